"""What a training run needs around its loop: a checkpoint directory that is checked, locked, cleaned and
rotated; checkpoints read back with their meta checked; and signals that stop the run cleanly.

No flags are defined here (infinitrain.train defines them), so this imports anywhere.
"""

import errno
import fcntl
import glob
import json
import os
import signal
import socket
import stat
import tempfile
import time

import numpy as np

from infinitrain import checkpoint

CKPT_PATTERN = "ckpt_*.bin"
LOCK_NAME = ".lock"
METRICS_NAME = "metrics.jsonl"
# What runs write in their checkpoint directory, by name: checkpoints with their shards and damaged ones
# (ckpt_*), the metrics, the precision checker's record, profiles, TensorBoard event files. A run that starts
# over refuses a directory holding any of these (another run's); other files are the user's and left alone.
RUN_FILE_PATTERNS = ("ckpt_*", METRICS_NAME, "precision.jsonl", "*.profile.md", "*.trace.json", "events.out.tfevents.*")
# Where --fresh sets another run's files aside (inside the directory: no second file system, nothing deleted).
EARLIER_PREFIX = "earlier-run-"


class UsageError(ValueError):
    """A bad flag or input: exit status 2."""


class TrainError(RuntimeError):
    """The run cannot go on (disk full, non-finite loss, ...): exit status 1."""


class Stopped(Exception):
    """A signal stopped the run cleanly; exit status 128 + signum."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class CheckpointDir:
    """A run's checkpoint directory, checked and locked when the run starts.

    The lock is an flock on `.lock` (released by the kernel when the process dies, even by SIGKILL), holding the
    owner's pid and host for the error a second run gets. Temporary files of interrupted saves are removed.
    Saving writes the new checkpoint before deleting old ones, unless the disk is short of room for it.
    """

    def __init__(self, directory, keep=2):
        self.directory, self.keep = directory, keep
        kind = checkpoint.path_kind(directory)
        if kind not in (None, "directory"):  # /dev/null, a file: never written into or replaced
            raise UsageError(f"--checkpoint_dir={directory}: is a {kind}, not a directory")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--checkpoint_dir={directory}: cannot create it: {e.strerror or e}") from None
        if not os.path.isdir(directory):
            raise UsageError(f"--checkpoint_dir={directory}: not a directory")
        try:  # a read-only or full directory fails now, not at the first save
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-", suffix=".tmp") as f:
                f.write(b"x")
                f.flush()
        except OSError as e:
            raise UsageError(f"--checkpoint_dir={directory}: cannot write there: {e.strerror or e}") from None
        self._lock_fd = None
        self._lock()
        self.removed = self._remove_stale_temporaries()
        for path in self.checkpoints():  # a save would fail on (or replace) one of these only after training
            kind = checkpoint.path_kind(path) or "dangling symlink"
            if kind != "regular file":
                self.close()
                raise UsageError(
                    f"--checkpoint_dir={directory}: {os.path.basename(path)} is a {kind}, not a checkpoint file; "
                    "move it away"
                )

    def _lock(self):
        path = os.path.join(self.directory, LOCK_NAME)
        try:  # never through a symlink, and only a regular file: the owner's line is written into it
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            why = "is a symlink" if e.errno == errno.ELOOP else e.strerror
            raise UsageError(f"--checkpoint_dir={self.directory}: cannot lock {path}: {why}") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            kind = checkpoint.file_kind(mode)
            raise UsageError(f"--checkpoint_dir={self.directory}: cannot lock {path}: it is a {kind}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise UsageError(f"--checkpoint_dir={self.directory}: cannot lock {path}: {e.strerror}") from None
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise UsageError(
                f"--checkpoint_dir={self.directory} is in use by another run ({holder}); "
                "wait for it to finish or choose another directory"
            ) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, started {started}\n".encode(), 0)
        self._lock_fd = fd

    def close(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _remove_stale_temporaries(self):
        # Only this run writes here (it holds the lock), so every temporary file is a leftover of a killed save.
        removed = []
        for pattern in (".ckpt_*.tmp", ".probe-*.tmp"):
            for path in glob.glob(os.path.join(self.directory, pattern)):
                try:
                    os.remove(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
        return removed

    def checkpoints(self):
        return sorted(glob.glob(os.path.join(self.directory, CKPT_PATTERN)))

    def run_files(self):
        """Names of the entries a run writes (RUN_FILE_PATTERNS) found in the directory, sorted."""
        names = set()
        for pattern in RUN_FILE_PATTERNS:
            names.update(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(self.directory), pattern)))
        return sorted(names)

    def set_aside(self, names):
        """Moves these entries into a new <directory>/earlier-run-<time>/ (same file system: renames); returns it."""
        base = os.path.join(self.directory, EARLIER_PREFIX + time.strftime("%Y%m%d-%H%M%S"))
        target, n = base, 1
        while True:
            try:
                os.mkdir(target)
                break
            except FileExistsError:
                target, n = f"{base}-{n}", n + 1
        for name in names:
            os.rename(os.path.join(self.directory, name), os.path.join(target, name))
        return target

    def checkpoint_bytes(self):
        """Bytes the directory's checkpoints (and their shards) take: rotation can reclaim them."""
        total = 0
        for path in glob.glob(os.path.join(glob.escape(self.directory), "ckpt_*.bin*")):
            if not path.endswith(".damaged") and ".damaged." not in os.path.basename(path):
                try:
                    total += os.stat(path).st_size
                except OSError:
                    pass
        return total

    def _free_bytes(self):
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    def save(self, step, tensors, meta):
        """Writes ckpt_<step>.bin atomically and keeps the newest `keep`. When the free space is less than the
        new file needs, old checkpoints are deleted first (never the newest one)."""
        path = os.path.join(self.directory, f"ckpt_{step:08d}.bin")
        need = sum(checkpoint._align(np.asarray(v).nbytes) for v in tensors.values()) + (1 << 20)
        old = [p for p in self.checkpoints() if p != path]
        while len(old) > 1 and len(old) >= self.keep and self._free_bytes() < need:
            os.remove(old.pop(0))
        try:
            checkpoint.save(path, tensors, meta)
        except OSError as e:
            left = self.checkpoints()
            kept = f"; the newest intact checkpoint is {left[-1]}" if left else ""
            raise TrainError(f"cannot write checkpoint {path}: {e.strerror or e}{kept}") from None
        for stale in [p for p in self.checkpoints() if p != path][: -(self.keep - 1) or None]:
            os.remove(stale)
        return path

    def mark_damaged(self, path):
        """Moves a damaged checkpoint out of the way (kept for inspection; an earlier damaged one of the same
        name too); returns its new name."""
        target, n = path + ".damaged", 1
        while os.path.lexists(target):
            target, n = f"{path}.damaged.{n}", n + 1
        os.rename(path, target)
        return target


def read_checkpoint(path):
    """(tensors, meta) of an intact checkpoint; ValueError when it is damaged or its meta is malformed."""
    tensors, meta = checkpoint.load(path)
    try:
        ok = (
            isinstance(meta["step"], int)
            and meta["step"] >= 0
            and isinstance(meta["optimizer"]["step"], int)
            and isinstance(meta["optimizer"]["lr"], (int, float))
            and isinstance(meta["loader"], dict)
            and isinstance(meta["generator"], dict)
            and isinstance(meta.get("run", {}), dict)
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ValueError(
            f"{path}: checkpoint is corrupt: its meta lacks or mistypes step, optimizer, loader or generator"
        )
    return tensors, meta


class StopRequest:
    """SIGTERM and the first Ctrl-C ask the run to stop at the next micro-batch boundary (the step in progress is
    given up) and save the last completed step; a second Ctrl-C aborts at once (KeyboardInterrupt; a save in
    progress removes its temporary file)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum = None
        self._previous = {}

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signum = signum
        # os.write, not print: a handler that prints while the loop prints raises "reentrant call".
        name = signal.Signals(signum).name
        note = f"\n{name}: stopping after this micro-batch, at the last completed step (Ctrl-C again aborts)\n"
        os.write(2, note.encode())


# ---- output files -----------------------------------------------------------------------------------------------


def open_output(path, mode="a"):
    """Opens a file a run streams into (metrics, logs, records), text mode "a" or "w". A symlink is written
    through; a regular file or a character device (/dev/null, a terminal) is opened as asked; a FIFO only when
    its reader is there (opening it would block until one comes). A directory, block device or socket raises
    OSError: never written into."""
    kind = checkpoint.path_kind(path)
    if kind not in (None, "regular file", "character device", "FIFO (named pipe)"):
        code = errno.EISDIR if kind == "directory" else errno.EINVAL
        raise OSError(code, f"is a {kind}, not a file to write to")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fifo = kind == "FIFO (named pipe)"
    try:
        fd = os.open(path, flags | (os.O_NONBLOCK if fifo else 0), 0o644)
    except OSError as e:
        if fifo and e.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "is a FIFO (named pipe) with no reader; start its reader first") from None
        raise
    if fifo:  # opened: writes may block again (the reader sets the pace)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, mode)


# ---- metrics ----------------------------------------------------------------------------------------------------


def default_run_dir(model_name):
    """Where a run without --save or --metrics_file writes: $INFINITRAIN_RUNS_DIR or ./runs, one folder per run."""
    root = os.environ.get("INFINITRAIN_RUNS_DIR") or "runs"
    return os.path.join(root, f"{model_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


class MetricsLog:
    """A run's metrics as JSON lines: one `config` line when a run (or a resumed part of it) starts, one `step`
    line per optimizer step (train loss, validation loss when evaluated, learning rate, gradient norm,
    tokens/s, ms, memory), an `end` line. Opened and written at start, so a bad path fails before training.
    Appends: a resumed run continues its file, and readers take the newest line of each step."""

    def __init__(self, path, flag="--metrics_file", tensorboard_dir=""):
        self.path, self.flag = path, flag
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self.f = open_output(path, "a")
            if _ends_mid_line(path):  # a run killed while writing: its partial line must not swallow our first
                self.f.write("\n")
            self.f.flush()
        except OSError as e:
            raise UsageError(f"{flag}={path}: cannot open it: {e.strerror or e}") from None
        self.tb = None
        if tensorboard_dir:
            from infinitrain.runs.tensorboard import SummaryWriter

            try:
                self.tb = SummaryWriter(tensorboard_dir)
            except OSError as e:
                raise UsageError(f"--tensorboard_dir={tensorboard_dir}: {e.strerror or e}") from None

    def write(self, record):
        try:
            self.f.write(json.dumps(record, default=_json_value) + "\n")
            self.f.flush()
        except OSError as e:
            raise TrainError(f"{self.flag}={self.path}: cannot write: {e.strerror or e}") from None
        if self.tb is not None and record.get("kind") == "step":
            for key, tag in _TB_TAGS.items():
                if record.get(key) is not None:
                    self.tb.add_scalar(tag, float(record[key]), record["step"])

    def close(self):
        for f in (self.f, self.tb):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def _ends_mid_line(path):
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or not st.st_size:  # never opens a FIFO or device to read it
            return False
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


_TB_TAGS = {
    "train_loss": "loss/train",
    "val_loss": "loss/val",
    "lr": "lr",
    "grad_norm": "grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "ms": "perf/ms_per_step",
    "mem_peak_mib": "memory/peak_mib",
}


def _json_value(v):
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    return str(v)


def metrics_path(path):
    """A run directory's metrics file, or the file itself."""
    return os.path.join(path, METRICS_NAME) if os.path.isdir(path) else path


def _checked_config(path, n, rec):
    for key, kind in (("flags", dict), ("model_config", dict), ("devices", list)):
        if rec.get(key) is not None and not isinstance(rec[key], kind):
            raise ValueError(f"{path}:{n}: config's {key!r} should be a JSON {kind.__name__}, got {rec[key]!r:.60}")
    if not all(isinstance(d, str) for d in rec.get("devices") or []):
        raise ValueError(f"{path}:{n}: config's 'devices' should be a list of strings")
    return rec


def _checked_step(path, n, rec):
    """The step number of a step line whose step and numeric fields are what readers expect."""
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"{path}:{n}: a step line needs a non-negative integer 'step', got {step!r:.60}")
    for key, value in rec.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key not in ("kind", "step") and not (number or value is None):
            raise ValueError(f"{path}:{n}: step {step}'s {key!r} should be a number, got {value!r:.60}")
    return step


def read_metrics(path):
    """(config, steps) of a metrics file or run directory: the first config line, and step -> the newest step
    line (a resumed run re-does the steps after its checkpoint)."""
    path = metrics_path(path)
    config, steps = None, {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such metrics file (pass a run directory or its {METRICS_NAME})") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory without {METRICS_NAME}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                continue  # a run killed mid-write leaves a partial last line
            raise ValueError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
        if rec.get("kind") == "config" and config is None:
            config = _checked_config(path, n, rec)
        elif rec.get("kind") == "step":
            step = _checked_step(path, n, rec)
            steps[step] = rec
    if config is None:
        raise ValueError(f"{path}: not a metrics file (no config line)")
    return config, steps
