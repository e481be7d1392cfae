"""benchmarks/grading.py: which notebooks a benchmark grades (--notebooks)."""

import pytest

from benchmarks import grading
from graders import pipeline


def test_select_ranges_and_lists_by_leading_number():
    every = pipeline.assignments()
    assert grading.select(None) == every
    first_seven = grading.select("01-07")
    assert [a[:2] for a in first_seven] == ["01", "02", "03", "04", "05", "06", "07"]
    assert [a[:2] for a in grading.select("1,3,5-6")] == ["01", "03", "05", "06"]


@pytest.mark.parametrize("spec", ["seven", "01-x", "98-99"])
def test_select_names_a_bad_list(spec):
    with pytest.raises(SystemExit, match="--notebooks"):
        grading.select(spec)
