"""A TensorBoard event-file writer for scalars, without dependencies.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, payload, masked CRC-32C of the
payload) whose payloads are `Event` protocol buffers; scalars are `Event{wall_time, step, summary{value{tag,
simple_value}}}`. Those few fields are encoded here by hand (and read back by `read_scalars`, for tests).
"""

import errno
import os
import socket
import struct
import time


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time, step, *, summary=None, file_version=None):
    out = b"\x09" + struct.pack("<d", wall_time)  # field 1, fixed64
    if step:
        out += b"\x10" + _varint(step)  # field 2, varint
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if summary is not None:
        out += _field_bytes(5, summary)
    return out


def _scalar_summary(tag, value):
    v = _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", value)  # tag; simple_value (fixed32)
    return _field_bytes(1, v)


class SummaryWriter:
    """add_scalar(tag, value, step) into <log_dir>/events.out.tfevents.<time>.<host>; flushes every write."""

    def __init__(self, log_dir):
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", log_dir)
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(log_dir, name)
        self._f = open(self.path, "xb")  # a new file: an entry of that name (a symlink, a FIFO) is not ours
        self._write(_event(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, payload):
        length = struct.pack("<Q", len(payload))
        self._f.write(length + struct.pack("<I", _masked(length)) + payload + struct.pack("<I", _masked(payload)))
        self._f.flush()

    def add_scalar(self, tag, value, step, wall_time=None):
        self._write(
            _event(time.time() if wall_time is None else wall_time, int(step), summary=_scalar_summary(tag, value))
        )

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None


def _read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf):
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 1:
            v, i = buf[i : i + 8], i + 8
        elif wire == 5:
            v, i = buf[i : i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i : i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, v


def read_scalars(path):
    """[(tag, step, value)] of an event file, checking every record's CRCs."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        length = data[i : i + 8]
        (n,) = struct.unpack("<Q", length)
        if struct.unpack("<I", data[i + 8 : i + 12])[0] != _masked(length):
            raise ValueError(f"{path}: bad length CRC at byte {i}")
        payload = data[i + 12 : i + 12 + n]
        if struct.unpack("<I", data[i + 12 + n : i + 16 + n])[0] != _masked(payload):
            raise ValueError(f"{path}: bad payload CRC at byte {i}")
        i += 16 + n
        step, summary = 0, None
        for number, v in _fields(payload):
            if number == 2:
                step = v
            elif number == 5:
                summary = v
        for number, value in _fields(summary or b""):
            if number != 1:
                continue
            tag, simple = None, None
            for k, v in _fields(value):
                if k == 1:
                    tag = v.decode()
                elif k == 2:
                    (simple,) = struct.unpack("<f", v)
            out.append((tag, step, simple))
    return out
