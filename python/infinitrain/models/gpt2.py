"""GPT-2 in llm.c's layout: learned positions, pre-LayerNorm blocks, tanh GELU,
and the token embedding tied to the output head. Loads and saves llm.c model
files (magic 20240326, version 3 float32 or 5 bfloat16)."""

import math
from dataclasses import dataclass

import numpy as np

from infinitrain import amp, checkpoint, nn
from infinitrain import functional as F
from infinitrain.models import validate as V
from infinitrain.models.blocks import run_split
from infinitrain.models.sampling import check_ids, generate
from infinitrain.tensor import from_numpy

MAGIC = 20240326


@dataclass
class GPT2Config:
    block_size: int = 1024
    vocab_size: int = 50257
    padded_vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768

    def __post_init__(self):
        V.int_field(self, "block_size", 1, V.MAX_BLOCK_SIZE)
        V.int_field(self, "vocab_size", 1, V.MAX_VOCAB)
        V.int_field(self, "padded_vocab_size", 1, V.MAX_VOCAB)
        V.int_field(self, "n_layer", 1, V.MAX_LAYERS)
        V.int_field(self, "n_head", 1, V.MAX_HEADS)
        V.int_field(self, "n_embd", 1, V.MAX_WIDTH)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"padded_vocab_size ({self.padded_vocab_size}) must be >= vocab_size ({self.vocab_size})")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, device=device, std=0.02)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, device=device, std=proj_std)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.reshape(B, T, self.n_head, hs) for t in (q, k, v))
        y = F.attention_bthd(q, k, v, is_causal=True)  # [B, T, H, hs]: no transposes
        return self.c_proj(y.reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, device=device, std=0.02)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, device=device, std=proj_std)

    def forward(self, x):
        fc, proj = self.c_fc, self.c_proj
        if type(fc) is nn.Linear and type(proj) is nn.Linear:  # not wrapped (LoRA): one node a provider can fuse
            return F.linear_gelu_linear(x, fc.weight, fc.bias, proj.weight, proj.bias)
        return proj(F.gelu(fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, device=device)
        self.attn = CausalSelfAttention(cfg, device, proj_std)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, device=device)
        self.mlp = MLP(cfg, device, proj_std)

    def forward(self, x):
        x, y = self.forward_split(x)
        return x + y

    def forward_split(self, x, pending=None):
        """(residual, branch): the block's output is their sum, left to the caller to add in the next norm (as
        the block adds `pending`, the previous block's branch, in its first)."""
        # A norm whose output feeds one plain linear (c_attn; the MLP's one node) writes autocast's dtype, which the
        # linear casts to anyway. Not for several consumers or wrapped ones (LoRA): their input gradients would
        # meet in that dtype instead of float32.
        lo = amp.autocast_dtype()
        attn, mlp = self.attn, self.mlp
        one_attn = type(attn) is CausalSelfAttention and type(attn.c_attn) is nn.Linear
        one_mlp = type(mlp) is MLP and type(mlp.c_fc) is nn.Linear and type(mlp.c_proj) is nn.Linear
        x, h = self.ln_1.forward_add(x, pending, lo if one_attn else None)
        x, h = self.ln_2.forward_add(x, attn(h), lo if one_mlp else None)
        return x, mlp(h)


class GPT2(nn.Module):
    def __init__(self, cfg, device="cpu"):
        super().__init__()
        self.config = cfg
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # residual projections scaled as in GPT-2
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.n_embd, device=device, std=0.02)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd, device=device, std=0.02)
        self.h = nn.ModuleList([Block(cfg, device, proj_std) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, device=device)

    def forward(self, idx, targets=None):
        """idx, targets: int64 [B, T]. Returns (logits, mean loss or None): logits [B, T, vocab_size] without
        targets; with targets [B, T, padded_vocab_size], the padded columns -inf (llm.c's layout)."""
        B, T = check_ids("GPT2", idx, targets, self.config.block_size)
        head = self.wte.weight
        if self.config.padded_vocab_size != self.config.vocab_size:
            # The tied head over the real vocabulary; embedding through it makes ids in [vocab, padded) an error.
            head = head[: self.config.vocab_size]
        x = F.embedding(idx, head) + self.wpe.weight[:T]
        x, pending = run_split(self.h, x)
        x = self.ln_f.forward_add(x, pending, amp.autocast_dtype())[1]
        # The head runs over the padded vocabulary: its aligned width keeps the GEMMs on the fast path.
        if self.config.padded_vocab_size == self.config.vocab_size:
            logits = F.linear(x, self.wte.weight)
        elif targets is None:
            logits = F.linear(x, self.wte.weight)[..., : self.config.vocab_size]
        else:
            # Padding takes no probability: a -inf bias on the padded columns, added by the product itself
            # (a separate masking pass over the logits would cost as much as the loss).
            logits = F.linear(x, self.wte.weight, self._padding_bias())
        loss = None if targets is None else F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def _padding_bias(self):
        """0 for the real vocabulary columns, -inf for the padded ones, on the model's device (made once)."""
        w = self.wte.weight
        bias = getattr(self, "_pad_bias", None)
        if bias is None or bias.device != w.device or bias.dtype != w.dtype:
            cols = np.where(np.arange(self.config.padded_vocab_size) >= self.config.vocab_size, -np.inf, 0.0)
            bias = self._pad_bias = from_numpy(cols, device=w.device).to(w.dtype)
        return bias

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, seed=0, generator=None):
        """idx [B, T] ids (a tensor, or an array) extended by max_new_tokens samples (models/sampling.py)."""
        cfg = self.config
        return generate(self, idx, max_new_tokens, cfg.block_size, cfg.vocab_size, temperature, top_k, seed, generator)

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
        """Parameters in llm.c's order, each per-layer kind stacked over layers."""
        h = list(self.h)
        per_layer = [
            lambda b: b.ln_1.weight,
            lambda b: b.ln_1.bias,
            lambda b: b.attn.c_attn.weight,
            lambda b: b.attn.c_attn.bias,
            lambda b: b.attn.c_proj.weight,
            lambda b: b.attn.c_proj.bias,
            lambda b: b.ln_2.weight,
            lambda b: b.ln_2.bias,
            lambda b: b.mlp.c_fc.weight,
            lambda b: b.mlp.c_fc.bias,
            lambda b: b.mlp.c_proj.weight,
            lambda b: b.mlp.c_proj.bias,
        ]
        groups = [[self.wte.weight], [self.wpe.weight]]
        groups += [[get(b) for b in h] for get in per_layer]
        groups += [[self.ln_f.weight], [self.ln_f.bias]]
        return groups

    def save_llmc(self, path, dtype="float32"):
        cfg = self.config
        version = {"float32": 3, "bfloat16": 5}[dtype]
        header = [MAGIC, version, cfg.block_size, cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_embd]
        header.append(cfg.padded_vocab_size)
        arrays = [np.stack([p.numpy().astype(np.float32) for p in g]) for g in self._llmc_tensors()]
        checkpoint.write_llmc_model(path, header, arrays, np.float32 if dtype == "float32" else "bfloat16")

    @classmethod
    def from_llmc(cls, path, device="cpu"):
        def config_of(h):
            return GPT2Config(
                block_size=int(h[2]),
                vocab_size=int(h[3]),
                n_layer=int(h[4]),
                n_head=int(h[5]),
                n_embd=int(h[6]),
                padded_vocab_size=int(h[7]),
            )

        def count(h):
            c = config_of(h)
            C, L = c.n_embd, c.n_layer
            per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C
            return (c.padded_vocab_size + c.block_size) * C + L * per_layer + 2 * C

        header, flat = checkpoint.read_llmc_model(path, MAGIC, count)
        model = cls(config_of(header), device)
        offset = 0
        for group in model._llmc_tensors():
            for p in group:
                n = p.numel()
                p.copy_(from_numpy(flat[offset : offset + n].reshape(p.shape), dtype=p.dtype))
                offset += n
        return model
