"""Where a step's time goes, op by op.

    with it.profiler.profile() as prof:
        train_step()
    print(prof.table(top=10))                 # ops by device time, with their share
    prof.export_chrome_trace("step.json")     # open in Perfetto or chrome://tracing

While the context is active the dispatcher times every kernel it runs: the
host time spent issuing it and its device time between two events around the
launch (on the cpu, where kernels run when issued, both are the host time).
Leaving the context waits for the device.
"""

import json
from collections import defaultdict

from infinitrain import _C


class OpRecord:
    __slots__ = ("op", "device", "host_start_us", "host_us", "device_start_ms", "device_ms")

    def __init__(self, op, device, host_start_us, host_us, device_start_ms, device_ms):
        self.op, self.device = op, device
        self.host_start_us, self.host_us = host_start_us, host_us
        self.device_start_ms, self.device_ms = device_start_ms, device_ms


class profile:  # noqa: N801 (PyTorch's name)
    def __init__(self):
        self.records = []

    def __enter__(self):
        _C.start_profiling()
        return self

    def __exit__(self, *exc):
        self.records = [OpRecord(*r) for r in _C.stop_profiling()]

    def summary(self):
        """{op: {'calls', 'device_ms', 'host_ms'}}, summed over the records."""
        out = defaultdict(lambda: {"calls": 0, "device_ms": 0.0, "host_ms": 0.0})
        for r in self.records:
            s = out[r.op]
            s["calls"] += 1
            s["device_ms"] += r.device_ms
            s["host_ms"] += r.host_us / 1000.0
        return dict(out)

    def table(self, top=10):
        """The ops with the most device time, with their share of it, as a Markdown table."""
        rows = sorted(self.summary().items(), key=lambda kv: -kv[1]["device_ms"])
        total = sum(s["device_ms"] for _, s in rows) or 1.0
        host = sum(s["host_ms"] for _, s in rows)
        lines = ["| op | calls | device ms | share | host ms |", "|---|---|---|---|---|"]
        for name, s in rows[:top]:
            share = 100.0 * s["device_ms"] / total
            lines.append(f"| {name} | {s['calls']} | {s['device_ms']:.2f} | {share:.1f}% | {s['host_ms']:.2f} |")
        lines.append(f"| all {len(rows)} ops | {len(self.records)} | {total:.2f} | 100% | {host:.2f} |")
        return "\n".join(lines)

    def export_chrome_trace(self, path):
        """A Chrome trace-event file: a host track and one track per device."""
        events = []
        for r in self.records:
            events.append(
                {"name": r.op, "ph": "X", "ts": r.host_start_us, "dur": r.host_us, "pid": "host", "tid": r.device}
            )
            if r.device_start_ms >= 0:
                events.append(
                    {
                        "name": r.op,
                        "ph": "X",
                        "ts": r.device_start_ms * 1000.0,
                        "dur": r.device_ms * 1000.0,
                        "pid": r.device,
                        "tid": "kernels",
                    }
                )
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        return path
