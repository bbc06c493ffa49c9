"""Datasets: map-style (index -> sample) and iterable ones, and the ways of combining and splitting them."""

import bisect
import math

import numpy as np

from infinitrain.tensor import host_rng


class Dataset:
    """A map-style dataset: __getitem__(index) and usually __len__."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset:
    """A dataset read as a stream: __iter__. In DataLoader worker processes each worker iterates its own copy;
    get_worker_info() tells a worker which share to produce."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Samples are the index-th rows of tensors that share their first dimension."""

    def __init__(self, *tensors):
        if tensors and any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            raise ValueError("TensorDataset: the tensors' first dimensions differ")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0] if self.tensors else 0


class StackDataset(Dataset):
    """Samples are tuples (or dicts) of the same index of several datasets of one length."""

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise ValueError("StackDataset: pass datasets positionally or by name, not both")
        self._dict = bool(kwargs)
        self.datasets = kwargs if kwargs else args
        lengths = {len(d) for d in (kwargs.values() if kwargs else args)}
        if len(lengths) > 1:
            raise ValueError("StackDataset: the datasets' lengths differ")
        self._length = lengths.pop() if lengths else 0

    def __getitem__(self, index):
        if self._dict:
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length


class ConcatDataset(Dataset):
    """Map-style datasets one after another."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: the datasets must not be empty")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not take IterableDatasets (use ChainDataset)")
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]))

    def __len__(self):
        return int(self.cumulative_sizes[-1])

    def __getitem__(self, index):
        if index < 0:
            if -index > len(self):
                raise IndexError(f"index {index} out of range for a dataset of {len(self)}")
            index += len(self)
        k = bisect.bisect_right(self.cumulative_sizes, index)
        if k >= len(self.datasets):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)}")
        start = self.cumulative_sizes[k - 1] if k else 0
        return self.datasets[k][index - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __iter__(self):
        for d in self.datasets:
            yield from d

    def __len__(self):
        return sum(len(d) for d in self.datasets)


class Subset(Dataset):
    """The samples of `dataset` at `indices`."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, index):
        if isinstance(index, list):
            return [self.dataset[self.indices[i]] for i in index]
        return self.dataset[self.indices[index]]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """Splits dataset into Subsets of the given lengths (or fractions summing to 1, the remainder spread over the
    first pieces), after a random permutation drawn from `generator`."""
    n = len(dataset)
    lengths = list(lengths)
    if lengths and all(0 <= f <= 1 for f in lengths) and math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError(f"random_split: the lengths sum to {sum(lengths)}, the dataset has {n} samples")
    order = host_rng(generator, n).permutation(n).tolist()
    out, start = [], 0
    for k in lengths:
        out.append(Subset(dataset, order[start : start + k]))
        start += k
    return out
