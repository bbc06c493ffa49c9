"""The op table is the single source: docs/ops.md matches it, every op has a CPU
kernel and a test that runs it, and schemas are well formed."""

import os
import re

from infinitrain import _C
from infinitrain.tools import opdoc

HERE = os.path.dirname(os.path.abspath(__file__))


def _repo_file(*parts):
    # Under Bazel the docs travel as data next to the tests; from a checkout they sit one level up.
    for base in (os.path.join(HERE, ".."), os.environ.get("TEST_SRCDIR", "") + "/infinitrain"):
        p = os.path.join(base, *parts)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(os.path.join(*parts))


def test_docs_match_table():
    with open(_repo_file("docs", "ops.md")) as f:
        assert f.read() == opdoc.render(), "docs/ops.md is stale: ./bazelw run //python:opdoc > docs/ops.md"


def test_every_op_has_a_cpu_kernel():
    missing = [o["name"] for o in _C.ops() if o["tier"] != "provider" and "cpu" not in o["kernels"]]
    assert not missing, f"ops without a CPU kernel: {missing}"


def test_every_op_is_exercised_by_a_test():
    text = ""
    for name in os.listdir(HERE):
        if name.startswith("test_") and name.endswith(".py") and name != "test_op_table.py":
            with open(os.path.join(HERE, name)) as f:
                text += f.read()
    untested = [o["name"] for o in _C.ops() if not re.search(r"[\"']" + re.escape(o["name"]) + r"[\"']", text)]
    assert not untested, f"ops that no test names: {untested}"


def test_schemas_are_well_formed():
    for o in _C.ops():
        assert o["tier"] in ("required", "fused", "provider"), o
        assert o["doc"], o["name"]
        assert o["schema"].startswith(o["name"] + "("), o
        for b in filter(None, o["backward"].split(", ")):
            _C.op(b)  # raises for a backward op that is not in the table
        # Every fused op has a composite, so every device can run it.
        assert o["tier"] != "fused" or o["composite"], o["name"]
