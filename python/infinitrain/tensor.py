"""Tensor: a native tensor handle plus autograd metadata, and the functions that create tensors.

The data lives in the C++ core (`_C.Tensor`, always contiguous); this class
adds requires_grad, .grad, the recorded Node and hooks, host access and the
in-place fills. The differentiable methods (arithmetic, shape, reductions,
`.to()`, `.backward()`) are attached by infinitrain.tensor_methods, which
forwards them to infinitrain.functional; keeping them out of this module keeps
the op layer free of import cycles.
"""

import hashlib

import numpy as np

from infinitrain import _C, autograd, dispatch, dtypes
from infinitrain import random as _random
from infinitrain.runtime import device_object

DTYPES = tuple(dtypes.BY_NAME[n] for n in dtypes.NAMES)
# What a tensor may be cast to: DTYPES and the float8 storage dtypes.
CAST_DTYPES = DTYPES + tuple(dtypes.BY_NAME[n] for n in dtypes.FLOAT8)
FLOAT_DTYPES = tuple(dtypes.BY_NAME[n] for n in ("float16", "bfloat16", "float32", "float64"))
_DTYPE = dtypes.BY_NAME
_NUMPY_TO_DTYPE = {np.dtype(d): d for d in DTYPES if d != "bfloat16"}


def _check_dtype(dtype):
    if dtype not in CAST_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(CAST_DTYPES)}")
    return dtype


class _Meta:
    """A tensor on the "meta" device: its shape and dtype, no storage, and the steps that initialised it (the last
    whole-tensor one: a fill, a random draw's seed and offset, or where to read the values; then any scalar writes
    into parts, such as an embedding's padding row), which materialize() replays on a real device. A model built
    there costs no memory; a sharded model materialises only what each rank owns."""

    __slots__ = ("shape", "dtype", "init")
    device = "meta"

    def __init__(self, shape, dtype, init=None):
        self.shape, self.dtype, self.init = tuple(shape), dtype, [init] if init else []

    @property
    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self):  # shown in a native op's refusal of it
        return f"<meta tensor {self.dtype}{list(self.shape)}: no data; materialise it on a device first>"

    def __getattr__(self, name):  # what Python code would read of a native tensor
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(
            f"a tensor on the meta device has no data ({name}): a model built on device 'meta' runs once "
            "FullyShardedDataParallel has materialised it (--zero_stage=3)"
        )


class Tensor:
    __slots__ = (
        "_t",
        "requires_grad",
        "grad",
        "_node",
        "_hooks",
        "_post_hooks",
        "_retains_grad",
        "_edge",
        "__weakref__",
    )
    # NumPy defers `array op tensor` to the tensor's reflected operator instead of converting the tensor.
    __array_priority__ = 1000

    def __init__(self, native, requires_grad=False):
        self._t = native
        self.requires_grad = requires_grad
        self.grad = None
        self._node = None
        self._hooks = None
        self._post_hooks = None
        self._retains_grad = False

    # ---- metadata ----
    @property
    def shape(self):
        return self._t.shape

    @property
    def dtype(self):
        return _DTYPE[self._t.dtype]

    @property
    def device(self):
        return device_object(self._t.device)

    @property
    def is_cuda(self):
        return self._t.device.startswith("cuda")

    @property
    def is_cpu(self):
        return self._t.device == "cpu"

    @property
    def is_meta(self):
        return type(self._t) is _Meta

    def get_device(self):
        """The device index, -1 for the cpu and meta (PyTorch's)."""
        d = self._t.device
        return -1 if d in ("cpu", "meta") else int(d.partition(":")[2])

    @property
    def ndim(self):
        return len(self._t.shape)

    @property
    def data(self):
        """The same storage without autograd history (PyTorch's .data)."""
        return Tensor(self._t)

    @data.setter
    def data(self, other):
        if tuple(other.shape) != self.shape and self.requires_grad:
            raise ValueError(f".data: shape {tuple(other.shape)} does not match {self.shape}")
        self._t = other._t

    def is_floating_point(self):
        return self._t.dtype in FLOAT_DTYPES

    def element_size(self):
        return _DTYPE[self._t.dtype].itemsize

    @property
    def itemsize(self):
        return _DTYPE[self._t.dtype].itemsize

    @property
    def nbytes(self):
        return self._t.numel * _DTYPE[self._t.dtype].itemsize

    def is_contiguous(self, memory_format=None):
        return True  # tensors here are always contiguous

    def dim(self):
        return len(self._t.shape)

    def numel(self):
        return self._t.numel

    def size(self, dim=None):
        if dim is None:
            return self._t.shape
        return self._t.shape[dim]

    @property
    def is_leaf(self):
        return self._node is None

    def is_pinned(self):
        return self._t.is_pinned

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __contains__(self, element):
        if not isinstance(element, (Tensor, int, float, bool)):
            raise RuntimeError(f"Tensor.__contains__ takes a Tensor or a scalar, got {type(element).__name__}")
        return bool((self == element).numpy().any())

    def __index__(self):
        if self._t.numel != 1 or self._t.dtype in FLOAT_DTYPES:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.numpy().reshape(()))

    def __format__(self, spec):
        if self._t.numel == 1 and not self._t.shape:
            return format(self.item(), spec)
        return object.__format__(self, spec) if spec else repr(self)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        if type(self._t) is _Meta:
            return f"tensor(..., size={self.shape}, dtype={self.dtype}, device='meta'{grad})"
        body = np.array2string(self.numpy(), precision=4, threshold=20, edgeitems=3)
        return f"tensor({body}, dtype={self.dtype}, device={self.device}{grad})"

    # ---- host access ----
    def numpy(self, *, force=False):
        """A host copy (bfloat16 arrives as float32)."""
        return self._t.numpy()

    def __array__(self, dtype=None, copy=None):
        a = self._t.numpy()
        return a if dtype is None else a.astype(dtype)

    def __reduce__(self):
        # Pickles as host data plus dtype, device and requires_grad (a state_dict pickles as PyTorch's does).
        return (_unpickle, (self.numpy(), self.dtype, self.device, self.requires_grad, type(self)))

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item(): the tensor has {self.numel()} elements, expected 1")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def _scalar(self, what):
        if self._t.numel != 1:
            raise RuntimeError(f"a Tensor with {self._t.numel} elements cannot be converted to {what}")
        return self.numpy().reshape(()).item()

    def __float__(self):
        return float(self._scalar("Scalar"))

    def __int__(self):
        return int(self._scalar("Scalar"))

    def __bool__(self):
        if self._t.numel != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self._t.numel} values is ambiguous")
        return bool(self.numpy().reshape(()).item())

    def __complex__(self):
        return complex(self._scalar("Scalar"))

    def pin_memory(self):
        """A copy in page-locked host memory (a cpu tensor), which copies to a device read asynchronously."""
        return Tensor(self._t.pin_memory())

    # ---- autograd metadata ----
    def detach(self):
        return Tensor(self._t)

    def requires_grad_(self, requires_grad=True):
        flag = requires_grad
        if flag and self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"only floating tensors can require grad, this one is {self.dtype}")
        self.requires_grad = flag
        return self

    def register_hook(self, hook):
        """hook(grad) runs when this tensor's gradient is computed; a returned tensor replaces the gradient."""
        fn = hook
        if not self.requires_grad:
            raise RuntimeError("register_hook on a tensor that does not require grad")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        autograd.pin(self)
        return fn

    def register_post_accumulate_grad_hook(self, fn):
        """fn(tensor) runs after backward accumulated into this leaf's .grad (DDP starts its all-reduces so)."""
        if not self.requires_grad or self._node is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only for leaf tensors that require grad")
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return fn

    def retain_grad(self):
        self._retains_grad = True
        autograd.pin(self)

    def _accumulate_grad(self, g, sole=False):
        """sole: nothing else references g or its memory, so its memory can become .grad (in a fresh wrapper, without
        g's graph state). Otherwise a copy: backward may hand the same gradient tensor to several inputs."""
        if self.grad is None:
            self.grad = Tensor(g._t if sole else dispatch.call("cast", [g], [g.dtype])[0])
        else:
            dispatch.call("axpy_", [self.grad, g], [1.0])

    # ---- in place (no autograd) ----
    def zero_(self):
        return self.fill_(0.0)

    def fill_(self, value):
        if type(self._t) is _Meta:
            self._t.init = [("fill", float(value))]
            return self
        dispatch.call("fill_", [self], [float(value)])
        return self

    def copy_(self, src, non_blocking=False):
        """Copies src's values into this tensor (converting dtype; from another device too)."""
        if type(self._t) is _Meta:
            return _copy_into_meta(self, src)
        if not isinstance(src, Tensor):
            src = tensor(src, dtype=self.dtype, device=self.device)
        if src.device != self.device:
            src = Tensor(src._t.to(self.device, non_blocking))
        dispatch.call("copy_", [self, src])
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        return self._random_("normal_", float(mean), float(std), generator)

    def uniform_(self, from_=0.0, to=1.0, *, generator=None):
        return self._random_("uniform_", float(from_), float(to), generator)

    def _random_(self, op, a, b, generator):
        # Counter-based draws: the seed and offset are the whole draw, so a meta tensor records them and its
        # materialisation on any device gives the numbers this call would have.
        seed, offset = (generator or _random.default_generator).advance(self.numel())
        if type(self._t) is _Meta:
            self._t.init = [(op, a, b, seed, offset)]
        else:
            dispatch.call(op, [self], [a, b, seed, offset])
        return self

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
        """Ones of `size` with this tensor's dtype and device (unless given)."""
        return full(
            _shape(size), 1.0, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad
        )

    def contiguous(self):
        return self


# ---- creation ----


def _native_dtype_of(arr, dtype):
    if dtype is not None:
        return _check_dtype(dtype)
    if arr.dtype.kind == "f":
        return {np.dtype(np.float64): "float64", np.dtype(np.float16): "float16"}.get(arr.dtype, "float32")
    if arr.dtype in _NUMPY_TO_DTYPE:
        return _NUMPY_TO_DTYPE[arr.dtype]
    raise ValueError(f"cannot make a tensor from NumPy dtype {arr.dtype}")


def from_numpy(ndarray, dtype=None, device="cpu", requires_grad=False, pin_memory=False):
    """A tensor holding a copy of `ndarray` (NumPy floats keep their width unless dtype says otherwise)."""
    arr = np.asarray(ndarray)
    dtype = _native_dtype_of(arr, dtype)
    if device == "meta":
        held = arr.copy()
        t = Tensor(_Meta(arr.shape, dtype, ("data", lambda: held)))
        return t.requires_grad_() if requires_grad else t
    carrier = np.float32 if dtype in dtypes.FLOAT32_CARRIED else np.dtype(dtype)
    # ascontiguousarray makes 0-d arrays 1-d; keep the shape.
    native = _C.from_numpy(np.ascontiguousarray(arr, dtype=carrier).reshape(arr.shape), dtype, device, pin_memory)
    t = Tensor(native)
    if requires_grad:
        t.requires_grad_()
    return t


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """Like torch.tensor: Python floats become the default dtype (float32), ints int64; tensors in the data are
    read as values (a copy)."""
    if isinstance(data, Tensor):
        arr = data.numpy()
        dtype = dtype or data.dtype
    elif isinstance(data, (list, tuple)) and data and any(isinstance(d, Tensor) for d in data):
        arr = np.asarray([d.numpy() if isinstance(d, Tensor) else d for d in data])
    else:
        arr = np.asarray(data)
    if dtype is None and arr.dtype == np.float64 and not isinstance(data, np.ndarray):
        dtype = dtypes.get_default_dtype()
    return from_numpy(arr, dtype, device or "cpu", requires_grad, pin_memory)


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def empty(*size, out=None, dtype=None, device=None, requires_grad=False, pin_memory=False, memory_format=None):
    dtype = dtype or dtypes.get_default_dtype()
    if device == "meta":
        t = Tensor(_Meta(_shape(size), _check_dtype(dtype)))
    else:
        t = Tensor(_C.empty(list(_shape(size)), _check_dtype(dtype), device or "cpu", pin_memory))
    return t.requires_grad_() if requires_grad else t


def _copy_into_meta(t, src):
    """copy_ into a meta tensor: another meta tensor's record (replayed in its dtype), or a snapshot of the values."""
    shape = tuple(src.shape) if isinstance(src, Tensor) else np.shape(src)
    try:
        fits = np.broadcast_shapes(shape, t.shape) == t.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"copy_: values of shape {shape} do not fit a tensor of shape {t.shape}")
    if isinstance(src, Tensor) and src.is_meta:
        steps, dtype = list(src._t.init), src.dtype
        if dtype == t.dtype and shape == t.shape:
            t._t.init = steps
        else:
            read = lambda: materialize(Tensor(_Meta(shape, dtype)), "cpu", steps).numpy()  # noqa: E731
            t._t.init = [("data", read, ("copy", dtype, shape, _steps_key(steps)))]
        return t
    held = src.numpy() if isinstance(src, Tensor) else np.array(src, copy=True)
    key = ("values", hashlib.sha256(np.ascontiguousarray(held).tobytes()).hexdigest()[:16], held.shape)
    t._t.init = [("data", lambda: np.broadcast_to(held, t.shape), key)]
    return t


def _steps_key(steps):
    """What identifies recorded steps across processes: the values themselves, or a file read's key."""
    return tuple(
        (step[0], repr(step[1]), step[2]) if step[0] == "setitem" else ("data", step[2]) if step[0] == "data" else step
        for step in steps
    )


def init_key(t):
    """What identifies a meta tensor's recorded initialisation across processes (FullyShardedDataParallel checks
    that every rank built the same)."""
    return _steps_key(t._t.init)


def load_(t, read, key=None):
    """Copies read() (a NumPy array of t's shape) into t, or, for a meta tensor, records read to be called when it is
    materialised: a sharded model then reads only the slices of a file that its rank owns. key: what identifies
    the values across processes (a file's fingerprint and the slice), for the ranks' same-build check."""
    if type(t._t) is _Meta:
        t._t.init = [("data", read, key)]
        return t
    arr = np.asarray(read())
    if tuple(arr.shape) != tuple(t.shape):
        raise ValueError(f"load_: values of shape {tuple(arr.shape)} for a tensor of shape {tuple(t.shape)}")
    return t.copy_(from_numpy(arr, dtype=t.dtype))


def materialize(t, device, steps=None):
    """A meta tensor's values on `device` (its recorded initialisation replayed: the same numbers the build would
    have given there), as a new Tensor; a tensor with storage is returned as it is."""
    m = t._t
    if type(m) is not _Meta:
        return t
    out = empty(*m.shape, dtype=m.dtype, device=device)
    for step in m.init if steps is None else steps:
        kind = step[0]
        if kind == "fill":
            out.fill_(step[1])
        elif kind in ("normal_", "uniform_"):
            dispatch.call(kind, [out], list(step[1:]))
        elif kind == "data":
            load_(out, step[1])
        else:  # "setitem": a scalar written into part of it
            out[step[1]] = step[2]
    return out


def _fill_dtype(value):
    """full()'s dtype for a fill value, as PyTorch infers it: bool, int64 or float32."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int64"
    return "float32"


def full(size, fill_value, *, out=None, dtype=None, device=None, requires_grad=False, layout=None):
    value = fill_value.item() if isinstance(fill_value, Tensor) else fill_value
    dtype = dtype or (dtypes.get_default_dtype() if _fill_dtype(value) == "float32" else _fill_dtype(value))
    t = empty(*_shape((size,)), dtype=dtype, device=device).fill_(value)
    return t.requires_grad_() if requires_grad else t


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return full(
        input.shape, fill_value, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad
    )


def empty_like(input, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return empty(*input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def zeros(*size, out=None, dtype=None, device=None, requires_grad=False, layout=None):
    return full(
        _shape(size), 0.0, dtype=dtype or dtypes.get_default_dtype(), device=device, requires_grad=requires_grad
    )


def ones(*size, out=None, dtype=None, device=None, requires_grad=False, layout=None):
    return full(
        _shape(size), 1.0, dtype=dtype or dtypes.get_default_dtype(), device=device, requires_grad=requires_grad
    )


def zeros_like(input, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return zeros(input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return ones(input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return randn(
        *input.shape,
        dtype=dtype or input.dtype,
        device=device or input.device,
        generator=generator,
        requires_grad=requires_grad,
    )


def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad=False, layout=None, memory_format=None):
    return rand(
        *input.shape,
        dtype=dtype or input.dtype,
        device=device or input.device,
        generator=generator,
        requires_grad=requires_grad,
    )


def randn(*size, generator=None, out=None, dtype=None, device=None, requires_grad=False, pin_memory=False, layout=None):
    t = empty(*_shape(size), dtype=dtype, device=device, pin_memory=pin_memory).normal_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def rand(*size, generator=None, out=None, dtype=None, device=None, requires_grad=False, pin_memory=False, layout=None):
    t = empty(*_shape(size), dtype=dtype, device=device, pin_memory=pin_memory).uniform_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def host_rng(generator, n):
    """A NumPy generator for a host-side draw of n numbers from our generator's counter stream: the same
    (seed, offset) gives the same numbers on every device, and the generator moves on by n."""
    seed, offset = (generator or _random.default_generator).advance(n)
    return np.random.default_rng([seed, offset])


def randint(*args, size=None, generator=None, dtype="int64", device="cpu", requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers uniform in [low, high), as PyTorch's."""
    if size is not None:
        args = (*args, size)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError("randint(high, size) or randint(low, high, size)")
    size = _shape((size,)) if isinstance(size, (tuple, list)) else _shape((size,))
    low, high = int(low), int(high)
    if high <= low:
        raise ValueError(f"randint: need low < high, got [{low}, {high})")
    n = int(np.prod(size)) if size else 1
    values = host_rng(generator, n).integers(low, high, size=size, dtype=np.int64)
    if requires_grad:
        raise ValueError("randint: integer tensors cannot require grad")
    return from_numpy(values, dtype=dtype, device=device)


def randperm(
    n, *, generator=None, out=None, dtype="int64", device=None, requires_grad=False, pin_memory=False, layout=None
):
    return from_numpy(
        host_rng(generator, n).permutation(int(n)), dtype=dtype, device=device or "cpu", pin_memory=pin_memory
    )


def arange(start, end=None, step=1, *, out=None, dtype=None, device="cpu", requires_grad=False, layout=None):
    """arange(end) or arange(start, end, step), as PyTorch: int64 when every bound is an integer, float32
    otherwise (unless dtype says)."""
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Tensor):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange: {name} must be a number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    values = np.arange(start, end, step, dtype=np.int64 if ints else np.float64)
    t = from_numpy(values, dtype=dtype or ("int64" if ints else "float32"), device=device)
    return t.requires_grad_() if requires_grad else t


def _unpickle(array, dtype, device, requires_grad, cls):
    t = from_numpy(array, dtype=dtype, device=device)
    if cls is not Tensor:
        t = cls(t, requires_grad) if requires_grad is not None else cls(t)
    elif requires_grad:
        t.requires_grad_()
    return t
