"""Kill trials: SIGKILL the train CLI at random moments while it saves a checkpoint every step, then resume.

Each trial starts `infinitrain.train --resume` on one checkpoint directory, lets it run for a random time and
kills it with SIGKILL (often in the middle of a save). The bar, checked on every trial:
  - the next run resumes from the newest checkpoint that was complete when the previous one died,
  - its losses after the resume equal an uninterrupted run's at the same steps,
  - no temporary file is left in the directory once it has resumed.

    PYTHONPATH=python .venv/bin/python tests/kill_trials.py --trials=30
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

STEP = re.compile(r"^step (\d+)/\d+ \| train loss (\S+) \|")
RESUMED = re.compile(r"^resumed from (\S+) at step (\d+)$")


def train_cmd(data, ckpt, extra=()):
    flags = [
        f"--input_bin={data}",
        "--num_iteration=100000",
        "--warmup_steps=5",
        "--n_layer=2",
        "--n_embd=128",
        "--n_head=4",
        "--sequence_length=64",
        "--batch_size=8",
        "--sample_every=0",
        "--checkpoint_every=1",
    ]
    if ckpt:
        flags.append(f"--checkpoint_dir={ckpt}")
    return [sys.executable, "-m", "infinitrain.train", *flags, *extra]


def read_until(proc, pred, timeout):
    """Lines of proc's stdout until pred(line) is true (returns (lines, line)) or the deadline passes."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            return lines, None
        lines.append(line.rstrip("\n"))
        if pred(lines[-1]):
            return lines, lines[-1]
    return lines, None


def reference_losses(data, steps, env):
    """Losses of an uninterrupted run (no checkpoints) for steps 1..steps."""
    proc = subprocess.Popen(train_cmd(data, None), stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
    losses = {}
    try:
        while len(losses) < steps:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the reference run ended early")
            m = STEP.match(line)
            if m:
                losses[int(m.group(1))] = m.group(2)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min_seconds", type=float, default=0.5, help="shortest run before the kill (after resuming)")
    ap.add_argument("--max_seconds", type=float, default=3.0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    from infinitrain.data import write_tokens

    work = tempfile.mkdtemp(prefix="infinitrain-kill-")
    data, ckpt = os.path.join(work, "train.bin"), os.path.join(work, "ckpt")
    write_tokens(data, np.random.default_rng(1).integers(0, 256, size=200_000), kind="gpt2")

    results, failures, expected_step = [], [], 0
    for trial in range(1, args.trials + 1):
        proc = subprocess.Popen(
            train_cmd(data, ckpt, ["--resume"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            bufsize=1,
        )
        lines, line = read_until(proc, lambda s: s.startswith(("resumed from", "no checkpoint in")), 120)
        problems = []
        if line is None:
            proc.kill()
            problems.append(f"did not resume: {lines[-5:]} {proc.stderr.read()[-2000:]}")
            resumed_at = None
        elif line.startswith("no checkpoint"):
            resumed_at = 0
        else:
            resumed_at = int(RESUMED.match(line).group(2))
        if resumed_at is not None and resumed_at != expected_step:
            problems.append(f"resumed at step {resumed_at}, but the newest complete checkpoint was {expected_step}")
        leftovers = [f for f in os.listdir(ckpt) if f.endswith(".tmp")] if os.path.isdir(ckpt) else []
        if leftovers:
            problems.append(f"temporary files left after resuming: {leftovers}")
        # Run for a while, then SIGKILL: the kill often lands inside a save (one per step).
        wait = float(rng.uniform(args.min_seconds, args.max_seconds))
        deadline, steps = time.time() + wait, {}
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        for s in (out or "").splitlines():
            m = STEP.match(s)
            if m:
                steps[int(m.group(1))] = m.group(2)
        # The newest checkpoint complete at the kill: renames are atomic, so it is the newest ckpt_*.bin.
        names = sorted(f for f in os.listdir(ckpt) if f.startswith("ckpt_") and f.endswith(".bin"))
        expected_step = int(names[-1][5:13]) if names else 0
        tmp_now = [f for f in os.listdir(ckpt) if f.endswith(".tmp")]
        results.append((trial, resumed_at, len(steps), expected_step, len(tmp_now), steps))
        if problems:
            failures.append((trial, problems))
        print(
            f"trial {trial:2d}: resumed at {resumed_at}, ran {len(steps)} steps, killed after {wait:.2f} s; "
            f"newest checkpoint {expected_step}, temporary files at the kill {len(tmp_now)}"
            + (f" | PROBLEMS: {problems}" if problems else ""),
            flush=True,
        )

    # Every resumed run's losses must equal an uninterrupted run's.
    top = max(max(r[5], default=0) for r in results)
    print(f"reference run: {top} steps", flush=True)
    reference = reference_losses(data, top, env)
    mismatches = 0
    for trial, _, _, _, _, steps in results:
        bad = [s for s, loss in steps.items() if reference.get(s) != loss]
        if bad:
            mismatches += 1
            failures.append((trial, [f"losses differ from the uninterrupted run at steps {bad[:5]}"]))
    killed_in_save = sum(1 for r in results if r[4])
    print(
        f"{len(results)} trials: {len(failures)} lost or wrong runs, {mismatches} loss mismatches, "
        f"{killed_in_save} kills left a temporary file (all removed by the next start), "
        f"{sum(r[2] for r in results)} steps trained in all"
    )
    for f in failures:
        print("FAILURE", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
