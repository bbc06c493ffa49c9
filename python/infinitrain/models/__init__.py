"""Language models: GPT-2 (llm.c layout), LLaMA 3, Qwen3 (and Qwen3-MoE) and Mixtral, each file exporting its
FAMILY (models/family.py) for the registry (models/registry.py); Hugging Face checkpoint files (models/hf.py) and
LoRA adapters (models/lora.py).

    model = models.from_pretrained("path/to/folder")     # the family from config.json's model_type
    models.save_pretrained(model, "out", dtype="bfloat16")
"""

from infinitrain.models.gpt2 import GPT2, GPT2Config
from infinitrain.models.llama3 import LLaMA3, LLaMA3Config
from infinitrain.models.mixtral import Mixtral, MixtralConfig
from infinitrain.models.qwen3 import Qwen3, Qwen3Config
from infinitrain.models.registry import FAMILIES, from_pretrained, register, save_pretrained

__all__ = [
    "FAMILIES",
    "GPT2",
    "GPT2Config",
    "LLaMA3",
    "LLaMA3Config",
    "Mixtral",
    "MixtralConfig",
    "Qwen3",
    "Qwen3Config",
    "from_pretrained",
    "register",
    "save_pretrained",
]
