"""DistributedSampler: each rank of a data-parallel group reads its own share of a map-style dataset."""

import math

from infinitrain.random import Generator
from infinitrain.tensor import host_rng
from infinitrain.utils.data.sampler import Sampler


class DistributedSampler(Sampler):
    """The indices rank `rank` of `num_replicas` reads: every num_replicas-th index of the (shuffled, padded)
    order, the same shuffle on every rank for a given seed and epoch (call set_epoch each epoch)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            from infinitrain import distributed as dist

            if not dist.is_initialized():
                raise RuntimeError("DistributedSampler: pass num_replicas and rank, or initialise a process group")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is not in [0, {num_replicas})")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            gen = Generator().manual_seed(self.seed + self.epoch)
            order = host_rng(gen, n).permutation(n).tolist()
        else:
            order = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(order)
            order += (order * math.ceil(pad / max(len(order), 1)))[:pad] if pad > 0 else []
        else:
            order = order[: self.total_size]
        return iter(order[self.rank : self.total_size : self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch
