"""Fault campaign (issue 29): the project's fuzz and fault tests at scale, seeded, in one command.

Categories, each counted as tried / crashes / tracebacks / silent accepts / lost runs:
  files      mutated files of every format fed to the in-process loaders (crash: the loading process died;
             traceback: an exception other than ValueError/OSError; silent accept: a mutant that loads although
             its format must reject it: a checkpoint that loads unequal to the original, an llm.c header edit
             that loads a different or inconsistent result, a safetensors header edit that moves weights)
  files_cli  a sample of them through train (--load, --llmc_filepath, --input_bin, --tokenizer_bin,
             --init_from), sample and export (crash: a signal or an exit status other than 0/1/2/130/143)
  kill       SIGKILL/SIGTERM at random moments of a run saving every step, then --resume (lost run: it does not
             resume from the newest intact checkpoint, or its losses differ from an uninterrupted run's)
  bad_cli    generated bad flag values and combinations for the train CLI (expect status 1 or 2, an `error:`
             line, no traceback, no step; silent accept: status 0)
  multiproc  2 cpu workers under the launcher: kill -9, SIGTERM, SIGSTOP a worker; SIGKILL/SIGTERM the launcher
             (crash: the launcher hangs or dies of a signal it was not sent, or a worker outlives it)
  disk_full  --checkpoint_dir on a small tmpfs (lost run: the resume trusts a damaged checkpoint, or fails)
  read_only  outputs on a read-only tmpfs (silent accept: status 0 while an output could not be written)

    PYTHONPATH=python .venv/bin/python tests/fault_campaign.py --seed=20261205 --out=/tmp/fc
"""

import argparse
import collections
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kill_trials  # noqa: E402


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fuzz = _module("fuzz_loaders", os.path.join(HERE, "io", "test_fuzz_loaders.py"))

FORMATS = (*fuzz.FORMATS, "metrics")
OK_STATUS = {0, 1, 2, 130, 143}
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--vocab_size=64", "--sequence_length=16", "--batch_size=4"]
TINY += ["--sample_every=0", "--val_every=0"]
PY = sys.executable
COLS = ("tried", "crashes", "tracebacks", "silent accepts", "lost runs")


class Campaign:
    def __init__(self, out):
        self.out = out
        self.table = collections.OrderedDict()
        self.findings = []

    def count(self, cat, col, n=1):
        self.table.setdefault(cat, dict.fromkeys(COLS, 0))[col] += n

    def find(self, cat, col, what, repro=""):
        self.count(cat, col)
        self.findings.append({"category": cat, "kind": col, "what": what[:600], "repro": repro})
        print(f"  FINDING [{cat}/{col}] {what[:300]}", flush=True)


def env():
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    e.pop("BUILD_WORKING_DIRECTORY", None)
    return e


def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY))


def run_cli(args, timeout=60, **kw):
    """(status or 'hang', stdout, stderr) of a CLI child; a negative status is a signal."""
    try:
        p = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, env=env(), preexec_fn=cap_memory, **kw
        )
    except subprocess.TimeoutExpired as e:
        return "hang", str(e.stdout or ""), str(e.stderr or "")
    return p.returncode, p.stdout, p.stderr


def judge_cli(c, cat, status, err, repro, allow_zero=True):
    """Counts a crash (signal, hang, undocumented status) or a traceback; returns True when it was clean."""
    if status == "hang" or not isinstance(status, int) or status < 0 or status not in OK_STATUS:
        c.find(cat, "crashes", f"status {status}: {err.strip()[-300:]}", repro)
        return False
    if "Traceback" in err:
        c.find(cat, "tracebacks", f"status {status}: {err.strip()[-400:]}", repro)
        return False
    if status == 0 and not allow_zero:
        c.find(cat, "silent accepts", f"status 0 for a bad input: {err.strip()[-200:]}", repro)
        return False
    return True


def train(*flags):
    return [PY, "-m", "infinitrain.train", *flags]


def tiny_tokens(path, n=20000, seed=1):
    from infinitrain.data import write_tokens

    write_tokens(path, np.random.default_rng(seed).integers(0, 64, size=n), kind="gpt2")
    return path


# ---- (1) mutated files, in a child process per format ----------------------------------------------------------


def metrics_seed(d):
    """A metrics file of a real (tiny) run."""
    path = os.path.join(d, "metrics.jsonl")
    data = tiny_tokens(os.path.join(d, "m.bin"))
    subprocess.run(train(f"--input_bin={data}", *TINY, "--num_iteration=3", f"--metrics_file={path}"), env=env(),
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    with open(path, "rb") as f:
        return f.read()


def mutate_metrics(data, rng):
    lines = data.split(b"\n")
    if rng.random() < 0.5:  # one JSON edit of one line
        i = int(rng.integers(len(lines)))
        try:
            obj = json.loads(lines[i])
            lines[i] = json.dumps(fuzz.mutate_json_tree(obj, rng) if isinstance(obj, dict) else obj).encode()
        except ValueError:
            pass
        data = b"\n".join(lines)
    return fuzz.mutate("tokens", data, rng) if rng.random() < 0.6 else data


def value(fmt, path):
    """A comparable result of loading `path` (raises what the loader raises)."""
    from infinitrain import checkpoint, runs
    from infinitrain.data import Tokenizer, read_tokens
    from infinitrain.models import GPT2, LLaMA3, hf, registry

    if fmt in ("gpt2", "llama3", "llama3_llmc"):
        m = (GPT2 if fmt == "gpt2" else LLaMA3).from_llmc(path)
        return m.config, {k: np.asarray(v).copy() for k, v in m.state_dict().items()}
    if fmt == "tokens":
        return read_tokens(path).copy()
    if fmt == "tokenizer":
        t = Tokenizer.load(path)
        return t.vocab_size, t.eot, [t.decode([i]) for i in range(t.vocab_size)]
    if fmt in ("checkpoint", "checkpoint_v1"):
        tensors, meta = checkpoint.load(path)
        runs.read_checkpoint(path)
        return {k: np.asarray(v).copy() for k, v in tensors.items()}, meta
    if fmt in ("hf_safetensors", "hf_config"):
        folder = os.path.dirname(path)
        m = registry.from_pretrained(folder)
        entries = hf.read_header(os.path.join(folder, hf.WEIGHTS_FILE))
        header = [(e.name, e.dtype, e.shape, e.start, e.nbytes) for e in entries]  # not the file's mtime
        return m.config, {k: np.asarray(v).copy() for k, v in m.state_dict().items()}, header
    if fmt == "metrics":
        return runs.read_metrics(path)
    fuzz.load(fmt, path)
    return None


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b or (a != a and b != b)


def sane_model(cfg):
    """An llm.c model config that a header may legitimately say."""
    d = vars(cfg)
    ints = [d[k] for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")]
    if min(ints) < 1 or cfg.n_embd % cfg.n_head:
        return False
    if d.get("padded_vocab_size") is not None and cfg.padded_vocab_size < cfg.vocab_size:
        return False
    for k in ("norm_eps", "rope_theta"):
        if k in d and not (np.isfinite(d[k]) and d[k] > 0):
            return False
    return True


def silent(fmt, orig, got, data, seed_bytes, forged):
    """Why a loaded mutant is a silent accept, or None."""
    if same(orig, got) or forged:
        return None
    hb = fuzz.header_bytes(fmt, seed_bytes)
    header_only = len(data) == len(seed_bytes) and data[hb:] == seed_bytes[hb:]
    if fmt in ("checkpoint", "checkpoint_v1"):
        return "a mutated checkpoint loaded with contents unequal to the original (checksummed format)"
    if fmt in ("gpt2", "llama3", "llama3_llmc"):
        if not sane_model(got[0]):
            return f"loaded an inconsistent header: {got[0]}"
        if header_only and same(orig[1], got[1]) is False and got[0] == orig[0]:
            return "a header-only edit changed the weights without changing the config"
    if fmt == "tokens" and header_only:
        return f"a header-only edit loaded {len(got)} tokens unequal to the original {len(orig)}"
    if fmt == "tokenizer" and not (got[1] is None or 0 <= got[1] < got[0]):
        return f"loaded eot {got[1]} outside the vocabulary of {got[0]}"
    if fmt == "hf_safetensors" and header_only and got[0] == orig[0]:
        if [e[:2] for e in got[2]] == [e[:2] for e in orig[2]]:
            return "a safetensors header edit (same dtypes) loaded different weights"
    if fmt in ("hf_config", "hf_safetensors") and not sane_model(got[0]):
        return f"loaded an inconsistent config: {got[0]}"
    return None


def files_child(fmt, count, seed, workdir, keep):
    """Prints one JSON line per case that is not a clean accept or rejection, and 'done'."""
    import infinitrain  # noqa: F401

    seeds = fuzz.make_seeds(workdir)
    seeds["metrics"] = metrics_seed(workdir)
    path = os.path.join(workdir, f"mutant-{fmt}.bin")
    if fmt in fuzz.HF_FILES:
        folder = os.path.join(workdir, f"mutant-{fmt}")
        os.makedirs(folder, exist_ok=True)
        for other in ("hf_safetensors", "hf_config") if fmt != "hf_tokenizer" else ():
            with open(os.path.join(folder, fuzz.HF_FILES[other]), "wb") as f:
                f.write(seeds[other])
        path = os.path.join(folder, fuzz.HF_FILES[fmt])
    with open(path, "wb") as f:
        f.write(seeds[fmt])
    orig = value(fmt, path)
    rng = np.random.default_rng([seed, FORMATS.index(fmt)])
    stats = collections.Counter()
    for i in range(count):
        forged = False
        if fmt == "metrics":
            data = mutate_metrics(seeds[fmt], rng)
        elif fmt in ("checkpoint", "checkpoint_v1") and rng.random() < 0.5:
            data, forged = fuzz.mutate(fmt, seeds[fmt], rng), True  # may recompute the checksum
        elif fmt in ("checkpoint", "checkpoint_v1"):
            data = fuzz.mutate("tokens", seeds[fmt], rng)  # byte edits only, the checksum kept
        else:
            data = fuzz.mutate(fmt, seeds[fmt], rng)
        with open(path, "wb") as f:
            f.write(data)
        print(json.dumps({"progress": i}), flush=True) if i % 50 == 0 else None
        rec = None
        try:
            got = value(fmt, path)
            stats["accepted"] += 1
            why = silent(fmt, orig, got, data, seeds[fmt], forged)
            if why:
                rec = {"kind": "silent accepts", "what": why}
        except (ValueError, OSError):
            stats["rejected"] += 1
        except BaseException as e:  # noqa: BLE001 - the finding
            rec = {"kind": "tracebacks", "what": f"{type(e).__name__}: {str(e)[:300]}"}
        if rec:
            keep_path = os.path.join(keep, f"{fmt}-{i}.bin")
            with open(keep_path, "wb") as f:
                f.write(data)
            print(json.dumps(dict(rec, case=i, file=keep_path)), flush=True)
    print(json.dumps({"done": dict(stats)}), flush=True)


def campaign_files(c, args):
    keep = os.path.join(args.out, "mutants")
    os.makedirs(keep, exist_ok=True)
    per = -(-args.files // len(FORMATS))
    for fmt in FORMATS:
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="fc-files-") as wd:
            cmd = [PY, os.path.abspath(__file__), "--files_child", fmt, f"--files={per}", f"--seed={args.seed}"]
            p = subprocess.run([*cmd, f"--out={keep}", f"--workdir={wd}"], capture_output=True, text=True,
                               env=env(), preexec_fn=cap_memory, timeout=1800)  # fmt: skip
        last, done, kinds = -1, None, collections.Counter()
        for line in p.stdout.splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if "progress" in rec:
                last = rec["progress"]
            elif "done" in rec:
                done = rec["done"]
            else:
                kinds[(rec["kind"], re.sub(r"\d+", "N", rec["what"])[:120])] += 1
                repro = f"loader of {fmt} on {rec['file']} (case {rec['case']})"
                if kinds[(rec["kind"], re.sub(r"\d+", "N", rec["what"])[:120])] <= 3:
                    c.find("files", rec["kind"], f"{fmt}: {rec['what']}", repro)
                else:
                    c.count("files", rec["kind"])
        c.count("files", "tried", per if done is not None else last + 1)
        if done is None:
            c.find("files", "crashes", f"{fmt}: the loading process ended ({p.returncode}) after case {last}: "
                   f"{p.stderr[-400:]}", f"--files_child {fmt} --seed={args.seed}")  # fmt: skip
        print(f"files {fmt:14s} {per} mutants, {done} in {time.time() - t0:.1f} s", flush=True)
    cli_sample(c, args, keep)


def cli_sample(c, args, keep):
    """A sample of mutants through the CLIs: train (--load, --llmc_filepath, --input_bin, --tokenizer_bin,
    --init_from), sample and export."""
    rng = np.random.default_rng([args.seed, 99])
    wd = os.path.join(args.out, "cli_files")
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    seeds = fuzz.make_seeds(wd)
    data = tiny_tokens(os.path.join(wd, "train.bin"))
    # A real checkpoint of the tiny run, to mutate for --load and the tools.
    ck = os.path.join(wd, "ck")
    subprocess.run(train(f"--input_bin={data}", *TINY, "--num_iteration=2", f"--save={ck}"), env=env(), check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    seeds["checkpoint"] = open(
        os.path.join(ck, sorted(f for f in os.listdir(ck) if f.endswith(".bin"))[-1]), "rb"
    ).read()
    base = [f"--input_bin={data}", *TINY, "--num_iteration=1"]
    uses = [
        ("checkpoint", lambda p: train(*base, f"--load={p}")),
        ("checkpoint", lambda p: [PY, "-m", "infinitrain.tools.sample", f"--checkpoint={p}", "--length=4"]),
        ("checkpoint", lambda p: [PY, "-m", "infinitrain.tools.export", f"--checkpoint={p}", f"--output={p}.out"]),
        (
            "gpt2",
            lambda p: train(
                *base[:1],
                "--sequence_length=8",
                "--batch_size=2",
                "--num_iteration=1",
                "--sample_every=0",
                "--val_every=0",
                f"--llmc_filepath={p}",
            ),
        ),  # fmt: skip
        ("gpt2", lambda p: [PY, "-m", "infinitrain.tools.sample", f"--llmc_filepath={p}", "--length=4"]),
        ("tokens", lambda p: train(*TINY, "--num_iteration=1", f"--input_bin={p}")),
        ("tokenizer", lambda p: train(*base, f"--tokenizer_bin={p}")),
        (
            "hf_config",
            lambda p: train(
                *base[:1],
                "--sequence_length=8",
                "--batch_size=2",
                "--num_iteration=1",
                "--sample_every=0",
                "--val_every=0",
                f"--init_from={os.path.dirname(p)}",
            ),
        ),  # fmt: skip
        (
            "hf_safetensors",
            lambda p: [
                PY,
                "-m",
                "infinitrain.tools.sample",
                f"--init_from={os.path.dirname(p)}",
                "--length=4",
                "--prompt_tokens=1,2",
            ],
        ),  # fmt: skip
    ]
    for i in range(args.cli_files):
        fmt, cmd = uses[i % len(uses)]
        mutant = fuzz.mutate("tokens" if fmt == "checkpoint" else fmt, seeds[fmt], rng)
        if fmt in fuzz.HF_FILES:
            folder = os.path.join(wd, f"hf-{i}")
            os.makedirs(folder, exist_ok=True)
            for other in ("hf_safetensors", "hf_config"):
                with open(os.path.join(folder, fuzz.HF_FILES[other]), "wb") as f:
                    f.write(seeds[other])
            path = os.path.join(folder, fuzz.HF_FILES[fmt])
        else:
            path = os.path.join(wd, f"mutant-{i}-{fmt}.bin")
        with open(path, "wb") as f:
            f.write(mutant)
        argv = cmd(path)
        status, _, err = run_cli(argv, timeout=120)
        c.count("files_cli", "tried")
        judge_cli(c, "files_cli", status, err, " ".join(argv))
    print(f"files_cli {args.cli_files} runs", flush=True)


# ---- (2) kill/term trials, with kill_trials' helpers -------------------------------------------------------------

KT_FLAGS = ["--n_layer=2", "--n_embd=64", "--n_head=4", "--vocab_size=256", "--sequence_length=32", "--batch_size=4"]


def kt_cmd(data, ckpt, extra=()):
    flags = [f"--input_bin={data}", "--num_iteration=100000", "--warmup_steps=5", *KT_FLAGS, "--sample_every=0"]
    flags.append("--checkpoint_every=1")
    if ckpt:
        flags.append(f"--checkpoint_dir={ckpt}")
    return [PY, "-m", "infinitrain.train", *flags, *extra]


def campaign_kill(c, args):
    kill_trials.train_cmd = kt_cmd  # reference_losses uses the same (smaller) model
    rng = np.random.default_rng([args.seed, 2])
    work = os.path.join(args.out, "kill")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data, ckpt = os.path.join(work, "train.bin"), os.path.join(work, "ckpt")
    from infinitrain.data import write_tokens

    write_tokens(data, np.random.default_rng(1).integers(0, 256, size=100_000), kind="gpt2")
    results, expected = [], 0
    for trial in range(1, args.kills + 1):
        sig = signal.SIGKILL if trial % 2 else signal.SIGTERM
        proc = subprocess.Popen(kt_cmd(data, ckpt, ["--resume"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env(), bufsize=1)  # fmt: skip
        lines, line = kill_trials.read_until(proc, lambda s: s.startswith(("resumed from", "no checkpoint in")), 120)
        repro = f"tests/kill_trials.py logic, trial {trial} ({sig.name}) in {ckpt}"
        resumed = None
        if line is None:
            proc.kill()
        elif line.startswith("no checkpoint"):
            resumed = 0
        else:
            resumed = int(kill_trials.RESUMED.match(line).group(2))
        c.count("kill", "tried")
        if resumed != expected:
            c.find("kill", "lost runs", f"trial {trial}: resumed at {resumed}, newest complete {expected}: "
                   f"{lines[-3:]}", repro)  # fmt: skip
        time.sleep(float(rng.uniform(args.min_seconds, args.max_seconds)))
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            c.find("kill", "crashes", f"trial {trial}: no exit within 120 s of {sig.name}", repro)
        if sig == signal.SIGTERM:
            judge_cli(c, "kill", proc.returncode, err, repro)
        steps = {int(m.group(1)): m.group(2) for m in map(kill_trials.STEP.match, out.splitlines()) if m}
        names = sorted(f for f in os.listdir(ckpt) if f.startswith("ckpt_") and f.endswith(".bin"))
        expected = int(names[-1][5:13]) if names else 0
        results.append((trial, steps))
        print(f"kill {trial:2d} {sig.name}: resumed at {resumed}, ran {len(steps)} steps, status "
              f"{proc.returncode}, newest {expected}", flush=True)  # fmt: skip
    top = max((max(s, default=0) for _, s in results), default=0)
    reference = kill_trials.reference_losses(data, top, env())
    for trial, steps in results:
        bad = [s for s, loss in steps.items() if reference.get(s) != loss]
        if bad:
            c.find("kill", "lost runs", f"trial {trial}: losses differ from the uninterrupted run at {bad[:5]}", "")
    print(f"kill: {len(results)} trials, {sum(len(s) for _, s in results)} steps checked", flush=True)


# ---- (3) bad CLI inputs ---------------------------------------------------------------------------------------------


def bad_flag_list(d, data):
    """[(flags, why)]: bad values and combinations for the train CLI."""
    fifo = os.path.join(d, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    empty, text = os.path.join(d, "empty.bin"), os.path.join(d, "text.bin")
    open(empty, "wb").close()
    with open(text, "w") as f:
        f.write("hello world\n" * 100)
    os.makedirs(os.path.join(d, "adir"), exist_ok=True)
    afile = data
    out = []
    ints = ["n_layer", "n_head", "n_embd", "vocab_size", "batch_size", "sequence_length", "num_iteration"]
    ints += ["total_batch_size", "lr_warmup_iters", "val_loss_every", "val_batches", "save_interval"]
    ints += ["max_checkpoint_keep", "n_kv_head", "nthread_per_process", "zero_stage", "tensor_parallel"]
    ints += ["pipeline_parallel", "lora_rank", "seed", "text_length", "intermediate_size", "num_experts"]
    for f in ints:
        for v in ("abc", "1.5", "", "0x10", "1e3", "99999999999999999999999"):
            out.append(([f"--{f}={v}"], "type/range"))
    for f in ("n_layer", "n_head", "n_embd", "vocab_size", "batch_size", "sequence_length", "num_iteration"):
        for v in ("0", "-1", "-2147483648", "100000000000"):
            out.append(([f"--{f}={v}"], "range"))
    for f in ("learning_rate", "weight_decay", "grad_clip", "min_lr", "lr_warmup_init", "lora_alpha", "lora_dropout"):
        for v in ("abc", "nan", "inf", "-inf", "1e400", ""):
            out.append(([f"--{f}={v}"], "float"))
    for f, v in [("learning_rate", "-1"), ("weight_decay", "-0.5"), ("lora_dropout", "1.5"), ("lora_dropout", "-0.1")]:
        out.append(([f"--{f}={v}"], "range"))
    for f in ("model", "dtype", "device", "optimizer", "lr_decay_style", "recompute_granularity", "pipeline_schedule"):
        for v in ("bogus", ""):
            out.append(([f"--{f}={v}"], "choice"))
    paths = {"missing": os.path.join(d, "missing.bin"), "dir": os.path.join(d, "adir"), "devnull": "/dev/null",
             "fifo": fifo, "empty": empty, "text": text}  # fmt: skip
    for f in ("input_bin", "input_val_bin", "tokenizer_bin", "llmc_filepath", "config_json", "init_from", "load"):
        for k, p in paths.items():
            if f == "init_from" and k == "dir":
                continue  # an empty folder: still bad, but kept to files here
            out.append(([f"--{f}={p}"], f"path:{k}"))
    out.append(([f"--init_from={os.path.join(d, 'adir')}"], "empty folder"))
    for f in ("log_file", "metrics_file"):
        out += [([f"--{f}={os.path.join(d, 'adir')}"], "output is a dir"), ([f"--{f}={afile}/x"], "parent is a file")]
    out += [([f"--save={afile}"], "save dir is a file"), ([f"--save={afile}/x"], "parent is a file")]
    combos = [
        ["--resume", "--fresh"],
        ["--n_head=3"],
        ["--model=llama3", "--n_head=2", "--n_kv_head=3"],
        [f"--llmc_filepath={empty}", f"--init_from={os.path.join(d, 'adir')}"],
        ["--total_batch_size=100"],
        ["--sequence_parallel"],
        ["--pipeline_parallel=2"],
        ["--tensor_parallel=2"],
        ["--resume"],
        ["--lr_decay_iters=-5"],
        ["--bogus_flag=1"],
        ["positional_extra"],
        ["--num_iteration"],
        ["--load_optimizer_state", f"--load={empty}"],
        ["--num_experts=2", "--num_experts_per_tok=3"],
        ["--vocab_size=64", "--n_embd=33"],
        [f"--input_val_bin={fifo}", "--val_loss_every=1"],
        ["--devices=cpu:0,cpu:0"],
        ["--activation_recompute", "--recompute_num_layers=5"],
        ["--profile_steps=abc"],
        ["--batch_size=100000", "--sequence_length=100000"],
    ]
    out += [(x, "combination") for x in combos]
    return out


def fresh_dir(args, name):
    """An empty work folder for one category under --out, with a small token file in it: (folder, token file)."""
    d = os.path.join(args.out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d, tiny_tokens(os.path.join(d, "train.bin"))


def campaign_bad_cli(c, args):
    d, data = fresh_dir(args, "bad_cli")
    items = bad_flag_list(d, data)
    for flags, why in items:
        base = [f"--input_bin={data}", *TINY, "--num_iteration=2"]
        names = {f.split("=")[0] for f in flags}
        argv = train(*[b for b in base if b.split("=")[0] not in names], *flags)
        if "--resume" in flags and "--fresh" not in flags:
            argv.append(f"--checkpoint_dir={data}")  # --resume over a file
        status, out, err = run_cli(argv, timeout=60)
        c.count("bad_cli", "tried")
        repro = " ".join(argv)
        if judge_cli(c, "bad_cli", status, err, repro, allow_zero=False):
            errors = [s for s in err.splitlines() if s.startswith("error: ")]
            if (
                len(errors) != 1
                or kill_trials.STEP.search(out or "")
                or any(s.startswith("step ") for s in out.splitlines())
            ):
                c.findings.append({"category": "bad_cli", "kind": "message", "what": f"{why}: status {status}, "
                                   f"{len(errors)} error lines: {err.strip()[-300:]}", "repro": repro})  # fmt: skip
    print(f"bad_cli {len(items)} runs", flush=True)


# ---- (4) multi-process faults under the launcher ------------------------------------------------------------------


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def campaign_multiproc(c, args):
    d, data = fresh_dir(args, "multiproc")
    helptext = subprocess.run([PY, "-m", "infinitrain.run", "--help"], capture_output=True, text=True, env=env()).stdout
    watchdog = "--heartbeat_timeout" in helptext
    faults = ["kill_worker", "term_worker", "stop_worker", "kill_launcher", "term_launcher"]
    for rep in range(args.mp_reps):
        for fault in faults:
            if fault == "stop_worker" and not watchdog:
                c.findings.append({"category": "multiproc", "kind": "n/a", "what": "no --heartbeat_timeout"})
                continue
            launcher = [PY, "-m", "infinitrain.run", "--nproc_per_node=2", "--master_port=0", "--stop_timeout=2"]
            launcher += ["--heartbeat_timeout=3"] if watchdog else []
            ck = os.path.join(d, f"ck-{fault}-{rep}")
            argv = [*launcher, "-m", "infinitrain.train", f"--input_bin={data}", *TINY, "--num_iteration=100000"]
            argv.append(f"--checkpoint_dir={ck}")
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), bufsize=1)
            repro = f"{' '.join(argv)}  # then {fault} once steps print"
            c.count("multiproc", "tried")
            lines, line = kill_trials.read_until(p, lambda s: s.startswith("step 5/"), 120)
            workers = [w for w in children(p.pid)]
            workers = [g for w in workers for g in [w, *children(w)]]  # a worker may exec via a shell
            if line is None or len(workers) < 2:
                p.kill()
                c.find("multiproc", "crashes", f"{fault}: the run did not start ({len(workers)} workers): {lines[-3:]}")
                continue
            victim = workers[-1]
            sig = {"kill_worker": signal.SIGKILL, "term_worker": signal.SIGTERM, "stop_worker": signal.SIGSTOP,
                   "kill_launcher": signal.SIGKILL, "term_launcher": signal.SIGTERM}[fault]  # fmt: skip
            t0 = time.time()
            os.kill(p.pid if "launcher" in fault else victim, sig)
            try:
                out, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                c.find("multiproc", "crashes", f"{fault}: the launcher did not exit within 30 s", repro)
            took = time.time() - t0
            deadline = time.time() + 5
            while time.time() < deadline and any(alive(w) for w in workers):
                time.sleep(0.1)
            left = [w for w in workers if alive(w)]
            if left:
                c.find("multiproc", "crashes", f"{fault}: workers {left} outlived the launcher by 5 s", repro)
                for w in left:
                    for s in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.kill(w, s)
                        except ProcessLookupError:
                            pass
            rc = p.returncode
            expected_signal = fault == "kill_launcher" and rc == -9
            if not expected_signal and (rc < 0 or rc == 0 or "Traceback" in err):
                col = "tracebacks" if rc > 0 and "Traceback" in err else "crashes"
                c.find("multiproc", col, f"{fault}: launcher status {rc}: {err.strip()[-400:]}", repro)
            print(f"multiproc {fault} #{rep}: launcher status {rc} after {took:.1f} s, {len(left)} left", flush=True)


# ---- (5) disk full and (6) read-only, in a private mount namespace ------------------------------------------------


def in_namespace(script, timeout=300):
    """Runs a shell script under `unshare -m` (status, stdout, stderr)."""
    try:
        p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=timeout,
                           env=env())  # fmt: skip
    except subprocess.TimeoutExpired:
        return "hang", "", ""
    return p.returncode, p.stdout, p.stderr


def campaign_disk_full(c, args):
    from infinitrain import checkpoint

    d, data = fresh_dir(args, "disk_full")
    status, _, err = in_namespace(f"mount -t tmpfs -o size=1m tmpfs {d} 2>&1 || exit 77; umount {d}")
    if status != 0:
        c.findings.append({"category": "disk_full", "kind": "n/a", "what": f"tmpfs mount failed: {err}"})
        return
    tiny_tokens(os.path.join(args.out, "disk_full_train.bin"))
    data = os.path.join(args.out, "disk_full_train.bin")
    model = ["--n_layer=2", "--n_embd=64", "--n_head=4", "--vocab_size=256", "--sequence_length=16", "--batch_size=4"]
    for size_k in args.disk_sizes:
        mnt = os.path.join(d, f"mnt{size_k}")
        copy = os.path.join(d, f"copy{size_k}")
        os.makedirs(mnt)
        first = train(f"--input_bin={data}", *model, "--sample_every=0", "--val_every=0", "--num_iteration=40",
                      "--checkpoint_every=1", "--max_checkpoint_keep=100", f"--checkpoint_dir={mnt}/ck",
                      f"--metrics_file={mnt}/m.jsonl")  # fmt: skip
        resume = train(f"--input_bin={data}", *model, "--sample_every=0", "--val_every=0", "--num_iteration=40",
                       "--checkpoint_every=1000", f"--checkpoint_dir={mnt}/ck", "--resume")  # fmt: skip
        q = " ".join(f"'{a}'" for a in first)
        r = " ".join(f"'{a}'" for a in resume)
        script = (
            f"mount -t tmpfs -o size={size_k}k tmpfs {mnt} || exit 77; "
            f"{q} >{d}/out1-{size_k} 2>{d}/err1-{size_k}; echo $? >{d}/rc1-{size_k}; "
            f"cp -a {mnt}/ck {copy} 2>/dev/null; rm -f {mnt}/m.jsonl; "
            f"{r} >{d}/out2-{size_k} 2>{d}/err2-{size_k}; echo $? >{d}/rc2-{size_k}"
        )
        st, _, _ = in_namespace(script)
        c.count("disk_full", "tried")
        if st == 77:
            c.findings.append({"category": "disk_full", "kind": "n/a", "what": f"mount of {size_k}k failed"})
            continue

        def rd(n, k=size_k):
            return open(f"{d}/{n}-{k}").read() if os.path.exists(f"{d}/{n}-{k}") else ""

        rc1, rc2 = int(rd("rc1") or -999), int(rd("rc2") or -999)
        repro = f"unshare -m sh -c '{script}'"
        judge_cli(c, "disk_full", rc1, rd("err1"), repro)
        judge_cli(c, "disk_full", rc2, rd("err2"), repro)
        m = re.search(r"^resumed from (\S+) at step (\d+)$", rd("out2"), re.M)
        intact = []
        for name in sorted(os.listdir(copy)) if os.path.isdir(copy) else []:
            if name.startswith("ckpt_") and name.endswith(".bin"):
                try:
                    checkpoint.load(os.path.join(copy, name))
                    intact.append(int(name[5:13]))
                except (ValueError, OSError):
                    pass
        want = max(intact, default=0)
        got = int(m.group(2)) if m else (0 if "no checkpoint in" in rd("out2") else None)
        if got != want:
            c.find("disk_full", "lost runs", f"{size_k} KiB: first run status {rc1} ({rd('err1').strip()[-200:]}); "
                   f"resume at {got}, newest intact {want}: {rd('err2').strip()[-200:]}", repro)  # fmt: skip
        print(f"disk_full {size_k} KiB: status {rc1}, {len(intact)} intact, resume status {rc2} at {got} "
              f"(newest intact {want}); {rd('err1').strip().splitlines()[-1:] }", flush=True)  # fmt: skip


def campaign_read_only(c, args):
    d, data = fresh_dir(args, "read_only")
    base = [f"--input_bin={data}", *TINY, "--num_iteration=3"]
    # A checkpoint directory from a real run, to resume read-only.
    ck = os.path.join(d, "ck")
    subprocess.run(train(*base, "--checkpoint_every=1", f"--checkpoint_dir={ck}"), env=env(), capture_output=True)
    cases = {
        "checkpoint_dir (resume)": lambda m: [
            f"--checkpoint_dir={m}/ck",
            "--resume",
            "--num_iteration=5",
            "--checkpoint_every=1",
        ],  # fmt: skip
        "checkpoint_dir (new)": lambda m: [f"--checkpoint_dir={m}/new", "--checkpoint_every=1"],
        "save into ro root": lambda m: [f"--save={m}", "--save_interval=1"],
        "metrics_file": lambda m: [f"--metrics_file={m}/m.jsonl"],
        "log_file": lambda m: [f"--log_file={m}/log.txt"],
        "tensorboard_dir": lambda m: [f"--tensorboard_dir={m}/tb"],
        "lora_save_path": lambda m: ["--lora_rank=2", f"--lora_save_path={m}/lora.bin"],
        "existing metrics file": lambda m: [f"--metrics_file={m}/ck/metrics.jsonl"],
    }
    for rep in range(args.ro_reps):
        for name, extra in cases.items():
            mnt = os.path.join(d, f"mnt-{rep}-{len(os.listdir(d))}")
            os.makedirs(mnt)
            argv = train(*base, *extra(mnt))
            cmd = " ".join(f"'{a}'" for a in argv)
            script = (
                f"mount -t tmpfs tmpfs {mnt} || exit 77; cp -a {ck} {mnt}/ck; touch {mnt}/ck/metrics.jsonl; "
                f"mount -o remount,ro {mnt} || exit 77; {cmd}"
            )
            st, out, err = in_namespace(script, timeout=120)
            c.count("read_only", "tried")
            if st == 77:
                c.findings.append({"category": "read_only", "kind": "n/a", "what": f"ro mount failed: {err}"})
                continue
            repro = f'unshare -m sh -c "{script}"'
            ok = judge_cli(c, "read_only", st, err, repro, allow_zero=False)
            if ok and not any(s.startswith("error: ") for s in err.splitlines()):
                c.findings.append({"category": "read_only", "kind": "message", "what": f"{name}: status {st} "
                                   f"without an error line: {err.strip()[-200:]}", "repro": repro})  # fmt: skip
            if rep == 0:
                print(f"read_only {name}: status {st}: {err.strip().splitlines()[-1:]}", flush=True)


# ---- the table ------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--out", default="")
    ap.add_argument("--files", type=int, default=11000, help="mutated files in all (spread over the formats)")
    ap.add_argument("--cli_files", type=int, default=100, help="mutants through the CLIs")
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--min_seconds", type=float, default=0.5)
    ap.add_argument("--max_seconds", type=float, default=2.5)
    ap.add_argument("--mp_reps", type=int, default=3)
    ap.add_argument("--disk_sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 3500, 4500, 6000])
    ap.add_argument("--ro_reps", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated categories")
    ap.add_argument("--files_child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.files_child:
        return files_child(args.files_child, args.files, args.seed, args.workdir, args.out)
    args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="fault-campaign-"))
    os.makedirs(args.out, exist_ok=True)
    c = Campaign(args.out)
    steps = dict(files=campaign_files, kill=campaign_kill, bad_cli=campaign_bad_cli, multiproc=campaign_multiproc)
    steps.update(disk_full=campaign_disk_full, read_only=campaign_read_only)
    only = args.only.split(",") if args.only else list(steps)
    t0 = time.time()
    for name in only:
        t = time.time()
        steps[name](c, args)
        print(f"== {name} done in {time.time() - t:.0f} s", flush=True)
    print(f"\nseed {args.seed}, {time.time() - t0:.0f} s, out {args.out}\n")
    print("| category | " + " | ".join(COLS) + " |\n|---|" + "---|" * len(COLS))
    for cat, row in c.table.items():
        print(f"| {cat} | " + " | ".join(str(row[k]) for k in COLS) + " |")
    with open(os.path.join(args.out, "findings.json"), "w") as f:
        json.dump({"seed": args.seed, "table": c.table, "findings": c.findings}, f, indent=1)
    for f in c.findings:
        print(f"- [{f['category']}/{f['kind']}] {f['what'][:400]}\n    repro: {f.get('repro', '')[:600]}")
    bad = sum(row[k] for row in c.table.values() for k in COLS[1:])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
