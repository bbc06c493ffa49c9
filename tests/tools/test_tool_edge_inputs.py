"""Tools' edge inputs: sample without a prompt (the end-of-text it starts from is not printed), lora_bench's
measurements of a tiny model (step time within the wall time, AdamW's state two float32 moments a parameter), and
torch_bench's worker on our side (one step time a step, each within the wall time), lora_bench's printed table and
ratios, opdoc's op table, and bench's microseconds a call on a stand-in clock."""

import argparse
import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from harness import child_env, rng
from infinitrain import _C
from infinitrain.data import ByteTokenizer
from infinitrain.models import GPT2
from infinitrain.models.gpt2 import GPT2Config
from infinitrain.tools import lora_bench, opdoc, run_matrix, sample, torch_bench


def test_sample_without_prompt_drops_the_start_token(tmp_path, capsys):
    """With no prompt, sample starts from end-of-text and prints only the generated text after it."""
    n_embd = int(np.random.default_rng().choice([8, 16]))
    model = GPT2(GPT2Config(block_size=16, vocab_size=257, padded_vocab_size=264, n_layer=1, n_head=2, n_embd=n_embd))
    model.save_llmc(str(tmp_path / "m.bin"))
    status = sample.main(
        [f"--llmc_filepath={tmp_path / 'm.bin'}", "--tokenizer_bin=byte", "--length=6", "--temperature=0"]
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    tok = ByteTokenizer()
    ids = GPT2.from_llmc(str(tmp_path / "m.bin")).generate(np.array([[tok.eot]]), 6, temperature=0.0)[0]
    assert out.out == tok.decode(ids[1:].tolist()) + "\n"


def test_lora_bench_measures_a_tiny_model():
    """lora_bench.run: per-step milliseconds positive and below the call's wall time per step; optimizer state
    8 bytes per trainable parameter (AdamW's two float32 moments), for full fine-tuning and for LoRA."""
    g = np.random.default_rng()
    args = argparse.Namespace(
        model="qwen3", device="cpu", n_layer=1, n_head=2, n_kv_head=1, n_embd=8 * int(g.integers(1, 3)),
        vocab_size=int(g.integers(32, 80)), sequence_length=8, batch_size=2, steps=2, lora_alpha=4.0,
        lora_target_modules="",
    )  # fmt: skip
    for rank in (0, 2):
        t0 = time.perf_counter()
        r = lora_bench.run(args, rank)
        wall_ms = (time.perf_counter() - t0) * 1e3
        assert 0 < r["ms"] < wall_ms / args.steps
        assert r["state_mib"] * 2**20 == 8 * r["trainable"]
        assert (r["trainable"] == r["total"]) == (rank == 0)


def test_torch_bench_worker_times_each_step(monkeypatch, capsys):
    """torch_bench's worker (our side) prints a JSON list of one duration a step: each positive, and together
    within the call's wall time. A tiny model stands in for the benchmark's sizes."""
    monkeypatch.setitem(torch_bench.MODELS, "tiny", (1, 2, 8, 16, 8, 2, 8))
    steps = int(np.random.default_rng().integers(2, 4))
    a = argparse.Namespace(side="ours", model="tiny", steps=steps, dtype="float32", threads=1, profile=False)
    t0 = time.perf_counter()
    torch_bench._worker(a)
    wall = time.perf_counter() - t0
    times = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(times) == steps
    assert all(t > 0 for t in times) and sum(times) < wall


def test_lora_bench_main_prints_each_runs_parameters_and_the_state_ratio(monkeypatch, capsys):
    """lora_bench.main's table gives each run's trainable parameters in millions, and its optimizer-state ratio is
    LoRA's trainable parameters over full fine-tuning's (AdamW keeps 8 bytes a parameter in both)."""
    results = []

    def recorded(args, rank):
        results.append(run(args, rank))
        return results[-1]

    run = lora_bench.run
    monkeypatch.setattr(lora_bench, "run", recorded)
    vocab = int(rng().integers(32, 80))
    lora_bench.main(["--n_layer=1", "--n_head=2", "--n_kv_head=1", "--n_embd=16", f"--vocab_size={vocab}",
                     "--sequence_length=8", "--batch_size=2", "--steps=1", "--lora_rank=2"])  # fmt: skip
    out = capsys.readouterr().out
    full, lora = (r["trainable"] for r in results)
    rows = [float(m) for m in re.findall(r"^\| [^|]+ \| ([0-9.]+)M \|", out, re.M)]
    assert rows == [pytest.approx(full / 1e6, abs=5e-4), pytest.approx(lora / 1e6, abs=5e-4)]
    ratio = float(re.search(r"optimizer state ([0-9.]+)x", out).group(1))
    assert ratio == pytest.approx(lora / full, abs=5e-5)


def test_opdoc_lists_the_required_and_fused_ops_but_no_provider_op():
    """opdoc.render's table has one row per op of the table that is not a provider's, in table order, and counts
    the required and fused ones."""
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \|", opdoc.render(), re.M)
    want = [(o["schema"], o["tier"]) for o in _C.ops() if o["tier"] in ("required", "fused")]
    assert rows == want and {t for _, t in rows} == {"required", "fused"}
    n_req = sum(t == "required" for _, t in want)
    assert f"{len(want)} ops: {n_req} required, {len(want) - n_req} fused." in opdoc.render()


def test_bench_per_call_us_is_microseconds_a_call():
    """bench.per_call_us on a clock that each call of the measured function advances by c seconds returns c * 1e6
    (run in a child: bench's flags share names with bench_gpu's)."""
    c = float(rng().uniform(1e-7, 1e-3))
    code = (
        "import types\n"
        "from infinitrain.tools import bench\n"
        "now = [0.0]\n"
        "bench.time = types.SimpleNamespace(perf_counter=lambda: now[0])\n"
        f"def fn():\n    now[0] += {c!r}\n"
        "print(repr(bench.per_call_us(fn, 7)))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert float(p.stdout) == pytest.approx(c * 1e6, rel=1e-6)


def test_bench_train_throughput_counts_a_steps_tokens():
    """bench.train_throughput returns a parameter count, the tokens of one step (its batch of 8 x 128) and a positive
    median step time (run in a child, as above)."""
    code = "from infinitrain.tools import bench\nprint(*bench.train_throughput('cpu', 1))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=300)
    assert p.returncode == 0, p.stderr
    n, tokens, med = p.stdout.split()
    assert int(n) > 0 and int(tokens) == 8 * 128 and float(med) > 0


def test_run_matrix_reads_only_the_step_losses(tmp_path):
    """run_matrix's training run returns the train_loss of each "step" record of the metrics file, in order, and
    skips the config and validation records (a stand-in trainer writes the file)."""
    losses = [float(v) for v in rng().uniform(1, 5, 4)]
    steps = [{"kind": "step", "train_loss": v} for v in losses]
    records = [{"kind": "config"}, *steps[:2], {"kind": "val", "val_loss": 9.0, "train_loss": 8.0}, *steps[2:]]
    code = (
        "import json, sys\n"
        "path = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--metrics_file=')][0]\n"
        f"open(path, 'w').write(''.join(json.dumps(r) + '\\n' for r in {records!r}))\n"
    )
    got, err = run_matrix._train([sys.executable, "-c", code], [], str(tmp_path / "m.jsonl"), str(tmp_path), 60)
    assert err == "" and got == losses
