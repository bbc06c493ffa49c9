"""The communication at tensor-parallel region boundaries, as differentiable ops (Megatron's mappings).

    copy_to(x, g)          forward: identity            backward: all-reduce (sum)
    reduce_from(x, g)      forward: all-reduce (sum)    backward: identity
    gather_from(x, g, d)   forward: all-gather along d  backward: keep this rank's chunk
    scatter_to(x, g, d)    forward: keep this chunk     backward: all-gather along d
    gather_seq(x, g)       forward: all-gather along the sequence (dim 1)   backward: reduce-scatter
    reduce_scatter_seq(x, g)  forward: reduce-scatter along the sequence    backward: all-gather

A group of one rank (or None) makes each of them the identity. Every rank of the group must run the same ops
in the same order (forward and backward), as for any collective.
"""

from infinitrain import functional as F
from infinitrain.dispatch import needs_grad, record
from infinitrain.distributed.collectives import all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from infinitrain.tensor import Tensor, empty


def _size(group):
    return 1 if group is None else group.size


def _all_reduce(x, group):
    out = F.clone(x.detach())  # the incoming tensor may be shared (a gradient handed to several inputs)
    all_reduce(out, "sum", group)
    return out


def _all_gather(x, group, dim):
    """Concatenation of every rank's x along dim, in rank order."""
    x = x.detach()
    n = group.size
    out = empty((n, *x.shape), dtype=x.dtype, device=x.device)
    all_gather_into_tensor(out, x, group)
    dim %= x.ndim
    if dim == 0:
        return out.reshape(n * x.shape[0], *x.shape[1:])
    # (n, d0.., d_dim, ..) -> (d0.., n, d_dim, ..) -> merge n into d_dim
    order = list(range(1, dim + 1)) + [0] + list(range(dim + 1, x.ndim + 1))
    shape = list(x.shape)
    shape[dim] *= n
    return F.permute(out, order).reshape(shape)


def _reduce_scatter(x, group, dim):
    """Sum over the ranks of x, of which this rank keeps chunk `rank` along dim."""
    x = x.detach()
    n = group.size
    dim %= x.ndim
    if x.shape[dim] % n:
        raise ValueError(f"reduce-scatter: dim {dim} of {list(x.shape)} is not divisible by {n} ranks")
    c = x.shape[dim] // n
    split = list(x.shape[:dim]) + [n, c] + list(x.shape[dim + 1 :])
    # Chunk r first, so rank r's block is contiguous.
    order = [dim] + [i for i in range(len(split)) if i != dim]
    blocks = F.permute(x.reshape(split), order) if dim else x.reshape(split)
    shape = list(x.shape)
    shape[dim] = c
    out = empty(tuple(shape), dtype=x.dtype, device=x.device)
    reduce_scatter_tensor(out, blocks, "sum", group)
    return out


def _chunk(x, group, dim):
    dim %= x.ndim
    n, r = group.size, group.rank
    if x.shape[dim] % n:
        raise ValueError(f"scatter: dim {dim} of {list(x.shape)} is not divisible by {n} ranks")
    c = x.shape[dim] // n
    return F.slice(x.detach(), dim, r * c, (r + 1) * c)


def _node(out, x, backward, name):
    if needs_grad(x):
        record(out, (x,), lambda g: (backward(g),), name)
    return out


def copy_to(x, group):
    if _size(group) == 1:
        return x
    return _node(Tensor(x._t), x, lambda g: _all_reduce(g, group), "copy_to_tp")


def reduce_from(x, group):
    if _size(group) == 1:
        return x
    return _node(_all_reduce(x, group), x, lambda g: g, "reduce_from_tp")


def gather_from(x, group, dim=-1):
    if _size(group) == 1:
        return x
    return _node(_all_gather(x, group, dim), x, lambda g: _chunk(g, group, dim), "gather_from_tp")


def scatter_to(x, group, dim=-1):
    if _size(group) == 1:
        return x
    return _node(_chunk(x, group, dim), x, lambda g: _all_gather(g, group, dim), "scatter_to_tp")


def gather_seq(x, group):
    if _size(group) == 1:
        return x
    return _node(_all_gather(x, group, 1), x, lambda g: _reduce_scatter(g, group, 1), "gather_seq")


def reduce_scatter_seq(x, group):
    if _size(group) == 1:
        return x
    return _node(_reduce_scatter(x, group, 1), x, lambda g: _all_gather(g, group, 1), "reduce_scatter_seq")
