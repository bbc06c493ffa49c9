"""The precision checker: for chosen steps, statistics of every module's forward output, every op's outputs,
every parameter's gradient and every parameter after the optimizer step, as JSON lines; and the comparison of
two such records that names the first module or op whose statistics part beyond a tolerance.

    rec = Recorder("precision.jsonl", steps={1}, meta={...})
    rec.attach(model)
    with rec.step(1):
        with rec.phase("forward"): loss = model(x, y)[1]
        with rec.phase("backward"): loss.backward()
        rec.record_tensors("grad", model.named_parameters(), grads=True)
    first_divergence("a.jsonl", "b.jsonl")

Statistics: min, max, mean, absolute max (over finite values), NaN and Inf counts, and a hash of the bytes
(bitwise equality). Every op is seen at the Python dispatcher (`dispatch.op`), outside composites: an op that
runs as a composite is one record, named by the op, in the innermost module that called it.
"""

import contextlib
import hashlib
import json
import math
import os

import numpy as np

from infinitrain import dispatch, fusion
from infinitrain.runs import open_output
from infinitrain.tensor import Tensor

FORMAT_VERSION = 1
# Tolerances on statistics, relative to the tensor's absolute maximum (see compare): float32 kernels on two
# providers differ by a few ulps per element, bfloat16 ones by a few bfloat16 ulps (2^-8).
TOLERANCES = {"float32": (1e-4, 1e-6), "bfloat16": (2e-2, 1e-3)}
STAT_KEYS = ("min", "max", "mean", "absmax")


def stats(array, with_hash=True):
    """Statistics of a host array (float64 sums; NaN and Inf counted and left out of the others)."""
    a = np.asarray(array)
    out = {"dtype": str(a.dtype), "shape": list(a.shape)}
    if a.dtype.kind in "fc":
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        finite = a[np.isfinite(a)] if nan or inf else a
    else:
        nan = inf = 0
        finite = a
    f = finite.astype(np.float64, copy=False)
    if f.size:
        out.update(min=float(f.min()), max=float(f.max()), mean=float(f.mean()), absmax=float(np.abs(f).max()))
    else:
        out.update(min=None, max=None, mean=None, absmax=None)
    out.update(nan=nan, inf=inf)
    if with_hash:
        out["hash"] = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    return out


def parse_config(text):
    """--precision_check: comma-separated key=value (InfiniTrain's form): steps=A or A:B (1-based, inclusive;
    default 1), level=1 (modules, gradients, parameters) or 2 (also every op; default), output_path=PATH,
    baseline=PATH (compare with this record at the end), output_md5=true|false (the hash), format=simple."""
    cfg = {"steps": {1}, "level": 2, "output_path": "", "baseline": "", "hash": True}
    if text.strip().lower() in ("1", "true", "on", "yes"):
        return cfg
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--precision_check: expected key=value, got {item!r}")
        if key == "steps":
            cfg["steps"] = parse_steps(value, "--precision_check steps")
        elif key == "level":
            if value not in ("1", "2"):
                raise ValueError(f"--precision_check: level must be 1 or 2, got {value!r}")
            cfg["level"] = int(value)
        elif key in ("output_path", "baseline"):
            cfg[key] = value
        elif key == "output_md5":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--precision_check: output_md5 must be true or false, got {value!r}")
            cfg["hash"] = value.lower() == "true"
        elif key == "format":
            if value != "simple":
                raise ValueError(f"--precision_check: format={value} is not implemented (only simple: JSON lines)")
        else:
            raise ValueError(
                f"--precision_check: unknown key {key!r} "
                "(known: steps, level, output_path, baseline, output_md5, format)"
            )
    return cfg


def parse_steps(text, what):
    """'A' or 'A:B' (1-based, inclusive) -> a set of steps."""
    try:
        a, sep, b = text.partition(":")
        lo, hi = int(a), int(b) if sep else int(a)
    except ValueError:
        raise ValueError(f"{what}={text}: expected a step A or a range A:B") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"{what}={text}: need 1 <= A <= B")
    return set(range(lo, hi + 1))


class _TappedOp:
    """Forwards to the native op and records its outputs (outside composites only)."""

    __slots__ = ("_op", "_name", "_rec")

    def __init__(self, op, name, rec):
        self._op, self._name, self._rec = op, name, rec

    def __call__(self, inputs, attrs):
        rec = self._rec
        rec._depth += 1
        try:
            outs = self._op(inputs, attrs)
        finally:
            rec._depth -= 1
        if rec._depth == 0 and rec._ops_on:
            for i, t in enumerate(outs):
                rec._record("op", self._name if len(outs) == 1 else f"{self._name}:{i}", Tensor(t))
        return outs

    def __getattr__(self, name):
        return getattr(self._op, name)


class Recorder:
    def __init__(self, path, steps, *, level=2, with_hash=True, meta=None, device=None):
        self.path, self.steps, self.level, self.with_hash = path, set(steps), level, with_hash
        self.device = device
        self._f = open_output(path, "w")  # never blocks on a FIFO or writes into a block device
        self._write({"precision_check": {"version": FORMAT_VERSION, "steps": sorted(self.steps), "level": level}})
        if meta:
            self._write({"meta": meta})
        self._active = False
        self._ops_on = False
        self._depth = 0
        self._step = 0
        self._phase = ""
        self._modules = []
        self._counts = {}

    def _write(self, obj):
        self._f.write(json.dumps(obj) + "\n")

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    # ---- what is recorded ----
    def _record(self, kind, name, tensor):
        if self.device is not None and tensor.device != self.device:
            return  # data parallel: replica 0 only
        module = self._modules[-1] if self._modules else ""
        key = (self._phase, kind, module, name)
        call = self._counts.get(key, 0)
        self._counts[key] = call + 1
        line = {"step": self._step, "phase": self._phase, "kind": kind, "module": module, "name": name}
        line["call"] = call
        line.update(stats(tensor.numpy(), self.with_hash))
        line["dtype"] = tensor.dtype
        self._write(line)

    def _record_later(self, module, label, t):
        """A module's output, recorded now, or (a value it.compile's fusion left pending) when it is computed: a
        record must not force the unfused ops the fusion replaced."""
        phase = self._phase

        def record(value):
            if not self._active:
                return
            saved, self._phase = self._phase, phase
            self._modules.append(module)
            try:
                self._record("module", label, value)
            finally:
                self._modules.pop()
                self._phase = saved

        if isinstance(t, fusion.Pending):
            t.when_computed(record)
        else:
            record(t)

    def record_tensors(self, kind, named, grads=False):
        """Records named tensors (e.g. model.named_parameters()), or their .grad with grads=True."""
        if not self._active:
            return
        for name, t in named:
            t = t.grad if grads else t
            if t is not None:
                self._record(kind, name, t)

    def attach(self, model, root="model"):
        """Wraps every module's forward so its outputs are recorded (under the module's dotted name)."""
        for name, module in model.named_modules():
            forward = module.forward

            def recorded(*args, _forward=forward, _name=name or root, **kwargs):
                if not self._active:
                    return _forward(*args, **kwargs)
                self._modules.append(_name)
                try:
                    out = _forward(*args, **kwargs)
                finally:
                    self._modules.pop()
                for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, Tensor):
                        label = "output" if not isinstance(out, (tuple, list)) else f"output:{i}"
                        self._record_later(_name, label, t)
                return out

            object.__setattr__(module, "forward", recorded)
        return model

    @contextlib.contextmanager
    def step(self, step):
        """Records inside when `step` (1-based) is a chosen one."""
        if step not in self.steps:
            yield False
            return
        self._active, self._step, self._counts = True, step, {}
        real_op = dispatch.op
        taps = {}

        def tapped(name):
            t = taps.get(name)
            if t is None:
                t = taps[name] = _TappedOp(real_op(name), name, self)
            return t

        if self.level >= 2:
            dispatch.op = tapped
        try:
            yield True
        finally:
            dispatch.op = real_op
            self._active = False
            self._f.flush()

    @contextlib.contextmanager
    def phase(self, name):
        prev, prev_ops = self._phase, self._ops_on
        self._phase, self._ops_on = name, self.level >= 2
        try:
            yield
        finally:
            self._phase, self._ops_on = prev, prev_ops


# ---- comparing two records ----------------------------------------------------------------------------------


def read(path):
    """(header, meta, records) of a precision record file."""
    header, meta, records = None, {}, []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{n}: not a JSON line") from None
                if "precision_check" in obj:
                    header = obj["precision_check"]
                elif "meta" in obj:
                    meta = obj["meta"]
                else:
                    records.append(obj)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such precision record") from None
    if header is None:
        raise ValueError(f"{path}: not a precision record (no precision_check header line)")
    return header, meta, records


def _key(r):
    return (r["step"], r["phase"], r["kind"], r["module"], r["name"], r["call"])


def describe(r):
    where = f" in {r['module']}" if r["module"] and r["kind"] != "module" else ""
    what = {"op": "op", "module": "module", "grad": "gradient of", "param": "parameter"}.get(r["kind"], r["kind"])
    name = r["module"] if r["kind"] == "module" else r["name"]
    call = f" (call {r['call'] + 1})" if r["call"] else ""
    return f"step {r['step']} {r['phase']}: {what} {name}{where}{call}"


def _differs(a, b, rtol, atol):
    """The worst statistic's (name, a, b) beyond tolerance, or None."""
    if (a["nan"], a["inf"]) != (b["nan"], b["inf"]):
        return ("nan/inf", f"{a['nan']}/{a['inf']}", f"{b['nan']}/{b['inf']}")
    if list(a["shape"]) != list(b["shape"]):
        return ("shape", a["shape"], b["shape"])
    scale = max(abs(a["absmax"] or 0.0), abs(b["absmax"] or 0.0))
    worst, which = 0.0, None
    for k in STAT_KEYS:
        x, y = a[k], b[k]
        if x is None or y is None:
            if x is not y:
                return (k, x, y)
            continue
        ratio = abs(x - y) / (atol + rtol * scale)
        if ratio > worst:
            worst, which = ratio, (k, x, y)
    return which if worst > 1.0 else None


def first_divergence(path_a, path_b, rtol=None, atol=None):
    """Lines up two records (by step, phase, kind, module, name and call number, in A's order) and returns a
    dict: first (the first record beyond tolerance, with the statistic), first_bitwise (the first whose hash
    differs), compared, missing (keys in A without a match in B), tolerance."""
    ha, ma, ra = read(path_a)
    _, mb, rb = read(path_b)
    dtypes = {ma.get("dtype"), mb.get("dtype")}
    default = TOLERANCES["bfloat16"] if "bfloat16" in dtypes else TOLERANCES["float32"]
    rtol = default[0] if rtol is None else rtol
    atol = default[1] if atol is None else atol
    index = {_key(r): r for r in rb}
    result = {"first": None, "first_bitwise": None, "compared": 0, "missing": [], "tolerance": (rtol, atol)}
    for a in ra:
        b = index.get(_key(a))
        if b is None:
            result["missing"].append(describe(a))
            if result["first"] is None:
                result["first"] = {"record": a, "what": describe(a), "stat": "missing in B", "a": None, "b": None}
            continue
        result["compared"] += 1
        if result["first_bitwise"] is None and a.get("hash") and a.get("hash") != b.get("hash"):
            result["first_bitwise"] = describe(a)
        if result["first"] is None:
            d = _differs(a, b, rtol, atol)
            if d is not None:
                result["first"] = {"record": a, "what": describe(a), "stat": d[0], "a": d[1], "b": d[2]}
    return result


def format_divergence(result, name_a="A", name_b="B"):
    rtol, atol = result["tolerance"]
    lines = [f"precision: {result['compared']} records compared (tolerance rtol {rtol:g}, atol {atol:g} of |max|)"]
    first = result["first"]
    if first is None:
        lines.append("precision: no statistic parts beyond tolerance")
    elif first["a"] is None:
        lines.append(f"precision: first divergence: {first['what']}: missing in {name_b}")
    else:
        lines.append(
            f"precision: first divergence: {first['what']}: {first['stat']} {_fmt(first['a'])} ({name_a}) vs "
            f"{_fmt(first['b'])} ({name_b})"
        )
    lines.append(f"precision: first bitwise difference: {result['first_bitwise'] or 'none (every hash equal)'}")
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.9g}" if math.isfinite(v) else str(v)
    return str(v)


def default_path(run_dir):
    return os.path.join(run_dir, "precision.jsonl")
