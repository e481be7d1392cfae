"""benchmarks/grading.py: which notebooks a benchmark grades (--notebooks)."""

import pytest

from benchmarks import grading
from graders.run import pipeline


def test_select_ranges_and_lists_by_leading_number():
    every = pipeline.assignments()
    assert grading.select(None) == every
    first_seven = grading.select("01-07")
    assert [a[:2] for a in first_seven] == ["01", "02", "03", "04", "05", "06", "07"]
    assert [a[:2] for a in grading.select("1,3,5-6")] == ["01", "03", "05", "06"]


@pytest.mark.parametrize("spec", ["seven", "01-x", "98-99"])
def test_select_names_a_bad_list(spec):
    with pytest.raises(SystemExit, match="--notebooks"):
        grading.select(spec)


@pytest.mark.notebooks
def test_a_run_that_did_not_grade_is_never_timed(tmp_path):
    """A timed run whose notebooks were not graded (here one file that is not a notebook, beside
    a release handed back unchanged) stops the benchmark, naming the student and the cause."""
    import shutil

    from graders.grade import grade

    a = "01_online_softmax"
    release = pipeline.REPO / "notebooks" / a / f"{a}.ipynb"
    for student in ("ana", "bo"):
        (tmp_path / "submitted" / student / a).mkdir(parents=True)
    shutil.copyfile(release, tmp_path / "submitted" / "ana" / a / f"{a}.ipynb")
    (tmp_path / "submitted" / "bo" / a / f"{a}.ipynb").write_text("not a notebook")
    grade(tmp_path / "submitted", tmp_path / "graded", jobs=1, progress=False, sandbox=False)
    with pytest.raises(SystemExit, match="the class: bo was not graded: "):
        grading._refuse_failed(tmp_path / "graded", "the class")
    (tmp_path / "graded" / "results" / "bo" / f"{a}.json").unlink()
    grading._refuse_failed(tmp_path / "graded", "the class")  # an untouched release is graded


@pytest.mark.notebooks
def test_the_plain_nbgrader_course_takes_the_courses_config(tmp_path):
    """--versus-nbgrader's course for plain nbgrader: its nbgrader_config.py loads the course's
    (which reads course.toml beside the repository, so a copy of it elsewhere fails), and
    `nbgrader generate_assignment` releases the notebook there."""
    import json

    a = "01_online_softmax"
    (tmp_path / "class" / "ana" / a).mkdir(parents=True)
    root = grading._plain_course(tmp_path / "plain", [a], tmp_path / "class")
    released = json.loads((root / "notebooks" / a / f"{a}.ipynb").read_text(encoding="utf-8"))
    shipped = json.loads((pipeline.REPO / "notebooks" / a / f"{a}.ipynb").read_text("utf-8"))
    assert [c["source"] for c in released["cells"]] == [c["source"] for c in shipped["cells"]]
