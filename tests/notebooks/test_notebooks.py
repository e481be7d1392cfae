"""Every notebook: generated from its solution by nbgrader, executed end to end in a plain kernel.

Each solution's run top to bottom (its time limit, and its graded cells' pass lines with nothing
on stderr: fixtures.ran) is checked once per test run: here with nbclient where no browser is
installed, else on the file the browser test saves after its Run All in JupyterLab
(tests/browser/test_browser.py), which runs each solution anyway.

Autograding every notebook (nbgrader autograde through the course's grader: the full solution
scores every point, the release handed back untouched scores 0, exactly) is asserted by the
graded class of tests/graders/test_grading.py, which grades both for each notebook in the same run;
it is not graded a second time here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest
from fixtures import kernels, ran
from nbclient.exceptions import CellExecutionError

from graders.authoring import authoring
from graders.run import pipeline

REPO = pipeline.REPO
ASSIGNMENTS = pipeline.assignments()

pytestmark = pytest.mark.notebooks


def _path(folder: str, assignment: str) -> Path:
    return REPO / folder / assignment / f"{assignment}.ipynb"


def _limit(path: Path) -> int:
    return ran.limit(path.stem)


def _execute(path: Path, allow_errors: bool = False):
    nb = nbformat.read(path, as_version=4)
    client = kernels.notebook_client(
        nb,
        timeout=_limit(path),
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - start


def _grade_cells(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def test_there_are_notebooks():
    assert ASSIGNMENTS, "no solutions/NN_topic/NN_topic.ipynb found"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_is_generated_from_solution(assignment, tmp_path):
    released = pipeline.release_into(tmp_path, only=[assignment])
    fresh = json.loads((released / assignment / f"{assignment}.ipynb").read_text())
    committed_path = _path("notebooks", assignment)
    assert committed_path.exists(), f"run `python -m graders release` to create {committed_path}"
    committed = json.loads(committed_path.read_text())
    assert committed == fresh, (
        f"notebooks/{assignment} differs from what nbgrader generates from solutions/: "
        "never edit student notebooks by hand; run `python -m graders release`"
    )


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_committed_without_outputs_and_with_setup_cell(folder, assignment):
    nb = nbformat.read(_path(folder, assignment), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"outputs in {cell.id}"
    assert nb.cells[0].source == authoring.setup_source(assignment), (
        "the first cell must be the Colab setup cell from graders/authoring/authoring.py "
        "(run `python -m graders sync-setup`)"
    )


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_readme_has_colab_badge(assignment):
    readme = (REPO / "README.md").read_text()
    link = f"{authoring.COLAB_URL}/blob/main/notebooks/{assignment}/{assignment}.ipynb"
    assert link in readme, f"README.md needs an 'Open in Colab' badge linking {link}"


@pytest.mark.skipif(
    ran.IN_THE_BROWSER, reason="run by tests/browser/test_browser.py's Run All (fixtures.ran)"
)
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_runs_top_to_bottom_quietly(assignment):
    nb, seconds = _execute(_path("solutions", assignment))
    ran.assert_ran_quietly(nb, assignment, seconds)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_stops_at_first_exercise(assignment):
    path = _path("notebooks", assignment)
    nb = nbformat.read(path, as_version=4)
    client = kernels.notebook_client(
        nb,
        timeout=_limit(path),
        resources={"metadata": {"path": str(path.parent)}},
    )
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    # NotWrittenError: the course's NotImplementedError that shows as one line (student_errors)
    assert info.value.ename in ("NotImplementedError", "NotWrittenError"), (
        f"the untouched student notebook failed with {info.value.ename} instead of "
        f"NotImplementedError:\n{info.value}"
    )
    failed = next(
        i
        for i, c in enumerate(nb.cells)
        if any(o.get("output_type") == "error" for o in c.get("outputs", []))
    )
    first_answer = next(
        i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution")
    )
    first_test = nb.cells.index(_grade_cells(nb)[0])
    assert first_answer < failed <= first_test, (
        "the untouched notebook must stop between the first exercise and its check, "
        f"not at cell {nb.cells[failed].get('id')!r}"
    )
