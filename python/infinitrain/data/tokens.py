"""llm.c token files: a 256-word int32 header followed by the raw tokens.

Header words: [0] magic, [1] version, [2] token count; the rest are zero.
GPT-2 files hold uint16 tokens, LLaMA 3 files uint32 tokens (llm.c's dev/data convention).
"""

from __future__ import annotations

import os

import numpy as np

from ..checkpoint import atomic_write

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


def read_tokens_header(path: str | os.PathLike) -> tuple[str, int, int]:
    """Validates the header and size of a token file; returns (kind, version, token count)."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(
            f"{path}: not an llm.c token file: {size} bytes is shorter than the {HEADER_BYTES}-byte header"
        )
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
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


def read_tokens(path: str | os.PathLike) -> np.ndarray:
    """Memory-maps the tokens of a validated llm.c token file (read-only uint16 or uint32 array)."""
    kind, _, count = read_tokens_header(path)
    dtype = _KINDS[kind][2]
    if count == 0:
        # mmap of zero bytes is an error on most platforms.
        return np.empty(0, dtype=dtype)
    return np.memmap(os.fspath(path), dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))
