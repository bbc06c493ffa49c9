"""Where a step's time goes, op by op.

    with it.profiler.profile() as prof:
        with prof.mark("step 1"):
            train_step()
    print(prof.table(top=10))                 # ops by device time, with their share and host time
    prof.export_chrome_trace("step.json")     # open in Perfetto or chrome://tracing

While the context is active the dispatcher times every kernel it runs: the
host time spent issuing it and its device time between two events around the
launch (on the cpu, where kernels run when issued, both are the host time).
`mark` adds named spans (steps, phases) of the Python side; `pause` leaves
work out (evaluation, sampling between profiled steps). Leaving the context
waits for the device.

The train CLI profiles steps A..B with --profile_steps=A:B.
"""

import contextlib
import json
import time
from collections import defaultdict

from infinitrain import _C


class OpRecord:
    """One kernel: host_start_us since the profile began; device_start_ms since the device's first kernel of
    the same session (a pause starts a new one)."""

    __slots__ = ("op", "device", "host_start_us", "host_us", "device_start_ms", "device_ms", "session")

    def __init__(self, op, device, host_start_us, host_us, device_start_ms, device_ms, session=0):
        self.op, self.device = op, device
        self.host_start_us, self.host_us = host_start_us, host_us
        self.device_start_ms, self.device_ms = device_start_ms, device_ms
        self.session = session


class profile:  # noqa: N801 (PyTorch's name)
    def __init__(self):
        self.records = []
        self.spans = []  # (name, start_us, duration_us), Python-side marks
        self._t0 = None
        self._session = 0
        self._session_t0 = None

    def __enter__(self):
        self.records, self.spans, self._session = [], [], 0
        self._start()
        self._t0 = self._session_t0
        return self

    def _start(self):
        _C.start_profiling()
        # The dispatcher's clock starts at start_profiling (steady_clock, CLOCK_MONOTONIC, as perf_counter).
        self._session_t0 = time.perf_counter()

    def _collect(self):
        offset = (self._session_t0 - self._t0) * 1e6
        for r in _C.stop_profiling():
            rec = OpRecord(*r, session=self._session)
            rec.host_start_us += offset
            self.records.append(rec)
        self._session += 1

    def __exit__(self, *exc):
        self._collect()
        self._t0 = None

    @contextlib.contextmanager
    def pause(self):
        """Kernels run inside are not recorded (no-op outside the context)."""
        if self._t0 is None:
            yield
            return
        self._collect()
        try:
            yield
        finally:
            self._start()

    @contextlib.contextmanager
    def mark(self, name):
        """A named span on the trace's Python track (no-op outside the context)."""
        if self._t0 is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.spans.append((name, (start - self._t0) * 1e6, (end - start) * 1e6))

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
        """The ops with the most device time, with their share of it and their host (issue) time, as a
        Markdown table; the last row sums every op."""
        rows = sorted(self.summary().items(), key=lambda kv: (-kv[1]["device_ms"], kv[0]))
        total = sum(s["device_ms"] for _, s in rows) or 1.0
        host = sum(s["host_ms"] for _, s in rows)
        lines = [
            "| op | calls | device ms | share | device us/call | host ms |",
            "|---|---|---|---|---|---|",
        ]
        for name, s in rows[:top]:
            share = 100.0 * s["device_ms"] / total
            per = 1000.0 * s["device_ms"] / s["calls"]
            lines.append(
                f"| {name} | {s['calls']} | {s['device_ms']:.2f} | {share:.1f}% | {per:.1f} | {s['host_ms']:.2f} |"
            )
        lines.append(f"| all {len(rows)} ops | {len(self.records)} | {total:.2f} | 100% | | {host:.2f} |")
        return "\n".join(lines)

    def chrome_trace(self):
        """The trace as a dict in Chrome's trace-event format: process 0 is the host (a Python track with the
        marks, a dispatcher track with each op's issue time), then one process per device with its kernels.
        Device clocks start at their first recorded kernel, placed at that kernel's issue time on the host."""
        events = [_meta("process_name", 0, 0, "host"), _meta("thread_name", 0, 0, "python")]
        events.append(_meta("thread_name", 0, 1, "dispatcher (issue)"))
        for name, start, dur in self.spans:
            events.append({"name": name, "cat": "mark", "ph": "X", "ts": start, "dur": dur, "pid": 0, "tid": 0})
        pids, origin = {}, {}
        for r in self.records:
            events.append(
                {
                    "name": r.op,
                    "cat": "op",
                    "ph": "X",
                    "ts": r.host_start_us,
                    "dur": r.host_us,
                    "pid": 0,
                    "tid": 1,
                    "args": {"device": r.device},
                }
            )
            if r.device not in pids:
                pids[r.device] = len(pids) + 1
                events.append(_meta("process_name", pids[r.device], 0, f"device {r.device}"))
                events.append(_meta("thread_name", pids[r.device], 0, "kernels"))
            if r.device_start_ms < 0:  # the cpu: kernels run while they are issued
                start = r.host_start_us
            else:
                base = origin.setdefault((r.device, r.session), r.host_start_us - r.device_start_ms * 1000.0)
                start = base + r.device_start_ms * 1000.0
            events.append(
                {
                    "name": r.op,
                    "cat": "kernel",
                    "ph": "X",
                    "ts": start,
                    "dur": r.device_ms * 1000.0,
                    "pid": pids[r.device],
                    "tid": 0,
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path):
        """Writes chrome_trace() as JSON (open it in Perfetto or chrome://tracing); returns the path."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path


def _meta(what, pid, tid, name):
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
