"""Checkpoints of a training run: what a checkpoint holds (model, optimizer, loader position, generator, the settings
that shape the loss curve, the data's identity, the model's config), writing one, and continuing from one (the
newest intact of a directory, refusing another model's or other settings'). Under tensor/pipeline parallelism
every model-parallel rank writes its shard beside rank 0's main file.
"""

import glob
import json
import os
import sys

import infinitrain as it
from infinitrain.parallel import shards as parallel_shards
from infinitrain.runs import TrainError, UsageError, read_checkpoint

# Settings a --load may change when it extends a finished run.
EXTENDABLE = ("num_iteration", "lr_decay_iters")


def checkpoint_state(step, model, optimizer, loader, *, model_name, run, data, extra, with_optimizer=True,
                     model_state=None):  # fmt: skip
    """(tensors, meta) of a checkpoint: model, optimizer, loader position, generator, run settings, data identity,
    and `extra` (the model's config and tokenizer, so sample and export can rebuild it). model_state: the model's
    state as NumPy arrays, when the model does not hold it whole (ZeRO-3)."""
    if model_state is None:
        model_state = {k: v.numpy() for k, v in model.state_dict().items()}
    tensors = {f"model.{k}": v for k, v in model_state.items()}
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
        found = sorted(glob.glob(os.path.join(path, "ckpt_*.bin")))
        if not found:  # unlike --resume's first attempt, --load names a run to continue: it must be there
            raise UsageError(f"--load={path}: the directory holds no checkpoint (ckpt_*.bin)")
        return found
    if os.path.exists(path):
        return [path]
    raise UsageError(f"--load={path}: no such checkpoint file or directory")


def resume(
    candidates, ckpt_dir, models, optimizers, loader, *, where, extend=False, load_optimizer=True, pctx=None,
    before_scratch=None, **check,
):  # fmt: skip
    """Continues from the newest intact checkpoint of `candidates`; damaged ones in the run's own (locked)
    directory are set aside with a warning, others skipped. Returns (the step, the checkpoint's path), or (0, None)
    when there is none: before_scratch() may refuse that (raising)."""
    if not candidates:
        if before_scratch is not None:
            before_scratch()
        print(f"no checkpoint in {where}; starting from scratch")
        return 0, None
    moved_any = False
    for path in reversed(candidates):
        try:
            tensors, meta = read_checkpoint(path)
        except ValueError as e:
            if ckpt_dir is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(ckpt_dir.directory):
                moved, moved_any = ckpt_dir.mark_damaged(path), True
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
    hint = "; to start over there, pass --fresh instead of --resume (it moves that run's files aside)"
    raise TrainError(
        f"no intact checkpoint in {where}: every one was damaged (see the warnings above){hint if moved_any else ''}"
    )


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
