"""The grader's verdicts in nbgrader's gradebook, read back by nbgrader itself, and the LMS files.

One real grading run (once per test run, fixtures.once; `python -m graders grade --course-dir ...
--export ...` in a subprocess) grades a small class into a fresh course directory: ana (the full
solution of 01_online_softmax and 02_merge_partials), 张伟 (a partial answer to both) and bo (a
file that is not a notebook, for 01). The submissions are laid out as `nbgrader collect` leaves
them, with timestamp.txt and submission_secret.txt. Then nbgrader's own `nbgrader export`,
`generate_feedback` and `release_feedback` run in that course directory, with the
nbgrader_config.py the grader wrote there, and must find what the grader recorded. One test
sets a manual score in the gradebook, grades notebook 01 again with --regrade, and checks that the
manual score and the total that includes it survive. The tests that change the course (feedback,
the manual score) work on a copy of their own, so the tests can run in any order, on any worker.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fixtures import bank, once

from graders.outputs import exports
from graders.run import pipeline

A1, A2 = "01_online_softmax", "02_merge_partials"
FULL, PARTIAL, BROKEN = "ana", "张伟", "bo"

pytestmark = [
    pytest.mark.notebooks,
    pytest.mark.xdist_group("gradebook"),
    pytest.mark.skipif(
        not {A1, A2} <= set(pipeline.assignments()), reason="notebooks 01 and 02 needed"
    ),
]

ROSTER = (
    "student,name,lms_id,section,email\n"
    f'{FULL},"Lopez, Ana",1001,S1,ana@example.org\n'
    f'{PARTIAL},"Zhang, Wei",1002,S2,wei@example.org\n'
)


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _grade_cli(root: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "graders", "grade", str(root / "submitted")]
    cmd += ["--out", str(root / "graded"), "--course-dir", str(root / "course")]
    cmd += ["--jobs", str(once.grading_jobs()), "--unsafe-no-sandbox", *extra]
    proc = subprocess.run(
        cmd, cwd=pipeline.REPO, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    """nbgrader's own command line, run in the course directory (its nbgrader_config.py)."""
    nbgrader = Path(sys.executable).parent / "nbgrader"
    proc = subprocess.run(
        [str(nbgrader), *args], cwd=course, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _results(out: Path) -> dict[tuple[str, str], dict]:
    found = {}
    for path in (out / "results").glob("*/*.json"):
        res = json.loads(path.read_text(encoding="utf-8"))
        found[(res["student"], res["assignment"])] = res
    return found


def _grade_class(root: Path) -> None:
    """The class of the module doc, graded into root/course, root/graded."""
    entries = []
    for a in (A1, A2):
        kinds = {e.name.split(":")[0]: e for e in bank.core(a)}
        kinds["full"].student, kinds["partial"].student = FULL, PARTIAL
        entries += [kinds["full"], kinds["partial"]]
    entries.append(
        bank.Entry("not-json", b"{ not a notebook", set(), "invalid-notebook", assignment=A1)
    )
    entries[-1].student = BROKEN
    bank.write(entries, root)
    secrets = {}
    for folder in (root / "submitted").glob("*/*"):  # what nbgrader collect leaves beside it
        (folder / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
        secrets[f"{folder.parent.name}/{folder.name}"] = (
            f"secret-{folder.parent.name}-{folder.name}"
        )
        (folder / "submission_secret.txt").write_text(
            secrets[f"{folder.parent.name}/{folder.name}"]
        )
    (root / "roster.csv").write_text(ROSTER, encoding="utf-8")
    proc = _grade_cli(
        root, "--export", "canvas", "--export", "moodle", "--roster", str(root / "roster.csv")
    )
    (root / "secrets.json").write_text(json.dumps(secrets), encoding="utf-8")
    (root / "stdout.txt").write_text(proc.stdout, encoding="utf-8")


def _read_class(root: Path) -> dict:
    out = root / "graded"
    grades = {row["student"]: row for row in csv.DictReader(open(out / "grades.csv"))}
    secrets = json.loads((root / "secrets.json").read_text(encoding="utf-8"))
    return {
        "root": root,
        "out": out,
        "course": root / "course",
        "grades": grades,
        "results": _results(out),
        "secrets": {tuple(k.split("/")): v for k, v in secrets.items()},
        "stdout": (root / "stdout.txt").read_text(encoding="utf-8"),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """The class, graded once per test run (fixtures.once: the first pytest-xdist worker that
    needs it grades it, the others read it). Tests that change the course work on a copy
    (`own_copy`), so the others always read the class as graded."""
    return _read_class(once.built_once(tmp_path_factory, "gradebook-class", _grade_class))


@pytest.fixture
def own_copy(graded, tmp_path) -> dict:
    """A copy of the graded class for a test that changes it (feedback, a manual score)."""
    root = tmp_path / "class"
    shutil.copytree(graded["root"], root, symlinks=True, ignore=shutil.ignore_patterns(once.DONE))
    return _read_class(root)


def _gradebook(course: Path):
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course / 'gradebook.db'}")


# ------------------------------------------------------------------- what the grader said


def test_the_class_got_full_partial_and_zero(graded):
    """The premise of the other tests: three different outcomes, as the bank says."""
    g = graded["grades"]
    assert float(g[FULL][A1]) == bank.expected_score(A1, bank.core(A1)[0]) > 0
    partial = next(e for e in bank.core(A1) if e.name == "partial")
    assert 0 < float(g[PARTIAL][A1]) == bank.expected_score(A1, partial) < float(g[FULL][A1])
    assert float(g[BROKEN][A1]) == 0
    assert g[BROKEN]["status"] == "invalid-notebook;missing"  # and nothing handed in for A2
    assert graded["results"][(FULL, A1)]["autograded"] == f"autograded/{FULL}/{A1}.ipynb"
    assert (graded["out"] / "autograded" / PARTIAL / f"{A1}.ipynb").is_file()


# ------------------------------------------------------------------- nbgrader reads it back


def test_nbgrader_export_lists_the_graders_scores(graded):
    course = graded["course"]
    assert (course / "nbgrader_config.py").is_file()
    _nbgrader(course, "export", "--to", str(graded["root"] / "nbgrader_grades.csv"))
    rows = list(csv.DictReader(open(graded["root"] / "nbgrader_grades.csv", encoding="utf-8")))
    exported = {(r["student_id"], r["assignment"]): r for r in rows}
    checked = 0
    for student, row in graded["grades"].items():
        for a in (A1, A2):
            if (student, a) not in graded["results"]:  # no submission: 0, named missing
                assert float(row[a]) == 0 and "missing" in row["status"].split(";")
                continue
            got = exported[(student, a)]
            assert float(got["score"]) == pytest.approx(float(row[a])), (student, a)
            assert float(got["max_score"]) == pytest.approx(
                graded["results"][(student, a)]["max_score"]
            )
            checked += 1
    assert checked == 5
    assert exported[(FULL, A1)]["timestamp"].startswith("2026-12-01 10:00:00")
    assert exported[(PARTIAL, A1)]["last_name"] == "Zhang"  # the roster's name
    assert exported[(PARTIAL, A1)]["email"] == "wei@example.org"


def test_every_graded_cell_holds_the_graders_verdict(graded):
    course = graded["course"]
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert {s.id for s in gb.students} == {FULL, PARTIAL, BROKEN}
        for (student, a), res in graded["results"].items():
            sub = gb.find_submission(a, student)
            (nb,) = sub.notebooks
            grades = {g.name: g for g in nb.grades}
            assert set(grades) == set(bank.points(a))
            for gid, grade in grades.items():
                want = res["cells"][gid]["score"] if res["status"] == "graded" else 0.0
                assert grade.auto_score == pytest.approx(want), (student, a, gid)
                assert grade.manual_score is None and not grade.needs_manual_grade
            assert sub.score == pytest.approx(res["score"])
            assert nb.flagged == (res["status"] != "graded")
            notebook = course / "autograded" / student / a / f"{a}.ipynb"
            assert notebook.is_file()
            assert (course / "autograded" / student / a / "submission_secret.txt").is_file()
        # the partial answer: some cells 0, some full marks, as the grader said
        partial = {
            g.name: g.auto_score for g in gb.find_submission_notebook(A1, A1, PARTIAL).grades
        }
        assert 0.0 in partial.values() and max(partial.values()) > 0
        # the file that was not a notebook: 0, flagged, and why, on its first answer cell
        broken = gb.find_submission_notebook(A1, A1, BROKEN)
        notes = [c.auto_comment for c in broken.comments if c.auto_comment]
        assert len(notes) == 1 and "invalid-notebook" in notes[0] and "not JSON" in notes[0]
    page = (course / "autograded" / BROKEN / A1 / f"{A1}.ipynb").read_text(encoding="utf-8")
    assert "was not graded (invalid-notebook)" in page
    graded_nb = (course / "autograded" / FULL / A1 / f"{A1}.ipynb").read_text(encoding="utf-8")
    assert '"outputs": [' in graded_nb and '"output_type"' in graded_nb  # it ran
    submitted = course / "submitted" / PARTIAL / A1 / f"{A1}.ipynb"
    assert (
        submitted.read_bytes()
        == (graded["root"] / "submitted" / PARTIAL / A1 / f"{A1}.ipynb").read_bytes()
    )


def test_formgrader_lists_every_submission_as_autograded(graded):
    """nbgrader's API behind Formgrader, configured from the course directory's own file only."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    course = graded["course"]
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    cfg.CourseDirectory.root = str(course)
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    subs = {s["student"]: s for s in api.get_submissions(A1)}
    assert set(subs) == {FULL, PARTIAL, BROKEN}
    for student, sub in subs.items():
        assert sub["submitted"] and sub["autograded"], student
        assert sub["score"] == pytest.approx(float(graded["grades"][student][A1]))
    cells = {n["student"]: n for n in api.get_notebook_submissions(A1, A1)}
    assert cells[BROKEN]["flagged"] and not cells[FULL]["flagged"]
    assert cells[PARTIAL]["failed_tests"] and not cells[FULL]["failed_tests"]


def test_feedback_is_generated_and_released_through_the_exchange(own_copy):
    from nbgrader.utils import notebook_hash

    graded = own_copy
    course, exchange = graded["course"], graded["root"] / "exchange"
    _nbgrader(course, "generate_feedback", A1, "--force")
    for student in (FULL, PARTIAL, BROKEN):
        page = course / "feedback" / student / A1 / f"{A1}.html"
        assert page.is_file(), student
    text = (course / "feedback" / PARTIAL / A1 / f"{A1}.html").read_text(encoding="utf-8")
    assert f"{float(graded['grades'][PARTIAL][A1]):g}" in text  # nbgrader's score line
    exchange.mkdir()
    _nbgrader(course, "release_feedback", A1, f"--Exchange.root={exchange}")
    released = {p.name for p in (exchange / "flash-attention" / "feedback").glob("*.html")}
    for student in (FULL, PARTIAL, BROKEN):
        secret = graded["secrets"][(student, A1)]
        assert f"{notebook_hash(secret=secret, notebook_id=A1)}.html" in released, student


# ------------------------------------------------------------------- the LMS files


def test_canvas_file_has_canvas_columns_points_possible_and_scores(graded):
    rows = _read_csv(graded["out"] / "grades_canvas.csv")
    header, points, body = rows[0], rows[1], rows[2:]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert header[5].endswith(f"({A1})") and header[6].endswith(f"({A2})")
    assert points[0].strip() == "Points Possible" and points[1:5] == ["", "", "", ""]
    maxima = {(s, a): r["max_score"] for (s, a), r in graded["results"].items()}
    assert float(points[5]) == maxima[(FULL, A1)] and float(points[6]) == maxima[(FULL, A2)]
    by_login = {r[3]: r for r in body}
    assert set(by_login) == {FULL, PARTIAL, BROKEN}
    assert by_login[PARTIAL][:5] == ["Zhang, Wei", "1002", "", PARTIAL, "S2"]
    assert by_login[BROKEN][:5] == [BROKEN, "", BROKEN, BROKEN, ""]  # not in the roster
    for student, row in graded["grades"].items():
        for col, a in ((5, A1), (6, A2)):
            if row[a] == "":
                assert by_login[student][col] == ""
            else:
                assert float(by_login[student][col]) == pytest.approx(float(row[a]))


def test_moodle_file_has_identifiers_grades_and_feedback(graded):
    rows = list(csv.DictReader(open(graded["out"] / "grades_moodle.csv", encoding="utf-8")))
    assert list(rows[0])[:4] == ["Full name", "ID number", "Username", "Email address"]
    assert {A1, f"{A1} (feedback)", A2, f"{A2} (feedback)"} <= set(rows[0])
    by_user = {r["Username"]: r for r in rows}
    assert by_user[FULL]["Email address"] == "ana@example.org"
    assert by_user[FULL]["ID number"] == "1001" and by_user[BROKEN]["ID number"] == BROKEN
    for student, row in graded["grades"].items():
        for a in (A1, A2):
            if row[a] != "":
                assert float(by_user[student][a]) == pytest.approx(float(row[a]))
    assert "invalid-notebook" in by_user[BROKEN][f"{A1} (feedback)"]
    # nothing handed in: 0, and the feedback column says so
    assert by_user[BROKEN][A2] == "0" and "(missing)" in by_user[BROKEN][f"{A2} (feedback)"]


# ------------------------------------------------------------------- an instructor's hand


def test_a_manual_score_survives_a_regrade(own_copy):
    """Set a manual score on a cell 张伟 failed; grade 01 again: it stays, and counts."""
    graded = own_copy
    course, out = graded["course"], graded["out"]
    res = graded["results"][(PARTIAL, A1)]
    failed = next(g for g, c in res["cells"].items() if c["score"] == 0)
    bonus = res["cells"][failed]["max_score"]
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grade = gb.find_grade(failed, A1, A1, PARTIAL)
        grade.manual_score = bonus
        gb.db.commit()
    before = _results(out)[(PARTIAL, A1)]
    _grade_cli(graded["root"], "--regrade", "--assignment", A1, "--export", "canvas")
    after = _results(out)[(PARTIAL, A1)]
    assert after["sha256"] == before["sha256"] and after["score"] == res["score"]
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grade = gb.find_grade(failed, A1, A1, PARTIAL)
        assert grade.manual_score == bonus  # kept
        assert grade.auto_score == 0.0  # the grader's verdict, written again
        assert grade.needs_manual_grade  # nbgrader's rule: a manual score is reviewed again
        total = gb.find_submission(A1, PARTIAL).score
        assert total == pytest.approx(res["score"] + bonus)
        assert gb.find_submission(A1, FULL).score == pytest.approx(res["max_score"])
    canvas = {r[3]: r for r in _read_csv(out / "grades_canvas.csv")[2:]}
    assert float(canvas[PARTIAL][5]) == pytest.approx(res["score"] + bonus)  # the gradebook's
    # grades.csv stays the grader's own verdict
    grades = {row["student"]: row for row in csv.DictReader(open(out / "grades.csv"))}
    assert float(grades[PARTIAL][A1]) == pytest.approx(res["score"])


# ------------------------------------------------------------------- no grading needed


def test_a_bad_roster_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "roster.csv"
    bad.write_text("name,lms_id\nAna,1\n", encoding="utf-8")
    with pytest.raises(exports.RosterError, match=r"roster\.csv, line 1: missing column 'student'"):
        exports.read_roster(bad)
    bad.write_text("student,name\nana,Ana\n,Nobody\n", encoding="utf-8")
    with pytest.raises(exports.RosterError, match=r"roster\.csv, line 3: empty column 'student'"):
        exports.read_roster(bad)
    bad.write_text("student,name\nana,Ana\nana,Ana again\n", encoding="utf-8")
    with pytest.raises(exports.RosterError, match="line 3: student 'ana' is listed twice"):
        exports.read_roster(bad)
    bad.write_text("student,nmae\nana,Ana\n", encoding="utf-8")
    with pytest.raises(exports.RosterError, match="line 1: unknown column 'nmae'"):
        exports.read_roster(bad)
    good = tmp_path / "good.csv"
    good.write_text('\ufeffStudent,Name,Email\n张伟,"Zhang, Wei",w@x.org\n\n', encoding="utf-8")
    people = exports.read_roster(good)
    assert people["张伟"].name == "Zhang, Wei" and people["张伟"].email == "w@x.org"


def test_the_command_refuses_a_bad_roster_or_export_before_grading(tmp_path, capsys):
    from graders.__main__ import main

    (tmp_path / "sub").mkdir()
    bad = tmp_path / "roster.csv"
    bad.write_text("who,email\n", encoding="utf-8")
    base = ["grade", str(tmp_path / "sub"), "--unsafe-no-sandbox"]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--export", "canvas", "--roster", str(bad)])
    assert exc.value.code == 2
    assert f"{bad}, line 1: missing column 'student'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--export", "canvas,blackboard"])
    assert "--export must be one of canvas, moodle, got 'blackboard'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--roster", str(bad)])
    assert "roster" in capsys.readouterr().err
    assert exports.parse_kinds(["moodle", "canvas,moodle"]) == ["moodle", "canvas"]


def test_failed_submissions_of_every_kind_are_recorded_with_zero(tmp_path):
    """gradebook.record on results that never reached a notebook: a grader error whose source is
    gone, and an autograde failure; the gradebook gets 0 and the reason, nothing raises."""
    from graders.outputs import gradebook

    max_score = sum(bank.points(A2).values())
    results = [
        {
            "student": "x",
            "assignment": A2,
            "source": str(tmp_path / "gone.ipynb"),
            "status": "grader-error",
            "score": 0.0,
            "max_score": max_score,
            "cells": {},
            "problems": ["grading took longer than 60 s and was stopped"],
        },
        {
            "student": "Ana_María-1f0c2d3e",
            "assignment": A2,
            "source": "",
            "status": "autograde-failed",
            "score": 0.0,
            "max_score": max_score,
            "cells": {},
            "problems": ["nbgrader autograde failed: boom"],
        },
    ]
    course = tmp_path / "course"
    notes = gradebook.record(results, course, tmp_path / "out", [A2])
    assert notes == []
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for res in results:
            nb = gb.find_submission_notebook(A2, A2, res["student"])
            assert nb.score == 0 and nb.max_score == pytest.approx(max_score)
            assert all(g.auto_score == 0.0 for g in nb.grades) and nb.flagged
            (note,) = [c.auto_comment for c in nb.comments if c.auto_comment]
            assert res["status"] in note and res["problems"][0] in note
    assert gradebook.final_scores(course, [A2]) == {
        ("x", A2): (0.0, max_score),
        ("Ana_María-1f0c2d3e", A2): (0.0, max_score),
    }


def test_recording_again_writes_auto_scores_and_keeps_manual_ones(tmp_path):
    """record() twice on the same course directory: the second verdicts replace the auto scores,
    a manual score set in between stays and counts, a cell without one follows the grader."""
    from graders.outputs import gradebook

    pts = bank.points(A2)
    first, second = sorted(pts)[:2]

    def result(scores: dict[str, float]) -> dict:
        cells = {g: {"score": scores.get(g, p), "max_score": p} for g, p in pts.items()}
        return {
            "student": "José",
            "assignment": A2,
            "source": "",
            "status": "graded",
            "score": sum(c["score"] for c in cells.values()),
            "max_score": sum(pts.values()),
            "cells": cells,
            "problems": [],
        }

    course = tmp_path / "course"
    gradebook.record([result({})], course, tmp_path, [A2])
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gb.find_grade(first, A2, A2, "José").manual_score = 0.5
        gb.db.commit()
    gradebook.record([result({first: 0.0, second: 0.0})], course, tmp_path, [A2])
    with _gradebook(course) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = gb.find_grade(first, A2, A2, "José")
        assert (kept.manual_score, kept.auto_score, kept.score) == (0.5, 0.0, 0.5)
        other = gb.find_grade(second, A2, A2, "José")
        assert (other.manual_score, other.auto_score, other.score) == (None, 0.0, 0.0)
        total = gb.find_submission(A2, "José").score
    assert total == pytest.approx(sum(pts.values()) - pts[first] - pts[second] + 0.5)
    assert gradebook.final_scores(course, [A2])[("José", A2)][0] == pytest.approx(total)
