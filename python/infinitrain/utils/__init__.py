"""PyTorch's torch.utils names: data (datasets, samplers, DataLoader) and checkpoint (activation checkpointing)."""

from infinitrain.utils import checkpoint, data

__all__ = ["checkpoint", "data"]
