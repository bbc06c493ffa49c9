"""Strategies: how a run's model is placed on its devices, stepped, evaluated and checkpointed. The Trainer's loop
is the same for every one; a new kind of parallelism is a new Strategy.

- Local: one process; one device, or data-parallel replicas over several devices of this process (--devices,
  --nthread_per_process), their gradients averaged by the provider's collectives. Kept beside the launcher (unlike
  PyTorch's retired DataParallel) because it is InfiniTrain's --nthread_per_process and needs no processes.
- DataParallel: one device per process under python -m infinitrain.run, DDP averaging the gradients as backward
  runs; ZeRO-1/2 shard the optimizer state (and the gradients).
- ModelParallel: the data x pipeline x tensor grid (infinitrain.parallel): this rank's model part, the schedule
  over micro-batches, sharded checkpoints.

Each strategy takes the run's global batches (B x rows of them: `rows`) and reads the rows that are its own.

Every model forward runs under it.compile's fusion rules (`fusing()`, infinitrain/fusion.py): the one place the
training layer chooses fused ops (the residual add joined with the next norm, norm outputs written in 16-bit for
the linear that reads them, GPT-2's linear + GELU + linear as one node); the models themselves are plain.
"""

import contextlib
import time

import numpy as np

import infinitrain as it
from infinitrain import fp8, parallel
from infinitrain.compiler import fusing
from infinitrain.data.device import DeviceLoader
from infinitrain.nn.utils import eval_mode
from infinitrain.runs import TrainError, UsageError
from infinitrain.tensor import zeros
from infinitrain.training import checkpoints


class StepAbandoned(Exception):  # noqa: N818 (not an error: a signal asked the run to stop)
    """A step given up between micro-batches because the run was asked to stop; nothing was applied (the
    optimizer did not step), so the model and optimizer are those of the last completed step."""

    def __init__(self, step, done, accum):
        super().__init__(f"step {step} given up after {done} of {accum} micro-batches")
        self.step, self.done, self.accum = step, done, accum


class Nothing:
    """A do-nothing context (profile marks and precision phases when they are off)."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _marks(prof, rec):
    mark = prof.mark if prof is not None else (lambda name: Nothing())
    phase = rec.phase if rec is not None else (lambda name: Nothing())
    return mark, phase


def on_device(batch, device):
    """A batch array (from a DataLoader) as a tensor on `device`; a DeviceLoader's tensor is there already."""
    return batch if isinstance(batch, it.Tensor) else it.from_numpy(batch, device=device)


class RankRows:
    """This rank's rows (B of them, from `first`) of a loader's global batches; its state is the loader's."""

    def __init__(self, loader, first, rows):
        self.loader, self.first, self.rows = loader, first, rows

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.loader)
        r = slice(self.first, self.first + self.rows)
        return x[r], y[r]

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def _batches_per_epoch(loader):
    inner = loader
    while not hasattr(inner, "batches_per_epoch"):  # a DeviceLoader or RankRows around the DataLoader
        inner = inner.loader
    return inner.batches_per_epoch


def fill_missing_grads(params):
    """Zero gradients for trainable parameters that got none this step (an expert no token was routed to), so
    data-parallel all-reduces see the same tensors on every replica."""
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = zeros(p.shape, dtype=p.dtype, device=p.device)


def average_replica_gradients(replicas, comms):
    """All-reduces (averages) in place the gradients of in-process replicas (replicas[i]: replica i's trainable
    parameters, in one order; comms[i] its communicator). A parameter that no replica's backward reached (an
    expert no token was routed to) keeps no gradient, as on one device; one that some replicas reached is averaged
    with zeros for the others."""
    reached = [any(p.grad is not None for p in same) for same in zip(*replicas, strict=True)]
    for params in replicas:
        fill_missing_grads([p for p, r in zip(params, reached, strict=True) if r])
    with it.distributed.group(comms[0].device):
        for params, comm in zip(replicas, comms, strict=True):
            for p in params:
                if p.grad is not None:
                    it.distributed.comm.all_reduce(comm, p.grad, "avg")


def optimizer_choice(cfg):
    """(optimizer class, its keyword arguments) that --optimizer and its flags choose."""
    name, lr, wd = cfg.optimizer, cfg.learning_rate, cfg.weight_decay
    if name == "sgd":
        return it.optim.SGD, {"lr": lr, "weight_decay": wd}
    betas = (0.9, 0.95) if name == "adamw" else (0.9, 0.999)
    return it.optim.AdamW, {"lr": lr, "betas": betas, "eps": 1e-8, "weight_decay": wd}


class Strategy:
    """The interface. After build(), `model` is the model the Trainer reports on and samples from, `optimizer`
    the optimizer whose state checkpoints hold, `lead` whether this process prints and writes."""

    rows = 1  # B-row shares of each global micro-batch (the loader reads B * rows rows)
    lead = True
    samples = True  # whether samples can be drawn from `model`
    stop = None  # the run's StopRequest (the Trainer sets it): a step checks it between micro-batches

    def __init__(self, cfg, devices):
        self.cfg, self.devices, self.device = cfg, devices, devices[0]

    def describe(self):
        """How the run is placed, for the header line."""
        raise NotImplementedError

    def split_loaders(self, loader, val_loader):
        """The loaders this process reads (its rows, on its device)."""
        raise NotImplementedError

    def build(self, spec, adapt):
        """Builds the model (replicas, parts), wraps it and makes the optimizer(s)."""
        raise NotImplementedError

    def step(self, step, lr, loader, accum, prof=None, rec=None):
        """One optimizer step over `accum` micro-batches; returns (mean loss, gradient norm before clipping)."""
        raise NotImplementedError

    def evaluate(self, loader, batches):
        raise NotImplementedError

    def save(self, ckpt_dir, step, loader, args):
        """Writes a checkpoint (ckpt_dir None on ranks that only help gather state); returns its path or None."""
        raise NotImplementedError

    def load(self, tensors, meta, loader, *, allow_other_data, load_optimizer, path):
        """Restores a checkpoint's state; returns its step."""
        raise NotImplementedError

    def resume_from(self, candidates, ckpt_dir, loader, **kw):
        """Continues from the newest intact of `candidates`; (step, path)."""
        return checkpoints.resume(candidates, ckpt_dir, self.models, self.optimizers, loader, **kw)

    def stop_requested(self, stop):
        return bool(stop.signum)

    def num_parameters(self):
        return self.model.num_parameters()

    def numel(self, name, t):
        """The whole size of the model's state_dict entry `name` (t: what this process holds of it)."""
        return t.numel()

    def whole_model(self):
        """A context in which `model` holds every parameter (every process must enter it)."""
        return contextlib.nullcontext()

    def abandon_step(self):
        """Whether the step in progress should be given up at this micro-batch boundary (a signal came). Every
        process of a run calls it at the same boundaries: under the launcher it is a collective."""
        return self.stop is not None and self.stop_requested(self.stop)


# ---- one process -------------------------------------------------------------------------------------------------


class Local(Strategy):
    """One process: one device, or replicas on several devices of this process (each B rows of every batch)."""

    processes = False  # whether the replicas are processes (under the launcher)

    def __init__(self, cfg, devices):
        super().__init__(cfg, devices)
        self.rows = len(devices)
        self.comms = None

    def describe(self):
        n = len(self.devices)
        return f"devices {','.join(self.devices)}" if n > 1 else f"device {self.device}"

    def split_loaders(self, loader, val_loader):
        return _device_loader(loader, self.devices), _device_loader(val_loader, self.devices)

    def build(self, spec, adapt):
        model = spec.build(self.device)
        self.params = [adapt(model)]
        self.models = [model]
        rng_state = it.random.default_generator.get_state()
        for d in self.devices[1:]:
            replica = spec.build(d)
            self.params.append(adapt(replica))
            replica.load_state_dict(model.state_dict())
            self.models.append(replica)
        it.random.default_generator.set_state(rng_state)  # as after building and adapting one model
        self.model = model
        cls, kwargs = optimizer_choice(self.cfg)
        self.optimizers = [cls(p, **kwargs) for p in self.params]
        self.optimizer = self.optimizers[0]
        if len(self.devices) > 1:
            self.comms = it.distributed.init_all(self.devices)

    def _average_gradients(self):
        average_replica_gradients(self.params, self.comms)

    def step(self, step, lr, loader, accum, prof=None, rec=None, ddp=None):
        cfg, n, B = self.cfg, len(self.devices), self.cfg.batch_size
        for opt in self.optimizers:
            opt.lr = lr
            opt.zero_grad()
        it.runtime.reset_peak_memory_stats(self.device)
        if cfg.overfit_single_batch:
            loader.load_state_dict({"epoch": 0, "position": 0})
        mark, phase = _marks(prof, rec)
        recording = rec.step(step + 1) if rec is not None else Nothing()
        loss_sums = [None] * n
        with recording:
            for k in range(accum):
                x, y = next(loader)
                for r, (d, m) in enumerate(zip(self.devices, self.models, strict=True)):
                    sync = ddp.no_sync() if ddp is not None and k < accum - 1 else Nothing()
                    if n == 1:
                        xr, yr = on_device(x, d), on_device(y, d)
                    else:
                        xr = it.from_numpy(x[r * B : (r + 1) * B], device=d)
                        yr = it.from_numpy(y[r * B : (r + 1) * B], device=d)
                    with sync:
                        with mark("forward"), phase("forward"):
                            with it.amp.autocast(d, dtype="bfloat16", enabled=cfg.autocast), fusing():
                                _, loss = m(xr, yr)
                            loss = loss * (1.0 / accum)
                        with mark("backward"), phase("backward"):
                            loss.backward()  # under the launcher, DDP averages the gradients across the processes
                    loss_sums[r] = loss.detach() if loss_sums[r] is None else loss_sums[r] + loss.detach()
                # A signal gives up the step here rather than after the rest of its micro-batches (a step of many
                # can take minutes); nothing was applied yet.
                if k < accum - 1 and self.abandon_step():
                    raise StepAbandoned(step + 1, k + 1, accum)
            with mark("optimizer"), phase("optimizer"):
                if cfg.fp8 and (n > 1 or self.processes):  # the replicas' FP8 scales agree again
                    fp8.sync_amax(
                        self.models, (lambda t: it.distributed.all_reduce(t, "max")) if self.processes else None
                    )
                if n > 1:
                    self._average_gradients()
                if rec is not None:
                    rec.record_tensors("grad", self.models[0].named_parameters(), grads=True)
                clip = cfg.grad_clip or None
                if isinstance(self.optimizers[0], it.distributed.ZeroRedundancyOptimizer):
                    norms = [self.optimizers[0].clip_grad_norm_(clip)]
                else:
                    norms = [it.optim.clip_grad_norm_(p, clip) for p in self.params]
                for opt in self.optimizers:
                    opt.step()
                if rec is not None:
                    rec.record_tensors("param", self.models[0].named_parameters())
            if self.processes:
                it.distributed.all_reduce(loss_sums[0], "avg")  # the loss of the global batch
            train_loss = sum(ls.item() for ls in loss_sums) / n  # the step's host synchronisation
        return train_loss, (norms[0].item() if norms[0] is not None else 0.0)

    @it.no_grad()
    def evaluate(self, loader, batches):
        """Mean loss over the first `batches` batches of `loader` (rewound first), on the first device."""
        loader.load_state_dict({"epoch": 0, "position": 0})
        losses = []
        with eval_mode(self.model):
            for _ in range(min(batches, _batches_per_epoch(loader))):
                x, y = (on_device(a, self.device) for a in next(loader))
                with it.amp.autocast(self.device, dtype="bfloat16", enabled=self.cfg.autocast), fusing():
                    _, loss = self.model(x, y)
                losses.append(loss.item())
        return float(np.mean(losses))

    def save(self, ckpt_dir, step, loader, args):
        if isinstance(self.optimizer, it.distributed.ZeroRedundancyOptimizer):
            self.optimizer.consolidate_state_dict(to=0)
        if ckpt_dir is None:
            return None
        tensors, meta = checkpoints.checkpoint_state(step, self.model, self.optimizer, loader, **args)
        return ckpt_dir.save(step, tensors, meta)

    def load(self, tensors, meta, loader, *, allow_other_data, load_optimizer, path):
        return checkpoints.apply_checkpoint(
            tensors, meta, self.models, self.optimizers, loader, allow_other_data=allow_other_data,
            load_optimizer=load_optimizer, path=path,
        )  # fmt: skip


def _device_loader(loader, devices):
    """A single accelerator takes its batches through a DeviceLoader (pinned buffers, copied a batch ahead on a
    side stream); the cpu, and several devices that each slice rows of the host batch, read the arrays."""
    if loader is None or len(devices) != 1 or devices[0] == "cpu":
        return loader
    return DeviceLoader(loader, devices[0])


# ---- processes under the launcher --------------------------------------------------------------------------------


class DataParallel(Local):
    """One device per process under the launcher: DDP (or ZeRO-1/2) over the processes; each process reads its B
    rows of every global batch, rank 0 evaluates, samples and writes."""

    processes = True

    def __init__(self, cfg, devices, mp):
        super().__init__(cfg, devices)
        self.mp, self.rows, self.lead = mp, mp.world, mp.rank == 0
        # ZeRO-3: every forward is a collective, so every rank evaluates; samples (rank 0 alone) are not drawn.
        self.sharded = cfg.zero_stage == 3
        self.samples = self.lead and not self.sharded
        self.fsdp = None

    def describe(self):
        zero = f", ZeRO-{self.cfg.zero_stage}" if self.cfg.zero_stage else ""
        return f"device {self.device} (rank 0 of {self.mp.world} processes{zero})"

    def split_loaders(self, loader, val_loader):
        B = self.cfg.batch_size
        loader = RankRows(loader, self.mp.rank * B, B)
        if self.sharded and val_loader is not None:
            val_loader = RankRows(val_loader, self.mp.rank * B, B)  # every rank its rows (a forward is collective)
        elif not self.lead:
            val_loader = None  # rank 0 evaluates (the whole global batch)
        return _device_loader(loader, self.devices), _device_loader(val_loader, self.devices)

    def build(self, spec, adapt):
        stage = self.cfg.zero_stage
        # ZeRO-3 builds on device "meta" (no storage) and materialises only this rank's shard on the device (a
        # file's tensors read then), so a model that fits neither one device nor one process's host memory can be
        # built.
        model = spec.build("meta" if stage == 3 else self.device)
        self.params = [adapt(model)]
        self.models, self.model = [model], model
        cls, kwargs = optimizer_choice(self.cfg)
        if stage == 3:
            if not spec.family.can_recompute(model.config):
                raise UsageError(
                    "--zero_stage=3 is not implemented for mixture-of-experts models (it recomputes each block, and "
                    "the router's balancing loss is a side output of a block's forward)"
                )
            self.ddp = None  # the sharded model reduces its own gradients, every micro-batch
            self.fsdp = it.distributed.FullyShardedDataParallel(
                model, spec.family.block_list(model), device=self.device
            )
            zero = it.distributed.ZeroRedundancyOptimizer
            self.optimizers = [zero(self.params[0], cls, stage=3, fsdp=self.fsdp, **kwargs)]
            self.optimizer = self.optimizers[0]
            return
        # Experts that this rank's tokens never reached have no gradient: counted as zero.
        self.ddp = it.distributed.DistributedDataParallel(model, find_unused_parameters=True)
        if stage:
            zero = it.distributed.ZeroRedundancyOptimizer
            self.optimizers = [zero(self.params[0], cls, stage=stage, ddp=self.ddp if stage == 2 else None, **kwargs)]
        else:
            self.optimizers = [cls(self.params[0], **kwargs)]
        self.optimizer = self.optimizers[0]

    def step(self, step, lr, loader, accum, prof=None, rec=None):
        return super().step(step, lr, loader, accum, prof, rec, ddp=self.ddp)

    def num_parameters(self):
        return self.fsdp.num_parameters() if self.fsdp else super().num_parameters()

    def evaluate(self, loader, batches):
        loss = super().evaluate(loader, batches)
        if not self.sharded:
            return loss
        # Each rank evaluated its rows of every batch (equal shares): the mean of the means is the global mean.
        t = it.from_numpy(np.array([loss], dtype=np.float64))
        it.distributed.all_reduce(t, "avg")
        return float(t.numpy()[0])

    def numel(self, name, t):
        whole = self.fsdp.numel(name) if self.fsdp else None
        return t.numel() if whole is None else whole

    def whole_model(self):
        return self.fsdp.gathered() if self.fsdp else contextlib.nullcontext()

    def save(self, ckpt_dir, step, loader, args):
        if self.fsdp is None:
            return super().save(ckpt_dir, step, loader, args)
        self.optimizer.consolidate_state_dict(to=0)
        state = self.fsdp.full_state_dict(to=0)  # one unit gathered at a time
        if ckpt_dir is None:
            return None
        tensors, meta = checkpoints.checkpoint_state(
            step, self.model, self.optimizer, loader, model_state=state, **args
        )
        return ckpt_dir.save(step, tensors, meta)

    def resume_from(self, candidates, ckpt_dir, loader, **kw):
        """Rank 0 chooses the checkpoint (falling back past damaged ones); the others load the same file (under
        ZeRO-3 each rank copies in only what it owns)."""
        return _resume_led_by_rank0(self, loader, kw, lambda: super(DataParallel, self).resume_from(
            candidates, ckpt_dir, loader, **kw))  # fmt: skip

    def stop_requested(self, stop):
        """Whether any rank got a signal (the ranks must agree on the step they stop at, or those going on would
        wait for the others forever)."""
        flag = it.from_numpy(np.array([stop.signum or 0], dtype=np.int64))
        it.distributed.all_reduce(flag, "max")
        stop.signum = int(flag.numpy()[0]) or None
        return bool(stop.signum)


# ---- the data x pipeline x tensor grid ---------------------------------------------------------------------------


class ParallelContext:
    """This rank's part of a tensor/pipeline-parallel run: grid, model part, engine."""

    def __init__(self, grid, model, engine, full_names):
        self.grid, self.model, self.engine, self.full_names = grid, model, engine, full_names
        self.save_dir = ""

    @property
    def index(self):
        return self.grid.stage * self.model.layout.tp + self.grid.tp_rank


class ModelParallel(Strategy):
    """This rank's part of a tensor/pipeline-parallel model (infinitrain.parallel): the pipeline schedule over the
    micro-batches, gradients made whole and clipped across the grid, sharded checkpoints. No samples."""

    samples = False

    def __init__(self, cfg, devices, mp, layout, accum):
        super().__init__(cfg, devices)
        self.mp, self.layout, self.accum = mp, layout, accum
        self.rows, self.lead = layout.dp, mp.rank == 0

    def describe(self):
        zero = f", ZeRO-{self.cfg.zero_stage}" if self.cfg.zero_stage else ""
        return f"device {self.device} (rank 0 of {self.mp.world} processes as {self.layout.describe()}{zero})"

    def split_loaders(self, loader, val_loader):
        # Each replica reads its rows; every rank evaluates them (the pipeline needs all its stages).
        B = self.cfg.batch_size
        first = self.pctx.grid.dp_rank * B
        loader = RankRows(loader, first, B)
        if val_loader is not None:
            val_loader = RankRows(val_loader, first, B)
        return _device_loader(loader, self.devices), _device_loader(val_loader, self.devices)

    def build(self, spec, adapt):
        full = spec.build(self.device)
        adapt(full)
        self.full = full
        tp_plan = spec.family.tensor_parallel
        check_parallel_model(self.layout, tp_plan, full.config, self.cfg.sequence_length, self.accum)
        split = None
        if self.cfg.pipeline_split:
            try:
                split = [int(v) for v in self.cfg.pipeline_split.split(",")]
            except ValueError:
                raise UsageError(
                    f"--pipeline_split={self.cfg.pipeline_split}: expected comma-separated layer counts"
                ) from None
        full_names = [n for n, _ in full.named_parameters()]
        grid = parallel.Grid(self.layout, self.device)
        try:
            model = parallel.ParallelModel(
                full, self.layout, tp_plan, grid, split=split, sequence_length=self.cfg.sequence_length
            )
        except parallel.LayoutError as e:
            raise UsageError(f"--pipeline_split: {e}") from None
        self.pctx = ParallelContext(grid, model, parallel.Engine(model, grid), full_names)
        self.pctx.save_dir = self.cfg.save
        self.model, self.models = model, [model]
        self.params = [list(model.parameters())]
        cls, kwargs = optimizer_choice(self.cfg)
        if self.cfg.zero_stage and self.layout.dp > 1:  # ZeRO-1 across the data-parallel group of this model part
            zero = it.distributed.ZeroRedundancyOptimizer
            self.optimizers = [zero(self.params[0], cls, process_group=grid.dp, stage=1, **kwargs)]
        else:
            self.optimizers = [cls(self.params[0], **kwargs)]
        self.optimizer = self.optimizers[0]

    def _micro_batches(self, loader, n):
        return [tuple(on_device(a, self.device) for a in next(loader)) for _ in range(n)]

    def step(self, step, lr, loader, accum, prof=None, rec=None):
        """The pipeline over `accum` micro-batches, the gradients made whole and clipped, the step; the same loss
        and norm on every rank. One schedule runs every micro-batch: a signal stops the run after the step."""
        self.optimizer.lr = lr
        self.optimizer.zero_grad()
        it.runtime.reset_peak_memory_stats(self.device)
        if self.cfg.overfit_single_batch:
            loader.load_state_dict({"epoch": 0, "position": 0})
        mark, _ = _marks(prof, None)
        mbs = self._micro_batches(loader, accum)
        autocast = it.amp.autocast(self.device, dtype="bfloat16", enabled=self.cfg.autocast)
        with mark("forward-backward"), autocast, fusing():
            loss = self.pctx.engine.forward_backward(mbs)
        with mark("optimizer"):
            norm = self.pctx.engine.finish_gradients(self.cfg.grad_clip or None)
            self.optimizer.step()
        return loss.item(), norm.item()

    @it.no_grad()
    def evaluate(self, loader, batches):
        """Mean loss over the first `batches` batches (this replica's rows) through the pipeline, averaged over the
        replicas (every rank takes part)."""
        loader.load_state_dict({"epoch": 0, "position": 0})
        n = min(batches, _batches_per_epoch(loader))
        autocast = it.amp.autocast(self.device, dtype="bfloat16", enabled=self.cfg.autocast)
        with eval_mode(*self.models), autocast, fusing():
            loss = self.pctx.engine.forward_backward(self._micro_batches(loader, n), forward_only=True)
        return loss.item()

    def save(self, ckpt_dir, step, loader, args):
        return checkpoints.save_parallel_checkpoint(ckpt_dir, step, self.pctx, self.optimizer, loader, **args)

    def load(self, tensors, meta, loader, *, allow_other_data, load_optimizer, path):
        return checkpoints.apply_checkpoint(
            tensors, meta, self.models, self.optimizers, loader, allow_other_data=allow_other_data,
            load_optimizer=load_optimizer, path=path, pctx=self.pctx,
        )  # fmt: skip

    def resume_from(self, candidates, ckpt_dir, loader, **kw):
        return _resume_led_by_rank0(self, loader, kw, lambda: checkpoints.resume(
            candidates, ckpt_dir, self.models, self.optimizers, loader, pctx=self.pctx, **kw))  # fmt: skip

    stop_requested = DataParallel.stop_requested


_RESUME_KEY, _RESUME_FAILED = "train/resume", "\0failed"
_ECHO_DELAY_S = 10


def _resume_led_by_rank0(st, loader, kw, lead):
    """Rank 0 runs lead() -> (step, path) and publishes the path; the other ranks load the same file. A failure on
    rank 0 is published too, so the others stop with it instead of waiting for a path forever."""
    store = it.distributed.default_store()
    if st.mp.rank != 0:
        path = store.get(_RESUME_KEY).decode()
        if path == _RESUME_FAILED:
            # Give rank 0 time to exit first, so the launcher reports its error rather than this echo of it.
            time.sleep(_ECHO_DELAY_S)
            raise TrainError("rank 0 could not resume (its error says why); this rank stops with it")
        if not path:
            return 0, None
        tensors, meta = checkpoints.read_checkpoint(path)
        start = st.load(tensors, meta, loader, allow_other_data=kw["allow_other_data"],
                        load_optimizer=kw["load_optimizer"], path=path)  # fmt: skip
        return start, path
    try:
        start, path = lead()
    except BaseException:
        store.set(_RESUME_KEY, _RESUME_FAILED.encode())
        raise
    store.set(_RESUME_KEY, (path or "").encode())
    return start, path


def check_parallel_model(layout, plan, config, sequence_length, accum):
    """Refuses a layout the model cannot be split into, as a usage error (plan: its family's TensorParallelPlan)."""
    try:
        parallel.check_model(layout, plan, config, sequence_length, accum)
    except parallel.LayoutError as e:
        raise UsageError(f"{e} ({layout.describe()})") from None
