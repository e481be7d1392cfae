"""The grader's handling of real notebook files and folders, without running nbgrader autograde.

Reading what Jupyter writes (lists of lines, every nbformat 4 minor, nbformat 3), clear reasons
for files that are not notebooks, the repairs of an honest student's tooling accidents, student
ids from any name, the newest of several uploads, one-line causes, a feedback page and a results
file for every status, and the similarity of answers. Fast: these run with the unit tests.
"""

from __future__ import annotations

import copy
import glob
import html
import json
import os
import re
import time
import unicodedata
from itertools import combinations
from pathlib import Path

import nbformat
import numpy as np
import pytest
from fixtures import bank

from graders.intake.submissions import (
    IGNORED_FILE,
    OLDER_UPLOAD,
    attach_submission_info,
    cause_line,
    discover,
    find_tampering,
    is_untouched,
    one_line,
    prepare,
    read_notebook,
    read_submission,
    source_text,
    student_id,
    truncate_outputs,
)
from graders.outputs import similarity
from graders.outputs.report import fallback_feedback, finalize
from graders.run import pipeline

ASSIGNMENTS = pipeline.assignments()
A = "01_online_softmax"

pytestmark = pytest.mark.skipif(A not in ASSIGNMENTS, reason="notebook 01 missing")


def _gid(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _release(assignment=A):
    return nbformat.read(bank.release_path(assignment), 4)


def _write(path: Path, nb, how="nbformat") -> Path:
    bank.save_notebook(nb, path, how)
    return path


# ---------------------------------------------------------------------------------------------
# Reading what Jupyter writes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_notebooks_read_as_nbformat_reads_them(assignment):
    """The files students get store sources as lists of lines; every consumer gets strings."""
    path = bank.release_path(assignment)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert any(isinstance(c["source"], list) for c in raw["cells"])  # as every Jupyter saves
    nb = read_notebook(path)
    assert nb == nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    assert all(isinstance(c.source, str) for c in nb.cells)
    assert find_tampering(nb) == []
    notes = prepare(nb, _release(assignment))
    assert notes == []  # nothing to repair in the release itself


def test_list_sources_from_a_plain_dict_work_too():
    """A notebook built from JSON without nbformat's rejoin (lists of lines) is read as well."""
    raw = json.loads(bank.release_path(A).read_text(encoding="utf-8"))
    nb = nbformat.from_dict(raw)
    assert isinstance(nb.cells[0].source, list)
    assert find_tampering(nb) == []
    cell = next(c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("solution"))
    cell.source = ["import numpy as np\n", "np.allclose = lambda *a, **k: True\n"]
    assert find_tampering(nb) == [f"cell {_gid(cell)}: np.allclose = lambda *a, **k: True"]
    cell.outputs = [{"output_type": "stream", "name": "stdout", "text": ["x" * 70_000, "y\n"]}]
    assert truncate_outputs(nb) == [_gid(cell)]
    assert source_text(["a\n", "b"]) == "a\nb" and source_text("c") == "c"


@pytest.mark.parametrize("how", ["nbformat", "nbformat-4.4", "nbformat-v3", "json"])
def test_every_format_jupyter_writes_is_read_as_nbformat_4_5(tmp_path, how):
    solved = pipeline.solved_notebook(A)
    path = _write(tmp_path / "x.ipynb", solved, how)
    nb, notes = read_submission(path, _release())
    assert notes == []
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    ids = [c["id"] for c in nb.cells]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)
    answers = {_gid(c): c.source for c in solved.cells if _gid(c)}
    assert {_gid(c): c.source for c in nb.cells if _gid(c)} == answers


def test_outputs_widget_state_and_attachments_are_kept(tmp_path):
    path = _write(tmp_path / "x.ipynb", bank.with_outputs(pipeline.solved_notebook(A)))
    nb = read_notebook(path)
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata["widgets"]
    assert any(c.get("attachments") for c in nb.cells)
    assert any(o.output_type == "display_data" for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"{ this is not a notebook", "the file is not JSON (Expecting property name"),
        (bytes(range(256)), "not UTF-8 text"),
        (b"[1, 2]", "no 'nbformat' field"),
        (b"{}", "no 'nbformat' field"),
        (b'{"nbformat": 5, "nbformat_minor": 0, "cells": []}', "Unsupported nbformat version 5"),
        (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "missing an expected key: cells"),
        (
            b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, '
            b'"cells": [{"cell_type": "code", "id": "a", "metadata": {}}]}',
            "'source' is a required property",
        ),
    ],
    ids=["not-json", "binary", "json-list", "empty-object", "nbformat-5", "no-cells", "no-source"],
)
def test_a_file_that_is_not_a_notebook_gets_a_one_line_reason(tmp_path, content, reason):
    path = tmp_path / "x.ipynb"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_notebook(path)
    message = str(info.value)
    assert message.startswith("not a notebook Jupyter can open: ") and "\n" not in message
    assert reason in message, message


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "x.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + bank.release_path(A).read_bytes())
    assert read_notebook(path).cells


# ---------------------------------------------------------------------------------------------
# Repairs: an honest student's tooling accidents
# ---------------------------------------------------------------------------------------------


def _first_exercise():
    return next(e for e in bank.exercises(A) if e.function)


def test_an_answer_cell_pasted_twice_runs_both_copies(tmp_path):
    ex = _first_exercise()
    nb = pipeline.solved_notebook(A)
    i = next(i for i, c in enumerate(nb.cells) if _gid(c) == ex.answer)
    nb.cells.insert(i + 1, copy.deepcopy(nb.cells[i]))  # same id, same nbgrader metadata
    nb.cells[i].source = "# my first try\n"
    got, notes = read_submission(_write(tmp_path / "x.ipynb", nb, "json"), _release())
    assert len(got.cells) == len(nb.cells)  # nothing the student wrote is dropped
    assert [c.source for c in got.cells] == [c.source for c in nb.cells]
    assert [i for i, c in enumerate(got.cells) if _gid(c) == ex.answer] == [i + 1]
    ids = [c["id"] for c in got.cells]
    assert len(set(ids)) == len(ids)
    assert notes == [
        "1 cell(s) had the id of another cell (a cell copied and pasted); gave them new ids",
        f"cell {ex.answer}: the answer cell appears 2 times (copied and pasted); all copies ran "
        "in order, as written",
    ]


@pytest.mark.parametrize("where", ["below", "end", "above-the-answer"])
def test_a_test_cell_pasted_twice_is_graded_once_in_the_releases_place(where):
    ex = _first_exercise()
    test = ex.tests[0]
    nb = pipeline.solved_notebook(A)
    i = next(i for i, c in enumerate(nb.cells) if _gid(c) == test)
    pasted = copy.deepcopy(nb.cells[i])
    pasted["id"] = "pasted"
    pasted.source = "# edited copy\n" + pasted.source
    answer_at = next(k for k, c in enumerate(nb.cells) if _gid(c) == ex.answer)
    at = {"below": i + 1, "end": len(nb.cells), "above-the-answer": answer_at}[where]
    nb.cells.insert(at, pasted)
    notes = prepare(nb, _release())
    kept = [c for c in nb.cells if _gid(c) == test]
    assert len(kept) == 1 and kept[0]["id"] != "pasted"  # the release's copy
    order = [_gid(c) for c in nb.cells if _gid(c)]
    assert order.index(ex.answer) < order.index(test)
    assert notes == [
        f"cell {test}: the test cell appears 2 times (copied and pasted); graded once, the "
        "release's copy"
    ]


def test_changed_nbgrader_metadata_and_a_deleted_test_cell_are_put_back():
    ex = _first_exercise()
    nb = pipeline.solved_notebook(A)
    cell = next(c for c in nb.cells if _gid(c) == ex.tests[0])
    cell.metadata["nbgrader"]["schema_version"] = 99
    other = next(e for e in bank.exercises(A) if e.tests and e.answer != ex.answer)
    nb.cells.remove(next(c for c in nb.cells if _gid(c) == other.tests[0]))
    notes = prepare(nb, _release())
    assert cell.metadata["nbgrader"]["schema_version"] == 3
    assert (
        f"cell {ex.tests[0]}: the test cell was given other nbgrader metadata; restored from the "
        "release"
    ) in notes
    assert f"cell {other.tests[0]}: locked cell was deleted; restored from the release" in notes
    assert [_gid(c) for c in nb.cells if _gid(c)] == [_gid(c) for c in _release().cells if _gid(c)]


def test_a_test_cell_turned_into_markdown_is_graded_as_released():
    ex = _first_exercise()
    nb = pipeline.solved_notebook(A)
    i = next(i for i, c in enumerate(nb.cells) if _gid(c) == ex.tests[0])
    test = nb.cells[i]
    # what Jupyter's "M" key makes of a code cell: markdown, same source, id and metadata
    nb.cells[i] = nbformat.v4.new_markdown_cell(test.source, metadata=test.metadata, id=test.id)
    notes = prepare(nb, _release())
    assert nb.cells[i].cell_type == "code" and nb.cells[i].outputs == []
    assert source_text(nb.cells[i].source) == source_text(test.source)
    assert (
        f"cell {ex.tests[0]}: the test cell was turned into markdown; restored from the release"
        in notes
    )


def test_an_edited_test_cell_gets_the_release_source_back():
    ex = _first_exercise()
    nb = pipeline.solved_notebook(A)
    cell = next(c for c in nb.cells if _gid(c) == ex.tests[0])
    released = source_text(cell.source)
    cell.source = "pass  # the student emptied the test"
    notes = prepare(nb, _release())
    assert source_text(cell.source) == released
    assert f"cell {ex.tests[0]}: the test cell was edited; restored from the release" in notes


def test_an_answer_cell_turned_into_markdown_runs_its_code():
    ex = _first_exercise()
    nb = pipeline.solved_notebook(A)
    i = next(i for i, c in enumerate(nb.cells) if _gid(c) == ex.answer)
    answer = nb.cells[i]
    nb.cells[i] = nbformat.v4.new_markdown_cell(answer.source, metadata=answer.metadata)
    notes = prepare(nb, _release())
    assert nb.cells[i].cell_type == "code"
    assert source_text(nb.cells[i].source) == source_text(answer.source)  # the student's code
    assert any(n.startswith(f"cell {ex.answer}: the answer cell was turned into") for n in notes)


def test_a_cell_the_release_does_not_have_is_not_graded():
    nb = pipeline.solved_notebook(A)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    claim = dict(test.metadata["nbgrader"], grade_id="bonus", points=100)
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": claim}))
    nb.cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True}}))
    notes = prepare(nb, _release())
    assert "nbgrader" not in nb.cells[-1].metadata and "nbgrader" not in nb.cells[-2].metadata
    assert [n for n in notes if "not a cell of the release" in n] == [
        "cell bonus: not a cell of the release, but marked as graded (100 points); ignored, its "
        "code ran ungraded",
        "cell (no id): not a cell of the release, but marked as graded (0 points); ignored, its "
        "code ran ungraded",
    ]
    ids = [_gid(c) for c in nb.cells if _gid(c)]
    assert ids == [_gid(c) for c in _release().cells if _gid(c)]


def _as_cleaned(nb, tmp_path: Path, ids: bool = True):
    """`nb` handed in through nb-clean's git filter (every cell's metadata gone), then read as
    the grader reads it; ids=False: and without cell ids (an older nbformat)."""
    path = _write(tmp_path / f"{A}.ipynb", nb, "nb-clean")
    raw = json.loads(path.read_text())
    assert not any(c.get("metadata") for c in raw["cells"])  # the real tool's work
    if not ids:
        for cell in raw["cells"]:
            cell.pop("id", None)
        raw["nbformat_minor"] = 4
        path.write_text(json.dumps(raw))
    return read_notebook(path)


@pytest.mark.parametrize("ids", [True, False], ids=["with-ids", "without-ids"])
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_metadata_a_tool_dropped_is_matched_back_to_the_release(assignment, ids, tmp_path):
    """Every graded and locked cell of the release gets its metadata back, on the cell the
    student has in its place: tests and instructions by id or text, answers by id or place,
    each answer keeping the student's code."""
    solved = pipeline.solved_notebook(assignment)
    release = _release(assignment)
    nb = _as_cleaned(solved, tmp_path, ids)
    notes = prepare(nb, release)
    want = [_gid(c) for c in release.cells if _gid(c)]
    assert [_gid(c) for c in nb.cells if _gid(c)] == want
    assert len(nb.cells) == len(solved.cells)  # nothing restored a second time
    answers = {_gid(c): source_text(c.source) for c in solved.cells if _gid(c)}
    for cell in nb.cells:
        if _gid(cell):
            assert source_text(cell.source) == answers[_gid(cell)], _gid(cell)
    assert any("had lost their nbgrader metadata" in n for n in notes), notes
    assert not any("locked cell was deleted" in n for n in notes), notes


def test_a_cleaned_notebook_with_an_extra_cell_keeps_the_answer_unmatched_not_guessed(tmp_path):
    """Two cells where the release has one answer, without ids: which one is the answer is a
    guess, so neither is made the answer cell; both run as ordinary code, and the tests after
    them still find their places by text."""
    ex = _first_exercise()
    solved = pipeline.solved_notebook(A)
    i = next(i for i, c in enumerate(solved.cells) if _gid(c) == ex.answer)
    solved.cells.insert(i, nbformat.v4.new_code_cell("scratch = 1  # the student's own cell"))
    nb = _as_cleaned(solved, tmp_path, ids=False)
    prepare(nb, _release())
    assert ex.answer not in [_gid(c) for c in nb.cells]
    k = next(k for k, c in enumerate(nb.cells) if _gid(c) == ex.tests[0])
    before = [source_text(c.source) for c in nb.cells[:k]]
    assert source_text(next(c for c in solved.cells if _gid(c) == ex.answer).source) in before


def test_a_cleaned_and_edited_test_cell_is_matched_by_id_and_restored(tmp_path):
    """Metadata dropped and a test cell emptied: the id finds it, and it is graded as released."""
    ex = _first_exercise()
    solved = pipeline.solved_notebook(A)
    cell = next(c for c in solved.cells if _gid(c) == ex.tests[0])
    released = source_text(cell.source)
    cell.source = "pass  # the student emptied the test"
    nb = _as_cleaned(solved, tmp_path)
    notes = prepare(nb, _release())
    (test,) = [c for c in nb.cells if _gid(c) == ex.tests[0]]
    assert source_text(test.source) == released
    assert f"cell {ex.tests[0]}: the test cell was edited; restored from the release" in notes


def test_untouched_means_no_code_of_the_students():
    release = _release()
    nb = copy.deepcopy(release)
    prepare(nb, release)
    assert is_untouched(nb, release)
    ran = copy.deepcopy(release)  # opened, run and saved: outputs do not count
    for cell in ran.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", text="x\n")]
    assert is_untouched(ran, release)
    mine = copy.deepcopy(release)
    mine.cells.append(nbformat.v4.new_code_cell("print('trying something')"))
    assert not is_untouched(mine, release)
    assert not is_untouched(pipeline.solved_notebook(A), release)


# ---------------------------------------------------------------------------------------------
# Student ids, and the newest of several uploads
# ---------------------------------------------------------------------------------------------

NAMES = [
    "alice",
    "José",
    "张伟",
    "Ana María",
    "Ana_María",
    "Ana-María",
    "a+b",
    "a b",
    "a_b",
    ".hidden",
    "x*y[1]?",
    "O'Brien, Seán",
    "Müller",
    "12345",
    "",
    "دانيال",
    "Ωmega",
]


def test_student_ids_keep_names_and_never_merge_two():
    ids = [student_id(n) for n in NAMES]
    assert len(set(ids)) == len(NAMES)  # two different names never share an id
    assert student_id("José") == "José" and student_id("张伟") == "张伟"
    assert student_id("alice") == "alice" and student_id("12345") == "12345"
    assert "unknown" not in ids
    for sid in ids:
        assert re.fullmatch(r"[\w.-]+", sid) and not sid.startswith((".", "-"))
        assert not set(sid) & set("*?[]+/\\ ")
    nfd = unicodedata.normalize("NFD", "José")
    assert nfd != "José" and student_id(nfd) == "José"  # the same name, as macOS spells it
    assert student_id("Ana María") == student_id("Ana María")  # stable across runs


def test_nbgrader_accepts_the_ids_as_student_and_folder(tmp_path):
    """nbgrader finds a submission by globbing the student id and parses it back by regex.

    (The gradebook takes the ids too: the graded class of tests/graders/test_grading.py has 张伟,
    José and Ana María.)
    """
    from nbgrader.coursedir import CourseDirectory

    for name in NAMES:
        sid = student_id(name)
        coursedir = CourseDirectory(root=str(tmp_path), student_id=sid, assignment_id=A)
        assert coursedir.student_id == sid
        folder = Path(coursedir.format_path("submitted", sid, A))
        folder.mkdir(parents=True)
        assert glob.glob(coursedir.format_path("submitted", sid, A)) == [str(folder)]
        pattern = coursedir.format_path(
            "submitted", "(?P<student_id>.*)", "(?P<assignment_id>.*)", escape=True
        )
        assert re.match(pattern, str(folder))["student_id"] == sid


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_of_several_uploads_the_newest_is_graded(tmp_path):
    nb = _release()
    folder = tmp_path / "submitted" / "José" / A
    for name, age in ((f"{A} (1).ipynb", 300), (f"{A}.ipynb", 200), (f"{A} (2).ipynb", 100)):
        _age(_write(folder / name, nb), age)
    (tmp_path / "submitted" / "José" / ".ipynb_checkpoints").mkdir()
    subs, problems = discover(tmp_path, ASSIGNMENTS)
    assert problems == []
    (sub,) = subs
    assert (sub.student, sub.name, sub.path.name) == ("José", "José", f"{A} (2).ipynb")
    assert sorted(p.name for p in sub.others) == [f"{A} (1).ipynb", f"{A}.ipynb"]
    results = [{"student": "José", "assignment": A, "problems": ["cell x: something"]}]
    attach_submission_info(results, subs)
    attach_submission_info(results, subs)  # again (a second run): the notes are not doubled
    assert results[0]["problems"] == [
        f"{OLDER_UPLOAD} {A}.ipynb (graded the newest upload, {A} (2).ipynb)",
        f"{OLDER_UPLOAD} {A} (1).ipynb (graded the newest upload, {A} (2).ipynb)",
        "cell x: something",
    ]
    assert results[0]["name"] == "José"


def test_a_scratch_notebook_beside_the_answer_is_skipped_and_named(tmp_path):
    folder = tmp_path / "submitted" / "agarcia" / A
    _age(_write(folder / f"{A}.ipynb", pipeline.solved_notebook(A)), 600)
    # saved later in the same folder: a new notebook, and a copy saved under another name
    _write(folder / "Untitled.ipynb", nbformat.v4.new_notebook())
    _write(
        folder / "scratch.ipynb", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    )
    (folder / "timestamp.txt").write_text("2026-12-04 10:00:00.000000 UTC")
    (folder / ".ipynb_checkpoints").mkdir()
    _write(folder / ".ipynb_checkpoints" / f"{A}-checkpoint.ipynb", _release())
    subs, problems = discover(tmp_path, ASSIGNMENTS)
    (sub,) = subs
    assert problems == [] and sub.path.name == f"{A}.ipynb" and sub.others == ()
    assert sorted(p.name for p in sub.ignored) == ["Untitled.ipynb", "scratch.ipynb"]
    results = [{"student": "agarcia", "assignment": A, "problems": []}]
    attach_submission_info(results, subs)
    assert [p.split(" (")[0] for p in results[0]["problems"]] == [
        f"{IGNORED_FILE} Untitled.ipynb",
        f"{IGNORED_FILE} scratch.ipynb",
    ]


def test_a_renamed_notebook_with_the_assignments_cells_is_graded(tmp_path):
    folder = tmp_path / "submitted" / "bchen" / A
    _write(folder / "my work.ipynb", pipeline.solved_notebook(A))
    _write(folder / "Untitled.ipynb", nbformat.v4.new_notebook())
    (sub,), problems = discover(tmp_path, ASSIGNMENTS)
    assert problems == [] and sub.path.name == "my work.ipynb"
    assert [p.name for p in sub.ignored] == ["Untitled.ipynb"]
    only_scratch = tmp_path / "other" / "submitted" / "cdiaz" / A
    _write(only_scratch / "Untitled.ipynb", nbformat.v4.new_notebook())
    subs, problems = discover(tmp_path / "other", ASSIGNMENTS)
    assert subs == []
    assert problems == [f"cdiaz/{A}: no notebook of the assignment, only Untitled.ipynb (skipped)"]


def test_flat_lms_export_is_understood(tmp_path):
    nb = _release()
    _age(_write(tmp_path / f"alice_{A}.ipynb", nb), 100)
    _write(tmp_path / f"alice_{A} (1).ipynb", nb)  # uploaded again: newer
    _write(tmp_path / f"{A}_José.ipynb", nb)
    _write(tmp_path / f"张伟-{A}-1.ipynb", nb)
    _write(tmp_path / f"Ana María_{A}.ipynb", nb)
    _write(tmp_path / f"Ana_María_{A}.ipynb", nb)
    _write(tmp_path / "notes.ipynb", nb)
    _write(tmp_path / f"{A}.ipynb", nb)
    subs, problems = discover(tmp_path, ASSIGNMENTS)
    got = {s.student: s for s in subs}
    assert set(got) == {"alice", "José", "张伟", student_id("Ana María"), "Ana_María"}
    assert got["alice"].path.name == f"alice_{A} (1).ipynb"
    assert [p.name for p in got["alice"].others] == [f"alice_{A}.ipynb"]
    assert any("notes.ipynb" in p for p in problems)
    assert any(f"{A}.ipynb: no student name" in p for p in problems)
    subs, _ = discover(tmp_path, ASSIGNMENTS, assignment=A)
    assert {s.student for s in subs} >= {"alice", "notes"}


# ---------------------------------------------------------------------------------------------
# One-line causes, and a feedback page and a results file for every status
# ---------------------------------------------------------------------------------------------

SCHEMA_LOG = """[INFO] Sanitizing /tmp/x/submitted/s/01/01.ipynb
[ERROR] One or more notebooks in the assignment use an old version
    of the nbgrader metadata format. Please **back up your class files
    directory** and then update the metadata using:

    nbgrader update .

Traceback (most recent call last):
  File "/v/lib/python3.11/site-packages/nbgrader/converters/base.py", line 468, in convert
    raise NbGraderException(msg)
nbgrader.converters.base.NbGraderException: Please see the the above traceback for details
"""

KEYERROR_LOG = """[ERROR] There was an error processing assignment: /tmp/x
    Traceback (most recent call last):
      File "/v/lib/python3.11/site-packages/nbgrader/preprocessors/deduplicateids.py", line 33, in p
        grade_id = cell.metadata.nbgrader['grade_id']
    KeyError: 'grade_id'
[ERROR] Please see the the above traceback for details on the specific errors on the above failures.
"""


def test_a_log_is_told_in_one_line_naming_the_cause():
    assert cause_line(SCHEMA_LOG).startswith(
        "One or more notebooks in the assignment use an old version of the nbgrader metadata"
    )
    assert cause_line(KEYERROR_LOG) == (
        "KeyError: 'grade_id' (in nbgrader/preprocessors/deduplicateids.py, line 33)"
    )
    tail = (
        "the grader itself failed:     line for line in cell.source.splitlines()\n"
        "                     ^^^^^^^^^^^^^^^^^^^^^^\n"
        "AttributeError: 'list' object has no attribute 'splitlines'"
    )
    assert one_line(tail) == (
        "the grader itself failed: AttributeError: 'list' object has no attribute 'splitlines'"
    )
    assert one_line("cell x: already one line") == "cell x: already one line"
    assert "\n" not in cause_line("a\nb\n\nc")


STATUSES = {
    "graded": ["cell x: very long output, cut in the feedback"],
    "invalid-notebook": ["not a notebook Jupyter can open: the file is not JSON (line 1)"],
    "autograde-failed": [f"nbgrader autograde failed: {KEYERROR_LOG}"],
    "grader-error": ["the grader itself failed: Traceback\n  File x\nMemoryError: boom"],
    "timeout": ["grading took longer than 900 s and was stopped"],
}


def test_every_status_gets_a_feedback_page_and_a_results_file(tmp_path):
    results = [
        {
            "student": f"s-{status}",
            "assignment": A,
            "status": status,
            "score": 0.0,
            "max_score": 12.0,
            "cells": {"t": {"score": 0.0, "max_score": 2.0, "error": "KeyError: 'x'"}},
            "problems": list(problems),
        }
        for status, problems in STATUSES.items()
    ]
    finalize(results, tmp_path)
    for res in results:
        assert all("\n" not in p for p in res["problems"]), res["problems"]
        page = (tmp_path / res["feedback"]).read_text(encoding="utf-8")
        assert res["status"] in page and html.escape(res["problems"][0]) in page
        saved = json.loads((tmp_path / "results" / res["student"] / f"{A}.json").read_text())
        assert saved == res
    by = {r["status"]: r for r in results}
    assert by["grader-error"]["problems"] == ["the grader itself failed: MemoryError: boom"]
    assert by["autograde-failed"]["problems"] == [
        "nbgrader autograde failed: KeyError: 'grade_id' (in "
        "nbgrader/preprocessors/deduplicateids.py, line 33)"
    ]
    assert "not a score" in fallback_feedback(by["grader-error"])


def test_an_existing_nbgrader_feedback_page_is_kept(tmp_path):
    page = tmp_path / "feedback" / "s" / f"{A}.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>nbgrader's</html>")
    res = {"student": "s", "assignment": A, "status": "graded", "score": 1.0, "max_score": 1.0}
    res |= {"cells": {}, "problems": [], "feedback": f"feedback/s/{A}.html"}
    finalize([res], tmp_path)
    assert page.read_text() == "<html>nbgrader's</html>"


# ---------------------------------------------------------------------------------------------
# Similar answers
# ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(similarity.available() is not None, reason="copydetect not installed")
def test_near_copies_and_copies_of_the_course_code_are_found(tmp_path):
    solved = pipeline.solved_notebook(A)
    ex = _first_exercise()
    renamed = copy.deepcopy(solved)  # the same code with other names and comments
    cell = next(c for c in renamed.cells if _gid(c) == ex.answer)
    cell.source = re.sub(r"\bblock\b", "chunk", cell.source).replace("#", "# my note:")
    own = _release()  # the stubs only, and one answer of the course's own code
    softmax = Path(pipeline.REPO / "course_utils" / "references" / "softmax.py").read_text()
    body = softmax[softmax.index("def ") :][:1500]
    next(c for c in own.cells if _gid(c) == ex.answer).source = body
    files = {"a": solved, "b": renamed, "c": _release(), "d": own}
    results = [
        {"student": s, "assignment": A, "status": "graded", "source": str(tmp_path / f"{s}.ipynb")}
        for s in files
    ]
    for s, nb in files.items():
        _write(tmp_path / f"{s}.ipynb", nb)
    pairs = similarity.similar_pairs(results)
    found = {(p.student, p.other) for p in pairs}
    assert ("a", "b") in found  # renaming and comments do not hide a copy
    assert ("a", "reference: solutions") in found and ("b", "reference: solutions") in found
    assert ("d", "reference: course_utils/references/softmax.py") in found
    assert not any("c" in (p.student, p.other) for p in pairs)  # untouched stubs are not code
    assert all(p.share >= similarity.THRESHOLD for p in pairs)
    assert similarity.similar_pairs(results, threshold=1.01) == []


@pytest.mark.skipif(similarity.available() is not None, reason="copydetect not installed")
def test_a_reference_made_once_without_boilerplate_gives_the_same_shares():
    """similar_pairs fingerprints each reference once per run, without the assignment's
    boilerplate: a student's share against it is the share against the filtered one."""
    release = similarity.answer_code(_release())
    stub = similarity._fingerprint(release)
    boilerplate = np.unique(np.array(list(stub.hashes), dtype=np.int64))
    refs = similarity.reference_sources(A)
    solved = similarity.answer_code(pipeline.solved_notebook(A))
    softmax = Path(pipeline.REPO / "course_utils" / "references" / "softmax.py").read_text()
    answers = [solved, release + "\n\n" + softmax[softmax.index("def ") :][:1500]]
    for code in answers:
        fp = similarity._fingerprint(code, boilerplate)
        for text in refs.values():
            filtered = similarity._fingerprint(text, boilerplate)
            once = similarity._reference_fingerprint(text)
            assert similarity._shares(fp, once)[0] == similarity._shares(fp, filtered)[0]
    hits = similarity._reference_fingerprint.cache_info().hits
    similarity._reference_fingerprint(refs["solutions"])
    assert similarity._reference_fingerprint.cache_info().hits == hits + 1


def _course_functions(min_lines: int = 12) -> list[str]:
    """Distinct code to stand for independent answers: the course package's own functions."""
    import ast

    out = []
    for path in sorted((pipeline.REPO / "course_utils").rglob("*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= min_lines:
                out.append(ast.get_source_segment(text, node))
    return out


@pytest.mark.skipif(similarity.available() is not None, reason="copydetect not installed")
def test_the_pair_index_finds_what_comparing_every_pair_finds(monkeypatch):
    """candidate_pairs leaves out no pair that the full comparison lists, with the common-hash
    cap in force (lowered so that a class of 60 uses it), and compares far fewer pairs."""
    monkeypatch.setattr(similarity, "COMMON_MIN", 3)
    monkeypatch.setattr(similarity, "COMMON_SHARE", 0.0)
    bodies = _course_functions()[:50]
    answers = {f"s{i:03d}": code for i, code in enumerate(bodies)}
    for i in range(0, 40, 4):  # ten near-copies: other names, other comments
        twin = re.sub(r"\b(out|lse|q|k|v|x|result|value)\b", "renamed", bodies[i])
        answers[f"t{i:03d}"] = twin.replace("#", "# mine:")
    answers["u000"] = answers["u001"] = answers["u002"] = bodies[45]  # three identical answers
    prints = {s: similarity._fingerprint(code) for s, code in answers.items()}
    prints = {s: fp for s, fp in prints.items() if fp.token_coverage >= similarity.MIN_TOKENS}
    everyone = [
        (a, b)
        for a, b in combinations(sorted(prints), 2)
        if min(similarity._shares(prints[a], prints[b])) >= similarity.THRESHOLD
    ]
    assert len(everyone) >= 10  # the test has copies to find
    groups = similarity.same_code_groups(prints)
    firsts = {members[0]: prints[members[0]] for members in groups.values()}
    found = set(similarity.candidate_pairs(firsts, similarity.THRESHOLD))
    found |= {pair for m in groups.values() for pair in combinations(m, 2)}  # a group's pairs
    assert set(everyone) <= found
    assert {("s045", "u000"), ("s045", "u001"), ("s045", "u002")} <= found  # four held the code
    assert len(found) < 0.1 * len(prints) * (len(prints) - 1) / 2


# ---------------------------------------------------------------------------------------------
# The bank's named mistakes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, name, ex, code",
    [pytest.param(a, *m, id=f"{a}:{m[0]}") for a in ASSIGNMENTS for m in bank.mistakes(a)],
)
def test_every_bank_mistake_is_plain_code_its_check_names(assignment, name, ex, code):
    """The answer the bank submits for a named mistake, run here as a learner's cell."""
    import ast
    import contextlib
    import io
    import linecache

    from course_utils.checks import CheckFailure
    from course_utils.checks.engine.failures import misconception_slug

    assert "course_utils" not in code  # the kernel cannot see course_utils while graded
    solved = pipeline.solved_notebook(assignment)
    test = next(c for c in solved.cells if _gid(c) == ex.tests[0]).source
    namespace = {"__name__": "__main__"}
    # the imports the notebook's cells make (triton_attention first: the interpreter before
    # triton), and the cell registered in linecache as Jupyter does, so @triton.jit can read it
    imports = ["import math", "import numpy as np"]
    for cell in solved.cells:
        if cell.cell_type != "code" or _gid(cell) == ex.tests[0]:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics
            continue
        imports += [
            ast.unparse(node)
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom) and "checks" not in ast.unparse(node)
        ]
    if any("triton" in line for line in imports):
        imports.insert(0, "import course_utils.triton_attention")
    # the notebook's other answers (an exercise may call an earlier one), then this one
    answers = [
        c.source
        for c in solved.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    ]
    source = "\n".join([*dict.fromkeys(imports), *answers, code]) + "\n"
    filename = f"<answer {assignment} {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    with pytest.raises(CheckFailure) as info, contextlib.redirect_stdout(io.StringIO()):
        exec(test.split("### BEGIN HIDDEN TESTS")[0], namespace)
    assert misconception_slug(str(info.value)) == name.split(":")[1], str(info.value)
