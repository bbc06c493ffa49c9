"""it.compile: the model (or function) with infinitrain's fusions applied as it runs (infinitrain.fusion).

    model = it.compile(model)          # as torch.compile: same calls, same results, the fused ops underneath

A compiled module is an OptimizedModule holding the original as `_orig_mod` (so its state_dict keys start with
"_orig_mod.", as PyTorch's do); attribute reads fall through to the original. There is no graph capture to
guard or recompile: every call runs the Python forward, and the fusion rules rewrite the ops it issues, so data-
dependent control flow, shape changes and graph breaks need no special handling. mode, fullgraph, dynamic and
backend are accepted; disable=True returns the model as it is.
"""

import functools

from infinitrain import autograd
from infinitrain import fusion as _fusion
from infinitrain.nn import Module


class fusing:  # noqa: N801 (a context manager, used as one)
    """Turns fusion on for this thread while it is entered (reentrant): the fusion rules rewrite the ops issued
    inside (infinitrain/fusion.py). The training layer runs every model forward in one."""

    def __enter__(self):
        self.prev = autograd.fusion.on
        autograd.fusion.on = True

    def __exit__(self, *exc):
        autograd.fusion.on = self.prev


def _settle(out):
    """Computes every pending tensor in a compiled call's output, so that what leaves the call is a value."""
    if isinstance(out, _fusion.Pending):
        out._t  # noqa: B018 (reading computes it)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _settle(o)
    elif isinstance(out, dict):
        for o in out.values():
            _settle(o)
    return out


class OptimizedModule(Module):
    """A module whose forward runs with fusion on; everything else is the wrapped module's."""

    def __init__(self, mod, mode=None):
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "mode", mode)

    def forward(self, *args, **kwargs):
        with fusing():
            return _settle(self._orig_mod(*args, **kwargs))

    def __getattr__(self, name):
        modules = self.__dict__.get("_modules")
        if modules is not None and "_orig_mod" in modules:
            return getattr(modules["_orig_mod"], name)
        raise AttributeError(name)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None, disable=False):
    """torch.compile's call forms: compile(model), compile(fn), and @compile / @compile(mode=...) decorators."""
    if model is None:
        return functools.partial(
            compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options, disable=disable
        )
    if disable:
        return model
    if isinstance(model, Module):
        return OptimizedModule(model, mode)
    if not callable(model):
        raise TypeError(f"it.compile expects a Module or a callable, got {type(model).__name__}")

    @functools.wraps(model)
    def compiled(*args, **kwargs):
        with fusing():
            return _settle(model(*args, **kwargs))

    return compiled
