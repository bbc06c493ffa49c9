"""Language models: GPT-2 (llm.c layout), LLaMA 3, Qwen3 (and Qwen3-MoE) and Mixtral; Hugging Face
checkpoints in and out (models/hf.py), LoRA adapters (models/lora.py), CLI selection (models/registry.py)."""

from infinitrain.models.gpt2 import GPT2, GPT2Config
from infinitrain.models.llama3 import LLaMA3, LLaMA3Config
from infinitrain.models.mixtral import Mixtral, MixtralConfig
from infinitrain.models.qwen3 import Qwen3, Qwen3Config

__all__ = ["GPT2", "GPT2Config", "LLaMA3", "LLaMA3Config", "Mixtral", "MixtralConfig", "Qwen3", "Qwen3Config"]
