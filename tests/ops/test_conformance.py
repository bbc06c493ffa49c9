"""The conformance report on the device under test: every op has a spec, every case passes, required
ops run natively, the outputs parse, and the checks are live (a wrong reference or spec fails)."""

import json

import numpy as np
import pytest

from harness import DEVICE
from infinitrain import _C
from infinitrain.tools import conformance
from infinitrain.tools.conformance_specs import SPECS


@pytest.fixture(scope="module")
def report():
    return conformance.run(DEVICE)


def _describe(records):
    return "\n".join(
        f"{r['op']} {r['dtype']}: {r['status']} ({r['how']}, ratio {r['ratio']}) {r['note']}" for r in records
    )


def test_every_op_has_a_spec():
    names = {o["name"] for o in _C.ops()}
    assert sorted(names - set(SPECS)) == [], "ops without a conformance spec"
    assert sorted(set(SPECS) - names) == [], "specs for ops not in the table"


def test_every_case_passes(report):
    bad = [r for r in report["records"] if r["status"] != "pass"]
    assert not bad, _describe(bad)
    assert report["summary"]["ok"]
    assert report["device"] == _C.parse_device(DEVICE)
    provider = _C.privateuse1()
    assert report["provider"] == (provider["name"] if provider else None)


def test_required_ops_run_natively(report):
    required = {o["name"] for o in _C.ops() if o["tier"] == "required"}
    not_native = sorted({r["op"] for r in report["records"] if r["op"] in required and r["how"] != "native"})
    assert not not_native, f"required ops not native on {DEVICE}: {not_native}"


def test_covers_every_listed_float_dtype(report):
    cases = {(r["op"], r["dtype"]) for r in report["records"]}
    floats = ("float32", "bfloat16", "float16", "float64")
    for o in _C.ops():
        listed = o["dtypes"].split()
        listed = floats if "all" in listed else listed  # "all", and maybe float8 dtypes after it
        for d in floats:
            assert (d in listed) == ((o["name"], d) in cases), (o["name"], d)


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    json_out, md_out = tmp_path / "report.json", tmp_path / "report.md"
    argv = ["conformance", f"--device={DEVICE}", f"--json_out={json_out}", f"--md_out={md_out}"]
    conformance.FLAGS(argv + ["--ops=add,split,cross_entropy,adamw_", "--seed=11"])
    try:
        assert conformance.main(["conformance"]) == 0
    finally:
        conformance.FLAGS.unparse_flags()
    printed = capsys.readouterr().out
    data = json.loads(json_out.read_text())
    assert data["seed"] == 11 and data["device"] == _C.parse_device(DEVICE)
    assert {r["op"] for r in data["records"]} == {"add", "split", "cross_entropy", "adamw_"}
    assert data["summary"]["cases"] == len(data["records"]) == 4 + 6 + 4 + 4
    assert data["summary"]["line"] in printed
    rows = [line for line in md_out.read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(data["records"])  # header + one row per case
    assert all(len(row.strip("|").split(" | ")) == len(conformance.COLUMNS) for row in rows)
    assert data["summary"]["line"] in md_out.read_text()


def test_wrong_reference_fails(monkeypatch):
    spec = SPECS["add"]
    off = spec._replace(ref=lambda xs, at, d: [r + 1e-3 for r in spec.ref(xs, at, d)])
    monkeypatch.setitem(SPECS, "add", off)
    rep = conformance.run(DEVICE, ops=["add"])
    by_dtype = {r["dtype"]: r for r in rep["records"]}
    for d in ("float32", "float64"):  # 1e-3 is inside bfloat16's 1.6e-2
        assert by_dtype[d]["status"] == "fail" and by_dtype[d]["ratio"] > 10, by_dtype[d]
    assert not rep["summary"]["ok"]


def _perturbed(e):
    """Expected value e with one element off by far more than any tolerance (a flipped bool); empty: a wrong shape."""
    arr, dtype = e if isinstance(e, tuple) else (e, None)
    arr = np.array(arr, copy=True)
    if arr.size:
        i = arr.size - 1
        arr.flat[i] = (not arr.flat[i]) if arr.dtype == np.bool_ else arr.flat[i] + 1 + abs(arr.flat[i])
    else:
        arr = arr.reshape(arr.shape + (1,))
    return (arr, dtype) if dtype else arr


@pytest.mark.parametrize("op", sorted(SPECS))
def test_every_output_is_checked(op, monkeypatch):
    # One element of one expected output wrong: every case of the op must fail, for each output in turn.
    spec, outputs = SPECS[op], []

    def ref(k):
        def wrong(xs, at, d):
            expected = spec.ref(xs, at, d)
            outputs.append(len(expected))
            return [_perturbed(e) if i == k else e for i, e in enumerate(expected)]

        return wrong

    k = 0
    while True:
        monkeypatch.setitem(SPECS, op, spec._replace(ref=ref(k)))
        rep = conformance.run(DEVICE, ops=[op])
        if k >= max(outputs):
            break
        bad = [r for r in rep["records"] if r["status"] != "fail"]
        assert not bad, f"output {k} wrong, still:\n" + _describe(bad)
        k += 1


def test_missing_spec_is_a_failure(monkeypatch):
    monkeypatch.delitem(SPECS, "neg")
    rep = conformance.run(DEVICE, ops=["neg", "exp"])
    (neg,) = [r for r in rep["records"] if r["op"] == "neg"]
    assert neg["status"] == "no-spec"
    assert not rep["summary"]["ok"] and "1 no-spec" in rep["summary"]["line"]
    conformance.FLAGS(["conformance", f"--device={DEVICE}", "--ops=neg"])
    try:
        assert conformance.main(["conformance"]) == 1  # the command's exit status
    finally:
        conformance.FLAGS.unparse_flags()


def test_raising_op_is_an_error_row(monkeypatch):
    spec = SPECS["add"]
    bad = spec._replace(make=lambda gen, d: ([(np.ones((3, 4)), d), (np.ones(5), d)], []))
    monkeypatch.setitem(SPECS, "add", bad)
    rep = conformance.run(DEVICE, ops=["add"])
    assert all(r["status"] == "error" and "cannot be broadcast" in r["note"] for r in rep["records"])
    assert not rep["summary"]["ok"]


def test_how_classification(monkeypatch):
    # How each op runs is the dispatcher's answer; here it is replaced to check the report's statuses.
    hows = {"swiglu": "missing", "add": "missing", "mul": "native"}
    real = conformance.how_runs

    def fake(name, device, prefer_composite=False):
        how = hows[name]
        return how, (None if how == "missing" else _C.op(name))

    monkeypatch.setattr(conformance, "how_runs", fake)
    rep = conformance.run(DEVICE, ops=["swiglu", "add", "mul"])
    how = {r["op"]: (r["how"], r["status"]) for r in rep["records"]}
    assert how == {"swiglu": ("missing", "missing"), "add": ("missing", "missing"), "mul": ("native", "pass")}
    assert "0 composite, 0 fallback, 8 missing" in rep["summary"]["line"]

    # A fused op may run as a composite; a required one must be native, right numbers or not.
    hows.update(swiglu="composite", add="composite")
    rep = conformance.run(DEVICE, ops=["swiglu", "add"])
    how = {r["op"]: (r["how"], r["status"]) for r in rep["records"]}
    assert how == {"swiglu": ("composite", "pass"), "add": ("composite", "not-native")}

    hows.update(swiglu="cpu-fallback")
    rep = conformance.run(DEVICE, ops=["swiglu"])
    assert {(r["how"], r["status"]) for r in rep["records"]} == {("cpu-fallback", "pass")}
    assert real("mul", DEVICE)[0] == "native"


def test_seeded_runs_repeat():
    # A seed fixes every case's inputs, whatever subset of ops runs.
    a = conformance.run(DEVICE, ops=["exp", "normal_"], seed=1234)
    b = conformance.run(DEVICE, ops=["normal_"], seed=1234)
    ratios = lambda rep, op: [r["ratio"] for r in rep["records"] if r["op"] == op]  # noqa: E731
    assert ratios(a, "normal_") == ratios(b, "normal_")
    assert a["seed"] == 1234


def test_composites_flag_runs_the_composites():
    fused = sorted(o["name"] for o in _C.ops() if o["tier"] == "fused")
    rep = conformance.run(DEVICE, ops=fused, prefer_composite=True)
    assert {r["op"] for r in rep["records"] if r["how"] == "composite"} == set(fused)
    # Composites compute bfloat16 in float32, as the kernels do, so every dtype meets the same tolerances.
    bad = [r for r in rep["records"] if r["status"] != "pass"]
    assert not bad, _describe(bad)
