"""Distributed training: process groups and collectives in PyTorch's shape, DDP, and the communicators under
them.

    python -m infinitrain.run --nproc_per_node=2 train.py     # one process per device
    it.distributed.init_process_group()                      # in each: join the others
    it.distributed.all_reduce(t)                             # cpu tensors over Gloo, device tensors over the
                                                             # provider's CCL
    model = it.distributed.DistributedDataParallel(model)    # gradients averaged as backward runs

`infinitrain.distributed.comm` is the layer below: communicators made directly (one process driving several
devices with init_all, or one per process with init_rank) and collectives on them.
"""

from infinitrain.distributed import comm
from infinitrain.distributed.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    broadcast,
    recv,
    reduce,
    reduce_scatter_tensor,
    send,
)
from infinitrain.distributed.comm import OPS, Communicator, group, has_ccl, init_all, init_rank, unique_id
from infinitrain.distributed.ddp import DistributedDataParallel
from infinitrain.distributed.fsdp import FullyShardedDataParallel
from infinitrain.distributed.group import (
    NON_GROUP_MEMBER,
    ProcessGroup,
    Work,
    barrier,
    default_group,
    default_store,
    destroy_process_group,
    flush_sends,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    new_group,
)
from infinitrain.distributed.zero import ZeroRedundancyOptimizer


class ReduceOp:
    """PyTorch's reduction names; collectives here take them as these strings."""

    SUM, AVG, PRODUCT, MIN, MAX = "sum", "avg", "prod", "min", "max"


def is_available():
    """Whether process groups can be used (always, in this build: Gloo for the cpu, the provider's CCL)."""
    return True


__all__ = [
    "NON_GROUP_MEMBER",
    "OPS",
    "Communicator",
    "DistributedDataParallel",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "ZeroRedundancyOptimizer",
    "FullyShardedDataParallel",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "barrier",
    "broadcast",
    "comm",
    "default_group",
    "default_store",
    "destroy_process_group",
    "flush_sends",
    "get_rank",
    "get_world_size",
    "group",
    "has_ccl",
    "init_all",
    "init_process_group",
    "is_available",
    "init_rank",
    "is_initialized",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "send",
    "unique_id",
]
