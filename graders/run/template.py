"""The grading template: the release as nbgrader sees it, with a gradebook and the students'
stripped packages, built once per release and kept in a cache between runs.

    release = release_hash()                       client and workers must agree on it
    template, max_score, code_cells = cached_template(assignments, release, say=print)

template is a course directory (solutions/, notebooks/, gradebook.db, the stripped course_utils
of every assignment: graders/isolation/student_build.py); max_score {assignment: points};
code_cells {assignment: code cells of the release}. Each submission is graded in a copy of its
own (graders/run/worker.py); the dask workers build or reuse theirs (graders/run/cluster.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from graders.isolation import student_build
from graders.run import pipeline


def release_hash(root: Path = pipeline.REPO) -> str:
    """A digest of the release (solutions/ and notebooks/): client and workers must agree."""
    h = hashlib.sha256()
    for folder in ("solutions", "notebooks"):
        for path in sorted((Path(root) / folder).rglob("*.ipynb")):
            if ".ipynb_checkpoints" in path.parts:
                continue
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


TEMPLATE_CACHE_KEEP = 4  # templates kept in the cache: the newest used, the others removed
_META = ".meta.json"  # max scores and code cells; written last, so its presence marks a whole one


def template_cache() -> Path:
    """Where grading templates are kept between runs: $XDG_CACHE_HOME/fa-course-grader
    (default ~/.cache/fa-course-grader)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fa-course-grader"


def template_key(release: str, assignments: list[str]) -> str:
    """What a grading template is made from: the release (release_hash), the assignments it
    holds, and what turns them into a template: nbgrader's version, the course's nbgrader config,
    and the course package with the code that strips it (graders/isolation/student_build.py)."""
    from importlib.metadata import version

    h = hashlib.sha256(f"{release}\n{','.join(assignments)}\n{version('nbgrader')}\n".encode())
    stripped = sorted(student_build.PACKAGE.rglob("*.py"))
    for path in (pipeline.CONFIG_FILE, Path(student_build.__file__), *stripped):
        h.update(str(path.relative_to(pipeline.REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def cached_template(
    assignments: list[str], release: str, say=None
) -> tuple[Path, dict[str, float], dict[str, int]]:
    """The grading template of build_template for these assignments, built once
    per template_key into template_cache() and reused by every later run (the release generated
    with nbgrader and the students' packages stripped: seconds a run). A changed release, course
    package or nbgrader gives another key, so a new template; the newest few are kept. Built in a
    temporary folder beside it and renamed into place whole, so a run that is stopped, or two
    that build at once, never leave or use a half-built one. It holds the release alone: each
    submission is graded in a copy of its own (graders/run/worker.py)."""
    root = template_cache()
    dest = root / template_key(release, assignments)
    if not (dest / _META).is_file():
        if say is not None:
            say(f"building the release template of {len(assignments)} assignments (cached)")
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            template, max_score, code_cells = build_template(tmp, assignments, release)
            meta = {"max_score": max_score, "code_cells": code_cells}
            (template / _META).write_text(json.dumps(meta))
            if dest.is_dir() and not (dest / _META).is_file():
                shutil.rmtree(dest)  # not a template (no meta): never renamed into place whole
            try:
                os.rename(template, dest)
            except OSError:  # another run renamed its own first: the same key, the same content
                if not (dest / _META).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((dest / _META).read_text())
    os.utime(dest)  # most recently used
    _prune(root, dest)
    return dest, meta["max_score"], meta["code_cells"]


def _prune(root: Path, current: Path) -> None:
    """Remove all but the TEMPLATE_CACHE_KEEP most recently used templates (never `current`),
    and what builds stopped a day ago or more left (a build in progress is younger)."""
    import time

    for stale in root.glob(".building-*"):
        if stale.stat().st_mtime < time.time() - 86400:
            shutil.rmtree(stale, ignore_errors=True)
    done = [p for p in root.iterdir() if p.is_dir() and (p / _META).is_file() and p != current]
    done.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in done[TEMPLATE_CACHE_KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def build_template(
    work: Path, only: list[str], release: str = ""
) -> tuple[Path, dict[str, float], dict[str, int]]:
    """A course directory with the release and a gradebook that knows every assignment; its
    `.release` file holds the release digest (release_hash) it was built from."""
    import nbformat

    template = work / "template"
    shutil.rmtree(template, ignore_errors=True)
    shutil.copytree(pipeline.REPO / "solutions", template / "solutions")
    shutil.copytree(pipeline.REPO / "notebooks", template / "notebooks")
    for assignment in only:
        pipeline.generate(template, assignment)
    code_cells = {
        a: sum(
            c.cell_type == "code"
            for c in nbformat.read(template / "notebooks" / a / f"{a}.ipynb", 4).cells
        )
        for a in only
    }
    student_build.build_all(template, only)
    (template / ".release").write_text(release)
    return template, pipeline.max_scores(template), code_cells
