"""Loading Hugging Face folders and llm.c files is checked before anything is allocated and bounded by the model
being built: safetensors headers are parsed and checked against their files, the tensors' names, shapes and dtypes
against what config.json implies before the model is built, and tensors are read by offset (an ignored buffer or a
refused tensor is never read). Peak memory is measured in child processes (ru_maxrss) on sparse files that declare
gigabytes and hold almost none. Every bad folder is one ValueError naming the file, and one line from the CLIs."""

import json
import math
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import harness
import infinitrain as it
import numpy_models as ref
from harness import DEVICE, child_env, rng
from infinitrain import checkpoint
from infinitrain.models import from_pretrained, hf, registry

MB = 1 << 20
ITEMSIZE = {"F32": 4, "I32": 4, "F16": 2, "BF16": 2}

# The child reports how far its peak RSS rose while loading (after the imports), and the error if one was raised.
CHILD = r"""
import json, resource, sys
from infinitrain.models import GPT2, from_pretrained

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

base = peak()
out = {"error": None}
try:
    m = from_pretrained(sys.argv[2]) if sys.argv[1] == "hf" else GPT2.from_llmc(sys.argv[2])
    out["params"] = m.num_parameters()
except ValueError as e:
    out["error"] = str(e)
out["extra"] = peak() - base
print(json.dumps(out))
"""


def load_in_child(kind, path):
    p = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(path)], capture_output=True, text=True, env=child_env(), timeout=300
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- safetensors files by hand ----


def st_bytes(tensors, sparse=()):
    """(header + data bytes, total size) of a safetensors file: `tensors` name -> float32 array written, then
    `sparse` (name, dtype, shape) declared after them, their bytes left to a sparse tail."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    end = len(data)
    for name, dtype, shape in sparse:
        n = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [end, end + n]}
        end += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return head + data, len(head) + end


def write_st(file, tensors, sparse=()):
    blob, total = st_bytes(tensors, sparse)
    with open(file, "wb") as f:
        f.write(blob)
        f.truncate(total)  # a hole: the declared gigabytes take no disk


def raw_st(file, header, data=b"", length=None):
    """A file of a given header (an object, or JSON text as bytes) and data section."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return file


def small_gpt2(path, g):
    """A GPT-2 folder of random weights (save_pretrained); returns (HF name -> array, config dict)."""
    from infinitrain.models import GPT2, GPT2Config

    model = GPT2(GPT2Config(block_size=8, vocab_size=11, padded_vocab_size=11, n_layer=2, n_head=2, n_embd=8))
    for p in model.parameters():
        p.copy_(it.from_numpy(g.standard_normal(p.shape).astype(np.float32), device=p.device))
    model.save_pretrained(path)
    return hf.read_tensors(path), json.loads((path / "config.json").read_text())


# ---- expected shapes from the config, without a model ----


def random_hf_config(kind, g):
    """A small random config.json of `kind` (a family's model_type)."""
    r = lambda lo, hi: int(g.integers(lo, hi + 1))  # noqa: E731
    if kind == "gpt2":
        H = r(1, 3)
        return dict(model_type="gpt2", vocab_size=r(5, 40), n_positions=r(4, 16), n_embd=H * r(1, 4) * 2,
                    n_layer=r(1, 3), n_head=H)  # fmt: skip
    kv = r(1, 2)
    H = kv * r(1, 2)
    hd = 2 * r(1, 3)
    base = dict(vocab_size=r(5, 40), hidden_size=H * hd, intermediate_size=r(4, 24), num_hidden_layers=r(1, 3),
                num_attention_heads=H, num_key_value_heads=kv, max_position_embeddings=r(4, 16),
                hidden_act="silu")  # fmt: skip
    if kind == "llama":
        return dict(base, model_type="llama", tie_word_embeddings=bool(r(0, 1)))
    if kind == "mixtral":
        E = r(2, 4)
        return dict(base, model_type="mixtral", num_local_experts=E, num_experts_per_tok=r(1, E))
    cfg = dict(base, model_type=kind, head_dim=hd, tie_word_embeddings=bool(r(0, 1)))
    if kind == "qwen3_moe":
        E, L = r(2, 4), base["num_hidden_layers"]
        only = [i for i in range(L) if r(0, 2) == 0]
        cfg.update(num_experts=E, num_experts_per_tok=r(1, E), moe_intermediate_size=r(2, 12),
                   decoder_sparse_step=r(1, 2), mlp_only_layers=only)  # fmt: skip
    return cfg


def random_model(kind, g):
    """(model, family, config, cfg): a family's model built from a fresh random config.json of `kind`."""
    cfg = random_hf_config(kind, g)
    family, config = registry.config_from_hf(cfg)
    model = family.build(config, DEVICE)
    if family.hf.tie is not None:
        model = family.hf.tie(model, cfg)
    return model, family, config, cfg


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3", "qwen3_moe", "mixtral"])
def test_expected_shapes_are_what_the_family_writes(kind, tmp_path):
    """A family's HFFormat.shapes (from the config alone) names exactly the tensors its save_pretrained writes, in
    their shapes, on fresh random configs; the folders load back bit-exactly."""
    g = rng()
    for trial in range(4):
        model, family, config, cfg = random_model(kind, g)
        for p in model.parameters():
            p.copy_(it.from_numpy(g.standard_normal(p.shape).astype(np.float32), device=p.device))
        _, written = family.hf.save(model)
        want = family.hf.shapes(config, cfg, set(written))
        assert set(want.required) <= set(written), sorted(set(want.required) - set(written))
        for name, a in written.items():
            assert name in want.required or name in want.optional, name
            assert tuple(a.shape) == tuple(want.required.get(name, want.optional.get(name))), name
        folder = tmp_path / f"t{trial}"
        model.save_pretrained(folder)
        back = from_pretrained(folder, DEVICE)
        for name, p in model.state_dict().items():
            np.testing.assert_array_equal(back.state_dict()[name].numpy(), p.numpy(), err_msg=name)


# ---- a config describing a huge model next to tiny weights ----

HUGE = {
    "gpt2": dict(n_layer=6, n_embd=2048, n_head=16),
    "llama": dict(num_hidden_layers=4, hidden_size=2048, intermediate_size=5632, num_attention_heads=16,
                  num_key_value_heads=16, head_dim=128),
    "mixtral": dict(num_hidden_layers=4, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
                    num_key_value_heads=16, head_dim=64, num_local_experts=8, num_experts_per_tok=2),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(HUGE))
def test_a_huge_config_next_to_tiny_weights_fails_before_building(kind, tmp_path):
    """The config implies a gigabyte model, the files hold a tiny one: refused from the headers, naming the
    mismatched tensor, with the peak memory of the child far below the model's (nothing built, nothing read)."""
    model = random_model(kind, rng())[0]
    model.save_pretrained(tmp_path)
    big = dict(json.loads((tmp_path / "config.json").read_text()), **HUGE[kind])
    (tmp_path / "config.json").write_text(json.dumps(big))
    registry.config_from_hf(big)  # a config the family accepts: the weights refuse it
    out = load_in_child("hf", tmp_path)
    assert out["extra"] < 200 * MB, out
    assert out["error"] is not None and "\n" not in out["error"]
    assert re.search(r"model\.safetensors: tensor '.*' has shape .* expected .* from the config", out["error"])
    with pytest.raises(ValueError, match="from the config"):
        from_pretrained(tmp_path)


# ---- tensors declared huge (sparse files): refused or skipped without reading ----


def test_an_extra_huge_tensor_is_refused_without_reading_it(tmp_path):
    g = rng()
    t, _ = small_gpt2(tmp_path, g)
    write_st(tmp_path / "model.safetensors", t, [("extra.weight", "F32", (256, 1 << 20))])  # 1 GiB declared
    out = load_in_child("hf", tmp_path)
    assert out["extra"] < 200 * MB, out
    assert out["error"] == f"{tmp_path}: unexpected tensors ['extra.weight']", out


def test_a_mis_shaped_huge_tensor_is_refused_without_reading_it(tmp_path):
    g = rng()
    t, _ = small_gpt2(tmp_path, g)
    name = str(g.choice(sorted(t)))
    rest = {k: v for k, v in t.items() if k != name}
    write_st(tmp_path / "model.safetensors", rest, [(name, "F32", (1 << 14, 1 << 14))])  # 1 GiB declared
    out = load_in_child("hf", tmp_path)
    want = f"{tmp_path / 'model.safetensors'}: tensor '{name}' has shape (16384, 16384), expected {t[name].shape}"
    assert out["extra"] < 200 * MB, out
    assert out["error"].startswith(want), out


def test_an_ignored_huge_buffer_is_never_read(tmp_path):
    """GPT-2 files may carry the attention mask buffers (h.N.attn.bias); the model ignores them, so a 1 GiB one
    costs nothing and the weights load bit-exactly."""
    g = rng()
    t, _ = small_gpt2(tmp_path, g)
    write_st(tmp_path / "model.safetensors", t, [("transformer.h.0.attn.bias", "F32", (1, 1, 1 << 14, 1 << 14))])
    out = load_in_child("hf", tmp_path)
    assert out["error"] is None, out
    assert out["extra"] < 200 * MB, out
    model = from_pretrained(tmp_path)
    got = registry.family_of_model(model).hf.save(model)[1]
    assert set(got) == set(t)
    for k, v in t.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_shard_index_reads_only_expected_tensors(tmp_path):
    """Sharded folders: headers of every shard checked; a tensor in two shards, or a shard name that is not a file
    in the folder, is refused."""
    g = rng()
    t, cfg = small_gpt2(tmp_path / "one", g)
    names = sorted(t)
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    parts = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in parts.items():
        write_st(folder / file, {n: t[n] for n in part})
    index = {"weight_map": {n: f for f, part in parts.items() for n in part}}
    (folder / hf.INDEX_FILE).write_text(json.dumps(index))
    model = from_pretrained(folder)
    saved = registry.family_of_model(model).hf.save(model)[1]
    for k, v in t.items():
        np.testing.assert_array_equal(saved[k], v, err_msg=k)
    dup = names[0]
    write_st(folder / "b.safetensors", {n: t[n] for n in [*parts["b.safetensors"], dup]})
    with pytest.raises(ValueError, match=rf"{re.escape(str(folder / hf.INDEX_FILE))}: tensor '{re.escape(dup)}' is in"):
        from_pretrained(folder)
    for bad in ({"weight_map": {dup: "../x.safetensors"}}, {"weight_map": {dup: 3}}, {"weight_map": [1]}, [1]):
        (folder / hf.INDEX_FILE).write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=re.escape(str(folder / hf.INDEX_FILE))):
            from_pretrained(folder)


# ---- malformed headers ----


def malformed_cases(g):
    """(header or raw bytes, data, problem) triples; tensors a and b of fresh random sizes."""
    m, n = int(g.integers(1, 6)), int(g.integers(1, 6))
    A, B = 4 * m * 3, 4 * n
    data = bytes(g.integers(0, 256, A + B, dtype=np.uint8))
    a = {"dtype": "F32", "shape": [m, 3], "data_offsets": [0, A]}
    b = {"dtype": "F32", "shape": [n], "data_offsets": [A, A + B]}

    def h(**kw):
        return {"a": kw.get("a", a), "b": kw.get("b", b)}

    return [
        (h(), data, None),  # the valid file they start from
        (h(a=dict(a, dtype="Q4")), data, "unknown dtype 'Q4'"),
        (h(a=dict(a, dtype=7)), data, "unknown dtype 7"),
        (h(a=dict(a, shape=[m, 4])), data, f"is F32 [{m}, 4] ({16 * m} bytes) but data_offsets [0, {A}] hold {A}"),
        (h(a=dict(a, shape=[m, -3])), data, "expected a list of sizes"),
        (h(a=dict(a, shape=[m, True])), data, "expected a list of sizes"),
        (h(a=dict(a, shape="3")), data, "expected a list of sizes"),
        (h(b=dict(b, data_offsets=[A])), data, "expected [begin, end]"),
        (h(b=dict(b, data_offsets=[A, A - 4])), data, "its end is before its begin"),
        (h(b=dict(b, data_offsets=[A + 4, A + B + 4])), data + bytes(4), "belong to no tensor"),
        (h(b=dict(b, data_offsets=[A + 4, A + B + 4])), data, f"outside the {A + B}-byte data section"),
        (h(b=dict(b, data_offsets=[A - 4, A + B - 4])), data, "tensors 'a' and 'b' overlap"),
        (h(), data + bytes(8), "8 bytes after the last tensor"),
        (h(a=[1, 2]), data, "expected {dtype, shape, data_offsets}"),
        (h(a={"dtype": "F32", "shape": [m, 3]}), data, "expected {dtype, shape, data_offsets}"),
        ({"__metadata__": 3, **h()}, data, "__metadata__ is a int"),
        ([h()], data, "the header is a JSON list, expected an object"),
        (b'{"a": 1, "a": 2}', b"", "the header is not valid JSON (key 'a' appears twice)"),
        (b"{not json", b"", "the header is not valid JSON"),
        (b"\xff\xfe{}", b"", "the header is not valid JSON"),
        (b"[" * 100_000, b"", "the header is not valid JSON"),  # nesting deep enough to exhaust the recursion
    ]


def test_malformed_headers_name_the_file_and_the_problem(tmp_path):
    g = rng()
    folder = tmp_path / "f"
    t, cfg = small_gpt2(folder, g)
    for i, (header, data, problem) in enumerate(malformed_cases(g)):
        file = raw_st(tmp_path / f"{i}.safetensors", header, data)
        if problem is None:
            assert [e.name for e in hf.read_header(file)] == ["a", "b"]
            assert b"".join(a.astype("<f4").tobytes() for a in hf.read_file(file).values()) == data
            continue
        want = f"{file}: not a valid safetensors file: "
        with pytest.raises(ValueError) as e:
            hf.read_header(file)
        assert str(e.value).startswith(want) and problem in str(e.value), (problem, str(e.value))
        # from_pretrained on a folder holding it: the same one line, before anything is built.
        (folder / "model.safetensors").write_bytes(file.read_bytes())
        with pytest.raises(ValueError) as e:
            from_pretrained(folder)
        assert str(e.value).startswith(f"{folder / 'model.safetensors'}: not a valid safetensors file: ")
        assert problem in str(e.value) and "\n" not in str(e.value)


def test_header_length_is_checked_against_the_file(tmp_path):
    file = tmp_path / "x.safetensors"
    file.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match=re.escape(f"{file}: not a valid safetensors file: 2 bytes is shorter")):
        hf.read_header(file)
    n = int(rng().integers(3, 1 << 40))
    raw_st(file, b"{}", length=n)
    with pytest.raises(ValueError, match=re.escape(f"header length {n} runs past the end of the file (10 bytes)")):
        hf.read_header(file)
    n = hf.MAX_HEADER_BYTES + 8
    with open(file, "wb") as f:  # a sparse file as long as the header it declares
        f.write(struct.pack("<Q", n) + b"{}")
        f.truncate(8 + n)
    with pytest.raises(ValueError, match=re.escape(f"header length {n} exceeds")):
        hf.read_header(file)


def test_a_weight_that_is_not_float_is_refused_before_building(tmp_path):
    g = rng()
    t, _ = small_gpt2(tmp_path, g)
    name = str(g.choice(sorted(t)))
    blob, _ = st_bytes({k: v for k, v in t.items() if k != name}, [(name, "I32", t[name].shape)])
    (tmp_path / "model.safetensors").write_bytes(blob + bytes(4 * t[name].size))
    with pytest.raises(ValueError, match=re.escape(f"tensor '{name}' has dtype I32; expected F32, BF16, F16 or F64")):
        from_pretrained(tmp_path)


def test_a_file_changed_after_its_header_was_read_is_refused(tmp_path):
    g = rng()
    small_gpt2(tmp_path / "a", g)
    entries = hf.read_entries(tmp_path / "a")
    small_gpt2(tmp_path / "a", g)  # rewritten (atomically: a new file) after the headers were read
    with pytest.raises(ValueError, match="changed after its header was read"):
        next(iter(entries.values())).read()


# ---- config field types: one clear line everywhere ----

WRONG = [["gpt2"], {"a": 1}, "7", True, -1, 2**70, 1.5, None, []]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3_moe", "mixtral"])
def test_wrong_config_types_are_one_value_error_naming_the_file(kind, tmp_path):
    """Every config.json field of a valid folder set to values of the wrong type (or out of range): from_pretrained
    loads it or raises one ValueError naming the folder's file; nothing else escapes."""
    model = random_model(kind, rng())[0]
    model.save_pretrained(tmp_path / "ok")
    saved = json.loads((tmp_path / "ok" / "config.json").read_text())
    keys = sorted(set(saved) | {"model_type", "router_aux_loss_coef", "head_dim", "rope_scaling", "n_inner"})
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((tmp_path / "ok" / "model.safetensors").read_bytes())
    refused = 0
    for key in keys:
        for value in WRONG:
            (folder / "config.json").write_text(json.dumps(dict(saved, **{key: value})))
            try:
                from_pretrained(folder)
            except ValueError as e:
                msg = str(e)
                assert str(folder) in msg and "\n" not in msg, (key, value, msg)
                refused += 1
    assert refused > len(keys)
    (folder / "config.json").write_text(json.dumps(dict(saved, model_type=["gpt2"])))
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'config.json'}: field 'model_type' must be a string")):
        from_pretrained(folder)


def cli(module, *args):
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, env=child_env(), timeout=300
    )


def assert_one_line(p, *needles):
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(lines) == 1, p.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_bad_folders_are_one_line_from_every_cli(tmp_path):
    """model_type ["gpt2"], a mistyped router coefficient, and a huge config next to tiny weights: one line from
    sample --init_from, train --init_from and export (which reads train checkpoints: it says what the folder is)."""
    g = rng()
    tokens = tmp_path / "train.bin"
    tokens.write_bytes(ref.tokens_bytes(g.integers(0, 11, size=300)))
    gpt2 = tmp_path / "gpt2"
    _, cfg = small_gpt2(gpt2, g)
    (gpt2 / "config.json").write_text(json.dumps(dict(cfg, model_type=["gpt2"])))
    mixtral = tmp_path / "mixtral"
    mcfg = random_hf_config("mixtral", g)
    family, config = registry.config_from_hf(mcfg)
    family.build(config).save_pretrained(mixtral)
    saved = json.loads((mixtral / "config.json").read_text())
    (mixtral / "config.json").write_text(json.dumps(dict(saved, router_aux_loss_coef=[1])))
    huge = tmp_path / "huge"
    small_gpt2(huge, g)
    (huge / "config.json").write_text(json.dumps(dict(cfg, n_layer=48, n_embd=6400, n_head=64)))
    cases = [
        ("gpt2", gpt2, [f"{gpt2 / 'config.json'}: field 'model_type' must be a string, got ['gpt2']"]),
        ("mixtral", mixtral, [f"{mixtral / 'config.json'}: field 'router_aux_loss_coef'"]),
        ("gpt2", huge, [f"{huge / 'model.safetensors'}: tensor 'transformer.wte.weight' has shape (11, 8)"]),
    ]
    for model, folder, needles in cases:
        assert_one_line(cli("infinitrain.tools.sample", f"--init_from={folder}", "--prompt_tokens=1"), *needles)
        p = harness.run_train(
            f"--model={model}", f"--init_from={folder}", f"--input_bin={tokens}", "--sequence_length=4",
            "--batch_size=1", "--num_iteration=1", "--sample_every=0", check=False, device="cpu",
        )  # fmt: skip
        assert_one_line(p, *needles)
        p = cli("infinitrain.tools.export", f"--checkpoint={folder}", f"--output={tmp_path / 'o.bin'}")
        assert_one_line(p, f"{folder}: a Hugging Face checkpoint folder, not a train checkpoint")
    p = cli("infinitrain.tools.sample", f"--init_from={tmp_path / 'nowhere'}", "--prompt_tokens=1")
    assert_one_line(p, "no such folder")


@pytest.mark.parametrize(
    "recorded", [{"family": ["gpt2"], "fields": {}}, {"family": "gpt2", "fields": []},
                 {"family": "gpt2", "fields": {"n_layer": 2, "bogus": 1}}, {"family": "gpt2"}],
)  # fmt: skip
def test_export_and_sample_refuse_a_mistyped_recorded_config_in_one_line(recorded, tmp_path):
    ckpt = tmp_path / "ckpt_00000001.bin"
    meta = {"step": 1, "optimizer": {"step": 1, "lr": 0.1}, "loader": {}, "generator": {}, "model_config": recorded}
    checkpoint.save(ckpt, {"model.x": np.zeros(2, np.float32)}, meta)
    assert_one_line(
        cli("infinitrain.tools.export", f"--checkpoint={ckpt}", f"--output={tmp_path / 'o.bin'}"), str(ckpt)
    )
    assert_one_line(cli("infinitrain.tools.sample", f"--checkpoint={ckpt}", "--prompt_tokens=1"), str(ckpt))


# ---- llm.c files: the header against the file size, the parameters by offset ----

GPT2_MAGIC = 20240326


def llmc_header(version, block, vocab, n_layer, n_head, n_embd, padded):
    words = np.zeros(256, "<i4")
    words[:8] = [GPT2_MAGIC, version, block, vocab, n_layer, n_head, n_embd, padded]
    return words.tobytes()


def gpt2_count(block, padded, n_layer, C):
    return (padded + block) * C + n_layer * (12 * C * C + 13 * C) + 2 * C


@pytest.mark.parametrize("version", [3, 5])
def test_llmc_parameters_are_read_by_offset(version, tmp_path):
    """A 170 MB GPT-2 llm.c file (sparse: zeros) loads with the peak memory of the model plus a tensor, not the
    model plus the file's bytes plus their float32 copy."""
    block, vocab, padded, n_layer, n_head, C = 64, 1000, 1024, 6, 12, 768
    n = gpt2_count(block, padded, n_layer, C)
    path = tmp_path / "m.bin"
    with open(path, "wb") as f:
        f.write(llmc_header(version, block, vocab, n_layer, n_head, C, padded))
        f.truncate(1024 + n * (4 if version == 3 else 2))
    out = load_in_child("llmc", path)
    assert out["error"] is None and out["params"] == n, out
    assert out["extra"] < 1.4 * 4 * n, (out, 4 * n)


def test_llmc_header_is_checked_against_the_file_before_reading(tmp_path):
    """A header describing 48 x 6400 next to a few bytes: refused from the sizes, nothing read or built."""
    path = tmp_path / "m.bin"
    extra = int(rng().integers(0, 4096))
    path.write_bytes(llmc_header(3, 1024, 50257, 48, 64, 6400, 50304) + bytes(4 * extra))
    out = load_in_child("llmc", path)
    n = gpt2_count(1024, 50304, 48, 6400)
    assert out["error"].startswith(f"{path}: truncated: the header implies {n} parameters"), out
    assert out["extra"] < 100 * MB, out


def test_llmc_params_are_exact_by_slice_and_refuse_a_changed_file(tmp_path):
    g = rng()
    params = [g.standard_normal(int(g.integers(1, 50))).astype(np.float32) for _ in range(int(g.integers(2, 6)))]
    flat = np.concatenate(params)
    path = tmp_path / "m.bin"
    words = [GPT2_MAGIC, 3] + [0] * 254
    checkpoint.write_llmc_model(path, words, params)
    _, lazy = checkpoint.read_llmc_model(path, GPT2_MAGIC, lambda h: flat.size)
    assert lazy.dtype == np.float32 and len(lazy) == flat.size
    np.testing.assert_array_equal(np.asarray(lazy), flat)
    for _ in range(10):
        a = int(g.integers(0, flat.size))
        b = int(g.integers(a, flat.size + 1))
        np.testing.assert_array_equal(lazy[a:b], flat[a:b])
    checkpoint.write_llmc_model(path, words, params)  # replaced after the header was read
    with pytest.raises(ValueError, match=re.escape(f"{path}: the file changed after its header was read")):
        lazy[0:1]
