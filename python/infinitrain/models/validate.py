"""Config field checks shared by the models: every field an int or a finite float within a sane bound.

Configs come from user code and from model-file headers; a header field that passes these checks cannot
make a model allocate absurd amounts of memory or divide by zero.
"""

import math
import numbers

# Upper bounds, far above any real model's and far below what would exhaust memory before the file-size check.
MAX_BLOCK_SIZE = 1 << 20
MAX_VOCAB = 1 << 24
MAX_LAYERS = 1 << 12
MAX_HEADS = 1 << 12
MAX_WIDTH = 1 << 17


def int_field(cfg, name, lo=1, hi=None):
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    setattr(cfg, name, value)
    return value


def float_field(cfg, name, lo, hi, lo_open=False):
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < lo or (lo_open and value == lo) or value > hi:
        raise ValueError(f"{name} must be finite and in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    setattr(cfg, name, value)
    return value


def bool_field(cfg, name):
    value = getattr(cfg, name)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        setattr(cfg, name, bool(value))
        return bool(value)
    raise ValueError(f"{name} must be a bool (0 or 1), got {value!r}")
