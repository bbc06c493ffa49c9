"""SGD and AdamW over lists of parameters; updates run as in-place kernels."""

import math
import numbers

from infinitrain import autograd, dispatch
from infinitrain import functional as F
from infinitrain.tensor import Tensor, zeros


def _hyper(name, value, lo, hi, hi_open=False, lo_open=False):
    """A finite float in the range; NaN or inf would silently turn every parameter into NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{name} must be finite and in {lb}{lo:g}, {hi:g}{rb}, got {value!r}")
    return value


class Optimizer:
    def __init__(self, params, lr):
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.lr = lr
        self.step_count = 0

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _hyper("learning rate", value, 0.0, math.inf, hi_open=True)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def state_dict(self):
        """Host copies of the optimizer state: {'step': int, 'lr': float, 'tensors': {name: ndarray}}."""
        return {"step": self.step_count, "lr": self.lr, "tensors": self._state_tensors()}

    def load_state_dict(self, state):
        """Restores step, lr and every state tensor; refuses state that does not fit this optimizer."""
        own = self._state_tensors_live(state["tensors"].keys())
        unexpected = sorted(set(state["tensors"]) - set(own))
        missing = sorted(set(own) - set(state["tensors"]))
        if unexpected or missing:
            raise KeyError(f"optimizer state does not fit: missing {missing}, unexpected {unexpected}")
        for name, t in own.items():
            value = state["tensors"][name]
            if tuple(value.shape) != t.shape:
                raise ValueError(f"optimizer state '{name}' has shape {tuple(value.shape)}, expected {t.shape}")
            t.copy_(value)
        self.step_count = int(state["step"])
        self.lr = float(state["lr"])

    def _state_tensors_live(self, wanted=None):
        """name -> state tensor; `wanted` (names being loaded) lets lazily created state appear first."""
        return {}

    def _state_tensors(self):
        return {k: v.numpy() for k, v in self._state_tensors_live().items()}


class SGD(Optimizer):
    """p -= lr * (g + weight_decay * p), with optional momentum buffer b = momentum * b + g."""

    def __init__(self, params, lr=1e-3, momentum=0.0, weight_decay=0.0):
        super().__init__(params, lr)
        self.momentum = _hyper("momentum", momentum, 0.0, 1.0)
        self.weight_decay = _hyper("weight_decay", weight_decay, 0.0, math.inf, hi_open=True)
        self.buffers = [None] * len(self.params)

    @autograd.no_grad()
    def step(self):
        self.step_count += 1
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if self.weight_decay:
                g = g + p * self.weight_decay
            if self.momentum:
                if self.buffers[i] is None:
                    self.buffers[i] = g.clone()
                else:
                    b = self.buffers[i]
                    dispatch.call("copy_", [b, b * self.momentum + g])
                g = self.buffers[i]
            dispatch.call("axpy_", [p, g], [-self.lr])

    def _state_tensors_live(self, wanted=None):
        for name in wanted or ():
            i = int(name.split(".")[1]) if name.startswith("momentum.") and name[9:].isdigit() else -1
            if 0 <= i < len(self.params) and self.buffers[i] is None:
                p = self.params[i]
                self.buffers[i] = zeros(p.shape, dtype=p.dtype, device=p.device)
        return {f"momentum.{i}": b for i, b in enumerate(self.buffers) if b is not None}


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), PyTorch's AdamW formula, fused per tensor."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr)
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise ValueError(f"betas must be a pair, got {betas!r}") from None
        b1 = _hyper("betas[0]", b1, 0.0, 1.0, hi_open=True)
        b2 = _hyper("betas[1]", b2, 0.0, 1.0, hi_open=True)
        self.betas = (b1, b2)
        self.eps = _hyper("eps", eps, 0.0, math.inf, lo_open=True, hi_open=True)
        self.weight_decay = _hyper("weight_decay", weight_decay, 0.0, math.inf, hi_open=True)
        stat = lambda p: "float64" if p.dtype == "float64" else "float32"  # noqa: E731
        self.m = [zeros(p.shape, dtype=stat(p), device=p.device) for p in self.params]
        self.v = [zeros(p.shape, dtype=stat(p), device=p.device) for p in self.params]

    @autograd.no_grad()
    def step(self):
        self.step_count += 1
        b1, b2 = self.betas
        attrs = [float(self.lr), b1, b2, float(self.eps), float(self.weight_decay), self.step_count]
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad if p.grad.dtype == p.dtype else p.grad.to(p.dtype)
            dispatch.call("adamw_", [p, g, m, v], attrs)

    def _state_tensors_live(self, wanted=None):
        out = {}
        for i, (m, v) in enumerate(zip(self.m, self.v, strict=True)):
            out[f"m.{i}"], out[f"v.{i}"] = m, v
        return out


@autograd.no_grad()
def clip_grad_norm_(params, max_norm):
    """Scales gradients so their global L2 norm is at most max_norm; returns the norm before clipping
    as a 0-d tensor on the gradients' device (no host synchronisation)."""
    if max_norm is not None:
        _hyper("max_norm", max_norm, 0.0, math.inf)  # inf: no clipping; NaN is an error, not "no clipping"
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    sq = [Tensor(dispatch.call("sum_squares", [g])[0]) for g in grads]
    total = sq[0]
    for s in sq[1:]:
        total = total + s
    norm = F.sqrt(total)
    if max_norm is not None and math.isfinite(max_norm):
        # coef = min(max_norm / (norm + 1e-6), 1), computed on the device.
        coef = F.clamp(F.pow(F.affine(norm, 1.0, 1e-6), -1.0) * float(max_norm), None, 1.0)
        for g in grads:
            scaled = g * (coef if coef.dtype == g.dtype else coef.to(g.dtype))
            g._t = scaled._t
    return norm
