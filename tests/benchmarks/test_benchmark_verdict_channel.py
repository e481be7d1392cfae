"""benchmarks/verdict_channel.py: both ways of calling the kernel are timed, on right answers."""

import pytest

from benchmarks import verdict_channel


@pytest.mark.notebooks
def test_both_ways_are_timed_each_round():
    said = []
    times = verdict_channel.measure(calls=5, rounds=2, size=8, say=said.append)
    assert set(times) == set(verdict_channel.MODES)
    assert all(len(v) == 2 and all(ms > 0 for ms in v) for v in times.values()), times
    assert len(said) == 4 and said[1].startswith("round 1: served"), said
    assert said[2].startswith("round 2: served"), said  # the order alternates


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        verdict_channel.main(["--calls", "0"])
