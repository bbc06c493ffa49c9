"""torch.utils.checkpoint: run a function without keeping its activations, recomputing them in backward."""

from infinitrain.nn import recompute
from infinitrain.tensor import Tensor


def checkpoint(
    function,
    *args,
    use_reentrant=None,
    context_fn=None,
    determinism_check="default",
    debug=False,
    preserve_rng_state=True,
    **kwargs,
):
    """function(*args, **kwargs), its activations recomputed in backward (random ops draw the same numbers in the
    recompute). The function returns one tensor. use_reentrant and the other switches are accepted: there is one
    implementation."""
    if kwargs:
        return recompute.checkpoint(lambda *a: function(*a, **kwargs), *args)
    out = recompute.checkpoint(function, *args)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: the function must return one tensor, got {type(out).__name__}")
    return out


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Runs a Sequential (or a list of modules) in `segments` checkpointed pieces, the last one normally."""
    fns = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = max(1, len(fns) // max(1, int(segments)))
    x = input
    for start in range(0, len(fns), size):
        piece = fns[start : start + size]

        def run(y, piece=piece):
            for f in piece:
                y = f(y)
            return y

        x = checkpoint(run, x) if start + size < len(fns) else run(x)
    return x
