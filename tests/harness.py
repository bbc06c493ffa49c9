"""Shared test harness: the device under test, tolerances, and float64 checks.

The device comes from INFINITRAIN_TEST_DEVICE (set by `--config=<provider>`),
"cpu" by default. Tolerances are the project's (docs/architecture.md); a test needing looser bounds
passes them explicitly and says why.
"""

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections import namedtuple

import numpy as np

from infinitrain import _C

DEVICE = os.environ.get("INFINITRAIN_TEST_DEVICE", "cpu")
TOL = {
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
    "float64": (1e-10, 1e-12),
}

# Every output is filled with NaN bytes before its kernel runs: unwritten elements fail.
_C.set_poison_outputs(True)


def repo_file(rel):
    """Path of the repository file `rel`: in Bazel's runfiles (the working directory of a test), or the checkout
    beside tests/."""
    for base in (os.getcwd(), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")):
        path = os.path.join(base, rel)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(rel)


def rng():
    """A fresh, unseeded generator: every run draws new inputs."""
    return np.random.default_rng()


def randn(*shape, gen=None, scale=1.0):
    return ((gen or rng()).standard_normal(shape) * scale).astype(np.float64)


def round_to(a, dtype):
    """Rounds a float64 array through `dtype`, so references see exactly what the kernel sees."""
    a = np.asarray(a)
    if dtype == "bfloat16":
        bits = _C.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(a.shape), "bfloat16", "cpu")
        return bits.numpy().astype(np.float64)
    if dtype in ("float32", "float16"):
        return a.astype(dtype).astype(np.float64)
    return a


def to_device(a, dtype, device=None):
    """A native tensor holding `a` converted to dtype on the device under test."""
    a = np.asarray(a)
    carrier = {"bfloat16": np.float32, "bool": np.bool_}.get(dtype) or np.dtype(dtype)
    # ascontiguousarray turns 0-d arrays into 1-d ones; keep the shape.
    return _C.from_numpy(np.ascontiguousarray(a, dtype=carrier).reshape(a.shape), dtype, device or DEVICE)


def run(op, inputs, attrs=()):
    """Runs one op through the dispatcher; returns the list of output tensors.

    Synchronises the device afterwards: a provider reports kernel errors (a bad
    index, say) asynchronously, at the next synchronisation, as GPUs do."""
    out = _C.op(op)(list(inputs), list(attrs))
    if DEVICE != "cpu":
        _C.synchronize(DEVICE)
    return out


def assert_close(actual, expected, dtype, rtol=None, atol=None, what=""):
    """Checks a native tensor (or array) against a float64 reference with the dtype's tolerances."""
    got = actual.numpy() if hasattr(actual, "numpy") else np.asarray(actual)
    got = got.astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    r, a = TOL[dtype]
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    assert not np.isnan(got).any() or np.isnan(expected).any(), f"{what}: NaN in output (unwritten element?)"
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=what)


def stat_dtype(dtype):
    """The dtype kernels keep statistics in (means, variances, log-sum-exps, optimizer moments)."""
    return "float64" if dtype == "float64" else "float32"


# ---- the train CLI in a child process ----


def child_env(**extra):
    """The environment of a child process: it imports what this process imports (the package and any provider
    modules), relative paths are its working directory's (not `bazel run`'s caller's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **extra)
    env.pop("BUILD_WORKING_DIRECTORY", None)
    return env


def run_train(*flags, nproc=1, device=DEVICE, check=True, cwd=None, env_extra=None, timeout=300, program=None):
    """The train CLI with `flags` on `device` (nproc > 1: that many processes under the launcher; program: a script
    that is the CLI, as tests/models/test_model_family.py, instead of the module); returns the CompletedProcess.
    check: a non-zero exit fails the test, with the output."""
    launcher = ["-m", "infinitrain.run", f"--nproc_per_node={nproc}", "--master_port=0"] if nproc > 1 else []
    entry = [program] if program else ["-m", "infinitrain.train"]
    cmd = [sys.executable, *launcher, *entry, f"--device={device}", *flags]
    env = child_env(**(env_extra or {}))
    if nproc > 1:
        env.setdefault("INFINITRAIN_CCL_TIMEOUT_S", "120")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    if check:
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]
    return p


Result = namedtuple("Result", "returncode stdout stderr")


def run_train_in_process(capsys, *flags, device=DEVICE):
    """The train CLI in this process (no interpreter start-up; a monkeypatch reaches it); returns a Result."""
    from infinitrain import train

    train.FLAGS.unparse_flags()
    saved, sys.argv = sys.argv, ["train", f"--device={device}", *flags]
    try:
        train.run()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
        train.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def stdout_queue(proc):
    """A queue of a child's stdout lines (None at the end), filled by a thread: reads wait with a timeout, so a
    child that hangs fails the test instead of hanging it."""
    if not hasattr(proc, "lines"):
        proc.lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                proc.lines.put(line)
            proc.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
    return proc.lines


STEP_LINE = re.compile(r"^step (\d+)/(\d+) \| train loss (\S+) \| lr (\S+) \| norm (\S+) \|")


def step_lines(stdout):
    """step -> (train loss, lr, norm), as the CLI printed them (strings: equal runs print equal digits)."""
    return {int(m.group(1)): m.group(3, 4, 5) for m in map(STEP_LINE.match, stdout.splitlines()) if m}


def train_losses(metrics_path):
    """The train losses of a metrics file's step records, in order."""
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r["train_loss"] for r in records if r.get("kind") == "step"]
