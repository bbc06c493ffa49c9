"""SGD, Adam and AdamW with PyTorch's param_groups; updates run as in-place kernels."""

import math
import numbers

import numpy as np

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


def _lr(value):
    return _hyper("learning rate", value, 0.0, math.inf, hi_open=True)


def _betas(betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair, got {betas!r}") from None
    return (_hyper("betas[0]", b1, 0.0, 1.0, hi_open=True), _hyper("betas[1]", b2, 0.0, 1.0, hi_open=True))


class Optimizer:
    """Parameters in param_groups (PyTorch's): each group a dict with 'params' and its own hyper-parameters
    (defaults fill what a group leaves out). Hyper-parameters are checked when set and again at every step,
    since a group's dict may be edited directly (`group['lr'] = ...`)."""

    def __init__(self, params, defaults):
        if isinstance(params, Tensor):
            raise TypeError("params must be an iterable of tensors or of dicts, not a single tensor")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = dict(defaults)
        self.param_groups = []
        self.state = {}
        self.step_count = 0
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("a parameter group must be a dict with 'params'")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be tensors, got {type(p).__name__}")
            if id(p) in seen:
                raise ValueError("a parameter appears in more than one parameter group (or twice)")
            seen.add(id(p))
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(f"unknown optimizer options {sorted(unknown)} (known: {sorted(self.defaults)})")
        full = {**self.defaults, **group, "params": params}
        self._check(full)
        self.param_groups.append(full)
        self._init_state(params)

    @property
    def params(self):
        """Every parameter, in group order (state is indexed by this order)."""
        return [p for g in self.param_groups for p in g["params"]]

    @property
    def lr(self):
        """The first group's learning rate; setting it sets every group's (what schedules do)."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        value = _lr(value)
        for g in self.param_groups:
            g["lr"] = value

    def _check(self, group):
        group["lr"] = _lr(group["lr"])
        if "weight_decay" in group:
            group["weight_decay"] = _hyper("weight_decay", group["weight_decay"], 0.0, math.inf, hi_open=True)

    def _init_state(self, params):
        pass

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with autograd.enable_grad():
                loss = closure()
        self.step_count += 1
        with autograd.no_grad():
            for g in self.param_groups:
                self._check(g)
                self._step_group(g)
        return loss

    # ---- state ----
    def _param_state(self, i):
        """PyTorch's per-parameter state dict for parameter index i (live tensors)."""
        return {}

    def state_dict(self):
        """PyTorch's layout, {'state': {i: {...}}, 'param_groups': [{..., 'params': [i, ...]}]}, with live
        tensors, plus infinitrain's flat view that the train CLI's checkpoints use: 'step', 'lr' and 'tensors'
        (name -> the same tensors)."""
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        state = {}
        for i in range(start):
            s = self._param_state(i)
            if s:
                state[i] = {"step": self.step_count, **s}
        return {
            "state": state,
            "param_groups": groups,
            "step": self.step_count,
            "lr": self.lr,
            "tensors": self._state_tensors_live(),
        }

    def load_state_dict(self, state):
        """Restores hyper-parameters, step and state tensors from state_dict()'s output (or from the flat view
        alone, as older checkpoints hold it); refuses state that does not fit this optimizer."""
        if "param_groups" in state:
            saved = state["param_groups"]
            if len(saved) != len(self.param_groups):
                n = len(self.param_groups)
                raise ValueError(f"optimizer state has {len(saved)} parameter groups, this optimizer {n}")
            for g, s in zip(self.param_groups, saved, strict=True):
                if len(s["params"]) != len(g["params"]):
                    raise ValueError("optimizer state does not fit: a parameter group has another size")
            tensors = state.get("tensors") or self._tensors_from_state(state.get("state", {}))
            step = state.get("step")
            if step is None:
                steps = [s.get("step") for s in state.get("state", {}).values()]
                step = int(max(steps)) if steps else 0
        else:
            saved, tensors, step = None, state["tensors"], state["step"]
        own = self._state_tensors_live(tensors.keys())
        unexpected = sorted(set(tensors) - set(own))
        missing = sorted(set(own) - set(tensors))
        if unexpected or missing:
            raise KeyError(f"optimizer state does not fit: missing {missing}, unexpected {unexpected}")
        for name, t in own.items():
            value = tensors[name]
            if tuple(value.shape) != t.shape:
                raise ValueError(f"optimizer state '{name}' has shape {tuple(value.shape)}, expected {t.shape}")
        for name, t in own.items():
            t.copy_(tensors[name])
        self.step_count = int(step)
        if saved is not None:
            for g, s in zip(self.param_groups, saved, strict=True):
                g.update({k: (tuple(v) if k == "betas" else v) for k, v in s.items() if k != "params"})
                self._check(g)
        else:
            self.lr = float(state["lr"])

    def _tensors_from_state(self, state):
        return {}

    def _state_tensors_live(self, wanted=None):
        """name -> state tensor; `wanted` (names being loaded) lets lazily created state appear first."""
        return {}

    def _state_tensors(self):
        return {k: v.numpy() for k, v in self._state_tensors_live().items()}


class SGD(Optimizer):
    """p -= lr * b with b = momentum * b + (g + weight_decay * p) (b = g without momentum), or the Nesterov
    form g + momentum * b, as PyTorch's SGD without dampening."""

    def __init__(
        self,
        params,
        lr=1e-3,
        momentum=0.0,
        dampening=0.0,
        weight_decay=0.0,
        nesterov=False,
        *,
        maximize=False,
        foreach=None,
        differentiable=False,
        fused=None,
    ):
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": bool(nesterov),
            "dampening": dampening,
            "maximize": bool(maximize),
        }
        self.buffers = []
        super().__init__(params, defaults)

    @property
    def momentum(self):
        return self.param_groups[0]["momentum"]

    @property
    def weight_decay(self):
        return self.param_groups[0]["weight_decay"]

    def _check(self, group):
        super()._check(group)
        group["momentum"] = _hyper("momentum", group["momentum"], 0.0, 1.0)
        group["dampening"] = _hyper("dampening", group["dampening"], 0.0, 1.0)
        if group["nesterov"] and (not group["momentum"] or group["dampening"]):
            raise ValueError("SGD: nesterov needs momentum > 0 and zero dampening")

    def _init_state(self, params):
        self.buffers += [None] * len(params)

    def _step_group(self, group):
        start = self._offset(group)
        lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
        for j, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            g = -p.grad if group["maximize"] else p.grad
            if wd:
                g = g + p * wd
            if mom:
                i = start + j
                if self.buffers[i] is None:
                    self.buffers[i] = g.clone()
                else:
                    b = self.buffers[i]
                    damp = group["dampening"]
                    dispatch.call("copy_", [b, b * mom + (g * (1.0 - damp) if damp else g)])
                g = g + self.buffers[i] * mom if group["nesterov"] else self.buffers[i]
            dispatch.call("axpy_", [p, g], [-lr])

    def _offset(self, group):
        start = 0
        for g in self.param_groups:
            if g is group:
                return start
            start += len(g["params"])
        raise ValueError("not a parameter group of this optimizer")

    def _param_state(self, i):
        return {} if self.buffers[i] is None else {"momentum_buffer": self.buffers[i]}

    def _tensors_from_state(self, state):
        return {f"momentum.{i}": s["momentum_buffer"] for i, s in state.items() if "momentum_buffer" in s}

    def _state_tensors_live(self, wanted=None):
        params = self.params
        for name in wanted or ():
            i = int(name.split(".")[1]) if name.startswith("momentum.") and name[9:].isdigit() else -1
            if 0 <= i < len(params) and self.buffers[i] is None:
                p = params[i]
                self.buffers[i] = zeros(p.shape, dtype=p.dtype, device=p.device)
        return {f"momentum.{i}": b for i, b in enumerate(self.buffers) if b is not None}


def _by_device_dtype(tensors):
    """Lists of the tensors of each (device, dtype), in order of first appearance."""
    groups = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), PyTorch's AdamW formula: one fused multi-tensor
    update (foreach_adamw_) per device and parameter dtype of a group. Moments are float32 (float64 for float64
    parameters)."""

    decoupled = True

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.01,
        amsgrad=False,
        *,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
    ):
        # foreach and fused name PyTorch's implementations; here every step is the fused multi-tensor kernel.
        if amsgrad:
            raise NotImplementedError(f"{type(self).__name__}: amsgrad is not supported")
        self.m, self.v = [], []
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": bool(maximize)}
        super().__init__(params, defaults)

    @property
    def betas(self):
        return self.param_groups[0]["betas"]

    @property
    def eps(self):
        return self.param_groups[0]["eps"]

    @property
    def weight_decay(self):
        return self.param_groups[0]["weight_decay"]

    def _check(self, group):
        super()._check(group)
        group["betas"] = _betas(group["betas"])
        group["eps"] = _hyper("eps", group["eps"], 0.0, math.inf, lo_open=True, hi_open=True)

    def _init_state(self, params):
        stat = lambda p: "float64" if p.dtype == "float64" else "float32"  # noqa: E731
        self.m += [zeros(p.shape, dtype=stat(p), device=p.device) for p in params]
        self.v += [zeros(p.shape, dtype=stat(p), device=p.device) for p in params]

    def _step_group(self, group):
        b1, b2 = group["betas"]
        wd = group["weight_decay"]
        attrs = [group["lr"], b1, b2, group["eps"], wd if self.decoupled else 0.0, self.step_count]
        start = 0
        for g in self.param_groups:
            if g is group:
                break
            start += len(g["params"])
        sets = {}  # (device, dtype) -> ([params], [grads], [m], [v])
        for j, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            grad = p.grad if p.grad.dtype == p.dtype else p.grad.to(p.dtype)
            if group.get("maximize"):
                grad = -grad
            if wd and not self.decoupled:
                grad = grad + p * wd  # Adam's L2 penalty enters the moments
            lists = sets.setdefault((p.device, p.dtype), ([], [], [], []))
            for lst, t in zip(lists, (p, grad, self.m[start + j], self.v[start + j]), strict=True):
                lst.append(t)
        for params, grads, m, v in sets.values():
            dispatch.call("foreach_adamw_", params + grads + m + v, attrs)

    def _param_state(self, i):
        return {"exp_avg": self.m[i], "exp_avg_sq": self.v[i]}

    def _tensors_from_state(self, state):
        out = {}
        for i, s in state.items():
            out[f"m.{i}"], out[f"v.{i}"] = s["exp_avg"], s["exp_avg_sq"]
        return out

    def _state_tensors_live(self, wanted=None):
        out = {}
        for i, (m, v) in enumerate(zip(self.m, self.v, strict=True)):
            out[f"m.{i}"], out[f"v.{i}"] = m, v
        return out


class Adam(AdamW):
    """Adam (weight decay as an L2 penalty added to the gradient, PyTorch's Adam); default weight_decay 0."""

    decoupled = False

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        amsgrad=False,
        *,
        foreach=None,
        maximize=False,
        capturable=False,
        differentiable=False,
        fused=None,
        decoupled_weight_decay=False,
    ):
        self.decoupled = bool(decoupled_weight_decay)  # True: AdamW's update
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


class _Buffered(Optimizer):
    """An optimizer whose state is a few named per-parameter buffers (float32, float64 for float64 parameters),
    made on first use: RMSprop, Adagrad. Their steps run as ops, one parameter at a time."""

    BUFFERS = ()  # (state name, checkpoint prefix)

    def _init_state(self, params):
        if not hasattr(self, "_bufs"):
            self._bufs = {name: [] for name, _ in self.BUFFERS}
        for name, _ in self.BUFFERS:
            self._bufs[name] += [None] * len(params)

    def _buf(self, name, i, p, init=0.0):
        b = self._bufs[name][i]
        if b is None:
            b = self._bufs[name][i] = zeros(
                p.shape, dtype="float64" if p.dtype == "float64" else "float32", device=p.device
            ).fill_(init)
        return b

    def _offset(self, group):
        start = 0
        for g in self.param_groups:
            if g is group:
                return start
            start += len(g["params"])
        raise ValueError("not a parameter group of this optimizer")

    def _param_state(self, i):
        return {name: self._bufs[name][i] for name, _ in self.BUFFERS if self._bufs[name][i] is not None}

    def _tensors_from_state(self, state):
        out = {}
        for i, st in state.items():
            for name, prefix in self.BUFFERS:
                if name in st:
                    out[f"{prefix}.{i}"] = st[name]
        return out

    def _state_tensors_live(self, wanted=None):
        params = self.params
        for w in wanted or ():
            prefix, _, idx = w.partition(".")
            for name, pre in self.BUFFERS:
                if pre == prefix and idx.isdigit() and int(idx) < len(params):
                    self._buf(name, int(idx), params[int(idx)])
        return {f"{pre}.{i}": b for name, pre in self.BUFFERS for i, b in enumerate(self._bufs[name]) if b is not None}


class RMSprop(_Buffered):
    """v = alpha v + (1 - alpha) g^2; p -= lr g / (sqrt(v) + eps) (centered: v minus the squared mean gradient;
    momentum: through a buffer), PyTorch's RMSprop."""

    BUFFERS = (("square_avg", "square_avg"), ("momentum_buffer", "momentum"), ("grad_avg", "grad_avg"))

    def __init__(
        self,
        params,
        lr=1e-2,
        alpha=0.99,
        eps=1e-8,
        weight_decay=0.0,
        momentum=0.0,
        centered=False,
        capturable=False,
        foreach=None,
        maximize=False,
        differentiable=False,
    ):
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": bool(centered),
            "maximize": bool(maximize),
        }
        super().__init__(params, defaults)

    def _check(self, group):
        super()._check(group)
        group["alpha"] = _hyper("alpha", group["alpha"], 0.0, 1.0)
        group["eps"] = _hyper("eps", group["eps"], 0.0, math.inf, hi_open=True)
        group["momentum"] = _hyper("momentum", group["momentum"], 0.0, 1.0)

    def _step_group(self, group):
        start = self._offset(group)
        a, eps, wd, mom = group["alpha"], group["eps"], group["weight_decay"], group["momentum"]
        for j, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            i = start + j
            g = p.grad.to(self._buf("square_avg", i, p).dtype)
            if group["maximize"]:
                g = -g
            if wd:
                g = g + p.to(g.dtype) * wd
            v = self._buf("square_avg", i, p)
            v.copy_(v * a + g * g * (1.0 - a))
            denom = v
            if group["centered"]:
                ga = self._buf("grad_avg", i, p)
                ga.copy_(ga * a + g * (1.0 - a))
                denom = v - ga * ga
            denom = F.sqrt(denom) + eps
            if mom:
                b = self._buf("momentum_buffer", i, p)
                b.copy_(b * mom + g / denom)
                p.copy_(p - b * group["lr"])
            else:
                p.copy_(p - (g / denom) * group["lr"])


class Adagrad(_Buffered):
    """s += g^2; p -= lr / (1 + (step - 1) lr_decay) * g / (sqrt(s) + eps), PyTorch's Adagrad."""

    BUFFERS = (("sum", "sum"),)

    def __init__(
        self,
        params,
        lr=1e-2,
        lr_decay=0.0,
        weight_decay=0.0,
        initial_accumulator_value=0.0,
        eps=1e-10,
        foreach=None,
        *,
        maximize=False,
        differentiable=False,
        fused=None,
    ):
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "eps": eps,
            "initial_accumulator_value": initial_accumulator_value,
            "maximize": bool(maximize),
        }
        super().__init__(params, defaults)

    def _check(self, group):
        super()._check(group)
        group["lr_decay"] = _hyper("lr_decay", group["lr_decay"], 0.0, math.inf, hi_open=True)
        group["eps"] = _hyper("eps", group["eps"], 0.0, math.inf, hi_open=True)

    def _step_group(self, group):
        start = self._offset(group)
        clr = group["lr"] / (1.0 + (self.step_count - 1) * group["lr_decay"])
        for j, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            i = start + j
            acc = self._buf("sum", i, p, group["initial_accumulator_value"])
            g = p.grad.to(acc.dtype)
            if group["maximize"]:
                g = -g
            if group["weight_decay"]:
                g = g + p.to(g.dtype) * group["weight_decay"]
            acc.copy_(acc + g * g)
            p.copy_(p - (g / (F.sqrt(acc) + group["eps"])) * clr)


@autograd.no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scales gradients so their global L2 norm is at most max_norm; returns the norm before clipping
    as a 0-d tensor on the gradients' device (no host synchronisation)."""
    if norm_type != 2.0:
        raise NotImplementedError(f"clip_grad_norm_: only norm_type=2 is supported, got {norm_type}")
    if max_norm is not None:
        _hyper("max_norm", max_norm, 0.0, math.inf)  # inf: no clipping; NaN is an error, not "no clipping"
    params = [parameters] if isinstance(parameters, Tensor) else parameters
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    norm = F.sqrt(squared_norm(grads))
    if error_if_nonfinite and not np.isfinite(norm.item()):
        raise RuntimeError(f"clip_grad_norm_: the total gradient norm is {norm.item()}")
    scale_to_norm(grads, norm, max_norm)
    return norm


def squared_norm(grads):
    """The sum of squares over every element of every gradient (a non-empty list): one foreach_sum_squares per
    device and dtype, each accumulated in float64; 0-d float32 (float64 when a group is float64), on the first
    gradient's device."""
    total = None
    for group in _by_device_dtype(grads):
        s = Tensor(dispatch.call("foreach_sum_squares", group)[0])
        if total is None:
            total = s
        else:
            total = total + (s if s.device == total.device else s.to(total.device))
    return total


def squared_norms(grads):
    """Each gradient's sum of squares (0-d, accumulated in float64; float32, or float64 for float64)."""
    return [Tensor(dispatch.call("sum_squares", [g])[0]) for g in grads]


def scale_to_norm(grads, norm, max_norm):
    """Scales grads in place by min(max_norm / (norm + 1e-6), 1), computed on the device (norm: 0-d): one
    foreach_mul_ per device and dtype, each distinct gradient scaled once."""
    if max_norm is None:
        return
    _hyper("max_norm", max_norm, 0.0, math.inf)  # inf: no clipping; NaN is an error, not "no clipping"
    if math.isfinite(max_norm):
        coef = F.clamp(F.pow(F.affine(norm, 1.0, 1e-6), -1.0) * float(max_norm), None, 1.0)
        distinct = {}  # a gradient listed twice must not be scaled twice
        for g in grads:
            if g.numel() > 0:
                distinct.setdefault((g.device, g._t.data_ptr), g)
        for group in _by_device_dtype(distinct.values()):
            c = coef if coef.device == group[0].device else coef.to(group[0].device)
            dispatch.call("foreach_mul_", [c, *group])
