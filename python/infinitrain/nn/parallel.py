"""torch.nn.parallel's name for the data-parallel wrapper (infinitrain.distributed.ddp)."""

from infinitrain.distributed.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
