"""The profiler: every kernel the dispatcher runs inside the context is recorded once, with its device,
and the Chrome trace holds them."""

import json

import numpy as np

import infinitrain as it
from harness import DEVICE


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
    names = [e["name"] for e in trace["traceEvents"] if e["pid"] == "host"]
    assert names == ops
    with it.profiler.profile() as again:
        pass
    assert again.records == []  # nothing recorded outside a context, nothing carried over
