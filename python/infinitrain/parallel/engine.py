"""One training step of a ParallelModel: the pipeline schedule over the micro-batches, then the gradients made
whole (sequence-parallel parameters summed over the tensor group, the tied embedding over its two stages,
everything averaged over the data-parallel group), the global gradient norm clipped, the optimizer stepped.

    engine = Engine(model, grid)
    loss = engine.forward_backward(micro_batches)     # [(ids, targets)] of this data-parallel rank's rows
    norm = engine.finish_gradients(max_norm=1.0)      # the norm of the whole model's gradient, before clipping
    optimizer.step()

Each micro-batch's loss is scaled by 1 / micro-batches, as gradient accumulation on one device does, so the
step equals the single-device step on the global batch.

Activations and their gradients go stage to stage over the grid's channels (one two-rank group per kind and
direction). A send returns at once: the cpu's CCL buffers it, and a device's goes on a stream of its own per
channel (a device CCL's send waits there for the receive); the step ends by waiting for the receivers to have
taken every send. `stats` after a step: the most micro-batch chunks whose activations were held at once,
and the peak memory the step allocated above what it started with.
"""

import math

from infinitrain import autograd, runtime
from infinitrain import functional as F
from infinitrain.distributed.collectives import all_reduce, recv, send
from infinitrain.distributed.group import flush_sends
from infinitrain.optim import optimizers as _optim
from infinitrain.parallel.schedules import schedule
from infinitrain.tensor import empty, tensor, zeros


def _flat_all_reduce(tensors, op, group):
    """All-reduces tensors in place as one flat tensor per dtype."""
    if group is None or group.size == 1 or not tensors:
        return
    for dtype in sorted({t.dtype for t in tensors}):
        ts = [t for t in tensors if t.dtype == dtype]
        flat = F.cat([t.reshape(-1) for t in ts])
        all_reduce(flat, op, group)
        for t, part in zip(ts, F.split(flat, [t.numel() for t in ts]), strict=True):
            t.copy_(part.reshape(t.shape))


class Engine:
    def __init__(self, model, grid=None, schedule_name=None):
        self.model, self.grid = model, grid
        self.layout = model.layout
        self.schedule_name = schedule_name or self.layout.schedule
        self.params = list(model.shard_parameters())
        self.specs = model.specs()
        self.device = self.params[0][1].device
        self.dtype = self.params[0][1].dtype
        self.stats = {}
        self._send_streams, self._in_flight = {}, []  # a device's sends: a stream per channel, and those in flight

    @property
    def stage(self):
        return self.grid.stage if self.grid is not None else 0

    def _act_shape(self, x):
        B, T = x.shape
        if self.layout.sp:
            T //= self.layout.tp
        return (B, T, self.model.config.n_embd)

    def _recv(self, kind, from_stage, shape):
        g, peer = self.grid.recv_channel(kind, from_stage)
        t = empty(shape, dtype=self.dtype, device=self.device)
        recv(t, peer, g)
        return t

    def _send(self, kind, to_stage, t):
        g, peer = self.grid.send_channel(kind, to_stage)
        t = t if t.dtype == self.dtype else t.to(self.dtype)
        if self.device.startswith("cpu"):
            send(t, peer, g)  # Gloo buffers it: it returns at once
            return
        # A device CCL's send waits on its stream for the peer's receive (NCCL's rendezvous). On the compute stream
        # it would hold up this stage's next receive, and two stages sending to each other would wait forever
        # (1F1B's steady state does that). On a stream of its own per channel it waits alone, as a buffered send:
        # the schedules are checked deadlock-free under that model (schedules.simulate).
        stream = self._send_streams.get((kind, to_stage))
        if stream is None:
            stream = self._send_streams[(kind, to_stage)] = runtime.Stream(self.device)
        ready = runtime.Event(self.device)
        ready.record()
        stream.wait_event(ready)
        with runtime.stream(stream):
            send(t, peer, g)
            done = runtime.Event(self.device)
            done.record()
        self._in_flight = [(x, e) for x, e in self._in_flight if not e.query()]  # sent: their memory may go
        self._in_flight.append((t, done))

    def _drain_sends(self):
        """The compute stream waits for every send of the step (their tensors are freed after)."""
        current = runtime.current_stream(self.device)
        for _, done in self._in_flight:
            current.wait_event(done)
        self._in_flight = []

    def forward_backward(self, micro_batches, forward_only=False):
        """Runs the schedule; returns the mean loss over the micro-batches (on every rank of the pipeline: the
        last stage's, summed over the pipeline group) as a 0-d float32 tensor, averaged over data parallelism."""
        L, chunks = self.layout, self.model.chunks
        pp, stage, n_mb = L.pp, self.stage, len(micro_batches)
        last_v = L.chunks - 1
        ops = schedule(self.schedule_name, pp, L.vpp, stage, n_mb)
        if forward_only:
            ops = [op for op in ops if op[0] == "F"]
        scale = 1.0 / n_mb
        held = {}
        loss_sum = None
        peak_live, act_bytes = 0, None
        base = runtime.memory_allocated(self.device)
        runtime.reset_peak_memory_stats(self.device)
        grad_mode = autograd.no_grad() if forward_only else autograd.enable_grad()
        with grad_mode:
            for op, c, m in ops:
                v = c * pp + stage
                x, y = micro_batches[m]
                if op == "F":
                    shape = self._act_shape(x)
                    if v == 0:
                        inp = x
                    else:
                        # Mixtral's activations come flat, with the router statistics so far appended
                        carry = chunks[c].carry
                        inp = self._recv("act", (v - 1) % pp, (math.prod(shape) + carry,) if carry else shape)
                        if not forward_only:
                            inp.requires_grad_()
                    before = runtime.memory_allocated(self.device)
                    out = chunks[c](inp, y if v == last_v else None, shape)
                    if v == last_v:
                        loss_sum = out.detach() if loss_sum is None else loss_sum + out.detach()
                        out = out * scale
                    else:
                        self._send("act", (v + 1) % pp, out.detach())
                    if not forward_only:
                        held[(c, m)] = (inp, out)
                        peak_live = max(peak_live, len(held))
                        if act_bytes is None:  # what one micro-batch's forward leaves held for its backward
                            act_bytes = runtime.memory_allocated(self.device) - before
                else:
                    inp, out = held.pop((c, m))
                    if v == last_v:
                        autograd.backward(out)
                    else:
                        autograd.backward(out, self._recv("grad", (v + 1) % pp, tuple(out.shape)))
                    if v > 0:
                        self._send("grad", (v - 1) % pp, inp.grad)
                    del inp, out
        if pp > 1:
            flush_sends()
            self._drain_sends()
        self.stats = {
            "in_flight": peak_live,
            "peak_bytes": runtime.max_memory_allocated(self.device) - base,
            "act_bytes": act_bytes or 0,
            "micro_batches": n_mb,
        }
        loss = zeros((), dtype="float32", device=self.device)
        if loss_sum is not None:
            loss = loss + (loss_sum * scale).to("float32")
        if self.grid is not None:
            if pp > 1:
                all_reduce(loss, "sum", self.grid.pp)
            if L.dp > 1:
                all_reduce(loss, "avg", self.grid.dp)
        return loss

    @autograd.no_grad()
    def finish_gradients(self, max_norm=None):
        """Makes every gradient the full model's (summed/averaged as the layout needs); returns the global norm
        before clipping (0-d float32, the same on every rank) after clipping to max_norm (None: no clipping). A
        parameter no backward reached on any rank that sums its gradient keeps none, as on one device."""
        L, grid = self.layout, self.grid
        # Whether a backward reached each parameter, reduced along with the gradients: the optimizer must skip one
        # that none reached (an expert no token was routed to), as the single-device one does; a zero gradient
        # would still move it by its momentum and weight decay.
        missing = [p.grad is None for _, p in self.params]
        reached = F.split(tensor([0.0 if m else 1.0 for m in missing], dtype="float32", device=self.device), 1)
        for _, p in self.params:
            if p.grad is None:  # every rank still has to reduce it
                p.grad = zeros(p.shape, dtype=p.dtype, device=p.device)

        def reduce(which, op, group):
            idx = [i for i, (n, _) in enumerate(self.params) if which(n)]
            _flat_all_reduce([self.params[i][1].grad for i in idx] + [reached[i] for i in idx], op, group)

        if grid is not None:
            if L.sp:
                reduce(lambda n: self.specs[n].sync_tp, "sum", grid.tp)
            plan = self.model.plan
            if L.pp > 1 and (grid.first or grid.last) and plan.tied_head:
                reduce(lambda n: n == f"{plan.embedding}.weight", "sum", grid.embedding)
            reduce(lambda n: True, "avg", grid.dp)
        # The norm: each piece of the full model counted once (replicated parts at their first holder, the tied
        # embedding at the first stage).
        tp, r = L.tp, (grid.tp_rank if grid is not None else 0)
        total = zeros((), dtype="float32", device=self.device)
        parts = []
        for name, p in self.params:
            spec = self.specs[name]
            if spec.tied and not (grid is None or grid.first):
                continue
            ranges = spec.local_ranges(tp, r)
            if all(counted for _, _, counted in ranges):
                parts.append(p.grad)
            else:
                at = 0
                for a, b, counted in ranges:
                    if counted:
                        parts.append(F.slice(p.grad, spec.dim, at, at + b - a))
                    at += b - a
        if parts:
            s = _optim.squared_norm(parts)
            total = total + (s if s.dtype == "float32" else s.to("float32"))
        if grid is not None and grid.mp is not None and grid.mp.size > 1:
            all_reduce(total, "sum", grid.mp)
        norm = F.sqrt(total)
        if max_norm:
            _optim.scale_to_norm([p.grad for _, p in self.params], norm, max_norm)
        if any(missing):  # only a parameter no local backward reached can be unreached everywhere
            for (_, p), r in zip(self.params, F.cat(list(reached)).numpy(), strict=True):
                if r == 0:
                    p.grad = None
        return norm

    def zero_grad(self):
        for _, p in self.params:
            p.grad = None
