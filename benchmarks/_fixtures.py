"""The tests' fixtures for the benchmarks: `from benchmarks._fixtures import bank`.

The bank of synthetic submissions (tests/fixtures/bank.py) is a test fixture, so it lives with
the tests. The benchmarks import it the way the tests do, as `fixtures.bank` with tests/ on
sys.path (pytest's `pythonpath`); here tests/ is appended to sys.path, after everything else,
so it never hides an installed package. Importing the file by path instead would make a second
module under another name, and a test that runs a benchmark would then hold two banks.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))

from fixtures import bank  # noqa: E402  (tests/ on sys.path first)

__all__ = ["bank"]
