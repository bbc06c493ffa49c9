"""Runs a model-parallel run matrix (a JSON file of train CLI runs) under the launcher and compares each run's
loss curve with the single-device run of the same model and dtype; prints a table, exits 1 if any run differs
by more than its dtype's tolerance.

    python -m infinitrain.tools.run_matrix --matrix=examples/parallel/run_matrix.json [--only=tp4] [--device=cpu]

The file: "flags" (every run's), "models" (flags per model), "steps", "tolerance" {dtype: max |difference|},
"runs" [{"name", "nproc", "flags", "reference_flags"}], each run for every model in "models_per_run" and dtype in
"dtypes_per_run" (a run may narrow them with its own "models"/"dtypes"). reference_flags go to the run and to its
single-device reference (a run's flags come last and win: a data-parallel run's reference has the global batch).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np


def _train(cmd_prefix, flags, metrics, cwd, timeout):
    cmd = [*cmd_prefix, "-m", "infinitrain.train", *flags, f"--metrics_file={metrics}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
        return None, " | ".join(tail)
    with open(metrics) as f:
        steps = [json.loads(line) for line in f]
    return [r["train_loss"] for r in steps if r.get("kind") == "step"], ""


def expand(matrix, only=None, dtypes=None, models=None):
    """(run name, model, dtype, nproc, reference flags, flags) of every run of the matrix."""
    out = []
    for run in matrix["runs"]:
        if only and not re.search(only, run["name"]):
            continue
        for model in run.get("models", matrix.get("models_per_run", list(matrix["models"]))):
            for dtype in run.get("dtypes", matrix.get("dtypes_per_run", ["float32"])):
                if (dtypes and dtype not in dtypes) or (models and model not in models):
                    continue
                ref = list(run.get("reference_flags", []))
                out.append((run["name"], model, dtype, int(run["nproc"]), ref, list(run["flags"])))
    return out


def run_matrix(matrix, data, device="cpu", only=None, workdir=None, timeout=600, out=sys.stdout, dtypes=None,
               models=None):  # fmt: skip
    """Runs the matrix on the token file `data`; returns the rows [(name, model, dtype, nproc, max diff, tol,
    ok, note)]."""
    workdir = workdir or tempfile.mkdtemp(prefix="run-matrix-")
    steps = int(matrix.get("steps", 10))
    common = [*matrix.get("flags", []), f"--num_iteration={steps}", f"--input_bin={data}", f"--device={device}"]
    refs, rows = {}, []
    for name, model, dtype, nproc, ref_flags, flags in expand(matrix, only, dtypes, models):
        base = [*common, *matrix["models"][model], f"--dtype={dtype}", *ref_flags]
        key = (model, dtype, tuple(ref_flags))
        if key not in refs:
            metrics = os.path.join(workdir, f"ref-{model}-{dtype}-{len(refs)}.jsonl")
            refs[key] = _train([sys.executable], base, metrics, workdir, timeout)
        ref, why = refs[key]
        tol = float(matrix["tolerance"][dtype])
        t0 = time.time()
        if ref is None:
            rows.append((name, model, dtype, nproc, float("nan"), tol, False, f"the single-device run failed: {why}"))
            continue
        launcher = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={nproc}", "--master_port=0"]
        metrics = os.path.join(workdir, f"{name}-{model}-{dtype}.jsonl")
        got, why = _train(launcher, [*base, *flags], metrics, workdir, timeout)
        if got is None or len(got) != len(ref):
            rows.append((name, model, dtype, nproc, float("nan"), tol, False, why or f"{len(got)} steps"))
        else:
            diff = float(np.max(np.abs(np.asarray(got) - np.asarray(ref))))
            rows.append((name, model, dtype, nproc, diff, tol, diff <= tol, f"{time.time() - t0:.1f} s"))
        print(_row(rows[-1]), file=out, flush=True)
    return rows


def _row(r):
    name, model, dtype, nproc, diff, tol, ok, note = r
    verdict = "ok" if ok else "FAIL"
    return f"| {name:<22} | {model:<6} | {dtype:<8} | {nproc:>5} | {diff:>9.2e} | {tol:>7.0e} | {verdict:<4} | {note}"


HEADER = (
    "| run                    | model  | dtype    | procs | max diff  |  tol    |      |\n"
    "|------------------------|--------|----------|-------|-----------|---------|------|"
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", required=True, help="the run matrix JSON file")
    ap.add_argument("--input_bin", default="", help="token file to train on (default: a generated repeating one)")
    ap.add_argument("--device", default="cpu", help="device type of every process (cpu, sim, cuda)")
    ap.add_argument("--only", default="", help="run only runs whose name matches this regular expression")
    ap.add_argument("--dtypes", default="", help="only these dtypes (comma-separated)")
    ap.add_argument("--models", default="", help="only these models (comma-separated)")
    ap.add_argument("--workdir", default="", help="where metrics go (default: a temporary directory)")
    args = ap.parse_args(argv)
    with open(args.matrix) as f:
        matrix = json.load(f)
    workdir = args.workdir or tempfile.mkdtemp(prefix="run-matrix-")
    os.makedirs(workdir, exist_ok=True)
    data = args.input_bin
    if not data:
        from infinitrain.data.tokens import write_tokens

        data = os.path.join(workdir, "train.bin")
        write_tokens(data, np.tile(np.random.default_rng(0).integers(0, 60, 37), 300))
    print(HEADER, flush=True)
    split = lambda v: [x for x in v.split(",") if x] or None  # noqa: E731
    rows = run_matrix(matrix, os.path.abspath(data), args.device, args.only or None, workdir,
                      dtypes=split(args.dtypes), models=split(args.models))  # fmt: skip
    bad = [r for r in rows if not r[6]]
    print(f"{len(rows) - len(bad)} of {len(rows)} runs equal the single-device curve")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
