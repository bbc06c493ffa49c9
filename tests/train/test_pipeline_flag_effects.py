"""The pipeline flags of the train CLI by their effect, in two-process pipeline runs (cpu: Gloo) under the launcher:
which layers each stage holds (--pipeline_split, --virtual_pipeline_parallel), read from the per-rank checkpoint
shards, and how many micro-batches' activations a stage holds at once (--pipeline_schedule), read from the step's
peak memory; the loss curve is the same whatever the split, chunks or schedule."""

import glob
import os

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, run_train, train_losses

TYPE = DEVICE.split(":")[0]


def _tokens(tmp_path):
    from infinitrain.data.tokens import write_tokens

    path = tmp_path / "train.bin"
    write_tokens(path, np.random.default_rng(3).integers(0, 60, 3000))
    return path


def pipeline_run(tmp_path, name, n_layer, *flags, accum=2):
    """A GPT-2 of n_layer layers for 2 steps of `accum` micro-batches (two processes when flags ask for a
    pipeline); returns (train losses, {step: record} of the metrics, checkpoint dir)."""
    from infinitrain.runs import read_metrics

    ckpt = tmp_path / name
    shape = ["--model=gpt2", f"--n_layer={n_layer}", "--n_head=2", "--n_embd=32", "--vocab_size=64"]
    batch = ["--sequence_length=16", "--batch_size=2", f"--total_batch_size={32 * accum}", "--num_iteration=2"]
    quiet = ["--val_loss_every=0", "--freq_generate_txt=0", "--save_optimizer_state=false"]
    nproc = 2 if any(f.startswith("--pipeline_parallel") for f in flags) else 1
    flags = [f"--input_bin={_tokens(tmp_path)}", *shape, *batch, *quiet, *flags, f"--save={ckpt}"]
    run_train(*flags, nproc=nproc, device=TYPE, cwd=tmp_path)
    metrics = ckpt / "metrics.jsonl"
    return train_losses(metrics), read_metrics(metrics)[1], ckpt


def stage_parts(ckpt):
    """Pipeline stage -> the parts of the model its checkpoint shard holds ("h.3", "wte", "ln_f", ...)."""
    out = {}
    for f in glob.glob(os.path.join(ckpt, "ckpt_*.bin*")):
        tensors, meta = it.checkpoint.load(f)
        names = [k.split(".")[1:3] for k in tensors if k.startswith("model.")]
        out[meta["shard"]["stage"]] = {f"h.{n[1]}" if n[0] == "h" else n[0] for n in names}
    return out


def blocks(*layers):
    return {f"h.{i}" for i in layers}


def test_pipeline_split_sets_the_layers_of_each_stage(tmp_path):
    """--pipeline_split=5,1 puts the embeddings and layers 0-4 on stage 0, layer 5 and the final norm on stage 1
    (which also holds the tied embedding, as the head); with --virtual_pipeline_parallel=2 the counts go in
    virtual-stage order, stage 0 holding virtual stages 0 and 2. The same losses as one process."""
    one, _, _ = pipeline_run(tmp_path, "one", 6)
    losses, _, ckpt = pipeline_run(tmp_path, "pp", 6, "--pipeline_parallel=2", "--pipeline_split=5,1")
    assert stage_parts(ckpt) == {0: blocks(0, 1, 2, 3, 4) | {"wte", "wpe"}, 1: blocks(5) | {"ln_f", "wte"}}
    np.testing.assert_allclose(losses, one, rtol=0, atol=1e-5)
    flags = ["--pipeline_parallel=2", "--virtual_pipeline_parallel=2", "--pipeline_split=2,1,1,2"]
    losses, _, ckpt = pipeline_run(tmp_path, "vpp", 6, *flags)
    assert stage_parts(ckpt) == {0: blocks(0, 1, 3) | {"wte", "wpe"}, 1: blocks(2, 4, 5) | {"ln_f", "wte"}}
    np.testing.assert_allclose(losses, one, rtol=0, atol=1e-5)


def test_virtual_pipeline_parallel_gives_each_stage_that_many_chunks(tmp_path):
    """Four layers over PP2: one chunk per stage holds two neighbouring layers; two chunks per stage hold one layer
    each, virtual stage v = chunk x 2 + stage, so stage 0 holds layers 0 and 2. The same losses either way."""
    plain, _, ckpt = pipeline_run(tmp_path, "vpp1", 4, "--pipeline_parallel=2")
    assert stage_parts(ckpt) == {0: blocks(0, 1) | {"wte", "wpe"}, 1: blocks(2, 3) | {"ln_f", "wte"}}
    losses, _, ckpt = pipeline_run(tmp_path, "vpp2", 4, "--pipeline_parallel=2", "--virtual_pipeline_parallel=2")
    assert stage_parts(ckpt) == {0: blocks(0, 2) | {"wte", "wpe"}, 1: blocks(1, 3) | {"ln_f", "wte"}}
    np.testing.assert_allclose(losses, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("vpp", [1, 2])
def test_pipeline_schedule_sets_the_activations_held(tmp_path, vpp):
    """GPipe runs every micro-batch's forward before any backward, so stage 0 holds all their activations: its
    peak memory grows by one micro-batch's activations per micro-batch. 1F1B (interleaved over the chunks with
    --virtual_pipeline_parallel=2) starts backwards as soon as the last stage can, so stage 0 holds a number set by
    the stages and chunks: the same peak with 4 or 8 micro-batches, and less than GPipe's. Both give the same
    losses."""
    peak, losses = {}, {}
    for schedule in ("gpipe", "1f1b"):
        for accum in (4, 8):
            flags = ["--pipeline_parallel=2", f"--virtual_pipeline_parallel={vpp}", f"--pipeline_schedule={schedule}"]
            losses[schedule, accum], records, _ = pipeline_run(tmp_path, f"{schedule}{accum}", 4, *flags, accum=accum)
            peak[schedule, accum] = max(r["mem_peak_mib"] for r in records.values())  # rank 0's: stage 0
    for accum in (4, 8):
        np.testing.assert_allclose(losses["gpipe", accum], losses["1f1b", accum], rtol=0, atol=1e-6)
    per_micro_batch = (peak["gpipe", 8] - peak["gpipe", 4]) / 4
    assert per_micro_batch > 0.05, peak  # MiB: a micro-batch's activations of two layers
    # (what 1F1B's peak gains: the step's token ids, all loaded up front, 1 KiB a micro-batch)
    assert abs(peak["1f1b", 8] - peak["1f1b", 4]) < 0.1 * per_micro_batch, peak
    assert peak["1f1b", 4] < peak["gpipe", 4] - 0.25 * per_micro_batch, peak
