"""torch.nn.functional-style names for the differentiable ops."""

from infinitrain.functional import (  # noqa: F401
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    relu,
    rms_norm,
    rope,
    scaled_dot_product_attention,
    silu,
    softmax,
    swiglu,
)
