"""source/*.md, the notebooks as text, is the source: solutions/ and notebooks/ are built from it
byte for byte (graders/notebook_text.py), and course.toml's repository reaches every setup cell
and Colab badge."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import nbformat
import pytest

from graders import authoring, notebook_text, pipeline, settings

REPO = pipeline.REPO
SOURCE = REPO / notebook_text.SOURCE
ASSIGNMENTS = pipeline.assignments()
FORK = "https://github.com/someone-else/their-fork"


def _nb(root: Path, folder: str, assignment: str) -> Path:
    return root / folder / assignment / f"{assignment}.ipynb"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A course directory built from source/ alone: solutions/, then notebooks/ (nbgrader)."""
    root = tmp_path_factory.mktemp("fresh")
    (root / "notebooks").mkdir()
    notebook_text.build(root, source=SOURCE)
    pipeline.release(root)
    return root


def test_every_solution_has_its_text():
    texts = [p.stem for p in notebook_text.source_files(SOURCE)]
    assert texts == ASSIGNMENTS, (
        f"source/ holds {texts}, solutions/ {ASSIGNMENTS}: each solutions/NN/NN.ipynb is built "
        "from source/NN.md (`python -m graders import-notebook` makes one from a notebook)"
    )


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_committed_notebook_is_a_fresh_build(fresh, folder, assignment):
    committed, built = _nb(REPO, folder, assignment), _nb(fresh, folder, assignment)
    assert committed.read_bytes() == built.read_bytes(), (
        f"{committed.relative_to(REPO)} is not what source/{assignment}.md builds: edit "
        f"source/{assignment}.md (never the .ipynb), then run `python -m graders release` "
        "and commit solutions/ and notebooks/"
    )


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_text_form_is_lossless(assignment, tmp_path):
    """Notebook -> text -> notebook gives the same bytes: import-notebook can be run again on a
    notebook edited in Jupyter (its own check) and builds back the committed file."""
    out = notebook_text.import_notebook(_nb(REPO, "solutions", assignment), tmp_path / "source")
    notebook_text.build(tmp_path, [assignment], source=tmp_path / "source")
    assert _nb(tmp_path, "solutions", assignment).read_bytes() == (
        _nb(REPO, "solutions", assignment).read_bytes()
    ), f"{out.name} does not build back to solutions/{assignment}"


def _diff(a: str, b: str) -> list[str]:
    lines = difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
    return [x for x in lines if x[:1] in "+-" and not x.startswith(("+++", "---"))]


def test_one_line_prose_edit_is_one_line_of_the_notebook(tmp_path):
    assignment = "02_merge_partials"
    text = (SOURCE / f"{assignment}.md").read_text(encoding="utf-8")
    old = "exactly, with one extra number per row: the **logsumexp** (lse)."
    assert text.count(old) == 1
    (tmp_path / "source").mkdir()
    edited = text.replace(old, "exactly, with one more number per row: the **logsumexp** (lse).")
    (tmp_path / "source" / f"{assignment}.md").write_text(edited, encoding="utf-8")
    assert len(_diff(text, edited)) == 2
    notebook_text.build(tmp_path, source=tmp_path / "source")
    committed = _nb(REPO, "solutions", assignment).read_text(encoding="utf-8")
    changed = _diff(committed, _nb(tmp_path, "solutions", assignment).read_text(encoding="utf-8"))
    assert len(changed) == 2, "\n".join(changed)  # the line removed, the line added
    assert "one more number per row" in changed[1]


def test_repository_in_course_toml_reaches_every_setup_cell_and_badge(tmp_path):
    toml = (REPO / "course.toml").read_text(encoding="utf-8")
    assert toml.count(authoring.REPO_URL) == 1
    (tmp_path / "course.toml").write_text(toml.replace(authoring.REPO_URL, FORK), "utf-8")
    shutil.copyfile(REPO / "README.md", tmp_path / "README.md")
    (tmp_path / "notebooks").mkdir()
    notebook_text.release(tmp_path, source=SOURCE)

    fork = settings.load(tmp_path / "course.toml")
    assert fork.repository == FORK
    for assignment in ASSIGNMENTS:
        for folder in ("solutions", "notebooks"):
            nb = nbformat.read(_nb(tmp_path, folder, assignment), as_version=4)
            setup = nb.cells[0].source
            assert setup == authoring.setup_source(assignment, FORK), f"{folder}/{assignment}"
            assert f'_url = "{FORK}"' in setup and authoring.REPO_URL not in setup
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    for assignment in ASSIGNMENTS:
        assert authoring.colab_link(assignment, fork.colab_url) in readme, assignment
    assert authoring.COLAB_URL not in readme


def test_a_cell_without_an_id_or_with_a_taken_one_is_named(tmp_path):
    head = "---\nkernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n"
    no_id = head + "\n```{code-cell}\nx = 1\n```\n"
    with pytest.raises(notebook_text.NotebookTextError, match="cell 0 has no id"):
        notebook_text.from_text(no_id, "99_x")
    twice = head + '\n+++ {"id": "a"}\n\nprose\n\n```{code-cell}\n:id: a\n\nx = 1\n```\n'
    with pytest.raises(notebook_text.NotebookTextError, match="share the id 'a'"):
        notebook_text.from_text(twice, "99_x")
    no_points = head + "\n```{code-cell}\n:tests: x_tests\n\nassert x\n```\n"
    with pytest.raises(notebook_text.NotebookTextError, match="points"):
        notebook_text.from_text(no_points, "99_x")


def test_short_options_become_nbgrader_metadata():
    head = "---\nkernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n"
    text = head + (
        "\n```{code-cell}\n:solution: f\n\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n"
        "    ### END SOLUTION\n```\n\n```{code-cell}\n:tests: f_tests\n:points: 2\n\n"
        "assert f() == 1\n```\n"
    )
    nb = notebook_text.from_text(text, "99_x")
    solution, tests = nb.cells
    assert solution.id == "f" and tests.id == "f-tests"
    assert solution.metadata == authoring.solution("", grade_id="f").metadata
    assert tests.metadata == authoring.tests("", grade_id="f_tests", points=2).metadata


def test_settings_reach_nbgrader_and_the_hub():
    from hub import launch

    course = settings.load()
    assert pipeline.load_config(REPO, db_url="none").CourseDirectory.course_id == course.course_id
    assert launch.COURSE_ID == course.course_id
    with pytest.raises(settings.SettingsError, match="github.com/OWNER/NAME"):
        settings.parse('[course]\nname = "x"\nid = "x"\nrepository = "https://example.org/x"\n')
    with pytest.raises(settings.SettingsError, match="timeout"):
        settings.parse(
            '[course]\nname = "x"\nid = "x"\nrepository = "https://github.com/a/b"\n'
            '[grader]\ntimeout = "long"\n'
        )


def test_grade_command_defaults_come_from_course_toml(capsys):
    from graders.__main__ import main

    course = settings.load()
    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(course.toml: {course.timeout})" in help_text
    assert f"(course.toml: {course.memory_gb:g})" in help_text
