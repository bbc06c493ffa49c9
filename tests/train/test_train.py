"""The train CLI end to end: step lines, exact resume from a checkpoint after a
simulated crash, refusal of corrupt checkpoints, and clear errors for bad flags."""

import os
import re

import numpy as np
import pytest

from harness import DEVICE, rng, run_train
from infinitrain import _C, backends
from infinitrain.data import write_tokens

STEP = re.compile(
    r"^step (\d+)/(\d+) \| train loss ([0-9.]+) \| lr \S+ \| norm \S+ \| \S+ ms \| \d+ tok/s \| mem \S+ MiB$"
)


def losses(stdout):
    out = {}
    for line in stdout.splitlines():
        m = STEP.match(line)
        if m:
            out[int(m.group(1))] = m.group(3)
    return out


def norms(stdout):
    return {
        int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ .*\| norm (\S+) \|", stdout, re.M)
    }


@pytest.fixture
def corpus(tmp_path):
    phrase = rng().integers(0, 40, size=9)
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(phrase, 200), kind="gpt2")
    return str(path)


# The corpus is a GPT-2 token file (vocabulary 50257 by llm.c's convention); --vocab_size keeps the model small.
TINY_RUN = ["--sequence_length=16", "--batch_size=4", "--sample_every=0"]
TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", *TINY_RUN]


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_resume_reproduces_the_uninterrupted_curve(model, corpus, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [f"--model={model}", f"--input_bin={corpus}", "--num_iteration=6", "--warmup_steps=2", *TINY]
    full = run_train(*args, f"--checkpoint_dir={ckpt}", "--checkpoint_every=3", "--total_batch_size=128")
    full_losses = losses(full.stdout)
    assert sorted(full_losses) == list(range(1, 7)), full.stdout
    assert float(full_losses[6]) < float(full_losses[1])
    # Simulate a crash after step 3: only the step-3 checkpoint survives.
    os.remove(ckpt / "ckpt_00000006.bin")
    resumed = run_train(*args, f"--checkpoint_dir={ckpt}", "--resume", "--total_batch_size=128")
    assert "resumed from" in resumed.stdout
    res_losses = losses(resumed.stdout)
    assert sorted(res_losses) == [4, 5, 6]
    for s in (4, 5, 6):
        assert res_losses[s] == full_losses[s], (s, full.stdout, resumed.stdout)


def test_resume_refuses_changed_settings(corpus, tmp_path):
    ckpt = tmp_path / "ckpt"
    run_train(f"--input_bin={corpus}", "--num_iteration=2", *TINY, f"--checkpoint_dir={ckpt}")
    p = run_train(
        f"--input_bin={corpus}", "--num_iteration=4", *TINY, f"--checkpoint_dir={ckpt}", "--resume", check=False
    )
    assert p.returncode != 0 and "--num_iteration=4 (checkpoint: 2)" in p.stderr, p.stderr


def test_corrupt_checkpoint_is_refused(corpus, tmp_path):
    ckpt = tmp_path / "ckpt"
    run_train(f"--input_bin={corpus}", "--num_iteration=2", *TINY, f"--checkpoint_dir={ckpt}")
    path = ckpt / "ckpt_00000002.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    p = run_train(
        f"--input_bin={corpus}", "--num_iteration=4", *TINY, f"--checkpoint_dir={ckpt}", "--resume", check=False
    )
    assert p.returncode != 0
    assert "corrupt" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--dtype=float16"], "float16"),
        (["--total_batch_size=100"], "must be a multiple of batch_size*sequence_length*devices=64"),  # 4 x 16 x 1
        (["--device=nosuch"], "unknown device type 'nosuch'"),
        (["--batch_size=0"], "batch_size"),
        (["--resume"], "--resume needs --checkpoint_dir"),
        (["--input_bin=/nonexistent/file.bin"], "/nonexistent/file.bin"),
        (["--model=gpt3"], "gpt3"),
    ],
)
def test_bad_flags_fail_clearly(flags, message, corpus):
    base = [] if any(f.startswith("--input_bin") for f in flags) else [f"--input_bin={corpus}"]
    p = run_train(*base, "--num_iteration=1", *TINY, *flags, check=False)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def _data_parallel_kind():
    """The device kind for data parallelism: the device under test's, or sim's when the cpu suite has it built in
    (the cpu has no collectives); None when neither has two devices with a CCL."""
    kind = _C.parse_device(DEVICE).split(":")[0]
    if kind == "cpu" and "sim" in backends.available():
        return "sim"  # registered in the training child on first use of "sim:0"
    return kind if _C.has_ccl(kind) and _C.device_count(kind) >= 2 else None


@pytest.mark.skipif(_data_parallel_kind() is None, reason="needs two devices with a CCL (or the sim provider)")
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_data_parallel_matches_one_device(model, corpus):
    kind = _data_parallel_kind()
    tiny = [f for f in TINY if not f.startswith("--batch_size")]
    args = [f"--model={model}", f"--input_bin={corpus}", f"--input_val_bin={corpus}", "--num_iteration=5", *tiny]
    args += ["--warmup_steps=1", "--val_every=5", "--val_batches=2"]
    out_one = run_train(*args, f"--device={kind}:0", "--batch_size=4").stdout
    out_two = run_train(*args, f"--devices={kind}:0,{kind}:1", "--batch_size=2").stdout
    one, two = losses(out_one), losses(out_two)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4, 5]
    for s in one:
        assert abs(float(one[s]) - float(two[s])) <= 1e-5, (s, one, two)
    # Averaged, not summed, gradients: clipping and AdamW would hide a factor of 2 in the weights; the norm shows it.
    n1, n2 = norms(out_one), norms(out_two)
    assert sorted(n1) == sorted(n2) == [1, 2, 3, 4, 5]
    for s in n1:
        assert abs(n1[s] - n2[s]) <= 2e-4 + 1e-5 * n1[s], (s, n1, n2)
    val = [float(re.search(r"val loss ([0-9.]+)", o).group(1)) for o in (out_one, out_two)]
    assert abs(val[0] - val[1]) <= 1e-5, val  # validation sees the same global batch


@pytest.mark.skipif(_data_parallel_kind() is None, reason="needs two devices with a CCL (or the sim provider)")
def test_nthread_per_process_trains_on_that_many_devices(corpus):
    """--nthread_per_process=2 on device 0 trains on devices 0 and 1: the curve of --devices with both, and the
    losses of one device with their global batch (2 rows each, 4 in all)."""
    kind = _data_parallel_kind()
    tiny = [f for f in TINY if not f.startswith("--batch_size")]
    args = [f"--input_bin={corpus}", "--num_iteration=3", "--warmup_steps=1", *tiny]
    threads = run_train(*args, f"--device={kind}:0", "--nthread_per_process=2", "--batch_size=2").stdout
    two = run_train(*args, f"--devices={kind}:0,{kind}:1", "--batch_size=2").stdout
    one = run_train(*args, f"--device={kind}:0", "--batch_size=4").stdout
    assert losses(threads) == losses(two) and sorted(losses(threads)) == [1, 2, 3]
    for s, loss in losses(one).items():
        assert abs(float(losses(threads)[s]) - float(loss)) <= 1e-5, (s, threads, one)


@pytest.mark.skipif(not DEVICE.startswith("sim"), reason="needs the sim provider's INFINITRAIN_SIM_SKIP_OPS")
def test_training_through_composites_matches_the_cpu(corpus):
    """With the fused ops' kernels removed, the composites carry training, and the curve matches the CPU's."""
    skip = "sdpa,sdpa_backward,gelu_tanh,gelu_tanh_backward,cross_entropy,cross_entropy_backward,adamw_"
    args = [f"--input_bin={corpus}", "--num_iteration=5", "--warmup_steps=1", *TINY]
    cpu = losses(run_train(*args, device="cpu").stdout)
    sim = losses(run_train(*args, env_extra={"INFINITRAIN_SIM_SKIP_OPS": skip}).stdout)
    assert sorted(cpu) == sorted(sim) == [1, 2, 3, 4, 5]
    for s in cpu:
        assert abs(float(cpu[s]) - float(sim[s])) <= 1e-5, (s, cpu, sim)
