"""The checks of notebook 02: right answers pass quietly, every named mistake is recognized.

The "learner" functions here are written in this file (a correct merge, a correct
attention_by_parts), so the checks' run-time guard against calling course_utils does not fire.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of

from course_utils.checks import merge as checks
from course_utils.checks._core import CheckFailure

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here
# ---------------------------------------------------------------------------------------------


def good_merge(o1, lse1, o2, lse2):
    """The merge as a learner writes it: logaddexp, weights with a finite stand-in for -inf."""
    lse = np.logaddexp(lse1, lse2)
    safe = np.where(np.isneginf(lse), 0.0, lse)
    w1, w2 = np.exp(lse1 - safe), np.exp(lse2 - safe)
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    return w1 * o1 + w2 * o2, lse


def good_by_parts(q, K, V, parts):
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        idx = np.asarray(idx, dtype=int)
        if len(idx) == 0:
            continue
        s = tau * (q @ K[idx].T)
        m = s.max(axis=1)
        p = np.exp(s - m[:, None])
        l = p.sum(axis=1)
        o, lse = good_merge(o, lse, (p @ V[idx]) / l[:, None], m + np.log(l))
    return o, lse


def naive_merge(o1, lse1, o2, lse2):
    """No guard: both sets empty gives exp(-inf - (-inf)) = NaN."""
    lse = np.logaddexp(lse1, lse2)
    w1, w2 = np.exp(lse1 - lse), np.exp(lse2 - lse)
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    return w1 * o1 + w2 * o2, lse


def float32_merge(o1, lse1, o2, lse2):
    args = (np.asarray(a, dtype=np.float32) for a in (o1, lse1, o2, lse2))
    return good_merge(*args)


def by_parts_nan_on_empty(q, K, V, parts):
    """An empty part gives m = -inf, l = 0 and o = 0/0 = NaN."""
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        s = tau * (q @ K[idx].T)
        m = s.max(axis=1, initial=NEG_INF)
        p = np.exp(s - np.where(np.isneginf(m), 0.0, m)[:, None])
        l = p.sum(axis=1)
        o, lse = good_merge(o, lse, (p @ V[idx]) / l[:, None], m + np.log(l))
    return o, lse


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly
# ---------------------------------------------------------------------------------------------


def test_merge_check_passes_a_right_answer():
    printed = run_quietly(checks.check_merge_partials, good_merge)
    assert printed.startswith("✓ merge_partials:") and printed.count("\n") == 1


def test_parts_check_passes_a_right_answer():
    printed = run_quietly(checks.check_attention_by_parts, good_by_parts)
    assert printed.startswith("✓ attention_by_parts:") and printed.count("\n") == 1


@pytest.mark.parametrize("trials", [0, 60])
def test_hidden_mode_fresh_inputs_pass(trials):
    assert "✓" in run_quietly(checks.check_merge_partials, good_merge, seed=None, trials=trials)
    assert "✓" in run_quietly(
        checks.check_attention_by_parts, good_by_parts, seed=None, trials=trials
    )


def test_cases_start_with_the_lessons_example_and_cover_the_edge_cases():
    cases = checks._merge_cases(0, 5)
    o1, lse1, o2, lse2 = cases[0].args
    assert (o1[0], o2[0]) == pytest.approx((4 / 3, 10 / 3))
    assert np.exp([lse1[0], lse2[0]]) == pytest.approx([3.0, 12.0])
    lses = np.concatenate([np.concatenate([c.args[1], c.args[3]]) for c in cases])
    assert np.isneginf(lses).any() and np.nanmax(lses) > 709  # empty sets, e^lse overflows
    both_empty = [c for c in cases if (np.isneginf(c.args[1]) & np.isneginf(c.args[3])).any()]
    assert both_empty
    parts_cases = checks._parts_cases(0, 5)
    assert any(len(p) == 0 for c in parts_cases for p in c.args[3])  # an empty part
    assert any(c.args[1].shape[0] == 0 for c in parts_cases)  # no keys at all


# ---------------------------------------------------------------------------------------------
# Every named mistake is recognized
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mistake",
    checks.MERGE_MISTAKES,
    ids=[f"{m.slug}-{i}" for i, m in enumerate(checks.MERGE_MISTAKES)],
)
def test_merge_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize(
    "mistake",
    checks.PARTS_MISTAKES,
    ids=[f"{m.slug}-{i}" for i, m in enumerate(checks.PARTS_MISTAKES)],
)
def test_parts_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_brief_mistakes_are_all_covered():
    merge_slugs = {m.slug for m in checks.MERGE_MISTAKES}
    assert {
        "plain-average",
        "normalize-then-add",
        "unnormalized-weights",
        "base2-lse",
        "nan-masked",
        "lse-max",
        "swapped-weights",
    } <= merge_slugs


def test_nan_from_both_sets_empty_is_named():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(naive_merge)
    assert slug_of(info.value) == "nan-masked"
    assert "both sets empty" in str(info.value)


def test_nan_from_an_empty_part_is_named():
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(by_parts_nan_on_empty)
    assert slug_of(info.value) == "nan-masked"
    assert "parts [3] | [] | [2, 0, 1]" in str(info.value)  # the parts are printed readably


def test_float32_is_low_precision_not_a_named_bug():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(float32_merge)
    assert slug_of(info.value) == "low-precision"


def test_mistakes_that_agree_with_the_reference_are_not_named():
    """Swapping equal weights changes nothing: such an input must not name the mistake."""
    swapped = next(m for m in checks.MERGE_MISTAKES if m.slug == "swapped-weights")
    args = (np.array([1.0]), np.array([0.5]), np.array([3.0]), np.array([0.5]))
    with pytest.raises(ValueError):
        swapped.fn(*args)


def test_calling_the_reference_is_refused():
    import course_utils as cu

    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(lambda *a: cu.merge_partials(*a))
    assert slug_of(info.value) == "calls-reference"


def test_not_implemented_propagates():
    def stub(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_merge_partials(stub)
    with pytest.raises(NotImplementedError):
        checks.check_attention_by_parts(stub)


def test_a_crash_is_reported_with_its_input():
    def crashes(q, K, V, parts):
        return q[99], q  # IndexError

    with pytest.raises(CheckFailure, match=r"raised IndexError.* on the lesson.s example"):
        checks.check_attention_by_parts(crashes)


def test_key_parts_behave_like_a_list_of_index_arrays():
    parts = checks.key_parts([2, 0], [], [1])
    assert len(parts) == 3 and [list(p) for p in parts] == [[2, 0], [], [1]]
    assert parts[0].dtype == np.intp and repr(parts) == "parts [2, 0] | [] | [1]"


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def test_quick_merge():
    assert "✓" in run_quietly(checks.check_quick_merge, 4.25)
    assert "✓" in run_quietly(checks.check_quick_merge, (1 * 2 + 3 * 5) / 4)
    with pytest.raises(CheckFailure, match="plain-average"):
        checks.check_quick_merge(3.5)
    with pytest.raises(CheckFailure, match="normalize-then-add"):
        checks.check_quick_merge(7.0)
    with pytest.raises(CheckFailure, match="no answer yet"):
        checks.check_quick_merge(None)
    with pytest.raises(CheckFailure):
        checks.check_quick_merge("4.25?")


def test_quick_merge_second_and_its_lse():
    assert "✓" in run_quietly(checks.check_quick_merge_second, 3.25)
    with pytest.raises(CheckFailure, match="swapped-weights"):
        checks.check_quick_merge_second(0.75 * 1 + 0.25 * 4)
    with pytest.raises(CheckFailure, match="unnormalized-weights"):
        checks.check_quick_merge_second(2 * 1 + 6 * 4)
    assert "✓" in run_quietly(checks.check_quick_merged_lse, math.log(8))
    assert "✓" in run_quietly(checks.check_quick_merged_lse, 2.0794)
    with pytest.raises(CheckFailure, match="lse-max"):
        checks.check_quick_merged_lse(math.log(6))
    with pytest.raises(CheckFailure, match="base2-lse"):
        checks.check_quick_merged_lse(3.0)
    with pytest.raises(CheckFailure, match="natural log"):
        checks.check_quick_merged_lse(8.0)
