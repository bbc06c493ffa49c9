"""The train CLI: trains GPT-2 or LLaMA 3 on llm.c token files (default: the
embedded Shakespeare corpus, byte-level), with gradient accumulation,
warmup+cosine learning rate, optional bfloat16 autocast, atomic checkpoints
and exact resume.

    ./bazelw run //python:train -- --num_iteration=200
"""

import glob
import os
import sys
import time

import numpy as np
from absl import app, flags

import infinitrain as it
from infinitrain import _C, checkpoint
from infinitrain.data import ByteTokenizer, DataLoader, Tokenizer, default_corpus
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config

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
flags.DEFINE_string("checkpoint_dir", "", "Directory for checkpoints (empty: none).")
flags.DEFINE_integer("checkpoint_every", 0, "Save every N steps (0: only at the end).", lower_bound=0)
flags.DEFINE_bool("resume", False, "Resume from the latest checkpoint in --checkpoint_dir.")
flags.DEFINE_integer("seed", 42, "Seed for initialisation and data order.", lower_bound=0)
flags.DEFINE_integer("sample_every", 100, "Print a generated sample every N steps (0: never).", lower_bound=0)
flags.DEFINE_integer("sample_length", 96, "Tokens per sample.", lower_bound=1)
flags.DEFINE_integer("val_every", 0, "Evaluate validation loss every N steps (0: never).", lower_bound=0)
flags.DEFINE_integer("val_batches", 4, "Batches per validation.", lower_bound=1)
flags.DEFINE_integer("n_layer", 4, "Layers of a fresh model.", lower_bound=1)
flags.DEFINE_integer("n_head", 4, "Attention heads of a fresh model.", lower_bound=1)
flags.DEFINE_integer("n_kv_head", 2, "Key/value heads of a fresh LLaMA 3.", lower_bound=1)
flags.DEFINE_integer("n_embd", 128, "Width of a fresh model.", lower_bound=1)
flags.DEFINE_string("log_file", "", "Also append step lines to this file.")

CKPT_PATTERN = "ckpt_*.bin"


class UsageError(ValueError):
    pass


def build_model(vocab_size, device):
    if FLAGS.llmc_filepath:
        cls = GPT2 if FLAGS.model == "gpt2" else LLaMA3
        return cls.from_llmc(FLAGS.llmc_filepath, device)
    T = FLAGS.sequence_length
    if FLAGS.model == "gpt2":
        padded = -(-vocab_size // 64) * 64
        cfg = GPT2Config(T, vocab_size, padded, FLAGS.n_layer, FLAGS.n_head, FLAGS.n_embd)
        return GPT2(cfg, device)
    cfg = LLaMA3Config(
        block_size=T,
        vocab_size=vocab_size,
        n_layer=FLAGS.n_layer,
        n_head=FLAGS.n_head,
        n_kv_head=FLAGS.n_kv_head,
        n_embd=FLAGS.n_embd,
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


def run_settings():
    """The flags that shape the loss curve, plus the number of devices (which ones does not matter)."""
    settings = {k: getattr(FLAGS, k) for k in RUN_FLAGS}
    settings["n_devices"] = len(FLAGS.devices.split(",")) if FLAGS.devices else 1
    return settings


def _default(k):
    return 1 if k == "n_devices" else FLAGS[k].default


def latest_checkpoint(directory):
    paths = sorted(glob.glob(os.path.join(directory, CKPT_PATTERN)))
    return paths[-1] if paths else None


def save_checkpoint(directory, step, model, optimizer, loader, keep=2):
    tensors = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    tensors.update({f"optim.{k}": v for k, v in opt["tensors"].items()})
    meta = {
        "step": step,
        "optimizer": {"step": opt["step"], "lr": opt["lr"]},
        "loader": loader.state_dict(),
        "generator": it.random.default_generator.get_state(),
        "model": FLAGS.model,
        "run": run_settings(),
    }
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"ckpt_{step:08d}.bin")
    checkpoint.save(path, tensors, meta)
    for old in sorted(glob.glob(os.path.join(directory, CKPT_PATTERN)))[:-keep]:
        os.remove(old)
    return path


def load_checkpoint(path, model, optimizer, loader):
    tensors, meta = checkpoint.load(path)
    if meta.get("model") != FLAGS.model:
        raise UsageError(f"{path} holds a {meta.get('model')} checkpoint, but --model={FLAGS.model}")
    saved, now = meta.get("run", {}), run_settings()
    changed = [
        f"--{k}={now[k]} (checkpoint: {saved.get(k, _default(k))})" for k in now if saved.get(k, _default(k)) != now[k]
    ]
    if changed:
        raise UsageError(f"{path} was trained with other settings; resuming would change the run: {', '.join(changed)}")
    model.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    opt_tensors = {k[len("optim.") :]: v for k, v in tensors.items() if k.startswith("optim.")}
    optimizer.load_state_dict({**meta["optimizer"], "tensors": opt_tensors})
    loader.load_state_dict(meta["loader"])
    it.random.default_generator.set_state(meta["generator"])
    return int(meta["step"])


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


def sample(model, decode, eot, device):
    start = np.full((1, 1), eot, dtype=np.int64)
    out = model.generate(start, FLAGS.sample_length, temperature=1.0, top_k=40, seed=FLAGS.seed)
    return decode(out[0, 1:].tolist())


def main(argv):
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])  # `bazel run`: paths are relative to the caller
    if FLAGS.resume and not FLAGS.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint_dir")
    devices = [_C.parse_device(d) for d in (FLAGS.devices.split(",") if FLAGS.devices else [FLAGS.device])]
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices must be distinct, got {FLAGS.devices}")
    n = len(devices)
    if n > 1 and not it.distributed.has_ccl(devices[0]):
        raise UsageError(f"--devices: {devices[0]} has no collective library, so no data-parallel training")
    device = devices[0]
    B, T = FLAGS.batch_size, FLAGS.sequence_length
    total = FLAGS.total_batch_size or B * T * n
    if total % (B * T * n):
        raise UsageError(
            f"--total_batch_size={total} must be a multiple of batch_size*sequence_length*devices={B * T * n}"
        )
    accum = total // (B * T * n)

    if FLAGS.input_bin:
        train_path, val_path = FLAGS.input_bin, FLAGS.input_val_bin
    else:
        train_path, val_path = default_corpus()
        val_path = FLAGS.input_val_bin or val_path
    tokenizer = Tokenizer.load(FLAGS.tokenizer_bin) if FLAGS.tokenizer_bin else None
    if tokenizer is None and not FLAGS.input_bin:
        tokenizer = ByteTokenizer()

    it.manual_seed(FLAGS.seed)
    # One loader feeds every device: each micro-batch has B rows per device.
    loader = DataLoader(train_path, B * n, T, shuffle=True, seed=FLAGS.seed)
    vocab = tokenizer.vocab_size if tokenizer is not None else int(loader.tokens.max()) + 1
    models = [build_model(vocab, device)]
    rng_state = it.random.default_generator.get_state()
    for d in devices[1:]:  # replicas start as copies of the first model
        replica = build_model(vocab, d)
        replica.load_state_dict(models[0].state_dict())
        models.append(replica)
    it.random.default_generator.set_state(rng_state)
    model = models[0]
    optimizers = [
        it.optim.AdamW(list(m.parameters()), lr=FLAGS.learning_rate, betas=(0.9, 0.95), weight_decay=FLAGS.weight_decay)
        for m in models
    ]
    schedule = it.optim.WarmupCosine(optimizers[0], FLAGS.warmup_steps, FLAGS.num_iteration)
    comms = it.distributed.init_all(devices) if n > 1 else None

    start = 0
    if FLAGS.resume:
        path = latest_checkpoint(FLAGS.checkpoint_dir)
        if path is None:
            print(f"no checkpoint in {FLAGS.checkpoint_dir}; starting from scratch")
        else:
            for m, opt in zip(models, optimizers, strict=True):
                start = load_checkpoint(path, m, opt, loader)
            print(f"resumed from {path} at step {start}")
    n_params = model.num_parameters()
    where = f"devices {','.join(devices)}" if n > 1 else f"device {device}"
    print(
        f"model {FLAGS.model}: {n_params / 1e6:.2f}M parameters | {where} | dtype {FLAGS.dtype} | "
        f"batch {B}x{T}{f' x {n} devices' if n > 1 else ''}, accumulation {accum} | {FLAGS.num_iteration} steps | "
        f"data {train_path}"
    )
    log = open(FLAGS.log_file, "a") if FLAGS.log_file else None
    progress = Progress(FLAGS.num_iteration)
    autocast = FLAGS.dtype == "bfloat16"
    eot = tokenizer.eot if tokenizer is not None and tokenizer.eot is not None else 0

    for step in range(start, FLAGS.num_iteration):
        t0 = time.time()
        lr = schedule.get_lr(step)
        for opt in optimizers:
            opt.lr = lr
            opt.zero_grad()
        _C.reset_peak_memory(device)
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
        norms = [it.optim.clip_grad_norm_(list(m.parameters()), FLAGS.grad_clip or None) for m in models]
        for opt in optimizers:
            opt.step()
        train_loss = sum(ls.item() for ls in loss_sums) / n  # the step's host synchronisation
        norm = norms[0].item()
        ms = (time.time() - t0) * 1000
        mem = _C.memory_stats(device)["peak_allocated"] / 2**20
        line = (
            f"step {step + 1}/{FLAGS.num_iteration} | train loss {train_loss:.6f} | lr {lr:.2e} | "
            f"norm {norm:.4f} | {ms:.1f} ms | {total / (ms / 1000):.0f} tok/s | mem {mem:.1f} MiB"
        )
        progress.clear()
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()
        progress.show(step + 1)
        done = step + 1
        if FLAGS.val_every and val_path and (done % FLAGS.val_every == 0 or done == FLAGS.num_iteration):
            progress.clear()
            print(f"step {done} | val loss {evaluate(model, val_path, device, n):.6f}", flush=True)
        if FLAGS.checkpoint_dir and (
            done == FLAGS.num_iteration or (FLAGS.checkpoint_every and done % FLAGS.checkpoint_every == 0)
        ):
            save_checkpoint(FLAGS.checkpoint_dir, done, model, optimizers[0], loader)
        if FLAGS.sample_every and tokenizer is not None and (done % FLAGS.sample_every == 0):
            progress.clear()
            print(f"--- sample at step {done} ---\n{sample(model, tokenizer.decode, eot, device)}\n---", flush=True)
    progress.clear()
    if log:
        log.close()


def average_gradients(models, comms):
    """All-reduces (averages) every parameter's gradient across the replicas, in place."""
    with it.distributed.group(comms[0].device):
        for m, comm in zip(models, comms, strict=True):
            for p in m.parameters():
                it.distributed.all_reduce(comm, p.grad, "avg")


@it.no_grad()
def evaluate(model, path, device, n_devices=1):
    """Mean loss over --val_batches batches of the run's global batch size, on one device."""
    loader = DataLoader(path, FLAGS.batch_size * n_devices, FLAGS.sequence_length, shuffle=False)
    losses = []
    for _ in range(min(FLAGS.val_batches, loader.batches_per_epoch)):
        x, y = next(loader)
        _, loss = model(it.from_numpy(x, device=device), it.from_numpy(y, device=device))
        losses.append(loss.item())
    return float(np.mean(losses))


def run():
    try:
        app.run(main)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
