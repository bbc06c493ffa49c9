"""Generates text from a train checkpoint or an llm.c model file.

    python -m infinitrain.tools.sample --checkpoint=runs/x --prompt="ROMEO:" --length=200 --top_k=40 --seed=1
    ./bazelw run //python:sample -- --llmc_filepath=gpt2_124M.bin --tokenizer_bin=gpt2_tokenizer.bin

The tokenizer is --tokenizer_bin, else the one the checkpoint was trained with (the byte tokenizer of the
default corpus, or its --tokenizer_bin): an llm.c tokenizer file or a Hugging Face tokenizer.json. Without
one, prompts are --prompt_tokens and the output is token ids. Text prompts with an llm.c tokenizer are
encoded by longest match (see infinitrain.tools.prepare).
"""

import argparse
import os
import struct
import sys

import numpy as np

from infinitrain.models import registry
from infinitrain.tools.export import model_from_checkpoint
from infinitrain.tools.prepare import load_tokenizer

LLMC_MAGICS = {20240326: "gpt2", 20240803: "llama3"}


def model_from_llmc(path, device="cpu"):
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ValueError(f"--llmc_filepath={path}: {e.strerror or e}") from None
    magic = struct.unpack("<i", head)[0] if len(head) == 4 else None
    if magic not in LLMC_MAGICS:
        raise ValueError(f"--llmc_filepath={path}: not an llm.c model file (magic {magic})")
    return registry.FAMILIES[LLMC_MAGICS[magic]].from_llmc(path, device)


def generate_text(model, *, prompt_ids, length, temperature, top_k, seed, num_samples=1):
    """[num_samples, len(prompt) + length] token ids."""
    idx = np.tile(np.asarray(prompt_ids, dtype=np.int64)[None, :], (num_samples, 1))
    return model.generate(idx, length, temperature=temperature, top_k=top_k, seed=seed)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    p = _Parser(prog="sample", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a train checkpoint, or a --save directory (its newest)")
    src.add_argument("--llmc_filepath", help="an llm.c model file (GPT-2 or LLaMA 3)")
    src.add_argument("--init_from", help="a Hugging Face checkpoint folder")
    p.add_argument("--tokenizer_bin", default="", help="llm.c tokenizer file, tokenizer.json, or 'byte'")
    p.add_argument("--prompt", default="", help="text to continue (default: start after end-of-text)")
    p.add_argument("--prompt_tokens", default="", help="comma-separated token ids instead of --prompt")
    p.add_argument("--length", type=int, default=128, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top_k", type=int, default=40, help="sample among the k likeliest (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_samples", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    try:
        if args.length < 0 or args.num_samples < 1 or args.top_k < 0:
            raise ValueError("--length must be >= 0, --num_samples >= 1 and --top_k >= 0")
        tok_spec = args.tokenizer_bin
        if args.checkpoint:
            model, meta = model_from_checkpoint(args.checkpoint, args.device)
            tok_spec = tok_spec or meta.get("tokenizer") or ""
        elif args.init_from:
            if not os.path.isdir(args.init_from):
                raise ValueError(
                    f"--init_from={args.init_from}: no such folder (a Hugging Face checkpoint folder; an llm.c "
                    "model file goes to --llmc_filepath)"
                )
            model = registry.from_pretrained(args.init_from, args.device)
        else:
            model = model_from_llmc(args.llmc_filepath, args.device)
        tok = enc = None
        if tok_spec:
            tok, enc, _ = load_tokenizer(tok_spec)
        if args.prompt_tokens:
            try:
                ids = [int(t) for t in args.prompt_tokens.split(",")]
            except ValueError:
                raise ValueError(f"--prompt_tokens={args.prompt_tokens}: expected comma-separated ints") from None
        elif args.prompt:
            if enc is None:
                raise ValueError("--prompt needs a tokenizer (--tokenizer_bin); or pass --prompt_tokens")
            ids = enc.encode(args.prompt).tolist()
        else:
            eot = tok.eot if tok is not None and tok.eot is not None else 0
            ids = [eot]
        if not ids:
            raise ValueError("the prompt encodes to no tokens")
        out = generate_text(
            model, prompt_ids=ids, length=args.length, temperature=args.temperature,
            top_k=args.top_k or None, seed=args.seed, num_samples=args.num_samples,
        )  # fmt: skip
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for i, row in enumerate(out):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        if tok is not None:
            start = 1 if not (args.prompt or args.prompt_tokens) else 0  # drop the end-of-text we started from
            print(tok.decode(row[start:].tolist()))
        else:
            print(" ".join(str(t) for t in row.tolist()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
