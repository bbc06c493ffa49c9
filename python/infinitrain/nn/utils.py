"""torch.nn.utils' gradient clipping."""

from infinitrain.optim.optimizers import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
