"""torch.nn.init's initialisers: each fills a tensor in place (no gradient recorded) and returns it."""

import math

import numpy as np

from infinitrain import autograd
from infinitrain.tensor import from_numpy, host_rng


def _fans(t):
    if t.ndim < 2:
        raise ValueError(f"fan in and fan out need a tensor of at least 2 dims, got shape {t.shape}")
    receptive = math.prod(t.shape[2:])
    return t.shape[1] * receptive, t.shape[0] * receptive


def calculate_gain(nonlinearity, param=None):
    gains = {"linear": 1.0, "sigmoid": 1.0, "conv1d": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 0.75}
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity not in gains:
        raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")
    return gains[nonlinearity]


@autograd.no_grad()
def normal_(tensor, mean=0.0, std=1.0, generator=None):
    return tensor.normal_(mean, std, generator)


@autograd.no_grad()
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    return tensor.uniform_(a, b, generator=generator)


@autograd.no_grad()
def constant_(tensor, val):
    return tensor.fill_(val)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    fan_in, fan_out = _fans(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


@autograd.no_grad()
def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """N(mean, std^2) conditioned on [a, b], drawn on the host (rejection) from the generator's stream."""
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got [{a}, {b}]")
    rng = host_rng(generator, tensor.numel())
    n = tensor.numel()
    out = np.empty(0)
    while out.size < n:
        draw = rng.normal(mean, std, size=2 * (n - out.size) + 16)
        out = np.concatenate([out, draw[(draw >= a) & (draw <= b)]])
    return tensor.copy_(from_numpy(out[:n].reshape(tensor.shape), dtype=tensor.dtype, device=tensor.device))
