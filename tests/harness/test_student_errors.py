"""What a student sees when an answer is not written yet, or a check fails: one line, no frames."""

from __future__ import annotations

import nbformat
import pytest
from fixtures import kernels

from graders.run import pipeline

pytestmark = pytest.mark.notebooks

CELLS = [
    "import course_utils",
    "def online_softmax_stats(x, block):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
    "online_softmax_stats([1.0], 1)",
    "# Set answer_rescale to your number\n# YOUR CODE HERE\nraise NotImplementedError()",
    "from course_utils.checks.online_softmax import check_quick_rescale\ncheck_quick_rescale(2.0)",
    "raise NotImplementedError('a message of my own')",
    "check_quick_rescale(answer_never_set)",
    "print(undefined_name)",
    "import numpy as np\nnp.zeros(3).reshape(5)",
]


def _errors(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in cells]
    kernels.notebook_client(nb, allow_errors=True, timeout=60).execute()
    return [next((o for o in c.outputs if o.output_type == "error"), None) for c in nb.cells]


def test_stub_and_check_failures_are_one_message_and_other_errors_keep_their_traceback():
    err = _errors(CELLS)
    assert err[0] is None and err[1] is None
    stub = err[2]
    assert stub.ename == "NotImplementedError" and len(stub.traceback) == 1
    assert stub.traceback[0].startswith("✗ online_softmax_stats is not written yet")
    answer = err[3]
    assert len(answer.traceback) == 1 and "this answer is not written yet" in answer.traceback[0]
    check = err[4]
    assert check.ename == "CheckFailure"
    assert check.traceback[0].startswith("✗ rescale factor: 2 is not right")
    assert not any("engine" in line for line in check.traceback)
    # a NotImplementedError with a message, and any other error, keep IPython's traceback
    assert len(err[5].traceback) > 1 and "a message of my own" in "".join(err[5].traceback)
    unset = err[6]
    assert unset.ename == "NameError" and len(unset.traceback) == 1
    assert unset.traceback[0].startswith("✗ answer_never_set is not set yet")
    assert len(err[7].traceback) > 1  # a NameError of another name: the usual traceback
    assert err[8].ename == "ValueError" and len(err[8].traceback) > 1


def test_validate_of_an_untouched_notebook_names_the_function(tmp_path):
    """nbgrader's Validate (what the student's toolbar button runs) on the released notebook."""
    from nbgrader.validator import Validator

    path = pipeline.REPO / "notebooks" / "01_online_softmax" / "01_online_softmax.ipynb"
    results = Validator().validate(str(path))
    failed = results.get("failed", [])
    assert failed, results
    text = "\n".join(f.get("error", "") for f in failed)
    assert "online_softmax_stats is not written yet" in text, text
    assert "answer_rescale is not set yet" in text, text
    assert "checks/engine" not in text and "Traceback" not in text


# ---- issue 39: cells after an exercise stop with one line naming it ------------------------------
def test_uses_exercises_turns_any_error_into_one_line_naming_the_exercise():
    from course_utils.harness.counting_memory import ThreadBlockError
    from course_utils.student_errors import ExerciseNotReady, NotWrittenError, uses_exercises

    causes = [
        NotImplementedError(),
        NotWrittenError("count_flash_forward"),
        NameError("name 't_std' is not defined"),
        AssertionError(),
        ThreadBlockError(
            "a K tile is loaded while no Q tile is on chip\nmore", "stream-without-tile"
        ),
    ]
    for cause in causes:
        with pytest.raises(ExerciseNotReady) as info:
            with uses_exercises("exercise 2 (count_flash_forward)"):
                raise cause
        lines = info.value._render_traceback_()
        assert len(lines) == 1 and lines[0].startswith("✗ this cell uses exercise 2")
        assert "\n" not in lines[0]
    with pytest.raises(ValueError, match="exercises"):
        with uses_exercises():
            pass


def _run_student(assignment, replace=None):
    path = pipeline.REPO / "notebooks" / assignment / f"{assignment}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for grade_id, source in (replace or {}).items():
        cell = next(
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
        )
        cell.source = source
    path_meta = {"metadata": {"path": str(path.parent)}}
    kernels.notebook_client(nb, allow_errors=True, timeout=120, resources=path_meta).execute()
    return nb


def _error(cell):
    return next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)


def test_04_demo_cells_after_a_wrong_or_unfinished_exercise_say_so_in_one_line():
    """Issue 39: cell 55 (NameError t_std or a bare AssertionError), cells 30 and 70 (a
    ThreadBlockError traceback through course_utils/harness/counting_memory.py)."""
    wrong = {
        "standard_attention_traffic": "def standard_attention_traffic(N, d):\n    return 4 * N * N",
        "count_flash_forward": (
            "def count_flash_forward(mem, N, d, Br, Bc):\n"
            "    for j0 in range(0, N, Bc):\n"
            "        mem.load('K', (j0, j0 + Bc))\n"
        ),
    }
    for nb in (_run_student("04_hbm_traffic"), _run_student("04_hbm_traffic", wrong)):
        for index in (30, 55, 70):
            err = _error(nb.cells[index])
            assert err is not None, index
            assert len(err.traceback) == 1, (index, err.traceback)
            assert err.traceback[0].startswith("✗ this cell uses exercise"), err.traceback


def test_05_try_it_after_exercise_2_does_not_fail_on_a_missing_cache():
    """Issue 39: cell 19 called the learner's function before it defined q10, K10, V10."""
    nb = _run_student("05_split_kv")
    err = _error(nb.cells[24])
    assert err is not None and len(err.traceback) == 1
    assert "not written yet" in err.traceback[0] and "q10" not in err.traceback[0]
