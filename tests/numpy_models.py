"""Independent float64 NumPy references of GPT-2 and LLaMA 3, and writers of llm.c files.

Nothing here imports infinitrain: the models follow the published architectures (GPT-2 as in llm.c's
train_gpt2.py, LLaMA 3.1 as in llm.c's train_llama3.py) and the files follow llm.c's byte layouts, so a
test comparing infinitrain with these checks it against something it did not write.

Parameters are plain dicts of float64 arrays: GPT-2 {"wte" [Vp, C], "wpe" [maxT, C], "layers": [{...}],
"lnf_w", "lnf_b"}, LLaMA 3 {"wte" [V, C], "layers": [...], "lnf_w", "lm_head" [V, C]}.
"""

import math
import struct

import numpy as np

GPT2_MAGIC, LLAMA3_MAGIC = 20240326, 20240803
TOKENS_GPT2_MAGIC, TOKENS_LLAMA3_MAGIC = 20240520, 20240801
TOKENIZER_GPT2_MAGIC, TOKENIZER_LLAMA3_MAGIC = 20240328, 20240801

# llm.c's per-layer tensors, in file order.
GPT2_LAYER_KEYS = ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b")
GPT2_LAYER_KEYS += ("ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b")
LLAMA3_LAYER_KEYS = ("ln1_w", "qkv_w", "attproj_w", "ln2_w", "up_w", "gate_w", "down_w")


# ---- building blocks -------------------------------------------------------------------------------------------


def layernorm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def causal_attention(q, k, v):
    """q [B, H, T, D], k, v [B, H, T, D] (already repeated for grouped heads)."""
    T, D = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    scores = np.where(np.triu(np.ones((T, T), dtype=bool), 1), -np.inf, scores)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(-1, keepdims=True)) @ v


def mean_cross_entropy(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], -1).mean()


# ---- GPT-2 -----------------------------------------------------------------------------------------------------


def gpt2_forward(params, idx, n_head, vocab_size):
    """Logits [B, T, vocab_size] of GPT-2 (pre-LayerNorm blocks, tanh GELU, head tied to wte[:vocab_size])."""
    B, T = idx.shape
    x = params["wte"][idx] + params["wpe"][:T]
    C = x.shape[-1]
    hs = C // n_head
    for lp in params["layers"]:
        h = layernorm(x, lp["ln1_w"], lp["ln1_b"])
        qkv = h @ lp["qkv_w"].T + lp["qkv_b"]
        q, k, v = (qkv[..., i * C : (i + 1) * C].reshape(B, T, n_head, hs).transpose(0, 2, 1, 3) for i in range(3))
        y = causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ lp["attproj_w"].T + lp["attproj_b"]
        h = layernorm(x, lp["ln2_w"], lp["ln2_b"])
        h = gelu_tanh(h @ lp["fc_w"].T + lp["fc_b"])
        x = x + h @ lp["fcproj_w"].T + lp["fcproj_b"]
    x = layernorm(x, params["lnf_w"], params["lnf_b"])
    return x @ params["wte"][:vocab_size].T


def gpt2_random_params(gen, *, vocab_size, padded_vocab_size, block_size, n_layer, n_embd):
    """Random parameters at a scale where every term matters: norm weights away from 1, nonzero biases."""
    C = n_embd

    def lin(o, i):
        return gen.standard_normal((o, i)) / math.sqrt(i)

    def vec(n, center=0.0, spread=0.3):
        return center + spread * gen.standard_normal(n)

    wte = 0.3 * gen.standard_normal((padded_vocab_size, C))
    wte[vocab_size:] = gen.standard_normal((padded_vocab_size - vocab_size, C))  # padding rows: never read
    layers = []
    for _ in range(n_layer):
        layers.append(
            {
                "ln1_w": vec(C, 1.0),
                "ln1_b": vec(C),
                "qkv_w": 2 * lin(3 * C, C),  # larger q, k: attention far from uniform
                "qkv_b": vec(3 * C),
                "attproj_w": lin(C, C),
                "attproj_b": vec(C),
                "ln2_w": vec(C, 1.0),
                "ln2_b": vec(C),
                "fc_w": lin(4 * C, C),
                "fc_b": vec(4 * C),
                "fcproj_w": lin(C, 4 * C),
                "fcproj_b": vec(C),
            }
        )
    return {
        "wte": wte,
        "wpe": 0.5 * gen.standard_normal((block_size, C)),
        "layers": layers,
        # Logits of size ~0.5: float32's rounding through two layers stays within atol (5e-6 relative).
        "lnf_w": vec(C, 0.3, 0.1),
        "lnf_b": vec(C, 0.0, 0.1),
    }


# ---- LLaMA 3 ---------------------------------------------------------------------------------------------------


def llama3_hidden_dim(n_embd, ffn_dim_multiplier, multiple_of):
    hidden = int(2 * (4 * n_embd) / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama31_frequencies(head_dim, theta, use_scaled):
    """RoPE frequencies; LLaMA 3.1 divides long wavelengths by 8 (beyond 8192 / 1) and blends down to 8192 / 4."""
    freqs = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    if use_scaled:
        out = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < 8192 / 4:
                out.append(f)
            elif wavelen > 8192 / 1:
                out.append(f / 8)
            else:
                smooth = (8192 / wavelen - 1) / (4 - 1)
                out.append((1 - smooth) * f / 8 + smooth * f)
        freqs = out
    return np.array(freqs)


def rotate_pairs(x, freqs):
    """x [B, T, H, D]: pairs (x[2i], x[2i+1]) as complex numbers times e^(i t freq_i)."""
    T = x.shape[1]
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * np.outer(np.arange(T), freqs))[None, :, None, :]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def llama3_forward(params, idx, cfg):
    """Logits [B, T, V]. cfg: n_head, n_kv_head, norm_eps, rope_theta, use_scaled_rope."""
    B, T = idx.shape
    x = params["wte"][idx]
    C = x.shape[-1]
    nh, nkv = cfg["n_head"], cfg["n_kv_head"]
    hd = C // nh
    freqs = llama31_frequencies(hd, cfg["rope_theta"], cfg["use_scaled_rope"])
    for lp in params["layers"]:
        h = rmsnorm(x, lp["ln1_w"], cfg["norm_eps"])
        qkv = h @ lp["qkv_w"].T
        q = rotate_pairs(qkv[..., : nh * hd].reshape(B, T, nh, hd), freqs)
        k = rotate_pairs(qkv[..., nh * hd : (nh + nkv) * hd].reshape(B, T, nkv, hd), freqs)
        v = qkv[..., (nh + nkv) * hd :].reshape(B, T, nkv, hd)
        k, v = (np.repeat(t, nh // nkv, axis=2) for t in (k, v))  # query head j reads kv head j // (nh / nkv)
        y = causal_attention(*(t.transpose(0, 2, 1, 3) for t in (q, k, v)))
        x = x + y.transpose(0, 2, 1, 3).reshape(B, T, C) @ lp["attproj_w"].T
        h = rmsnorm(x, lp["ln2_w"], cfg["norm_eps"])
        x = x + (silu(h @ lp["gate_w"].T) * (h @ lp["up_w"].T)) @ lp["down_w"].T
    return rmsnorm(x, params["lnf_w"], cfg["norm_eps"]) @ params["lm_head"].T


def llama3_random_params(gen, *, vocab_size, n_layer, n_head, n_kv_head, n_embd, hidden_dim):
    C, hd = n_embd, n_embd // n_head

    def lin(o, i, gain=1.0):
        return gain * gen.standard_normal((o, i)) / math.sqrt(i)

    layers = []
    for _ in range(n_layer):
        layers.append(
            {
                "ln1_w": 1.0 + 0.3 * gen.standard_normal(C),
                "qkv_w": lin((n_head + 2 * n_kv_head) * hd, C, 2.0),
                "attproj_w": lin(C, C),
                "ln2_w": 1.0 + 0.3 * gen.standard_normal(C),
                "up_w": lin(hidden_dim, C),
                "gate_w": lin(hidden_dim, C),
                "down_w": lin(C, hidden_dim),
            }
        )
    return {
        "wte": gen.standard_normal((vocab_size, C)),
        "layers": layers,
        "lnf_w": 1.0 + 0.3 * gen.standard_normal(C),
        "lm_head": lin(vocab_size, C, 0.4),  # logits of size ~0.5, as for GPT-2
    }


# ---- llm.c files -----------------------------------------------------------------------------------------------


def _f32(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def gpt2_llmc_bytes(params, *, block_size, vocab_size, n_layer, n_head, n_embd):
    """An llm.c GPT-2 model file (train_gpt2.py's write_model, version 3: float32): a 256-int32 header
    [magic, version, maxT, V, L, NH, C, Vp], then wte, wpe, each per-layer tensor stacked over layers, lnf_w, lnf_b."""
    padded = params["wte"].shape[0]
    header = np.zeros(256, dtype="<i4")
    header[:8] = [GPT2_MAGIC, 3, block_size, vocab_size, n_layer, n_head, n_embd, padded]
    out = [header.tobytes(), _f32(params["wte"]), _f32(params["wpe"])]
    for key in GPT2_LAYER_KEYS:
        out += [_f32(lp[key]) for lp in params["layers"]]
    out += [_f32(params["lnf_w"]), _f32(params["lnf_b"])]
    return b"".join(out)


def llama3_llmc_bytes(params, cfg, layout):
    """An llm.c LLaMA 3 model file, float32. layout "llmc" (train_llama3.py's write_model): 256 int32 words
    [magic, version, maxT, V, L, NH, NKV, C, multiple_of, use_scaled_rope, major, minor], then 256 float32 words
    [ffn_dim_multiplier, norm_eps, rope_theta]. layout "infinitrain" (InfiniTrain's reader): one 256-word header
    [magic, version, maxT, V, L, NH, NKV, C, ffn_dim_multiplier (f32), multiple_of, norm_eps (f32), rope_theta
    (f32), use_scaled_rope, max_gen_batch_size, major, minor]. Then wte, each per-layer tensor stacked over layers
    (ln_1, c_attn, c_proj, ln_2, c_fc = up, c_fc2 = gate, mlp c_proj), ln_f, lm_head."""
    ints = [LLAMA3_MAGIC, 3, cfg["block_size"], cfg["vocab_size"], cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"]]
    ints.append(cfg["n_embd"])
    if layout == "llmc":
        words = ints + [cfg["multiple_of"], int(cfg["use_scaled_rope"]), 3, 1]
        header = struct.pack("<256i", *(words + [0] * (256 - len(words))))
        floats = [cfg["ffn_dim_multiplier"], cfg["norm_eps"], cfg["rope_theta"]]
        header += struct.pack("<256f", *(floats + [0.0] * 253))
    else:
        parts = [struct.pack("<8i", *ints), struct.pack("<f", cfg["ffn_dim_multiplier"])]
        parts += [struct.pack("<i", cfg["multiple_of"]), struct.pack("<2f", cfg["norm_eps"], cfg["rope_theta"])]
        parts += [struct.pack("<4i", int(cfg["use_scaled_rope"]), cfg.get("max_gen_batch_size", 4), 3, 1)]
        header = b"".join(parts) + bytes(4 * (256 - 16))
    out = [header, _f32(params["wte"])]
    for key in LLAMA3_LAYER_KEYS:
        out += [_f32(lp[key]) for lp in params["layers"]]
    out += [_f32(params["lnf_w"]), _f32(params["lm_head"])]
    return b"".join(out)


def tokens_bytes(tokens, kind="gpt2"):
    """An llm.c token file: 256 int32 [magic, version, count], then uint16 (GPT-2, version 1) or uint32 (LLaMA 3,
    version 7) tokens."""
    magic, version, fmt = (TOKENS_GPT2_MAGIC, 1, "<u2") if kind == "gpt2" else (TOKENS_LLAMA3_MAGIC, 7, "<u4")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [magic, version, len(tokens)]
    return header.tobytes() + np.asarray(tokens, dtype=fmt).tobytes()


def tokenizer_bytes(pieces, eot, magic=TOKENIZER_GPT2_MAGIC):
    """An llm.c tokenizer file (write_tokenizer, version 2): 256 int32 [magic, 2, vocab, eot], then per token a
    uint8 length and its bytes."""
    header = np.zeros(256, dtype="<i4")
    header[:4] = [magic, 2, len(pieces), eot]
    return header.tobytes() + b"".join(bytes([len(p)]) + p for p in pieces)


def to_f32(params):
    """The parameters rounded to float32 (what a float32 model or file holds), still as float64 arrays."""
    if isinstance(params, dict):
        return {k: to_f32(v) for k, v in params.items()}
    if isinstance(params, list):
        return [to_f32(v) for v in params]
    return np.asarray(params, dtype=np.float32).astype(np.float64)
