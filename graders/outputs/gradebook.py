"""The grader's verdicts written into the instructor's nbgrader gradebook.

    python -m graders grade PATH --course-dir COURSE [--gradebook URL]

After a class is graded, this module (run by the grading command's own process, never by a worker
or a student's kernel) makes the course directory COURSE what nbgrader would have made of it:

    COURSE/nbgrader_config.py                  written once if absent (see CONFIG_TEMPLATE); an
                                               instructor's own file is read and kept
    COURSE/<source>/<a>/<a>.ipynb              the instructor notebook the class was graded against
    COURSE/<release>/<a>/<a>.ipynb             nbgrader generate_assignment's output, which also
                                               records the assignment, its notebook and its grade,
                                               solution and source cells in the gradebook
    COURSE/submitted/<student>/<a>/<a>.ipynb   the file the student handed in (with the
                                               timestamp.txt and submission_secret.txt of an
                                               nbgrader collect, when the submission had them)
    COURSE/autograded/<student>/<a>/<a>.ipynb  the notebook the grader graded, with its outputs
    gradebook (default sqlite:///COURSE/gradebook.db)
        every student, every submission, each graded cell's auto_score = the grader's verdict

so that Formgrader shows every submission cell by cell, `nbgrader export` lists the scores, and
`nbgrader generate_feedback` then `nbgrader release_feedback` hand feedback back through the
exchange. The rules:

- Only auto_score is written. A manual_score an instructor set in Formgrader is never touched, so
  it survives any later re-grade (nbgrader's rule: a cell's score is its manual score when set,
  else its auto score); such a cell is marked for manual review again, as nbgrader's own
  autograde does.
- A submission that was not graded (invalid notebook, autograde failed, grader error) is recorded
  with 0 for every graded cell, its notebook flagged in Formgrader, and its status in the
  comment of its first answer cell; its autograded notebook is the released notebook under one
  first cell that says what happened, so its feedback says it too.
- The gradebook's assignment is nbgrader's record of the release graded: a release that added or
  removed cells since submissions were recorded is refused by nbgrader, and that error is shown.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path

import nbformat

from graders.run import pipeline

# written into a course directory that has no nbgrader_config.py of its own, so that nbgrader's
# own commands run there (`nbgrader export`, `generate_feedback`, `release_feedback`, formgrader)
# see the layout and gradebook this module filled
CONFIG_TEMPLATE = """\
# nbgrader configuration of this course directory, written by `python -m graders grade
# --course-dir` (graders/outputs/gradebook.py). Edit freely: the grader reads this file and
# keeps it.
c = get_config()  # noqa: F821 (provided by traitlets when the file is loaded)

c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.source_directory = {source!r}
c.CourseDirectory.release_directory = {release!r}
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.png"]
{db_line}"""

# what nbgrader collect leaves beside a submitted notebook; release_feedback needs both
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")

NOT_GRADED = ("invalid-notebook", "autograde-failed", "grader-error")


class GradebookError(RuntimeError):
    """The gradebook or course directory could not be written; the message says why."""


def default_url(course_dir: Path) -> str:
    return f"sqlite:///{Path(course_dir).resolve() / 'gradebook.db'}"


# what marks a folder as an nbgrader course an instructor already has
COURSE_MARKS = ("nbgrader_config.py", "gradebook.db", "source", "release", "submitted")
NBGRADER_LAYOUT = {"source_directory": "source", "release_directory": "release"}  # its defaults


def existing_course(course_dir: Path) -> bool:
    """True when `course_dir` already is an nbgrader course (its config, gradebook or folders)."""
    return any((Path(course_dir) / mark).exists() for mark in COURSE_MARKS)


def ensure_config(course_dir: Path, db_url: str | None = None) -> Path | None:
    """COURSE/nbgrader_config.py for a new course directory, with the course's layout (and
    `db_url` when it is not the default one). An existing nbgrader course is left as it is:
    its own file, if any, is read, and nothing is written (returns None when it has none)."""
    course_dir = Path(course_dir)
    path = course_dir / "nbgrader_config.py"
    if path.exists():
        return path
    if existing_course(course_dir):
        return None
    course = pipeline.load_config(course_dir, "none")
    db_line = ""
    if db_url and db_url != default_url(course_dir):
        db_line = f"c.CourseDirectory.db_url = {db_url!r}\n"
    path.write_text(
        CONFIG_TEMPLATE.format(
            course_id=course.CourseDirectory.course_id,
            source=course.CourseDirectory.source_directory,
            release=course.CourseDirectory.release_directory,
            db_line=db_line,
        ),
        encoding="utf-8",
    )
    return path


def course_config(course_dir: Path, db_url: str | None = None):
    """The nbgrader config for COURSE: the course's own (graders/authoring/nbgrader_config.py), then
    COURSE/nbgrader_config.py on top; `db_url` (else the file's, else COURSE/gradebook.db)."""
    from traitlets.config.loader import PyFileConfigLoader

    course_dir = Path(course_dir).resolve()
    cfg = pipeline.load_config(course_dir, db_url or default_url(course_dir))
    own = course_dir / "nbgrader_config.py"
    if existing_course(course_dir) and not _wrote_config(own):
        # an instructor's nbgrader course: nbgrader's default folders, unless their file says
        for key, value in NBGRADER_LAYOUT.items():
            setattr(cfg.CourseDirectory, key, value)
    if own.is_file():
        mine = PyFileConfigLoader(own.name, path=str(course_dir)).load_config()
        cfg.merge(mine)
    cfg.CourseDirectory.root = str(course_dir)
    if db_url:
        cfg.CourseDirectory.db_url = db_url
    return cfg


def _wrote_config(path: Path) -> bool:
    """True for a config file this module wrote (CONFIG_TEMPLATE's first line)."""
    try:
        return path.read_text(encoding="utf-8").startswith(CONFIG_TEMPLATE.splitlines()[0])
    except OSError:
        return False


def _api(cfg):
    import logging

    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=cfg)
    api = NbGraderAPI(coursedir=coursedir, config=cfg)
    api.log.setLevel(logging.ERROR)
    return api, coursedir


def _nb_path(coursedir, folder: str, student: str, assignment: str) -> Path:
    """<folder>/<student>/<assignment>/<assignment>.ipynb as this course directory lays it out."""
    where = coursedir.format_path(folder, student, assignment)
    return Path(where) / f"{assignment}.ipynb"


def record_assignments(cfg, assignments: Iterable[str]) -> list[str]:
    """Copy each assignment's instructor notebook into the course's source folder (where it is
    not there yet) and run nbgrader generate_assignment there: the gradebook then knows its
    notebook and every cell. An instructor's own source notebook that differs from the one the
    class was graded against is never overwritten: GradebookError says what to do."""
    api, coursedir = _api(cfg)
    notes = []
    for a in assignments:
        source = _nb_path(coursedir, coursedir.source_directory, ".", a)
        ours = pipeline.REPO / "solutions" / a / f"{a}.ipynb"
        if source.is_file() and source.read_bytes() != ours.read_bytes():
            raise GradebookError(
                f"{source} differs from {ours}, the notebook the class was graded against, and "
                "the gradebook must describe the release that was graded; the grader does not "
                f"overwrite your file: copy ours over it (cp {ours} {source}) or give another "
                "--course-dir"
            )
        if not source.is_file():
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ours, source)
        with pipeline._quiet():
            result = api.generate_assignment(a, force=True, create=True)
        if not result.get("success"):
            raise GradebookError(
                f"nbgrader generate_assignment failed for {a} in {coursedir.root} (the gradebook "
                f"{coursedir.db_url}):\n{result.get('error') or result.get('log')}"
            )
    return notes


def _status_note(res: dict) -> str | None:
    """The line a submission's first comment carries: its status and problems, or None."""
    if res["status"] == "graded" and not res.get("problems"):
        return None
    text = f"Grader: {res['status']}"
    if res["status"] in NOT_GRADED:
        text += " (not graded: every graded cell scores 0)"
    if res.get("problems"):
        text += ". " + " | ".join(res["problems"])
    return text[:4000]


def _placeholder(release: Path, res: dict):
    """The released notebook under one first cell that says why this submission has no graded
    notebook: Formgrader and the feedback show it instead of nothing."""
    nb = nbformat.read(release, 4)
    problems = "\n".join(f"- {p}" for p in res.get("problems", [])) or "- (no details)"
    note = nbformat.v4.new_markdown_cell(
        f"**This submission was not graded ({res['status']}); every graded cell scores 0.**\n\n"
        f"{problems}\n\nThe cells below are the released notebook, not the submission."
    )
    note.id = "grader-status"
    nb.cells.insert(0, note)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def _place_files(coursedir, res: dict, out: Path) -> str | None:
    """Put the submitted and the autograded notebook where nbgrader looks; a problem or None."""
    student, a = res["student"], res["assignment"]
    src = Path(res["source"]) if res.get("source") else None
    submitted = _nb_path(coursedir, coursedir.submitted_directory, student, a)
    autograded = _nb_path(coursedir, coursedir.autograded_directory, student, a)
    submitted.parent.mkdir(parents=True, exist_ok=True)
    autograded.parent.mkdir(parents=True, exist_ok=True)
    if src is not None and src.is_file():  # (the class may be graded from COURSE/submitted)
        if not (submitted.exists() and submitted.samefile(src)):
            shutil.copyfile(src, submitted)
        for name in EXCHANGE_FILES:
            extra = src.parent / name
            if not extra.is_file():
                continue
            for folder in (submitted.parent, autograded.parent):
                if not ((folder / name).exists() and (folder / name).samefile(extra)):
                    shutil.copyfile(extra, folder / name)
    graded = out / res["autograded"] if res.get("autograded") else None
    if graded is not None and graded.is_file():
        shutil.copyfile(graded, autograded)
        return None
    release = _nb_path(coursedir, coursedir.release_directory, ".", a)
    nbformat.write(_placeholder(release, res), str(autograded))
    if res["status"] in NOT_GRADED:
        return None
    return (
        f"{student}/{a}: no autograded notebook kept from an earlier run (before the gradebook "
        "option); grade with --regrade to see its cells in Formgrader"
    )


def _split_name(name: str) -> tuple[str | None, str]:
    """(first, last) of "Last, First" or "First Last"."""
    if "," in name:
        last, _, first = name.partition(",")
        return first.strip() or None, last.strip()
    first, _, last = name.strip().rpartition(" ")
    return first or None, last


def _record_student(gb, res: dict, roster: dict | None) -> None:
    """The student, with the roster's name, email and LMS id when it has them (else the name
    found in the submissions, where the gradebook has none yet)."""
    student = res["student"]
    person = gb.update_or_create_student(student)
    entry = (roster or {}).get(student)
    name = (entry.name if entry else "") or res.get("name") or ""
    if (
        name
        and name != student
        and (entry is not None or not (person.first_name or person.last_name))
    ):
        person.first_name, person.last_name = _split_name(name)
    if entry is not None and entry.email:
        person.email = entry.email
    if entry is not None and entry.lms_id:
        person.lms_user_id = entry.lms_id


def _record_one(gb, res: dict, order: list[str], roster: dict | None = None) -> None:
    """One submission's scores, flag and status comment; manual scores are left alone."""
    from nbgrader.api import MissingEntry

    student, a = res["student"], res["assignment"]
    _record_student(gb, res, roster)
    try:
        sub = gb.find_submission(a, student)
    except MissingEntry:
        sub = gb.add_submission(a, student)
    src = Path(res["source"]) if res.get("source") else None
    stamp = src.parent / "timestamp.txt" if src is not None else None
    if stamp is not None and stamp.is_file():
        from nbgrader import utils

        try:
            sub.timestamp = utils.parse_utc(stamp.read_text().strip())
        except (ValueError, TypeError, OverflowError):
            pass  # an unreadable timestamp: the submission stays without one
    ok = res["status"] not in NOT_GRADED
    cells = res.get("cells", {}) if ok else {}
    for nb in sub.notebooks:
        answers = {c.name for c in nb.notebook.solution_cells}
        for grade in nb.grades:
            # a code cell that is no answer is a test cell: nbgrader scores it automatically
            autograded_test = getattr(grade.cell, "cell_type", None) == "code"
            autograded_test = autograded_test and grade.name not in answers
            if grade.name in cells:
                grade.auto_score = float(cells[grade.name]["score"])
            elif autograded_test or not ok:
                grade.auto_score = 0.0  # the grader gave it nothing (failed, or did not run)
            else:
                grade.auto_score = None  # a cell for a person to grade
            grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        if res["status"] != "graded":
            nb.flagged = True  # to look at in Formgrader; a later clean grade leaves it to you
        comments = {c.name: c for c in nb.comments}
        first = next((comments[g] for g in order if g in comments), None)
        if first is None and comments:
            first = comments[sorted(comments)[0]]
        if first is not None:
            first.auto_comment = _status_note(res)
    gb.db.commit()


def _answer_order(release: Path) -> list[str]:
    nb = nbformat.read(release, 4)
    return [
        c.metadata["nbgrader"]["grade_id"]
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    ]


def record(
    results: list[dict],
    course_dir: Path,
    out: Path,
    assignments: list[str],
    db_url: str | None = None,
    roster: dict | None = None,
) -> list[str]:
    """Write every result into the gradebook of `course_dir` (see the module's docstring).

    results: the grader's results (graders/grade.py), whatever their status; out: the grading
    output folder (the autograded notebooks are under out/autograded/); roster: {student id:
    graders.outputs.exports.Person}, whose name, email and LMS id the gradebook's students get.
    Returns notes for the summary; raises GradebookError when the course directory or the
    gradebook cannot be used.
    """
    from nbgrader.api import Gradebook, InvalidEntry

    course_dir = Path(course_dir).resolve()
    course_dir.mkdir(parents=True, exist_ok=True)
    ensure_config(course_dir, db_url)
    cfg = course_config(course_dir, db_url)
    notes = record_assignments(cfg, assignments)
    _, coursedir = _api(cfg)
    orders = {
        a: _answer_order(_nb_path(coursedir, coursedir.release_directory, ".", a))
        for a in assignments
    }
    try:
        with Gradebook(coursedir.db_url) as gb, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SQLAlchemy's autoflush notes about nbgrader's session
            for res in results:
                if res["assignment"] not in orders:
                    continue
                note = _place_files(coursedir, res, Path(out))
                if note:
                    notes.append(note)
                _record_one(gb, res, orders[res["assignment"]], roster)
    except InvalidEntry as exc:
        raise GradebookError(f"the gradebook {coursedir.db_url} refused an entry: {exc}") from exc
    return notes


def final_scores(
    course_dir: Path, assignments: list[str], db_url: str | None = None
) -> dict[tuple[str, str], tuple[float, float]]:
    """{(student, assignment): (score, max_score)} as the gradebook holds them now: a manual score
    an instructor set counts instead of the grader's."""
    from nbgrader.api import Gradebook

    cfg = course_config(course_dir, db_url)
    scores = {}
    with Gradebook(cfg.CourseDirectory.db_url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in assignments:
            for sub in gb.assignment_submissions(a):
                scores[(sub.student_id, a)] = (float(sub.score), float(sub.max_score))
    return scores
