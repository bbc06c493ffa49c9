"""cuda's two linear paths: the GEMM suite in a fresh process on the default (cuBLASLt, the bias and its gradient in
the GEMM epilogues) and again under `INFINITRAIN_CUDA_LINEAR=portable` (the switch is read once per process), with
proof from the call counters that cuBLASLt ran both linear and linear_weight_grad on the first and neither on the
second: every case it declines falls back to the portable kernel and would pass too. Other providers have one
linear path."""

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
print("lt_calls", infinitrain_cuda.lt_linear_calls(), infinitrain_cuda.lt_weight_grad_calls())
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
    assert calls, p.stdout[-2000:]
    return int(calls.group(1)), int(calls.group(2)), p.stdout[-2000:]


@pytest.mark.skipif(PROVIDER != "cuda", reason=f"{PROVIDER} has one linear path")
def test_gemm_suite_on_cublaslt():
    linear, weight_grad, out = _gemm_suite(None)
    assert linear > 0, "cuBLASLt ran no linear call: every case fell back\n" + out
    assert weight_grad > 0, "cuBLASLt ran no linear_weight_grad call: every case fell back\n" + out


@pytest.mark.skipif(PROVIDER != "cuda", reason=f"{PROVIDER} has one linear path")
def test_gemm_suite_on_the_portable_kernels():
    linear, weight_grad, out = _gemm_suite("portable")
    assert (linear, weight_grad) == (0, 0), "INFINITRAIN_CUDA_LINEAR=portable still ran cuBLASLt\n" + out
