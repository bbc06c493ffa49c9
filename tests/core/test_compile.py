"""it.compile: a model written the plain PyTorch way, compiled, computes what it computes eagerly (losses and every
gradient), while its transposes into attention, residual adds with their next norm, and the norms' 16-bit outputs
for linear layers run as the fused ops; the wrapper behaves as torch.compile's."""

import math

import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn as nn
import infinitrain.nn.functional as F
from harness import DEVICE, rng

C, H, KV, T, V = 32, 4, 2, 16, 50


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T_, _ = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T_, H, C // H).transpose(1, 2)
        k = k.view(B, T_, H, C // H).transpose(1, 2)
        v = v.view(B, T_, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C), nn.Dropout(0.0))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(it.arange(idx.size(1), device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return it.cat((-b, a), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
        self.wq = nn.Linear(C, C, bias=False)
        self.wk = nn.Linear(C, KV * C // H, bias=False)
        self.wv = nn.Linear(C, KV * C // H, bias=False)
        self.wo = nn.Linear(C, C, bias=False)
        self.w1, self.w3 = nn.Linear(C, 64, bias=False), nn.Linear(C, 64, bias=False)
        self.w2 = nn.Linear(64, C, bias=False)

    def forward(self, x, cos, sin):
        B, T_, _ = x.shape
        h = self.n1(x)
        q = self.wq(h).view(B, T_, H, C // H).transpose(1, 2)
        k = self.wk(h).view(B, T_, KV, C // H).transpose(1, 2)
        v = self.wv(h).view(B, T_, KV, C // H).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T_, C))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaLayer(), LlamaLayer()])
        self.norm = nn.RMSNorm(C, eps=1e-5)
        self.out = nn.Linear(C, V, bias=False)
        d = C // H
        ang = np.outer(np.arange(T), 1.0 / 10000 ** (np.arange(0, d, 2) / d))
        ang = np.concatenate([ang, ang], -1)
        self.register_buffer("cos", it.tensor(np.cos(ang), dtype="float32"))
        self.register_buffer("sin", it.tensor(np.sin(ang), dtype="float32"))

    def forward(self, idx, targets):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return F.cross_entropy(self.out(self.norm(x)).view(-1, V), targets.view(-1))


def _data():
    g = rng()
    return (it.tensor(g.integers(0, V, (3, T)), device=DEVICE), it.tensor(g.integers(0, V, (3, T)), device=DEVICE))


def _run(model, x, y, dtype, steps=3):
    """Losses and final gradients of a few SGD steps (autocast in dtype unless float32)."""
    opt = it.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with it.autocast(device_type=it.device(DEVICE).type, dtype=dtype, enabled=dtype != "float32"):
            loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad.numpy() for p in model.parameters()]
        opt.step()
    return losses, grads


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", [GPT, Llama], ids=["gpt", "llama"])
def test_compiled_equals_eager(family, dtype):
    x, y = _data()
    it.manual_seed(0)
    eager = family().to(DEVICE)
    it.manual_seed(0)
    compiled = it.compile(family().to(DEVICE))
    le, ge = _run(eager, x, y, dtype)
    lc, gc = _run(compiled, x, y, dtype)
    if dtype == "float32" and family is GPT:
        # The fused norm and attention do the plain ops' arithmetic: the same bits.
        assert le == lc
        for a, b in zip(ge, gc, strict=True):
            np.testing.assert_array_equal(a, b)
    elif dtype == "float32":
        # swiglu's backward kernel takes silu's derivative in one expression, autograd of silu * up in two ops: the
        # last bits of the gradients may differ (float32's tolerance, scaled to each gradient).
        np.testing.assert_allclose(lc, le, rtol=1e-6)
        for a, b in zip(ge, gc, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * np.abs(a).max())
    else:
        # bfloat16: the fused norm writes its 16-bit output from float32 directly (one rounding, as the cast);
        # attention in the projections' layout may pick another kernel on a GPU: bf16's tolerance.
        np.testing.assert_allclose(lc, le, rtol=2e-2)
        for a, b in zip(ge, gc, strict=True):
            np.testing.assert_allclose(b, a, rtol=1.6e-2, atol=2e-2 * np.abs(a).max())


def test_fused_residual_norm_with_float64_weights_over_a_float32_stream():
    """Compiled x + y into layer_norm / rms_norm with float64 weights over float32 inputs gives the float32 norm of
    the sum (float64 NumPy reference)."""
    g = rng()
    a, b, w, bias = (g.standard_normal(s) for s in ((2, 3, C), (2, 3, C), (C,), (C,)))
    ta, tb = (it.tensor(v, dtype="float32", device=DEVICE) for v in (a, b))
    tw, tbias = (it.tensor(v, dtype="float64", device=DEVICE) for v in (w, bias))
    s = a.astype(np.float32).astype(np.float64) + b.astype(np.float32)
    z = s - s.mean(-1, keepdims=True)
    want_ln = z / np.sqrt((z * z).mean(-1, keepdims=True) + 1e-5) * w + bias
    want_rms = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * w
    ln = it.compile(lambda x, y: F.layer_norm(x + y, (C,), tw, tbias, eps=1e-5))(ta, tb)
    rms = it.compile(lambda x, y: F.rms_norm(x + y, (C,), tw, eps=1e-6))(ta, tb)
    for out, want in ((ln, want_ln), (rms, want_rms)):
        assert out.dtype == "float32"
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def _ops(fn):
    with it.profiler.profile() as prof:
        fn()
    return {r.op for r in prof.records}


def test_compiled_model_runs_the_fused_ops():
    x, y = _data()
    it.manual_seed(0)
    model = GPT().to(DEVICE)
    compiled = it.compile(model)

    def step(m):
        def run():
            with it.autocast(device_type=it.device(DEVICE).type, dtype="bfloat16"):
                loss = m(x, y)
            loss.backward()

        return run

    eager_ops, fused_ops = _ops(step(model)), _ops(step(compiled))
    assert "permute" in eager_ops and "sdpa" in eager_ops
    assert "permute" not in fused_ops, fused_ops  # no transposed copies, forward or backward
    assert {"sdpa_bthd", "sdpa_bthd_backward", "add_layernorm", "add_layernorm_backward"} <= fused_ops, fused_ops
    llama = it.compile(Llama().to(DEVICE))
    llama_ops = _ops(step(llama))
    assert "permute" not in llama_ops and {"sdpa_bthd", "add_rmsnorm", "swiglu"} <= llama_ops, llama_ops
    # The norm feeding q, k and v (and gate and up) runs once, in the 16-bit dtype: no float32 norm, no casts of it.
    counts = {}
    with it.profiler.profile() as prof:
        with it.autocast(device_type=it.device(DEVICE).type, dtype="bfloat16"):
            llama(x, y)
    for r in prof.records:
        counts[r.op] = counts.get(r.op, 0) + 1
    assert counts.get("rmsnorm", 0) == 1 and counts["add_rmsnorm"] == 4, counts  # 1: the first layer's input


def test_optimized_module_behaves_as_torch_compiles():
    m = GPT()
    c = it.compile(m)
    assert c._orig_mod is m and c.ln_f is m.ln_f and len(c.h) == 2
    assert all(k.startswith("_orig_mod.") for k in c.state_dict())
    assert [id(p) for p in c.parameters()] == [id(p) for p in m.parameters()]
    c.eval()
    assert not m.training
    assert it.compile(m, disable=True) is m
    assert isinstance(it.compile(mode="max-autotune", fullgraph=True)(m), type(c))

    @it.compile
    def f(a, b):
        return (a.transpose(0, 1) + b.transpose(0, 1)).transpose(0, 1) * 2

    a, b = rng().standard_normal((3, 4)), rng().standard_normal((3, 4))
    out = f(it.tensor(a), it.tensor(b))
    np.testing.assert_allclose(out.numpy(), (a + b) * 2, rtol=1e-6)
    assert out.shape == (3, 4)


def test_pending_values_read_as_tensors():
    a = it.tensor(rng().standard_normal((2, 3, 4, 5)), device=DEVICE)

    def fn(x):
        p = x.transpose(1, 2)
        assert p.shape == (2, 4, 3, 5) and p.dim() == 4 and p.size(1) == 4 and p.is_floating_point()
        return p, (p * 2).sum(), p.numpy()

    p, s, arr = it.compile(fn)(a)
    np.testing.assert_array_equal(arr, a.numpy().transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(p.numpy(), arr)
    assert math.isclose(s.item(), float(arr.sum() * 2), rel_tol=1e-5)


def test_a_deferred_input_written_in_place_is_an_error():
    x = it.tensor(rng().standard_normal((2, 3)), device=DEVICE)
    y = it.tensor(rng().standard_normal((2, 3)), device=DEVICE)

    def fn(a, b):
        s = a + b  # pending
        a.add_(1.0)  # a plain tensor written in place before s is read
        return s

    with pytest.raises(RuntimeError, match="modified in place"):
        it.compile(fn)(x, y)


def test_backward_inside_a_compiled_function_runs_plain_ops():
    model = GPT().to(DEVICE)
    x, y = _data()

    @it.compile
    def step():
        loss = model(x, y)
        loss.backward()
        return loss

    loss = step()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in model.parameters())


# ---- the project's own models train through the same rules ----


def _ops_and_grads(model, x, fused, dtype):
    from collections import Counter

    from infinitrain.compiler import fusing

    model.zero_grad()
    with it.profiler.profile() as prof:
        with it.amp.autocast(DEVICE, dtype="bfloat16", enabled=dtype == "bfloat16"):
            if fused:
                with fusing():
                    _, loss = model(x, x)
            else:
                _, loss = model(x, x)
        loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return Counter(r.op for r in prof.records), loss.item(), grads


@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen3"])
def test_plain_model_blocks_train_through_the_fusion_rules(family):
    """The models' blocks are plain (x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))); under fusing(), as the Trainer
    runs them, each residual add joins the next norm and GPT-2's MLP is linear_gelu_linear, and in float32 the loss
    and every gradient equal the unfused run's bit for bit. A norm several linears read keeps float32 output."""
    from infinitrain.models import registry

    it.manual_seed(int(rng().integers(1 << 30)))
    spec = registry.resolve(family, shape={"n_layer": 3, "n_head": 2, "n_embd": 32}, sequence_length=T, vocab_size=V)
    model = spec.build(DEVICE)
    x = it.from_numpy(rng().integers(0, V, (2, T)), device=DEVICE)
    plain, loss, grads = _ops_and_grads(model, x, False, "float32")
    fused, loss_f, grads_f = _ops_and_grads(model, x, True, "float32")
    assert loss_f == loss
    for n in grads:
        np.testing.assert_array_equal(grads_f[n], grads[n], err_msg=n)
    norm = "add_layernorm" if family == "gpt2" else "add_rmsnorm"
    # 3 blocks: 2 norms each, the final one; all but the first block's first norm join a residual add.
    assert plain[norm] == 0 and fused[norm] == 6 and fused["add"] <= plain["add"] - 6
    if family == "gpt2":
        # The GELU runs inside linear_gelu_tanh; its one gelu_tanh per block is backward's recompute of the output.
        assert fused["linear_gelu_tanh"] == 3 and fused["gelu_tanh"] == 3 and plain["gelu_tanh"] == 3
    # bf16: a norm read by one linear writes bfloat16 itself (fewer casts); LLaMA's ln_2 and the decoders' norms
    # feed several linears and keep float32 (the casts stay).
    plain16, _, _ = _ops_and_grads(model, x, False, "bfloat16")
    fused16, _, _ = _ops_and_grads(model, x, True, "bfloat16")
    saved = plain16["cast"] - fused16["cast"]
    expected_min = {"gpt2": 6, "llama3": 3, "qwen3": 1}[family]
    assert saved >= expected_min, (plain16["cast"], fused16["cast"])


def test_the_autocast_policy_table_drives_autocast(monkeypatch):
    """amp.POLICY is the one declaration of what autocast does to an op: changing a line changes the op."""
    from infinitrain import _C, amp

    ops = {o["name"] for o in _C.ops()}
    assert set(amp.POLICY) - ops <= {"linear_gelu_linear"}  # every line names an op (or the MLP's one node)
    a = it.from_numpy(rng().standard_normal((4, 8)).astype(np.float32), device=DEVICE)
    b = it.from_numpy(rng().standard_normal((8, 3)).astype(np.float32), device=DEVICE)
    with it.autocast(DEVICE, dtype=it.bfloat16):
        assert (a @ b).dtype == "bfloat16" and it.softmax(a.to("bfloat16"), -1).dtype == "float32"
        monkeypatch.setitem(amp.POLICY, "matmul", "keep")
        monkeypatch.setitem(amp.POLICY, "softmax", "keep")
        assert (a @ b).dtype == "float32" and it.softmax(a.to("bfloat16"), -1).dtype == "bfloat16"


def test_deferred_linears_keep_eager_semantics():
    """The norm-fed linear that waits for a GELU: a write to its input before it runs raises; a GELU and linear
    issued under another grad or autocast state than the first linear run as the eager ops would."""
    from infinitrain.compiler import fusing

    ln, fc, proj = (m.to(DEVICE) for m in (nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)))
    x = it.from_numpy(rng().standard_normal((2, 5, C)).astype(np.float32), device=DEVICE)
    with fusing():
        h = ln(x)
        y = fc(h)
        h.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified in place"):
            y.numpy()
    for p in (*fc.parameters(), *proj.parameters()):
        p.grad = None
    with fusing():
        with it.no_grad():
            g = F.gelu(fc(ln(x)), approximate="tanh")
        out = proj(g)  # the second linear with grad: fc's weight must get none, as eagerly
    out.sum().backward()
    assert fc.weight.grad is None and proj.weight.grad is not None
    with fusing():
        g = F.gelu(fc(ln(x)), approximate="tanh")
        with it.autocast(DEVICE, dtype=it.bfloat16):
            out = proj(g)
    assert out.dtype == "bfloat16"  # as eagerly: the second linear under autocast


def test_run_config_replace_counts_its_changes_as_given():
    from infinitrain.training import RunConfig

    base = RunConfig(model="llama3", n_layer=1)
    assert "intermediate_size" in base.replace(intermediate_size=160).present
