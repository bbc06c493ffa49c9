"""Hugging Face checkpoint files, for every family: a local folder with config.json and safetensors weights (one
model.safetensors, or shards listed by model.safetensors.index.json), float32, bfloat16, float16 or float64 on
disk. No hub access: folders only. Each model file maps its own names and config fields (its family's HFFormat);
models.from_pretrained picks the family from config.json's model_type.

A malformed file, a missing or mis-shaped tensor, or a config field a family cannot represent raises ValueError
naming the file, tensor or field. LLaMA-style q/k projections rotate halves (rotate_half) where our rope op rotates
interleaved pairs: rotary_from_hf / rotary_to_hf permute their rows (docs/decisions.md).
"""

import json
import os
import re

import numpy as np

from infinitrain import checkpoint
from infinitrain.tensor import from_numpy

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_FROM_ST = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
_TO_ST = {"float32": ("float32", np.float32), "float16": ("float16", np.float16), "float64": ("float64", np.float64)}


# ---- files -------------------------------------------------------------------------------------------------


def read_config(path):
    """config.json of a checkpoint folder as a dict."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no such file (a Hugging Face checkpoint folder has a config.json)")
    try:
        with open(file) as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def read_file(file):
    """name -> array of one safetensors file."""
    from safetensors import SafetensorError, deserialize  # lazily: only checkpoint I/O needs the package

    try:
        with open(file, "rb") as f:
            entries = deserialize(f.read())
    except SafetensorError as e:
        raise ValueError(f"{file}: not a valid safetensors file ({e})") from None
    out = {}
    for name, entry in entries:
        dt, shape, data = entry["dtype"], tuple(entry["shape"]), entry["data"]
        if dt == "BF16":
            arr = checkpoint.bf16_bits_to_float32(np.frombuffer(data, dtype="<u2"))
        elif dt in _FROM_ST:
            arr = np.frombuffer(data, dtype=np.dtype(_FROM_ST[dt]).newbyteorder("<")).astype(_FROM_ST[dt])
        else:
            raise ValueError(f"{file}: tensor '{name}' has dtype {dt}; expected F32, BF16, F16 or F64")
        out[name] = arr.reshape(shape)
    return out


def read_tensors(path):
    """name -> NumPy array (float32, or float64 for F64 tensors) of every tensor in the folder's weights."""
    index, single = os.path.join(path, INDEX_FILE), os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: malformed index ({e}); expected {{'weight_map': {{name: file}}}}") from None
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if not isinstance(shard, str) or os.path.basename(shard) != shard:
                raise ValueError(f"{index}: weight_map names shard {shard!r}; expected a file in the folder")
            file = os.path.join(path, shard)
            if not os.path.isfile(file):
                raise ValueError(f"{index}: shard {shard} is missing")
            tensors.update(read_file(file))
        missing = sorted(n for n in weight_map if n not in tensors)
        if missing:
            raise ValueError(f"{index}: tensors {missing[:5]} are listed but not in their shards")
        return tensors
    if os.path.isfile(single):
        return read_file(single)
    raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE}")


def _parse_size(size):
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size: expected bytes or a size such as '2GB', got {size!r}")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(m.group(1)) * scale)


def write_checkpoint(path, config, tensors, dtype="float32", max_shard_size="5GB"):
    """Writes config.json and the tensors (name -> float array) as safetensors in `dtype` (float32, bfloat16,
    float16, float64), sharded with an index when they exceed max_shard_size. Files are written atomically;
    weight files of an earlier save that this one does not use are removed."""
    if dtype not in ("bfloat16", *_TO_ST):
        raise ValueError(f"dtype must be float32, bfloat16, float16 or float64, got {dtype!r}")
    from safetensors import serialize

    limit = _parse_size(max_shard_size)
    if limit < 1:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    entries = []
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if dtype == "bfloat16":
            data, st = checkpoint.float32_to_bf16_bits(arr.astype(np.float32)).astype("<u2").tobytes(), "bfloat16"
        else:
            st, np_dtype = _TO_ST[dtype]
            data = np.ascontiguousarray(arr, dtype=np.dtype(np_dtype).newbyteorder("<")).tobytes()
        entries.append((name, {"dtype": st, "shape": list(arr.shape), "data": data}))
    shards, size = [[]], 0
    for e in entries:
        n = len(e[1]["data"])
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    os.makedirs(path, exist_ok=True)
    names = (
        [WEIGHTS_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards, strict=True):
        blob = serialize(dict(shard), metadata={"format": "pt"})
        checkpoint.atomic_write(os.path.join(path, name), lambda f, b=blob: f.write(b))
    written = set(names)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(len(e[1]["data"]) for e in entries)},
            "weight_map": {e[0]: n for n, shard in zip(names, shards, strict=True) for e in shard},
        }
        checkpoint.atomic_write(os.path.join(path, INDEX_FILE), lambda f: f.write(json.dumps(index, indent=2).encode()))
        written.add(INDEX_FILE)
    for old in os.listdir(path):
        if old not in written and (re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors", old) or old == INDEX_FILE):
            os.remove(os.path.join(path, old))
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    checkpoint.atomic_write(os.path.join(path, CONFIG_FILE), lambda f: f.write(text.encode()))


# ---- config fields ------------------------------------------------------------------------------------------

_REQUIRED = object()


def field(cfg, key, default=_REQUIRED, kind=int):
    """A config.json field of the given kind (int: a positive integer; float: positive; bool; str)."""
    if key not in cfg or cfg[key] is None:
        if default is _REQUIRED:
            raise ValueError(f"config.json: missing field '{key}'")
        return default
    v = cfg[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"config.json: field '{key}' must be a positive integer, got {v!r}")
    elif kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"config.json: field '{key}' must be a positive number, got {v!r}")
        v = float(v)
    elif kind is bool:
        if not isinstance(v, bool):
            raise ValueError(f"config.json: field '{key}' must be true or false, got {v!r}")
    elif not isinstance(v, kind):
        raise ValueError(f"config.json: field '{key}' must be a {kind.__name__}, got {v!r}")
    return v


def require(cfg, key, allowed, default, why):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if v not in allowed:
        raise ValueError(f"config.json: field '{key}' = {v!r} cannot be represented: {why}")


def build(make, what):
    """Runs a model config's constructor; its ValueError (a field out of range) names the checkpoint."""
    try:
        return make()
    except ValueError as e:
        raise ValueError(f"config.json: {what} cannot be represented: {e}") from None


# ---- tensors ------------------------------------------------------------------------------------------------


class Tensors:
    """A checkpoint's tensors (name -> array) read from `where`: take() each expected one by name and shape;
    leftovers are an error (finish)."""

    def __init__(self, tensors, where):
        self.t, self.where = dict(tensors), where

    def take(self, name, shape):
        if name not in self.t:
            raise ValueError(f"{self.where}: missing tensor '{name}'")
        arr = self.t.pop(name)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"{self.where}: tensor '{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}")
        return arr

    def finish(self, ignore=None):
        left = sorted(n for n in self.t if not (ignore and ignore.fullmatch(n)))  # ignore: a pattern of buffers
        if left:
            raise ValueError(f"{self.where}: unexpected tensors {left[:8]}{' ...' if len(left) > 8 else ''}")


def set_param(param, arr):
    param.copy_(from_numpy(np.asarray(arr), dtype=param.dtype, device=param.device))


def rotary_from_hf(w, heads):
    """Rows of a q/k projection [heads * hd, ...] from rotate-half order (pair i = rows i, i + hd/2 of a head)
    to interleaved order (pair i = rows 2i, 2i + 1)."""
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rotary_to_hf(w, heads):
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def host(p):
    """A parameter's values on the host, float32 (float64 stays)."""
    return p.numpy().astype(np.float32) if p.dtype != "float64" else p.numpy()


def same_tied(tensors, name, shape, tied, what):
    """A tied head a checkpoint may still hold (some exporters write it) must equal the embedding `tied`."""
    if name in tensors.t and not np.array_equal(tensors.take(name, shape), tied):
        raise ValueError(f"{tensors.where}: {name} differs from the tied {what}")
