"""Grade one submission in a scratch course directory, in a process of its own.

    python -m graders.run.worker '{"student": ..., "assignment": ..., "path": ..., "template": ...,
                               "out": ..., "timeout": ..., "memory_gb": ..., "sandbox": true,
                               "threads": ...}'

Each submission gets its own copy of the course directory and gradebook, so a submission that
crashes, hangs or fills memory cannot touch another one. With "sandbox" (the default) the
notebook's kernel runs in graders.isolation.sandbox's bubblewrap sandbox; this process, which runs
nbgrader and writes the gradebook, stays outside it. "threads" holds it and its kernel to that many
threads of torch, OpenBLAS and MKL (graders/run/threads.py: the machine's cores over the notebooks
graded on it at once). The result is written as JSON to <out>/results/<student>/<assignment>.json
and printed; the autograded notebook is kept as <out>/autograded/<student>/<assignment>.ipynb
(result["autograded"]).

    result = run_worker(job, wall_seconds)   grade_one in a process of its own, forked from
                                            a server that imported nbgrader and the checks
                                            once (graders/run/preload.py), stopped after
                                            wall_seconds (what each dask task of
                                            graders/run/cluster.py calls)
    start_server(preload)                   start that server in the background (a local
                                            cluster's client, before its cluster starts)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from graders.isolation import scratch as host_scratch
from graders.run import pipeline
from graders.run.threads import share_cores

if __name__ == "__main__":  # the grading process: before .submissions imports nbformat (below)
    pipeline.skip_iri_grammar()

from graders.intake.submissions import (  # noqa: E402
    cause_line,
    find_tampering,
    is_untouched,
    read_submission,
    source_text,
    truncate_outputs,
)

# nbgrader (through .execute) and course_utils are imported where they are used: the grader's
# client imports this module for result_path and sha256 alone, and must start fast (grade.py);
# .submissions (and nbformat) it imports anyway

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def result_path(out: Path, student: str, assignment: str) -> Path:
    return Path(out) / "results" / student / f"{assignment}.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_worker(job: dict, wall_seconds: float) -> dict:
    """Grade one notebook in a process of its own, stopped after `wall_seconds`; its result is
    read from job["out"]/results. Never raises for a problem of the submission.

    The process is forked from a multiprocessing forkserver that imported what grading needs
    once (graders/run/preload.py): it starts with nbgrader and the checks loaded, instead of
    importing them for every submission, and has run nothing before (see preload's doc). It
    gets this process's environment as it is now.

    A grading process that ends without a result (it crashed: grade_one itself never fails for
    a problem of the submission, whose code runs in a kernel of its own) is the tooling's
    failure, not the student's: the notebook is graded once more, and the result names the first
    failure; a second one is the result's `grader-error`. A process stopped at `wall_seconds` is
    not run again (each cell has its own time limit, so only a stuck grader gets there, and it
    would only get stuck again)."""
    first, crashed = _attempt(job, wall_seconds)
    if not crashed:
        return first
    again, _ = _attempt(job, wall_seconds)
    if again["status"] != "grader-error":
        why = first["problems"][0].removeprefix("the grader itself failed: ")
        again["problems"] = [
            f"graded a second time: the grader's first try failed ({why.splitlines()[-1]})",
            *again.get("problems", []),
        ]
    return again


def _attempt(job: dict, wall_seconds: float) -> tuple[dict, bool]:
    """One grading process for `job`: its result, or a grader-error naming why there is none;
    and whether it crashed (ended without a result, not stopped at `wall_seconds`)."""
    base = {
        "student": job["student"],
        "assignment": job["assignment"],
        "source": job.get("source", job["path"]),
        "sha256": sha256(job["path"]),
        "score": 0.0,
        "max_score": job["max_score"],
        "cells": {},
        "seconds": wall_seconds,
    }
    log = str(host_scratch.make_file("fa-grading-log-", ".txt"))
    try:
        code = _run_graded_process(job, log, wall_seconds)
        if code is None:
            stopped = f"grading took longer than {wall_seconds:.0f} s and was stopped"
            return {**base, "status": "grader-error", "problems": [stopped]}, False
        path = result_path(Path(job["out"]), job["student"], job["assignment"])
        if code == 0 and path.exists():
            return json.loads(path.read_text()), False
        printed = Path(log).read_text(errors="replace").strip()
        tail = "\n".join(printed.splitlines()[-3:]) or f"exit code {code}"
        failed = f"the grader itself failed: {tail}"
        return {**base, "status": "grader-error", "problems": [failed]}, True
    finally:
        Path(log).unlink(missing_ok=True)


def _run_graded_process(job: dict, log: str, wall_seconds: float) -> int | None:
    """Grade `job` in a process of its own, its output into `log`: its exit code, or None when
    it ran past `wall_seconds` and was killed (its sandbox ends with it: --die-with-parent).

    Forked from the preloaded server where this process may have children of multiprocessing's
    and the platform has a forkserver; elsewhere (a dask worker under a nanny is a daemon
    process, which may not; Windows has no fork) `python -m graders.run.worker JOB`, which
    imports everything itself."""
    if _uses_server():
        proc = _forkserver(tuple(job.get("preload", ()))).Process(
            target=_forked,
            args=(json.dumps(job), log, dict(os.environ), str(pipeline.REPO)),
            name=f"grade {job['student']}/{job['assignment']}",
        )
        proc.start()
        proc.join(wall_seconds)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            return None
        return proc.exitcode
    with open(log, "ab") as out:
        cmd = [sys.executable, "-m", "graders.run.worker", json.dumps(job)]
        child = subprocess.Popen(cmd, cwd=pipeline.REPO, stdout=out, stderr=out)
        try:
            return child.wait(wall_seconds)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return None


_server_lock = threading.Lock()

TORCH_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch\b", re.MULTILINE)


def preload_for(template: Path, assignments: list[str]) -> list[str]:
    """What the server imports beyond graders/run/preload.py for a run of these assignments:
    torch where a released notebook imports it (the checks of those notebooks then import it in
    every graded process, 1.6 s each; a notebook of 06 or 09 graded about 2 s faster with it
    preloaded), nothing for a run of numpy notebooks alone. torch only: it initialises CUDA
    lazily, at first use, so a process forked after `import torch` can still use a GPU. The client
    computes it once for the whole run (job["preload"]): the first job to start the server
    decides for every later one."""
    for a in assignments:
        released = Path(template) / "notebooks" / a / f"{a}.ipynb"
        try:
            cells = json.loads(released.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            continue
        code = (source_text(c.get("source")) for c in cells if c.get("cell_type") == "code")
        if any(TORCH_IMPORT.search(src) for src in code):
            return ["torch"]
    return []


def _forkserver(extra: tuple[str, ...] = ()):
    """The multiprocessing context whose server preloads graders/run/preload.py and `extra`
    (started by the first Process of this process, once: the first job's list holds)."""
    import multiprocessing

    with _server_lock:
        _short_multiprocessing_temp()
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["graders.run.preload", *extra])
        return ctx


# The server listens on <multiprocessing's temp folder, pymp-*>/listener-*, a Unix socket.
MP_SOCKET_TAIL = len("/pymp-abcdefgh/listener-abcdefgh")


def _short_multiprocessing_temp() -> None:
    """Make multiprocessing's temp folder (made once a process, on first use, in tempfile's) in a
    folder short enough for its server's socket, where TMPDIR is too long for it (a cluster
    job's can be; Python before 3.13 would fail to start the server: "AF_UNIX path too long").
    Nothing where TMPDIR is short enough or the folder was made already."""
    import tempfile
    from multiprocessing import util

    parent = host_scratch.socket_parent(MP_SOCKET_TAIL)
    if parent == Path(tempfile.gettempdir()).resolve():
        return
    saved, tempfile.tempdir = tempfile.tempdir, str(parent)
    try:
        util.get_temp_dir()  # made now, under parent, and kept for this process
    finally:
        tempfile.tempdir = saved


def _uses_server() -> bool:
    """Whether this process forks its grading processes from the preloaded server: it may have
    children of multiprocessing's (a daemonic dask worker may not) and the platform has a
    forkserver (Windows has none)."""
    import multiprocessing

    forks = "forkserver" in multiprocessing.get_all_start_methods()
    return forks and not multiprocessing.current_process().daemon


def start_server(preload: list[str] | tuple[str, ...] = ()) -> None:
    """Start the grading processes' server now, in the background, where this process will fork
    its grading processes from it (a local cluster: its workers are threads of this process).
    Its imports (graders/run/preload.py and `preload`: 5.0 s of CPU, 9.0 s with torch, on an idle
    core of a 2-core machine, 2026-12-06) then run while the client starts its cluster, instead
    of after, when the first job asks for the server. Nothing where no server is used."""
    from multiprocessing import forkserver

    if _uses_server():
        _forkserver(tuple(preload))
        forkserver.ensure_running()  # spawns the server and returns; it imports meanwhile


def _forked(job_text: str, log: str, env: dict, cwd: str) -> None:
    """The graded process's body (forked from the server): what `python -m graders.run.worker
    JOB` does, its output into `log` for the caller to quote."""
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    _main(json.loads(job_text))


def _cell_reports(nb) -> dict[str, dict]:
    """Per graded cell: the error it raised (first line) and the misconception it names."""
    from course_utils.checks.engine.failures import misconception_slug

    reports = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        text = ""
        if errors:
            err = errors[0]
            text = ANSI.sub("", f"{err.get('ename', '')}: {err.get('evalue', '')}")
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        reports[meta["grade_id"]] = {
            "error": first[:300],
            "misconception": misconception_slug(text),
        }
    return reports


def grade_one(job: dict) -> dict:
    """Autograde one submission; never raises for a problem of the submission itself."""
    import nbformat

    from graders.isolation import student_build
    from graders.run.execute import KERNEL_DIED, NOT_STOPPED, TIMED_OUT

    student, assignment = job["student"], job["assignment"]
    out, template = Path(job["out"]), Path(job["template"])
    result = {
        "student": student,
        "assignment": assignment,
        "source": str(job["path"]),
        "sha256": sha256(job["path"]),
        "status": "graded",
        "score": 0.0,
        "max_score": job.get("max_score", 0.0),
        "cells": {},
        "problems": [],
        "seconds": 0.0,
    }
    start = time.perf_counter()
    scratch = out / ".work" / f"{student}__{assignment}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch_course(template, scratch, assignment)
    release = nbformat.read(scratch / "notebooks" / assignment / f"{assignment}.ipynb", 4)
    try:
        nb, repairs = read_submission(job["path"], release)
    except ValueError as exc:
        result.update(status="invalid-notebook", problems=[str(exc)])
        return _finish(result, start, out)
    result["problems"] += repairs
    untouched = is_untouched(nb, release)
    tampering = find_tampering(nb)
    pipeline.submit(scratch, student, assignment, nb)
    if job.get("sandbox", True):  # the kernel imports course_utils with every answer a stub
        package = student_build.prebuilt(template, assignment) or student_build.build(
            scratch / "student_build", assignment
        )  # bound read-only: the template's one copy serves every kernel of the assignment
        job = {**job, "package": str(package)}
    outcome = pipeline.autograde(
        scratch, assignment, student, timeout=job.get("timeout"), sandbox=sandbox_settings(job)
    )
    if not outcome.get("success"):
        log = f"{outcome.get('log') or ''}\n{outcome.get('error') or ''}"
        result.update(status="autograde-failed")
        result["problems"].append(f"nbgrader autograde failed: {cause_line(log)}")
        return _finish(result, start, out)
    graded_nb_path = scratch / "autograded" / student / assignment / f"{assignment}.ipynb"
    graded_nb = nbformat.read(graded_nb_path, 4)
    for gid in truncate_outputs(graded_nb):
        result["problems"].append(f"cell {gid}: very long output, cut in the feedback")
    student_build.note_course_code(graded_nb)  # demos that needed the stripped course code
    graded_nb_path.chmod(0o644)  # nbgrader leaves it read-only: only a root grader could write it
    nbformat.write(graded_nb, str(graded_nb_path))
    # the autograded notebook goes back to the client, which files it in the instructor's
    # gradebook course directory (graders/outputs/gradebook.py): Formgrader shows it cell by cell
    kept = out / "autograded" / student / f"{assignment}.ipynb"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(graded_nb_path, kept)
    result["autograded"] = str(kept.relative_to(out))
    got = pipeline.scores(scratch, assignment)[student]
    reports = _cell_reports(graded_nb)
    for gid, (score, max_score) in got["cells"].items():
        rep = reports.get(gid, {})
        if score is not None and max_score:
            result["cells"][gid] = {"score": score, "max_score": max_score, **rep}
    result["score"], result["max_score"] = got["score"], got["max_score"]
    for cell in graded_nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "an answer cell")
        died = [o for o in cell.get("outputs", []) if o.get("ename") == KERNEL_DIED]
        if died and not died[0].get("evalue", "").startswith("not run"):
            result["problems"].append(f"cell {gid}: the kernel died here; later cells scored 0")
        stuck = [
            o
            for o in cell.get("outputs", [])
            if o.get("ename") == TIMED_OUT and NOT_STOPPED in o.get("evalue", "")
        ]
        if stuck:
            result["problems"].append(
                f"cell {gid}: ran past the time limit and ignored the interrupt; the kernel was "
                "stopped, later cells scored 0"
            )
    if untouched:  # the released notebook came back with no code of the student's
        result["status"] = "untouched"
    if tampering:  # the scores stand (computed in this process); the instructor takes a look
        result["status"] = "needs-review"
        result["problems"] += [
            f"possible tampering (patches course or library code), to review: {t}"
            for t in tampering
        ]
    feedback = pipeline.feedback(scratch, assignment, student)
    if feedback is not None:
        dest = out / "feedback" / student / f"{assignment}.html"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(feedback, dest)
        result["feedback"] = str(dest.relative_to(out))
    return _finish(result, start, out)


def scratch_course(template: Path, scratch: Path, assignment: str) -> None:
    """The part of the grading template that autograding `assignment` reads, copied into this
    submission's own course directory: the gradebook (written to, so a copy of its own), the
    assignment's source (nbgrader copies its other files) and its release. The other
    assignments' notebooks and the stripped packages stay in the template (measured: copying the
    whole template was most of the worker's file work)."""
    scratch.mkdir(parents=True)
    shutil.copyfile(template / "gradebook.db", scratch / "gradebook.db")
    for folder in ("solutions", "notebooks"):
        if (template / folder / assignment).is_dir():
            shutil.copytree(template / folder / assignment, scratch / folder / assignment)


def sandbox_settings(job: dict) -> dict | None:
    """SandboxKernelManager settings for this job, or None when it runs without a sandbox."""
    if not job.get("sandbox", True):
        return None
    hidden = [job["out"], job["template"], str(Path(job["path"]).resolve().parent)]
    hidden += [h for h in job.get("hidden", []) if h not in hidden]
    settings = {"memory_gb": float(job.get("memory_gb") or 0.0), "hidden": hidden}
    if job.get("package"):
        settings["package_dir"] = job["package"]
    return settings


def _finish(result: dict, start: float, out: Path) -> dict:
    result["seconds"] = round(time.perf_counter() - start, 2)
    path = result_path(out, result["student"], result["assignment"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    shutil.rmtree(out / ".work" / f"{result['student']}__{result['assignment']}", True)
    return result


def cap_memory(memory_gb: float | None) -> None:
    """Cap this process's address space; the notebook's kernel, started from here, inherits it."""
    if not memory_gb:
        return
    try:
        import resource

        cap = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):  # not on this platform: grade without a cap
        pass


def die_with_parent() -> None:
    """End this process when the one that started it (a dask worker) is gone: a killed worker's
    task runs again elsewhere, and this copy must not go on grading (its sandbox then ends too:
    bwrap runs with --die-with-parent)."""
    parent = os.getppid()  # forked by run_worker: the forkserver, which ends with the dask worker

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def _main(job: dict) -> None:
    die_with_parent()
    cap_memory(job.get("memory_gb"))
    share_cores(job.get("threads"))
    print(json.dumps(grade_one(job)), flush=True)


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
