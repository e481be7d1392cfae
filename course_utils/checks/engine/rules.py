"""Rules: how the answer must be computed, checked once every value is right.

A Rule runs one case under instrumented_call (engine.watch) with the instruments it needs; its
judge returns None when the rule holds, or (Mistake, what was measured):

    memory_budget(case, allowed, mistake, forbidden=, what=)   peak of new allocations
    tile_rule, single_pass_rule, bounded_loads_rule, partition_rule
                                                  what the traced inputs' LoadLogs show
    calls_rule(case, helper, ...)                 the learner's own helper is called as asked
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from course_utils.checks.engine.display import _describe_args, fmt_bytes
from course_utils.checks.engine.watch import instrumented_call

if TYPE_CHECKING:
    from course_utils.checks.engine.cases import Case
    from course_utils.checks.engine.failures import Mistake
    from course_utils.checks.engine.tracing import LoadLog
    from course_utils.checks.engine.watch import CallReport


# ---------------------------------------------------------------------------------------------
# Rules: how the answer is computed
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How the learner must compute, checked on one case once every value is right.

    The case runs under instrumented_call with the given instruments; judge(report, case) returns
    None when the rule holds, or (Mistake, what was measured) when it is broken.

    what: the rule in the notebook's words ("never build an N x N_k array").
    """

    case: Case
    judge: Callable[[CallReport, Case], tuple[Mistake, str] | None]
    what: str
    trace: tuple = ()
    memory: bool = False
    spy: tuple[str, ...] = ()


def memory_budget(case: Case, allowed: int, mistake: Mistake, *, forbidden: int, what: str) -> Rule:
    """A Rule: the peak of new allocations while fn runs on case stays within `allowed` bytes.

    forbidden: the size of the array the rule forbids (at least 10x allowed on a good case).
    """

    def judge(report: CallReport, case: Case):
        if report.peak is None or report.peak <= allowed:
            return None
        return mistake, (
            f"your function allocated {fmt_bytes(report.peak)} at its peak; the budget is "
            f"{fmt_bytes(allowed)} (the forbidden array alone is {fmt_bytes(forbidden)})"
        )

    return Rule(case, judge, what, memory=True)


def traced_loads(fn: Callable, case: Case, trace: tuple) -> dict[str, LoadLog]:
    """The LoadLogs of one of the checks' own implementations (a reference) on case."""

    def own(*a, **k):
        return fn(*a, **k)

    own.__course_test_double__ = True  # the checks' own code: not a learner's call into it
    own.__signature__ = inspect.signature(fn)
    report = instrumented_call(own, case.args, case.kwargs, name="reference", trace=trace)
    return {key: report.loads[report.traced[key]] for key in trace}


def tile_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    arg: int | str,
    axis: int,
    limit: int,
    whole_reads: int = 0,
):
    """A Rule: no single load of argument `arg` spans more than `limit` positions along `axis`
    (e.g. K is read in tiles of at most Bc rows; a stream in blocks of at most `block`).

    whole_reads: how many loads of the whole array are allowed besides the tiles (a preparation
    step such as D = rowsum(dO * O) reads dO and O whole once).
    """

    def judge(report: CallReport, case: Case):
        log = _log_of(report, arg)
        name = _name_of(report, arg)
        whole = [ld for ld in log.loads if ld.size == log.counts.size]
        if whole_reads and len(whole) > whole_reads:
            return mistake, (
                f"`{name}` is read whole {len(whole)} times; the exercise needs at most "
                f"{whole_reads}, the rest in tiles"
            )
        pieces = [ld for ld in log.loads if not (whole_reads and ld.size == log.counts.size)]
        widest = max((len(log.positions(ld, axis)) for ld in pieces), default=0)
        if widest <= limit:
            return None
        return mistake, (
            f"one read of `{name}` spans {widest} of its {log.shape[axis]} positions along "
            f"axis {axis}; a tile may span at most {limit}"
        )

    return Rule(case, judge, what, trace=(arg,))


def single_pass_rule(case: Case, what: str, mistake: Mistake, *, arg: int | str):
    """A Rule: no element of argument `arg` is loaded twice (one streaming pass)."""

    def judge(report: CallReport, case: Case):
        log = _log_of(report, arg)
        most = int(log.counts.max(initial=0))
        if most <= 1:  # elements never read are allowed (a masked key's value is not needed)
            return None
        name = _name_of(report, arg)
        return (
            mistake,
            f"some elements of `{name}` are read {most} times (one pass reads each once)",
        )

    return Rule(case, judge, what, trace=(arg,))


def bounded_loads_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    args: tuple,
    reference: Callable | Sequence[Callable],
    slack: float = 1.0,
):
    """A Rule: the traced `args` are loaded no more often in all than a rule-following loop loads
    them.

    reference: one (or several) of the checks' own implementations that follow the rule (e.g. a
    tiled forward that stops at the diagonal; a backward in each loop order); their loads are
    measured on the same case with the same tracer, and each argument's bound is the largest.
    slack: the learner may load up to slack times that bound (tiles cut at other boundaries).
    """
    references = list(reference) if isinstance(reference, list | tuple) else [reference]

    def judge(report: CallReport, case: Case):
        bounds = [traced_loads(ref, case, args) for ref in references]
        for arg in args:
            log = _log_of(report, arg)
            ref_total = max(int(b[arg].counts.sum()) for b in bounds)
            total, allowed = int(log.counts.sum()), int(slack * ref_total)
            if total > allowed:
                name = _name_of(report, arg)
                return mistake, (
                    f"`{name}` is read {total:,} element-times in all; a loop that follows the "
                    f"rule reads it {ref_total:,} times"
                )
        return None

    return Rule(case, judge, what, trace=tuple(args))


def partition_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    args: tuple,
    axis: int,
    groups: Callable[[Case], Sequence],
    unit: str = "part",
):
    """A Rule: no single load of the traced `args` touches positions (along `axis`) of two groups.

    groups(case): the groups, a sequence of index arrays (the key sets of attention by parts, the
    chunks of a split-KV decode): each is a worker's own data, computed on its own.
    """

    def judge(report: CallReport, case: Case):
        for arg in args:
            log = _log_of(report, arg)
            owner = np.full(log.shape[axis], -1)
            for g, idx in enumerate(groups(case)):
                owner[np.asarray(idx, dtype=np.intp)] = g
            for load in log.loads:
                rows = np.unique(np.unravel_index(load, log.shape)[axis])
                touched = np.unique(owner[rows])
                if len(touched) > 1:
                    name = _name_of(report, arg)
                    return mistake, (
                        f"one read of `{name}` takes {len(rows)} of its {log.shape[axis]} rows, "
                        f"from {len(touched)} different {unit}s; each {unit} is read on its own"
                    )
        return None

    return Rule(case, judge, what, trace=tuple(args))


def calls_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    helper: str,
    at_least: int | Callable[[Case], int],
    check: Callable[[list, Case], str | None] | None = None,
):
    """A Rule: the learner's function calls its own `helper` (a function of the notebook) at
    least `at_least` times; check(calls, case), if given, may refuse the calls' arguments with a
    message (e.g. a decode that calls its split_kv_partials with num_splits = 1)."""

    def judge(report: CallReport, case: Case):
        calls = report.calls.get(helper, [])
        need = at_least(case) if callable(at_least) else at_least
        if len(calls) < need:
            times = f"{len(calls)} time" + ("s" if len(calls) != 1 else "")
            return mistake, f"your {helper} was called {times}; the exercise needs at least {need}"
        problem = check(calls, case) if check is not None else None
        return None if problem is None else (mistake, problem)

    return Rule(case, judge, what, spy=(helper,))


def _name_of(report: CallReport, arg) -> str:
    return report.traced.get(arg, str(arg))


def _log_of(report: CallReport, arg) -> LoadLog:
    return report.loads[_name_of(report, arg)]


def _rule_message(name: str, rule: Rule, mistake: Mistake, measured: str, names) -> str:
    return "\n".join(
        [
            f"✗ {name} gives the right values but breaks a rule of the exercise on "
            f"{rule.case.label}: {rule.what}.",
            f"  input:    {_describe_args(rule.case, names)}",
            f"  measured: {measured}",
            f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]",
            f"  {mistake.explanation}",
        ]
    )
