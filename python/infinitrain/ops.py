"""Any op of the op table by name, providers' own ops included.

    it.ops.call("fake.scale_add", x, y, alpha=2.0)
    it.ops.fake.scale_add(x, y, alpha=2.0)     # the same: a namespace per provider
    it.ops.schema("layernorm")                 # 'layernorm(x, weight, bias; eps: float) -> (out, mean, rstd)'
    it.ops.names()                             # every op, table order

Inputs are Tensors, attributes keywords named as in the schema. The result is
a Tensor, a tuple of them for several outputs, or None for an in-place op.
Ops called this way record no autograd graph: the differentiable versions are
infinitrain.functional's.
"""

import functools

from infinitrain import _C, dispatch
from infinitrain.tensor import Tensor


@functools.cache
def _info(name):
    return dispatch.op(name).info()


def schema(name):
    return _info(name)["schema"]


def names():
    return [o["name"] for o in _C.ops()]


def call(name, *inputs, **attrs):
    info = _info(name)
    wanted = info["attr_names"]
    unexpected = sorted(set(attrs) - set(wanted))
    missing = [a for a in wanted if a not in attrs]
    if unexpected or missing:
        raise TypeError(
            f"{info['schema']}: "
            + "; ".join(
                ([f"unexpected attribute(s) {', '.join(unexpected)}"] if unexpected else [])
                + ([f"missing attribute(s) {', '.join(missing)}"] if missing else [])
            )
        )
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: inputs must be infinitrain Tensors, got {type(t).__name__}")
    outs = [Tensor(t) for t in dispatch.call(name, inputs, [attrs[a] for a in wanted])]
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


class _Namespace:
    """The ops named '<prefix>.<op>'."""

    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, op):
        name = f"{self._prefix}.{op}"
        if name not in names():
            raise AttributeError(f"no op '{name}' (the op table has {', '.join(self.__dir__())})")
        return functools.partial(call, name)

    def __dir__(self):
        return [n.split(".", 1)[1] for n in names() if n.startswith(self._prefix + ".")]


def __getattr__(prefix):
    if any(n.startswith(prefix + ".") for n in names()):
        return _Namespace(prefix)
    raise AttributeError(f"module 'infinitrain.ops' has no attribute '{prefix}' (no op is named '{prefix}.<op>')")
