"""Batches on a device, copied ahead of their use.

DeviceLoader wraps a DataLoader (or any iterator of tuples of NumPy arrays).
On an accelerator it writes each batch into page-locked host buffers and
copies it with a non-blocking copy on a side stream, one batch ahead; the
stream that takes a batch waits for its copy (an event), and a host buffer is
refilled only once the copy that read it has completed. On the cpu batches are
plain tensors. Resuming works as with the wrapped loader: state_dict() counts
the batches handed out, not the one copied ahead.

Unlike the rest of infinitrain.data this module needs the native core.
"""

import numpy as np

from infinitrain import runtime
from infinitrain.tensor import Tensor, empty, from_numpy


class _Slot:
    """Pinned host buffers for one batch and the event of the copy that last read them."""

    def __init__(self, arrays, device):
        self.host = [empty(*a.shape, dtype=str(a.dtype), pin_memory=True) for a in arrays]
        self.event = runtime.Event(device)
        self.used = False


class DeviceLoader:
    def __init__(self, loader, device, depth=2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.loader = loader
        self.device = runtime.parse_device(device)
        self.depth = depth
        self.on_cpu = self.device == "cpu"
        self.copy_stream = None if self.on_cpu else runtime.Stream(self.device)
        self._slots = []
        self._turn = 0
        self._ahead = None  # (tensors, copy event, loader state before it) of the batch copied ahead

    def __iter__(self):
        return self

    def _copy(self, arrays):
        if self.on_cpu:
            return [from_numpy(a) for a in arrays], None
        if len(self._slots) < self.depth:
            self._slots.append(_Slot(arrays, self.device))
        slot = self._slots[self._turn % self.depth]
        self._turn += 1
        if slot.used:
            slot.event.synchronize()  # the copy that read these buffers has run
        out = []
        with runtime.stream(self.copy_stream):
            for buf, a in zip(slot.host, arrays, strict=True):
                if buf.shape != a.shape or buf.dtype != str(a.dtype):
                    raise ValueError(f"batch arrays changed shape or dtype: {a.dtype}{a.shape}, was {buf.dtype}")
                np.copyto(buf._t.host_array(), a)
                out.append(Tensor(buf._t.to(self.device, True)))
            slot.event.record(self.copy_stream)
        slot.used = True
        return out, slot.event

    def _fetch(self):
        """(tensors, copy event, the loader's state before this batch), or None at the end."""
        state = self.loader.state_dict() if hasattr(self.loader, "state_dict") else None
        try:
            arrays = [np.ascontiguousarray(a) for a in next(self.loader)]
        except StopIteration:
            return None
        return (*self._copy(arrays), state)

    def __next__(self):
        if self._ahead is None:
            self._ahead = self._fetch()
        if self._ahead is None:
            raise StopIteration
        tensors, event, _ = self._ahead
        if event is not None:
            runtime.current_stream(self.device).wait_event(event)
        self._ahead = self._fetch()  # the next batch's copy starts now, on the side stream
        return tuple(tensors)

    def state_dict(self):
        """The wrapped loader's state as of the batches handed out (not the one copied ahead)."""
        if self._ahead is not None:
            return self._ahead[2]
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self._ahead = None  # the batch copied ahead belongs to the old position
        self.loader.load_state_dict(state)
