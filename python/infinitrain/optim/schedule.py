"""The learning-rate schedule of the train CLI, as InfiniTrain (and Megatron) define it.

For 0-based step s, with W = warmup_iters and D = decay_iters:
  s < W:   warmup_init + (lr - warmup_init) * s / W
  then, t = s - W over D - W steps:
  constant: lr
  linear:   lr + (min_lr - lr) * t / (D - W), then min_lr
  cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * t / (D - W))) / 2, then min_lr
  inverse-square-root: max(min_lr, lr * sqrt(max(W, 1) / max(s, 1))), min_lr after D
  none:     lr at every step (no warmup either)
A warmup as long as the run (or longer) is allowed here (InfiniTrain refuses it): short test runs keep the
default warmup.
"""

import math

STYLES = ("constant", "linear", "cosine", "inverse-square-root", "none")


class Schedule:
    def __init__(self, lr, *, style="cosine", warmup_iters=0, warmup_init=0.0, min_lr=0.0, decay_iters):
        if style not in STYLES:
            raise ValueError(f"--lr_decay_style={style}: choose one of {', '.join(STYLES)}")
        for name, v in (("learning_rate", lr), ("lr_warmup_init", warmup_init), ("min_lr", min_lr)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"--{name}={v} must be finite and >= 0")
        if warmup_iters < 0 or decay_iters <= 0:
            raise ValueError(f"need --lr_warmup_iters >= 0 and --lr_decay_iters > 0, got {warmup_iters}, {decay_iters}")
        if style != "none":
            if min_lr > lr:
                raise ValueError(f"--min_lr={min_lr} exceeds --learning_rate={lr}")
            if warmup_init > lr:
                raise ValueError(f"--lr_warmup_init={warmup_init} exceeds --learning_rate={lr}")
        self.lr, self.style, self.min_lr = lr, style, min_lr
        self.warmup_iters, self.warmup_init, self.decay_iters = warmup_iters, warmup_init, decay_iters

    def __call__(self, step):
        lr, W, D = self.lr, self.warmup_iters, self.decay_iters
        if self.style == "none":
            return lr
        if step < W:
            return self.warmup_init + (lr - self.warmup_init) * step / W
        t, span = step - W, D - W
        if self.style == "constant":
            return lr
        if self.style == "inverse-square-root":
            if step > D:
                return self.min_lr
            return max(self.min_lr, lr * math.sqrt(max(W, 1)) / math.sqrt(max(step, 1)))
        if t >= span:
            return self.min_lr
        if self.style == "linear":
            return lr + (self.min_lr - lr) * t / span
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * t / span)) * (lr - self.min_lr)
