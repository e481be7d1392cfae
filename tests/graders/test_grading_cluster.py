"""`python -m graders grade --scheduler` on a real dask.distributed cluster on loopback.

A `dask scheduler` and two `dask worker` processes are started as an instructor would start them
(separate programs, each in its own process group). A real client process grades a small class
through the scheduler; while it grades, one worker is killed with everything it started (SIGKILL
to its whole process group: the nanny, the worker and the grading subprocess). Every submission
must still be graded exactly once, with the score its answer earns (fixtures.bank), and the
killed worker's scratch must be gone from the node's temp folder when the class is graded.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import bank

from graders.run import pipeline

ASSIGNMENT = "01_online_softmax"  # the fastest notebook
STUDENTS = 4

pytestmark = [
    pytest.mark.notebooks,
    pytest.mark.skipif(ASSIGNMENT not in pipeline.assignments(), reason="notebook 01 missing"),
]


def _sandbox() -> bool:
    from graders.isolation import sandbox

    return sandbox.probe() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _class(root: Path, students: int = STUDENTS) -> Path:
    kinds = bank.core(ASSIGNMENT)  # full, untouched, partial, a named mistake
    for i in range(students):
        e = kinds[i % len(kinds)]
        bank.write([bank.Entry(f"s{i}", e.notebook, e.failing, save=e.save)], root, ASSIGNMENT)
    return root / "submitted"


def _expected(students: int = STUDENTS) -> dict[str, tuple[str, float]]:
    """Each student's status and score in grades.csv: what their answer earns."""
    kinds = bank.core(ASSIGNMENT)
    picked = {f"s{i}": kinds[i % len(kinds)] for i in range(students)}
    return {s: (e.status, bank.expected_score(ASSIGNMENT, e)) for s, e in picked.items()}


def _scores(out: Path) -> dict[str, tuple[str, float]]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {r["student"]: (r["status"], float(r[ASSIGNMENT])) for r in rows}


def _start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=pipeline.REPO,
        start_new_session=True,  # its own process group: killed whole below
    )


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _wait_for(cond, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_worker_costs_nothing(tmp_path):
    submitted = _class(tmp_path / "class")
    sandbox = _sandbox()

    bindir = Path(sys.executable).parent
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scratch = tmp_path / "tmp"  # the node's temp folder, shared by its two workers
    scratch.mkdir()
    env = {
        **os.environ,
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
        "TMPDIR": str(scratch),
    }
    procs = [
        _start(
            [str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--no-dashboard"],
            tmp_path / "scheduler.log", env,
        )
    ]  # fmt: skip
    try:
        for name in ("w1", "w2"):
            procs.append(
                _start(
                    [str(bindir / "dask"), "worker", address, "--nworkers", "1", "--nthreads",
                     "1", "--name", name, "--no-dashboard", "--memory-limit", "0"],
                    tmp_path / f"{name}.log", env,
                )
            )  # fmt: skip
        from distributed import Client

        _wait_for(lambda: _worker_count(Client, address) == 2, 120, "two workers")
        out = tmp_path / "cluster"
        cmd = [sys.executable, "-m", "graders", "grade", str(submitted), "--out", str(out),
               "--scheduler", address, "--timeout", "30"]  # fmt: skip
        if not sandbox:
            cmd.append("--unsafe-no-sandbox")
        client = subprocess.Popen(
            cmd, cwd=pipeline.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # kill worker w2 (nanny, worker, its grading subprocess and sandbox) once a first result
        # is in and w2 holds a task
        results = out / "results"
        _wait_for(lambda: any(results.rglob("*.json")), 600, "a first result")
        _wait_for(lambda: _busy(Client, address, "w2"), 300, "w2 grading a notebook")
        _kill(procs[2])
        said, _ = client.communicate(timeout=900)
        assert client.returncode == 0, said
    finally:
        for p in reversed(procs):
            _kill(p)

    files = sorted(results.rglob("*.json"))
    assert len(files) == STUDENTS, files  # each submission once, none lost
    graded = [json.loads(f.read_text()) for f in files]
    assert {(r["student"], r["assignment"]) for r in graded} == {
        (f"s{i}", ASSIGNMENT) for i in range(STUDENTS)
    }
    assert _scores(out) == _expected(), said  # what each answer earns (fixtures.bank)
    for i in range(STUDENTS):  # every submission has its feedback, written by the client
        assert (out / "feedback" / f"s{i}" / f"{ASSIGNMENT}.html").is_file()
    assert not (out / ".work").exists()
    # the killed worker's scratch (the student's notebook, its graded copy, the grader's log)
    # was removed by the worker that took its task over. (This folder's path under pytest is
    # too long for a kernel's sockets: the sandboxes' folders went to a shorter temp folder.)
    left = sorted(p.name for p in scratch.iterdir() if p.name.startswith("fa-"))
    assert not left, left


def _busy(Client, address: str, name: str) -> bool:
    """Whether the worker called `name` is running a grading task now."""
    with Client(address, timeout="5s") as c:
        workers = c.scheduler_info().get("workers", {})
        mine = [a for a, w in workers.items() if w.get("name") == name]
        return bool(mine) and any(c.processing(workers=mine).values())


def _worker_count(Client, address: str) -> int:
    try:
        with Client(address, timeout="5s") as c:
            return len(c.scheduler_info().get("workers", {}))
    except OSError:
        return 0


def test_a_temp_folder_too_long_for_sockets_still_grades(tmp_path):
    """A cluster job's TMPDIR can be longer than a Unix socket's path allows (107 bytes). A local
    run forks its grading processes from a server that listens on such a socket, and each
    sandboxed kernel talks over them: both go to a shorter temp folder, and every student gets
    what the answer earns (before: "AF_UNIX path too long", or ZMQError "File name too long" for
    every notebook). In a program of its own, so that its temp folder is the long one."""
    from graders.isolation import sandbox
    from graders.isolation.scratch import leaves_room
    from graders.run.worker import MP_SOCKET_TAIL

    long_tmp = tmp_path / ("job-" + "7" * 70) / "tmp"
    long_tmp.mkdir(parents=True)
    assert not leaves_room(long_tmp, MP_SOCKET_TAIL)  # no room for either kind of socket
    assert not leaves_room(long_tmp, sandbox.SCRATCH_TAIL)
    # two students: the run's two grading processes, each with its sandbox's sockets, at once
    # (the four of the cluster's class graded the same way, 7 core-s more, 2026-12-07)
    submitted = _class(tmp_path / "class", students=2)
    out = tmp_path / "graded"
    cmd = [sys.executable, "-m", "graders", "grade", str(submitted), "--out", str(out),
           "--jobs", "2", "--timeout", "30",
           *([] if _sandbox() else ["--unsafe-no-sandbox"])]  # fmt: skip
    got = subprocess.run(
        cmd, cwd=pipeline.REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "TMPDIR": str(long_tmp)},
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert _scores(out) == _expected(students=2), got.stdout[-3000:]


def test_no_scheduler_at_that_address_is_one_clear_line(tmp_path):
    submitted = _class(tmp_path / "class")
    port = _free_port()  # nothing listens there
    got = subprocess.run(
        [sys.executable, "-m", "graders", "grade", str(submitted), "--out", str(tmp_path / "o"),
         "--scheduler", f"tcp://127.0.0.1:{port}", "--unsafe-no-sandbox"],
        cwd=pipeline.REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 2, got.stdout + got.stderr
    assert "error:" in got.stderr and f"127.0.0.1:{port}" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr


def test_the_local_cluster_does_not_profile_the_graders_cores():
    """Its workers are threads of the client on the grading cores: no statistical profiler, a
    slow system monitor, and the retry budget of graders.run.cluster."""
    import dask
    from distributed import Client

    from graders.run import cluster

    before = dask.config.get("distributed.worker.profile.enabled")
    local = cluster._local_cluster(1)
    try:
        with Client(local) as client:
            worker = next(iter(local.workers.values()))
            assert "profile" not in worker.periodic_callbacks  # no sampling every 10 ms
            assert worker.periodic_callbacks["monitor"].callback_time >= 5000  # ms: psutil rarely
            assert not worker.monitor.monitor_disk_io
            assert local.scheduler.allowed_failures == cluster.ALLOWED_FAILURES
            assert client.submit(sum, [1, 2]).result() == 3
        # the caller's own dask configuration is left as it was
        assert dask.config.get("distributed.worker.profile.enabled") == before
    finally:
        local.close()
