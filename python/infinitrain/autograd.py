"""Reverse-mode autodiff, small enough to read at once.

Every differentiable op result carries a Node: the backward function that maps
the output's gradient to its inputs' gradients, and the inputs that need them.
backward() walks the graph in reverse topological order, summing gradients
that meet, running tensor hooks, and accumulating into leaves' .grad.
"""

import sys
import threading

_state = threading.local()


def is_grad_enabled():
    return getattr(_state, "enabled", True)


class _GradMode:
    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        self.prev = is_grad_enabled()
        _state.enabled = self.enabled

    def __exit__(self, *exc):
        _state.enabled = self.prev

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with _GradMode(self.enabled):
                return fn(*args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper


def no_grad():
    """Context manager (and decorator) under which ops record no graph."""
    return _GradMode(False)


def enable_grad():
    return _GradMode(True)


class Node:
    """One recorded op: backward(grad) returns one gradient (or None) per input. `saved` holds
    (native tensor, version) for each tensor the backward reads, to catch in-place writes since. With `fold` (an
    input's position), backward(grad, pending) also takes the gradient that input has gathered so far from its
    other uses (or None) and returns it added to its own, so the sum costs no separate pass (a norm's backward
    adds the residual stream's gradient in its kernel)."""

    __slots__ = ("backward", "inputs", "name", "saved", "fold")

    def __init__(self, backward, inputs, name, saved=(), fold=None):
        self.backward = backward
        self.inputs = inputs
        self.name = name
        self.saved = saved
        self.fold = fold


def _toposort(root):
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t._node is not None:
            for p in t._node.inputs:
                if p is not None and p.requires_grad and id(p) not in seen:
                    stack.append((p, False))
    return order[::-1]


def backward(root, grad=None, retain_graph=False):
    if not root.requires_grad:
        raise RuntimeError("backward(): the tensor does not require grad (did you call it under no_grad?)")
    if grad is None:
        if root.numel() != 1:
            raise RuntimeError(f"backward(): grad can be omitted only for a single-element tensor, got {root.shape}")
        grad = root.new_ones(root.shape)
    elif grad.shape != root.shape or grad.dtype != root.dtype or grad.device != root.device:
        raise ValueError(
            f"backward(): grad is {grad.dtype}{list(grad.shape)} on {grad.device}, "
            f"expected {root.dtype}{list(root.shape)} on {root.device}"
        )
    grads = {id(root): grad}
    if getattr(_state, "callbacks", None) is not None:  # inside another backward (activation recompute):
        with no_grad():  # its callbacks wait for the outermost one
            _run(root, grads, retain_graph)
        return
    _state.callbacks = []
    try:
        with no_grad():
            _run(root, grads, retain_graph)
            while _state.callbacks:
                _state.callbacks.pop(0)()
    finally:
        _state.callbacks = None


def queue_callback(fn):
    """fn() runs once the (outermost) backward() in progress on this thread has been through the graph (DDP
    waits for its all-reduces there); outside a backward it is an error."""
    if getattr(_state, "callbacks", None) is None:
        raise RuntimeError("queue_callback: no backward() is running on this thread")
    _state.callbacks.append(fn)


def current_backward():
    """A token of the outermost backward() running on this thread (None outside one): equal tokens, one pass."""
    return getattr(_state, "callbacks", None)


def _counts_locals():
    """Whether sys.getrefcount sees a local's reference: so on CPython before 3.14 (later versions may borrow
    references the interpreter holds, and a count of 2 would then mean another holder)."""
    probe = object()
    return sys.getrefcount(probe) == 2


# A gradient that nothing else references becomes a leaf's .grad without a copy of its memory (as PyTorch's
# AccumulateGrad steals one); elsewhere every gradient is copied.
_STEAL = (
    sys.implementation.name == "cpython"
    and sys.version_info < (3, 14)
    and getattr(sys, "_is_gil_enabled", lambda: True)()
    and _counts_locals()
)


def _run(root, grads, retain_graph):
    for t in _toposort(root):
        g = grads.pop(id(t), None)
        if g is None:
            continue
        for hook in t._hooks or ():
            r = hook(g)
            if r is not None:
                if r.shape != g.shape or r.dtype != g.dtype or r.device != g.device:
                    raise ValueError(
                        f"a hook returned {r.dtype}{list(r.shape)} on {r.device} for a gradient of "
                        f"{g.dtype}{list(g.shape)} on {g.device}"
                    )
                g = r
        r = hook = None  # a hook's result must not count as another holder of a later gradient
        node = t._node
        if node is None:
            # References to g: this frame's and getrefcount's own; to its native tensor: g's and getrefcount's
            # (another wrapper of it, such as a kept g.detach(), is a third).
            sole = _STEAL and sys.getrefcount(g) == 2 and sys.getrefcount(g._t) == 2 and g._t.sole_owner
            t._accumulate_grad(g, sole)
            for hook in t._post_hooks or ():
                hook(t)
            continue
        if t._retains_grad:
            t._accumulate_grad(g)
        for native, version in node.saved:
            if native.version != version:
                raise RuntimeError(
                    f"a tensor that the backward of '{node.name}' needs was modified in place after it was "
                    f"used (version {native.version}, saved at {version}); clone it before writing to it"
                )
        if node.fold is None:
            in_grads = node.backward(g)
        else:
            fp = node.inputs[node.fold]
            pending = grads.pop(id(fp), None) if fp is not None and fp.requires_grad else None
            in_grads = node.backward(g, pending)
            if pending is not None and in_grads[node.fold] is None:
                grads[id(fp)] = pending  # the backward declined to fold it: keep it
            fp = pending = None  # no stray references (see in_grads below)
        for p, pg in zip(node.inputs, in_grads, strict=True):
            if p is None or pg is None or not p.requires_grad:
                continue
            if pg.dtype != p.dtype:
                pg = pg.to(p.dtype)
            prev = grads.get(id(p))
            grads[id(p)] = pg if prev is None else prev + pg
        in_grads = pg = prev = None  # no stray references: a leaf's gradient is handed over when it has no others
        if not retain_graph:
            # Drop the inputs (and the activations the closure holds) so the graph can be freed.
            t._node = Node(_freed, (), node.name)


def _freed(_):
    raise RuntimeError("backward through a graph a second time: pass retain_graph=True to the first backward()")
