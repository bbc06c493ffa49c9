"""DistributedDataParallel: data parallelism over a process group, PyTorch's shape.

    model = DistributedDataParallel(model)     # every rank: the same parameters (rank 0's, broadcast)
    loss = loss_fn(model(x), y)                # x: this rank's share of the global batch
    loss.backward()                            # gradients averaged across the ranks as backward runs
    with model.no_sync(): ...                  # micro-batches that only accumulate

Parameters are grouped into buckets of up to bucket_cap_mb, in reverse order of registration (about the order
backward produces their gradients), one dtype per bucket. When backward has accumulated the gradient of every
parameter of a bucket, the bucket's gradients are flattened and all-reduced (averaged) at once, while backward
goes on: cpu buckets on the group's collective thread, device buckets on a communication stream that waits for
the gradients. Buckets are reduced in bucket order on every rank, so ranks always agree on the sequence. At the
end of backward the averaged values are copied back into .grad. A parameter that got no gradient raises, unless
find_unused_parameters=True, which counts its gradient as zero in the average, and leaves none (.grad None) on a
parameter that no rank's backward reached.
"""

import contextlib

from infinitrain import autograd, functional, nn, runtime
from infinitrain.distributed.collectives import all_reduce, broadcast, reduce
from infinitrain.distributed.group import NON_GROUP_MEMBER, default_group
from infinitrain.tensor import tensor, zeros_like


class _Bucket:
    def __init__(self, params, owner=None):
        self.params = params
        self.owner = owner  # the group rank the gradients are reduced to (ZeRO-2), or None: all of them
        self.ready = set()
        self.flat = None
        self.work = None  # a Work (cpu) or the communication stream's Event (a device)


def _chunks(params, cap_bytes):
    out, cur, size = [], [], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if cur and (size + nbytes > cap_bytes or p.dtype != cur[0].dtype):
            out.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        out.append(cur)
    return out


class DistributedDataParallel(nn.Module):
    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=True,
        init_sync=True,
        process_group=None,
        bucket_cap_mb=25.0,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=False,
        static_graph=False,
        **kwargs,
    ):
        # dim, init_sync, check_reduction, gradient_as_bucket_view, static_graph and PyTorch's later options are
        # accepted: the parameters are always broadcast from rank 0, gradients live in their own tensors.
        if bucket_cap_mb is None:
            bucket_cap_mb = 25.0
        super().__init__()
        group = process_group if process_group is not None else default_group()
        if group is NON_GROUP_MEMBER:
            raise ValueError("DistributedDataParallel: this rank is not in the process group")
        if not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.module = module
        self.process_group = group
        self.find_unused_parameters = bool(find_unused_parameters)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("DistributedDataParallel: the module has no parameter that requires grad")
        devices = sorted({p.device for _, p in named})
        if len(devices) != 1:
            raise ValueError(f"DistributedDataParallel: one device per rank, the parameters are on {devices}")
        self.device = devices[0]
        self._names = {id(p): n for n, p in named}
        with autograd.no_grad():  # every rank starts from rank 0's parameters
            src = group.ranks[0]
            for _, p in named:
                broadcast(p, src, group)
            if broadcast_buffers:
                for _, b in module.named_buffers():
                    broadcast(b, src, group)
        self._cap = bucket_cap_mb * (1 << 20)
        self._order = [p for _, p in named]
        self._set_buckets([(c, None) for c in _chunks(self._order[::-1], self._cap)])
        self._stream = None if self.device.startswith("cpu") else runtime.Stream(self.device)
        self._sync = True
        self._pass = None  # the backward whose gradients are being reduced (autograd.current_backward())
        self._next = 0  # the next bucket to launch: buckets go in order on every rank
        self._reduced_to_owners = False  # ZeRO-2: this step's gradients went to their owners already
        for _, p in named:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _set_buckets(self, chunks):
        self._buckets = [_Bucket(c, owner) for c, owner in chunks]
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}

    def _shard_gradients(self, owner):
        """ZeRO-2 (ZeroRedundancyOptimizer): each gradient is reduced to the rank that owns its parameter
        (owner: id(param) -> group rank), and dropped on the others. Buckets then hold one owner's parameters;
        they go in the order backward should complete them (the latest registered parameters first)."""
        position = {id(p): i for i, p in enumerate(self._order)}
        chunks = []
        for r in range(self.process_group.size):
            mine = [p for p in self._order[::-1] if owner[id(p)] == r]
            chunks += [(c, r) for c in _chunks(mine, self._cap)]
        chunks.sort(key=lambda c: -min(position[id(p)] for p in c[0]))
        self._set_buckets(chunks)

    @property
    def require_backward_grad_sync(self):
        """PyTorch's switch for the same thing as no_sync(): False while micro-batches only accumulate."""
        return self._sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, on):
        self._sync = bool(on)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate gradients; the first one after reduces the sums."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ---- gradient reduction ----

    def _on_grad(self, p):
        if not self._sync:
            return
        current = autograd.current_backward()
        if self._pass is not current:  # the first gradient of this backward (an earlier one may have failed)
            if self._reduced_to_owners:
                raise RuntimeError(
                    "DistributedDataParallel with ZeRO-2: the gradients of this step were reduced to their owners "
                    "already; call the optimizer's step() first, and accumulate micro-batches under no_sync()"
                )
            self._pass = current
            self._next = 0
            for b in self._buckets:
                b.ready.clear()
                b.flat = b.work = None
            autograd.queue_callback(self._finish)
        b = self._bucket_of[id(p)]
        b.ready.add(id(p))
        self._launch_ready()

    def _launch_ready(self):
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if len(b.ready) != len(b.params):
                return
            self._launch(b)
            self._next += 1

    def _launch(self, b):
        flat = functional.cat([p.grad.reshape(-1) for p in b.params])
        group = self.process_group

        def reduce_flat(async_op=False):
            if b.owner is None:
                return all_reduce(flat, "avg", group, async_op=async_op)
            return reduce(flat, group.ranks[b.owner], "avg", group, async_op=async_op)

        if self._stream is None:
            b.work = reduce_flat(async_op=True)
        else:
            ready = runtime.Event(self.device)
            ready.record()
            self._stream.wait_event(ready)
            with runtime.stream(self._stream):
                reduce_flat()
                b.work = runtime.Event(self.device)
                b.work.record()
        b.flat = flat

    def _reduce_used_map(self, flags):
        """Starts the all-reduce (max) of which parameters got a gradient on this rank (flags, 1.0 or 0.0 each),
        after every bucket's: every rank runs it each backward, as every rank must; only a rank with an unused
        parameter waits for it."""
        used = tensor(flags, dtype="float32", device=self.device)
        if self._stream is None:
            return used, all_reduce(used, "max", self.process_group, async_op=True)
        written = runtime.Event(self.device)  # the upload runs on the current stream: the reduce waits for it
        written.record()
        self._stream.wait_event(written)
        with runtime.stream(self._stream):
            all_reduce(used, "max", self.process_group)
            done = runtime.Event(self.device)
            done.record()
        return used, done

    def _drop_globally_unused(self, used):
        """A parameter no rank's backward reached keeps no gradient, as without DDP (PyTorch's reducer does the
        same): a zero one would still be moved by the optimizer's momentum and weight decay."""
        flags, work = used
        if self._stream is None:
            work.wait()
        else:
            runtime.current_stream(self.device).wait_event(work)
        for p, u in zip(self._order, flags.numpy(), strict=True):
            if u == 0:
                p.grad = None

    def _finish(self):
        self._pass = None
        self._reduced_to_owners = any(b.owner is not None for b in self._buckets)
        waiting = {id(p) for b in self._buckets[self._next :] for p in b.params if id(p) not in b.ready}
        missing = [n for i, n in self._names.items() if i in waiting]  # in registration order
        # Which parameters got a gradient on this rank, taken before the unused ones get zeros.
        flags = [0.0 if id(p) in waiting and p.grad is None else 1.0 for p in self._order]
        if missing:
            if not self.find_unused_parameters:
                shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
                raise RuntimeError(
                    f"DistributedDataParallel: no gradient reached {shown} in this backward; pass "
                    "find_unused_parameters=True to count them as zero (every rank must reduce every bucket)"
                )
            for b in self._buckets[self._next :]:
                for p in b.params:
                    if id(p) not in b.ready:
                        if p.grad is None:
                            p.grad = zeros_like(p)
                        b.ready.add(id(p))
            self._launch_ready()
        used = self._reduce_used_map(flags) if self.find_unused_parameters else None
        current = None if self._stream is None else runtime.current_stream(self.device)
        for b in self._buckets:
            if current is None:
                b.work.wait()
            else:
                current.wait_event(b.work)
            if b.owner is None or b.owner == self.process_group.rank:
                parts = functional.split(b.flat, [p.numel() for p in b.params])
                for p, part in zip(b.params, parts, strict=True):
                    p.grad.copy_(part.reshape(p.shape))
            else:
                for p in b.params:
                    p.grad = None  # its owner steps it
            b.flat = b.work = None
        if missing:  # a parameter unused on every rank was unused on this one
            self._drop_globally_unused(used)
