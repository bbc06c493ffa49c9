"""Checkpoint files: crash-safe writes, checksummed tensor files, and llm.c model files.

Pure NumPy + stdlib so it imports without the C++ extension.

Checkpoints are safetensors files (format 2), which other tools read as they are:
    0   uint64 little-endian N, the JSON header's length
    8   N bytes of JSON, padded with spaces to a multiple of 8:
        {"__metadata__": {"format": "pt", "infinitrain.format": "2", "infinitrain.meta": <meta as JSON text>,
                          "infinitrain.sha256": <hex digest>},
         <name>: {"dtype": "F32" | "BF16" | ..., "shape": [...], "data_offsets": [begin, end]}, ...}
    8+N the tensors' bytes, back to back in header order
The digest is SHA-256 over the header's canonical JSON without the digest (sorted keys, no spaces), a newline
and the data section, so any change to names, shapes, meta or data is caught. The header lists the tensors
in the order they were given, which is the order load() returns them in.

Format 1, the container written before, still loads (read-only):
    0   b"INFTCKPT"
    8   uint32 format version (1)
    12  uint32 reserved (0)
    16  uint64 JSON header length H
    24  uint64 data section length D
    32  JSON header (utf-8): {"meta": ..., "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}
        zero padding up to a multiple of 64: the data section starts there (offsets are relative to it,
        each a multiple of 64)
    ... D bytes of tensor data
    ... 32-byte SHA-256 of every byte before it
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Callable

import numpy as np

MAGIC = b"INFTCKPT"
VERSION = 1
ALIGN = 64
_PREFIX = struct.Struct("<8sIIQQ")
_DIGEST_BYTES = 32

# numpy dtype strings allowed in the container; uint16 carries bf16 bit patterns.
SUPPORTED_DTYPES = ("<f4", "<f8", "<f2", "<i8", "<i4", "<u2", "|u1", "|b1")

# llm.c model files.
LLMC_HEADER_WORDS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_WORDS * 4
LLMC_MAGIC_GPT2 = 20240326
LLMC_MAGIC_LLAMA3 = 20240803
LLMC_VERSION_FP32 = 3
LLMC_VERSION_BF16 = 5
_LLMC_MAGIC_NAMES = {LLMC_MAGIC_GPT2: "GPT-2", LLMC_MAGIC_LLAMA3: "LLaMA 3"}


def file_kind(st_mode: int) -> str:
    """What a stat mode describes, in words ("regular file", "directory", "FIFO", ...)."""
    for test, name in (
        (stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
    ):  # fmt: skip
        if test(st_mode):
            return name
    return "special file"


def path_kind(path) -> str | None:
    """What `path` is, symlinks followed (file_kind's words), or None when nothing is there or it cannot be
    reached (the open that follows says which)."""
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return None


def atomic_write(path: str | os.PathLike, write_fn: Callable) -> None:
    """Calls write_fn(binary file) on a temp file beside `path`, then fsyncs and renames it over `path`.

    A crash or exception before the rename leaves any previous `path` untouched and removes the temp file.
    A symlink is written through: the file it names is replaced and the link kept. A target that is not a
    regular file (a directory, device node, FIFO or socket) is refused with an OSError, never replaced.
    """
    path = os.fspath(path)
    target = os.path.realpath(path)  # a symlink (or a symlinked folder) names the file to replace
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
        raise OSError(code, f"is a {kind}, not a regular file; refusing to replace it", path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".", suffix=".tmp")
    try:
        # mkstemp makes 0600 files; keep an existing file's mode, else use the usual 0644.
        os.fchmod(fd, st.st_mode & 0o7777 if st is not None else 0o644)
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    # Persist the rename itself; some platforms cannot fsync a directory.
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _json_default(value):
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"checkpoint meta must be JSON-serializable; got {type(value).__name__}")


def _le_array(name: str, value) -> np.ndarray:
    arr = np.asarray(value)
    dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    if dtype.str not in SUPPORTED_DTYPES:
        raise ValueError(f"tensor {name!r}: dtype {arr.dtype} is not supported; use one of {list(SUPPORTED_DTYPES)}")
    return np.asarray(arr, dtype=dtype, order="C")  # ascontiguousarray would make 0-d arrays 1-d


# safetensors dtype names of the NumPy dtypes a checkpoint holds; BF16 is carried as uint16 bit patterns.
_TO_ST = {"<f4": "F32", "<f8": "F64", "<f2": "F16", "<i8": "I64", "<i4": "I32", "<i2": "I16", "|u1": "U8"}
_TO_ST.update({"|i1": "I8", "|b1": "BOOL", "<u2": "U16"})
_FROM_ST = {v: k for k, v in _TO_ST.items()}
_FROM_ST["BF16"] = "<u2"
FORMAT = "2"
_MAX_HEADER = 1 << 30


def _canonical(header: dict) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def save(path: str | os.PathLike, tensors: dict, meta: dict | None = None, bf16=()) -> None:
    """Writes tensors (name -> array) and JSON-serializable meta to `path` atomically as a checksummed
    safetensors file. Names in `bf16` are uint16 arrays of bfloat16 bit patterns, stored as BF16."""
    arrays, header, offset = [], {}, 0
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
        if name == "__metadata__":
            raise ValueError("'__metadata__' is not a tensor name (safetensors reserves it)")
        arr = _le_array(name, value)
        st = _TO_ST.get(arr.dtype.str)
        if st is None:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} is not supported; use one of {list(_TO_ST)}")
        if name in bf16:
            if st != "U16":
                raise ValueError(f"tensor {name!r}: bfloat16 bits must be a uint16 array, got {arr.dtype}")
            st = "BF16"
        header[name] = {"dtype": st, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        arrays.append(arr)
        offset += arr.nbytes
    meta_text = json.dumps({} if meta is None else meta, default=_json_default, allow_nan=True)
    md = {"format": "pt", "infinitrain.format": FORMAT, "infinitrain.meta": meta_text}
    header = {"__metadata__": md, **header}  # the file keeps the tensors' order; the digest sorts keys
    digest = hashlib.sha256(_canonical(header) + b"\n")
    for arr in arrays:
        digest.update(memoryview(arr.reshape(-1).view(np.uint8)))
    md["infinitrain.sha256"] = digest.hexdigest()
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    body += b" " * (-len(body) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(body)))
        f.write(body)
        for arr in arrays:
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))

    atomic_write(path, write)


def _save_v1(path: str | os.PathLike, tensors: dict, meta: dict | None = None) -> None:
    """Writes format 1 (the container before safetensors); kept so that its reader stays tested."""
    arrays = []
    entries = []
    offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
        arr = _le_array(name, value)
        offset = _align(offset)
        entries.append(
            {"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset, "nbytes": arr.nbytes}
        )
        arrays.append((offset, arr))
        offset += arr.nbytes
    data_size = offset
    header = json.dumps(
        {"meta": {} if meta is None else meta, "tensors": entries}, default=_json_default, allow_nan=True
    ).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, VERSION, 0, len(header), data_size)
    data_start = _align(len(prefix) + len(header))

    def write(f):
        digest = hashlib.sha256()

        def put(b):
            digest.update(b)
            f.write(b)

        put(prefix)
        put(header)
        put(bytes(data_start - len(prefix) - len(header)))
        pos = 0
        for off, arr in arrays:
            put(bytes(off - pos))
            put(memoryview(arr.reshape(-1).view(np.uint8)))
            pos = off + arr.nbytes
        f.write(digest.digest())

    atomic_write(path, write)


def _corrupt(path: str, why: str) -> ValueError:
    return ValueError(f"{path}: checkpoint is corrupt: {why}")


def _truncated(path: str, why: str) -> ValueError:
    return ValueError(f"{path}: checkpoint is truncated: {why}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read(path) -> tuple[str, bytearray]:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not a checkpoint")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        if f.readinto(buf) != size:
            raise _truncated(path, "file shrank while reading")
    return path, buf


def load(path: str | os.PathLike, require_checksum: bool = True) -> tuple[dict, dict]:
    """Reads a checkpoint written by save() (or format 1); returns (tensors, meta) after verifying structure and
    checksum. bfloat16 tensors arrive as uint16 bit patterns. require_checksum=False also reads safetensors
    files written elsewhere (meta then {})."""
    tensors, meta, _ = load_with_dtypes(*_read(path), require_checksum)
    return tensors, meta


def load_with_dtypes(path: str, buf: bytearray, require_checksum: bool = True) -> tuple[dict, dict, dict]:
    """load() of a file's bytes, plus name -> safetensors dtype ('BF16' marks uint16 bit patterns)."""
    if buf[:1] == MAGIC[:1] and len(buf) < 8 or buf[:8] == MAGIC:
        tensors, meta = _load_v1(path, buf)
        return tensors, meta, {k: ("BF16" if v.dtype.str == "<u2" else _TO_ST[v.dtype.str]) for k, v in tensors.items()}
    size = len(buf)
    if size < 8:
        raise _truncated(path, f"{size} bytes is shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", buf)
    if n > _MAX_HEADER or n < 2:
        raise _corrupt(path, f"not a safetensors or infinitrain checkpoint (header length {n})")
    if n > size - 8:
        raise _truncated(path, f"the header length says {n} bytes, the file has {size - 8} after it")
    if buf[8:9] != b"{":
        raise _corrupt(path, "not a safetensors or infinitrain checkpoint (the header is not a JSON object)")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _corrupt(path, f"unreadable JSON header ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the JSON header is not an object")
    md = header.get("__metadata__", {})
    if not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values()):
        raise _corrupt(path, "__metadata__ must map strings to strings")
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            st, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise _corrupt(path, f"bad tensor entry {name!r}: {str(entry)[:200]} ({type(e).__name__})") from None
        if not isinstance(st, str) or st not in _FROM_ST:
            raise _corrupt(path, f"tensor {name!r} has unsupported dtype {str(st)[:40]!r}")
        if not isinstance(shape, list) or not all(_is_int(v) for v in (*shape, begin, end)):
            raise _corrupt(path, f"tensor {name!r}: shape and data_offsets must be integers, got {str(entry)[:200]}")
        if len(shape) > 32:
            raise _corrupt(path, f"tensor {name!r} has {len(shape)} dimensions (at most 32)")
        dtype = np.dtype(_FROM_ST[st])
        if any(d < 0 for d in shape) or begin < 0 or math.prod(shape) * dtype.itemsize != end - begin:
            raise _corrupt(path, f"tensor {name!r}: shape {shape} of {st} does not fit data_offsets [{begin}, {end}]")
        entries.append((begin, end, name, st, dtype, tuple(shape)))
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    for begin, end, name, *_ in entries:
        if begin != pos:
            raise _corrupt(path, f"tensor {name!r} starts at {begin}, expected {pos} (gaps or overlaps)")
        pos = end
    data_start = 8 + n
    data_size = size - data_start
    if data_size < pos:
        raise _truncated(path, f"the tensors need {pos} bytes of data, found {data_size}")
    if data_size > pos:
        raise _corrupt(path, f"the tensors need {pos} bytes of data, found {data_size} ({data_size - pos} extra)")
    view = memoryview(buf)
    digest = md.get("infinitrain.sha256")
    if digest is not None:
        rest = dict(header, __metadata__={k: v for k, v in md.items() if k != "infinitrain.sha256"})
        h = hashlib.sha256(_canonical(rest) + b"\n")
        h.update(view[data_start:])
        if h.hexdigest() != digest:
            raise _corrupt(path, "SHA-256 checksum mismatch (contents were altered or damaged)")
    elif require_checksum:
        raise _corrupt(path, "no infinitrain.sha256 in its metadata (not written by infinitrain.checkpoint.save)")
    try:
        meta = json.loads(md.get("infinitrain.meta", "{}"))
    except (json.JSONDecodeError, RecursionError) as e:
        raise _corrupt(path, f"unreadable meta ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(meta, dict):
        raise _corrupt(path, "its meta must be a JSON object")
    tensors, dtypes = {}, {}
    order = {name: i for i, name in enumerate(header)}
    for begin, end, name, st, dtype, shape in sorted(entries, key=lambda e: order[e[2]]):
        count = (end - begin) // dtype.itemsize
        # Views into one writable buffer: no second copy of the weights.
        tensors[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=data_start + begin).reshape(shape)
        dtypes[name] = st
    return tensors, meta, dtypes


def _load_v1(path: str, buf: bytearray) -> tuple[dict, dict]:
    size = len(buf)
    if buf[: len(MAGIC)] != MAGIC[: min(size, len(MAGIC))]:
        raise _corrupt(
            path, f"bad magic {bytes(buf[: len(MAGIC)])!r}, expected {MAGIC!r} (not an infinitrain checkpoint?)"
        )
    if size < _PREFIX.size:
        raise _truncated(path, f"{size} bytes is shorter than the {_PREFIX.size}-byte fixed header")
    _, version, _, header_len, data_size = _PREFIX.unpack_from(buf)
    if version != VERSION:
        raise _corrupt(path, f"unsupported format version {version}, expected {VERSION}")
    data_start = _align(_PREFIX.size + header_len)
    expected = data_start + data_size + _DIGEST_BYTES
    if size < expected:
        raise _truncated(path, f"expected {expected} bytes from its header, found {size}")
    if size > expected:
        raise _corrupt(path, f"expected {expected} bytes from its header, found {size} ({size - expected} extra)")
    view = memoryview(buf)
    if hashlib.sha256(view[:-_DIGEST_BYTES]).digest() != bytes(view[-_DIGEST_BYTES:]):
        raise _corrupt(path, "SHA-256 checksum mismatch (contents were altered or damaged)")
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + header_len]).decode("utf-8"))
        meta, entries = header["meta"], header["tensors"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
        raise _corrupt(path, f"unreadable JSON header ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(meta, dict) or not isinstance(entries, list):
        raise _corrupt(path, "the JSON header's meta must be an object and its tensors a list")
    tensors = {}
    for entry in entries:
        try:
            name, dtype_str = entry["name"], entry["dtype"]
            shape, offset, nbytes = entry["shape"], entry["offset"], entry["nbytes"]
        except (KeyError, TypeError) as e:
            raise _corrupt(path, f"bad tensor entry {str(entry)[:200]} (missing {e})") from None
        # Exact ints only: int() would turn a shape of 2.5 into 2 and accept it.
        if not isinstance(name, str) or not isinstance(dtype_str, str) or not isinstance(shape, list):
            raise _corrupt(path, f"bad tensor entry {str(entry)[:200]} (name, dtype and shape must be str, str, list)")
        if not all(_is_int(v) for v in (*shape, offset, nbytes)):
            raise _corrupt(path, f"tensor {name!r}: shape, offset and nbytes must be integers, got {str(entry)[:200]}")
        shape = tuple(shape)
        if len(shape) > 32:
            raise _corrupt(path, f"tensor {name!r} has {len(shape)} dimensions (at most 32)")
        if offset % ALIGN:
            raise _corrupt(path, f"tensor {name!r}: offset {offset} is not a multiple of {ALIGN}")
        if dtype_str not in SUPPORTED_DTYPES:
            raise _corrupt(path, f"tensor {name!r} has unsupported dtype {dtype_str!r}")
        if name in tensors:
            raise _corrupt(path, f"tensor {name!r} appears twice")
        dtype = np.dtype(dtype_str)
        if any(d < 0 for d in shape) or math.prod(shape) * dtype.itemsize != nbytes:
            raise _corrupt(path, f"tensor {name!r}: shape {list(shape)} of {dtype_str} does not make {nbytes} bytes")
        if offset < 0 or offset + nbytes > data_size:
            raise _corrupt(path, f"tensor {name!r}: bytes [{offset}, {offset + nbytes}) overrun the data section")
        count = nbytes // dtype.itemsize
        # Views into one writable buffer: no second copy of the weights.
        tensors[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=data_start + offset).reshape(shape)
    return tensors, meta


# ---- bf16 helpers -------------------------------------------------------------------------------------------


def float32_to_bf16_bits(x) -> np.ndarray:
    """Rounds float32 values to bfloat16 (round-to-nearest-even) and returns the bits as uint16."""
    bits = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    # Rounding can carry a NaN's payload into infinity; keep NaNs quiet NaNs.
    return np.where(np.isnan(bits.view(np.float32)), np.uint16(0x7FC0), rounded)


def bf16_bits_to_float32(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- llm.c model files --------------------------------------------------------------------------------------


def _dtype_kind(dtype) -> str:
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return "bf16"
    if np.dtype(dtype) == np.float32:
        return "f32"
    raise ValueError(f"llm.c model dtype must be float32 or 'bfloat16', got {dtype!r}")


def _header_bits(header_words, n_words=LLMC_HEADER_WORDS) -> np.ndarray:
    words = list(header_words)
    if len(words) > n_words:
        raise ValueError(f"llm.c header holds {n_words} words, got {len(words)}")
    header = np.zeros(n_words, dtype="<u4")
    for i, w in enumerate(words):
        if isinstance(w, (float, np.floating)):
            header[i] = np.array([w], dtype="<f4").view("<u4")[0]
        else:
            w = int(w)
            if not -(2**31) <= w < 2**32:
                raise ValueError(f"llm.c header word {i} = {w} does not fit 32 bits")
            header[i] = w & 0xFFFFFFFF
    return header


def write_llmc_model(path: str | os.PathLike, header_words, params, dtype=np.float32, header_size_words=None) -> None:
    """Writes an llm.c model file: the header (int32 words, floats as float32 bits), then all params in order.

    dtype: np.float32, or "bfloat16" for llm.c's bf16 files. The header (magic, version, config) is the
    caller's; nothing is filled in here. header_size_words: 256 (default) or 512 (llm.c's LLaMA 3 layout:
    256 int32 words, then 256 float32 words).
    """
    kind = _dtype_kind(dtype)
    n_words = header_size_words or LLMC_HEADER_WORDS
    if n_words not in (LLMC_HEADER_WORDS, 2 * LLMC_HEADER_WORDS):
        raise ValueError(f"header_size_words must be 256 or 512, got {n_words}")
    header = _header_bits(header_words, n_words)
    flat = [np.ascontiguousarray(p, dtype=np.float32).reshape(-1) for p in params]

    def write(f):
        f.write(header.tobytes())
        for p in flat:
            f.write(p.astype("<f4").tobytes() if kind == "f32" else float32_to_bf16_bits(p).astype("<u2").tobytes())

    atomic_write(path, write)


def _magic_name(magic: int) -> str:
    name = _LLMC_MAGIC_NAMES.get(magic)
    return f"{magic} ({name})" if name else str(magic)


def _read_exactly(f, n: int, path: str, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError(f"{path}: truncated while reading {what}: expected {n} bytes, got {len(data)} (file changed?)")
    return data


def read_into(path: str, offset: int, out: np.ndarray, what: str, identity=None) -> np.ndarray:
    """Fills the contiguous array `out` with the file's bytes from `offset` (seek + read: no more memory than
    `out`). identity: the file's (device, inode, size, mtime) when its header was read; a file replaced or
    rewritten since is an error, as is one that ends early."""
    view, got = memoryview(out).cast("B"), 0
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if identity is not None and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != identity:
                raise ValueError(f"{path}: the file changed after its header was read; load it again")
            f.seek(offset)
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    if got != len(view):
        raise ValueError(
            f"{path}: truncated while reading {what}: expected {len(view)} bytes, got {got} (file changed?)"
        )
    return out


_FINGERPRINTS = {}


def fingerprint(path: str) -> str:
    """A digest of a file's size and its first and last 64 KiB: the same on every node's copy of one checkpoint,
    different for two checkpoints of the same shapes (their values differ there). Cached per path and identity."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256(str(st.st_size).encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 16))
            f.seek(max(0, st.st_size - (1 << 16)))
            h.update(f.read(1 << 16))
        _FINGERPRINTS[key] = h.hexdigest()[:16]
    return _FINGERPRINTS[key]


def file_identity(f) -> tuple:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class LlmcParams:
    """An llm.c file's parameters as one flat float32 vector, read by offset: flat[a:b] reads just those values
    from the file (bf16 widened), so a loader holds one tensor at a time besides its model; np.asarray(flat)
    reads them all."""

    dtype = np.dtype(np.float32)
    ndim = 1

    def __init__(self, path: str, offset: int, count: int, kind: str, identity: tuple):
        self.path, self.offset, self.size, self.kind, self.identity = path, offset, count, kind, identity
        self.shape = (count,)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError(f"llm.c parameters are read by slices, got {key!r}")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("llm.c parameters are read by contiguous slices")
        return self._read(start, max(start, stop))

    def _read(self, start: int, stop: int) -> np.ndarray:
        f32 = self.kind == "f32"
        raw = np.empty(stop - start, dtype="<f4" if f32 else "<u2")
        what = f"parameters {start}..{stop}"
        read_into(self.path, self.offset + start * raw.itemsize, raw, what, self.identity)
        return raw.astype(np.float32, copy=False) if f32 else bf16_bits_to_float32(raw)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        flat = self._read(0, self.size)
        return flat if dtype is None else flat.astype(dtype, copy=False)


def read_llmc_model(
    path: str | os.PathLike, expected_magic: int, count_fn: Callable, dtype=None, header_words_fn=None
) -> tuple[np.ndarray, LlmcParams]:
    """Reads an llm.c model file's header; returns (header as int32 words, the params as one flat float32 vector
    read by offset: an LlmcParams, whose slices are read from the file when taken).

    count_fn(header) gives the number of parameters the header implies; the file must hold exactly that many,
    checked against the file's size before any parameter is read (so a header cannot make a loader read or
    allocate more than the file holds). A ValueError it raises (an invalid config field) is reported with the
    file's name. dtype: None infers it from header[1] (3: float32, 5: bf16); otherwise np.float32 or "bfloat16".
    header_words_fn(first 256 words): the header's length in words (256 or 512), for formats with two layouts.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not an llm.c model file")
    name = _LLMC_MAGIC_NAMES.get(expected_magic, "llm.c")
    with open(path, "rb") as f:
        identity = file_identity(f)
        size = identity[2]
        if size < LLMC_HEADER_BYTES:
            raise ValueError(
                f"{path}: truncated llm.c model file: {size} bytes is shorter than the {LLMC_HEADER_BYTES}-byte header"
            )
        header = np.frombuffer(_read_exactly(f, LLMC_HEADER_BYTES, path, "the header"), dtype="<i4").astype(np.int32)
        magic = int(header[0])
        if magic != expected_magic:
            raise ValueError(f"{path}: expected magic {_magic_name(expected_magic)}, got {_magic_name(magic)}")
        n_words = LLMC_HEADER_WORDS if header_words_fn is None else int(header_words_fn(header))
        header_bytes = n_words * 4
        if n_words > LLMC_HEADER_WORDS:
            if size < header_bytes:
                raise ValueError(
                    f"{path}: truncated llm.c model file: {size} bytes is shorter than its {header_bytes}-byte header"
                )
            rest = _read_exactly(f, header_bytes - LLMC_HEADER_BYTES, path, "the header")
            header = np.concatenate([header, np.frombuffer(rest, dtype="<i4").astype(np.int32)])
        if dtype is None:
            version = int(header[1])
            if version == LLMC_VERSION_FP32:
                kind = "f32"
            elif version == LLMC_VERSION_BF16:
                kind = "bf16"
            else:
                raise ValueError(
                    f"{path}: unknown llm.c model version {version} in header field version; expected "
                    f"{LLMC_VERSION_FP32} (float32) or {LLMC_VERSION_BF16} (bf16), or pass dtype"
                )
        else:
            kind = _dtype_kind(dtype)
        itemsize = 4 if kind == "f32" else 2
        try:
            count = int(count_fn(header))
        except (ValueError, ArithmeticError) as e:
            raise ValueError(f"{path}: invalid {name} model header: {e}") from None
        if count < 0:
            raise ValueError(f"{path}: count_fn gave a negative parameter count {count}")
        expected = count * itemsize
        found = size - header_bytes
        if found < expected:
            raise ValueError(
                f"{path}: truncated: the header implies {count} parameters ({expected} bytes), found {found} bytes"
            )
        if found > expected:
            raise ValueError(
                f"{path}: the header implies {count} parameters ({expected} bytes), found {found} bytes "
                f"({found - expected} extra; wrong config or dtype?)"
            )
    return header, LlmcParams(path, header_bytes, count, kind, identity)


def header_float(header, i: int) -> float:
    """Reinterprets int32 header slot i as the float32 stored in it."""
    return float(np.asarray(header, dtype=np.int32)[i : i + 1].view(np.float32)[0])
