"""pytest configuration shared by Bazel's py_test targets and plain pytest runs."""

import os
import sys
import tempfile

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
# Plain `pytest tests/` from a checkout: the package sources (with _C.so linked in by
# `./bazelw run //python:develop`) and this folder.
for p in (os.path.join(_here, "..", "python"), _here):
    if p not in sys.path:
        sys.path.insert(0, p)

# Train runs without --save or --metrics_file write their metrics under ./runs: keep tests' out of the checkout.
os.environ.setdefault("INFINITRAIN_RUNS_DIR", tempfile.mkdtemp(prefix="infinitrain-test-runs-"))


@pytest.fixture
def run_train():
    """The train CLI in a child process: run_train(*flags, nproc=1, device=DEVICE, check=True, cwd=None, ...) ->
    CompletedProcess (harness.run_train; tests that call it from helpers import it from there)."""
    import harness

    return harness.run_train


def pytest_configure(config):
    config.addinivalue_line("markers", "network: needs the package registries (INFINITRAIN_NETWORK_TESTS=1)")
    config.addinivalue_line("markers", "hardware: needs a real accelerator")
    config.addinivalue_line("markers", "shard_by(param): tests sharing this parameter's value run in one shard")


def _shard_group(item):
    """Tests of one group run in the same shard: those sharing a module fixture's expensive work (the marker
    names the parameter it depends on), else each test alone."""
    mark = item.get_closest_marker("shard_by")
    callspec = getattr(item, "callspec", None)
    if mark is not None and callspec is not None and mark.args[0] in callspec.params:
        return f"{mark.args[0]}={callspec.params[mark.args[0]]}"
    return item.nodeid


def pytest_collection_modifyitems(config, items):
    """Bazel's test sharding (shard_count): this shard runs every TEST_TOTAL_SHARDS-th group of tests."""
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total <= 1:
        return
    index = int(os.environ["TEST_SHARD_INDEX"])
    if os.environ.get("TEST_SHARD_STATUS_FILE"):
        open(os.environ["TEST_SHARD_STATUS_FILE"], "a").close()  # tells Bazel the runner shards
    groups = list(dict.fromkeys(_shard_group(i) for i in items))
    mine = set(groups[index::total])
    keep = [i for i in items if _shard_group(i) in mine]
    config.hook.pytest_deselected(items=[i for i in items if _shard_group(i) not in mine])
    items[:] = keep
