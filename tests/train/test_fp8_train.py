"""--fp8 in the train CLI: the run trains its linear layers in FP8 and follows the bfloat16 run's loss; a resumed
FP8 run continues with the checkpoint's amax histories and scales and equals the uninterrupted one exactly; the
flags it cannot combine with are refused before anything runs."""

import numpy as np
import pytest

import harness
from harness import DEVICE, rng
from infinitrain.training.config import RunConfig, UsageError

BASE = (
    "--model=gpt2", "--n_layer=2", "--n_head=2", "--n_embd=64", "--sequence_length=32", "--batch_size=4",
    "--dtype=bfloat16", "--sample_every=0", "--val_loss_every=0", "--lr_warmup_iters=2",
)  # fmt: skip


def losses(stdout):
    return np.array([float(v[0]) for _, v in sorted(harness.step_lines(stdout).items())])


def test_fp8_follows_bfloat16():
    """Over 30 steps from the same seed and data, the FP8 run's loss stays within 2% of the bfloat16 run's (the
    smoothed curves), and the run says how many layers went to FP8 (2 blocks x 4 linears; the tied head stays)."""
    seed = f"--seed={int(rng().integers(1, 1000))}"
    bf16 = harness.run_train(*BASE, "--num_iteration=30", seed).stdout
    f8 = harness.run_train(*BASE, "--num_iteration=30", seed, "--fp8").stdout
    assert "fp8: 8 linear layers in FP8 (delayed scaling, amax history 16" in f8
    a, b = losses(bf16), losses(f8)
    assert len(a) == len(b) == 30
    smooth = lambda v: np.convolve(v, np.ones(5) / 5, mode="valid")  # noqa: E731
    rel = np.abs(smooth(b) - smooth(a)) / smooth(a)
    assert rel.max() < 0.02, rel
    assert not np.array_equal(a, b)  # FP8 did change the arithmetic


@pytest.mark.parametrize("scaling", ["delayed", "current"])
def test_fp8_resume_is_exact(tmp_path, scaling):
    """Six steps, saved at step 3, resumed to 6: the same losses, printed digit for digit, as six straight steps;
    the delayed run's checkpoint holds every FP8 layer's history and scales."""
    flags = (*BASE, f"--fp8_scaling={scaling}", "--fp8", "--fp8_amax_history=4", "--num_iteration=6")
    flags = (*flags, "--val_loss_every=2", "--val_batches=2")  # validation must not move the scales
    save = f"--save={tmp_path / 'ck'}"
    straight = harness.step_lines(harness.run_train(*flags, save, "--save_interval=3").stdout)
    (tmp_path / "ck" / "ckpt_00000006.bin").unlink()  # resume from step 3's
    resumed = harness.step_lines(harness.run_train(*flags, save, "--resume").stdout)
    assert {s: resumed[s] for s in (4, 5, 6)} == {s: straight[s] for s in (4, 5, 6)}
    from infinitrain.runs import read_checkpoint

    tensors, _ = read_checkpoint(str(tmp_path / "ck" / "ckpt_00000003.bin"))
    names = [n for n in tensors if "fp8_amax_history" in n]
    assert len(names) == 8
    hist = np.asarray(tensors[names[0]])
    assert hist.shape == (3, 4)
    if scaling == "delayed":  # three uses (one micro-batch a step) of a four-long history
        assert (hist[:, :3] > 0).all() and (hist[:, 3] == 0).all()
    else:
        assert (hist == 0).all()


def test_fp8_ddp_resume_is_exact(tmp_path):
    """Two processes under the launcher (DDP): their amax histories are made equal every step, so rank 0's
    checkpoint holds every rank's FP8 state and the resumed run equals the uninterrupted one."""
    flags = (*BASE, "--fp8", "--fp8_amax_history=4", "--num_iteration=4")
    save = f"--save={tmp_path / 'ck'}"
    straight = harness.step_lines(harness.run_train(*flags, save, "--save_interval=2", nproc=2, device="cpu").stdout)
    (tmp_path / "ck" / "ckpt_00000004.bin").unlink()
    resumed = harness.step_lines(harness.run_train(*flags, save, "--resume", nproc=2, device="cpu").stdout)
    assert {s: resumed[s] for s in (3, 4)} == {s: straight[s] for s in (3, 4)}


@pytest.mark.parametrize(
    "extra,named",
    [
        ({"lora_rank": 4}, "--lora_rank"),
        ({"tensor_parallel": 2}, "--tensor_parallel"),
        ({"pipeline_parallel": 2}, "--pipeline_parallel"),
        ({"zero_stage": 3}, "--zero_stage=3"),
        ({"activation_recompute": True}, "--activation_recompute"),
    ],
)
def test_fp8_conflicts_refused(extra, named):
    with pytest.raises(UsageError, match=f"--fp8 with {named}.*not implemented yet"):
        RunConfig(fp8=True, **extra)


def test_fp8_bounds():
    with pytest.raises(UsageError, match="fp8_amax_history"):
        RunConfig(fp8=True, fp8_amax_history=0)
    with pytest.raises(UsageError, match="fp8_scaling"):
        RunConfig(fp8=True, fp8_scaling="dynamic")


def test_fp8_on_the_device_under_test_runs():
    """The device under test has FP8 kernels (cpu, sim, cuda): one step runs there."""
    out = harness.run_train(*BASE, "--num_iteration=1", "--fp8", device=DEVICE).stdout
    assert "fp8: 8 linear layers" in out
