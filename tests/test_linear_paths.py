"""cuda's other linear path: the GEMM suite again in a fresh process under `INFINITRAIN_CUDA_LINEAR=lt` (cuBLASLt
with the bias in the epilogue; the switch is read once per process), and proof that cuBLASLt ran rather than the
portable kernel it falls back to. Other providers have one linear path."""

import os
import re
import subprocess
import sys

import pytest

from harness import DEVICE

PROVIDER = DEVICE.split(":")[0]

# Runs the suite in this process, then reports how many linear calls cuBLASLt took.
RUN = """
import sys
import pytest
code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", sys.argv[1]])
import infinitrain_cuda
print("lt_linear_calls", infinitrain_cuda.lt_linear_calls())
sys.exit(code)
"""


@pytest.mark.skipif(PROVIDER != "cuda", reason=f"{PROVIDER} has one linear path")
def test_gemm_suite_on_cublaslt():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, INFINITRAIN_CUDA_LINEAR="lt")
    cmd = [sys.executable, "-c", RUN, os.path.join(here, "test_ops_gemm.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=here)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    calls = re.search(r"lt_linear_calls (\d+)", p.stdout)
    assert calls and int(calls.group(1)) > 0, "cuBLASLt ran no linear call: every case fell back\n" + p.stdout[-2000:]
