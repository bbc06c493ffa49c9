"""Mixture-of-experts routing ops on the device under test against float64 NumPy: "moe_topk" and
"moe_topk_backward" (router), "moe_permute", "moe_unpermute" and "moe_unpermute_backward" (dropless
dispatch and combine); the functional wrappers' gradients against finite differences; bad input errors."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, TOL, assert_close, rng, round_to, run, to_device
from infinitrain import _C
from infinitrain import functional as F


def softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def moe_reference(x, params, k, normalize):
    """A SparseMoE block in float64 NumPy, token by token: softmax gating, the top-k experts (renormalised when
    `normalize`), each a SwiGLU MLP, summed with their gates. Returns (out, probs, top)."""
    probs = softmax(x @ params["gate.weight"].T)
    top = np.argsort(-probs, -1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, top, -1)
    if normalize:
        w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(k):
            e = f"experts.{top[n, j]}."
            g = x[n] @ params[e + "gate_proj.weight"].T
            h = g / (1 + np.exp(-g)) * (x[n] @ params[e + "up_proj.weight"].T)
            out[n] += w[n, j] * (h @ params[e + "down_proj.weight"].T)
    return out, probs, top


def ref_topk(x, k, normalize):
    experts = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(x, experts, -1)
    w = softmax(chosen) if normalize else np.take_along_axis(softmax(x), experts, -1)
    return w, experts


def stat(dtype):
    return "float64" if dtype == "float64" else "float32"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("normalize", [0, 1])
@pytest.mark.parametrize("n,e,k", [(37, 8, 2), (5, 1, 1), (12, 6, 6)])
def test_topk_routes_every_token_to_k_distinct_experts(dtype, normalize, n, e, k):
    x = round_to(rng().standard_normal((n, e)) * 2, dtype)
    w, experts = run("moe_topk", [to_device(x, dtype)], [k, normalize])
    assert w.dtype == stat(dtype) and experts.dtype == "int64"
    got = experts.numpy()
    assert got.shape == (n, k)
    assert all(len(set(row)) == k for row in got.tolist())  # every token reaches exactly k experts
    want_w, want_e = ref_topk(x, k, normalize)
    np.testing.assert_array_equal(got, want_e)
    assert_close(w, want_w, stat(dtype), what="weights")
    if normalize:  # dispatch weights sum to 1
        np.testing.assert_allclose(w.numpy().sum(-1), 1.0, rtol=0, atol=1e-6)


def test_topk_ties_go_to_the_lower_expert():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    _, experts = run("moe_topk", [to_device(x, "float32")], [3, 1])
    np.testing.assert_array_equal(experts.numpy(), [[1, 2, 0], [0, 1, 2]])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("normalize", [0, 1])
def test_topk_backward(dtype, normalize):
    g = rng()
    n, e, k = 11, 7, 3
    x = round_to(g.standard_normal((n, e)), dtype)
    experts = np.stack([g.permutation(e)[:k] for _ in range(n)])
    grad = g.standard_normal((n, k))
    (dl,) = run(
        "moe_topk_backward",
        [to_device(x, dtype), to_device(experts, "int64"), to_device(grad, stat(dtype))],
        [normalize],
    )

    # Reference by central differences of the float64 weights (the forward's formula on the given experts).
    def weights(xx):
        chosen = np.take_along_axis(xx, experts, -1)
        return softmax(chosen) if normalize else np.take_along_axis(softmax(xx), experts, -1)

    want = np.zeros_like(x)
    h = 1e-6
    for i in range(n):
        for j in range(e):
            xp, xm = x.copy(), x.copy()
            xp[i, j] += h
            xm[i, j] -= h
            want[i, j] = ((weights(xp) - weights(xm)) * grad).sum() / (2 * h)
    rtol, atol = TOL[dtype]
    assert_close(dl, want, dtype, rtol=max(rtol, 1e-7), atol=max(atol, 1e-8))  # finite differences: ~1e-9 error


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_permute_groups_rows_by_expert_and_unpermute_inverts_it(dtype):
    g = rng()
    n, e, k, c = 23, 8, 2, 5
    x = round_to(g.standard_normal((n, c)), dtype)
    experts = np.stack([g.permutation(e - 1)[:k] for _ in range(n)])  # expert 7 gets no row
    rows, source, counts = run("moe_permute", [to_device(x, dtype), to_device(experts, "int64")], [e])
    src, cnt = source.numpy(), counts.numpy()
    np.testing.assert_array_equal(cnt, np.bincount(experts.reshape(-1), minlength=e))
    assert cnt[7] == 0 and cnt.sum() == n * k  # dropless: every (token, choice) has a row
    np.testing.assert_array_equal(np.sort(src), np.arange(n * k))
    flat = experts.reshape(-1)
    assert (np.diff(flat[src]) >= 0).all(), "rows grouped by expert"
    for lo, hi in zip(np.cumsum(cnt) - cnt, np.cumsum(cnt), strict=True):
        assert (np.diff(src[lo:hi]) > 0).all(), "token order within an expert"
    np.testing.assert_array_equal(rows.numpy().astype(np.float64), x[src // k])
    # Combine with weights summing to 1 per token restores x exactly in float64, within rounding otherwise.
    w = softmax(g.standard_normal((n, k)))
    w = round_to(w, stat(dtype))
    (out,) = run("moe_unpermute", [rows, source, to_device(w, stat(dtype))])
    assert_close(out, x * w.sum(-1, keepdims=True), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_unpermute_and_backward_against_numpy(dtype):
    g = rng()
    n, k, c = 9, 3, 4
    y = round_to(g.standard_normal((n * k, c)), dtype)
    source = g.permutation(n * k)
    w = round_to(g.uniform(0, 1, (n, k)), stat(dtype))
    grad = round_to(g.standard_normal((n, c)), dtype)
    ins = [to_device(y, dtype), to_device(source, "int64"), to_device(w, stat(dtype))]
    (out,) = run("moe_unpermute", ins)
    pos = np.argsort(source)
    assert_close(out, (y[pos].reshape(n, k, c) * w[..., None]).sum(1), dtype)
    dy, dw = run("moe_unpermute_backward", [to_device(grad, dtype)] + ins)
    slot_w = w.reshape(-1)[source]
    assert_close(dy, slot_w[:, None] * grad[source // k], dtype)
    want_dw = np.zeros(n * k)
    want_dw[source] = (grad[source // k] * y).sum(-1)
    assert_close(dw, want_dw.reshape(n, k), stat(dtype))


def test_functional_gradients_by_finite_differences():
    """x -> router -> dispatch -> per-row scale -> combine, in float64: autograd against central differences."""
    g = rng()
    n, e, k, c = 6, 4, 2, 3
    x0 = g.standard_normal((n, c))
    wr0 = g.standard_normal((e, c))
    scale = g.standard_normal((n * k, c))

    def forward(x_np, wr_np, grad=False):
        x = it.from_numpy(x_np, device=DEVICE, requires_grad=grad)
        wr = it.from_numpy(wr_np, device=DEVICE, requires_grad=grad)
        weights, experts = F.moe_topk(F.linear(x, wr), k, normalize=True)
        rows, source, _ = F.moe_permute(x, experts, e)
        y = rows * it.from_numpy(scale, device=DEVICE)
        out = F.moe_unpermute(y, source, weights)
        return (out * out).sum(), x, wr

    loss, x, wr = forward(x0, wr0, grad=True)
    loss.backward()
    h = 1e-6
    for arr, t in ((x0, x), (wr0, wr)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            p, m = arr.copy(), arr.copy()
            p[idx] += h
            m[idx] -= h
            a = (forward(p, wr0)[0] if t is x else forward(x0, p)[0]).item()
            b = (forward(m, wr0)[0] if t is x else forward(x0, m)[0]).item()
            num[idx] = (a - b) / (2 * h)
        np.testing.assert_allclose(t.grad.numpy(), num, rtol=1e-6, atol=1e-7)


def test_bad_inputs_raise_clear_errors():
    x = to_device(np.zeros((4, 3)), "float32")
    with pytest.raises(ValueError, match="k must be in"):
        run("moe_topk", [x], [4, 1])
    experts = to_device(np.array([[0, 1], [1, 2], [2, 0], [0, 5]]), "int64")
    with pytest.raises(IndexError, match="expert 5 at slot 7"):
        run("moe_permute", [to_device(np.zeros((4, 2)), "float32"), experts], [3])
    with pytest.raises(ValueError, match="experts must have shape"):
        run("moe_permute", [to_device(np.zeros((3, 2)), "float32"), experts], [6])
    y = to_device(np.zeros((4, 2)), "float32")
    w = to_device(np.ones((2, 2)), "float32")
    with pytest.raises(ValueError, match="permutation"):
        run("moe_unpermute", [y, to_device(np.array([0, 1, 1, 3]), "int64"), w])
    with pytest.raises(ValueError, match="weights must be float32"):
        run("moe_unpermute", [y, to_device(np.arange(4), "int64"), to_device(np.ones((2, 2)), "float64")])


def test_ops_are_fused_with_composites():
    for name in ("moe_topk", "moe_topk_backward", "moe_permute", "moe_unpermute", "moe_unpermute_backward"):
        info = _C.op(name).info()
        assert info["tier"] == "fused" and info["composite"], name


def test_one_expert_top1_equals_the_dense_swiglu_block():
    from infinitrain.models.moe import Expert, SparseMoE

    it.manual_seed(7)
    moe = SparseMoE(12, 20, num_experts=1, top_k=1, normalize=True, device=DEVICE)
    dense = Expert(12, 20, DEVICE, 0.02, 0.02)
    for a, b in zip(moe.experts[0].parameters(), dense.parameters(), strict=True):
        b.copy_(a)
    moe.to("float64"), dense.to("float64")
    x = it.from_numpy(rng().standard_normal((2, 5, 12)), device=DEVICE)
    np.testing.assert_allclose(moe(x).numpy(), dense(x).numpy(), rtol=1e-12, atol=1e-14)


def test_block_routes_every_token_to_k_experts_and_balancing_loss():
    from infinitrain.models.moe import SparseMoE, load_balancing_loss

    it.manual_seed(8)
    E, k, N, C = 8, 2, 30, 16
    moe = SparseMoE(C, 24, num_experts=E, top_k=k, normalize=True, device=DEVICE)
    moe.to("float64")
    x = rng().standard_normal((N, C))
    out = moe(it.from_numpy(x, device=DEVICE))
    counts, prob_sum, tokens = moe.router_stats
    assert tokens == N and counts.numpy().sum() == N * k  # dropless: exactly k experts per token
    # NumPy reference of the block: softmax gating, top-2 of 8, renormalised, SwiGLU experts.
    params = {n: p.numpy() for n, p in moe.named_parameters()}
    want, probs, top = moe_reference(x, params, k, normalize=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(counts.numpy(), np.bincount(top.reshape(-1), minlength=E))
    aux = load_balancing_loss([moe.router_stats], E).item()
    assert aux == pytest.approx(E * (np.bincount(top.reshape(-1), minlength=E) / N * probs.mean(0)).sum(), rel=1e-12)


def test_expert_parallel_block_on_one_rank_keeps_the_routing_statistics():
    """ExpertParallelMoE on a one-rank region: router_stats hold the per-expert counts of the top-k routing and
    the summed router probabilities, as float64 NumPy computes them."""
    from infinitrain.models.moe import ExpertParallelMoE, SparseMoE
    from infinitrain.parallel.layers import TPRegion

    E, k, N, C = 6, 2, 20, 8
    moe = SparseMoE(C, 12, num_experts=E, top_k=k, normalize=False, device=DEVICE)
    moe.to("float64")
    ep = ExpertParallelMoE(moe, None, TPRegion(None))
    x = rng().standard_normal((2, N // 2, C))
    ep(it.from_numpy(x, device=DEVICE))
    counts, prob_sum, tokens = ep.router_stats
    probs = softmax(x.reshape(N, C) @ moe.gate.weight.numpy().T)
    top = np.argsort(-probs, -1, kind="stable")[:, :k]
    assert tokens == N
    np.testing.assert_array_equal(counts.numpy(), np.bincount(top.reshape(-1), minlength=E))
    np.testing.assert_allclose(prob_sum.numpy(), probs.sum(0), rtol=1e-12)


def test_expert_parallel_block_on_one_rank_matches_numpy():
    """ExpertParallelMoE on a one-rank region runs every expert on its routed rows: its output is the gate-weighted
    sum of each token's top-k SwiGLU experts, computed per token in float64 NumPy."""
    from infinitrain.models.moe import ExpertParallelMoE, SparseMoE
    from infinitrain.parallel.layers import TPRegion

    it.manual_seed(9)
    E, k, N, C = 4, 2, 24, 8
    moe = SparseMoE(C, 12, num_experts=E, top_k=k, normalize=False, device=DEVICE)
    moe.to("float64")
    ep = ExpertParallelMoE(moe, None, TPRegion(None))
    x = rng().standard_normal((2, N // 2, C))
    out = ep(it.from_numpy(x, device=DEVICE)).numpy().reshape(N, C)
    params = {n: p.numpy() for n, p in moe.named_parameters()}
    want, _, top = moe_reference(x.reshape(N, C), params, k, normalize=False)
    assert np.bincount(top.reshape(-1), minlength=E).min() > 0
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
