"""A model split for a layout: this rank's model chunks, made from the full model by its family's
TensorParallelPlan (models/family.py; GPT-2, LLaMA 3 and Mixtral have one).

    full = GPT2(cfg)                                                      # every rank builds it from the same seed
    model = ParallelModel(full, layout, gpt2.FAMILY.tensor_parallel, grid)   # this rank's layers and part

The full model's blocks are reused (their attention and MLP replaced by the plan's tensor-parallel versions holding
this rank's heads and MLP columns, or whole experts), so the layers compute what the single-device model does
and the split model starts from the same weights. Parameters keep the full model's names
("h.3.attn.c_attn.weight"); `specs[name]` says how each relates to the full tensor (checkpoint merging and
gradient norms read it).

Chunk v of the pipeline (virtual stage v = chunk * pp + stage) holds a contiguous run of layers; the first also
the embedding, the last the final norm, the head and the loss. The split balances parameter counts unless an
explicit one is given.
"""

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.parallel import mappings as M
from infinitrain.parallel.layers import (
    ColumnParallelLinear,
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


# ---- one chunk ----


class Stage(nn.Module):
    """Layers [lo, hi) of the full model, as attributes named like the full model's (its blocks are keyed by the
    global layer index), with the embedding when first and the final norm, head and loss when last.
    forward(x, targets) takes ids on the first chunk, activations [B, T (/ tp with SP), C] on the others; returns
    the mean loss on the last, the activations otherwise. With experts, the chunks after the first take, and all
    but the last return, the activations flattened with the router statistics of the layers before appended
    (`carry` values: summed counts and probabilities per expert), since the balancing loss couples every layer."""

    def __init__(self, full, plan, lo, hi, first, last, region, tied_wte=None):
        super().__init__()
        cfg = full.config
        self.plan, self.config, self.region = plan, cfg, region
        self.first, self.last, self.lo, self.hi = first, last, lo, hi
        emb, blocks, norm, attn, mlp = plan.embedding, plan.blocks, plan.norm, plan.attention, plan.mlp
        self._specs = {}
        tp, r = region.size, region.rank
        rows = plan.dims(cfg).vocab_rows
        self.vocab_start, vocab_end = piece(rows, tp, r)
        vocab = Spec((rows, cfg.n_embd), 0, [(rows, tp)])
        if first:
            setattr(self, emb, VocabParallelEmbedding(vocab.take(getattr(full, emb).weight, tp, r), self.vocab_start,
                                                      region))  # fmt: skip
            self._specs[f"{emb}.weight"] = vocab
            if plan.positions:
                setattr(self, plan.positions, getattr(full, plan.positions))
        setattr(self, blocks, nn.ModuleDict())
        for i in range(lo, hi):
            block = getattr(full, blocks)[i]
            if tp > 1:
                setattr(block, attn, plan.attention_tp(getattr(block, attn), cfg, region))
                setattr(block, mlp, plan.mlp_tp(getattr(block, mlp), cfg, region))
                for sub in (attn, mlp):
                    for name, spec in getattr(block, sub).specs().items():
                        self._specs[f"{blocks}.{i}.{sub}.{name}"] = spec
            getattr(self, blocks)[str(i)] = block
        self.carry = 2 * cfg.num_experts if plan.balancing_loss is not None else 0
        if last:
            setattr(self, norm, getattr(full, norm))
            if plan.tied_head:
                if not first:  # the tied head's own copy on the last stage; its gradient meets the first's
                    head = tied_wte if tied_wte is not None else VocabParallelEmbedding(
                        vocab.take(getattr(full, emb).weight, tp, r), self.vocab_start, region
                    )  # fmt: skip
                    setattr(self, emb, head)
                    self._specs[f"{emb}.weight"] = Spec(vocab.full_shape, 0, vocab.segments, tied=True)
            else:
                head = Spec(full.lm_head.weight.shape, 0, [(rows, tp)])
                self.lm_head = ColumnParallelLinear(head.take(full.lm_head.weight, tp, r), None, region, enter=False)
                self._specs["lm_head.weight"] = head
            self.valid = max(0, min(vocab_end, cfg.vocab_size) - self.vocab_start)  # GPT-2 pads its vocabulary
        # Everything else is replicated; used on a sequence shard (SP), its gradient is partial on each rank.
        for name, p in self.named_parameters():
            if name not in self._specs:
                self._specs[name] = Spec(p.shape, 0, None, sync_tp=region.sp)
        self._rope = None
        self.aux_loss = None  # with experts, the last chunk: the last forward's balancing loss

    def specs(self):
        return self._specs

    def _tables(self, T, device):
        rope = self._rope
        if rope is None or rope[0].shape[0] < T:
            n = min(self.config.block_size, max(64, 1 << (T - 1).bit_length()))
            self._rope = self.plan.rotary(self.config, device, n)
        cos, sin = self._rope
        return cos[:T], sin[:T]

    def embed(self, idx):
        region = self.region
        x = getattr(self, self.plan.embedding).partial(idx)
        T = idx.shape[1]
        if self.plan.positions:
            wpe = getattr(self, self.plan.positions).weight
            if region.sp:
                n = T // region.size
                return M.reduce_scatter_seq(x, region.group) + wpe[region.rank * n : (region.rank + 1) * n]
            return M.reduce_from(x, region.group) + wpe[:T]
        return region.exit(x)

    def forward(self, x, targets=None, shape=None):
        """shape: (B, T, C) of the activations when they come flattened with the router statistics (the engine
        passes it; the shape is the one it received)."""
        plan = self.plan
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
        extra = self._tables(T, x.device) if plan.rotary is not None else ()
        for block in getattr(self, plan.blocks).values():
            x = block(x, *extra)
            if self.carry:
                stats.append(getattr(block, plan.mlp).router_stats)
        if self.carry:
            counts, probs = _sum_stats(stats)
        if not self.last:
            if self.carry:  # float32 carries the counts exactly (the engine sends float32 anyway)
                return F.cat([x.reshape(-1).to("float32"), counts.to("float32"), probs.to("float32")])
            return x
        x = self.region.enter(getattr(self, plan.norm)(x))
        logits = F.linear(x, plan.head(self))  # [B, T, this rank's vocabulary columns]
        B = logits.shape[0]
        loss = vocab_parallel_cross_entropy(
            logits.reshape(B * T, -1), targets.reshape(B * T), self.vocab_start, self.region, self.valid
        )
        if self.carry:  # the router's balancing loss, as the full model adds it (and keeps in aux_loss)
            aux = plan.balancing_loss(stats, self.config.num_experts)
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
    """This rank's chunks of the full model under `layout`, split by its family's TensorParallelPlan (grid: its
    groups; None for one process). `split`: layers per chunk in virtual-stage order (default: balanced by parameter
    count). The full model is taken apart: do not use it afterwards."""

    def __init__(self, full, layout, plan, grid=None, split=None, sequence_length=None):
        super().__init__()
        check_model(layout, plan, full.config, sequence_length)
        self.plan, self.layout, self.config = plan, layout, full.config
        self.grid = grid
        stage = grid.stage if grid is not None else 0
        tp_group = grid.tp if grid is not None else None
        self.region = TPRegion(tp_group, layout.sp)
        emb, blocks, norm = (getattr(full, n) for n in (plan.embedding, plan.blocks, plan.norm))
        n_layer = len(blocks)
        if split is None:
            emb = _n(emb) + (_n(getattr(full, plan.positions)) if plan.positions else 0)
            head = _n(norm) + (0 if plan.tied_head else _n(full.lm_head))
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
            self.chunks.append(Stage(full, plan, bounds[v], bounds[v + 1], first, last, self.region))
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
