"""Generated mutants of the portable GPU kernels (backends/gpu/*.cu, *.cuh), compiled here and run on the GPU machine.

The mutants are sample_cc.py's (one spaced binary operator or integer literal changed) over the committed kernel
sources. This machine compiles, for each mutant of a seeded sample, every translation unit that includes the mutated
file (nvcc, the flags of //backends/cuda:gpu); the GPU machine links each mutant's provider module from those objects
and the unmutated ones and runs the kernel's op suites on device "cuda", several mutants at once.

    # here, after `./bazelw build --config=cuda //python:infinitrain` of the same commit (the unmutated objects):
    .venv/bin/python tools/mutate/sample_gpu.py pack --seed=20261207 --count=80 --out=.device/gpu_mutants
    # there (a staged payload, python3.11 from .device/env.sh); results under OUT, written as they come:
    python3.11 .device/gpu_mutants/sample_gpu.py run --pack=.device/gpu_mutants --payload=.device/payload/cuda \\
        --out=$OUT --jobs=8 --deadline=520
    # here again: the report
    .venv/bin/python tools/mutate/sample_gpu.py report --pack=.device/gpu_mutants --results=OUT/gpu_results.json \\
        --md_out=/tmp/gpu.md --json_out=/tmp/gpu.json

The unmutated module is linked on the GPU machine the same way and each test file run with it first (the baseline):
a test failing there is deselected for the mutants, as sample_py.py does. A mutant whose tests fail, or whose test
process dies of a signal (a device fault), is killed; one that hangs past --timeout is reported as timed out; one
that does not compile is not scored. Mutants still waiting at --deadline are reported as not run, so a call that
must end in time still returns what it measured; `run --ids=` takes the rest in another call.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = "backends/gpu"
VENDOR = "backends/cuda/vendor_cuda.h"
NVCC_FLAGS = [
    "-x", "cu", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
    "-gencode=arch=compute_90,code=sm_90", f'-DINFINITRAIN_GPU_VENDOR_HEADER="{VENDOR}"',
]  # fmt: skip
# The provider module's libraries (the link line of //backends/cuda:infinitrain_cuda), found on the GPU machine.
LIBS = ["nvrtc", "cudnn", "cublas", "nccl", "cublasLt", "cudart"]

# Each translation unit's op suites; the conformance and composite suites run after them for every mutant. The
# portable linear and attention kernels run on cuda only with cuBLASLt or cuDNN switched off: the paths tests do that.
COMMON = ["ops/test_conformance.py", "ops/test_composites.py"]
TU_TESTS = {
    "ops_attention.cu": ["ops/test_ops_attention.py", "ops/test_attention_paths.py"],
    "ops_copy.cu": ["ops/test_ops_copy.py"],
    "ops_elementwise.cu": ["ops/test_ops_elementwise.py", "ops/test_ops_extreme.py"],
    "ops_foreach.cu": ["ops/test_ops_optim.py", "core/test_nn_optim.py"],
    "ops_fp8.cu": ["ops/test_fp8.py"],
    "ops_gemm.cu": ["ops/test_ops_gemm.py", "ops/test_linear_paths.py"],
    "ops_index.cu": ["ops/test_ops_index.py"],
    "ops_loss.cu": ["ops/test_ops_loss.py"],
    "ops_moe.cu": ["ops/test_ops_moe.py"],
    "ops_norm.cu": ["ops/test_ops_norm.py"],
    "ops_optim.cu": ["ops/test_ops_optim.py"],
    "ops_random.cu": ["ops/test_ops_random.py"],
    "ops_reduce.cu": ["ops/test_ops_reduce.py"],
    "ops_scan_sort.cu": ["ops/test_ops_scan_sort.py"],
    "ops_shape.cu": ["ops/test_ops_shape.py"],
    # Device-side error reporting (an index out of range inside a kernel): the index, loss and MoE suites raise it.
    "device_error.cu": ["ops/test_ops_index.py", "ops/test_ops_loss.py", "ops/test_ops_moe.py"],
}
_INCLUDE = re.compile(r'^\s*#include "(backends/gpu/[\w.]+)"', re.M)


# ---- here: the sample, the objects, the pack -------------------------------------------------------------------


def _extract(t, dest):
    try:
        t.extractall(dest, filter="data")
    except TypeError:  # a Python without tar filters (before 3.11.4); the archive is our own
        t.extractall(dest)


def committed_sources(root, rev):
    """{path: text} of the committed backends/gpu/*.cu and *.cuh files (the mutated ones) at rev."""
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, KERNELS + "/"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        p: subprocess.run(["git", "show", f"{rev}:{p}"], cwd=root, capture_output=True, text=True, check=True).stdout
        for p in names
        if p.endswith((".cu", ".cuh"))
    }


def units_including(path, sources):
    """The translation units (.cu basenames) whose include closure holds path."""
    out = []
    for tu in sorted(p for p in sources if p.endswith(".cu")):
        seen, todo = set(), [tu]
        while todo:
            p = todo.pop()
            if p in seen or p not in sources:
                continue
            seen.add(p)
            todo += _INCLUDE.findall(sources[p])
        if path in seen:
            out.append(os.path.basename(tu))
    return out


def tests_of(tus):
    out = []
    for tu in tus:
        out += [t for t in TU_TESTS[tu] if t not in out]
    return out + COMMON


def bazel_objects(root):
    """[(object path, name in the pack)] of //backends/cuda:infinitrain_cuda's link line, in its order."""
    bin_dir = subprocess.run(
        ["./bazelw", "info", "--config=cuda", "bazel-bin"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    params = os.path.join(bin_dir, "backends/cuda/infinitrain_cuda.so-2.params")
    if not os.path.exists(params):
        raise SystemExit(f"no {params}: run `./bazelw build --config=cuda //python:infinitrain` first")
    exec_root = os.path.dirname(os.path.dirname(os.path.dirname(bin_dir)))  # .../execroot/<ws>
    out = []
    with open(params) as f:
        for line in f.read().split():
            if line.endswith(".o"):
                path = os.path.join(exec_root, line)
                out.append((path, os.path.basename(path)))
    if len({n for _, n in out}) != len(out):
        raise SystemExit("two objects of the provider module share a name")
    return out


def compile_unit(tree, tu, obj, log):
    cmd = ["/usr/local/cuda/bin/nvcc", *NVCC_FLAGS, "-I.", "-c", f"{KERNELS}/{tu}", "-o", obj]
    p = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-4000:]}\n")
    log.flush()
    return p.returncode == 0


def export_tree(root, rev, dest):
    """The files the kernels compile from (backends/gpu, the vendor header, infinitrain's headers) at rev."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, KERNELS, VENDOR, "infinitrain"], cwd=root, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as t:
            _extract(t, dest)


def pack(a):
    sys.path.insert(0, HERE)
    import sample_cc
    import sample_py

    root = os.path.abspath(os.path.join(HERE, "..", ".."))
    sources = committed_sources(root, a.rev)
    mutants = sample_cc.enumerate_mutants(sources)
    try:
        picked = sample_py.choose(mutants, a.seed, a.count, a.ids)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    rev = subprocess.run(["git", "rev-parse", "--short", a.rev], cwd=root, capture_output=True, text=True).stdout
    meta = {"seed": a.seed, "rev": rev.strip(), "total": len(mutants), "sampled": len(picked), "files": len(sources)}
    meta["kind"] = "CUDA (portable GPU kernels, cuda provider)"
    print(f"{len(mutants)} mutants in {len(sources)} files; sample of {len(picked)} (seed {a.seed})", flush=True)
    for m in picked:
        m["tus"] = units_including(m["path"], sources)
        m["tests"] = tests_of(m["tus"])
    if a.dry_run:
        for m in picked:
            print(f"{m['id']}: {' '.join(m['tus'])}: {' '.join(m['tests'])}")
        return 0

    objects = bazel_objects(root)
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu-mutants-")
    log = open(os.path.join(work, "build.log"), "w")
    try:
        stage = os.path.join(work, "objs")
        os.makedirs(os.path.join(stage, "base"))
        for path, name in objects:
            shutil.copyfile(path, os.path.join(stage, "base", name))
        tree = os.path.join(work, "tree")
        export_tree(root, a.rev, tree)
        t0 = time.time()
        for i, m in enumerate(picked):
            key = f"m{i:03d}"
            m["key"] = key
            path = os.path.join(tree, m["path"])
            text = sources[m["path"]]
            new = sample_cc.mutated_text(text, m)
            m["diff"] = sample_py.diff_of(text, new, m["path"])
            with open(path, "w") as f:
                f.write(new)
            os.makedirs(os.path.join(stage, key))
            try:
                ok = all(
                    compile_unit(tree, tu, os.path.join(stage, key, tu.replace(".cu", ".pic.o")), log)
                    for tu in m["tus"]
                )
            finally:
                with open(path, "w") as f:
                    f.write(text)
            m["built"] = ok
            if not ok:
                shutil.rmtree(os.path.join(stage, key))
            print(f"[{i + 1}/{len(picked)}] {'built' if ok else 'NOT BUILT'} {m['id']} ({' '.join(m['tus'])}) "
                  f"{time.time() - t0:.0f} s", flush=True)  # fmt: skip
        with open(os.path.join(stage, "manifest.json"), "w") as f:
            json.dump({**meta, "link": [n for _, n in objects], "mutants": picked}, f, indent=1)
        # One solid xz stream, each object beside the unmutated one of its unit: a mutant's object then costs
        # only what differs.
        names = ["manifest.json"] + sorted(
            (os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs if f.endswith(".o")),
            key=lambda p: (os.path.basename(p), p),
        )
        listing = os.path.join(work, "list")
        with open(listing, "w") as f:
            f.write("\n".join(names) + "\n")
        out_tar = os.path.join(a.out, "objects.tar.xz")
        subprocess.run(
            f"tar -C {stage} -cf - -T {listing} | xz -9 -T1 > {out_tar}", shell=True, check=True
        )  # fmt: skip
        for f in ("sample_gpu.py", "sample_cc.py", "sample_py.py"):  # run's imports (the standard library's else)
            shutil.copyfile(os.path.join(HERE, f), os.path.join(a.out, f))
        shutil.copyfile(os.path.join(stage, "manifest.json"), os.path.join(a.out, "manifest.json"))
        print(f"{a.out}: {os.path.getsize(out_tar) / 2**20:.1f} MiB of objects, {len(picked)} mutants", flush=True)
    finally:
        log.close()
        shutil.copyfile(os.path.join(work, "build.log"), os.path.join(a.out, "build.log"))
        shutil.rmtree(work, ignore_errors=True)
    return 0


# ---- there: link, baseline, mutants ----------------------------------------------------------------------------


def find_libs(dirs):
    """Linker arguments for LIBS from the first of dirs holding each (an unversioned name is not required)."""
    args = []
    for name in LIBS:
        pat = re.compile(rf"^lib{re.escape(name)}\.so(\.\d+)*$")
        hit = None
        for d in dirs:
            if os.path.isdir(d):
                cands = sorted(f for f in os.listdir(d) if pat.match(f))
                if cands:
                    hit = (d, cands[0])
                    break
        if hit is None:
            raise SystemExit(f"lib{name}.so not found in {dirs}")
        args += [f"-L{hit[0]}", f"-l:{hit[1]}"]
    return args


def link(objs, out, core_dir, libs):
    cmd = ["g++", "-shared", "-o", out, "-Wl,--no-as-needed", "-Wl,--whole-archive", *objs, "-Wl,--no-whole-archive"]
    cmd += [f"-L{core_dir}", "-linfinitrain", *libs, "-lstdc++", "-lm"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode == 0, p.stderr[-2000:]


def run(a):
    sys.path.insert(0, HERE)
    import sample_cc
    import sample_py

    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    work = a.work or tempfile.mkdtemp(prefix="gpu-mutants-")
    with tarfile.open(os.path.join(a.pack, "objects.tar.xz")) as t:
        _extract(t, work)
    with open(os.path.join(work, "manifest.json")) as f:
        manifest = json.load(f)
    payload = os.path.abspath(a.payload)
    core_dir = os.path.join(payload, "python", "infinitrain")
    dirs = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + ["/usr/local/cuda/lib64"]
    libs = find_libs([d for d in dirs if d])
    tests_root = os.path.join(payload, "tests")
    results_path = os.path.join(a.out, "gpu_results.json")
    logs = os.path.join(a.out, "logs")
    os.makedirs(logs, exist_ok=True)

    def module(key, mutant=None):
        """Links the provider module of key (the unmutated one for 'base'); returns its folder or raises."""
        d = os.path.join(work, "so", key)
        os.makedirs(d, exist_ok=True)
        own = set(os.listdir(os.path.join(work, key))) if mutant else set()
        objs = [os.path.join(work, key if n in own else "base", n) for n in manifest["link"]]
        ok, err = link(objs, os.path.join(d, "infinitrain_cuda.so"), core_dir, libs)
        if not ok:
            raise RuntimeError(f"link failed: {err}")
        return d

    def env_for(so_dir):
        env = dict(os.environ, INFINITRAIN_TEST_DEVICE="cuda", OMP_NUM_THREADS="2")
        mine = [so_dir, os.path.join(payload, "python"), tests_root]  # before the wheels' folders, kept
        env["PYTHONPATH"] = os.pathsep.join(mine + [p for p in [os.environ.get("PYTHONPATH")] if p])
        env["LD_LIBRARY_PATH"] = os.pathsep.join([os.path.join(payload, "lib"), os.environ.get("LD_LIBRARY_PATH", "")])
        return env

    base = module("base")
    files = sorted({t for m in manifest["mutants"] for t in m["tests"]})
    lock = threading.Lock()
    baseline = {}

    def base_one(t):
        status, secs, detail, out = sample_py.run_pytest([t], tests_root, env_for(base), 300, None, stop_first=False)
        with lock:
            baseline[t] = {"status": status, "secs": secs, "detail": detail, "failing": sample_py.failed_ids(out),
                           "passed": bool(re.search(r"\b[1-9]\d* passed", out))}  # fmt: skip
        with open(os.path.join(logs, "baseline_" + t.replace("/", "_") + ".log"), "w") as f:
            f.write(out[-20000:])
        print(f"baseline {t}: {status} in {secs:.0f} s {detail}", flush=True)

    if a.baseline:  # an earlier call's, on the same pack
        with open(a.baseline) as f:
            baseline.update(json.load(f)["baseline"])
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(base_one, [t for t in files if t not in baseline]))
    deselect = [i for b in baseline.values() for i in b["failing"]]
    # A file whose tests do not run unmutated, or of which none passes (no device), tests no mutant.
    broken = {t for t, b in baseline.items() if b["status"] not in ("pass", "fail") or not b.get("passed", True)}

    wanted = set(filter(None, a.ids.split(","))) if a.ids else None
    results = []

    def save():
        with open(results_path, "w") as f:
            json.dump({"baseline": baseline, "results": results, "elapsed": time.time() - t_start}, f, indent=1)

    def one(m):
        res = {"id": m["id"], "tests": m["tests"], "secs": 0.0, "detail": ""}
        if not m.get("built"):
            res.update(result="skipped", detail="does not build (not scored)")
        elif time.time() - t_start > a.deadline:
            res.update(result="not run", detail=f"not started by the {a.deadline:.0f} s deadline")
        elif set(m["tests"]) & broken:
            res.update(result="error", detail=f"tests that do not run unmutated: {sorted(set(m['tests']) & broken)}")
        else:
            try:
                so = module(m["key"], m)
            except RuntimeError as e:
                res.update(result="error", detail=str(e)[:300])
            else:
                # A limit from the baseline (several suites for a shared header), cut at the call's end.
                limit = max(a.timeout, 3 * sum(baseline[t]["secs"] for t in m["tests"]))
                left = a.deadline + a.grace - (time.time() - t_start)
                status, secs, detail, out = sample_py.run_pytest(
                    m["tests"], tests_root, env_for(so), min(limit, left), None, deselect=deselect
                )
                res["secs"] = secs
                res.update(zip(("result", "detail"), sample_cc.outcome(status, detail), strict=True))
                if status == "timeout" and left < limit:
                    res.update(result="not run", detail=f"cut at the call's end after {secs:.0f} s")
                with open(os.path.join(logs, m["key"] + ".log"), "w") as f:
                    f.write(out[-20000:])
                shutil.rmtree(so, ignore_errors=True)
        with lock:
            results.append(res)
            save()
        print(f"{res['result']:8s} {res['secs']:5.0f}s {m['id']} {res['detail'][:120]}", flush=True)

    todo = [m for m in manifest["mutants"] if wanted is None or m["id"] in wanted]
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(one, todo))
    save()
    n = {k: sum(r["result"] == k for r in results) for k in ("killed", "survived", "timeout", "error", "not run")}
    print(f"done in {time.time() - t_start:.0f} s: {n}", flush=True)
    return 0


# ---- here: the report ------------------------------------------------------------------------------------------


def report(a):
    sys.path.insert(0, HERE)
    import sample_py

    with open(os.path.join(a.pack, "manifest.json")) as f:
        manifest = json.load(f)
    got = {}
    for path in a.results.split(","):
        with open(path) as f:
            for r in json.load(f)["results"]:
                if r["result"] != "not run" or r["id"] not in got:
                    got[r["id"]] = r
    results = []
    for m in manifest["mutants"]:
        r = got.get(m["id"]) or {"result": "not run", "detail": "", "secs": 0.0}
        if r["result"] == "not run":
            continue
        results.append({**{k: m[k] for k in ("id", "path", "op", "line", "tests", "diff")}, **r, "tests": m["tests"]})
    meta = {k: manifest[k] for k in ("seed", "rev", "total", "files", "kind")}
    meta["sampled"] = len(manifest["mutants"])
    a.seed = manifest["seed"]
    equivalent = set(filter(None, a.equivalent.split(",")))
    print(sample_py.write_reports(a, meta, results, equivalent))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: sample, compile each mutant's units, pack the objects")
    p.add_argument("--seed", type=int, default=20261207)
    p.add_argument("--count", type=int, default=80)
    p.add_argument("--ids", default="", help="comma-separated mutant ids instead of a sample")
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--out", default=".device/gpu_mutants")
    p.add_argument("--dry_run", action="store_true", help="print the sample, its units and tests; build nothing")
    r = sub.add_parser("run", help="on the GPU machine: link each mutant and run its tests")
    r.add_argument("--pack", required=True)
    r.add_argument("--payload", required=True, help="a staged cuda payload (tools/device_payload.sh)")
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="", help="a scratch folder (default: a new temporary one)")
    r.add_argument("--jobs", type=int, default=8, help="mutants tested at once")
    r.add_argument("--timeout", type=float, default=120, help="seconds at least a mutant's tests may take")
    r.add_argument("--deadline", type=float, default=520, help="seconds after which no mutant is started")
    r.add_argument("--grace", type=float, default=60, help="seconds after the deadline that running tests may take")
    r.add_argument("--ids", default="", help="comma-separated mutant ids to run (default: all in the pack)")
    r.add_argument("--baseline", default="", help="an earlier run's gpu_results.json whose baseline to reuse")
    s = sub.add_parser("report", help="here: the report of one or more runs' results")
    s.add_argument("--pack", required=True)
    s.add_argument("--results", required=True, help="comma-separated gpu_results.json files")
    s.add_argument("--equivalent", default="", help="comma-separated mutant ids judged equivalent (not scored)")
    s.add_argument("--json_out", default="")
    s.add_argument("--md_out", default="")
    a = ap.parse_args(argv)
    return {"pack": pack, "run": run, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
