"""Indexing ops (embedding, embedding_backward, gather, scatter_add) against float64 NumPy."""

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")


def _input(shape, dtype):
    return round_to(randn(*shape), dtype).reshape(shape)


def _add_at(x, index, src, dim):
    """out = x; out[.., index, ..] += src along dim, with NumPy's unbuffered np.add.at."""
    out = x.copy()
    ix = list(np.indices(index.shape, sparse=True))
    ix[dim] = index
    np.add.at(out, tuple(ix), src)
    return out


# ---- embedding ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "V,C,ishape", [(5, 3, (4,)), (17, 33, (2, 3)), (1, 7, (3,)), (9, 1, (4, 1)), (6, 4, ()), (6, 4, (0,)), (4, 0, (3,))]
)
def test_embedding(V, C, ishape, dtype):
    w = _input((V, C), dtype)
    idx = np.asarray(rng().integers(0, V, size=ishape))
    (out,) = run("embedding", [to_device(w, dtype), to_device(idx, "int64")])
    assert out.dtype == dtype
    assert_close(out, w[idx], dtype, rtol=0, atol=0, what=f"embedding V={V} C={C} {ishape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "V,C,ishape",
    [(5, 3, (4,)), (17, 33, (2, 3)), (1, 7, (3,)), (9, 1, (4, 1)), (6, 4, ()), (6, 4, (0,)), (3, 65, (40, 50))],
)
def test_embedding_backward(V, C, ishape, dtype):
    idx = np.asarray(rng().integers(0, V, size=ishape))  # repeats: rows accumulate
    g = _input(ishape + (C,), dtype)
    (dw,) = run("embedding_backward", [to_device(g, dtype), to_device(idx, "int64")], [V + 2])  # two rows never used
    expected = np.zeros((V + 2, C))
    np.add.at(expected, idx.reshape(-1), g.reshape(-1, C))
    assert dw.dtype == dtype
    assert_close(dw, expected, dtype, what=f"embedding_backward V={V} C={C} {ishape}")


def test_embedding_backward_finite_difference():
    # loss(w) = sum(embedding(w, idx) * g): dloss/dw is embedding_backward(g, idx).
    V, C = 4, 3
    w, idx, g = randn(V, C), rng().integers(0, V, size=(5,)), randn(5, C)
    (dw,) = run("embedding_backward", [to_device(g, "float64"), to_device(idx, "int64")], [V])

    def loss(w):
        (y,) = run("embedding", [to_device(w, "float64"), to_device(idx, "int64")])
        return np.sum(y.numpy() * g)

    num = np.zeros_like(w)
    eps = 1e-6
    for i in np.ndindex(w.shape):
        wp, wm = w.copy(), w.copy()
        wp[i] += eps
        wm[i] -= eps
        num[i] = (loss(wp) - loss(wm)) / (2 * eps)
    np.testing.assert_allclose(dw.numpy(), num, rtol=1e-7, atol=1e-8)


def test_embedding_backward_accumulates_in_double():
    # 30000 same-sign rows into one: float32 accumulation would drift past rtol 1.3e-6.
    g = round_to(rng().uniform(0.5, 1.5, size=(30000, 5)), "float32")
    idx = np.zeros(30000, dtype=np.int64)
    (dw,) = run("embedding_backward", [to_device(g, "float32"), to_device(idx, "int64")], [2])
    assert_close(dw, np.stack([g.sum(0), np.zeros(5)]), "float32")


def test_embedding_bad_input():
    w = to_device(randn(6, 4), "float32")
    with pytest.raises(IndexError, match=r"embedding: index 6 out of range .*6 rows \(expected 0 <= index < 6\)"):
        run("embedding", [w, to_device(np.array([0, 6, 1]), "int64")])
    with pytest.raises(IndexError, match="embedding: index -1 out of range"):
        run("embedding", [w, to_device(np.array([[-1]]), "int64")])
    with pytest.raises(ValueError, match="embedding: index must be int64, got int32"):
        run("embedding", [w, to_device(np.array([0]), "int32")])
    with pytest.raises(ValueError, match="embedding: weight must be 2-d"):
        run("embedding", [to_device(randn(6), "float32"), to_device(np.array([0]), "int64")])
    with pytest.raises(ValueError, match="embedding: weight must be float32, bfloat16, float16 or float64, got int64"):
        run("embedding", [to_device(np.ones((6, 4)), "int64"), to_device(np.array([0]), "int64")])
    g = to_device(randn(3, 4), "float32")
    with pytest.raises(IndexError, match=r"embedding_backward: index 5 out of range .*\(expected 0 <= index < 5\)"):
        run("embedding_backward", [g, to_device(np.array([0, 5, 1]), "int64")], [5])
    with pytest.raises(ValueError, match=r"embedding_backward: grad \[3, 4\] must be index's shape plus \[C\]"):
        run("embedding_backward", [g, to_device(np.array([0, 1]), "int64")], [5])
    with pytest.raises(ValueError, match="embedding_backward: num_weights must be >= 0"):
        run("embedding_backward", [g, to_device(np.array([0, 1, 2]), "int64")], [-1])


# ---- gather / scatter_add ----

# (x shape, dim, index size along dim)
GATHER_CASES = [
    ((5,), 0, 7),
    ((3, 4), 0, 2),
    ((3, 4), 1, 6),
    ((3, 4), -1, 1),
    ((2, 3, 4), 1, 5),
    ((2, 3, 4), -3, 3),
    ((2, 1, 17), 1, 4),
    ((2, 33, 3), 1, 0),  # empty index
    ((1, 1), 0, 1),
    ((64, 300), 1, 257),  # big enough for threads
    ((1000, 70), 0, 900),
]


def _index(xshape, dim, m):
    shape = list(xshape)
    shape[dim] = m
    return rng().integers(0, xshape[dim], size=shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xshape,dim,m", GATHER_CASES)
def test_gather(xshape, dim, m, dtype):
    x = _input(xshape, dtype)
    idx = _index(xshape, dim, m)
    (out,) = run("gather", [to_device(x, dtype), to_device(idx, "int64")], [dim])
    assert_close(out, np.take_along_axis(x, idx, axis=dim), dtype, rtol=0, atol=0, what=f"gather{xshape} {dim} {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xshape,dim,m", GATHER_CASES)
def test_scatter_add(xshape, dim, m, dtype):
    x = _input(xshape, dtype)
    idx = _index(xshape, dim, m)  # repeated targets accumulate
    src = _input(idx.shape, dtype)
    (out,) = run("scatter_add", [to_device(x, dtype), to_device(idx, "int64"), to_device(src, dtype)], [dim])
    assert_close(out, _add_at(x, idx, src, dim), dtype, what=f"scatter_add{xshape} {dim} {m}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gather_scatter_add_adjoint(dtype):
    # scatter_add into zeros is gather's backward: <gather(x), g> == <x, scatter_add(0, idx, g)>.
    x = round_to(randn(4, 6, 3), dtype)
    idx = _index(x.shape, 1, 9)
    g = round_to(randn(*idx.shape), dtype)
    (y,) = run("gather", [to_device(x, dtype), to_device(idx, "int64")], [1])
    (dx,) = run("scatter_add", [to_device(np.zeros_like(x), dtype), to_device(idx, "int64"), to_device(g, dtype)], [1])
    lhs, dxv = np.sum(y.numpy().astype(np.float64) * g), dx.numpy().astype(np.float64)
    # dx's sums are rounded once to the dtype (each off by at most u |dx|, u = 2^-24 or 2^-53); the two float64
    # dot products add at most n 2^-53 relative each.
    u = (2.0**-24 if dtype == "float32" else 2.0**-53) + 2 * x.size * 2.0**-53
    assert abs(lhs - np.sum(x * dxv)) <= u * np.sum(np.abs(x * dxv)), (lhs, np.sum(x * dxv))


def test_scatter_add_accumulates_in_double():
    # 20000 same-sign values into one slot: float32 accumulation would drift past rtol 1.3e-6.
    src = round_to(rng().uniform(0.5, 1.5, size=(20000, 2)), "float32")
    x = round_to(randn(3, 2), "float32")
    idx = np.ones((20000, 2), dtype=np.int64)
    (out,) = run("scatter_add", [to_device(x, "float32"), to_device(idx, "int64"), to_device(src, "float32")], [0])
    assert_close(out, _add_at(x, idx, src, 0), "float32")


def test_gather_scatter_add_bad_input():
    x = to_device(randn(3, 4), "float32")
    with pytest.raises(
        IndexError, match=r"gather: index 4 out of range for dim 1 of size 4 \(expected 0 <= index < 4\)"
    ):
        run("gather", [x, to_device(np.array([[0], [4], [1]]), "int64")], [1])
    with pytest.raises(IndexError, match="gather: index -1 out of range for dim 0 of size 3"):
        run("gather", [x, to_device(np.array([[0, 1, -1, 2]]), "int64")], [0])
    with pytest.raises(ValueError, match=r"gather: index \[2, 2\] must match x \[3, 4\] outside dim 1"):
        run("gather", [x, to_device(np.zeros((2, 2)), "int64")], [1])
    with pytest.raises(ValueError, match="gather: index must have x's number of dimensions"):
        run("gather", [x, to_device(np.zeros(3), "int64")], [0])
    with pytest.raises(ValueError, match="gather: index must be int64, got float32"):
        run("gather", [x, x], [0])
    with pytest.raises(ValueError, match="gather: dim 2 out of range"):
        run("gather", [x, to_device(np.zeros((3, 4)), "int64")], [2])
    src = to_device(randn(3, 1), "float32")
    with pytest.raises(IndexError, match="scatter_add: index 7 out of range for dim 1 of size 4"):
        run("scatter_add", [x, to_device(np.array([[0], [7], [1]]), "int64"), src], [1])
    with pytest.raises(IndexError, match="scatter_add: index -2 out of range for dim 1 of size 4"):
        run("scatter_add", [x, to_device(np.array([[0], [-2], [1]]), "int64"), src], [-1])
    with pytest.raises(ValueError, match=r"scatter_add: index and src: shapes \[3, 1\] and \[3, 2\] must be equal"):
        run("scatter_add", [x, to_device(np.zeros((3, 1)), "int64"), to_device(randn(3, 2), "float32")], [1])
    with pytest.raises(ValueError, match="scatter_add: dtype mismatch: float32 and float64"):
        run("scatter_add", [x, to_device(np.zeros((3, 1)), "int64"), to_device(randn(3, 1), "float64")], [1])
    with pytest.raises(ValueError, match=r"scatter_add: index \[2, 1\] must match x \[3, 4\] outside dim 1"):
        run("scatter_add", [x, to_device(np.zeros((2, 1)), "int64"), to_device(randn(2, 1), "float32")], [1])
