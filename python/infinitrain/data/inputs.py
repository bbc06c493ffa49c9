"""Input paths checked before anything opens them. Opening a FIFO for reading blocks until a writer comes, a
device reads as endless (/dev/zero, /dev/urandom) or empty data, and a directory is not a file: each is refused
with a message naming the path and what it is. Symlinks are followed."""

from __future__ import annotations

import errno
import os
import stat

from ..checkpoint import file_kind


def check_input(path: str | os.PathLike, expect: str = "file", what: str = "a regular file") -> None:
    """Raises unless `path` is what `expect` says and readable: "file" (a regular file), "dir" (a directory) or
    "file or dir". FileNotFoundError when nothing is there (a dangling symlink included), PermissionError when it
    cannot be read, ValueError for the wrong kind; `what` names the file expected in that message."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    is_dir, is_file = stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode)
    if is_dir and "dir" not in expect:
        raise ValueError(f"{path}: is a directory, not {what}")
    if not is_dir and not (is_file and "file" in expect):
        raise ValueError(f"{path}: is a {file_kind(st.st_mode)}, not {what}")
    if not os.access(path, os.R_OK | (os.X_OK if is_dir else 0)):
        raise PermissionError(errno.EACCES, "Permission denied", path)
