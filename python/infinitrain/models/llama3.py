"""LLaMA 3: RMSNorm pre-norm blocks, grouped-query attention with rotary
position embeddings (LLaMA 3.1 frequency scaling), a SwiGLU MLP and an untied
output head. Loads and saves llm.c model files (magic 20240803)."""

import math
from dataclasses import dataclass

import numpy as np

from infinitrain import checkpoint, nn
from infinitrain import functional as F
from infinitrain.models.sampling import generate
from infinitrain.tensor import from_numpy

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
        for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "multiple_of"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)}")
        for k in ("norm_eps", "rope_theta"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)}")
        if self.ffn_dim_multiplier < 0:
            raise ValueError(f"ffn_dim_multiplier must be >= 0, got {self.ffn_dim_multiplier}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError("the head dimension must be even for rotary embeddings")

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


def rope_tables(cfg, device, dtype="float32"):
    """cos, sin [block_size, head_dim / 2] of the rotation angles t * freq_i (float32; float64 for float64 models)."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if cfg.use_scaled_rope:
        # LLaMA 3.1: stretch low frequencies by 8 beyond an 8192-token original context, blend in between.
        factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192.0
        wavelen = 2 * math.pi / freqs
        smooth = np.clip((old_ctx / wavelen - low) / (high - low), 0.0, 1.0)
        scaled = (1 - smooth) * freqs / factor + smooth * freqs
        freqs = np.where(wavelen < old_ctx / high, freqs, np.where(wavelen > old_ctx / low, freqs / factor, scaled))
    angles = np.outer(np.arange(cfg.block_size, dtype=np.float64), freqs)
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
        q = F.rope(q.reshape(B, T, nh, hd), cos, sin).transpose(1, 2)
        k = F.rope(k.reshape(B, T, nkv, hd), cos, sin).transpose(1, 2)
        v = v.reshape(B, T, nkv, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # grouped-query heads, no repeat
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


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
        self.ln_1 = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device)
        self.attn = Attention(cfg, device, proj_std)
        self.ln_2 = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device)
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
        self.ln_f = nn.RMSNorm(cfg.n_embd, cfg.norm_eps, device)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, False, device, std=0.02)
        self._rope = None

    def _tables(self, T):
        device = self.wte.weight.device
        dtype = "float64" if self.wte.weight.dtype == "float64" else "float32"  # the rope op's table dtype
        if self._rope is None or self._rope[0].device != device or self._rope[0].dtype != dtype:
            self._rope = rope_tables(self.config, device, dtype)
        cos, sin = self._rope
        return cos[:T], sin[:T]

    def forward(self, idx, targets=None):
        """idx, targets: int64 [B, T]. Returns (logits [B, T, vocab_size], mean loss or None)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        cos, sin = self._tables(T)
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, seed=0):
        cfg = self.config
        return generate(self, idx, max_new_tokens, cfg.block_size, cfg.vocab_size, temperature, top_k, seed)

    # ---- Hugging Face checkpoints (models/hf.py) ----
    @classmethod
    def from_pretrained(cls, path, device="cpu", **kwargs):
        """A model from a local Hugging Face checkpoint folder (config.json + safetensors)."""
        from infinitrain.models import hf

        return hf.from_pretrained(path, device, cls=cls, **kwargs)

    def save_pretrained(self, path, dtype="float32", max_shard_size="5GB"):
        """Writes a Hugging Face checkpoint folder: config.json + safetensors (sharded above max_shard_size)."""
        from infinitrain.models import hf

        hf.save_pretrained(self, path, dtype, max_shard_size)

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

    def save_llmc(self, path, dtype="float32"):
        c = self.config
        version = {"float32": 3, "bfloat16": 5}[dtype]
        header = [MAGIC, version, c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.n_embd]
        header += [float(c.ffn_dim_multiplier), c.multiple_of, float(c.norm_eps), float(c.rope_theta)]
        header += [int(c.use_scaled_rope), c.max_gen_batch_size, c.version_major, c.version_minor]
        arrays = [np.stack([p.numpy().astype(np.float32) for p in g]) for g in self._llmc_tensors()]
        checkpoint.write_llmc_model(path, header, arrays, np.float32 if dtype == "float32" else "bfloat16")

    @classmethod
    def from_llmc(cls, path, device="cpu"):
        def config_of(h):
            return LLaMA3Config(
                block_size=int(h[2]),
                vocab_size=int(h[3]),
                n_layer=int(h[4]),
                n_head=int(h[5]),
                n_kv_head=int(h[6]),
                n_embd=int(h[7]),
                ffn_dim_multiplier=checkpoint.header_float(h, 8),
                multiple_of=int(h[9]),
                norm_eps=checkpoint.header_float(h, 10),
                rope_theta=checkpoint.header_float(h, 11),
                use_scaled_rope=bool(h[12]),
                max_gen_batch_size=int(h[13]),
                version_major=int(h[14]),
                version_minor=int(h[15]),
            )

        def count(h):
            c = config_of(h)
            C, hd, H = c.n_embd, c.head_dim, c.hidden_dim
            qkv = (c.n_head + 2 * c.n_kv_head) * hd * C
            per_layer = C + qkv + C * C + C + 3 * C * H
            return c.vocab_size * C + c.n_layer * per_layer + C + c.vocab_size * C

        header, flat = checkpoint.read_llmc_model(path, MAGIC, count)
        model = cls(config_of(header), device)
        offset = 0
        for group in model._llmc_tensors():
            for p in group:
                n = p.numel()
                p.copy_(from_numpy(flat[offset : offset + n].reshape(p.shape), dtype=p.dtype))
                offset += n
        return model
