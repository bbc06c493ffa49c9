"""Collectives on process groups, with PyTorch's signatures: the tensor first, ranks as global ranks,
group=None for the default group (a Communicator works as a group too, its ranks its own). In place unless
they say otherwise. async_op=True returns a Work; see ProcessGroup.run for what it overlaps."""

import operator

from infinitrain.distributed import comm as _comm
from infinitrain.distributed.group import NON_GROUP_MEMBER, ProcessGroup, Work, _world
from infinitrain.tensor import Tensor


def _resolve(group, tensor, what, op=None):
    """(communicator, group or None) for tensor's device; (None, None) outside a group."""
    if group is NON_GROUP_MEMBER:
        return None, None
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{what}: expected an infinitrain Tensor, got {type(tensor).__name__}")
    if isinstance(group, _comm.Communicator):
        _comm._check(group, tensor, what, op)
        return group, None
    g = group if group is not None else _world(what)
    if not isinstance(g, ProcessGroup):
        raise ValueError(f"{what}: group must be a ProcessGroup or a Communicator, got {type(g).__name__}")
    c = g.communicator(tensor.device)
    _comm._check(c, tensor, what, op)
    return c, g


def _peer(g, c, r, what, name):
    """A global rank (or a Communicator's rank) as the communicator's rank."""
    try:
        r = operator.index(r)
    except TypeError:
        raise ValueError(f"{what}: {name} must be an int rank, got {r!r}") from None
    if g is None:
        return _comm._check_rank(c, r, what, name)
    return g.group_rank(r, what)


def _run(c, g, fn, async_op):
    if c is None:
        return Work(None) if async_op else None
    if g is None:
        fn()
        return Work(None) if async_op else None
    work = g.run(fn, async_op, c.device)
    return work if async_op else None


def all_reduce(tensor, op="sum", group=None, async_op=False):
    """Reduces tensor across the group's ranks (sum, avg, max, min, prod), in place on every rank."""
    c, g = _resolve(group, tensor, "all_reduce", op)
    return _run(c, g, lambda: c.all_reduce(tensor._t, tensor._t, op), async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copies rank src's tensor (group rank group_src's) into every rank's."""
    if src is None:
        if group_src is None:
            raise ValueError("broadcast: pass src (a global rank) or group_src")
        src = group.global_rank(group_src) if group is not None and hasattr(group, "global_rank") else group_src
    c, g = _resolve(group, tensor, "broadcast")
    if c is None:
        return None
    root = _peer(g, c, src, "broadcast", "src")
    return _run(c, g, lambda: c.broadcast(tensor._t, tensor._t, root), async_op)


def reduce(tensor, dst, op="sum", group=None, async_op=False):
    """Reduces tensor across the ranks into rank dst's (the others' stay as they were)."""
    c, g = _resolve(group, tensor, "reduce", op)
    if c is None:
        return None
    root = _peer(g, c, dst, "reduce", "dst")
    return _run(c, g, lambda: c.reduce(tensor._t, tensor._t, op, root), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """output (size x input's elements, any shape with that many) gets every rank's input, rank order."""
    output, input = output_tensor, input_tensor
    c, g = _resolve(group, input, "all_gather_into_tensor")
    if c is None:
        return None
    _comm._check(c, output, "all_gather_into_tensor")
    if output.dtype != input.dtype or output.numel() != input.numel() * c.size:
        raise ValueError(
            f"all_gather_into_tensor: output must be {input.dtype} with {c.size} x {input.numel()} elements, "
            f"got {output.dtype}{list(output.shape)}"
        )
    return _run(c, g, lambda: c.all_gather(input._t, output._t), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[r] = rank r's tensor (the list has one tensor of tensor's shape per rank)."""
    c, g = _resolve(group, tensor, "all_gather")
    if c is None:
        return None
    if len(tensor_list) != c.size:
        raise ValueError(f"all_gather: tensor_list must hold {c.size} tensors, got {len(tensor_list)}")
    from infinitrain.tensor import empty

    out = empty((c.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)

    def fn():
        c.all_gather(tensor._t, out._t)
        for r, t in enumerate(tensor_list):
            if t.shape != tensor.shape or t.dtype != tensor.dtype:
                raise ValueError(f"all_gather: tensor_list[{r}] is {t.dtype}{list(t.shape)}, not like the input")
            t.copy_(out[r])

    return _run(c, g, fn, async_op)


def reduce_scatter_tensor(output, input, op="sum", group=None, async_op=False):
    """Reduces input (size x output's elements) across the ranks; rank r's output gets block r."""
    c, g = _resolve(group, input, "reduce_scatter_tensor", op)
    if c is None:
        return None
    _comm._check(c, output, "reduce_scatter_tensor")
    if output.dtype != input.dtype or input.numel() != output.numel() * c.size:
        raise ValueError(
            f"reduce_scatter_tensor: input must be {output.dtype} with {c.size} x {output.numel()} elements, "
            f"got {input.dtype}{list(input.shape)}"
        )
    return _run(c, g, lambda: c.reduce_scatter(input._t, output._t, op), async_op)


def _other(c, peer, what):
    if peer == c.rank:
        raise ValueError(f"{what}: the peer must be another rank, got this rank ({peer}); copy the tensor instead")
    return peer


def send(tensor, dst, group=None):
    """Sends tensor to rank dst (another rank), whose recv takes the same numel and dtype."""
    c, g = _resolve(group, tensor, "send")
    if c is not None:
        peer = _other(c, _peer(g, c, dst, "send", "dst"), "send")
        _run(c, g, lambda: c.send(tensor._t, peer), False)


def recv(tensor, src, group=None):
    """Receives rank src's send into tensor, in place."""
    c, g = _resolve(group, tensor, "recv")
    if c is not None:
        peer = _other(c, _peer(g, c, src, "recv", "src"), "recv")
        _run(c, g, lambda: c.recv(tensor._t, peer), False)
    return tensor
