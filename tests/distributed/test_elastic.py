"""Elastic restarts (python -m infinitrain.run --max_restarts=N): a worker killed mid-run brings every worker down
and up again, the train CLI continues from its newest intact checkpoint, and the finished curve equals an
uninterrupted run's bit for bit; the restart is in the metrics. Workers run on the cpu over Gloo whatever the
suite's device: restarts are the launcher's and the trainer's."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from harness import child_env, rng
from infinitrain.data import write_tokens

TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16", "--batch_size=2"]
TINY += ["--sample_every=0", "--val_every=0", "--device=cpu", "--save_interval=1"]
STEPS = 8

# The train CLI, except that rank 1 of the first round kills itself (SIGKILL: no clean-up, no checkpoint) once the
# checkpoint of step KILL_AT exists.
WORKER = """
import os, runpy, signal, sys, threading, time

def kill_when_saved(path):
    while not os.path.exists(path):
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)

if os.environ["INFINITRAIN_RESTART_COUNT"] == "0" and os.environ["RANK"] == os.environ.get("KILL_RANK", "1"):
    path = os.path.join(os.environ["KILL_DIR"], "ckpt_%08d.bin" % int(os.environ["KILL_AT"]))
    threading.Thread(target=kill_when_saved, args=(path,), daemon=True).start()
sys.argv[0] = "train"
runpy.run_module("infinitrain.train", run_name="__main__")
"""


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(rng().integers(0, 60, size=37), 60), kind="gpt2")
    return str(path)


def launch(tmp_path, save, *flags, launcher=(), kill_at=3, timeout=300):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    cmd = [sys.executable, "-m", "infinitrain.run", "--nproc_per_node=2", "--master_port=0", "--stop_timeout=2"]
    cmd += [*launcher, str(script), *flags, f"--save={save}"]
    env = child_env(KILL_DIR=str(save), KILL_AT=str(kill_at), INFINITRAIN_CCL_TIMEOUT_S="60")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def metrics(save):
    with open(os.path.join(save, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    configs = [r for r in records if r["kind"] == "config"]
    steps = {}
    for r in records:
        if r["kind"] == "step":
            steps[r["step"]] = r["train_loss"]  # a resumed run redoes steps after its checkpoint: the newest
    return configs, steps


def test_a_killed_rank_restarts_every_worker_from_the_newest_checkpoint(corpus, tmp_path):
    flags = [f"--input_bin={corpus}", *TINY, f"--num_iteration={STEPS}"]
    plain = launch(tmp_path, tmp_path / "plain", *flags, kill_at=10**6)  # never killed
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    p = launch(tmp_path, tmp_path / "elastic", *flags, launcher=["--max_restarts=2"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "rank 1 (local rank 1" in p.stderr and "exited with code 137" in p.stderr, p.stderr  # 128 + SIGKILL
    assert p.stderr.count("restarting every worker (restart 1 of 2)") == 1, p.stderr
    configs, steps = metrics(tmp_path / "elastic")
    _, expected = metrics(tmp_path / "plain")
    assert [c["restart"] for c in configs] == [0, 1], configs
    resumed_at = configs[1]["start_step"]
    assert resumed_at >= 3, configs  # the checkpoint that triggered the kill, or a later one
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert steps == expected  # bit for bit, the redone steps included
    assert f"resumed from {tmp_path / 'elastic'}" in p.stdout, p.stdout[-3000:]


def test_restarts_run_out_and_usage_errors_are_not_restarted(corpus, tmp_path):
    flags = [f"--input_bin={corpus}", *TINY, f"--num_iteration={STEPS}"]
    # Without restarts the kill ends the run, with the killed rank named.
    p = launch(tmp_path, tmp_path / "none", *flags)
    assert p.returncode != 0 and "restarting" not in p.stderr, p.stderr
    assert "rank 1 (local rank 1" in p.stderr, p.stderr
    # A flag the CLI refuses fails the same way every time: one round, status 2, no restart.
    p = launch(tmp_path, tmp_path / "bad", *flags, "--lora_dropout=2", launcher=["--max_restarts=3"])
    assert p.returncode == 2 and "restarting" not in p.stderr, p.stderr
    assert "--lora_dropout=2.0 must be in [0, 1)" in p.stderr, p.stderr


def test_launcher_flags(tmp_path):
    def run(*flags):
        cmd = [sys.executable, "-m", "infinitrain.run", *flags, "x.py"]
        return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)

    p = run("--max_restarts=-1")
    assert p.returncode == 2 and "--max_restarts must be >= 0, got -1" in p.stderr, p.stderr
    p = run("--max_restarts=1", "--nnodes=2")
    assert p.returncode == 2 and "--max_restarts with several nodes is not implemented yet" in p.stderr, p.stderr
