"""Hugging Face checkpoints in and out: a local folder with config.json and safetensors weights (one
model.safetensors, or shards listed by model.safetensors.index.json), float32, bfloat16, float16 or
float64 on disk, for GPT-2, LLaMA (3), Qwen3 / Qwen3-MoE and Mixtral. No hub access: folders only.

    model = from_pretrained("path/to/folder")          # the class from config.json's model_type
    save_pretrained(model, "out", dtype="bfloat16", max_shard_size="2GB")

Names and layouts are Hugging Face's: GPT-2's Conv1D weights are stored transposed ([in, out]);
LLaMA-family q/k projections rotate halves (rotate_half) where our rope op rotates interleaved pairs, so
their rows (and Qwen3's q/k norm weights) are permuted on the way in and out (docs/decisions.md). A
malformed file, a missing or mis-shaped tensor, or a config the model cannot represent raises ValueError
naming the file, tensor or config field.
"""

import json
import os
import re

import numpy as np

from infinitrain import checkpoint
from infinitrain.models.gpt2 import GPT2, GPT2Config
from infinitrain.models.llama3 import LLaMA3, LLaMA3Config
from infinitrain.models.mixtral import Mixtral, MixtralConfig
from infinitrain.models.qwen3 import Qwen3, Qwen3Config
from infinitrain.tensor import from_numpy

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_FROM_ST = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
_TO_ST = {"float32": ("float32", np.float32), "float16": ("float16", np.float16), "float64": ("float64", np.float64)}


# ---- files -------------------------------------------------------------------------------------------------


def read_config(path):
    """config.json of a checkpoint folder as a dict."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no such file (a Hugging Face checkpoint folder has a config.json)")
    try:
        with open(file) as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _read_file(file):
    from safetensors import SafetensorError, deserialize  # lazily: only checkpoint I/O needs the package

    try:
        with open(file, "rb") as f:
            entries = deserialize(f.read())
    except SafetensorError as e:
        raise ValueError(f"{file}: not a valid safetensors file ({e})") from None
    out = {}
    for name, entry in entries:
        dt, shape, data = entry["dtype"], tuple(entry["shape"]), entry["data"]
        if dt == "BF16":
            arr = checkpoint.bf16_bits_to_float32(np.frombuffer(data, dtype="<u2"))
        elif dt in _FROM_ST:
            arr = np.frombuffer(data, dtype=np.dtype(_FROM_ST[dt]).newbyteorder("<")).astype(_FROM_ST[dt])
        else:
            raise ValueError(f"{file}: tensor '{name}' has dtype {dt}; expected F32, BF16, F16 or F64")
        out[name] = arr.reshape(shape)
    return out


def read_tensors(path):
    """name -> NumPy array (float32, or float64 for F64 tensors) of every tensor in the folder's weights."""
    index, single = os.path.join(path, INDEX_FILE), os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: malformed index ({e}); expected {{'weight_map': {{name: file}}}}") from None
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if not isinstance(shard, str) or os.path.basename(shard) != shard:
                raise ValueError(f"{index}: weight_map names shard {shard!r}; expected a file in the folder")
            file = os.path.join(path, shard)
            if not os.path.isfile(file):
                raise ValueError(f"{index}: shard {shard} is missing")
            tensors.update(_read_file(file))
        missing = sorted(n for n in weight_map if n not in tensors)
        if missing:
            raise ValueError(f"{index}: tensors {missing[:5]} are listed but not in their shards")
        return tensors
    if os.path.isfile(single):
        return _read_file(single)
    raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE}")


def _parse_size(size):
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size: expected bytes or a size such as '2GB', got {size!r}")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(m.group(1)) * scale)


def write_checkpoint(path, config, tensors, dtype="float32", max_shard_size="5GB"):
    """Writes config.json and the tensors (name -> float array) as safetensors in `dtype` (float32, bfloat16,
    float16, float64), sharded with an index when they exceed max_shard_size. Files are written atomically;
    weight files of an earlier save that this one does not use are removed."""
    if dtype not in ("bfloat16", *_TO_ST):
        raise ValueError(f"dtype must be float32, bfloat16, float16 or float64, got {dtype!r}")
    from safetensors import serialize

    limit = _parse_size(max_shard_size)
    if limit < 1:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    entries = []
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if dtype == "bfloat16":
            data, st = checkpoint.float32_to_bf16_bits(arr.astype(np.float32)).astype("<u2").tobytes(), "bfloat16"
        else:
            st, np_dtype = _TO_ST[dtype]
            data = np.ascontiguousarray(arr, dtype=np.dtype(np_dtype).newbyteorder("<")).tobytes()
        entries.append((name, {"dtype": st, "shape": list(arr.shape), "data": data}))
    shards, size = [[]], 0
    for e in entries:
        n = len(e[1]["data"])
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    os.makedirs(path, exist_ok=True)
    names = (
        [WEIGHTS_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards, strict=True):
        blob = serialize(dict(shard), metadata={"format": "pt"})
        checkpoint.atomic_write(os.path.join(path, name), lambda f, b=blob: f.write(b))
    written = set(names)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(len(e[1]["data"]) for e in entries)},
            "weight_map": {e[0]: n for n, shard in zip(names, shards, strict=True) for e in shard},
        }
        checkpoint.atomic_write(os.path.join(path, INDEX_FILE), lambda f: f.write(json.dumps(index, indent=2).encode()))
        written.add(INDEX_FILE)
    for old in os.listdir(path):
        if old not in written and (re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors", old) or old == INDEX_FILE):
            os.remove(os.path.join(path, old))
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    checkpoint.atomic_write(os.path.join(path, CONFIG_FILE), lambda f: f.write(text.encode()))


# ---- config fields ------------------------------------------------------------------------------------------

_REQUIRED = object()


def _field(cfg, key, default=_REQUIRED, kind=int):
    """A config.json field of the given kind (int: a positive integer; float: positive; bool; str)."""
    if key not in cfg or cfg[key] is None:
        if default is _REQUIRED:
            raise ValueError(f"config.json: missing field '{key}'")
        return default
    v = cfg[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"config.json: field '{key}' must be a positive integer, got {v!r}")
    elif kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"config.json: field '{key}' must be a positive number, got {v!r}")
        v = float(v)
    elif kind is bool:
        if not isinstance(v, bool):
            raise ValueError(f"config.json: field '{key}' must be true or false, got {v!r}")
    elif not isinstance(v, kind):
        raise ValueError(f"config.json: field '{key}' must be a {kind.__name__}, got {v!r}")
    return v


def _require(cfg, key, allowed, default, why):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if v not in allowed:
        raise ValueError(f"config.json: field '{key}' = {v!r} cannot be represented: {why}")


def _build(make, what):
    """Runs a model config's constructor; its ValueError (a field out of range) names the checkpoint."""
    try:
        return make()
    except ValueError as e:
        raise ValueError(f"config.json: {what} cannot be represented: {e}") from None


# ---- tensors ------------------------------------------------------------------------------------------------


class _Tensors:
    """The checkpoint's tensors: take() each expected one by name and shape; leftovers are an error."""

    def __init__(self, tensors, where):
        self.t, self.where = dict(tensors), where

    def take(self, name, shape):
        if name not in self.t:
            raise ValueError(f"{self.where}: missing tensor '{name}'")
        arr = self.t.pop(name)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"{self.where}: tensor '{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}")
        return arr

    def finish(self, ignore=None):
        left = sorted(n for n in self.t if not (ignore and ignore.fullmatch(n)))
        if left:
            raise ValueError(f"{self.where}: unexpected tensors {left[:8]}{' ...' if len(left) > 8 else ''}")


def _set(param, arr):
    param.copy_(from_numpy(np.asarray(arr), dtype=param.dtype, device=param.device))


def rotary_from_hf(w, heads):
    """Rows of a q/k projection [heads * hd, ...] from rotate-half order (pair i = rows i, i + hd/2 of a head)
    to interleaved order (pair i = rows 2i, 2i + 1)."""
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rotary_to_hf(w, heads):
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _host(p):
    return p.numpy().astype(np.float32) if p.dtype != "float64" else p.numpy()


# ---- GPT-2 --------------------------------------------------------------------------------------------------

_GPT2_BUFFERS = re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias")


def _gpt2_config(cfg, padded_vocab_size=None):
    _require(
        cfg, "activation_function", ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), "gelu_new", "GPT2 uses tanh GELU"
    )
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    if eps != 1e-5:
        raise ValueError(f"config.json: field 'layer_norm_epsilon' = {eps!r} cannot be represented: GPT2 uses 1e-5")
    C = _field(cfg, "n_embd")
    if cfg.get("n_inner") not in (None, 4 * C):
        raise ValueError(
            f"config.json: field 'n_inner' = {cfg['n_inner']!r} cannot be represented: GPT2 uses 4 * n_embd"
        )
    _require(cfg, "scale_attn_weights", (True,), True, "GPT2 scales attention by 1/sqrt(head dim)")
    _require(cfg, "scale_attn_by_inverse_layer_idx", (False,), False, "GPT2 does not scale by layer")
    _require(cfg, "add_cross_attention", (False,), False, "GPT2 is decoder-only")
    _require(cfg, "tie_word_embeddings", (True,), True, "GPT2 ties its output head to wte")
    V = _field(cfg, "vocab_size")
    return _build(
        lambda: GPT2Config(
            block_size=_field(cfg, "n_positions"),
            vocab_size=V,
            padded_vocab_size=padded_vocab_size or V,
            n_layer=_field(cfg, "n_layer"),
            n_head=_field(cfg, "n_head"),
            n_embd=C,
        ),
        "the GPT-2 config",
    )


def _gpt2_load(model, tensors, where):
    c = model.config
    C, V = c.n_embd, c.vocab_size
    prefix = "transformer." if any(n.startswith("transformer.") for n in tensors) else ""
    t = _Tensors(tensors, where)
    wte = t.take(prefix + "wte.weight", (V, C))
    padded = np.zeros((c.padded_vocab_size, C), dtype=wte.dtype)
    padded[:V] = wte
    _set(model.wte.weight, padded)
    _set(model.wpe.weight, t.take(prefix + "wpe.weight", (c.block_size, C)))
    for i, b in enumerate(model.h):
        p = f"{prefix}h.{i}."
        for ln, mod in (("ln_1", b.ln_1), ("ln_2", b.ln_2)):
            _set(mod.weight, t.take(p + ln + ".weight", (C,)))
            _set(mod.bias, t.take(p + ln + ".bias", (C,)))
        # Conv1D stores [in, out]: our Linear holds [out, in].
        for name, mod, n_out in (
            ("attn.c_attn", b.attn.c_attn, 3 * C),
            ("attn.c_proj", b.attn.c_proj, C),
            ("mlp.c_fc", b.mlp.c_fc, 4 * C),
            ("mlp.c_proj", b.mlp.c_proj, C),
        ):
            n_in = mod.weight.shape[1]
            _set(mod.weight, t.take(p + name + ".weight", (n_in, n_out)).T)
            _set(mod.bias, t.take(p + name + ".bias", (n_out,)))
    _set(model.ln_f.weight, t.take(prefix + "ln_f.weight", (C,)))
    _set(model.ln_f.bias, t.take(prefix + "ln_f.bias", (C,)))
    if "lm_head.weight" in t.t and not np.array_equal(t.take("lm_head.weight", (V, C)), wte):
        raise ValueError(f"{where}: lm_head.weight differs from wte.weight; GPT2 ties them")
    t.finish(_GPT2_BUFFERS)


def _gpt2_save(model):
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
        "transformer.wte.weight": _host(model.wte.weight)[: c.vocab_size],
        "transformer.wpe.weight": _host(model.wpe.weight),
    }
    for i, b in enumerate(model.h):
        p = f"transformer.h.{i}."
        for ln, mod in (("ln_1", b.ln_1), ("ln_2", b.ln_2)):
            out[p + ln + ".weight"], out[p + ln + ".bias"] = _host(mod.weight), _host(mod.bias)
        for name, mod in (
            ("attn.c_attn", b.attn.c_attn),
            ("attn.c_proj", b.attn.c_proj),
            ("mlp.c_fc", b.mlp.c_fc),
            ("mlp.c_proj", b.mlp.c_proj),
        ):
            out[p + name + ".weight"] = np.ascontiguousarray(_host(mod.weight).T)
            out[p + name + ".bias"] = _host(mod.bias)
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = _host(model.ln_f.weight), _host(model.ln_f.bias)
    return cfg, out


# ---- LLaMA family: shared checks ----------------------------------------------------------------------------


def _llama_family_checks(cfg, name):
    _require(cfg, "hidden_act", ("silu",), "silu", f"{name} uses SwiGLU (silu)")
    _require(cfg, "attention_bias", (False,), False, f"{name} has no attention biases")
    _require(cfg, "mlp_bias", (False,), False, f"{name} has no MLP biases")
    hidden, heads = _field(cfg, "hidden_size"), _field(cfg, "num_attention_heads")
    kv = _field(cfg, "num_key_value_heads", heads)
    return hidden, heads, kv


_LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _llama_config(cfg):
    hidden, heads, kv = _llama_family_checks(cfg, "LLaMA3")
    if hidden % heads or _field(cfg, "head_dim", hidden // heads) != hidden // heads:
        raise ValueError(
            f"config.json: field 'head_dim' = {cfg.get('head_dim')!r} cannot be represented: "
            "LLaMA3 uses hidden_size / num_attention_heads"
        )
    _field(cfg, "tie_word_embeddings", False, bool)  # checked here; tie_llama_head ties the built model
    scaling = cfg.get("rope_scaling")
    scaled = False
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind == "llama3" and all(scaling.get(k) == v for k, v in _LLAMA3_SCALING.items()):
            scaled = True
        elif kind != "default":
            raise ValueError(
                f"config.json: field 'rope_scaling' = {scaling!r} cannot be represented: LLaMA3 supports none or "
                f"rope_type 'llama3' with {_LLAMA3_SCALING}"
            )
    inter = _field(cfg, "intermediate_size")
    # LLaMA3Config derives the MLP width from (ffn_dim_multiplier, multiple_of); this pair yields exactly `inter`.
    base = int(2 * (4 * hidden) / 3)
    mult = 1.0 if base <= inter else inter / base
    return _build(
        lambda: LLaMA3Config(
            block_size=_field(cfg, "max_position_embeddings"),
            vocab_size=_field(cfg, "vocab_size"),
            n_layer=_field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            ffn_dim_multiplier=mult,
            multiple_of=inter,
            norm_eps=_field(cfg, "rms_norm_eps", 1e-6, float),
            rope_theta=_field(cfg, "rope_theta", 10000.0, float),
            use_scaled_rope=scaled,
        ),
        "the LLaMA config",
    )


def llama_tied(model):
    """Whether a LLaMA3's output head is its embedding (one shared parameter, as LLaMA 3.2 1B and 3B)."""
    return model.lm_head.weight is model.wte.weight


def tie_llama_head(model):
    """Makes the output head share the embedding's parameter (tie_word_embeddings: the same tensor, trained as
    one, counted once); returns the model."""
    model.lm_head.weight = model.wte.weight
    return model


def tie_as_config(model, cfg):
    """A model built from config.json `cfg`, tied as it says (LLaMA3Config has no field for it)."""
    if isinstance(model, LLaMA3) and _field(cfg, "tie_word_embeddings", False, bool):
        tie_llama_head(model)
    return model


def _llama_pairs(model):
    """(HF name, parameter) for LLaMA3 but q/k/v (handled separately); no lm_head when it is tied."""
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
    if not llama_tied(model):
        pairs += [("lm_head.weight", model.lm_head.weight)]
    return pairs


def _llama_load(model, tensors, where):
    c = model.config
    hd, C = c.head_dim, c.n_embd
    t = _Tensors(tensors, where)
    for name, p in _llama_pairs(model):
        _set(p, t.take(name, p.shape))
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}.self_attn."
        q = rotary_from_hf(t.take(p + "q_proj.weight", (c.n_head * hd, C)), c.n_head)
        k = rotary_from_hf(t.take(p + "k_proj.weight", (c.n_kv_head * hd, C)), c.n_kv_head)
        v = t.take(p + "v_proj.weight", (c.n_kv_head * hd, C))
        _set(b.attn.c_attn.weight, np.concatenate([q, k, v]))
    # A tied checkpoint may still hold the head (some exporters write it): it must be the embedding.
    if llama_tied(model) and "lm_head.weight" in t.t:
        if not np.array_equal(t.take("lm_head.weight", model.wte.weight.shape), _host(model.wte.weight)):
            raise ValueError(f"{where}: lm_head.weight differs from the tied model.embed_tokens.weight")
    t.finish(re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"))


def _llama_save(model):
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
        "rope_scaling": dict(_LLAMA3_SCALING, rope_type="llama3") if c.use_scaled_rope else None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        # Tied: no lm_head.weight in the files (Hugging Face's layout; its loader ties the head to embed_tokens).
        "tie_word_embeddings": llama_tied(model),
        "use_cache": True,
    }
    out = {name: _host(p) for name, p in _llama_pairs(model)}
    hd = c.head_dim
    for i, b in enumerate(model.h):
        p = f"model.layers.{i}.self_attn."
        q, k, v = np.split(_host(b.attn.c_attn.weight), [c.n_head * hd, (c.n_head + c.n_kv_head) * hd])
        out[p + "q_proj.weight"] = rotary_to_hf(q, c.n_head)
        out[p + "k_proj.weight"] = rotary_to_hf(k, c.n_kv_head)
        out[p + "v_proj.weight"] = v
    return cfg, out


# ---- Qwen3 / Qwen3-MoE / Mixtral (models/decoder.py) --------------------------------------------------------


def _qwen3_config(cfg):
    hidden, heads, kv = _llama_family_checks(cfg, "Qwen3")
    _require(cfg, "rope_scaling", (None,), None, "Qwen3 uses plain rotary frequencies")
    _require(cfg, "use_sliding_window", (False,), False, "Qwen3 attends over the whole causal context")
    moe = cfg.get("model_type") == "qwen3_moe"
    kw = {}
    if moe:
        layers = cfg.get("mlp_only_layers") or []
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(f"config.json: field 'mlp_only_layers' must be a list of layer numbers, got {layers!r}")
        kw = dict(
            num_experts=_field(cfg, "num_experts"),
            num_experts_per_tok=_field(cfg, "num_experts_per_tok"),
            moe_intermediate_size=_field(cfg, "moe_intermediate_size"),
            norm_topk_prob=_field(cfg, "norm_topk_prob", False, bool),
            decoder_sparse_step=_field(cfg, "decoder_sparse_step", 1),
            mlp_only_layers=tuple(layers),
            router_aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.001)),
        )
    return _build(
        lambda: Qwen3Config(
            block_size=_field(cfg, "max_position_embeddings"),
            vocab_size=_field(cfg, "vocab_size"),
            n_layer=_field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            head_dim=_field(cfg, "head_dim", 128),
            intermediate_size=_field(cfg, "intermediate_size"),
            norm_eps=_field(cfg, "rms_norm_eps", 1e-6, float),
            rope_theta=_field(cfg, "rope_theta", 10000.0, float),
            tie_word_embeddings=_field(cfg, "tie_word_embeddings", True, bool),
            **kw,
        ),
        "the Qwen3 config",
    )


def _mixtral_config(cfg):
    hidden, heads, kv = _llama_family_checks(cfg, "Mixtral")
    _require(cfg, "rope_scaling", (None,), None, "Mixtral uses plain rotary frequencies")
    _require(cfg, "tie_word_embeddings", (False,), False, "Mixtral has an untied lm_head")
    block = _field(cfg, "max_position_embeddings")
    window = cfg.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < block):
        raise ValueError(
            f"config.json: field 'sliding_window' = {window!r} cannot be represented: Mixtral here attends over the "
            f"whole causal context (null, or at least max_position_embeddings = {block})"
        )
    jitter = cfg.get("router_jitter_noise", 0.0) or 0.0
    if jitter != 0:
        raise ValueError(
            f"config.json: field 'router_jitter_noise' = {jitter!r} cannot be represented: no router noise"
        )
    return _build(
        lambda: MixtralConfig(
            block_size=block,
            vocab_size=_field(cfg, "vocab_size"),
            n_layer=_field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            head_dim=_field(cfg, "head_dim", 0 if hidden % heads else hidden // heads),
            intermediate_size=_field(cfg, "intermediate_size"),
            num_experts=_field(cfg, "num_local_experts"),
            num_experts_per_tok=_field(cfg, "num_experts_per_tok"),
            norm_eps=_field(cfg, "rms_norm_eps", 1e-5, float),
            rope_theta=_field(cfg, "rope_theta", 1e6, float),
            router_aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.02)),
        ),
        "the Mixtral config",
    )


_MIXTRAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def _decoder_hf_name(model, name):
    """Our parameter name -> Hugging Face's."""
    if name.startswith("lm_head."):
        return name
    if isinstance(model, Mixtral):
        name = name.replace(".mlp.", ".block_sparse_moe.")
        name = re.sub(r"(experts\.\d+\.)(gate_proj|down_proj|up_proj)", lambda m: m[1] + _MIXTRAL_EXPERT[m[2]], name)
    return "model." + name


def _decoder_rotary_heads(model, name):
    """How many rotary heads a parameter's rows hold (0: none)."""
    c = model.config
    if name.endswith("self_attn.q_proj.weight"):
        return c.n_head
    if name.endswith("self_attn.k_proj.weight"):
        return c.n_kv_head
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        return 1
    return 0


def _decoder_load(model, tensors, where):
    t = _Tensors(tensors, where)
    for name, p in model.named_parameters():
        arr = t.take(_decoder_hf_name(model, name), p.shape)
        heads = _decoder_rotary_heads(model, name)
        _set(p, rotary_from_hf(arr, heads) if heads else arr)
    if model.config.tie_word_embeddings and "lm_head.weight" in t.t:
        if not np.array_equal(
            t.take("lm_head.weight", model.embed_tokens.weight.shape), _host(model.embed_tokens.weight)
        ):
            raise ValueError(f"{where}: lm_head.weight differs from the tied embed_tokens.weight")
    t.finish(re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"))


def _decoder_save(model):
    c = model.config
    cfg = {
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
    if isinstance(model, Mixtral):
        cfg.update(
            architectures=["MixtralForCausalLM"],
            model_type="mixtral",
            num_local_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            router_aux_loss_coef=c.router_aux_loss_coef,
            router_jitter_noise=0.0,
            output_router_logits=False,
            sliding_window=None,
        )
    elif c.num_experts:
        cfg.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
            norm_topk_prob=c.norm_topk_prob,
            decoder_sparse_step=c.decoder_sparse_step,
            mlp_only_layers=list(c.mlp_only_layers),
            router_aux_loss_coef=c.router_aux_loss_coef,
            output_router_logits=False,
            use_sliding_window=False,
            sliding_window=None,
        )
    else:
        cfg.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False, sliding_window=None
        )
    out = {}
    for name, p in model.named_parameters():
        heads = _decoder_rotary_heads(model, name)
        arr = _host(p)
        out[_decoder_hf_name(model, name)] = rotary_to_hf(arr, heads) if heads else arr
    return cfg, out


# ---- entry points -------------------------------------------------------------------------------------------

# model_type -> (class, config from config.json, load tensors)
_KINDS = {
    "gpt2": (GPT2, _gpt2_config, _gpt2_load),
    "llama": (LLaMA3, _llama_config, _llama_load),
    "qwen3": (Qwen3, _qwen3_config, _decoder_load),
    "qwen3_moe": (Qwen3, _qwen3_config, _decoder_load),
    "mixtral": (Mixtral, _mixtral_config, _decoder_load),
}


def config_from_hf(cfg):
    """(model class, our config) for a config.json dict."""
    kind = cfg.get("model_type")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(f"config.json: field 'model_type' = {kind!r} is not supported (one of {', '.join(_KINDS)})")
    cls, make_config, _ = _KINDS[kind]
    return cls, make_config(cfg)


def from_pretrained(path, device="cpu", cls=None, **config_overrides):
    """A model from a local Hugging Face checkpoint folder; `cls` (optional) must match its model_type.
    config_overrides: GPT-2's padded_vocab_size."""
    path = os.fspath(path)
    cfg = read_config(path)
    kind = cfg.get("model_type")
    if kind in _KINDS and cls is not None and _KINDS[kind][0] is not cls:
        raise ValueError(f"config.json: model_type {kind!r} is not a {cls.__name__} checkpoint")
    if kind == "gpt2":
        model_cls, config = GPT2, _gpt2_config(cfg, config_overrides.pop("padded_vocab_size", None))
    else:
        model_cls, config = config_from_hf(cfg)
    if config_overrides:
        raise TypeError(f"from_pretrained: unexpected arguments {sorted(config_overrides)}")
    tensors = read_tensors(path)
    model = tie_as_config(model_cls(config, device), cfg)
    _KINDS[kind][2](model, tensors, path)
    return model


def save_pretrained(model, path, dtype="float32", max_shard_size="5GB"):
    """Writes `model` as a Hugging Face checkpoint folder (config.json + safetensors, sharded with an index
    above max_shard_size) in `dtype` (float32 or bfloat16; float16, float64 too)."""
    from infinitrain.models.lora import lora_modules

    if lora_modules(model):
        raise ValueError(
            "save_pretrained: the model has LoRA adapters; lora.merge_and_unload(model) first, "
            "or lora.save_adapters(model, path) for the adapters alone"
        )
    if isinstance(model, GPT2):
        cfg, tensors = _gpt2_save(model)
    elif isinstance(model, LLaMA3):
        cfg, tensors = _llama_save(model)
    elif isinstance(model, (Qwen3, Mixtral)):
        cfg, tensors = _decoder_save(model)
    else:
        raise TypeError(f"save_pretrained: no Hugging Face layout for {type(model).__name__}")
    cfg["torch_dtype"] = dtype
    write_checkpoint(os.fspath(path), cfg, tensors, dtype, max_shard_size)
