"""Communicators: collectives on the device type's collective library (CCL), rank by rank.

This is the layer under process groups (infinitrain.distributed): a communicator is one rank's member of one
group on one device. Two ways to make them:

    comms = comm.init_all(["sim:0", "sim:1"])     # one process, many devices
    uid = comm.unique_id("sim")                    # one device per rank:
    c = comm.init_rank(uid, nranks, rank, dev)     # every rank passes the same uid

A collective is enqueued on the calling thread's current stream of the
communicator's device (see `runtime.stream`) and completes asynchronously;
reading a result (`.numpy()`) or `runtime.synchronize` waits for it. Errors
found while it runs (ranks that disagree, timeouts) surface at the next
synchronisation of the device and in `comm.async_error()`.

Every rank must issue the same collectives in the same order. Issuing them for
several devices from one thread is fine (wrap them in `group()` for portability
with NCCL-like libraries, where such calls may otherwise wait on each other).
Collectives do not record autograd history.
"""

import contextlib
import operator

from infinitrain import _C
from infinitrain.tensor import Tensor, empty

Communicator = _C.Communicator
OPS = ("sum", "avg", "max", "min", "prod")


def init_all(devices):
    """Communicators for `devices` (rank i on devices[i]), all in this process."""
    devices = [_C.parse_device(d) for d in devices]
    if not devices:
        raise ValueError("init_all: expected at least one device")
    if len(set(devices)) != len(devices):
        raise ValueError(f"init_all: devices must be distinct, got {devices}")
    return _C.ccl_init_all(devices)


def unique_id(device_type):
    """128 opaque bytes naming a new group; hand them to every rank's init_rank."""
    return _C.ccl_unique_id(device_type)


def init_rank(uid, nranks, rank, device):
    """This rank's communicator in the group `uid`; blocks until all nranks ranks joined."""
    if not isinstance(uid, bytes):
        raise ValueError(f"init_rank: uid must be the bytes from unique_id(), got {type(uid).__name__}")
    if not 0 <= rank < nranks:
        raise ValueError(f"init_rank: need 0 <= rank < nranks, got rank {rank} of {nranks}")
    return _C.ccl_init_rank(uid, nranks, rank, _C.parse_device(device))


def has_ccl(device_type):
    """Whether the device type has a collective library."""
    return _C.has_ccl(device_type)


@contextlib.contextmanager
def group(device_type=None):
    """Groups the collectives issued inside (group start/end of the CCL; the registered provider's by default)."""
    if device_type is None:
        info = _C.privateuse1()
        if info is None:
            raise ValueError("group(): no provider is registered; pass the device type")
        device_type = info["name"]
    _C.ccl_group_start(device_type)
    try:
        yield
    finally:
        _C.ccl_group_end(device_type)


def _check(comm, tensor, what, op=None):
    if not isinstance(comm, Communicator):
        raise ValueError(f"{what}: expected a Communicator, got {type(comm).__name__}")
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{what}: expected an infinitrain Tensor, got {type(tensor).__name__}")
    if tensor.device != comm.device:
        raise ValueError(f"{what}: tensor is on {tensor.device}, the communicator (rank {comm.rank}) on {comm.device}")
    if op is not None:
        if op not in OPS:
            raise ValueError(f"{what}: unknown reduce op {op!r}: expected one of {', '.join(OPS)}")
        if tensor.dtype == "bool":
            raise ValueError(f"{what}: cannot reduce a bool tensor")


def _check_rank(comm, r, what, name):
    try:
        r = operator.index(r)
    except TypeError:
        raise ValueError(f"{what}: {name} must be an int rank, got {r!r}") from None
    if not 0 <= r < comm.size:
        raise ValueError(f"{what}: {name} {r} out of range for a group of {comm.size}")
    return r


def all_reduce(comm, tensor, op="sum"):
    """Reduces `tensor` across ranks, in place on every rank; returns it."""
    _check(comm, tensor, "all_reduce", op)
    comm.all_reduce(tensor._t, tensor._t, op)
    return tensor


def broadcast(comm, tensor, root):
    """Copies root's `tensor` into every rank's `tensor` (same shape and dtype); returns it."""
    _check(comm, tensor, "broadcast")
    root = _check_rank(comm, root, "broadcast", "root")
    comm.broadcast(tensor._t, tensor._t, root)
    return tensor


def reduce(comm, tensor, op="sum", root=0):
    """Reduces `tensor` across ranks into root's `tensor` (other ranks' stay unchanged); returns it."""
    _check(comm, tensor, "reduce", op)
    root = _check_rank(comm, root, "reduce", "root")
    comm.reduce(tensor._t, tensor._t, op, root)
    return tensor


def all_gather(comm, tensor):
    """A new tensor of shape (size, *tensor.shape): rank r's `tensor` at index r."""
    _check(comm, tensor, "all_gather")
    out = empty((comm.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    comm.all_gather(tensor._t, out._t)
    return out


def reduce_scatter(comm, tensor, op="sum"):
    """Reduces `tensor` across ranks and returns this rank's block of its first dim (size blocks)."""
    _check(comm, tensor, "reduce_scatter", op)
    if tensor.ndim == 0 or tensor.shape[0] % comm.size:
        raise ValueError(
            f"reduce_scatter: the first dim of shape {tensor.shape} must be divisible by the group size {comm.size}"
        )
    out = empty((tensor.shape[0] // comm.size, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    comm.reduce_scatter(tensor._t, out._t, op)
    return out


def send(comm, tensor, peer):
    """Sends `tensor` to rank `peer`, whose matching recv takes the same numel and dtype."""
    _check(comm, tensor, "send")
    peer = _check_rank(comm, peer, "send", "peer")
    comm.send(tensor._t, peer)


def recv(comm, tensor, peer):
    """Receives rank `peer`'s matching send into `tensor`, in place; returns it."""
    _check(comm, tensor, "recv")
    peer = _check_rank(comm, peer, "recv", "peer")
    comm.recv(tensor._t, peer)
    return tensor
