"""nbgrader plumbing shared by the release command, the grader and the tests.

The course directory nbgrader sees is laid out as
    <root>/solutions/<assignment>/<assignment>.ipynb   source (instructor notebooks, built from
                                                        source/<assignment>.md: notebook_text)
    <root>/notebooks/<assignment>/<assignment>.ipynb   release (student notebooks)
    <root>/submitted/<student>/<assignment>/...         submissions, then autograded/, feedback/
`root` is the repository for a release, and a working folder for grading. REPO, CONFIG_FILE and
assignments() are graders/authoring/course.py's, offered here too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
from pathlib import Path

from graders.authoring.course import CONFIG_FILE as CONFIG_FILE
from graders.authoring.course import REPO as REPO
from graders.authoring.course import assignments as assignments


def skip_iri_grammar() -> None:
    """Keep jsonschema from compiling rfc3987_syntax's IRI grammar (about 1 s at import, most of
    the time `import nbformat` takes). Only jsonschema's "iri" format checker uses it, and
    nbformat validates notebooks without format checking, so nothing the grader does changes.
    Called first thing by the grader's programs (python -m graders, python -m graders.run.worker),
    never on import: a library must not change what its importer's jsonschema checks."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # None: `import` raises ImportError


def _alembic_on_path() -> None:
    """nbgrader runs the `alembic` program of its environment: make sure it is found."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _gradebook_stamp_in_process() -> None:
    """Have nbgrader read the head of its gradebook migrations in this process.

    A new gradebook is stamped with the newest revision of nbgrader's migrations, which nbgrader
    gets by running the `alembic heads` program: 2.5 s of CPU for every new gradebook on a 2-core
    machine (a grading template, an instructor's gradebook; measured 2026-12-06), where alembic's
    own ScriptDirectory, given the same configuration file (nbgrader's `_temp_alembic_ini`),
    reads the same scripts in 0.08 s. The revision is the same one; where it is not a single
    head, or nbgrader's helpers have moved, nbgrader's own function runs (with `alembic` on the
    PATH: _alembic_on_path)."""
    import nbgrader.api as nb_api

    original = nb_api.get_alembic_version
    if getattr(original, "in_process", False):
        return

    def get_alembic_version() -> str:
        try:
            from alembic.config import Config
            from alembic.script import ScriptDirectory

            with nb_api._temp_alembic_ini("sqlite:////tmp/gradebook.db") as ini:
                heads = ScriptDirectory.from_config(Config(ini)).get_heads()
        except Exception:  # any surprise: nbgrader's own way
            return original()
        return heads[0] if len(heads) == 1 else original()

    get_alembic_version.in_process = True
    nb_api.get_alembic_version = get_alembic_version


def load_config(
    root: Path, db_url: str | None = None, timeout: int | None = None, sandbox: dict | None = None
):
    """The course's nbgrader config for `root`, with a gradebook (default: <root>/gradebook.db).

    Without a gradebook (db_url="none") generate_assignment records nothing: enough for a release.
    timeout: seconds one cell may run during autograde (default: the config file's).
    sandbox: run each kernel in graders.isolation.sandbox's bubblewrap sandbox, with these settings
    of SandboxKernelManager (memory_gb, tmpfs_mb, hidden); None: the kernel runs as this user.
    """
    from traitlets.config.loader import PyFileConfigLoader

    _alembic_on_path()
    _gradebook_stamp_in_process()
    cfg = PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()
    root = Path(root).resolve()
    cfg.CourseDirectory.root = str(root)
    if db_url == "none":
        cfg.GenerateAssignment.no_database = True
        cfg.SaveCells.enabled = False
    else:
        cfg.CourseDirectory.db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    if timeout is not None:
        cfg.Execute.timeout = int(timeout)
    from nbgrader.converters.autograde import Autograde

    from graders.run.execute import SurvivingExecute
    from graders.run.feedback_html import FeedbackHTMLExporter

    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    # the graded kernel has nothing to save: killed at the end, not asked to quit (0.3 s a
    # submission, against 0.1); its sandbox and scratch go the same way as a stuck kernel's
    cfg.SurvivingExecute.shutdown_kernel = "immediate"
    cfg.Autograde.autograde_preprocessors = [
        SurvivingExecute if getattr(s, "__name__", "") == "Execute" else s for s in steps
    ]
    # the feedback page as nbgrader's, without nbconvert's second parse of it (0.7 s a page)
    cfg.GenerateFeedback.exporter_class = FeedbackHTMLExporter
    if sandbox is not None:
        cfg.SurvivingExecute.sandboxed = True
        for key, value in sandbox.items():
            setattr(cfg.SandboxKernelManager, key, value)
    return cfg


def nbgrader_api(
    root: Path, db_url: str | None = None, timeout: int | None = None, sandbox: dict | None = None
):
    """An nbgrader API object for the course directory at `root`."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    cfg = load_config(root, db_url, timeout, sandbox)
    coursedir = CourseDirectory(config=cfg)
    api = NbGraderAPI(coursedir=coursedir, config=cfg)
    api.log.setLevel(logging.ERROR)
    return api


@contextlib.contextmanager
def _quiet():
    """nbgrader logs a lot to stderr; keep it for errors only."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def generate(root: Path, assignment: str, db_url: str | None = None) -> None:
    """Run nbgrader generate_assignment: solutions/<a> -> notebooks/<a>, outputs cleared."""
    api = nbgrader_api(root, db_url)
    with _quiet():
        result = api.generate_assignment(assignment, force=True, create=True)
    if not result.get("success"):
        raise RuntimeError(
            f"nbgrader generate_assignment failed for {assignment}:\n"
            f"{result.get('error') or result.get('log')}"
        )


def release(root: Path = REPO, only: list[str] | None = None) -> list[Path]:
    """Regenerate the student notebooks of `root` from its solutions; returns the written files."""
    root = Path(root)
    written = []
    for assignment in only or assignments(root):
        if not (root / "solutions" / assignment).is_dir():
            raise ValueError(f"no assignment {assignment!r} under {root / 'solutions'}")
        generate(root, assignment, db_url="none")
        written.append(root / "notebooks" / assignment / f"{assignment}.ipynb")
    return written


def build_and_release(root: Path, only: list[str] | None = None, source: Path | None = None):
    """What `python -m graders release` does at `root`: build solutions/ from source/, point the
    Colab badges of README.md and docs/ at course.toml's repository, then generate notebooks/
    with nbgrader. Returns (solutions changed, badge files changed, notebooks released)."""
    from graders.authoring import authoring, notebook_text

    built = notebook_text.build(root, only, source)
    colab_url = notebook_text.course_settings(root).colab_url
    badges = authoring.sync_badge_files(root, colab_url)
    return built, badges, release(root, only)


def release_into(tmp: Path, only: list[str] | None = None) -> Path:
    """Copy solutions/ into a scratch course directory and release there (for comparisons)."""
    tmp = Path(tmp)
    shutil.copytree(REPO / "solutions", tmp / "solutions", dirs_exist_ok=True)
    os.makedirs(tmp / "notebooks", exist_ok=True)
    release(tmp, only)
    return tmp / "notebooks"


def _strip_solution_markers(source: str) -> str:
    keep = [
        line
        for line in source.splitlines()
        if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    ]
    return "\n".join(keep)


def solved_notebook(assignment: str, root: Path = REPO):
    """The student notebook with every answer cell filled in from the instructor solution.

    This is what a perfect student submits: locked cells as released, answers as the solution.
    """
    import nbformat

    root = Path(root)
    source = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    student = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    answers = {
        c.metadata["nbgrader"]["grade_id"]: _strip_solution_markers(c.source)
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    for cell in student.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return student


def submit(root: Path, student: str, assignment: str, notebook) -> Path:
    """Place one student's notebook in nbgrader's submitted/<student>/<assignment>/ layout."""
    import nbformat

    folder = Path(root) / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment}.ipynb"
    if isinstance(notebook, str | Path):
        shutil.copyfile(notebook, path)
    else:
        nbformat.write(notebook, str(path))
    return path


def autograde(
    root: Path,
    assignment: str,
    student: str,
    timeout: int | None = None,
    sandbox: dict | None = None,
) -> dict:
    """Run nbgrader autograde for one submission; returns nbgrader's result dict.

    sandbox: None runs the kernel as this user; a dict (settings of graders.isolation.sandbox's
    SandboxKernelManager, {} for the defaults) runs it in the bubblewrap sandbox.
    """
    api = nbgrader_api(root, timeout=timeout, sandbox=sandbox)
    with _quiet():
        return api.autograde(assignment, student, force=True, create=True)


def scores(root: Path, assignment: str) -> dict[str, dict]:
    """Gradebook scores: {student: {"score", "max_score", "cells": {grade_id: (s, max)}}}."""
    import warnings

    from nbgrader.api import Gradebook

    cfg = load_config(root)
    out = {}
    with Gradebook(cfg.CourseDirectory.db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's autoflush notes about nbgrader's session
        for sub in gb.assignment_submissions(assignment):
            cells = {}
            for nb in sub.notebooks:
                for grade in nb.grades:
                    cells[grade.name] = (grade.score, grade.max_score)
            out[sub.student_id] = {"score": sub.score, "max_score": sub.max_score, "cells": cells}
    return out


def feedback(root: Path, assignment: str, student: str) -> Path | None:
    """Run nbgrader generate_feedback for one graded submission; the HTML file, or None."""
    api = nbgrader_api(root)
    with _quiet():
        result = api.generate_feedback(assignment, student, force=True)
    html = Path(root) / "feedback" / student / assignment / f"{assignment}.html"
    return html if result.get("success") and html.exists() else None


def max_scores(root: Path) -> dict[str, float]:
    """{assignment: max score} for the assignments recorded in the gradebook of `root`."""
    import warnings

    from nbgrader.api import Gradebook

    cfg = load_config(root)
    with Gradebook(cfg.CourseDirectory.db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {a.name: float(a.max_score) for a in gb.assignments}
