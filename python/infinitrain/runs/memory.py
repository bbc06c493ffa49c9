"""A step's peak memory by category: weights, gradients and optimizer state (the tensors themselves) and the rest
(activations, workspace and temporaries at the peak)."""


def by_category(params, optimizer, peak_bytes):
    """{category: GB}: `params`' weights and their .grad, `optimizer`'s state (AdamW's moments: its `m` and `v`
    lists; an optimizer without them counts 0), and peak_bytes less those three."""

    def gb(tensors):
        return sum(t.numel() * t.element_size() for t in tensors if t is not None) / 1e9

    parts = {
        "weights": gb(params),
        "grads": gb(p.grad for p in params),
        "optimizer": gb(list(getattr(optimizer, "m", [])) + list(getattr(optimizer, "v", []))),
    }
    parts["activations_and_workspace"] = peak_bytes / 1e9 - sum(parts.values())
    return parts
