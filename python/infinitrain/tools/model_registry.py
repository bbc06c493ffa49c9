"""Which model `--model NAME` builds: model families (an architecture with its config class) and presets (a
family with a fixed shape), in one registry the train, sample and export CLIs share. Sizes of a custom model
and pretrained weights go through the models' own helpers (infinitrain.models.registry).

Adding an architecture is local:

    from infinitrain.tools import model_registry as R
    R.register_family(R.Family("mixtral", Mixtral, MixtralConfig, custom={...}, make_config=...))
    R.register_preset("mixtral-8x7b", "mixtral", "Mixtral 8x7B", n_layer=32, ...)

A preset alone gives its documented shape. The shape flags (--n_layer, --n_head, --n_kv_head, --n_embd, and
the models' --intermediate_size, --num_experts, --num_experts_per_tok) build a custom-size model of a family
instead: the fields not given take the family's small defaults and the block size is the sequence length.
They go with a family's own name (`gpt2`, `llama3`, `mixtral`, `qwen3`), not a sized preset.
"""

import dataclasses
from dataclasses import dataclass, field

from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config, Mixtral, MixtralConfig, Qwen3, Qwen3Config
from infinitrain.models import registry as models_registry

SHAPE_FLAGS = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "num_experts", "num_experts_per_tok")


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
    # The transformer blocks activation recompute wraps, and whether it may (not with mixture-of-experts
    # layers: their balancing loss is a side output of the forward, which recompute would run without a graph).
    blocks: object = None
    recompute_ok: object = lambda config: True  # noqa: E731
    # fields -> config for a fresh model (default: the config class itself).
    make_config: object = None

    def config(self, fields):
        return self.make_config(fields) if self.make_config else self.config_cls(**fields)

    def restore(self, fields):
        """The config from config_dict's fields (a checkpoint's)."""
        return self.config_cls(**fields)

    def build(self, config, device):
        return self.model_cls(config, device)

    def from_llmc(self, path, device):
        return self.model_cls.from_llmc(path, device)

    def from_pretrained(self, path, device):
        """An llm.c model file or a Hugging Face checkpoint folder (the models' loader)."""
        return models_registry.load_pretrained(self.name, path, device)


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


def _decoder_config(name):
    """A fresh Mixtral or Qwen3 config from the size fields (the models' config_from_sizes)."""

    def make(f):
        return models_registry.config_from_sizes(
            name, f["vocab_size"], f["block_size"], f["n_layer"], f["n_head"], f["n_embd"], f.get("n_kv_head"),
            f.get("intermediate_size", 0), f.get("num_experts", 8), f.get("num_experts_per_tok", 2),
        )  # fmt: skip

    return make


def _llama3_config(f):
    if f.get("intermediate_size"):  # the models' mapping of an MLP width onto LLaMA 3's two fields
        return models_registry.config_from_sizes(
            "llama3", f["vocab_size"], f["block_size"], f["n_layer"], f["n_head"], f["n_embd"], f.get("n_kv_head"),
            f["intermediate_size"],
        )  # fmt: skip
    return LLaMA3Config(**f)


FAMILIES["llama3"].make_config = _llama3_config
FAMILIES["llama3"].shape_flags = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size")
_DECODER_CUSTOM = {"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128}
for _name, _cls, _cfg, _moe in (("mixtral", Mixtral, MixtralConfig, True), ("qwen3", Qwen3, Qwen3Config, False)):
    register_family(
        Family(
            _name,
            _cls,
            _cfg,
            custom=dict(_DECODER_CUSTOM, **({"num_experts": 8, "num_experts_per_tok": 2} if _moe else {})),
            shape_flags=SHAPE_FLAGS if _moe else SHAPE_FLAGS[:5],
            vocab_of_kind={"llama3": 128256},
            vocab_fields=lambda v: {"vocab_size": v},
            blocks=lambda m: list(m.layers),
            recompute_ok=lambda config: not getattr(config, "num_experts", 0),
            make_config=_decoder_config(_name),
        )
    )
    register_preset(_name, _name, f"a small {_name} (4 layers, 4 heads, 2 kv heads, 128 wide; sizes by flags)")

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
    init_from: str = ""  # an llm.c model file or a Hugging Face folder (the models' loader)
    config_json: str = ""  # a Hugging Face config.json giving a fresh model's sizes
    router_aux_loss_coef: float = None  # an MoE model's balancing-loss weight (None: the model's)

    def build(self, device):
        return models_registry.set_router_aux_loss_coef(self._build(device), self.router_aux_loss_coef)

    def _build(self, device):
        if self.llmc_filepath:
            return self.family.from_llmc(self.llmc_filepath, device)
        if self.init_from:
            return self.family.from_pretrained(self.init_from, device)
        if self.config_json:
            return models_registry.model_from_config_json(self.family.name, self.config_json, device)
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
    family_name, preset, _ = PRESETS.get(name, (None, None, None))
    if family_name is None:
        family_of(name)  # raises
    family = FAMILIES[family_name]
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


def config_dict(model):
    """A model's config as plain JSON values (stored in checkpoints, so sample and export can rebuild it)."""
    return dataclasses.asdict(model.config)


def from_config(family_name, fields, device="cpu"):
    if family_name not in FAMILIES:
        raise ModelChoiceError(f"unknown model family {family_name!r}; known: {', '.join(sorted(FAMILIES))}")
    family = FAMILIES[family_name]
    return family.build(family.restore(fields), device)


def family_of_model(model):
    for family in FAMILIES.values():
        if isinstance(model, family.model_cls):
            return family
    raise ModelChoiceError(f"{type(model).__name__} is not a registered model family")
