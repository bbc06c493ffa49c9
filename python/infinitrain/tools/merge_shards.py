"""Merges a tensor/pipeline-parallel run's checkpoint (its per-rank shards) into a plain checkpoint: the model and
optimizer state of the single-device model, which one device (train --load/--resume, sample, export) or any
other layout starts from. --llmc also writes an llm.c model file.

    python -m infinitrain.tools.merge_shards --checkpoint=runs/x/ckpt_00000100.bin --output=merged.bin
"""

import argparse
import os
import sys

from infinitrain import checkpoint
from infinitrain.models import registry
from infinitrain.parallel import shards


def full_model(meta, device="cpu"):
    cfg = meta.get("model_config")
    if not isinstance(cfg, dict) or "family" not in cfg:
        raise ValueError("the checkpoint does not record its model's config")
    return registry.from_config(cfg["family"], cfg["fields"], device)


def merge_file(path, output, llmc=""):
    """Writes the merged checkpoint to `output` (and an llm.c file); returns the model loaded with it."""
    _, meta = checkpoint.load(path)
    if "shard" not in meta:
        raise ValueError(f"{path} is not a sharded checkpoint: it loads as it is")
    model = full_model(meta)
    names = [n for n, _ in model.named_parameters()]
    tensors, merged_meta = shards.merged_checkpoint(path, names)
    model.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    checkpoint.save(output, tensors, merged_meta)
    if llmc:
        model.save_llmc(llmc)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--checkpoint", required=True, help="the main file (ckpt_N.bin) of a sharded checkpoint, or its run directory"
    )
    ap.add_argument("--output", required=True, help="the plain checkpoint to write")
    ap.add_argument("--llmc", default="", help="also write an llm.c model file here")
    args = ap.parse_args(argv)
    path = args.checkpoint
    try:
        if os.path.isdir(path):
            from infinitrain.tools.export import newest_checkpoint

            path = newest_checkpoint(path)
        merge_file(path, args.output, args.llmc)
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"merged {path} into {args.output}" + (f" and {args.llmc}" if args.llmc else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
