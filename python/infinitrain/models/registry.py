"""The model registry: every family (models/family.py) and its presets, which `--model NAME` builds, shared by the
train, sample, export and merge tools. Each model file exports its FAMILY; registering one is one line:

    register(gpt2.FAMILY)

A preset gives its documented shape. The shape flags (--n_layer, --n_head, --n_kv_head, --n_embd, and
--intermediate_size, --num_experts, --num_experts_per_tok) build a custom-size model of a family instead: the
fields not given take the family's small defaults and the block size is the sequence length. They go with a
family's own name (`gpt2`, `llama3`, `mixtral`, `qwen3`), not a sized preset. --init_from (a Hugging Face folder or
an llm.c model file) and --config_json (a Hugging Face config.json) fix the shape instead.
"""

import dataclasses
import json
import os
from dataclasses import dataclass

from infinitrain.models import gpt2, hf, llama3, lora, mixtral, qwen3

SHAPE_FLAGS = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "num_experts", "num_experts_per_tok")

FAMILIES = {}  # name -> Family
PRESETS = {}  # --model name -> (family name, config fields, description)


class ModelChoiceError(ValueError):
    pass


def register(family):
    """Adds a family and its presets (a name already taken is an error)."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    taken = [p.name for p in family.presets if p.name in PRESETS]
    if taken:
        raise ValueError(f"model presets {taken} are already registered")
    FAMILIES[family.name] = family
    for p in family.presets:
        PRESETS[p.name] = (family.name, dict(p.fields), p.description)
    return family


def unregister(name):
    """Removes a family and its presets (tests that register their own)."""
    FAMILIES.pop(name)
    for preset in [k for k, v in PRESETS.items() if v[0] == name]:
        del PRESETS[preset]


register(gpt2.FAMILY)
register(llama3.FAMILY)
register(mixtral.FAMILY)
register(qwen3.FAMILY)


# ---- which model --model names ----


@dataclass
class ModelSpec:
    """What to build: a family and its config fields (None: read from `llmc_filepath`)."""

    family: object
    fields: dict
    llmc_filepath: str = ""
    vocab_from: str = ""  # where the vocabulary size came from, for messages
    init_from: str = ""  # an llm.c model file or a Hugging Face folder
    config_json: str = ""  # a Hugging Face config.json giving a fresh model's sizes
    router_aux_loss_coef: float = None  # an MoE model's balancing-loss weight (None: the model's)

    def build(self, device):
        return set_router_aux_loss_coef(self._build(device), self.router_aux_loss_coef)

    def _build(self, device):
        if self.llmc_filepath:
            return self.family.from_llmc(self.llmc_filepath, device)
        if self.init_from:
            return load_pretrained(self.family.name, self.init_from, device)
        if self.config_json:
            return model_from_config_json(self.family.name, self.config_json, device)
        return self.family.build(self.family.config(self.fields), device)


def names():
    return sorted(PRESETS)


def describe():
    """One line per preset, for --help and docs/train_flags.md."""
    out = []
    for name in names():
        family, fields, what = PRESETS[name]
        shape = ", ".join(f"{k}={fields[k]}" for k in SHAPE_FLAGS if k in fields) or "custom"
        out.append(f"{name}: {what} ({shape})")
    return out


def family_of(name):
    if name in PRESETS:
        return FAMILIES[PRESETS[name][0]]
    raise ModelChoiceError(f"--model={name}: unknown model; choose one of {', '.join(names())}")


def resolve(
    name, *, shape, sequence_length, vocab_size=None, vocab_from="", llmc_filepath="", token_kind=None, init_from="",
    config_json="", router_aux_loss_coef=None,
):  # fmt: skip
    """The ModelSpec for --model=name.

    shape: the shape flags given explicitly (name -> value). vocab_size: from --vocab_size or the tokenizer
    (None: the preset's, else the token file kind's). llmc_filepath, init_from (an llm.c file or a Hugging Face
    folder) and config_json (a Hugging Face config.json) fix the shape instead. router_aux_loss_coef (None: the
    model's) goes to a mixture-of-experts model (a model built without experts refuses it). Raises
    ModelChoiceError (a one-line message) on conflicts.
    """
    family = family_of(name)
    preset = PRESETS[name][1]
    given = [k for k in SHAPE_FLAGS if shape.get(k) is not None]
    sources = [(f, v) for f, v in (("llmc_filepath", llmc_filepath), ("init_from", init_from)) if v]
    sources += [("config_json", config_json)] if config_json else []
    if len(sources) > 1:
        raise ModelChoiceError(f"--{sources[0][0]} and --{sources[1][0]} both give the model; pick one")
    if sources:
        flag = sources[0][0]
        if given:
            flags = ", ".join(f"--{k}" for k in given)
            raise ModelChoiceError(
                f"{flags} conflict{'s' if len(given) == 1 else ''} with --{flag} (it fixes the model's "
                f"shape); drop {flags}"
            )
        if name != family.name and preset:
            raise ModelChoiceError(f"--model={name} fixes the model's shape; use --model={family.name} with --{flag}")
        aux = router_aux_loss_coef
        if config_json:
            return ModelSpec(family, {}, "", "the config file", config_json=config_json, router_aux_loss_coef=aux)
        return ModelSpec(family, {}, llmc_filepath, "the model file", init_from=init_from, router_aux_loss_coef=aux)
    unknown = [k for k in given if k not in family.shape_flags]
    if unknown:
        raise ModelChoiceError(f"--{unknown[0]} does not apply to {family.name} models")
    if given and name != family.name and preset:
        raise ModelChoiceError(
            f"--model={name} fixes the model's shape; --{given[0]} builds a custom-size model: "
            f"use --model={family.name} with the shape flags"
        )
    custom = bool(given) or not preset
    fields = dict(family.custom) if custom else dict(preset)
    fields.update({k: shape[k] for k in given})
    if custom:
        fields["block_size"] = sequence_length
    if vocab_size is None and "vocab_size" not in fields:
        vocab_size = family.vocab_of_kind.get(token_kind)
        vocab_from = f"the {token_kind} token file's tokenizer" if vocab_size else ""
        if vocab_size is None:
            raise ModelChoiceError(
                f"--model={name}: the vocabulary size is unknown; pass --vocab_size or --tokenizer_bin"
            )
    if vocab_size is not None:
        fields.update(family.vocab_fields(vocab_size))
    else:
        vocab_from = f"the {name} preset"
    try:
        config = family.config(fields)  # validates now, as a usage error
    except (TypeError, ValueError) as e:
        raise ModelChoiceError(f"--model={name}: {e}") from None
    if router_aux_loss_coef is not None and not getattr(config, "num_experts", 0):
        raise ModelChoiceError(
            f"--router_aux_loss_coef applies to mixture-of-experts models (mixtral, or a Qwen3-MoE from "
            f"--config_json/--init_from); --model={name} has no router"
        )
    return ModelSpec(family, fields, "", vocab_from, router_aux_loss_coef=router_aux_loss_coef)


# ---- models and their families ----


def config_dict(model):
    """A model's config as plain JSON values (stored in checkpoints, so sample and export can rebuild it)."""
    return dataclasses.asdict(model.config)


def from_config(family_name, fields, device="cpu"):
    """A model of a family's name and config fields (as a checkpoint records them: config_dict)."""
    if not isinstance(family_name, str) or family_name not in FAMILIES:
        raise ModelChoiceError(f"unknown model family {family_name!r}; known: {', '.join(sorted(FAMILIES))}")
    if not isinstance(fields, dict):
        raise ModelChoiceError(f"the {family_name} model's config fields are {type(fields).__name__}, not an object")
    family = FAMILIES[family_name]
    try:
        config = family.restore(fields)
    except TypeError as e:  # a field the config does not have (or lacks one it needs)
        raise ModelChoiceError(f"the {family_name} model's config fields do not fit its config: {e}") from None
    return family.build(config, device)


def family_of_model(model):
    for family in FAMILIES.values():
        if isinstance(model, family.model_cls):
            return family
    raise ModelChoiceError(f"{type(model).__name__} is not a registered model family")


def family_of_config(config):
    for family in FAMILIES.values():
        if isinstance(config, family.config_cls):
            return family
    raise ModelChoiceError(f"{type(config).__name__} is not the config of a registered model family")


def family_of_hf(cfg, where="config.json"):
    """The family whose Hugging Face format reads a config.json dict (its model_type)."""
    kind = cfg.get("model_type")
    if not isinstance(kind, str):
        problem = "missing field 'model_type'" if kind is None else f"field 'model_type' must be a string, got {kind!r}"
        raise ValueError(f"{where}: {problem}")
    for family in FAMILIES.values():
        if family.hf is not None and kind in family.hf.model_types:
            return family
    known = [t for f in FAMILIES.values() if f.hf is not None for t in f.hf.model_types]
    raise ValueError(f"{where}: field 'model_type' = {kind!r} is not supported (one of {', '.join(known)})")


def config_from_hf(cfg):
    """(family, our config) for a config.json dict."""
    family = family_of_hf(cfg)
    return family, family.config_from_hf(cfg)


def from_pretrained(path, device="cpu", **config_overrides):
    """A model from a local Hugging Face checkpoint folder, of the family its config.json's model_type names.
    A bad folder raises ValueError (FileNotFoundError when there is none) naming the file and the problem,
    before the model is built (Family.from_pretrained)."""
    path = os.fspath(path)
    cfg = hf.read_config(path)
    return family_of_hf(cfg, hf.where(cfg)).from_pretrained(path, device, **config_overrides)


def save_pretrained(model, path, dtype="float32", max_shard_size="5GB"):
    """Writes a Hugging Face checkpoint folder for any registered model with a Hugging Face format."""
    family_of_model(model).save_pretrained(model, path, dtype, max_shard_size)


# ---- the CLI's model settings ----


def _no_router(what):
    return f"--router_aux_loss_coef applies to mixture-of-experts models (Mixtral, Qwen3-MoE); {what} has no router"


def set_router_aux_loss_coef(model, coef):
    """Sets the weight of a mixture-of-experts model's load-balancing loss in the training loss (in place;
    None: leave the model's); refuses a model without experts."""
    if coef is None:
        return model
    if not getattr(model.config, "num_experts", 0):
        raise ValueError(_no_router(f"this {type(model).__name__} model"))
    # replace() runs the config's checks (a finite coefficient in range) before the model takes it.
    model.config = dataclasses.replace(model.config, router_aux_loss_coef=float(coef))
    return model


def _family(name):
    if name not in FAMILIES:
        raise ValueError(f"--model must be one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def _read_config_json(name, path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"--config_json {path}: not valid JSON ({e})") from None
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"--config_json {path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--config_json {path}: expected a JSON object")
    cfg = hf.Config(cfg, path)  # field errors name the file
    family = family_of_hf(cfg, path)
    config = family.config_from_hf(cfg)
    if family is not _family(name):
        raise ValueError(f"--config_json {path} describes a {cfg.get('model_type')} model, but --model={name}")
    return cfg, config


def config_from_json(name, path):
    """Our config from a Hugging Face config.json, checked to be the --model family."""
    return _read_config_json(name, path)[1]


def model_from_config_json(name, path, device="cpu"):
    """A fresh model sized by a Hugging Face config.json; tied as it says (LLaMA's tie_word_embeddings)."""
    cfg, config = _read_config_json(name, path)
    family = FAMILIES[name]
    model = family.build(config, device)
    return family.hf.tie(model, cfg) if family.hf.tie is not None else model


def load_pretrained(name, path, device="cpu"):
    """Weights to start from: a Hugging Face checkpoint folder, or an llm.c model file (gpt2, llama3)."""
    family = _family(name)
    if os.path.isdir(path):
        cfg = hf.read_config(path)
        if family_of_hf(cfg, hf.where(cfg)) is not family:
            raise ValueError(f"--init_from {path} holds a {cfg.get('model_type')} checkpoint, but --model={name}")
        return family.from_pretrained(path, device)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--init_from {path}: no such file or folder")
    if not family.llmc:
        raise ValueError(f"--init_from {path}: llm.c model files hold gpt2 or llama3, not {name}; pass an HF folder")
    return family.from_llmc(path, device)


def build_model(
    name, vocab_size, block_size, *, n_layer=4, n_head=4, n_embd=128, n_kv_head=None, intermediate_size=0,
    num_experts=8, num_experts_per_tok=2, config_json="", init_from="", router_aux_loss_coef=None, device="cpu",
):  # fmt: skip
    """A model of family `name`: from init_from's weights, else fresh with config_json's sizes, else with these
    sizes (0 / None: the family's derived default); router_aux_loss_coef (None: the model's or its config's) weighs
    an MoE model's balancing loss. Its vocabulary and block size must cover vocab_size and block_size."""
    if init_from and config_json:
        raise ValueError("--init_from and --config_json both set: the checkpoint carries its own config")
    family = _family(name)
    if init_from:
        model = load_pretrained(name, init_from, device)
    elif config_json:
        model = model_from_config_json(name, config_json, device)
    else:
        sizes = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "n_kv_head": n_kv_head or n_head}
        sizes.update(intermediate_size=intermediate_size, num_experts=num_experts)
        sizes["num_experts_per_tok"] = num_experts_per_tok
        fields = dict(family.custom, block_size=block_size, **family.vocab_fields(vocab_size))
        fields.update({k: v for k, v in sizes.items() if k in family.shape_flags and v})
        model = family.build(family.config(fields), device)
    set_router_aux_loss_coef(model, router_aux_loss_coef)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is smaller than the data's {vocab_size}")
    if model.config.block_size < block_size:
        raise ValueError(f"--sequence_length {block_size} exceeds the model's block_size {model.config.block_size}")
    return model


def setup_lora(model, name, rank, alpha=16.0, target_modules="", dropout=0.0):
    """With rank > 0, adds LoRA adapters (target_modules empty: the family's lora_targets) and returns the
    parameters to optimize: the adapters alone. With rank 0, every parameter."""
    if rank < 0:
        raise ValueError(f"--lora_rank must be >= 0, got {rank}")
    if rank == 0:
        return list(model.parameters())
    lora.apply_lora(model, target_modules or _family(name).lora_targets, rank, alpha, dropout)
    return lora.trainable_parameters(model)


# The model flags of RunConfig: name -> (type, default, help, lower bound). All shape a run: resuming compares them.
FLAG_SPECS = {
    "config_json": (str, "", "Hugging Face config.json giving a fresh model's sizes.", None),
    "init_from": (str, "", "Start from these weights: a Hugging Face checkpoint folder or an llm.c model file.", None),
    "intermediate_size": (int, 0, "MLP / expert width of a fresh model (0: derived).", 0),
    "num_experts": (int, 8, "Experts per MoE layer of a fresh Mixtral.", 1),
    "num_experts_per_tok": (int, 2, "Experts each token is routed to (top-k).", 1),
    "router_aux_loss_coef": (
        float,
        None,
        "Weight of the router's load-balancing loss in a mixture-of-experts model's loss (default: the model's, "
        "Mixtral 0.02, Qwen3-MoE 0.001, or its config.json's).",
        0.0,
    ),
    "lora_rank": (int, 0, "LoRA rank (0: full fine-tuning).", 0),
    "lora_alpha": (float, 16.0, "LoRA alpha: the update is scaled by alpha / rank.", None),
    "lora_target_modules": (
        str,
        "",
        "Comma-separated linear layer names to adapt (empty: the attention projections).",
        None,
    ),
    "lora_dropout": (float, 0.0, "Dropout on the LoRA path's input.", None),
}
RUN_FLAGS = tuple(FLAG_SPECS)
