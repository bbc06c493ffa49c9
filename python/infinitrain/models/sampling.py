"""Autoregressive sampling shared by the models (host-side, from the last position's logits)."""

import math

import numpy as np

from infinitrain import autograd
from infinitrain.tensor import from_numpy


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
def generate(model, idx, max_new_tokens, block_size, vocab_size, temperature=1.0, top_k=None, seed=0):
    """Extends int token array idx [B, T0] by max_new_tokens sampled tokens; returns the new [B, T0 + n] array."""
    idx = np.asarray(idx, dtype=np.int64)
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
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
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
            nxt = np.array([rng.choice(vocab_size, p=row) for row in p])
        idx = np.concatenate([idx, nxt[:, None].astype(np.int64)], axis=1)
    model.train(was_training)
    return idx
