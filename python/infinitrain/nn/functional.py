"""torch.nn.functional's names and signatures over infinitrain's differentiable ops.

Where infinitrain.functional's own signature differs (layer_norm takes no normalized_shape there), the
PyTorch form is defined here; everything else is the same function.
"""

import math

from infinitrain import functional as _F
from infinitrain import tensor_ops as _T
from infinitrain.functional import (  # noqa: F401
    gelu,
    linear,
    mse_loss,
    multinomial,
    nll_loss,
    one_hot,
    rope,
    scaled_dot_product_attention,
    sigmoid,
    swiglu,
    tanh,
)
from infinitrain.tensor import ones, zeros

_EPS = {"float32": 1.1920928955078125e-07, "float64": 2.220446049250313e-16, "bfloat16": 0.0078125}
_EPS["float16"] = 0.0009765625


def relu(input, inplace=False):
    return _F.relu(input)


def silu(input, inplace=False):
    return _F.silu(input)


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    return _F.dropout(input, p, training, generator)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _F.softmax(input, -1 if dim is None else dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _F.log_softmax(input, -1 if dim is None else dim, dtype)


def cross_entropy(
    input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0
):
    return _F.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


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


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _F.add(_F.relu(input), _F.mul(_F.relu(_F.neg(input)), -negative_slope))


def softplus(input, beta=1.0, threshold=20.0):
    x = _F.mul(input, beta)
    soft = _F.mul(_F.log1p(_F.exp(_F.clamp(x, None, threshold))), 1.0 / beta)
    return _F.where(_F.gt(x, threshold), input, soft)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input divided by its p-norm along dim (at least eps)."""
    norm = _T.norm(input, p, dim, keepdim=True)
    return _F.div(input, _F.clamp(norm, eps, None))


def pad(input, pad, mode="constant", value=None):
    """Padding; `pad` lists (before, after) pairs from the last dim backwards, as PyTorch: mode 'constant' (value,
    default 0), 'reflect', 'replicate' or 'circular' (the last three by index selection)."""
    if mode in ("reflect", "replicate", "circular"):
        return _index_pad(input, pad, mode)
    if mode != "constant":
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    value = 0.0 if value is None else value
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


def _index_pad(input, pad, mode):
    """reflect / replicate / circular padding: each padded dim is one index_select of source positions."""
    import numpy as np

    out = input
    for i in range(len(pad) // 2):
        dim = input.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        n = out.shape[dim]
        pos = np.arange(-before, n + after)
        if mode == "replicate":
            pos = np.clip(pos, 0, n - 1)
        elif mode == "circular":
            pos = pos % n
        else:  # reflect: mirror without repeating the edge
            if before >= n or after >= n:
                raise ValueError(f"pad: reflect padding ({before}, {after}) must be smaller than the dim ({n})")
            pos = np.abs(pos)
            pos = np.where(pos > n - 1, 2 * (n - 1) - pos, pos)
        out = _F.index_select(out, dim, pos)
    return out


# ---- activations ----


def elu(input, alpha=1.0, inplace=False):
    return _F.where(_F.gt(input, 0.0), input, _F.mul(_F.expm1(_F.clamp(input, None, 0.0)), alpha))


def selu(input, inplace=False):
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return _F.mul(elu(input, alpha), scale)


def celu(input, alpha=1.0, inplace=False):
    return _F.where(_F.gt(input, 0.0), input, _F.mul(_F.expm1(_F.div(_F.clamp(input, None, 0.0), alpha)), alpha))


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return _F.neg(softplus(_F.neg(input)))


def mish(input, inplace=False):
    return _F.mul(input, _F.tanh(softplus(input)))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    return _F.clamp(input, min_val, max_val)


def relu6(input, inplace=False):
    return _F.clamp(input, 0.0, 6.0)


def hardsigmoid(input, inplace=False):
    return _F.affine(_F.clamp(input, -3.0, 3.0), 1.0 / 6.0, 0.5)


def hardswish(input, inplace=False):
    return _F.mul(input, hardsigmoid(input))


def softsign(input):
    return _F.div(input, _F.affine(_F.abs(input), 1.0, 1.0))


def glu(input, dim=-1):
    """a * sigmoid(b) with (a, b) the two halves of input along dim."""
    a, b = _F.split(input, input.shape[dim] // 2, dim)
    return _F.mul(a, _F.sigmoid(b))


def silu_(input):
    return _F.silu(input)


# ---- normalisation ----


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-05):
    """Normalises each group of num_groups channels (dim 1) of each sample over the group's channels and spatial
    positions, then scales and shifts per channel."""
    n, c = input.shape[0], input.shape[1]
    if c % num_groups:
        raise ValueError(f"group_norm: {c} channels do not split into {num_groups} groups")
    x = input.reshape(n, num_groups, -1)
    mean = _F.mean(x, -1, keepdim=True)
    d = _F.sub(x, mean)
    var = _F.mean(_F.mul(d, d), -1, keepdim=True)
    out = _F.mul(d, _F.rsqrt(_F.affine(var, 1.0, eps))).reshape(input.shape)
    shape = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = _F.mul(out, weight.reshape(shape))
    if bias is not None:
        out = _F.add(out, bias.reshape(shape))
    return out


# ---- losses ----


def _reduce(loss, reduction, name):
    if reduction == "mean":
        return _F.mean(loss)
    if reduction == "sum":
        return _F.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    return _reduce(_F.abs(_F.sub(input, target)), reduction, "l1_loss")


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta."""
    d = _F.abs(_F.sub(input, target))
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    loss = _F.where(_F.lt(d, beta), _F.mul(_F.mul(d, d), 0.5 / beta), _F.affine(d, 1.0, -0.5 * beta))
    return _reduce(loss, reduction, "smooth_l1_loss")


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    d = _F.abs(_F.sub(input, target))
    loss = _F.where(_F.lt(d, delta), _F.mul(_F.mul(d, d), 0.5), _F.affine(d, delta, -0.5 * delta * delta))
    return _reduce(loss, reduction, "huber_loss")


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log p + (1 - t) log(1 - p)) on probabilities p, each log clamped at -100 as PyTorch's."""
    logp = _F.clamp(_F.log(input), -100.0, None)
    log1mp = _F.clamp(_F.log(_F.rsub(input, 1.0)), -100.0, None)
    loss = _F.neg(_F.add(_F.mul(target, logp), _F.mul(_F.rsub(target, 1.0), log1mp)))
    if weight is not None:
        loss = _F.mul(loss, weight)
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(
    input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None
):
    """binary_cross_entropy(sigmoid(x), t) from the logits, stable for large |x|:
    (1 - t) x + (1 + (w - 1) t) softplus(-x), w = pos_weight (1 without one)."""
    sp = softplus(_F.neg(input))  # -log(sigmoid(x))
    if pos_weight is None:
        loss = _F.add(_F.mul(_F.rsub(target, 1.0), input), sp)
    else:
        coef = _F.affine(_F.mul(target, _F.affine(pos_weight, 1.0, -1.0)), 1.0, 1.0)
        loss = _F.add(_F.mul(_F.rsub(target, 1.0), input), _F.mul(coef, sp))
    if weight is not None:
        loss = _F.mul(loss, weight)
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """Pointwise target * (log target - input) with input log-probabilities; 'batchmean' divides the sum by the
    batch size (PyTorch's recommended reduction; 'mean' averages over every element)."""
    if log_target:
        loss = _F.mul(_F.exp(target), _F.sub(target, input))
    else:
        safe = _F.where(_F.gt(target, 0.0), target, 1.0)
        loss = _F.where(_F.gt(target, 0.0), _F.mul(target, _F.sub(_F.log(safe), input)), 0.0)
    if reduction == "batchmean":
        return _F.div(_F.sum(loss), float(input.shape[0]) if input.ndim else 1.0)
    return _reduce(loss, reduction, "kl_div")


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """x1 . x2 / max(|x1| |x2|, eps) along dim."""
    dot = _F.sum(_F.mul(x1, x2), dim)
    n1 = _F.sum(_F.mul(x1, x1), dim)
    n2 = _F.sum(_F.mul(x2, x2), dim)
    return _F.div(dot, _F.sqrt(_F.clamp(_F.mul(n1, n2), eps * eps, None)))


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps over the last dim."""
    return _T.norm(_F.affine(_F.sub(x1, x2), 1.0, eps), p, -1, keepdim)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-06, swap=False, reduction="mean"):
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = _F.minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce(_F.relu(_F.affine(_F.sub(d_pos, d_neg), 1.0, margin)), reduction, "triplet_margin_loss")


# ---- convolution (im2col: index selection and one matmul) ----


def _tuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _conv_nd(input, weight, bias, stride, padding, dilation, groups, nd):
    """An nd convolution (1 or 2) of input [N, C, *S] with weight [O, C/groups, *K]: the input's patches gathered
    by index into [N, groups, C/groups * prod(K), L] columns, one batched matmul, bias added."""
    import numpy as np

    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    ksize = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            total = [d * (k - 1) for d, k in zip(dilation, ksize, strict=True)]
            pads = []
            for t in reversed(total):
                pads += [t // 2, t - t // 2]
            input = pad(input, pads)
            padding = (0,) * nd
        else:
            raise ValueError(f"conv: padding must be 'valid', 'same', an int or a tuple, got {padding!r}")
    padding = _tuple(padding, nd)
    if any(padding):
        pads = []
        for p_ in reversed(padding):
            pads += [p_, p_]
        input = pad(input, pads)
    n, c = input.shape[0], input.shape[1]
    space = tuple(input.shape[2:])
    o = weight.shape[0]
    if c % groups or o % groups or weight.shape[1] * groups != c:
        raise ValueError(f"conv: {c} input channels, weight {tuple(weight.shape)} and groups={groups} do not match")
    out_size = tuple(
        (s - d * (k - 1) - 1) // st + 1 for s, d, k, st in zip(space, dilation, ksize, stride, strict=True)
    )
    if any(v <= 0 for v in out_size):
        raise ValueError(f"conv: the kernel {ksize} does not fit the padded input {space}")
    # Flat input positions of every (kernel offset, output position) pair.
    grids = np.meshgrid(*[np.arange(v) * st for v, st in zip(out_size, stride, strict=True)], indexing="ij")
    offs = np.meshgrid(*[np.arange(k) * d for k, d in zip(ksize, dilation, strict=True)], indexing="ij")
    strides = [int(np.prod(space[i + 1 :])) for i in range(nd)]
    base = sum(g.reshape(-1) * s for g, s in zip(grids, strides, strict=True))
    koff = sum(k.reshape(-1) * s for k, s in zip(offs, strides, strict=True))
    ids = (koff[:, None] + base[None, :]).reshape(-1)
    kk, length = len(koff), len(base)
    cols = _F.index_select(input.reshape(n, c, -1), 2, ids)  # [N, C, K * L]
    cols = cols.reshape(n, groups, (c // groups) * kk, length)
    w = weight.reshape(groups, o // groups, (c // groups) * kk)
    out = _F.matmul(w, cols)  # [N, groups, O/groups, L]
    out = out.reshape((n, o) + out_size)
    if bias is not None:
        out = _F.add(out, bias.reshape((1, o) + (1,) * nd))
    return out


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    unbatched = input.ndim == 2
    x = input.unsqueeze(0) if unbatched else input
    out = _conv_nd(x, weight, bias, stride, padding, dilation, groups, 1)
    return out.squeeze(0) if unbatched else out


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    out = _conv_nd(x, weight, bias, stride, padding, dilation, groups, 2)
    return out.squeeze(0) if unbatched else out


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    k = _tuple(kernel_size, 1)[0]
    c = input.shape[-2]
    w = ones(c, 1, k, dtype=input.dtype, device=input.device)
    w = _F.mul(w, 1.0 / k)
    return conv1d(input, w, None, stride or k, padding, 1, c)


def avg_pool2d(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    kh, kw = _tuple(kernel_size, 2)
    c = input.shape[-3]
    w = _F.mul(ones(c, 1, kh, kw, dtype=input.dtype, device=input.device), 1.0 / (divisor_override or kh * kw))
    return conv2d(input, w, None, stride or (kh, kw), padding, 1, c)
