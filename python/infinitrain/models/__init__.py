"""Language models, each in one file: GPT-2 (llm.c layout) and LLaMA 3."""

from infinitrain.models.gpt2 import GPT2, GPT2Config
from infinitrain.models.llama3 import LLaMA3, LLaMA3Config

__all__ = ["GPT2", "GPT2Config", "LLaMA3", "LLaMA3Config"]
