"""Cases and the loop that runs a check on them: one pass line, or the smallest failing case.

A check runs the learner's function on a list of cases ordered from smallest to largest, compares
each result with the reference, and either prints one pass line (to stdout) or raises CheckFailure
with: the smallest failing input, the learner's value, the expected value, and, when the learner's
output matches a known buggy implementation (a Mistake), the misconception by name. Then it checks
the Rules (engine.rules), each on its own case.

    Case(label, args, kwargs, focus=, stage=)   one input of a check
    frozen(*arrays)                             a check module's example arrays made read-only
    run_cases(name, fn, reference, cases, outputs=, mistakes=, rules=, ...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from course_utils.checks.engine.display import _arg_names, _describe_args
from course_utils.checks.engine.failures import CALLS_REFERENCE, CheckFailure, calls_reference
from course_utils.checks.engine.feedback import (
    _as_tuple,
    _failure_message,
    _relative_error,
    close,
    diagnose,
)
from course_utils.checks.engine.rules import _rule_message
from course_utils.checks.engine.watch import _LearnerRaised, instrumented_call

if TYPE_CHECKING:
    from course_utils.checks.engine.failures import Mistake
    from course_utils.checks.engine.rules import Rule
    from course_utils.checks.engine.watch import CallReport


@dataclass(frozen=True)
class Case:
    """One input of a check: label for the report, positional args for the function.

    focus: the part of the exercise's specification this case exercises ("the causal mask: a
    query sees the keys c <= r"); said when the case fails and no known mistake matches.
    stage: for an exercise checked in stages (plain tiles, then ragged, then causal, ...), the
    stage this case belongs to; run_cases names the first failing stage and the ones that pass.
    """

    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    focus: str = ""
    stage: str = ""  # the stage of a staged check ("ragged tiles"); cases come stage by stage


def frozen(*arrays: np.ndarray):
    """Make a check module's own example arrays read-only, in place; returns them (one or a tuple).

    A learner's `x -= shift` on an example would otherwise change it for the rest of the kernel's
    life, and later messages would show inputs that no longer match their labels.
    """
    for a in arrays:
        a.flags.writeable = False
    return arrays[0] if len(arrays) == 1 else arrays


# ---------------------------------------------------------------------------------------------
# Running a check
# ---------------------------------------------------------------------------------------------


def run_cases(
    name: str,
    fn: Callable,
    reference: Callable,
    cases: Sequence[Case],
    *,
    outputs: Sequence[str],
    mistakes: Sequence[Mistake] = (),
    rtol: float = 1e-10,
    atol: float = 1e-10,
    summary: str = "",
    low_precision_below: float | None = 5e-2,
    allow: tuple[str, ...] = (),
    rules: Sequence[Rule] = (),
) -> None:
    """Run fn and reference on every case; check the rules; print one pass line or raise.

    Args:
        name: the exercise, as the learner knows it (e.g. "merge_partials").
        fn: the learner's function.  reference: the correct one, same signature.
        cases: smallest first, so the first failure is the smallest input that shows it.
        outputs: names of the returned values, e.g. ("o", "lse"); one name: a single value.
        mistakes: known buggy implementations, tried in order to name the learner's mistake.
            One is named only when its output on the failing case matches the learner's.
        rtol, atol: tolerance of the comparison with the reference.
        summary: appended to the pass line (what was covered).
        low_precision_below: a finite result within this relative error that matches no known
            mistake is described as close but not exact (None: never); it names no mistake.
        allow: names of course_utils functions the learner may call (earlier notebooks' answers).
        rules: how the answer must be computed (memory budget, loads, helpers), checked after
            every value is right, each on its own case.
    """
    if calls_reference(fn):
        raise CheckFailure(
            f"✗ {name}: your function is course_utils' own ({fn.__module__}.{fn.__name__}).\n"
            f"  likely mistake: {CALLS_REFERENCE.title} [misconception: {CALLS_REFERENCE.slug}]\n"
            f"  {CALLS_REFERENCE.explanation}"
        )
    settings = dict(
        outputs=outputs,
        mistakes=mistakes,
        rtol=rtol,
        atol=atol,
        low_precision_below=low_precision_below,
        allow=allow,
    )
    stages = _stage_order(cases)
    for case in cases:
        try:
            _run_case(name, fn, reference, case, **settings)
        except CheckFailure as failure:
            if not stages:
                raise
            raise CheckFailure(_stage_header(name, stages, case.stage) + str(failure)) from None
    for rule in rules:
        report = _run_case(
            name,
            fn,
            reference,
            rule.case,
            trace=rule.trace,
            memory=rule.memory,
            spy=rule.spy,
            **settings,
        )
        verdict = rule.judge(report, rule.case)
        if verdict is not None:
            names = _arg_names(fn, len(rule.case.args), rule.case.kwargs)
            raise CheckFailure(_rule_message(name, rule, *verdict, names))
    count = f"{len(cases)} case" + ("s match" if len(cases) != 1 else " matches")
    extra = f"; {len(rules)} rule" + ("s" if len(rules) != 1 else "") + " hold" if rules else ""
    extra = extra.replace(" rule hold", " rule holds")
    print(f"✓ {name}: {count} the reference{extra}" + (f" ({summary})" if summary else ""))


def _stage_order(cases: Sequence[Case]) -> list[str]:
    """The stages of cases in order (empty when the check is not staged); cases must come
    stage by stage, so that the first failure is in the first failing stage."""
    stages: list[str] = []
    for case in cases:
        if case.stage and (not stages or stages[-1] != case.stage):
            if case.stage in stages:
                raise ValueError(f"cases of stage {case.stage!r} are not contiguous")
            stages.append(case.stage)
    if stages and any(not c.stage for c in cases):
        raise ValueError("a staged check needs a stage on every case")
    return stages


def _stage_header(name: str, stages: list[str], failed: str) -> str:
    k = stages.index(failed)
    passed = "; ".join(f"stage {i + 1} ({s}) passes" for i, s in enumerate(stages[:k]))
    later = ", ".join(stages[k + 1 :])
    line = f"✗ {name}: stage {k + 1} of {len(stages)} ({failed}) fails"
    line += f"; {passed}" if passed else ""
    line += f". Still to check after it: {later}." if later else "."
    return line + "\n"


def _run_case(
    name, fn, reference, case, *, outputs, mistakes, rtol, atol, low_precision_below, allow, **instr
) -> CallReport:
    """One case: the learner's call (instrumented), then the comparison; raise on a wrong value."""
    expected = _as_tuple(reference(*case.args, **case.kwargs), len(outputs))
    names = _arg_names(fn, len(case.args), case.kwargs)
    try:
        report = instrumented_call(fn, case.args, case.kwargs, name=name, allow=allow, **instr)
    except _LearnerRaised as err:
        raise CheckFailure(
            f"✗ {name} raised {err} on {case.label}.\n  input: {_describe_args(case, names)}"
        ) from None
    yours = _as_tuple(report.result, len(outputs))
    for out_name, y, e in zip(outputs, yours, expected, strict=True):
        if np.shape(y) != np.shape(e):
            if np.size(y) == np.size(e) and close(
                np.reshape(y, np.shape(e)), e, rtol=rtol, atol=atol
            ):
                why = "the values are right but"
            else:
                why = ""
            raise CheckFailure(
                f"✗ {name}: {why + ' ' if why else ''}{out_name} has shape {np.shape(y)}, "
                f"expected {np.shape(e)} on {case.label}.\n  input: {_describe_args(case, names)}"
            )
    bad = [
        (out_name, y, e)
        for out_name, y, e in zip(outputs, yours, expected, strict=True)
        if not close(y, e, rtol=rtol, atol=atol)
    ]
    if bad:
        mistake = diagnose(yours, case, mistakes, len(outputs), expected)
        note = None
        if mistake is None:
            if any(np.isnan(np.asarray(y, dtype=float)).any() for _, y, _ in bad):
                note = "your result has NaN where the expected value is a number or ±inf"
            elif low_precision_below is not None:
                rel = max(_relative_error(y, e) for _, y, e in bad)
                if rel < low_precision_below:
                    note = (
                        f"your values are close (relative error {rel:.1e}) but not within the "
                        f"tolerance ({rtol:g})"
                    )
        raise CheckFailure(
            _failure_message(name, case, bad, mistake, names, rtol=rtol, atol=atol, note=note)
        )
    return report
