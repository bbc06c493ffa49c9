"""Autoregressive sampling shared by the models (host-side, from the last position's logits)."""

import numpy as np

from infinitrain import autograd
from infinitrain.tensor import from_numpy


@autograd.no_grad()
def generate(model, idx, max_new_tokens, block_size, vocab_size, temperature=1.0, top_k=None, seed=0):
    """Extends int token array idx [B, T0] by max_new_tokens sampled tokens; returns the new [B, T0 + n] array."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"generate: idx must be a non-empty [B, T] int array, got shape {idx.shape}")
    if temperature < 0:
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
