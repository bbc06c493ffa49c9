"""examples/nanogpt (a nanoGPT-style model and training loop written as PyTorch code against infinitrain)
runs: the loss falls on a learnable sequence, and a run resumed from its it.save checkpoint continues with the
same losses as the uninterrupted run."""

import os
import re
import subprocess
import sys

import numpy as np

from harness import DEVICE, repo_file, rng
from infinitrain.data import write_tokens


def _script():
    return repo_file("examples/nanogpt/train.py")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run(
        [sys.executable, _script(), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _losses(out):
    return {int(m[1]): float(m[2]) for m in re.finditer(r"iter (\d+): loss ([\d.]+)", out)}


def test_nanogpt_example_trains_and_resumes(tmp_path):
    pattern = rng().integers(0, 40, size=23)
    write_tokens(tmp_path / "train.bin", np.tile(pattern, 400), kind="gpt2")
    common = [
        f"--input_bin={tmp_path / 'train.bin'}",
        f"--device={DEVICE}",
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=32",
        "--block_size=32",
        "--batch_size=4",
        "--warmup_iters=2",
        "--learning_rate=1e-2",
        "--eval_iters=1",
        "--eval_interval=6",
        "--weight_decay=0.1",
    ]
    full = _losses(_run(*common, "--max_iters=12", f"--out_dir={tmp_path / 'a'}", "--sample_tokens=8"))
    assert sorted(full) == list(range(1, 13))
    assert full[12] < 0.75 * full[1], full  # a repeating 23-token sequence is learnt quickly (uniform: 3.69)
    first = _losses(_run(*common, "--max_iters=12", "--stop_after=5", f"--out_dir={tmp_path / 'b'}"))
    assert sorted(first) == list(range(1, 6)) and (tmp_path / "b" / "ckpt.safetensors").exists()
    resumed = _losses(_run(*common, "--max_iters=12", f"--out_dir={tmp_path / 'b'}", "--init_from=resume"))
    assert sorted(resumed) == list(range(6, 13))
    # Weights, AdamW moments, step counts and the batch stream come back exactly.
    assert {**first, **resumed} == full
