"""Generated mutants of the CPU kernels: every operator and integer-constant mutation of the committed
infinitrain/kernels/cpu/*.cc files, a seeded random sample of them, each applied in place, the core library
rebuilt (one file and a link) and the kernel's op suites run; the score is the share the tests kill.

    .venv/bin/python tools/mutate/sample_cc.py --list                  # mutants per file, and the total
    .venv/bin/python tools/mutate/sample_cc.py --dry_run --count=40     # the sample and each one's tests
    .venv/bin/python tools/mutate/sample_cc.py --seed=20261205 --count=40 --md_out=/tmp/cc.md --json_out=/tmp/cc.json

No C++ mutation tool is pinned here (none installs from PyPI, and Mull or dextool need an LLVM build): the mutants
come from the source text, as one token changed. clang-format writes binary operators with a space on each side,
so ` + `, ` < `, ` && ` and the compound assignments are binary operators, never a template's angle bracket, a
pointer's `*` or a unary minus; those are replaced by their usual mutation-testing counterparts (+ and -, * and /,
< and <=, > and >=, == and !=, && and ||, += and -=, ...). An integer literal n becomes n + 1 (0 and 1 also swap).
Comments, string and character literals, preprocessor lines and registrations are not mutated.

Each mutant's tests run twice, at 1 and 2 OpenMP threads (a kernel's serial and split paths), stopping at the first
failure; a test process that dies of a signal (an abort, a fault) counts as a kill; a mutant that does not compile
is reported as not built and not scored (as mutation tools do with stillborn mutants). Run it in a clone of its own
(see docs/mutation_python.md): the files are edited in place and restored after each mutant, also on Ctrl-C, SIGTERM
or an error. The GPU kernels (backends/gpu) are sampled by sample_gpu.py: compiled here, run on the GPU machine.
"""

import argparse
import atexit
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sample_py  # noqa: E402  (the sampling, restore, pytest and report machinery)

ROOT = sample_py.ROOT
KERNELS = "infinitrain/kernels/cpu"
CORE = ["//python:infinitrain/libinfinitrain.so", "//python:infinitrain/_C.so"]
THREADS = (1, 2)

# Every kernel file's op suites, plus the conformance suite (every op against its float64 reference) and the
# composite comparison (every fused op's kernel against its composite). Files without their own suite (blas.cc,
# threads.cc) map to the suites of the kernels they serve.
COMMON = ["ops/test_conformance.py", "ops/test_composites.py"]
AREAS = {
    # The bf16 products run on the sbgemm kernels only where the CPU has AMX, or forced: the paths test forces them.
    "attention.cc": ["ops/test_ops_attention.py", "ops/test_attention_paths.py", "ops/test_cpu_bf16_gemm_paths.py"],
    "bf16_gemm.cc": ["ops/test_ops_gemm.py", "ops/test_cpu_bf16_gemm_paths.py"],
    "blas.cc": ["ops/test_ops_gemm.py"],
    "copy.cc": ["ops/test_ops_copy.py"],
    "elementwise.cc": ["ops/test_ops_elementwise.py", "ops/test_ops_extreme.py"],
    "fp8.cc": ["ops/test_fp8.py"],
    "gemm.cc": ["ops/test_ops_gemm.py", "ops/test_linear_paths.py", "ops/test_cpu_bf16_gemm_paths.py"],
    "index.cc": ["ops/test_ops_index.py"],
    "loss.cc": ["ops/test_ops_loss.py"],
    "moe.cc": ["ops/test_ops_moe.py"],
    "norm.cc": ["ops/test_ops_norm.py"],
    "optim.cc": ["ops/test_ops_optim.py"],
    "random.cc": ["ops/test_ops_random.py"],
    "reduce.cc": ["ops/test_ops_reduce.py"],
    "scan.cc": ["ops/test_ops_scan_sort.py"],
    "shape.cc": ["ops/test_ops_shape.py"],
    "sort.cc": ["ops/test_ops_scan_sort.py"],
    "threads.cc": ["core/test_torch_functions.py", "ops/test_ops_elementwise.py"],  # set_num_threads
}

# Binary operators (as clang-format spaces them) and what each becomes.
BINARY = {
    "+": ["-"], "-": ["+"], "*": ["/"], "/": ["*"], "%": ["*"],
    "<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "==": ["!="], "!=": ["=="],
    "&&": ["||"], "||": ["&&"],
    "+=": ["-="], "-=": ["+="], "*=": ["/="], "/=": ["*="],
    "<<": [">>"], ">>": ["<<"], "&": ["|"], "|": ["&"], "^": ["&"],
}  # fmt: skip
_BIN = re.compile(r"(?<=\S) (" + "|".join(re.escape(k) for k in sorted(BINARY, key=len, reverse=True)) + r") (?=\S)")
_INT = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
_SKIP_LINE = re.compile(r"^\s*(#|//|REGISTER_|\*|/\*)")


def _code_spans(line):
    """(start, end) spans of a line outside string/char literals and a trailing // comment."""
    spans, start, i, quote = [], 0, 0, None
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote, start = None, i + 1
        elif c in "\"'":
            spans.append((start, i))
            quote = c
        elif line.startswith("//", i):
            spans.append((start, i))
            return spans
        i += 1
    if not quote:
        spans.append((start, len(line)))
    return spans


def enumerate_mutants(sources):
    """Every mutant of sources ({path: text}) in a fixed order: [{"id", "path", "op", "line", "col", "old", "new"}]."""
    out = []
    for path in sorted(sources):
        in_block = False
        for ln, line in enumerate(sources[path].splitlines(), 1):
            if in_block:
                in_block = "*/" not in line
                continue
            if line.lstrip().startswith("/*"):
                in_block = "*/" not in line
                continue
            if _SKIP_LINE.match(line) or "OpError(" in line or "static_assert" in line:
                continue
            found = []
            for a, b in _code_spans(line):
                seg = line[a:b]
                found += [(a + m.start(1), m.group(1), new) for m in _BIN.finditer(seg) for new in BINARY[m.group(1)]]
                for m in _INT.finditer(seg):
                    n = int(m.group(1))
                    for new in sorted({n + 1, 1 - n} if n in (0, 1) else {n + 1}):
                        found.append((a + m.start(1), m.group(1), str(new)))
            for col, old, new in sorted(found):
                kind = "constant" if old.isdigit() else "operator"
                mid = f"{path}:{ln}:{col}:{old}->{new}"
                out.append({"id": mid, "path": path, "op": kind, "line": ln, "col": col, "old": old, "new": new})
    return out


def mutated_text(text, m):
    lines = text.split("\n")
    line = lines[m["line"] - 1]
    assert line[m["col"] : m["col"] + len(m["old"])] == m["old"], m["id"]
    lines[m["line"] - 1] = line[: m["col"]] + m["new"] + line[m["col"] + len(m["old"]) :]
    return "\n".join(lines)


def committed_sources(rev="HEAD"):
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, KERNELS + "/"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    out = {}
    for p in names:
        if p.endswith(".cc"):
            out[p] = subprocess.run(
                ["git", "show", f"{rev}:{p}"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout
    return out


def outcome(status, detail):
    """(result, detail) of a kernel mutant's run_pytest status: a test process that died of a signal (an abort, a
    fault) caught it."""
    if status == "error" and re.match(r"pytest exit -\d+", detail):
        return "killed", detail.split(":")[0] + " (crashed)"
    return {"pass": "survived", "fail": "killed", "timeout": "timeout", "error": "error"}[status], detail


def build(log):
    t0 = time.time()
    p = subprocess.run(["./bazelw", "build", *CORE], cwd=ROOT, capture_output=True, text=True)
    log.write(f"$ ./bazelw build {' '.join(CORE)}\n{p.stdout[-2000:]}{p.stderr[-4000:]}\n")
    log.flush()
    return p.returncode == 0, time.time() - t0


def run_one(m, committed, tests, tests_root, env, timeout, log):
    res = {**m, "tests": list(tests), "deselected": [], "diff": "", "secs": 0.0}
    path = os.path.join(ROOT, m["path"])
    with open(path) as f:
        text = f.read()
    if text != committed:
        res.update(result="skipped", detail="file differs from HEAD in the working tree")
        return res
    new = mutated_text(text, m)
    sample_py._restore[path] = (text, new)
    try:
        with open(path, "w") as f:
            f.write(new)
        res["diff"] = sample_py.diff_of(text, new, m["path"])
        ok, secs = build(log)
        res["secs"] = secs
        if not ok:
            res.update(result="skipped", detail="does not build (not scored)")
            return res
        for n in THREADS:
            env_n = dict(env, OMP_NUM_THREADS=str(n), OMP_WAIT_POLICY="passive")
            status, s, detail, _ = sample_py.run_pytest(tests, tests_root, env_n, timeout, log)
            res["secs"] += s
            if status != "pass":
                result, detail = outcome(status, detail)
                res.update(result=result, detail=f"{detail} ({n} thread{'s' if n > 1 else ''})")
                return res
        res.update(result="survived", detail="")
        return res
    finally:
        sample_py.restore_all()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--ids", default="", help="comma-separated mutant ids to run instead of a sample (a rerun)")
    ap.add_argument("--list", action="store_true", help="print the mutant count per file and exit")
    ap.add_argument("--dry_run", action="store_true", help="print the sample and each one's tests; run nothing")
    ap.add_argument("--timeout", type=float, default=300, help="seconds at most of one pytest run")
    ap.add_argument("--equivalent", default="", help="comma-separated mutant ids judged equivalent (not scored)")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--json_out", default="")
    ap.add_argument("--md_out", default="")
    ap.add_argument("--log", default="/tmp/infinitrain-mutate-cc.log")
    a = ap.parse_args(argv)

    sources = committed_sources(a.rev)
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
        picked = sample_py.choose(mutants, a.seed, a.count, a.ids)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    tests_root = os.path.join(ROOT, "tests")

    def tests_of(m):
        own = AREAS.get(os.path.basename(m["path"]), [])
        return [t for t in own + COMMON if os.path.exists(os.path.join(tests_root, t))]

    rev = subprocess.run(["git", "rev-parse", "--short", a.rev], cwd=ROOT, capture_output=True, text=True).stdout
    meta = {"seed": a.seed, "rev": rev.strip(), "total": len(mutants), "sampled": len(picked), "files": len(sources)}
    meta["kind"] = "C++ (CPU kernels)"
    print(f"{len(mutants)} mutants in {len(sources)} files; sample of {len(picked)} (seed {a.seed})", flush=True)
    if a.dry_run:
        for m in picked:
            print(f"{m['id']}: {' '.join(tests_of(m))}")
        return 0
    atexit.register(sample_py.restore_all)
    signal.signal(signal.SIGTERM, sample_py._on_signal)
    signal.signal(signal.SIGINT, sample_py._on_signal)
    log = open(a.log, "w")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for k in ("INFINITRAIN_TEST_DEVICE", "OMP_NUM_THREADS", "BUILD_WORKING_DIRECTORY"):
        env.pop(k, None)
    equivalent = set(filter(None, a.equivalent.split(",")))
    results, t_start = [], time.time()
    try:
        for i, m in enumerate(picked):
            res = run_one(m, sources[m["path"]], tests_of(m), tests_root, env, a.timeout, log)
            results.append(res)
            print(f"[{i + 1}/{len(picked)}] {res['result']:8s} {res['secs']:5.0f}s {m['id']}", flush=True)
            sample_py.write_reports(a, meta, results, equivalent)
    finally:
        sample_py.restore_all()
        build(log)  # the library as committed again
    line = sample_py.write_reports(a, meta, results, equivalent)
    print(f"{line} (in {time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
