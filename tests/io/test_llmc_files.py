"""llm.c files written and read by independent code (tests/numpy_models.py: struct and NumPy following llm.c's
train_gpt2.py / train_llama3.py and InfiniTrain's LLaMA 3 reader), checked against infinitrain's readers and
writers tensor by tensor. Every tensor is distinct random data, so a swapped, transposed or shifted tensor fails;
the loaded models' logits are compared with the NumPy models on the same arrays."""

import struct

import numpy as np
import pytest

import infinitrain as it
import numpy_models as ref
from harness import DEVICE, assert_close, rng
from infinitrain.data import ByteTokenizer, DataLoader, Tokenizer, read_tokens, read_tokens_header, write_tokens
from infinitrain.models import GPT2, GPT2Config, LLaMA3

V, VP, MAXT, L = 61, 64, 16, 2
GPT2_CFG = dict(block_size=MAXT, vocab_size=V, n_layer=L, n_head=4, n_embd=32)
LLAMA_CFG = dict(block_size=MAXT, vocab_size=V, n_layer=L, n_head=4, n_kv_head=2, n_embd=32)
LLAMA_CFG.update(ffn_dim_multiplier=1.5, multiple_of=16, norm_eps=2.0**-14, rope_theta=5e5, use_scaled_rope=True)
LLAMA_CFG.update(max_gen_batch_size=4)
GPT2_KEYS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight")
GPT2_KEYS += ("attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias")
GPT2_KEYS += ("mlp.c_proj.weight", "mlp.c_proj.bias")
LLAMA_KEYS = ("ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight", "mlp.c_fc.weight")
LLAMA_KEYS += ("mlp.c_fc2.weight", "mlp.c_proj.weight")


def gpt2_params(gen):
    c = GPT2_CFG
    p = ref.gpt2_random_params(gen, vocab_size=V, padded_vocab_size=VP, block_size=MAXT, n_layer=L, n_embd=32)
    return ref.to_f32(p), c


def llama_params(gen):
    c = LLAMA_CFG
    hidden = ref.llama3_hidden_dim(c["n_embd"], c["ffn_dim_multiplier"], c["multiple_of"])
    p = ref.llama3_random_params(
        gen,
        vocab_size=V,
        n_layer=L,
        n_head=c["n_head"],
        n_kv_head=c["n_kv_head"],
        n_embd=c["n_embd"],
        hidden_dim=hidden,
    )
    return ref.to_f32(p), c


def named(model):
    return dict(model.named_parameters())


def gpt2_expected(params):
    """Model parameter name -> the array the file holds for it."""
    out = {"wte.weight": params["wte"], "wpe.weight": params["wpe"]}
    for i, lp in enumerate(params["layers"]):
        for key, name in zip(ref.GPT2_LAYER_KEYS, GPT2_KEYS, strict=True):
            out[f"h.{i}.{name}"] = lp[key]
    out["ln_f.weight"], out["ln_f.bias"] = params["lnf_w"], params["lnf_b"]
    return out


def llama_expected(params):
    out = {"wte.weight": params["wte"]}
    for i, lp in enumerate(params["layers"]):
        for key, name in zip(ref.LLAMA3_LAYER_KEYS, LLAMA_KEYS, strict=True):
            out[f"h.{i}.{name}"] = lp[key]
    out["ln_f.weight"], out["lm_head.weight"] = params["lnf_w"], params["lm_head"]
    return out


def check_tensors(model, expected):
    got = named(model)
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        np.testing.assert_array_equal(got[name].numpy().astype(np.float64), want, err_msg=name)


def test_gpt2_reads_an_llmc_file(tmp_path):
    gen = rng()
    params, c = gpt2_params(gen)
    path = tmp_path / "gpt2.bin"
    path.write_bytes(ref.gpt2_llmc_bytes(params, **c))
    model = GPT2.from_llmc(path, DEVICE)
    cfg = model.config
    assert (cfg.block_size, cfg.vocab_size, cfg.padded_vocab_size) == (MAXT, V, VP)
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (L, 4, 32)
    check_tensors(model, gpt2_expected(params))
    x = gen.integers(0, V, size=(2, MAXT))
    want = ref.gpt2_forward(params, x, 4, V)
    assert_close(model(it.from_numpy(x, device=DEVICE))[0], want, "float32", what="logits of the loaded model")


@pytest.mark.parametrize("layout", ["llmc", "infinitrain"])
def test_llama3_reads_both_header_layouts(layout, tmp_path):
    gen = rng()
    params, c = llama_params(gen)
    path = tmp_path / "llama.bin"
    path.write_bytes(ref.llama3_llmc_bytes(params, c, layout))
    model = LLaMA3.from_llmc(path, DEVICE)
    cfg = model.config
    for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "multiple_of"):
        assert getattr(cfg, key) == c[key], key
    for key in ("ffn_dim_multiplier", "norm_eps", "rope_theta"):
        assert getattr(cfg, key) == np.float32(c[key]), key  # float32 in both layouts
    assert cfg.use_scaled_rope is True and (cfg.version_major, cfg.version_minor) == (3, 1)
    check_tensors(model, llama_expected(params))
    x = gen.integers(0, V, size=(2, MAXT))
    want = ref.llama3_forward(params, x, c)
    assert_close(model(it.from_numpy(x, device=DEVICE))[0], want, "float32", what="logits of the loaded model")


def bf16_exact(params):
    """Parameters whose float32 values are exactly bfloat16 (low 16 bits zero)."""
    if isinstance(params, dict):
        return {k: bf16_exact(v) for k, v in params.items()}
    if isinstance(params, list):
        return [bf16_exact(v) for v in params]
    bits = np.asarray(params, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32).astype(np.float64)


def to_bf16_file(f32_file, header_bytes):
    """An llm.c bfloat16 file (version 5) from a float32 one holding bfloat16-exact values: the top halves."""
    header = bytearray(f32_file[:header_bytes])
    struct.pack_into("<i", header, 4, 5)
    body = np.frombuffer(f32_file[header_bytes:], dtype="<u4")
    return bytes(header) + (body >> 16).astype("<u2").tobytes()


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_bfloat16_files(kind, tmp_path):
    gen = rng()
    if kind == "gpt2":
        params, c = gpt2_params(gen)
        params = bf16_exact(params)
        data, cls, expected = to_bf16_file(ref.gpt2_llmc_bytes(params, **c), 1024), GPT2, gpt2_expected(params)
    else:
        params, c = llama_params(gen)
        params = bf16_exact(params)
        data, cls = to_bf16_file(ref.llama3_llmc_bytes(params, c, "llmc"), 2048), LLaMA3
        expected = llama_expected(params)
    path = tmp_path / "m.bin"
    path.write_bytes(data)
    check_tensors(cls.from_llmc(path, DEVICE), expected)


# ---- infinitrain's writers, read back by an independent reader ----------------------------------------------


def read_words(data, n, fmt="<i"):
    return [struct.unpack_from(fmt, data, 4 * i)[0] for i in range(n)]


def split_body(body, shapes):
    """Cuts float32 data into arrays of the given shapes, in order; all of it must be used."""
    flat = np.frombuffer(body, dtype="<f4").astype(np.float64)
    out, o = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(flat[o : o + n].reshape(s))
        o += n
    assert o == flat.size, (o, flat.size)
    return out


def randomize(model, gen):
    """Distinct random values in every parameter (a fresh model's norms are all ones)."""
    for p in model.parameters():
        p.copy_(it.from_numpy(gen.standard_normal(p.shape), dtype=p.dtype, device=p.device))


def test_gpt2_save_llmc_writes_llmc_layout(tmp_path):
    gen = rng()
    model = GPT2(GPT2Config(MAXT, V, VP, L, 4, 32), DEVICE)
    randomize(model, gen)
    path = tmp_path / "g.bin"
    model.save_llmc(path)
    data = path.read_bytes()
    assert read_words(data, 8) == [ref.GPT2_MAGIC, 3, MAXT, V, L, 4, 32, VP]
    assert not any(read_words(data[32:1024], 248))
    C = 32
    per_layer = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    shapes = [(VP, C), (MAXT, C)] + [(L,) + s for s in per_layer] + [(C,), (C,)]
    arrays = split_body(data[1024:], shapes)
    p = named(model)
    names = ["wte.weight", "wpe.weight"] + [[f"h.{i}.{k}" for i in range(L)] for k in GPT2_KEYS]
    names += ["ln_f.weight", "ln_f.bias"]
    for name, arr in zip(names, arrays, strict=True):
        group = [name] if isinstance(name, str) else name
        want = np.stack([p[n].numpy() for n in group]) if len(group) > 1 else p[group[0]].numpy()
        np.testing.assert_array_equal(arr, want, err_msg=str(name))


@pytest.mark.parametrize("layout", ["llmc", "infinitrain"])
def test_llama3_save_llmc_writes_both_layouts(layout, tmp_path):
    gen = rng()
    c = LLAMA_CFG
    params, _ = llama_params(gen)
    src = tmp_path / "src.bin"
    src.write_bytes(ref.llama3_llmc_bytes(params, c, "llmc"))
    model = LLaMA3.from_llmc(src, DEVICE)
    path = tmp_path / "l.bin"
    model.save_llmc(path, layout=layout)
    data = path.read_bytes()
    ints = [ref.LLAMA3_MAGIC, 3, MAXT, V, L, c["n_head"], c["n_kv_head"], c["n_embd"]]
    if layout == "llmc":
        assert read_words(data, 12) == ints + [c["multiple_of"], 1, 3, 1]
        floats = read_words(data[1024:], 3, "<f")
        body = data[2048:]
    else:
        words = read_words(data, 16)
        assert words[:8] == ints and words[9] == c["multiple_of"] and words[12:16] == [1, 4, 3, 1]
        floats = [struct.unpack_from("<f", data, 4 * i)[0] for i in (8, 10, 11)]
        body = data[1024:]
    assert floats == [np.float32(c[k]) for k in ("ffn_dim_multiplier", "norm_eps", "rope_theta")]
    C, H = c["n_embd"], model.config.hidden_dim
    qkv = (c["n_head"] + 2 * c["n_kv_head"]) * (C // c["n_head"])
    per_layer = [(C,), (qkv, C), (C, C), (C,), (H, C), (H, C), (C, H)]
    shapes = [(V, C)] + [(L,) + s for s in per_layer] + [(C,), (V, C)]
    arrays = split_body(body, shapes)
    want = [params["wte"]] + [np.stack([lp[k] for lp in params["layers"]]) for k in ref.LLAMA3_LAYER_KEYS]
    want += [params["lnf_w"], params["lm_head"]]
    for k, (a, w) in enumerate(zip(arrays, want, strict=True)):
        np.testing.assert_array_equal(a, w, err_msg=f"tensor {k}")


# ---- token and tokenizer files -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_token_files(kind, tmp_path):
    gen = rng()
    top = 2**16 if kind == "gpt2" else 2**31
    tokens = gen.integers(0, top, size=1001)
    tokens[:2] = [0, top - 1]  # the extremes of the width
    path = tmp_path / "t.bin"
    path.write_bytes(ref.tokens_bytes(tokens, kind))
    assert read_tokens_header(path)[0] == kind
    np.testing.assert_array_equal(read_tokens(path), tokens)
    # The loader's first unshuffled batch is the first B*T + 1 tokens.
    x, y = next(DataLoader(path, 4, 25, shuffle=False))
    np.testing.assert_array_equal(x.ravel(), tokens[:100])
    np.testing.assert_array_equal(y.ravel(), tokens[1:101])
    # And infinitrain's writer produces the same bytes.
    mine = tmp_path / "mine.bin"
    write_tokens(mine, tokens, kind=kind)
    assert mine.read_bytes() == path.read_bytes()


def test_tokenizer_file(tmp_path):
    gen = rng()
    pieces = [bytes(gen.integers(0, 256, size=gen.integers(0, 9)).tolist()) for _ in range(300)]
    pieces[7] = b"<|endoftext|>"
    path = tmp_path / "tok.bin"
    path.write_bytes(ref.tokenizer_bytes(pieces, 7))
    tok = Tokenizer.load(path)
    assert tok.vocab_size == 300 and tok.eot == 7 and tok.pieces == pieces
    ids = gen.integers(0, 300, size=50)
    assert tok.decode_bytes(ids) == b"".join(pieces[i] for i in ids)


def test_byte_tokenizer_writes_an_llmc_tokenizer(tmp_path):
    path = tmp_path / "bytes.bin"
    ByteTokenizer().write_llmc(path)
    assert path.read_bytes() == ref.tokenizer_bytes([bytes([b]) for b in range(256)] + [b"<|endoftext|>"], 256)
