"""Reverse-mode autodiff, small enough to read at once.

Every differentiable op result carries a Node: the backward function that maps
the output's gradient to its inputs' gradients, and the inputs that need them.
backward() walks the graph in reverse topological order, summing gradients
that meet, running tensor hooks, and accumulating into leaves' .grad.
"""

import sys
import threading
import weakref

_state = threading.local()


class _FusionState(threading.local):
    """Whether this thread runs a compiled forward (it.compile): the op layer then fuses what it can
    (infinitrain.fusion). Backward always runs the plain ops."""

    on = False


fusion = _FusionState()


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


def no_grad(orig_func=None):
    """Context manager (and decorator) under which ops record no graph."""
    return _GradMode(False) if orig_func is None else _GradMode(False)(orig_func)


def enable_grad(orig_func=None):
    return _GradMode(True) if orig_func is None else _GradMode(True)(orig_func)


class Node:
    """One recorded op: backward(grad) returns one gradient (or None) per input. `saved` holds
    (native tensor, version) for each tensor the backward reads, to catch in-place writes since. With `fold` (an
    input's position), backward(grad, pending) also takes the gradient that input has gathered so far from its
    other uses (or None) and returns it added to its own, so the sum costs no separate pass (a norm's backward
    adds the residual stream's gradient in its kernel). Inputs are kept as leaves (tensors) and Edges (op
    results, held weakly: see Edge)."""

    __slots__ = ("backward", "inputs", "name", "saved", "fold")

    def __init__(self, backward, inputs, name, saved=(), fold=None):
        self.backward = backward
        self.inputs = tuple(_entry(p) for p in inputs)
        self.name = name
        self.saved = saved
        self.fold = fold


class Edge:
    """An op result as a later node's input: the node that made it and its dtype, the tensor itself only weakly.
    A result that no backward reads (a residual branch's output, a linear's input that FP8 saves as float8) is
    freed when the program drops it instead of living until backward. One Edge per tensor and producing node, so
    every use of the tensor meets in one gradient. A tensor with hooks or retain_grad is pinned (held strongly):
    backward runs its hooks and fills its .grad as PyTorch does, even after the program dropped it."""

    __slots__ = ("_node", "dtype", "requires_grad", "_ref", "_pin")

    def __init__(self, t):
        self._node, self.dtype, self.requires_grad = t._node, t.dtype, t.requires_grad
        self._ref, self._pin = weakref.ref(t), None
        if t._hooks or t._retains_grad:
            self._pin = t

    def tensor(self):
        return self._pin if self._pin is not None else self._ref()

    @property
    def _hooks(self):
        t = self.tensor()
        return t._hooks if t is not None else None

    @property
    def _retains_grad(self):
        t = self.tensor()
        return t is not None and t._retains_grad

    def _accumulate_grad(self, g, sole=False):
        self.tensor()._accumulate_grad(g, sole)

    def _free(self, node):
        """Backward is done with the producing node: a second one raises (on the tensor too, if alive)."""
        t = self.tensor()
        if t is not None and t._node is self._node:
            t._node = node
        self._node = node


def _entry(t):
    """What a node keeps of input t: None, a leaf tensor itself (its .grad is backward's result), or t's Edge."""
    if t is None or t._node is None or isinstance(t, Edge):
        return t
    e = getattr(t, "_edge", None)
    if e is None or e._node is not t._node or e.requires_grad != t.requires_grad:
        e = Edge(t)
        t._edge = e
    return e


def pin(t):
    """Keeps an op result alive for backward once something (a hook, retain_grad) needs the tensor itself."""
    e = getattr(t, "_edge", None)
    if e is not None and e._node is t._node:
        e._pin = t


class GradFn:
    """Tensor.grad_fn: the node that made a tensor (name() and the nodes of its inputs)."""

    __slots__ = ("_node",)

    def __init__(self, node):
        self._node = node

    def name(self):
        return self._node.name

    @property
    def next_functions(self):
        return tuple((GradFn(p._node) if p is not None and p._node is not None else None, 0) for p in self._node.inputs)

    def __repr__(self):
        return f"<{self._node.name} backward>"


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


def run_backward(root, grad=None, retain_graph=False):
    """Backpropagates from root (with gradient grad, ones for a one-element root) into the leaves' .grad."""
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
    root = _entry(root)
    grads = {id(root): grad}
    fused, fusion.on = fusion.on, False
    try:
        _backward_from(root, grads, retain_graph)
    finally:
        fusion.on = fused


def _backward_from(root, grads, retain_graph):
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


def _run(root, grads, retain_graph, capture=None):
    """capture: {id(tensor): None} to fill with those tensors' gradients instead of accumulating into leaves."""
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
        if capture is not None:
            if id(t) in capture:
                capture[id(t)] = g if capture[id(t)] is None else capture[id(t)] + g
            if node is None:
                continue
        elif node is None:
            # References to g: this frame's and getrefcount's own; to its native tensor: g's and getrefcount's
            # (another wrapper of it, such as a kept g.detach(), is a third).
            sole = _STEAL and sys.getrefcount(g) == 2 and sys.getrefcount(g._t) == 2 and g._t.sole_owner
            t._accumulate_grad(g, sole)
            for hook in t._post_hooks or ():
                hook(t)
            continue
        if t._retains_grad and capture is None:
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
            freed = Node(_freed, (), node.name)
            if isinstance(t, Edge):
                t._free(freed)
            else:
                t._node = freed


def _freed(_):
    raise RuntimeError("backward through a graph a second time: pass retain_graph=True to the first backward()")


def grad(
    outputs,
    inputs,
    grad_outputs=None,
    retain_graph=None,
    create_graph=False,
    only_inputs=True,
    allow_unused=None,
    is_grads_batched=False,
    materialize_grads=False,
):
    """The gradients of outputs (summed, each weighted by its grad_outputs entry) with respect to inputs, returned
    as a tuple; .grad of leaves is left alone. An input the outputs do not depend on is an error unless
    allow_unused (then None, or zeros with materialize_grads). Higher-order gradients (create_graph) are not
    supported."""
    if create_graph:
        raise NotImplementedError("autograd.grad(create_graph=True): higher-order gradients are not supported")
    if is_grads_batched:
        raise NotImplementedError("autograd.grad(is_grads_batched=True) is not supported")
    single = hasattr(inputs, "_t")
    outputs = [outputs] if hasattr(outputs, "_t") else list(outputs)
    inputs = [inputs] if single else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif hasattr(grad_outputs, "_t"):
        grad_outputs = [grad_outputs]
    seeds = []
    for o, g in zip(outputs, grad_outputs, strict=True):
        if not o.requires_grad:
            raise RuntimeError("autograd.grad: an output does not require grad")
        if g is None:
            if o.numel() != 1:
                raise RuntimeError(f"autograd.grad: grad_outputs is needed for an output of shape {o.shape}")
            g = o.new_ones(o.shape)
        seeds.append(g)
    root = type(outputs[0])(outputs[0]._t, True)
    root._node = Node(lambda _g: tuple(seeds), tuple(outputs), "grad")
    root = _entry(root)
    entries = [_entry(t) for t in inputs]
    capture = {id(e): None for e in entries}
    fused, fusion.on = fusion.on, False
    try:
        with no_grad():
            _run(root, {id(root): seeds[0]}, bool(retain_graph), capture)
    finally:
        fusion.on = fused
    out = []
    for t, e in zip(inputs, entries, strict=True):
        g = capture[id(e)]
        if g is None:
            if not allow_unused and not materialize_grads:
                raise RuntimeError("autograd.grad: an input is not in the outputs' graph (pass allow_unused=True)")
            if materialize_grads:
                g = t.new_zeros(*t.shape)
        out.append(g)
    return tuple(out)


class _Parts:
    """The gradients some outputs of one Function application got, by output position; + merges two such sets."""

    __slots__ = ("dtype", "grads")

    def __init__(self, dtype, grads):
        self.dtype, self.grads = dtype, grads

    def __add__(self, other):
        for i, g in other.grads.items():
            self.grads[i] = self.grads[i] + g if i in self.grads else g
        return self

    def to(self, dtype):
        return self


class FunctionCtx:
    """What forward leaves for backward: save_for_backward(*tensors) and saved_tensors, needs_input_grad, and any
    attributes set on it."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tuple(tensors)

    def mark_non_differentiable(self, *tensors):
        self._non_diff = {id(t) for t in tensors}

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)

    def mark_dirty(self, *tensors):
        pass


class Function:
    """A custom differentiable op, as torch.autograd.Function: static forward(ctx, *args) and backward(ctx,
    *grads) (one gradient or None per forward argument); call it with Cls.apply(*args)."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("Function subclasses define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("Function subclasses define backward(ctx, ...)")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        ctx.saved_tensors = ()
        ctx.materialize_grads = True
        ctx.needs_input_grad = tuple(hasattr(a, "_t") and a.requires_grad for a in args)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        if not (is_grad_enabled() and any(ctx.needs_input_grad)):
            return out
        outs = out if isinstance(out, tuple) else (out,)
        tensor_args = tuple(a if hasattr(a, "_t") and a.requires_grad else None for a in args)
        non_diff = getattr(ctx, "_non_diff", set())
        diff = [i for i, o in enumerate(outs) if hasattr(o, "_t") and id(o) not in non_diff and o.dtype in _FLOAT]

        def run_backward(grads):
            if ctx.materialize_grads:
                grads = [g if g is not None else outs[i].new_zeros(*outs[i].shape) for i, g in enumerate(grads)]
            res = cls.backward(ctx, *grads)
            res = res if isinstance(res, tuple) else (res,)
            if len(res) != len(args):
                raise RuntimeError(f"{cls.__name__}.backward returned {len(res)} gradients for {len(args)} inputs")
            return res

        wrapped = list(outs)
        if len(outs) == 1:
            o = type(outs[0])(outs[0]._t, True)
            o._node = Node(lambda g: run_backward([g]), tensor_args, cls.__name__)
            wrapped[0] = o
        else:
            joint = type(outs[diff[0]])(outs[diff[0]]._t, True)
            joint._node = Node(
                lambda parts: run_backward([parts.grads.get(i) for i in range(len(outs))]), tensor_args, cls.__name__
            )
            for i in diff:
                o = type(outs[i])(outs[i]._t, True)
                o._node = Node(lambda g, i=i: (_Parts(g.dtype, {i: g}),), (joint,), cls.__name__)
                wrapped[i] = o
        return tuple(wrapped) if isinstance(out, tuple) else wrapped[0]


_FLOAT = frozenset(("float16", "bfloat16", "float32", "float64"))


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None):
    """torch.autograd.backward: backward() of each tensor (their gradients accumulate in the leaves)."""
    tensors = [tensors] if hasattr(tensors, "_t") else list(tensors)
    grads = grad_tensors if grad_tensors is not None else grad_variables
    grads = [None] * len(tensors) if grads is None else ([grads] if hasattr(grads, "_t") else list(grads))
    for t, g in zip(tensors, grads, strict=True):
        if create_graph or inputs is not None:
            raise NotImplementedError("autograd.backward: create_graph and inputs are not supported")
        run_backward(t, g, True if retain_graph is None and len(tensors) > 1 else bool(retain_graph))
