"""Autoregressive sampling shared by the models (host-side, from the last position's logits)."""

import math

import numpy as np

from infinitrain import autograd
from infinitrain.nn.utils import eval_mode
from infinitrain.tensor import Tensor, from_numpy, host_rng


def check_ids(model_name, idx, targets, block_size):
    """Checks idx (and targets) are [B, T] tensors with T <= block_size; returns (B, T). Id ranges are checked
    by the embedding kernel (no host synchronisation here)."""
    if len(idx.shape) != 2:
        raise ValueError(f"{model_name}: idx must be a 2-d [batch, sequence] tensor of ids, got shape {idx.shape}")
    if targets is not None and tuple(targets.shape) != tuple(idx.shape):
        raise ValueError(f"{model_name}: targets must have idx's shape {idx.shape}, got {targets.shape}")
    B, T = idx.shape
    if T > block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {block_size}")
    return B, T


@autograd.no_grad()
def generate(model, idx, max_new_tokens, block_size, vocab_size, temperature=1.0, top_k=None, seed=0, generator=None):
    """Extends ids idx [B, T0] by max_new_tokens sampled tokens; returns [B, T0 + n] as idx came: a tensor on
    idx's device (int64) for a tensor, an array for an array. Draws come from `generator` (an it.Generator,
    which moves on) when given, else from NumPy seeded with `seed`."""
    as_tensor = isinstance(idx, Tensor)
    out_device = idx.device if as_tensor else None
    idx = idx.numpy().astype(np.int64) if as_tensor else np.asarray(idx, dtype=np.int64)
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"generate: idx must be a non-empty [B, T] int array, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= vocab_size):
        raise ValueError(f"generate: token ids must be in [0, {vocab_size}), got [{idx.min()}, {idx.max()}]")
    if not max_new_tokens >= 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be >= 1 (or None for no filtering), got {top_k}")
    rng = np.random.default_rng(seed) if generator is None else None
    device = next(model.parameters()).device
    with eval_mode(model):
        return _sample(model, idx, max_new_tokens, block_size, vocab_size, temperature, top_k, rng, generator,
                       device, as_tensor, out_device)  # fmt: skip


def _sample(model, idx, max_new_tokens, block_size, vocab_size, temperature, top_k, rng, generator, device,
            as_tensor, out_device):  # fmt: skip
    for _ in range(max_new_tokens):
        ctx = idx[:, -block_size:]
        logits, _ = model(from_numpy(ctx, device=device))
        last = logits[:, -1, :].numpy().astype(np.float64)[:, :vocab_size]
        if temperature == 0:
            nxt = last.argmax(-1)
        else:
            last = last / temperature
            if top_k is not None and top_k < vocab_size:
                kth = np.sort(last, axis=-1)[:, -top_k][:, None]
                last = np.where(last < kth, -np.inf, last)
            p = np.exp(last - last.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            draw = rng if rng is not None else host_rng(generator, len(p))
            nxt = np.array([draw.choice(vocab_size, p=row) for row in p])
        idx = np.concatenate([idx, nxt[:, None].astype(np.int64)], axis=1)
    return from_numpy(idx, device=out_device) if as_tensor else idx
