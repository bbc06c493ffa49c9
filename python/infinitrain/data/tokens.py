"""llm.c token files: a 256-word int32 header followed by the raw tokens.

Header words: [0] magic, [1] version, [2] token count; the rest are zero.
GPT-2 files hold uint16 tokens, LLaMA 3 files uint32 tokens (llm.c's dev/data convention).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..checkpoint import atomic_write, path_kind

HEADER_WORDS = 256
HEADER_BYTES = HEADER_WORDS * 4

MAGIC_GPT2 = 20240520
MAGIC_LLAMA3 = 20240801

# Versions written; llm.c writes 1 for GPT-2 and 7 for LLaMA 3.
VERSION_GPT2 = 1
VERSION_LLAMA3 = 7
# The magic alone fixes the token width, so any known version is accepted for either magic.
ACCEPTED_VERSIONS = (1, 2, 7)

_KINDS = {
    "gpt2": (MAGIC_GPT2, VERSION_GPT2, np.dtype("<u2")),
    "llama3": (MAGIC_LLAMA3, VERSION_LLAMA3, np.dtype("<u4")),
}
_MAGIC_TO_KIND = {magic: kind for kind, (magic, _, _) in _KINDS.items()}
_KIND_NAMES = {"gpt2": "GPT-2", "llama3": "LLaMA 3"}


def token_dtype(kind: str) -> np.dtype:
    """The on-disk token dtype for `kind` ("gpt2" or "llama3")."""
    return _kind(kind)[2]


def _kind(kind: str):
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown token file kind {kind!r}; expected one of {sorted(_KINDS)}") from None


def write_tokens(path: str | os.PathLike, tokens, kind: str = "gpt2") -> None:
    """Writes a 1-D sequence of token ids as an llm.c token file, atomically."""
    magic, version, dtype = _kind(kind)
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {arr.dtype}")
    if arr.size >= 2**31:
        raise ValueError(f"{arr.size} tokens do not fit the int32 count in the header")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        limit = int(np.iinfo(dtype).max)
        if lo < 0 or hi > limit:
            raise ValueError(f"token ids must be in [0, {limit}] for {_KIND_NAMES[kind]} files, got range [{lo}, {hi}]")
    header = np.zeros(HEADER_WORDS, dtype="<i4")
    header[0], header[1], header[2] = magic, version, arr.size
    payload = arr.astype(dtype, copy=False)

    def write(f):
        f.write(header.tobytes())
        f.write(payload.tobytes())

    atomic_write(path, write)


def _check_header(path: str, header: np.ndarray, size: int) -> tuple[str, int, int]:
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    kind = _MAGIC_TO_KIND.get(magic)
    if kind is None:
        raise ValueError(
            f"{path}: bad magic {magic}; expected {MAGIC_GPT2} (GPT-2 tokens) or {MAGIC_LLAMA3} (LLaMA 3 tokens)"
        )
    if version not in ACCEPTED_VERSIONS:
        raise ValueError(
            f"{path}: unknown token file version {version} for {_KIND_NAMES[kind]}; "
            f"expected one of {list(ACCEPTED_VERSIONS)}"
        )
    if count < 0:
        raise ValueError(f"{path}: negative token count {count} in header")
    itemsize = _KINDS[kind][2].itemsize
    expected = HEADER_BYTES + count * itemsize
    if size < expected:
        found = (size - HEADER_BYTES) // itemsize
        raise ValueError(
            f"{path}: truncated: header says {count} tokens ({expected} bytes in all), "
            f"but the file has {size} bytes ({found} whole tokens)"
        )
    if size > expected:
        raise ValueError(
            f"{path}: corrupt: header says {count} tokens ({expected} bytes in all), "
            f"but the file has {size - expected} extra bytes"
        )
    return kind, version, count


def _open_checked(path: str):
    """Opens a token file and validates its header against its size; returns (fd, kind, version, count)."""
    kind = path_kind(path)
    if kind == "directory":
        raise ValueError(f"{path}: is a directory, not an llm.c token file")
    if kind not in (None, "regular file"):  # a FIFO would block the open, a device read as endless or no tokens
        raise ValueError(f"{path}: is a {kind}, not an llm.c token file (a regular file)")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            raise ValueError(
                f"{path}: not an llm.c token file: {size} bytes is shorter than the {HEADER_BYTES}-byte header"
            )
        raw = os.pread(fd, HEADER_BYTES, 0)
        if len(raw) != HEADER_BYTES:
            raise ValueError(f"{path}: the file shrank while its header was read")
        return (fd, *_check_header(path, np.frombuffer(raw, dtype="<i4"), size))
    except BaseException:
        os.close(fd)
        raise


def read_tokens_header(path: str | os.PathLike) -> tuple[str, int, int]:
    """Validates the header and size of a token file; returns (kind, version, token count)."""
    fd, kind, version, count = _open_checked(os.fspath(path))
    os.close(fd)
    return kind, version, count


class TokenFile:
    """The tokens of a validated llm.c token file, read on demand with pread.

    Not memory-mapped: truncating or rewriting a mapped file under a running job kills it with SIGBUS. Reads go
    through the descriptor opened here (a file replaced by rename keeps being read as it was), and a read that
    comes back short (the file was truncated) raises ValueError naming the file.
    """

    _SCAN_TOKENS = 1 << 22

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._fd, self.kind, self.version, self.count = _open_checked(self.path)
        self.dtype = _KINDS[self.kind][2]

    def __len__(self) -> int:
        return self.count

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) (clipped to the file) as a new array of the file's dtype."""
        start, stop = max(0, min(start, self.count)), max(0, min(stop, self.count))
        n = max(0, stop - start)
        if n == 0:
            return np.empty(0, dtype=self.dtype)
        if self._fd is None:
            raise ValueError(f"{self.path}: token file is closed")
        nbytes = n * self.dtype.itemsize
        buf = bytearray(nbytes)
        got = os.preadv(self._fd, [buf], HEADER_BYTES + start * self.dtype.itemsize)
        if got != nbytes:
            raise ValueError(
                f"{self.path}: token file changed while in use: expected {self.count} tokens, but tokens "
                f"[{start}, {stop}) could not be read (the file was truncated or rewritten)"
            )
        return np.frombuffer(buf, dtype=self.dtype)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.count)
            return self.read(start, stop) if step == 1 else np.asarray(self)[key]
        i = int(key)
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(f"token index {key} out of range for {self.count} tokens")
        return self.read(i, i + 1)[0]

    def chunks(self, n_tokens: int | None = None):
        """Yields the whole stream in arrays of at most n_tokens tokens."""
        step = n_tokens or self._SCAN_TOKENS
        for start in range(0, self.count, step):
            yield self.read(start, start + step)

    def max(self) -> int:
        """The largest token id (a full scan); -1 for an empty file."""
        return max((int(c.max()) for c in self.chunks() if c.size), default=-1)

    def __array__(self, dtype=None, copy=None):
        out = self.read(0, self.count)
        return out if dtype is None else out.astype(dtype)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r}, {self.kind}, {self.count} tokens)"


def read_tokens(path: str | os.PathLike) -> np.ndarray:
    """Reads the tokens of a validated llm.c token file into memory (uint16 or uint32 array).

    A copy, not a memory map: a later change to the file cannot kill the reader with SIGBUS.
    """
    tf = TokenFile(path)
    try:
        return tf.read(0, tf.count)
    finally:
        tf.close()


def token_file_identity(path: str | os.PathLike, samples: int = 64, sample_bytes: int = 4096) -> dict:
    """What a checkpoint records about its training data: path, size, token count and kind, and a SHA-256 over
    the header and `samples` blocks spread evenly over the tokens (cheap for any size, and any rewrite of the
    data almost surely changes it)."""
    tf = TokenFile(path)
    try:
        digest = hashlib.sha256(os.pread(tf._fd, HEADER_BYTES, 0))
        payload = tf.count * tf.dtype.itemsize
        if payload <= samples * sample_bytes:
            starts = [0] if payload else []
            sample_bytes = payload
        else:
            starts = [i * (payload - sample_bytes) // (samples - 1) for i in range(samples)]
        for s in starts:
            block = os.pread(tf._fd, sample_bytes, HEADER_BYTES + s)
            if len(block) != sample_bytes:
                raise ValueError(f"{tf.path}: the file shrank while it was read")
            digest.update(block)
        return {
            "path": os.path.abspath(tf.path),
            "size": HEADER_BYTES + payload,
            "n_tokens": tf.count,
            "kind": tf.kind,
            "sample_sha256": digest.hexdigest(),
        }
    finally:
        tf.close()
