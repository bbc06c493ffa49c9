"""Hugging Face checkpoint files, for every family: a local folder with config.json and safetensors weights (one
model.safetensors, or shards listed by model.safetensors.index.json), float32, bfloat16, float16 or float64 on
disk. No hub access: folders only. Each model file maps its own names and config fields (its family's HFFormat);
models.from_pretrained picks the family from config.json's model_type.

Loading is bounded by the model being built: every safetensors header is parsed here and checked against its
file, and the names, shapes and dtypes against what config.json implies (the family's HFFormat.shapes), before the
model is built or any tensor read; then each tensor is read by its offset when the model takes it (buffers a
family ignores are never read). A malformed file, a missing, extra or mis-shaped tensor, or a config field of the
wrong type or one a family cannot represent raises ValueError naming the file, tensor or field.

LLaMA-style q/k projections rotate halves (rotate_half) where our rope op rotates interleaved pairs:
rotary_from_hf / rotary_to_hf permute their rows (docs/decisions.md).
"""

import json
import math
import os
import re
import struct
from typing import NamedTuple

import numpy as np

from infinitrain import checkpoint
from infinitrain.tensor import from_numpy, load_

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_TO_ST = {"float32": ("float32", np.float32), "float16": ("float16", np.float16), "float64": ("float64", np.float64)}

# Every safetensors dtype and its bytes per element (a header may name any; only floats load as weights).
ST_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8, "I64": 8, "I32": 4,
    "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
_FLOATS = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BF16": "<u2"}  # BF16: bit patterns, widened on read
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
MAX_JSON_BYTES = 64 << 20  # config.json and the index are kilobytes; more is not a checkpoint folder


# ---- files -------------------------------------------------------------------------------------------------


class Config(dict):
    """A config.json dict that knows its file, so field errors name it."""

    def __init__(self, values, file=CONFIG_FILE):
        super().__init__(values)
        self.file = file


def where(cfg):
    """The file a config dict came from, for messages."""
    return getattr(cfg, "file", CONFIG_FILE)


def _read_json(file, what):
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_JSON_BYTES:
                raise ValueError(f"{file}: {size} bytes is too large for {what}")
            return json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{file}: not valid JSON ({_short(e)})") from None
    except OSError as e:
        raise ValueError(f"{file}: cannot be read ({e.strerror or e})") from None


def read_config(path):
    """config.json of a checkpoint folder as a dict (a Config, naming its file)."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no such file (a Hugging Face checkpoint folder has a config.json)")
    cfg = _read_json(file, "a config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    return Config(cfg, file)


class Entry(NamedTuple):
    """One tensor of a safetensors file, as its header declares it: read() loads it by its offset."""

    file: str
    name: str
    dtype: str  # a safetensors dtype (ST_ITEMSIZE)
    shape: tuple
    start: int  # the first byte's offset in the file
    nbytes: int
    identity: tuple = None  # the file's when the header was read (checkpoint.read_into)

    def check_float(self):
        if self.dtype not in _FLOATS:
            raise ValueError(
                f"{self.file}: tensor '{self.name}' has dtype {self.dtype}; expected F32, BF16, F16 or F64"
            )

    def read(self):
        """The tensor as a NumPy array: float32 (F32, BF16), float16 or float64."""
        self.check_float()
        raw = np.empty(self.nbytes // ST_ITEMSIZE[self.dtype], dtype=_FLOATS[self.dtype])
        checkpoint.read_into(self.file, self.start, raw, f"tensor '{self.name}'", self.identity)
        arr = (
            checkpoint.bf16_bits_to_float32(raw)
            if self.dtype == "BF16"
            else raw.astype(raw.dtype.newbyteorder("="), copy=False)
        )
        return arr.reshape(self.shape)


def _short(v, limit=80):
    """repr (or str, of an exception) cut to one short line: messages quote what a file holds."""
    text = " ".join((str(v) if isinstance(v, BaseException) else repr(v)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _unique_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def read_header(file):
    """The tensors (Entry list, in header order) a safetensors file declares, checked against the file before
    any tensor is read: the header's length fits the file, it is a JSON object of {dtype, shape, data_offsets}
    with known dtypes, each tensor's bytes are dtype * shape, and the offsets tile the data section exactly
    (no overlap, no gap, nothing past its end). ValueError names the file and the problem."""
    file = os.fspath(file)

    def bad(problem):
        return ValueError(f"{file}: not a valid safetensors file: {problem}")

    try:
        with open(file, "rb") as f:
            identity = checkpoint.file_identity(f)
            size = identity[2]
            if size < 8:
                raise bad(f"{size} bytes is shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise bad(f"header length {n} runs past the end of the file ({size} bytes)")
            if n > MAX_HEADER_BYTES:
                raise bad(f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
            text = f.read(n)
    except OSError as e:
        raise ValueError(f"{file}: cannot be read ({e.strerror or e})") from None
    if len(text) != n:
        raise bad("truncated header (file changed?)")
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError, as is a key
        raise bad(f"the header is not valid JSON ({_short(e)})") from None  # repeated; deep nesting recurses
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, expected an object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not isinstance(meta, dict):
        raise bad(f"__metadata__ is a {type(meta).__name__}, expected an object")
    data_start, data_bytes = 8 + n, size - 8 - n
    entries, spans = [], []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise bad(f"tensor '{name}' is {_short(e)}; expected {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in ST_ITEMSIZE:
            raise bad(f"tensor '{name}' has unknown dtype {_short(dtype)}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise bad(f"tensor '{name}' has shape {_short(shape)}; expected a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise bad(f"tensor '{name}' has data_offsets {_short(offsets)}; expected [begin, end]")
        begin, end = offsets
        if begin > end:
            raise bad(f"tensor '{name}' has data_offsets {offsets}: its end is before its begin")
        if end > data_bytes:
            raise bad(f"tensor '{name}' has data_offsets {offsets} outside the {data_bytes}-byte data section")
        nbytes = math.prod(shape) * ST_ITEMSIZE[dtype]
        if end - begin != nbytes:
            raise bad(
                f"tensor '{name}' is {dtype} {_short(shape)} ({_short(nbytes)} bytes) but data_offsets {offsets} "
                f"hold {end - begin}"
            )
        entries.append(Entry(file, name, dtype, tuple(shape), data_start + begin, nbytes, identity))
        spans.append((begin, end, name))
    covered, last = 0, None
    for begin, end, name in sorted(spans):
        if begin < covered:
            raise bad(f"tensors '{last}' and '{name}' overlap")
        if begin > covered:
            raise bad(f"bytes {covered}..{begin} of the data section belong to no tensor")
        covered, last = end, name
    if covered != data_bytes:
        raise bad(f"the data section has {data_bytes - covered} bytes after the last tensor")
    return entries


def read_entries(path):
    """name -> Entry of every tensor in the folder's weights (model.safetensors, or the shards its index names),
    every header checked and nothing read yet."""
    index, single = os.path.join(path, INDEX_FILE), os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(index):
        doc = _read_json(index, "an index")
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: malformed index; expected {{'weight_map': {{name: file}}}}")
        entries, home = {}, {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise ValueError(f"{index}: weight_map names shard {shard!r}; expected a file in the folder")
            file = os.path.join(path, shard)
            if not os.path.isfile(file):
                raise ValueError(f"{index}: shard {shard} is missing")
            for e in read_header(file):
                if e.name in entries:
                    raise ValueError(f"{index}: tensor '{e.name}' is in both {home[e.name]} and {shard}")
                entries[e.name], home[e.name] = e, shard
        missing = sorted(n for n in weight_map if n not in entries)
        if missing:
            raise ValueError(f"{index}: tensors {missing[:5]} are listed but not in their shards")
        return entries
    if os.path.isfile(single):
        return {e.name: e for e in read_header(single)}
    raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE} or {INDEX_FILE}")


def read_file(file):
    """name -> array of one safetensors file (its header checked before anything is read)."""
    return {e.name: e.read() for e in read_header(file)}


def read_tensors(path):
    """name -> NumPy array (float32, or float64 for F64 tensors) of every tensor in the folder's weights."""
    return {name: e.read() for name, e in read_entries(path).items()}


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
            raise ValueError(f"{where(cfg)}: missing field '{key}'")
        return default
    v = cfg[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where(cfg)}: field '{key}' must be a positive integer, got {v!r}")
    elif kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{where(cfg)}: field '{key}' must be a positive number, got {v!r}")
        v = float(v)
    elif kind is bool:
        if not isinstance(v, bool):
            raise ValueError(f"{where(cfg)}: field '{key}' must be true or false, got {v!r}")
    elif not isinstance(v, kind):
        raise ValueError(f"{where(cfg)}: field '{key}' must be a {kind.__name__}, got {v!r}")
    return v


def coefficient(cfg, key, default):
    """A config.json field that is a finite number >= 0 (a loss weight: 0 turns it off)."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise ValueError(f"{where(cfg)}: field '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


def require(cfg, key, allowed, default, why):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if v not in allowed:
        raise ValueError(f"{where(cfg)}: field '{key}' = {v!r} cannot be represented: {why}")


def build(make, what, cfg=None):
    """Runs a model config's constructor; its ValueError (a field out of range) names the checkpoint."""
    try:
        return make()
    except ValueError as e:
        raise ValueError(f"{where(cfg)}: {what} cannot be represented: {e}") from None


# ---- tensors ------------------------------------------------------------------------------------------------


class Expected(NamedTuple):
    """The tensors a config implies, name -> shape: required ones, optional ones (a tied head a file may still
    hold), and `ignore`, a pattern of buffers files may carry (never read)."""

    required: dict
    optional: dict
    ignore: object = None


def check_entries(entries, expected, path):
    """Checks a folder's tensors (name -> Entry) against the names, shapes and dtypes a config implies, before
    the model is built or any tensor read: with every tensor read expected, what is read is bounded by the
    model the config describes."""
    for name, shape in [*expected.required.items(), *expected.optional.items()]:  # the model's order
        e = entries.get(name)
        if e is None:
            continue
        if e.shape != tuple(shape):
            raise ValueError(
                f"{e.file}: tensor '{name}' has shape {e.shape}, expected {tuple(shape)} from the config "
                "(do config.json and the weights belong together?)"
            )
        e.check_float()
    missing = [n for n in expected.required if n not in entries]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{path}: missing tensor '{missing[0]}'{more}")
    left = sorted(
        n
        for n in entries
        if n not in expected.required
        and n not in expected.optional
        and not (expected.ignore and expected.ignore.fullmatch(n))
    )
    if left:
        raise ValueError(f"{path}: unexpected tensors {left[:8]}{' ...' if len(left) > 8 else ''}")


class Lazy:
    """A checkpoint tensor not read yet, with the transforms applied to it so far: read() reads and applies them.
    A model on device "meta" records it (tensor.load_), so each rank of a sharded model reads only what it owns."""

    def __init__(self, read, shape, key):
        self.read, self.shape, self.key = read, tuple(shape), key  # key: the file's fingerprint, what was done

    @property
    def T(self):
        return Lazy(lambda: self.read().T, self.shape[::-1], (self.key, "T"))


def _now(x):
    return x.read() if isinstance(x, Lazy) else x


class Tensors:
    """A checkpoint's tensors (name -> array, or Entry: read when taken) from `where`: take() each expected one by
    name and shape; leftovers are an error (finish). lazy: an Entry is taken as a Lazy, read when its parameter is
    materialised (names and shapes are still checked at once)."""

    def __init__(self, tensors, where, lazy=False):
        self.t, self.where, self.lazy = dict(tensors), where, lazy

    def take(self, name, shape):
        if name not in self.t:
            raise ValueError(f"{self.where}: missing tensor '{name}'")
        item = self.t.pop(name)
        if tuple(item.shape) != tuple(shape):
            raise ValueError(f"{self.where}: tensor '{name}' has shape {tuple(item.shape)}, expected {tuple(shape)}")
        if isinstance(item, Entry):
            if self.lazy:
                return Lazy(item.read, item.shape, (checkpoint.fingerprint(item.file), item.start, item.nbytes))
            return item.read()
        return item

    def finish(self, ignore=None):
        left = sorted(n for n in self.t if not (ignore and ignore.fullmatch(n)))  # ignore: a pattern of buffers
        if left:
            raise ValueError(f"{self.where}: unexpected tensors {left[:8]}{' ...' if len(left) > 8 else ''}")


def set_param(param, arr):
    if isinstance(arr, Lazy):
        load_(param, arr.read, arr.key)  # now, or when a meta parameter is materialised
        return
    param.copy_(from_numpy(np.asarray(arr), dtype=param.dtype, device=param.device))


def concat(parts):
    """np.concatenate of arrays along the first axis, Lazy if any part is."""
    if not any(isinstance(x, Lazy) for x in parts):
        return np.concatenate(parts)
    shape = (sum(x.shape[0] for x in parts), *parts[0].shape[1:])
    keys = tuple(x.key if isinstance(x, Lazy) else ("array", x.shape) for x in parts)
    return Lazy(lambda: np.concatenate([_now(x) for x in parts]), shape, ("concat", keys))


def pad_rows(x, rows):
    """x [n, ...] with zero rows appended up to `rows`, Lazy if x is."""
    if isinstance(x, Lazy):
        return Lazy(lambda: pad_rows(x.read(), rows), (rows, *x.shape[1:]), (x.key, "pad", rows))
    out = np.zeros((rows, *x.shape[1:]), dtype=x.dtype)
    out[: x.shape[0]] = x
    return out


def rotary_from_hf(w, heads):
    """Rows of a q/k projection [heads * hd, ...] from rotate-half order (pair i = rows i, i + hd/2 of a head)
    to interleaved order (pair i = rows 2i, 2i + 1)."""
    if isinstance(w, Lazy):
        return Lazy(lambda: rotary_from_hf(w.read(), heads), w.shape, (w.key, "rotary", heads))
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rotary_to_hf(w, heads):
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def host(p):
    """A parameter's values on the host, float32 (float64 stays)."""
    return p.numpy().astype(np.float32) if p.dtype != "float64" else p.numpy()


def same_tied(tensors, name, shape, tied, what):
    """A tied head a checkpoint may still hold (some exporters write it) must equal the embedding `tied` (the
    checkpoint's; both Lazy: compared when read, which a sharded model does where the embedding is owned)."""
    if name not in tensors.t:
        return tied
    head = tensors.take(name, shape)

    def check(emb):
        if not np.array_equal(_now(head), emb):
            raise ValueError(f"{tensors.where}: {name} differs from the tied {what}")
        return emb

    if isinstance(tied, Lazy):
        return Lazy(lambda: check(tied.read()), tied.shape, (tied.key, "tied", getattr(head, "key", None)))
    check(tied)
    return tied
