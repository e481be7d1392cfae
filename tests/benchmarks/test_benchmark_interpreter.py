"""benchmarks/interpreter.py: both interpreters are timed, each on a checked answer."""

import pytest

from benchmarks import interpreter
from course_utils.harness import triton_interpreter


@pytest.mark.skipif(not triton_interpreter.INTERPRETER, reason="the kernels run on the GPU here")
def test_both_interpreters_are_timed_each_round():
    said = []
    times = interpreter.measure(1, {"decode": 1}, say=said.append)
    assert set(times["decode"]) == set(interpreter.VARIANTS)
    assert all(len(v) == 1 and v[0] > 0 for v in times["decode"].values()), times
    assert said and said[0].startswith("round 1: decode: as shipped"), said


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        interpreter.main(["--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err
