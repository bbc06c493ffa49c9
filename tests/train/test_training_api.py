"""The training layer from Python: RunConfig validates once, on construction; Trainer(config).fit() trains the run
the train CLI would, to the same bits; a Strategy is the one place a step happens; --help lists every flag by
group."""

import dataclasses
import errno
import math
import os

import numpy as np
import pytest

from harness import DEVICE, repo_file, rng
from infinitrain.data import write_tokens
from infinitrain.runs import UsageError, read_metrics
from infinitrain.training import Local, RunConfig, Trainer, config, trainer

SMALL = dict(model="gpt2", n_layer=1, n_head=2, n_embd=32, vocab_size=64, sequence_length=16, batch_size=4)


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.bin"
    write_tokens(path, rng().integers(0, 64, size=5000).astype(np.uint16))
    return str(path)


def test_python_api_trains_the_run_the_cli_trains(run_train, tokens, tmp_path):
    """Five lines of Python and the CLI with the same settings give the same losses, norms and rates, bit for bit."""
    run = dict(SMALL, input_bin=tokens, num_iteration=4, total_batch_size=128, val_loss_every=2, device=DEVICE)
    run.update(freq_generate_txt=0, learning_rate=float(rng().uniform(1e-3, 3e-3)))
    cfg = RunConfig(**run, metrics_file=str(tmp_path / "api.jsonl"))
    assert Trainer(cfg).fit() == 0

    flags = [f"--{k}={v}" for k, v in run.items()]
    run_train(*flags, f"--metrics_file={tmp_path / 'cli.jsonl'}")
    (api_cfg, api), (cli_cfg, cli) = read_metrics(tmp_path / "api.jsonl"), read_metrics(tmp_path / "cli.jsonl")
    assert sorted(api) == [1, 2, 3, 4] and api_cfg["accumulation"] == 2
    for s in api:
        for key in ("train_loss", "grad_norm", "lr", "val_loss"):
            assert api[s].get(key) == cli[s].get(key), (s, key)
    api_cfg["flags"].pop("metrics_file"), cli_cfg["flags"].pop("metrics_file")
    assert api_cfg["flags"] == cli_cfg["flags"] and api_cfg["run"] == cli_cfg["run"]
    assert all(math.isfinite(api[s]["train_loss"]) for s in api)


@pytest.mark.parametrize(
    "change,needles",
    [
        ({"learning_rate": float("nan")}, ["--learning_rate=nan", "finite"]),
        ({"batch_size": 0}, ["--batch_size=0", ">= 1"]),
        ({"optimizer": "lamb"}, ["--optimizer=lamb", "adamw, adam, sgd"]),
        ({"zero_stage": 4}, ["--zero_stage=4", "<= 3"]),
        ({"recompute_method": "block"}, ["--recompute_method=block", "not implemented"]),
        ({"resume": True}, ["--resume needs"]),
        ({"resume": True, "save": "d", "load": "e"}, ["--resume and --load"]),
        ({"activation_recompute": True, "recompute_granularity": "none"}, ["--recompute_granularity=none"]),
        ({"nthread_per_process": 2, "devices": "cpu,cpu"}, ["--nthread_per_process and --devices"]),
    ],
    ids=lambda v: ",".join(v) if isinstance(v, dict) else None,
)
def test_run_config_refuses_bad_settings_when_made(change, needles):
    with pytest.raises(UsageError) as e:
        RunConfig(**change)
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_an_unreadable_token_file_is_a_usage_error_naming_the_flag(tmp_path):
    """open_tokens turns an OSError into a usage error naming the flag, the system's reason and the path."""
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(UsageError) as e:
        trainer.open_tokens("--input_val_bin", missing, 2, 8)
    assert str(e.value) == f"--input_val_bin: {os.strerror(errno.ENOENT)}: {missing}"


def test_run_config_is_frozen_and_records_what_was_given():
    cfg = RunConfig(num_iteration=7, dtype="bfloat16")
    assert cfg.present == {"num_iteration", "dtype"} and cfg.autocast and cfg.decay_iters == 7
    assert cfg.resolved_min_lr == pytest.approx(cfg.learning_rate / 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_iteration = 8
    with pytest.raises(TypeError):
        RunConfig(num_iterations=8)  # a misspelt setting is an error, not ignored
    assert cfg.replace(lr_decay_iters=20).decay_iters == 20
    with pytest.raises(UsageError):
        cfg.replace(grad_clip=-1.0)


def test_a_strategy_is_where_each_step_happens(tokens, tmp_path):
    """A Strategy given to the Trainer runs every step and evaluation (here the one-device one, counting)."""
    calls = []

    class Counting(Local):
        def step(self, step, lr, loader, accum, prof=None, rec=None):
            calls.append(("step", step, accum))
            return super().step(step, lr, loader, accum, prof, rec)

        def evaluate(self, loader, batches):
            calls.append(("evaluate", batches))
            return super().evaluate(loader, batches)

    run = dict(SMALL, input_bin=tokens, input_val_bin=tokens, num_iteration=3, val_loss_every=2, val_batches=2)
    cfg = RunConfig(**run, freq_generate_txt=0, device=DEVICE, metrics_file=str(tmp_path / "m.jsonl"))
    from infinitrain import runtime

    Trainer(cfg, strategy=Counting(cfg, [runtime.parse_device(DEVICE)])).fit()
    assert calls == [("step", 0, 1), ("step", 1, 1), ("evaluate", 2), ("step", 2, 1), ("evaluate", 2)]
    _, steps = read_metrics(tmp_path / "m.jsonl")
    assert sorted(steps) == [1, 2, 3] and "val_loss" in steps[2] and "val_loss" in steps[3]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_flag_by_group(run_train, flag):
    p = run_train(flag)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    titles = [title for _, title in config.GROUPS]
    positions = [out.index(f"\n{title}:\n") for title in titles]
    assert positions == sorted(positions)
    for f in config.flag_fields():
        group = [t for g, t in config.GROUPS if g == f.metadata["group"]][0]
        start = out.index(f"\n{group}:\n")
        end = min([p for p in positions if p > start] or [len(out)])
        assert f"--{f.name}" in out[start:end], f.name
        for alias in f.metadata["aliases"]:
            assert f"--{alias}" in out[start:end], alias


def test_every_flag_is_a_config_field_and_back():
    """The CLI's flags are RunConfig's fields (and their aliases), nothing more."""
    from infinitrain import train

    fields = {f.name for f in config.flag_fields()}
    ours = {fl.name for fl in train.FLAGS.flags_by_module_dict()["infinitrain.training.config"]}
    assert ours == fields | set(config.aliases())
    for f in config.flag_fields():
        assert train.FLAGS[f.name].default == f.default, f.name


def test_train_flags_doc_is_current():
    from infinitrain.tools import flagdoc

    with open(repo_file("docs/train_flags.md")) as f:
        assert (
            f.read() == flagdoc.render()
        ), "docs/train_flags.md is stale: ./bazelw run //python:flagdoc > docs/train_flags.md"
