"""LLaMA 3: RMSNorm pre-norm blocks, grouped-query attention with rotary
position embeddings (LLaMA 3.1 frequency scaling), a SwiGLU MLP and an untied
output head (tied for LLaMA 3.2 1B and 3B checkpoints). Loads and saves llm.c
model files (magic 20240803) and Hugging Face checkpoints (model_type llama);
FAMILY says how the framework builds, converts and splits it."""

import math
import re
from dataclasses import dataclass

import numpy as np

from infinitrain import checkpoint, nn
from infinitrain import functional as F
from infinitrain.models import hf
from infinitrain.models import validate as V
from infinitrain.models.family import Dims, Family, HFFormat, Preset, TensorParallelPlan
from infinitrain.models.sampling import check_ids, generate
from infinitrain.parallel import mappings as M
from infinitrain.parallel.layers import ColumnParallelLinear, RowParallelLinear, Spec, TPModule
from infinitrain.tensor import from_numpy, load_

MAGIC = 20240803


@dataclass
class LLaMA3Config:
    block_size: int = 8192
    vocab_size: int = 128256
    n_layer: int = 16
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 2048
    ffn_dim_multiplier: float = 1.5
    multiple_of: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = True
    max_gen_batch_size: int = 4
    version_major: int = 3
    version_minor: int = 1

    def __post_init__(self):
        V.int_field(self, "block_size", 1, V.MAX_BLOCK_SIZE)
        V.int_field(self, "vocab_size", 1, V.MAX_VOCAB)
        V.int_field(self, "n_layer", 1, V.MAX_LAYERS)
        V.int_field(self, "n_head", 1, V.MAX_HEADS)
        V.int_field(self, "n_kv_head", 1, V.MAX_HEADS)
        V.int_field(self, "n_embd", 1, V.MAX_WIDTH)
        V.int_field(self, "multiple_of", 1, V.MAX_WIDTH)
        V.float_field(self, "ffn_dim_multiplier", 0.0, 64.0)  # 0: none
        V.float_field(self, "norm_eps", 0.0, 1.0, lo_open=True)
        V.float_field(self, "rope_theta", 1.0, 1e12)
        V.bool_field(self, "use_scaled_rope")
        V.int_field(self, "max_gen_batch_size", 1, 1 << 16)
        V.int_field(self, "version_major", 3, 3)
        V.int_field(self, "version_minor", 0, 99)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.n_embd // self.n_head) % 2:
            hd = self.n_embd // self.n_head
            raise ValueError(f"the head dimension n_embd / n_head = {hd} must be even for rotary embeddings")
        if self.hidden_dim > 64 * V.MAX_WIDTH:
            raise ValueError(f"ffn_dim_multiplier {self.ffn_dim_multiplier} makes a {self.hidden_dim}-wide MLP")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def hidden_dim(self):
        """The SwiGLU width: 2/3 of 4 * n_embd, times ffn_dim_multiplier, rounded up to multiple_of."""
        hidden = int(2 * (4 * self.n_embd) / 3)
        if self.ffn_dim_multiplier:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


def rope_tables(cfg, device, length=None, dtype="float32"):
    """cos, sin [length, head_dim / 2] of the rotation angles t * freq_i (length: block_size; float32, or
    float64 for float64 models)."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if cfg.use_scaled_rope:
        # LLaMA 3.1: stretch low frequencies by 8 beyond an 8192-token original context, blend in between.
        factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192.0
        wavelen = 2 * math.pi / freqs
        smooth = np.clip((old_ctx / wavelen - low) / (high - low), 0.0, 1.0)
        scaled = (1 - smooth) * freqs / factor + smooth * freqs
        freqs = np.where(wavelen < old_ctx / high, freqs, np.where(wavelen > old_ctx / low, freqs / factor, scaled))
    angles = np.outer(np.arange(cfg.block_size if length is None else length, dtype=np.float64), freqs)
    return from_numpy(np.cos(angles), dtype, device), from_numpy(np.sin(angles), dtype, device)


class Attention(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.n_kv_head) * hd, False, device, std=0.02)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, False, device, std=proj_std)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        nh, nkv, hd = self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim
        q, k, v = self.c_attn(x).split([nh * hd, nkv * hd, nkv * hd], dim=2)
        q = F.rope(q.reshape(B, T, nh, hd), cos, sin)
        k = F.rope(k.reshape(B, T, nkv, hd), cos, sin)
        y = F.attention_bthd(q, k, v.reshape(B, T, nkv, hd), is_causal=True)  # grouped-query heads, no repeat
        return self.c_proj(y.reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        h = cfg.hidden_dim
        self.c_fc = nn.Linear(cfg.n_embd, h, False, device, std=0.02)  # up
        self.c_fc2 = nn.Linear(cfg.n_embd, h, False, device, std=0.02)  # gate
        self.c_proj = nn.Linear(h, cfg.n_embd, False, device, std=proj_std)

    def forward(self, x):
        return self.c_proj(F.swiglu(self.c_fc2(x), self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.ln_1 = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device=device)
        self.attn = Attention(cfg, device, proj_std)
        self.ln_2 = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device=device)
        self.ln_2.keep_float32_output = True  # gate and up both read it: their input gradients meet in float32
        self.mlp = MLP(cfg, device, proj_std)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class LLaMA3(nn.Module):
    def __init__(self, cfg, device="cpu"):
        super().__init__()
        self.config = cfg
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd, device=device, std=0.02)
        self.h = nn.ModuleList([Block(cfg, device, proj_std) for _ in range(cfg.n_layer)])
        self.ln_f = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device=device)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, False, device, std=0.02)
        self._rope = None

    def _tables(self, T):
        # Built for the lengths in use (not block_size, which a model file may set huge), doubling as they grow;
        # row t does not depend on the table's length.
        device = self.wte.weight.device
        dtype = "float64" if self.wte.weight.dtype == "float64" else "float32"  # the rope op's table dtype
        rope = self._rope
        if rope is None or rope[0].device != device or rope[0].dtype != dtype or rope[0].shape[0] < T:
            n = min(self.config.block_size, max(64, 1 << (T - 1).bit_length()))
            self._rope = rope_tables(self.config, device, n, dtype)
        cos, sin = self._rope
        return cos[:T], sin[:T]

    def forward(self, idx, targets=None):
        """idx, targets: int64 [B, T]. Returns (logits [B, T, vocab_size], mean loss or None)."""
        B, T = check_ids("LLaMA3", idx, targets, self.config.block_size)
        cos, sin = self._tables(T)
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, seed=0, generator=None):
        """idx [B, T] ids (a tensor, or an array) extended by max_new_tokens samples (models/sampling.py)."""
        cfg = self.config
        return generate(self, idx, max_new_tokens, cfg.block_size, cfg.vocab_size, temperature, top_k, seed, generator)

    # ---- Hugging Face checkpoints ----
    @classmethod
    def from_pretrained(cls, path, device="cpu"):
        """A model from a local Hugging Face checkpoint folder (config.json + safetensors)."""
        return FAMILY.from_pretrained(path, device)

    def save_pretrained(self, path, dtype="float32", max_shard_size="5GB"):
        """Writes a Hugging Face checkpoint folder: config.json + safetensors (sharded above max_shard_size)."""
        FAMILY.save_pretrained(self, path, dtype, max_shard_size)

    @property
    def tied(self):
        """Whether the output head is the embedding (one shared parameter, as LLaMA 3.2 1B and 3B)."""
        return self.lm_head.weight is self.wte.weight

    def tie_head(self):
        """Makes the output head share the embedding's parameter (the same tensor, trained as one, counted once);
        returns the model."""
        self.lm_head.weight = self.wte.weight
        return self

    # ---- llm.c model files ----
    def _llmc_tensors(self):
        h = list(self.h)
        per_layer = [
            lambda b: b.ln_1.weight,
            lambda b: b.attn.c_attn.weight,
            lambda b: b.attn.c_proj.weight,
            lambda b: b.ln_2.weight,
            lambda b: b.mlp.c_fc.weight,
            lambda b: b.mlp.c_fc2.weight,
            lambda b: b.mlp.c_proj.weight,
        ]
        groups = [[self.wte.weight]]
        groups += [[get(b) for b in h] for get in per_layer]
        groups += [[self.ln_f.weight], [self.lm_head.weight]]
        return groups

    def save_llmc(self, path, dtype="float32", layout="infinitrain"):
        """Writes an llm.c model file. layout "infinitrain": one 256-word header with the float fields as float32
        bits among the ints; "llmc": llm.c's train_llama3.py layout, 256 int32 words then 256 float32 words (it has
        no max_gen_batch_size)."""
        c = self.config
        version = {"float32": 3, "bfloat16": 5}[dtype]
        ints = [MAGIC, version, c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.n_embd]
        if layout == "infinitrain":
            header = ints + [float(c.ffn_dim_multiplier), c.multiple_of, float(c.norm_eps), float(c.rope_theta)]
            header += [int(c.use_scaled_rope), c.max_gen_batch_size, c.version_major, c.version_minor]
            words = None
        elif layout == "llmc":
            header = ints + [c.multiple_of, int(c.use_scaled_rope), c.version_major, c.version_minor]
            header += [0] * (256 - len(header))
            header += [float(c.ffn_dim_multiplier), float(c.norm_eps), float(c.rope_theta)]
            words = 512
        else:
            raise ValueError(f"layout must be 'infinitrain' or 'llmc', got {layout!r}")
        arrays = [np.stack([p.numpy().astype(np.float32) for p in g]) for g in self._llmc_tensors()]
        checkpoint.write_llmc_model(path, header, arrays, np.float32 if dtype == "float32" else "bfloat16", words)

    @staticmethod
    def llmc_layout(header):
        """The header layout of an llm.c LLaMA 3 file from its first 256 words: "llmc" when word 10 holds the
        major version as a small int (llm.c's train_llama3.py), "infinitrain" when it holds norm_eps's float32
        bits (a normal float's bits are at least 2**23 in magnitude as an int)."""
        return "llmc" if abs(int(header[10])) < 1 << 23 else "infinitrain"

    @classmethod
    def config_from_llmc_header(cls, h):
        if cls.llmc_layout(h) == "llmc":
            f = np.asarray(h, dtype=np.int32)[256:259].view(np.float32)
            floats = {"ffn_dim_multiplier": float(f[0]), "norm_eps": float(f[1]), "rope_theta": float(f[2])}
            rest = {"multiple_of": int(h[8]), "use_scaled_rope": int(h[9]), "version_major": int(h[10])}
            rest["version_minor"] = int(h[11])
        else:
            floats = {k: checkpoint.header_float(h, i) for k, i in (("ffn_dim_multiplier", 8), ("norm_eps", 10))}
            floats["rope_theta"] = checkpoint.header_float(h, 11)
            rest = {"multiple_of": int(h[9]), "use_scaled_rope": int(h[12]), "max_gen_batch_size": int(h[13])}
            rest.update(version_major=int(h[14]), version_minor=int(h[15]))
        return LLaMA3Config(
            block_size=int(h[2]),
            vocab_size=int(h[3]),
            n_layer=int(h[4]),
            n_head=int(h[5]),
            n_kv_head=int(h[6]),
            n_embd=int(h[7]),
            **floats,
            **rest,
        )

    @classmethod
    def from_llmc(cls, path, device="cpu"):
        """Reads either LLaMA 3 header layout (see save_llmc), told apart by llmc_layout."""

        def count(h):
            c = cls.config_from_llmc_header(h)
            C, hd, H = c.n_embd, c.head_dim, c.hidden_dim
            qkv = (c.n_head + 2 * c.n_kv_head) * hd * C
            per_layer = C + qkv + C * C + C + 3 * C * H
            return c.vocab_size * C + c.n_layer * per_layer + C + c.vocab_size * C

        def words(h):
            return 512 if cls.llmc_layout(h) == "llmc" else 256

        header, flat = checkpoint.read_llmc_model(path, MAGIC, count, header_words_fn=words)
        fprint = checkpoint.fingerprint(path)  # the same file on every rank (sharded initialisation checks it)
        model = cls(cls.config_from_llmc_header(header), device)
        offset = 0
        for group in model._llmc_tensors():
            for p in group:
                n = p.numel()
                # Read now, or when a meta model's owner materialises it (sharded initialisation).
                key = ("llmc", fprint, offset, n)
                load_(p, lambda a=offset, n=n, shape=tuple(p.shape): flat[a : a + n].reshape(shape), key)
                offset += n
        return model


# ---- Hugging Face checkpoints ----

_ROPE_BUFFERS = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_HF_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def hf_decoder_checks(cfg, name):
    """Checks the LLaMA-style decoders (LLaMA, Qwen3, Mixtral) share; (hidden size, heads, kv heads)."""
    hf.require(cfg, "hidden_act", ("silu",), "silu", f"{name} uses SwiGLU (silu)")
    hf.require(cfg, "attention_bias", (False,), False, f"{name} has no attention biases")
    hf.require(cfg, "mlp_bias", (False,), False, f"{name} has no MLP biases")
    hidden, heads = hf.field(cfg, "hidden_size"), hf.field(cfg, "num_attention_heads")
    kv = hf.field(cfg, "num_key_value_heads", heads)
    return hidden, heads, kv


def config_from_hf(cfg):
    hidden, heads, kv = hf_decoder_checks(cfg, "LLaMA3")
    if hidden % heads or hf.field(cfg, "head_dim", hidden // heads) != hidden // heads:
        raise ValueError(
            f"{hf.where(cfg)}: field 'head_dim' = {cfg.get('head_dim')!r} cannot be represented: "
            "LLaMA3 uses hidden_size / num_attention_heads"
        )
    hf.field(cfg, "tie_word_embeddings", False, bool)  # checked here; tie_as_hf ties the built model
    scaling = cfg.get("rope_scaling")
    scaled = False
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind == "llama3" and all(scaling.get(k) == v for k, v in _HF_SCALING.items()):
            scaled = True
        elif kind != "default":
            raise ValueError(
                f"{hf.where(cfg)}: field 'rope_scaling' = {scaling!r} cannot be represented: LLaMA3 supports none or "
                f"rope_type 'llama3' with {_HF_SCALING}"
            )
    inter = hf.field(cfg, "intermediate_size")
    mult, multiple_of = _mlp_fields(hidden, inter)
    return hf.build(
        lambda: LLaMA3Config(
            block_size=hf.field(cfg, "max_position_embeddings"),
            vocab_size=hf.field(cfg, "vocab_size"),
            n_layer=hf.field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            ffn_dim_multiplier=mult,
            multiple_of=multiple_of,
            norm_eps=hf.field(cfg, "rms_norm_eps", 1e-6, float),
            rope_theta=hf.field(cfg, "rope_theta", 10000.0, float),
            use_scaled_rope=scaled,
        ),
        "the LLaMA config",
        cfg,
    )


def _mlp_fields(n_embd, width):
    """(ffn_dim_multiplier, multiple_of) that make LLaMA3Config's derived MLP width exactly `width`."""
    base = int(2 * (4 * n_embd) / 3)
    return (1.0 if base <= width else width / base), width


def tie_as_hf(model, cfg):
    """A model built from config.json `cfg`, tied as it says (LLaMA3Config has no field for it)."""
    if hf.field(cfg, "tie_word_embeddings", False, bool):
        model.tie_head()
    return model


def hf_shapes(config, cfg, names):
    """The tensors a LLaMA config implies; lm_head.weight optional when tie_word_embeddings says the head is the
    embedding."""
    c = config
    C, hd, H, V = c.n_embd, c.head_dim, c.hidden_dim, c.vocab_size
    out = {"model.embed_tokens.weight": (V, C)}
    for i in range(c.n_layer):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = out[p + "post_attention_layernorm.weight"] = (C,)
        out[p + "self_attn.q_proj.weight"] = (c.n_head * hd, C)
        out[p + "self_attn.k_proj.weight"] = out[p + "self_attn.v_proj.weight"] = (c.n_kv_head * hd, C)
        out[p + "self_attn.o_proj.weight"] = (C, C)
        out[p + "mlp.gate_proj.weight"] = out[p + "mlp.up_proj.weight"] = (H, C)
        out[p + "mlp.down_proj.weight"] = (C, H)
    out["model.norm.weight"] = (C,)
    head = {"lm_head.weight": (V, C)}
    if hf.field(cfg, "tie_word_embeddings", False, bool):
        return hf.Expected(out, head, _ROPE_BUFFERS)
    return hf.Expected(dict(out, **head), {}, _ROPE_BUFFERS)


def _hf_pairs(model):
    """(HF name, parameter) but q/k/v (handled separately); no lm_head when it is tied."""
    pairs = [("model.embed_tokens.weight", model.wte.weight)]
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}."
        pairs += [
            (p + "input_layernorm.weight", b.ln_1.weight),
            (p + "self_attn.o_proj.weight", b.attn.c_proj.weight),
            (p + "post_attention_layernorm.weight", b.ln_2.weight),
            (p + "mlp.gate_proj.weight", b.mlp.c_fc2.weight),
            (p + "mlp.up_proj.weight", b.mlp.c_fc.weight),
            (p + "mlp.down_proj.weight", b.mlp.c_proj.weight),
        ]
    pairs += [("model.norm.weight", model.ln_f.weight)]
    if not model.tied:
        pairs += [("lm_head.weight", model.lm_head.weight)]
    return pairs


def load_hf(model, t):
    c = model.config
    hd, C = c.head_dim, c.n_embd
    for name, p in _hf_pairs(model):
        arr = t.take(name, p.shape)
        if model.tied and name == "model.embed_tokens.weight":
            arr = hf.same_tied(t, "lm_head.weight", p.shape, arr, name)
        hf.set_param(p, arr)
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}.self_attn."
        q = hf.rotary_from_hf(t.take(p + "q_proj.weight", (c.n_head * hd, C)), c.n_head)
        k = hf.rotary_from_hf(t.take(p + "k_proj.weight", (c.n_kv_head * hd, C)), c.n_kv_head)
        v = t.take(p + "v_proj.weight", (c.n_kv_head * hd, C))
        hf.set_param(b.attn.c_attn.weight, hf.concat([q, k, v]))
    t.finish(_ROPE_BUFFERS)


def save_hf(model):
    c = model.config
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd,
        "intermediate_size": c.hidden_dim,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(_HF_SCALING, rope_type="llama3") if c.use_scaled_rope else None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        # Tied: no lm_head.weight in the files (Hugging Face's layout; its loader ties the head to embed_tokens).
        "tie_word_embeddings": model.tied,
        "use_cache": True,
    }
    out = {name: hf.host(p) for name, p in _hf_pairs(model)}
    hd = c.head_dim
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}.self_attn."
        q, k, v = np.split(hf.host(b.attn.c_attn.weight), [c.n_head * hd, (c.n_head + c.n_kv_head) * hd])
        out[p + "q_proj.weight"] = hf.rotary_to_hf(q, c.n_head)
        out[p + "k_proj.weight"] = hf.rotary_to_hf(k, c.n_kv_head)
        out[p + "v_proj.weight"] = v
    return cfg, out


# ---- tensor parallelism ----


class AttentionTP(TPModule):
    """Grouped-query attention with this rank's query heads. Key/value heads split like the queries when there are
    at least as many as ranks; with fewer, every rank holds all of them (they are small) and uses its group's one;
    their rows enter the region (copy_to), so their gradient is summed over the ranks."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        nh, nkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.split_heads(cfg, region)
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


class MLPTP(TPModule):
    """The SwiGLU MLP with this rank's columns of up and gate and the matching rows of the down projection."""

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


def _dims(cfg):
    return Dims(cfg.n_head, cfg.n_kv_head, cfg.n_layer, cfg.hidden_dim, cfg.vocab_size)


def _make_config(f):
    if f.get("intermediate_size"):  # an MLP width mapped onto LLaMA 3's two fields
        f = dict(f)
        f["ffn_dim_multiplier"], f["multiple_of"] = _mlp_fields(f["n_embd"], f.pop("intermediate_size"))
    return LLaMA3Config(**f)


# LLaMA 3 sizes (untied output head, as llm.c's train_llama3.py); vocabulary 128256.
_SIZES = (
    (("llama3", "llama3-1b"), (16, 32, 8, 2048, 1.5, 1024, 8192), "LLaMA 3.2 1B shape"),
    (("llama3-3b",), (28, 24, 8, 3072, 1.0, 256, 8192), "LLaMA 3.2 3B shape"),
    (("llama3-8b",), (32, 32, 8, 4096, 1.3, 1024, 8192), "LLaMA 3.1 8B"),
    (("llama3-70b",), (80, 64, 8, 8192, 1.3, 4096, 8192), "LLaMA 3.1 70B"),
)
_BIG = {"vocab_size": 128256, "rope_theta": 500000.0, "use_scaled_rope": True}

FAMILY = Family(
    "llama3",
    LLaMA3,
    LLaMA3Config,
    custom={"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "ffn_dim_multiplier": 1.0, "multiple_of": 32},
    presets=(
        *(
            Preset(
                n,
                what,
                n_layer=L,
                n_head=H,
                n_kv_head=KV,
                n_embd=C,
                ffn_dim_multiplier=mult,
                multiple_of=of,
                block_size=block,
                **_BIG,
            )  # fmt: skip
            for names, (L, H, KV, C, mult, of, block), what in _SIZES
            for n in names
        ),
        Preset("llama3-tiny", "a 4-layer, 128-wide LLaMA 3 (block size: the sequence length)"),
    ),
    make_config=_make_config,
    blocks="h",
    lora_targets="attn.c_attn,attn.c_proj",
    hf=HFFormat(("llama",), config_from_hf, load_hf, save_hf, tie=tie_as_hf, shapes=hf_shapes),
    tensor_parallel=TensorParallelPlan(
        "wte", "h", "ln_f", "attn", "mlp", AttentionTP, MLPTP, _dims, rotary=lambda c, d, n: rope_tables(c, d, n)
    ),
    llmc=True,
)
