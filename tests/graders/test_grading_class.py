"""A real class: what nbgrader's exchange delivers, graded into the instructor's own course.

Five students on notebooks 01, 03 and 05, released, fetched, submitted and collected with
nbgrader's own exchange (tests/classroom.py) into an nbgrader course in nbgrader's default layout
(`source/`, `release/`, the instructor's `nbgrader_config.py`), then graded with
`python -m graders grade course/submitted --course-dir course --roster roster.csv`:

    agarcia  01 solved, with a scratch Untitled.ipynb saved later beside it; 03 solved; no 05
    bchen    01 fetched and handed back unchanged; 03 solved with a test cell turned into
             markdown; 05 solved
    cdiaz    01 solved plus a cell of her own that claims 100 points; no 03; 05 first partial,
             then solved and submitted again
    dlee     on the roster, handed in nothing
    eve      not on the roster, 01 solved

Every score and status is asserted, every total is over the course's 43 points, and nothing is
written into the course directory where nbgrader would not write.
"""

from __future__ import annotations

import copy
import csv
import os
import subprocess
import sys
from pathlib import Path

import classroom
import nbformat
import pytest
from fixtures import bank, once

from graders.grade import NOT_ROSTERED
from graders.intake.submissions import IGNORED_FILE
from graders.run import pipeline

A1, A3, A5 = "01_online_softmax", "03_tiled_forward", "05_split_kv"
COURSE = [A1, A3, A5]

pytestmark = [
    pytest.mark.notebooks,
    pytest.mark.xdist_group("grading-class"),
    pytest.mark.skipif(
        not set(COURSE) <= set(pipeline.assignments()), reason="notebooks 01, 03, 05 needed"
    ),
]

ROSTER = (
    "student,name,lms_id,email\n"
    'agarcia,"García, Ana",1001,ana@example.org\n'
    'bchen,"Chen, Bo",1002,bo@example.org\n'
    'cdiaz,"Díaz, Carla",1003,carla@example.org\n'
    'dlee,"Lee, Dana",1004,dana@example.org\n'
)


def _points(a: str) -> float:
    return sum(bank.points(a).values())


def _test_cell_to_markdown(nb, assignment: str):
    """The first test cell made markdown, as Jupyter's "M" key does (source, id, metadata kept)."""
    nb = copy.deepcopy(nb)
    first = next(e for e in bank.exercises(assignment) if e.tests)
    i = next(
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade_id") == first.tests[0]
    )
    cell = nb.cells[i]
    nb.cells[i] = nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata, id=cell.id)
    return nb


def _with_own_graded_cell(nb):
    nb = copy.deepcopy(nb)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    claim = dict(test.metadata["nbgrader"], grade_id="my_bonus", points=100)
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": claim}))
    return nb


def _sandbox_flag() -> list[str]:
    from graders.isolation import sandbox

    return [] if sandbox.probe() is None else ["--unsafe-no-sandbox"]


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """The class handed in through the exchange and graded, once per test run (fixtures.once:
    the first pytest-xdist worker that needs it builds it, the others read its files)."""
    root = once.built_once(tmp_path_factory, "exchange-class", _hand_in_and_grade)
    out = root / "graded"
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {row["student"]: row for row in csv.DictReader(fh)}
    config = (root / "nbgrader_config.before.py").read_bytes()
    return {"root": root, "course": root / "course", "out": out, "rows": rows, "config": config}


def _hand_in_and_grade(root: Path) -> None:
    course, exchange = classroom.make_course(root, COURSE)
    (root / "nbgrader_config.before.py").write_bytes((course / "nbgrader_config.py").read_bytes())

    def hand_in(student: str, a: str, nb=None, scratch: bool = False) -> None:
        home = root / "home" / student
        if not (home / a).is_dir():  # fetched once; a resubmission works in the same folder
            classroom.fetch(home, exchange, a)
        path = home / a / f"{a}.ipynb"
        if nb is not None:  # None: the fetched notebook, handed back as it came
            classroom.save(nb, path)
        if scratch:
            classroom.save(nbformat.v4.new_notebook(), path.parent / "Untitled.ipynb")
        classroom.submit(home, exchange, student, a)

    solved = {a: pipeline.solved_notebook(a) for a in COURSE}
    hand_in("agarcia", A1, solved[A1], scratch=True)
    hand_in("agarcia", A3, solved[A3])
    hand_in("bchen", A1)
    hand_in("bchen", A3, _test_cell_to_markdown(solved[A3], A3))
    hand_in("bchen", A5, solved[A5])
    hand_in("cdiaz", A1, _with_own_graded_cell(solved[A1]))
    hand_in("cdiaz", A5, bank.partial(A5)[0])
    hand_in("cdiaz", A5, solved[A5])  # submitted again: collect takes the newest
    hand_in("eve", A1, solved[A1])
    for a in COURSE:
        classroom.collect(course, exchange, a)
    roster = root / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    out = root / "graded"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    cmd = [sys.executable, "-m", "graders", "grade", str(course / "submitted"), "--out", str(out)]
    cmd += [
        "--course-dir",
        str(course),
        "--roster",
        str(roster),
        "--jobs",
        str(once.grading_jobs()),
    ]
    cmd += ["--timeout", str(bank.cell_timeout(not _sandbox_flag())), *_sandbox_flag()]
    proc = subprocess.run(
        cmd, cwd=pipeline.REPO, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


EXPECTED = {  # student: (score of 01, 03, 05) with None for missing
    "agarcia": (_points(A1), _points(A3), None),
    "bchen": (0.0, _points(A3), _points(A5)),
    "cdiaz": (_points(A1), None, _points(A5)),
    "dlee": (None, None, None),
    "eve": (_points(A1), None, None),
}


@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_every_student_has_a_row_over_the_whole_course(klass, student):
    row = klass["rows"][student]
    want = EXPECTED[student]
    assert [float(row[a]) for a in COURSE] == [w or 0.0 for w in want], row["problems"]
    assert float(row["total"]) == sum(w or 0.0 for w in want)
    assert float(row["max_total"]) == sum(_points(a) for a in COURSE) == 43
    statuses = set(row["status"].split(";"))
    assert ("missing" in statuses) == (None in want)


def test_the_whole_class_and_no_one_else(klass):
    assert set(klass["rows"]) == set(EXPECTED)


def _result(klass, student: str, a: str) -> dict:
    import json

    return json.loads((klass["out"] / "results" / student / f"{a}.json").read_text())


def test_a_scratch_notebook_is_skipped_not_graded(klass):
    res = _result(klass, "agarcia", A1)
    assert res["status"] == "graded" and res["score"] == _points(A1), res["problems"]
    assert any(
        p.startswith(f"{A1}: {IGNORED_FILE} Untitled.ipynb")
        for p in klass_problems(klass, "agarcia")
    )


def klass_problems(klass, student: str) -> list[str]:
    return klass["rows"][student]["problems"].split(" | ")


def test_an_unchanged_notebook_is_untouched_not_wrong(klass):
    res = _result(klass, "bchen", A1)
    assert res["status"] == "untouched" and res["score"] == 0.0, res["problems"]
    assert "untouched" in klass["rows"]["bchen"]["status"].split(";")


def test_a_test_cell_turned_into_markdown_is_graded_as_released(klass):
    res = _result(klass, "bchen", A3)
    assert res["status"] == "graded" and res["score"] == _points(A3), res["problems"]
    assert any("turned into markdown; restored" in p for p in res["problems"])


def test_a_cell_that_claims_points_is_ignored_and_reported(klass):
    res = _result(klass, "cdiaz", A1)
    assert res["status"] == "graded", res["problems"]
    assert res["score"] == res["max_score"] == _points(A1), res["problems"]
    assert any(
        "my_bonus: not a cell of the release" in p and "100 points" in p for p in res["problems"]
    )


def test_the_newest_submission_is_graded(klass):
    res = _result(klass, "cdiaz", A5)
    assert res["score"] == _points(A5)


def test_missing_work_is_named(klass):
    for student, want in EXPECTED.items():
        for a, score in zip(COURSE, want, strict=True):
            if score is None:
                assert f"{a}: no submission" in klass_problems(klass, student), (student, a)


def test_a_student_off_the_roster_is_graded_and_named(klass):
    assert f"{A1}: {NOT_ROSTERED}" in klass_problems(klass, "eve")
    assert not any(NOT_ROSTERED in p for p in klass_problems(klass, "agarcia"))


def test_the_instructors_course_directory_keeps_its_layout(klass):
    course = klass["course"]
    assert not (course / "solutions").exists() and not (course / "notebooks").exists()
    assert (course / "nbgrader_config.py").read_bytes() == klass["config"]
    for a in COURSE:
        assert (course / "source" / a / f"{a}.ipynb").is_file()
        assert (course / "release" / a / f"{a}.ipynb").is_file()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {(s.student_id, a): s.score for a in COURSE for s in gb.assignment_submissions(a)}
    want = {
        (student, a): score
        for student, row in EXPECTED.items()
        for a, score in zip(COURSE, row, strict=True)
        if score is not None
    }
    assert scores == pytest.approx(want)
