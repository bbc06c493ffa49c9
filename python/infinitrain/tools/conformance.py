"""Conformance report: every op in the op table, run on one device against float64 NumPy references.

    ./bazelw run //python:conformance -- --device=cpu --md_out=/tmp/conformance.md

For each op and dtype it records how the device runs the op (its own kernel, the Python composite,
the CPU fallback, or not at all) and the worst error as a ratio to the tests' tolerance for the
output's dtype: max |got - ref| / (atol + rtol * |ref|), <= 1 passes; bool and integer outputs must
match exactly. The input generators and references live in conformance_specs.py, one per op; an op
without a spec fails the report. Exit status 0 when every case passes, 1 otherwise.
"""

import json
import math
import os
import warnings
import zlib

import numpy as np
from absl import app, flags

from infinitrain import _C, dispatch
from infinitrain.tools import conformance_specs
from infinitrain.tools.conformance_specs import FLOAT8, FLOATS, round_to

# The tests' (rtol, atol) (tests/harness.py); dtypes missing here (bool, integers) compare exactly.
TOL = {
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
    "float64": (1e-10, 1e-12),
}
HOWS = ("native", "composite", "cpu-fallback", "missing")
_DTYPE_IDS = {
    d: i for i, d in enumerate(FLOATS + ("int64", "bool", "int32", "uint8", "int8", "float16") + tuple(FLOAT8))
}


def how_runs(name, device, prefer_composite=False):
    """(how, runner): how the dispatcher runs op `name` on the device, and a callable(inputs, attrs)
    that runs it so.

    prefer_composite runs an op's composite even where the device has a kernel: it checks the composites.
    """
    op = dispatch.op(name)
    if prefer_composite and op.info()["composite"]:
        return "composite", op.call_composite
    how = op.how(device)
    return how, (None if how == "missing" else op)


def case_dtypes(info, spec):
    """The float dtypes the table lists for the op, plus the spec's extra dtypes the op accepts."""
    listed = info["dtypes"].split()  # "all": every dtype but float8, which the table names after it
    accepts = lambda d: d in listed or ("all" in listed and d not in FLOAT8)  # noqa: E731
    extra = spec.extra if spec is not None else ()
    return [d for d in FLOATS + tuple(extra) if accepts(d)]


def _upload(a, dtype, device):
    carrier = np.float32 if dtype == "bfloat16" or dtype in FLOAT8 else np.bool_ if dtype == "bool" else np.dtype(dtype)
    return _C.from_numpy(np.array(a, dtype=carrier, order="C"), dtype, device)  # np.array keeps 0-d shapes


def _expected(e, case_dtype):
    """A spec's expected value as (float64-comparable array, dtype)."""
    if isinstance(e, tuple):
        return np.asarray(e[0]), e[1]
    e = np.asarray(e)
    if e.dtype == np.bool_:
        return e, "bool"
    if np.issubdtype(e.dtype, np.integer):
        return e, "int64"
    return e, case_dtype


def error(got, ref, rtol, atol):
    """(worst ratio |got - ref| / (atol + rtol |ref|), max abs error); NaN or inf matching the reference is exact."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.size == 0:
        return 0.0, 0.0
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(same, 0.0, np.abs(got - ref))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
        ratio = np.where(diff == 0, 0.0, diff / (atol + rtol * np.abs(ref)))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max()), float(diff.max())


def check(got, expected, case_dtype, names, device, rel16=None):
    """Compares output tensors with a spec's expected values: (worst ratio, max abs error, note). rel16: the
    spec's extra absolute tolerance for 16-bit outputs, as a fraction of the largest reference value."""
    if len(got) != len(expected):
        return math.inf, None, f"{len(got)} outputs, expected {len(expected)}"
    worst, max_abs, note = 0.0, 0.0, ""
    for i, (t, e) in enumerate(zip(got, expected, strict=True)):
        ref, dtype = _expected(e, case_dtype)
        name = _output_name(names, i)
        if t.dtype != dtype:
            return math.inf, None, f"{name}: dtype {t.dtype}, expected {dtype}"
        if t.device != device:
            return math.inf, None, f"{name}: on {t.device}, expected {device}"
        arr = t.numpy()
        if arr.shape != ref.shape:
            return math.inf, None, f"{name}: shape {arr.shape}, expected {ref.shape}"
        rtol, atol = TOL.get(dtype, (0.0, 0.0))
        if rel16 and dtype in rel16 and ref.size:
            atol = max(atol, rel16[dtype] * float(np.nanmax(np.abs(np.where(np.isfinite(ref), ref, 0.0)))))
        ratio, diff = error(arr, ref, rtol, atol)
        max_abs = max(max_abs, diff)
        if ratio > worst:
            worst = ratio
            note = f"worst: {name}" if len(got) > 1 else ""
    return worst, max_abs, note


def _output_name(names, i):
    """The table's name of output (or input) i; variadic ones ("outs...") are numbered."""
    last = len(names) - 1
    if names and names[-1].endswith("...") and i >= last:
        return f"{names[-1][:-3]}[{i - last}]"
    return names[i] if i < len(names) else f"output {i}"


def _names(csv):
    return [n.strip() for n in csv.split(",") if n.strip()]


def run_case(info, spec, dtype, device, runner, gen):
    """Runs one op/dtype case; returns (ratio, max_abs, note). Exceptions propagate."""
    inputs, attrs = spec.make(gen, dtype)
    host = [round_to(a, d) for a, d in inputs]
    tensors = [_upload(a, d, device) for a, (_, d) in zip(host, inputs, strict=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's once-per-op warning: the report says so already
        outs = runner(tensors, list(attrs))
    expected = spec.ref(host, attrs, dtype)
    written = dispatch.op(info["name"]).written(len(tensors))  # a written variadic input: each of its tensors
    if written:  # the outputs (if any) come first in the spec's expected values, then the written inputs
        inputs_named = _names(info["inputs"])
        names = _names(info["outputs"]) + [_output_name(inputs_named, i) for i in written]
        return check(list(outs) + [tensors[i] for i in written], expected, dtype, names, device, spec.rel16)
    return check(list(outs), expected, dtype, _names(info["outputs"]), device, spec.rel16)


def _status(ratio, tier, how):
    if not ratio <= 1.0:  # NaN fails too
        return "fail"
    # Required ops must run natively; right numbers through a fallback do not count.
    return "pass" if tier != "required" or how == "native" else "not-native"


def run(device="cpu", ops=None, seed=None, specs=None, prefer_composite=False):
    """Runs the conformance cases; returns the report (a dict, as written to --json_out)."""
    specs = conformance_specs.SPECS if specs is None else specs
    device = _C.parse_device(device)  # registers the provider a name like "sim:1" needs
    _C.set_poison_outputs(True)  # outputs start as NaN: an unwritten element fails
    if seed is None:
        seed = int(np.random.SeedSequence().entropy) % 2**63
    table = _C.ops()
    known = {o["name"] for o in table}
    if ops:
        unknown = sorted(set(ops) - known)
        if unknown:
            raise ValueError(f"unknown op(s) {', '.join(unknown)}; the op table has {len(known)} ops")
        table = [o for o in table if o["name"] in ops]
    dev_type = device.split(":")[0]
    records = []
    for info in table:
        name, spec = info["name"], specs.get(info["name"])
        how, runner = how_runs(name, device, prefer_composite)
        base = {"op": name, "tier": info["tier"], "how": how, "site": info["kernels"].get(dev_type)}
        if spec is None:
            # A provider's own op has no reference here: it is listed with how it runs.
            status, note = ("provider-op", info["schema"]) if info["tier"] == "provider" else ("no-spec", "no spec")
            records.append(dict(base, dtype="-", ratio=None, max_abs=None, status=status, note=note))
            continue
        for dtype in case_dtypes(info, spec):
            rec = dict(base, dtype=dtype, ratio=None, max_abs=None, note="")
            if runner is None:
                rec.update(status="missing", note=f"no kernel for {dev_type}, no composite, CPU fallback off")
            else:
                # Each case has its own stream: a --ops subset redraws the same inputs for the same seed.
                gen = np.random.default_rng([seed, zlib.crc32(name.encode()), _DTYPE_IDS.get(dtype, 99)])
                try:
                    ratio, max_abs, note = run_case(info, spec, dtype, device, runner, gen)
                    rec.update(ratio=ratio, max_abs=max_abs, note=note, status=_status(ratio, info["tier"], how))
                except Exception as e:  # a report row, not a crash
                    rec.update(status="error", note=f"{type(e).__name__}: {e}")
            records.append(rec)
    provider = _C.privateuse1()
    return {
        "device": device,
        "provider": provider["name"] if provider else None,
        "seed": seed,
        "stale_specs": sorted(set(specs) - known),
        "summary": summarize(records),
        "records": records,
    }


def summarize(records):
    ops = {r["op"] for r in records}
    count = {h: sum(r["how"] == h for r in records) for h in HOWS}
    by_status = {}
    for r in records:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    n_pass = by_status.get("pass", 0)
    n_listed = by_status.get("provider-op", 0)
    line = (
        f"{len(ops)} ops, {len(records)} op/dtype cases: {count['native']} native, {count['composite']} composite, "
        f"{count['cpu-fallback']} fallback, {count['missing']} missing; {n_pass} pass, "
        f"{len(records) - n_pass - n_listed} fail"
    )
    others = [f"{n} {s}" for s, n in sorted(by_status.items()) if s not in ("pass", "fail", "provider-op")]
    if n_listed:
        others.append(f"{n_listed} provider op(s) listed without a reference")
    if others:
        line += f" ({', '.join(others)})"
    return {
        "ops": len(ops),
        "cases": len(records),
        "how": count,
        "status": by_status,
        "ok": n_pass + n_listed == len(records),
        "line": line,
    }


def _fmt(x, spec):
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else "nan" if math.isnan(x) else format(x, spec)


COLUMNS = ("op", "tier", "dtype", "how", "worst error ratio", "max abs error", "status", "note")


def _rows(report):
    for r in report["records"]:
        yield (r["op"], r["tier"], r["dtype"], r["how"], _fmt(r["ratio"], ".3g"), _fmt(r["max_abs"], ".2e"),
               r["status"], r["note"])  # fmt: skip


def format_table(report):
    rows = [COLUMNS] + [tuple(str(c) for c in row) for row in _rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1] for row in rows]
    return "\n".join(line.rstrip() for line in lines)


LEGEND = (
    "*how*: native (the device's own kernel), composite (Python definition over required ops), cpu-fallback, "
    "missing. *worst error ratio*: max |got - ref| / (atol + rtol |ref|) against a float64 NumPy reference, "
    "with the tests' tolerance for each output's dtype; <= 1 passes, bool and integer outputs must match exactly. "
    "*not-native*: a required op that is right but not run by the device's own kernel. "
    "*provider-op*: an op the provider declared itself, listed with how it runs (no reference to check it against)."
)


def to_markdown(report):
    head = f"# Conformance report: {report['device']}"
    meta = f"provider: {report['provider'] or 'none'}, seed: {report['seed']}"
    lines = [head, "", meta, "", f"**{report['summary']['line']}**", ""]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in _rows(report):
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


def _json_safe(x):
    # JSON has no inf or NaN: write them as strings.
    return x if x is None or math.isfinite(x) else str(x)


def to_json(report):
    records = [dict(r, ratio=_json_safe(r["ratio"]), max_abs=_json_safe(r["max_abs"])) for r in report["records"]]
    return json.dumps(dict(report, records=records), indent=1) + "\n"


def _write(path, text):
    # `bazel run` starts in the runfiles tree: relative paths mean the caller's directory.
    path = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", ""), path)
    with open(path, "w") as f:
        f.write(text)
    return path


FLAGS = flags.FLAGS
flags.DEFINE_string("device", "cpu", "Device to check, e.g. cpu, sim, sim:1.")
flags.DEFINE_string("json_out", None, "Write the report as JSON to this path.")
flags.DEFINE_string("md_out", None, "Write the report as a Markdown table to this path.")
flags.DEFINE_integer("seed", None, "Seed of the random inputs (default: fresh; the report prints the one used).")
flags.DEFINE_list("ops", None, "Only these ops (comma-separated names).")
flags.DEFINE_bool("composites", False, "Run fused ops through their Python composites even where a kernel exists.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        report = run(FLAGS.device, ops=FLAGS.ops, seed=FLAGS.seed, prefer_composite=FLAGS.composites)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    print(f"device {report['device']}, provider {report['provider'] or 'none'}, seed {report['seed']}")
    print(format_table(report))
    if report["stale_specs"]:
        print(f"warning: specs for ops not in the table: {', '.join(report['stale_specs'])}")
    print(report["summary"]["line"])
    if FLAGS.json_out:
        print(f"wrote {_write(FLAGS.json_out, to_json(report))}")
    if FLAGS.md_out:
        print(f"wrote {_write(FLAGS.md_out, to_markdown(report))}")
    return 0 if report["summary"]["ok"] else 1


if __name__ == "__main__":
    app.run(main)
