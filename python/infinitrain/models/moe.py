"""The sparse mixture-of-experts feed-forward block shared by Mixtral and Qwen3-MoE, and the router's
load-balancing loss.

A linear router scores each token against E experts; `moe_topk` keeps the k best (softmax gating,
optionally renormalised over the k); `moe_permute` sorts the N*k (token, choice) slots by expert with no
capacity limit (dropless: no token is ever dropped); each expert, a SwiGLU MLP, runs once over its
contiguous rows; `moe_unpermute` adds each token's k outputs weighted by its gates. Under tensor parallelism
whole experts go to the ranks (ExpertParallelMoE).
"""

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.parallel import mappings as M
from infinitrain.parallel.layers import Spec, TPModule


class Expert(nn.Module):
    """A SwiGLU MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, n_embd, hidden, device, std, proj_std):
        super().__init__()
        self.gate_proj = nn.Linear(n_embd, hidden, False, device, std=std)
        self.up_proj = nn.Linear(n_embd, hidden, False, device, std=std)
        self.down_proj = nn.Linear(hidden, n_embd, False, device, std=proj_std)

    def forward(self, x):
        return self.down_proj(F.swiglu(self.gate_proj(x), self.up_proj(x)))


class SparseMoE(nn.Module):
    """Top-k of `num_experts` SwiGLU experts per token, dropless. After each forward, `router_stats` holds
    (rows per expert [E] int64, summed router probabilities [E] float32, tokens) for the balancing loss."""

    def __init__(self, n_embd, hidden, num_experts, top_k, normalize, device, std=0.02, proj_std=0.02):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, num_experts={num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.normalize = num_experts, top_k, normalize
        self.gate = nn.Linear(n_embd, num_experts, False, device, std=std)  # the router
        self.experts = nn.ModuleList([Expert(n_embd, hidden, device, std, proj_std) for _ in range(num_experts)])
        self.router_stats = None

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = self.gate(x2)
        weights, experts = F.moe_topk(logits, self.top_k, self.normalize)
        rows, source, counts = F.moe_permute(x2, experts, self.num_experts)
        sizes = [int(c) for c in counts.numpy()]  # the host needs the group sizes to slice per expert
        outs, start = [], 0
        for expert, n in zip(self.experts, sizes, strict=True):
            if n:
                outs.append(expert(rows[start : start + n]))
            start += n
        y = outs[0] if len(outs) == 1 else F.cat(outs, 0)
        out = F.moe_unpermute(y, source, weights)
        probs = F.softmax(logits if logits.dtype in ("float32", "float64") else logits.to("float32"), -1)
        self.router_stats = (counts, F.sum(probs, 0), x2.shape[0])
        return out.reshape(shape)


def load_balancing_loss(stats, num_experts):
    """Switch/Mixtral balancing loss over every MoE layer's tokens together (as Hugging Face computes it):
    E * sum_e f_e * P_e with f_e the fraction of (token, choice) slots routed to expert e and P_e the mean
    router probability of e; k at perfect balance. `stats`: the layers' router_stats."""
    counts = probs = None
    tokens = 0
    for c, p, n in stats:
        c = c.to(p.dtype)  # counts are int64: no gradient flows through them
        counts = c if counts is None else counts + c
        probs = p if probs is None else probs + p
        tokens += n
    return (counts * probs).sum() * (float(num_experts) / float(tokens * tokens))


class ExpertParallelMoE(TPModule):
    """Mixtral's sparse MoE with the experts split across the tensor-parallel ranks (expert parallel): this rank
    holds experts [lo, hi) whole. The router is outside the region, replicated like a norm (on a sequence shard
    with SP); the tokens and their routing enter the region (copy_to, or gathered with SP), each rank runs its
    experts on the rows routed to them, and the partial combines are summed on exit (as the row-parallel linear's
    outputs). The routing's entry sums the gates' gradient over the ranks, so the router's is whole."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        E = full.num_experts
        self.region, self.num_experts, self.top_k, self.normalize = region, E, full.top_k, full.normalize
        self.local = E // tp
        self.lo, self.hi = r * self.local, (r + 1) * self.local
        self.gate = full.gate
        self.experts = nn.ModuleDict({str(e): full.experts[e] for e in range(self.lo, self.hi)})  # full names
        self._specs = {f"experts.{e}.{n}": Spec(p.shape, owner=r)
                       for e in range(self.lo, self.hi) for n, p in full.experts[e].named_parameters()}  # fmt: skip
        self.router_stats = None

    def forward(self, x):
        region = self.region
        B, T, C = x.shape  # T: this rank's sequence shard with SP
        k = self.top_k
        logits = self.gate(x.reshape(-1, C))
        weights, experts = F.moe_topk(logits, k, self.normalize)
        xs = region.enter(x).reshape(-1, C)
        weights = region.enter(weights.reshape(B, T, k)).reshape(-1, k)
        experts = region.enter(experts.reshape(B, T, k)).reshape(-1, k)
        # Other ranks' experts share one bucket past the local ones, which this rank does not run.
        inside = F.ge(experts, self.lo) * F.lt(experts, self.hi)
        local = F.where(inside, F.sub(experts, self.lo), self.local)
        rows, source, counts = F.moe_permute(xs, local, self.local + 1)
        sizes = [int(c) for c in counts.numpy()]  # the host needs the group sizes to slice per expert
        outs, start = [], 0
        for expert, n in zip(self.experts.values(), sizes, strict=False):
            if n:
                outs.append(expert(rows[start : start + n]))
            start += n
        # The other ranks' rows contribute zero here; kept on the graph so every rank's backward runs the same
        # collectives (the entry's all-reduce) even when none of its experts got a token.
        rest = rows[start:] * 0.0
        outs.append(rest if not outs or rest.dtype == outs[0].dtype else rest.to(outs[0].dtype))
        y = region.exit(F.moe_unpermute(F.cat(outs, 0), source, weights).reshape(B, -1, C))
        # Balancing statistics of all the tokens: counts from the entered routing, probabilities summed over the
        # shards (the same on every rank; each rank's gradient reaches its own tokens).
        probs = F.softmax(logits if logits.dtype in ("float32", "float64") else logits.to("float32"), -1)
        full = F.sum(F.one_hot(experts.reshape(-1), self.num_experts), 0)
        probs = F.sum(probs, 0)
        if region.sp:
            probs = M.reduce_from(probs, region.group)
        self.router_stats = (full, probs, xs.shape[0])
        return y
