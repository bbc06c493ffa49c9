"""The GPU kernel mutant tool (tools/mutate/sample_gpu.py) without a GPU or a compiler: which translation units a
mutated file reaches through its includes, that every unit of backends/gpu maps to op suites that exist, how the
GPU machine's libraries are found, and the report from a run's results. The mutants themselves are sample_cc.py's
(tested in test_mutate_cc.py); compiling and running them is the tool's own long run.

The tool is read from the checkout this file lives in, as in test_mutate_cc.py."""

import importlib.util
import json
import os
import sys

import pytest

SAMPLE_GPU = os.path.join("tools", "mutate", "sample_gpu.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _load():
    if not os.path.isfile(os.path.join(ROOT, SAMPLE_GPU)):
        pytest.fail(f"{SAMPLE_GPU} is not beside this file's tests/ (in {ROOT})")
    sys.path.insert(0, os.path.join(ROOT, "tools", "mutate"))
    spec = importlib.util.spec_from_file_location("infinitrain_sample_gpu", os.path.join(ROOT, SAMPLE_GPU))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


G = _load()

SOURCES = {
    "backends/gpu/common.cuh": '#include "backends/gpu/vendor.h"\n',
    "backends/gpu/map.cuh": '#include "backends/gpu/common.cuh"\n',
    "backends/gpu/norm.cuh": '#include "backends/gpu/common.cuh"\n',
    "backends/gpu/ops_norm.cu": '#include "backends/gpu/norm.cuh"\n',
    "backends/gpu/ops_shape.cu": '#include "backends/gpu/map.cuh"\n// #include "backends/gpu/norm.cuh"\n',
}


def test_a_header_reaches_the_units_that_include_it():
    assert G.units_including("backends/gpu/norm.cuh", SOURCES) == ["ops_norm.cu"]
    assert G.units_including("backends/gpu/map.cuh", SOURCES) == ["ops_shape.cu"]
    assert G.units_including("backends/gpu/common.cuh", SOURCES) == ["ops_norm.cu", "ops_shape.cu"]
    assert G.units_including("backends/gpu/ops_norm.cu", SOURCES) == ["ops_norm.cu"]


def test_tests_of_units_are_their_suites_then_the_common_ones():
    assert G.tests_of(["ops_norm.cu"]) == ["ops/test_ops_norm.py", *G.COMMON]
    both = G.tests_of(["ops_index.cu", "device_error.cu"])
    assert both[: len(G.TU_TESTS["device_error.cu"])] == G.TU_TESTS["device_error.cu"]  # index's suite once
    assert len(both) == len(set(both))


def test_every_gpu_unit_has_tests_that_exist():
    folder = os.path.join(ROOT, G.KERNELS)
    units = sorted(f for f in os.listdir(folder) if f.endswith(".cu"))
    assert sorted(G.TU_TESTS) == units
    for unit, tests in G.TU_TESTS.items():
        for t in tests + G.COMMON:
            assert os.path.exists(os.path.join(ROOT, "tests", t)), (unit, t)
    sources = {f"{G.KERNELS}/{f}": open(os.path.join(folder, f)).read() for f in os.listdir(folder)}
    for path in sources:
        if path.endswith(".cuh"):
            assert G.units_including(path, sources), f"{path} is included by no unit: its mutants would test nothing"


def test_libraries_are_found_by_soname_in_the_first_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for name in G.LIBS:
        (b / f"lib{name}.so.9").write_text("")
    (a / "libnccl.so.2").write_text("")
    (a / "libnccl_static.a").write_text("")
    args = G.find_libs([str(a), str(b)])
    assert args[args.index("-l:libnccl.so.2") - 1] == f"-L{a}"
    assert "-l:libcudart.so.9" in args and len(args) == 2 * len(G.LIBS)
    (b / "libcudnn.so.9").unlink()
    with pytest.raises(SystemExit, match="libcudnn.so not found"):
        G.find_libs([str(a), str(b)])


def test_report_scores_the_runs_results(tmp_path):
    mutants = [
        {"id": f"backends/gpu/ops_norm.cu:{i}:4:+->-", "path": "backends/gpu/ops_norm.cu", "op": "operator",
         "line": i, "tests": ["ops/test_ops_norm.py"], "diff": "-a + b\n+a - b", "built": True}
        for i in range(1, 6)
    ]  # fmt: skip
    manifest = {"seed": 7, "rev": "abc1234", "total": 99, "files": 3, "kind": "CUDA", "mutants": mutants}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    got = ["killed", "survived", "timeout", "not run", "killed"]
    rows = [{"id": m["id"], "result": r, "secs": 1.0, "detail": ""} for m, r in zip(mutants, got, strict=True)]
    first = {"results": rows}
    second = {"results": [{"id": mutants[3]["id"], "result": "killed", "secs": 2.0, "detail": "FAILED x"}]}
    (tmp_path / "r1.json").write_text(json.dumps(first))
    (tmp_path / "r2.json").write_text(json.dumps(second))
    out = tmp_path / "report.json"
    args = ["report", f"--pack={tmp_path}", f"--results={tmp_path / 'r1.json'},{tmp_path / 'r2.json'}"]
    assert G.main(args + [f"--json_out={out}", f"--equivalent={mutants[1]['id']}"]) == 0
    rep = json.loads(out.read_text())
    assert [r["result"] for r in rep["results"]] == ["killed", "survived", "timeout", "killed", "killed"]
    assert rep["counts"]["killed"] == 3 and rep["counts"]["equivalent"] == 1
    assert rep["counts"]["score"] == pytest.approx(3 / 4)  # the equivalent survivor is not scored
