"""graders.isolation.scratch: the grader's host-side scratch is named by its maker's PID, and
what a killed maker left is removed by the next one made with the same prefix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from graders.isolation import scratch

REPO = Path(__file__).resolve().parents[2]


def _made_by_a_killed_process(tmp_path, prefix: str) -> list[str]:
    """A folder (with a file in it) and a file made by a process that then dies by SIGKILL,
    running none of its clean-up."""
    code = textwrap.dedent(
        f"""
        import os, signal
        from graders.isolation import scratch
        d = scratch.make_dir({prefix!r}, {str(tmp_path)!r})
        (d / "notebook.ipynb").write_text("{{}}")
        f = scratch.make_file({prefix!r}, ".txt", {str(tmp_path)!r})
        print(d.name, f.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert got.returncode == -9, got.stderr
    return got.stdout.split()


def test_what_a_killed_grader_left_goes_with_the_next_scratch(tmp_path):
    left = _made_by_a_killed_process(tmp_path, "fa-grading-task-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(left)
    mine = scratch.make_dir("fa-grading-task-", tmp_path)
    assert mine.name.startswith(f"fa-grading-task-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]


def test_a_living_graders_scratch_and_other_names_are_kept(tmp_path):
    mine = scratch.make_dir("fa-grading-task-", tmp_path)  # this process: alive
    log = scratch.make_file("fa-grading-log-", ".txt", tmp_path)
    other = _made_by_a_killed_process(tmp_path, "fa-other-")  # another prefix
    named = tmp_path / "fa-grading-task-notapid-x"  # no PID in its name
    named.mkdir()
    assert scratch.sweep("fa-grading-task-", tmp_path) == []
    assert scratch.sweep("fa-grading-log-", tmp_path) == []
    assert {p.name for p in tmp_path.iterdir()} == {mine.name, log.name, named.name, *other}
    assert sorted(p.name for p in scratch.sweep("fa-other-", tmp_path)) == sorted(other)


def test_scratch_is_private_to_its_user(tmp_path):
    folder = scratch.make_dir("fa-grading-task-", tmp_path)
    file = scratch.make_file("fa-grading-log-", ".txt", tmp_path)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert file.stat().st_mode & 0o777 == 0o600
