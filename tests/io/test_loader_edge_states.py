"""Loader edge cases: resuming from a state saved right after an epoch's last batch, a DeviceLoader's state
(the batches handed out, not the one copied ahead), token_file_identity covering the file's last bytes, digesting
evenly spread blocks and recording its size, and the length of a utils.data.DataLoader over a sized IterableDataset
with drop_last."""

import hashlib
import os

import numpy as np

import infinitrain as it
from infinitrain.data import DataLoader, write_tokens
from infinitrain.data.device import DeviceLoader
from infinitrain.data.tokens import HEADER_BYTES, token_file_identity


def test_resume_from_the_end_of_an_epoch():
    """A state saved after the last batch of an epoch (position == batches_per_epoch) loads, and the resumed
    loader continues with the same batches as the uninterrupted one."""
    g = np.random.default_rng()
    tokens = g.integers(0, 1000, size=int(g.integers(200, 400)))
    a = DataLoader(tokens, batch_size=2, seq_len=8, seed=int(g.integers(0, 1000)))
    for _ in range(a.batches_per_epoch):
        next(a)
    state = a.state_dict()
    b = DataLoader(tokens, batch_size=2, seq_len=8, seed=a.seed)
    b.load_state_dict(state)
    for _ in range(3):
        (xa, ya), (xb, yb) = next(a), next(b)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


class _Sized(it.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_iterable_len_with_drop_last():
    """len() over a sized IterableDataset is floor(n / batch) with drop_last and ceil without, and matches the
    number of batches actually yielded."""
    n, bs = int(np.random.default_rng().integers(10, 40)), 3
    for drop_last, want in ((True, n // bs), (False, -(-n // bs))):
        loader = it.utils.data.DataLoader(_Sized(n), batch_size=bs, drop_last=drop_last)
        assert len(loader) == want
        assert sum(1 for _ in loader) == want


def test_device_loader_state_is_the_batches_handed_out():
    """DeviceLoader.state_dict(), before any batch and after k, resumes a plain loader at the next batch the
    DeviceLoader would hand out (the batch it copied ahead is not counted as consumed)."""
    g = np.random.default_rng()
    tokens = g.integers(0, 1000, size=300)
    seed = int(g.integers(0, 1000))
    dl = DeviceLoader(DataLoader(tokens, batch_size=2, seq_len=8, seed=seed), "cpu")
    for k in range(3):
        resumed = DataLoader(tokens, batch_size=2, seq_len=8, seed=seed)
        resumed.load_state_dict(dl.state_dict())
        x, y = next(dl)
        rx, ry = next(resumed)
        np.testing.assert_array_equal(x.numpy(), rx, err_msg=f"after {k} batches")
        np.testing.assert_array_equal(y.numpy(), ry)


def test_token_file_identity_sees_the_last_token(tmp_path):
    """The sampled digest's last block ends at the file's end: changing only the last token changes it."""
    g = np.random.default_rng()
    tokens = g.integers(0, 50000, size=int(g.integers(500, 1500))).astype(np.uint16)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    write_tokens(a, tokens)
    tokens[-1] ^= 1
    write_tokens(b, tokens)
    ida, idb = token_file_identity(a, samples=4, sample_bytes=16), token_file_identity(b, samples=4, sample_bytes=16)
    assert ida["size"] == idb["size"] and ida["n_tokens"] == idb["n_tokens"] == len(tokens)
    assert ida["sample_sha256"] != idb["sample_sha256"]


def test_token_file_identity_size_is_the_file_size(tmp_path):
    """The recorded size is the file's size on disk (header plus payload) for both token widths: resume compares
    it against the data it is given, so it must describe the file, not the payload alone."""
    g = np.random.default_rng()
    for kind, dtype in (("gpt2", np.uint16), ("llama3", np.uint32)):
        tokens = g.integers(0, 50000, size=int(g.integers(1, 600))).astype(dtype)
        path = tmp_path / f"{kind}.bin"
        write_tokens(path, tokens, kind=kind)
        ident = token_file_identity(path)
        assert ident["size"] == os.path.getsize(path)
        assert ident["n_tokens"] == len(tokens) and ident["kind"] == kind


def test_token_file_identity_digests_evenly_spread_blocks(tmp_path):
    """With more payload than the samples cover, the digest is SHA-256 of the header then `samples` blocks
    starting at floor(i * (payload - sample_bytes) / (samples - 1)), read here from the file's bytes."""
    g = np.random.default_rng()
    samples, sample_bytes = 5, 16
    count = int(g.integers(100, 2000))
    if (2 * count) & sample_bytes:
        count += sample_bytes // 2
    path = tmp_path / "t.bin"
    write_tokens(path, g.integers(0, 50000, size=count).astype(np.uint16))
    data = path.read_bytes()
    payload = len(data) - HEADER_BYTES
    want = hashlib.sha256(data[:HEADER_BYTES])
    for i in range(samples):
        start = HEADER_BYTES + i * (payload - sample_bytes) // (samples - 1)
        want.update(data[start : start + sample_bytes])
    ident = token_file_identity(path, samples=samples, sample_bytes=sample_bytes)
    assert ident["sample_sha256"] == want.hexdigest()
