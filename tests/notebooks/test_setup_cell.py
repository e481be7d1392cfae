"""The Colab setup cell: when the course package cannot be installed, one line says what to do."""

from __future__ import annotations

import nbformat
import pytest
from fixtures import kernels

from graders.authoring import authoring

pytestmark = pytest.mark.notebooks


def test_failed_install_is_one_line_that_names_the_url_and_the_fix(tmp_path):
    bad = "file://" + str(tmp_path / "no-such-repository")
    source = authoring.SETUP_SOURCE.replace(authoring.REPO_URL, bad)
    assert bad in source
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import sys\nsys.modules['course_utils'] = None  # not installed"
        ),
        nbformat.v4.new_code_cell(source),
    ]
    kernels.notebook_client(nb, allow_errors=True, timeout=120).execute()
    outputs = nb.cells[1].outputs
    errors = [o for o in outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "CourseSetupError", outputs
    (line,) = errors[0].traceback
    assert line.startswith("✗ The course package could not be installed from " + bad)
    assert "network" in line and "course.toml" in line
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"]


def test_setup_cell_does_nothing_when_the_package_is_there():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(authoring.SETUP_SOURCE)]
    kernels.notebook_client(nb, timeout=60).execute()
    assert nb.cells[0].outputs == []
