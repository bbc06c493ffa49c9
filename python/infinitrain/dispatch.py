"""The Python side of the dispatcher: op lookup, calls, graph recording and
dtype promotion. Every module that runs ops goes through here; it imports only
the native core and autograd, so nothing above it forms an import cycle.

Which implementation runs (a device's kernel, the op's composite, the CPU
fallback) is the native dispatcher's choice; `how(name, device)` reports it.
"""

import contextlib
import numbers

from infinitrain import _C, autograd

_ops = {}


def op(name):
    """The native op object (cached: this is on every op's path)."""
    o = _ops.get(name)
    if o is None:
        o = _ops[name] = _C.op(name)
    return o


def call(name, inputs, attrs=()):
    """Runs op `name` on Tensors (anything with a native `_t`); returns the native outputs."""
    return op(name)([t._t for t in inputs], list(attrs))


def how(name, device):
    """How `device` runs op `name`: 'native', 'composite', 'cpu-fallback' or 'missing'."""
    return op(name).how(device)


def set_composite(name, fn):
    """Registers fn(native inputs, attrs) -> native outputs as the composite of op `name`."""
    op(name).set_composite(fn)


@contextlib.contextmanager
def prefer_composites(names):
    """Inside, the ops `names` run their composites even where a device has a kernel (to compare the paths)."""
    ops = [op(n) for n in names]
    for o in ops:
        o.prefer_composite(True)
    try:
        yield
    finally:
        for o in ops:
            o.prefer_composite(False)


def needs_grad(*ts):
    """Whether an op on these tensors must record a graph node."""
    if not autograd.is_grad_enabled():
        return False
    for t in ts:
        if t is not None and t.requires_grad:
            return True
    return False


def record(out, inputs, backward, name, saved=(), fold=None):
    """Makes `out` a graph node; `saved` lists the tensors whose values backward reads; `fold` as autograd.Node's."""
    out.requires_grad = True
    out._node = autograd.Node(backward, inputs, name, tuple((t._t, t._t.version) for t in saved), fold)
    return out


_FLOAT_RANK = {"bfloat16": 0, "float16": 0, "float32": 1, "float64": 2}
# PyTorch's categories: bool < integers < floats; the higher category decides the result's kind.
_KIND = {"bool": 0, "uint8": 1, "int8": 1, "int32": 1, "int64": 1}
_KIND.update(dict.fromkeys(_FLOAT_RANK, 2))
_INT_RANK = {"uint8": 0, "int8": 0, "int32": 1, "int64": 2}


def is_float(dtype):
    return dtype in _FLOAT_RANK


def promoted_dtype(a, b):
    """The dtype two tensors' dtypes meet at, by PyTorch's rules: bool < integers < floats by category, the
    wider within one; bfloat16 with float16 meet at float32, uint8 with int8 at int32 (there is no int16)."""
    if a == b:
        return a
    ka, kb = _KIND.get(a), _KIND.get(b)
    if ka is None or kb is None:
        raise ValueError(f"dtype mismatch: {a} and {b} (cast one with .to(dtype))")
    if ka != kb:
        return a if ka > kb else b
    rank = _FLOAT_RANK if ka == 2 else _INT_RANK
    ra, rb = rank[a], rank[b]
    if ra == rb:
        return "float32" if ka == 2 else "int32"
    return a if ra > rb else b


def result_dtype(a, b):
    """The dtype two tensors meet at, as PyTorch's result_type: tensors with dimensions outrank 0-d ones, so a
    0-d tensor beside a tensor with dimensions acts as a scalar of its category: it decides the dtype only when
    its category (bool < integers < floats) is higher, and then gives its own (`x_bf16 * tensor(2.0)` stays
    bfloat16, `int64 * tensor(0.5)` is float32, `int32 * tensor(7)` stays int32). Otherwise promoted_dtype."""
    da, db = a.dtype, b.dtype
    if da == db:
        return da
    za, zb = a.ndim == 0, b.ndim == 0
    if za == zb:
        return promoted_dtype(da, db)
    dim, zero = (db, da) if za else (da, db)
    kd, kz = _KIND.get(dim), _KIND.get(zero)
    if kd is None or kz is None:
        raise ValueError(f"dtype mismatch: {da} and {db} (cast one with .to(dtype))")
    return zero if kz > kd else dim


def scalar_dtype(value, dtype):
    """The dtype a Python scalar takes beside a tensor of `dtype` (PyTorch's rules: a scalar does not widen
    a tensor of its own category; a float scalar makes an integer or bool tensor float32, an int scalar makes
    a bool tensor int64)."""
    if isinstance(value, bool):
        return dtype
    if isinstance(value, numbers.Integral):
        return "int64" if dtype == "bool" else dtype
    if isinstance(value, numbers.Real):
        return dtype if dtype in _FLOAT_RANK else "float32"
    raise TypeError(f"expected a Tensor or a Python number, got {type(value).__name__}")
