"""Notebook 01's float64 references and known mistakes (buggy implementations, one each).

    STATS_MISTAKES, ATTENTION_MISTAKES     wrong values: each Mistake's fn is a buggy
                                           online_softmax_stats / online_softmax_attention
    STATS_RULE_MISTAKES, ATTENTION_RULE_MISTAKES
                                           right values, wrong algorithm (the whole row at once,
                                           several passes): each breaks the exercise's rule

x: scores of shape (..., n) (the last axis is the stream); v: values of shape (n, d) or (n,).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from course_utils.checks.engine.failures import LOW_PRECISION_MISTAKE, NAN_MISTAKE, Mistake
from course_utils.checks.engine.tracing import TILE_READS
from course_utils.references.softmax import online_softmax_stats

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# References (float64)
# ---------------------------------------------------------------------------------------------


def _stats_reference(x, block):
    return online_softmax_stats(x, block)


def _online_attention_reference(x, v, block):
    """Direct softmax average of one query, no blocks: o = softmax(x) @ v, lse = logsumexp(x).

    Args:
        x: (n,) scores, -inf allowed.  v: (n,) or (n, d) values.  block: ignored (the answer
            does not depend on it; that is the point of the exercise).

    Returns:
        o: () or (d,) float64, 0 when no score is finite.  lse: () float64, -inf then.
    """
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m = x.max(initial=NEG_INF)
    if np.isneginf(m):
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    p = np.exp(x - m)  # in (0, 1]: nothing overflows
    l = p.sum()
    return np.tensordot(p, v, axes=(0, 0)) / l, np.float64(m + np.log(l))


# ---------------------------------------------------------------------------------------------
# Buggy implementations: one per misconception (each guards -inf unless the bug is the guard)
# ---------------------------------------------------------------------------------------------


def _safe(m):
    return np.where(np.isneginf(m), 0.0, m)


def _blocks(n, block):
    return [slice(s, s + block) for s in range(0, n, block)]


def _stats_loop(x, block, update):
    """Run `update(m, l, xb) -> (m, l)` over the blocks of the last axis of x."""
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], NEG_INF)
    l = np.zeros(x.shape[:-1])
    for sl in _blocks(x.shape[-1], block):
        m, l = update(m, l, x[..., sl])
    return m, l


def _stats_no_rescale(x, block):
    def update(m, l, xb):
        m_new = np.maximum(m, xb.max(axis=-1))
        return m_new, l + np.exp(xb - _safe(m_new)[..., None]).sum(axis=-1)  # old l not rescaled

    return _stats_loop(x, block, update)


def _stats_own_block_max(x, block):
    def update(m, l, xb):
        mb = xb.max(axis=-1)
        l_block = np.exp(xb - _safe(mb)[..., None]).sum(axis=-1)  # relative to the block's max
        return np.maximum(m, mb), l + l_block  # ... and added as if it were relative to m

    return _stats_loop(x, block, update)


def _stats_no_max(x, block):
    def update(m, l, xb):
        return np.maximum(m, xb.max(axis=-1)), l + np.exp(xb).sum(axis=-1)  # exp(1000) = inf

    return _stats_loop(x, block, update)


def _stats_unguarded(x, block):
    def update(m, l, xb):
        m_new = np.maximum(m, xb.max(axis=-1))  # -inf - (-inf) = nan below
        return m_new, np.exp(m - m_new) * l + np.exp(xb - m_new[..., None]).sum(axis=-1)

    return _stats_loop(x, block, update)


def _stats_float32(x, block):
    x = np.asarray(x, dtype=np.float32)
    m = np.full(x.shape[:-1], NEG_INF, dtype=np.float32)
    l = np.zeros(x.shape[:-1], dtype=np.float32)
    for sl in _blocks(x.shape[-1], block):
        xb = x[..., sl]
        m_new = np.maximum(m, xb.max(axis=-1))
        ms = np.where(np.isneginf(m_new), np.float32(0), m_new)
        l = np.exp(m - ms) * l + np.exp(xb - ms[..., None]).sum(axis=-1)
        m = m_new
    return m.astype(np.float64), l.astype(np.float64)


def _attention_loop(x, v, block, update, dtype=np.float64):
    """Run `update(m, l, acc, xb, vb) -> (m, l, acc)`; return (acc / l, m + log l), guarded."""
    x = np.asarray(x, dtype=dtype)
    v = np.asarray(v, dtype=dtype)
    m, l, acc = dtype(NEG_INF), dtype(0.0), np.zeros(v.shape[1:], dtype=dtype)
    for sl in _blocks(len(x), block):
        m, l, acc = update(m, l, acc, x[sl], v[sl])
    if l == 0:
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    return np.float64(1.0) * acc / l, np.float64(m + np.log(l))


def _att_no_rescale(x, v, block):
    def update(m, l, acc, xb, vb):
        m_new = max(m, xb.max())
        p = np.exp(xb - _safe(m_new))
        return m_new, l + p.sum(), acc + np.tensordot(p, vb, axes=(0, 0))

    return _attention_loop(x, v, block, update)


def _att_rescale_l_not_acc(x, v, block):
    def update(m, l, acc, xb, vb):
        m_new = max(m, xb.max())
        p = np.exp(xb - _safe(m_new))
        factor = np.exp(m - _safe(m_new))
        return m_new, factor * l + p.sum(), acc + np.tensordot(p, vb, axes=(0, 0))

    return _attention_loop(x, v, block, update)


def _att_own_block_max(x, v, block):
    def update(m, l, acc, xb, vb):
        mb = xb.max()
        p = np.exp(xb - _safe(mb))
        return max(m, mb), l + p.sum(), acc + np.tensordot(p, vb, axes=(0, 0))

    return _attention_loop(x, v, block, update)


def _att_normalize_then_average(x, v, block):
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    outs = []
    for sl in _blocks(len(x), block):
        xb, vb = x[sl], v[sl]
        mb = xb.max()
        if np.isneginf(mb):
            continue
        p = np.exp(xb - mb)
        outs.append(np.tensordot(p, vb, axes=(0, 0)) / p.sum())  # each block normalized ...
    _, lse = _online_attention_reference(x, v, block)
    o = np.mean(outs, axis=0) if outs else np.zeros(v.shape[1:])  # ... then a plain average
    return o, lse


def _att_no_max(x, v, block):
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    l, acc = 0.0, np.zeros(v.shape[1:])
    for sl in _blocks(len(x), block):
        p = np.exp(x[sl])  # exp(1000) = inf, and inf / inf = nan
        l, acc = l + p.sum(), acc + np.tensordot(p, v[sl], axes=(0, 0))
    if l == 0:
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    return acc / l, np.float64(np.log(l))


def _att_unguarded(x, v, block):
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m, l, acc = NEG_INF, 0.0, np.zeros(v.shape[1:])
    for sl in _blocks(len(x), block):
        m_new = max(m, x[sl].max())
        p = np.exp(x[sl] - m_new)  # nan when m_new is still -inf
        factor = np.exp(m - m_new)
        l, acc = factor * l + p.sum(), factor * acc + np.tensordot(p, v[sl], axes=(0, 0))
        m = m_new
    return acc / l, np.float64(m + np.log(l))  # 0 / 0 = nan for an all -inf row


def _att_divides_empty(x, v, block):
    """The update guarded, but acc / l divided without a guard: 0 / 0 for a fully masked row."""

    def update(m, l, acc, xb, vb):
        m_new = max(m, xb.max())
        p, factor = np.exp(xb - _safe(m_new)), np.exp(m - _safe(m_new))
        return m_new, factor * l + p.sum(), factor * acc + np.tensordot(p, vb, axes=(0, 0))

    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m, l, acc = NEG_INF, 0.0, np.zeros(v.shape[1:])
    for sl in _blocks(len(x), block):
        m, l, acc = update(m, l, acc, x[sl], v[sl])
    return acc / l, np.float64(m + np.log(l))  # nan and -inf when l == 0


def _att_float32(x, v, block):
    def update(m, l, acc, xb, vb):
        m_new = max(m, xb.max())
        ms = np.float32(0) if np.isneginf(m_new) else m_new
        p = np.exp(xb - ms)
        factor = np.exp(m - ms)
        return m_new, factor * l + p.sum(), factor * acc + np.tensordot(p, vb, axes=(0, 0))

    return _attention_loop(x, v, block, update, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Right values, wrong algorithm: the rule of the exercise is broken (each one's values are exact)
# ---------------------------------------------------------------------------------------------


def _stats_whole_row(x, block):
    """The safe softmax of section 2 on each row: one max and one sum over the whole row."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, initial=NEG_INF)
    return m, np.exp(x - _safe(m)[..., None]).sum(axis=-1)


def _stats_logsumexp(x, block):
    """l from scipy's logsumexp of the whole row: m + log l = lse, so l = exp(lse - m)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, initial=NEG_INF)
    lse = logsumexp(x, axis=-1)
    return m, np.where(np.isneginf(m), 0.0, np.exp(lse - _safe(m)))


def _stats_two_pass(x, block):
    """Blocks of `block`, but two passes: every block for the max, then every block for the sum."""
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], NEG_INF)
    for sl in _blocks(x.shape[-1], block):
        m = np.maximum(m, x[..., sl].max(axis=-1))
    l = np.zeros(x.shape[:-1])
    for sl in _blocks(x.shape[-1], block):
        l = l + np.exp(x[..., sl] - _safe(m)[..., None]).sum(axis=-1)
    return m, l


def _att_whole_row(x, v, block):
    """The safe softmax average of section 2: p = exp(x - x.max()) over the whole row."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m = x.max(initial=NEG_INF)
    if np.isneginf(m):
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    p = np.exp(x - m)
    return p @ v / p.sum(), np.float64(m + np.log(p.sum()))


def _att_logsumexp(x, v, block):
    """Weights exp(x - lse) with lse from scipy's logsumexp of the whole row."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    lse = logsumexp(x)
    if np.isneginf(lse):
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    return np.exp(x - lse) @ v, np.float64(lse)


def _att_three_pass(x, v, block):
    """The three passes of section 8, block by block: the max, then the sum, then the values."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    blocks = _blocks(len(x), block)
    m = max((x[sl].max() for sl in blocks), default=NEG_INF)
    if np.isneginf(m):
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    l = sum(np.exp(x[sl] - m).sum() for sl in blocks)
    acc = sum(np.tensordot(np.exp(x[sl] - m), v[sl], axes=(0, 0)) for sl in blocks)
    return acc / l, np.float64(m + np.log(l))


def _att_values_at_the_end(x, v, block):
    """One online pass over the scores, but the weights kept and multiplied with all of v last."""
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m, l, weights = NEG_INF, 0.0, []
    for sl in _blocks(len(x), block):
        xb = x[sl]
        m_new = max(m, xb.max())
        factor = np.exp(m - _safe(m_new))
        weights = [w * factor for w in weights] + [np.exp(xb - _safe(m_new))]
        l, m = factor * l + weights[-1].sum(), m_new
    if l == 0:
        return np.zeros(v.shape[1:]), np.float64(NEG_INF)
    return np.tensordot(np.concatenate(weights), v, axes=(0, 0)) / l, np.float64(m + np.log(l))


# ---------------------------------------------------------------------------------------------
# The misconceptions
# ---------------------------------------------------------------------------------------------

_NO_RESCALE = (
    "no-rescale",
    "the old sums are not rescaled when the max grows",
    "l (and acc) are sums of exp(x_i - m) for the CURRENT max m. When a block raises the max "
    "from m_old to m_new, every old term is too large by exp(m_new - m_old): multiply the old l "
    "and acc by the rescale factor exp(m_old - m_new) <= 1 before adding the new block's terms.",
)
_OWN_BLOCK_MAX = (
    "own-block-max",
    "each block's sum is taken relative to the block's own max and added without a correction",
    "A block's terms exp(x_i - m_block) are relative to the block's max, the old sum is relative "
    "to m_old. Bring both to m_new = max(m_old, m_block) before adding: the old sum times "
    "exp(m_old - m_new), the block's sum times exp(m_block - m_new) (or use exp(x_i - m_new)).",
)
_NO_MAX = (
    "no-max-subtraction",
    "the max is not subtracted before exp",
    "exp(x) overflows for large scores: exp(89) is inf in float32 and exp(710) in float64, and "
    "inf / inf = nan. Keep l = sum exp(x_i - m) relative to the running max m, so that every "
    "exponent is <= 0 and every term lies in [0, 1].",
)
_UNGUARDED = (NAN_MISTAKE.slug, NAN_MISTAKE.title, NAN_MISTAKE.explanation)
_LOW = ("low-precision", LOW_PRECISION_MISTAKE.title, LOW_PRECISION_MISTAKE.explanation)
_WHOLE_STREAM = (
    "whole-stream",
    "the whole row of scores is read at once",
    "The exercise is the one-pass algorithm: read a block, x[..., s:s + block], fold it into the "
    "running m and l, and move on to the next. x.max(), np.exp(x - x.max()) or "
    "scipy.special.logsumexp(x) read the whole row at once: that is the safe softmax of section "
    "2, and FlashAttention never holds a whole row of scores. (Computing with a whole row, "
    "x[r].max() or np.exp(row - m), reads it whole too: slice each block, x[..., s:s + block] or "
    "row[s:s + block], and compute with the block.)",
)
_MULTI_PASS = (
    "multi-pass",
    "the scores are read more than once (a pass for the max, another for the sum)",
    "Reading the blocks once for the max and again for the sum (and the values) is the "
    "multi-pass safe softmax of sections 2 and 8. In one pass each block updates m, l (and acc) "
    "as it arrives: when it raises the max, the old sums are multiplied by exp(m_old - m_new), so "
    "no block is ever needed again. Read each score (and each value) exactly once. " + TILE_READS,
)

STATS_MISTAKES = [
    Mistake(*_NO_RESCALE, fn=_stats_no_rescale),
    Mistake(*_OWN_BLOCK_MAX, fn=_stats_own_block_max),
    Mistake(*_NO_MAX, fn=_stats_no_max),
    Mistake(*_UNGUARDED, fn=_stats_unguarded),
    Mistake(*_LOW, fn=_stats_float32),
]

ATTENTION_MISTAKES = [
    Mistake(*_NO_RESCALE, fn=_att_no_rescale),
    Mistake(
        "rescale-l-not-acc",
        "l is rescaled when the max grows, but acc is not",
        "acc = sum exp(x_i - m) v_i is relative to the running max exactly like l. When the max "
        "grows, multiply BOTH by exp(m_old - m_new); otherwise the old values keep too much "
        "weight in acc / l.",
        fn=_att_rescale_l_not_acc,
    ),
    Mistake(*_OWN_BLOCK_MAX, fn=_att_own_block_max),
    Mistake(
        "normalize-then-average",
        "each block is normalized on its own, then the blocks are averaged",
        "A block's normalized output sum(p v) / sum(p) forgets how much softmax mass the block "
        "holds. Keep acc unnormalized across blocks and divide by l once, at the end (or weight "
        "each block by exp(lse_block - lse), never by 1 / number of blocks).",
        fn=_att_normalize_then_average,
    ),
    Mistake(*_NO_MAX, fn=_att_no_max),
    Mistake(*_UNGUARDED, fn=_att_unguarded),
    Mistake(*_UNGUARDED, fn=_att_divides_empty),
    Mistake(*_LOW, fn=_att_float32),
]

# The rules' mistakes: right values, computed the way the exercise forbids. The first of each
# slug is the one a rule names; the others are further replays of it (for the tests).
STATS_RULE_MISTAKES = [
    Mistake(*_WHOLE_STREAM, fn=_stats_whole_row),
    Mistake(*_MULTI_PASS, fn=_stats_two_pass),
    Mistake(*_WHOLE_STREAM, fn=_stats_logsumexp),
]

ATTENTION_RULE_MISTAKES = [
    Mistake(*_WHOLE_STREAM, fn=_att_whole_row),
    Mistake(*_MULTI_PASS, fn=_att_three_pass),
    Mistake(
        "values-read-whole",
        "the values are read all at once, not block by block with their scores",
        "A block of keys brings its values along, and in FlashAttention both are gone after the "
        "block: add p @ v[s:s + block] to acc (rescaled with l) in the same step as the block's "
        "scores. Collecting the weights and multiplying them with all of v at the end reads v "
        "as a whole.",
        fn=_att_values_at_the_end,
    ),
    Mistake(*_WHOLE_STREAM, fn=_att_logsumexp),
]
