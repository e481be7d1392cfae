"""Online softmax statistics and the logsumexp merge of two partial softmax results.

Everything here is float64 NumPy. The one invariant behind both ideas: a partial result over a
set A of scores is a pair (o_A, lse_A) with lse_A = log sum_{i in A} exp(x_i), and the empty set
has lse = -inf, weight 0 and o = 0. No function here ever evaluates -inf - (-inf).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_utils._validate import as_float_array, positive_int
from course_utils.harness.constants import NEG_INF


def _finite_or_zero(m: np.ndarray) -> np.ndarray:
    """m with -inf replaced by 0: subtracting it from -inf scores gives -inf, never NaN."""
    return np.where(np.isneginf(m), 0.0, m)


def online_softmax_stats(x, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Running max m and running sum l = sum_i exp(x_i - m), reading x in blocks of `block`.

    For each block j:  m_j = max(m_{j-1}, max(block)),
                       l_j = exp(m_{j-1} - m_j) * l_{j-1} + sum_block exp(x_i - m_j).
    The result is exact for any block size: m + log(l) = logsumexp(x).

    Args:
        x: scores, shape (n,) for one stream or (..., n) for a batch of rows (the last axis is
            the stream). -inf entries are masked scores; +inf and NaN are refused.
        block: how many scores are read at a time, a positive int (may exceed n).

    Returns:
        (m, l): float64 arrays of shape x.shape[:-1] (0-d for a single stream). A row that is
        empty or all -inf gives m = -inf, l = 0.
    """
    x = as_float_array(x, "x", allow_inf=True)
    if x.ndim == 0:
        raise ValueError("x must have at least 1 dimension (the stream of scores), got a scalar")
    block = positive_int(block, "block")
    m = np.full(x.shape[:-1], NEG_INF)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]  # read `block` scores per row
        m_new = np.maximum(m, xb.max(axis=-1))
        m_safe = _finite_or_zero(m_new)
        with np.errstate(over="ignore"):  # x - m may round to -inf: its exp is 0, as it should be
            l = np.exp(m - m_safe) * l + np.exp(xb - m_safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l


@dataclass(frozen=True)
class OnlineStep:
    """The state of one query after a block: what the online-softmax stepper shows."""

    start: int  # first index of the block
    stop: int  # one past its last index
    m: float  # running max after the block
    factor: float  # exp(m_old - m_new), the rescale applied to the old l and acc
    l: float  # running sum of exp(x_i - m)
    acc: np.ndarray  # running unnormalized output sum exp(x_i - m) v_i, shape (d,) or ()
    weights: np.ndarray  # exp(x_i - m) for the scores seen so far, shape (stop,)


def online_softmax_steps(x, v, block: int) -> list[OnlineStep]:
    """The running (m, l, acc) of one query after every block of keys.

    Args:
        x: scores of one query, shape (n,), -inf allowed.
        v: values, shape (n,) (scalar values) or (n, d).
        block: positive int.

    Returns:
        One OnlineStep per block. After the last one, acc / l is the softmax average of v and
        m + log(l) the logsumexp of x (acc = 0, l = 0 if every score is -inf).
    """
    x = as_float_array(x, "x", ndim=1, allow_inf=True)
    v = as_float_array(v, "v", ndim=(1, 2))
    if v.shape[0] != x.shape[0]:
        raise ValueError(f"v must have one value per score: x has {x.shape}, v has {v.shape}")
    block = positive_int(block, "block")
    m, l, acc = NEG_INF, 0.0, np.zeros(v.shape[1:])
    steps = []
    for start in range(0, len(x), block):
        xb, vb = x[start : start + block], v[start : start + block]
        m_new = max(m, float(xb.max()))
        m_safe = 0.0 if m_new == NEG_INF else m_new
        factor = float(np.exp(m - m_safe))
        p = np.exp(xb - m_safe)
        l = factor * l + p.sum()
        acc = factor * acc + np.tensordot(p, vb, axes=(0, 0))
        m = m_new
        weights = np.exp(x[: start + len(xb)] - m_safe)
        steps.append(OnlineStep(start, start + len(xb), m, factor, float(l), acc.copy(), weights))
    return steps


def softmax_partial(scores, values) -> tuple[float, float]:
    """The partial result (o, lse) of one set of scores, by a direct softmax.

        o = sum_i e^(x_i - m) v_i / l,   lse = m + log(l),   l = sum_i e^(x_i - m),  m = max x_i.

    Args:
        scores: (n,) scores of one query, finite or -inf (masked); n may be 0.
        values: (n,) scalar values.

    Returns:
        (o, lse) as floats; (0.0, -inf) for an empty or fully masked set (weight 0).
    """
    scores = np.asarray(scores, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    m = scores.max(initial=NEG_INF)
    if m == NEG_INF:
        return 0.0, NEG_INF
    p = np.exp(scores - m)
    l = p.sum()
    return float(p @ values / l), float(m + np.log(l))


def merge_partials(o1, lse1, o2, lse2) -> tuple[np.ndarray, np.ndarray]:
    """Merge two partial softmax results over disjoint key sets A and B.

        lse = log(exp(lse1) + exp(lse2)),   o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2.

    The weights are the shares of the softmax mass in A and in B; they add up to 1. An empty set
    (lse = -inf) has weight 0; two empty sets give o = 0, lse = -inf.

    Args:
        o1, o2: normalized partial outputs, shape (rows, d), or (rows,) for scalar values;
            finite (an empty set's o is ignored but must not be NaN).
        lse1, lse2: their logsumexps, shape (rows,), natural log; -inf marks an empty set.
        A single row works too: lse of shape () and o of shape (d,) or ().

    Returns:
        (o, lse) with the shapes of (o1, lse1), float64.
    """
    lse1 = as_float_array(lse1, "lse1", allow_inf=True)
    lse2 = as_float_array(lse2, "lse2", allow_inf=True)
    o1 = as_float_array(o1, "o1")
    o2 = as_float_array(o2, "o2")
    if lse1.shape != lse2.shape:
        raise ValueError(f"lse1 and lse2 must have the same shape, got {lse1.shape}, {lse2.shape}")
    if o1.shape != o2.shape:
        raise ValueError(f"o1 and o2 must have the same shape, got {o1.shape} and {o2.shape}")
    if o1.shape[: lse1.ndim] != lse1.shape or o1.ndim not in (lse1.ndim, lse1.ndim + 1):
        raise ValueError(
            f"o1 must have shape lse1.shape {lse1.shape} or lse1.shape + (d,), got {o1.shape}"
        )
    with np.errstate(over="ignore"):  # differences beyond float range: weights of exactly 0
        lse = np.logaddexp(lse1, lse2)  # -inf only when both sets are empty
        lse_safe = _finite_or_zero(lse)
        w1 = np.exp(lse1 - lse_safe)  # 0 for an empty set, never exp(-inf - (-inf))
        w2 = np.exp(lse2 - lse_safe)
    if o1.ndim > lse1.ndim:
        w1, w2 = w1[..., None], w2[..., None]
    return w1 * o1 + w2 * o2, lse
