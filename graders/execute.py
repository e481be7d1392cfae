"""An nbgrader Execute step that survives a submission that kills its kernel.

nbgrader's own Execute gives up on the whole notebook when the kernel dies (os._exit, a segfault,
the out-of-memory killer): the student gets nothing, not even for the exercises before. Here the
cell that killed the kernel gets an error output, and every later code cell gets one too (its
state is gone), so the test cells that ran before keep their points and the later ones score 0.
"""

from __future__ import annotations

from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

KERNEL_DIED = "KernelDied"


def _error(evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=KERNEL_DIED, evalue=evalue, traceback=[evalue])


class SurvivingExecute(Execute):
    """Execute, but a dead kernel fails the cells from there on instead of the whole notebook."""

    _died_at: int | None = None

    def preprocess(self, nb, resources=None, km=None):
        self._died_at = None
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self._died_at is not None:
            cell.outputs = [_error(f"not run: the kernel died in cell {self._died_at}")]
            return cell, resources
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._died_at = index
            cell.outputs.append(
                _error(
                    "the Python kernel died while running this cell (os._exit, a crash, or too "
                    "much memory); the cells after it were not run"
                )
            )
            return cell, resources
