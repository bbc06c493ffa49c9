"""Samplers: the order in which DataLoader reads a map-style dataset, and its grouping into batches.

Random samplers draw from an infinitrain Generator (counter-based, so the same seed gives the same order on every
machine); without one they take a seed from the default generator, so it.manual_seed fixes the shuffle."""

import numpy as np

from infinitrain.random import MAX_SEED, Generator, default_generator
from infinitrain.tensor import host_rng


def _fresh_generator():
    """A generator seeded from the default one (which moves on), as PyTorch's samplers do without a generator."""
    seed = int(host_rng(default_generator, 1).integers(0, MAX_SEED))
    return Generator().manual_seed(seed)


class Sampler:
    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation of the indices (or num_samples draws with replacement)."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement, self._num_samples = data_source, replacement, num_samples
        self.generator = generator
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"RandomSampler: num_samples must be a positive int, got {num_samples!r}")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        gen = self.generator or _fresh_generator()
        if self.replacement:
            yield from host_rng(gen, self.num_samples).integers(0, n, self.num_samples).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from host_rng(gen, n).permutation(n).tolist()
        yield from host_rng(gen, n).permutation(n)[: self.num_samples % n].tolist()

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = list(indices), generator

    def __iter__(self):
        gen = self.generator or _fresh_generator()
        for i in host_rng(gen, len(self.indices)).permutation(len(self.indices)):
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices drawn with probability proportional to weights."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        w = np.asarray(weights.numpy() if hasattr(weights, "numpy") else weights, dtype=np.float64).reshape(-1)
        if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError("WeightedRandomSampler: weights must be finite, non-negative and not all zero")
        self.weights, self.num_samples, self.replacement, self.generator = w, int(num_samples), replacement, generator

    def __iter__(self):
        gen = self.generator or _fresh_generator()
        p = self.weights / self.weights.sum()
        yield from host_rng(gen, self.num_samples).choice(len(p), self.num_samples, self.replacement, p).tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of batch_size indices from another sampler (the last one shorter unless drop_last)."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
