"""bench_gpu's measured step on a tiny model: random token ids of the vocabulary, the untrained loss ln(vocab)."""

import json
import math

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
