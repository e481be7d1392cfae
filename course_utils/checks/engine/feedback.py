"""Comparing the learner's values with the reference, and saying what went wrong.

close(yours, expected, rtol=, atol=)      elementwise, equal infinities match, NaN never
max_abs_error, matches_in_norm, worst_row
diagnose(yours, case, mistakes, n)        the first known Mistake whose output matches
closest_mistake(yours, replays, tol)      the replayed mistake nearest the learner's output
mismatch_lines, _failure_message          the lines of a failure: input, yours, expected
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from course_utils.checks.engine.display import _SMALL, _describe_args, describe
from course_utils.checks.engine.failures import CheckFailure

if TYPE_CHECKING:
    from course_utils.checks.engine.cases import Case
    from course_utils.checks.engine.failures import Mistake


# ---------------------------------------------------------------------------------------------
# Comparing values
# ---------------------------------------------------------------------------------------------


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


def _worst(yours, expected, *, rtol: float, atol: float) -> tuple[tuple, int]:
    """The index of the worst wrong entry, and how many entries are wrong."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(np.isinf(e) & (y == e), 0.0, np.abs(y - e))
        wrong = ~(diff <= atol + rtol * np.where(np.isfinite(e), np.abs(e), 0.0))
    score = np.where(np.isnan(diff), np.inf, diff)
    score = np.where(wrong, score, -1.0)
    return np.unravel_index(int(np.argmax(score)), y.shape), int(wrong.sum())


def _as_tuple(result, n: int):
    if n == 1:
        return (result,)
    if not isinstance(result, tuple | list) or len(result) != n:
        got = type(result).__name__ + (
            f" of length {len(result)}" if hasattr(result, "__len__") else ""
        )
        raise CheckFailure(f"expected your function to return {n} values as a tuple, got {got}")
    return tuple(result)


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
    try:
        y = np.asarray(yours, dtype=np.float64)
        t = np.asarray(theirs, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if y.shape != t.shape:
        return False
    both_nan = np.isnan(y) & np.isnan(t)
    with np.errstate(invalid="ignore"):
        near = np.isclose(y, t, rtol=1e-6, atol=1e-9, equal_nan=False) | both_nan
    return bool(near.all())


def matches_in_norm(yours: np.ndarray, theirs: np.ndarray, tol: float) -> bool:
    """yours matches a mistake's output (a kernel check's emulation or replay): NaN, +inf and
    -inf in the same places, and the finite rest within tol in norm, relative to ||theirs||."""
    if yours.shape != theirs.shape:
        return False
    special_y, special_t = ~np.isfinite(yours), ~np.isfinite(theirs)
    if (special_y != special_t).any():
        return False
    if not np.array_equal(yours[special_y], theirs[special_t], equal_nan=True):
        return False
    y, t = yours[~special_y], theirs[~special_t]
    if y.size == 0:
        return True
    return float(np.linalg.norm(y - t)) <= tol * max(float(np.linalg.norm(t)), 1e-30)


def worst_row(yours: np.ndarray, expected: np.ndarray, lead: int = 3) -> tuple[int, ...]:
    """The index over the first `lead` axes of the row with the largest difference: NaN counts
    as largest, the same infinity (or NaN) on both sides as none."""
    with np.errstate(all="ignore"):
        diff = np.abs(yours - expected)
    alike = (np.isnan(yours) & np.isnan(expected)) | (np.isinf(yours) & (yours == expected))
    diff = np.where(alike, 0.0, np.where(np.isnan(diff), np.inf, diff))
    lead = min(lead, diff.ndim)
    per_row = diff.reshape(*diff.shape[:lead], -1).max(axis=-1)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(per_row)), per_row.shape))


def mismatch_lines(
    what: str,
    yours: np.ndarray,
    expected: np.ndarray,
    err: float,
    tol: float,
    mistake: Mistake | None,
    focus: str,
    *,
    rows: Sequence[str] = ("batch", "head", "query"),
    nan_note: str = "",
) -> list[str]:
    """The lines every kernel check prints under its own header when an output is wrong: the
    relative error and the worst row (named by `rows`, the output's leading axes), yours and the
    expected values there (a row's first six entries, or one value), then the mistake, but only
    when a replay of it matched; otherwise what the case exercises, with a note on NaN (and
    `nan_note`) or on a result that is merely close."""
    idx = worst_row(yours, expected, len(rows))
    at = ", ".join(str(i) for i in idx)
    where = ", ".join(f"{name} {i}" for name, i in zip(rows, idx, strict=False))
    err_text = "NaN or inf" if not math.isfinite(err) else f"{err:.2e}"
    lines = [
        f"  relative error of {what}: {err_text} (tolerance {tol:.0e}); the worst row is {where}:"
    ]
    if yours.shape != expected.shape:
        lines.append(f"  yours has shape {yours.shape}, expected {expected.shape}")
    elif yours.ndim > len(idx):
        lines.append(f"  yours:    {what}[{at}, :6] = {describe(yours[idx][:6], 5)}")
        lines.append(f"  expected: {what}[{at}, :6] = {describe(expected[idx][:6], 5)}")
    else:
        lines.append(f"  yours:    {what}[{at}] = {describe(yours[idx], 7)}")
        lines.append(f"  expected: {what}[{at}] = {describe(expected[idx], 7)}")
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
        return lines
    if np.isnan(yours).any():
        lines.append(
            f"  note: your {what} has NaN in {int(np.isnan(yours).sum())} of {yours.size} "
            f"entries{nan_note}."
        )
    elif math.isfinite(err) and err < 5e-2:
        lines.append(
            f"  note: your values are close (relative error {err:.1e}) but not within the "
            f"tolerance ({tol:.0e})."
        )
    lines.append(f"  No known mistake matches; this case exercises {focus}.")
    return lines


def closest_mistake(yours: tuple, replays, tol: float) -> Mistake | None:
    """Of the mistakes whose replay matches yours (every output, matches_in_norm within tol), the
    nearest one; None when none matches.

    yours: the learner's outputs, a tuple of arrays. replays: (mistake, their outputs) pairs in
    the order the check prefers them; the caller leaves out a mistake that is right on this case
    (it cannot be what went wrong). Taking the nearest, not the first, keeps a loose tolerance
    (half precision on a GPU) from naming a neighbouring mistake that shrinks the output by a
    similar factor; replays within twice the nearest distance (two mistakes that compute the
    same thing, such as tl.exp on log2 scores and log2(e) folded twice) count as a tie, which
    goes to the first in order.
    """
    matched = []
    for mistake, theirs in replays:
        pairs = list(zip(yours, theirs, strict=True))
        if all(matches_in_norm(y, t, tol) for y, t in pairs):
            matched.append((mistake, max(_norm_distance(y, t) for y, t in pairs)))
    if not matched:
        return None
    nearest = min(distance for _, distance in matched)
    return next(m for m, distance in matched if distance <= 2 * nearest + 1e-9)


def _norm_distance(yours: np.ndarray, theirs: np.ndarray) -> float:
    """||y - t|| / ||t|| over the finite entries (matches_in_norm has checked the rest)."""
    finite = np.isfinite(theirs)
    y, t = yours[finite], theirs[finite]
    if y.size == 0:
        return 0.0
    return float(np.linalg.norm(y - t)) / max(float(np.linalg.norm(t)), 1e-30)


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


def _failure_message(
    name: str,
    case: Case,
    bad,
    mistake: Mistake | None,
    names=None,
    *,
    rtol=1e-10,
    atol=1e-10,
    note: str | None = None,
) -> str:
    lines = [f"✗ {name} is wrong on {case.label}.", f"  input:    {_describe_args(case, names)}"]
    for out_name, y, e in bad:
        if np.size(e) <= _SMALL:
            digits = 6 if describe(y) != describe(e) else 15  # close: show where they differ
            lines.append(f"  yours:    {out_name} = {describe(y, digits)}")
            lines.append(f"  expected: {out_name} = {describe(e, digits)}")
            err = max_abs_error(y, e)
            if np.isfinite(err) and err > 0:
                lines.append(f"  largest difference in {out_name}: {err:.3g}")
        else:
            where, count = _worst(y, e, rtol=rtol, atol=atol)
            at = f"{out_name}[{', '.join(str(int(i)) for i in where)}]"
            yv, ev = np.asarray(y)[where], np.asarray(e)[where]
            lines.append(
                f"  {out_name}: {count} of {np.size(e)} entries are wrong (shape {np.shape(e)}); "
                f"the worst is {at}"
            )
            lines.append(f"  yours:    {at} = {describe(yv)}")
            lines.append(f"  expected: {at} = {describe(ev)}")
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        if note:
            lines.append(f"  note: {note}.")
        focus = case.focus or f"the specification of {name} (its docstring)"
        lines.append(f"  No known mistake matches; this case exercises {focus}.")
    return "\n".join(lines)
