"""Options of the Hugging Face path that the main suites leave at their defaults: a Mixtral sliding_window wider
than the context, write_checkpoint's decimal "KB" shard size and its shard file names, and the balancing loss
summed over several MoE layers, each against a hand computation."""

import json

import numpy as np
import pytest

import infinitrain as it
from infinitrain.models import hf, mixtral
from infinitrain.models.moe import load_balancing_loss

MIXTRAL = dict(
    model_type="mixtral", vocab_size=37, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12, rms_norm_eps=1e-5,
    rope_theta=1e6, hidden_act="silu", num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
    sliding_window=None, tie_word_embeddings=False,
)  # fmt: skip


def test_mixtral_window_wider_than_context_is_full_attention():
    """A sliding_window at least max_position_embeddings never limits attention: accepted, same model config."""
    window = 12 + int(np.random.default_rng().integers(1, 5000))
    assert mixtral.config_from_hf(dict(MIXTRAL, sliding_window=window)) == mixtral.config_from_hf(MIXTRAL)
    assert mixtral.config_from_hf(dict(MIXTRAL, sliding_window=12)) == mixtral.config_from_hf(MIXTRAL)
    with pytest.raises(ValueError, match="sliding_window"):
        mixtral.config_from_hf(dict(MIXTRAL, sliding_window=11))


def test_write_checkpoint_kb_shards(tmp_path):
    """max_shard_size="1KB" is 1000 bytes: five 400-byte float32 tensors go two to a file, in three files named
    model-0000i-of-00003.safetensors, and read back unchanged."""
    g = np.random.default_rng()
    tensors = {f"w{i}": g.standard_normal(100).astype(np.float32) for i in range(5)}
    hf.write_checkpoint(tmp_path, {"model_type": "x"}, tensors, max_shard_size="1KB")
    files = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    assert files == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    back = hf.read_tensors(tmp_path)
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)


def test_load_balancing_loss_sums_every_layer():
    """With several layers' router stats the loss is E * sum_e (sum of counts)_e * (sum of probs)_e / tokens^2,
    the layers' counts and probabilities each summed (Hugging Face's concatenation over layers)."""
    g = np.random.default_rng()
    E, layers = 4, 3
    counts = [g.integers(0, 10, size=E) for _ in range(layers)]
    probs = [g.uniform(0.1, 3.0, size=E) for _ in range(layers)]
    tokens = [int(g.integers(5, 20)) for _ in range(layers)]
    stats = [
        (it.tensor(c, dtype="int64"), it.tensor(p, dtype="float64"), n)
        for c, p, n in zip(counts, probs, tokens, strict=True)
    ]
    want = E * float((sum(counts) * sum(probs)).sum()) / float(sum(tokens)) ** 2
    assert load_balancing_loss(stats, E).item() == pytest.approx(want, rel=1e-12)


def test_mixtral_head_dim_defaults_to_hidden_over_heads():
    """A Mixtral config without head_dim takes hidden_size / num_attention_heads (32 / 4 here), as Hugging Face's;
    where the heads do not divide the width (12 / 8) it is refused, not rounded down."""
    assert "head_dim" not in MIXTRAL
    assert mixtral.config_from_hf(MIXTRAL).head_dim == 32 // 4
    with pytest.raises(ValueError, match=r"n_embd \(12\) must be divisible by n_head \(8\)"):
        mixtral.config_from_hf(dict(MIXTRAL, hidden_size=12, num_attention_heads=8))
