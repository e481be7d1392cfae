"""The suite's own scheduling: `--dist loadgroup` keeps each xdist_group on one worker.

tests/conftest.py restores what pytest 9.2 broke in pytest-xdist (pytest-dev/pytest-xdist#1386);
without it a class fixture is built on one worker while the other waits on its lock
(fixtures.once). Checked on a throwaway test file run with two workers, the way
`python3 course.py test` runs the suite.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parents[1]

FILE = """
import time
import pytest

@pytest.mark.xdist_group("first")
@pytest.mark.parametrize("k", range(6))
def test_in_the_first_group(k):
    time.sleep(0.05)

@pytest.mark.xdist_group("second")
@pytest.mark.parametrize("k", range(6))
def test_in_the_second_group(k):
    time.sleep(0.05)

@pytest.mark.parametrize("k", range(6))
def test_in_no_group(k):
    time.sleep(0.05)
"""


def test_each_group_runs_on_one_worker(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_groups.py").write_text(FILE)
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
           "-p", "no:cacheprovider", "-p", "no:randomly", "test_groups.py"]  # fmt: skip
    got = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, test in re.findall(r"\[(gw\d+)\] .*PASSED test_groups\.py::(\w+)", got.stdout):
        workers.setdefault(test, set()).add(worker)
    assert set(workers) == {"test_in_the_first_group", "test_in_the_second_group",
                            "test_in_no_group"}, got.stdout[-3000:]  # fmt: skip
    assert len(workers["test_in_the_first_group"]) == 1, workers
    assert len(workers["test_in_the_second_group"]) == 1, workers
