"""A GPT-2, LLaMA 3 or Mixtral split for a layout: this rank's model chunks, made from the full model.

    full = GPT2(cfg)                                  # every rank builds it from the same seed
    model = ParallelModel(full, layout, grid)         # takes this rank's layers and its tensor-parallel part

The full model's blocks are reused (their attention and MLP replaced by tensor-parallel versions holding this
rank's heads and MLP columns, or Mixtral's whole experts), so the layers compute what the single-device model does
and the split model starts from the same weights. Parameters keep the full model's names
("h.3.attn.c_attn.weight"); `specs[name]` says how each relates to the full tensor (checkpoint merging and
gradient norms read it).

Chunk v of the pipeline (virtual stage v = chunk * pp + stage) holds a contiguous run of layers; the first also
the embedding, the last the final norm, the head and the loss. The split balances parameter counts unless an
explicit one is given.
"""

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.models.llama3 import rope_tables
from infinitrain.models.moe import load_balancing_loss
from infinitrain.parallel import mappings as M
from infinitrain.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    Spec,
    TPRegion,
    VocabParallelEmbedding,
    piece,
    vocab_parallel_cross_entropy,
)
from infinitrain.parallel.layout import LayoutError, check_model


def _n(module):
    return sum(p.numel() for p in module.parameters())


def split_layers(layer_params, chunks, first_extra=0, last_extra=0):
    """Layers per chunk, contiguous, each chunk at least one, minimising the largest chunk's parameter count
    (the embedding counts on the first chunk, the head on the last)."""
    n = len(layer_params)
    if n < chunks:
        raise LayoutError(f"{n} layers cannot fill {chunks} pipeline stages")
    prefix = [0]
    for p in layer_params:
        prefix.append(prefix[-1] + p)

    def cost(c, a, b):  # chunk c holds layers [a, b)
        return prefix[b] - prefix[a] + (first_extra if c == 0 else 0) + (last_extra if c == chunks - 1 else 0)

    # best[c][b]: the smallest largest cost of chunks 0..c covering layers [0, b)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(chunks)]
    cut = [[0] * (n + 1) for _ in range(chunks)]
    for b in range(1, n + 1):
        best[0][b] = cost(0, 0, b)
    for c in range(1, chunks):
        for b in range(c + 1, n + 1):
            for a in range(c, b):
                v = max(best[c - 1][a], cost(c, a, b))
                if v < best[c][b]:
                    best[c][b], cut[c][b] = v, a
    sizes, b = [], n
    for c in range(chunks - 1, 0, -1):
        a = cut[c][b]
        sizes.append(b - a)
        b = a
    sizes.append(b)
    return sizes[::-1]


# ---- tensor-parallel sublayers ----


class _TPModule(nn.Module):
    def specs(self):
        return self._specs

    def _split_heads(self, cfg, region):
        """This rank's query heads; key/value heads split like them when there are at least as many as ranks,
        else all held (kv_heads 1 used: the kv_index-th)."""
        tp, nkv = region.size, cfg.n_kv_head
        self.region, self.hd = region, cfg.head_dim
        self.heads = cfg.n_head // tp
        self.split_kv = nkv % tp == 0
        self.kv_heads = nkv // tp if self.split_kv else 1
        self.kv_index = region.rank * nkv // tp


class GPT2AttentionTP(_TPModule):
    """GPT-2's attention with this rank's heads: c_attn rows of its q, k and v heads, c_proj's matching columns."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        C = cfg.n_embd
        self.heads, self.hs, self.region = cfg.n_head // tp, C // cfg.n_head, region
        qkv = Spec(full.c_attn.weight.shape, 0, [(C, tp)] * 3)
        qkv_b = Spec(full.c_attn.bias.shape, 0, [(C, tp)] * 3)
        proj = Spec(full.c_proj.weight.shape, 1, [(C, tp)])
        self.c_attn = ColumnParallelLinear(qkv.take(full.c_attn.weight, tp, r), qkv_b.take(full.c_attn.bias, tp, r),
                                           region, enter=False)  # fmt: skip
        self.c_proj = RowParallelLinear(proj.take(full.c_proj.weight, tp, r), full.c_proj.bias, region)
        self._specs = {"c_attn.weight": qkv, "c_attn.bias": qkv_b, "c_proj.weight": proj}

    def forward(self, x):
        x = self.region.enter(x)
        B, T, _ = x.shape
        w = self.heads * self.hs
        q, k, v = self.c_attn(x).split(w, dim=2)
        q, k, v = (t.reshape(B, T, self.heads, self.hs) for t in (q, k, v))
        y = F.attention_bthd(q, k, v, is_causal=True)
        return self.c_proj(y.reshape(B, T, w))


class GPT2MLPTP(_TPModule):
    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        H = 4 * cfg.n_embd
        fc, fc_b = Spec(full.c_fc.weight.shape, 0, [(H, tp)]), Spec(full.c_fc.bias.shape, 0, [(H, tp)])
        proj = Spec(full.c_proj.weight.shape, 1, [(H, tp)])
        self.region = region
        self.c_fc = ColumnParallelLinear(fc.take(full.c_fc.weight, tp, r), fc_b.take(full.c_fc.bias, tp, r), region,
                                         enter=False)  # fmt: skip
        self.c_proj = RowParallelLinear(proj.take(full.c_proj.weight, tp, r), full.c_proj.bias, region)
        self._specs = {"c_fc.weight": fc, "c_fc.bias": fc_b, "c_proj.weight": proj}

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(self.region.enter(x)), approximate="tanh"))


class LLaMA3AttentionTP(_TPModule):
    """LLaMA 3's grouped-query attention with this rank's query heads. Key/value heads split like the queries
    when there are at least as many as ranks; with fewer, every rank holds all of them (they are small) and uses
    its group's one; their rows enter the region (copy_to), so their gradient is summed over the ranks."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        nh, nkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self._split_heads(cfg, region)
        self.nkv = nkv
        kv_pieces = tp if self.split_kv else 1
        qkv = Spec(full.c_attn.weight.shape, 0, [(nh * hd, tp), (nkv * hd, kv_pieces), (nkv * hd, kv_pieces)])
        proj = Spec(full.c_proj.weight.shape, 1, [(nh * hd, tp)])
        self.c_attn = ColumnParallelLinear(qkv.take(full.c_attn.weight, tp, r), None, region, enter=False)
        self.c_proj = RowParallelLinear(proj.take(full.c_proj.weight, tp, r), None, region)
        self._specs = {"c_attn.weight": qkv, "c_proj.weight": proj}

    def _qkv(self, x):
        if self.split_kv:
            return self.c_attn(x)
        w, qn, hd, j = self.c_attn.weight, self.heads * self.hd, self.hd, self.kv_index
        kv = M.copy_to(w[qn:], self.region.group)
        wk = kv[j * hd : (j + 1) * hd]
        wv = kv[(self.nkv + j) * hd : (self.nkv + j + 1) * hd]
        return F.linear(x, F.cat([w[:qn], wk, wv], 0))

    def forward(self, x, cos, sin):
        x = self.region.enter(x)
        B, T, _ = x.shape
        nh, nkv, hd = self.heads, self.kv_heads, self.hd
        q, k, v = self._qkv(x).split([nh * hd, nkv * hd, nkv * hd], dim=2)
        q = F.rope(q.reshape(B, T, nh, hd), cos, sin)
        k = F.rope(k.reshape(B, T, nkv, hd), cos, sin)
        y = F.attention_bthd(q, k, v.reshape(B, T, nkv, hd), is_causal=True)
        return self.c_proj(y.reshape(B, T, nh * hd))


class LLaMA3MLPTP(_TPModule):
    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        H = cfg.hidden_dim
        col = Spec(full.c_fc.weight.shape, 0, [(H, tp)])
        proj = Spec(full.c_proj.weight.shape, 1, [(H, tp)])
        self.region = region
        self.c_fc = ColumnParallelLinear(col.take(full.c_fc.weight, tp, r), None, region, enter=False)
        self.c_fc2 = ColumnParallelLinear(col.take(full.c_fc2.weight, tp, r), None, region, enter=False)
        self.c_proj = RowParallelLinear(proj.take(full.c_proj.weight, tp, r), None, region)
        self._specs = {"c_fc.weight": col, "c_fc2.weight": col, "c_proj.weight": proj}

    def forward(self, x):
        x = self.region.enter(x)
        return self.c_proj(F.swiglu(self.c_fc2(x), self.c_fc(x)))


class DecoderAttentionTP(_TPModule):
    """Mixtral's grouped-query attention (models/decoder.py: separate q/k/v projections) with this rank's query
    heads; key/value heads split or replicated as LLaMA3AttentionTP's."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        nh, nkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self._split_heads(cfg, region)
        q = Spec(full.q_proj.weight.shape, 0, [(nh * hd, tp)])
        kv = Spec(full.k_proj.weight.shape, 0, [(nkv * hd, tp if self.split_kv else 1)])
        o = Spec(full.o_proj.weight.shape, 1, [(nh * hd, tp)])
        self.q_proj = ColumnParallelLinear(q.take(full.q_proj.weight, tp, r), None, region, enter=False)
        self.k_proj = ColumnParallelLinear(kv.take(full.k_proj.weight, tp, r), None, region, enter=False)
        self.v_proj = ColumnParallelLinear(kv.take(full.v_proj.weight, tp, r), None, region, enter=False)
        self.o_proj = RowParallelLinear(o.take(full.o_proj.weight, tp, r), None, region)
        self._specs = {"q_proj.weight": q, "k_proj.weight": kv, "v_proj.weight": kv, "o_proj.weight": o}

    def _kv(self, proj, x):
        if self.split_kv:
            return proj(x)
        j, hd = self.kv_index, self.hd  # every rank holds all kv heads; the gradient of the copy is summed
        return F.linear(x, M.copy_to(proj.weight, self.region.group)[j * hd : (j + 1) * hd])

    def forward(self, x, cos, sin):
        x = self.region.enter(x)
        B, T, _ = x.shape
        nh, nkv, hd = self.heads, self.kv_heads, self.hd
        q = F.rope(self.q_proj(x).reshape(B, T, nh, hd), cos, sin)
        k = F.rope(self._kv(self.k_proj, x).reshape(B, T, nkv, hd), cos, sin)
        v = self._kv(self.v_proj, x).reshape(B, T, nkv, hd)
        y = F.attention_bthd(q, k, v, is_causal=True)
        return self.o_proj(y.reshape(B, T, nh * hd))


class ExpertParallelMoE(_TPModule):
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


_TP = {
    "gpt2": (GPT2AttentionTP, GPT2MLPTP),
    "llama3": (LLaMA3AttentionTP, LLaMA3MLPTP),
    "mixtral": (DecoderAttentionTP, ExpertParallelMoE),
}
# (embedding, blocks, final norm, a block's attention, its MLP) as each family names them
_NAMES = {
    "gpt2": ("wte", "h", "ln_f", "attn", "mlp"),
    "llama3": ("wte", "h", "ln_f", "attn", "mlp"),
    "mixtral": ("embed_tokens", "layers", "norm", "self_attn", "mlp"),
}


# ---- one chunk ----


class Stage(nn.Module):
    """Layers [lo, hi) of the full model, as attributes named like the full model's (its blocks are keyed by the
    global layer index), with the embedding when first and the final norm, head and loss when last.
    forward(x, targets) takes ids on the first chunk, activations [B, T (/ tp with SP), C] on the others; returns
    the mean loss on the last, the activations otherwise. Mixtral's chunks after the first take, and all but the
    last return, the activations flattened with the router statistics of the layers before appended (`carry`
    values: summed counts and probabilities per expert), since the balancing loss couples every layer."""

    def __init__(self, full, family, lo, hi, first, last, region, tied_wte=None):
        super().__init__()
        cfg = full.config
        self.family, self.config, self.region = family, cfg, region
        self.first, self.last, self.lo, self.hi = first, last, lo, hi
        emb, blocks, norm, attn, mlp = self._names = _NAMES[family]
        self._specs = {}
        tp, r = region.size, region.rank
        rows = cfg.padded_vocab_size if family == "gpt2" else cfg.vocab_size
        self.vocab_start, vocab_end = piece(rows, tp, r)
        vocab = Spec((rows, cfg.n_embd), 0, [(rows, tp)])
        if first:
            setattr(self, emb, VocabParallelEmbedding(vocab.take(getattr(full, emb).weight, tp, r), self.vocab_start,
                                                      region))  # fmt: skip
            self._specs[f"{emb}.weight"] = vocab
            if family == "gpt2":
                self.wpe = full.wpe
        setattr(self, blocks, nn.ModuleDict())
        attn_tp, mlp_tp = _TP[family]
        for i in range(lo, hi):
            block = getattr(full, blocks)[i]
            if tp > 1:
                setattr(block, attn, attn_tp(getattr(block, attn), cfg, region))
                setattr(block, mlp, mlp_tp(getattr(block, mlp), cfg, region))
                for sub in (attn, mlp):
                    for name, spec in getattr(block, sub).specs().items():
                        self._specs[f"{blocks}.{i}.{sub}.{name}"] = spec
            getattr(self, blocks)[str(i)] = block
        self.carry = 2 * cfg.num_experts if family == "mixtral" else 0
        if last:
            setattr(self, norm, getattr(full, norm))
            if family == "gpt2":
                if not first:  # the tied head's own copy on the last stage; its gradient meets the first's
                    self.wte = tied_wte if tied_wte is not None else VocabParallelEmbedding(
                        vocab.take(full.wte.weight, tp, r), self.vocab_start, region
                    )  # fmt: skip
                    self._specs["wte.weight"] = Spec(vocab.full_shape, 0, vocab.segments, tied=True)
                self.valid = max(0, min(vocab_end, cfg.vocab_size) - self.vocab_start)
            else:
                head = Spec(full.lm_head.weight.shape, 0, [(rows, tp)])
                self.lm_head = ColumnParallelLinear(head.take(full.lm_head.weight, tp, r), None, region, enter=False)
                self._specs["lm_head.weight"] = head
                self.valid = None
        # Everything else is replicated; used on a sequence shard (SP), its gradient is partial on each rank.
        for name, p in self.named_parameters():
            if name not in self._specs:
                self._specs[name] = Spec(p.shape, 0, None, sync_tp=region.sp)
        self._rope = None
        self.aux_loss = None  # Mixtral's last chunk: the last forward's balancing loss

    def specs(self):
        return self._specs

    def _tables(self, T, device):
        rope = self._rope
        if rope is None or rope[0].shape[0] < T:
            n = min(self.config.block_size, max(64, 1 << (T - 1).bit_length()))
            self._rope = rope_tables(self.config, device, n)
        cos, sin = self._rope
        return cos[:T], sin[:T]

    def embed(self, idx):
        region = self.region
        x = getattr(self, self._names[0]).partial(idx)
        T = idx.shape[1]
        if self.family == "gpt2":
            if region.sp:
                n = T // region.size
                return M.reduce_scatter_seq(x, region.group) + self.wpe.weight[region.rank * n : (region.rank + 1) * n]
            return M.reduce_from(x, region.group) + self.wpe.weight[:T]
        return region.exit(x)

    def forward(self, x, targets=None, shape=None):
        """shape: (B, T, C) of the activations when they come flattened with the router statistics (the engine
        passes it; the shape is the one it received)."""
        stats = []
        if self.first:
            x = self.embed(x)
        elif self.carry:
            E, n = self.carry // 2, shape[0] * shape[1] * shape[2]
            x, counts, probs = F.split(x, [n, E, E])
            x = x.reshape(*shape)
            if self.lo:  # the layers before this chunk: their tokens, counted once per layer as the loss does
                tokens = shape[0] * shape[1] * (self.region.size if self.region.sp else 1) * self.lo
                stats.append((counts.detach(), probs, tokens))
        T = x.shape[1] * (self.region.size if self.region.sp else 1)
        extra = self._tables(T, x.device) if self.family != "gpt2" else ()
        for block in getattr(self, self._names[1]).values():
            x = block(x, *extra)
            if self.carry:
                stats.append(block.mlp.router_stats)
        if self.carry:
            counts, probs = _sum_stats(stats)
        if not self.last:
            if self.carry:  # float32 carries the counts exactly (the engine sends float32 anyway)
                return F.cat([x.reshape(-1).to("float32"), counts.to("float32"), probs.to("float32")])
            return x
        x = self.region.enter(getattr(self, self._names[2])(x))
        head = self.wte.weight if self.family == "gpt2" else self.lm_head.weight
        logits = F.linear(x, head)  # [B, T, this rank's vocabulary columns]
        B = logits.shape[0]
        loss = vocab_parallel_cross_entropy(
            logits.reshape(B * T, -1), targets.reshape(B * T), self.vocab_start, self.region, self.valid
        )
        if self.carry:  # the router's balancing loss, as DecoderLM adds it (and keeps in aux_loss)
            aux = load_balancing_loss(stats, self.config.num_experts)
            self.aux_loss = aux.detach()
            if self.config.router_aux_loss_coef:
                loss = loss + aux * self.config.router_aux_loss_coef
        return loss


def _sum_stats(stats):
    counts = probs = None
    for c, p, _ in stats:
        counts = c if counts is None else counts + c
        probs = p if probs is None else probs + p
    return counts, probs


class ParallelModel(nn.Module):
    """This rank's chunks of the full model under `layout` (grid: its groups; None for one process). `split`:
    layers per chunk in virtual-stage order (default: balanced by parameter count). The full model is taken
    apart: do not use it afterwards."""

    def __init__(self, full, layout, grid=None, split=None, sequence_length=None):
        super().__init__()
        family = check_model(layout, full.config, sequence_length)
        self.family, self.layout, self.config = family, layout, full.config
        self.grid = grid
        stage = grid.stage if grid is not None else 0
        tp_group = grid.tp if grid is not None else None
        self.region = TPRegion(tp_group, layout.sp)
        emb, blocks, norm = (getattr(full, n) for n in _NAMES[family][:3])
        n_layer = len(blocks)
        if split is None:
            emb = _n(emb) + (_n(full.wpe) if family == "gpt2" else 0)
            head = _n(norm) + (_n(full.lm_head) if family != "gpt2" else 0)
            split = split_layers([_n(b) for b in blocks], layout.chunks, emb, head)
        split = [int(s) for s in split]
        if len(split) != layout.chunks or sum(split) != n_layer or min(split) < 1:
            raise LayoutError(
                f"pipeline split {split}: expected {layout.chunks} positive layer counts summing to n_layer={n_layer}"
            )
        self.split = split
        bounds = [0]
        for s in split:
            bounds.append(bounds[-1] + s)
        self.chunks = nn.ModuleList()
        self.virtual = []  # the virtual stage of each local chunk
        for c in range(layout.vpp):
            v = c * layout.pp + stage
            first, last = v == 0, v == layout.chunks - 1
            self.chunks.append(Stage(full, family, bounds[v], bounds[v + 1], first, last, self.region))
            self.virtual.append(v)

    def specs(self):
        out = {}
        for ch in self.chunks:
            out.update(ch.specs())
        return out

    def shard_parameters(self):
        """(full name, parameter) of this rank's parameters, each once."""
        seen, out = set(), []
        for ch in self.chunks:
            for name, p in ch.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((name, p))
        return out

    def parameters(self, recurse=True):
        for _, p in self.shard_parameters():
            yield p

    def shard_state_dict(self):
        return dict(self.shard_parameters())

    def load_shard_state_dict(self, state):
        own = self.shard_state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError(f"shard state: missing {missing[:5]}, unexpected {unexpected[:5]}")
        from infinitrain import autograd
        from infinitrain.tensor import Tensor, from_numpy

        with autograd.no_grad():
            for name, p in own.items():
                v = state[name]
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"shard state: {name} is {tuple(v.shape)}, this rank's part is {tuple(p.shape)}")
                p.copy_(v if isinstance(v, Tensor) else from_numpy(v, dtype=p.dtype, device=p.device))

    def forward(self, idx, targets):
        """The whole model on one rank (no pipeline: one chunk); with a pipeline use the engine."""
        if len(self.chunks) != 1 or not (self.chunks[0].first and self.chunks[0].last):
            raise RuntimeError("ParallelModel.forward runs an unpipelined model; use parallel.Engine for stages")
        return self.chunks[0](idx, targets)
