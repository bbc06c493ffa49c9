"""Runs the shared suites from a payload of tools/device_payload.sh, on a machine without Bazel.

    python3 run_tests.py [--jobs=N] [test files] [pytest args]

The device under test is the payload's provider (INFINITRAIN_TEST_DEVICE overrides it). Without test files it
runs every suite. --jobs=N runs the files in N pytest processes at once (a GPU has room for several, and device
time is scarce); each writes logs/shard<i>.log, and the summary lines of all of them end the output. The exit
status is the worst of the processes'.
"""

import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-rfEs"]

# Tests that need what a payload does not carry, left out with the reason printed (they run in CI).
NOT_IN_PAYLOAD = {
    "test_mutants.py": "reads the source tree, which a payload does not hold",
    "test_mutate_py.py": "runs the mutation tool of the source tree, which a payload does not hold",
    "test_docs.py": "checks the docs against the source tree, which a payload does not hold",
}
# Tests of host-side tools whose Python packages may be missing on the GPU machine (too large to ship there).
NEEDS_MODULE = {
    "matplotlib": ["test_compare.py", "test_precision.py::test_train_cli_records_and_compare_names_the_op"],
    "tokenizers": ["test_tokenizers.py"],
}


def environment():
    env = dict(os.environ)
    with open(os.path.join(HERE, "provider.txt")) as f:
        env.setdefault("INFINITRAIN_TEST_DEVICE", f.read().strip())
    paths = [os.path.join(HERE, "python"), os.path.join(HERE, "tests")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    libs = [os.path.join(HERE, "lib")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return env


def left_out():
    """{test file or node id: reason} for what cannot run from this payload on this machine."""
    out = dict(NOT_IN_PAYLOAD)
    for module, tests in NEEDS_MODULE.items():
        if importlib.util.find_spec(module) is None:
            out.update((t, f"needs the Python package {module}, not installed here") for t in tests)
    return out


def shards(files, n):
    """Files in n groups of about equal size (largest first, each to the lightest group): size stands in for
    run time."""
    groups = [[] for _ in range(n)]
    weight = [0] * n
    for f in sorted(files, key=lambda f: -os.path.getsize(f)):
        i = weight.index(min(weight))
        groups[i].append(f)
        weight[i] += os.path.getsize(f)
    return [g for g in groups if g]


def main(argv):
    jobs = 1
    if argv and argv[0].startswith("--jobs="):
        jobs = int(argv[0].split("=", 1)[1])
        argv = argv[1:]
    # A bare file name is a suite in one of tests/'s folders.
    suites = {}
    for folder, _, names in os.walk(os.path.join(HERE, "tests")):
        for n in names:
            if n.startswith("test_") and n.endswith(".py"):
                suites[n] = os.path.join(folder, n)
    files = [a if os.sep in a else suites.get(a, os.path.join(HERE, "tests", a)) for a in argv if a.endswith(".py")]
    missing = [f for f in files if not os.path.isfile(os.path.join(HERE, f))]
    if missing:
        sys.exit(f"no such test file: {', '.join(missing)}")
    rest = [a for a in argv if not a.endswith(".py")]
    if not files:
        files = sorted(suites.values())
    env = environment()
    skip = left_out()
    for name, why in sorted(skip.items()):
        print(f"left out {name}: {why}")
    files = [f for f in files if os.path.basename(f) not in skip]
    tests = os.path.join(HERE, "tests")  # pytest's rootdir: node ids are relative to it
    rest += [f"--deselect={os.path.relpath(suites[name.split('::')[0]], tests)}::{name.split('::', 1)[1]}"
             for name in skip if "::" in name and name.split("::")[0] in suites]  # fmt: skip
    if jobs <= 1:
        return subprocess.call([sys.executable, "-m", "pytest", *files, *PYTEST_ARGS, *rest], cwd=HERE, env=env)
    logs = os.path.join(HERE, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = []
    for i, group in enumerate(shards(files, jobs)):
        log = open(os.path.join(logs, f"shard{i}.log"), "w")  # closed once its process ends
        cmd = [sys.executable, "-m", "pytest", *group, *PYTEST_ARGS, *rest]
        procs.append((subprocess.Popen(cmd, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    status = 0
    for i, (p, log) in enumerate(procs):
        status = max(status, p.wait())
        log.close()
        with open(log.name) as f:
            lines = f.read().splitlines()
        summary = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))] + lines[-1:]
        print(f"== shard {i} ({log.name}): exit {p.returncode}")
        print("\n".join(summary), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
