"""Hugging Face tokenizers (`tokenizer.json`, through the `tokenizers` package): encode text corpora into
llm.c token files, decode samples, and train a small byte-level BPE (e.g. on the Shakespeare corpus).

    tok = HFTokenizer.load("tokenizer.json")
    tokenize_files(tok, ["a.txt", "b.txt"], "train.bin")     # documents joined by the end-of-text token
    python -m infinitrain.data.hf_tokenizer --tokenizer=tokenizer.json --out=train.bin a.txt b.txt
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterable

import numpy as np

from ..checkpoint import atomic_write
from .inputs import check_input
from .tokenizer import ByteTokenizer
from .tokens import read_tokens, write_tokens

# End-of-text markers of common vocabularies, tried in order.
EOT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>")


class HFTokenizer:
    """A tokenizers.Tokenizer with the interface the train CLI uses (encode, decode, vocab_size, eot)."""

    def __init__(self, tok):
        self._tok = tok
        self.eot = next((i for i in (tok.token_to_id(t) for t in EOT_TOKENS) if i is not None), None)

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFTokenizer:
        from tokenizers import Tokenizer

        path = os.fspath(path)
        if not os.path.lexists(path):
            raise FileNotFoundError(f"{path}: no such tokenizer file")
        check_input(path, what="a tokenizer.json file")
        with _refused(f"{path}: not a valid tokenizer.json"):
            return cls(Tokenizer.from_file(path))

    def save(self, path: str | os.PathLike) -> None:
        text = self._tok.to_str()
        atomic_write(path, lambda f: f.write(text.encode("utf-8")))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_kind(self) -> str:
        """The llm.c token file kind that holds these ids: gpt2 (uint16) or llama3 (uint32)."""
        return "gpt2" if self.vocab_size <= 2**16 else "llama3"

    def encode(self, text: str) -> np.ndarray:
        with _refused("the tokenizer failed to encode"):
            return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in np.asarray(list(ids)).reshape(-1)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        with _refused("the tokenizer failed to decode"):
            return self._tok.decode(ids, skip_special_tokens=False)


@contextlib.contextmanager
def _refused(what):
    """The package's errors as ValueError. Its Rust panics (a malformed model, e.g. a continuing_subword_prefix
    longer than a token) arrive as PanicException, a BaseException: caught too, but not KeyboardInterrupt and
    friends."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError):
        raise
    except BaseException as e:
        raise ValueError(f"{what} ({type(e).__name__}: {e})") from None


def train_bpe(texts: Iterable[str], vocab_size: int = 512, special_tokens=("<|endoftext|>",)) -> HFTokenizer:
    """A byte-level BPE (GPT-2 style: every byte is a token, so any text encodes) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size must be >= {256 + len(special_tokens)} (the bytes and special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok)


def encode_documents(tokenizer: HFTokenizer, texts: Iterable[str]) -> np.ndarray:
    """Every text encoded, joined by the end-of-text token (which the tokenizer must have)."""
    if tokenizer.eot is None:
        raise ValueError(f"the tokenizer has no end-of-text token (one of {', '.join(EOT_TOKENS)})")
    parts = []
    for i, text in enumerate(texts):
        if i:
            parts.append(np.array([tokenizer.eot], dtype=np.int64))
        parts.append(tokenizer.encode(text))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def tokenize_files(tokenizer: HFTokenizer, text_paths, out_path, kind: str | None = None) -> int:
    """Encodes UTF-8 text files (one document each) into an llm.c token file; returns the token count."""
    texts = []
    for p in text_paths:
        with open(p, encoding="utf-8") as f:
            texts.append(f.read())
    tokens = encode_documents(tokenizer, texts)
    write_tokens(out_path, tokens, kind or tokenizer.token_kind())
    return int(tokens.size)


def corpus_documents(path: str | os.PathLike) -> list[str]:
    """The texts of a byte-level llm.c token file (the default Shakespeare corpus), split at end-of-text."""
    ids = read_tokens(path).astype(np.int64)
    cuts = np.flatnonzero(ids == ByteTokenizer.eot)
    docs, start = [], 0
    for c in [*cuts.tolist(), ids.size]:
        docs.append(ids[start:c].astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
        start = c + 1
    return [d for d in docs if d]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Tokenize UTF-8 text files into an llm.c token file.")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("--out", required=True, help="the llm.c token file to write")
    ap.add_argument("--kind", choices=["gpt2", "llama3"], help="token width (default: by vocabulary size)")
    ap.add_argument("texts", nargs="+", help="text files, one document each")
    args = ap.parse_args(argv)
    tok = HFTokenizer.load(args.tokenizer)
    n = tokenize_files(tok, args.texts, args.out, args.kind)
    print(f"wrote {n} tokens to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
