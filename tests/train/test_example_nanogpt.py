"""examples/nanogpt (nanoGPT's model and training loop written as PyTorch code, only the imports naming
infinitrain) runs as its users run it: prepare.py turns a text into token files, the loss falls on a learnable
text, a run resumed from its checkpoint continues with the same losses as the uninterrupted run, it.compile gives
the eager losses, and the DDP form under the launcher trains."""

import os
import pickle
import re
import subprocess
import sys

import numpy as np

from harness import DEVICE, repo_file, rng


def _script(name):
    return repo_file(f"examples/nanogpt/{name}")


def _run(*args, launcher=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sys.executable, "-m", "infinitrain.run", "--nproc_per_node=2"] if launcher else [sys.executable]
    p = subprocess.run(
        [*cmd, _script("train.py"), *args],
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


def _data(tmp_path):
    """A text of one repeated random 23-character phrase, through prepare.py."""
    g = rng()
    phrase = "".join(g.choice(list("abcdefghijklmnopqrstuvwxyz .,"), 23))
    (tmp_path / "input.txt").write_text(phrase * 400)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run(
        [sys.executable, _script("prepare.py"), str(tmp_path / "input.txt"), str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "data" / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    train = np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16)
    assert "".join(meta["itos"][i] for i in train[:23]) == phrase and len(train) == int(0.9 * 23 * 400)
    return tmp_path / "data"


COMMON = [
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


def test_nanogpt_example_trains_resumes_and_compiles(tmp_path):
    data = _data(tmp_path)
    common = [f"--data_dir={data}", f"--device={DEVICE}", *COMMON]
    full = _losses(_run(*common, "--max_iters=12", f"--out_dir={tmp_path / 'a'}", "--sample_tokens=8"))
    assert sorted(full) == list(range(1, 13))
    assert full[12] < 0.75 * full[1], full  # a repeating phrase is learnt quickly
    first = _losses(_run(*common, "--max_iters=12", "--stop_after=5", f"--out_dir={tmp_path / 'b'}"))
    assert sorted(first) == list(range(1, 6)) and (tmp_path / "b" / "ckpt.pt").exists()
    resumed = _losses(_run(*common, "--max_iters=12", f"--out_dir={tmp_path / 'b'}", "--init_from=resume"))
    assert sorted(resumed) == list(range(6, 13))
    # Weights, AdamW moments, step counts and the batch stream come back exactly.
    assert {**first, **resumed} == full
    # it.compile runs the fused ops and gives the same float32 losses.
    assert _losses(_run(*common, "--max_iters=12", "--compile")) == full


def test_nanogpt_example_under_the_launcher(tmp_path):
    data = _data(tmp_path)
    out = _run(
        f"--data_dir={data}",
        "--device=cpu",
        "--backend=gloo",
        *COMMON,
        "--max_iters=4",
        "--gradient_accumulation_steps=2",
        launcher=True,
    )
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and "2 process(es)" in out
