"""Linear warmup followed by cosine decay to min_lr_ratio * max_lr."""

import math


def warmup_cosine_lr(step, max_lr, warmup_steps, total_steps, min_lr_ratio=0.1):
    """Learning rate for 0-based `step`: (step + 1) / warmup * max_lr during warmup, then a cosine."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return max_lr * min_lr_ratio
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    min_lr = max_lr * min_lr_ratio
    return min_lr + coeff * (max_lr - min_lr)


class WarmupCosine:
    """Sets optimizer.lr each step(); state is the step counter."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr_ratio=0.1, max_lr=None):
        if warmup_steps < 0 or total_steps <= 0:
            raise ValueError(f"need warmup_steps >= 0 and total_steps > 0, got {warmup_steps}, {total_steps}")
        if not (math.isfinite(min_lr_ratio) and 0.0 <= min_lr_ratio <= 1.0):
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        if max_lr is not None and not (math.isfinite(max_lr) and max_lr >= 0):
            raise ValueError(f"max_lr must be finite and >= 0, got {max_lr!r}")
        self.optimizer = optimizer
        self.max_lr = optimizer.lr if max_lr is None else max_lr
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        self.last_step = 0
        self.optimizer.lr = self.get_lr(0)

    def get_lr(self, step):
        return warmup_cosine_lr(step, self.max_lr, self.warmup_steps, self.total_steps, self.min_lr_ratio)

    def step(self):
        self.last_step += 1
        self.optimizer.lr = self.get_lr(self.last_step)
        return self.optimizer.lr
