"""GPT-2 in llm.c's layout: learned positions, pre-LayerNorm blocks, tanh GELU,
and the token embedding tied to the output head. Loads and saves llm.c model
files (magic 20240326, version 3 float32 or 5 bfloat16) and Hugging Face
checkpoints (Conv1D weights stored transposed, [in, out]); FAMILY says how the
framework builds, converts and splits it."""

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
from infinitrain.parallel.layers import ColumnParallelLinear, RowParallelLinear, Spec, TPModule
from infinitrain.tensor import from_numpy, load_

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
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, device, proj_std):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, device=device)
        self.attn = CausalSelfAttention(cfg, device, proj_std)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, device=device)
        self.mlp = MLP(cfg, device, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


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
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
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

    # ---- Hugging Face checkpoints ----
    @classmethod
    def from_pretrained(cls, path, device="cpu", padded_vocab_size=None):
        """A model from a local Hugging Face checkpoint folder (config.json + safetensors)."""
        return FAMILY.from_pretrained(path, device, padded_vocab_size=padded_vocab_size)

    def save_pretrained(self, path, dtype="float32", max_shard_size="5GB"):
        """Writes a Hugging Face checkpoint folder: config.json + safetensors (sharded above max_shard_size)."""
        FAMILY.save_pretrained(self, path, dtype, max_shard_size)

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
        fprint = checkpoint.fingerprint(path)  # the same file on every rank (sharded initialisation checks it)
        model = cls(config_of(header), device)
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

_HF_BUFFERS = re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias")
_HF_LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def config_from_hf(cfg, padded_vocab_size=None):
    hf.require(
        cfg, "activation_function", ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), "gelu_new", "GPT2 uses tanh GELU"
    )
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    if eps != 1e-5:
        raise ValueError(f"{hf.where(cfg)}: field 'layer_norm_epsilon' = {eps!r} cannot be represented: GPT2 uses 1e-5")
    C = hf.field(cfg, "n_embd")
    if cfg.get("n_inner") not in (None, 4 * C):
        raise ValueError(
            f"{hf.where(cfg)}: field 'n_inner' = {cfg['n_inner']!r} cannot be represented: GPT2 uses 4 * n_embd"
        )
    hf.require(cfg, "scale_attn_weights", (True,), True, "GPT2 scales attention by 1/sqrt(head dim)")
    hf.require(cfg, "scale_attn_by_inverse_layer_idx", (False,), False, "GPT2 does not scale by layer")
    hf.require(cfg, "add_cross_attention", (False,), False, "GPT2 is decoder-only")
    hf.require(cfg, "tie_word_embeddings", (True,), True, "GPT2 ties its output head to wte")
    vocab = hf.field(cfg, "vocab_size")
    return hf.build(
        lambda: GPT2Config(
            block_size=hf.field(cfg, "n_positions"),
            vocab_size=vocab,
            padded_vocab_size=padded_vocab_size or vocab,
            n_layer=hf.field(cfg, "n_layer"),
            n_head=hf.field(cfg, "n_head"),
            n_embd=C,
        ),
        "the GPT-2 config",
        cfg,
    )


def hf_shapes(config, cfg, names):
    """The tensors a GPT-2 config implies (Hugging Face's names and [in, out] Conv1D layouts), with or without
    the "transformer." prefix as the files have it; a tied lm_head a file may hold."""
    C, V = config.n_embd, config.vocab_size
    prefix = "transformer." if any(n.startswith("transformer.") for n in names) else ""
    out = {prefix + "wte.weight": (V, C), prefix + "wpe.weight": (config.block_size, C)}
    for i in range(config.n_layer):
        p = f"{prefix}h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"] = out[p + ln + ".bias"] = (C,)
        for name, n_in, n_out in (("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C),
                                  ("mlp.c_proj", 4 * C, C)):  # fmt: skip
            out[p + name + ".weight"], out[p + name + ".bias"] = (n_in, n_out), (n_out,)
    out[prefix + "ln_f.weight"] = out[prefix + "ln_f.bias"] = (C,)
    return hf.Expected(out, {"lm_head.weight": (V, C)}, _HF_BUFFERS)


def load_hf(model, t):
    c = model.config
    C, vocab = c.n_embd, c.vocab_size
    prefix = "transformer." if any(n.startswith("transformer.") for n in t.t) else ""
    wte = t.take(prefix + "wte.weight", (vocab, C))
    wte = hf.same_tied(t, "lm_head.weight", (vocab, C), wte, prefix + "wte.weight (GPT2 ties them)")
    hf.set_param(model.wte.weight, hf.pad_rows(wte, c.padded_vocab_size))
    hf.set_param(model.wpe.weight, t.take(prefix + "wpe.weight", (c.block_size, C)))
    for i, b in enumerate(model.h):
        p = f"{prefix}h.{i}."
        for ln in ("ln_1", "ln_2"):
            mod = getattr(b, ln)
            hf.set_param(mod.weight, t.take(p + ln + ".weight", (C,)))
            hf.set_param(mod.bias, t.take(p + ln + ".bias", (C,)))
        for name in _HF_LINEARS:  # Conv1D stores [in, out]: our Linear holds [out, in]
            mod = b.get_submodule(name)
            n_out, n_in = mod.weight.shape
            hf.set_param(mod.weight, t.take(p + name + ".weight", (n_in, n_out)).T)
            hf.set_param(mod.bias, t.take(p + name + ".bias", (n_out,)))
    hf.set_param(model.ln_f.weight, t.take(prefix + "ln_f.weight", (C,)))
    hf.set_param(model.ln_f.bias, t.take(prefix + "ln_f.bias", (C,)))
    t.finish(_HF_BUFFERS)


def save_hf(model):
    c = model.config
    cfg = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "use_cache": True,
    }
    out = {
        "transformer.wte.weight": hf.host(model.wte.weight)[: c.vocab_size],
        "transformer.wpe.weight": hf.host(model.wpe.weight),
    }
    for i, b in enumerate(model.h):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            mod = getattr(b, ln)
            out[p + ln + ".weight"], out[p + ln + ".bias"] = hf.host(mod.weight), hf.host(mod.bias)
        for name in _HF_LINEARS:
            mod = b.get_submodule(name)
            out[p + name + ".weight"] = np.ascontiguousarray(hf.host(mod.weight).T)
            out[p + name + ".bias"] = hf.host(mod.bias)
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = hf.host(model.ln_f.weight), hf.host(model.ln_f.bias)
    return cfg, out


# ---- tensor parallelism ----


class AttentionTP(TPModule):
    """The attention with this rank's heads: c_attn rows of its q, k and v heads, c_proj's matching columns."""

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


class MLPTP(TPModule):
    """The MLP with this rank's columns of c_fc and the matching rows of c_proj."""

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


def _dims(cfg):
    return Dims(cfg.n_head, cfg.n_head, cfg.n_layer, 4 * cfg.n_embd, cfg.padded_vocab_size)


def _vocab(v):
    """The vocabulary fields of a vocabulary size: the embedding padded to a multiple of 64 rows."""
    return {"vocab_size": v, "padded_vocab_size": -(-v // 64) * 64}


# GPT-2 sizes as llm.c and InfiniTrain name them (dN: N layers); vocabulary 50257, 1024 positions.
_SIZES = (
    (("gpt2", "d12"), (12, 12, 768), "GPT-2 124M"),
    (("gpt2-medium", "d24"), (24, 16, 1024), "GPT-2 350M"),
    (("gpt2-large", "d36"), (36, 20, 1280), "GPT-2 774M"),
    (("gpt2-xl", "d48"), (48, 25, 1600), "GPT-2 1558M"),
)

FAMILY = Family(
    "gpt2",
    GPT2,
    GPT2Config,
    custom={"n_layer": 4, "n_head": 4, "n_embd": 128},
    presets=(
        *(
            Preset(n, what, n_layer=L, n_head=H, n_embd=C, block_size=1024, vocab_size=50257)
            for names, (L, H, C), what in _SIZES
            for n in names
        ),
        Preset("gpt2-tiny", "the main job's 4-layer, 128-wide GPT-2 (block size: the sequence length)"),
    ),
    shape_flags=("n_layer", "n_head", "n_embd"),
    vocab_fields=_vocab,
    blocks="h",
    lora_targets="attn.c_attn,attn.c_proj",
    hf=HFFormat(("gpt2",), config_from_hf, load_hf, save_hf, shapes=hf_shapes),
    tensor_parallel=TensorParallelPlan(
        "wte", "h", "ln_f", "attn", "mlp", AttentionTP, MLPTP, _dims, positions="wpe", tied_head=True
    ),
    llmc=True,
)
