"""Shared test harness: the device under test, tolerances, and float64 checks.

The device comes from INFINITRAIN_TEST_DEVICE (set by `--config=<provider>`),
"cpu" by default. Tolerances are the project's (docs/architecture.md); a test needing looser bounds
passes them explicitly and says why.
"""

import os

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
