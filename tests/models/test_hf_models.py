"""GPT-2, LLaMA, Qwen3, Qwen3-MoE and Mixtral from hand-written Hugging Face checkpoints (safetensors +
config.json with HF's parameter names and layouts, random weights and non-default norm weights/biases):
logits against float64 NumPy re-implementations of Hugging Face's math written here (Conv1D, rotate_half
rotary embeddings, QK-norm, softmax top-k routing), gradients against finite differences (float64),
save_pretrained -> from_pretrained round trips (float32, bfloat16, sharded), and clear errors for malformed
files and configs the models cannot represent."""

import json
import math

import numpy as np
import pytest
from safetensors import serialize_file

import infinitrain as it
from harness import DEVICE, assert_close, rng, round_to
from infinitrain.models import GPT2, LLaMA3, Mixtral, Qwen3, from_pretrained, hf
from infinitrain.tensor import materialize

B, T = 2, 7

CONFIGS = {
    "gpt2": dict(
        model_type="gpt2", vocab_size=37, n_positions=12, n_embd=16, n_layer=2, n_head=2,
        activation_function="gelu_new", layer_norm_epsilon=1e-5,
    ),
    "llama": dict(
        model_type="llama", vocab_size=37, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12, rms_norm_eps=1e-5,
        rope_theta=5e5, hidden_act="silu", tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ),
    "qwen3": dict(
        model_type="qwen3", vocab_size=37, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=12, rms_norm_eps=1e-6,
        rope_theta=1e6, hidden_act="silu", tie_word_embeddings=True,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe", vocab_size=37, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=12, rms_norm_eps=1e-6,
        rope_theta=1e6, hidden_act="silu", tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
        router_aux_loss_coef=0.001,
    ),
    "mixtral": dict(
        model_type="mixtral", vocab_size=37, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12, rms_norm_eps=1e-5,
        rope_theta=1e6, hidden_act="silu", num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
        sliding_window=None, tie_word_embeddings=False,
    ),
}  # fmt: skip
# LLaMA 3.2 1B and 3B tie the output head to embed_tokens (their files hold no lm_head.weight).
CONFIGS["llama_tied"] = dict(CONFIGS["llama"], tie_word_embeddings=True)
CLASSES = {"gpt2": GPT2, "llama": LLaMA3, "llama_tied": LLaMA3, "qwen3": Qwen3, "qwen3_moe": Qwen3, "mixtral": Mixtral}


# ---- checkpoints by hand, with Hugging Face's names and layouts ----


def f32(a):
    return a.astype(np.float32).astype(np.float64)  # float32-exact, so float64 models see the same values


def hf_tensors(kind, g):
    c = CONFIGS[kind]
    w = lambda *s: f32(g.standard_normal(s) * 0.2)  # noqa: E731
    norm = lambda n: f32(1.0 + 0.2 * g.standard_normal(n))  # noqa: E731  non-default norm weights
    t = {}
    if kind == "gpt2":
        C, V = c["n_embd"], c["vocab_size"]
        t["wte.weight"], t["wpe.weight"] = w(V, C), w(c["n_positions"], C)
        for i in range(c["n_layer"]):
            p = f"h.{i}."
            for ln in ("ln_1", "ln_2"):
                t[p + ln + ".weight"], t[p + ln + ".bias"] = norm(C), w(C)
            for name, shape in (("attn.c_attn", (C, 3 * C)), ("attn.c_proj", (C, C)), ("mlp.c_fc", (C, 4 * C)),
                                ("mlp.c_proj", (4 * C, C))):  # fmt: skip
                t[p + name + ".weight"], t[p + name + ".bias"] = w(*shape), w(shape[1])
        t["ln_f.weight"], t["ln_f.bias"] = norm(C), w(C)
        return t
    C, V, H, KV = c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", C // H)
    t["model.embed_tokens.weight"] = w(V, C)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = norm(C), norm(C)
        t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"] = w(H * hd, C), w(KV * hd, C)
        t[p + "self_attn.v_proj.weight"], t[p + "self_attn.o_proj.weight"] = w(KV * hd, C), w(C, H * hd)
        if kind.startswith("qwen3"):
            t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = norm(hd), norm(hd)
        if kind == "mixtral":
            E, I = c["num_local_experts"], c["intermediate_size"]
            t[p + "block_sparse_moe.gate.weight"] = w(E, C)
            for e in range(E):
                q = f"{p}block_sparse_moe.experts.{e}."
                t[q + "w1.weight"], t[q + "w3.weight"], t[q + "w2.weight"] = w(I, C), w(I, C), w(C, I)
        elif kind == "qwen3_moe" and i not in c["mlp_only_layers"]:
            E, I = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = w(E, C)
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                t[q + "gate_proj.weight"], t[q + "up_proj.weight"], t[q + "down_proj.weight"] = (
                    w(I, C), w(I, C), w(C, I),
                )  # fmt: skip
        else:
            I = c["intermediate_size"]
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(I, C), w(I, C)
            t[p + "mlp.down_proj.weight"] = w(C, I)
    t["model.norm.weight"] = norm(C)
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = w(V, C)
    return t


def write_hf(path, config, tensors, shards=1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    entries = {
        n: {"dtype": "float32", "shape": list(a.shape), "data": a.astype("<f4").tobytes()} for n, a in tensors.items()
    }
    if shards == 1:
        serialize_file(entries, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(entries)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        serialize_file({n: entries[n] for n in part}, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


# ---- float64 NumPy references of Hugging Face's math ----


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def silu(x):
    return x / (1 + np.exp(-x))


def attention(q, k, v):
    """q [B, H, T, hd], k, v [B, KV, T, hd]: causal, grouped heads (head h reads kv head h // (H / KV))."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.triu(np.ones((q.shape[2], q.shape[2]), bool), 1), -np.inf, s)
    return softmax(s) @ v


def ref_gpt2(c, t, idx):
    C, H = c["n_embd"], c["n_head"]
    x = t["wte.weight"][idx] + t["wpe.weight"][: idx.shape[1]]

    def split(a):
        return a.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)

    for i in range(c["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"], 1e-5)
        qkv = a @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]  # Conv1D: x @ W[in, out]
        q, k, v = (split(z) for z in np.split(qkv, 3, axis=-1))
        y = attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        m = layer_norm(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"], 1e-5) @ t[p + "mlp.c_fc.weight"]
        m = m + t[p + "mlp.c_fc.bias"]
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))
        x = x + m @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    return layer_norm(x, t["ln_f.weight"], t["ln_f.bias"], 1e-5) @ t["wte.weight"].T, None


def inv_freq(c, hd):
    f = 1.0 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    rs = c.get("rope_scaling")
    if rs:  # Hugging Face's llama3 frequency scaling
        old, lo, hi, factor = (rs[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                               "high_freq_factor", "factor"))  # fmt: skip
        wavelen = 2 * math.pi / f
        scaled = np.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        f = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return f


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def ref_decoder(kind, c, t, idx):
    """Returns (logits, aux loss or None)."""
    C, H, KV, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    hd = c.get("head_dim", C // H)
    ang = np.arange(idx.shape[1])[:, None] * inv_freq(c, hd)[None, :]
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    x = t["model.embed_tokens.weight"][idx]
    router_probs, router_top = [], []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        q = (a @ t[p + "self_attn.q_proj.weight"].T).reshape(B, T, H, hd)
        k = (a @ t[p + "self_attn.k_proj.weight"].T).reshape(B, T, KV, hd)
        v = (a @ t[p + "self_attn.v_proj.weight"].T).reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
        if kind.startswith("qwen3"):
            q, k = (
                rms_norm(q, t[p + "self_attn.q_norm.weight"], eps),
                rms_norm(k, t[p + "self_attn.k_norm.weight"], eps),
            )
        q, k = (z.transpose(0, 2, 1, 3) for z in (q, k))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, T, H * hd)
        x = x + y @ t[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps).reshape(B * T, C)
        if kind == "mixtral" or (kind == "qwen3_moe" and i not in c["mlp_only_layers"]):
            moe = "block_sparse_moe" if kind == "mixtral" else "mlp"
            names = ("w1", "w3", "w2") if kind == "mixtral" else ("gate_proj", "up_proj", "down_proj")
            k_ = c["num_experts_per_tok"]
            probs = softmax(m @ t[f"{p}{moe}.gate.weight"].T)
            top = np.argsort(-probs, -1, kind="stable")[:, :k_]
            wts = np.take_along_axis(probs, top, -1)
            if kind == "mixtral" or c["norm_topk_prob"]:
                wts = wts / wts.sum(-1, keepdims=True)
            out = np.zeros_like(m)
            for n in range(m.shape[0]):
                for j in range(k_):
                    e = f"{p}{moe}.experts.{top[n, j]}."
                    h = silu(m[n] @ t[e + names[0] + ".weight"].T) * (m[n] @ t[e + names[1] + ".weight"].T)
                    out[n] += wts[n, j] * (h @ t[e + names[2] + ".weight"].T)
            router_probs.append(probs)
            router_top.append(top)
        else:
            h = silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)
            out = h @ t[p + "mlp.down_proj.weight"].T
        x = x + out.reshape(B, T, C)
    head = t["model.embed_tokens.weight"] if c["tie_word_embeddings"] else t["lm_head.weight"]
    logits = rms_norm(x, t["model.norm.weight"], eps) @ head.T
    aux = None
    if router_probs:  # Hugging Face's load_balancing_loss_func over every layer's tokens together
        probs, top = np.concatenate(router_probs), np.concatenate(router_top)
        E = probs.shape[1]
        tokens_per_expert = np.eye(E)[top].mean(0)  # [k, E]
        aux = (tokens_per_expert * probs.mean(0)[None]).sum() * E
    return logits, aux


def reference(kind, t, idx):
    c = CONFIGS[kind]
    return ref_gpt2(c, t, idx) if kind == "gpt2" else ref_decoder(kind, c, t, idx)


def ids(g, kind):
    return g.integers(0, CONFIGS[kind]["vocab_size"], (B, T))


KINDS = list(CONFIGS)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_numpy_reference(kind, dtype, tmp_path):
    g = rng()
    t = hf_tensors(kind, g)
    write_hf(tmp_path, CONFIGS[kind], t, shards=2 if kind in ("llama", "mixtral") else 1)
    model = CLASSES[kind].from_pretrained(tmp_path, DEVICE)
    if dtype == "float64":
        model.to("float64")
    idx = ids(g, kind)
    logits, _ = model(it.from_numpy(idx, device=DEVICE))
    want, aux = reference(kind, t, idx)
    assert_close(logits, want, dtype, what=f"{kind} logits")
    if aux is not None:
        assert_close(model.aux_loss, aux, dtype, what="load-balancing loss")


# (parameter name in our model, index) pairs checked by finite differences.
FD_PARAMS = {
    "gpt2": ["h.0.attn.c_attn.weight", "h.1.ln_2.bias", "wpe.weight"],
    "llama": ["h.0.attn.c_attn.weight", "h.1.mlp.c_fc2.weight", "ln_f.weight"],
    "llama_tied": ["wte.weight", "h.1.attn.c_proj.weight"],  # the tied weight: embedding and head together
    "qwen3": ["layers.0.self_attn.q_norm.weight", "layers.1.self_attn.k_proj.weight", "embed_tokens.weight"],
    "qwen3_moe": ["layers.0.mlp.gate.weight", "layers.0.mlp.experts.1.down_proj.weight", "lm_head.weight"],
    "mixtral": ["layers.1.mlp.gate.weight", "layers.0.mlp.experts.2.gate_proj.weight", "norm.weight"],
}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_finite_differences(kind, tmp_path):
    g = rng()
    write_hf(tmp_path, CONFIGS[kind], hf_tensors(kind, g))
    model = CLASSES[kind].from_pretrained(tmp_path, DEVICE).to("float64")
    idx, tgt = (it.from_numpy(ids(g, kind), device=DEVICE) for _ in range(2))
    _, loss = model(idx, tgt)
    loss.backward()
    params = dict(model.named_parameters())
    h = 1e-6
    for name in FD_PARAMS[kind]:
        p = params[name]
        base = p.numpy()
        for flat in g.choice(base.size, 3, replace=False):
            pos = np.unravel_index(flat, base.shape)
            vals = []
            for s in (h, -h):
                arr = base.copy()
                arr[pos] += s
                p.copy_(it.from_numpy(arr, device=DEVICE))
                vals.append(model(idx, tgt)[1].item())
            p.copy_(it.from_numpy(base, device=DEVICE))
            num = (vals[0] - vals[1]) / (2 * h)
            # An expert the random tokens never reach gets no gradient (None), as in PyTorch: its gradient is 0.
            got = p.grad.numpy()[pos] if p.grad is not None else 0.0
            assert abs(got - num) <= 1e-6 * abs(num) + 1e-8, (name, pos, got, num)


@pytest.mark.parametrize("kind", KINDS)
def test_save_pretrained_round_trips(kind, tmp_path):
    g = rng()
    write_hf(tmp_path / "in", CONFIGS[kind], hf_tensors(kind, g))
    model = CLASSES[kind].from_pretrained(tmp_path / "in", DEVICE)
    idx = it.from_numpy(ids(g, kind), device=DEVICE)
    logits = model(idx)[0].numpy()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    model.save_pretrained(tmp_path / "fp32")
    again = CLASSES[kind].from_pretrained(tmp_path / "fp32", DEVICE)
    for k, v in again.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), state[k], err_msg=k)
    np.testing.assert_array_equal(again(idx)[0].numpy(), logits)
    # The files hold Hugging Face's names and layouts: the hand-written tensors come back.
    saved = hf.read_tensors(tmp_path / "fp32")
    src = hf.read_tensors(tmp_path / "in")
    if kind == "gpt2":
        src = {"transformer." + k: v for k, v in src.items()}
    assert set(saved) == set(src)
    for k in src:
        np.testing.assert_array_equal(saved[k], src[k], err_msg=k)
    # bfloat16, sharded with an index: the weights come back rounded to bfloat16, and round-trip exactly after.
    model.save_pretrained(tmp_path / "bf16", dtype="bfloat16", max_shard_size=3000)
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    bf = CLASSES[kind].from_pretrained(tmp_path / "bf16", DEVICE)
    for k, v in bf.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), round_to(state[k], "bfloat16"), err_msg=k)
    bf.save_pretrained(tmp_path / "bf16", dtype="bfloat16")  # one file now: the stale shards are removed
    assert sorted(p.name for p in (tmp_path / "bf16").iterdir()) == ["config.json", "model.safetensors"]
    bf2 = CLASSES[kind].from_pretrained(tmp_path / "bf16", DEVICE)
    np.testing.assert_array_equal(bf2(idx)[0].numpy(), bf(idx)[0].numpy())


@pytest.mark.parametrize("kind", ["gpt2", "llama", "llama_tied"])
def test_hf_checkpoints_convert_to_llmc_files(kind, tmp_path):
    g = rng()
    cfg = dict(CONFIGS[kind])
    if "rms_norm_eps" in cfg:
        # llm.c headers hold float32 and the norm kernels add eps in float64: only a float32 eps survives exactly.
        cfg["rms_norm_eps"] = float(np.float32(cfg["rms_norm_eps"]))
    write_hf(tmp_path / "hf", cfg, hf_tensors(kind, g))
    model = CLASSES[kind].from_pretrained(tmp_path / "hf", DEVICE)
    model.save_llmc(tmp_path / "m.bin")
    back = CLASSES[kind].from_llmc(tmp_path / "m.bin", DEVICE)
    if kind != "gpt2":
        assert back.config.norm_eps == model.config.norm_eps
    idx = it.from_numpy(ids(g, kind), device=DEVICE)
    np.testing.assert_array_equal(back(idx)[0].numpy(), model(idx)[0].numpy())
    if kind == "llama":  # intermediate_size 40 survives the llm.c header's (ffn_dim_multiplier, multiple_of)
        assert back.config.hidden_dim == 40


def test_tied_llama_shares_its_head(tmp_path):
    """tie_word_embeddings: the head is the embedding's parameter (trained as one, counted once); a file that
    still holds lm_head.weight must hold the embedding there; save_pretrained writes HF's tied layout; a fresh
    model from the tied config.json (--config_json) is tied too."""
    from infinitrain.models import registry

    g = rng()
    c = CONFIGS["llama_tied"]
    t = hf_tensors("llama_tied", g)
    assert "lm_head.weight" not in t
    write_hf(tmp_path / "in", c, t)
    model = LLaMA3.from_pretrained(tmp_path / "in", DEVICE)
    assert model.lm_head.weight is model.wte.weight
    untied = LLaMA3.from_pretrained(write_untied(tmp_path / "untied", t), DEVICE)
    V, C = c["vocab_size"], c["hidden_size"]
    assert model.num_parameters() == untied.num_parameters() - V * C
    # One optimizer step moves head and embedding together.
    idx, tgt = (it.from_numpy(ids(g, "llama_tied"), device=DEVICE) for _ in range(2))
    opt = it.optim.AdamW(list(model.parameters()), lr=0.1)
    model(idx, tgt)[1].backward()
    opt.step()
    np.testing.assert_array_equal(model.lm_head.weight.numpy(), model.wte.weight.numpy())
    assert not np.array_equal(model.wte.weight.numpy(), t["model.embed_tokens.weight"].astype(np.float32))
    model.save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["tie_word_embeddings"] is True and "lm_head.weight" not in hf.read_tensors(tmp_path / "out")
    again = LLaMA3.from_pretrained(tmp_path / "out", DEVICE)
    assert again.lm_head.weight is again.wte.weight
    np.testing.assert_array_equal(again(idx)[0].numpy(), model(idx)[0].numpy())
    untied.save_pretrained(tmp_path / "untied2")  # an untied model stays untied
    assert json.loads((tmp_path / "untied2" / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in hf.read_tensors(tmp_path / "untied2")
    # A head that is the embedding is accepted; any other is not.
    write_hf(tmp_path / "with_head", c, dict(t, **{"lm_head.weight": t["model.embed_tokens.weight"]}))
    with_head = LLaMA3.from_pretrained(tmp_path / "with_head", DEVICE)
    assert with_head.lm_head.weight is with_head.wte.weight
    write_hf(tmp_path / "bad_head", c, dict(t, **{"lm_head.weight": t["model.embed_tokens.weight"] + 1.0}))
    with pytest.raises(ValueError, match="lm_head.weight differs from the tied model.embed_tokens.weight"):
        LLaMA3.from_pretrained(tmp_path / "bad_head")
    lazy = LLaMA3.from_pretrained(tmp_path / "bad_head", "meta")  # read, and so checked, where it is materialised
    with pytest.raises(ValueError, match="lm_head.weight differs from the tied model.embed_tokens.weight"):
        materialize(lazy.wte.weight, DEVICE)
    fresh = registry.build_model("llama3", V, T, config_json=str(tmp_path / "in" / "config.json"), device=DEVICE)
    assert fresh.lm_head.weight is fresh.wte.weight


def write_untied(path, t):
    """The same weights as an untied LLaMA checkpoint (its head a copy of the embedding)."""
    write_hf(path, CONFIGS["llama"], dict(t, **{"lm_head.weight": t["model.embed_tokens.weight"]}))
    return path


def test_rotary_permutation_inverts():
    w = rng().standard_normal((3 * 8, 5))
    np.testing.assert_array_equal(hf.rotary_to_hf(hf.rotary_from_hf(w, 3), 3), w)
    # HF rows (i, i + hd/2) of a head become our rows (2i, 2i + 1).
    ours = hf.rotary_from_hf(np.arange(8.0)[:, None], 1)[:, 0]
    np.testing.assert_array_equal(ours, [0, 4, 1, 5, 2, 6, 3, 7])


def test_bad_files_and_configs_raise_clear_errors(tmp_path):
    g = rng()
    t = hf_tensors("llama", g)
    good = CONFIGS["llama"]

    def attempt(config=good, tensors=t, name="x"):
        path = tmp_path / name
        write_hf(path, config, tensors)
        return LLaMA3.from_pretrained(path)

    for field, value in [
        ("hidden_act", "gelu"),
        ("attention_bias", True),
        ("tie_word_embeddings", "yes"),
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
        ("num_attention_heads", 0),
    ]:
        with pytest.raises(ValueError, match=f"'{field}'"):
            attempt(dict(good, **{field: value}), name=field)
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        attempt({k: v for k, v in good.items() if k != "hidden_size"}, name="nohidden")
    with pytest.raises(ValueError, match="missing tensor 'model.norm.weight'"):
        attempt(tensors={k: v for k, v in t.items() if k != "model.norm.weight"}, name="missing")
    with pytest.raises(ValueError, match="'lm_head.weight' has shape"):
        attempt(tensors=dict(t, **{"lm_head.weight": t["lm_head.weight"][:5]}), name="shape")
    with pytest.raises(ValueError, match="unexpected tensors"):
        attempt(tensors=dict(t, extra=t["model.norm.weight"]), name="extra")
    with pytest.raises(ValueError, match="model_type 'llama' is not a Qwen3"):
        write_hf(tmp_path / "q", good, t)
        Qwen3.from_pretrained(tmp_path / "q")
    with pytest.raises(ValueError, match="'sliding_window'"):
        write_hf(tmp_path / "m", dict(CONFIGS["mixtral"], sliding_window=4), hf_tensors("mixtral", g))
        Mixtral.from_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="'model_type' = 'bert'"):
        write_hf(tmp_path / "b", dict(good, model_type="bert"), t)
        from_pretrained(tmp_path / "b")
    bad = tmp_path / "garbage"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(good))
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file"):
        LLaMA3.from_pretrained(bad)
    (bad / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        LLaMA3.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps(good))
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    with pytest.raises(ValueError, match="shard model-1.safetensors is missing"):
        LLaMA3.from_pretrained(bad)
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLaMA3.from_pretrained(tmp_path / "nowhere")
