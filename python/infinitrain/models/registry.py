"""Model selection for the train CLI: which architecture (--model gpt2|llama3|mixtral|qwen3), its sizes
(flags or --config_json, a Hugging Face config.json), where its weights start (--init_from: a Hugging Face
folder or an llm.c model file) and LoRA (--lora_rank --lora_alpha --lora_target_modules --lora_dropout).

Plain functions with explicit arguments, so the CLI and tests share them; `define_flags` declares the
flags the CLI adds for them (absl), `build_model_from_flags` / `setup_lora_from_flags` read them.
"""

import dataclasses
import json
import os

from infinitrain.models import hf, lora
from infinitrain.models.gpt2 import GPT2, GPT2Config
from infinitrain.models.llama3 import LLaMA3, LLaMA3Config
from infinitrain.models.mixtral import Mixtral, MixtralConfig
from infinitrain.models.qwen3 import Qwen3, Qwen3Config

MODEL_NAMES = ("gpt2", "llama3", "mixtral", "qwen3")
_CLASSES = {"gpt2": GPT2, "llama3": LLaMA3, "mixtral": Mixtral, "qwen3": Qwen3}
# The layers --lora_target_modules adapts when it is empty: the attention projections.
DEFAULT_LORA_TARGETS = {
    "gpt2": "attn.c_attn,attn.c_proj",
    "llama3": "attn.c_attn,attn.c_proj",
    "mixtral": "q_proj,k_proj,v_proj,o_proj",
    "qwen3": "q_proj,k_proj,v_proj,o_proj",
}


def _check_name(name):
    if name not in _CLASSES:
        raise ValueError(f"--model must be one of {', '.join(MODEL_NAMES)}, got {name!r}")
    return _CLASSES[name]


def _swiglu_width(n_embd, multiple=32):
    """8/3 n_embd rounded up to a multiple of 32: the SwiGLU width of a fresh model sized by flags."""
    return multiple * -(-(8 * n_embd // 3) // multiple)


def config_from_sizes(
    name,
    vocab_size,
    block_size,
    n_layer,
    n_head,
    n_embd,
    n_kv_head=None,
    intermediate_size=0,
    num_experts=8,
    num_experts_per_tok=2,
    router_aux_loss_coef=None,
):
    """A fresh model's config from the CLI's size flags (0 / None: the model's derived default).
    router_aux_loss_coef (None: the model's default) weighs Mixtral's load-balancing loss."""
    _check_name(name)
    if router_aux_loss_coef is not None and name != "mixtral":
        raise ValueError(_no_router(name))
    kv = n_kv_head or n_head
    if name == "gpt2":
        return GPT2Config(block_size, vocab_size, -(-vocab_size // 64) * 64, n_layer, n_head, n_embd)
    if name == "llama3":
        if intermediate_size:
            base = int(2 * (4 * n_embd) / 3)
            mult = 1.0 if base <= intermediate_size else intermediate_size / base
            return LLaMA3Config(block_size, vocab_size, n_layer, n_head, kv, n_embd, mult, intermediate_size)
        return LLaMA3Config(block_size, vocab_size, n_layer, n_head, kv, n_embd, ffn_dim_multiplier=1.0, multiple_of=32)
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    width = intermediate_size or _swiglu_width(n_embd)
    common = dict(
        block_size=block_size,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=kv,
        n_embd=n_embd,
        head_dim=n_embd // n_head,
        intermediate_size=width,
    )
    if name == "mixtral":
        aux = {} if router_aux_loss_coef is None else {"router_aux_loss_coef": float(router_aux_loss_coef)}
        return MixtralConfig(**common, num_experts=num_experts, num_experts_per_tok=num_experts_per_tok, **aux)
    return Qwen3Config(**common, tie_word_embeddings=False)


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


def config_from_json(name, path):
    """Our config from a Hugging Face config.json, checked to be the --model architecture."""
    return _read_config_json(name, path)[1]


def model_from_config_json(name, path, device="cpu"):
    """A fresh model sized by a Hugging Face config.json; tied as it says (LLaMA's tie_word_embeddings)."""
    cfg, config = _read_config_json(name, path)
    return hf.tie_as_config(_CLASSES[name](config, device), cfg)


def _read_config_json(name, path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"--config_json {path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--config_json {path}: expected a JSON object")
    cls, config = hf.config_from_hf(cfg)
    if cls is not _check_name(name):
        raise ValueError(f"--config_json {path} describes a {cfg.get('model_type')} model, but --model={name}")
    return cfg, config


def load_pretrained(name, path, device="cpu"):
    """Weights to start from: a Hugging Face checkpoint folder, or an llm.c model file (gpt2, llama3)."""
    cls = _check_name(name)
    if os.path.isdir(path):
        cfg = hf.read_config(path)
        if hf.config_from_hf(cfg)[0] is not cls:
            raise ValueError(f"--init_from {path} holds a {cfg.get('model_type')} checkpoint, but --model={name}")
        return hf.from_pretrained(path, device, cls=cls)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--init_from {path}: no such file or folder")
    if name not in ("gpt2", "llama3"):
        raise ValueError(f"--init_from {path}: llm.c model files hold gpt2 or llama3, not {name}; pass an HF folder")
    return cls.from_llmc(path, device)


def build_model(
    name,
    vocab_size,
    block_size,
    *,
    n_layer=4,
    n_head=4,
    n_embd=128,
    n_kv_head=None,
    intermediate_size=0,
    num_experts=8,
    num_experts_per_tok=2,
    config_json="",
    init_from="",
    router_aux_loss_coef=None,
    device="cpu",
):
    """The model the CLI trains: from --init_from's weights, else fresh with --config_json's sizes, else with
    the size flags; router_aux_loss_coef (None: the model's or its config's) weighs an MoE model's balancing
    loss. A checkpoint's vocabulary must cover the data's (vocab_size)."""
    if init_from and config_json:
        raise ValueError("--init_from and --config_json both set: the checkpoint carries its own config")
    if init_from:
        model = load_pretrained(name, init_from, device)
    elif config_json:
        model = model_from_config_json(name, config_json, device)
    else:
        cfg = config_from_sizes(
            name, vocab_size, block_size, n_layer, n_head, n_embd, n_kv_head, intermediate_size, num_experts,
            num_experts_per_tok,
        )  # fmt: skip
        model = _CLASSES[name](cfg, device)
    set_router_aux_loss_coef(model, router_aux_loss_coef)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is smaller than the data's {vocab_size}")
    if model.config.block_size < block_size:
        raise ValueError(f"--sequence_length {block_size} exceeds the model's block_size {model.config.block_size}")
    return model


def setup_lora(model, name, rank, alpha=16.0, target_modules="", dropout=0.0):
    """With rank > 0, adds LoRA adapters (target_modules empty: DEFAULT_LORA_TARGETS[name]) and returns the
    parameters to optimize: the adapters alone. With rank 0, every parameter."""
    if rank < 0:
        raise ValueError(f"--lora_rank must be >= 0, got {rank}")
    if rank == 0:
        return list(model.parameters())
    lora.apply_lora(model, target_modules or DEFAULT_LORA_TARGETS[name], rank, alpha, dropout)
    return lora.trainable_parameters(model)


# ---- absl flags (the CLI's) ----

# The flags define_flags adds that shape a run: the CLI's resume check must compare them too.
RUN_FLAGS = (
    "config_json",
    "init_from",
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "router_aux_loss_coef",
    "lora_rank",
    "lora_alpha",
    "lora_target_modules",
    "lora_dropout",
)


# name -> (type, default, help, lower bound): the CLI's model flags (RunConfig's fields, define_flags' flags).
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


def define_flags(flag_values=None):
    """Declares the flags these helpers read (the CLI keeps --model, sizes, --device, ...)."""
    from absl import flags

    fv = flag_values or flags.FLAGS
    define = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float}
    for name, (kind, default, help_text, lower) in FLAG_SPECS.items():
        bound = {} if lower is None else {"lower_bound": lower}
        define[kind](name, default, help_text, flag_values=fv, **bound)


def build_model_from_flags(fv, vocab_size, device):
    """build_model with the CLI's flags (--model, --sequence_length, sizes, --config_json, --init_from)."""
    return build_model(
        fv.model,
        vocab_size,
        fv.sequence_length,
        n_layer=fv.n_layer,
        n_head=fv.n_head,
        n_embd=fv.n_embd,
        n_kv_head=fv.n_kv_head,
        intermediate_size=fv.intermediate_size,
        num_experts=fv.num_experts,
        num_experts_per_tok=fv.num_experts_per_tok,
        config_json=fv.config_json,
        init_from=fv.init_from,
        router_aux_loss_coef=fv.router_aux_loss_coef,
        device=device,
    )


def setup_lora_from_flags(fv, model):
    """setup_lora with --lora_rank --lora_alpha --lora_target_modules --lora_dropout."""
    return setup_lora(model, fv.model, fv.lora_rank, fv.lora_alpha, fv.lora_target_modules, fv.lora_dropout)


def fill_missing_grads(params):
    """Zero gradients for trainable parameters that got none this step (an expert no token was routed to),
    so data-parallel all-reduces see the same tensors on every replica."""
    from infinitrain.tensor import zeros

    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = zeros(p.shape, dtype=p.dtype, device=p.device)


def load_tokenizer(path):
    """A tokenizer for decoding samples: a Hugging Face tokenizer.json, or an llm.c tokenizer file."""
    from infinitrain.data import HFTokenizer, Tokenizer

    return HFTokenizer.load(path) if str(path).endswith(".json") else Tokenizer.load(path)
