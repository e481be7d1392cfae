"""benchmarks/grading.py: which notebooks a benchmark grades (--notebooks), a run that did not grade
is never timed, and --compare-threads runs both ways in turn."""

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


def _stub_grading(monkeypatch, grades):
    """compare_threads with the class and `python -m graders grade` replaced: each run records the
    thread variables it was given and writes the next of `grades` as its grades.csv."""
    from graders.run.threads import THREAD_VARIABLES

    calls = []

    def graders(submitted, dest, jobs, env=None):
        calls.append({k: env[k] for k in THREAD_VARIABLES if k in env})
        dest.mkdir(parents=True)
        (dest / "grades.csv").write_text(grades[len(calls) - 1], encoding="utf-8")
        return 1.0, ""

    monkeypatch.setattr(grading, "make_class", lambda folder, students, assignments: None)
    monkeypatch.setattr(grading, "_graders", graders)
    monkeypatch.setattr(grading, "_refuse_failed", lambda dest, what: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the caller's setting: neither run keeps it
    return calls


def test_compare_threads_runs_both_ways_in_turn(tmp_path, monkeypatch, capsys):
    """--compare-threads: "share" runs with no thread variable (the grader's share decides),
    "cores" with all three at the core count; first of each pair in turn; the medians printed."""
    from graders.run.threads import THREAD_VARIABLES, thread_share

    calls = _stub_grading(monkeypatch, ["s,1\n"] * 4)
    assert grading.compare_threads(2, 2, 2, str(tmp_path), ["01_online_softmax"]) == 0
    every = dict.fromkeys(THREAD_VARIABLES, str(thread_share(1)))
    assert calls == [{}, every, every, {}], calls
    assert "median: share 1.0 s, cores 1.0 s" in capsys.readouterr().out


def test_compare_threads_refuses_two_ways_that_grade_differently(tmp_path, monkeypatch):
    _stub_grading(monkeypatch, ["s,1\n", "s,0\n"])
    with pytest.raises(SystemExit, match="different grades.csv"):
        grading.compare_threads(1, 2, 2, str(tmp_path), ["01_online_softmax"])
