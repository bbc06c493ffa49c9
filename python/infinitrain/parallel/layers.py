"""Tensor-parallel layers (Megatron-style), each made from the full layer's weights by taking this rank's part. The
model files build their families' tensor-parallel attention and MLP (TPModule) from these.

    ColumnParallelLinear     output features split: replicated input (with SP: gathered along the sequence)
    RowParallelLinear        input features split: partial outputs summed (with SP: reduce-scattered)
    VocabParallelEmbedding   vocabulary rows split: each rank looks up the ids it holds, the rest read zero
    vocab_parallel_cross_entropy   the loss over vocabulary-split logits: no rank holds a full row of them

`TPRegion` carries the group and whether sequence parallelism is on; its enter/exit are the two boundaries of a
tensor-parallel region (a sublayer enters once, however many column-parallel layers read its input).
"""

import math

from infinitrain import autograd, nn
from infinitrain import functional as F
from infinitrain.dispatch import needs_grad, record
from infinitrain.distributed.collectives import all_reduce
from infinitrain.parallel import mappings as M
from infinitrain.tensor import arange


class TPRegion:
    def __init__(self, group, sp=False):
        self.group = group
        self.size = 1 if group is None else group.size
        self.rank = 0 if group is None else group.rank
        self.sp = bool(sp) and self.size > 1

    def enter(self, x):
        """Into a region of split features: the replicated (or sequence-sharded) input."""
        return M.gather_seq(x, self.group) if self.sp else M.copy_to(x, self.group)

    def exit(self, y):
        """Out of it: partial sums become the replicated (or sequence-sharded) output."""
        return M.reduce_scatter_seq(y, self.group) if self.sp else M.reduce_from(y, self.group)


def piece(full, n, i):
    """[start, end) of piece i when `full` rows split into n pieces (ceil-sized; the last may be shorter)."""
    size = -(-full // n)
    return min(full, i * size), min(full, (i + 1) * size)


class Spec:
    """How a rank's parameter relates to the full model's: along `dim`, the full tensor is the concatenation of
    `segments` [(full size, pieces)], each split into `pieces` pieces of which tp rank r holds piece
    r * pieces // tp (pieces == 1: replicated; == tp: split). sync_tp: its gradient is partial on each tp rank
    (it is used on a sequence shard) and is summed over the group after backward. tied: GPT-2's embedding, also
    held by the last stage. owner: the one tp rank that holds the whole tensor (an expert, under expert
    parallelism); the other ranks have no part of it."""

    def __init__(self, full_shape, dim=0, segments=None, sync_tp=False, tied=False, owner=None):
        self.full_shape = tuple(full_shape)
        self.dim = dim
        self.segments = segments or [(self.full_shape[dim] if self.full_shape else 1, 1)]
        self.sync_tp, self.tied, self.owner = sync_tp, tied, owner

    def local_ranges(self, tp, r):
        """[(full start, full end, counted here)] of this rank's rows along dim, in local order; counted: this rank
        is the first holder of the piece (so norms count it once)."""
        if self.owner is not None:  # held whole by its owner alone
            return [(0, self.full_shape[self.dim], True)]
        out, base = [], 0
        for full, n in self.segments:
            i = r * n // tp
            a, b = piece(full, n, i)
            out.append((base + a, base + b, r == i * tp // n if n < tp else True))
            base += full
        return out

    def take(self, full, tp, r):
        """This rank's part of the full tensor."""
        parts = [F.slice(full, self.dim, a, b) for a, b, _ in self.local_ranges(tp, r)]
        return parts[0] if len(parts) == 1 else F.cat(parts, self.dim)

    def to_json(self):
        d = {"full_shape": list(self.full_shape), "dim": self.dim, "segments": [list(s) for s in self.segments],
             "sync_tp": self.sync_tp, "tied": self.tied}  # fmt: skip
        if self.owner is not None:
            d["owner"] = self.owner
        return d

    @classmethod
    def from_json(cls, d):
        return cls(d["full_shape"], d["dim"], [tuple(s) for s in d["segments"]], d["sync_tp"], d["tied"],
                   d.get("owner"))  # fmt: skip


def _param(t):
    return nn.Parameter(F.clone(t.detach()))


class TPModule(nn.Module):
    """A block's attention or MLP with this rank's part of the full one's parameters; specs() says how each of its
    parameters relates to the full tensor (checkpoint merging and gradient norms read it)."""

    def specs(self):
        return self._specs

    def split_heads(self, cfg, region):
        """This rank's query heads; key/value heads split like them when there are at least as many as ranks,
        else all held (kv_heads 1 used: the kv_index-th)."""
        tp, nkv = region.size, cfg.n_kv_head
        self.region, self.hd = region, cfg.head_dim
        self.heads = cfg.n_head // tp
        self.split_kv = nkv % tp == 0
        self.kv_heads = nkv // tp if self.split_kv else 1
        self.kv_index = region.rank * nkv // tp


class ColumnParallelLinear(nn.Module):
    """y = x W_r^T + b_r for this rank's rows W_r of W. enter=False when the caller entered the region already."""

    def __init__(self, weight, bias, region, enter=True):
        super().__init__()
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None
        self.region, self.enter = region, enter

    def forward(self, x):
        if self.enter:
            x = self.region.enter(x)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b for this rank's columns W_r of W and its features x_r of the input."""

    def __init__(self, weight, bias, region):
        super().__init__()
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None
        self.region = region

    def forward(self, x):
        y = self.region.exit(F.linear(x, self.weight))
        if self.bias is not None:  # after the sum: added once
            y = y + (self.bias if self.bias.dtype == y.dtype else self.bias.to(y.dtype))
        return y


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the embedding; the sum over ranks of the lookups is the full lookup. exit=False
    returns the partial sum (the caller reduces it, e.g. with the positions added first)."""

    def __init__(self, weight, start, region):
        super().__init__()
        self.weight = _param(weight)
        self.start, self.end = start, start + weight.shape[0]
        self.region = region

    def partial(self, idx):
        if self.region.size == 1:
            return F.embedding(idx, self.weight)
        inside = F.ge(idx, self.start) * F.lt(idx, self.end)
        local = F.where(inside, F.sub(idx, self.start), 0)
        out = F.embedding(local, self.weight)
        return out * inside.to(out.dtype).reshape(*idx.shape, 1)

    def forward(self, idx):
        return self.region.exit(self.partial(idx))


def vocab_parallel_cross_entropy(logits, target, start, region, valid=None):
    """Mean cross-entropy of logits split by vocabulary: logits [N, V_r] are this rank's columns [start,
    start + V_r) of the full [N, V], target [N] int64 full-vocabulary ids. valid: how many of the local columns are
    real (GPT-2's padded vocabulary: the rest take no probability). The loss is the same on every rank; its
    gradient reaches only the local columns. Three all-reduces of [N] values: the row maxima, the sums of
    exponentials and the target logits."""
    group = region.group
    n, width = logits.shape
    with autograd.no_grad():
        lf = logits if logits.dtype in ("float32", "float64") else logits.to("float32")
        if valid is not None and valid < width:
            cols = arange(width, device=logits.device)
            lf = F.masked_fill(lf, F.ge(cols, valid).reshape(1, width), -math.inf)
        rowmax = F.amax(lf, -1, keepdim=True)
        if region.size > 1:
            all_reduce(rowmax, "max", group)
        e = F.exp(lf - rowmax)
        sums = F.sum(e, -1, keepdim=True)
        inside = F.ge(target, start) * F.lt(target, start + width)
        local = F.where(inside, F.sub(target, start), 0).reshape(n, 1)
        picked = F.gather(lf, 1, local) * inside.to(lf.dtype).reshape(n, 1)
        if region.size > 1:
            all_reduce(sums, "sum", group)
            all_reduce(picked, "sum", group)
        rows = F.log(sums) + rowmax - picked
        loss = F.mean(rows)
    if needs_grad(logits):
        dtype = logits.dtype

        def backward(g):
            # d loss / d logit = (softmax - onehot) / N, on the local columns.
            onehot = F.one_hot(local.reshape(n), width).to(e.dtype) * inside.to(e.dtype).reshape(n, 1)
            grad = (e / sums - onehot) * (g.to(e.dtype) * (1.0 / n))
            return (grad if grad.dtype == dtype else grad.to(dtype),)

        record(loss, (logits,), backward, "vocab_parallel_cross_entropy")
    return loss
