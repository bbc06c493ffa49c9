"""The CPU's bfloat16 GEMM paths: the bfloat16 cases of the GEMM and attention suites again in a fresh process per
INFINITRAIN_CPU_BF16_GEMM value (the switch is read once per process), so the widen + sgemm path and each bf16
kernel this CPU can run pass them, not only the one `auto` picks. `generic` (and `sbgemm`, the best kernel) run on
any CPU; `amx` and `avx512bf16` are skipped where the CPU refuses them. On other providers the products are not the
CPU kernels', so there is nothing to switch."""

import os
import subprocess
import sys

import pytest

from harness import DEVICE

PROVIDER = DEVICE.split(":")[0]
CPU_KERNELS = PROVIDER in ("cpu", "sim")  # sim runs the CPU kernels on its streams
HERE = os.path.dirname(os.path.abspath(__file__))
PATHS = ["widen", "sbgemm", "amx", "avx512bf16", "generic"]

PROBE = """
import numpy as np
import infinitrain as it
a = it.from_numpy(np.ones((2, 3), np.float32)).to(it.bfloat16)
print(float((a @ a.T).float().numpy()[0, 0]))
"""


# A float32 linear and matmul under the switch: the bf16 kernels are for bfloat16 operands only, so float32 products
# stay float32 (the error of float32 accumulation, not of bfloat16 rounding) whichever kernel is forced.
FLOAT32 = """
import numpy as np
import infinitrain as it
g = np.random.default_rng()
x, w = g.standard_normal((37, 24)), g.standard_normal((19, 24))
ref = x @ w.T
lin = it.nn.functional.linear(it.from_numpy(x, dtype="float32"), it.from_numpy(w, dtype="float32")).numpy()
mm = (it.from_numpy(x, dtype="float32") @ it.from_numpy(w.T, dtype="float32")).numpy()
print(max(float(np.abs(lin - ref).max()), float(np.abs(mm - ref).max())))
"""


def run_python(args, value, timeout=600):
    env = dict(os.environ, INFINITRAIN_CPU_BF16_GEMM=value)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not CPU_KERNELS, reason=f"{PROVIDER} does not multiply on the CPU kernels")
@pytest.mark.parametrize("path", PATHS)
def test_bf16_suites_on_path(path):
    probe = run_python(["-c", PROBE], path, timeout=120)
    if probe.returncode and "this CPU cannot run that kernel" in probe.stderr:
        pytest.skip(f"this CPU cannot run the {path} kernel")
    assert probe.returncode == 0 and probe.stdout.strip() == "3.0", probe.stderr[-2000:]
    f32 = run_python(["-c", FLOAT32], path, timeout=120)
    assert f32.returncode == 0 and float(f32.stdout.strip()) < 1e-4, f32.stdout + f32.stderr[-2000:]
    suites = [os.path.join(HERE, f) for f in ("test_ops_gemm.py", "test_ops_attention.py")]
    p = run_python(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "bfloat16", *suites], path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " passed" in p.stdout.splitlines()[-1], p.stdout[-2000:]


@pytest.mark.skipif(not CPU_KERNELS, reason=f"{PROVIDER} does not multiply on the CPU kernels")
def test_invalid_switch_is_a_clear_error():
    p = run_python(["-c", PROBE], "fast", timeout=120)
    assert p.returncode != 0
    assert "ValueError: INFINITRAIN_CPU_BF16_GEMM='fast': expected 'auto'" in p.stderr, p.stderr[-2000:]
