"""Tensors on device "meta" (sharded initialisation's building block): a model built there holds no storage, and
each tensor materialised on the device under test has the values a build there gives (counter-based draws replayed
from the recorded seed and offset, fills, values read from a file only then); anything that needs data refuses
with a message."""

import gc

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
    gc.collect()  # earlier tests' tensors freed now, not during the build
    before = it.runtime.memory_allocated("cpu")
    it.manual_seed(seed)
    meta = _models("meta")
    assert it.runtime.memory_allocated("cpu") <= before  # nothing allocated for the meta build
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


def test_copy_into_a_meta_tensor_takes_its_values_at_the_call():
    src = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)
    t = it.empty(2, 3, device="meta").copy_(src)
    want = src.copy()
    src[:] = 7.0  # changed after the copy: the copy keeps what it was given
    np.testing.assert_array_equal(materialize(t, DEVICE).numpy(), want)
    drawn = it.empty(2, 3, device="meta").normal_()
    np.testing.assert_array_equal(
        materialize(it.empty(2, 3, device="meta").copy_(drawn), DEVICE).numpy(), materialize(drawn, DEVICE).numpy()
    )
    half = it.empty(2, 3, dtype="bfloat16", device="meta").copy_(drawn)  # from another dtype: converted
    np.testing.assert_array_equal(materialize(half, DEVICE).numpy(), materialize(drawn, DEVICE).to("bfloat16").numpy())
    with pytest.raises(ValueError, match=r"values of shape \(3, 2\) do not fit a tensor of shape \(2, 3\)"):
        it.empty(2, 3, device="meta").copy_(np.zeros((3, 2)))


def test_lora_adapters_load_onto_a_meta_model(tmp_path):
    from infinitrain.models import lora

    it.manual_seed(int(np.random.default_rng().integers(0, 2**31)))
    model, _ = _models("cpu")
    lora.apply_lora(model, "c_attn", rank=2)
    for p in lora.trainable_parameters(model):
        p.copy_(it.from_numpy(np.random.default_rng().standard_normal(p.shape).astype(np.float32)))
    lora.save_adapters(model, tmp_path / "ad")
    meta, _ = _models("meta")
    lora.apply_lora(meta, "c_attn", rank=2)
    lora.load_adapters(meta, tmp_path / "ad")
    for (name, p), (_, q) in zip(meta.named_parameters(), model.named_parameters(), strict=True):
        if "lora" in name:
            np.testing.assert_array_equal(materialize(p, DEVICE).numpy(), q.numpy(), err_msg=name)


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


@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen3"])
def test_a_hugging_face_folder_loads_onto_meta_lazily(tmp_path, family):
    """Tied heads included (the checkpoint's copy of the head compared with the embedding when that is read)."""
    from infinitrain.models import Qwen3, Qwen3Config

    g = np.random.default_rng()
    gpt2, llama = _models("cpu")
    model = {"gpt2": gpt2, "llama3": llama}.get(family) or Qwen3(
        Qwen3Config(16, 61, 2, 4, 2, 24, head_dim=8, intermediate_size=40, tie_word_embeddings=True)
    )
    for p in model.parameters():
        p.copy_(it.from_numpy(g.standard_normal(p.shape).astype(np.float32)))
    model.save_pretrained(tmp_path / "m")
    cls = type(model)
    lazy, eager = cls.from_pretrained(tmp_path / "m", "meta"), cls.from_pretrained(tmp_path / "m", DEVICE)
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert p.is_meta and [step[0] for step in p._t.init] == ["data"], name
        np.testing.assert_array_equal(materialize(p, DEVICE).numpy(), q.numpy(), err_msg=name)


def test_the_same_build_check_tells_files_apart(tmp_path):
    """Two llm.c files of the same shapes: their meta parameters' keys differ (the ranks' same-build check compares
    them); the same file read twice gives the same keys."""
    from infinitrain.tensor import init_key

    gpt2, _ = _models("cpu")
    gpt2.save_llmc(tmp_path / "a.bin")
    with it.no_grad():
        gpt2.wte.weight.mul_(2.0)
    gpt2.save_llmc(tmp_path / "b.bin")
    a1, a2, b = (GPT2.from_llmc(tmp_path / f, "meta") for f in ("a.bin", "a.bin", "b.bin"))
    keys = [[init_key(p) for p in m.parameters()] for m in (a1, a2, b)]
    assert keys[0] == keys[1] and keys[0] != keys[2]


def test_what_needs_data_refuses_a_meta_tensor():
    m = it.nn.Linear(4, 3, device="meta")
    with pytest.raises(RuntimeError, match="Linear: a tensor it uses is on device 'meta' \\(no data\\)"):
        m(it.randn(2, 4))
    with pytest.raises(RuntimeError, match="on the meta device has no data"):
        m.weight.numpy()
