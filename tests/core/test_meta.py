"""Tensors on device "meta" (sharded initialisation's building block): a model built there holds no storage, and
each tensor materialised on the device under test has the values a build there gives (counter-based draws replayed
from the recorded seed and offset, fills, values read from a file only then); anything that needs data refuses
with a message."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config
from infinitrain.tensor import load_, materialize


def _models(device):
    gpt2 = GPT2(GPT2Config(block_size=16, vocab_size=61, padded_vocab_size=64, n_layer=2, n_head=2, n_embd=32), device)
    llama = LLaMA3(LLaMA3Config(16, 61, 2, 4, 2, 32, ffn_dim_multiplier=1.0, multiple_of=16), device)
    return gpt2, llama


def test_a_model_built_on_meta_materialises_to_the_same_values():
    seed = int(np.random.default_rng().integers(0, 2**31))
    it.manual_seed(seed)
    real = _models(DEVICE)
    after_real = it.random.get_rng_state()
    before = it.runtime.memory_allocated("cpu")
    it.manual_seed(seed)
    meta = _models("meta")
    assert it.runtime.memory_allocated("cpu") == before  # nothing allocated for the meta build
    assert it.random.get_rng_state() == after_real  # the same draws reserved: later draws stay aligned
    for r, m in zip(real, meta, strict=True):
        want = dict(r.named_parameters())
        got = dict(m.named_parameters())
        assert list(want) == list(got)
        for name, p in got.items():
            assert p.is_meta and tuple(p.shape) == tuple(want[name].shape) and p.dtype == want[name].dtype
            v = materialize(p, DEVICE)
            assert not v.is_meta and str(v.device) == str(want[name].device)
            np.testing.assert_array_equal(v.numpy(), want[name].numpy(), err_msg=name)  # bit for bit
        for (name, b), (_, rb) in zip(m.named_buffers(), r.named_buffers(), strict=True):
            np.testing.assert_array_equal(materialize(b, DEVICE).numpy(), rb.numpy(), err_msg=name)


def test_meta_tensors_record_fills_copies_and_draws():
    t = it.empty(3, 4, device="meta")
    assert t.is_meta and t.shape == (3, 4) and t.numel() == 12 and str(t.device) == "meta"
    assert materialize(t.fill_(2.5), DEVICE).numpy().tolist() == [[2.5] * 4] * 3
    assert materialize(t.zero_(), DEVICE).numpy().sum() == 0
    src = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(materialize(t.copy_(src), DEVICE).numpy(), src)
    g = it.Generator().manual_seed(11)
    t.uniform_(-2.0, 3.0, generator=g)
    assert g.offset == 12
    want = it.empty(3, 4, device=DEVICE).uniform_(-2.0, 3.0, generator=it.Generator().manual_seed(11))
    np.testing.assert_array_equal(materialize(t, DEVICE).numpy(), want.numpy())
    h = it.tensor([[1.0, 2.0]], device="meta")
    assert h.is_meta and materialize(h, DEVICE).numpy().tolist() == [[1.0, 2.0]]


def test_an_embeddings_padding_row_is_replayed_after_its_draw():
    seed = int(np.random.default_rng().integers(0, 2**31))
    it.manual_seed(seed)
    real = it.nn.Embedding(10, 4, padding_idx=3, device=DEVICE)
    it.manual_seed(seed)
    meta = it.nn.Embedding(10, 4, padding_idx=3, device="meta")
    got = materialize(meta.weight, DEVICE).numpy()
    np.testing.assert_array_equal(got, real.weight.numpy())
    assert not got[3].any() and got[4].all()
    with pytest.raises(RuntimeError, match="takes only a number written into part of it"):
        meta.weight[0] = it.ones(4)


def test_load_reads_a_meta_tensors_values_only_when_materialised():
    calls = []
    vals = np.arange(6, dtype=np.float32).reshape(2, 3)

    def read():
        calls.append(1)
        return vals

    t = load_(it.empty(2, 3, device="meta"), read)
    assert calls == []
    np.testing.assert_array_equal(materialize(t, DEVICE).numpy(), vals)
    assert calls == [1]
    real = load_(it.empty(2, 3, device=DEVICE), read)  # a real tensor reads at once
    assert calls == [1, 1] and np.array_equal(real.numpy(), vals)
    with pytest.raises(ValueError, match=r"values of shape \(3, 2\) for a tensor of shape \(2, 3\)"):
        load_(it.empty(2, 3, device=DEVICE), lambda: vals.T)


def test_an_llmc_file_loads_onto_meta_lazily(tmp_path):
    it.manual_seed(int(np.random.default_rng().integers(0, 2**31)))
    gpt2, _ = _models("cpu")
    path = tmp_path / "m.bin"
    gpt2.save_llmc(path)
    lazy = GPT2.from_llmc(path, "meta")
    eager = GPT2.from_llmc(path, DEVICE)
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert p.is_meta and [step[0] for step in p._t.init] == ["data"]
        np.testing.assert_array_equal(materialize(p, DEVICE).numpy(), q.numpy(), err_msg=name)


def test_what_needs_data_refuses_a_meta_tensor():
    m = it.nn.Linear(4, 3, device="meta")
    with pytest.raises((TypeError, RuntimeError), match="meta tensor float32\\[3, 4\\]: no data"):
        m(it.randn(2, 4))
    with pytest.raises(RuntimeError, match="on the meta device has no data"):
        m.weight.numpy()
