"""cuda's two linear paths: the GEMM suite in a fresh process on the default (cuBLASLt, the bias and its gradient in
the GEMM epilogues) and again under `INFINITRAIN_CUDA_LINEAR=portable` (the switch is read once per process), with
proof from the call counters that cuBLASLt ran both linear and linear_weight_grad on the first and neither on the
second: every case it declines falls back to the portable kernel and would pass too. After the suite, one bfloat16
linear with a bias and one bfloat16 linear_weight_grad with the bias gradient, each counted on its own, show that the
16-bit epilogues (where split-K is off) run on cuBLASLt and not on its fallback. Other providers have one linear
path."""

import os
import re
import subprocess
import sys

import pytest

from harness import DEVICE

PROVIDER = DEVICE.split(":")[0]

# Runs the suite in this process, then reports how many calls cuBLASLt took.
RUN = """
import sys
import pytest
code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", sys.argv[1]])
import infinitrain_cuda
from harness import randn, run, to_device
def counts():
    return infinitrain_cuda.lt_linear_calls(), infinitrain_cuda.lt_weight_grad_calls()
print("lt_calls", *counts())
bf = lambda *s: to_device(randn(*s), "bfloat16")
before = counts()
run("linear", [bf(4, 9, 512), bf(64, 512), bf(64)])
after_linear = counts()
run("linear_weight_grad", [bf(4096, 64), bf(4096, 32)], [1])
print("lt_16bit", *before, *after_linear, *counts())
sys.exit(code)
"""


def _gemm_suite(switch):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env.pop("INFINITRAIN_CUDA_LINEAR", None)
    if switch:
        env["INFINITRAIN_CUDA_LINEAR"] = switch
    cmd = [sys.executable, "-c", RUN, os.path.join(here, "test_ops_gemm.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=here)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    calls = re.search(r"lt_calls (\d+) (\d+)", p.stdout)
    epilogues = re.search(r"lt_16bit" + r" (\d+)" * 6, p.stdout)
    assert calls and epilogues, p.stdout[-2000:]
    return tuple(map(int, calls.groups())), tuple(map(int, epilogues.groups())), p.stdout[-2000:]


@pytest.mark.skipif(PROVIDER != "cuda", reason=f"{PROVIDER} has one linear path")
def test_gemm_suite_on_cublaslt():
    (linear, weight_grad), (l0, w0, l1, w1, l2, w2), out = _gemm_suite(None)
    assert linear > 0, "cuBLASLt ran no linear call: every case fell back\n" + out
    assert weight_grad > 0, "cuBLASLt ran no linear_weight_grad call: every case fell back\n" + out
    assert (l1 - l0, w1 - w0) == (1, 0), "a bfloat16 linear with bias did not run on cuBLASLt\n" + out
    assert (l2 - l1, w2 - w1) == (0, 1), "a bfloat16 linear_weight_grad with bias did not run on cuBLASLt\n" + out


@pytest.mark.skipif(PROVIDER != "cuda", reason=f"{PROVIDER} has one linear path")
def test_gemm_suite_on_the_portable_kernels():
    calls, epilogues, out = _gemm_suite("portable")
    assert calls == (0, 0) and epilogues == (0,) * 6, "INFINITRAIN_CUDA_LINEAR=portable still ran cuBLASLt\n" + out
