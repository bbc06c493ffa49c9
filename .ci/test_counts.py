"""Counts the tests a `bazel test //tests/...` run executed and guards the count against shrinking.

    python3 .ci/test_counts.py LABEL BAZEL_OUTPUT [--record]

Reads the target list from BAZEL_OUTPUT (the `//tests:name STATUS` lines), then each target's pytest log under
bazel-testlogs/ for its "N passed, M skipped" line and "SKIPPED [k] file:line: reason" lines. Prints the totals and
the skip reasons, and compares the number of passed tests with the one recorded for LABEL in .ci/test_counts:
fewer is a failure (a suite that silently stopped running tests), more is a note to record the new count
(--record writes it).
"""

import collections
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "test_counts")
TARGET = re.compile(r"^(//tests[/\w]*:\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY)")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
SKIP = re.compile(r"^SKIPPED \[(\d+)\] ([^:]+):\d+: (.*)$")


def this_run_logs(target_dir):
    """The target's test.log files of the latest run: one, or one per shard. bazel-testlogs keeps what earlier
    invocations left beside them (run_K_of_N/ from --runs_per_test, shard_K_of_N/ of another shard count, a
    test.log from before the target was sharded); counting those would inflate the total."""
    layouts = collections.defaultdict(list)  # shard count (1: not sharded) -> logs
    for root, _, files in os.walk(target_dir):
        if "test.log" not in files:
            continue
        parts = os.path.relpath(root, target_dir).split(os.sep)
        if any(re.fullmatch(r"run_\d+_of_\d+", p) for p in parts):
            continue
        shard = re.fullmatch(r"shard_\d+_of_(\d+)", parts[0])
        if parts == ["."]:
            layouts[1].append(os.path.join(root, "test.log"))
        elif shard and len(parts) == 1:
            layouts[int(shard.group(1))].append(os.path.join(root, "test.log"))
    if not layouts:
        return []
    newest = max(layouts.values(), key=lambda logs: max(os.path.getmtime(f) for f in logs))
    return sorted(newest)


def read_record():
    counts = {}
    if os.path.exists(RECORD):
        with open(RECORD) as f:
            for line in f:
                parts = line.split("#")[0].split()
                if len(parts) == 2:
                    counts[parts[0]] = int(parts[1])
    return counts


def write_record(counts):
    with open(RECORD, "w") as f:
        f.write("# Tests that pass per CI config (.ci/run fails when a run executes fewer); .ci/run --record-counts\n")
        for label in sorted(counts):
            f.write(f"{label} {counts[label]}\n")


def main(argv):
    label, output = argv[1], argv[2]
    record = "--record" in argv[3:]
    with open(output, errors="replace") as f:
        targets = sorted({m.group(1) for m in map(TARGET.match, f) if m})
    totals = collections.Counter()
    skips = collections.Counter()
    missing = []
    for target in targets:
        package, name = target[2:].split(":", 1)
        logs = this_run_logs(os.path.join("bazel-testlogs", package, name))
        if not logs:
            missing.append(name)
            continue
        found = False
        for log in logs:
            with open(log, errors="replace") as f:
                lines = f.read().splitlines()
            for line in lines:
                m = SKIP.match(line)
                if m:
                    skips[f"{os.path.basename(m.group(2))}: {m.group(3)}"] += int(m.group(1))
            tail = [line for line in lines if re.search(r"\d+ (passed|failed|skipped)", line) and " in " in line]
            if tail:
                found = True
                for n, kind in SUMMARY.findall(tail[-1]):
                    totals[kind] += int(n)
        if not found:
            totals["passed"] += 1  # a test without pytest (the C++ stress test) counts once
    print(
        f"{label}: {totals['passed']} tests passed, {totals['skipped']} skipped, {totals['failed']} failed "
        f"in {len(targets)} targets"
    )
    for reason, n in sorted(skips.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  skipped {n:5d}  {reason}")
    if missing:
        print(f"{label}: no test log for {', '.join(missing)}")
    counts = read_record()
    was = counts.get(label)
    if record and (totals["failed"] or missing):
        print(f"{label}: not recorded: the run had failures")
        return 1
    if record:
        counts[label] = totals["passed"]
        write_record(counts)
        print(f"{label}: recorded {totals['passed']} in {os.path.relpath(RECORD)}")
        return 0
    if was is None:
        print(f"{label}: no recorded count in {os.path.relpath(RECORD)} (.ci/run --record-counts)")
        return 1
    if totals["passed"] < was:
        print(f"{label}: {totals['passed']} tests passed, fewer than the {was} recorded: tests stopped running")
        return 1
    if totals["passed"] > was:
        print(f"{label}: {totals['passed']} tests passed, {was} recorded (.ci/run --record-counts records it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
