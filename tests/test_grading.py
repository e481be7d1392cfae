"""The grader on a bank of synthetic submissions: every one gets exactly the score it deserves."""

from __future__ import annotations

import csv
import json

import pytest

from graders import bank, pipeline
from graders.grade import grade
from graders.submissions import discover

ASSIGNMENT = "01_online_softmax"  # the fastest notebook: the bank exercises the grader, not it

pytestmark = [
    pytest.mark.notebooks,
    pytest.mark.xdist_group("grading"),  # one worker builds the graded class once
    pytest.mark.skipif(ASSIGNMENT not in pipeline.assignments(), reason="notebook 01 missing"),
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    entries = bank.build(ASSIGNMENT)
    bank.write(entries, folder, ASSIGNMENT)
    outcome = grade(
        folder / "submitted",
        folder / "graded",
        jobs=2,
        timeout=bank.TIMEOUT_FOR_BANK,
        progress=False,
    )
    results = {r["student"]: r for r in outcome.results}
    return entries, results, outcome, folder


def _entries():
    return bank.build(ASSIGNMENT) if ASSIGNMENT in pipeline.assignments() else []


def test_bank_covers_every_kind_of_submission():
    names = {e.name.split(":")[0] for e in _entries()}
    for kind in (
        "full",
        "untouched",
        "mistake",
        "calls-reference",
        "infinite-loop",
        "sys-exit",
        "os-exit",
        "memory-bomb",
        "huge-output",
        "warnings",
        "edited-test-cell",
        "deleted-test-cell",
        "changed-cell-ids",
        "patched-allclose",
        "patched-check",
        "not-json",
    ):
        assert kind in names, f"the bank has no {kind!r} submission"


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e.name)
def test_submission_gets_its_exact_score(graded, entry):
    _, results, _, _ = graded
    res = results[bank.student_id(entry)]
    want = bank.expected_score(ASSIGNMENT, entry)
    assert res["status"] == entry.status, res["problems"]
    assert res["score"] == pytest.approx(want), (
        f"{entry.name}: scored {res['score']}, expected {want}; cells {res['cells']}; "
        f"problems {res['problems']}"
    )
    for cell, slug in entry.misconception.items():
        assert res["cells"][cell]["misconception"] == slug, res["cells"][cell]
    if entry.problem:
        assert any(entry.problem in p for p in res["problems"]), res["problems"]


def test_grades_feedback_and_report_are_written(graded):
    entries, results, outcome, folder = graded
    out = outcome.out
    with open(out / "grades.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["student"] for r in rows} == {bank.student_id(e) for e in entries}
    for row in rows:
        assert float(row[ASSIGNMENT]) == pytest.approx(results[row["student"]]["score"])
    for res in results.values():
        if res["status"] in ("graded", "needs-review"):
            assert (out / res["feedback"]).exists(), res
    for name in ("report.md", "report.html", "score_distribution.png", "misconceptions.png"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert "calls-reference" in report and "Pass rate per exercise" in report


def test_running_again_keeps_what_was_graded(graded):
    entries, results, outcome, folder = graded
    before = (outcome.out / "grades.csv").read_text()
    again = grade(folder / "submitted", outcome.out, jobs=2, progress=False)
    assert (outcome.out / "grades.csv").read_text() == before
    for res in again.results:  # reused, not re-run: the recorded time is unchanged
        assert res["seconds"] == results[res["student"]]["seconds"]


def test_flat_lms_export_is_understood(tmp_path):
    entries = [e for e in _entries() if e.name in ("full", "untouched")]
    bank.write(entries, tmp_path, ASSIGNMENT, layout="flat")
    (tmp_path / "notes.ipynb").write_text("{}")
    subs, problems = discover(tmp_path, pipeline.assignments())
    assert sorted((s.student, s.assignment) for s in subs) == [
        ("full", ASSIGNMENT),
        ("untouched", ASSIGNMENT),
    ]
    assert any("notes.ipynb" in p for p in problems)
    subs, _ = discover(tmp_path, pipeline.assignments(), assignment=ASSIGNMENT)
    assert {s.student for s in subs} >= {"full", "untouched", "notes"}


def test_result_files_are_json_with_the_submission_hash(graded):
    _, results, outcome, _ = graded
    some = next(iter(results.values()))
    path = outcome.out / "results" / some["student"] / f"{ASSIGNMENT}.json"
    assert json.loads(path.read_text())["sha256"] == some["sha256"]
