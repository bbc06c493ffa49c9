"""torch.nn.functional's names and signatures over infinitrain's differentiable ops.

Where infinitrain.functional's own signature differs (layer_norm takes no normalized_shape there), the
PyTorch form is defined here; everything else is the same function.
"""

import math

from infinitrain import functional as _F
from infinitrain.functional import (  # noqa: F401
    cross_entropy,
    dropout,
    gelu,
    linear,
    log_softmax,
    mse_loss,
    multinomial,
    nll_loss,
    one_hot,
    relu,
    rope,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    swiglu,
    tanh,
)
from infinitrain.tensor import ones, zeros

_EPS = {"float32": 1.1920928955078125e-07, "float64": 2.220446049250313e-16, "bfloat16": 0.0078125}
_EPS["float16"] = 0.0009765625


def _normalized(x, normalized_shape, what):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(x.shape[-len(shape) :]) != shape:
        raise ValueError(f"{what}: normalized_shape {shape} must be the input's trailing dims, input {x.shape}")
    return shape


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = _normalized(input, normalized_shape, "layer_norm")
    n = math.prod(shape)
    lead = input.shape[: input.ndim - len(shape)]
    x = input.reshape(lead + (n,)) if len(shape) != 1 else input
    w = weight.reshape(n) if weight is not None else ones(n, dtype=input.dtype, device=input.device)
    b = bias.reshape(n) if bias is not None else zeros(n, dtype=w.dtype, device=input.device)
    out = _F.layer_norm(x, w, b, eps)
    return out.reshape(input.shape) if len(shape) != 1 else out


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """eps=None is the dtype's machine epsilon, as in PyTorch."""
    shape = _normalized(input, normalized_shape, "rms_norm")
    n = math.prod(shape)
    lead = input.shape[: input.ndim - len(shape)]
    x = input.reshape(lead + (n,)) if len(shape) != 1 else input
    w = weight.reshape(n) if weight is not None else ones(n, dtype=input.dtype, device=input.device)
    out = _F.rms_norm(x, w, _EPS.get(input.dtype, 1e-6) if eps is None else eps)
    return out.reshape(input.shape) if len(shape) != 1 else out


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """weight[input]. padding_idx's row gets no gradient."""
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    out = _F.embedding(input, weight)
    if padding_idx is not None and out.requires_grad:
        pad = padding_idx % weight.shape[0]
        out = _no_pad_grad(out, input, pad)
    return out


def _no_pad_grad(out, input, pad):
    # The value is unchanged; the gradient of rows at padding_idx is zeroed (PyTorch leaves that row fixed).
    keep = _F.cast(_F.ne(input, pad), out.dtype).unsqueeze(-1)
    return _F.add(_F.mul(out, keep), _F.mul(out.detach(), _F.rsub(keep, 1.0)))


def leaky_relu(input, negative_slope=0.01):
    return _F.add(_F.relu(input), _F.mul(_F.relu(_F.neg(input)), -negative_slope))


def softplus(input, beta=1.0, threshold=20.0):
    x = _F.mul(input, beta)
    soft = _F.mul(_F.log(_F.affine(_F.exp(_F.clamp(x, None, threshold)), 1.0, 1.0)), 1.0 / beta)
    return _F.where(_F.gt(x, threshold), input, soft)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    if p != 2.0:
        raise NotImplementedError("normalize: only p=2 is supported")
    norm = _F.sqrt(_F.sum(_F.mul(input, input), dim, keepdim=True))
    return _F.div(input, _F.clamp(norm, eps, None))


def pad(input, pad, mode="constant", value=0.0):
    """Constant padding; `pad` lists (before, after) pairs from the last dim backwards, as PyTorch."""
    if mode != "constant":
        raise NotImplementedError(f"pad: only mode='constant' is supported, got {mode!r}")
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: expected pairs for at most {input.ndim} dims, got {pad}")
    out = input
    for i in range(len(pad) // 2):
        dim = input.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        if before < 0 or after < 0:
            raise NotImplementedError("pad: negative padding is not supported")
        parts = []
        for n in (before, after):
            shape = list(out.shape)
            shape[dim] = n
            parts.append(_filled(shape, value, out))
        out = _F.cat([parts[0], out, parts[1]], dim)
    return out


def _filled(shape, value, like):
    return zeros(*shape, dtype=like.dtype, device=like.device).fill_(value)
