"""Grading on dask.distributed: one task per submitted notebook, on this machine or a cluster.

    for result, feedback_html in run(tasks, scheduler=None, workers=2, progress=True): ...

Each task is `grade_task(job)`: it runs on a dask worker, grades one notebook there in a process of
its own (nbgrader, the sandboxed kernel; forked from a server that imported them once, or `python
-m graders.run.worker` in a daemonic worker; see graders/run/worker.py) inside a scratch folder
local to the worker, and returns the result, the feedback page and the autograded notebook
(result["autograded_notebook"], for the instructor's gradebook: graders/outputs/gradebook.py) to
the client. Nothing a worker does writes into the output folder: the client alone writes grades,
feedback, the report, the gradebook and the cache (graders/grade.py), so a worker needs no view
of it, and a student's code, run on the worker inside the sandbox, cannot reach it either.

Where the work runs:
    scheduler=None       an in-process LocalCluster of `workers` workers, one thread each (the
                         `--jobs` of the command), started and closed by `run`; each task's
                         grading runs in a process of its own anyway
    scheduler="tcp://.." an existing cluster (`dask scheduler` + `dask worker`, dask-jobqueue on
                         SLURM, dask-kubernetes): every worker must have the course's environment
                         and the same release (solutions/ and notebooks/) as the client; a worker
                         whose release differs refuses the task and says so

Each notebook's grading process and kernel get their share of the cores for torch's, OpenBLAS's and
MKL's threads (graders/run/threads.py): this machine's cores over `workers` for a local
cluster, a node's cores over the threads of its workers on a cluster (in a container with a CPU
limit below its node's cores, set OMP_NUM_THREADS for the workers instead).

Nothing lost: a worker that dies mid-task (killed, out of memory) has its task run again on
another worker by the scheduler; a task whose worker dies a second time (the scheduler's
`distributed.scheduler.allowed-failures`, set to 1 for the LocalCluster; set
DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=1 where your scheduler starts) is reported as a
grader error for that submission alone. A task that raises is retried once. Results reach the
caller as they finish, so an interrupted run keeps what was graded (the cache in results/).
"""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from graders.isolation import scratch as host_scratch
from graders.run import pipeline
from graders.run.template import cached_template, release_hash
from graders.run.threads import thread_share

ALLOWED_FAILURES = 1  # a task may lose its worker once; the second loss is reported


# ---------------------------------------------------------------- on the worker

_templates: dict[tuple, Path] = {}
_template_lock = threading.Lock()


def _template_for(job: dict) -> Path:
    """The course directory to grade in: the client's, where this worker sees it with the same
    release stamp (a LocalCluster), else this node's cached one (cached_template)."""
    given = Path(job["template"])
    stamp = given / ".release"
    if stamp.is_file() and stamp.read_text() == job["release"]:
        return given
    key = (job["release"], tuple(job["assignments"]))
    with _template_lock:
        if key in _templates and _templates[key].is_dir():
            return _templates[key]
        mine = release_hash()
        if mine != job["release"]:
            raise RuntimeError(
                f"this worker's course release ({pipeline.REPO}, {mine[:12]}) differs from the "
                f"client's ({job['release'][:12]}): install the same release on every node"
            )
        template, _, _ = cached_template(list(job["assignments"]), job["release"])
        _templates[key] = template
        return template


def grade_task(job: dict) -> dict:
    """Grade one submission on this worker; returns {"result": ..., "feedback": html or None}.

    job: the fields of graders/run/worker.py's job, plus "notebook" (the file's bytes, base64),
    "release" (release_hash) and "assignments" (those the template holds). The notebook is
    graded from a copy in a scratch folder of this worker, removed afterwards.
    """
    from graders.run.worker import run_worker

    stage = host_scratch.make_dir("fa-grading-task-")  # swept after a killed worker too
    try:
        template = _template_for(job)
        name = Path(job["source"]).name
        (stage / "in").mkdir()
        path = stage / "in" / name
        path.write_bytes(base64.b64decode(job["notebook"]))
        local = {k: v for k, v in job.items() if k not in ("notebook", "release", "assignments")}
        local.update(path=str(path), out=str(stage / "out"), template=str(template))
        local["hidden"] = [*job.get("hidden", []), str(stage)]
        local["threads"] = job.get("threads") or _share_of_this_worker()
        result = run_worker(local, job["wall"])
        result["source"] = job["source"]
        feedback = None
        if result.get("feedback"):
            page = stage / "out" / result["feedback"]
            if page.is_file():
                feedback = page.read_text(encoding="utf-8", errors="replace")
        graded = stage / "out" / result.pop("autograded", "")
        if result.get("status") != "grader-error" and graded.is_file():  # the client files it
            result["autograded_notebook"] = graded.read_text(encoding="utf-8", errors="replace")
        return {"result": result, "feedback": feedback}
    finally:
        shutil.rmtree(stage, ignore_errors=True)


_node_share: dict[str, int] = {}  # per worker (its address): its share, asked once
_node_lock = threading.Lock()


def _share_of_this_worker() -> int:
    """On a cluster's worker: this node's cores over the notebooks its workers grade at once (the
    threads of every worker on this host, as the scheduler lists them: a SLURM job of 16
    single-thread worker processes grades 16 at once). One notebook at a time outside a worker."""
    from distributed import get_worker

    try:
        me = get_worker()
    except ValueError:  # called outside a worker
        return thread_share(1)
    with _node_lock:
        if me.address not in _node_share:
            try:
                workers = me.client.scheduler_info(n_workers=-1)["workers"].values()
                here = sum(w["nthreads"] for w in workers if w["host"] == me.ip)
            except Exception:  # noqa: BLE001 - an older scheduler: this worker's threads alone
                here = 0
            _node_share[me.address] = thread_share(max(here, me.state.nthreads))
        return _node_share[me.address]


# ---------------------------------------------------------------- on the client


# The local cluster's workers are threads of the client, on the cores that grade: dask's
# statistical profiler (a sample of every thread each 10 ms, per worker), its system monitor
# (psutil twice a second, disk counters included) and its 20 ms event-loop tick took CPU from the
# grading processes. Profiled with py-spy on 2 cores (3 students, 21 notebooks), they were the
# client's largest cost after the template; turned off, its CPU fell from 27.2 to 11.2 s for the
# same run. A remote cluster keeps its own settings (and its dashboard's profile page).
LOCAL_QUIET = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.system-monitor.disk": False,
    "distributed.admin.system-monitor.gil.enabled": False,
    "distributed.admin.tick.interval": "500ms",
}


def _local_cluster(workers: int):
    import dask
    from distributed import LocalCluster

    # workers as threads of this process: each task already runs in a grading process of its
    # own (graders/run/worker.py), so worker processes would only add their start (measured on 2
    # cores: 15 to 35 s more for one student's notebooks); a real cluster's workers are processes.
    # The settings are read while the scheduler and workers start: set for that only, so that
    # the caller's own dask (an instructor's notebook) keeps its configuration.
    with dask.config.set(
        {"distributed.scheduler.allowed-failures": ALLOWED_FAILURES, **LOCAL_QUIET}
    ):
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=False,
            memory_limit=0,  # each notebook's grader caps its own memory (graders/run/worker.py)
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        )


def _failed(job: dict, why: str) -> dict:
    return {
        "student": job["student"],
        "assignment": job["assignment"],
        "source": job["source"],
        "sha256": job["sha256"],
        "status": "grader-error",
        "score": 0.0,
        "max_score": job["max_score"],
        "cells": {},
        "problems": [why],
        "seconds": 0.0,
    }


def _why(exc: BaseException) -> str:
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        return (
            "the grader's worker died twice while grading this notebook (killed, or out of "
            "memory outside the sandbox); graded by no one"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"the grader itself failed twice: {type(exc).__name__}: {first}"[:400]


def _scheduler_answers(address: str, seconds: float = 5.0) -> None:
    """Raise OSError naming `address` when nothing accepts a TCP connection there for `seconds`
    (a scheduler still starting gets that long). dask's Client would retry for 30 s before
    saying so; a mistyped address is one clear line in 5. Other schemes are left to dask."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "tcp") or not host or not port.isdigit():
        return
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                why = exc.strerror or type(exc).__name__
                raise OSError(f"no dask scheduler answers at {address} ({why})") from None
            time.sleep(0.25)


def run(
    jobs: list[dict],
    *,
    scheduler: str | None = None,
    workers: int = 1,
    progress: bool = True,
    say=print,
) -> Iterator[tuple[dict, str | None]]:
    """Grade every job on dask; yield (result, feedback html) as each one finishes."""
    if not jobs:  # before importing dask (a second or so): a run with nothing new starts nothing
        return
    if scheduler is None:  # the local workers fork from this process's server: its imports
        from graders.run.worker import start_server  # overlap dask's and the cluster's start

        start_server(jobs[0].get("preload", ()))
        for job in jobs:  # `workers` notebooks at once on this machine's cores
            job.setdefault("threads", thread_share(workers))
    from distributed import Client, as_completed
    from tqdm.auto import tqdm

    cluster = None
    if scheduler is None:
        cluster = _local_cluster(workers)
        client = Client(cluster)
        where = f"a local cluster of {workers} worker{'s' if workers > 1 else ''}"
    else:
        _scheduler_answers(scheduler)
        client = Client(scheduler, timeout="30s")
        n = len(client.scheduler_info().get("workers", {}))
        where = f"the cluster at {scheduler} ({n} worker{'s' if n != 1 else ''} now)"
    try:
        link = dashboard_link(client, cluster) if _has_dashboard() else None
        if progress:
            say(
                f"grading {len(jobs)} notebooks on {where}"
                + (f"; dashboard: {link}" if link else "")
            )
        futures = {}
        for job in jobs:
            fut = client.submit(
                grade_task,
                job,
                key=f"grade-{job['student']}-{job['assignment']}-{job['sha256'][:12]}",
                retries=1,
                pure=False,
            )
            futures[fut] = job
        bar = tqdm(total=len(jobs), desc="grading", unit="notebook", disable=not progress)
        try:
            for fut in as_completed(futures):
                job = futures[fut]
                try:
                    got = fut.result()
                    result, feedback = got["result"], got["feedback"]
                except Exception as exc:  # noqa: BLE001 - reported for this submission only
                    result, feedback = _failed(job, _why(exc)), None
                bar.set_postfix_str(
                    f"{result['student']}/{result['assignment']}: {result['status']}"
                )
                bar.update()
                yield result, feedback
        finally:
            bar.close()
            for fut in futures:
                fut.cancel()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def dashboard_link(client, cluster=None) -> str | None:
    """The dashboard's address as it really listens. A local cluster's dashboard listens on
    127.0.0.1 only (see _local_cluster), while dask's own link names the machine's network
    address, which does not open; a remote scheduler's link is dask's."""
    if cluster is None:
        return client.dashboard_link
    from distributed.utils import format_dashboard_link

    port = client.scheduler_info().get("services", {}).get("dashboard")
    if not port:
        return None
    options = getattr(cluster, "scheduler_spec", {}).get("options", {})
    host = str(options.get("dashboard_address") or "127.0.0.1:0").rpartition(":")[0]
    return format_dashboard_link(host or "127.0.0.1", port)


def _has_dashboard() -> bool:
    try:
        import bokeh  # noqa: F401  (the dashboard needs it)

        return True
    except ImportError:
        return False


def encode_notebook(path: Path) -> str:
    """A notebook file's bytes as text, to travel inside a task to a worker on another node."""
    return base64.b64encode(Path(path).read_bytes()).decode("ascii")
