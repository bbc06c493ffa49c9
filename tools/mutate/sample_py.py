"""Generated mutation sample over the Python layer: enumerates every mutant that cosmic-ray's operators make in the
.py files of python/infinitrain, runs a seeded random sample of them one at a time against the tests of each
mutant's area, and reports which ones the tests killed. The bugs are the generator's, not hand-picked.

    .venv/bin/python tools/mutate/sample_py.py --seed=20261205 --count=300 --md_out=/tmp/m.md --json_out=/tmp/m.json
    .venv/bin/python tools/mutate/sample_py.py --list                     # the mutant count per file
    .venv/bin/python tools/mutate/sample_py.py --dry_run                  # the sample and each one's tests
    .venv/bin/python tools/mutate/sample_py.py --only_files=optim/lr_scheduler.py --count=20
    .venv/bin/python tools/mutate/sample_py.py --ids=python/infinitrain/tools/compare.py:ReplaceOrWithAnd:9

Mutants are enumerated from the committed files (git HEAD, read-only), so a seed names the same sample for a
commit whatever else is being edited; a sampled mutant whose file differs from HEAD in the working tree is reported
as skipped, not applied. A mutant is (file, operator, occurrence): cosmic_ray.mutating.mutate_code makes it. The
file is edited in place and restored afterwards, also on Ctrl-C, SIGTERM or an error. The tests of its area (AREAS:
the longest matching source prefix) run from tests/ as `pytest -x -q -p no:cacheprovider` in one process, under
--timeout_factor times the area's baseline time (at least 60 s, at most --timeout). The baseline runs each area's
tests once unmutated (unless --no_baseline); tests failing there are deselected for its mutants. Killed: a test
failed. Survived: every test passed. Timed out: counted apart, and not as killed (a mutant that loops forever is
caught, one that only slows the suite is not). Errored: the area's tests cannot run unmutated, or pytest could not
run. Score: killed / (run - equivalent), the equivalent mutants being those listed in --equivalent (ids judged by
reading the diff). The sample runs in its random order and the reports are rewritten after every mutant, so an
interrupted run still leaves a report of a random part of the sample.
"""

import argparse
import atexit
import difflib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = "python/infinitrain"
# Files not worth mutating: data tables rather than logic (the PyTorch name list, the conformance op specs).
EXCLUDE = ("python/infinitrain/tools/pytorch_api.py", "python/infinitrain/tools/conformance_specs.py")
# Operators that need arguments from a config (cosmic-ray makes none of them without one) are left out.

# Source prefix (relative to python/infinitrain/) -> the tests that should notice a bug there; the longest prefix
# wins. Areas are the suites a developer runs for that code, kept to files where a folder's suite is long.
AREAS = {
    "": ["core"],  # the tensor layer's top-level modules
    "__init__.py": ["core"],
    "accelerator.py": ["runtime"],
    "backends.py": ["runtime"],
    "runtime.py": ["runtime"],
    "amp.py": ["train/test_precision.py", "core/test_nn_layers.py", "core/test_amp_edges.py"],
    "autograd.py": ["core/test_autograd.py", "core/test_option_effects.py"],
    "checkpoint.py": ["io/test_checkpoint_io.py"],
    "serialization.py": ["io/test_checkpoint_io.py"],
    "compiler.py": ["core/test_compile.py"],
    "composites.py": ["ops/test_composites.py", "core/test_autograd.py"],
    "dispatch.py": ["core", "ops/test_op_table.py"],
    "dtypes.py": ["core", "ops/test_ops_copy.py"],
    "functional.py": [
        "core/test_torch_functions.py",
        "core/test_nn_layers.py",
        "core/test_autograd.py",
        "core/test_option_effects.py",
    ],
    "fp8.py": ["ops/test_fp8.py", "train/test_fp8_train.py"],
    "fusion.py": ["core/test_compile.py", "core/test_nn_layers.py"],
    "ops.py": ["core", "ops/test_op_table.py"],
    "profiler.py": ["train/test_profiler.py"],
    "random.py": ["ops/test_ops_random.py", "core"],
    "tensor.py": ["core"],
    "tensor_methods.py": ["core"],
    "tensor_ops.py": ["core"],
    "data/": ["io"],
    "distributed/": ["distributed"],
    "run.py": ["distributed"],
    "models/": ["models"],
    "models/lora.py": ["models/test_lora.py"],
    "models/moe.py": ["models/test_moe.py", "ops/test_ops_moe.py", "models/test_hf_edge_options.py"],
    "models/mixtral.py": ["models/test_moe.py", "models/test_model_family.py", "models/test_hf_edge_options.py"],
    "models/hf.py": ["models/test_hf_models.py", "models/test_hf_bounded.py", "models/test_hf_edge_options.py"],
    "nn/": ["core"],
    "optim/": ["core/test_nn_optim.py", "core/test_optim_schedules.py", "core/test_option_effects.py"],
    "parallel/": ["distributed/test_parallel.py", "distributed/test_parallel_cli.py"],
    "runs/": ["train", "tools/test_compare.py"],
    "runs/precision.py": ["train/test_precision.py"],
    "tools/": ["tools"],
    "tools/compare.py": ["tools/test_compare.py", "tools/test_compare_precision_paths.py"],
    "tools/conformance.py": ["ops/test_conformance.py", "ops/test_conformance_names.py"],
    "training/": ["train"],
    "train.py": ["train"],
    "utils/": ["io/test_utils_data.py", "io/test_data.py", "io/test_loader_edge_states.py"],
}

_restore = {}  # path -> (original text, mutated text), while mutated


def restore_all():
    """Puts every mutated file back; a file someone else changed meanwhile is not overwritten (said loudly)."""
    for path, (text, mutated) in list(_restore.items()):
        with open(path) as f:
            now = f.read()
        if now in (mutated, text):
            with open(path, "w") as f:
                f.write(text)
            _drop_bytecode(path)
        else:
            print(f"!!! {path} changed while mutated: left as it is; its original is in {path}.unmutated", flush=True)
            with open(path + ".unmutated", "w") as f:
                f.write(text)
        del _restore[path]


def _on_signal(signum, frame):
    restore_all()
    raise SystemExit(128 + signum)


def operators():
    """[(name, instance)] of cosmic-ray's operators that take no arguments, in its order."""
    import cosmic_ray.plugins

    out = []
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():
            out.append((name, cls()))
    return out


def committed_sources(root=ROOT, rev="HEAD", pkg=PKG):
    """{path: text} of the .py files under pkg at rev (git read-only)."""
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "--", pkg], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    out = {}
    for name in sorted(n for n in names if n.endswith(".py") and n not in EXCLUDE):
        out[name] = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
    return out


def enumerate_mutants(sources, ops=None):
    """Every mutant of sources ({path: text}), in a fixed order: [{"id", "path", "op", "occurrence", "line"}]."""
    from cosmic_ray.ast import ast_nodes, get_ast

    ops = ops if ops is not None else operators()
    out = []
    for path in sorted(sources):
        nodes = list(ast_nodes(get_ast(sources[path])))
        for name, op in ops:
            occurrence = 0
            for node in nodes:
                for start, _ in op.mutation_positions(node):
                    mid = f"{path}:{name.split('/')[-1]}:{occurrence}"
                    out.append({"id": mid, "path": path, "op": name, "occurrence": occurrence, "line": start[0]})
                    occurrence += 1
    return out


def sample(mutants, seed, count):
    """A seeded sample in random order (the same seed and tree give the same list), so that the first N run of an
    interrupted run are themselves a random sample of the whole."""
    picked = random.Random(seed).sample(range(len(mutants)), min(count, len(mutants)))
    return [mutants[i] for i in picked]


def choose(mutants, seed, count, ids=""):
    """The seeded sample of mutants, or those named by ids (comma-separated, a rerun); unknown ids: ValueError."""
    if not ids:
        return sample(mutants, seed, count)
    by_id = {m["id"]: m for m in mutants}
    unknown = [i for i in ids.split(",") if i not in by_id]
    if unknown:
        raise ValueError(f"--ids: no such mutant: {unknown}")
    return [by_id[i] for i in ids.split(",")]


def mutated_text(text, m, ops=None):
    """The mutant m of text (None: the operator makes no mutation at that occurrence)."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    op = dict(ops)[m["op"]] if ops else cosmic_ray.plugins.get_operator(m["op"])()
    return mutate_code(text, op, m["occurrence"])


def diff_of(text, new, path):
    lines = difflib.unified_diff(text.splitlines(), new.splitlines(), f"a/{path}", f"b/{path}", lineterm="", n=1)
    return "\n".join(list(lines)[2:])  # without the ---/+++ header: the path is reported beside it


def apply(root, m, committed):
    """Mutates m's file in place (restored by restore_all); returns (diff, None) or (None, why not)."""
    path = os.path.join(root, m["path"])
    with open(path) as f:
        text = f.read()
    if text != committed:
        return None, "file differs from HEAD in the working tree"
    new = mutated_text(text, m)
    if new is None or new == text:
        return None, "the operator makes no change here"
    _restore[path] = (text, new)
    with open(path, "w") as f:
        f.write(new)
    _drop_bytecode(path)
    return diff_of(text, new, m["path"]), None


def _drop_bytecode(path):
    """Removes the file's cached bytecode: a mutant of the same length written within the second of the last
    compile would otherwise run as the cached original (CPython checks the source's size and whole-second mtime)."""
    try:
        os.remove(importlib.util.cache_from_source(path))
    except (FileNotFoundError, NotImplementedError, ValueError):
        pass


def area_tests(path, tests_root):
    """The test paths (relative to tests/) of the source file path, those that exist."""
    rel = os.path.relpath(path, PKG)
    keys = [k for k in AREAS if rel == k or (k.endswith("/") and rel.startswith(k)) or k == ""]
    best = max(keys, key=len)
    return [t for t in AREAS[best] if os.path.exists(os.path.join(tests_root, t))]


def failed_ids(out):
    """The node ids pytest's short summary names as failed or errored."""
    ids = []
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            ids.append(line.split(" ", 1)[1].split(" - ", 1)[0].strip())
    return ids


def run_pytest(tests, tests_root, env, timeout, log, stop_first=True, deselect=()):
    """('pass' | 'fail' | 'timeout' | 'error', seconds, detail, output) of one pytest process in tests_root."""
    cmd = [sys.executable, "-m", "pytest", *(["-x"] if stop_first else []), "-q", "-p", "no:cacheprovider", *tests]
    cmd += [f"--deselect={t}" for t in deselect]
    t0 = time.time()
    p = subprocess.Popen(
        cmd,
        cwd=tests_root,
        env=dict(env, PYTHONDONTWRITEBYTECODE="1"),  # no mutant's bytecode is left for a later run
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the whole group: training children too
        out, _ = p.communicate()
        status = "timeout"
    secs = time.time() - t0
    if log:
        log.write(f"$ cd {tests_root} && {' '.join(cmd)}\n{out}\n")
        log.flush()
    if status == "timeout":
        return "timeout", secs, f"timed out after {timeout:.0f} s", out
    if status == 0:
        return "pass", secs, "", out
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if status == 1 or failed:
        return "fail", secs, failed[0] if failed else f"pytest exit {status}", out
    return "error", secs, f"pytest exit {status}: {out.strip().splitlines()[-1] if out.strip() else ''}", out


def run_baseline(tests, tests_root, env, timeout, log):
    """(why the area cannot be used or None, its tests failing unmutated, seconds) of the area's tests on the
    unmutated tree. Tests that already fail (work in progress elsewhere) are deselected for its mutants, said in the
    report, rather than counted as kills."""
    status, secs, detail, out = run_pytest(tests, tests_root, env, timeout, log, stop_first=False)
    failing = failed_ids(out) if status == "fail" else []
    print(f"baseline {' '.join(tests)}: {status} in {secs:.0f} s; failing unmutated: {failing}", flush=True)
    if status == "pass" or (status == "fail" and failing):
        return None, failing, secs
    return f"the area's tests do not run unmutated ({status}): {detail}", [], secs


def run_one(m, root, committed, tests, tests_root, env, timeout, log, deselect=(), why=None):
    """Applies mutant m under root, runs its tests, restores the file; returns its result record."""
    res = {**m, "tests": list(tests), "deselected": list(deselect), "diff": "", "secs": 0.0}
    if why:
        res.update(result="error", detail=why)
        return res
    try:
        diff, why = apply(root, m, committed)
        if why:
            res.update(result="skipped", detail=why)
            return res
        res["diff"] = diff
        status, res["secs"], detail, _ = run_pytest(tests, tests_root, env, timeout, log, deselect=deselect)
    finally:
        restore_all()
    result = {"pass": "survived", "fail": "killed", "timeout": "timeout", "error": "error"}[status]
    res.update(result=result, detail=detail)
    return res


def summary(results, equivalent):
    n = {k: sum(r["result"] == k for r in results) for k in ("killed", "survived", "timeout", "error", "skipped")}
    eq = sum(r["result"] == "survived" and r["id"] in equivalent for r in results)
    scored = n["killed"] + n["survived"] + n["timeout"] - eq
    n.update(equivalent=eq, score=n["killed"] / scored if scored else 0.0)
    return n


def write_reports(a, meta, results, equivalent):
    s = summary(results, equivalent)
    line = (
        f"score {s['score']:.1%} = {s['killed']} killed / ({len(results) - s['skipped'] - s['error']} run - "
        f"{s['equivalent']} equivalent); {s['survived']} survived, {s['timeout']} timed out, {s['error']} errored, "
        f"{s['skipped']} skipped; {len(results)} of {meta['sampled']} sampled from {meta['total']} mutants"
    )
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({**meta, "summary": line, "counts": s, "results": results}, f, indent=1)
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(f"# {meta.get('kind', 'Python')} mutation sample (seed {a.seed}, {meta['rev']})\n\n{line}\n\n")
            f.write("| mutant | line | result | seconds | detail |\n|---|---|---|---|---|\n")
            for r in results:
                f.write(
                    f"| {r['id']} | {r['line']} | {r['result']} | {r['secs']:.0f} | {r['detail'].replace('|', '/')} |\n"
                )
            surv = [r for r in results if r["result"] == "survived"]
            if surv:
                f.write("\n## Survivors\n")
            for r in surv:
                eq = " (judged equivalent)" if r["id"] in equivalent else ""
                f.write(f"\n### {r['path']}:{r['line']} {r['op']}{eq}\n\nRan: {' '.join(r['tests'])}\n\n")
                f.write(f"```diff\n{r['diff']}\n```\n")
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--only_files", default="", help="comma-separated paths under python/infinitrain/ to draw from")
    ap.add_argument("--ids", default="", help="comma-separated mutant ids to run instead of a sample (a rerun)")
    ap.add_argument("--list", action="store_true", help="print the mutant count per file and exit")
    ap.add_argument("--dry_run", action="store_true", help="print the sample and each one's tests; run nothing")
    ap.add_argument("--timeout", type=float, default=600, help="seconds at most of a pytest run (baselines too)")
    ap.add_argument(
        "--timeout_factor", type=float, default=3.0, help="a mutant's limit: this times its area's baseline (>= 60 s)"
    )
    ap.add_argument("--no_baseline", action="store_true", help="do not run each area's tests unmutated first")
    ap.add_argument("--equivalent", default="", help="comma-separated mutant ids judged equivalent (not scored)")
    ap.add_argument("--rev", default="HEAD", help="the commit whose files the mutants are enumerated from")
    ap.add_argument("--json_out", default="")
    ap.add_argument("--md_out", default="")
    ap.add_argument("--log", default="/tmp/infinitrain-mutate-py.log")
    a = ap.parse_args(argv)

    sources = committed_sources(ROOT, a.rev)
    if a.only_files:
        want = {os.path.join(PKG, p) for p in a.only_files.split(",")}
        missing = want - set(sources)
        if missing:
            print(f"--only_files: not committed .py files of the package: {sorted(missing)}", file=sys.stderr)
            return 2
        sources = {p: t for p, t in sources.items() if p in want}
    mutants = enumerate_mutants(sources)
    if a.list:
        per = {}
        for m in mutants:
            per[m["path"]] = per.get(m["path"], 0) + 1
        for p, n in sorted(per.items()):
            print(f"{n:6d} {p}")
        print(f"{len(mutants):6d} mutants in {len(sources)} files")
        return 0
    try:
        picked = choose(mutants, a.seed, a.count, a.ids)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    tests_root = os.path.join(ROOT, "tests")
    rev = subprocess.run(["git", "rev-parse", "--short", a.rev], cwd=ROOT, capture_output=True, text=True).stdout
    meta = {"seed": a.seed, "rev": rev.strip(), "total": len(mutants), "sampled": len(picked), "files": len(sources)}
    print(f"{len(mutants)} mutants in {len(sources)} files; sample of {len(picked)} (seed {a.seed})", flush=True)
    if a.dry_run:
        for m in picked:
            print(f"{m['id']} line {m['line']}: {' '.join(area_tests(m['path'], tests_root))}")
        return 0

    atexit.register(restore_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log = open(a.log, "w")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, "bazel-bin", "backends", "sim")]),
    )
    for k in ("INFINITRAIN_TEST_DEVICE", "OMP_NUM_THREADS", "BUILD_WORKING_DIRECTORY"):
        env.pop(k, None)
    equivalent = set(filter(None, a.equivalent.split(",")))
    baseline = {}  # tuple(tests) -> (why the area cannot be used or None, its failing tests, its seconds)
    results = []
    t_start = time.time()
    try:
        for i, m in enumerate(picked):
            tests = area_tests(m["path"], tests_root)
            if tests and not a.no_baseline and tuple(tests) not in baseline:
                baseline[tuple(tests)] = run_baseline(tests, tests_root, env, a.timeout, log)
            why, deselect, base_s = baseline.get(tuple(tests), (None, [], None))
            if not tests:
                why = "no test of its area exists"
            limit = a.timeout if base_s is None else min(a.timeout, max(60.0, a.timeout_factor * base_s))
            res = run_one(m, ROOT, sources[m["path"]], tests, tests_root, env, limit, log, deselect, why)
            results.append(res)
            print(
                f"[{i + 1}/{len(picked)}] {res['result']:8s} {res['secs']:5.0f}s {m['id']} line {m['line']}", flush=True
            )
            write_reports(a, meta, results, equivalent)
    finally:
        restore_all()
    line = write_reports(a, meta, results, equivalent)
    print(f"{line} (in {time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
