"""What a student sees when an answer is not written yet, or a check fails: one line, no frames."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from graders import pipeline

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
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=60).execute()
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
    assert not any("_core.py" in line for line in check.traceback)
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
    assert "_core.py" not in text and "Traceback" not in text
