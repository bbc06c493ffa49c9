"""LoRA fine-tuning (Hu et al. 2021): chosen linear layers get a trainable low-rank update while every
base weight is frozen and left out of the optimizer.

    adapted = lora.apply_lora(model, ["q_proj", "v_proj"], rank=8, alpha=16, dropout=0.05)
    opt = it.optim.AdamW(lora.trainable_parameters(model), lr=1e-4)
    ...
    lora.save_adapters(model, "adapters/")         # the adapters alone (adapter_config.json + safetensors)
    lora.load_adapters(fresh_model, "adapters/")   # applies LoRA as saved, then loads the adapters
    lora.merge_lora(model) / lora.unmerge_lora(model)   # W += scale * B A, and back
    lora.merge_and_unload(model)                   # plain Linear layers again (then save_pretrained)

A wrapped layer computes y = x W^T + b + dropout(x) A^T B^T * alpha / rank with A [rank, in] drawn
uniform in +-1/sqrt(in) and B [out, rank] zero, so a fresh adapter leaves the model unchanged.
target_modules are matched against module names (`model.named_modules()`) as in PEFT: a pattern matches a
name equal to it or ending in "." + pattern; glob patterns match the same way (`layers.1.*_proj`, `experts.*`).
"""

import fnmatch
import json
import math
import os

import numpy as np

from infinitrain import autograd, checkpoint, fusion, nn
from infinitrain import functional as F
from infinitrain.models import hf
from infinitrain.tensor import empty, from_numpy

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoRALinear(nn.Module):
    """A Linear (its weight and bias kept, frozen) plus the low-rank update lora_B @ lora_A."""

    def __init__(self, base, rank, alpha, dropout=0.0):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA wraps Linear layers, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {rank}")
        if not alpha > 0:
            raise ValueError(f"lora alpha must be positive, got {alpha}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {dropout}")
        w = base.weight
        self.in_features, self.out_features = base.in_features, base.out_features
        if rank > min(self.in_features, self.out_features):
            # The update's rank cannot exceed the layer's smaller side; a larger one only costs memory.
            raise ValueError(
                f"lora rank {rank} exceeds the smaller side of a {self.in_features} -> {self.out_features} layer"
            )
        self.rank, self.alpha, self.dropout = int(rank), float(alpha), float(dropout)
        self.scaling = self.alpha / self.rank
        self.weight = base.weight
        self.bias = base.bias
        bound = 1.0 / math.sqrt(self.in_features)  # PEFT's kaiming_uniform(a=sqrt(5)) bound
        self.lora_A = nn.Parameter(empty(self.rank, self.in_features, dtype=w.dtype, device=w.device))
        self.lora_A.uniform_(-bound, bound)
        self.lora_B = nn.Parameter(empty(self.out_features, self.rank, dtype=w.dtype, device=w.device).zero_())
        self.merged = False

    def forward(self, x):
        x = fusion.settle(x)  # the base and the adapter both read x: as one float32 value, as without fusion
        y = F.linear(x, self.weight, self.bias)
        if self.merged:
            return y
        h = F.dropout(x, self.dropout, self.training) if self.dropout else x
        return y + F.affine(F.linear(F.linear(h, self.lora_A), self.lora_B), self.scaling, 0.0)

    def delta(self):
        """scale * B @ A, the update merging adds to the weight."""
        return F.affine(F.matmul(self.lora_B, self.lora_A), self.scaling, 0.0)

    def __repr__(self):
        return f"LoRALinear({self.in_features}, {self.out_features}, rank={self.rank}, alpha={self.alpha})"


def _patterns(target_modules):
    if isinstance(target_modules, str):
        target_modules = target_modules.split(",")
    pats = [p.strip() for p in target_modules if p and p.strip()]
    if not pats:
        raise ValueError("target_modules is empty: name the linear layers to adapt (e.g. q_proj,v_proj)")
    return pats


def _matches(name, pattern):
    return (
        name == pattern
        or name.endswith("." + pattern)
        or fnmatch.fnmatchcase(name, pattern)
        or fnmatch.fnmatchcase(name, "*." + pattern)
    )


def lora_modules(model):
    """(name, LoRALinear) of every adapted layer."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def apply_lora(model, target_modules, rank=8, alpha=16.0, dropout=0.0):
    """Wraps the Linear layers whose names match target_modules (names or a comma-separated string) in
    LoRALinear, freezes every other parameter, and returns the adapted layers' names."""
    pats = _patterns(target_modules)
    if lora_modules(model):
        raise ValueError("the model already has LoRA adapters")
    linear = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = [(n, m) for n, m in linear if any(_matches(n, p) for p in pats)]
    unused = [p for p in pats if not any(_matches(n, p) for n, _ in linear)]
    if unused:
        names = sorted({n.rsplit(".", 1)[-1] for n, _ in linear})
        raise ValueError(f"lora_target_modules {unused} match no linear layer; this model's are named {names}")
    for p in model.parameters():
        p.requires_grad = False
    for name, base in chosen:
        parent, _, child = name.rpartition(".")
        owner = model
        for part in parent.split(".") if parent else ():
            owner = owner._modules[part]
        setattr(owner, child, LoRALinear(base, rank, alpha, dropout))
    model._lora_config = {
        "r": int(rank),
        "lora_alpha": float(alpha),
        "lora_dropout": float(dropout),
        "target_modules": pats,
    }
    return [n for n, _ in chosen]


def trainable_parameters(model):
    """The parameters that require gradients (with LoRA applied: the adapters alone)."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_state_dict(model):
    """name -> adapter tensor (`<layer>.lora_A`, `<layer>.lora_B`)."""
    return {k: v for k, v in model.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}


@autograd.no_grad()
def merge_lora(model):
    """Adds each adapter's update into its base weight; the layers then skip the adapter path."""
    for _, m in lora_modules(model):
        if not m.merged:
            m.weight.copy_(F.add(m.weight, m.delta().to(m.weight.dtype)))
            m.merged = True


@autograd.no_grad()
def unmerge_lora(model):
    """Subtracts each merged adapter's update again (exact up to float rounding)."""
    for _, m in lora_modules(model):
        if m.merged:
            m.weight.copy_(F.sub(m.weight, m.delta().to(m.weight.dtype)))
            m.merged = False


def merge_and_unload(model):
    """Merges every adapter and puts plain Linear layers back (e.g. before save_pretrained or save_llmc);
    every parameter is trainable again."""
    merge_lora(model)
    for name, m in lora_modules(model):
        parent, _, child = name.rpartition(".")
        owner = model
        for part in parent.split(".") if parent else ():
            owner = owner._modules[part]
        lin = nn.Linear.__new__(nn.Linear)
        nn.Module.__init__(lin)
        lin.in_features, lin.out_features = m.in_features, m.out_features
        lin.weight, lin.bias = m.weight, m.bias
        setattr(owner, child, lin)
    for p in model.parameters():
        p.requires_grad = True
    model._lora_config = None
    return model


def save_adapters(model, path):
    """Writes the adapters alone: adapter_config.json (r, lora_alpha, lora_dropout, target_modules, PEFT's keys)
    and adapter_model.safetensors (float32, this model's module names)."""
    from safetensors import serialize

    cfg = getattr(model, "_lora_config", None)
    if not cfg or not lora_modules(model):
        raise ValueError("save_adapters: the model has no LoRA adapters (apply_lora first)")
    if any(m.merged for _, m in lora_modules(model)):
        raise ValueError("save_adapters: the adapters are merged into the weights; unmerge_lora first")
    entries = {}
    for name, t in adapter_state_dict(model).items():
        arr = np.ascontiguousarray(t.numpy(), dtype="<f4")
        entries[name] = {"dtype": "float32", "shape": list(arr.shape), "data": arr.tobytes()}
    blob = serialize(entries, metadata={"format": "pt"})
    config = dict(cfg, peft_type="LORA", task_type="CAUSAL_LM", bias="none", base_model_class=type(model).__name__)
    text = json.dumps(config, indent=2) + "\n"
    os.makedirs(path, exist_ok=True)
    checkpoint.atomic_write(os.path.join(path, ADAPTER_WEIGHTS), lambda f: f.write(blob))
    checkpoint.atomic_write(os.path.join(path, ADAPTER_CONFIG), lambda f: f.write(text.encode()))


def load_adapters(model, path):
    """Applies LoRA as adapter_config.json says (unless the model has it already) and loads the adapters;
    raises ValueError naming a missing, unexpected or mis-shaped adapter."""
    file = os.path.join(path, ADAPTER_CONFIG)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no such file")
    try:
        with open(file) as f:
            cfg = json.load(f)
        r, alpha, dropout, targets = cfg["r"], cfg["lora_alpha"], cfg.get("lora_dropout", 0.0), cfg["target_modules"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{file}: malformed adapter config ({e}); needs r, lora_alpha, target_modules") from None
    if not lora_modules(model):
        apply_lora(model, targets, r, alpha, dropout)
    tensors = hf.read_file(os.path.join(path, ADAPTER_WEIGHTS))
    own = adapter_state_dict(model)
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise ValueError(f"{path}: adapters do not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, p in own.items():
        if tuple(tensors[name].shape) != p.shape:
            raise ValueError(f"{path}: adapter '{name}' has shape {tuple(tensors[name].shape)}, expected {p.shape}")
        p.copy_(from_numpy(tensors[name], dtype=p.dtype, device=p.device))
    return model
