"""What a PyTorch script touches besides the ops: the device namespace (it.cuda and any provider's), devices and
dtypes as objects with PyTorch's attributes, Tensor's Python protocols (__index__, __format__, __bool__, ...),
Tensor.to's forms, autograd.grad and autograd.Function, save/load's PyTorch arguments, and the compatibility
report over PyTorch's most used names."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng


def t(a, dtype=None, requires_grad=False):
    return it.tensor(a, dtype=dtype, device=DEVICE, requires_grad=requires_grad)


# ---- the device namespace ------------------------------------------------------------------------------------


def test_device_modules_exist_for_pytorch_names_and_providers():
    for name in ("cuda", "xpu", "mps"):
        mod = getattr(it, name)
        assert mod.device_count() >= 0 and isinstance(mod.is_available(), bool)
    for name in it.backends.available():
        assert getattr(it, name) is getattr(it, name)  # one cached namespace a name
    with pytest.raises(AttributeError):
        it.not_a_device  # noqa: B018


def test_ops_names_no_namespace_for_an_unknown_prefix():
    """it.ops.<prefix> where no op is named '<prefix>.<op>' is an AttributeError naming it (hasattr is False)."""
    assert not hasattr(it.ops, "no_such_provider")
    with pytest.raises(AttributeError, match=r"no op is named 'no_such_provider\.<op>'"):
        it.ops.no_such_provider  # noqa: B018


def test_device_module_of_the_device_under_test():
    kind = it.device(DEVICE).type
    if kind == "cpu":
        assert not it.cuda.is_available() or it.backends.registered() is not None
        return
    mod = getattr(it, kind)
    assert mod.is_available() and mod.device_count() >= 1 and mod.is_bf16_supported()
    mod.set_device(0)
    assert mod.current_device() == 0
    with mod.device(0):
        pass
    mod.synchronize()
    mod.reset_peak_memory_stats()
    x = it.randn(256, 256, device=DEVICE)
    assert mod.memory_allocated() >= x.numel() * 4 and mod.max_memory_allocated() >= mod.memory_allocated()
    assert mod.memory_reserved() >= mod.memory_allocated()
    s = mod.Stream()
    s.wait_stream(mod.current_stream())  # x was made on the current stream
    with mod.stream(s):
        y = x * 2
    mod.current_stream().wait_stream(s)  # y is read on the current stream below
    ev0, ev1 = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
    ev0.record()
    z = y + 1
    ev1.record()
    ev1.synchronize()
    assert ev1.query() and ev0.elapsed_time(ev1) >= 0.0
    np.testing.assert_allclose(z.numpy(), x.numpy() * 2 + 1, rtol=1e-6)
    with mod.amp.autocast(dtype="bfloat16"):
        assert (x @ x).dtype == "bfloat16"
    scaler = mod.amp.GradScaler(enabled=False)
    assert not scaler.is_enabled()
    del x, y, z
    mod.empty_cache()


def test_seeds():
    it.cuda.manual_seed(7)
    a = it.randn(5).numpy()
    it.manual_seed(7)
    assert it.initial_seed() == 7
    np.testing.assert_array_equal(it.randn(5).numpy(), a)
    s = it.seed()
    assert it.initial_seed() == s
    state = it.get_rng_state()
    b = it.rand(4).numpy()
    it.set_rng_state(state)
    np.testing.assert_array_equal(it.rand(4).numpy(), b)
    g = it.Generator(device=DEVICE).manual_seed(3)
    assert g.device == DEVICE
    with pytest.raises(TypeError, match="device"):
        it.Generator(5)


# ---- devices and dtypes --------------------------------------------------------------------------------------


def test_devices_and_dtypes_as_objects():
    x = t(rng().standard_normal((2, 3)))
    assert x.device.type == it.device(DEVICE).type and x.device == it.device(DEVICE)
    assert it.device("cpu").index is None and it.device("cpu").type == "cpu"
    assert it.device("cuda", 1).index == 1 and it.device("cuda", 1).type == "cuda"
    assert isinstance(x.dtype, it.dtype) and x.dtype == it.float64 and x.dtype.is_floating_point
    assert x.dtype.itemsize == 8 and x.element_size() == 8 and x.nbytes == 48 and x.itemsize == 8
    assert x.is_cuda == DEVICE.startswith("cuda") and x.get_device() == (-1 if DEVICE == "cpu" else 0)
    assert str(it.float32) == "float32" and it.float32 == "float32"


def test_to_forms():
    x = t(rng().standard_normal((2, 3)), "float32")
    assert x.to(it.float64).dtype == "float64"
    assert x.to(DEVICE, it.bfloat16).dtype == "bfloat16"
    y = t(np.zeros(2, dtype=np.int32))
    assert x.to(y).dtype == "int32" and x.to(y).device == y.device
    assert x.to(dtype=it.float16, non_blocking=True).dtype == "float16"
    c = x.to(DEVICE, copy=True)
    assert c is not x
    np.testing.assert_array_equal(c.numpy(), x.numpy())
    assert x.cpu().device == "cpu"
    with pytest.raises(ValueError, match="neither a dtype"):
        x.to("float128")


# ---- Python protocols ----------------------------------------------------------------------------------------


def test_index_format_and_scalar_conversions():
    i = t(3)
    data = list(range(10))
    assert data[i] == 3 and data[t(np.int64(2)) : t(5)] == [2, 3, 4]
    assert [10, 20, 30][t(np.array([1]))] == 20  # one element, 1-d
    with pytest.raises(TypeError, match="integer tensors of a single element"):
        data[t(1.5)]
    with pytest.raises(TypeError, match="integer tensors of a single element"):
        data[t([1, 2])]
    loss = t(np.float32(0.123456))
    assert f"{loss:.4f}" == "0.1235" and f"{t(7):3d}" == "  7"
    assert f"{loss}" == str(loss.item())  # a 0-d tensor formats as its value, as PyTorch's
    assert int(t(4.9)) == 4 and float(t([2.5])) == 2.5 and bool(t(1)) and not bool(t([0.0]))
    with pytest.raises(RuntimeError, match="2 elements cannot be converted"):
        float(t([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(t([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="ambiguous"):
        if t([True, False]):
            pass


def test_len_iteration_contains_array():
    a = rng().standard_normal((3, 4))
    x = t(a)
    assert len(x) == 3
    rows = list(x)
    assert len(rows) == 3 and all(r.shape == (4,) for r in rows)
    np.testing.assert_array_equal(rows[1].numpy(), a[1])
    assert a[0, 0] in x and 1e9 not in x
    np.testing.assert_array_equal(np.asarray(x), a)
    with pytest.raises(TypeError, match="0-d"):
        iter(t(1.0))
    with pytest.raises(TypeError, match="0-d"):
        len(t(1.0))


def test_operators_as_pytorch_gives_them():
    a = rng().standard_normal((3, 4))
    x = t(a)
    np.testing.assert_array_equal(abs(x).numpy(), np.abs(a))
    np.testing.assert_array_equal((+x).numpy(), a)
    np.testing.assert_allclose((x % 0.7).numpy(), np.remainder(a, 0.7))
    np.testing.assert_allclose((x // 0.7).numpy(), np.floor(a / 0.7))
    np.testing.assert_allclose((a[:, :1].T @ x).numpy(), a[:, :1].T @ a)  # __rmatmul__ from NumPy
    assert (x > 0).dtype == "bool"


# ---- autograd ------------------------------------------------------------------------------------------------


def test_autograd_grad():
    a = rng().standard_normal(5)
    x = t(a, "float64", requires_grad=True)
    y = (x * x).sum()
    (g,) = it.autograd.grad(y, x)
    np.testing.assert_allclose(g.numpy(), 2 * a)
    assert x.grad is None  # leaves untouched
    b = t(rng().standard_normal(5), "float64", requires_grad=True)
    out1, out2 = x * b, (x + b).sum()
    w = rng().standard_normal(5)
    gx, gb = it.autograd.grad([out1, out2], [x, b], [t(w, "float64"), None])
    np.testing.assert_allclose(gx.numpy(), w * b.numpy() + 1)
    np.testing.assert_allclose(gb.numpy(), w * a + 1)
    z = t(rng().standard_normal(2), "float64", requires_grad=True)
    with pytest.raises(RuntimeError, match="allow_unused"):
        it.autograd.grad((x * 2).sum(), [z])
    (none,) = it.autograd.grad((x * 2).sum(), [z], allow_unused=True)
    assert none is None
    (zeros,) = it.autograd.grad((x * 2).sum(), [z], materialize_grads=True)
    np.testing.assert_array_equal(zeros.numpy(), [0.0, 0.0])
    h = x * 3
    (gh,) = it.autograd.grad((h * h).sum(), [h])  # a non-leaf input
    np.testing.assert_allclose(gh.numpy(), 6 * a)
    with pytest.raises(NotImplementedError, match="create_graph"):
        it.autograd.grad((x * x).sum(), x, create_graph=True)


def test_autograd_backward_function():
    a = rng().standard_normal(4)
    x = t(a, "float64", requires_grad=True)
    it.autograd.backward([(x * 2).sum(), (x * x).sum()])
    np.testing.assert_allclose(x.grad.numpy(), 2 + 2 * a)


def test_custom_function():
    class Cube(it.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x * x * x * scale

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x * ctx.scale, None

    a = rng().standard_normal(5)
    x = t(a, "float64", requires_grad=True)
    y = Cube.apply(x, 2.0)
    np.testing.assert_allclose(y.numpy(), 2 * a**3)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * a**2)

    class SplitTwo(it.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 * 2 + g2 * 3

    z = t(a, "float64", requires_grad=True)
    p, q = SplitTwo.apply(z)
    (p.sum() + 0 * q.sum()).backward()
    np.testing.assert_allclose(z.grad.numpy(), np.full(5, 2.0))  # q's gradient materialises as zeros
    assert Cube.apply(t(a, "float64"), 1.0).requires_grad is False


def test_grad_fn():
    x = t(rng().standard_normal(3), "float64", requires_grad=True)
    y = (x * x).sum()
    assert x.grad_fn is None and y.grad_fn.name() == "sum" and y.grad_fn.next_functions[0][0].name() == "mul"


def test_detach_():
    x = t(rng().standard_normal(3), "float64", requires_grad=True)
    y = x * 2
    y.detach_()
    assert not y.requires_grad and y.grad_fn is None


# ---- files ---------------------------------------------------------------------------------------------------


def test_save_load_take_pytorch_arguments(tmp_path):
    obj = {"w": t(rng().standard_normal((2, 2)), "float32"), "step": 3}
    it.save(obj, tmp_path / "a.pt", pickle_protocol=4)
    back = it.load(tmp_path / "a.pt", map_location="cpu", weights_only=True, mmap=None)
    assert back["step"] == 3
    np.testing.assert_array_equal(back["w"].numpy(), obj["w"].numpy())
    back2 = it.load(tmp_path / "a.pt", it.device("cpu"))
    assert back2["w"].device == "cpu"


# ---- the compatibility report --------------------------------------------------------------------------------


def test_compatibility_report_is_current_and_covers_90_percent():
    from harness import repo_file
    from infinitrain.tools import pytorch_api

    rows = pytorch_api.probe()
    assert len(rows) >= 300
    assert pytorch_api.coverage(rows) >= 0.9, [r for r in rows if r[2] != "present"]
    with open(repo_file("docs/pytorch_api.md")) as f:
        assert f.read() == pytorch_api.render(
            rows
        ), "python -m infinitrain.tools.pytorch_api --output docs/pytorch_api.md"


def test_report_detects_a_missing_parameter():
    from infinitrain.tools import pytorch_api

    def f(input, dim):
        return input

    assert pytorch_api.compare(f, ["input", "dim", ":keepdim"]) == ["no keepdim="]
    assert pytorch_api.compare(f, ["input", "axis"]) == ["parameter 2 is dim, PyTorch's axis"]
    assert pytorch_api.compare(lambda *size, dtype=None: None, ["*size", ":dtype", ":out"]) == []
