"""The train CLI's InfiniTrain-compatible flags: flag files, refusal of unknown and unimplemented flags by name,
model presets, learning-rate schedules, --load extending a finished run, --overfit_single_batch, metrics and
TensorBoard files, and activation recompute (same loss and gradients, less memory)."""

import gc
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng, run_train
from harness import run_train_in_process as run_in_process
from infinitrain.data import DataLoader, read_tokens, write_tokens
from infinitrain.models import registry as R
from infinitrain.nn import recompute
from infinitrain.runs import read_metrics
from infinitrain.runs.tensorboard import crc32c, read_scalars

TINY_RUN = ["--sequence_length=16", "--batch_size=4", "--freq_generate_txt=0"]
TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", *TINY_RUN]

# InfiniTrain's example/gpt2/train.flags and example/llama3/train.flags, as they are.
GPT2_FLAGS = """# GPT-2 training defaults. CLI options after --flagfile override these values.
--model=gpt2
--optimizer=sgd
--learning_rate=0.0001
--batch_size=4
--sequence_length=64
--total_batch_size=256
--num_iteration=10
--dtype=float32
--zero_stage=0
--lr_decay_style=constant
--lora_target_modules=c_attn,c_proj
--load_optimizer_state=false
--save_optimizer_state=false
--profile_name=gpt2
"""
LLAMA3_FLAGS = """# LLaMA3 training defaults. CLI options after --flagfile override these values.
--model=llama3
--optimizer=adam
--learning_rate=0.00001
--batch_size=4
--sequence_length=64
--total_batch_size=256
--num_iteration=10
--dtype=float32
--zero_stage=0
--lr_decay_style=constant
--lora_target_modules=c_attn,c_proj,c_fc,c_fc2
--load_optimizer_state=true
--save_optimizer_state=true
--profile_name=llama3
"""


def one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, p.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def steps_of(metrics):
    return read_metrics(metrics)[1]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(rng().integers(0, 40, size=9), 200), kind="gpt2")
    return str(path)


# ---- flag files and refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,family,opt", [(GPT2_FLAGS, "gpt2", "sgd"), (LLAMA3_FLAGS, "llama3", "adam")], ids=["gpt2", "llama3"]
)
def test_infinitrain_flags_file_runs(text, family, opt, corpus, tmp_path):
    """The files run as they are; later command-line flags override them (as in InfiniTrain), here the size."""
    flagfile = tmp_path / "train.flags"
    flagfile.write_text(text)
    metrics = tmp_path / "m.jsonl"
    small = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--num_iteration=3", "--vocab_size=64"]
    p = run_train(f"--flagfile={flagfile}", f"--input_bin={corpus}", *small, f"--metrics_file={metrics}")
    config, steps = read_metrics(metrics)
    flags = config["flags"]
    assert config["family"] == family and flags["optimizer"] == opt and flags["lr_decay_style"] == "constant"
    assert (flags["batch_size"], flags["sequence_length"], flags["total_batch_size"]) == (4, 64, 256)
    assert flags["save_optimizer_state"] == (opt == "adam") and flags["profile_name"] == family
    assert sorted(steps) == [1, 2, 3] and "step 3/3" in p.stdout
    # Warmup (our default of 10 steps) from 0 towards the file's learning rate.
    lr = float(re.search(r"--learning_rate=(\S+)", text).group(1))
    assert [steps[s]["lr"] for s in (1, 2, 3)] == pytest.approx([0.0, lr / 10, 2 * lr / 10], rel=1e-12)


def test_unknown_and_unimplemented_flags_are_refused_by_name(corpus, tmp_path, capsys):
    base = [f"--input_bin={corpus}", "--num_iteration=1", *TINY]
    one_line_error(run_train(*base, "--no_such_flag=3", check=False), "no_such_flag")  # a real process once
    flagfile = tmp_path / "bad.flags"
    flagfile.write_text("--model=gpt2\n--learning_rate_typo=0.1\n")
    one_line_error(run_in_process(capsys, *base, f"--flagfile={flagfile}"), "learning_rate_typo")
    for flag, needle in (
        # Model parallelism needs processes (tests/distributed/test_parallel_cli.py runs it under the launcher).
        ("--tensor_parallel=2", "splits the model across processes: start the run with python -m infinitrain.run"),
        ("--zero_stage=1", "shards across processes: start the run with python -m infinitrain.run"),
        ("--sequence_parallel", "splits the model across processes"),
        ("--pipeline_parallel=2", "splits the model across processes"),
        ("--lora_save_path=x", "--lora_save_path needs --lora_rank"),
        ("--lora_dropout=nan", "--lora_dropout=nan must be in [0, 1)"),  # refused with or without --lora_rank
        ("--lora_dropout=1", "--lora_dropout=1.0 must be in [0, 1)"),
        ("--activation_recompute --model=mixtral", "not implemented for mixture-of-experts"),
        ("--recompute_granularity=selective", "selective"),
        ("--recompute_num_layers=2", "--recompute_num_layers=2"),
        ("--lr_decay_style=warmdown", "lr_decay_style"),
    ):
        one_line_error(run_in_process(capsys, *base, *flag.split()), flag.split()[0].split("=")[0], needle)
    # A rank beyond the adapted layers' sides is refused before anything is allocated for it.
    p = run_in_process(capsys, *base, "--lora_rank=1099511627776")
    one_line_error(p, "LoRA: lora rank 1099511627776 exceeds the smaller side of a 32 -> 96 layer")


def test_model_shape_conflicts_and_vocabulary(corpus, tmp_path, capsys):
    """--n_layer with --llmc_filepath is a conflict; a sized preset does not take shape flags; the vocabulary
    comes from --vocab_size, the tokenizer or the token file's kind, never from the largest token id."""
    model_file = tmp_path / "m.bin"
    it.manual_seed(0)
    R.resolve("gpt2", shape={"n_layer": 1, "n_head": 2, "n_embd": 32}, sequence_length=16, vocab_size=64).build(
        "cpu"
    ).save_llmc(str(model_file))
    base = [f"--input_bin={corpus}", "--num_iteration=1", *TINY_RUN]
    one_line_error(run_in_process(capsys, *base, f"--llmc_filepath={model_file}", "--n_layer=2"), "--n_layer conflicts")
    one_line_error(run_in_process(capsys, *base, "--model=gpt2-medium", "--n_layer=2"), "gpt2-medium fixes")
    one_line_error(run_in_process(capsys, *base, "--model=gpt5"), "gpt5", "gpt2-xl")
    one_line_error(run_in_process(capsys, *base, "--model=gpt2", "--intermediate_size=64"), "does not apply to gpt2")
    metrics = tmp_path / "m.jsonl"
    run_train(*base, f"--llmc_filepath={model_file}", f"--metrics_file={metrics}")
    assert read_metrics(metrics)[0]["model_config"]["vocab_size"] == 64  # the file's
    metrics = tmp_path / "k.jsonl"
    run_train(*base, "--n_layer=1", "--n_head=2", "--n_embd=16", f"--metrics_file={metrics}")
    assert read_metrics(metrics)[0]["model_config"]["vocab_size"] == 50257  # a GPT-2 token file: GPT-2's


# ---- presets --------------------------------------------------------------------------------------------------

# Published parameter counts (GPT-2: untied counting of the tied embedding once, 50257 tokens; LLaMA 3.1 8B and
# 70B; LLaMA 3.2 1B and 3B tie their head, which llm.c's layout (and ours) keeps separate: + vocab * width).
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama3-1b": 1_235_814_400 + 128256 * 2048,
    "llama3-3b": 3_212_749_824 + 128256 * 3072,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}


def count_gpt2(c):
    C, L = c["n_embd"], c["n_layer"]
    return c["vocab_size"] * C + c["block_size"] * C + L * (12 * C * C + 13 * C) + 2 * C


def count_llama3(c):
    cfg = R.FAMILIES["llama3"].config(c)
    C, H, hd = cfg.n_embd, cfg.hidden_dim, cfg.head_dim
    per_layer = 2 * C + C * (cfg.n_head + 2 * cfg.n_kv_head) * hd + C * C + 3 * C * H
    return 2 * cfg.vocab_size * C + cfg.n_layer * per_layer + C


def test_presets_build_the_documented_shapes():
    for name, published in PUBLISHED.items():
        spec = R.resolve(name, shape={}, sequence_length=64)
        count = count_gpt2 if spec.family.name == "gpt2" else count_llama3
        assert count(spec.fields) == published, name
    for a, b in (("gpt2", "d12"), ("gpt2-medium", "d24"), ("gpt2-large", "d36"), ("gpt2-xl", "d48")):
        assert R.resolve(a, shape={}, sequence_length=64).fields == R.resolve(b, shape={}, sequence_length=64).fields
    assert R.resolve("llama3", shape={}, sequence_length=64).fields["n_kv_head"] == 8
    # The counting above is the models' own: build small ones and count their parameters.
    for name, count in (("gpt2-tiny", count_gpt2), ("llama3-tiny", count_llama3)):
        spec = R.resolve(name, shape={}, sequence_length=32, vocab_size=100)
        fields = dict(spec.fields, vocab_size=spec.fields.get("padded_vocab_size", 100))  # GPT-2 pads its table
        assert spec.build("cpu").num_parameters() == count(fields), name


# ---- runs -----------------------------------------------------------------------------------------------------


def test_load_extends_a_finished_run(corpus, tmp_path):
    """A finished 4-step run, extended to 6 with --load, equals a 6-step run with the same schedule (the decay
    kept over 4 steps with --lr_decay_iters=4, so both sit at min_lr afterwards); its metrics file continues."""
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", "--lr_warmup_iters=1", "--lr_decay_iters=4", *TINY]
    run_train(*args, "--num_iteration=4", f"--save={ckpt}")
    p = run_train(*args, "--num_iteration=4", f"--save={ckpt}", "--resume", "--num_iteration=6", check=False)
    one_line_error(p, "--num_iteration=6 (checkpoint: 4)", "use --load")
    p = run_train(*args, "--num_iteration=6", f"--load={ckpt}", f"--save={ckpt}")
    assert "resumed from" in p.stdout and "at step 4" in p.stdout and "extending the run from 4 to 6" in p.stderr
    full = tmp_path / "full"
    run_train(*args, "--num_iteration=6", f"--save={full}")
    extended, straight = steps_of(ckpt), steps_of(full)
    assert sorted(extended) == sorted(straight) == list(range(1, 7))
    for s in range(1, 7):
        assert extended[s]["train_loss"] == straight[s]["train_loss"], s
    assert extended[5]["lr"] == extended[6]["lr"] == pytest.approx(1e-4)  # min_lr: learning_rate / 10
    p = run_train(*args, "--num_iteration=6", f"--load={ckpt}", check=False)
    one_line_error(p, "at step 6", "--num_iteration above it")


def test_overfit_single_batch_trains_on_the_first_batch(tmp_path):
    """Every step sees the first batch of the shuffled data: the same curve as a file holding only that batch."""
    big = tmp_path / "big.bin"
    tokens = rng().integers(0, 64, size=4000)
    write_tokens(big, tokens, kind="gpt2")
    first = DataLoader(str(big), 4, 16, shuffle=True, seed=42).chunk_starts(0)[0]
    one = tmp_path / "one.bin"
    write_tokens(one, read_tokens(big)[first : first + 4 * 16 + 1], kind="gpt2")
    args = ["--num_iteration=4", "--lr_warmup_iters=0", *TINY]
    run_train(f"--input_bin={big}", "--overfit_single_batch", f"--metrics_file={tmp_path / 'a.jsonl'}", *args)
    run_train(f"--input_bin={one}", f"--metrics_file={tmp_path / 'b.jsonl'}", *args)
    a, b = steps_of(tmp_path / "a.jsonl"), steps_of(tmp_path / "b.jsonl")
    assert [a[s]["train_loss"] for s in a] == [b[s]["train_loss"] for s in b]
    assert a[4]["train_loss"] < a[1]["train_loss"]


def test_metrics_lines_and_tensorboard_events(corpus, tmp_path):
    tb = tmp_path / "tb"
    ckpt = tmp_path / "ckpt"
    args = [f"--input_bin={corpus}", f"--input_val_bin={corpus}", "--num_iteration=4", "--val_loss_every=2", *TINY]
    p = run_train(*args, f"--save={ckpt}", f"--tensorboard_dir={tb}")
    lines = [json.loads(x) for x in open(ckpt / "metrics.jsonl")]
    assert lines[0]["kind"] == "config" and lines[-1] == {"kind": "end", "status": "completed", "step": 4}
    steps = {r["step"]: r for r in lines if r["kind"] == "step"}
    printed = {
        int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+)/4 \| train loss (\S+)", p.stdout, re.M)
    }
    val = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+) \| val loss (\S+)", p.stdout, re.M)}
    assert sorted(val) == [2, 4]
    for s, r in steps.items():
        assert set(r) >= {"train_loss", "lr", "grad_norm", "tokens_per_s", "ms", "mem_allocated_mib", "mem_peak_mib"}
        assert r["train_loss"] == pytest.approx(printed[s], abs=1e-6)
        assert r["tokens_per_s"] == pytest.approx(64 / (r["ms"] / 1000))
        assert ("val_loss" in r) == (s in val) and (s not in val or r["val_loss"] == pytest.approx(val[s], abs=1e-6))
        assert 0 < r["mem_allocated_mib"] <= r["mem_peak_mib"]
    (events,) = list(tb.glob("events.out.tfevents.*"))
    scalars = read_scalars(events)
    loss = {step: v for tag, step, v in scalars if tag == "loss/train"}
    assert loss == {s: pytest.approx(r["train_loss"], rel=1e-6) for s, r in steps.items()}
    assert {step for tag, step, _ in scalars if tag == "loss/val"} == {2, 4}
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


# ---- activation recompute -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,autocast", [("gpt2", False), ("llama3", True)])
def test_activation_recompute_keeps_loss_and_gradients_and_lowers_peak_memory(family, autocast):
    tokens = rng().integers(0, 64, size=(2, 129))  # long sequences, few tokens: the blocks' activations dominate

    def step(with_recompute):
        it.manual_seed(7)
        spec = R.resolve(family, shape={"n_layer": 4}, sequence_length=128, vocab_size=64)
        model = spec.build(DEVICE)
        if with_recompute:
            recompute.enable(model, spec.family.block_list(model))
        x, y = (it.from_numpy(t, device=DEVICE) for t in (tokens[:, :-1], tokens[:, 1:]))
        # Tensors of earlier tests in reference cycles would be freed whenever the collector runs, lowering the
        # allocation below the base: collect them first and keep the collector out of the measurement.
        gc.collect()
        gc.disable()
        try:
            it.runtime.synchronize(DEVICE)
            base = it.runtime.memory_allocated(DEVICE)
            it.runtime.reset_peak_memory_stats(DEVICE)
            with it.amp.autocast(DEVICE, dtype="bfloat16", enabled=autocast):
                _, loss = model(x, y)
            loss.backward()
            it.runtime.synchronize(DEVICE)
            peak = it.runtime.max_memory_allocated(DEVICE) - base
        finally:
            gc.enable()
        return loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}, peak

    loss, grads, peak = step(False)
    loss_rc, grads_rc, peak_rc = step(True)
    assert loss_rc == loss
    for k in grads:  # the same kernels on the same inputs: equal bits
        np.testing.assert_array_equal(grads_rc[k], grads[k], err_msg=k)
    assert peak_rc < 0.7 * peak, (peak_rc, peak)


# ---- the models' families and LoRA ---------------------------------------------------------------------------


def test_lora_trains_the_adapters_alone_and_saves_them(corpus, tmp_path):
    """InfiniTrain's --lora_rank/--lora_target_modules through the models' LoRA: base weights stay as they were,
    the adapters are saved with --lora_save_path, and export merges them into an llm.c file."""
    from infinitrain.models import GPT2
    from infinitrain.runs import read_checkpoint

    ckpt, adapters = tmp_path / "ckpt", tmp_path / "adapters"
    args = [f"--input_bin={corpus}", "--num_iteration=3", "--lr_warmup_iters=0", *TINY, "--model=gpt2"]
    run_train(*args, f"--save={ckpt}", "--save_interval=1", "--max_checkpoint_keep=3", "--lora_rank=2",
              "--lora_target_modules=c_attn,c_proj", f"--lora_save_path={adapters}")  # fmt: skip
    assert (adapters / "adapter_config.json").exists()
    first, _ = read_checkpoint(ckpt / "ckpt_00000001.bin")
    last, meta = read_checkpoint(ckpt / "ckpt_00000003.bin")
    assert meta["lora"]["r"] == 2
    lora_keys = [k for k in last if "lora" in k]
    assert lora_keys and all(k.startswith("model.") for k in lora_keys)
    for k in last:
        if k.startswith("model."):
            changed = not np.array_equal(first[k], last[k])
            assert changed == ("lora_B" in k or "lora_A" in k), k  # only adapters move
    out = tmp_path / "merged.bin"
    p = subprocess.run(
        [sys.executable, "-m", "infinitrain.tools.export", f"--checkpoint={ckpt}", f"--output={out}"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    merged = GPT2.from_llmc(str(out)).state_dict()
    pre = "model.h.0.attn.c_attn."
    want = last[pre + "weight"] + 16.0 / 2 * last[pre + "lora_B"] @ last[pre + "lora_A"]  # alpha / rank
    np.testing.assert_allclose(merged["h.0.attn.c_attn.weight"].numpy(), want, rtol=1e-5, atol=1e-6)
    assert not any("lora" in k for k in merged)


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_the_models_families_train_from_the_cli(family, corpus, tmp_path):
    metrics = tmp_path / "m.jsonl"
    args = [f"--input_bin={corpus}", "--num_iteration=2", f"--model={family}", *TINY, "--n_kv_head=1"]
    if family == "mixtral":
        args += ["--num_experts=2", "--num_experts_per_tok=1", "--intermediate_size=48"]
    run_train(*args, f"--metrics_file={metrics}")
    config, steps = read_metrics(metrics)
    assert config["family"] == family and sorted(steps) == [1, 2]
    assert config["model_config"]["n_layer"] == 1 and config["model_config"]["n_kv_head"] == 1
    if family == "mixtral":
        assert config["model_config"]["num_experts"] == 2 and config["model_config"]["intermediate_size"] == 48


# ---- flags that would have been ignored -----------------------------------------------------------------------


def test_recompute_granularity_none_conflicts_with_recompute(corpus, capsys):
    base = [f"--input_bin={corpus}", "--num_iteration=1", *TINY]
    p = run_in_process(capsys, *base, "--activation_recompute", "--recompute_granularity=none")
    one_line_error(p, "--recompute_granularity=none", "--activation_recompute", "--recompute_granularity=full")
    # Either alone is fine: none without --activation_recompute is no recompute, as asked.
    assert run_in_process(capsys, *base, "--recompute_granularity=none").returncode == 0


def test_lora_load_path_refuses_other_adapter_settings(corpus, tmp_path, capsys):
    """The adapters bring their rank, alpha, targets and dropout: a flag given with another value is refused by
    name (not silently overridden); one equal to the adapters' (a flag file's) is fine."""
    from infinitrain.models import lora

    it.manual_seed(0)
    model = R.resolve("gpt2", shape={"n_layer": 1, "n_head": 2, "n_embd": 32}, sequence_length=16, vocab_size=64)
    model = model.build("cpu")
    lora.apply_lora(model, "c_attn,c_proj", rank=2, alpha=8.0, dropout=0.1)
    adapters = tmp_path / "adapters"
    lora.save_adapters(model, adapters)
    base = [f"--input_bin={corpus}", "--num_iteration=1", *TINY, "--model=gpt2", f"--lora_load_path={adapters}"]
    for flags, named in (
        (["--lora_rank=4"], ["--lora_rank=4 (the adapters': 2)"]),
        (["--lora_alpha=16"], ["--lora_alpha=16.0 (the adapters': 8.0)"]),
        (["--lora_dropout=0"], ["--lora_dropout=0.0"]),
        (["--lora_target_modules=c_attn"], ["--lora_target_modules=c_attn"]),
        (["--lora_rank=3", "--lora_dropout=0.2"], ["--lora_rank=3", "--lora_dropout=0.2", "conflict with"]),
    ):
        one_line_error(run_in_process(capsys, *base, *flags), *named, "--lora_load_path")
    metrics = tmp_path / "m.jsonl"
    same = ["--lora_target_modules=c_proj,c_attn", "--lora_rank=2", "--lora_alpha=8", "--lora_dropout=0.1"]
    p = run_in_process(capsys, *base, *same, f"--metrics_file={metrics}")
    assert p.returncode == 0, p.stderr
    assert read_metrics(metrics)[0]["parameters"] == model.num_parameters()  # the adapters came along


def test_profile_and_precision_steps_outside_the_run_are_refused(corpus, tmp_path, capsys):
    """Steps the run never reaches (past --num_iteration, or before the step a run continues from) would record
    nothing: a usage error naming the flag and the steps the run trains."""
    base = [f"--input_bin={corpus}", *TINY]
    for flag, needles in (
        ("--profile_steps=4:5", ["--profile_steps=4:5", "steps 1..3", "--num_iteration=3"]),
        ("--profile_steps=4", ["--profile_steps=4", "steps 1..3"]),
        ("--precision_check=steps=4:6", ["--precision_check steps=4:6", "steps 1..3", "within 1..3"]),
    ):
        one_line_error(run_in_process(capsys, *base, "--num_iteration=3", flag), *needles)
    ckpt = tmp_path / "ckpt"
    assert run_in_process(capsys, *base, "--num_iteration=2", f"--save={ckpt}").returncode == 0
    more = [*base, "--num_iteration=4", f"--load={ckpt}"]
    for flag, needles in (
        ("--profile_steps=1:3", ["--profile_steps=1:3", "steps 3..4", "resumed at step 2"]),
        ("--precision_check=steps=2", ["--precision_check steps=2", "steps 3..4", "resumed at step 2"]),
    ):
        one_line_error(run_in_process(capsys, *more, flag), *needles)
    # A record that overlaps the run is kept: steps 3 and 4 of 2:5.
    out = tmp_path / "prec.jsonl"
    p = run_in_process(capsys, *more, f"--precision_check=steps=2:5,level=1,output_path={out}")
    assert p.returncode == 0, p.stderr
    assert {json.loads(line).get("step") for line in open(out)} - {None} == {3, 4}


def test_one_accelerator_takes_its_batches_through_a_device_loader(corpus, tmp_path, capsys, monkeypatch):
    """A single non-cpu device reads the training and validation batches through DeviceLoader (pinned buffers
    copied ahead on a side stream); the cpu reads the arrays as before."""
    from infinitrain.data.device import DeviceLoader
    from infinitrain.training import strategy

    made = []

    class Counting(DeviceLoader):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.handed = 0
            made.append(self)

        def __next__(self):
            self.handed += 1
            return super().__next__()

    monkeypatch.setattr(strategy, "DeviceLoader", Counting)
    args = [f"--input_bin={corpus}", f"--input_val_bin={corpus}", "--num_iteration=3", "--val_loss_every=2"]
    p = run_in_process(capsys, *args, "--val_batches=2", *TINY, f"--metrics_file={tmp_path / 'm.jsonl'}")
    assert p.returncode == 0, p.stderr
    if it.runtime.parse_device(DEVICE) == "cpu":
        assert made == []
    else:
        assert [m.device for m in made] == [it.runtime.parse_device(DEVICE)] * 2
        assert [m.handed for m in made] == [3, 4]  # 3 steps; 2 validation batches at steps 2 and 3
