"""ZeRO-3: parameters, gradients and optimizer state sharded across a process group (PyTorch's
FullyShardedDataParallel, in ZeRO's whole-tensor form).

    fsdp = FullyShardedDataParallel(model, blocks=list(model.h))   # every rank: the same model, then sharded
    FullyShardedDataParallel(GPT2(cfg, "cpu"), blocks, device="cuda:0")  # built on the host, sharded onto the GPU
    FullyShardedDataParallel(GPT2(cfg, "meta"), blocks, device="cuda:0")  # no storage; each rank makes its own
    opt = ZeroRedundancyOptimizer(model.parameters(), it.optim.AdamW, stage=3, fsdp=fsdp, lr=1e-3)
    loss = fsdp(x, y)[1]; loss.backward(); opt.step()               # as with DDP

Each parameter is owned by one rank (zero.py's partition: whole tensors, the largest first, to the least loaded
rank); the others hold an empty tensor in its place. A block's parameters are gathered (each owner broadcasts
its own, flattened) just before the block runs and freed right after. The block's forward keeps no graph: in
backward its parameters are gathered again, its forward recomputed and differentiated (activation recompute, so
a gathered block lives only while it runs), and its gradients reduced (averaged) to their owners, which add them
to what they hold; the others drop theirs. The rest of the model (embeddings, final norm, head: the root) is
gathered for the whole forward and backward and reduced at the end of backward. A parameter no rank's backward
reached keeps no gradient. The owner steps its parameters (ZeroRedundancyOptimizer stage 3), nothing is broadcast
after the step. gathered() materialises every parameter on every rank (checkpoints: save and load).

While a block runs, the next one's gather is already issued (prefetch=True, the default; backward's recompute goes
backwards): on the cpu the broadcasts run on the group's worker thread meanwhile; a device's are queued in order on
its stream (no side stream yet, so no overlap there).

Memory per rank: 1/N of the parameters, gradients and optimizer state, plus the root, two blocks gathered (one with
prefetch=False), and the activations at block boundaries.
"""

import contextlib
import hashlib

import numpy as np

from infinitrain import autograd, functional, nn
from infinitrain.distributed.collectives import all_reduce, broadcast, reduce
from infinitrain.distributed.group import NON_GROUP_MEMBER, default_group
from infinitrain.distributed.zero import partition
from infinitrain.nn import recompute
from infinitrain.tensor import Tensor, empty, from_numpy, init_key, materialize, tensor, zeros


class _Unit:
    """Parameters gathered and freed together: a block's, or the root's."""

    def __init__(self, name, params):
        self.name, self.params = name, params
        self.gathered = False
        self.pending = None  # a prefetch in flight: [(owner, params, flat buffer, Work)]
        self.stash = {}  # id(param) -> the owner's gradient from earlier micro-batches, during a recompute


class FullyShardedDataParallel(nn.Module):
    def __init__(self, module, blocks, process_group=None, device=None, prefetch=True):
        super().__init__()
        group = process_group if process_group is not None else default_group()
        if group is NON_GROUP_MEMBER:
            raise ValueError("FullyShardedDataParallel: this rank is not in the process group")
        named = list(module.named_parameters())
        if not named:
            raise ValueError("FullyShardedDataParallel: the module has no parameters")
        devices = sorted({str(p.device) for _, p in named})
        if len(devices) != 1:
            raise ValueError(f"FullyShardedDataParallel: one device per rank, the parameters are on {devices}")
        if devices == ["meta"] and device is None:
            raise ValueError(
                "FullyShardedDataParallel: a model built on device 'meta' needs device= (where to materialise it)"
            )
        blocks = list(blocks)
        if not blocks:
            raise ValueError("FullyShardedDataParallel: give the blocks to shard by (e.g. list(model.h))")
        self.module = module
        self.process_group, self.device = group, str(device or devices[0])
        self.prefetch = bool(prefetch)
        self.params = [p for _, p in named]
        self.names = {id(p): n for n, p in named}
        self.shapes = {id(p): tuple(p.shape) for p in self.params}
        # Every state_dict name of a parameter (a tied one has several) -> its whole shape.
        held = {id(p) for p in self.params}
        entries = module.state_dict(keep_vars=True).items()
        self._shape_by_name = {k: self.shapes[id(v)] for k, v in entries if id(v) in held}
        owner = partition(self.params, group.size)
        self.owner = {id(p): o for p, o in zip(self.params, owner, strict=True)}
        in_block = set()
        self.units = []
        for i, b in enumerate(blocks):
            params = list(b.parameters())
            shared = [self.names[id(p)] for p in params if id(p) in in_block]
            if shared:  # gathered with one block, it would be missing from the other
                raise ValueError(
                    f"FullyShardedDataParallel: block {i} shares {', '.join(shared)} with an earlier block"
                )
            in_block.update(id(p) for p in params)
            self.units.append(_Unit(f"block {i}", params))
        self.root = _Unit("root", [p for p in self.params if id(p) not in in_block])
        for b, unit in zip(blocks, self.units, strict=True):
            self._wrap_block(b, unit)
        for p in self.root.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_root_grad)
        self._pass = None
        self._wrap_root()
        object.__setattr__(module, "load_state_dict", self._load_state_dict)
        self._shard(module)

    @autograd.no_grad()
    def _shard(self, module):
        """Keeps what this rank owns, on the device, with rank 0's values (as DDP starts); a model built on
        another device (the host) comes over one parameter at a time, so the device never holds it whole. A model
        built on device "meta" is initialised sharded: each rank materialises only what it owns (its recorded
        draw or file slice replayed, the values a whole build would give), so no rank ever holds the whole model."""
        g = self.process_group
        deferred = [p for p in self.params if p.is_meta]
        blank = [self.names[id(p)] for p in deferred if not p._t.init]
        if blank:
            raise ValueError(f"FullyShardedDataParallel: {', '.join(blank[:4])} built on 'meta' never initialised")
        self._check_same_build(deferred)
        for p in self.params:
            if p.is_meta:
                t = materialize(p, self.device) if self.owns(p) else empty((0,), dtype=p.dtype, device=self.device)
                p._t = t._t
                continue
            t = p.detach() if str(p.device) == self.device else p.detach().to(self.device)
            broadcast(t, g.ranks[0], g)
            p._t = t._t if self.owns(p) else empty((0,), dtype=p.dtype, device=self.device)._t
        for _, b in module.named_buffers():
            if b.is_meta:
                b._t = materialize(b, self.device)._t
            elif str(b.device) != self.device:
                b._t = b.to(self.device)._t

    def _check_same_build(self, params):
        """Sharded initialisation trusts every rank to have built the same model from the same seed (nothing is
        broadcast): a digest of each rank's recorded initialisation is compared with rank 0's, on every rank."""
        g = self.process_group
        # First whether any rank built on meta (the same collectives on every rank, meta or not): the max of
        # [meta, -meta] is [1, 0] where some did and some did not.
        meta = tensor([int(bool(params)), -int(bool(params))], dtype="int64", device=self.device)
        all_reduce(meta, "max", g)
        if meta.numpy().tolist() == [1, 0]:
            raise ValueError(
                "FullyShardedDataParallel: some ranks built the model on device 'meta' and some did not; build it "
                "the same way on every rank"
            )
        if not params:
            return
        record = [(self.names[id(p)], tuple(p.shape), p.dtype, init_key(p)) for p in params]
        digest = int.from_bytes(hashlib.sha256(repr(record).encode()).digest()[:7], "little")
        lead = tensor([digest], dtype="int64", device=self.device)
        broadcast(lead, g.ranks[0], g)
        differs = tensor([int(int(lead.item()) != digest)], dtype="int64", device=self.device)
        all_reduce(differs, "max", g)
        if differs.item():
            raise ValueError(
                "FullyShardedDataParallel: the ranks built different models on device 'meta' (sizes, order, the "
                "random seed or the files read differ), so their shards would not form one model; seed every rank "
                "alike and load the same checkpoint"
            )

    # ---- what callers see ----

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def owns(self, p):
        return self.owner[id(p)] == self.process_group.rank

    def num_parameters(self):
        """The whole model's count (its modules report only what this rank holds)."""
        return sum(_numel(self.shapes[id(p)]) for p in self.params)

    def numel(self, name):
        """The whole size of the parameter `name` (a state_dict key of the module), or None for a buffer."""
        shape = self._shape_by_name.get(name)
        return None if shape is None else _numel(shape)

    @contextlib.contextmanager
    def gathered(self):
        """Every parameter whole on every rank inside (every rank must enter): to save, load or sample. What a
        rank owns keeps any change made inside; the rest is freed on exit."""
        units = [u for u in [*self.units, self.root] if not u.gathered]
        for u in units:
            self._gather(u)
        try:
            yield
        finally:
            for u in units:
                self._free(u)

    def full_state_dict(self, to=0):
        """The module's state_dict as NumPy arrays on global rank `to` ({} elsewhere; every rank must call it),
        gathered one unit at a time, so no rank ever holds more than one unit beyond its shard."""
        me = self.process_group.ranks[self.process_group.rank] == to
        out = {}
        for unit in [*self.units, self.root]:
            was = unit.gathered
            self._gather(unit)
            if me:
                for k, v in self.module.state_dict().items():
                    if k not in out and v.numel() > 0:  # others' parameters outside this unit are empty now
                        out[k] = v.numpy().copy()
            if not was:
                self._free(unit)
        if me:
            for k, v in self.module.state_dict().items():
                out.setdefault(k, v.numpy().copy())
        return out

    @autograd.no_grad()
    def _load_state_dict(self, state, strict=True, assign=False):
        """The module's load_state_dict, sharded: names and whole shapes checked as nn.Module's are, each rank
        copying in only what it owns (nothing is gathered)."""
        own = self.module.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, t in own.items():
            if name not in state:
                continue
            v = state[name]
            whole = self.shapes.get(id(t), tuple(t.shape))
            if tuple(v.shape) != whole:
                raise ValueError(f"load_state_dict: '{name}' has shape {tuple(v.shape)}, the module expects {whole}")
            if id(t) in self.owner and not self.owns(t):
                continue
            if tuple(t.shape) != whole:  # an owned parameter is always whole; a buffer too
                raise RuntimeError(f"load_state_dict: '{name}' is not whole on its owner")
            t.copy_(v if isinstance(v, Tensor) else from_numpy(np.asarray(v), dtype=t.dtype, device=t.device))
        return missing, unexpected

    # ---- gather and free ----

    def _by_owner(self, params):
        """(owner, dtype, params) groups in an order every rank shares."""
        out = []
        for r in range(self.process_group.size):
            mine = [p for p in params if self.owner[id(p)] == r]
            for dtype in sorted({p.dtype for p in mine}):
                out.append((r, dtype, [p for p in mine if p.dtype == dtype]))
        return out

    @autograd.no_grad()
    def _start_gather(self, unit):
        """Issues the unit's broadcasts (each owner's parameters, flattened) without waiting for them."""
        if unit.gathered or unit.pending is not None:
            return
        g = self.process_group
        unit.pending = []
        for r, dtype, params in self._by_owner(unit.params):
            if r == g.rank:
                flat = functional.cat([p.detach().reshape(-1) for p in params])
            else:
                flat = empty((sum(_numel(self.shapes[id(p)]) for p in params),), dtype=dtype, device=self.device)
            unit.pending.append((r, params, flat, broadcast(flat, g.ranks[r], g, async_op=True)))

    @autograd.no_grad()
    def _gather(self, unit):
        if unit.gathered:
            return
        self._start_gather(unit)
        g = self.process_group
        for r, params, flat, work in unit.pending:
            work.wait()
            if r != g.rank:
                sizes = [_numel(self.shapes[id(p)]) for p in params]
                for p, part in zip(params, functional.split(flat, sizes), strict=True):
                    p._t = part.reshape(self.shapes[id(p)])._t
        unit.pending = None
        unit.gathered = True

    def _prefetch(self, unit, backward):
        """Starts gathering the block that runs after `unit` (the next in forward, the previous in backward's
        recompute) while `unit` computes: the cpu's collectives run on the group's worker thread meanwhile; a
        device's are queued on its stream in the same order."""
        if not self.prefetch:
            return
        i = self.units.index(unit) + (-1 if backward else 1)
        if 0 <= i < len(self.units):
            self._start_gather(self.units[i])

    def _free(self, unit):
        if not unit.gathered:
            return
        for p in unit.params:
            if not self.owns(p):
                p._t = empty((0,), dtype=p.dtype, device=self.device)._t
        unit.gathered = False

    # ---- gradients ----

    @autograd.no_grad()
    def _reduce_grads(self, unit):
        """Averages this micro-batch's gradients of the unit's parameters into their owners' (added to the stash
        of earlier micro-batches); a parameter no rank reached keeps what it had (None at first)."""
        g = self.process_group
        trainable = [p for p in unit.params if p.requires_grad]
        for r, dtype, params in self._by_owner(trainable):
            pieces = [p.grad.reshape(-1) if p.grad is not None else zeros((_numel(self.shapes[id(p)]),), dtype=dtype,
                      device=self.device) for p in params]  # fmt: skip
            reached = [1.0 if p.grad is not None else 0.0 for p in params]
            flat = functional.cat([*pieces, tensor(reached, dtype=dtype, device=self.device)])
            reduce(flat, g.ranks[r], "avg", g)
            for p in params:
                p.grad = None
            if r != g.rank:
                continue
            sizes = [_numel(self.shapes[id(p)]) for p in params]
            parts = functional.split(flat, [*sizes, len(params)])
            any_reached = parts[-1].numpy() > 0
            for p, part, hit in zip(params, parts[:-1], any_reached, strict=True):
                before = unit.stash.pop(id(p), None)
                if not hit:
                    p.grad = before
                    continue
                part = part.reshape(self.shapes[id(p)])
                p.grad = part if before is None else before + part
        unit.stash.clear()

    def _stash(self, unit):
        """Sets aside the owners' gradients of earlier micro-batches, so the recompute's backward leaves this
        micro-batch's alone in .grad."""
        for p in unit.params:
            if p.grad is not None:
                unit.stash[id(p)] = p.grad
                p.grad = None

    def _on_root_grad(self, p):
        self._note_backward()

    def _note_backward(self):
        """Once per backward (from the first root gradient or block recompute): the root is reduced and freed at
        its end, also when no root parameter trains (LoRA on the blocks)."""
        current = autograd.current_backward()
        if current is not None and self._pass is not current:
            self._pass = current
            autograd.queue_callback(self._finish_backward)

    def clear_stash(self):
        """Drops gradients set aside by a forward whose backward never ran (zero_grad calls it), and any prefetch
        such a forward left: its values would be stale after the next step."""
        for unit in [*self.units, self.root]:
            unit.stash.clear()
        self._drop_prefetches()

    def _drop_prefetches(self):
        for unit in self.units:
            if unit.pending is not None:
                for *_, work in unit.pending:
                    work.wait()  # every rank issued it: completed, then discarded
                unit.pending = None

    def _finish_backward(self):
        self._pass = None
        self._drop_prefetches()
        self._reduce_grads(self.root)
        self._free(self.root)

    # ---- the forwards ----

    def _wrap_root(self):
        forward = self.module.forward

        def gathered_forward(*args, **kwargs):
            training = autograd.is_grad_enabled()
            self._gather(self.root)
            if training:
                self._stash(self.root)
            out = forward(*args, **kwargs)
            if not training:  # no backward will free it (evaluation, sampling)
                self._free(self.root)
            return out

        object.__setattr__(self.module, "forward", gathered_forward)

    def _wrap_block(self, block, unit):
        forward = block.forward

        def gather(backward):
            self._gather(unit)
            self._prefetch(unit, backward)
            if backward:
                self._note_backward()
                self._stash(unit)

        def release(backward):
            if backward:
                self._reduce_grads(unit)
            self._free(unit)

        def sharded_forward(*args):
            return recompute.checkpoint(forward, *args, gather=gather, release=release)

        object.__setattr__(block, "forward", sharded_forward)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n
