"""torch.utils.data as a PyTorch user writes it: datasets (map-style and iterable), samplers, and DataLoader, which
batches samples with a collate function, shuffles with a generator, and can load in worker processes and pin
batches for asynchronous copies.

    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2, pin_memory=True)
    for xb, yb in loader:
        xb, yb = xb.to("cuda", non_blocking=True), yb.to("cuda", non_blocking=True)
"""

from infinitrain.utils.data.collate import default_collate, default_convert
from infinitrain.utils.data.dataloader import DataLoader, get_worker_info
from infinitrain.utils.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from infinitrain.utils.data.distributed import DistributedSampler
from infinitrain.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]
