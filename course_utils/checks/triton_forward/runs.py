"""How notebook 06's puzzles are run: a Puzzle's cases launched, compared, a failure named.

    PuzzleCase                       one launch: label, shapes, dtype, seed, stage
    Puzzle                           a puzzle's name, inputs, reference, replays of its mistakes,
                                     tolerance and load rules
    _check(puzzle, kernel, cases)    launch every case, compare, raise the first failure or print
                                     the pass line

The four puzzles themselves are in puzzles.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.display import describe
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.feedback import worst_row
from course_utils.checks.engine.kernels import (
    _dtype_hint,
    _nothing_on_stderr,
    _raised_failure,
)
from course_utils.checks.engine.watch import _LearnerRaised
from course_utils.checks.triton_forward.common import (
    _as_numpy,
    _error,
    _launch,
    _learner_source,
    _nearest_mistake,
    _on_gpu,
    _rules_line,
    _stage_line,
)
from course_utils.checks.triton_forward.loads import broken


# ---- the puzzles' common machinery --------------------------------------------------------------
@dataclass(frozen=True)
class PuzzleCase:
    """One launch of a puzzle: what it is, its stage, its inputs and what it exercises."""

    label: str
    stage: str
    params: dict
    focus: str


@dataclass(frozen=True)
class Puzzle:
    """A puzzle: how to make a case's inputs, launch, compute the expected output buffer, and
    the mistakes (each an emulation of the buffer the kernel with that bug writes)."""

    name: str
    run: Callable  # the runner of course_utils.harness.triton_puzzles
    inputs: Callable  # (case, torch, device) -> (runner args after the kernel, numpy inputs)
    expected: Callable  # (case, numpy inputs) -> the expected output buffer
    mistakes: list  # Mistakes whose fn(case, numpy inputs) gives the buggy buffer
    tolerance: Callable  # (case, on_gpu) -> (tolerance, match tolerance)
    where: str  # how the buffer is described in a failure ("y_buf[r, c]")
    summary: str
    rules: Callable = lambda case: ()  # (case) -> the loads.py Rules its loads must keep
    rules_summary: str = ""  # the rules, for the pass line


def _run_puzzle(puzzle: Puzzle, kernel, cases: list[PuzzleCase]) -> int:
    import torch

    on_gpu = _on_gpu()
    device = "cuda" if on_gpu else "cpu"
    stages = list(dict.fromkeys(c.stage for c in cases))
    logged = []  # (case, its loads): the rules are judged once every value is right
    for case in cases:
        args, arrays = puzzle.inputs(case, torch, device)
        try:
            got, loads = _launch(puzzle.name, kernel, puzzle.run, *args)
        except _LearnerRaised as err:
            failure = _raised_failure(puzzle.name, _Described(case), err.exc)
            raise CheckFailure(
                _stage_line(puzzle.name, stages, case.stage)
                + "\n"
                + str(failure)
                + _dtype_hint(err.exc)
            ) from None
        yours = _as_numpy(got)
        expected = puzzle.expected(case, arrays)
        tol, match_tol = puzzle.tolerance(case, on_gpu)
        err = _error(yours, expected)
        if err <= tol:
            logged.append((case, loads))
            continue
        replays = (
            (m, theirs)
            for m in puzzle.mistakes
            for theirs in [m.fn(case, arrays)]
            if _error(theirs, expected) > tol  # harmless here: cannot be what went wrong
        )
        mistake = _nearest_mistake(yours, replays, match_tol, source=_learner_source(kernel))
        raise CheckFailure(
            _stage_line(puzzle.name, stages, case.stage)
            + "\n"
            + _puzzle_failure(puzzle, case, yours, expected, err, tol, mistake)
        )
    for case, loads in logged:
        rule_broken = broken(puzzle.name, puzzle.rules(case), loads, _Described(case).describe())
        if rule_broken:
            raise CheckFailure(rule_broken)
    return len(cases)


class _Described:
    """What _raised_failure needs of a case: a label and a describe()."""

    def __init__(self, case):
        self.label = case.label
        self._case = case

    def describe(self) -> str:
        return ", ".join(f"{k} = {v}" for k, v in self._case.params.items() if k != "seed")


def _puzzle_failure(puzzle, case, yours, expected, err, tol, mistake) -> str:
    at = worst_row(yours, expected, lead=expected.ndim)
    where = puzzle.where.format(*at)
    inside = np.isfinite(expected[at])
    err_text = "NaN, inf or a write outside the matrix" if not math.isfinite(err) else f"{err:.2e}"
    lines = [
        f"  case: {case.label}",
        f"  input: {_Described(case).describe()}",
        f"  relative error: {err_text} (tolerance {tol:.0e}); the worst cell is {where}"
        + ("" if inside else ", outside the matrix (the output buffer starts as NaN there)"),
        f"  yours:    {describe(yours[at], 6)}",
        f"  expected: {describe(expected[at], 6)}",
    ]
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        written_outside = np.isnan(expected) & ~np.isnan(yours)
        if written_outside.any():
            lines.append(
                f"  note: your kernel wrote {int(written_outside.sum())} cells outside the matrix."
            )
        elif np.isnan(yours[np.isfinite(expected)]).any():
            lines.append("  note: some cells of the matrix were never written, or hold NaN.")
        lines.append(f"  No known mistake matches; this case exercises {case.focus}.")
    return "\n".join(lines)


def _passed(puzzle: Puzzle, launches: int, stages: list[str]) -> None:
    where = "compiled on the GPU" if _on_gpu() else "in the interpreter"
    print(
        f"✓ {puzzle.name}: {launches} launches match ({where}; {puzzle.summary})"
        + _rules_line(puzzle.rules_summary)
    )


def _check(puzzle: Puzzle, kernel, cases) -> None:
    with _nothing_on_stderr():
        launches = _run_puzzle(puzzle, kernel, cases)
    _passed(puzzle, launches, [c.stage for c in cases])
