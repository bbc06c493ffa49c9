"""Mutation score: applies realistic bugs (tools/mutate/mutants.py) one at a time to the source tree, rebuilds what
they touch, runs the suites that should notice, and reports which mutants the tests killed.

    python3 tools/mutate/mutate.py                       # every mutant, with the tests in tests/
    python3 tools/mutate/mutate.py --only=K3,P5          # some
    python3 tools/mutate/mutate.py --tests_from=REV      # with the tests as they were at REV (a score "before")
    python3 tools/mutate/mutate.py --md_out=/tmp/m.md --json_out=/tmp/m.json

A mutant is an exact snippet of a file and its replacement (the snippet must occur once). The file is edited in
place and restored afterwards, also on Ctrl-C or an error; the mutated files must be committed (or pass
--allow_dirty). C++ mutants rebuild the core library with ./bazelw (incremental: one file and a link), which the
develop links in python/infinitrain/ point at; Python mutants need no build. Each mutant's tests run with plain
pytest on the cpu, with the sim provider importable for data-parallel training, under a time limit; kernel
mutants run at 1, 2 and 8 OpenMP threads, as the op suites do in CI (--threads=default: the machine's count).
Killed: a test failed or timed out. Survived: every test passed. Invalid: the mutant does not apply (its snippet
does not occur exactly once), names a test file the tree lacks, or does not build: not counted in the score, but
listed loudly and the exit status is 1, so a stale mutant cannot quietly shrink the set. Before mutating, the tests
run once on the unmutated tree (--no_baseline skips that).
"""

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import MUTANTS  # noqa: E402

CORE = ["//python:infinitrain/libinfinitrain.so", "//python:infinitrain/_C.so"]
SIM = "//backends/sim:infinitrain_sim.so"
SUITE_THREADS = (1, 2, 8)
_restore = {}  # path -> original text, while mutated


def restore_all():
    for path, text in list(_restore.items()):
        with open(path, "w") as f:
            f.write(text)
        del _restore[path]


def _on_signal(signum, frame):
    restore_all()
    raise SystemExit(128 + signum)


def sh(cmd, timeout=None, env=None, log=None):
    """Runs cmd in the repository root, in its own process group (killed whole on timeout: training children
    too); returns (exit status or "timeout", seconds, output tail)."""
    t0 = time.time()
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        status = "timeout"
    if log:
        log.write(f"$ {' '.join(cmd)}\n{out}\n")
        log.flush()
    return status, time.time() - t0, out[-3000:]


def build(log, extra=()):
    status, secs, out = sh(["./bazelw", "build", "--config=ci", *CORE, *extra], timeout=3600, log=log)
    return status == 0, secs, out


def bazel_bin():
    p = subprocess.run(["./bazelw", "info", "bazel-bin"], cwd=ROOT, capture_output=True, text=True, check=True)
    return p.stdout.strip()


def test_runs(m, tests_dir, threads_mode):
    """[(pytest args, OMP threads or None)] for a mutant; tests missing from tests_dir are dropped."""
    args = []
    for t in m.tests:
        path = t.split("::")[0]
        if os.path.exists(os.path.join(tests_dir, os.path.relpath(path, "tests"))):
            args.append(os.path.join(tests_dir, os.path.relpath(t, "tests")))
    if not args:
        return []
    if m.kind == "cpp" and threads_mode == "suite":
        return [(args, n) for n in SUITE_THREADS]
    return [(args, None)]


def run_tests(runs, env_base, timeout, log):
    """('pass' | 'fail' | 'timeout' | 'no-tests', seconds, detail) of pytest over runs; stops at the first failure.
    pytest's 4 (usage error: a named test does not exist) and 5 (nothing collected) count as no tests."""
    total = 0.0
    if not runs:
        return "no-tests", 0.0, "no test file of this mutant exists in the tests used"
    for args, threads in runs:
        env = dict(env_base)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
        status, secs, out = sh(cmd, timeout=timeout, env=env, log=log)
        total += secs
        if status == "timeout":
            return "timeout", total, f"timed out after {timeout} s ({threads or 'default'} threads)"
        if status in (4, 5):
            return "no-tests", total, f"pytest exit {status}"
        if status != 0:
            failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
            where = f" at {threads} threads" if threads else ""
            return "fail", total, (failed[0] if failed else f"pytest exit {status}") + where
    return "pass", total, ""


def problem_of(m):
    """Why mutant m cannot run as written (None: it can): its snippet must occur exactly once in its file, and
    every test file it lists must exist in the tree."""
    path = os.path.join(ROOT, m.path)
    if not os.path.exists(path):
        return f"{m.path} does not exist"
    with open(path) as f:
        n = f.read().count(m.old)
    if n != 1:
        return f"the snippet occurs {n} times in {m.path}"
    missing = [t for t in m.tests if not os.path.exists(os.path.join(ROOT, t.split("::")[0]))]
    if missing:
        return f"test file(s) missing from the tree: {', '.join(missing)}"
    return None


def apply(m):
    path = os.path.join(ROOT, m.path)
    with open(path) as f:
        text = f.read()
    n = text.count(m.old)
    if n != 1:
        return f"the snippet occurs {n} times in {m.path}"
    _restore[path] = text
    with open(path, "w") as f:
        f.write(text.replace(m.old, m.new))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--tests_from", default="", help="a git revision whose tests/ to run instead of the tree's")
    ap.add_argument("--threads", choices=["suite", "default"], default="suite")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per pytest run")
    ap.add_argument("--no_baseline", action="store_true")
    ap.add_argument("--allow_dirty", action="store_true")
    ap.add_argument("--json_out", default="")
    ap.add_argument("--md_out", default="")
    ap.add_argument("--log", default="/tmp/infinitrain-mutate.log")
    a = ap.parse_args()

    mutants = [m for m in MUTANTS if not a.only or m.id in a.only.split(",")]
    if a.only and len(mutants) != len(set(a.only.split(","))):
        print(f"--only={a.only}: unknown mutant id(s)", file=sys.stderr)
        return 2
    stale = [(m, problem_of(m)) for m in mutants]
    stale = [(m, why) for m, why in stale if why]
    for m, why in stale:
        print(f"!!! INVALID MUTANT {m.id} ({m.note}): {why}: update tools/mutate/mutants.py", file=sys.stderr)
    if a.list:
        for m in mutants:
            print(f"{m.id:4s} {m.kind:3s} {m.path}: {m.note}")
        return 1 if stale else 0
    paths = sorted({m.path for m in mutants})
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *paths], cwd=ROOT).returncode
    if dirty and not a.allow_dirty:
        print(f"uncommitted changes in {paths}: commit them first (or --allow_dirty)", file=sys.stderr)
        return 2
    atexit.register(restore_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log = open(a.log, "w")
    tests_dir = os.path.join(ROOT, "tests")
    tmp = None
    if a.tests_from:
        tmp = tempfile.mkdtemp(prefix="infinitrain-mutate-tests-")
        archive = subprocess.run(["git", "archive", a.tests_from, "tests"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        tests_dir = os.path.join(tmp, "tests")

    print(f"building the core and the sim provider (log: {a.log})", flush=True)
    ok, secs, out = build(log, [SIM])
    if not ok:
        print(out, file=sys.stderr)
        return 1
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(bazel_bin(), "backends", "sim")]),
    )
    for k in ("INFINITRAIN_TEST_DEVICE", "OMP_NUM_THREADS", "BUILD_WORKING_DIRECTORY"):
        env.pop(k, None)

    if not a.no_baseline:
        seen = set()
        for m in mutants:
            for args, threads in test_runs(m, tests_dir, a.threads):
                key = (tuple(args), threads)
                if key in seen:
                    continue
                seen.add(key)
                status, secs, detail = run_tests([(args, threads)], env, a.timeout, log)
                if status not in ("pass", "no-tests"):
                    print(f"baseline: {' '.join(args)} ({threads or 'default'} threads) fails unmutated: {detail}")
                    return 1
        print(f"baseline: {len(seen)} test runs pass unmutated", flush=True)

    results = []
    t_start = time.time()
    try:
        for m in mutants:
            res = {"id": m.id, "kind": m.kind, "path": m.path, "note": m.note, "build_s": 0.0, "test_s": 0.0}
            problem = problem_of(m) or apply(m)
            if problem:
                res.update(result="invalid", detail=problem)
            else:
                built = True
                if m.kind == "cpp":
                    built, res["build_s"], out = build(log)
                    if not built:
                        res.update(result="invalid", detail="does not build")
                if built:
                    status, res["test_s"], detail = run_tests(test_runs(m, tests_dir, a.threads), env, a.timeout, log)
                    res.update(result={"pass": "survived", "no-tests": "survived"}.get(status, "killed"), detail=detail)
            restore_all()
            results.append(res)
            print(
                f"{m.id:4s} {res['result']:8s} {res['build_s'] + res['test_s']:6.1f}s  {m.note}  {res['detail']}",
                flush=True,
            )
    finally:
        restore_all()
        if any(m.kind == "cpp" for m in mutants):
            print("rebuilding the unmutated core", flush=True)
            build(log)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    killed = sum(r["result"] == "killed" for r in results)
    survived = sum(r["result"] == "survived" for r in results)
    score = killed / max(1, killed + survived)
    line = (
        f"mutation score {score:.1%}: {killed} killed, {survived} survived, "
        f"{sum(r['result'] == 'invalid' for r in results)} invalid, in {time.time() - t_start:.0f} s"
    )
    print(line)
    invalid = [r for r in results if r["result"] == "invalid"]
    if invalid:
        print(
            f"!!! {len(invalid)} INVALID MUTANT(S), NOT SCORED: {', '.join(r['id'] for r in invalid)} "
            "(see the lines above): the score covers the others only; exit status 1",
            file=sys.stderr,
        )
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(
                {"tests_from": a.tests_from or "tree", "threads": a.threads, "summary": line, "results": results},
                f,
                indent=1,
            )
    if a.md_out:
        with open(a.md_out, "w") as f:
            f.write(f"{line}\n\n| id | file | mutation | result | detail |\n|---|---|---|---|---|\n")
            for r in results:
                f.write(
                    f"| {r['id']} | {r['path']} | {r['note']} | {r['result']} | {r['detail'].replace('|', '/')} |\n"
                )
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
