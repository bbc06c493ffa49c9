"""The sparse mixture-of-experts feed-forward block shared by Mixtral and Qwen3-MoE, and the router's
load-balancing loss.

A linear router scores each token against E experts; `moe_topk` keeps the k best (softmax gating,
optionally renormalised over the k); `moe_permute` sorts the N*k (token, choice) slots by expert with no
capacity limit (dropless: no token is ever dropped); each expert, a SwiGLU MLP, runs once over its
contiguous rows; `moe_unpermute` adds each token's k outputs weighted by its gates.
"""

from infinitrain import functional as F
from infinitrain import nn


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
