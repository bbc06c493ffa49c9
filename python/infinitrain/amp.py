"""Automatic mixed precision: inside autocast, matrix products and attention
run in the low-precision dtype (the provider's default: bfloat16 on the CPU),
softmax and log-softmax run in float32, and cross-entropy computes in float32
from the 16-bit logits as they are."""

import threading

from infinitrain import _C

_state = threading.local()


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
    def __init__(self, device="cpu", dtype=None, enabled=True):
        if dtype is not None and dtype not in ("bfloat16", "float16"):
            raise ValueError(f"autocast dtype must be 'bfloat16' or 'float16', got {dtype!r}")
        self.dtype = (dtype or default_dtype(device)) if enabled else None

    def __enter__(self):
        self.prev = autocast_dtype()
        _state.dtype = self.dtype
        return self

    def __exit__(self, *exc):
        _state.dtype = self.prev
