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

    def __init__(self, optimizer, last_epoch=-1, verbose="deprecated"):
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

    def get_lr(self):
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]

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


class StepLR(LRScheduler):
    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        return self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        return self.gamma ** sum(1 for m in self.milestones if epoch >= m)


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        return self.gamma**epoch


class ConstantLR(LRScheduler):
    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 < factor <= 1:
            raise ValueError("ConstantLR: factor must be in (0, 1]")
        self.const, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        return self.const if epoch < self.total_iters else 1.0


class LinearLR(LRScheduler):
    """The factor moves linearly from start_factor to end_factor over total_iters steps, then stays."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1]")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def factor(self, epoch):
        t = min(epoch, self.total_iters) / self.total_iters if self.total_iters else 1.0
        return self.start_factor + (self.end_factor - self.start_factor) * t


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every T_i epochs, T_0 first and each next period T_mult times longer."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):  # noqa: N803
        if T_0 <= 0 or T_mult < 1:
            raise ValueError("CosineAnnealingWarmRestarts: need T_0 > 0 and T_mult >= 1")
        self.T_0, self.T_mult, self.eta_min = T_0, T_mult, eta_min
        super().__init__(optimizer, last_epoch)

    def _position(self, epoch):
        t, period = epoch, self.T_0
        while t >= period:
            t -= period
            period *= self.T_mult
        return t, period

    def step(self, epoch=None):
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        t, period = self._position(self.last_epoch)
        c = 0.5 * (1.0 + math.cos(math.pi * t / period))
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = self.eta_min + (base - self.eta_min) * c


class OneCycleLR(LRScheduler):
    """The one-cycle policy: from max_lr / div_factor up to max_lr over pct_start of total_steps, then down to
    initial / final_div_factor (cosine or linear); momentum (betas[0] or momentum) cycles the other way."""

    def __init__(
        self,
        optimizer,
        max_lr,
        total_steps=None,
        epochs=None,
        steps_per_epoch=None,
        pct_start=0.3,
        anneal_strategy="cos",
        cycle_momentum=True,
        base_momentum=0.85,
        max_momentum=0.95,
        div_factor=25.0,
        final_div_factor=1e4,
        three_phase=False,
        last_epoch=-1,
    ):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: pass total_steps, or epochs and steps_per_epoch")
            total_steps = epochs * steps_per_epoch
        n = len(optimizer.param_groups)
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * n
        self.total_steps, self.anneal = total_steps, anneal_strategy
        self.cycle_momentum = cycle_momentum
        for g, m in zip(optimizer.param_groups, max_lrs, strict=True):
            g["initial_lr"] = m / div_factor
            g["max_lr"], g["min_lr"] = m, m / div_factor / final_div_factor
            if cycle_momentum:
                g["max_momentum"], g["base_momentum"] = max_momentum, base_momentum
        up = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (2 * up, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self.phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self.anneal == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def step(self):
        self.last_epoch += 1
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times, total_steps is {self.total_steps}")
        for g in self.optimizer.param_groups:
            start = 0.0
            for end, lr0, lr1, m0, m1 in self.phases:
                if step <= end or end == self.phases[-1][0]:
                    pct = (step - start) / (end - start) if end > start else 1.0
                    g["lr"] = self._anneal(g[lr0], g[lr1], pct)
                    if self.cycle_momentum:
                        m = self._anneal(g[m0], g[m1], pct)
                        if "betas" in g:
                            g["betas"] = (m, g["betas"][1])
                        elif "momentum" in g:
                            g["momentum"] = m
                    break
                start = end


class SequentialLR(LRScheduler):
    """schedulers[i] runs from milestones[i - 1] on, counting its epochs from there."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("SequentialLR: need one milestone fewer than schedulers")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        self.optimizer = optimizer
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch + 1
        for g, base in zip(optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = base
        self.schedulers[0].last_epoch = -1
        self.schedulers[0].step()

    def step(self):
        self.last_epoch += 1
        k = sum(1 for m in self.milestones if self.last_epoch >= m)
        sched = self.schedulers[k]
        if k and self.last_epoch == self.milestones[k - 1]:
            sched.last_epoch = -1
        sched.step()


class ReduceLROnPlateau:
    """Multiplies each group's lr by factor when the metric passed to step() has not improved (by threshold, rel
    or abs) for patience epochs; then waits cooldown epochs; never below min_lr."""

    def __init__(
        self,
        optimizer,
        mode="min",
        factor=0.1,
        patience=10,
        threshold=1e-4,
        threshold_mode="rel",
        cooldown=0,
        min_lr=0,
        eps=1e-8,
    ):
        if factor >= 1.0:
            raise ValueError("ReduceLROnPlateau: factor should be < 1.0")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError("ReduceLROnPlateau: mode is 'min' or 'max', threshold_mode 'rel' or 'abs'")
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, factor, patience
        self.threshold, self.threshold_mode, self.cooldown, self.eps = threshold, threshold_mode, cooldown, eps
        n = len(optimizer.param_groups)
        self.min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * n
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs, self.cooldown_counter, self.last_epoch = 0, 0, 0

    def _better(self, a, best):
        if self.mode == "min":
            return a < (best * (1 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (1 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics):
        current = float(metrics)
        self.last_epoch += 1
        if self._better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, lo in zip(self.optimizer.param_groups, self.min_lrs, strict=True):
                new = max(g["lr"] * self.factor, lo)
                if g["lr"] - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)
