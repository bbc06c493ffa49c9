"""Optimizers, learning-rate schedules and gradient clipping."""

from infinitrain.optim import lr_scheduler
from infinitrain.optim.lr_scheduler import WarmupCosine, warmup_cosine_lr
from infinitrain.optim.optimizers import SGD, Adagrad, Adam, AdamW, Optimizer, RMSprop, clip_grad_norm_

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "Optimizer",
    "RMSprop",
    "WarmupCosine",
    "clip_grad_norm_",
    "lr_scheduler",
    "warmup_cosine_lr",
]
