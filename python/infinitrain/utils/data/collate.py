"""Collation: a list of samples into one batch, as PyTorch's default_collate does it."""

import collections.abc

import numpy as np

from infinitrain import functional as F
from infinitrain.tensor import Tensor, from_numpy, tensor


def default_collate(batch):
    """Tensors (and NumPy arrays) stack along a new first dim; Python ints become an int64 tensor, floats a
    float64 one, bools a bool one; strings stay a list; mappings, tuples, named tuples and lists are collated
    field by field."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return F.stack(list(batch), 0)
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "OSUV":
            raise TypeError(f"default_collate: NumPy arrays of {elem.dtype} cannot become tensors")
        return from_numpy(np.stack(batch))
    if isinstance(elem, np.generic):
        return from_numpy(np.array(batch))
    if isinstance(elem, bool):
        return tensor(batch, dtype="bool")
    if isinstance(elem, int):
        return tensor(batch, dtype="int64")
    if isinstance(elem, float):
        return tensor(batch, dtype="float64")
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        return {key: default_collate([d[key] for d in batch]) for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # a named tuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch, strict=True)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(b) != len(elem) for b in batch):
            raise RuntimeError("default_collate: each element in the list of the batch should be of equal size")
        cols = [default_collate(list(s)) for s in zip(*batch, strict=True)]
        return cols if isinstance(elem, list) else type(elem)(cols) if isinstance(elem, tuple) else cols
    raise TypeError(
        f"default_collate: batch must contain tensors, NumPy arrays, numbers, dicts or lists; found {type(elem)}"
    )


def default_convert(data):
    """What DataLoader does to a sample when batch_size is None: NumPy arrays become tensors, recursively."""
    if isinstance(data, np.ndarray) and data.dtype.kind not in "OSUV":
        return from_numpy(data)
    if isinstance(data, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(d) for d in data)
    return data


def pin(data):
    """Every tensor in data copied to page-locked memory."""
    if isinstance(data, Tensor):
        return data.pin_memory() if data.device == "cpu" else data
    if isinstance(data, collections.abc.Mapping):
        return {k: pin(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(pin(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(pin(d) for d in data)
    return data
