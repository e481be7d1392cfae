"""graders.run.local_kernel: kernels run as this user talk over Unix sockets of their own, so no
other process can take their ports between the manager's pick and the kernel's bind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from fixtures import kernels

from graders.run import local_kernel
from graders.run.execute import SurvivingExecute

pytestmark = pytest.mark.skipif(os.name != "posix", reason="Unix sockets: POSIX only")


def _sockets(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]


def test_a_kernel_listens_on_unix_sockets_in_its_own_folder_and_leaves_nothing(tmp_path):
    km, kc = kernels.start_kernel(cwd=str(tmp_path))
    try:
        info = json.loads(Path(km.connection_file).read_text())
        folder = Path(km.connection_file).parent
        assert info["transport"] == "ipc", info
        assert folder.name.startswith(local_kernel.PREFIX) and Path(info["ip"]).parent == folder
        assert len(_sockets(folder)) == 5, sorted(p.name for p in folder.iterdir())
        reply = kc.execute_interactive("import os; x = os.getcwd()", timeout=30)
        assert reply["content"]["status"] == "ok"
        km.restart_kernel(now=True)  # the same paths: the client's channels still reach it
        kc.wait_for_ready(timeout=60)
        assert Path(km.connection_file).parent == folder
        reply = kc.execute_interactive("x = 1", timeout=30)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not folder.exists()


def test_a_temp_folder_too_long_for_sockets_is_swapped_for_a_short_one(tmp_path, monkeypatch):
    long = tmp_path / ("x" * 90)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    km, kc = kernels.start_kernel(cwd=str(tmp_path))
    try:
        folder = Path(km.connection_file).parent
        assert not folder.is_relative_to(long)
        assert all(len(os.fsencode(str(p))) <= 107 for p in _sockets(folder))
        assert kc.execute_interactive("1", timeout=30)["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_grader_without_a_sandbox_starts_its_kernels_so(tmp_path):
    """nbgrader's Execute, as the grader runs it with --unsafe-no-sandbox: a notebook executed
    with the kernel on Unix sockets."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    execute = SurvivingExecute(sandboxed=False, kernel_name="python3", timeout=60)
    execute.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert execute.kernel_manager_class is local_kernel.LocalKernelManager
    assert nb.cells[0].outputs[0]["text"] == "42\n"
