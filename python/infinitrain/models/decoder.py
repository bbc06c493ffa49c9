"""The decoder-only transformer that Qwen3 and Mixtral share, with Hugging Face's module names (so LoRA
patterns and checkpoint names read the same): RMSNorm pre-norm blocks, grouped-query attention with rotary
embeddings (optionally a per-head RMSNorm on queries and keys), and a SwiGLU MLP or a sparse
mixture-of-experts block per layer; an optionally tied output head.

Rotary embeddings rotate interleaved pairs (x[2i], x[2i+1]) (the `rope` op); Hugging Face checkpoints
rotate halves, and the q/k projection rows are permuted on load and save (docs/decisions.md). The Hugging Face
mapping and the tensor-parallel attention here serve both families (qwen3.py and mixtral.py hold their FAMILY).
"""

import math
import re

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.models import hf
from infinitrain.models import validate as V
from infinitrain.models.llama3 import rope_tables
from infinitrain.models.moe import Expert, SparseMoE, load_balancing_loss
from infinitrain.models.sampling import generate
from infinitrain.parallel import mappings as M
from infinitrain.parallel.layers import ColumnParallelLinear, RowParallelLinear, Spec, TPModule
from infinitrain.parallel.layout import LayoutError


def _int(cfg, name, lo, hi):
    if not isinstance(getattr(type(cfg), name, None), property):  # a property derives from a checked field
        V.int_field(cfg, name, lo, hi)


def check_config(cfg):
    """Validation shared by the decoder configs (types and sane bounds, as models/validate.py's); raises
    ValueError naming the field."""
    _int(cfg, "block_size", 1, V.MAX_BLOCK_SIZE)
    _int(cfg, "vocab_size", 1, V.MAX_VOCAB)
    _int(cfg, "n_layer", 1, V.MAX_LAYERS)
    _int(cfg, "n_head", 1, V.MAX_HEADS)
    _int(cfg, "n_kv_head", 1, V.MAX_HEADS)
    _int(cfg, "n_embd", 1, V.MAX_WIDTH)
    _int(cfg, "head_dim", 1, V.MAX_WIDTH)
    _int(cfg, "intermediate_size", 1, 64 * V.MAX_WIDTH)
    V.float_field(cfg, "norm_eps", 0.0, 1.0, lo_open=True)
    V.float_field(cfg, "rope_theta", 1.0, 1e12)
    V.float_field(cfg, "router_aux_loss_coef", 0.0, 1e3)
    V.bool_field(cfg, "tie_word_embeddings")
    if cfg.n_head % cfg.n_kv_head:
        raise ValueError(f"n_head ({cfg.n_head}) must be a multiple of n_kv_head ({cfg.n_kv_head})")
    if cfg.head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {cfg.head_dim}")
    _int(cfg, "num_experts", 0, 1 << 12)
    if cfg.num_experts:
        _int(cfg, "num_experts_per_tok", 1, cfg.num_experts)
        _int(cfg, "moe_intermediate_size", 1, 64 * V.MAX_WIDTH)
        _int(cfg, "decoder_sparse_step", 1, V.MAX_LAYERS)


def is_sparse_layer(cfg, i):
    """Whether layer i has the mixture-of-experts block (Qwen3-MoE's rule; every layer for Mixtral)."""
    return cfg.num_experts > 0 and i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0


class Attention(nn.Module):
    def __init__(self, cfg, device, proj_std, qk_norm):
        super().__init__()
        self.cfg = cfg
        C, hd = cfg.n_embd, cfg.head_dim
        self.q_proj = nn.Linear(C, cfg.n_head * hd, False, device, std=0.02)
        self.k_proj = nn.Linear(C, cfg.n_kv_head * hd, False, device, std=0.02)
        self.v_proj = nn.Linear(C, cfg.n_kv_head * hd, False, device, std=0.02)
        self.o_proj = nn.Linear(cfg.n_head * hd, C, False, device, std=proj_std)
        self.q_norm = nn.RMSNorm(hd, cfg.norm_eps, device=device) if qk_norm else None
        self.k_norm = nn.RMSNorm(hd, cfg.norm_eps, device=device) if qk_norm else None

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        nh, nkv, hd = self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim
        q = self.q_proj(x).reshape(B, T, nh, hd)
        k = self.k_proj(x).reshape(B, T, nkv, hd)
        if self.q_norm is not None:  # QK-norm: RMSNorm over each head's vector, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).reshape(B, T, nkv, hd)
        y = F.attention_bthd(F.rope(q, cos, sin), F.rope(k, cos, sin), v, is_causal=True)
        return self.o_proj(y.reshape(B, T, nh * hd))


class DecoderBlock(nn.Module):
    def __init__(self, cfg, i, device, proj_std, qk_norm):
        super().__init__()
        C = cfg.n_embd
        self.input_layernorm = nn.RMSNorm(C, cfg.norm_eps, device=device)
        self.self_attn = Attention(cfg, device, proj_std, qk_norm)
        self.post_attention_layernorm = nn.RMSNorm(C, cfg.norm_eps, device=device)
        # Several linears read each norm's output (q, k, v; gate and up, or the router and the experts): it stays
        # float32 under autocast, so their input gradients meet in float32.
        self.input_layernorm.keep_float32_output = True
        self.post_attention_layernorm.keep_float32_output = True
        if is_sparse_layer(cfg, i):
            self.mlp = SparseMoE(
                C,
                cfg.moe_intermediate_size,
                cfg.num_experts,
                cfg.num_experts_per_tok,
                cfg.norm_topk_prob,
                device,
                proj_std=proj_std,
            )
        else:
            self.mlp = Expert(C, cfg.intermediate_size, device, 0.02, proj_std)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderLM(nn.Module):
    """Token embedding, blocks, final RMSNorm and the output head (the embedding itself when tied).
    forward(idx, targets) returns (logits, loss); with experts, loss adds router_aux_loss_coef times the
    load-balancing loss, which is also kept in `aux_loss`."""

    qk_norm = False  # subclasses: Qwen3 normalises queries and keys per head

    @staticmethod
    def hf_rename(name):
        """A parameter's Hugging Face name after "model." (subclasses rename, as Mixtral's experts)."""
        return name

    def __init__(self, cfg, device="cpu"):
        super().__init__()
        self.config = cfg
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd, device=device, std=0.02)
        self.layers = nn.ModuleList([DecoderBlock(cfg, i, device, proj_std, self.qk_norm) for i in range(cfg.n_layer)])
        self.norm = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device=device)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, False, device, std=0.02)
        self.aux_loss = None
        self._rope = None

    def _tables(self, T):
        # Built for the lengths in use (block_size may be huge), doubling as they grow, as LLaMA3 does.
        device = self.embed_tokens.weight.device
        dtype = "float64" if self.embed_tokens.weight.dtype == "float64" else "float32"  # the rope op's table dtype
        rope = self._rope
        if rope is None or rope[0].device != device or rope[0].dtype != dtype or rope[0].shape[0] < T:
            n = min(self.config.block_size, max(64, 1 << (T - 1).bit_length()))
            self._rope = rope_tables(self.config, device, n, dtype)
        cos, sin = self._rope
        return cos[:T], sin[:T]

    def forward(self, idx, targets=None):
        """idx, targets: int64 [B, T]. Returns (logits [B, T, vocab_size], mean loss or None)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        cos, sin = self._tables(T)
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        x = self.norm(x)
        head = getattr(self, "lm_head", None)
        logits = head(x) if head is not None else F.linear(x, self.embed_tokens.weight)
        stats = [b.mlp.router_stats for b in self.layers if isinstance(b.mlp, SparseMoE)]
        self.aux_loss = load_balancing_loss(stats, self.config.num_experts) if stats else None
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
            if self.aux_loss is not None and self.config.router_aux_loss_coef:
                loss = loss + self.aux_loss * self.config.router_aux_loss_coef
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, seed=0, generator=None):
        """idx [B, T] ids (a tensor, or an array) extended by max_new_tokens samples (models/sampling.py)."""
        cfg = self.config
        return generate(self, idx, max_new_tokens, cfg.block_size, cfg.vocab_size, temperature, top_k, seed, generator)

    # ---- Hugging Face checkpoints ----
    family = None  # subclasses: their FAMILY

    @classmethod
    def from_pretrained(cls, path, device="cpu"):
        """A model from a local Hugging Face checkpoint folder (config.json + safetensors)."""
        return cls.family.from_pretrained(path, device)

    def save_pretrained(self, path, dtype="float32", max_shard_size="5GB"):
        """Writes a Hugging Face checkpoint folder: config.json + safetensors (sharded above max_shard_size)."""
        self.family.save_pretrained(self, path, dtype, max_shard_size)


# ---- sizes ----


def _swiglu_width(n_embd, multiple=32):
    """8/3 n_embd rounded up to a multiple of 32: the SwiGLU width of a fresh model sized by flags."""
    return multiple * -(-(8 * n_embd // 3) // multiple)


def config_from_sizes(config_cls, f, **extra):
    """A fresh model's config from the size fields (n_kv_head, intermediate_size unset or 0: derived)."""
    n_embd, n_head = f["n_embd"], f["n_head"]
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    return config_cls(
        block_size=f["block_size"], vocab_size=f["vocab_size"], n_layer=f["n_layer"], n_head=n_head,
        n_kv_head=f.get("n_kv_head") or n_head, n_embd=n_embd, head_dim=n_embd // n_head,
        intermediate_size=f.get("intermediate_size") or _swiglu_width(n_embd), **extra,
    )  # fmt: skip


# ---- Hugging Face checkpoints ----

ROPE_BUFFERS = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def hf_config_fields(c):
    """config.json fields both families write."""
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": c.tie_word_embeddings,
        "use_cache": True,
    }


def _rotary_heads(model, name):
    """How many rotary heads a parameter's rows hold (0: none)."""
    c = model.config
    if name.endswith("self_attn.q_proj.weight"):
        return c.n_head
    if name.endswith("self_attn.k_proj.weight"):
        return c.n_kv_head
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        return 1
    return 0


def _hf_name(model, name):
    """Our parameter name -> Hugging Face's (the family may rename, as Mixtral's experts)."""
    return name if name.startswith("lm_head.") else "model." + model.hf_rename(name)


def _param_shapes(model_cls, c):
    """Our parameter name -> shape of a DecoderLM `model_cls` built from config `c` (as __init__ lays it out)."""
    C, hd, V = c.n_embd, c.head_dim, c.vocab_size
    out = {"embed_tokens.weight": (V, C)}
    for i in range(c.n_layer):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = (C,)
        out[p + "self_attn.q_proj.weight"] = (c.n_head * hd, C)
        out[p + "self_attn.k_proj.weight"] = out[p + "self_attn.v_proj.weight"] = (c.n_kv_head * hd, C)
        out[p + "self_attn.o_proj.weight"] = (C, c.n_head * hd)
        if model_cls.qk_norm:
            out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "post_attention_layernorm.weight"] = (C,)
        if is_sparse_layer(c, i):
            I = c.moe_intermediate_size
            out[p + "mlp.gate.weight"] = (c.num_experts, C)
            experts = [f"{p}mlp.experts.{e}." for e in range(c.num_experts)]
        else:
            I, experts = c.intermediate_size, [p + "mlp."]
        for q in experts:
            out[q + "gate_proj.weight"] = out[q + "up_proj.weight"] = (I, C)
            out[q + "down_proj.weight"] = (C, I)
    out["norm.weight"] = (C,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (V, C)
    return out


def hf_shapes(model_cls):
    """HFFormat.shapes of a DecoderLM subclass: its parameters under Hugging Face's names; a tied head's
    lm_head.weight optional."""

    def shapes(config, cfg, names):
        ours = _param_shapes(model_cls, config)
        optional = {"lm_head.weight": ours["embed_tokens.weight"]} if config.tie_word_embeddings else {}
        return hf.Expected({_hf_name(model_cls, n): s for n, s in ours.items()}, optional, ROPE_BUFFERS)

    return shapes


def load_hf(model, t):
    tied = model.config.tie_word_embeddings
    for name, p in model.named_parameters():
        arr = t.take(_hf_name(model, name), p.shape)
        if tied and p is model.embed_tokens.weight:
            arr = hf.same_tied(t, "lm_head.weight", p.shape, arr, "embed_tokens.weight")
        heads = _rotary_heads(model, name)
        hf.set_param(p, hf.rotary_from_hf(arr, heads) if heads else arr)
    t.finish(ROPE_BUFFERS)


def save_hf_tensors(model):
    out = {}
    for name, p in model.named_parameters():
        heads = _rotary_heads(model, name)
        arr = hf.host(p)
        out[_hf_name(model, name)] = hf.rotary_to_hf(arr, heads) if heads else arr
    return out


# ---- tensor parallelism ----


class AttentionTP(TPModule):
    """Grouped-query attention (separate q/k/v projections) with this rank's query heads; key/value heads split or
    replicated as LLaMA 3's."""

    def __init__(self, full, cfg, region):
        super().__init__()
        if full.q_norm is not None:
            raise LayoutError("tensor parallelism of attention with a per-head q/k norm (Qwen3) is not implemented")
        tp, r = region.size, region.rank
        nh, nkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.split_heads(cfg, region)
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
