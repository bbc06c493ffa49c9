"""pytest configuration shared by Bazel's py_test targets and plain pytest runs."""

import os
import sys
import tempfile

_here = os.path.dirname(os.path.abspath(__file__))
# Plain `pytest tests/` from a checkout: the package sources (with _C.so linked in by
# `./bazelw run //python:develop`) and this folder.
for p in (os.path.join(_here, "..", "python"), _here):
    if p not in sys.path:
        sys.path.insert(0, p)

# Train runs without --save or --metrics_file write their metrics under ./runs: keep tests' out of the checkout.
os.environ.setdefault("INFINITRAIN_RUNS_DIR", tempfile.mkdtemp(prefix="infinitrain-test-runs-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "network: needs the package registries (INFINITRAIN_NETWORK_TESTS=1)")
    config.addinivalue_line("markers", "hardware: needs a real accelerator")
