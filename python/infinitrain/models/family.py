"""A model family: everything the framework needs to know about one architecture, in the one object its model file
exports (FAMILY) and models/registry.py collects. Adding a model is its file plus one line in the registry.

    FAMILY = Family(
        "gpt2", GPT2, GPT2Config,
        custom={"n_layer": 4, "n_head": 4, "n_embd": 128},          # a custom-size model's defaults
        presets=(Preset("gpt2", "GPT-2 124M", n_layer=12, ...),),    # --model names with a fixed shape
        lora_targets="attn.c_attn,attn.c_proj",                      # what --lora_rank adapts by default
        hf=HFFormat(("gpt2",), config_from_hf, load_hf, save_hf),    # Hugging Face checkpoints in and out
        tensor_parallel=TensorParallelPlan(...),                     # how the tensor/pipeline grid splits it
    )
"""

import os
from dataclasses import dataclass, field

from infinitrain.models import hf, lora


@dataclass(frozen=True)
class Preset:
    """A --model name: the family with these config fields (none: a custom-size model, the sequence length its
    block size)."""

    name: str
    description: str
    fields: dict = field(default_factory=dict)

    def __init__(self, name, description, **fields):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "fields", fields)


@dataclass(frozen=True)
class HFFormat:
    """A family's Hugging Face checkpoint format (models/hf.py reads and writes the files)."""

    model_types: tuple  # config.json model_type values the family reads
    config: object  # (config.json dict, **overrides) -> our config; ValueError naming the field it cannot represent
    load: object  # (model, hf.Tensors) -> None: every parameter taken from the checkpoint's tensors
    save: object  # model -> (config.json dict, {Hugging Face name: array})
    tie: object = None  # (model, config.json dict) -> model, its head tied as the config says
    # (our config, config.json dict, the tensor names in the files) -> hf.Expected: the names and shapes the files
    # must hold, checked before the model is built (None: only as load takes them)
    shapes: object = None


@dataclass(frozen=True)
class Dims:
    """What a tensor-parallel split divides: heads, key/value heads, layers, the MLP width (None: the experts go
    whole to the ranks), vocabulary rows of the embedding and head, experts (0: none)."""

    heads: int
    kv_heads: int
    layers: int
    mlp_width: int | None
    vocab_rows: int
    experts: int = 0


@dataclass(frozen=True)
class TensorParallelPlan:
    """How infinitrain.parallel splits a family's model: the attributes of its parts, and the tensor-parallel
    versions of a block's attention and MLP (each made from the full module: `cls(full, config, region)`, with
    `specs()` saying how its parameters relate to the full ones)."""

    embedding: str  # the token embedding
    blocks: str  # the list of blocks
    norm: str  # the final norm
    attention: str  # a block's attention
    mlp: str  # a block's MLP (or mixture of experts)
    attention_tp: type
    mlp_tp: type
    dims: object  # config -> Dims; raises parallel.LayoutError for a config that cannot be split
    positions: str = ""  # a learned position embedding added to the token embedding's output
    tied_head: bool = False  # the head is the token embedding (the last pipeline stage holds a copy)
    rotary: object = None  # (config, device, length) -> (cos, sin), passed to every block after x
    balancing_loss: object = None  # experts: (router stats, num_experts) -> loss; the pipeline carries the stats

    def head(self, model):
        """The head's weight ([vocabulary rows, width])."""
        return getattr(model, self.embedding).weight if self.tied_head else model.lm_head.weight


def _vocab_size(v):
    return {"vocab_size": v}


@dataclass
class Family:
    name: str
    model_cls: type
    config_cls: type
    # Defaults of a custom-size model (the shape flags override them); block_size is the sequence length.
    custom: dict
    presets: tuple = ()
    # Shape flags this family understands (GPT-2 has no separate key/value heads).
    shape_flags: tuple = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size")
    # fields -> config of a fresh model (default: the config class itself).
    make_config: object = None
    # How the config's vocabulary is set from a vocabulary size (GPT-2 pads its embedding for speed).
    vocab_fields: object = _vocab_size
    # Token-file kind -> vocabulary, when neither a tokenizer nor --vocab_size says (llm.c's convention: a GPT-2
    # token file holds GPT-2 BPE ids).
    vocab_of_kind: dict = field(default_factory=lambda: {"gpt2": 50257, "llama3": 128256})
    # The attribute holding the transformer blocks (activation recompute wraps each), and whether recompute may
    # (not with mixture-of-experts layers: their balancing loss is a side output of the forward).
    blocks: str = "h"
    recompute_ok: object = None
    # The linear layers --lora_rank adapts when --lora_target_modules is empty.
    lora_targets: str = ""
    hf: HFFormat = None
    tensor_parallel: TensorParallelPlan = None
    # Whether llm.c model files hold this family (model_cls.from_llmc / save_llmc).
    llmc: bool = False

    def config(self, fields):
        return self.make_config(fields) if self.make_config else self.config_cls(**fields)

    def restore(self, fields):
        """The config from config_dict's fields (a checkpoint's)."""
        return self.config_cls(**fields)

    def build(self, config, device="cpu"):
        return self.model_cls(config, device)

    def block_list(self, model):
        return list(getattr(model, self.blocks))

    def can_recompute(self, config):
        return self.recompute_ok is None or self.recompute_ok(config)

    def from_llmc(self, path, device="cpu"):
        if not self.llmc:
            raise ValueError(f"{path}: llm.c model files hold gpt2 or llama3 models, not {self.name}")
        return self.model_cls.from_llmc(path, device)

    # ---- Hugging Face checkpoints ----
    def from_pretrained(self, path, device="cpu", **config_overrides):
        """A model from a local Hugging Face checkpoint folder (config.json + safetensors) of this family. The
        config's field types, the files' headers and their tensors' names, shapes and dtypes are checked before
        the model is built; each tensor is read (by its offset) as the model takes it."""
        path = os.fspath(path)
        cfg = hf.read_config(path)
        self.check_hf(cfg, hf.where(cfg))
        config = self.hf.config(cfg, **config_overrides)
        entries = hf.read_entries(path)
        if self.hf.shapes is not None:
            hf.check_entries(entries, self.hf.shapes(config, cfg, set(entries)), path)
        model = self.build(config, device)
        if self.hf.tie is not None:
            model = self.hf.tie(model, cfg)
        lazy = any(p.is_meta for p in model.parameters())  # each tensor read when (and where) materialised
        self.hf.load(model, hf.Tensors(entries, path, lazy=lazy))
        return model

    def config_from_hf(self, cfg):
        return self.hf.config(cfg)

    def check_hf(self, cfg, where):
        if self.hf is None:
            raise ValueError(f"{where}: {self.name} models have no Hugging Face format")
        kind = cfg.get("model_type")
        if not isinstance(kind, str):
            raise ValueError(f"{where}: field 'model_type' must be a string, got {kind!r}")
        if kind not in self.hf.model_types:
            raise ValueError(f"{where}: model_type {kind!r} is not a {self.model_cls.__name__} checkpoint")

    def save_pretrained(self, model, path, dtype="float32", max_shard_size="5GB"):
        """Writes `model` as a Hugging Face checkpoint folder (config.json + safetensors, sharded with an index above
        max_shard_size) in `dtype` (float32 or bfloat16; float16, float64 too)."""
        if self.hf is None:
            raise TypeError(f"save_pretrained: no Hugging Face layout for {type(model).__name__}")
        if lora.lora_modules(model):
            raise ValueError(
                "save_pretrained: the model has LoRA adapters; lora.merge_and_unload(model) first, "
                "or lora.save_adapters(model, path) for the adapters alone"
            )
        cfg, tensors = self.hf.save(model)
        cfg["torch_dtype"] = dtype
        hf.write_checkpoint(os.fspath(path), cfg, tensors, dtype, max_shard_size)
