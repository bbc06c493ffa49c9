"""The train CLI's model-parallel flags under the launcher: the run matrix (examples/parallel/run_matrix.json, its
fp32 runs) equals the single-device curves; a TP2+SP+PP2 run's per-rank checkpoint shards resume in their layout,
merge (tools/merge_shards) into a plain checkpoint that one device and another layout continue from, all on the
single-device curve; a shard alone is refused by a single device; bad layouts are refused before any training.
(bf16 runs of the matrix take minutes on 2 cores: python -m infinitrain.tools.run_matrix runs them; the bf16
layouts are covered in test_parallel.py.)"""

import json
import os
import subprocess
import sys

import numpy as np

from harness import DEVICE, child_env, repo_file, run_train, train_losses

TYPE = DEVICE.split(":")[0]
MATRIX = "examples/parallel/run_matrix.json"


def _env():
    return child_env(INFINITRAIN_CCL_TIMEOUT_S="120")


def _tokens(tmp_path):
    from infinitrain.data.tokens import write_tokens

    g = np.random.default_rng()
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(g.integers(0, 60, 37), 300))
    return path, int(g.integers(1000))


def _cli(tmp_path, name, n, *flags, ok=True):
    """The train CLI (n > 1: under the launcher); returns (train losses, the CompletedProcess)."""
    metrics = tmp_path / f"{name}.jsonl"
    p = run_train(*flags, f"--metrics_file={metrics}", nproc=n, device=TYPE, cwd=tmp_path, check=ok)
    return (train_losses(metrics) if ok else None), p


def test_run_matrix_fp32(tmp_path):
    data, _ = _tokens(tmp_path)
    cmd = [sys.executable, "-m", "infinitrain.tools.run_matrix", f"--matrix={repo_file(MATRIX)}", f"--device={TYPE}",
           "--dtypes=float32", f"--input_bin={data}", f"--workdir={tmp_path / 'matrix'}"]  # fmt: skip
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr[-5000:]
    from infinitrain.tools.run_matrix import expand

    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and "float32" in ln]
    n = len(expand(json.load(open(repo_file(MATRIX))), dtypes=["float32"]))
    assert n == 16 and len(rows) == n, p.stdout  # 7 layouts x GPT-2, LLaMA 3; 2 expert-parallel Mixtral layouts
    assert all("| ok " in r for r in rows), p.stdout
    assert f"{n} of {n} runs equal the single-device curve" in p.stdout


def test_shards_resume_merge_and_load_into_other_layouts(tmp_path):
    data, seed = _tokens(tmp_path)
    flags = [f"--input_bin={data}", "--model=llama3", "--n_layer=4", "--n_head=4", "--n_kv_head=2", "--n_embd=32"]
    flags += ["--vocab_size=64", "--sequence_length=16", "--learning_rate=1e-2", "--total_batch_size=128"]
    flags += ["--batch_size=4", f"--seed={seed}", "--val_loss_every=0", "--freq_generate_txt=0"]
    layout = ["--tensor_parallel=2", "--sequence_parallel", "--pipeline_parallel=2"]
    one, _ = _cli(tmp_path, "one", 1, *flags, "--num_iteration=6")
    ckpt = tmp_path / "ckpt"
    first, p = _cli(tmp_path, "first", 4, *flags, *layout, "--num_iteration=3", f"--save={ckpt}")
    assert "as DP1xTP2+SPxPP2" in p.stdout and p.stdout.count("train loss") == 3
    files = sorted(os.listdir(ckpt))
    assert [f for f in files if f.startswith("ckpt_")] == ["ckpt_00000003.bin"] + [
        f"ckpt_00000003.bin.shard{k:03d}" for k in (1, 2, 3)
    ], files
    more, _ = _cli(tmp_path, "more", 4, *flags, *layout, "--num_iteration=6", f"--load={ckpt}")
    np.testing.assert_allclose(first + more, one, rtol=0, atol=1e-5)
    # One device refuses a shard; the merged checkpoint continues on one device and on PP4, on the same curve.
    _, p = _cli(tmp_path, "refused", 1, *flags, "--num_iteration=6", f"--load={ckpt}", ok=False)
    assert p.returncode == 2 and "holds one shard of a" in p.stderr and "merge_shards" in p.stderr, p.stderr
    merged = tmp_path / "merged.bin"
    m = subprocess.run([sys.executable, "-m", "infinitrain.tools.merge_shards", f"--checkpoint={ckpt}",
                        f"--output={merged}"], env=_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert m.returncode == 0, m.stdout + m.stderr
    single, _ = _cli(tmp_path, "single", 1, *flags, "--num_iteration=6", f"--load={merged}")
    np.testing.assert_allclose(first + single, one, rtol=0, atol=1e-5)
    pp4, _ = _cli(tmp_path, "pp4", 4, *flags, "--pipeline_parallel=4", "--num_iteration=6", f"--load={merged}")
    np.testing.assert_allclose(first + pp4, one, rtol=0, atol=1e-5)
    # Another layout refuses the shards with the way out.
    _, p = _cli(tmp_path, "other", 4, *flags, "--tensor_parallel=4", "--num_iteration=6", f"--load={ckpt}", ok=False)
    assert p.returncode != 0 and "merge the shards first" in p.stderr, p.stderr[-3000:]


def test_bad_layouts_are_refused_before_training(tmp_path):
    data, seed = _tokens(tmp_path)
    flags = [f"--input_bin={data}", "--model=gpt2", "--n_layer=2", "--n_head=2", "--n_embd=32", "--vocab_size=64"]
    flags += ["--sequence_length=16", "--batch_size=2", "--num_iteration=2", "--val_loss_every=0"]
    for n, extra, message in (
        (3, ["--tensor_parallel=2"], "world size 3 is not a multiple of tensor_parallel x pipeline_parallel = 2 x 1"),
        (2, ["--tensor_parallel=4"], "world size 2 is not a multiple"),
        (4, ["--tensor_parallel=4"], "n_head=2 is not divisible by tensor_parallel=4"),
        (4, ["--pipeline_parallel=4"], "n_layer=2 is fewer than the 4 pipeline stages"),
        (2, ["--pipeline_parallel=2", "--virtual_pipeline_parallel=2"], "n_layer=2 is fewer than the 4 pipeline"),
        (1, ["--tensor_parallel=2"], "--tensor_parallel: model parallelism splits the model across processes"),
        (2, ["--tensor_parallel=2", "--zero_stage=2"], "use --zero_stage=1"),
    ):
        _, p = _cli(tmp_path, "bad", n, *flags, *extra, ok=False)
        assert p.returncode != 0, (extra, p.stdout)
        assert message in p.stderr, (extra, p.stderr[-2000:])
        assert "train loss" not in p.stdout, (extra, p.stdout)
