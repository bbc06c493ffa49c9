"""The precision checker: statistics against NumPy, and a deliberately perturbed op named as the first
divergence between two records, in process and through the train CLI and compare. The perturbed op is GPT-2's
linear_gelu_tanh (the fused MLP the Trainer's fusion runs, when c_proj reads the GELU) run as its composite instead
of the kernel (prefer_composites), with the tanh inside the composite scaled by 1 + 1e-2 (composites are registered
once, so the test perturbs what the composite calls)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng
from infinitrain import dispatch
from infinitrain import functional as F
from infinitrain.compiler import fusing
from infinitrain.data import write_tokens
from infinitrain.models import registry as R
from infinitrain.runs import precision as P
from infinitrain.tools import compare


def test_statistics_match_numpy():
    a = rng().standard_normal((7, 13)).astype(np.float32)
    a[1, 2], a[3, 4], a[5, 6] = np.nan, np.inf, -np.inf
    s = P.stats(a)
    finite = a[np.isfinite(a)].astype(np.float64)
    assert (s["nan"], s["inf"]) == (1, 2)
    assert s["min"] == finite.min() and s["max"] == finite.max() and s["absmax"] == np.abs(finite).max()
    assert s["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    b = a.copy()
    b[0, 0] = np.nextafter(b[0, 0], np.float32(np.inf))  # one ulp: another hash, statistics within tolerance
    assert P.stats(b)["hash"] != s["hash"] and P.stats(a.copy())["hash"] == s["hash"]


def record_step(path, tokens, perturb=None, monkeypatch=None):
    """One training step of a small GPT-2 on DEVICE, recorded; perturb: None, 'composite' (gelu's composite
    instead of its kernel) or 'perturbed' (that composite with its tanh scaled)."""
    it.manual_seed(3)
    model = R.resolve("gpt2", shape={"n_layer": 2}, sequence_length=16, vocab_size=64).build(DEVICE)
    opt = it.optim.AdamW(list(model.parameters()), lr=1e-3)
    rec = P.Recorder(str(path), {1}, meta={"dtype": "float32", "device": DEVICE})
    rec.attach(model)
    x, y = (it.from_numpy(t, device=DEVICE) for t in (tokens[:, :-1], tokens[:, 1:]))
    if perturb == "perturbed":
        tanh = F.tanh
        monkeypatch.setattr(F, "tanh", lambda t: tanh(t) * 1.01)
    try:
        with dispatch.prefer_composites(["linear_gelu_tanh"] if perturb else []), rec.step(1):
            with rec.phase("forward"), fusing():  # as the Trainer runs models: GPT-2's MLP is linear_gelu_linear
                _, loss = model(x, y)
            with rec.phase("backward"):
                loss.backward()
            rec.record_tensors("grad", model.named_parameters(), grads=True)
            with rec.phase("optimizer"):
                opt.step()
            rec.record_tensors("param", model.named_parameters())
    finally:
        monkeypatch.undo() if monkeypatch else None
        rec.close()
    return loss.item()


def test_a_perturbed_op_is_named_as_the_first_divergence(tmp_path, monkeypatch):
    tokens = rng().integers(0, 64, size=(4, 17))
    base, comp, bad = (tmp_path / f"{n}.jsonl" for n in ("base", "composite", "perturbed"))
    record_step(base, tokens)
    record_step(comp, tokens, "composite")
    record_step(bad, tokens, "perturbed", monkeypatch)
    lines = [json.loads(x) for x in open(base)]
    assert lines[0]["precision_check"]["steps"] == [1]
    kinds = {(r["kind"], r["phase"]) for r in lines[2:]}
    assert kinds >= {("op", "forward"), ("module", "forward"), ("op", "backward"), ("grad", ""), ("param", "")}
    # The composite computes gelu in other steps than the kernel: within tolerance, if not bitwise.
    same = P.first_divergence(str(base), str(comp))
    assert same["first"] is None and same["compared"] == len(lines) - 2, same["first"]
    result = P.first_divergence(str(base), str(bad))
    first = result["first"]
    assert first is not None, P.format_divergence(result)
    rec = first["record"]
    assert (rec["kind"], rec["name"], rec["module"], rec["phase"]) == (
        "op",
        "linear_gelu_tanh:0",
        "h.0.mlp.c_proj",
        "forward",
    )
    assert first["what"] == "step 1 forward: op linear_gelu_tanh:0 in h.0.mlp.c_proj"
    # Everything before it agrees, bit for bit.
    order = [P._key(r) for r in lines[2:]]
    assert result["first_bitwise"] == first["what"] or order.index(P._key(rec)) > 0
    assert P.first_divergence(str(base), str(base))["first_bitwise"] is None


TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16", "--batch_size=4"]
TINY += ["--freq_generate_txt=0", "--num_iteration=2", "--lr_warmup_iters=0"]

# The train CLI with the perturbed gelu composite preferred over the kernel, as a provider's bug would be.
PERTURBED_TRAIN = """
import sys
from infinitrain import dispatch, train
from infinitrain import functional as F
tanh = F.tanh
F.tanh = lambda t: tanh(t) * 1.01
dispatch.op("linear_gelu_tanh").prefer_composite(True)
sys.argv = ["train", *sys.argv[1:]]
train.run()
"""


def test_train_cli_records_and_compare_names_the_op(tmp_path, capsys):
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(rng().integers(0, 40, size=9), 100), kind="gpt2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    for name, head in (("a", ["-m", "infinitrain.train"]), ("b", ["-c", PERTURBED_TRAIN])):
        cmd = [sys.executable, *head, f"--device={DEVICE}", f"--input_bin={corpus}", *TINY]
        cmd += [f"--save={tmp_path / name}", "--precision_check=steps=1:2"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"precision check: steps [1, 2] into {tmp_path / name / 'precision.jsonl'}" in p.stdout
    args = [str(tmp_path / "a"), str(tmp_path / "b"), "--precision", f"--out={tmp_path / 'cmp'}"]
    assert compare.main([*args, "--throughput_tol=1e9", "--loss_tol=1"]) == 1
    out = capsys.readouterr().out
    assert "precision: first divergence: step 1 forward: op linear_gelu_tanh:0 in h.0.mlp.c_proj: " in out, out
    report = (tmp_path / "cmp" / "compare.md").read_text()
    assert "first divergence: step 1 forward: op linear_gelu_tanh:0 in h.0.mlp.c_proj" in report
