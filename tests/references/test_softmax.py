"""Online softmax statistics and the logsumexp merge, checked against direct float64 formulas.

Every expectation is computed independently here (plain NumPy, scipy.special.logsumexp, or the
hand arithmetic of the lessons), never copied from the implementation. Every warning is an error
in this file: the online softmax must never evaluate -inf - (-inf), overflow or divide by zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import logsumexp
from scipy.special import softmax as scipy_softmax

from course_utils import (
    attention_reference,
    merge_partials,
    online_softmax_stats,
    online_softmax_steps,
)

pytestmark = pytest.mark.filterwarnings("error")

NEG_INF = -np.inf

# The lesson's worked example (seed 000, section 4): e^x = (2, 1, 8, 4), values (1, 2, 3, 4).
LESSON_X = np.log([2.0, 1.0, 8.0, 4.0])
LESSON_V = np.array([1.0, 2.0, 3.0, 4.0])
# The textbook's worked example (seed 002): already-scaled scores and scalar values.
BOOK_X = np.array([1.0, 3.0, 2.0, 5.0])
BOOK_V = np.array([10.0, 20.0, 30.0, 40.0])
# Subnormal values (hypothesis draws them) round differently in any two orders of summation.
TINY = 1e-300


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------


def direct_stats(x):
    """(max, sum exp(x - max)) over the last axis, in one pass; (-inf, 0) for an empty row."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, initial=NEG_INF)
    dead = np.isneginf(m)
    shift = np.where(dead, 0.0, m)
    l = np.exp(x - shift[..., None]).sum(axis=-1)
    return m, np.where(dead, 0.0, l)


def direct_softmax_average(x, v):
    """sum_i softmax(x)_i v_i for one stream x (n,) and values v (n,) or (n, d)."""
    return np.tensordot(scipy_softmax(x), v, axes=(0, 0))


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

# Moderate scores, huge scores (up to 1e300) and masked scores, in one stream.
scores = st.one_of(
    st.floats(-30.0, 30.0),
    st.floats(-1e300, 1e300),
    st.sampled_from([1e4, -1e4, 1e300, -1e300, 0.0]),
    st.just(NEG_INF),
)


@st.composite
def score_batches(draw, max_n=40):
    """x of shape batch + (n,) with 0..2 batch dimensions; n may be 0."""
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    n = draw(st.integers(0, max_n))
    return draw(hnp.arrays(np.float64, batch + (n,), elements=scores))


# ---------------------------------------------------------------------------------------------
# online_softmax_stats
# ---------------------------------------------------------------------------------------------


def check_stats(x, block):
    m, l = online_softmax_stats(x, block)
    m_ref, l_ref = direct_stats(x)
    assert m.shape == l.shape == x.shape[:-1]
    assert m.dtype == l.dtype == np.float64
    assert not np.isnan(m).any() and not np.isnan(l).any()
    np.testing.assert_array_equal(m, m_ref)  # a max is exact, whatever the order
    np.testing.assert_allclose(l, l_ref, rtol=1e-12, atol=0)
    alive = l > 0
    np.testing.assert_array_equal(alive, ~np.isneginf(m_ref))
    # m + log l is the logsumexp of the row
    lse_ref = logsumexp(x, axis=-1)
    np.testing.assert_allclose(
        np.asarray(m + np.log(l, where=alive, out=np.full(l.shape, NEG_INF)))[alive],
        np.asarray(lse_ref)[alive],
        rtol=1e-12,
        atol=1e-12,
    )
    # 1 <= l <= n for a row that has a finite score (the max contributes exactly 1)
    assert np.all(l[alive] >= 1.0) and np.all(l[alive] <= x.shape[-1] * (1 + 1e-12))
    return m, l


@given(x=score_batches(), block=st.integers(1, 50))
def test_stats_equal_direct_max_and_sum_for_any_block(x, block):
    check_stats(x, block)


@given(x=score_batches(max_n=25))
def test_stats_do_not_depend_on_the_block_size(x):
    n = x.shape[-1]
    results = [online_softmax_stats(x, b) for b in range(1, n + 2)]
    m0, l0 = results[0]
    for m, l in results[1:]:
        np.testing.assert_array_equal(m, m0)
        np.testing.assert_allclose(l, l0, rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(7,), (1, 7), (4, 7), (2, 3, 7), (3, 1, 2, 7)])
@pytest.mark.parametrize("block", [1, 2, 3, 7, 8, 100])
def test_stats_batches_of_rows(shape, block):
    rng = np.random.default_rng(sum(shape) * 101 + block)
    x = rng.normal(scale=5.0, size=shape)
    m, l = check_stats(x, block)
    # each row is its own stream: the batch result equals the row-by-row result
    for idx in np.ndindex(shape[:-1]):
        m_row, l_row = online_softmax_stats(x[idx], block)
        assert m_row.shape == () and l_row.shape == ()
        assert float(m_row) == m[idx]
        assert float(l_row) == pytest.approx(l[idx], rel=1e-14)


def test_stats_single_stream_returns_0d_arrays():
    m, l = online_softmax_stats(np.array([0.5, -1.0, 2.0]), 2)
    assert np.ndim(m) == 0 and np.ndim(l) == 0
    assert float(m) == 2.0
    assert float(l) == pytest.approx(np.exp(-1.5) + np.exp(-3.0) + 1.0, rel=1e-15)


@pytest.mark.parametrize("block", [1, 3, 5, 6, 1000])
def test_stats_block_of_one_and_larger_than_n(block):
    x = np.array([0.3, -2.0, 4.0, 1.5, 4.0])
    check_stats(x, block)


@pytest.mark.parametrize("big", [1e4, 1e300])
@pytest.mark.parametrize("block", [1, 2, 4])
def test_stats_huge_scores_do_not_overflow(big, block):
    # naive sum(exp(x)) overflows at x > 709; the online stats must stay finite and exact
    x = np.array([big, big - 1.0, -big, big - 3.0, big]) if big < 1e16 else np.array([big, -big])
    m, l = check_stats(x, block)
    assert float(m) == big
    assert np.isfinite(l)
    if big < 1e16:
        assert float(l) == pytest.approx(2.0 + np.exp(-1.0) + np.exp(-3.0), rel=1e-14)
        assert float(m + np.log(l)) == pytest.approx(big + np.log(l), rel=1e-15)
    else:
        assert float(l) == 1.0


def test_stats_increasing_scores_rescale_every_block():
    # a max that grows on every block forces a rescale each time; 1e4 apart would overflow naively
    x = np.arange(0.0, 2000.0, 100.0)
    m, l = check_stats(x, 1)
    assert float(m) == 1900.0
    assert float(l) == pytest.approx(sum(np.exp(-100.0 * k) for k in range(20)), rel=1e-14)


@pytest.mark.parametrize("block", [1, 2, 3, 10])
def test_stats_masked_entries(block):
    x = np.array([NEG_INF, 1.0, NEG_INF, NEG_INF, 0.0, NEG_INF])
    m, l = check_stats(x, block)
    assert float(m) == 1.0
    assert float(l) == pytest.approx(1.0 + np.exp(-1.0), rel=1e-15)


@pytest.mark.parametrize("block", [1, 2, 3, 4, 9])
def test_stats_all_masked_row_gives_minus_inf_and_zero(block):
    x = np.array(
        [
            [NEG_INF, NEG_INF, NEG_INF, NEG_INF],
            [NEG_INF, 2.0, NEG_INF, NEG_INF],
            [NEG_INF, NEG_INF, NEG_INF, NEG_INF],
            [1.0, 2.0, 3.0, 4.0],
        ]
    )
    m, l = check_stats(x, block)
    assert m[0] == NEG_INF and l[0] == 0.0
    assert m[2] == NEG_INF and l[2] == 0.0
    assert m[1] == 2.0 and l[1] == 1.0


def test_stats_masked_block_after_a_live_one_keeps_the_state():
    # the first block is live, every later block is fully masked: the state must not change
    x = np.array([1.0, 2.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF])
    m, l = check_stats(x, 2)
    assert float(m) == 2.0
    assert float(l) == pytest.approx(1.0 + np.exp(-1.0), rel=1e-15)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 2, 0)])
def test_stats_empty_stream(shape):
    m, l = online_softmax_stats(np.zeros(shape), 4)
    assert m.shape == l.shape == shape[:-1]
    assert np.all(np.isneginf(m)) and np.all(l == 0.0)


def test_stats_lesson_worked_example():
    # e^x = (2, 1, 8, 4): m = ln 8, l = 15 / 8 = 1.875, m + log l = ln 15
    m, l = online_softmax_stats(LESSON_X, 2)
    assert float(m) == pytest.approx(np.log(8.0), abs=1e-15)
    assert float(l) == pytest.approx(1.875, rel=1e-14)
    assert float(m + np.log(l)) == pytest.approx(np.log(15.0), rel=1e-14)


def test_stats_lesson_small_numbers():
    # scores (1, 2) then 4: l = e^-3 + e^-2 + 1 = 1.185
    m, l = online_softmax_stats(np.array([1.0, 2.0, 4.0]), 2)
    assert float(m) == 4.0
    assert round(float(l), 3) == 1.185
    assert float(l) == pytest.approx(np.exp(-3.0) + np.exp(-2.0) + 1.0, rel=1e-15)


def test_stats_textbook_example():
    # scores [1, 3, 2, 5], block 2: m = 5, l = 1.20345 (the book adds terms rounded to 5
    # decimals; exactly, l = e^-4 + e^-2 + e^-3 + 1 = 1.2034380)
    m, l = online_softmax_stats(BOOK_X, 2)
    assert float(m) == 5.0
    assert float(l) == pytest.approx(1.20345, abs=2e-5)
    assert float(l) == pytest.approx(np.exp(-4.0) + np.exp(-2.0) + np.exp(-3.0) + 1.0, rel=1e-15)


def test_stats_accept_lists_and_float32():
    m, l = online_softmax_stats([0.0, 1.0, 2.0], 2)
    m32, l32 = online_softmax_stats(np.array([0.0, 1.0, 2.0], dtype=np.float32), 2)
    assert m32.dtype == l32.dtype == np.float64
    assert float(m) == float(m32) == 2.0
    assert float(l) == pytest.approx(1.0 + np.exp(-1.0) + np.exp(-2.0), rel=1e-15)
    assert float(l32) == pytest.approx(float(l), rel=1e-7)


def test_stats_do_not_modify_the_input():
    x = np.array([[3.0, NEG_INF, 1.0], [NEG_INF, NEG_INF, NEG_INF]])
    before = x.copy()
    online_softmax_stats(x, 2)
    np.testing.assert_array_equal(x, before)


# ---------------------------------------------------------------------------------------------
# online_softmax_steps
# ---------------------------------------------------------------------------------------------


def test_steps_lesson_worked_example():
    steps = online_softmax_steps(LESSON_X, LESSON_V, 2)
    assert len(steps) == 2
    s1, s2 = steps
    assert (s1.start, s1.stop, s2.start, s2.stop) == (0, 2, 2, 4)
    # block 1: m = ln 2, factor 0 (start), l = 1.5, acc = 2
    assert s1.m == pytest.approx(np.log(2.0), abs=1e-15)
    assert s1.factor == 0.0
    assert s1.l == pytest.approx(1.5, rel=1e-15)
    assert float(s1.acc) == pytest.approx(2.0, rel=1e-15)
    np.testing.assert_allclose(s1.weights, [1.0, 0.5], rtol=1e-15)
    # block 2: m = ln 8, factor 1/4, l = 1.875, acc = 5.5
    assert s2.m == pytest.approx(np.log(8.0), abs=1e-15)
    assert s2.factor == pytest.approx(0.25, rel=1e-15)
    assert s2.l == pytest.approx(1.875, rel=1e-15)
    assert float(s2.acc) == pytest.approx(5.5, rel=1e-15)
    np.testing.assert_allclose(s2.weights, [0.25, 0.125, 1.0, 0.5], rtol=1e-15)
    # output 44/15, lse ln 15
    assert float(s2.acc) / s2.l == pytest.approx(44.0 / 15.0, rel=1e-15)
    assert s2.m + np.log(s2.l) == pytest.approx(np.log(15.0), rel=1e-15)


def test_steps_textbook_example():
    # The book rounds every intermediate to 4-5 digits, so its numbers are checked to 1e-4
    # relative and the exact closed forms to 1e-14.
    e = np.exp
    s1, s2 = online_softmax_steps(BOOK_X, BOOK_V, 2)
    # block 1: m = 3, l = 1.13534, acc = 21.3534
    assert s1.m == 3.0 and s1.factor == 0.0
    assert s1.l == pytest.approx(1.13534, rel=1e-4)
    assert s1.l == pytest.approx(e(-2.0) + 1.0, rel=1e-14)
    assert float(s1.acc) == pytest.approx(21.3534, rel=1e-4)
    assert float(s1.acc) == pytest.approx(10.0 * e(-2.0) + 20.0, rel=1e-14)
    # block 2: m = 5, scale_old = e^-2 = 0.13534, l = 1.20345, acc = 44.3834, O = 36.8806
    assert s2.m == 5.0
    assert s2.factor == pytest.approx(e(-2.0), rel=1e-15)
    assert s2.l == pytest.approx(1.20345, rel=1e-4)
    assert s2.l == pytest.approx(e(-4.0) + e(-2.0) + e(-3.0) + 1.0, rel=1e-14)
    assert float(s2.acc) == pytest.approx(44.3834, rel=1e-4)
    assert float(s2.acc) == pytest.approx(
        10.0 * e(-4.0) + 20.0 * e(-2.0) + 30.0 * e(-3.0) + 40.0, rel=1e-14
    )
    assert float(s2.acc) / s2.l == pytest.approx(36.8806, abs=5e-5)
    assert float(s2.acc) / s2.l == pytest.approx(
        float(direct_softmax_average(BOOK_X, BOOK_V)), rel=1e-14
    )


def test_steps_textbook_active_recall():
    # scores [2, 4, 1, 3], values [5, 15, 25, 35]: the max does not grow in block 2 (factor 1)
    e = np.exp
    x, v = np.array([2.0, 4.0, 1.0, 3.0]), np.array([5.0, 15.0, 25.0, 35.0])
    s1, s2 = online_softmax_steps(x, v, 2)
    assert s1.m == 4.0 and s2.m == 4.0
    assert s2.factor == 1.0
    assert s1.l == pytest.approx(1.1353, rel=1e-4)
    assert float(s1.acc) == pytest.approx(15.6767, rel=1e-4)
    assert s2.l == pytest.approx(1.5531, rel=1e-4)
    assert s2.l == pytest.approx(e(-2.0) + 1.0 + e(-3.0) + e(-1.0), rel=1e-14)
    assert float(s2.acc) == pytest.approx(29.7971, rel=1e-4)
    assert float(s2.acc) / s2.l == pytest.approx(19.187, abs=5e-4)
    assert float(s2.acc) / s2.l == pytest.approx(float(direct_softmax_average(x, v)), rel=1e-14)


def test_steps_lesson_check_yourself_1():
    # state m = 3, l = 2, acc = 5 (built from two scores 3 with values 2.5 each), then the block
    # of scores (5, 3) with values (1, 0): m = 5, l = 1 + 3 e^-2, acc = 1 + 5 e^-2
    x, v = np.array([3.0, 3.0, 5.0, 3.0]), np.array([2.5, 2.5, 1.0, 0.0])
    s1, s2 = online_softmax_steps(x, v, 2)
    assert (s1.m, s1.l, float(s1.acc)) == (3.0, 2.0, 5.0)
    assert s2.m == 5.0
    assert s2.factor == pytest.approx(np.exp(-2.0), rel=1e-15)
    assert s2.l == pytest.approx(1.0 + 3.0 * np.exp(-2.0), rel=1e-15)
    assert float(s2.acc) == pytest.approx(1.0 + 5.0 * np.exp(-2.0), rel=1e-15)
    assert round(s2.l, 3) == 1.406 and round(float(s2.acc), 3) == 1.677
    assert round(float(s2.acc) / s2.l, 3) == 1.193


def test_steps_lesson_small_numbers():
    s1, s2 = online_softmax_steps(np.array([1.0, 2.0, 4.0]), np.array([1.0, 1.0, 1.0]), 2)
    assert s1.m == 2.0 and round(s1.l, 3) == 1.368
    assert round(s2.factor, 3) == 0.135
    assert round(s1.l * s2.factor, 3) == 0.185
    assert s2.l == pytest.approx(np.exp(-3.0) + np.exp(-2.0) + 1.0, rel=1e-15)
    assert (s2.start, s2.stop) == (2, 3)


@st.composite
def stream_and_values(draw):
    n = draw(st.integers(1, 40))
    x = draw(
        hnp.arrays(
            np.float64,
            (n,),
            elements=st.one_of(st.floats(-40.0, 40.0), st.floats(-1e4, 1e4), st.just(NEG_INF)),
        )
    )
    d = draw(st.one_of(st.none(), st.integers(1, 4)))
    shape = (n,) if d is None else (n, d)
    v = draw(hnp.arrays(np.float64, shape, elements=st.floats(-100.0, 100.0)))
    return x, v


@given(xv=stream_and_values(), block=st.integers(1, 45))
def test_steps_every_state_equals_the_direct_prefix(xv, block):
    x, v = xv
    n = len(x)
    steps = online_softmax_steps(x, v, block)
    assert len(steps) == math.ceil(n / block)
    m_prev = NEG_INF
    for k, step in enumerate(steps):
        assert step.start == k * block
        assert step.stop == min(n, (k + 1) * block)
        prefix = x[: step.stop]
        m_ref, l_ref = direct_stats(prefix)
        w_ref = np.exp(prefix - (0.0 if m_ref == NEG_INF else m_ref))
        acc_ref = np.tensordot(w_ref, v[: step.stop], axes=(0, 0))
        assert step.m == m_ref
        assert step.l == pytest.approx(float(l_ref), rel=1e-12, abs=0)
        scale = float(np.abs(w_ref) @ np.abs(v[: step.stop]).reshape(step.stop, -1).max(axis=1))
        np.testing.assert_allclose(step.acc, acc_ref, rtol=1e-12, atol=1e-12 * scale + TINY)
        assert np.shape(step.acc) == v.shape[1:]
        np.testing.assert_allclose(step.weights, w_ref, rtol=1e-12, atol=0)
        factor_ref = 0.0 if m_prev == NEG_INF else math.exp(m_prev - step.m)
        assert step.factor == pytest.approx(factor_ref, rel=1e-12, abs=0)
        assert 0.0 <= step.factor <= 1.0
        assert not np.isnan(step.acc).any() and not np.isnan(step.weights).any()
        m_prev = step.m
    last = steps[-1]
    if np.isneginf(x).all():
        assert last.m == NEG_INF and last.l == 0.0
        np.testing.assert_array_equal(last.acc, np.zeros(v.shape[1:]))
    else:
        out_ref = direct_softmax_average(x, v)
        np.testing.assert_allclose(
            last.acc / last.l, out_ref, rtol=1e-11, atol=1e-11 * np.abs(v).max() + TINY
        )
        assert last.m + math.log(last.l) == pytest.approx(float(logsumexp(x)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("block", [1, 2, 3, 4, 5])
def test_steps_vector_values(block):
    rng = np.random.default_rng(block)
    x, v = rng.normal(scale=3.0, size=9), rng.normal(size=(9, 5))
    steps = online_softmax_steps(x, v, block)
    last = steps[-1]
    assert last.acc.shape == (5,)
    np.testing.assert_allclose(last.acc / last.l, direct_softmax_average(x, v), rtol=1e-13)
    # the state of a step does not change when a later step is computed (acc is a copy)
    np.testing.assert_allclose(
        steps[0].acc,
        np.exp(x[:block] - x[:block].max()) @ v[:block],
        rtol=1e-13,
    )


def test_steps_all_masked_then_live():
    x = np.array([NEG_INF, NEG_INF, NEG_INF, 1.0])
    v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    s1, s2 = online_softmax_steps(x, v, 2)
    assert s1.m == NEG_INF and s1.l == 0.0 and s1.factor == 0.0
    np.testing.assert_array_equal(s1.acc, [0.0, 0.0])
    np.testing.assert_array_equal(s1.weights, [0.0, 0.0])
    assert s2.m == 1.0 and s2.l == 1.0 and s2.factor == 0.0
    np.testing.assert_array_equal(s2.acc, [7.0, 8.0])


# ---------------------------------------------------------------------------------------------
# merge_partials
# ---------------------------------------------------------------------------------------------


def expected_merge(o1, lse1, o2, lse2):
    """Merge row by row with Python floats: shares of the softmax mass, empty sets weigh 0."""
    o1, o2 = np.asarray(o1, dtype=float), np.asarray(o2, dtype=float)
    lse1, lse2 = np.asarray(lse1, dtype=float), np.asarray(lse2, dtype=float)
    o = np.zeros(o1.shape)
    lse = np.full(lse1.shape, NEG_INF)
    for idx in np.ndindex(lse1.shape):
        a, b = float(lse1[idx]), float(lse2[idx])
        if a == NEG_INF and b == NEG_INF:
            continue
        top = max(a, b)
        ea, eb = (
            math.exp(a - top) if a != NEG_INF else 0.0,
            math.exp(b - top) if b != NEG_INF else 0,
        )
        lse[idx] = top + math.log(ea + eb)
        o[idx] = (ea * o1[idx] + eb * o2[idx]) / (ea + eb)
    return o, lse


def assert_merge_close(got, want, rtol=1e-12):
    (o, lse), (o_ref, lse_ref) = got, want
    assert o.shape == np.shape(o_ref) and lse.shape == np.shape(lse_ref)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    scale = max(1.0, float(np.abs(o_ref).max(initial=0.0)))
    np.testing.assert_allclose(o, o_ref, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(lse, lse_ref, rtol=rtol, atol=rtol)


lse_values = st.one_of(st.floats(-700.0, 700.0), st.floats(-5.0, 5.0), st.just(NEG_INF))
o_values = st.floats(-1e3, 1e3)


@st.composite
def partials(draw, n=2):
    """n partial results (o, lse) of one shape: rows (or a single 0-d row), scalar or d values."""
    lse_shape = draw(st.sampled_from([(), (1,), (3,), (7,)]))
    d = draw(st.one_of(st.none(), st.integers(1, 4)))
    o_shape = lse_shape if d is None else lse_shape + (d,)
    return [
        (
            draw(hnp.arrays(np.float64, o_shape, elements=o_values)),
            draw(hnp.arrays(np.float64, lse_shape, elements=lse_values)),
        )
        for _ in range(n)
    ]


@given(p=partials(2))
def test_merge_matches_the_formula(p):
    (o1, lse1), (o2, lse2) = p
    got = merge_partials(o1, lse1, o2, lse2)
    assert got[0].dtype == got[1].dtype == np.float64
    assert_merge_close(got, expected_merge(o1, lse1, o2, lse2))


@given(p=partials(2))
def test_merge_is_commutative(p):
    (o1, lse1), (o2, lse2) = p
    assert_merge_close(
        merge_partials(o2, lse2, o1, lse1), merge_partials(o1, lse1, o2, lse2), 1e-14
    )


@given(p=partials(3))
def test_merge_is_associative(p):
    (oa, la), (ob, lb), (oc, lc) = p
    left = merge_partials(*merge_partials(oa, la, ob, lb), oc, lc)
    right = merge_partials(oa, la, *merge_partials(ob, lb, oc, lc))
    assert_merge_close(left, right, 1e-12)


@st.composite
def key_split_problem(draw):
    """Queries, keys, values and a partition of the keys into 2..5 sets (maybe empty)."""
    n = draw(st.integers(1, 30))
    rows = draw(st.integers(1, 4))
    d = draw(st.integers(1, 8))
    dv = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    Q = rng.normal(scale=draw(st.sampled_from([0.5, 2.0, 6.0])), size=(rows, d))
    K = rng.normal(size=(n, d))
    V = rng.normal(size=(n, dv))
    n_sets = draw(st.integers(2, 5))
    if draw(st.booleans()):  # contiguous sets: cut points
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=n_sets - 1, max_size=n_sets - 1)))
        bounds = [0, *cuts, n]
        sets = [np.arange(bounds[i], bounds[i + 1]) for i in range(n_sets)]
    else:  # any sets: a label per key
        labels = np.array(draw(st.lists(st.integers(0, n_sets - 1), min_size=n, max_size=n)))
        sets = [np.flatnonzero(labels == s) for s in range(n_sets)]
    return Q, K, V, sets


@given(problem=key_split_problem(), data=st.data())
def test_any_split_of_the_keys_merged_in_any_order_is_full_attention(problem, data):
    Q, K, V, sets = problem
    tau = 1.0 / math.sqrt(Q.shape[1])
    O_full = scipy_softmax(tau * Q @ K.T, axis=1) @ V  # (rows, dv)
    lse_full = logsumexp(tau * Q @ K.T, axis=1)  # (rows,)
    parts = [attention_reference(Q, K[idx], V[idx]) for idx in sets]
    for (o, lse), idx in zip(parts, sets, strict=True):
        if len(idx) == 0:  # an empty set: weight 0, o = 0
            assert np.all(np.isneginf(lse)) and np.all(o == 0.0)
    # merge in a random tree order: pick any two partials (either argument order), merge, repeat
    while len(parts) > 1:
        i = data.draw(st.integers(0, len(parts) - 1))
        j = data.draw(st.integers(0, len(parts) - 2))
        j = j + 1 if j >= i else j
        a, b = parts[i], parts[j]
        parts = [p for k, p in enumerate(parts) if k not in (i, j)]
        parts.append(merge_partials(*a, *b))
    o, lse = parts[0]
    np.testing.assert_allclose(o, O_full, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(lse, lse_full, rtol=1e-12, atol=1e-12)


def test_merge_lesson_example_is_not_a_plain_average():
    # set A (keys 1, 2): lse ln 3, o 4/3; set B (keys 3, 4): lse ln 12, o 10/3
    o, lse = merge_partials(
        np.array([4.0 / 3.0]), np.log([3.0]), np.array([10.0 / 3.0]), np.log([12.0])
    )
    assert o[0] == pytest.approx(44.0 / 15.0, rel=1e-15)
    assert lse[0] == pytest.approx(np.log(15.0), rel=1e-15)
    assert abs(o[0] - 7.0 / 3.0) > 0.5  # the plain average 7/3 is wrong
    # the weights are the shares of the mass: 3/15 = 0.2 and 12/15 = 0.8
    w = np.exp(np.log([3.0, 12.0]) - lse[0])
    np.testing.assert_allclose(w, [0.2, 0.8], rtol=1e-15)


def test_merge_lesson_example_from_the_raw_scores():
    # the same merge, with the partial results computed from the scores and values themselves
    x, v = LESSON_X, LESSON_V
    parts = []
    for blk in (slice(0, 2), slice(2, 4)):
        parts += [np.array(direct_softmax_average(x[blk], v[blk])), np.array(logsumexp(x[blk]))]
    o, lse = merge_partials(*parts)
    assert np.ndim(o) == 0 and np.ndim(lse) == 0
    assert float(o) == pytest.approx(44.0 / 15.0, rel=1e-14)
    assert float(lse) == pytest.approx(np.log(15.0), rel=1e-14)


@pytest.mark.parametrize(
    ("oa", "lse_a", "ob", "lse_b", "o_want", "lse_want"),
    [
        (1.0, np.log(2.0), 4.0, np.log(6.0), 3.25, np.log(8.0)),  # check yourself 2
        (2.0, np.log(1.0), 5.0, np.log(3.0), 4.25, np.log(4.0)),  # recall card 5
    ],
)
def test_merge_lesson_exercises(oa, lse_a, ob, lse_b, o_want, lse_want):
    o, lse = merge_partials(np.array(oa), np.array(lse_a), np.array(ob), np.array(lse_b))
    assert float(o) == pytest.approx(o_want, rel=1e-15)
    assert float(lse) == pytest.approx(lse_want, rel=1e-15, abs=1e-15)


@pytest.mark.parametrize("garbage", [0.0, 7.5, -1e6])
def test_merge_empty_set_has_weight_zero(garbage):
    o1, lse1 = np.array([[1.0, -2.0], [3.0, 0.5]]), np.array([0.3, -40.0])
    empty_o, empty_lse = np.full((2, 2), garbage), np.full(2, NEG_INF)
    for o, lse in (
        merge_partials(o1, lse1, empty_o, empty_lse),
        merge_partials(empty_o, empty_lse, o1, lse1),
    ):
        np.testing.assert_allclose(o, o1, rtol=1e-15, atol=0)
        np.testing.assert_allclose(lse, lse1, rtol=1e-15, atol=0)


@pytest.mark.parametrize("garbage", [0.0, 3.0, -1e6])
def test_merge_two_empty_sets(garbage):
    o, lse = merge_partials(
        np.full(3, garbage), np.full(3, NEG_INF), np.full(3, 1.0), np.full(3, NEG_INF)
    )
    np.testing.assert_array_equal(o, np.zeros(3))
    assert np.all(np.isneginf(lse))
    o, lse = merge_partials(
        np.array([2.0, 3.0]), np.array(NEG_INF), np.array([4.0, 5.0]), np.array(NEG_INF)
    )
    assert o.shape == (2,) and lse.shape == ()
    np.testing.assert_array_equal(o, [0.0, 0.0])
    assert lse == NEG_INF


def test_merge_many_rows_some_masked_in_a_some_in_b():
    rng = np.random.default_rng(7)
    rows, d = 12, 3
    o1, o2 = rng.normal(size=(rows, d)), rng.normal(size=(rows, d))
    lse1, lse2 = rng.normal(scale=4.0, size=rows), rng.normal(scale=4.0, size=rows)
    lse1[[1, 4, 9]] = NEG_INF  # empty in A
    lse2[[2, 4, 10]] = NEG_INF  # empty in B (row 4 empty in both)
    o, lse = merge_partials(o1, lse1, o2, lse2)
    assert_merge_close((o, lse), expected_merge(o1, lse1, o2, lse2), 1e-14)
    np.testing.assert_allclose(o[[1, 9]], o2[[1, 9]], rtol=1e-15)
    np.testing.assert_allclose(o[[2, 10]], o1[[2, 10]], rtol=1e-15)
    np.testing.assert_array_equal(o[4], np.zeros(d))
    assert lse[4] == NEG_INF
    both = [0, 3, 5, 6, 7, 8, 11]
    np.testing.assert_allclose(lse[both], np.logaddexp(lse1[both], lse2[both]), rtol=1e-15)


@pytest.mark.parametrize(
    ("o_shape", "lse_shape"),
    [((5,), (5,)), ((5, 3), (5,)), ((), ()), ((4,), ()), ((2, 3), (2, 3)), ((2, 3, 4), (2, 3))],
)
def test_merge_shapes(o_shape, lse_shape):
    rng = np.random.default_rng(len(o_shape) + 10 * len(lse_shape))
    o1, o2 = rng.normal(size=o_shape), rng.normal(size=o_shape)
    lse1, lse2 = rng.normal(size=lse_shape), rng.normal(size=lse_shape)
    o, lse = merge_partials(o1, lse1, o2, lse2)
    assert o.shape == o_shape and lse.shape == lse_shape
    assert_merge_close((o, lse), expected_merge(o1, lse1, o2, lse2), 1e-14)


def test_merge_huge_and_tiny_lse_do_not_overflow():
    # exp(lse) overflows for lse > 709: the merge must work with the differences only
    o, lse = merge_partials(
        np.array([1.0, 2.0]),
        np.array([1e4, -1e4]),
        np.array([3.0, 4.0]),
        np.array([1e4, -1e4 + np.log(3.0)]),
    )
    np.testing.assert_allclose(o, [2.0, 3.5], rtol=1e-12)
    np.testing.assert_allclose(lse, [1e4 + np.log(2.0), -1e4 + np.log(4.0)], rtol=1e-15)
    o, lse = merge_partials(np.array(1.0), np.array(1e300), np.array(5.0), np.array(0.0))
    assert float(o) == 1.0 and float(lse) == 1e300


def test_merge_does_not_modify_its_inputs():
    o1, lse1 = np.array([[1.0, 2.0]]), np.array([NEG_INF])
    o2, lse2 = np.array([[3.0, 4.0]]), np.array([0.5])
    copies = [a.copy() for a in (o1, lse1, o2, lse2)]
    merge_partials(o1, lse1, o2, lse2)
    for a, c in zip((o1, lse1, o2, lse2), copies, strict=True):
        np.testing.assert_array_equal(a, c)


def test_softmax_partial_is_one_sets_output_and_logsumexp():
    from course_utils.references.softmax import softmax_partial

    x, v = np.array([0.4, 1.6, -0.8, NEG_INF]), np.array([1.0, 4.0, 2.0, 9.0])
    o, lse = softmax_partial(x, v)
    assert o == pytest.approx(float(scipy_softmax(x) @ v)) and lse == pytest.approx(logsumexp(x))
    assert softmax_partial([], []) == (0.0, NEG_INF)
    assert softmax_partial([NEG_INF, NEG_INF], [1.0, 2.0]) == (0.0, NEG_INF)
    # two sets merged: the partial of their union
    merged = merge_partials(*softmax_partial(x[:2], v[:2]), *softmax_partial(x[2:], v[2:]))
    assert merged[0] == pytest.approx(o) and merged[1] == pytest.approx(lse)
