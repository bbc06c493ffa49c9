"""bench_gpu's measured step on a tiny model: random token ids of the vocabulary, the untrained loss ln(vocab),
ms_per_step the median step time."""

import json
import math
import types

from absl.testing import flagsaver

from harness import DEVICE
from infinitrain.tools import bench_gpu


def test_main_trains_on_random_ids_of_the_vocabulary(monkeypatch, capsys):
    """main() on a tiny GPT-2 (standing in for the 124M one) on the cpu prints one JSON line whose loss is that of
    an untrained model on token ids drawn from the vocabulary: ln(vocab) (init std 0.02 keeps the logits near 0)."""
    from infinitrain.models import GPT2, GPT2Config

    vocab = 61

    def tiny(model, seq, device):
        cfg = GPT2Config(block_size=seq, vocab_size=vocab, padded_vocab_size=64, n_layer=1, n_head=2, n_embd=16)
        return GPT2(cfg, device), vocab

    monkeypatch.setattr(bench_gpu, "build", tiny)
    if not bench_gpu.FLAGS.is_parsed():
        bench_gpu.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(device=DEVICE, model="gpt2", batch=4, seq=16, steps=1, warmup=0, profile="", fp8=False):
        bench_gpu.main([])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["batch"], out["seq"], out["model"]) == (4, 16, "gpt2")
    assert abs(out["loss"] - math.log(vocab)) < 0.05


def test_ms_per_step_is_the_median_step_time(monkeypatch, capsys):
    """ms_per_step is the median of the measured steps' wall times in milliseconds, rounded to 0.01, and
    tokens_per_s is batch * seq over that median (the clock here advances by chosen step times)."""
    from infinitrain.models import GPT2, GPT2Config

    def tiny(model, seq, device):
        cfg = GPT2Config(block_size=seq, vocab_size=61, padded_vocab_size=64, n_layer=1, n_head=2, n_embd=16)
        return GPT2(cfg, device), 61

    durations = [0.0125, 0.04, 0.02]  # median 20 ms
    ticks = iter([t for i, d in enumerate(durations) for t in (float(i), i + d)])

    monkeypatch.setattr(bench_gpu, "build", tiny)
    monkeypatch.setattr(bench_gpu, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    if not bench_gpu.FLAGS.is_parsed():
        bench_gpu.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(device=DEVICE, model="gpt2", batch=2, seq=8, steps=3, warmup=0, profile="", fp8=False):
        bench_gpu.main([])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ms_per_step"] == 20.0
    assert out["tokens_per_s"] == 2 * 8 * 50
