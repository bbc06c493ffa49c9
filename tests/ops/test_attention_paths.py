"""The GPU providers' other attention paths: the attention suite again in a fresh process per path switch (the
switches are read once per process), so every path a provider can take passes it, not only its default one.
cuda: the flash kernels (tensor cores for 16-bit, `INFINITRAIN_CUDA_ATTENTION=portable`) and the GEMM path
(`INFINITRAIN_GPU_ATTENTION=gemm`); maca: the flash kernels' SIMT policy for 16-bit (`INFINITRAIN_GPU_ATTENTION=flash`).
The cpu and sim have one path each."""

import os
import subprocess
import sys

import pytest

from harness import DEVICE

PATHS = {
    "cuda": [
        {"INFINITRAIN_CUDA_ATTENTION": "portable"},
        {"INFINITRAIN_CUDA_ATTENTION": "portable", "INFINITRAIN_GPU_ATTENTION": "gemm"},
    ],
    "maca": [{"INFINITRAIN_GPU_ATTENTION": "flash"}],
}
PROVIDER = DEVICE.split(":")[0]
CASES = PATHS.get(PROVIDER, [])


@pytest.mark.skipif(not CASES, reason=f"{PROVIDER} has one attention path")
@pytest.mark.parametrize("switches", CASES, ids=[",".join(f"{k}={v}" for k, v in e.items()) for e in CASES])
def test_attention_suite_on_path(switches):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **switches)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        os.path.join(here, "test_ops_attention.py"),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
