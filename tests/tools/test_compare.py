"""compare: two runs' loss curves against the dtype's threshold and their throughput against 20%, the exit
status, the Markdown summary and the PNG plots (their data, not their pixels), and the mode that trains one
configuration on two devices."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, child_env, rng, run_train
from infinitrain.data import write_tokens
from infinitrain.runs import read_metrics
from infinitrain.tools import compare as C

TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16", "--batch_size=4"]
TINY += ["--freq_generate_txt=0", "--lr_warmup_iters=1"]


def train(*flags, device=DEVICE):
    return run_train(*flags, device=device)


def compare_cli(*args):
    cmd = [sys.executable, "-m", "infinitrain.tools.compare", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=300)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(rng().integers(0, 40, size=11), 200), kind="gpt2")
    return str(path)


def compare_main(capsys, *args):
    """compare in this process; returns (status, stdout)."""
    status = C.main(list(args))
    return status, capsys.readouterr().out


def test_identical_runs_pass_and_a_perturbed_learning_rate_fails(corpus, tmp_path, capsys):
    args = [f"--input_bin={corpus}", f"--input_val_bin={corpus}", "--num_iteration=5", "--val_loss_every=5", *TINY]
    for name, lr in (("a", "1e-3"), ("b", "1e-3"), ("c", "1.001e-3")):
        train(*args, f"--learning_rate={lr}", f"--save={tmp_path / name}")
    # Tiny runs' throughput is noise on a shared machine: the threshold has its own test below.
    status, out = compare_main(capsys, str(tmp_path / "a"), str(tmp_path / "b"), f"--out={tmp_path / 'ab'}",
                               "--throughput_tol=1e9")  # fmt: skip
    assert status == 0, out
    assert "loss: PASS: 5 steps, max |diff| 0 " in out and "val loss: PASS" in out
    assert (tmp_path / "ab" / "compare.md").read_text().startswith(f"# a ({it.runtime.parse_device(DEVICE)}) vs b (")
    status, out = compare_main(capsys, str(tmp_path / "a"), str(tmp_path / "c"), f"--out={tmp_path / 'ac'}",
                               "--throughput_tol=1e9")  # fmt: skip
    assert status == 1, out
    a, c = read_metrics(tmp_path / "a")[1], read_metrics(tmp_path / "c")[1]
    first = next(s for s in sorted(a) if abs(a[s]["train_loss"] - c[s]["train_loss"]) > 1e-5)
    d = abs(a[first]["train_loss"] - c[first]["train_loss"])
    assert f"loss: FAIL at step {first}: |diff| {d:.3g} > 1e-05" in out, out
    md = (tmp_path / "ac" / "compare.md").read_text()
    assert md.startswith("# a (") and ": FAIL" in md.splitlines()[0] and f"| {first} |" in md
    # The plots: files of the expected size, whose data are the metrics.
    for name in ("loss.png", "loss_diff.png", "throughput.png"):
        assert png_size(tmp_path / "ac" / name) == (800, 450)
    run_a, run_c = C.Run(str(tmp_path / "a")), C.Run(str(tmp_path / "c"))
    r = C.compare_runs(run_a, run_c)
    figs = C.figures(run_a, run_c, r)
    steps = sorted(a)
    loss_lines = figs["loss.png"].axes[0].get_lines()
    np.testing.assert_array_equal(loss_lines[0].get_xdata(), steps)
    np.testing.assert_array_equal(loss_lines[0].get_ydata(), [a[s]["train_loss"] for s in steps])
    np.testing.assert_array_equal(loss_lines[1].get_ydata(), [c[s]["train_loss"] for s in steps])
    np.testing.assert_array_equal(loss_lines[2].get_ydata(), [a[5]["val_loss"]])
    diff_ax = figs["loss_diff.png"].axes[0]
    assert diff_ax.get_yscale() == "log"
    want = [max(abs(a[s]["train_loss"] - c[s]["train_loss"]), C.LOG_FLOOR) for s in steps]
    np.testing.assert_array_equal(diff_ax.get_lines()[0].get_ydata(), want)
    assert diff_ax.get_lines()[1].get_ydata()[0] == 1e-5  # the threshold line
    tput = figs["throughput.png"].axes[0].get_lines()
    np.testing.assert_array_equal(tput[1].get_ydata(), [c[s]["tokens_per_s"] for s in steps])


def write_metrics(path, dtype, losses, tokens_per_s):
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "config", "flags": {"dtype": dtype}, "devices": ["cpu"]}) + "\n")
        for i, (loss, tps) in enumerate(zip(losses, tokens_per_s, strict=True), 1):
            f.write(json.dumps({"kind": "step", "step": i, "train_loss": loss, "tokens_per_s": tps}) + "\n")


@pytest.mark.parametrize(
    "dtype,delta,ratio,status",
    [
        ("float32", 5e-6, 0.85, 0),  # within 1e-5 and 20%
        ("float32", 5e-5, 1.0, 1),  # loss beyond 1e-5
        ("bfloat16", 5e-3, 1.0, 0),  # within bfloat16's 1e-2
        ("bfloat16", 5e-2, 1.0, 1),
        ("float32", 0.0, 0.75, 1),  # 25% slower
        ("float32", 0.0, 1.25, 1),  # 25% faster: not within 20% either
    ],
)
def test_thresholds_follow_the_dtype_and_throughput(dtype, delta, ratio, status, tmp_path):
    n = 8
    losses = 5.0 - np.arange(n) * 0.1 + rng().standard_normal(n) * 0.01
    tps = 1000.0 + rng().standard_normal(n) * 5
    write_metrics(tmp_path / "a.jsonl", dtype, losses.tolist(), tps.tolist())
    write_metrics(tmp_path / "b.jsonl", dtype, (losses + delta).tolist(), (tps * ratio).tolist())
    rc = C.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), f"--out={tmp_path / 'out'}"])
    assert rc == status


@pytest.mark.parametrize("ratio, words", [(1.1, "10.0% faster"), (0.9, "10.0% slower"), (1.0, "0.0% faster")])
def test_throughput_line_says_how_much_faster_or_slower(ratio, words, tmp_path, capsys):
    """The throughput verdict names the median tokens/s of each run and b's speed relative to a in percent
    (1100 vs 1000 tok/s: 10.0% faster; 900: 10.0% slower), within the 20% threshold."""
    losses = (5.0 - np.arange(6) * 0.1).tolist()
    write_metrics(tmp_path / "a.jsonl", "float32", losses, [1000.0] * 6)
    write_metrics(tmp_path / "b.jsonl", "float32", losses, [1000.0 * ratio] * 6)
    C.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), f"--out={tmp_path / 'out'}"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("throughput:"))
    assert line.startswith("throughput: PASS: median 1000 tok/s (") and f") vs {1000 * ratio:.0f} (" in line, line
    assert line.endswith(f" is {words} (threshold 20%)"), line


def test_bad_input_is_one_line(tmp_path, capsys):
    assert C.main([str(tmp_path / "nothing"), str(tmp_path), f"--out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no such metrics file" in err and len(err.splitlines()) == 1, err
    with pytest.raises(SystemExit) as e:
        C.main([str(tmp_path)])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: give two runs (directories or metrics files), or --devices=A,B -- <train flags>\n"
    )


@pytest.mark.parametrize(
    "line,message",
    [
        ("[1, 2]", "expected a JSON object, got list"),
        ('"step"', "expected a JSON object, got str"),
        ('{"kind": "step", "train_loss": 1.0}', "a step line needs a non-negative integer 'step', got None"),
        ('{"kind": "step", "step": "3"}', "a step line needs a non-negative integer 'step', got '3'"),
        ('{"kind": "step", "step": true}', "a step line needs a non-negative integer 'step', got True"),
        ('{"kind": "step", "step": -2}', "a step line needs a non-negative integer 'step', got -2"),
        ('{"kind": "step", "step": 3, "train_loss": "low"}', "step 3's 'train_loss' should be a number, got 'low'"),
        ('{"kind": "step", "step": 3, "tokens_per_s": [1]}', "step 3's 'tokens_per_s' should be a number, got [1]"),
        ('{"kind": "config", "devices": "cpu"}', "config's 'devices' should be a JSON list, got 'cpu'"),
        ('{"kind": "config", "flags": [1]}', "config's 'flags' should be a JSON dict, got [1]"),
        ('{"kind": "config", "devices": [1]}', "config's 'devices' should be a list of strings"),
    ],
)
def test_a_malformed_metrics_line_is_one_line_naming_it(line, message, tmp_path, capsys):
    """A line of the right JSON but the wrong shape (a hand-edited or foreign file) is named with its line number,
    by read_metrics (ValueError) and by the tool (status 2), never a KeyError or TypeError."""
    good = tmp_path / "good.jsonl"
    write_metrics(good, "float32", [2.0, 1.5], [100.0, 100.0])
    bad = tmp_path / "bad.jsonl"
    lines = good.read_text().splitlines()
    first = 1 if '"config"' in line else 2  # a config line counts only as the first one
    bad.write_text("\n".join(lines[: first - 1] + [line] + lines[first - 1 :]) + "\n")
    with pytest.raises(ValueError) as e:
        read_metrics(bad)
    assert str(e.value) == f"{bad}:{first}: {message}"
    assert C.main([str(good), str(bad), f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {bad}:{first}: {message}\n", err


def test_one_configuration_on_two_devices(corpus, tmp_path):
    """--devices trains the flags after -- on each device and compares (cpu against the device under test)."""
    out = tmp_path / "cmp"
    p = compare_cli(
        f"--devices=cpu,{DEVICE}", f"--out={out}", "--throughput_tol=1e9", "--precision", "--",
        f"--input_bin={corpus}", "--num_iteration=3", *TINY,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loss: PASS: 3 steps" in p.stdout and "precision: no statistic parts beyond tolerance" in p.stdout
    runs = sorted(os.listdir(out))
    assert runs[:2] == ["A_cpu", f"B_{DEVICE.replace(':', '_')}"] or runs[:2] == ["A_cpu", "B_cpu"]
    assert read_metrics(out / "A_cpu")[0]["devices"] == ["cpu"]
