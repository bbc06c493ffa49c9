"""The Trainer: the training loop over a Strategy, and the run's set-up around it (devices, data, model, outputs,
resuming). `fit()` is the loop: schedule, accumulation and clipping (inside the strategy's step), logging,
evaluation, samples, checkpoint cadence, signals.

    Trainer(RunConfig(model="gpt2-tiny", num_iteration=50)).fit()
"""

import glob
import json
import math
import os
import signal
import socket
import sys
import time

import numpy as np

import infinitrain as it
from infinitrain import fp8, parallel
from infinitrain.checkpoint import path_kind
from infinitrain.data import (
    ByteTokenizer,
    DataLoader,
    HFTokenizer,
    Tokenizer,
    check_input,
    default_corpus,
    read_tokens_header,
)
from infinitrain.data.tokens import token_file_identity
from infinitrain.distributed import cluster
from infinitrain.models import lora
from infinitrain.models import registry as models_registry
from infinitrain.nn import recompute
from infinitrain.optim.schedule import Schedule
from infinitrain.parallel import shards as parallel_shards
from infinitrain.run import RESTART_ENV
from infinitrain.runs import (
    CKPT_PATTERN,
    METRICS_NAME,
    CheckpointDir,
    MetricsLog,
    Stopped,
    StopRequest,
    TrainError,
    UsageError,
    default_run_dir,
    open_output,
    precision,
)
from infinitrain.training import checkpoints, strategy
from infinitrain.training.config import defaults

# Settings that shape the loss curve: resuming must keep them (checkpoints store them).
RUN_FLAGS = (
    "batch_size", "sequence_length", "total_batch_size", "num_iteration", "learning_rate", "lr_warmup_iters",
    "lr_warmup_init", "lr_decay_style", "min_lr", "lr_decay_iters", "optimizer", "weight_decay", "grad_clip", "dtype",
    "seed", "overfit_single_batch", "llmc_filepath", *models_registry.RUN_FLAGS,
)  # fmt: skip


# Micro-batches per step beyond which --total_batch_size is taken for a mistake (a step that would take ages).
MAX_ACCUMULATION = 1 << 16


class Launched:
    """This process's place when infinitrain.run started several: rank, local rank, world size."""

    def __init__(self, rank, local_rank, world):
        self.rank, self.local_rank, self.world = rank, local_rank, world


def launched():
    try:
        cluster.apply()  # under srun or mpirun: their variables, as infinitrain.run's
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        return Launched(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world)
    except (KeyError, ValueError):
        msg = "WORLD_SIZE > 1 needs integer RANK and LOCAL_RANK (start with python -m infinitrain.run, srun or mpirun)"
        raise UsageError(msg) from None


class Plan:
    """What a RunConfig means on this machine: processes, devices, layout, accumulation, schedule, checks."""

    def __init__(self, cfg):
        self.mp = mp = launched()
        if mp and (cfg.devices or cfg.nthread_per_process > 1):
            raise UsageError(
                "under infinitrain.run each process trains on one device (its LOCAL_RANK's); --devices and "
                "--nthread_per_process choose several devices in one process"
            )
        if cfg.zero_stage and not mp:
            raise UsageError("--zero_stage shards across processes: start the run with python -m infinitrain.run")
        if cfg.zero_stage == 3 and cfg.precision_check:
            raise UsageError("--precision_check with --zero_stage=3 is not implemented (a rank holds a shard only)")
        self.layout = parallel_layout(cfg, mp)
        names = cfg.devices.split(",") if cfg.devices else [cfg.device]
        if mp:
            if not it.distributed.is_initialized():
                it.distributed.init_process_group()
            kind = it.runtime.parse_device(cfg.device).split(":")[0]
            names = ["cpu" if kind == "cpu" else f"{kind}:{mp.local_rank % it.runtime.device_count(kind)}"]
        if cfg.nthread_per_process > 1:
            kind = it.runtime.parse_device(cfg.device).split(":")[0]
            names = [f"{kind}:{i}" for i in range(cfg.nthread_per_process)]
        devices = [it.runtime.parse_device(d) for d in names]
        if len(set(devices)) != len(devices):
            raise UsageError(f"--devices must be distinct, got {','.join(names)}")
        if len(devices) > 1 and not it.distributed.has_ccl(devices[0]):
            raise UsageError(f"--devices: {devices[0]} has no collective library, so no data-parallel training")
        self.devices = devices
        B, T = cfg.batch_size, cfg.sequence_length
        replicas = self.layout.dp if self.layout else len(devices) * (mp.world if mp else 1)
        self.total = cfg.total_batch_size or B * T * replicas
        if self.total % (B * T * replicas):
            what = "data-parallel ranks" if self.layout else "processes" if mp else "devices"
            raise UsageError(
                f"--total_batch_size={self.total} must be a multiple of "
                f"batch_size*sequence_length*{what}={B * T * replicas}"
            )
        self.accum = self.total // (B * T * replicas)
        if self.accum > MAX_ACCUMULATION:
            raise UsageError(
                f"--total_batch_size={self.total}: a step of {self.accum} micro-batches of {B}x{T} tokens"
                f"{f' x {replicas} replicas' if replicas > 1 else ''}; more than {MAX_ACCUMULATION} per step is "
                "refused (such a step hardly ever finishes): raise --batch_size or lower --total_batch_size"
            )
        self.replicas = replicas
        try:
            self.schedule = Schedule(
                cfg.learning_rate, style=cfg.lr_decay_style, warmup_iters=cfg.lr_warmup_iters,
                warmup_init=cfg.lr_warmup_init, min_lr=cfg.resolved_min_lr, decay_iters=cfg.decay_iters,
            )  # fmt: skip
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.prec_cfg = None
        if cfg.precision_check:
            try:
                self.prec_cfg = precision.parse_config(cfg.precision_check)
            except ValueError as e:
                raise UsageError(str(e)) from None
        self.profile_steps = parse_range(cfg.profile_steps, "--profile_steps") if cfg.profile_steps else None
        if not (cfg.resume or cfg.load):  # a continued run is checked once its start step is known
            check_step_flags(cfg, self.profile_steps, self.prec_cfg, 0, cfg.num_iteration)

    def strategy(self, cfg):
        if self.layout:
            return strategy.ModelParallel(cfg, self.devices, self.mp, self.layout, self.accum)
        if self.mp:
            return strategy.DataParallel(cfg, self.devices, self.mp)
        return strategy.Local(cfg, self.devices)


class Trainer:
    """Trains the model a RunConfig describes, under a Strategy (default: the one the config and the machine
    imply). fit() returns 0 when every step ran; it raises Stopped after a signal, UsageError for bad settings and
    TrainError when training cannot go on."""

    def __init__(self, config, strategy=None, run_defaults=None):
        self.cfg = config
        self._strategy = strategy
        # Settings checkpoints of earlier versions do not record take these values.
        self.run_defaults = dict(run_defaults or {k: defaults()[k] for k in RUN_FLAGS}, n_devices=1)

    # ---- the loop ----
    def fit(self):
        self.restart = restart_round()
        if self.restart:
            self.cfg = continued_after_restart(self.cfg)
        cfg = self.cfg
        self.plan = plan = Plan(cfg)
        self.strategy = self._strategy or plan.strategy(cfg)
        lead = self.strategy.lead
        outputs = _Outputs(cfg, lead)
        try:
            with StopRequest() as stop:  # signals stop the run cleanly from here on
                self.strategy.stop = stop  # a step checks it between micro-batches
                self.abandoned = None
                self._setup(outputs)
                done = start = self.start
                self.last_saved = start or None
                try:
                    for step in range(start, cfg.num_iteration):
                        if self.strategy.stop_requested(stop):
                            break
                        if self._step(step) is None:
                            break  # a signal gave the step up between micro-batches
                        done = step + 1
                        if cfg.save and self._due(cfg.save_interval, done):
                            with self._pause():
                                self._save(done)
                            self.last_saved = done
                        if cfg.freq_generate_txt and self.tokenizer is not None and done % cfg.freq_generate_txt == 0:
                            self._print_sample(done)
                except BaseException as e:
                    status = "stopped" if isinstance(e, (KeyboardInterrupt, Stopped)) else "failed"
                    error = " ".join(str(e).split())[:500]
                    outputs.metrics.write({"kind": "end", "status": status, "step": done, "error": error})
                    raise
                finally:
                    self._close_step_tools()
                self.progress.clear()
                if stop.signum and done < cfg.num_iteration:
                    self._stopped(stop.signum, done)
                outputs.metrics.write({"kind": "end", "status": "completed", "step": done})
                self._finish()
                return 0
        finally:
            self.strategy.stop = None
            outputs.close()

    def _due(self, every, done):
        return done == self.cfg.num_iteration or (every and done % every == 0)

    def _step(self, step):
        """One optimizer step with its report (printed, logged, in the metrics), the evaluation when due; None
        only when the step was not taken."""
        cfg, plan = self.cfg, self.plan
        if self.profile_steps and step + 1 == min(self.profile_steps):
            self.prof = it.profiler.profile().__enter__()
        mark = self.prof.mark(f"step {step + 1}") if self.prof is not None else strategy.Nothing()
        t0 = time.time()
        lr = plan.schedule(step)
        # A step given up midway must leave the data position and the generator as the last completed step left
        # them: the checkpoint saved at the stop holds them, and a resumed run redoes this step from there.
        loader_state, rng_state = self.loader.state_dict(), it.random.default_generator.get_state()
        with mark:
            try:
                train_loss, norm = self.strategy.step(step, lr, self.loader, plan.accum, self.prof, self.recorder)
            except strategy.StepAbandoned as e:
                self.loader.load_state_dict(loader_state)
                it.random.default_generator.set_state(rng_state)
                self.abandoned = e
                return None
        ms = (time.time() - t0) * 1000
        if self.prof is not None and step + 1 == max(self.profile_steps):
            self.prof.__exit__(None, None, None)
            write_profile(self.prof, self.run_dir, cfg.profile_name, self.profile_steps)
            self.prof = None
        device = self.strategy.device
        mem = it.runtime.max_memory_allocated(device) / 2**20
        done = step + 1
        line = (
            f"step {done}/{cfg.num_iteration} | train loss {train_loss:.6f} | lr {lr:.2e} | "
            f"norm {norm:.4f} | {ms:.1f} ms | {plan.total / (ms / 1000):.0f} tok/s | mem {mem:.1f} MiB"
        )
        self.progress.clear()
        print(line, flush=True)
        self.outputs.log.write(line)
        record = {"kind": "step", "step": done, "train_loss": train_loss, "lr": lr, "grad_norm": norm, "ms": ms}
        record["tokens_per_s"] = plan.total / (ms / 1000)
        record["tokens"] = done * plan.total
        record["mem_allocated_mib"] = it.runtime.memory_allocated(device) / 2**20
        record["mem_peak_mib"] = mem
        if not (math.isfinite(train_loss) and math.isfinite(norm)) and not cfg.allow_nonfinite:
            self.outputs.metrics.write(record)
            raise TrainError(
                f"non-finite {'loss' if not math.isfinite(train_loss) else 'gradient norm'} at step {done} "
                f"(loss {train_loss}, norm {norm}); stopped without saving{self._kept_note()}. Lower "
                "--learning_rate, or pass --allow_nonfinite to keep going"
            )
        if self.val_loader is not None and cfg.val_loss_every and self._due(cfg.val_loss_every, done):
            with self._pause():
                record["val_loss"] = self.strategy.evaluate(self.val_loader, cfg.val_batches)
            self.progress.clear()
            print(f"step {done} | val loss {record['val_loss']:.6f}")
            self.outputs.log.write(f"step {done} | val loss {record['val_loss']:.6f}")
        self.outputs.metrics.write(record)
        self.progress.show(done, train_loss)
        return record

    # ---- set-up ----
    def _setup(self, outputs):
        """Data, model, strategy, resume, the header and the config record; outputs opened first, so a bad directory
        or file fails before any of that."""
        cfg = self.cfg
        self.outputs = outputs
        check_inputs(cfg, self.prec_cfg)
        outputs.open()
        self.run_dir = outputs.run_dir
        check_outputs(cfg, self.run_dir, self.profile_steps)
        it.manual_seed(cfg.seed)
        self._setup_data()
        self._setup_model()
        self._resume()
        self._check_room()
        check_step_flags(cfg, self.profile_steps, self.prec_cfg, self.start, cfg.num_iteration)
        self._announce()
        self.progress = Progress(cfg.num_iteration, self.start)
        self.prof = None
        self.recorder = self._precision_recorder()

    def _setup_data(self):
        cfg, rows = self.cfg, self.strategy.rows
        B, T = cfg.batch_size, cfg.sequence_length
        self.train_path, self.val_path, self.tokenizer, kind = resolve_data(cfg)
        # One loader feeds every replica: each micro-batch has B rows per device (and per process: every process
        # reads the global batch and takes its rows, so the run sees the data one process on all of it would).
        self.loader = open_tokens("--input_bin", self.train_path, B * rows, T, shuffle=True, seed=cfg.seed)
        self.val_loader = None
        if self.val_path and (cfg.val_loss_every or cfg.input_val_bin):  # an explicit file is checked even if unused
            self.val_loader = open_tokens("--input_val_bin", self.val_path, B * rows, T, shuffle=False)
        self.token_kind = kind
        self._check_sizes(B * rows, T)

    def _check_sizes(self, rows, T):
        """Refuses a step that needs more micro-batches than the training data holds (each step would reread
        batches of the same step), and --val_batches beyond the validation data (it was cut silently)."""
        cfg, accum, held = self.cfg, self.plan.accum, self.loader.batches_per_epoch
        if accum > held:
            raise UsageError(
                f"--total_batch_size={self.plan.total}: a step reads {accum} micro-batches of {rows}x{T} tokens, but "
                f"--input_bin={self.train_path} holds {len(self.loader.tokens)} tokens ({held} such batches): lower "
                "--total_batch_size or use more data"
            )
        if self.val_loader is None or not cfg.val_loss_every:
            return
        val_held = self.val_loader.batches_per_epoch
        if cfg.val_batches <= val_held:
            return
        what = f"{self.val_path} holds {val_held} validation batch{'es' if val_held > 1 else ''} of {rows}x{T} tokens"
        if "val_batches" in cfg.present:
            raise UsageError(f"--val_batches={cfg.val_batches}: {what}; lower --val_batches or use a longer file")
        print(f"note: {what}; each validation uses {val_held}, not --val_batches={cfg.val_batches}")

    def _setup_model(self):
        cfg, plan, st = self.cfg, self.plan, self.strategy
        vocab, vocab_from = cfg.vocab_size, "--vocab_size"
        if vocab is None and self.tokenizer is not None:
            vocab = self.tokenizer.vocab_size
            vocab_from = f"--tokenizer_bin={cfg.tokenizer_bin}" if cfg.tokenizer_bin else "the byte tokenizer"
        present = cfg.present
        for name in ("llmc_filepath", "init_from", "config_json"):
            if getattr(cfg, name) and "vocab_size" in present:
                raise UsageError(f"--vocab_size conflicts with --{name} (it fixes the vocabulary); drop it")
        # Shape flags given: ours default to None, the models' (--intermediate_size, ...) count when set.
        shape = {k: getattr(cfg, k) for k in models_registry.SHAPE_FLAGS if getattr(cfg, k) is not None}
        shape = {k: v for k, v in shape.items() if k in ("n_layer", "n_head", "n_kv_head", "n_embd") or k in present}
        try:
            spec = models_registry.resolve(
                cfg.model, shape=shape, sequence_length=cfg.sequence_length, vocab_size=vocab, vocab_from=vocab_from,
                llmc_filepath=cfg.llmc_filepath, token_kind=self.token_kind, init_from=cfg.init_from,
                config_json=cfg.config_json, router_aux_loss_coef=cfg.router_aux_loss_coef,
            )  # fmt: skip
        except models_registry.ModelChoiceError as e:
            raise UsageError(str(e)) from None
        if plan.layout and spec.fields:  # the layout against the model's shape, before anything is built
            config = spec.family.config(spec.fields)
            strategy.check_parallel_model(
                plan.layout, spec.family.tensor_parallel, config, cfg.sequence_length, plan.accum
            )
        lora_cfg = lora_settings(cfg, spec.family.name)
        recipe = None
        if cfg.fp8:
            ok, why = fp8.supported(st.device)
            if not ok:
                raise UsageError(f"--fp8: {why}; train without --fp8 on this device")
            recipe = fp8.Recipe(scaling=cfg.fp8_scaling, amax_history_len=cfg.fp8_amax_history)

        def adapt(m):
            if recipe is not None:
                fp8.convert(m, recipe)
            return apply_lora(m, spec.family.name, lora_cfg)

        try:
            st.build(spec, adapt)
        except (ValueError, FileNotFoundError) as e:  # a pretrained folder or config the models refuse
            raise UsageError(" ".join(str(e).split())) from None
        model = st.full if isinstance(st, strategy.ModelParallel) else st.model
        if recipe is not None:
            print(
                f"fp8: {getattr(model, 'fp8_layers', 0)} linear layers in FP8 ({recipe.scaling} scaling"
                + (f", amax history {recipe.amax_history_len}" if recipe.scaling == "delayed" else "")
                + "; heads and embeddings in the compute dtype)"
            )
        self.family, self.n_params = spec.family.name, st.num_parameters()
        self.model_config = models_registry.config_dict(model)
        self._check_data_fits(spec, vocab_from)
        self.loader, self.val_loader = st.split_loaders(self.loader, self.val_loader)
        if cfg.activation_recompute and cfg.zero_stage != 3:  # ZeRO-3 recomputes every block already
            if not spec.family.can_recompute(st.model.config):
                raise UsageError(
                    "--activation_recompute is not implemented for mixture-of-experts models (the router's balancing "
                    "loss is a side output of each block's forward)"
                )
            for m in st.models:
                recompute.enable(m, spec.family.block_list(m))

    def _check_data_fits(self, spec, vocab_from):
        cfg, st = self.cfg, self.strategy
        model_vocab = st.model.config.vocab_size
        what = f"--llmc_filepath={cfg.llmc_filepath}" if cfg.llmc_filepath else spec.vocab_from or vocab_from
        for path, ld in ((self.train_path, self.loader), (self.val_path, self.val_loader)):
            if ld is not None:
                check_vocab(path, ld, model_vocab, what)
        if cfg.sequence_length > st.model.config.block_size:
            raise UsageError(
                f"--sequence_length={cfg.sequence_length} exceeds the model's block_size {st.model.config.block_size}"
            )
        tok = self.tokenizer
        if tok is not None and tok.vocab_size < model_vocab and cfg.freq_generate_txt:
            what = f"the tokenizer's {tok.vocab_size} tokens do not cover the model's {model_vocab}"
            print(f"warning: no samples: {what}")
            self.tokenizer = None
        if not st.samples:
            if self.tokenizer is not None and cfg.freq_generate_txt and isinstance(st, strategy.ModelParallel):
                print("note: no samples under tensor/pipeline parallelism (merge a checkpoint and sample from it)")
            self.tokenizer = None

    def _ckpt_args(self):
        cfg, st = self.cfg, self.strategy
        tok_name = cfg.tokenizer_bin or ("byte" if isinstance(self.tokenizer, ByteTokenizer) else "")
        self.tok_name = tok_name
        extra = {"model_config": {"family": self.family, "fields": self.model_config}, "tokenizer": tok_name}
        if lora.lora_modules(st.model):  # sample and export rebuild the adapters before loading the weights
            extra["lora"] = dict(st.model._lora_config)
        self.run = run_settings(cfg, self.plan.replicas, self.model_config)
        self.data = token_file_identity(self.train_path)
        args = {"model_name": self.family, "run": self.run, "data": self.data, "extra": extra}
        args["with_optimizer"] = cfg.save_optimizer_state
        return args

    def _resume(self):
        cfg, st = self.cfg, self.strategy
        self.ckpt_args = self._ckpt_args()
        self.start = 0
        ckpt_dir = self.outputs.ckpt_dir
        if not (cfg.resume or (cfg.load and cfg.save and _inside(cfg.load, cfg.save))):
            self._refuse_earlier_run(resuming=False)  # a run that starts over (or continues another directory)
        if not (cfg.resume or cfg.load):
            return
        check = {"model_name": self.family, "run": self.run, "run_defaults": self.run_defaults, "data": self.data}
        check["allow_other_data"] = cfg.allow_other_data
        if cfg.resume:
            candidates = ckpt_dir.checkpoints() if st.lead else []
            where, extend = ckpt_dir.directory if st.lead else cfg.save, False
        else:
            candidates = checkpoints.checkpoint_candidates(cfg.load) if st.lead else []
            where, extend = cfg.load, True
        self.start, _ = st.resume_from(
            candidates, ckpt_dir, self.loader, where=where, extend=extend, load_optimizer=cfg.load_optimizer_state,
            before_scratch=lambda: self._refuse_earlier_run(resuming=True), **check,
        )  # fmt: skip
        if cfg.load and self.start >= cfg.num_iteration:
            raise UsageError(
                f"--load: the checkpoint is at step {self.start}; pass a --num_iteration above it to extend the run"
            )

    def _refuse_earlier_run(self, resuming):
        """Refuses to start over in a --save holding another run's files (RUN_FILE_PATTERNS, as found at start),
        unless they are an earlier attempt of this run that saved no checkpoint: no ckpt_* file, and a metrics file
        whose every run has this model and these settings (starting over then loses nothing)."""
        earlier, ckpt_dir = self.outputs.earlier, self.outputs.ckpt_dir
        if not earlier or self._earlier_attempt(earlier):
            return
        d = ckpt_dir.directory
        what = "no intact checkpoint to resume, but another run's files" if resuming else "another run's files"
        raise UsageError(
            f"--checkpoint_dir={d} holds {what} ({_listed(earlier)}); starting over there would mix the two runs: "
            f"{'run once with --fresh instead of --resume' if resuming else 'pass --fresh'} to move them into "
            f"{os.path.join(d, 'earlier-run-<time>')} and start from step 1"
            f"{'' if resuming else ', --resume to continue that run'}, or choose another directory"
        )

    def _earlier_attempt(self, earlier):
        if any(name.startswith("ckpt_") for name in earlier) or METRICS_NAME not in earlier:
            return False
        run = json.loads(json.dumps(self.run, default=str))  # as the metrics file holds it
        return same_run_metrics(os.path.join(self.outputs.ckpt_dir.directory, METRICS_NAME), self.family, run)

    def checkpoint_bytes(self):
        """An upper bound on one checkpoint's size: the model's state dict, the optimizer's moments when saved
        (Adam/AdamW: two per trainable value, float32, float64 for float64 parameters; SGD without momentum keeps
        none), and the header (names, shapes, meta). bfloat16 tensors count 4 bytes (they may be widened)."""
        cfg, st = self.cfg, self.strategy
        parallel_model = isinstance(st, strategy.ModelParallel)
        model = st.full if parallel_model else st.model
        state = model.state_dict()
        total = sum(st.numel(k, t) * (4 if t.dtype == "bfloat16" else t.itemsize) for k, t in state.items())
        n = len(state)
        if cfg.save_optimizer_state and cfg.optimizer in ("adam", "adamw"):
            trainable = {id(p) for p in (model.parameters() if parallel_model else st.params[0])}
            named = [(k, p) for k, p in model.named_parameters() if id(p) in trainable]
            total += sum(2 * st.numel(k, p) * (8 if p.dtype == "float64" else 4) for k, p in named)
            n += 2 * len(named)
        return total + (64 << 10) + 512 * n

    def _check_room(self):
        """Refuses a --save without room for two checkpoints (a new one is written before the previous one is
        deleted); the directory's checkpoints count as room (rotation deletes them)."""
        ckpt_dir = self.outputs.ckpt_dir
        if ckpt_dir is None:
            return
        each = self.checkpoint_bytes()
        try:
            free = ckpt_dir._free_bytes()
        except OSError:
            return  # a file system without statvfs: the first save reports a full disk
        reclaimable = ckpt_dir.checkpoint_bytes()
        if free + reclaimable >= 2 * each:
            return
        opt = f" and their {self.cfg.optimizer} state" if self.cfg.save_optimizer_state else ""
        has = f"{_size(free)} free" + (f" and {_size(reclaimable)} in its checkpoints" if reclaimable else "")
        raise UsageError(
            f"--checkpoint_dir={ckpt_dir.directory}: no room for two checkpoints of this model ({_size(2 * each)}: "
            f"{_size(each)} each, for {self.n_params / 1e6:.2f}M parameters{opt}); it has {has}: free some space or "
            "choose another directory"
        )

    def _announce(self):
        cfg, plan, st = self.cfg, self.plan, self.strategy
        n, world = len(plan.devices), plan.mp.world if plan.mp else 1
        replicas = f"{plan.layout.dp} data-parallel replicas" if plan.layout else f"{world} processes"
        B, T = cfg.batch_size, cfg.sequence_length
        header = (
            f"model {cfg.model} ({self.family}): {self.n_params / 1e6:.2f}M parameters | {st.describe()} | "
            f"dtype {cfg.dtype} | "
            f"batch {B}x{T}{f' x {n} devices' if n > 1 else ''}{f' x {replicas}' if plan.mp else ''}, "
            f"accumulation {plan.accum} | {cfg.num_iteration} steps | data {self.train_path}"
        )
        print(header)
        print(f"metrics: {self.outputs.metrics.path}")
        self.outputs.log.write(header)
        self.outputs.metrics.write(
            {
                "kind": "config", "start_step": self.start, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "host": socket.gethostname(), "argv": sys.argv[1:], "devices": plan.devices,
                "provider": it.backends.available(), "model": cfg.model, "family": self.family,
                "model_config": self.model_config, "parameters": self.n_params,
                "layout": parallel_shards.layout_meta(plan.layout) if plan.layout else None,
                "tokens_per_step": plan.total, "accumulation": plan.accum, "data": self.train_path,
                "tokenizer": self.tok_name, "flags": cfg.values(), "run": self.run, "restart": self.restart,
            }
        )  # fmt: skip

    @property
    def profile_steps(self):
        return self.plan.profile_steps if self.strategy.lead else None

    @property
    def prec_cfg(self):
        return self.plan.prec_cfg if self.strategy.lead else None

    def _precision_recorder(self):
        cfg = self.prec_cfg
        if not cfg:
            return None
        path = cfg["output_path"] or precision.default_path(self.run_dir)
        device = self.strategy.device
        try:
            recorder = precision.Recorder(
                path, cfg["steps"], level=cfg["level"], with_hash=cfg["hash"], device=device,
                meta={"device": device, "dtype": self.cfg.dtype, "model": self.cfg.model, "argv": sys.argv[1:]},
            )  # fmt: skip
        except OSError as e:
            raise UsageError(f"--precision_check output_path={path}: {e.strerror or e}") from None
        recorder.attach(self.strategy.model)
        print(f"precision check: steps {sorted(cfg['steps'])} into {path}")
        return recorder

    # ---- pieces of the loop ----
    def _pause(self):
        """Evaluation, saving and samples are left out of a profile."""
        return self.prof.pause() if self.prof is not None else strategy.Nothing()

    def _save(self, step):
        return self.strategy.save(self.outputs.ckpt_dir, step, self.loader, self.ckpt_args)

    def _kept_note(self):
        return f" (the checkpoint of step {self.last_saved} is intact)" if self.last_saved else ""

    def _print_sample(self, done):
        self.progress.clear()
        tok = self.tokenizer
        eot = tok.eot if tok.eot is not None else 0
        with self._pause():
            text = sample(self.strategy.model, tok.decode, eot, self.cfg.text_length, self.cfg.seed)
        print(f"--- sample at step {done} ---\n{text}\n---", flush=True)

    def _close_step_tools(self):
        if getattr(self, "prof", None) is not None:  # the run ended inside the profiled range
            self.prof.__exit__(None, None, None)
            write_profile(self.prof, self.run_dir, self.cfg.profile_name, self.profile_steps)
            self.prof = None
        if getattr(self, "recorder", None) is not None:
            self.recorder.close()

    def _stopped(self, signum, done):
        cfg, last_saved = self.cfg, self.last_saved
        name = signal.Signals(signum).name
        self.outputs.metrics.write({"kind": "end", "status": "stopped", "step": done, "signal": name})
        if self.abandoned is not None:
            e = self.abandoned
            print(f"{name}: gave up step {e.step} after {e.done} of its {e.accum} micro-batches", flush=True)
        if cfg.save and last_saved != done and done > 0:
            path = self._save(done)
            print(f"{name}: stopped at step {done}; saved {path} (continue with --resume)", flush=True)
        elif cfg.save and last_saved is not None:
            print(f"{name}: stopped at step {done}; the checkpoint of step {last_saved} is current", flush=True)
        else:
            print(f"{name}: stopped at step {done}; nothing saved (no --checkpoint_dir)", flush=True)
        raise Stopped(signum)

    def _finish(self):
        cfg = self.cfg
        if cfg.lora_save_path:
            with self.strategy.whole_model():  # every process enters: under ZeRO-3 the adapters are gathered
                if self.strategy.lead:
                    try:
                        lora.save_adapters(self.strategy.model, cfg.lora_save_path)
                    except OSError as e:  # checked at start, but the disk or its permissions may change meanwhile
                        raise TrainError(
                            f"--lora_save_path={cfg.lora_save_path}: the adapters were not saved: {e}"
                        ) from None
            if self.strategy.lead:
                print(f"saved the LoRA adapters to {cfg.lora_save_path}")
        if self.recorder is not None and self.prec_cfg["baseline"]:
            result = precision.first_divergence(self.prec_cfg["baseline"], self.recorder.path)
            print(precision.format_divergence(result, "baseline", "this run"))


# ---- outputs -----------------------------------------------------------------------------------------------------


class _Outputs:
    """The checkpoint directory, the step log and the metrics; rank 0 writes them (and prints), the other ranks
    of a run under the launcher train silently."""

    def __init__(self, cfg, lead):
        self.cfg, self.lead = cfg, lead
        self.ckpt_dir = self.log = self.metrics = None
        self.quiet = None
        self.earlier = []  # the run files --save held at start (RUN_FILE_PATTERNS), before this run wrote any

    def open(self):
        cfg, lead = self.cfg, self.lead
        if cfg.save and lead:
            self.ckpt_dir = CheckpointDir(cfg.save, cfg.max_checkpoint_keep)
            self.earlier = self.ckpt_dir.run_files()
        if not lead:
            self.quiet = open(os.devnull, "w")  # noqa: SIM115 (closed by close())
            sys.stdout, self.quiet = self.quiet, sys.stdout
        for path in self.ckpt_dir.removed if self.ckpt_dir else ():
            print(f"removed {path} (left by an interrupted save)")
        if cfg.fresh and self.earlier:  # before this run opens its metrics there
            if cfg.load and _inside(cfg.load, cfg.save):
                raise UsageError(f"--fresh would move away the checkpoint --load={cfg.load} continues from")
            moved = self.ckpt_dir.set_aside(self.earlier)
            print(f"--fresh: moved another run's files ({_listed(self.earlier)}) to {moved}")
            self.earlier = []
        self.log = Log(cfg.log_file if lead else None)
        if cfg.metrics_file:
            metrics_path = cfg.metrics_file
        else:
            metrics_path = os.path.join(cfg.save or default_run_dir(cfg.model), METRICS_NAME)
        if lead:
            flag = "--metrics_file" if cfg.metrics_file else "the metrics file"
            self.metrics = MetricsLog(metrics_path, flag, cfg.tensorboard_dir)
        else:
            self.metrics = NullMetrics(metrics_path)
        self.run_dir = os.path.dirname(metrics_path) or "."

    def close(self):
        for f in (self.log, self.metrics, self.ckpt_dir):
            if f is not None:
                f.close()
        if self.quiet:
            sys.stdout.close()
            sys.stdout = self.quiet


class NullMetrics:
    """The metrics of a rank other than 0: nothing is written."""

    def __init__(self, path):
        self.path = path

    def write(self, record):
        pass

    def close(self):
        pass


class Log:
    """--log_file: opened and written once at start, so an unwritable file fails before any training."""

    def __init__(self, path):
        self.path, self.f = path, None
        if path:
            try:
                self.f = open_output(path, "a")
            except OSError as e:
                raise UsageError(f"--log_file={path}: cannot open it: {e.strerror or e}") from None

    def write(self, line):
        if self.f is None:
            return
        try:
            self.f.write(line + "\n")
            self.f.flush()
        except OSError as e:
            raise TrainError(f"--log_file={self.path}: cannot write: {e.strerror or e}") from None

    def close(self):
        if self.f is not None:
            try:
                self.f.close()
            except OSError:
                pass


class Progress:
    """A one-line progress bar on a terminal's stderr (ours, not tqdm: the step lines go to stdout between bar
    updates, which this clears and redraws); silent otherwise."""

    def __init__(self, total, start=0):
        self.total, self.start, self.first = total, time.time(), start
        self.on = sys.stderr.isatty()

    def clear(self):
        if self.on:
            sys.stderr.write("\r\033[K")

    def show(self, done, loss=None):
        if not self.on:
            return
        width = 30
        filled = int(width * done / self.total)
        rate = (time.time() - self.start) / max(done - self.first, 1)
        eta = rate * (self.total - done)
        tail = f" loss {loss:.4f}" if loss is not None else ""
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} eta {eta:.0f}s{tail}")
        sys.stderr.flush()


def write_profile(prof, run_dir, name, steps):
    """The profile's table (printed, and saved as Markdown) and Chrome trace, in the run directory."""
    os.makedirs(run_dir, exist_ok=True)
    table = prof.table(top=15)
    span = f"{min(steps)}:{max(steps)}"
    md = os.path.join(run_dir, f"{name}.profile.md")
    with open_output(md, "w") as f:
        f.write(f"Profile of steps {span} ({len(prof.records)} kernels)\n\n{table}\n")
    trace = prof.export_chrome_trace(os.path.join(run_dir, f"{name}.trace.json"))
    print(f"profile of steps {span}:\n{table}\nprofile: {md}, Chrome trace {trace} (open in Perfetto)", flush=True)


def sample(model, decode, eot, length, seed):
    start = np.full((1, 1), eot, dtype=np.int64)
    out = model.generate(start, length, temperature=1.0, top_k=40, seed=seed)
    return decode(out[0, 1:].tolist())


def _inside(path, directory):
    """Whether `path` is `directory` or a file directly in it (symlinks resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or os.path.dirname(path) == directory


def _listed(names, most=5):
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def same_run_metrics(path, family, run):
    """Whether every run a metrics file records (its config lines) trained this model family with these settings.
    Lines that do not parse (a run killed while writing one) are skipped: they record no run."""
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("kind") == "config" and (record.get("family"), record.get("run")) != (family, run):
            return False
    return True


# ---- inputs and outputs checked at start -------------------------------------------------------------------------

# Flags naming files or folders a run reads: what each must be.
INPUT_FLAGS = (
    ("input_bin", "file"), ("input_val_bin", "file"), ("tokenizer_bin", "file"), ("llmc_filepath", "file"),
    ("config_json", "file"), ("init_from", "file or dir"), ("lora_load_path", "dir"), ("load", "file or dir"),
)  # fmt: skip


def check_inputs(cfg, prec_cfg):
    """Every input path is what its flag reads, and readable, before anything opens it (a FIFO would block the
    run, a device read as endless or empty data)."""
    paths = [(f"--{name}", getattr(cfg, name), expect) for name, expect in INPUT_FLAGS if getattr(cfg, name)]
    if prec_cfg and prec_cfg["baseline"]:
        paths.append(("--precision_check baseline", prec_cfg["baseline"], "file"))
    for flag, path, expect in paths:
        what = {"file": "a regular file", "dir": "a directory", "file or dir": "a file or directory"}[expect]
        try:
            check_input(path, expect, what)
        except FileNotFoundError:
            raise UsageError(f"{flag}={path}: no such file or directory") from None
        except PermissionError:
            raise UsageError(f"{flag}={path}: cannot be read (permission denied)") from None
        except ValueError as e:
            raise UsageError(f"{flag}={path}: {str(e).removeprefix(path + ': ')}") from None


def check_outputs(cfg, run_dir, profile_steps):
    """Files written at the end of a run are checked at start: the profile's (streamed: a regular file, a
    character device or nothing yet) and the LoRA adapters (replaced atomically: a regular file or nothing yet);
    never a directory, FIFO or block device."""
    files, streamed = [], ("regular file", "character device")
    if profile_steps:
        files += [(f"--profile_name={cfg.profile_name}", os.path.join(run_dir, cfg.profile_name + s), streamed)
                  for s in (".profile.md", ".trace.json")]  # fmt: skip
    if cfg.lora_save_path:
        kind = path_kind(cfg.lora_save_path)
        if kind not in (None, "directory"):
            raise UsageError(f"--lora_save_path={cfg.lora_save_path}: is a {kind}, not a directory")
        files += [(f"--lora_save_path={cfg.lora_save_path}", os.path.join(cfg.lora_save_path, n), ("regular file",))
                  for n in (lora.ADAPTER_WEIGHTS, lora.ADAPTER_CONFIG)]  # fmt: skip
        where = _nearest_existing(cfg.lora_save_path)
        if not os.access(where, os.W_OK | os.X_OK):
            raise UsageError(
                f"--lora_save_path={cfg.lora_save_path}: cannot write in {where} (read-only or no permission)"
            )
    for flag, path, allowed in files:
        kind = path_kind(path)
        if kind is not None and kind not in allowed:
            raise UsageError(f"{flag}: {path} is a {kind}, not a file to write to")


def restart_round():
    """How many times the launcher (infinitrain.run --max_restarts) restarted this run's workers: 0 at first."""
    value = os.environ.get(RESTART_ENV, "0")
    if not value.isdigit():
        raise UsageError(f"{RESTART_ENV}={value!r}: expected a count of restarts")
    return int(value)


def continued_after_restart(cfg):
    """The settings of a run the launcher restarted: it continues from the newest checkpoint in --save (as with
    --resume) when there is one, else starts as the first attempt did; never --fresh again (that would set the
    first attempt's files aside)."""
    if not cfg.save:
        if os.environ.get("RANK", "0") == "0":
            print(f"warning: restart {restart_round()} without --checkpoint_dir: training starts again from step 1")
        return cfg
    if os.path.isdir(cfg.save) and glob.glob(os.path.join(cfg.save, CKPT_PATTERN)):
        return cfg.replace(resume=True, load="", fresh=False)
    return cfg.replace(fresh=False) if cfg.fresh else cfg


def _nearest_existing(path):
    """path, or its nearest ancestor that exists (where writing it would create the rest)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


# ---- data --------------------------------------------------------------------------------------------------------


def resolve_data(cfg):
    """(train path, val path, tokenizer, token kind)."""
    if cfg.input_bin:
        train_path, val_path = cfg.input_bin, cfg.input_val_bin
    else:
        try:
            train_path, val_path = default_corpus()
        except RuntimeError as e:
            raise TrainError(f"{e}; to train without it, pass --input_bin=<an llm.c token file>") from None
        val_path = cfg.input_val_bin or val_path
    tokenizer = None
    if cfg.tokenizer_bin:
        try:  # an llm.c tokenizer file, or a Hugging Face tokenizer.json
            tokenizer = load_tokenizer(cfg.tokenizer_bin)
        except (ValueError, OSError) as e:
            raise UsageError(f"--tokenizer_bin: {' '.join(str(e).split())}") from None
    if tokenizer is None and not cfg.input_bin:
        tokenizer = ByteTokenizer()
    try:
        kind = read_tokens_header(train_path)[0]
    except (ValueError, OSError):
        kind = None  # open_tokens reports it
    return train_path, val_path, tokenizer, kind


def load_tokenizer(path):
    """A tokenizer for decoding samples: a Hugging Face tokenizer.json, or an llm.c tokenizer file."""
    return HFTokenizer.load(path) if str(path).endswith(".json") else Tokenizer.load(path)


def open_tokens(flag, path, batch_size, seq_len, **kw):
    """A DataLoader over a token file; a bad file is a usage error naming the flag."""
    try:
        return DataLoader(path, batch_size, seq_len, **kw)
    except (ValueError, OSError) as e:
        raise UsageError(
            f"{flag}: {e.strerror + ': ' + path if isinstance(e, OSError) and e.strerror else e}"
        ) from None


def check_vocab(path, loader, vocab_size, what):
    inner = loader
    while not hasattr(inner, "tokens"):  # a DeviceLoader or RankRows around the DataLoader
        inner = inner.loader
    tokens = inner.tokens
    top = int(tokens.max()) if len(tokens) else -1
    if top >= vocab_size:
        raise UsageError(f"{path} holds token id {top}, beyond the vocabulary of {vocab_size} tokens ({what})")


# ---- settings ----------------------------------------------------------------------------------------------------


def run_settings(cfg, n_devices, config):
    """The settings that shape the loss curve: flags (resolved: min_lr and lr_decay_iters are numbers), the
    model's shape and vocabulary, and the number of devices (which ones does not matter)."""
    settings = {k: getattr(cfg, k) for k in RUN_FLAGS}
    settings["min_lr"] = cfg.resolved_min_lr
    settings["lr_decay_iters"] = cfg.decay_iters
    for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size"):
        settings[k] = config.get(k)
    settings["n_devices"] = n_devices
    return settings


LORA_SHAPE_FLAGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout")


def lora_settings(cfg, family=""):
    """LoRA as the config asks (None: off): the models' adapters on lora_target_modules (empty: the family's
    attention projections), or the adapters of lora_load_path. The adapters carry their own rank, alpha, targets
    and dropout: any of those given explicitly with another value is refused."""
    if cfg.lora_load_path:
        check_lora_load_flags(cfg, family)
        return {"load": cfg.lora_load_path}
    if not cfg.lora_rank:
        if cfg.lora_save_path:
            raise UsageError("--lora_save_path needs --lora_rank (or --lora_load_path)")
        return None
    return {"rank": cfg.lora_rank, "alpha": cfg.lora_alpha, "targets": cfg.lora_target_modules,
            "dropout": cfg.lora_dropout}  # fmt: skip


def check_lora_load_flags(cfg, family):
    """Refuses --lora_rank/--lora_alpha/--lora_target_modules/--lora_dropout given explicitly with a value other
    than --lora_load_path's adapter_config.json records (equal ones, e.g. from a flag file, change nothing)."""
    given = [k for k in LORA_SHAPE_FLAGS if k in cfg.present]
    if not given:
        return
    path = cfg.lora_load_path
    saved = {}
    try:
        with open(os.path.join(path, lora.ADAPTER_CONFIG)) as f:
            adapter = json.load(f)
        saved = {"lora_rank": int(adapter["r"]), "lora_alpha": float(adapter["lora_alpha"])}
        saved["lora_dropout"] = float(adapter.get("lora_dropout", 0.0))
        saved["lora_target_modules"] = sorted(lora._patterns(adapter["target_modules"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable: loading the adapters reports it; every explicit flag is then a conflict
    conflicts = []
    for k in given:
        v = getattr(cfg, k)
        if k == "lora_target_modules":
            v = v or models_registry.FAMILIES[family].lora_targets
            v = sorted(p.strip() for p in v.split(",") if p.strip())
        elif k == "lora_rank":
            v = int(v)
        else:
            v = float(v)
        if saved.get(k) != v:
            conflicts.append(f"--{k}={getattr(cfg, k)}" + (f" (the adapters': {saved[k]})" if k in saved else ""))
    if conflicts:
        raise UsageError(
            f"{', '.join(conflicts)} conflict{'s' if len(conflicts) == 1 else ''} with --lora_load_path={path}: the "
            "adapters bring their own rank, alpha, targets and dropout; drop "
            + ", ".join(c.split("=")[0] for c in conflicts)
        )


def apply_lora(model, family, settings):
    """Adapts the model in place (models/lora.py); returns the parameters to train (all without LoRA)."""
    if settings is None:
        return list(model.parameters())
    try:
        if "load" in settings:
            lora.load_adapters(model, settings["load"])
            return lora.trainable_parameters(model)
        return models_registry.setup_lora(
            model, family, settings["rank"], settings["alpha"], settings["targets"], settings["dropout"]
        )
    except (ValueError, KeyError, OSError) as e:
        raise UsageError(f"LoRA: {' '.join(str(e).split())}") from None


def check_step_flags(cfg, profile_steps, prec_cfg, start, num_iteration):
    """Refuses --profile_steps and --precision_check steps that this run (steps start+1..num_iteration) never
    reaches: they would record nothing. A profile must begin within the run; a record needs one step in it."""
    first = start + 1
    span = f"steps {first}..{num_iteration}" if first <= num_iteration else "no steps"
    why = f"this run trains {span} (--num_iteration={num_iteration}"
    why += f", resumed at step {start})" if start else ")"
    if profile_steps and not first <= min(profile_steps) <= num_iteration:
        raise UsageError(
            f"--profile_steps={cfg.profile_steps}: {why}; the profile must start at a step in {first}.."
            f"{num_iteration}, or nothing is recorded"
        )
    if prec_cfg and not any(first <= s <= num_iteration for s in prec_cfg["steps"]):
        steps = prec_cfg["steps"]
        text = f"{min(steps)}:{max(steps)}" if len(steps) > 1 else f"{min(steps)}"
        raise UsageError(
            f"--precision_check steps={text}: {why}; choose steps within {first}..{num_iteration}, or nothing "
            "is recorded"
        )


def parse_range(text, flag):
    try:
        return precision.parse_steps(text, flag)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parallel_layout(cfg, mp):
    """The layout the parallel flags ask for (None: no model parallelism), refused when it cannot work."""
    tp, pp, vpp = cfg.tensor_parallel, cfg.pipeline_parallel, cfg.virtual_pipeline_parallel
    sp = cfg.sequence_parallel
    if tp == 1 and pp == 1 and vpp == 1 and not sp:
        return None
    if not mp:
        given = [f"--{k}" for k, v in (("tensor_parallel", tp > 1), ("sequence_parallel", sp), ("pipeline_parallel",
                 pp > 1), ("virtual_pipeline_parallel", vpp > 1)) if v]  # fmt: skip
        raise UsageError(
            f"{', '.join(given)}: model parallelism splits the model across processes: start the run with python -m "
            "infinitrain.run --nproc_per_node=N (N = data x pipeline x tensor parallel sizes)"
        )
    try:
        layout = parallel.make_layout(mp.world, tp, pp, vpp, sp, cfg.pipeline_schedule)
    except parallel.LayoutError as e:
        raise UsageError(f"{e} (--tensor_parallel={tp}, --pipeline_parallel={pp}, {mp.world} processes)") from None
    for bad, why in (
        (cfg.zero_stage == 2, "--zero_stage=2 shards gradients inside DDP; with tensor/pipeline parallelism use "
                              "--zero_stage=1"),
        (cfg.zero_stage == 3, "--zero_stage=3 shards whole models; with tensor/pipeline parallelism use "
                              "--zero_stage=1"),
        (cfg.lora_rank or cfg.lora_load_path, "LoRA is not implemented with tensor/pipeline parallelism"),
        (cfg.precision_check, "--precision_check records one whole model; not with tensor/pipeline parallelism"),
        (cfg.activation_recompute, "--activation_recompute is not implemented with tensor/pipeline parallelism"),
    ):  # fmt: skip
        if bad:
            raise UsageError(why)
    return layout
