"""The train CLI under abuse, continued (issue 29): restarts over another run's files, signals in the middle of a
long step, sizes that cannot finish, output paths that are not regular files, inputs that are not regular files,
and a checkpoint directory without room for two checkpoints. Every refusal is one `error: ...` line, a non-zero
exit and no training step."""

import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from harness import DEVICE, child_env, rng, run_train, run_train_in_process, stdout_queue, step_lines
from infinitrain import checkpoint
from infinitrain.data import write_tokens

TINY_RUN = ["--sequence_length=16", "--batch_size=4", "--sample_every=0", "--val_every=0"]
TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", *TINY_RUN]
# A child that would block (opening a FIFO, reading /dev/urandom) fails the test by this timeout, not hangs it.
TIMEOUT = 120


def assert_refused(p, *needles, status=None):
    """One `error:` line holding every needle, a non-zero exit (status if given), no traceback, no step trained."""
    assert p.returncode != 0 and (status is None or p.returncode == status), (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, f"expected one error line, got: {p.stderr}"
    for needle in needles:
        assert needle in errors[0], f"expected {needle!r} in {errors[0]!r}"
    assert not step_lines(p.stdout), f"a refused run trained: {p.stdout}"
    return errors[0]


def train(*flags, check=True, **kw):
    return run_train(*flags, check=check, timeout=kw.pop("timeout", TIMEOUT), **kw)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(rng().integers(0, 40, size=9), 2200), kind="gpt2")  # 19800 tokens
    return str(path)


def names(d):
    return sorted(os.listdir(d))


# ---- restarts -----------------------------------------------------------------------------------------------


def damage(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_restart_after_every_checkpoint_was_damaged_is_refused_until_fresh(corpus, tmp_path):
    """Every checkpoint damaged: --resume renamed them and exited 1, but the same command again (a scheduler's
    restart) printed "starting from scratch" and trained over the old run's files with exit 0. Now it refuses,
    naming them, until --fresh sets them aside; the scheduler's command then continues the new run."""
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", "--num_iteration=2", "--warmup_steps=1", *TINY, f"--save={ckpt}"]
    train(*args, "--save_interval=1")
    for path in ckpt.glob("ckpt_*.bin"):
        damage(path)
    first = train(*args, "--resume", check=False)
    assert_refused(first, "every one was damaged", status=1)
    left = names(ckpt)
    assert "ckpt_00000001.bin.damaged" in left and "ckpt_00000002.bin.damaged" in left, left
    again = train(*args, "--resume", check=False)  # the restart
    assert_refused(again, "ckpt_00000001.bin.damaged", "ckpt_00000002.bin.damaged", "metrics.jsonl", "--fresh")
    assert "starting from scratch" not in again.stdout, again.stdout
    assert names(ckpt) == left, "a refused restart changed the directory"
    assert "pass --fresh instead of --resume" in first.stderr, first.stderr  # the way out, from the first failure
    assert_refused(train(*args, check=False), "another run's files", "--fresh")  # not resuming: the same
    fresh = train(*args, "--fresh")
    assert sorted(step_lines(fresh.stdout)) == [1, 2], fresh.stdout
    aside = [n for n in names(ckpt) if n.startswith("earlier-run-")]
    assert len(aside) == 1 and "moved another run's files" in fresh.stdout, (names(ckpt), fresh.stdout)
    assert names(ckpt / aside[0]) == ["ckpt_00000001.bin.damaged", "ckpt_00000002.bin.damaged", "metrics.jsonl"]
    restart = train(*args, "--resume")
    assert f"resumed from {ckpt / 'ckpt_00000002.bin'} at step 2" in restart.stdout, restart.stdout
    both = train(*args, "--resume", "--fresh", check=False)
    assert_refused(both, "--fresh and --resume", status=2)


def test_a_new_run_over_another_runs_checkpoints_is_refused(corpus, tmp_path):
    """A run without --resume over another run's checkpoints warned and trained on: its rotation then deleted its
    own checkpoints (older names) and kept the other run's, which a later --resume took up."""
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", "--warmup_steps=1", *TINY, f"--save={ckpt}"]
    train(*args, "--num_iteration=4")
    p = train(*args, "--num_iteration=2", "--learning_rate=2e-3", check=False)
    assert_refused(p, f"--checkpoint_dir={ckpt}", "ckpt_00000004.bin", "metrics.jsonl", "--fresh", "--resume", status=2)
    assert names(ckpt) == [".lock", "ckpt_00000004.bin", "metrics.jsonl"]
    # --load from elsewhere into it is starting over there too; --load of its own checkpoint continues it.
    other = tmp_path / "other"
    train(*args[:-1], f"--save={other}", "--num_iteration=2")
    p = train(*args, "--num_iteration=6", f"--load={other}", check=False)
    assert_refused(p, "another run's files", status=2)
    p = train(*args, "--num_iteration=6", f"--load={ckpt}")
    assert "at step 4" in p.stdout and sorted(step_lines(p.stdout)) == [5, 6], p.stdout
    p = train(*args, "--num_iteration=8", f"--load={ckpt}", "--fresh", check=False)
    assert_refused(p, "--fresh would move away the checkpoint", status=2)


def test_what_counts_as_another_runs_files(corpus, tmp_path):
    """An empty or missing --save starts from scratch with --resume (a scheduler's first launch); so does an
    earlier attempt of the same run that saved no checkpoint (its metrics show the same settings); the user's own
    files do not count. A metrics file of other settings does."""
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", "--num_iteration=1", *TINY, f"--save={ckpt}", "--resume"]
    p = train(*args)
    assert "no checkpoint in" in p.stdout and "starting from scratch" in p.stdout, p.stdout
    os.remove(ckpt / "ckpt_00000001.bin")  # as if killed before its first checkpoint, while writing a metrics line
    with open(ckpt / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "st')
    (ckpt / "notes.txt").write_text("the user's")
    p = train(*args)
    assert "starting from scratch" in p.stdout and sorted(step_lines(p.stdout)) == [1], p.stdout
    assert (ckpt / "notes.txt").read_text() == "the user's"
    lines = (ckpt / "metrics.jsonl").read_text().splitlines()
    assert '{"kind": "step", "st' in lines, "the new run's lines must start on a line of their own"
    os.remove(ckpt / "ckpt_00000001.bin")
    p = train(*args, "--learning_rate=5e-4", check=False)
    assert_refused(p, "no intact checkpoint to resume", "metrics.jsonl", "--fresh instead of --resume")
    assert "notes.txt" not in p.stderr
    p = train(*args[:-1], "--learning_rate=5e-4", "--fresh")
    aside = [n for n in names(ckpt) if n.startswith("earlier-run-")]
    assert names(ckpt / aside[0]) == ["metrics.jsonl"] and (ckpt / "notes.txt").exists(), names(ckpt)


# ---- signals in a long step ---------------------------------------------------------------------------------

ACCUM = 100
LONG_STEPS = ["--num_iteration=3", "--warmup_steps=1", *TINY, f"--total_batch_size={4 * 16 * ACCUM}"]
# The train CLI with every batch read 40 ms late: a step of ACCUM micro-batches takes over 4 s however fast the
# machine, a micro-batch tens of milliseconds (the numbers are those of the plain CLI).
SLOW_TRAIN = """
import sys, time
from infinitrain import train
from infinitrain.data import loader
read = loader.DataLoader.__next__
def late(self):
    time.sleep(0.04)
    return read(self)
loader.DataLoader.__next__ = late
sys.argv = ["train", *sys.argv[1:]]
train.run()
"""


def start_slow(*flags):
    cmd = [sys.executable, "-c", SLOW_TRAIN, f"--device={DEVICE}", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    stdout_queue(proc)
    return proc


def wait_for_line(proc, prefix, timeout=TIMEOUT):
    lines, deadline = [], time.time() + timeout
    while True:
        try:
            line = proc.lines.get(timeout=max(0.0, deadline - time.time()))
        except queue.Empty:
            line = None
        if line is None:
            proc.kill()
            raise AssertionError(f"no line starting {prefix!r}: {''.join(lines)} {proc.stderr.read()}")
        lines.append(line)
        if line.startswith(prefix):
            return lines


def rest(proc, timeout=TIMEOUT):
    out = []
    while (line := proc.lines.get(timeout=timeout)) is not None:
        out.append(line)
    return "".join(out), proc.stderr.read()


def stop_in_step_two(sig, corpus, ckpt):
    """Starts a slow run and signals it half a second into step 2 (which takes over 4 s); returns (seconds from
    the signal to the exit, exit status, stdout, stderr)."""
    proc = start_slow(f"--input_bin={corpus}", *LONG_STEPS, f"--save={ckpt}")
    lines = wait_for_line(proc, "step 1/3")
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    elapsed = time.monotonic() - t0
    out, err = rest(proc)
    return elapsed, proc.returncode, "".join(lines) + out, err


def test_sigterm_stops_between_micro_batches_and_resumes_exactly(corpus, tmp_path):
    """SIGTERM waited for the step in progress: with many micro-batches that is minutes. Now the step is given up
    at the next micro-batch, the last completed step is saved (never a partial one) within seconds, and --resume
    from it continues exactly as a run that was never stopped."""
    ckpt = tmp_path / "ckpt"
    elapsed, status, out, err = stop_in_step_two(signal.SIGTERM, corpus, ckpt)
    assert status == 143 and "Traceback" not in err, (status, out, err)
    assert sorted(step_lines(out)) == [1], f"expected step 2 given up, got: {out}"
    assert "gave up step 2 after" in out and "stopped at step 1; saved" in out, out
    assert elapsed < 3, f"the run took {elapsed:.1f} s to stop (one micro-batch and a small save expected)"
    assert names(ckpt) == [".lock", "ckpt_00000001.bin", "metrics.jsonl"], names(ckpt)
    resumed = train(f"--input_bin={corpus}", *LONG_STEPS, f"--save={ckpt}", "--resume")
    assert f"resumed from {ckpt / 'ckpt_00000001.bin'} at step 1" in resumed.stdout, resumed.stdout
    straight = step_lines(train(f"--input_bin={corpus}", *LONG_STEPS).stdout)
    after = step_lines(resumed.stdout)
    assert sorted(after) == [2, 3] and all(after[s] == straight[s] for s in after), (after, straight)


def test_ctrl_c_stops_between_micro_batches(corpus, tmp_path):
    ckpt = tmp_path / "ckpt"
    elapsed, status, out, err = stop_in_step_two(signal.SIGINT, corpus, ckpt)
    assert status == 130 and "Traceback" not in err, (status, out, err)
    assert sorted(step_lines(out)) == [1] and "gave up step 2" in out, out
    assert elapsed < 3, f"the run took {elapsed:.1f} s to stop"
    assert [n for n in names(ckpt) if n.startswith(("ckpt_", "."))] == [".lock", "ckpt_00000001.bin"], names(ckpt)


# ---- sizes that cannot finish -------------------------------------------------------------------------------


def test_sizes_that_cannot_finish_are_refused_at_start(corpus, tmp_path):
    val = tmp_path / "val.bin"
    write_tokens(val, np.arange(200) % 40, kind="gpt2")  # three batches of 4x16
    for flags, needles in (
        # 310 micro-batches of 64 tokens: more than the 19800-token file holds in one pass.
        (["--total_batch_size=19840"], ["--total_batch_size=19840", "310 micro-batches", "19800 tokens"]),
        ([f"--total_batch_size={64 * (2**16 + 1)}"], ["65537 micro-batches", "more than 65536"]),
        ([f"--input_val_bin={val}", "--val_every=1", "--val_batches=5"], ["--val_batches=5", "holds 3 validation"]),
    ):
        p = train(f"--input_bin={corpus}", "--num_iteration=1", *TINY, *flags, check=False, timeout=60)
        assert_refused(p, *needles, status=2)
    # The default --val_batches is cut to what the file holds, saying so.
    p = train(f"--input_bin={corpus}", "--num_iteration=1", *TINY, f"--input_val_bin={val}", "--val_every=1")
    assert "holds 3 validation batches of 4x16 tokens; each validation uses 3" in p.stdout, p.stdout


# ---- outputs that are not regular files ---------------------------------------------------------------------


def test_atomic_write_writes_through_symlinks_and_never_replaces_special_files(tmp_path):
    """atomic_write renamed its temporary file over the target: a symlink became a file, a FIFO or a device node
    (as root: /dev/null) a regular file."""
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    checkpoint.atomic_write(link, lambda f: f.write(b"new"))
    assert link.is_symlink() and real.read_bytes() == b"new"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "to_fifo"
    to_fifo.symlink_to(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    targets = [(fifo, "FIFO"), (to_fifo, "FIFO"), (folder, "directory")]
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers, in a scratch folder
        targets.append((device, "character device"))
    except PermissionError:
        pass  # not root: the FIFO stands for the special files
    for target, kind in targets:
        before = os.stat(target).st_mode
        with pytest.raises(OSError, match=f"is a {kind}.*refusing to replace it"):
            checkpoint.atomic_write(target, lambda f: f.write(b"x"))
        assert os.stat(target).st_mode == before, target
    assert not [n for n in names(tmp_path) if n.endswith(".tmp")]


def test_outputs_that_are_not_regular_files_are_refused_or_written_through(corpus, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    base = [f"--input_bin={corpus}", "--num_iteration=1", *TINY]
    ckpt_dir = tmp_path / "dirckpt"
    (ckpt_dir / "ckpt_00000001.bin").mkdir(parents=True)  # where the save would go
    lock_dir = tmp_path / "lockckpt"
    lock_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (lock_dir / ".lock").symlink_to(victim)  # the lock wrote its owner line into whatever this named
    adapters = tmp_path / "adapters"
    adapters.write_text("a file")
    prof = tmp_path / "prof"
    (prof / "p.profile.md").mkdir(parents=True)
    for flags, needles in (
        (["--save=/dev/null"], ["--checkpoint_dir=/dev/null", "character device, not a directory"]),
        ([f"--save={ckpt_dir}"], ["ckpt_00000001.bin is a directory"]),
        ([f"--save={lock_dir}"], [".lock", "symlink"]),
        ([f"--metrics_file={fifo}"], ["--metrics_file", "FIFO (named pipe) with no reader"]),
        ([f"--log_file={fifo}"], ["--log_file", "FIFO (named pipe) with no reader"]),
        ([f"--precision_check=output_path={fifo}"], ["output_path", "FIFO (named pipe) with no reader"]),
        (["--model=gpt2", "--lora_rank=2", f"--lora_save_path={adapters}"], ["--lora_save_path", "not a directory"]),
        ([f"--save={prof}", "--profile_steps=1", "--profile_name=p"], ["p.profile.md is a directory"]),
    ):
        p = train(*base, *flags, check=False, timeout=60)
        assert_refused(p, *needles)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert victim.read_text() == "keep me" and (ckpt_dir / "ckpt_00000001.bin").is_dir()
    # A symlinked metrics file is written through; a FIFO with its reader there gets the lines.
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    train(*base, f"--metrics_file={link}")
    assert link.is_symlink() and '"kind": "step"' in real.read_text()
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    time.sleep(0.2)  # the reader opens the FIFO first
    train(*base, f"--metrics_file={fifo}")
    reader.join(timeout=30)
    assert got and '"kind": "end", "status": "completed"' in got[0], got


# ---- inputs that are not regular files ----------------------------------------------------------------------


def test_inputs_that_are_not_regular_files_are_refused(corpus, tmp_path):
    """A FIFO as an input blocked the run forever (opening it waits for a writer); /dev/urandom as the tokenizer
    was read forever; /dev/zero read as "too short"."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for flags, needles in (
        ([f"--input_bin={fifo}"], [f"--input_bin={fifo}", "is a FIFO (named pipe), not a regular file"]),
        ([f"--input_bin={corpus}", f"--input_val_bin={fifo}"], ["--input_val_bin", "FIFO"]),
        (["--input_bin=/dev/zero"], ["--input_bin=/dev/zero", "is a character device, not a regular file"]),
        ([f"--input_bin={corpus}", "--tokenizer_bin=/dev/urandom"], ["--tokenizer_bin", "character device"]),
        ([f"--input_bin={corpus}", f"--tokenizer_bin={folder}"], ["--tokenizer_bin", "is a directory"]),
        ([f"--input_bin={corpus}", f"--llmc_filepath={fifo}"], ["--llmc_filepath", "FIFO"]),
        ([f"--input_bin={corpus}", "--model=gpt2", f"--config_json={fifo}"], ["--config_json", "FIFO"]),
        ([f"--input_bin={corpus}", f"--load={fifo}"], ["--load", "FIFO"]),
        # An empty directory started a run from scratch with exit 0, as if continuing one.
        ([f"--input_bin={corpus}", f"--load={folder}"], [f"--load={folder}", "holds no checkpoint (ckpt_*.bin)"]),
        ([f"--input_bin={corpus}", f"--lora_load_path={corpus}"], ["--lora_load_path", "not a directory"]),
    ):
        fixed = any(f.startswith(("--llmc_filepath", "--config_json", "--tokenizer_bin")) for f in flags)
        p = train("--num_iteration=1", *(TINY_RUN if fixed else TINY), *flags, check=False, timeout=60)
        assert_refused(p, *needles, status=2)


# ---- room for two checkpoints -------------------------------------------------------------------------------


MIDSIZE = ["--model=llama3", "--n_layer=2", "--n_embd=64", "--n_head=4", "--n_kv_head=2", "--vocab_size=64", *TINY_RUN]


def fake_free_space(monkeypatch, under, free):
    """os.statvfs reports `free` bytes available for paths under `under` (the real answer elsewhere)."""
    real = os.statvfs

    def statvfs(path):
        st = real(path)
        if not os.path.abspath(os.fspath(path)).startswith(str(under)):
            return st
        return os.statvfs_result((st.f_bsize, 1, st.f_blocks, free, free, *st[5:]))

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_checkpoint_dir_without_room_for_two_checkpoints_is_refused(corpus, tmp_path, monkeypatch, capsys):
    """A --save without room failed at the first (or second) save, after hours of training."""
    from infinitrain.training import RunConfig, Trainer

    probe = Trainer(RunConfig(input_bin=corpus, model="llama3", n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                              vocab_size=64, sequence_length=16, batch_size=4, freq_generate_txt=0, val_loss_every=0,
                              num_iteration=1, save=str(tmp_path / "probe"), device=DEVICE))  # fmt: skip
    assert probe.fit() == 0
    size = os.path.getsize(tmp_path / "probe" / "ckpt_00000001.bin")  # one checkpoint of the model below
    capsys.readouterr()
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", *MIDSIZE, "--num_iteration=2", "--save_interval=1", f"--save={ckpt}"]
    fake_free_space(monkeypatch, tmp_path, int(1.5 * size))
    p = run_train_in_process(capsys, *args)
    assert_refused(p, f"--checkpoint_dir={ckpt}", "no room for two checkpoints", "free", status=2)
    assert not list(ckpt.glob("ckpt_*")), names(ckpt)
    fake_free_space(monkeypatch, tmp_path, 2 * size + (1 << 20))
    assert run_train_in_process(capsys, *args).returncode == 0
    # Resuming, its two checkpoints count as room (rotation deletes them): less than one more is enough.
    fake_free_space(monkeypatch, tmp_path, size // 2)
    p = run_train_in_process(capsys, *args, "--resume")
    assert p.returncode == 0 and "resumed from" in p.stdout, p.stderr
    # The estimate bounds the real size (a few header bytes over).
    assert size <= probe.checkpoint_bytes() <= size + (256 << 10), (size, probe.checkpoint_bytes())


def test_no_room_on_a_small_file_system(corpus, tmp_path):
    """The same through the CLI on a real 2 MiB tmpfs (in a private mount namespace: root only)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=2m tmpfs {mnt}"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    cmd = [sys.executable, "-m", "infinitrain.train", f"--device={DEVICE}", f"--input_bin={corpus}", *MIDSIZE]
    cmd += ["--num_iteration=2", "--save_interval=1", f"--save={mnt / 'ckpt'}"]
    script = 'mount -t tmpfs -o size=2m tmpfs "$0" && exec "$@"'  # the mount ends with the process
    p = subprocess.run(["unshare", "-m", "sh", "-c", script, str(mnt), *cmd], capture_output=True, text=True,
                       env=child_env(), timeout=TIMEOUT)  # fmt: skip
    assert_refused(p, "no room for two checkpoints", "MiB free", status=2)


def test_lora_adapters_on_a_read_only_file_system_are_refused_at_start(corpus, tmp_path):
    """--lora_save_path on a read-only mount failed after the last step with a bare OSError (status 1)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro,size=1m tmpfs {mnt}"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    out = mnt / "adapters" / "new"
    cmd = [sys.executable, "-m", "infinitrain.train", f"--device={DEVICE}", f"--input_bin={corpus}", *TINY]
    cmd += ["--num_iteration=2", "--lora_rank=2", f"--lora_save_path={out}"]
    script = 'mount -t tmpfs -o ro,size=1m tmpfs "$0" && exec "$@"'
    p = subprocess.run(["unshare", "-m", "sh", "-c", script, str(mnt), *cmd], capture_output=True, text=True,
                       env=child_env(), timeout=TIMEOUT)  # fmt: skip
    assert_refused(p, f"--lora_save_path={out}", f"cannot write in {mnt} (read-only or no permission)", status=2)
