"""torch.nn.utils: gradient clipping and flat parameter vectors; eval_mode for evaluating a model in training."""

import contextlib

from infinitrain import autograd
from infinitrain import functional as F
from infinitrain.optim.optimizers import clip_grad_norm_
from infinitrain.tensor import Tensor


@autograd.no_grad()
def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient to [-clip_value, clip_value] in place."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    v = float(clip_value)
    for p in params:
        if p.grad is not None:
            p.grad.clamp_(-v, v)


def parameters_to_vector(parameters):
    """The parameters flattened and joined into one 1-d tensor."""
    return F.cat([p.reshape(-1) for p in parameters], 0)


@autograd.no_grad()
def vector_to_parameters(vec, parameters):
    """Copies consecutive pieces of the 1-d vec into the parameters."""
    if vec.ndim != 1:
        raise ValueError(f"vector_to_parameters: expected a 1-d vector, got shape {vec.shape}")
    start = 0
    for p in parameters:
        n = p.numel()
        p.copy_(F.slice(vec, 0, start, start + n).reshape(p.shape))
        start += n
    if start != vec.numel():
        raise ValueError(f"vector_to_parameters: the vector has {vec.numel()} elements, the parameters {start}")


__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]


@contextlib.contextmanager
def eval_mode(*models):
    """The models in eval mode inside (no dropout, LoRA's included), every submodule's own mode restored after, also
    when the body raises."""
    modes = [(m, m.training) for model in models for m in model.modules()]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
