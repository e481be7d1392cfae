"""Grade a folder of submissions: nbgrader autograde for each, then grades, feedback and a report.

    python -m graders grade PATH [--out DIR] [--jobs N | --scheduler ADDRESS] [--timeout S]
                                 [--assignment A] [--regrade]

Who and what is graded: every student found in PATH and, with --roster, every student of the
roster, against every assignment found in PATH (or --assignment). A student with nothing handed in
for an assignment gets a `missing` row (0 points, named); a released notebook handed back unchanged
is `untouched`; so every total is over the same points. In a student's assignment folder only the
assignment's notebook is graded (`<assignment>.ipynb`, or a copy named so); a scratch notebook
beside it is skipped and named, as nbgrader skips it. The release's locked and test cells are
restored before grading, whatever was done to them (edited, turned into markdown, their metadata
changed, deleted), and a cell the release does not have scores nothing however many points it
claims (graders/intake/submissions.py, `prepare`).

Writes into DIR (default: PATH/../graded):
    grades.csv            one row per student: the score of each assignment and the total
    grades_by_cell.csv    one row per student, assignment and graded cell, with the misconception
    feedback/<student>/<assignment>.html
    report.md, report.html, score_distribution.png, exercise_pass_rates.png, misconceptions.png
    results/<student>/<assignment>.json   the raw result; kept between runs (see --regrade)
    autograded/<student>/<assignment>.ipynb   the notebook as nbgrader autograde left it
    grades_canvas.csv, grades_moodle.csv  with --export canvas,moodle (graders/outputs/exports.py)
With --course-dir COURSE every verdict also goes into COURSE's nbgrader gradebook, with the
autograded notebooks where Formgrader and `nbgrader generate_feedback` look
(graders/outputs/gradebook.py). A result is reused when the submitted file is byte for byte the
one graded before, so running the command again only grades what is new or changed, and nothing
already graded is lost: each result is written the moment it arrives, so an interrupted run
resumes where it stopped.

The notebooks are graded on dask.distributed (graders/run/cluster.py): a local cluster of --jobs
worker processes, or the cluster whose scheduler --scheduler names. Only this process writes DIR.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from graders.intake.submissions import Submission, attach_submission_info, discover
from graders.run import cluster, pipeline
from graders.run.template import cached_template, release_hash
from graders.run.worker import preload_for, result_path, sha256

DEFAULT_MEMORY_GB = 6.0
MISSING = "missing"  # the status of a rostered student's assignment with no submission
NOT_ROSTERED = "not in the roster: graded under the id the submission gave"


@dataclass
class Outcome:
    results: list[dict]
    problems: list[str] = field(default_factory=list)
    out: Path | None = None
    # wall seconds of each phase: "template" (the release and gradebook), "grading" (the tasks,
    # with the client writing each result as it arrives), "report" (CSVs, similarity, report)
    seconds: dict[str, float] = field(default_factory=dict)
    # CPU seconds of this process over the whole call (the client, the scheduler and, on a
    # local cluster, its worker threads, which wait on each notebook's grading process): the
    # client's own cost; the grading processes' CPU is not in it
    client_cpu: float = 0.0


def grade(
    path: Path,
    out: Path | None = None,
    *,
    jobs: int | None = None,
    timeout: int = 60,
    assignment: str | None = None,
    regrade: bool = False,
    memory_gb: float = DEFAULT_MEMORY_GB,
    progress: bool = True,
    sandbox: bool = True,
    scheduler: str | None = None,
    course_dir: Path | None = None,
    gradebook: str | None = None,
    exports: list[str] | None = None,
    roster: Path | None = None,
) -> Outcome:
    """Grade every submission under `path`; write grades, feedback and the report into `out`.

    sandbox: run each notebook's kernel in the bubblewrap sandbox (graders.isolation.sandbox);
    raises graders.isolation.sandbox.SandboxUnavailable, saying what to install, when none can be
    made here. sandbox=False runs the students' code as this user (a warning says so).
    scheduler: the address of a dask.distributed scheduler to grade on; None starts a local
    cluster of `jobs` worker processes (graders.run.cluster).
    course_dir, gradebook: write every verdict into this nbgrader course directory and its
    gradebook (a database URL; default sqlite:///<course_dir>/gradebook.db), see
    graders.outputs.gradebook; a gradebook without a course directory gets <out>/nbgrader as its
    course directory.
    exports: LMS files to write too ("canvas", "moodle": graders.outputs.exports), with the
    students' LMS identifiers from the `roster` CSV.
    """
    from graders.isolation import sandbox as _sandbox
    from graders.outputs import exports as _exports

    kinds = _exports.parse_kinds(exports)
    people = _exports.read_roster(roster) if roster is not None else None

    if sandbox:
        _sandbox.require()
    else:
        _sandbox.warn_unsafe()

    cpu0 = _own_cpu()
    known = pipeline.assignments()
    if assignment is not None and assignment not in known:
        raise ValueError(f"--assignment must be one of {', '.join(known)}, got {assignment!r}")
    path = Path(path).resolve()
    out = Path(out).resolve() if out else path.parent / "graded"
    out.mkdir(parents=True, exist_ok=True)
    course = None  # the nbgrader course directory that receives the verdicts
    if course_dir is not None or gradebook is not None:
        course = Path(course_dir).resolve() if course_dir is not None else out / "nbgrader"
    subs, problems = discover(path, known, assignment, people)
    if not subs:
        raise ValueError(f"no submissions found under {path} (see `python -m graders grade -h`)")
    wanted = sorted({s.assignment for s in subs}, key=known.index)
    t0 = time.perf_counter()
    release = release_hash()
    results: list[dict] = []
    todo: list[Submission] = []
    for sub in subs:
        old = result_path(out, sub.student, sub.assignment)
        if not regrade and old.exists():
            previous = json.loads(old.read_text())
            if previous.get("sha256") == sha256(sub.path) and previous["status"] != "grader-error":
                results.append(previous)
                continue
        todo.append(sub)
    workers = jobs or os.cpu_count() or 1
    if progress:  # the first line, within a second or two of the command
        print(_summary(subs, todo, workers, scheduler), flush=True)
    template, max_score, code_cells = (  # no template (nor cluster) when nothing is to grade
        cached_template(wanted, release, say=print if progress else None)
        if todo
        else (None, {r["assignment"]: r["max_score"] for r in results}, {})
    )
    preload = preload_for(template, wanted) if todo else []
    tasks = [
        {
            "preload": preload,  # what the grading processes' server imports once
            "student": sub.student,
            "assignment": sub.assignment,
            "source": str(sub.path),
            "sha256": sha256(sub.path),
            "notebook": cluster.encode_notebook(sub.path),
            "template": str(template),
            "release": release,
            "assignments": wanted,
            # the kernel never sees the output, the class or the instructor's course directory
            "hidden": [str(out), str(path), *([str(course)] if course else [])],
            "timeout": timeout,
            "max_score": max_score.get(sub.assignment, 0.0),
            "memory_gb": memory_gb,
            "sandbox": sandbox,
            "wall": timeout * (code_cells[sub.assignment] + 4) + 60,
        }
        for sub in todo
    ]
    t1 = time.perf_counter()
    for res, page in cluster.run(tasks, scheduler=scheduler, workers=workers, progress=progress):
        res.pop("feedback", None)
        res.pop("autograded", None)
        graded_nb = res.pop("autograded_notebook", None)
        if graded_nb is not None:  # nbgrader's autograded notebook, for the gradebook
            dest = out / "autograded" / res["student"] / f"{res['assignment']}.ipynb"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(graded_nb, encoding="utf-8")
            res["autograded"] = str(dest.relative_to(out))
        else:  # none this time (the notebook was not graded): no stale one from a run before
            (out / "autograded" / res["student"] / f"{res['assignment']}.ipynb").unlink(True)
        if page is not None:
            dest = out / "feedback" / res["student"] / f"{res['assignment']}.html"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(page, encoding="utf-8")
            res["feedback"] = str(dest.relative_to(out))
        cache = result_path(out, res["student"], res["assignment"])
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(res, indent=1, ensure_ascii=False), encoding="utf-8")
        results.append(res)
    shutil.rmtree(out / ".work", ignore_errors=True)
    attach_submission_info(results, subs)  # names as found, older uploads not graded
    for res in results if people is not None else []:
        said = any(p.startswith(NOT_ROSTERED.split(":")[0]) for p in res["problems"])
        if res["student"] not in people and not said:  # (an LMS download says it with its ids)
            res["problems"].append(NOT_ROSTERED)
    results += missing_results(results, wanted, max_score, people)
    results.sort(key=lambda r: (r["student"], known.index(r["assignment"])))
    t2 = time.perf_counter()
    written_from = [results, problems, wanted, max_score, str(course), gradebook]
    digest = _outputs_digest(out, written_from)
    if digest is not None:  # None: the grades and report on disk are these results' already
        from graders.outputs.report import write_outputs

        write_outputs(results, problems, out, wanted, max_score)
        (out / ".cache" / "outputs.sha256").write_text(digest)
    final = None
    if course is not None:
        from graders.outputs import gradebook as _gradebook

        if digest is not None:  # (else these very results are in the gradebook already)
            handed_in = [r for r in results if r["status"] != MISSING]
            notes = _gradebook.record(handed_in, course, out, wanted, gradebook, people)
            if progress:
                where = gradebook or _gradebook.default_url(course)
                print(f"gradebook: {len(handed_in)} submissions recorded in {where} ({course})")
                for note in notes:
                    print(f"  {note}")
        final = _gradebook.final_scores(course, wanted, gradebook)
    if kinds:
        tab = _exports.table(results, wanted, max_score, final)
        for path in _exports.write(kinds, tab, out, people):
            if progress:
                print(f"LMS file: {path}")
        strays = [s for s in tab.students if people is not None and s not in people]
        if strays and progress:
            print(f"  not in the roster (exported under their student id): {', '.join(strays)}")
    if progress:
        print(f"{len(todo)} graded, {len(subs) - len(todo)} unchanged; results in {out}")
    seconds = {"template": t1 - t0, "grading": t2 - t1, "report": time.perf_counter() - t2}
    return Outcome(results, problems, out, seconds, _own_cpu() - cpu0)


def missing_results(
    results: list[dict],
    assignments: list[str],
    max_score: dict[str, float],
    roster: dict | None = None,
) -> list[dict]:
    """A `missing` result (0 points, shown as such) for every student without a submission of
    an assignment of the course.

    The students are the roster's (every one, whether they handed in anything or not) and those
    who handed in something; the course is `assignments`, the ones graded in this run. So every
    student's total is over the same points, and work that never arrived is named, not hidden.
    """
    have = {(r["student"], r["assignment"]) for r in results}
    names = {r["student"]: r.get("name") or r["student"] for r in results}
    for student, person in (roster or {}).items():
        names.setdefault(student, getattr(person, "name", "") or student)
    return [
        {
            "student": student,
            "name": names[student],
            "assignment": a,
            "status": MISSING,
            "score": 0.0,
            "max_score": float(max_score.get(a, 0.0)),
            "cells": {},
            "problems": ["no submission"],
            "seconds": 0.0,
        }
        for student in sorted(names)
        for a in assignments
        if (student, a) not in have
    ]


def _summary(subs: list[Submission], todo: list[Submission], workers: int, scheduler) -> str:
    """What the run is about to do, said before anything slow starts."""
    where = f"the cluster at {scheduler}" if scheduler else f"{workers} workers"
    students = len({s.student for s in subs})
    return (
        f"grading {len(todo)} notebooks of {students} students "
        f"({len(subs) - len(todo)} unchanged) on {where}"
    )


def _outputs_digest(out: Path, what: list) -> str | None:
    """A digest of what the grades and the report are written from, or None when they were
    last written from the same (out/.cache/outputs.sha256) and are still there."""
    import hashlib

    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    stamp = out / ".cache" / "outputs.sha256"
    written = all((out / name).is_file() for name in ("grades.csv", "report.md"))
    if written and stamp.is_file() and stamp.read_text() == digest:
        return None
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # written again once the outputs are
    return digest


def _own_cpu() -> float:
    """User + system CPU seconds of this process (all its threads), children excluded."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
