"""The op table is the single source: docs/ops.md matches it, every op has a CPU
kernel and a test that runs it, and schemas are well formed."""

import ast
import importlib.util
import inspect
import os
import re

from harness import repo_file
from infinitrain import _C
from infinitrain.tools import opdoc

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, whose folders hold the suites


def test_docs_match_table():
    with open(repo_file("docs/ops.md")) as f:
        assert f.read() == opdoc.render(), "docs/ops.md is stale: ./bazelw run //python:opdoc > docs/ops.md"


def test_every_op_has_a_cpu_kernel():
    missing = [o["name"] for o in _C.ops() if o["tier"] != "provider" and "cpu" not in o["kernels"]]
    assert not missing, f"ops without a CPU kernel: {missing}"


def test_every_op_is_exercised_by_a_test():
    text = ""
    for folder, _, files in os.walk(TESTS):
        for name in files:
            if name.startswith("test_") and name.endswith(".py") and name != "test_op_table.py":
                with open(os.path.join(folder, name)) as f:
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


# Every dtype the table can name; an op declaring "all" must be run in each.
EVERY_DTYPE = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
DTYPE_PARAMS = ("dtype", "src", "dst")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            yield from _strings(v)


def _param_sets(fn):
    """(argument names, values) of each parametrize mark of a test function."""
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        for value in mark.args[1]:
            if type(value).__name__ == "ParameterSet":  # pytest.param(...)
                values = value.values
            else:
                values = value if len(names) > 1 else (value,)
            yield names, values


def exercised_dtypes():
    """(op, dtype) pairs the op suites (the files running ops through harness.run) run: a test function runs the
    ops it names (in its body or its parameters) in the dtypes it is parametrized with, or in its module's DTYPES
    when it loops over them."""
    ops = {o["name"] for o in _C.ops()}
    seen = set()
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(TESTS) for n in names)
    for path in paths:
        name = os.path.basename(path)
        if not (name.startswith("test_") and name.endswith(".py")) or name == "test_op_table.py":
            continue
        with open(path) as f:
            if not re.search(r"^from harness import .*\brun\b", f.read(), re.M):
                continue  # not an op suite (they run ops through harness.run)
        spec = importlib.util.spec_from_file_location(f"_optable_{name[:-3]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for fname, fn in vars(module).items():
            if not fname.startswith("test_") or not callable(fn):
                continue
            source = inspect.getsource(fn)
            named, dtypes = set(), set()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ops:
                    named.add(node.value)
            for names, values in _param_sets(fn):
                for arg, value in zip(names, values, strict=True):
                    if arg in DTYPE_PARAMS:
                        dtypes.add(value)
                    named.update(s for s in _strings(value) if s in ops)
            if re.search(r"for dtype in DTYPES", source):
                dtypes.update(module.DTYPES)
            seen.update((o, d) for o in named for d in dtypes)
    return seen


def test_every_declared_dtype_is_exercised():
    """The op suites run every op in every dtype the table says it accepts (float16 included): dropping a dtype
    from a suite's list fails here."""
    seen = exercised_dtypes()
    missing = []
    for o in _C.ops():
        if o["tier"] == "provider":
            continue
        tokens = o["dtypes"].split()  # "all" stands for EVERY_DTYPE, beside any float8 dtypes named after it
        declared = [d for t in tokens for d in (EVERY_DTYPE if t == "all" else (t,))]
        missing += [f"{o['name']} {d}" for d in declared if (o["name"], d) not in seen]
    assert not missing, f"declared dtypes no op suite runs: {missing}"
