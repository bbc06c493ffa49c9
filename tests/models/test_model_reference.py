"""GPT-2 and LLaMA 3 against independent float64 NumPy models (tests/numpy_models.py): logits and loss at the
float32 tolerances, and gradients against central differences of the reference loss. Parameters are random at a
scale where every term matters (norm weights away from 1, nonzero biases, attention far from uniform)."""

import numpy as np
import pytest

import infinitrain as it
import numpy_models as ref
from harness import DEVICE, TOL, assert_close, rng
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config

V, VP, MAXT, T, B = 61, 64, 24, 16, 3


def gpt2_case(gen):
    cfg = GPT2Config(block_size=MAXT, vocab_size=V, padded_vocab_size=VP, n_layer=2, n_head=4, n_embd=32)
    params = ref.to_f32(
        ref.gpt2_random_params(gen, vocab_size=V, padded_vocab_size=VP, block_size=MAXT, n_layer=2, n_embd=32)
    )
    model = GPT2(cfg, DEVICE)
    load_gpt2(model, params)
    return model, params, lambda p, idx: ref.gpt2_forward(p, idx, 4, V)


LLAMA = dict(n_head=4, n_kv_head=2, norm_eps=1e-5, rope_theta=1e4, use_scaled_rope=True)


def llama3_case(gen, **overrides):
    c = dict(LLAMA, **overrides)
    # head_dim 16 with theta 1e4: frequencies in all three LLaMA 3.1 scaling bands (kept, blended, divided by 8).
    heads = c["n_head"], c["n_kv_head"]
    cfg = LLaMA3Config(MAXT, V, 2, *heads, 64, ffn_dim_multiplier=1.3, multiple_of=16, **_floats(c))
    hidden = ref.llama3_hidden_dim(64, 1.3, 16)
    assert cfg.hidden_dim == hidden
    params = ref.to_f32(
        ref.llama3_random_params(
            gen, vocab_size=V, n_layer=2, n_head=c["n_head"], n_kv_head=c["n_kv_head"], n_embd=64, hidden_dim=hidden
        )
    )
    model = LLaMA3(cfg, DEVICE)
    load_llama3(model, params)
    return model, params, lambda p, idx: ref.llama3_forward(p, idx, c)


def _floats(c):
    return {k: c[k] for k in ("norm_eps", "rope_theta", "use_scaled_rope")}


def _set(p, a):
    assert tuple(p.shape) == a.shape, (p.shape, a.shape)
    p.copy_(it.from_numpy(a, dtype=p.dtype, device=p.device))


def load_gpt2(m, params):
    _set(m.wte.weight, params["wte"])
    _set(m.wpe.weight, params["wpe"])
    for b, lp in zip(m.h, params["layers"], strict=True):
        pairs = [
            (b.ln_1.weight, "ln1_w"),
            (b.ln_1.bias, "ln1_b"),
            (b.attn.c_attn.weight, "qkv_w"),
            (b.attn.c_attn.bias, "qkv_b"),
            (b.attn.c_proj.weight, "attproj_w"),
            (b.attn.c_proj.bias, "attproj_b"),
            (b.ln_2.weight, "ln2_w"),
            (b.ln_2.bias, "ln2_b"),
            (b.mlp.c_fc.weight, "fc_w"),
            (b.mlp.c_fc.bias, "fc_b"),
            (b.mlp.c_proj.weight, "fcproj_w"),
            (b.mlp.c_proj.bias, "fcproj_b"),
        ]
        for p, key in pairs:
            _set(p, lp[key])
    _set(m.ln_f.weight, params["lnf_w"])
    _set(m.ln_f.bias, params["lnf_b"])


def load_llama3(m, params):
    _set(m.wte.weight, params["wte"])
    for b, lp in zip(m.h, params["layers"], strict=True):
        pairs = [
            (b.ln_1.weight, "ln1_w"),
            (b.attn.c_attn.weight, "qkv_w"),
            (b.attn.c_proj.weight, "attproj_w"),
            (b.ln_2.weight, "ln2_w"),
            (b.mlp.c_fc.weight, "up_w"),
            (b.mlp.c_fc2.weight, "gate_w"),
            (b.mlp.c_proj.weight, "down_w"),
        ]
        for p, key in pairs:
            _set(p, lp[key])
    _set(m.ln_f.weight, params["lnf_w"])
    _set(m.lm_head.weight, params["lm_head"])


def gpt2_leaves(m, params):
    """(model parameter, reference array) pairs for every GPT-2 parameter."""
    out = [(m.wte.weight, params["wte"]), (m.wpe.weight, params["wpe"])]
    for b, lp in zip(m.h, params["layers"], strict=True):
        mods = {"ln1": b.ln_1, "qkv": b.attn.c_attn, "attproj": b.attn.c_proj, "ln2": b.ln_2}
        mods.update(fc=b.mlp.c_fc, fcproj=b.mlp.c_proj)
        for name, mod in mods.items():
            out += [(mod.weight, lp[name + "_w"]), (mod.bias, lp[name + "_b"])]
    return out + [(m.ln_f.weight, params["lnf_w"]), (m.ln_f.bias, params["lnf_b"])]


def llama3_leaves(m, params):
    out = [(m.wte.weight, params["wte"])]
    for b, lp in zip(m.h, params["layers"], strict=True):
        out += [(b.ln_1.weight, lp["ln1_w"]), (b.attn.c_attn.weight, lp["qkv_w"])]
        out += [(b.attn.c_proj.weight, lp["attproj_w"])]
        out += [(b.ln_2.weight, lp["ln2_w"]), (b.mlp.c_fc.weight, lp["up_w"]), (b.mlp.c_fc2.weight, lp["gate_w"])]
        out += [(b.mlp.c_proj.weight, lp["down_w"])]
    return out + [(m.ln_f.weight, params["lnf_w"]), (m.lm_head.weight, params["lm_head"])]


CASES = {"gpt2": (gpt2_case, gpt2_leaves), "llama3": (llama3_case, llama3_leaves)}


def ids(gen, t=T):
    return gen.integers(0, V, size=(B, t + 1))


@pytest.mark.parametrize("t", [T, MAXT, 1])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_logits_and_loss_match_the_numpy_model(kind, t):
    gen = rng()
    model, params, forward = CASES[kind][0](gen)
    data = ids(gen, t)
    x, y = data[:, :-1], data[:, 1:]
    logits, loss = model(it.from_numpy(x, device=DEVICE), it.from_numpy(y, device=DEVICE))
    want = forward(params, x)
    assert want.std() > 0.25  # logits far from uniform: every term shows
    got = logits.numpy().astype(np.float64)
    if kind == "gpt2":  # with targets, GPT-2's logits span the padded vocabulary, the padding at -inf (llm.c)
        assert got.shape[-1] == VP and (got[..., V:] == -np.inf).all()
        got = got[..., :V]
    assert_close(got, want, "float32", what=f"{kind} logits")
    assert_close(model(it.from_numpy(x, device=DEVICE))[0], want, "float32", what=f"{kind} logits without targets")
    assert_close(loss, ref.mean_cross_entropy(want, y), "float32", what=f"{kind} loss")


@pytest.mark.parametrize("n_head,n_kv_head", [(4, 4), (4, 1), (8, 2)])
def test_llama3_head_groupings_match(n_head, n_kv_head):
    gen = rng()
    model, params, forward = llama3_case(gen, n_head=n_head, n_kv_head=n_kv_head, use_scaled_rope=False)
    x = ids(gen)[:, :-1]
    assert_close(model(it.from_numpy(x, device=DEVICE))[0], forward(params, x), "float32", what="llama3 logits")


def test_causality_and_positions():
    """A later token never changes an earlier position's logits; moving a token changes its logits (positions)."""
    gen = rng()
    for case in (gpt2_case, llama3_case):
        model, _, _ = case(gen)
        x = ids(gen)[:, :-1]
        x2 = x.copy()
        x2[:, -1] = (x2[:, -1] + 1) % V
        a, b = (model(it.from_numpy(v, device=DEVICE))[0].numpy() for v in (x, x2))
        np.testing.assert_array_equal(a[:, :-1], b[:, :-1])
        assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3
        if case is gpt2_case:  # (RoPE is relative: one token everywhere gives LLaMA equal rows)
            same = np.full((1, T), x[0, 0])  # one token everywhere: only the position tells the rows apart
            rows = model(it.from_numpy(same, device=DEVICE))[0].numpy()[0]
            assert np.abs(rows[1:] - rows[0]).max(axis=1).min() > 1e-3


@pytest.mark.parametrize("kind", sorted(CASES))
def test_gradients_match_finite_differences(kind):
    """Autograd through the model against central differences of the float64 reference loss: a few entries of
    every parameter, at float32's tolerance."""
    gen = rng()
    case, leaves = CASES[kind]
    model, params, forward = case(gen)
    data = ids(gen)
    x, y = data[:, :-1], data[:, 1:]
    _, loss = model(it.from_numpy(x, device=DEVICE), it.from_numpy(y, device=DEVICE))
    loss.backward()
    h = 1e-5
    for k, (p, arr) in enumerate(leaves(model, params)):
        grad = p.grad.numpy().astype(np.float64)
        rows = arr.shape[0]
        if kind == "gpt2" and k == 0:
            rows = V  # padding rows of the tied embedding get no gradient
            assert not grad[V:].any()
        picks = [tuple(gen.integers(0, n) for n in (rows,) + arr.shape[1:]) for _ in range(3)]
        if arr.ndim == 2 and k == 0:
            picks.append((int(x[0, 0]),) + picks[0][1:])  # an embedding row that is read
        for i in picks:
            old = arr[i]
            arr[i] = old + h
            up = ref.mean_cross_entropy(forward(params, x), y)
            arr[i] = old - h
            down = ref.mean_cross_entropy(forward(params, x), y)
            arr[i] = old
            num = (up - down) / (2 * h)
            rtol, atol = TOL["float32"]
            assert abs(grad[i] - num) <= atol + rtol * abs(num), (kind, k, i, grad[i], num)
