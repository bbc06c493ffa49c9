"""The example flag files docs/training.md names (examples/gpt2/train.flags and examples/llama3/train.flags,
InfiniTrain's example/*/train.flags as they are) exist, parse, and start a run with --flagfile, the flags after it
overriding the file's."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from harness import DEVICE, repo_file, rng
from infinitrain.data import write_tokens
from infinitrain.runs import read_metrics

FILES = {"gpt2": "examples/gpt2/train.flags", "llama3": "examples/llama3/train.flags"}


def file_flags(path):
    """name -> value of a flag file's lines (one --name=value a line; # comments)."""
    out = {}
    for line in open(path).read().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.strip().removeprefix("--").partition("=")
            out[name] = value
    return out


def test_docs_name_the_shipped_flag_files():
    text = open(repo_file("docs/training.md")).read()
    named = sorted(set(re.findall(r"--flagfile=(\S+\.flags)", text)))
    assert named == sorted(FILES.values()), named
    for rel in named:
        repo_file(rel)


@pytest.mark.parametrize("family", sorted(FILES))
def test_example_flag_file_parses_and_starts(family, tmp_path):
    path = repo_file(FILES[family])
    flags = file_flags(path)
    assert flags["model"] == family and flags["zero_stage"] == "0"
    tokens = tmp_path / "tiny.bin"
    write_tokens(tokens, rng().integers(0, 64, size=2000), kind="gpt2")
    metrics = tmp_path / "m.jsonl"
    overrides = [f"--input_bin={tokens}", "--num_iteration=1", "--n_layer=1", "--n_embd=32", "--n_head=2"]
    overrides += ["--vocab_size=64", "--freq_generate_txt=0", f"--metrics_file={metrics}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    cmd = [sys.executable, "-m", "infinitrain.train", f"--device={DEVICE}", f"--flagfile={path}", *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    config, steps = read_metrics(metrics)
    assert config["family"] == family and sorted(steps) == [1] and "step 1/1" in p.stdout
    assert np.isfinite(steps[1]["train_loss"])
    got = config["flags"]
    for name, value in flags.items():
        if name == "num_iteration":
            assert got[name] == 1  # overridden after the file
        elif isinstance(got[name], bool):
            assert got[name] == (value == "true"), name
        elif isinstance(got[name], (int, float)):
            assert got[name] == float(value), name
        else:
            assert got[name] == value, name
    assert (got["n_layer"], got["n_embd"]) == (1, 32) and config["model_config"]["n_layer"] == 1
