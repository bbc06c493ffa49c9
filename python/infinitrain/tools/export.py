"""Exports a train checkpoint's model: an llm.c model file (GPT-2: llm.c's layout; LLaMA 3: either header
layout) or a Hugging Face checkpoint folder (config.json + safetensors, the models' save_pretrained). LoRA
adapters are merged into the weights first. Other formats plug in as EXPORTERS[name] = fn(model, meta,
output, args).

    python -m infinitrain.tools.export --checkpoint=runs/x --output=model.bin [--dtype=bfloat16]
    ./bazelw run //python:export -- --checkpoint=ckpt/ckpt_00000300.bin --format=safetensors --output=hf/
"""

import argparse
import os
import sys

from infinitrain.models import registry
from infinitrain.runs import read_checkpoint


def newest_checkpoint(path):
    """A checkpoint file, or the newest ckpt_*.bin in a directory."""
    if os.path.isdir(path):
        import glob

        found = sorted(glob.glob(os.path.join(path, "ckpt_*.bin")))
        if not found and os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"{path}: a Hugging Face checkpoint folder, not a train checkpoint (no ckpt_*.bin); "
                "sample and train read it with --init_from"
            )
        if not found:
            raise ValueError(f"{path}: no checkpoint (ckpt_*.bin) in this directory")
        return found[-1]
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such checkpoint")
    return path


def model_from_checkpoint(path, device="cpu"):
    """(model, meta) from a train checkpoint (file or run directory)."""
    path = newest_checkpoint(path)
    tensors, meta = read_checkpoint(path)
    cfg = meta.get("model_config")
    if not isinstance(cfg, dict) or "family" not in cfg or "fields" not in cfg:
        raise ValueError(f"{path}: the checkpoint does not record its model's config (saved by an older train CLI)")
    try:
        model = registry.from_config(cfg["family"], cfg["fields"], device)
    except ValueError as e:  # the recorded config is malformed
        raise ValueError(f"{path}: {e}") from None
    if meta.get("lora"):  # the adapters the checkpoint's weights include
        from infinitrain.models import lora

        c = meta["lora"]
        lora.apply_lora(model, c["target_modules"], c["r"], c["lora_alpha"], c.get("lora_dropout", 0.0))
    model.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    meta["path"] = path
    return model, meta


def _merged(model):
    from infinitrain.models import lora

    return lora.merge_and_unload(model) if lora.lora_modules(model) else model


def export_llmc(model, meta, output, args):
    model = _merged(model)
    if not hasattr(model, "save_llmc"):
        raise ValueError(f"--format=llmc: llm.c files hold GPT-2 or LLaMA 3, not {type(model).__name__}")
    if isinstance(model, registry.FAMILIES["llama3"].model_cls):
        model.save_llmc(output, dtype=args.dtype, layout=args.layout)
    else:
        model.save_llmc(output, dtype=args.dtype)


def export_safetensors(model, meta, output, args):
    """A Hugging Face checkpoint folder at `output` (Hugging Face's names and layouts)."""
    _merged(model).save_pretrained(output, dtype=args.dtype)


EXPORTERS = {"llmc": export_llmc, "safetensors": export_safetensors}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    p = _Parser(prog="export", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a train checkpoint, or a --save directory (its newest)")
    p.add_argument("--output", required=True, help="the file (llmc) or folder (safetensors) to write")
    p.add_argument("--format", default="llmc", help=f"one of {', '.join(EXPORTERS)}")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the weights' dtype")
    p.add_argument("--layout", default="llmc", choices=["llmc", "infinitrain"], help="llm.c LLaMA 3 header layout")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    try:
        if args.format not in EXPORTERS:
            raise ValueError(f"--format={args.format}: choose one of {', '.join(EXPORTERS)}")
        model, meta = model_from_checkpoint(args.checkpoint)
        EXPORTERS[args.format](model, meta, args.output, args)
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({args.format}, {model.num_parameters() / 1e6:.2f}M parameters, from {meta['path']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
