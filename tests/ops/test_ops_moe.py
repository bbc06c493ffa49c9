"""The MoE backward ops in float16 (tests/models/test_moe.py runs them in the other dtypes) against float64 NumPy, and
the routing ops where the thread split matters (many tokens)."""

import numpy as np
import pytest

from harness import assert_close, rng, round_to, run, to_device


def softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float16"])
@pytest.mark.parametrize("normalize", [0, 1])
def test_topk_backward(dtype, normalize):
    """d(weights . grad)/dlogits, analytically: the softmax Jacobian over all experts (or the chosen ones)."""
    g = rng()
    n, e, k = 13, 7, 3
    x = round_to(g.standard_normal((n, e)), dtype)
    experts = np.stack([g.permutation(e)[:k] for _ in range(n)])
    grad = round_to(g.standard_normal((n, k)), "float32")
    (dl,) = run(
        "moe_topk_backward", [to_device(x, dtype), to_device(experts, "int64"), to_device(grad, "float32")], [normalize]
    )
    want = np.zeros((n, e))
    for i in range(n):
        if normalize:
            p = softmax(x[i, experts[i]])
            want[i, experts[i]] = p * (grad[i] - (grad[i] * p).sum())
        else:
            p = softmax(x[i])
            gfull = np.zeros(e)
            gfull[experts[i]] = grad[i]
            want[i] = p * (gfull - (gfull * p).sum())
    assert_close(dl, want, dtype, what="dlogits")


@pytest.mark.parametrize("dtype", ["float16"])
@pytest.mark.parametrize("n,k,c", [(9, 3, 4), (700, 2, 64)])  # the second splits across threads
def test_unpermute_backward(dtype, n, k, c):
    g = rng()
    y = round_to(g.standard_normal((n * k, c)), dtype)
    source = g.permutation(n * k)
    w = round_to(g.uniform(0, 1, (n, k)), "float32")
    grad = round_to(g.standard_normal((n, c)), dtype)
    ins = [to_device(y, dtype), to_device(source, "int64"), to_device(w, "float32")]
    dy, dw = run("moe_unpermute_backward", [to_device(grad, dtype)] + ins)
    assert_close(dy, w.reshape(-1)[source][:, None] * grad[source // k], dtype, what="dy")
    want_dw = np.zeros(n * k)
    want_dw[source] = (grad[source // k] * y).sum(-1)
    assert_close(dw, want_dw.reshape(n, k), "float32", what="dweights")


@pytest.mark.parametrize("composite", [False, True], ids=["kernel", "composite"])
@pytest.mark.parametrize("bad", [[0, 2, 2, 3], [0, 1, 4, 3], [0, -1, 2, 3]], ids=["repeat", "high", "negative"])
def test_unpermute_refuses_a_source_that_is_no_permutation(bad, composite):
    """A repeated or out-of-range source row would silently drop or mix tokens: kernel and composite refuse it."""
    from infinitrain import dispatch

    g = rng()
    ins = [to_device(g.standard_normal((4, 3)), "float32"), to_device(np.array(bad), "int64")]
    ins.append(to_device(g.uniform(0, 1, (2, 2)), "float32"))
    with dispatch.prefer_composites(["moe_unpermute"] if composite else []):
        with pytest.raises(ValueError, match=r"moe_unpermute: source must be a permutation of \[0, 4\)"):
            run("moe_unpermute", ins)
