"""A class run through nbgrader's own exchange, for the tests that grade what nbgrader delivers.

An instructor's nbgrader course in nbgrader's default layout (`source/`, `release/`, its own
`nbgrader_config.py`), the assignments generated and released into a local exchange with
nbgrader's API, each student's home where nbgrader's fetch puts the assignment, and nbgrader's
submit and collect: so `course/submitted/` is the tree `nbgrader collect` leaves (timestamp.txt,
every file of the student's folder, scratch notebooks included), not one laid out by hand.

The students are told apart by nbgrader's own `--student` option of submit (CourseDirectory
.student_id), as one machine without real users allows; tests of a hub with real system users
are elsewhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from graders.run import pipeline

COURSE_ID = "fa-course-test"

INSTRUCTOR_CONFIG = """\
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course!r}
c.Exchange.root = {exchange!r}
"""


def _config(course: Path, exchange: Path, **course_dir):
    from traitlets.config import Config

    cfg = Config()
    cfg.CourseDirectory.course_id = COURSE_ID
    cfg.CourseDirectory.root = str(course)
    for key, value in course_dir.items():
        setattr(cfg.CourseDirectory, key, value)
    cfg.Exchange.root = str(exchange)
    cfg.Exchange.assignment_dir = str(course)  # a student's fetch and submit: their home
    return cfg


def _run(exchange_class, cfg, **course_dir) -> None:
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=cfg)
    for key, value in course_dir.items():
        setattr(coursedir, key, value)
    step = exchange_class(coursedir=coursedir, authenticator=Authenticator(config=cfg), config=cfg)
    step.start()


def make_course(root: Path, assignments: list[str]) -> tuple[Path, Path]:
    """An instructor's course at root/course (nbgrader's default folders, its own config file)
    with `assignments` generated from the course's solutions and released into root/exchange."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default import ExchangeReleaseAssignment

    pipeline._alembic_on_path()  # nbgrader runs its environment's `alembic`
    course, exchange = Path(root) / "course", Path(root) / "exchange"
    exchange.mkdir(parents=True, exist_ok=True)
    exchange.chmod(0o777)
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(
        INSTRUCTOR_CONFIG.format(course=COURSE_ID, exchange=str(exchange))
    )
    cfg = _config(course, exchange)
    cfg.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    for a in assignments:
        dest = course / "source" / a
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pipeline.REPO / "solutions" / a / f"{a}.ipynb", dest / f"{a}.ipynb")
        result = api.generate_assignment(a, force=True, create=True)
        assert result["success"], result.get("log")
        _run(ExchangeReleaseAssignment, cfg, assignment_id=a)
    return course, exchange


def fetch(home: Path, exchange: Path, assignment: str) -> Path:
    """nbgrader fetch_assignment into `home`; the fetched notebook's path."""
    from nbgrader.exchange.default import ExchangeFetchAssignment

    home.mkdir(parents=True, exist_ok=True)
    _run(ExchangeFetchAssignment, _config(home, exchange), assignment_id=assignment)
    return home / assignment / f"{assignment}.ipynb"


def submit(home: Path, exchange: Path, student: str, assignment: str) -> None:
    """nbgrader submit of home/<assignment>/ (every file in it) as `student`."""
    from nbgrader.exchange.default import ExchangeSubmit

    cfg = _config(home, exchange)
    cfg.ExchangeSubmit.strict = False
    _run(ExchangeSubmit, cfg, assignment_id=assignment, student_id=student)


def collect(course: Path, exchange: Path, assignment: str) -> None:
    """nbgrader collect of `assignment` into course/submitted/ (the newest of each student's)."""
    from nbgrader.exchange.default import ExchangeCollect

    cfg = _config(course, exchange)
    _run(ExchangeCollect, cfg, assignment_id=assignment)


def save(nb, path: Path) -> Path:
    """Write `nb` as Jupyter saves it (nbformat.write: sources as lists of lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path
