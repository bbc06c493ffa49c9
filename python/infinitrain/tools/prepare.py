"""Tokenizes a text file, or a folder of them, into llm.c token files for the train CLI.

    python -m infinitrain.tools.prepare --input=novels/ --output_dir=data --tokenizer=byte
    ./bazelw run //python:prepare -- --input=book.txt --output_dir=data --tokenizer=gpt2_tokenizer.bin

Each file is a document (a folder's *.txt files in sorted order); every document starts with the end-of-text
token, as llm.c's data scripts do. The last --val_fraction of the tokens is the validation split. Writes
<name>_train.bin and <name>_val.bin, and for the byte tokenizer its llm.c tokenizer file (for samples).

Tokenizers: `byte` (ids 0..255 are bytes, 256 ends a text), a Hugging Face tokenizer.json (its own BPE,
exact), and llm.c tokenizer files. llm.c's files hold each token's bytes but not BPE merge ranks, so text is
encoded by longest match over those bytes: a valid tokenization that decodes back to the text, though not
always the one GPT-2's BPE would choose.
"""

import argparse
import glob
import os
import sys

import numpy as np

from infinitrain.data import ByteTokenizer, Tokenizer, write_tokens
from infinitrain.data.tokenizer import TOKENIZER_MAGIC_LLAMA3


class LongestMatchEncoder:
    """Encodes bytes with an llm.c tokenizer's pieces, taking the longest piece at each position."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.root = {}
        for i, piece in enumerate(tokenizer.pieces):
            if not piece or i == tokenizer.eot:
                continue  # the end-of-text piece is a marker, not text
            node = self.root
            for b in piece:
                node = node.setdefault(b, {})
            node.setdefault(-1, i)  # the first id of a piece wins

    def encode_bytes(self, data):
        out, i, n = [], 0, len(data)
        while i < n:
            node, best, best_end, j = self.root, None, i, i
            while j < n:
                node = node.get(data[j])
                if node is None:
                    break
                j += 1
                if -1 in node:
                    best, best_end = node[-1], j
            if best is None:
                raise ValueError(f"byte 0x{data[i]:02x} at offset {i} has no token in this tokenizer")
            out.append(best)
            i = best_end
        return np.asarray(out, dtype=np.int64)

    def encode(self, text):
        return self.encode_bytes(text.encode("utf-8"))


def load_tokenizer(spec):
    """(tokenizer, encoder, name) for `byte`, a Hugging Face tokenizer.json or an llm.c tokenizer file."""
    if spec == "byte":
        t = ByteTokenizer()
        return t, t, "byte"
    if str(spec).endswith(".json"):
        from infinitrain.data import HFTokenizer

        t = HFTokenizer.load(spec)
        if t.eot is None:
            raise ValueError(f"{spec}: the tokenizer has no end-of-text token")
        return t, _TextEncoder(t), spec
    t = Tokenizer.load(spec)
    if t.eot is None:
        raise ValueError(f"{spec}: the tokenizer has no end-of-text token (version 1 file of a non-GPT-2 vocabulary)")
    return t, LongestMatchEncoder(t), spec


class _TextEncoder:
    """encode_bytes for a tokenizer that encodes text (a Hugging Face tokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text):
        return np.asarray(self.tokenizer.encode(text), dtype=np.int64)

    def encode_bytes(self, data):
        return self.encode(data.decode("utf-8", errors="replace"))


def input_files(path, pattern):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "**", pattern), recursive=True))
        files = [f for f in files if os.path.isfile(f)]
        if not files:
            raise ValueError(f"--input={path}: no {pattern} files in this folder")
        return files
    if not os.path.isfile(path):
        raise ValueError(f"--input={path}: no such file or folder")
    return [path]


def prepare(input_path, output_dir, *, tokenizer="byte", name=None, val_fraction=0.05, pattern="*.txt"):
    """Writes the token files; returns {'train': path, 'val': path or None, 'tokenizer': path or None, ...}."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val_fraction={val_fraction} must be in [0, 1)")
    tok, enc, tok_name = load_tokenizer(tokenizer)
    files = input_files(input_path, pattern)
    parts = []
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        parts.append(np.array([tok.eot], dtype=np.int64))
        parts.append(enc.encode_bytes(data))
    tokens = np.concatenate(parts)
    kind = "llama3" if getattr(tok, "magic", None) == TOKENIZER_MAGIC_LLAMA3 or tok.vocab_size > 65536 else "gpt2"
    name = name or os.path.splitext(os.path.basename(os.path.normpath(input_path)))[0]
    os.makedirs(output_dir, exist_ok=True)
    n_val = int(len(tokens) * val_fraction)
    out = {"files": len(files), "tokens": int(len(tokens)), "kind": kind, "val": None, "tokenizer": None}
    out["train"] = os.path.join(output_dir, f"{name}_train.bin")
    write_tokens(out["train"], tokens[: len(tokens) - n_val], kind=kind)
    if n_val:
        out["val"] = os.path.join(output_dir, f"{name}_val.bin")
        write_tokens(out["val"], tokens[len(tokens) - n_val :], kind=kind)
    if tok_name == "byte":
        out["tokenizer"] = os.path.join(output_dir, "byte_tokenizer.bin")
        tok.write_llmc(out["tokenizer"])
    else:
        out["tokenizer"] = tok_name
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    p = _Parser(prog="prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="a text file, or a folder of them")
    p.add_argument("--output_dir", required=True, help="where the token files go")
    p.add_argument("--tokenizer", default="byte", help="byte, a Hugging Face tokenizer.json or an llm.c tokenizer file")
    p.add_argument("--name", default=None, help="file name prefix (default: the input's name)")
    p.add_argument("--val_fraction", type=float, default=0.05, help="share of tokens for validation")
    p.add_argument("--pattern", default="*.txt", help="which files of a folder are read")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    try:
        out = prepare(
            args.input, args.output_dir, tokenizer=args.tokenizer, name=args.name, val_fraction=args.val_fraction,
            pattern=args.pattern,
        )  # fmt: skip
    except (ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{out['files']} files, {out['tokens']} tokens ({out['kind']} token files): {out['train']}, {out['val']}")
    val = f" --input_val_bin={out['val']}" if out["val"] else ""
    print(f"train with: --input_bin={out['train']}{val} --tokenizer_bin={out['tokenizer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
