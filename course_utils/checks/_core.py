"""The machinery behind every learner-facing check: run cases, compare, name the mistake.

A check runs the learner's function on a list of cases ordered from smallest to largest, compares
each result with the reference, and either prints one pass line (to stdout) or raises CheckFailure
with: the smallest failing input, the learner's value, the expected value, and, when the learner's
output matches a known buggy implementation (a Mistake), the misconception by name. The tag
``[misconception: <slug>]`` in a failure message lets the graders count misconceptions in a class.

The learner's function runs with warnings silenced and stderr captured: an nbgrader test cell that
writes to stderr scores 0, and a correct solution must never lose points for a harmless warning.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


class CheckFailure(AssertionError):
    """A check found a wrong result; the message explains what and why."""


_SLUG = re.compile(r"\[misconception: ([A-Za-z0-9_-]+)\]")


def misconception_slug(text: str) -> str | None:
    """The slug of the first `[misconception: slug]` tag in a failure message, or None."""
    found = _SLUG.search(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Mistake:
    """A known misconception and a buggy implementation that shows it.

    fn has the exercise's signature; when the learner's output matches fn's output on the failing
    case, the failure message names the mistake and explains the fix.
    """

    slug: str  # short id, e.g. "plain-average"
    title: str  # one line, e.g. "plain average in the merge"
    explanation: str  # why it is wrong and what to do instead
    fn: Callable = field(repr=False, compare=False)


@dataclass(frozen=True)
class Case:
    """One input of a check: label for the report, positional args for the function."""

    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def describe(value, precision: int = 6) -> str:
    """A short, readable repr of a number or array for feedback messages."""
    try:
        ndim = np.ndim(value)
    except ValueError:  # e.g. a list of index arrays of different lengths
        return repr(value)
    if isinstance(value, np.ndarray) or ndim > 0:
        arr = np.asarray(value)
        if arr.dtype.kind in "fc" or arr.dtype.kind in "iub":
            body = np.array2string(
                arr, precision=precision, threshold=12, edgeitems=3, max_line_width=90
            )
            return f"{body} (shape {arr.shape})" if arr.ndim > 1 or arr.size > 12 else body
        return repr(value)
    if isinstance(value, float | np.floating):
        return f"{float(value):.{precision}g}"
    return repr(value)


# Modules whose functions are the answers to exercises: a learner's code must not call them.
REFERENCE_MODULES = (
    "course_utils.softmax",
    "course_utils.attention",
    "course_utils.memory",
    "course_utils.backward",
)


class _ReferenceCallWatch:
    """A profile hook that notes whether a function of REFERENCE_MODULES runs during a call.

    Functions named in `allow` may be called (an earlier notebook's answer, e.g. merge_partials
    in split-KV decoding); whatever they call in turn is not counted.
    """

    def __init__(self, allow: tuple[str, ...] = ()):
        self.called: str | None = None
        self.allow = set(allow)
        self._inside_allowed = None  # the frame of an allowed function being run

    def __call__(self, frame, event, arg):
        if self._inside_allowed is not None:
            if event == "return" and frame is self._inside_allowed:
                self._inside_allowed = None
            return
        if event == "call" and self.called is None:
            module = frame.f_globals.get("__name__", "")
            if module in REFERENCE_MODULES:
                if frame.f_code.co_name in self.allow:
                    self._inside_allowed = frame
                else:
                    self.called = f"{module}.{frame.f_code.co_name}"


def call_learner(fn: Callable, *args, name: str, allow: tuple[str, ...] = (), **kwargs):
    """Call the learner's fn quietly (no warnings, no stderr) and translate its exceptions.

    NotImplementedError passes through unchanged (an exercise not done yet). Any other exception
    becomes _LearnerRaised, reported with its input by the caller. A call into the course's
    reference implementations raises CheckFailure (misconception calls-reference).
    """
    if not callable(fn):
        raise CheckFailure(f"{name}: expected a function, got {type(fn).__name__} {fn!r}")
    sink = io.StringIO()
    watch = _ReferenceCallWatch(allow)
    previous = sys.getprofile()
    try:
        with (
            warnings.catch_warnings(),
            np.errstate(all="ignore"),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            sys.setprofile(watch)
            try:
                result = fn(*args, **kwargs)
            finally:
                sys.setprofile(previous)
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's bug, reported with its input by the caller
        raise _LearnerRaised(exc) from exc
    if watch.called:
        raise CheckFailure(
            f"✗ {name} calls {watch.called}.\n"
            f"  likely mistake: {CALLS_REFERENCE.title} [misconception: {CALLS_REFERENCE.slug}]\n"
            f"  {CALLS_REFERENCE.explanation}"
        )
    return result


class _LearnerRaised(Exception):
    def __init__(self, exc: Exception):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def close(yours, expected, *, rtol: float, atol: float) -> bool:
    """True when yours matches expected elementwise; equal infinities match, NaN never does."""
    try:
        y = np.asarray(yours, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape or np.isnan(y).any():
        return False
    same_inf = np.isinf(e) & (y == e)
    finite = ~np.isinf(e)
    if np.isinf(y[finite]).any():
        return False
    ok = np.abs(y[finite] - e[finite]) <= atol + rtol * np.abs(e[finite])
    return bool(ok.all() and (same_inf | finite).all())


def max_abs_error(yours, expected) -> float:
    """Largest |yours - expected| over the finite entries of expected (inf if shapes differ)."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape:
        return np.inf
    finite = np.isfinite(e)
    if not finite.any():
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(y[finite] - e[finite])
    return float(np.where(np.isnan(diff), np.inf, diff).max())


NAN_MISTAKE = Mistake(
    slug="nan-masked",
    title="NaN from a fully masked row or an empty set",
    explanation=(
        "exp(-inf - (-inf)) is NaN. When the running max (or an lse) is still -inf, the rescale "
        "factor must be 0 and the row must stay empty: subtract a finite stand-in "
        "(np.where(m == -inf, 0, m)) instead of -inf. An empty set has weight 0, o = 0, lse = -inf."
    ),
    fn=lambda *a, **k: None,
)


LOW_PRECISION_MISTAKE = Mistake(
    slug="low-precision",
    title="running statistics kept in low precision",
    explanation=(
        "Your result is close but not exact, as when m, l, acc or lse are kept in float16, "
        "bfloat16 or float32. Keep the running statistics in float64 here (float32 on a GPU, "
        "never bf16): they sum many terms, and bf16 has only about 3 significant digits."
    ),
    fn=lambda *a, **k: None,
)

CALLS_REFERENCE = Mistake(
    slug="calls-reference",
    title="the answer calls the course's reference implementation",
    explanation=(
        "The exercise is to write the algorithm yourself; calling course_utils' version scores 0. "
        "Use the reference only to compare, as the notebook does."
    ),
    fn=lambda *a, **k: None,
)


def calls_reference(fn: Callable) -> bool:
    """True when fn is (or wraps without change) a function of the course_utils package."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", "") or ""
    return module == "course_utils" or module.startswith("course_utils.")


def _as_tuple(result, n: int):
    if n == 1:
        return (result,)
    if not isinstance(result, tuple | list) or len(result) != n:
        got = type(result).__name__ + (
            f" of length {len(result)}" if hasattr(result, "__len__") else ""
        )
        raise CheckFailure(f"expected your function to return {n} values as a tuple, got {got}")
    return tuple(result)


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
) -> None:
    """Run fn and reference on every case; print one pass line or raise a named CheckFailure.

    Args:
        name: the exercise, as the learner knows it (e.g. "merge_partials").
        fn: the learner's function.  reference: the correct one, same signature.
        cases: smallest first, so the first failure is the smallest input that shows it.
        outputs: names of the returned values, e.g. ("o", "lse"); one name: a single value.
        mistakes: known buggy implementations, tried in order to name the learner's mistake.
        rtol, atol: tolerance of the comparison with the reference.
        summary: appended to the pass line (what was covered).
        low_precision_below: a finite result within this relative error, matching no known
            mistake, is reported as running statistics kept in low precision (None: never).
        allow: names of course_utils functions the learner may call (earlier notebooks' answers).
    """
    if calls_reference(fn):
        raise CheckFailure(
            f"✗ {name}: your function is course_utils' own ({fn.__module__}.{fn.__name__}).\n"
            f"  likely mistake: {CALLS_REFERENCE.title} [misconception: {CALLS_REFERENCE.slug}]\n"
            f"  {CALLS_REFERENCE.explanation}"
        )
    for case in cases:
        expected = _as_tuple(reference(*case.args, **case.kwargs), len(outputs))
        try:
            raw = call_learner(fn, *case.args, name=name, allow=allow, **case.kwargs)
        except _LearnerRaised as err:
            raise CheckFailure(
                f"{name} raised {err} on {case.label}.\n  input: {_describe_args(case)}"
            ) from None
        yours = _as_tuple(raw, len(outputs))
        for out_name, y, e in zip(outputs, yours, expected, strict=True):
            if np.shape(y) != np.shape(e):
                raise CheckFailure(
                    f"{name}: {out_name} has shape {np.shape(y)}, expected {np.shape(e)} "
                    f"on {case.label}.\n  input: {_describe_args(case)}"
                )
        bad = [
            (out_name, y, e)
            for out_name, y, e in zip(outputs, yours, expected, strict=True)
            if not close(y, e, rtol=rtol, atol=atol)
        ]
        if bad:
            mistake = diagnose(yours, case, mistakes, len(outputs), expected)
            if mistake is None and any(
                np.isnan(np.asarray(y, dtype=float)).any() for _, y, _ in bad
            ):
                mistake = NAN_MISTAKE
            if mistake is None and low_precision_below is not None:
                rel = max(_relative_error(y, e) for _, y, e in bad)
                if rel < low_precision_below:
                    mistake = LOW_PRECISION_MISTAKE
            raise CheckFailure(_failure_message(name, case, bad, mistake))
    count = f"{len(cases)} case" + ("s match" if len(cases) != 1 else " matches")
    print(f"✓ {name}: {count} the reference" + (f" ({summary})" if summary else ""))


def diagnose(
    yours: tuple, case: Case, mistakes: Sequence[Mistake], n: int, expected: tuple | None = None
) -> Mistake | None:
    """The first mistake whose output on this case matches the learner's output, or None.

    A mistake that happens to give the right answer on this case (given `expected`) cannot be
    what went wrong, so it is never named.
    """
    for mistake in mistakes:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                theirs = _as_tuple(mistake.fn(*case.args, **case.kwargs), n)
        except Exception:
            continue
        if expected is not None and all(
            close(t, e, rtol=1e-10, atol=1e-10) for t, e in zip(theirs, expected, strict=True)
        ):
            continue
        if all(_matches(y, t) for y, t in zip(yours, theirs, strict=True)):
            return mistake
    return None


def _matches(yours, theirs) -> bool:
    y = np.asarray(yours, dtype=np.float64)
    t = np.asarray(theirs, dtype=np.float64)
    if y.shape != t.shape:
        return False
    both_nan = np.isnan(y) & np.isnan(t)
    with np.errstate(invalid="ignore"):
        near = np.isclose(y, t, rtol=1e-6, atol=1e-9, equal_nan=False) | both_nan
    return bool(near.all())


def _relative_error(yours, expected) -> float:
    """max |y - e| / max(1, max |e|) over finite entries; inf on NaN or mismatched infinities."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape or np.isnan(y).any() or (np.isinf(y) != np.isinf(e)).any():
        return np.inf
    finite = np.isfinite(e)
    if not finite.any():
        return 0.0
    scale = max(1.0, float(np.abs(e[finite]).max()))
    return float(np.abs(y[finite] - e[finite]).max()) / scale


def _describe_args(case: Case) -> str:
    parts = [describe(a) if not isinstance(a, bool) else repr(a) for a in case.args]
    parts += [f"{k}={v!r}" for k, v in case.kwargs.items()]
    return ", ".join(parts)


def _failure_message(name: str, case: Case, bad, mistake: Mistake | None) -> str:
    lines = [f"✗ {name} is wrong on {case.label}.", f"  input:    {_describe_args(case)}"]
    for out_name, y, e in bad:
        lines.append(f"  yours:    {out_name} = {describe(np.asarray(y, dtype=float))}")
        lines.append(f"  expected: {out_name} = {describe(np.asarray(e, dtype=float))}")
        err = max_abs_error(y, e)
        if np.isfinite(err) and err > 0:
            lines.append(f"  largest difference in {out_name}: {err:.3g}")
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        lines.append("  (no known mistake matches: compare your code with the update rule above)")
    return "\n".join(lines)


def check_answer(
    label: str, yours, expected, *, rtol: float = 1e-3, atol: float = 1e-9, hint: str = ""
) -> None:
    """Check a numeric quick-check answer; print a pass line or raise CheckFailure with a hint."""
    if yours is None or yours is Ellipsis:
        raise CheckFailure(f"{label}: no answer yet (replace the placeholder with a number)")
    if close(yours, expected, rtol=rtol, atol=atol):
        print(f"✓ {label}: {describe(yours)} is right")
        return
    msg = f"✗ {label}: {describe(yours)} is not right."
    raise CheckFailure(msg + (f"\n  hint: {hint}" if hint else ""))


def hinted_answer(
    label: str, yours, expected, wrong_answers, default_hint: str, rtol: float = 1e-3
) -> None:
    """check_answer whose hint is chosen by the wrong answer given, when it is a known one.

    wrong_answers: (value, hint) pairs, e.g. (8 / 10, "that is the ratio the other way round");
    a wrong answer within 1% of a value gets its hint, any other gets default_hint.
    """
    hint = default_hint
    try:
        value = float(yours)
    except (TypeError, ValueError):
        value = None
    if value is not None:
        for wrong, why in wrong_answers:
            if abs(value - wrong) <= max(1e-2, rtol) * abs(wrong):
                hint = why
                break
    check_answer(label, yours, expected, rtol=rtol, hint=hint)


def pick_output(fn: Callable, k: int, names: tuple[str, ...], name: str) -> Callable:
    """A function returning output k of fn, after checking fn returns len(names) values.

    Lets run_cases compare one output at a time (O first, then lse), so a mistake in O is named
    whatever the learner did with lse.
    """

    @functools.wraps(fn)
    def picked(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not isinstance(out, tuple | list) or len(out) != len(names):
            kind = type(out).__name__ + (
                f" of length {len(out)}" if hasattr(out, "__len__") else ""
            )
            what = {2: "the pair", 3: "the triple"}.get(len(names), f"{len(names)} values")
            raise TypeError(f"{name} must return {what} ({', '.join(names)}), got {kind}")
        return out[k]

    return picked
