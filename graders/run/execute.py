"""An nbgrader Execute step that grades what the student wrote, whatever the kernel goes through.

nbgrader's own Execute gives up on the whole notebook when the kernel dies (os._exit, a segfault,
the out-of-memory killer) or when a cell runs past the time limit and ignores the interrupt (a
`signal.signal(SIGINT, SIG_IGN)`, or a loop that catches KeyboardInterrupt): the student gets
nothing, not even for the exercises before. Here that cell gets an error output, the kernel is
stopped, and every later code cell gets an error output too ("not run": its state is gone), so
the test cells that ran before keep their points and the later ones score 0. A cell that runs
too long but does stop when interrupted costs only that cell: it gets a "took longer than N s"
error and the notebook goes on.

nbgrader scores a graded cell 0 for any output on stderr, so a test cell that calls the
student's function would fail because that function uses `logging`, `warnings` or
`print(file=sys.stderr)`. In graded cells, stderr output is moved to stdout, each line marked
"[stderr] ", so the feedback still shows it and the score depends only on errors.

With `sandboxed` (config), the kernel runs in graders.isolation.sandbox's bubblewrap sandbox.
"""

from __future__ import annotations

import shutil
import signal

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool

KERNEL_DIED = "KernelDied"
TIMED_OUT = "CellTimeoutError"
NOT_STOPPED = "did not stop when interrupted"
STDERR_MARK = "[stderr] "


def _error(evalue: str, ename: str = KERNEL_DIED) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[evalue])


def _stderr_to_stdout(cell) -> None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            text = out.get("text", "")
            lines = text.splitlines(keepends=True)
            out["name"] = "stdout"
            out["text"] = "".join(STDERR_MARK + line for line in lines)


class SurvivingExecute(Execute):
    """Execute, but a dead or stuck kernel fails the cells from there on, not the notebook."""

    sandboxed = Bool(
        False, help="run the kernel in graders.isolation.sandbox.SandboxKernelManager (bubblewrap)"
    ).tag(config=True)

    verdicts_in_grader = Bool(
        True,
        help="run graded test cells in the grader's process (graders.isolation.remote), not in "
        "the kernel",
    ).tag(config=True)

    _stopped: str | None = None  # why later cells are not run
    _io_dir = (
        None  # the verdicts' folder of a kernel outside a sandbox, made at its first test cell
    )

    def create_kernel_manager(self):
        if self.sandboxed:
            from graders.isolation.sandbox import SandboxKernelManager

            self.kernel_manager_class = SandboxKernelManager
        else:  # no port another process can take before the kernel binds it
            from graders.run.local_kernel import LocalKernelManager

            self.kernel_manager_class = LocalKernelManager
        return super().create_kernel_manager()

    def preprocess(self, nb, resources=None, km=None):
        self._stopped = None
        try:
            return super().preprocess(nb, resources, km)
        finally:  # the verdicts' folder outside a sandbox (a sandbox's goes with its scratch)
            io_dir, self._io_dir = self._io_dir, None
            if io_dir is not None:
                shutil.rmtree(io_dir, ignore_errors=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self._stopped is not None:
            cell.outputs = [_error(f"not run: {self._stopped}")]
            return cell, resources
        timeout = self._get_timeout(cell)
        self.error_on_timeout = {
            "ename": TIMED_OUT,
            "evalue": f"this cell took longer than {timeout} s and was stopped",
            "traceback": [
                f"\x1b[0;31m{TIMED_OUT}\x1b[0m: this cell took longer than {timeout} s and was "
                "stopped (the time limit of one cell)"
            ],
        }
        try:
            if self._is_test_cell(cell) and self.verdicts_in_grader:
                cell.outputs = self._verdict(cell, index)
            else:
                cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._stopped = f"the kernel died in cell {index}"
            cell.outputs.append(
                _error(
                    "the Python kernel died while running this cell (os._exit, a crash, or too "
                    "much memory); the cells after it were not run"
                )
            )
            return cell, resources
        except CellTimeoutError:
            # interrupted at the time limit, the cell went on running: stop the kernel itself
            self._kill_kernel()
            self._stopped = f"cell {index} ran past the time limit and the kernel was stopped"
            cell.outputs.append(
                _error(
                    f"this cell took longer than {timeout} s and {NOT_STOPPED} (it ignores "
                    "SIGINT or catches KeyboardInterrupt); the kernel was stopped and the cells "
                    "after it were not run",
                    TIMED_OUT,
                )
            )
            return cell, resources
        if cell.metadata.get("nbgrader", {}).get("grade"):
            _stderr_to_stdout(cell)
        return cell, resources

    @staticmethod
    def _is_test_cell(cell) -> bool:
        meta = cell.metadata.get("nbgrader", {})
        return bool(meta.get("grade")) and not meta.get("solution")

    def _verdict(self, cell, index: int) -> list:
        """The test cell's outputs, computed in this process against the kernel's functions.

        A dead or stuck kernel raises as if the cell had run in it (the except clauses above).
        """
        from pathlib import Path

        from graders.isolation import scratch as host_scratch
        from graders.isolation.remote import RemoteError, run_in_grader

        scratch = getattr(self.km, "scratch", None)
        if scratch is not None:  # the sandbox's folder that the kernel sees at the same path
            io_dir = Path(scratch) / "conn" / "grader"
        else:
            if self._io_dir is None:
                self._io_dir = host_scratch.make_dir("fa-grader-io-")
            io_dir = self._io_dir
        try:
            return run_in_grader(self, cell, index, io_dir)
        except RemoteError as err:
            if isinstance(err.original, DeadKernelError | CellTimeoutError):
                raise err.original from None
            return [_error(f"the grader could not check this cell: {err}", "GraderError")]

    def _kill_kernel(self) -> None:
        """SIGKILL the kernel (in the sandbox: all of its processes go with it)."""
        km = self.km

        async def kill():
            try:
                await ensure_async(km.signal_kernel(signal.SIGKILL))
                if km.provisioner is not None:
                    await km.provisioner.wait()
            except Exception:  # already gone
                pass

        if km is not None:
            run_sync(kill)()
