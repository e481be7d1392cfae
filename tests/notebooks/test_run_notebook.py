"""benchmarks/run_notebook.py: a notebook's code cells run in order, the first error stops."""

from __future__ import annotations

import nbformat
import pytest

from benchmarks import run_notebook


def _write(tmp_path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")] + [
        nbformat.v4.new_code_cell(s) for s in sources
    ]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)  # as Jupyter saves it: sources as lists of lines
    return path


def test_cells_share_one_namespace_in_order(tmp_path, capsys):
    path = _write(tmp_path, "x = 2\ny = 3", "print('sum', x + y)")
    assert run_notebook.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "sum 5" in out and "2 code cells ran" in out


def test_the_first_error_stops_the_run_and_names_the_cell(tmp_path, capsys):
    path = _write(tmp_path, "x = 1", "raise ValueError('boom')", "print('never')")
    assert run_notebook.main([str(path)]) == 1
    captured = capsys.readouterr()
    assert "code cell 1 of 3 raised" in captured.out and "never" not in captured.out
    assert "ValueError: boom" in captured.err


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="usage"):
        run_notebook.main([str(tmp_path / "none.ipynb")])
