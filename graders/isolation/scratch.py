"""The grader's host-side scratch, which outlives no grader.

A grader that is killed (the worker's wall clock, a dask worker lost with its node, an instructor's
Ctrl-C twice) runs none of its clean-up, and its scratch holds a student's notebook, its graded copy
and its feedback. So every scratch folder or file is named by the PID of the process that made it,
`<prefix><pid>-<random>`, and making one first removes those of the same prefix, in the same
folder, whose process is gone (and that belong to this user).

    make_dir("fa-grading-task-")         -> /tmp/fa-grading-task-4242-k3j9x0
    make_file("fa-grading-log-", ".txt") -> /tmp/fa-grading-log-4242-a8c1qe.txt

Scratch that holds Unix sockets (a sandboxed kernel's, multiprocessing's server's) needs a short
path: a socket's path has at most SOCKET_PATH_MAX bytes, and a cluster job's TMPDIR can leave too
little of that; `socket_parent` picks a temp folder that leaves enough.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # running, someone else's
        return True
    return True


def sweep(prefix: str, parent: str | Path | None = None) -> list[Path]:
    """Remove the `prefix<pid>-*` folders and files in `parent` (default: the temp folder) whose
    process is no longer running and that belong to this user. Returns what was removed."""
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-")[0]
        try:
            owner = path.lstat().st_uid
        except OSError:  # removed meanwhile
            continue
        if not pid.isdigit() or owner != os.getuid() or _alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def make_dir(prefix: str, parent: str | Path | None = None) -> Path:
    """A new folder `prefix<pid>-<random>` in `parent` (default: the temp folder), mode 0700,
    after the stale ones of `prefix` there are swept. The caller removes it when done."""
    sweep(prefix, parent)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def make_file(prefix: str, suffix: str = "", parent: str | Path | None = None) -> Path:
    """A new empty file `prefix<pid>-<random><suffix>`, mode 0600, as make_dir makes folders."""
    sweep(prefix, parent)
    fd, path = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}-", suffix=suffix, dir=parent)
    os.close(fd)
    return Path(path)


SOCKET_PATH_MAX = 107  # a Unix socket's sun_path: 108 bytes with its NUL
FALLBACK_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")


def leaves_room(path: str | Path, tail: int) -> bool:
    """Whether a socket `tail` bytes below `path` (a folder) fits a Unix socket's path."""
    return len(os.fsencode(str(path))) + tail <= SOCKET_PATH_MAX


def socket_parent(tail: int) -> Path:
    """The temp folder ($TMPDIR) if it leaves room for sockets `tail` bytes below it; else the
    first of FALLBACK_PARENTS that does and is writable. ValueError, naming TMPDIR, if none."""
    candidates = (Path(tempfile.gettempdir()).resolve(), *map(Path, FALLBACK_PARENTS))
    for path in candidates:
        if leaves_room(path, tail) and path.is_dir() and os.access(path, os.W_OK | os.X_OK):
            return path
    raise ValueError(
        f"the temp folder {tempfile.gettempdir()!r} leaves no room for the grader's sockets "
        f"(at most {SOCKET_PATH_MAX - tail} bytes of folder) and none of "
        f"{', '.join(FALLBACK_PARENTS)} is writable: set TMPDIR to a shorter folder"
    )
