"""A control group per sandboxed kernel: a cap on its processes and on its memory, tmpfs included.

The sandbox (graders/isolation/sandbox.py) already puts each kernel in its own PID namespace, so
nothing it starts outlives it, and caps each process's address space (RLIMIT_AS). Two things those
cannot bound: how many processes the kernel starts (a fork bomb would fill the machine's PID table
until the notebook's clock runs out), and the memory its tmpfs folders hold (files in /tmp are page
cache, outside any address space). A control group bounds both, for the whole group at once:

    group = KernelGroup.create(pids_max=1024, memory_bytes=6 << 30)   # None if none can be made
    argv = group.join_argv(argv)     # a prefix that moves the started process into the group
    ...                              # every process the kernel starts is in the group
    group.remove()                   # kills what is left, removes the group's folders

Both cgroup versions are handled: v1 (a `pids` and a `memory` hierarchy, each mounted on its own)
and v2 (one unified hierarchy whose `pids` and `memory` controllers are enabled where the group
is made). A group is made under this process's own group, so a grader started inside a container
or a systemd scope stays within the limits it was given. Making one needs write access there:
root, or a delegated subtree. `probe()` says whether that works here; where it does not, the
sandbox still caps processes with RLIMIT_NPROC, which the kernel enforces per user namespace for
every user but root (graders/isolation/sandbox.py LAUNCHER).

A kernel never sees its group: the sandbox has no /sys and its own cgroup namespace, so it cannot
move itself out or raise a limit.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fa-sandbox-"  # group folders are PREFIX<grader pid>-<random>: stale ones are swept

# Runs before bwrap (python -I -S: stdlib only): writes its own PID into each group's
# cgroup.procs, then execs the real command, so every process bwrap starts is in the groups.
JOIN = """\
import os, sys
split = sys.argv.index("--")
for procs in sys.argv[1:split]:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
os.execv(sys.argv[split + 1], sys.argv[split + 1 :])
"""


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, options) of every cgroup file system, from /proc/self/mountinfo."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        found.append((point, tail[0], set(tail[2].split(",")) | set(fields[5].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's group path per v1 controller, and under key '' its v2 path."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


@dataclass
class _Place:
    """Where groups for one limit are made: a folder and the limit files written in it."""

    parent: Path
    version: int  # 1 or 2


def _v1_place(controller: str) -> _Place | None:
    own = _own_paths()
    for point, fstype, options in _mounts():
        if fstype == "cgroup" and controller in options and controller in own:
            parent = Path(point) / own[controller].lstrip("/")
            if parent.is_dir() and os.access(parent, os.W_OK):
                return _Place(parent, 1)
    return None


def _v2_place() -> _Place | None:
    own = _own_paths().get("")
    if own is None:
        return None
    for point, fstype, _ in _mounts():
        if fstype != "cgroup2":
            continue
        parent = Path(point) / own.lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            available = (parent / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if not {"pids", "memory"} <= set(available) or not os.access(parent, os.W_OK):
            continue
        for name in {"pids", "memory"} - set(enabled):
            try:  # refused while this group itself holds processes (the v2 "no internal
                # processes" rule), except at the root: then v2 is not usable from here
                (parent / "cgroup.subtree_control").write_text(f"+{name}")
            except OSError:
                break
        else:
            return _Place(parent, 2)
    return None


@functools.lru_cache(maxsize=1)
def places() -> dict[str, _Place]:
    """Where to make groups: {'pids': ..., 'memory': ...} (one v2 place serves both), or {}."""
    v2 = _v2_place()
    if v2 is not None:
        return {"pids": v2, "memory": v2}
    found = {}
    for controller in ("pids", "memory"):
        place = _v1_place(controller)
        if place is not None:
            found[controller] = place
    return found


def probe() -> str | None:
    """None when a group with a process cap can be made here, else why not."""
    if "pids" not in places():
        return (
            "no writable cgroup with the pids controller (needs root, or a delegated cgroup "
            "subtree: systemd-run --user --scope -p Delegate=yes)"
        )
    return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass
class KernelGroup:
    """One kernel's group(s): a folder per hierarchy (v1 has two, v2 one)."""

    folders: list[Path] = field(default_factory=list)
    pids_max: int = 0
    memory_bytes: int = 0

    @classmethod
    def create(cls, pids_max: int = 1024, memory_bytes: int = 0) -> KernelGroup | None:
        """A new group capping processes at `pids_max` and memory (RAM, tmpfs included) at
        `memory_bytes` (0: no memory cap). None when no group can be made here."""
        where = places()
        if "pids" not in where:
            return None
        sweep_stale()
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        group = cls(pids_max=pids_max, memory_bytes=memory_bytes)
        made: dict[int, Path] = {}
        for controller in ("pids", "memory"):
            place = where.get(controller)
            if place is None:
                continue
            folder = place.parent / name
            if id(place) not in made:
                try:
                    folder.mkdir()
                except OSError:
                    group.remove()
                    return None
                made[id(place)] = folder
                group.folders.append(folder)
            ok = True
            if controller == "pids":
                ok = _write(folder / "pids.max", str(int(pids_max)))
            elif memory_bytes:
                if place.version == 2:
                    ok = _write(folder / "memory.max", str(int(memory_bytes)))
                    _write(folder / "memory.swap.max", "0")
                else:
                    ok = _write(folder / "memory.limit_in_bytes", str(int(memory_bytes)))
                    _write(folder / "memory.memsw.limit_in_bytes", str(int(memory_bytes)))
            if not ok and controller == "pids":
                group.remove()
                return None
        return group

    def join_argv(self, argv: list[str], python: str | None = None) -> list[str]:
        """`argv` prefixed by a tiny launcher that joins the group, then execs argv."""
        procs = [str(folder / "cgroup.procs") for folder in self.folders]
        return [python or sys.executable, "-I", "-S", "-c", JOIN, *procs, "--", *argv]

    def pids(self) -> set[int]:
        """Host PIDs of the processes in the group now."""
        found: set[int] = set()
        for folder in self.folders:
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def remove(self, wait: float = 15.0) -> None:
        """Kill every process still in the group, then remove its folders."""
        for folder in self.folders:
            _write(folder / "cgroup.kill", "1")  # v2: the kernel kills the whole group at once
        end = time.monotonic() + wait
        while True:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for folder in list(self.folders):
                try:
                    folder.rmdir()
                    self.folders.remove(folder)
                except FileNotFoundError:
                    self.folders.remove(folder)
                except OSError:
                    pass
            if not self.folders or time.monotonic() > end:
                return
            time.sleep(0.05)


def sweep_stale() -> list[Path]:
    """Remove groups left by graders that were killed (their PID, in the name, is gone)."""
    removed = []
    for place in {id(p): p for p in places().values()}.values():
        for folder in place.parent.glob(f"{PREFIX}*-*"):
            pid = folder.name[len(PREFIX) :].split("-")[0]
            if not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # its grader is alive
            except ProcessLookupError:
                pass
            except OSError:
                continue
            KernelGroup(folders=[folder]).remove(wait=1.0)
            removed.append(folder)
    return removed
