"""A GPT-2 or LLaMA 3 split for a layout: this rank's model chunks, made from the full model.

    full = GPT2(cfg)                                  # every rank builds it from the same seed
    model = ParallelModel(full, layout, grid)         # takes this rank's layers and its tensor-parallel part

The full model's blocks are reused (their attention and MLP replaced by tensor-parallel versions holding this
rank's heads and MLP columns), so the layers compute what the single-device model does and the split model starts
from the same weights. Parameters keep the full model's names ("h.3.attn.c_attn.weight"); `specs[name]` says how
each relates to the full tensor (checkpoint merging and gradient norms read it).

Chunk v of the pipeline (virtual stage v = chunk * pp + stage) holds a contiguous run of layers; the first also
the embedding, the last the final norm, the head and the loss. The split balances parameter counts unless an
explicit one is given.
"""

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.models.llama3 import rope_tables
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
        self.region, self.hd = region, hd
        self.heads = nh // tp
        self.split_kv = nkv % tp == 0
        self.kv_heads = nkv // tp if self.split_kv else 1
        self.nkv, self.kv_index = nkv, r * nkv // tp
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


_TP = {"gpt2": (GPT2AttentionTP, GPT2MLPTP), "llama3": (LLaMA3AttentionTP, LLaMA3MLPTP)}


# ---- one chunk ----


class Stage(nn.Module):
    """Layers [lo, hi) of the full model, as attributes named like the full model's (h is keyed by the global
    layer index), with the embedding when first and the final norm, head and loss when last. forward(x, targets)
    takes ids on the first chunk, activations [B, T (/ tp with SP), C] on the others; returns the mean loss on
    the last, the activations otherwise."""

    def __init__(self, full, family, lo, hi, first, last, region, tied_wte=None):
        super().__init__()
        cfg = full.config
        self.family, self.config, self.region = family, cfg, region
        self.first, self.last, self.lo, self.hi = first, last, lo, hi
        self._specs = {}
        tp, r = region.size, region.rank
        rows = cfg.padded_vocab_size if family == "gpt2" else cfg.vocab_size
        self.vocab_start, vocab_end = piece(rows, tp, r)
        vocab = Spec((rows, cfg.n_embd), 0, [(rows, tp)])
        if first:
            self.wte = VocabParallelEmbedding(vocab.take(full.wte.weight, tp, r), self.vocab_start, region)
            self._specs["wte.weight"] = vocab
            if family == "gpt2":
                self.wpe = full.wpe
        self.h = nn.ModuleDict()
        attn_tp, mlp_tp = _TP[family]
        for i in range(lo, hi):
            block = full.h[i]
            if tp > 1:
                block.attn = attn_tp(block.attn, cfg, region)
                block.mlp = mlp_tp(block.mlp, cfg, region)
                for sub in ("attn", "mlp"):
                    for name, spec in getattr(block, sub).specs().items():
                        self._specs[f"h.{i}.{sub}.{name}"] = spec
            self.h[str(i)] = block
        if last:
            self.ln_f = full.ln_f
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
        x = self.wte.partial(idx)
        T = idx.shape[1]
        if self.family == "gpt2":
            if region.sp:
                n = T // region.size
                return M.reduce_scatter_seq(x, region.group) + self.wpe.weight[region.rank * n : (region.rank + 1) * n]
            return M.reduce_from(x, region.group) + self.wpe.weight[:T]
        return region.exit(x)

    def forward(self, x, targets=None):
        if self.first:
            x = self.embed(x)
        T = x.shape[1] * (self.region.size if self.region.sp else 1)
        extra = self._tables(T, x.device) if self.family == "llama3" else ()
        for block in self.h.values():
            x = block(x, *extra)
        if not self.last:
            return x
        x = self.region.enter(self.ln_f(x))
        head = self.wte.weight if self.family == "gpt2" else self.lm_head.weight
        logits = F.linear(x, head)  # [B, T, this rank's vocabulary columns]
        B = logits.shape[0]
        return vocab_parallel_cross_entropy(
            logits.reshape(B * T, -1), targets.reshape(B * T), self.vocab_start, self.region, self.valid
        )


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
        n_layer = len(full.h)
        if split is None:
            emb = _n(full.wte) + (_n(full.wpe) if family == "gpt2" else 0)
            head = _n(full.ln_f) + (_n(full.lm_head) if family == "llama3" else 0)
            split = split_layers([_n(b) for b in full.h], layout.chunks, emb, head)
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
