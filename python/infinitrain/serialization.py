"""it.save and it.load: nested state (dicts, lists, tuples, numbers, strings, tensors, arrays) in one
safetensors file (checkpoint.save: atomic, checksummed). The tensors are plain safetensors entries named by
their path ("model.wte.weight", "optimizer.state.0.exp_avg"), so other tools read them; the structure around
them is JSON in the file's metadata. Unlike torch.save nothing is pickled, so loading runs no code; other
objects are refused (Tensors pickle, for pickle's own files)."""

import io
import json
import math
import os

import numpy as np

from infinitrain import checkpoint
from infinitrain.tensor import Tensor, from_numpy

_STRUCT_KEY = "infinitrain.structure"


def _flatten(obj, path, tensors, bf16, ids):
    if isinstance(obj, Tensor) or isinstance(obj, np.ndarray):
        key = ids.get(id(obj))
        if key is None:
            key = path or "tensor"
            while key in tensors:
                key += "_"
            ids[id(obj)] = key
            if isinstance(obj, Tensor):
                arr = obj.numpy()
                if obj.dtype == "bfloat16":
                    arr = checkpoint.float32_to_bf16_bits(arr)
                    bf16.add(key)
                tensors[key] = arr
            else:
                tensors[key] = obj
        if isinstance(obj, np.ndarray):
            return {"__ndarray__": key}
        return {
            "__tensor__": key,
            "dtype": obj.dtype,
            "device": obj.device,
            "requires_grad": bool(obj.requires_grad),
            "parameter": type(obj).__name__ == "Parameter",
        }
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(obj, dict):
        keys = list(obj)
        if all(isinstance(k, str) for k in keys):
            return {"__dict__": [[k, _flatten(obj[k], _join(path, k), tensors, bf16, ids)] for k in keys]}
        if all(isinstance(k, (int, str)) and not isinstance(k, bool) for k in keys):
            return {"__dict__": [[k, _flatten(obj[k], _join(path, str(k)), tensors, bf16, ids)] for k in keys]}
        raise TypeError(f"it.save: dict keys must be strings or ints, got {[type(k).__name__ for k in keys][:3]}")
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, _join(path, str(i)), tensors, bf16, ids) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    raise TypeError(
        f"it.save stores tensors, arrays, numbers, strings, None, lists, tuples and dicts, not "
        f"{type(obj).__name__} (at '{path}'); pickle other objects (Tensors pickle)"
    )


def _join(path, key):
    return f"{path}.{key}" if path else key


def save(
    obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True, _disable_byteorder_record=False
):
    """Writes obj to f (a path or a binary file object) as safetensors with the structure in its metadata (the
    pickle switches are PyTorch's and have nothing to switch here)."""
    tensors, bf16 = {}, set()
    structure = _flatten(obj, "", tensors, bf16, {})
    meta = {_STRUCT_KEY: structure}
    if isinstance(f, (str, os.PathLike)):
        checkpoint.save(f, tensors, meta, bf16=bf16)
        return
    # A file object: write to a temporary path, then copy the bytes (atomicity is the caller's).
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "obj.safetensors")
        checkpoint.save(tmp, tensors, meta, bf16=bf16)
        with open(tmp, "rb") as src:
            f.write(src.read())


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None, **pickle_load_args):
    """Reads what save() wrote (tensors go back to their saved devices, or to map_location). A safetensors file
    written elsewhere loads as a dict of tensors (on the CPU, or map_location)."""
    if isinstance(f, (str, os.PathLike)):
        path, buf = checkpoint._read(f)
    else:
        path, buf = getattr(f, "name", "<file>"), bytearray(f.read() if not isinstance(f, io.BytesIO) else f.getvalue())
    arrays, meta, dtypes = checkpoint.load_with_dtypes(str(path), buf, require_checksum=False)
    if map_location is not None and not isinstance(map_location, str):
        raise TypeError("map_location must be a device name such as 'cpu' or 'sim:0'")

    def tensor_of(key, dtype=None, device="cpu", requires_grad=False, parameter=False):
        arr = arrays[key]
        if dtypes[key] == "BF16":
            arr, dtype = checkpoint.bf16_bits_to_float32(arr), "bfloat16"
        t = from_numpy(arr, dtype=dtype, device=map_location or device)
        if parameter:
            from infinitrain.nn import Parameter

            return Parameter(t, requires_grad)
        return t.requires_grad_() if requires_grad else t

    if _STRUCT_KEY not in meta:
        return {k: tensor_of(k) for k in arrays}
    cache = {}

    def build(node):
        if isinstance(node, list):
            return [build(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "__tensor__" in node:
            key = node["__tensor__"]
            if key not in cache:
                cache[key] = tensor_of(
                    key, node["dtype"], node["device"], node.get("requires_grad", False), node.get("parameter", False)
                )
            return cache[key]
        if "__ndarray__" in node:
            return np.array(arrays[node["__ndarray__"]])
        if "__float__" in node:
            return float(node["__float__"])
        if "__tuple__" in node:
            return tuple(build(v) for v in node["__tuple__"])
        if "__dict__" in node:
            return {k: build(v) for k, v in node["__dict__"]}
        raise ValueError(f"{path}: unknown node in the saved structure: {json.dumps(node)[:100]}")

    return build(meta[_STRUCT_KEY])
