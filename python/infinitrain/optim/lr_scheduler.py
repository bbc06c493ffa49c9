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


class LRScheduler:
    """PyTorch's scheduler protocol: each group's lr = its initial lr * factor(epoch); step() advances."""

    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def factor(self, epoch):
        raise NotImplementedError

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self):
        self.last_epoch += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = base * self.factor(self.last_epoch)

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state):
        self.last_epoch, self.base_lrs = state["last_epoch"], list(state["base_lrs"])


class LambdaLR(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        return self.lr_lambda(epoch)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base - eta_min) (1 + cos(pi epoch / T_max)) / 2 (the closed form)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803 (PyTorch's name)
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def step(self):
        self.last_epoch += 1
        c = 0.5 * (1.0 + math.cos(math.pi * self.last_epoch / self.T_max))
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = self.eta_min + (base - self.eta_min) * c
