"""Tokenizers: a decoder for llm.c tokenizer files and a byte-level tokenizer.

llm.c tokenizer file: 256 uint32 header words ([0] magic, [1] version, [2] vocab size, and for
version 2 [3] the EOT id), then per token one uint8 length followed by that many bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import numpy as np

from ..checkpoint import atomic_write
from .inputs import check_input
from .tokens import HEADER_BYTES, HEADER_WORDS

TOKENIZER_MAGIC_GPT2 = 20240328
TOKENIZER_MAGIC_LLAMA3 = 20240801
_MAGIC_NAMES = {TOKENIZER_MAGIC_GPT2: "GPT-2", TOKENIZER_MAGIC_LLAMA3: "LLaMA 3"}

# Version 1 files carry no EOT id; llm.c assumes GPT-2's 50256 for its 50257-token vocab.
_GPT2_V1_VOCAB = 50257
_GPT2_V1_EOT = 50256

EOT_TEXT = b"<|endoftext|>"


def _as_ids(ids) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.reshape(-1).astype(np.int64, copy=False)


def _check_range(arr: np.ndarray, vocab_size: int) -> None:
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}), got range [{int(arr.min())}, {int(arr.max())}]")


class Tokenizer:
    """Decode-only tokenizer read from an llm.c tokenizer file."""

    def __init__(self, pieces: list[bytes], eot: int | None, magic: int = TOKENIZER_MAGIC_GPT2):
        self.pieces = list(pieces)
        self.eot = eot
        self.magic = magic

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = os.fspath(path)
        check_input(path, what="an llm.c tokenizer file")  # a FIFO or device would block or never end the read
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < HEADER_BYTES:
            raise ValueError(
                f"{path}: not an llm.c tokenizer file: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header"
            )
        header = struct.unpack_from(f"<{HEADER_WORDS}I", data)
        magic, version, vocab_size = header[0], header[1], header[2]
        if magic not in _MAGIC_NAMES:
            raise ValueError(
                f"{path}: bad magic {magic}; expected {TOKENIZER_MAGIC_GPT2} (GPT-2 tokenizer) "
                f"or {TOKENIZER_MAGIC_LLAMA3} (LLaMA 3 tokenizer)"
            )
        if version not in (1, 2):
            raise ValueError(f"{path}: unknown tokenizer version {version}; expected 1 or 2")
        if vocab_size == 0 or vocab_size >= 2**31:
            raise ValueError(f"{path}: implausible vocab size {vocab_size}")
        if version == 2:
            eot = header[3]
            if eot >= vocab_size:
                raise ValueError(f"{path}: EOT id {eot} is outside the vocab of {vocab_size} tokens")
        else:
            eot = _GPT2_V1_EOT if vocab_size == _GPT2_V1_VOCAB else None
        pieces = []
        pos = HEADER_BYTES
        for i in range(vocab_size):
            if pos >= len(data):
                raise ValueError(f"{path}: truncated: found {i} of {vocab_size} tokens")
            n = data[pos]
            if pos + 1 + n > len(data):
                raise ValueError(f"{path}: truncated: token {i} needs {n} bytes, file ends first")
            pieces.append(data[pos + 1 : pos + 1 + n])
            pos += 1 + n
        if pos != len(data):
            raise ValueError(f"{path}: corrupt: {len(data) - pos} extra bytes after the {vocab_size} tokens")
        return cls(pieces, eot, magic)

    def decode_bytes(self, ids) -> bytes:
        arr = _as_ids(ids)
        _check_range(arr, self.vocab_size)
        return b"".join(self.pieces[i] for i in arr.tolist())

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


class ByteTokenizer:
    """Byte-level tokenizer: ids 0..255 are raw bytes, 256 is end-of-text (vocab 257)."""

    vocab_size = 257
    eot = 256

    def encode(self, text: str) -> np.ndarray:
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        arr = _as_ids(ids)
        _check_range(arr, self.vocab_size)
        out = bytearray()
        # Split on EOT so the bulk of the work stays vectorized.
        eot_at = np.flatnonzero(arr == self.eot)
        start = 0
        for e in eot_at.tolist():
            out += arr[start:e].astype(np.uint8).tobytes()
            out += EOT_TEXT
            start = e + 1
        out += arr[start:].astype(np.uint8).tobytes()
        return bytes(out)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def write_llmc(self, path: str | os.PathLike) -> None:
        """Writes this vocab as an llm.c (GPT-2 magic, version 2) tokenizer file, atomically."""
        header = [0] * HEADER_WORDS
        header[0], header[1], header[2], header[3] = TOKENIZER_MAGIC_GPT2, 2, self.vocab_size, self.eot
        body = bytearray(struct.pack(f"<{HEADER_WORDS}I", *header))
        for b in range(256):
            body += bytes((1, b))
        body += bytes((len(EOT_TEXT),)) + EOT_TEXT

        atomic_write(path, lambda f: f.write(bytes(body)))
