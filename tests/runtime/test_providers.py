"""The provider mechanism, with the test-only providers `fake` and `fake2`
(tests/fake_provider: host memory, kernels for fill_, cast, add, mul and
sigmoid only). One provider per process, so each case runs in a subprocess."""

import os
import subprocess
import sys
import textwrap

import pytest

from infinitrain import backends

pytestmark = pytest.mark.skipif(
    "fake" not in backends.available(),
    reason="needs the test-only providers: bazel test //tests/runtime:test_providers",
)


def run_py(code, **extra_env):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **extra_env)
    env.pop("INFINITRAIN_CPU_FALLBACK", None)
    prelude = "import numpy as np, warnings\nimport infinitrain as it\nfrom infinitrain import _C\n"
    p = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_built_in_providers_are_listed():
    assert {"fake", "fake2"} <= set(backends.available())


def test_register_is_idempotent_and_reports_what_it_registered():
    out = run_py("""
        info = it.backends.register("fake")
        assert info == {"name": "fake", "autocast_dtype": "float16"}, info
        assert it.backends.register("fake") == info
        assert it.amp.default_dtype("fake:1") == "float16"
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_second_provider_is_refused():
    run_py("""
        it.backends.register("fake")
        try:
            it.backends.register("fake2")
        except RuntimeError as e:
            assert "cannot register provider 'fake2'" in str(e) and "'fake' already holds" in str(e), e
        else:
            raise AssertionError("registered two providers")
    """)


def test_first_use_of_the_device_name_registers_the_provider():
    run_py("""
        assert it.backends.registered() is None
        a = np.arange(6.0).reshape(2, 3)
        x = it.from_numpy(a, device="fake:1")
        assert it.backends.registered()["name"] == "fake"
        assert x.device == "fake:1"
        np.testing.assert_array_equal((x + x * x).numpy(), a + a * a)
    """)


def test_unknown_devices_and_indices_are_clear_errors():
    run_py("""
        try:
            it.zeros(3, device="nosuch:0")
        except ValueError as e:
            assert "unknown device type 'nosuch'" in str(e) and "fake" in str(e), e
        else:
            raise AssertionError
        it.backends.register("fake")
        for spec, msg in [("fake:2", "fake:2 does not exist: fake has 2 device(s)"),
                          ("fake2:0", "registered device types are cpu, fake"),
                          ("fake:x", "expected '<type>' or '<type>:<index>'")]:
            try:
                it.zeros(3, device=spec)
            except ValueError as e:
                assert msg in str(e), (spec, e)
            else:
                raise AssertionError(spec)
    """)


def test_a_missing_op_names_op_device_and_provider():
    run_py("""
        x = it.ones(4, device="fake:0")
        try:
            x - x
        except NotImplementedError as e:
            assert str(e) == "op 'sub' has no kernel for device fake:0 (provider 'fake')", e
        else:
            raise AssertionError
    """)


def test_cpu_fallback_runs_missing_ops_and_warns_once_per_op():
    run_py("""
        it.backends.set_cpu_fallback("fake", True)
        assert it.backends.cpu_fallback("fake") and not it.backends.cpu_fallback("cpu")
        a = np.random.default_rng().standard_normal((3, 5))
        x = it.from_numpy(a, device="fake:0")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = x - x * 3.0   # sub and affine fall back; mul is native
            z = x - x
            e = x.exp()
        assert y.device == "fake:0"
        np.testing.assert_allclose(y.numpy(), a - 3 * a, rtol=1e-15)
        np.testing.assert_allclose(e.numpy(), np.exp(a), rtol=1e-15)
        msgs = sorted(str(m.message) for m in w)
        assert len(msgs) == 3, msgs  # sub, affine, exp: each once
        assert all("running it on the CPU (CPU fallback)" in m for m in msgs), msgs
    """)


def test_fused_ops_without_kernels_run_their_composites():
    run_py("""
        from infinitrain import functional as F
        a = np.random.default_rng().standard_normal((4, 7))
        x = it.from_numpy(a, device="fake:0")
        y = F.silu(x)   # composite: x * sigmoid(x), both native here; no fallback is on
        np.testing.assert_allclose(y.numpy(), a / (1 + np.exp(-a)), rtol=1e-14)
    """)


def test_foreach_ops_without_kernels_run_their_composites():
    """fake has no foreach kernels: their composites run, with the ops they use falling back to the CPU where fake
    lacks them too (copy_, sum_squares, adamw_): the optimizer and clipping end where NumPy's float64 ones do."""
    run_py("""
        it.backends.set_cpu_fallback("fake", True)
        for name in ("foreach_sum_squares", "foreach_mul_", "foreach_adamw_"):
            assert _C.op(name).how("fake:0") == "composite", name
        gen = np.random.default_rng()
        shapes = [(3, 4), (5,), (0,), ()]
        p0 = [gen.standard_normal(s) for s in shapes]
        g0 = [3 * gen.standard_normal(s) for s in shapes]
        ps = [it.nn.Parameter(it.from_numpy(a, device="fake:0")) for a in p0]
        for p, g in zip(ps, g0):
            p.grad = it.from_numpy(g, device="fake:0")
        opt = it.optim.AdamW(ps, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's once-per-op warnings
            norm = it.optim.clip_grad_norm_(ps, 1.0)
            opt.step()
        total = np.sqrt(sum((g**2).sum() for g in g0))
        np.testing.assert_allclose(norm.numpy(), total, rtol=1e-12)
        coef = 1.0 / (total + 1e-6)
        for p, g in zip(ps, g0):
            np.testing.assert_allclose(p.grad.numpy(), g * coef, rtol=1e-12)
        for p, a, g in zip(ps, p0, g0):
            g = g * coef  # AdamW's first step: m / sqrt(v) is g / |g| after the bias corrections
            want = a * (1 - 0.1 * 0.1) - 0.1 * g / (np.abs(g) + 1e-8)
            np.testing.assert_allclose(p.numpy(), want, rtol=1e-10, atol=1e-12)
        print("ok")
    """)


def test_conformance_report_shows_how_the_provider_runs_each_op():
    run_py("""
        from infinitrain.tools import conformance
        it.backends.register("fake")
        rep = conformance.run("fake", ops=["add", "sub", "silu"])
        how = {(r["op"], r["dtype"]): (r["how"], r["status"]) for r in rep["records"]}
        assert how[("add", "float64")] == ("native", "pass"), how
        assert how[("sub", "float64")][0] == "missing" and how[("sub", "float64")][1] != "pass", how
        assert how[("silu", "float64")] == ("composite", "pass"), how
    """)


def test_registration_touches_no_hardware():
    # The fake runtime counts nothing until first use; registering must not allocate.
    run_py("""
        it.backends.register("fake")
        assert _C.memory_stats("fake:0")["num_allocs"] == 0
    """)


FAILED_REGISTRATION = """
    for _ in range(2):  # a retry fails the same way instead of finding a half-registered provider
        try:
            it.backends.register("fakebad")
        except RuntimeError as e:
            assert "registration failed" in str(e), e
            assert all(part in str(e) for part in EXPECTED), (EXPECTED, e)
            assert not any(part in str(e) for part in NOT_EXPECTED), (NOT_EXPECTED, e)
        else:
            raise AssertionError("registered a broken provider")
        assert it.backends.registered() is None
        assert "fakebad.scale_add" not in it.ops.names() and "fakebad.bad_backward" not in it.ops.names()
    it.backends.register("fake")  # the slot is still free
    assert it.backends.registered()["name"] == "fake"
"""


def _failed_registration(expected, not_expected=(), **env):
    code = f"EXPECTED = {list(expected)!r}\nNOT_EXPECTED = {list(not_expected)!r}\n"
    run_py(code + textwrap.dedent(FAILED_REGISTRATION), **env)


def test_a_failed_registration_leaves_nothing_registered():
    _failed_registration(["unknown op 'no_such_op'", "backward op 'no_such_backward_op' is not an op"])


def test_a_missing_backward_op_is_found_before_anything_is_registered():
    """With only the backward fault, registration once claimed the slot and the runtime before AddOp raised: the
    provider stayed half-registered and a retry failed on the runtime being registered twice."""
    _failed_registration(
        ["op 'fakebad.bad_backward' (at ", "backward op 'no_such_backward_op' is not an op"],
        not_expected=["unknown op 'no_such_op'"],
        INFINITRAIN_FAKEBAD_FAULTS="backward",
    )


def test_provider_ops_are_added_after_the_provider_ops_their_backward_uses():
    """fakebad without its faults: fakebad.uses_later's backward uses fakebad.later, defined after it; the core
    adds an op only after the ops its backward names, so the order they were written in does not matter."""
    run_py(
        """
        assert it.backends.register("fakebad")["name"] == "fakebad"
        names = it.ops.names()
        assert "fakebad.uses_later" in names and "fakebad.later" in names and "fakebad.bad_backward" not in names
        assert it.ops.schema("fakebad.uses_later") == "fakebad.uses_later(x) -> out"
        """,
        INFINITRAIN_FAKEBAD_FAULTS="",
    )


def test_provider_ops_run_natively_or_as_their_composite():
    run_py("""
        from infinitrain import dispatch
        it.backends.register("fake")
        assert it.ops.schema("fake.scale_add") == "fake.scale_add(x, y; alpha: float) -> out"
        assert "scale_add" in dir(it.ops.fake)
        g = np.random.default_rng()
        a, b = g.standard_normal((3, 5)), g.standard_normal((3, 5))
        x, y = it.from_numpy(a, device="fake:1"), it.from_numpy(b, device="fake:1")
        assert dispatch.how("fake.scale_add", "fake:1") == "native"
        out = it.ops.fake.scale_add(x, y, alpha=2.5)
        assert out.device == "fake:1"
        np.testing.assert_allclose(out.numpy(), a + 2.5 * b, rtol=1e-15)
        # No cpu kernel: the cpu runs the provider's composite (affine, then add).
        assert dispatch.how("fake.scale_add", "cpu") == "composite"
        out = it.ops.call("fake.scale_add", it.from_numpy(a), it.from_numpy(b), alpha=-0.5)
        np.testing.assert_allclose(out.numpy(), a - 0.5 * b, rtol=1e-15)
        for bad, err in [(lambda: it.ops.fake.scale_add(x, y), "missing attribute(s) alpha"),
                         (lambda: it.ops.fake.scale_add(x, y, alpha=1.0, beta=2.0), "unexpected attribute(s) beta"),
                         (lambda: it.ops.fake.scale_add(x, it.ones(2, device="fake:1", dtype="float64"), alpha=1.0),
                          "x and y must have one shape and dtype"),
                         (lambda: it.ops.fake.nope, "no op 'fake.nope'")]:
            try:
                bad()
            except (TypeError, ValueError, AttributeError) as e:
                assert err in str(e), e
            else:
                raise AssertionError(err)
        from infinitrain.tools import conformance
        rep = conformance.run("fake", ops=["fake.scale_add", "add"])
        rows = {r["op"]: r for r in rep["records"]}
        assert rows["fake.scale_add"]["tier"] == "provider" and rows["fake.scale_add"]["how"] == "native"
        assert rows["fake.scale_add"]["status"] == "provider-op" and rep["summary"]["ok"], rep["summary"]
    """)


def test_blas_handles_are_per_thread_and_bound_to_the_stream():
    run_py("""
        import threading, time
        it.backends.register("fake")
        x = it.ones(2, device="fake:0")
        probe = lambda: it.ops.fake.blas_probe(x).numpy().tolist()[:3]
        h1, made1, binds1 = probe()
        assert probe() == [h1, made1, binds1]  # same thread, same stream: same handle, no rebinding
        s = it.runtime.Stream("fake:0")
        with it.runtime.stream(s):
            h3, made3, binds3 = probe()
        assert (h3, made3, binds3) == (h1, made1, binds1 + 1)  # rebound to the op's stream
        seen = []
        for _ in range(8):  # threads one after another: an ended thread's handle goes to the next
            t = threading.Thread(target=lambda: seen.append(probe()))
            t.start()
            t.join(timeout=30)
            time.sleep(0.05)
        assert all(h != h1 for h, _, _ in seen)  # never the live handle of this thread
        assert seen[-1][1] - made1 <= 3, seen
    """)


def test_a_kernel_override_replaces_the_provider_kernel():
    run_py("""
        it.backends.register("fake")
        x = it.ones(3, device="fake:0")
        before = it.ops.fake.blas_probe(x).numpy()[3]
        x.fill_(2.0)
        assert it.ops.fake.blas_probe(x).numpy()[3] == before + 1  # the override ran, not the plain kernel
        np.testing.assert_array_equal(x.numpy(), [2.0, 2.0, 2.0])
    """)
