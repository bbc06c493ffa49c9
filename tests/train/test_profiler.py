"""The profiler: every kernel the dispatcher runs inside the context is recorded once, with its device; the
Chrome trace holds them on a host and a device track; the op counts of a training step's trace equal the ops
the step dispatched; and the train CLI's --profile_steps writes the table and the trace."""

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng
from infinitrain import dispatch
from infinitrain.data import write_tokens
from infinitrain.models import registry as R


def test_profile_records_every_dispatched_op(tmp_path):
    a = it.from_numpy(np.random.default_rng().standard_normal((64, 64)), device=DEVICE)
    with it.profiler.profile() as prof:
        b = a @ a
        c = (b + a).exp()
        d = c.sum()
    d.item()
    ops = [r.op for r in prof.records]
    assert ops == ["matmul", "add", "exp", "sum"], ops
    assert all(r.device == it.runtime.parse_device(DEVICE) for r in prof.records)
    assert all(r.device_ms >= 0 and r.host_us >= 0 for r in prof.records)
    summary = prof.summary()
    assert summary["matmul"]["calls"] == 1 and set(summary) == {"matmul", "add", "exp", "sum"}
    assert "| matmul | 1 |" in prof.table()
    trace = json.loads(open(prof.export_chrome_trace(str(tmp_path / "t.json"))).read())
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "op"]
    assert names == ops
    with it.profiler.profile() as again:
        pass
    assert again.records == []  # nothing recorded outside a context, nothing carried over
    with it.profiler.profile() as paused:
        b = a @ a
        with paused.pause():
            c = b + a
        d = c.exp()
    d.numpy()
    assert [r.op for r in paused.records] == ["matmul", "exp"]
    assert [r.session for r in paused.records] == [0, 1]
    assert paused.records[1].host_start_us > paused.records[0].host_start_us  # one clock across the pause


def test_summary_sums_each_ops_records():
    """summary() per op: the number of records, their device milliseconds summed, and their host microseconds
    summed in milliseconds (the records' own fields added up here)."""
    a = it.from_numpy(rng().standard_normal((32, 32)), device=DEVICE)
    with it.profiler.profile() as prof:
        b = a
        for _ in range(3):
            b = (b @ a).tanh()
    b.numpy()
    summary = prof.summary()
    assert set(summary) == {r.op for r in prof.records} == {"matmul", "tanh"}
    for op, s in summary.items():
        mine = [r for r in prof.records if r.op == op]
        assert s["calls"] == len(mine) == 3
        assert s["device_ms"] == sum(r.device_ms for r in mine)
        assert s["host_ms"] == pytest.approx(sum(r.host_us for r in mine) / 1000.0, rel=1e-12, abs=0)


def test_table_rows_follow_the_summary():
    """table(): one row per op, most device time first, with calls, device ms, its share of the total, device
    microseconds per call (1000 * device ms / calls) and host ms, each formatted from summary(); then the total."""
    a = it.from_numpy(rng().standard_normal((32, 32)), device=DEVICE)
    with it.profiler.profile() as prof:
        b = a
        for _ in range(3):
            b = (b @ a).tanh() + a
    b.numpy()
    summary = prof.summary()
    total = sum(s["device_ms"] for s in summary.values()) or 1.0
    lines = prof.table(top=10).splitlines()
    assert lines[0] == "| op | calls | device ms | share | device us/call | host ms |"
    rows = [line.strip("|").split(" | ") for line in lines[2:-1]]
    assert [r[0].strip() for r in rows] == sorted(summary, key=lambda op: (-summary[op]["device_ms"], op))
    for r in rows:
        s = summary[r[0].strip()]
        want = [str(s["calls"]), f"{s['device_ms']:.2f}", f"{100.0 * s['device_ms'] / total:.1f}%"]
        want += [f"{1000.0 * s['device_ms'] / s['calls']:.1f}", f"{s['host_ms']:.2f}"]
        assert [v.strip() for v in r[1:]] == want, r
    assert lines[-1].startswith(f"| all {len(summary)} ops | {len(prof.records)} | {total:.2f} | 100% |")


def check_chrome_trace(trace):
    """Chrome's trace-event format: complete events (X) with numeric times on integer pid/tid tracks, and
    metadata events (M) naming every track used."""
    assert set(trace) == {"traceEvents", "displayTimeUnit"}
    named = set()
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            named.add((e["name"], e["pid"], e["tid"] if e["name"] == "thread_name" else None))
        else:
            assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0, e
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert ("process_name", e["pid"], None) in named and ("thread_name", e["pid"], e["tid"]) in named, e


def test_trace_of_a_training_step_holds_the_ops_it_dispatched(tmp_path):
    it.manual_seed(0)
    model = R.resolve("gpt2", shape={"n_layer": 2}, sequence_length=16, vocab_size=64).build(DEVICE)
    opt = it.optim.AdamW(list(model.parameters()), lr=1e-3)
    tokens = rng().integers(0, 64, size=(4, 17))
    dispatched = collections.Counter()
    real = dispatch.op

    class Counted:  # counts every op call through the dispatcher, composites' inner ops included
        def __init__(self, name):
            self.op, self.name = real(name), name

        def __call__(self, inputs, attrs):
            dispatched[self.name] += 1
            return self.op(inputs, attrs)

    dispatch.op = Counted
    try:
        with it.profiler.profile() as prof:
            with prof.mark("step 1"):
                x, y = (it.from_numpy(t, device=DEVICE) for t in (tokens[:, :-1], tokens[:, 1:]))
                _, loss = model(x, y)
                loss.backward()
                it.optim.clip_grad_norm_(list(model.parameters()), 1.0)
                opt.step()
                loss.item()
    finally:
        dispatch.op = real
    trace = json.loads(open(prof.export_chrome_trace(str(tmp_path / "step.json"))).read())
    check_chrome_trace(trace)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    host = collections.Counter(e["name"] for e in events if e["cat"] == "op")
    device = collections.Counter(e["name"] for e in events if e["cat"] == "kernel")
    assert host == device == dispatched, (host - dispatched, dispatched - host)
    (mark,) = [e for e in events if e["cat"] == "mark"]
    assert mark["name"] == "step 1" and mark["pid"] == 0
    first_op = min(e["ts"] for e in events if e["cat"] == "op")
    last_end = max(e["ts"] + e["dur"] for e in events if e["cat"] == "op")
    assert mark["ts"] <= first_op and last_end <= mark["ts"] + mark["dur"] + 1.0  # the same clock
    assert {e["pid"] for e in events if e["cat"] == "kernel"} == {1}
    table = prof.table(top=5).splitlines()
    assert len(table) == 2 + 5 + 1 and table[-1].startswith(f"| all {len(dispatched)} ops | {sum(host.values())} |")


def test_write_profile_lists_the_top_15_ops(tmp_path):
    """write_profile (the train CLI's --profile_steps output) keeps the 15 ops with the most device time in its
    table, printed and in the Markdown file, and sums every op in the last row."""
    from infinitrain.training.trainer import write_profile

    a = it.from_numpy(rng().uniform(0.5, 1.0, (8, 8)), device=DEVICE)
    unary = ["exp", "log", "tanh", "sqrt", "abs", "neg", "sin", "cos", "sigmoid", "relu", "rsqrt", "floor"]
    with it.profiler.profile() as prof:
        outs = [getattr(a, op)() for op in unary] + [a + a, a * a, a - a, a / a, a @ a]
    outs[-1].numpy()
    ops = {r.op for r in prof.records}
    assert len(ops) >= 17, ops
    write_profile(prof, str(tmp_path), "t", [2, 3])
    md = (tmp_path / "t.profile.md").read_text().splitlines()
    rows = [line for line in md if line.startswith("| ")][1:]
    assert len(rows) == 15 + 1 and rows[-1].startswith(f"| all {len(ops)} ops | {len(prof.records)} |")


def test_train_profile_steps_writes_table_and_trace(tmp_path):
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(rng().integers(0, 40, size=9), 100), kind="gpt2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    cmd = [sys.executable, "-m", "infinitrain.train", f"--device={DEVICE}", f"--input_bin={corpus}"]
    cmd += ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16", "--batch_size=4"]
    cmd += ["--num_iteration=3", "--freq_generate_txt=0", "--profile_steps=2:3", "--profile_name=tiny"]
    cmd += [f"--save={tmp_path / 'run'}", f"--input_val_bin={corpus}", "--val_loss_every=1", "--val_batches=1"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "profile of steps 2:3:" in p.stdout and "| matmul |" in p.stdout
    md = (tmp_path / "run" / "tiny.profile.md").read_text()
    assert md.startswith("Profile of steps 2:3") and "| op | calls | device ms |" in md
    trace = json.loads((tmp_path / "run" / "tiny.trace.json").read_text())
    check_chrome_trace(trace)
    marks = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "mark"]
    assert marks.count("step 2") == marks.count("step 3") == 1 and "forward" in marks and "step 1" not in marks
    # Both steps ran the same ops, and the evaluation between them was left out (paused): the trace holds each
    # op an even number of times.
    counts = collections.Counter(e["name"] for e in trace["traceEvents"] if e.get("cat") == "op")
    assert counts and all(n % 2 == 0 for n in counts.values()), counts
