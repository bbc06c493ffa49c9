"""Tools' edge inputs: sample without a prompt (the end-of-text it starts from is not printed), lora_bench's
measurements of a tiny model (step time within the wall time, AdamW's state two float32 moments a parameter), and
torch_bench's worker on our side (one step time a step, each within the wall time)."""

import argparse
import json
import time

import numpy as np

from infinitrain.data import ByteTokenizer
from infinitrain.models import GPT2
from infinitrain.models.gpt2 import GPT2Config
from infinitrain.tools import lora_bench, sample, torch_bench


def test_sample_without_prompt_drops_the_start_token(tmp_path, capsys):
    """With no prompt, sample starts from end-of-text and prints only the generated text after it."""
    n_embd = int(np.random.default_rng().choice([8, 16]))
    model = GPT2(GPT2Config(block_size=16, vocab_size=257, padded_vocab_size=264, n_layer=1, n_head=2, n_embd=n_embd))
    model.save_llmc(str(tmp_path / "m.bin"))
    status = sample.main(
        [f"--llmc_filepath={tmp_path / 'm.bin'}", "--tokenizer_bin=byte", "--length=6", "--temperature=0"]
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    tok = ByteTokenizer()
    ids = GPT2.from_llmc(str(tmp_path / "m.bin")).generate(np.array([[tok.eot]]), 6, temperature=0.0)[0]
    assert out.out == tok.decode(ids[1:].tolist()) + "\n"


def test_lora_bench_measures_a_tiny_model():
    """lora_bench.run: per-step milliseconds positive and below the call's wall time per step; optimizer state
    8 bytes per trainable parameter (AdamW's two float32 moments), for full fine-tuning and for LoRA."""
    g = np.random.default_rng()
    args = argparse.Namespace(
        model="qwen3", device="cpu", n_layer=1, n_head=2, n_kv_head=1, n_embd=8 * int(g.integers(1, 3)),
        vocab_size=int(g.integers(32, 80)), sequence_length=8, batch_size=2, steps=2, lora_alpha=4.0,
        lora_target_modules="",
    )  # fmt: skip
    for rank in (0, 2):
        t0 = time.perf_counter()
        r = lora_bench.run(args, rank)
        wall_ms = (time.perf_counter() - t0) * 1e3
        assert 0 < r["ms"] < wall_ms / args.steps
        assert r["state_mib"] * 2**20 == 8 * r["trainable"]
        assert (r["trainable"] == r["total"]) == (rank == 0)


def test_torch_bench_worker_times_each_step(monkeypatch, capsys):
    """torch_bench's worker (our side) prints a JSON list of one duration a step: each positive, and together
    within the call's wall time. A tiny model stands in for the benchmark's sizes."""
    monkeypatch.setitem(torch_bench.MODELS, "tiny", (1, 2, 8, 16, 8, 2, 8))
    steps = int(np.random.default_rng().integers(2, 4))
    a = argparse.Namespace(side="ours", model="tiny", steps=steps, dtype="float32", threads=1, profile=False)
    t0 = time.perf_counter()
    torch_bench._worker(a)
    wall = time.perf_counter() - t0
    times = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(times) == steps
    assert all(t > 0 for t in times) and sum(times) < wall
