"""PyTorch's torch.* functions (infinitrain.tensor_ops) and the Tensor methods over them, against float64 NumPy on
fresh random inputs: values, dtypes, broadcasting and gradients (checked against finite differences or the
NumPy derivative)."""

import math

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, TOL, assert_close, rng


def t(a, dtype=None, requires_grad=False):
    """A tensor on the device under test; NumPy float64 arrays stay float64 (as torch.tensor keeps them)."""
    return it.tensor(a, dtype=dtype, device=DEVICE, requires_grad=requires_grad)


def f64(*shape):
    return rng().standard_normal(shape)


def grad_of(fn, *arrays):
    """Gradients of sum(fn(*tensors) * w) for a random weight w, and the weight, as float64 arrays."""
    ts = [t(a, "float64", requires_grad=True) for a in arrays]
    out = fn(*ts)
    w = f64(*out.shape)
    (out * t(w, "float64")).sum().backward()
    return [x.grad.numpy() for x in ts], w


def numeric_grad(fn_np, arrays, w, h=1e-6):
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k][idx] += h
            minus[k][idx] -= h
            g[idx] = np.sum((fn_np(*plus) - fn_np(*minus)) * w) / (2 * h)
        grads.append(g)
    return grads


# ---- creation ------------------------------------------------------------------------------------------------


def test_creation_functions():
    n = int(rng().integers(3, 9))
    np.testing.assert_allclose(it.linspace(-1.5, 2.0, n, device=DEVICE).numpy(), np.linspace(-1.5, 2.0, n), rtol=1e-6)
    np.testing.assert_allclose(it.logspace(0, 2, n, device=DEVICE).numpy(), np.logspace(0, 2, n), rtol=1e-6)
    np.testing.assert_array_equal(it.eye(n, n + 2, device=DEVICE).numpy(), np.eye(n, n + 2))
    assert it.eye(3).dtype == "float32" and it.linspace(0, 1, 3).dtype == "float32"
    a = f64(3, 4)
    x = t(a, "float32")
    assert it.as_tensor(x) is x
    assert it.as_tensor(x, dtype="float64").dtype == "float64"
    np.testing.assert_array_equal(it.as_tensor([1, 2, 3]).numpy(), [1, 2, 3])
    r = it.randint_like(x, 3, 9)
    assert r.shape == x.shape and r.numpy().min() >= 3 and r.numpy().max() < 9
    b = it.bernoulli(it.full((4000,), 0.3, device=DEVICE))
    assert set(np.unique(b.numpy())) <= {0.0, 1.0} and abs(b.numpy().mean() - 0.3) < 0.05
    z = it.normal(2.0, 3.0, (20000,))
    assert abs(z.numpy().mean() - 2.0) < 0.1 and abs(z.numpy().std() - 3.0) < 0.1
    zt = it.normal(t(np.full(5000, -1.0)), t(np.full(5000, 0.5)))
    assert abs(zt.numpy().mean() + 1.0) < 0.05


def test_default_dtype_drives_creation():
    try:
        it.set_default_dtype(it.float64)
        assert it.zeros(2).dtype == "float64" and it.tensor([1.5]).dtype == "float64" and it.randn(2).dtype == "float64"
        assert it.get_default_dtype() == it.float64
    finally:
        it.set_default_dtype("float32")
    assert it.ones(2).dtype == "float32" and it.tensor(1.5).dtype == "float32"
    with pytest.raises(TypeError, match="float32 and float64"):
        it.set_default_dtype("int64")


# ---- shapes and joining --------------------------------------------------------------------------------------


def test_joining_and_splitting():
    a, b = f64(2, 3), f64(2, 3)
    np.testing.assert_array_equal(it.hstack([t(a), t(b)]).numpy(), np.hstack([a, b]))
    np.testing.assert_array_equal(it.vstack([t(a), t(b)]).numpy(), np.vstack([a, b]))
    np.testing.assert_array_equal(it.concatenate([t(a), t(b)], axis=1).numpy(), np.concatenate([a, b], 1))
    x = f64(7, 5)
    for sections in (3, [2, 5], [0, 9]):
        got = it.tensor_split(t(x), sections, 0)
        want = np.array_split(x, sections, 0) if isinstance(sections, int) else np.split(x, sections, 0)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w)
    parts = it.split(t(x), [3, 4], dim=0)
    np.testing.assert_array_equal(parts[1].numpy(), x[3:])
    assert [p.shape for p in it.chunk(t(x), 3, 1)] == [(7, 2), (7, 2), (7, 1)]
    assert [u.shape for u in it.unbind(t(x), 1)] == [(7,)] * 5


def test_shape_functions():
    x = f64(2, 3, 4)
    xt = t(x, "float64")
    np.testing.assert_array_equal(it.movedim(xt, 0, -1).numpy(), np.moveaxis(x, 0, -1))
    np.testing.assert_array_equal(it.movedim(xt, [0, 1], [2, 0]).numpy(), np.moveaxis(x, [0, 1], [2, 0]))
    np.testing.assert_array_equal(it.swapaxes(xt, 0, 2).numpy(), np.swapaxes(x, 0, 2))
    np.testing.assert_array_equal(it.permute(xt, (2, 0, 1)).numpy(), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(it.narrow(xt, 2, 1, 2).numpy(), x[:, :, 1:3])
    np.testing.assert_array_equal(it.unflatten(xt, 2, (2, 2)).numpy(), x.reshape(2, 3, 2, 2))
    np.testing.assert_array_equal(xt.t().numpy() if False else it.t(t(x[0], "float64")).numpy(), x[0].T)
    np.testing.assert_array_equal(xt.mT.numpy(), np.swapaxes(x, -1, -2))
    np.testing.assert_array_equal(it.flip(xt, (0, 2)).numpy(), x[::-1, :, ::-1])
    np.testing.assert_array_equal(it.roll(xt, 2, 1).numpy(), np.roll(x, 2, 1))
    np.testing.assert_array_equal(it.roll(xt, (1, -1), (0, 2)).numpy(), np.roll(x, (1, -1), (0, 2)))
    np.testing.assert_array_equal(it.roll(xt, 5).numpy(), np.roll(x, 5))
    np.testing.assert_array_equal(it.tile(xt, (2, 1)).numpy(), np.tile(x, (2, 1)))
    np.testing.assert_array_equal(
        it.broadcast_to(t(x[0, 0], "float64"), (3, 4)).numpy(), np.broadcast_to(x[0, 0], (3, 4))
    )
    a, b = it.broadcast_tensors(t(f64(3, 1)), t(f64(4)))
    assert a.shape == b.shape == (3, 4)
    g1, g2 = it.meshgrid(t(np.arange(3.0)), t(np.arange(4.0)), indexing="ij")
    w1, w2 = np.meshgrid(np.arange(3.0), np.arange(4.0), indexing="ij")
    np.testing.assert_array_equal(g1.numpy(), w1)
    np.testing.assert_array_equal(g2.numpy(), w2)
    x1, x2 = it.meshgrid(t(np.arange(3.0)), t(np.arange(4.0)), indexing="xy")
    v1, v2 = np.meshgrid(np.arange(3.0), np.arange(4.0), indexing="xy")
    np.testing.assert_array_equal(x1.numpy(), v1)
    np.testing.assert_array_equal(x2.numpy(), v2)


def test_repeat_interleave_forms():
    x = f64(3, 2)
    np.testing.assert_array_equal(it.repeat_interleave(t(x, "float64"), 2).numpy(), np.repeat(x.reshape(-1), 2))
    np.testing.assert_array_equal(t(x, "float64").repeat_interleave(2, dim=0).numpy(), np.repeat(x, 2, 0))
    counts = [1, 0, 3]
    np.testing.assert_array_equal(it.repeat_interleave(t(x, "float64"), t(counts), 0).numpy(), np.repeat(x, counts, 0))


def test_diagonal_diag_trace():
    a = f64(4, 5)
    at = t(a, "float64")
    for off in (-2, 0, 1, 3):
        np.testing.assert_array_equal(it.diagonal(at, off).numpy(), np.diagonal(a, off))
        np.testing.assert_array_equal(it.diag(at, off).numpy(), np.diag(a, off))
    v = f64(3)
    for off in (-1, 0, 2):
        np.testing.assert_array_equal(it.diag(t(v, "float64"), off).numpy(), np.diag(v, off))
    np.testing.assert_allclose(it.trace(at).item(), np.trace(a))
    b = f64(2, 3, 3)
    np.testing.assert_array_equal(it.diagonal(t(b, "float64"), 0, 1, 2).numpy(), np.diagonal(b, 0, 1, 2))
    (g,), w = grad_of(lambda x: it.diag(x), v)
    np.testing.assert_allclose(g, np.diag(w), rtol=1e-12)


# ---- indexing ------------------------------------------------------------------------------------------------


def test_scatter_and_index_add():
    g = rng()
    x = f64(4, 5)
    idx = np.stack([g.permutation(4)[:3] for _ in range(5)], 1)  # [3, 5], distinct rows per column
    src = f64(3, 5)
    want = x.copy()
    np.put_along_axis(want, idx, src, 0)
    got = it.scatter(t(x, "float64"), 0, t(idx), t(src, "float64"))
    np.testing.assert_array_equal(got.numpy(), want)
    cols = np.stack([rng().permutation(5)[:2] for _ in range(3)])  # [3, 2]: smaller than x outside dim 1 too
    got_v = t(x, "float64").scatter(1, t(cols), value=7.0)
    want_v = x.copy()
    np.put_along_axis(want_v[:3], cols, 7.0, 1)
    np.testing.assert_array_equal(got_v.numpy(), want_v)
    y = t(x, "float64")
    y.scatter_(0, t(idx), t(src, "float64"))
    np.testing.assert_array_equal(y.numpy(), want)
    want_add = x.copy()
    np.add.at(want_add, (idx, np.arange(5)[None, :]), src)
    np.testing.assert_allclose(it.scatter_add(t(x, "float64"), 0, t(idx), t(src, "float64")).numpy(), want_add)
    rows = g.integers(0, 4, 6)
    source = f64(6, 5)
    want_ia = x.copy()
    np.add.at(want_ia, rows, 2.0 * source)
    z = t(x, "float64")
    z.index_add_(0, t(rows), t(source, "float64"), alpha=2.0)
    np.testing.assert_allclose(z.numpy(), want_ia, rtol=1e-12)
    # Gradients flow to input (where not overwritten) and to src.
    (gx, gs), w = grad_of(lambda a, s: it.scatter(a, 0, t(idx), s), x, src)
    hit = np.zeros_like(x, dtype=bool)
    np.put_along_axis(hit, idx, True, 0)
    np.testing.assert_allclose(gx, np.where(hit, 0.0, w))
    np.testing.assert_allclose(gs, np.take_along_axis(w, idx, 0))


def test_clamp_with_tensor_bounds_broadcasts():
    """clamp with a tensor min (and a number or tensor max) broadcasts the bounds as np.clip does."""
    x, lo, hi = f64(4, 5), f64(5) - 0.5, f64(4, 1) + 0.5
    xt = t(x, "float64")
    np.testing.assert_array_equal(it.clamp(xt, min=t(lo, "float64")).numpy(), np.maximum(x, lo))
    np.testing.assert_array_equal(it.clamp(xt, min=-0.25, max=t(hi, "float64")).numpy(), np.clip(x, -0.25, hi))
    np.testing.assert_array_equal(it.clamp(xt, t(lo, "float64"), 0.75).numpy(), np.minimum(np.maximum(x, lo), 0.75))


PROMOTIONS = [  # PyTorch's result_type for two tensors
    ("float32", "float64", "float64"),
    ("float32", "int64", "float32"),
    ("bfloat16", "float32", "float32"),
    ("int32", "int64", "int64"),
    ("bool", "int64", "int64"),
    ("bool", "float32", "float32"),
]


@pytest.mark.parametrize("da, db, want", PROMOTIONS, ids=[f"{a}-{b}" for a, b, _ in PROMOTIONS])
def test_mixed_dtype_binary_ops_promote(da, db, want):
    """Tensors of two dtypes meet at PyTorch's result dtype, in either order, for add, sub, mul and maximum; values
    against float64 NumPy on inputs every dtype holds exactly (quarters in [-4, 4], 0/1 for bool)."""
    g = rng()

    def values(dtype):
        if dtype == "bool":
            return g.integers(0, 2, 6).astype(np.float64)
        if dtype.startswith("int"):
            return g.integers(-4, 5, 6).astype(np.float64)
        return g.integers(-16, 17, 6) / 4.0

    x, y = values(da), values(db)
    a, b = t(x, da), t(y, db)
    for fn, ref in ((it.add, np.add), (it.sub, np.subtract), (it.mul, np.multiply), (it.maximum, np.maximum)):
        if fn is it.sub and "bool" in (da, db):
            continue  # PyTorch refuses subtraction with a bool tensor
        for p, q, u, v in ((a, b, x, y), (b, a, y, x)):
            out = fn(p, q)
            assert out.dtype == want, (fn.__name__, p.dtype, q.dtype)
            np.testing.assert_array_equal(out.numpy().astype(np.float64), ref(u, v))


def test_mixed_float_dtypes_gradients_keep_each_dtype():
    """a (float32) * b (float64) runs in float64; each input's gradient comes back in its own dtype, equal to the
    other input (rounded to float32 for a)."""
    x, y = f64(5), f64(5)
    a, b = t(x, "float32", requires_grad=True), t(y, "float64", requires_grad=True)
    out = a * b
    assert out.dtype == "float64"
    np.testing.assert_allclose(out.numpy(), x.astype(np.float32).astype(np.float64) * y, rtol=1e-15)
    out.sum().backward()
    assert a.grad.dtype == "float32" and b.grad.dtype == "float64"
    np.testing.assert_array_equal(a.grad.numpy(), y.astype(np.float32))
    np.testing.assert_array_equal(b.grad.numpy(), x.astype(np.float32).astype(np.float64))


def test_one_hot_ids_in_range():
    """one_hot accepts any ids in [0, num_classes), whether or not class 0 occurs (rows of np.eye), infers
    num_classes as max + 1, and rejects a negative id or one past num_classes."""
    ids = rng().integers(1, 6, size=(3, 4))  # no class 0
    np.testing.assert_array_equal(it.nn.functional.one_hot(t(ids), 6).numpy(), np.eye(6, dtype=np.int64)[ids])
    inferred = it.nn.functional.one_hot(t(ids)).numpy()
    np.testing.assert_array_equal(inferred, np.eye(ids.max() + 1, dtype=np.int64)[ids])
    for bad in ([2, -1], [0, 6]):
        with pytest.raises(ValueError, match=r"class ids must be in \[0, 6\)"):
            it.nn.functional.one_hot(t(bad), 6)


@pytest.mark.parametrize(
    "shape, sizes", [((3,), (2, 3)), ((2, 3), (2, 1, 3)), ((2, 3), (4, 2, 1, 2)), ((2, 3), (2, 2))]
)
def test_tensor_repeat_matches_np_tile(shape, sizes):
    """Tensor.repeat tiles like np.tile, also with more sizes than dims (new leading dims); its gradient sums the
    output's gradient over the copies (the tiled weight's blocks added up)."""
    x = f64(*shape)
    np.testing.assert_array_equal(t(x, "float64").repeat(*sizes).numpy(), np.tile(x, sizes))
    np.testing.assert_array_equal(t(x, "float64").repeat(list(sizes)).numpy(), np.tile(x, sizes))
    (g,), w = grad_of(lambda a: a.repeat(*sizes), x)
    lead = len(sizes) - len(shape)
    blocks = w.reshape([v for r, s in zip(sizes, (1,) * lead + shape, strict=True) for v in (r, s)])
    want = blocks.sum(axis=tuple(range(0, 2 * len(sizes), 2))).reshape(shape)
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="sizes for a"):
        t(x, "float64").repeat(*sizes[: len(shape) - 1])


def test_cat_joins_along_dim_0_by_default():
    """cat without dim joins along the first dim (np.concatenate's and PyTorch's default), for 1-d and 2-d tensors
    of different lengths there; its gradient splits back into the pieces."""
    a, b = f64(2, 3), f64(4, 3)
    np.testing.assert_array_equal(it.cat([t(a, "float64"), t(b, "float64")]).numpy(), np.concatenate([a, b]))
    np.testing.assert_array_equal(it.concat((t(a[0], "float64"), t(b[1], "float64"))).numpy(), np.r_[a[0], b[1]])
    (ga, gb), w = grad_of(lambda x, y: it.cat([x, y]), a, b)
    np.testing.assert_array_equal(ga, w[:2])
    np.testing.assert_array_equal(gb, w[2:])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_bthd_default_scale(causal):
    """attention_bthd (q [B, T, Hq, D], k, v [B, S, Hkv, D]) scales the scores by 1 / sqrt(D) unless told otherwise:
    against softmax(q k^T / sqrt(D)) v in float64 NumPy, with grouped kv heads (each serving Hq / Hkv queries)."""
    B, T, Hq, Hkv, D = 2, 5, 4, 2, 8
    q, k, v = f64(B, T, Hq, D), f64(B, T, Hkv, D), f64(B, T, Hkv, D)
    kr, vr = np.repeat(k, Hq // Hkv, axis=2), np.repeat(v, Hq // Hkv, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, kr) / math.sqrt(D)
    if causal:
        scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bhts,bshd->bthd", p, vr)
    got = it.functional.attention_bthd(t(q), t(k), t(v), is_causal=causal)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    half = it.functional.attention_bthd(t(q), t(k), t(v), is_causal=causal, scale=0.5 / math.sqrt(D))
    assert not np.allclose(half.numpy(), want)  # the scale is used, not fixed


def test_getitem_with_ellipsis_and_multi_dim_masks():
    """Ellipsis anywhere in an index, and a boolean mask over several dims at the front or after a slice, select
    as NumPy does (values compared exactly)."""
    x = f64(2, 3, 4, 5)
    xt = t(x, "float64")
    for idx in ((..., 1), (0, ..., 2), (0, 1, ..., 2), (..., 1, slice(1, 3)), (1, ...)):
        np.testing.assert_array_equal(xt[idx].numpy(), x[idx])
    front, middle = rng().random((2, 3)) < 0.5, rng().random((3, 4)) < 0.5
    np.testing.assert_array_equal(xt[t(front)].numpy(), x[front])
    np.testing.assert_array_equal(xt[:, t(middle)].numpy(), x[:, middle])


def test_list_indices_empty_and_out_of_range():
    """List and array ids as NumPy takes them: an empty list selects no rows (shape (0, ...)), and an id outside
    [-n, n) is an IndexError naming that id as given (-n - 1, not what it would wrap to) and the size."""
    x = f64(4, 3)
    xt = t(x, "float64")
    for empty in ([], np.array([], np.int64)):
        assert xt[empty].shape == x[empty].shape == (0, 3)
        assert it.index_select(xt, 0, empty).shape == (0, 3)
    rows = [int(i) for i in rng().integers(-4, 4, 5)]
    np.testing.assert_array_equal(xt[rows].numpy(), x[rows])
    for bad in (4, -5):
        with pytest.raises(IndexError, match=rf"index {bad} is out of range for size 4"):
            it.index_select(xt, 0, [0, bad])
        with pytest.raises(IndexError, match=rf"index {bad} is out of range for size 4"):
            xt[[bad, 1]]


def test_tensor_index_add_takes_pytorchs_arguments():
    """Tensor.index_add has PyTorch's signature: dim, index and source may be passed by name and alpha only by
    name; the result is x with alpha * source's rows added at index (np.add.at), x itself unchanged."""
    x, source = f64(4, 3), f64(5, 3)
    rows = rng().integers(0, 4, 5)
    want = x.copy()
    np.add.at(want, rows, -1.5 * source)
    xt = t(x, "float64")
    got = xt.index_add(dim=0, index=t(rows), source=t(source, "float64"), alpha=-1.5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(xt.numpy(), x)
    with pytest.raises(TypeError):
        xt.index_add(0, t(rows), t(source, "float64"), -1.5)


def test_take_along_dim_masked_select_nonzero():
    x = f64(3, 4)
    idx = rng().integers(0, 4, (3, 2))
    np.testing.assert_array_equal(it.take_along_dim(t(x), t(idx), 1).numpy(), np.take_along_axis(x, idx, 1))
    flat = rng().integers(0, 12, 5)
    np.testing.assert_array_equal(it.take_along_dim(t(x), t(flat)).numpy(), x.reshape(-1)[flat])
    mask = rng().random((3, 4)) < 0.5
    np.testing.assert_array_equal(it.masked_select(t(x), t(mask)).numpy(), x[mask])
    np.testing.assert_array_equal(it.nonzero(t(mask)).numpy(), np.argwhere(mask))
    rows, cols = it.nonzero(t(mask), as_tuple=True)
    np.testing.assert_array_equal(rows.numpy(), np.nonzero(mask)[0])
    np.testing.assert_array_equal(cols.numpy(), np.nonzero(mask)[1])
    np.testing.assert_array_equal(it.argwhere(t(mask)).numpy(), np.argwhere(mask))


# ---- pointwise -----------------------------------------------------------------------------------------------


POINTWISE = [
    ("exp2", lambda x: np.exp2(x)),
    ("log2", lambda x: np.log2(np.abs(x) + 0.5)),
    ("log10", lambda x: np.log10(np.abs(x) + 0.5)),
    ("square", np.square),
    ("tan", lambda x: np.tan(np.clip(x, -1.2, 1.2))),
    ("reciprocal", lambda x: 1.0 / (np.abs(x) + 0.5)),
    ("erfc", lambda x: np.vectorize(math.erfc)(x)),
    ("neg", np.negative),
]


@pytest.mark.parametrize("name, ref", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise(name, ref):
    x = f64(4, 7)
    if name in ("log2", "log10", "reciprocal"):
        x = np.abs(x) + 0.5
        arg = x
        want = {"log2": np.log2, "log10": np.log10, "reciprocal": lambda v: 1.0 / v}[name](x)
    elif name == "tan":
        arg = np.clip(x, -1.2, 1.2)
        want = np.tan(arg)
    else:
        arg, want = x, ref(x)
    got = getattr(it, name)(t(arg, "float64"))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    got32 = getattr(it, name)(t(arg, "float32"))
    assert_close(got32, want, "float32", rtol=1e-5)  # composed of a few float32 ops, each rounding


def test_arithmetic_forms():
    a, b = f64(3, 4), f64(4)
    at, bt = t(a, "float64"), t(b, "float64")
    np.testing.assert_allclose(it.add(at, bt, alpha=2.5).numpy(), a + 2.5 * b)
    np.testing.assert_allclose(it.sub(at, bt, alpha=-1.5).numpy(), a + 1.5 * b)
    np.testing.assert_allclose(it.mul(at, 3).numpy(), a * 3)
    np.testing.assert_allclose(it.div(at, bt).numpy(), a / b)
    np.testing.assert_allclose(it.div(at, bt, rounding_mode="floor").numpy(), np.floor(a / b))
    np.testing.assert_allclose(it.div(at, bt, rounding_mode="trunc").numpy(), np.trunc(a / b))
    np.testing.assert_allclose(it.true_divide(at, bt).numpy(), a / b)
    np.testing.assert_allclose(it.floor_divide(at, bt).numpy(), np.floor(a / b))
    i, j = rng().integers(-20, 20, (3, 4)), rng().integers(1, 7, (4,)) * rng().choice([-1, 1], 4)
    it_i, it_j = t(i), t(j)
    assert it.floor_divide(it_i, it_j).dtype == "int64"
    np.testing.assert_array_equal(it.floor_divide(it_i, it_j).numpy(), i // j)
    np.testing.assert_array_equal((it_i // it_j).numpy(), i // j)
    np.testing.assert_array_equal(it.remainder(it_i, it_j).numpy(), np.remainder(i, j))
    np.testing.assert_array_equal((it_i % 3).numpy(), i % 3)
    np.testing.assert_array_equal(it.fmod(it_i, it_j).numpy(), np.fmod(i, j))
    np.testing.assert_array_equal(it.div(it_i, it_j, rounding_mode="trunc").numpy(), np.trunc(i / j).astype(np.int64))
    np.testing.assert_allclose(it.atan2(at, bt).numpy(), np.arctan2(a, b))
    w = rng().random((3, 4))
    np.testing.assert_allclose(it.lerp(at, t(w, "float64"), 0.3).numpy(), a + 0.3 * (w - a))
    np.testing.assert_allclose(it.addcmul(at, at, bt, value=0.5).numpy(), a + 0.5 * a * b)
    np.testing.assert_allclose(it.addcdiv(at, at, bt, value=2).numpy(), a + 2 * a / b)
    np.testing.assert_allclose((2.0**at).numpy(), 2.0**a)  # __rpow__
    np.testing.assert_allclose(it.pow(t(np.abs(a) + 0.1, "float64"), bt).numpy(), (np.abs(a) + 0.1) ** b)


def test_pow_tensor_exponent_gradient():
    a, b = np.abs(f64(3, 4)) + 0.2, f64(4)
    (ga, gb), w = grad_of(lambda x, y: it.pow(x, y), a, b)
    na, nb = numeric_grad(lambda x, y: x**y, [a, b], w)
    np.testing.assert_allclose(ga, na, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gb, nb, rtol=1e-5, atol=1e-7)


def test_nan_inf_tests_and_nan_to_num():
    a = np.array([1.0, np.nan, np.inf, -np.inf, -2.0, 0.0])
    x = t(a, "float32")
    np.testing.assert_array_equal(it.isnan(x).numpy(), np.isnan(a))
    np.testing.assert_array_equal(it.isinf(x).numpy(), np.isinf(a))
    np.testing.assert_array_equal(it.isfinite(x).numpy(), np.isfinite(a))
    np.testing.assert_array_equal(it.isposinf(x).numpy(), np.isposinf(a))
    np.testing.assert_array_equal(it.isneginf(x).numpy(), np.isneginf(a))
    fi = it.finfo("float32")
    np.testing.assert_array_equal(it.nan_to_num(x).numpy(), np.nan_to_num(a.astype(np.float32)))
    np.testing.assert_array_equal(
        it.nan_to_num(x, 1.5, 9.0, -9.0).numpy(), np.nan_to_num(a, nan=1.5, posinf=9.0, neginf=-9.0)
    )
    assert fi.max == float(np.finfo(np.float32).max)
    assert not it.isnan(t([1, 2])).numpy().any() and it.isfinite(t([1, 2])).numpy().all()


def test_logic_and_comparison_functions():
    a, b = rng().random(20) < 0.5, rng().random(20) < 0.5
    np.testing.assert_array_equal(it.logical_and(t(a), t(b)).numpy(), a & b)
    np.testing.assert_array_equal(it.logical_or(t(a), t(b)).numpy(), a | b)
    np.testing.assert_array_equal(it.logical_xor(t(a), t(b)).numpy(), a ^ b)
    np.testing.assert_array_equal(it.logical_not(t(a)).numpy(), ~a)
    np.testing.assert_array_equal((t(a) ^ t(b)).numpy(), a ^ b)
    x, y = f64(5), f64(5)
    for name, fn in [
        ("eq", np.equal),
        ("ne", np.not_equal),
        ("lt", np.less),
        ("le", np.less_equal),
        ("gt", np.greater),
        ("ge", np.greater_equal),
    ]:
        np.testing.assert_array_equal(getattr(it, name)(t(x), t(y)).numpy(), fn(x.astype(np.float32), y))
    z = x + 1e-9
    np.testing.assert_array_equal(it.isclose(t(x, "float64"), t(z, "float64")).numpy(), np.isclose(x, z))
    assert it.allclose(t(x, "float64"), t(z, "float64")) and not it.allclose(t(x), t(y))
    nan = np.array([np.nan, 1.0])
    np.testing.assert_array_equal(it.isclose(t(nan), t(nan), equal_nan=True).numpy(), [True, True])
    np.testing.assert_array_equal(it.isclose(t(nan), t(nan)).numpy(), [False, True])
    assert it.equal(t(x), t(x)) and not it.equal(t(x), t(y)) and not it.equal(t(x), t(x[:3]))


# ---- reductions ----------------------------------------------------------------------------------------------


def test_all_any_count_nonzero():
    m = rng().random((4, 6)) < 0.7
    for dim in (None, 0, 1):
        np.testing.assert_array_equal(it.all(t(m), dim).numpy(), m.all(axis=dim))
        np.testing.assert_array_equal(it.any(t(m), dim).numpy(), m.any(axis=dim))
        np.testing.assert_array_equal(it.count_nonzero(t(m), dim).numpy(), np.count_nonzero(m, axis=dim))
    assert it.all(t(m)).dtype == "bool"
    assert t(m).all().numpy() == m.all() and t(m).any(1, keepdim=True).shape == (4, 1)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_prod(dtype):
    g = rng()
    x = g.uniform(0.5, 1.5, (3, 5)) * g.choice([-1, 1], (3, 5))
    if dtype == "int64":
        x = g.integers(-3, 4, (3, 5))
    x[1, 2] = 0  # a zero row
    for dim in (None, 0, 1):
        got = it.prod(t(x, dtype), dim)
        assert got.dtype == (dtype if dtype != "int64" else "int64")
        np.testing.assert_allclose(got.numpy(), np.prod(x, axis=dim), rtol=1e-6 if dtype == "float32" else 1e-12)
    assert t(x, dtype).prod(1, keepdim=True).shape == (3, 1)


def test_prod_gradient_with_zeros():
    x = rng().uniform(0.5, 1.5, (3, 4))
    x[0, 1] = 0.0  # one zero: its gradient is the product of the others
    x[2, 0] = x[2, 3] = 0.0  # two zeros: all gradients 0
    (g,), w = grad_of(lambda a: it.prod(a, 1), x)
    want = np.zeros_like(x)
    for r in range(3):
        for c in range(4):
            others = np.prod(np.delete(x[r], c))
            want[r, c] = w[r] * others
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15)


def test_cumprod_and_cumsum_forms():
    x = rng().uniform(0.5, 1.5, (3, 6)) * rng().choice([-1, 1], (3, 6))
    x[1, 3] = 0.0
    np.testing.assert_allclose(it.cumprod(t(x, "float64"), 1).numpy(), np.cumprod(x, 1), rtol=1e-12)
    np.testing.assert_allclose(it.cumsum(t(x, "float64"), 0).numpy(), np.cumsum(x, 0), rtol=1e-12)
    i = rng().integers(-5, 5, (4, 3))
    c = it.cumsum(t(i), 1)
    assert c.dtype == "int64"
    np.testing.assert_array_equal(c.numpy(), np.cumsum(i, 1))
    np.testing.assert_allclose(t(x, "float64").cumsum(1).numpy(), np.cumsum(x, 1))
    (g,), w = grad_of(lambda a: it.cumsum(a, 1), x)
    np.testing.assert_allclose(g, np.flip(np.cumsum(np.flip(w, 1), 1), 1), rtol=1e-12)


def test_logsumexp_norm_dist():
    x = f64(3, 5) * 30  # large values: the shift keeps exp finite
    want = np.log(np.sum(np.exp(x - x.max(1, keepdims=True)), 1)) + x.max(1)
    np.testing.assert_allclose(it.logsumexp(t(x, "float64"), 1).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(it.logsumexp(t(x, "float64"), 1, keepdim=True).numpy(), want[:, None], rtol=1e-12)
    allinf = it.logsumexp(t(np.full((2, 3), -np.inf), "float64"), 1).numpy()
    assert np.all(allinf == -np.inf)
    y = f64(4, 6)
    yt = t(y, "float64")
    for p, ref in [("fro", 2), (2, 2), (1, 1), (math.inf, np.inf), (-math.inf, -np.inf), (3, 3), (0, 0)]:
        np.testing.assert_allclose(it.norm(yt, p).numpy(), np.linalg.norm(y.reshape(-1), ref), rtol=1e-12)
        np.testing.assert_allclose(it.norm(yt, p, dim=1).numpy(), np.linalg.norm(y, ref, axis=1), rtol=1e-12)
    z = f64(4, 6)
    np.testing.assert_allclose(it.dist(yt, t(z, "float64"), 3).numpy(), np.linalg.norm((y - z).reshape(-1), 3))


def test_max_min_return_values_and_indices():
    x = f64(4, 7)
    v, i = it.max(t(x, "float64"), 1)
    np.testing.assert_array_equal(v.numpy(), x.max(1))
    np.testing.assert_array_equal(i.numpy(), x.argmax(1))
    r = t(x, "float64").min(dim=0, keepdim=True)
    np.testing.assert_array_equal(r.values.numpy(), x.min(0, keepdims=True))
    np.testing.assert_array_equal(r.indices.numpy(), x.argmin(0)[None])
    np.testing.assert_array_equal(it.max(t(x, "float64")).numpy(), x.max())
    y = f64(4, 7)
    np.testing.assert_array_equal(it.max(t(x, "float64"), t(y, "float64")).numpy(), np.maximum(x, y))


def test_sort_argsort_topk_kthvalue_median():
    x = np.round(f64(5, 9) * 2) / 2  # ties
    v, i = it.sort(t(x, "float64"), 1, descending=True)
    order = np.argsort(-x, 1, kind="stable")
    np.testing.assert_array_equal(i.numpy(), order)
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(it.argsort(t(x, "float64"), 0).numpy(), np.argsort(x, 0, kind="stable"))
    s = t(x, "float64").sort(dim=0)
    np.testing.assert_array_equal(s.values.numpy(), np.sort(x, 0))
    tk = it.topk(t(x, "float64"), 3)
    np.testing.assert_array_equal(tk.values.numpy(), -np.sort(-x, 1)[:, :3])
    k = int(rng().integers(1, 10))
    kv = it.kthvalue(t(x, "float64"), k, 1)
    np.testing.assert_array_equal(kv.values.numpy(), np.sort(x, 1)[:, k - 1])
    np.testing.assert_array_equal(np.take_along_axis(x, kv.indices.numpy()[:, None], 1)[:, 0], kv.values.numpy())
    y = f64(6)
    assert it.median(t(y, "float64")).item() == np.sort(y)[2]  # the lower of the two middles
    md = it.median(t(x, "float64"), 1)
    np.testing.assert_array_equal(md.values.numpy(), np.sort(x, 1)[:, 4])
    # The sort's values carry gradients back to their positions.
    z = f64(4, 6)
    (g,), w = grad_of(lambda a: it.sort(a, 1)[0], z)
    want = np.zeros_like(z)
    np.put_along_axis(want, np.argsort(z, 1, kind="stable"), w, 1)
    np.testing.assert_allclose(g, want)


def test_unique_and_bincount():
    i = rng().integers(0, 6, 30)
    u, inv, cnt = it.unique(t(i), return_inverse=True, return_counts=True)
    wu, winv, wcnt = np.unique(i, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(u.numpy(), wu)
    np.testing.assert_array_equal(inv.numpy(), winv)
    np.testing.assert_array_equal(cnt.numpy(), wcnt)
    np.testing.assert_array_equal(it.bincount(t(i), minlength=9).numpy(), np.bincount(i, minlength=9))
    w = rng().random(30)
    np.testing.assert_allclose(it.bincount(t(i), t(w, "float64")).numpy(), np.bincount(i, w))
    with pytest.raises(ValueError, match="non-negative"):
        it.bincount(t([-1, 2]))


def test_var_mean_std_mean():
    x = f64(5, 4)
    v, m = it.var_mean(t(x, "float64"), 0)
    np.testing.assert_allclose(v.numpy(), x.var(0, ddof=1))
    np.testing.assert_allclose(m.numpy(), x.mean(0))
    s, m2 = it.std_mean(t(x, "float64"), 1, correction=0)
    np.testing.assert_allclose(s.numpy(), x.std(1))
    np.testing.assert_allclose(m2.numpy(), x.mean(1))


# ---- linear algebra ------------------------------------------------------------------------------------------


def test_matrix_products():
    a, b, v = f64(3, 4), f64(4, 5), f64(4)
    at, bt, vt = t(a, "float64"), t(b, "float64"), t(v, "float64")
    np.testing.assert_allclose(it.mm(at, bt).numpy(), a @ b)
    np.testing.assert_allclose(it.mv(at, vt).numpy(), a @ v)
    np.testing.assert_allclose(it.dot(vt, vt).numpy(), v @ v)
    np.testing.assert_allclose(it.outer(vt, t(f64(2), "float64")).numpy().shape, (4, 2))
    c = f64(3, 5)
    np.testing.assert_allclose(it.addmm(t(c, "float64"), at, bt, beta=0.5, alpha=2.0).numpy(), 0.5 * c + 2 * (a @ b))
    x, y = f64(2, 3, 4), f64(2, 4, 5)
    np.testing.assert_allclose(it.bmm(t(x, "float64"), t(y, "float64")).numpy(), x @ y)
    z = f64(2, 3, 5)
    np.testing.assert_allclose(
        it.baddbmm(t(z, "float64"), t(x, "float64"), t(y, "float64"), beta=2.0, alpha=-1.0).numpy(), 2 * z - x @ y
    )
    np.testing.assert_allclose((at @ bt).numpy(), a @ b)
    with pytest.raises(ValueError, match="mm"):
        it.mm(t(x), t(y))
    p, q = f64(2, 6, 3), f64(2, 4, 3)
    want = np.sqrt(((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(it.cdist(t(p, "float64"), t(q, "float64")).numpy(), want, rtol=1e-12)


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
]


@pytest.mark.parametrize("eq, shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(eq, shapes):
    arrays = [f64(*s) for s in shapes]
    got = it.einsum(eq, *[t(a, "float64") for a in arrays])
    np.testing.assert_allclose(got.numpy(), np.einsum(eq, *arrays), rtol=1e-12, atol=1e-12)
    if len(shapes) == 2 and "..." not in eq and eq.count("i") < 3:
        grads, w = grad_of(lambda *xs: it.einsum(eq, *xs), *arrays)
        num = numeric_grad(lambda *xs: np.einsum(eq, *xs), arrays, w)
        for g, n in zip(grads, num, strict=True):
            np.testing.assert_allclose(g, n, rtol=1e-5, atol=1e-7)


def test_einsum_contracts_each_label_as_soon_as_it_can():
    """A chain "ij,jk,kl->il" contracts j with the second operand and k with the third: the peak memory beyond the
    inputs is that of the [2, 300] and [2, 2] intermediates (kilobytes), not of an [2, 300, 300, 2] array holding j
    and k to the end (2.9 MB). Values against np.einsum."""
    import gc

    arrays = [f64(2, 300), f64(300, 300), f64(300, 2)]
    ts = [t(a, "float64") for a in arrays]
    dev = it.runtime.parse_device(DEVICE)
    gc.collect()
    it.runtime.synchronize(dev)
    it.runtime.reset_peak_memory_stats(dev)
    before = it.runtime.memory_allocated(dev)
    got = it.einsum("ij,jk,kl->il", *ts)
    it.runtime.synchronize(dev)
    peak = it.runtime.max_memory_allocated(dev) - before
    np.testing.assert_allclose(got.numpy(), np.einsum("ij,jk,kl->il", *arrays), rtol=1e-10, atol=1e-12)
    assert peak < 2 * 300 * 300 * 8, peak  # under one [2, 300, 300] float64 array


def test_einsum_errors():
    with pytest.raises(ValueError, match="einsum"):
        it.einsum("ij,jk->ik", t(f64(3, 4)))
    with pytest.raises(ValueError, match="labels"):
        it.einsum("ij->i", t(f64(3, 4, 5)))


def test_einsum_operands_as_one_list():
    """PyTorch's einsum also takes the operands as one list or tuple: the same result as passing them one by one,
    against np.einsum."""
    arrays = [f64(2, 3), f64(3, 4), f64(4, 5)]
    want = np.einsum("ij,jk,kl->il", *arrays)
    ts = [t(a, "float64") for a in arrays]
    for operands in (ts, tuple(ts)):
        np.testing.assert_allclose(it.einsum("ij,jk,kl->il", operands).numpy(), want, rtol=1e-12, atol=1e-12)
    a = f64(3, 3)
    np.testing.assert_allclose(it.einsum("ii->i", [t(a, "float64")]).numpy(), np.diag(a), rtol=0, atol=0)


# ---- types ---------------------------------------------------------------------------------------------------


def test_type_queries():
    i, f = t([1, 2]), t([1.0])
    assert it.result_type(i, f) == "float32" and it.result_type(i, 2.5) == "float32" and it.result_type(i, 2) == "int64"
    assert it.promote_types(it.int32, it.float16) == it.float16 and it.promote_types("bfloat16", "float16") == "float32"
    assert it.float32.is_floating_point and not it.int64.is_floating_point and it.bfloat16.itemsize == 2
    assert isinstance(f.dtype, it.dtype) and repr(it.float32) == "infinitrain.float32"
    assert it.finfo(it.bfloat16).eps == 2.0**-7 and it.iinfo(it.int32).max == 2**31 - 1
    assert it.finfo().dtype == "float32"
    assert it.is_floating_point(f) and not it.is_floating_point(i) and it.numel(t(f64(3, 4))) == 12
    assert it.can_cast(it.int64, it.float32) and not it.can_cast(it.float32, it.int64)


def test_grad_mode_functions():
    x = t(f64(3), "float64", requires_grad=True)
    with it.inference_mode():
        assert not (x * 2).requires_grad and it.is_inference_mode_enabled()
    with it.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad
    it.set_grad_enabled(False)
    try:
        assert not it.is_grad_enabled()
    finally:
        it.set_grad_enabled(True)

    @it.inference_mode()
    def f(y):
        return y * 2

    assert not f(x).requires_grad

    @it.no_grad
    def g(y):
        return y * 2

    assert not g(x).requires_grad


def test_float32_matmul_precision_switches():
    assert it.get_float32_matmul_precision() == "highest" and not it.backends.cuda.matmul.allow_tf32
    try:
        it.backends.cuda.matmul.allow_tf32 = True
        assert it.get_float32_matmul_precision() == "high"
        it.set_float32_matmul_precision("medium")
        assert it.backends.cuda.matmul.allow_tf32
        with pytest.raises(ValueError, match="highest"):
            it.set_float32_matmul_precision("fast")
    finally:
        it.set_float32_matmul_precision("highest")
    assert it.backends.cudnn.allow_tf32 and not it.backends.cudnn.benchmark


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="TF32 tensor cores exist on CUDA GPUs only")
def test_allow_tf32_changes_float32_products_on_cuda():
    """On cuda, allow_tf32 rounds the float32 GEMM's inputs to 10 mantissa bits: the error against float64 rises
    from float32's (about 1e-6 of the result) to TF32's (about 1e-3); off again, float32's comes back."""
    a, b = f64(256, 512), f64(512, 256)
    want = a @ b

    def err():
        got = (t(a, "float32") @ t(b, "float32")).numpy()
        return np.abs(got - want).max() / np.abs(want).max()

    exact = err()
    try:
        it.backends.cuda.matmul.allow_tf32 = True
        tf32 = err()
    finally:
        it.backends.cuda.matmul.allow_tf32 = False
    assert exact < 1e-5 and tf32 > 1e-4, (exact, tf32)
    assert err() < 1e-5


def test_set_num_threads():
    n = it.get_num_threads()
    try:
        it.set_num_threads(1)
        assert it.get_num_threads() == 1
        a = f64(40, 50)
        np.testing.assert_allclose((t(a, "float64") @ t(a.T, "float64")).numpy(), a @ a.T)
    finally:
        it.set_num_threads(n)
    with pytest.raises(ValueError, match="positive"):
        it.set_num_threads(0)


def test_tolerances_default():
    assert TOL["float32"][0] < 1e-5


def test_cat_and_stack_promote_whichever_input_is_wider():
    """cat and stack of a float32 and a float64 tensor, in either order, give float64 holding both inputs' values,
    as PyTorch promotes."""
    g = rng()
    a, b = g.standard_normal((2, 3)).astype(np.float32), g.standard_normal((2, 3))
    ta, tb = it.tensor(a, device=DEVICE), it.tensor(b, dtype="float64", device=DEVICE)
    for xs, ref in (((ta, tb), (a, b)), ((tb, ta), (b, a))):
        for fn, np_fn in ((it.cat, np.concatenate), (it.stack, np.stack)):
            out = fn(list(xs))
            assert out.dtype == "float64"
            np.testing.assert_array_equal(out.numpy(), np_fn([r.astype(np.float64) for r in ref]))


def test_flatten_default_end_dim_is_the_last():
    """x.flatten(start) joins every dim from start to the last, as PyTorch's default end_dim=-1."""
    x = rng().standard_normal((2, 3, 4, 5))
    t = it.tensor(x, device=DEVICE)
    assert tuple(t.flatten(1).shape) == (2, 60)
    np.testing.assert_array_equal(t.flatten(1).numpy(), x.reshape(2, 60))
    assert tuple(t.flatten().shape) == (120,)
