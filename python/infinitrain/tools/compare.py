"""Compares two training runs: per-step loss difference against the dtype's threshold (float32 1e-5,
bfloat16 1e-2), throughput ratio against a 20% threshold, and optionally the precision records (the first
module or op whose statistics part). Writes a Markdown summary and PNG plots; exits 1 when a check fails.

    python -m infinitrain.tools.compare RUN_A RUN_B --out=cmp          # run directories or metrics files
    python -m infinitrain.tools.compare --devices=cpu,sim:0 --out=cmp -- --num_iteration=50
    ./bazelw run //python:compare -- RUN_A RUN_B

With --devices it first trains the configuration after `--` once on each device (one after the other), each
run in <out>/A_<device>/ and <out>/B_<device>/, then compares them.
"""

import argparse
import math
import os
import subprocess
import sys

import numpy as np

from infinitrain.runs import precision, read_metrics

LOSS_TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2}
THROUGHPUT_TOLERANCE = 0.2
LOG_FLOOR = 1e-10  # zero differences are drawn here on the log scale
FIGSIZE, DPI = (8.0, 4.5), 100


class Run:
    def __init__(self, path, label=None):
        self.path = path
        self.config, steps = read_metrics(path)
        self.steps = sorted(steps)
        self.records = steps
        self.label = label or _label(path, self.config)
        self.dtype = (self.config.get("flags") or {}).get("dtype", "float32")

    def series(self, key, steps=None):
        steps = self.steps if steps is None else steps
        return np.array([self.records[s].get(key, np.nan) if s in self.records else np.nan for s in steps], float)


def _label(path, config):
    devices = ",".join(config.get("devices") or [])
    base = os.path.basename(os.path.normpath(path if os.path.isdir(path) else os.path.dirname(path) or path))
    return f"{base} ({devices})" if devices else base


def compare_runs(a, b, *, loss_tol=None, throughput_tol=THROUGHPUT_TOLERANCE, skip_steps=2):
    """The comparison as a dict (see summary_markdown for its use)."""
    dtypes = {a.dtype, b.dtype}
    if loss_tol is None:
        loss_tol = LOSS_TOLERANCE["bfloat16"] if "bfloat16" in dtypes else LOSS_TOLERANCE["float32"]
    steps = sorted(set(a.steps) & set(b.steps))
    if not steps:
        raise ValueError(f"{a.path} and {b.path} have no step in common")
    la, lb = a.series("train_loss", steps), b.series("train_loss", steps)
    diff = np.abs(la - lb)
    bad = [s for s, d in zip(steps, diff, strict=True) if not d <= loss_tol]  # NaN fails
    out = {"steps": steps, "loss_a": la, "loss_b": lb, "diff": diff, "loss_tol": loss_tol, "bad_steps": bad}
    out["loss_ok"] = not bad
    worst = int(np.nanargmax(diff)) if np.isfinite(diff).any() else 0
    out["worst"] = (steps[worst], float(diff[worst]))
    vsteps = [s for s in steps if "val_loss" in a.records[s] and "val_loss" in b.records[s]]
    va, vb = a.series("val_loss", vsteps), b.series("val_loss", vsteps)
    out.update(val_steps=vsteps, val_a=va, val_b=vb, val_diff=np.abs(va - vb))
    out["val_bad"] = [s for s, d in zip(vsteps, out["val_diff"], strict=True) if not d <= loss_tol]
    # Throughput: the median over steps after the first `skip_steps` (warm-up: allocation, caches).
    tsteps = [s for s in steps if s > skip_steps] or steps
    ta, tb = np.nanmedian(a.series("tokens_per_s", tsteps)), np.nanmedian(b.series("tokens_per_s", tsteps))
    ratio = float(tb / ta) if ta > 0 else math.nan
    out.update(tok_a=float(ta), tok_b=float(tb), ratio=ratio, throughput_tol=throughput_tol)
    out["throughput_ok"] = abs(ratio - 1.0) <= throughput_tol
    out["only_a"] = sorted(set(a.steps) - set(b.steps))
    out["only_b"] = sorted(set(b.steps) - set(a.steps))
    return out


def verdict_lines(a, b, r):
    """One line per check."""
    n = len(r["steps"])
    if r["loss_ok"]:
        s, d = r["worst"]
        loss = f"loss: PASS: {n} steps, max |diff| {d:.3g} at step {s} (threshold {r['loss_tol']:g})"
    else:
        s = r["bad_steps"][0]
        i = r["steps"].index(s)
        loss = (
            f"loss: FAIL at step {s}: |diff| {r['diff'][i]:.3g} > {r['loss_tol']:g} ({a.label} {r['loss_a'][i]:.6f}, "
            f"{b.label} {r['loss_b'][i]:.6f}); {len(r['bad_steps'])} of {n} steps beyond, max {r['worst'][1]:.3g} "
            f"at step {r['worst'][0]}"
        )
    lines = [loss]
    if r["val_steps"]:
        vmax = float(np.nanmax(r["val_diff"])) if np.isfinite(r["val_diff"]).any() else math.nan
        state = "PASS" if not r["val_bad"] else f"FAIL at step {r['val_bad'][0]}"
        lines.append(f"val loss: {state}: {len(r['val_steps'])} evaluations, max |diff| {vmax:.3g}")
    pct = (r["ratio"] - 1.0) * 100
    lines.append(
        f"throughput: {'PASS' if r['throughput_ok'] else 'FAIL'}: median {r['tok_a']:.0f} tok/s ({a.label}) vs "
        f"{r['tok_b']:.0f} ({b.label}): {b.label} is {abs(pct):.1f}% {'faster' if pct >= 0 else 'slower'} "
        f"(threshold {r['throughput_tol'] * 100:.0f}%)"
    )
    if r["only_a"] or r["only_b"]:
        lines.append(f"note: steps only in {a.label}: {len(r['only_a'])}, only in {b.label}: {len(r['only_b'])}")
    return lines


def summary_markdown(a, b, r, plots, prec=None, max_rows=60):
    cfg_a, cfg_b = a.config, b.config
    ok = r["loss_ok"] and not r["val_bad"] and r["throughput_ok"] and (prec is None or prec["first"] is None)
    lines = [f"# {a.label} vs {b.label}: {'PASS' if ok else 'FAIL'}", ""]
    lines += ["| | A | B |", "|---|---|---|", f"| run | `{a.path}` | `{b.path}` |"]
    for key, get in (
        ("devices", lambda c: ",".join(c.get("devices") or [])),
        ("model", lambda c: f"{c.get('model')} ({c.get('parameters', 0) / 1e6:.2f}M)"),
        ("dtype", lambda c: (c.get("flags") or {}).get("dtype")),
        ("tokens/step", lambda c: c.get("tokens_per_step")),
        ("steps", None),
    ):
        if get is None:
            lines.append(f"| steps | {len(a.steps)} | {len(b.steps)} |")
        else:
            lines.append(f"| {key} | {get(cfg_a)} | {get(cfg_b)} |")
    lines += ["", *[f"- {v}" for v in verdict_lines(a, b, r)]]
    if prec is not None:
        lines += [f"- {v}" for v in precision.format_divergence(prec, a.label, b.label).splitlines()]
    lines += ["", "Plots: " + ", ".join(f"[{os.path.basename(p)}]({os.path.basename(p)})" for p in plots), ""]
    steps = r["steps"]
    rows = list(range(len(steps)))
    if len(rows) > max_rows:  # evenly spread, plus the first failing step
        keep = set(np.linspace(0, len(rows) - 1, max_rows).round().astype(int).tolist())
        if r["bad_steps"]:
            keep.add(steps.index(r["bad_steps"][0]))
        rows = sorted(keep)
    lines += ["| step | loss A | loss B | abs diff | tok/s A | tok/s B |", "|---|---|---|---|---|---|"]
    ta, tb = a.series("tokens_per_s", steps), b.series("tokens_per_s", steps)
    for i in rows:
        flag = " **beyond**" if not r["diff"][i] <= r["loss_tol"] else ""
        lines.append(
            f"| {steps[i]} | {r['loss_a'][i]:.6f} | {r['loss_b'][i]:.6f} | {r['diff'][i]:.3g}{flag} | "
            f"{ta[i]:.0f} | {tb[i]:.0f} |"
        )
    return "\n".join(lines) + "\n", ok


def figures(a, b, r):
    """{file name: matplotlib Figure}: the loss curves overlaid (validation points too), their absolute
    difference on a log scale with the threshold, and tokens/s per step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    steps = np.array(r["steps"])
    figs = {}
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    ax.plot(steps, r["loss_a"], label=f"{a.label} train", linewidth=1.5)
    ax.plot(steps, r["loss_b"], label=f"{b.label} train", linewidth=1.0, linestyle="--")
    if r["val_steps"]:
        ax.plot(r["val_steps"], r["val_a"], "o", label=f"{a.label} val")
        ax.plot(r["val_steps"], r["val_b"], "x", label=f"{b.label} val")
    ax.set(xlabel="step", ylabel="loss", title="loss")
    ax.legend()
    ax.grid(alpha=0.3)
    figs["loss.png"] = fig

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    ax.plot(steps, np.maximum(r["diff"], LOG_FLOOR), label="|loss A - loss B|")
    ax.axhline(r["loss_tol"], color="red", linestyle=":", label=f"threshold {r['loss_tol']:g}")
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="absolute difference", title=f"loss difference (0 drawn at {LOG_FLOOR:g})")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    figs["loss_diff.png"] = fig

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot()
    ax.plot(steps, a.series("tokens_per_s", r["steps"]), label=a.label)
    ax.plot(steps, b.series("tokens_per_s", r["steps"]), label=b.label)
    ax.set(xlabel="step", ylabel="tokens/s", title=f"throughput ({b.label} / {a.label} = {r['ratio']:.2f})")
    ax.legend()
    ax.grid(alpha=0.3)
    figs["throughput.png"] = fig
    return figs


def compare(path_a, path_b, out, *, labels=(None, None), loss_tol=None, throughput_tol=THROUGHPUT_TOLERANCE,
            skip_steps=2, precision_paths=None, precision_tol=(None, None), quiet=False):  # fmt: skip
    """Compares two runs, writes <out>/compare.md and the PNGs; returns (ok, markdown)."""
    a, b = Run(path_a, labels[0]), Run(path_b, labels[1])
    if a.label == b.label:
        a.label, b.label = f"A: {a.label}", f"B: {b.label}"
    r = compare_runs(a, b, loss_tol=loss_tol, throughput_tol=throughput_tol, skip_steps=skip_steps)
    prec = None
    if precision_paths:
        prec = precision.first_divergence(*precision_paths, rtol=precision_tol[0], atol=precision_tol[1])
    os.makedirs(out, exist_ok=True)
    plots = []
    for name, fig in figures(a, b, r).items():
        path = os.path.join(out, name)
        fig.savefig(path)
        plots.append(path)
    md, ok = summary_markdown(a, b, r, plots, prec)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(md)
    if not quiet:
        for line in verdict_lines(a, b, r):
            print(line)
        if prec is not None:
            print(precision.format_divergence(prec, a.label, b.label))
        print(f"{'PASS' if ok else 'FAIL'}: summary {os.path.join(out, 'compare.md')}, plots {', '.join(plots)}")
    return ok, md


def _precision_path(run):
    d = run if os.path.isdir(run) else os.path.dirname(run)
    return precision.default_path(d or ".")


def train_on_devices(devices, train_flags, out, with_precision):
    """Trains the same configuration once per device, sequentially; returns the run directories."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    runs = []
    for which, device in zip("AB", devices, strict=True):
        run_dir = os.path.join(out, f"{which}_{device.replace(':', '_')}")
        os.makedirs(run_dir, exist_ok=True)
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)  # a fresh run, not appended to an old one
        cmd = [sys.executable, "-m", "infinitrain.train", *train_flags, f"--device={device}"]
        cmd += [f"--metrics_file={metrics}"]
        if with_precision:
            cmd.append(f"--precision_check=steps=1,output_path={_precision_path(run_dir)}")
        print(f"== training on {device}: {' '.join(cmd[3:])}", flush=True)
        with open(os.path.join(run_dir, "train.log"), "w") as log:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        if p.returncode != 0:
            tail = open(os.path.join(run_dir, "train.log")).read().strip().splitlines()[-1:]
            raise RuntimeError(f"training on {device} failed (exit {p.returncode}): {' '.join(tail)}")
        runs.append(run_dir)
    return runs


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    train_flags = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_flags = argv[:i], argv[i + 1 :]
    p = _Parser(prog="compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="two run directories (or metrics.jsonl files)")
    p.add_argument("--devices", default="", help="train the flags after -- on these two devices, then compare")
    p.add_argument("--out", default="", help="folder for compare.md and the PNGs (default: ./compare-<A>-<B>)")
    p.add_argument("--loss_tol", type=float, default=None, help="loss threshold (default: float32 1e-5, bf16 1e-2)")
    p.add_argument("--throughput_tol", type=float, default=THROUGHPUT_TOLERANCE, help="allowed throughput ratio gap")
    p.add_argument("--skip_steps", type=int, default=2, help="first steps left out of the throughput median")
    p.add_argument("--precision", action="store_true", help="also compare the runs' precision.jsonl records")
    p.add_argument("--precision_files", nargs=2, metavar=("A", "B"), help="compare these two precision records only")
    p.add_argument("--rtol", type=float, default=None, help="precision: tolerance relative to |max|")
    p.add_argument("--atol", type=float, default=None, help="precision: absolute tolerance")
    args = p.parse_args(argv)
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    try:
        if args.precision_files:
            result = precision.first_divergence(*args.precision_files, rtol=args.rtol, atol=args.atol)
            print(precision.format_divergence(result))
            return 0 if result["first"] is None else 1
        labels = (None, None)
        if args.devices:
            devices = [d for d in args.devices.split(",") if d]
            if len(devices) != 2 or args.runs:
                p.error("--devices takes two devices (e.g. cpu,sim:0) and no run directories")
            out = args.out or f"compare-{devices[0]}-{devices[1]}".replace(":", "_")
            runs = train_on_devices(devices, train_flags, out, args.precision)
            labels = tuple(devices)
        else:
            if len(args.runs) != 2:
                p.error("give two runs (directories or metrics files), or --devices=A,B -- <train flags>")
            if train_flags:
                p.error("train flags after -- go with --devices")
            runs = args.runs
            names = [os.path.basename(os.path.normpath(r)) for r in runs]
            out = args.out or f"compare-{names[0]}-{names[1]}"
        prec_paths = None
        if args.precision:
            prec_paths = [_precision_path(r) for r in runs]
            for path in prec_paths:
                if not os.path.exists(path):
                    raise ValueError(f"{path}: no precision record (train with --precision_check)")
        ok, _ = compare(
            runs[0], runs[1], out, labels=labels, loss_tol=args.loss_tol, throughput_tol=args.throughput_tol,
            skip_steps=args.skip_steps, precision_paths=prec_paths, precision_tol=(args.rtol, args.atol),
        )  # fmt: skip
        return 0 if ok else 1
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
