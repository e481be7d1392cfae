"""The checks of notebook 01: correct answers in several styles pass, every known mistake is named.

The correct implementations here are written independently of course_utils (the learner's
answers, as a learner would write them). Every warning is an error in this file.
"""

from __future__ import annotations

import contextlib
import io
import math
import re

import nbformat
import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of
from scipy.special import logsumexp

import course_utils as cu
from course_utils.checks import CheckFailure
from course_utils.checks import online_softmax as chk
from course_utils.checks.online_softmax import exercises as chk_exercises
from graders.run.pipeline import REPO

pytestmark = pytest.mark.filterwarnings("error")


# ---------------------------------------------------------------------------------------------
# Correct answers, in the styles learners write them
# ---------------------------------------------------------------------------------------------


def good_stats(x, block):
    """Vectorised over the rows, one block at a time (the notebook's hints)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        l = np.exp(m - shift) * l + np.exp(xb - shift[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def stats_per_score(x, block):
    """One score (of every row) at a time: block is irrelevant to the result."""
    m = np.full(np.shape(x)[:-1], -np.inf)
    l = np.zeros(np.shape(x)[:-1])
    for i in range(np.shape(x)[-1]):
        xi = x[..., i]
        m_new = np.maximum(m, xi)
        shift = np.where(m_new == -np.inf, 0.0, m_new)
        l = l * np.exp(m - shift) + np.exp(xi - shift)
        m = m_new
    return m, l


def stats_array_split(x, block):
    """A converted copy (astype), then np.array_split into ceil(n / block) blocks."""
    x = x.astype(np.float64)
    n = x.shape[-1]
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for xb in np.array_split(x, max(1, -(-n // block)), axis=-1):
        if xb.shape[-1] == 0:
            continue
        mb = xb.max(axis=-1)
        m_new = np.maximum(m, mb)
        safe = np.where(np.isneginf(m_new), 0.0, m_new)
        l = l * np.exp(m - safe) + np.exp(xb - safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def stats_block_local(x, block):
    """The block-local form of section 4(c): each block's own (m_b, l_b), then both rescaled."""
    x = np.array(x, dtype=float)  # a copy
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s : s + block]
        m_b = xb.max(axis=-1)
        l_b = np.exp(xb - np.where(np.isneginf(m_b), 0.0, m_b)[..., None]).sum(axis=-1)
        m_new = np.maximum(m, m_b)
        safe = np.where(np.isneginf(m_new), 0.0, m_new)
        l = l * np.exp(m - safe) + l_b * np.exp(m_b - safe)
        m = m_new
    return m, l


def stats_loops(x, block):
    """Python loops, as a beginner writes them: per row, per block a slice; the block's max in
    one loop over its scores, the sum of its exponentials in another (the issue's example)."""
    rows, n = x.shape[:-1], x.shape[-1]
    m, l = np.full(rows, -np.inf), np.zeros(rows)
    for r in np.ndindex(rows):
        for s in range(0, n, block):
            xb = x[r][s : s + block]
            block_max = -math.inf
            for v in xb:
                block_max = max(block_max, float(v))
            m_new = max(m[r], block_max)
            if m_new == -math.inf:
                continue
            total = 0.0
            for v in xb:
                total += math.exp(v - m_new)
            l[r] = l[r] * math.exp(m[r] - m_new) + total
            m[r] = m_new
    return m, l


def good_attention(x, v, block):
    """One query's (o, lse) from the running (m, l, acc), divided once at the end."""
    m, l, acc = -np.inf, 0.0, np.zeros(np.shape(v)[1:])
    for start in range(0, len(x), block):
        xb, vb = x[start : start + block], v[start : start + block]
        m_new = max(m, xb.max())
        shift = 0.0 if m_new == -np.inf else m_new
        p, factor = np.exp(xb - shift), np.exp(m - shift)
        l = factor * l + p.sum()
        acc = factor * acc + p @ vb
        m = m_new
    if l == 0:
        return acc, -np.inf
    return acc / l, m + np.log(l)


def attention_per_score(x, v, block):
    """One key at a time, zip over the scores and the values (no blocks at all)."""
    m, l, acc = -np.inf, 0.0, np.zeros(np.shape(v)[1:])
    for xi, vi in zip(x, v, strict=True):
        if xi == -np.inf:
            continue
        m_new = max(m, xi)
        factor = np.exp(m - m_new)
        w = np.exp(xi - m_new)
        l, acc, m = l * factor + w, acc * factor + w * vi, m_new
    if l == 0.0:
        return np.zeros(np.shape(v)[1:]), -np.inf
    return acc / l, m + np.log(l)


def attention_key_loops(x, v, block):
    """Per block a slice of x and of v; the block's max in one loop over its scores, then a loop
    per key for the weight and acc (the issue's per-key loop), reading x_b[j] and v_b[j]."""
    m, l, acc = -math.inf, 0.0, np.zeros(np.shape(v)[1:])
    for s in range(0, len(x), block):
        xb, vb = x[s : s + block], v[s : s + block]
        block_max = -math.inf
        for j in range(len(xb)):
            block_max = max(block_max, xb[j])
        m_new = max(m, block_max)
        if m_new == -math.inf:
            continue
        factor = math.exp(m - m_new)
        l, acc = l * factor, acc * factor
        for j in range(len(xb)):
            w = math.exp(xb[j] - m_new)
            l += w
            acc = acc + w * vb[j]
        m = m_new
    if l == 0:
        return np.zeros(np.shape(v)[1:]), -math.inf
    return acc / l, m + math.log(l)


def attention_array_split(x, v, block):
    """float64 copies (astype), blocks of x and v from np.array_split, tensordot."""
    x, v = x.astype(np.float64), v.astype(np.float64)
    k = max(1, -(-len(x) // block))
    m, l, acc = -np.inf, 0.0, np.zeros(v.shape[1:])
    for xb, vb in zip(np.array_split(x, k), np.array_split(v, k), strict=True):
        if len(xb) == 0:
            continue
        m_new = np.maximum(m, xb.max())
        safe = 0.0 if np.isneginf(m_new) else m_new
        p, factor = np.exp(xb - safe), np.exp(m - safe)
        l = factor * l + p.sum()
        acc = factor * acc + np.tensordot(p, vb, axes=1)
        m = m_new
    if l == 0:
        return np.zeros(v.shape[1:]), np.float64(-np.inf)
    return acc / l, np.float64(m + np.log(l))


STATS_STYLES = [good_stats, stats_per_score, stats_array_split, stats_block_local, stats_loops]
ATTENTION_STYLES = [
    good_attention,
    attention_per_score,
    attention_array_split,
    attention_key_loops,
]


# ---------------------------------------------------------------------------------------------
# Wrong algorithms with right values, as learners write them
# ---------------------------------------------------------------------------------------------


def stats_scipy(x, block):
    """scipy's logsumexp over each whole row."""
    m = np.max(x, axis=-1, initial=-np.inf)
    lse = logsumexp(x, axis=-1)
    l = np.where(np.isneginf(m), 0.0, np.exp(lse - np.where(np.isneginf(m), 0.0, m)))
    return m, l


def stats_full_row(x, block):
    """np.exp(x - x.max()): the safe softmax of section 2."""
    m = x.max(axis=-1, initial=-np.inf)
    safe = np.where(np.isneginf(m), 0.0, m)
    return m, np.exp(x - safe[..., None]).sum(axis=-1)


def stats_two_pass_blocks(x, block):
    """Blocks, but a first pass for the max and a second for the sum."""
    n = x.shape[-1]
    m = np.full(x.shape[:-1], -np.inf)
    for s in range(0, n, block):
        m = np.maximum(m, x[..., s : s + block].max(axis=-1))
    safe = np.where(np.isneginf(m), 0.0, m)
    l = np.zeros(x.shape[:-1])
    for s in range(0, n, block):
        l += np.exp(x[..., s : s + block] - safe[..., None]).sum(axis=-1)
    return m, l


def attention_scipy(x, v, block):
    lse = logsumexp(x) if len(x) else -np.inf
    if lse == -np.inf:
        return np.zeros(np.shape(v)[1:]), -np.inf
    return np.exp(x - lse) @ v, lse


def attention_three_pass(x, v, block):
    """The three passes of section 8, block by block."""
    starts = range(0, len(x), block)
    m = max((x[s : s + block].max() for s in starts), default=-np.inf)
    if m == -np.inf:
        return np.zeros(np.shape(v)[1:]), -np.inf
    l = sum(np.exp(x[s : s + block] - m).sum() for s in starts)
    acc = sum(np.exp(x[s : s + block] - m) @ v[s : s + block] for s in starts)
    return acc / l, m + np.log(l)


def attention_values_last(x, v, block):
    """Online over the scores, then the weights (rescaled at the end) times all of v."""
    m, l, blocks = -np.inf, 0.0, []
    for s in range(0, len(x), block):
        xb = x[s : s + block]
        m_b = xb.max()
        blocks.append((m_b, np.exp(xb - (0.0 if m_b == -np.inf else m_b))))
        m = max(m, m_b)
    if m == -np.inf:
        return np.zeros(np.shape(v)[1:]), -np.inf
    p = np.concatenate([w * np.exp(m_b - m) for m_b, w in blocks])
    l = p.sum()
    return p @ v / l, m + np.log(l)


def stats_shifts_in_place(x, block):
    """x -= shift: changes the caller's scores."""
    m = x.max(axis=-1, keepdims=True)
    x -= m
    return m[..., 0], np.exp(x).sum(axis=-1)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _run_quietly(check, fn, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        check(fn, **kwargs)
    return out.getvalue(), err.getvalue()


def _slugs(message: str) -> list[str]:
    return re.findall(r"\[misconception: ([\w-]+)\]", message)


def _fails_with(check, fn) -> str:
    with pytest.raises(CheckFailure) as info:
        _run_quietly(check, fn)
    return str(info.value)


CHECKS = [
    (chk.check_online_softmax_stats, chk.STATS_MISTAKES + chk.STATS_RULE_MISTAKES),
    (
        chk.check_online_softmax_attention,
        chk.ATTENTION_MISTAKES + chk.ATTENTION_RULE_MISTAKES,
    ),
]
STYLES = [(chk.check_online_softmax_stats, f) for f in STATS_STYLES] + [
    (chk.check_online_softmax_attention, f) for f in ATTENTION_STYLES
]


# ---------------------------------------------------------------------------------------------
# Right answers pass
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check, good", STYLES, ids=lambda p: getattr(p, "__name__", None))
def test_correct_answers_in_every_style_pass_quietly(check, good):
    out, err = _run_quietly(check, good)
    assert out.startswith("✓ ") and out.count("\n") == 1, out
    assert "rules hold" in out and err == ""


@pytest.mark.parametrize("check, good", [STYLES[0], STYLES[len(STATS_STYLES)]])
def test_hidden_mode_fresh_inputs(check, good):
    for _ in range(3):
        out, err = _run_quietly(check, good, seed=None, trials=60)
        assert out.startswith("✓ ") and err == ""


# ---------------------------------------------------------------------------------------------
# Every mistake is named: wrong values, and right values computed against the rule
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check, mistake",
    [(c, m) for c, ms in CHECKS for m in ms],
    ids=lambda p: getattr(p, "slug", getattr(p, "__name__", None)),
)
def test_every_mistake_is_named(check, mistake):
    message = _fails_with(check, as_learner(mistake.fn))
    assert _slugs(message) == [mistake.slug], message


@pytest.mark.parametrize(
    "check, learner, slug",
    [
        (chk.check_online_softmax_stats, stats_scipy, "whole-stream"),
        (chk.check_online_softmax_stats, stats_full_row, "whole-stream"),
        (chk.check_online_softmax_stats, stats_two_pass_blocks, "multi-pass"),
        (chk.check_online_softmax_attention, attention_scipy, "whole-stream"),
        (chk.check_online_softmax_attention, attention_three_pass, "multi-pass"),
        (chk.check_online_softmax_attention, attention_values_last, "values-read-whole"),
    ],
    ids=lambda p: getattr(p, "__name__", None),
)
def test_breaking_the_rule_is_named_although_the_values_are_right(check, learner, slug):
    message = _fails_with(check, learner)
    assert "gives the right values but breaks a rule" in message, message
    assert _slugs(message) == [slug], message
    assert "block 6" in message and "measured:" in message


def test_the_slugs_cover_the_named_misconceptions():
    stats = {m.slug for m in chk.STATS_MISTAKES}
    att = {m.slug for m in chk.ATTENTION_MISTAKES}
    assert stats == {
        "no-rescale",
        "own-block-max",
        "no-max-subtraction",
        "nan-masked",
        "low-precision",
    }
    assert att == stats | {"rescale-l-not-acc", "normalize-then-average"}
    assert {m.slug for m in chk.STATS_RULE_MISTAKES} == {"whole-stream", "multi-pass"}
    assert {m.slug for m in chk.ATTENTION_RULE_MISTAKES} == {
        "whole-stream",
        "multi-pass",
        "values-read-whole",
    }


def test_float32_state_is_low_precision_but_float16_matches_no_replay():
    def float32(x, v, block):
        o, lse = good_attention(np.asarray(x, np.float32), np.asarray(v, np.float32), block)
        return np.asarray(o, np.float64), np.float64(lse)

    assert _slugs(_fails_with(chk.check_online_softmax_attention, float32)) == ["low-precision"]

    def float16(x, v, block):
        o, lse = good_attention(np.asarray(x, np.float16), np.asarray(v, np.float16), block)
        return np.asarray(o, np.float64), np.float64(lse)

    message = _fails_with(chk.check_online_softmax_attention, float16)
    assert _slugs(message) == [] and "No known mistake matches" in message
    assert "close (relative error" in message and "the rescale" in message  # the focus


def test_nan_only_from_the_final_division_is_named():
    def learner(x, v, block):
        m, l, acc = -np.inf, 0.0, np.zeros(np.shape(v)[1:])
        for start in range(0, len(x), block):
            xb, vb = x[start : start + block], v[start : start + block]
            m_new = max(m, xb.max())
            shift = 0.0 if m_new == -np.inf else m_new
            p, factor = np.exp(xb - shift), np.exp(m - shift)
            l, acc, m = factor * l + p.sum(), factor * acc + p @ vb, m_new
        return acc / l, m + np.log(l)  # 0 / 0 for a fully masked row

    message = _fails_with(chk.check_online_softmax_attention, learner)
    assert "all -inf" in message and _slugs(message) == ["nan-masked"]


def test_shifting_the_input_in_place_is_named_and_the_examples_are_frozen():
    message = _fails_with(chk.check_online_softmax_stats, stats_shifts_in_place)
    assert _slugs(message) == ["mutates-input"] and "`x`" in message
    for a in (chk.EXAMPLE_X, chk.EXAMPLE_V, chk.LOCAL_X, chk.LOCAL_V, chk.FURTHER_X):
        assert not a.flags.writeable
    np.testing.assert_array_equal(chk.EXAMPLE_X, np.log([2.0, 1.0, 8.0, 4.0]))


def test_a_loop_over_the_rows_that_slices_blocks_passes():
    def per_row(x, block):
        m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
        for r in np.ndindex(x.shape[:-1]):
            row = x[r]
            for s in range(0, len(row), block):
                xb = row[s : s + block]
                m_new = max(m[r], xb.max())
                safe = 0.0 if m_new == -np.inf else m_new
                l[r] = l[r] * np.exp(m[r] - safe) + np.exp(xb - safe).sum()
                m[r] = m_new
        return m, l

    _run_quietly(chk.check_online_softmax_stats, per_row)


def test_a_block_sliced_once_is_on_chip_however_it_is_read_again():
    """Issue 39: loops over a tile already sliced read no score again; loops that slice the input
    again for the sum, in a second pass over the blocks, do."""
    for check, learner in [
        (chk.check_online_softmax_stats, stats_loops),
        (chk.check_online_softmax_attention, attention_key_loops),
    ]:
        out, _ = _run_quietly(check, learner)
        assert out.startswith("✓ ") and "rules hold" in out, out

    def sliced_again_for_the_sum(x, block):
        """The same loops, but a pass over the blocks for the max, then another for the sum."""
        rows, n = x.shape[:-1], x.shape[-1]
        m, l = np.full(rows, -np.inf), np.zeros(rows)
        for r in np.ndindex(rows):
            for s in range(0, n, block):
                for v in x[r][s : s + block]:
                    m[r] = max(m[r], float(v))
            if m[r] == -math.inf:
                continue
            for s in range(0, n, block):
                for v in x[r][s : s + block]:
                    l[r] += math.exp(v - m[r])
        return m, l

    message = _fails_with(chk.check_online_softmax_stats, sliced_again_for_the_sum)
    assert _slugs(message) == ["multi-pass"], message
    assert "read 2 times" in message and "slicing the input again is a second read" in message


# ---------------------------------------------------------------------------------------------
# Edges of the API
# ---------------------------------------------------------------------------------------------


def test_not_implemented_propagates():
    def stub(*args):
        raise NotImplementedError()

    for check, _ in CHECKS:
        with pytest.raises(NotImplementedError):
            check(stub)


def test_calling_the_reference_is_refused():
    for fn in (cu.online_softmax_stats, lambda x, block: cu.online_softmax_stats(x, block)):
        with pytest.raises(CheckFailure) as info:
            chk.check_online_softmax_stats(fn)
        assert _slugs(str(info.value)) == ["calls-reference"]
    with pytest.raises(CheckFailure) as info:  # the checks' own helpers are the course's too
        chk.check_online_softmax_attention(
            lambda x, v, b: chk_exercises._online_attention_reference(x, v, b)
        )
    assert _slugs(str(info.value)) == ["calls-reference"]


def test_wrong_shape_and_wrong_arity_are_reported():
    with pytest.raises(CheckFailure, match="shape"):
        chk.check_online_softmax_stats(lambda x, b: (np.max(x), np.zeros(3)))
    with pytest.raises(CheckFailure, match="2 values"):
        chk.check_online_softmax_attention(lambda x, v, b: 1.0)
    with pytest.raises(CheckFailure, match="raised"):
        chk.check_online_softmax_stats(lambda x, b: 1 / 0)


def test_cases_start_with_the_notebooks_examples_and_are_deterministic():
    cases = chk_exercises._attention_cases(0, 5)
    assert "(2, 4, 1, 3)" in cases[0].label and "quick check" not in cases[0].label
    assert "section 4(b)" in cases[1].label
    assert "section 4(c)" in cases[2].label
    for c in cases + chk_exercises._stats_cases(0, 5):
        assert not re.search(r"textbook|lesson|recall", c.label), c.label
    again = chk_exercises._attention_cases(0, 5)
    for a, b in zip(cases, again, strict=True):
        for x, y in zip(a.args, b.args, strict=True):
            np.testing.assert_array_equal(x, y)
    o, lse = chk_exercises._online_attention_reference(*cases[1].args)
    assert o == pytest.approx(44 / 15) and lse == pytest.approx(np.log(15))
    o, _ = chk_exercises._online_attention_reference(*cases[2].args)
    assert o == pytest.approx(36.8806, abs=5e-5)
    o, _ = chk_exercises._online_attention_reference(*cases[0].args)
    assert o == pytest.approx(19.187, abs=5e-4)


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "quick, right, wrong, hint",
    [
        (chk.check_quick_rescale, np.exp(-2.0), np.exp(2.0), "<= 1"),
        (chk.check_quick_rescale, 0.135, 0.5, "exp(m_old - m_new)"),
        (chk.check_quick_new_l, 1 + 3 * np.exp(-2.0), 3 + np.exp(-2.0), "without rescaling"),
        (chk.check_quick_output, 1.193, 6 / (1 + 3 * np.exp(-2.0)), "acc needs"),
        (chk.check_quick_output, (1 + 5 * np.exp(-2.0)) / (1 + 3 * np.exp(-2.0)), 1.677, "acc /"),
        (chk.check_quick_second_example, 19.187, 23.81, "average of the two blocks' outputs"),
        (chk.check_quick_second_example, 19.1868, 13.81, "block 1's output alone"),
        (chk.check_quick_second_example, 19.187, 33.81, "block 2's output alone"),
        (chk.check_quick_second_example, 19.187, 20.0, "plain mean"),
        (chk.check_quick_second_example, 19.187, 19.0, "the max stays 4"),
    ],
)
def test_quick_checks(quick, right, wrong, hint):
    out, _ = _run_quietly(quick, right)
    assert out.startswith("✓")
    with pytest.raises(CheckFailure) as info:
        quick(wrong)
    assert hint in str(info.value)
    with pytest.raises(CheckFailure, match="no answer"):
        quick(None)
    with pytest.raises(CheckFailure, match="the value is right, but it is ndarray"):
        quick(np.array([right]))  # right value, wrong type


# ---- issue 39: "no nan" is enforced; a NumPy warning is not graded (the text says so) ----------
def _stats_subtracting_m_new(x, block):
    """The common unguarded style: exp(m - m_new) gives NaN on a row that is still all -inf."""
    x = np.asarray(x, dtype=float)
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s : s + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        l = np.exp(m - m_new) * l + np.exp(xb - m_new[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def _stats_guarded_after_exp(x, block):
    """Right values, but np.where evaluates exp(-inf - (-inf)) first: a RuntimeWarning."""
    x = np.asarray(x, dtype=float)
    m, l = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s : s + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        empty = np.isneginf(m_new)
        factor = np.where(empty, 0.0, np.exp(m - m_new))
        p = np.where(empty[..., None], 0.0, np.exp(xb - m_new[..., None]))
        l, m = factor * l + p.sum(axis=-1), m_new
    return m, l


def test_nan_where_the_reference_has_a_number_is_refused_by_name():
    with pytest.raises(CheckFailure) as info:
        chk.check_online_softmax_stats(_stats_subtracting_m_new)
    assert slug_of(info.value) == "nan-masked"


def test_an_honest_answer_that_warns_passes_and_the_text_says_warnings_are_not_graded():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _stats_guarded_after_exp(np.array([[-np.inf, -np.inf], [1.0, 2.0]]), 1)
    assert any(issubclass(w.category, RuntimeWarning) for w in caught)
    assert "✓" in run_quietly(chk.check_online_softmax_stats, _stats_guarded_after_exp)
    nb = nbformat.read(REPO / "solutions/01_online_softmax/01_online_softmax.ipynb", 4)
    text = " ".join(" ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    assert "no warning" not in text and "without a warning" not in text
    assert text.count("a NumPy warning on the way is not graded") == 2


def test_no_failure_label_cites_a_quick_check_the_learner_has_not_reached():
    cases = chk_exercises._stats_cases(0, 2) + chk_exercises._attention_cases(0, 2)
    assert not any("quick check" in case.label for case in cases)
