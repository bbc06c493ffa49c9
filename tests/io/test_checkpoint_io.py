"""Tests for infinitrain.checkpoint: the safetensors checkpoint format, the format-1 container it replaced (still
read), atomic writes, llm.c model files, and it.save / it.load over it."""

import hashlib
import json
import os
import re
import struct

import numpy as np
import pytest

from infinitrain import checkpoint as ckpt

rng = np.random.default_rng()

DTYPES = ["<f4", "<f8", "<f2", "<i8", "<i4", "<u2", "|u1", "|b1"]


def _random_array(dtype):
    ndim = int(rng.integers(0, 4))
    shape = tuple(int(d) for d in rng.integers(0, 7, size=ndim))
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def _random_tensors():
    tensors = {f"t{i}.{dtype}": _random_array(dtype) for i, dtype in enumerate(DTYPES * 2)}
    tensors["big"] = rng.standard_normal(int(rng.integers(1000, 5000))).astype(np.float32)
    tensors["empty"] = np.zeros((0, 3), dtype=np.float32)
    tensors["scalar"] = np.array(int(rng.integers(0, 2**40)), dtype=np.int64)
    return tensors


def _random_meta():
    return {
        "step": int(rng.integers(0, 2**40)),
        "lr": float(rng.random()),
        "name": "run-" + rng.bytes(4).hex(),
        "nested": {"loader": {"epoch": int(rng.integers(0, 9)), "position": int(rng.integers(0, 99))}, "ok": True},
        "list": [1, 2.5, None, "x"],
    }


# ---- container ------------------------------------------------------------------------------------------------


def test_save_load_roundtrip(tmp_path):
    tensors, meta = _random_tensors(), _random_meta()
    path = tmp_path / "c.ckpt"
    ckpt.save(path, tensors, meta)
    got, got_meta = ckpt.load(path)
    assert got_meta == meta
    assert list(got) == list(tensors)
    for name, arr in tensors.items():
        assert got[name].dtype == arr.dtype, name
        assert got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr)
    assert os.listdir(tmp_path) == ["c.ckpt"]


def test_save_normalizes_layout_and_byte_order(tmp_path):
    a = rng.standard_normal((5, 7)).astype(">f4")  # big-endian
    b = rng.integers(0, 100, (6, 4)).astype(np.int64).T  # non-contiguous
    path = tmp_path / "n.ckpt"
    ckpt.save(path, {"a": a, "b": b}, {"step": np.int64(3), "loss": np.float32(0.5)})
    got, meta = ckpt.load(path)
    assert got["a"].dtype.str == "<f4" and got["b"].dtype.str == "<i8"
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    assert meta == {"step": 3, "loss": 0.5}


def _st_header(raw):
    (n,) = struct.unpack_from("<Q", raw)
    return n, json.loads(raw[8 : 8 + n])


def test_file_is_safetensors_with_meta_and_digest(tmp_path):
    """Format 2: a safetensors file (BF16 for bfloat16 bits) that the safetensors package reads, the meta as JSON
    text in __metadata__ and a SHA-256 over the canonical header and the data."""
    from safetensors.numpy import load_file

    tensors, meta = _random_tensors(), _random_meta()
    bf16 = {"t5.<u2"}
    path = tmp_path / "l.safetensors"
    ckpt.save(path, tensors, meta, bf16=bf16)
    raw = path.read_bytes()
    n, header = _st_header(raw)
    assert n % 8 == 0
    md = header.pop("__metadata__")
    assert json.loads(md["infinitrain.meta"]) == meta and md["infinitrain.format"] == "2"
    names = {"<f4": "F32", "<f8": "F64", "<f2": "F16", "<i8": "I64", "<i4": "I32", "<u2": "U16", "|u1": "U8"}
    names["|b1"] = "BOOL"
    pos = 0
    for name, arr in tensors.items():
        e = header[name]
        assert e["dtype"] == ("BF16" if name in bf16 else names[arr.dtype.str]) and e["shape"] == list(arr.shape)
        assert e["data_offsets"] == [pos, pos + arr.nbytes]
        assert raw[8 + n + pos : 8 + n + pos + arr.nbytes] == arr.tobytes()
        pos += arr.nbytes
    assert len(raw) == 8 + n + pos and list(header) == list(tensors)
    canon = {"__metadata__": {k: v for k, v in md.items() if k != "infinitrain.sha256"}, **header}
    text = json.dumps(canon, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert md["infinitrain.sha256"] == hashlib.sha256(text + raw[8 + n :]).hexdigest()
    other = {k: v for k, v in tensors.items() if k not in bf16}
    path2 = tmp_path / "plain.safetensors"
    ckpt.save(path2, other, meta)
    got = load_file(str(path2))  # read by the safetensors package itself
    for name, arr in other.items():
        np.testing.assert_array_equal(got[name], arr)


def _saved_v2(tmp_path):
    path = tmp_path / "x.safetensors"
    ckpt.save(path, _random_tensors(), _random_meta())
    return path, path.read_bytes()


def test_flipped_data_byte_fails_checksum_and_header_edits_are_refused(tmp_path):
    path, raw = _saved_v2(tmp_path)
    n, _ = _st_header(raw)
    for _ in range(8):
        bad = bytearray(raw)
        bad[int(rng.integers(8 + n, len(raw)))] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: checkpoint is corrupt: SHA-256 checksum"):
            ckpt.load(path)
    _, header = _st_header(raw)
    md = header["__metadata__"]
    md["infinitrain.meta"] = md["infinitrain.meta"].replace('"step": ', '"step": 1')  # valid JSON, other meta
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    with pytest.raises(ValueError, match=r"checkpoint is corrupt: SHA-256 checksum"):
        ckpt.load(path)
    del md["infinitrain.sha256"]
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    with pytest.raises(ValueError, match=r"no infinitrain.sha256"):
        ckpt.load(path)
    assert ckpt.load(path, require_checksum=False)[1]["step"] != 0  # other tools' files load on request


def test_truncated_and_extended(tmp_path):
    path, raw = _saved_v2(tmp_path)
    cuts = {0, 5, 8, 31, len(raw) - 1} | {int(c) for c in rng.integers(1, len(raw), size=20)}
    for keep in sorted(cuts):
        path.write_bytes(raw[:keep])
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: checkpoint is truncated"):
            ckpt.load(path)
    path.write_bytes(raw + b"\x00")
    with pytest.raises(ValueError, match=r"checkpoint is corrupt: .*\(1 extra\)"):
        ckpt.load(path)
    path.write_bytes(b"NOTACKPT" + raw[8:])
    with pytest.raises(ValueError, match=r"checkpoint is corrupt: not a safetensors or infinitrain checkpoint"):
        ckpt.load(path)


def test_v1_checkpoints_still_load(tmp_path):
    """Format 1 (the container before safetensors) is read as before."""
    tensors, meta = _random_tensors(), _random_meta()
    ckpt._save_v1(tmp_path / "old.bin", tensors, meta)
    got, got_meta = ckpt.load(tmp_path / "old.bin")
    assert got_meta == meta and list(got) == list(tensors)
    for name, arr in tensors.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr)


def test_v1_file_layout_is_byte_exact(tmp_path):
    tensors, meta = _random_tensors(), _random_meta()
    path = tmp_path / "l.ckpt"
    ckpt._save_v1(path, tensors, meta)
    raw = path.read_bytes()
    magic, version, reserved, hlen, dsize = struct.unpack_from("<8sIIQQ", raw)
    assert (magic, version, reserved) == (b"INFTCKPT", 1, 0)
    header = json.loads(raw[32 : 32 + hlen].decode("utf-8"))
    assert header["meta"] == meta
    data_start = -(-(32 + hlen) // 64) * 64
    assert raw[32 + hlen : data_start] == bytes(data_start - 32 - hlen)
    assert len(raw) == data_start + dsize + 32
    assert [e["name"] for e in header["tensors"]] == list(tensors)
    for e in header["tensors"]:
        arr = tensors[e["name"]]
        assert e["dtype"] == arr.dtype.str
        assert e["shape"] == list(arr.shape)
        assert e["nbytes"] == arr.size * arr.itemsize
        assert e["offset"] % 64 == 0
        start = data_start + e["offset"]
        assert raw[start : start + e["nbytes"]] == arr.tobytes()
    assert raw[-32:] == hashlib.sha256(raw[:-32]).digest()


def _saved(tmp_path):
    path = tmp_path / "x.ckpt"
    ckpt._save_v1(path, _random_tensors(), _random_meta())
    return path, path.read_bytes()


def test_v1_flipped_payload_byte_fails_checksum(tmp_path):
    path, raw = _saved(tmp_path)
    hlen, dsize = struct.unpack_from("<QQ", raw, 16)
    data_start = -(-(32 + hlen) // 64) * 64
    for lo, hi in [(data_start, data_start + dsize), (32, 32 + hlen), (len(raw) - 32, len(raw))]:
        i = int(rng.integers(lo, hi))
        bad = bytearray(raw)
        bad[i] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: checkpoint is corrupt: SHA-256 checksum"):
            ckpt.load(path)


def test_v1_bad_version(tmp_path):
    path, raw = _saved(tmp_path)
    path.write_bytes(raw[:8] + struct.pack("<I", 2) + raw[12:])
    with pytest.raises(ValueError, match=r"checkpoint is corrupt: unsupported format version 2"):
        ckpt.load(path)


def test_v1_truncated(tmp_path):
    path, raw = _saved(tmp_path)
    cuts = {0, 5, 8, 31, 32, len(raw) - 1} | {int(c) for c in rng.integers(1, len(raw), size=20)}
    for keep in sorted(cuts):
        path.write_bytes(raw[:keep])
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: checkpoint is truncated"):
            ckpt.load(path)


def test_v1_trailing_bytes(tmp_path):
    path, raw = _saved(tmp_path)
    path.write_bytes(raw + b"\x00")
    with pytest.raises(ValueError, match=r"checkpoint is corrupt: .*\(1 extra\)"):
        ckpt.load(path)


def test_save_rejects_unsupported(tmp_path):
    for bad in (np.zeros(3, dtype=np.complex64), np.array(["a"])):
        with pytest.raises(ValueError, match=r"is not supported"):
            ckpt.save(tmp_path / "u.ckpt", {"x": bad}, {})
    with pytest.raises(TypeError, match=r"JSON-serializable"):
        ckpt.save(tmp_path / "u.ckpt", {}, {"x": object()})
    assert os.listdir(tmp_path) == []


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "f.bin"
    old = rng.bytes(int(rng.integers(1, 5000)))
    ckpt.atomic_write(path, lambda f: f.write(old))
    assert path.read_bytes() == old

    def crash(f):
        f.write(rng.bytes(100))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ckpt.atomic_write(path, crash)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["f.bin"]
    new = rng.bytes(int(rng.integers(1, 5000)))
    ckpt.atomic_write(str(path), lambda f: f.write(new))
    assert path.read_bytes() == new
    ckpt.atomic_write(tmp_path / "sub" / "g.bin", lambda f: f.write(b"x"))  # creates the directory
    assert (tmp_path / "sub" / "g.bin").read_bytes() == b"x"


# ---- llm.c model files ----------------------------------------------------------------------------------------


def _header_bytes(words):
    out = b"".join(struct.pack("<f", w) if isinstance(w, float) else struct.pack("<i", w) for w in words)
    return out + bytes(1024 - len(out))


def _model(version=3):
    words = [20240326, version] + [int(v) for v in rng.integers(1, 5000, size=5)] + [float(rng.random() * 1e-3)]
    params = [
        rng.standard_normal(tuple(int(d) for d in rng.integers(1, 20, size=int(rng.integers(1, 3))))) for _ in range(5)
    ]
    return words, [p.astype(np.float32) for p in params]


def _count(params):
    n = sum(p.size for p in params)
    return lambda header: n


def test_llmc_model_layout_and_roundtrip(tmp_path):
    words, params = _model()
    path = tmp_path / "m.bin"
    ckpt.write_llmc_model(path, words, params)
    raw = path.read_bytes()
    assert raw[:1024] == _header_bytes(words)
    assert raw[1024:] == b"".join(struct.pack(f"<{p.size}f", *p.ravel().tolist()) for p in params)
    seen = []

    def count_fn(header):
        seen.append(header)
        return sum(p.size for p in params)

    header, flat = ckpt.read_llmc_model(path, 20240326, count_fn)
    assert header.dtype == np.int32 and header.shape == (256,)
    np.testing.assert_array_equal(header, np.frombuffer(_header_bytes(words), dtype="<i4"))
    np.testing.assert_array_equal(seen[0], header)
    assert flat.dtype == np.float32
    np.testing.assert_array_equal(flat, np.concatenate([p.ravel() for p in params]))
    assert ckpt.header_float(header, 7) == struct.unpack("<f", struct.pack("<f", words[7]))[0]


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_llmc_model_slices_read_their_own_values(tmp_path, dtype):
    """flat[a:b] of an llm.c model file reads exactly parameters a..b from the file (float32, and bf16 widened),
    for every tensor's range and random ranges: the same values as the whole vector read at once."""
    words, params = _model(version=3 if dtype == np.float32 else 5)  # header[1] names the dtype
    path = tmp_path / "m.bin"
    ckpt.write_llmc_model(path, words, params, dtype=dtype)
    _, flat = ckpt.read_llmc_model(path, 20240326, _count(params))
    whole = np.asarray(flat)
    ref = np.concatenate([p.ravel() for p in params])
    if dtype == np.float32:
        np.testing.assert_array_equal(whole, ref)
    else:
        np.testing.assert_array_equal(whole, ckpt.bf16_bits_to_float32(ckpt.float32_to_bf16_bits(ref)))
    bounds = np.cumsum([0] + [p.size for p in params])
    ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
    ranges += [tuple(sorted(rng.integers(0, len(ref) + 1, size=2))) for _ in range(10)]
    for a, b in ranges:
        np.testing.assert_array_equal(flat[int(a) : int(b)], whole[a:b])


def test_llmc_model_wrong_magic(tmp_path):
    words, params = _model()
    path = tmp_path / "m.bin"
    words[0] = 20240803
    ckpt.write_llmc_model(path, words, params)
    with pytest.raises(ValueError, match=r"expected magic 20240326 \(GPT-2\), got 20240803 \(LLaMA 3\)"):
        ckpt.read_llmc_model(path, 20240326, _count(params))
    words[0] = int(rng.integers(1, 1000))
    ckpt.write_llmc_model(path, words, params)
    with pytest.raises(ValueError, match=rf"expected magic 20240326 \(GPT-2\), got {words[0]}$"):
        ckpt.read_llmc_model(path, 20240326, _count(params))


def test_llmc_model_truncated_and_oversized(tmp_path):
    words, params = _model()
    path = tmp_path / "m.bin"
    ckpt.write_llmc_model(path, words, params)
    raw = path.read_bytes()
    n = sum(p.size for p in params)
    cut = int(rng.integers(1, 4 * n + 1))
    path.write_bytes(raw[:-cut])
    with pytest.raises(ValueError, match=rf"truncated: .* {n} parameters \({4 * n} bytes\), found {4 * n - cut} bytes"):
        ckpt.read_llmc_model(path, 20240326, _count(params))
    path.write_bytes(raw + bytes(8))
    with pytest.raises(ValueError, match=rf"found {4 * n + 8} bytes \(8 extra"):
        ckpt.read_llmc_model(path, 20240326, _count(params))
    path.write_bytes(raw[:1000])
    with pytest.raises(ValueError, match=r"shorter than the 1024-byte header"):
        ckpt.read_llmc_model(path, 20240326, _count(params))


def test_llmc_model_bf16(tmp_path):
    words, params = _model(version=5)
    # Values with zero low mantissa bits are exact in bf16.
    exact = [(p.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) for p in params]
    path = tmp_path / "b.bin"
    ckpt.write_llmc_model(path, words, exact, dtype="bfloat16")
    n = sum(p.size for p in params)
    assert os.path.getsize(path) == 1024 + 2 * n
    raw = path.read_bytes()
    expected_bits = np.concatenate([(p.ravel().view(np.uint32) >> 16) for p in exact]).astype("<u2")
    assert raw[1024:] == expected_bits.tobytes()
    _, flat = ckpt.read_llmc_model(path, 20240326, _count(params))  # dtype from header[1] == 5
    np.testing.assert_array_equal(flat, np.concatenate([p.ravel() for p in exact]))
    ckpt.write_llmc_model(path, words, params, dtype="bfloat16")
    _, flat = ckpt.read_llmc_model(path, 20240326, _count(params))
    ref = np.concatenate([p.ravel() for p in params])
    assert np.all(np.abs(flat - ref) <= np.abs(ref) * 2.0**-8)
    # The same file read as float32 holds half the bytes the header would need.
    with pytest.raises(ValueError, match=r"truncated"):
        ckpt.read_llmc_model(path, 20240326, _count(params), dtype=np.float32)


def test_bf16_rounding_is_nearest_even():
    one_plus = [1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, -2.0, np.inf, -np.inf]
    bits = ckpt.float32_to_bf16_bits(np.array(one_plus, dtype=np.float32))
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000, 0x7F80, 0xFF80]
    assert np.isnan(ckpt.bf16_bits_to_float32(ckpt.float32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


def test_llmc_model_unknown_version_and_bad_header(tmp_path):
    words, params = _model(version=4)
    path = tmp_path / "m.bin"
    ckpt.write_llmc_model(path, words, params)
    with pytest.raises(ValueError, match=r"unknown llm.c model version 4"):
        ckpt.read_llmc_model(path, 20240326, _count(params))
    header, _ = ckpt.read_llmc_model(path, 20240326, _count(params), dtype=np.float32)
    assert int(header[1]) == 4
    with pytest.raises(ValueError, match=r"256 words"):
        ckpt.write_llmc_model(path, [0] * 257, params)
    with pytest.raises(ValueError, match=r"does not fit 32 bits"):
        ckpt.write_llmc_model(path, [2**32], params)


def test_it_save_load_keeps_every_dtype(tmp_path):
    """it.save / it.load give back each tensor with its dtype and exact bits, bfloat16 and the others alike, both
    through the saved structure and from a plain safetensors file (which loads as a dict of tensors)."""
    import infinitrain as it
    from harness import DEVICE

    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i64": rng.integers(-(2**40), 2**40, size=6),
    }
    state = {k: it.tensor(v, dtype=str(v.dtype), device=DEVICE) for k, v in arrays.items()}
    state["bf"] = it.tensor(arrays["f32"], dtype="bfloat16", device=DEVICE)
    bf_bits = ckpt.float32_to_bf16_bits(arrays["f32"])  # round to nearest even, as the tensor conversion does
    it.save(state, tmp_path / "s.safetensors")
    back = it.load(tmp_path / "s.safetensors")
    for k, v in arrays.items():
        assert back[k].dtype == str(v.dtype)
        np.testing.assert_array_equal(back[k].numpy(), v)
    assert back["bf"].dtype == "bfloat16"
    np.testing.assert_array_equal(back["bf"].numpy(), ckpt.bf16_bits_to_float32(bf_bits))
    ckpt.save(tmp_path / "plain.safetensors", {"w": arrays["f32"], "b": bf_bits}, bf16={"b"})
    plain = it.load(tmp_path / "plain.safetensors")
    assert plain["w"].dtype == "float32" and plain["b"].dtype == "bfloat16"
    np.testing.assert_array_equal(plain["w"].numpy(), arrays["f32"])
    np.testing.assert_array_equal(plain["b"].numpy(), ckpt.bf16_bits_to_float32(bf_bits))
