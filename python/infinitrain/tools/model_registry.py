"""Which model `--model NAME` builds: model families (an architecture with its config class) and presets (a
family with a fixed shape), in one registry the train, sample and export CLIs share.

Adding an architecture is local to its module:

    from infinitrain.tools import model_registry as R
    R.register_family(R.Family("mixtral", Mixtral, MixtralConfig, from_llmc=Mixtral.from_llmc, ...))
    R.register_preset("mixtral-8x7b", "mixtral", n_layer=32, ...)

A preset alone gives its documented shape. The shape flags (--n_layer, --n_head, --n_kv_head, --n_embd) build
a custom-size model of a family instead: the fields not given take the family's small defaults and the block
size is the sequence length. They go with a family's own name (`gpt2`, `llama3`), not a sized preset.
"""

import dataclasses
from dataclasses import dataclass, field

from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config

SHAPE_FLAGS = ("n_layer", "n_head", "n_kv_head", "n_embd")


@dataclass
class Family:
    name: str
    model_cls: type
    config_cls: type
    # Defaults of a custom-size model (the shape flags override them); block_size is the sequence length.
    custom: dict
    # Shape flags this family understands (GPT-2 has no separate key/value heads).
    shape_flags: tuple = SHAPE_FLAGS
    # Token-file kind -> vocabulary, when neither a tokenizer nor --vocab_size says (llm.c's convention: a
    # GPT-2 token file holds GPT-2 BPE ids).
    vocab_of_kind: dict = field(default_factory=lambda: {"gpt2": 50257, "llama3": 128256})
    # How the config's vocabulary is set from a vocabulary size (GPT-2 pads its embedding for speed).
    vocab_fields: object = None
    # The transformer blocks activation recompute wraps.
    blocks: object = None

    def config(self, fields):
        return self.config_cls(**fields)

    def build(self, config, device):
        return self.model_cls(config, device)

    def from_llmc(self, path, device):
        return self.model_cls.from_llmc(path, device)


def _gpt2_vocab(v):
    return {"vocab_size": v, "padded_vocab_size": -(-v // 64) * 64}


FAMILIES = {}
PRESETS = {}  # name -> (family, config fields, description)


def register_family(family):
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    FAMILIES[family.name] = family


def register_preset(name, family, description="", **fields):
    if name in PRESETS:
        raise ValueError(f"model preset {name!r} is already registered")
    if family not in FAMILIES:
        raise ValueError(f"model preset {name!r}: unknown family {family!r}")
    PRESETS[name] = (family, fields, description)


register_family(
    Family(
        "gpt2",
        GPT2,
        GPT2Config,
        custom={"n_layer": 4, "n_head": 4, "n_embd": 128},
        shape_flags=("n_layer", "n_head", "n_embd"),
        vocab_fields=_gpt2_vocab,
        blocks=lambda m: list(m.h),
    )
)
register_family(
    Family(
        "llama3",
        LLaMA3,
        LLaMA3Config,
        custom={"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "ffn_dim_multiplier": 1.0, "multiple_of": 32},
        vocab_fields=lambda v: {"vocab_size": v},
        blocks=lambda m: list(m.h),
    )
)

# GPT-2 sizes as llm.c and InfiniTrain name them (dN: N layers); vocabulary 50257, 1024 positions.
_GPT2 = {"block_size": 1024, "vocab_size": 50257}
for _names, (_l, _h, _c), _what in (
    (("gpt2", "d12"), (12, 12, 768), "GPT-2 124M"),
    (("gpt2-medium", "d24"), (24, 16, 1024), "GPT-2 350M"),
    (("gpt2-large", "d36"), (36, 20, 1280), "GPT-2 774M"),
    (("gpt2-xl", "d48"), (48, 25, 1600), "GPT-2 1558M"),
):
    for _n in _names:
        register_preset(_n, "gpt2", _what, n_layer=_l, n_head=_h, n_embd=_c, **_GPT2)
register_preset("gpt2-tiny", "gpt2", "the main job's 4-layer, 128-wide GPT-2 (block size: the sequence length)")

# LLaMA 3 sizes (untied output head, as llm.c's train_llama3.py); vocabulary 128256.
_LLAMA3 = {"vocab_size": 128256, "rope_theta": 500000.0, "use_scaled_rope": True}
for _names, (_l, _h, _kv, _c, _mult, _of, _block), _what in (
    (("llama3", "llama3-1b"), (16, 32, 8, 2048, 1.5, 1024, 8192), "LLaMA 3.2 1B shape"),
    (("llama3-3b",), (28, 24, 8, 3072, 1.0, 256, 8192), "LLaMA 3.2 3B shape"),
    (("llama3-8b",), (32, 32, 8, 4096, 1.3, 1024, 8192), "LLaMA 3.1 8B"),
    (("llama3-70b",), (80, 64, 8, 8192, 1.3, 4096, 8192), "LLaMA 3.1 70B"),
):
    for _n in _names:
        register_preset(
            _n,
            "llama3",
            _what,
            n_layer=_l,
            n_head=_h,
            n_kv_head=_kv,
            n_embd=_c,
            ffn_dim_multiplier=_mult,
            multiple_of=_of,
            block_size=_block,
            **_LLAMA3,
        )
register_preset("llama3-tiny", "llama3", "a 4-layer, 128-wide LLaMA 3 (block size: the sequence length)")


@dataclass
class ModelSpec:
    """What to build: a family and its config fields (None: read from `llmc_filepath`)."""

    family: Family
    fields: dict
    llmc_filepath: str = ""
    vocab_from: str = ""  # where the vocabulary size came from, for messages

    def build(self, device):
        if self.llmc_filepath:
            return self.family.from_llmc(self.llmc_filepath, device)
        return self.family.build(self.family.config(self.fields), device)


class ModelChoiceError(ValueError):
    pass


def names():
    return sorted(PRESETS)


def describe():
    """One line per preset, for --help and the README."""
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


def resolve(name, *, shape, sequence_length, vocab_size=None, vocab_from="", llmc_filepath="", token_kind=None):
    """The ModelSpec for --model=name.

    shape: the shape flags given explicitly (name -> value). vocab_size: from --vocab_size or the tokenizer
    (None: the preset's, else the token file kind's). Raises ModelChoiceError (a one-line message) on conflicts.
    """
    family_name, preset, _ = PRESETS.get(name, (None, None, None))
    if family_name is None:
        family_of(name)  # raises
    family = FAMILIES[family_name]
    given = [k for k in SHAPE_FLAGS if shape.get(k) is not None]
    if llmc_filepath:
        if given:
            flags = ", ".join(f"--{k}" for k in given)
            raise ModelChoiceError(
                f"{flags} conflict{'s' if len(given) == 1 else ''} with --llmc_filepath (the file fixes the model's "
                f"shape); drop {flags}"
            )
        return ModelSpec(family, {}, llmc_filepath, "the model file")
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
        family.config(fields)  # validates now, as a usage error
    except (TypeError, ValueError) as e:
        raise ModelChoiceError(f"--model={name}: {e}") from None
    return ModelSpec(family, fields, "", vocab_from)


def config_dict(model):
    """A model's config as plain JSON values (stored in checkpoints, so sample and export can rebuild it)."""
    return dataclasses.asdict(model.config)


def from_config(family_name, fields, device="cpu"):
    if family_name not in FAMILIES:
        raise ModelChoiceError(f"unknown model family {family_name!r}; known: {', '.join(sorted(FAMILIES))}")
    family = FAMILIES[family_name]
    return family.build(family.config(fields), device)


def family_of_model(model):
    for family in FAMILIES.values():
        if isinstance(model, family.model_cls):
            return family
    raise ModelChoiceError(f"{type(model).__name__} is not a registered model family")
