"""Automatic mixed precision: inside autocast, matrix products and attention
run in the low-precision dtype (the provider's default: bfloat16 on the CPU),
softmax and log-softmax run in float32, and cross-entropy computes in float32
from the 16-bit logits as they are. GradScaler scales the loss for float16.

Unlike PyTorch, autocast applies to every device's ops in the thread, not only
to device_type's (a process uses one device type at a time here)."""

import functools
import math
import threading
import warnings

from infinitrain import _C, autograd, dispatch
from infinitrain.tensor import Tensor

_state = threading.local()

# The autocast policy, beside the op table (docs/ops.md): what each op that autocast touches does under it.
#   low         float32 inputs are cast to autocast's 16-bit dtype and the op runs there (16-bit output)
#   float32     16-bit inputs are cast up; the op computes and writes float32
#   keep        the op takes its inputs as they are (cross-entropy computes in float32 from 16-bit logits)
#   low-output  the op computes in float32 and, when a `low` op reads its output, may write that output in the
#               16-bit dtype itself (the cast the reader would make, without its pass; it.compile's fusion,
#               infinitrain/fusion.py) unless its module keeps float32 outputs (`keep_float32_output`)
# Ops not listed run in their inputs' dtype.
POLICY = {
    "matmul": "low",
    "linear": "low",
    "linear_gelu_linear": "low",
    "sdpa": "low",
    "sdpa_bthd": "low",
    "softmax": "float32",
    "log_softmax": "float32",
    "cross_entropy": "keep",
    "layernorm": "low-output",
    "rmsnorm": "low-output",
}


def lowers(op):
    """Whether autocast (when on) runs `op` in the 16-bit dtype."""
    return POLICY.get(op) == "low"


def autocast_dtype():
    return getattr(_state, "dtype", None)


def default_dtype(device="cpu"):
    """The device's autocast dtype: bfloat16 on the CPU, the provider's declared default otherwise."""
    name = _C.parse_device(device).split(":")[0]
    info = _C.privateuse1()
    if name != "cpu" and info is not None and info["name"] == name:
        return info["autocast_dtype"]
    return "bfloat16"


class autocast:  # noqa: N801 (PyTorch's name)
    """autocast(device_type="cpu", dtype=None, enabled=True), as torch.autocast; also a decorator."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None, *, device=None):
        device_type = device if device is not None else device_type
        if enabled and dtype is not None and dtype not in ("bfloat16", "float16"):
            if dtype in ("float32", "float64"):  # PyTorch disables autocast for a dtype it cannot lower to
                warnings.warn(f"autocast: dtype {dtype} is not a 16-bit dtype; autocast is disabled", stacklevel=2)
                enabled = False
            else:
                raise ValueError(f"autocast dtype must be 'bfloat16' or 'float16', got {dtype!r}")
        self.device_type = device_type
        self.dtype = (dtype or default_dtype(device_type)) if enabled else None

    def __enter__(self):
        self.prev = autocast_dtype()
        _state.dtype = self.dtype
        return self

    def __exit__(self, *exc):
        _state.dtype = self.prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.dtype is not None):
                return fn(*args, **kwargs)

        return wrapped


class GradScaler:
    """Loss scaling for float16 training, as torch.amp.GradScaler: scale(loss) before backward, step(optimizer)
    unscales the gradients and skips the step when any is inf or NaN (one host synchronisation per step, as
    PyTorch's), update() halves the scale after a skipped step and doubles it after growth_interval good ones."""

    def __init__(
        self,
        device="cpu",
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        enabled=True,
    ):
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"GradScaler: init_scale must be finite and positive, got {init_scale}")
        if not growth_factor > 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError("GradScaler: need growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1")
        self._enabled = bool(enabled)
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._growth_tracker = 0
        self._unscaled = {}  # id(optimizer) -> found a non-finite gradient

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    def scale(self, outputs):
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self._scale

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale (once per step) and records whether any is inf or NaN."""
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() was already called on this optimizer since the last update()")
        inv = 1.0 / self._scale
        found = False
        with autograd.no_grad():
            grads = [p.grad for p in optimizer.params if p.grad is not None]
            for g in grads:
                g._t = (g * inv)._t
            if grads:
                total = None
                for g in grads:
                    s = Tensor(dispatch.call("sum_squares", [g])[0])
                    total = s if total is None else total + s
                found = not math.isfinite(total.item())
        self._unscaled[id(optimizer)] = found

    def step(self, optimizer, *args, **kwargs):
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self._unscaled[id(optimizer)]:
            return None  # skipped: a gradient overflowed
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        elif any(self._unscaled.values()):
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._unscaled = {}

    def state_dict(self):
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state):
        self._scale = float(state["scale"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval, self._growth_tracker = state["growth_interval"], state["_growth_tracker"]
