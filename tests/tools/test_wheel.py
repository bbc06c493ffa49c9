"""The wheel (`./bazelw build //python:wheel`) installs with pip into a fresh virtual environment and works
there: the native core loads, ops agree with NumPy, and the provider of the build's config is included."""

import glob
import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest

from harness import DEVICE

_HERE = os.path.dirname(os.path.abspath(__file__))


def _wheel():
    # Under Bazel the wheel is a data dependency (runfiles: python/...); under plain pytest, bazel-bin's.
    for pattern in (
        "python/infinitrain-*.whl",
        os.path.join(_HERE, "..", "..", "bazel-bin", "python", "infinitrain-*.whl"),
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return os.path.abspath(found[-1])
    return None


@pytest.mark.skipif(_wheel() is None, reason="no wheel built (./bazelw build //python:wheel); Bazel's test has one")
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", _wheel()],
        check=True,
        timeout=300,
    )
    # Dependencies (numpy, absl-py, scipy-openblas32) from the project venv through a .pth: no network here.
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    rng = np.random.default_rng()
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    device = DEVICE if DEVICE in ("cpu", "sim") else "cpu"
    script = textwrap.dedent(
        f"""
        import json, numpy as np, infinitrain as it
        a, b = np.load("a.npy"), np.load("b.npy")
        x = it.from_numpy(a, dtype="float64", device="{device}")
        y = it.from_numpy(b, dtype="float64", device="{device}")
        print(json.dumps({{"file": it.__file__, "providers": it.backends.available(), "out": (x @ y).tolist()}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RUNFILES", "TEST_"))}
    p = subprocess.run([py, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(venv)), got["file"]  # the installed copy, not the source tree
    np.testing.assert_allclose(np.array(got["out"]), a @ b, rtol=1e-12, atol=1e-12)
    if DEVICE == "sim":
        assert got["providers"] == ["sim"]
    elif DEVICE == "cpu":
        assert got["providers"] == []
