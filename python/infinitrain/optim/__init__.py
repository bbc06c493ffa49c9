"""Optimizers, learning-rate schedules and gradient clipping."""

from infinitrain.optim.lr_scheduler import WarmupCosine, warmup_cosine_lr
from infinitrain.optim.optimizers import SGD, AdamW, Optimizer, clip_grad_norm_

__all__ = ["SGD", "AdamW", "Optimizer", "WarmupCosine", "clip_grad_norm_", "warmup_cosine_lr"]
