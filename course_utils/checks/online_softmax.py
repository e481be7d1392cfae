"""Checks for notebook 01 (online softmax): the running (m, l) and one query's (out, lse).

Each check runs the learner's function on the source documents' worked examples first, then on
edge cases (a huge score, -inf entries, a row that is all -inf, an empty stream), then on random
inputs. The buggy functions below are the misconceptions a check can name; the cases are ordered
so that each bug first fails on an input where only its own buggy function matches:

    the textbook's recall question s = [2, 4, 1, 3] (block 2 does not raise the max) separates
        "own-block-max" from "no-rescale" (which is right as long as the max never grows);
    the lesson's example (block 2 raises the max) catches "no-rescale" and "rescale-l-not-acc";
    a score of 1000 catches "no-max-subtraction" in the attention output (exp(1000) = inf);
    a leading block of -inf scores and an all -inf row catch "nan-masked".
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..softmax import online_softmax_stats
from ._core import (
    LOW_PRECISION_MISTAKE,
    NAN_MISTAKE,
    Case,
    Mistake,
    check_answer,
    close,
    run_cases,
)

NEG_INF = -np.inf

# The lesson's worked example: e^x = (2, 1, 8, 4), values (1, 2, 3, 4), two blocks of two.
LESSON_X = np.log([2.0, 1.0, 8.0, 4.0])
LESSON_V = np.array([1.0, 2.0, 3.0, 4.0])
# The textbook's worked example (block 2 raises the max from 3 to 5) ...
BOOK_X = np.array([1.0, 3.0, 2.0, 5.0])
BOOK_V = np.array([10.0, 20.0, 30.0, 40.0])
# ... and its recall question 1 (block 2 has max 3 < 4: the running max does not grow).
RECALL_X = np.array([2.0, 4.0, 1.0, 3.0])
RECALL_V = np.array([5.0, 15.0, 25.0, 35.0])


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


def _att_float32(x, v, block):
    def update(m, l, acc, xb, vb):
        m_new = max(m, xb.max())
        ms = np.float32(0) if np.isneginf(m_new) else m_new
        p = np.exp(xb - ms)
        factor = np.exp(m - ms)
        return m_new, factor * l + p.sum(), factor * acc + np.tensordot(p, vb, axes=(0, 0))

    return _attention_loop(x, v, block, update, dtype=np.float32)


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
_UNGUARDED = (
    "nan-masked",
    NAN_MISTAKE.title,
    NAN_MISTAKE.explanation,
)
_LOW = ("low-precision", LOW_PRECISION_MISTAKE.title, LOW_PRECISION_MISTAKE.explanation)


def _differs_from(reference):
    """Make a buggy fn raise (so it is never named) on a case where it gives the right answer.

    A bug that is harmless on the failing case (e.g. no rescale when the max never grows)
    cannot explain a wrong result there; without this, a nearly right float32 answer would be
    named after such a bug.
    """

    def wrap(mistake: Mistake) -> Mistake:
        fn = mistake.fn

        def buggy(*args):
            theirs = fn(*args)
            expected = reference(*args)
            if all(
                close(t, e, rtol=1e-10, atol=1e-10) for t, e in zip(theirs, expected, strict=True)
            ):
                raise _SameAsReference
            return theirs

        return replace(mistake, fn=buggy)

    return wrap


class _SameAsReference(Exception):
    """Raised by a wrapped buggy function whose output is right on the case at hand."""


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
    Mistake(*_LOW, fn=_att_float32),
]


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


def _random_scores(rng, shape, *, mask=True):
    """Scores of a random scale, some -inf, now and then one huge score."""
    scale = rng.choice([0.5, 2.0, 8.0, 30.0])
    x = scale * rng.standard_normal(shape)
    if mask and rng.random() < 0.5:
        x[rng.random(shape) < 0.25] = NEG_INF
    if rng.random() < 0.25:
        x[(slice(None),) * (x.ndim - 1) + (rng.integers(shape[-1]),)] = rng.choice([300.0, 1e4])
    return x


def _stats_cases(seed, trials):
    cases = [
        Case(
            "the textbook's recall question, block 2 (block 2 does not raise the max)",
            (RECALL_X, 2),
        ),
        Case(
            "the lesson's example x = ln(2, 1, 8, 4), block 2 (block 2 raises the max)",
            (LESSON_X, 2),
        ),
        Case("the textbook's example s = (1, 3, 2, 5), block 2", (BOOK_X, 2)),
        Case("the lesson's example read one score at a time (block 1)", (LESSON_X, 1)),
        Case("one block larger than the stream (block 10 > n = 4)", (BOOK_X, 10)),
        Case("an empty stream (n = 0)", (np.zeros(0), 3)),
        Case(
            "a huge score (1000) in a ragged stream of 5, block 2",
            (np.array([0.5, -1.0, 1000.0, 3.0, 999.0]), 2),
        ),
        Case(
            "-inf scores, the first block all -inf, block 2",
            (np.array([NEG_INF, NEG_INF, 1.0, NEG_INF, 2.0]), 2),
        ),
        Case(
            "a batch of 3 rows of 7 scores, block 3 (ragged), row 1 all -inf",
            (
                np.array(
                    [
                        [0.3, -1.2, 2.5, 0.0, 1.1, -0.4, 3.0],
                        [NEG_INF] * 7,
                        [1e4, 2.0, NEG_INF, 9999.0, -3.0, 0.5, 1.0],
                    ]
                ),
                3,
            ),
        ),
        Case(
            "a batch of shape (2, 3, 10), block 4: the stream is the last axis",
            (np.random.default_rng(1).standard_normal((2, 3, 10)) * 4, 4),
        ),
        Case(
            "40 scores in 40 blocks of 1 (many blocks)",
            (np.random.default_rng(2).standard_normal(40) * 3, 1),
        ),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        n = int(rng.integers(1, 60))
        shape = (n,) if rng.random() < 0.4 else (int(rng.integers(1, 6)), n)
        block = int(rng.integers(1, n + 4))
        cases.append(
            Case(
                f"random case {t + 1}: shape {shape}, block {block}",
                (_random_scores(rng, shape), block),
            )
        )
    return cases


def _attention_cases(seed, trials):
    rng1 = np.random.default_rng(1)
    cases = [
        Case(
            "the textbook's recall question, block 2 (block 2 does not raise the max)",
            (RECALL_X, RECALL_V, 2),
        ),
        Case(
            "the lesson's example x = ln(2, 1, 8, 4), v = (1, 2, 3, 4), block 2",
            (LESSON_X, LESSON_V, 2),
        ),
        Case(
            "the textbook's example s = (1, 3, 2, 5), v = (10, 20, 30, 40), block 2",
            (BOOK_X, BOOK_V, 2),
        ),
        Case("the lesson's example read one score at a time (block 1)", (LESSON_X, LESSON_V, 1)),
        Case("one block larger than the stream (block 10 > n = 4)", (BOOK_X, BOOK_V, 10)),
        Case(
            "vector values v of shape (5, 3), block 2 (ragged)",
            (rng1.standard_normal(5) * 2, rng1.standard_normal((5, 3)), 2),
        ),
        Case(
            "a huge score (1000), values of shape (5, 2), block 2",
            (
                np.array([0.5, -1.0, 1000.0, 3.0, 999.0]),
                np.array([[1.0, 0.0], [2.0, -1.0], [3.0, 0.5], [4.0, 2.0], [5.0, 1.0]]),
                2,
            ),
        ),
        Case(
            "-inf scores, the first block all -inf, block 2",
            (
                np.array([NEG_INF, NEG_INF, 1.0, NEG_INF, 2.0]),
                np.array([7.0, -7.0, 1.0, 100.0, 3.0]),
                2,
            ),
        ),
        Case(
            "a row of 5 scores, all -inf (fully masked), values (5, 2), block 2",
            (np.full(5, NEG_INF), np.arange(10.0).reshape(5, 2), 2),
        ),
        Case("an empty stream (n = 0), values of shape (0, 2)", (np.zeros(0), np.zeros((0, 2)), 3)),
        Case(
            "50 scores in 50 blocks of 1, values (50, 4)",
            (rng1.standard_normal(50) * 3, rng1.standard_normal((50, 4)), 1),
        ),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        n = int(rng.integers(1, 60))
        block = int(rng.integers(1, n + 4))
        x = _random_scores(rng, (n,))
        if rng.random() < 0.1:
            x[:] = NEG_INF
        v = rng.standard_normal((n,) if rng.random() < 0.3 else (n, int(rng.integers(1, 6))))
        cases.append(
            Case(f"random case {t + 1}: n = {n}, v shape {v.shape}, block {block}", (x, v, block))
        )
    return cases


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def check_online_softmax_stats(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(x, block) -> (m, l) against course_utils.online_softmax_stats; print ✓ or raise.

    Cases: the documents' examples, block 1 and block > n, an empty stream, a huge score, -inf
    scores, an all -inf row in a batch, a 3-D batch, then `trials` random inputs (seed=None:
    fresh ones).
    """
    run_cases(
        "online_softmax_stats",
        fn,
        _stats_reference,
        _stats_cases(seed, trials),
        outputs=("m", "l"),
        mistakes=[_differs_from(_stats_reference)(m) for m in STATS_MISTAKES],
        summary="worked examples, any block size, huge and -inf scores, batches of rows",
    )


def check_online_softmax_attention(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(x, v, block) -> (o, lse) against the direct softmax average; print ✓ or raise.

    Cases: the documents' examples, block 1 and block > n, vector values, a huge score, -inf
    scores, an all -inf row, an empty stream, then `trials` random inputs (seed=None: fresh).
    """
    run_cases(
        "online_softmax_attention",
        fn,
        _online_attention_reference,
        _attention_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=[_differs_from(_online_attention_reference)(m) for m in ATTENTION_MISTAKES],
        summary="worked examples, scalar and vector values, huge and -inf scores, masked rows",
    )


# ---------------------------------------------------------------------------------------------
# Quick checks (the expected numbers are computed here, not written in the notebook)
# ---------------------------------------------------------------------------------------------

# Check yourself 1: state m = 3, l = 2, acc = 5; a block with scores (5, 3) and values (1, 0).
_CY_M, _CY_L, _CY_ACC = 3.0, 2.0, 5.0
_CY_X, _CY_V = np.array([5.0, 3.0]), np.array([1.0, 0.0])


def _check_yourself_state():
    m_new = max(_CY_M, _CY_X.max())
    factor = np.exp(_CY_M - m_new)
    p = np.exp(_CY_X - m_new)
    return factor * _CY_L + p.sum(), factor * _CY_ACC + p @ _CY_V


def _near(a, b):
    try:
        return abs(float(a) - b) <= 5e-3 * abs(b)
    except (TypeError, ValueError):
        return False


def check_quick_rescale(answer) -> None:
    """Quick check: the factor for the old l and acc when the max goes from 3 to 5."""
    expected = np.exp(3.0 - 5.0)
    hint = "the factor is exp(m_old - m_new); it is at most 1, since the old terms must shrink."
    if _near(answer, np.exp(5.0 - 3.0)):
        hint = "that is exp(m_new - m_old) = e^2; the old terms must shrink, so the factor is <= 1."
    check_answer("rescale factor", answer, expected, rtol=5e-3, hint=hint)


def check_quick_new_l(answer) -> None:
    """Quick check (check yourself 1): the new l after the block (5, 3)."""
    l_new, _ = _check_yourself_state()
    hint = "rescale the old l = 2 by exp(3 - 5), then add exp(x_i - 5) for the two new scores."
    if _near(answer, _CY_L + np.exp(0.0) + np.exp(-2.0)):
        hint = "you added the new terms to the old l = 2 without rescaling it by exp(3 - 5)."
    check_answer("new l", answer, l_new, rtol=5e-3, hint=hint)


def check_quick_output(answer) -> None:
    """Quick check (check yourself 1): the output so far, acc / l, after the block (5, 3)."""
    l_new, acc_new = _check_yourself_state()
    hint = "compute acc the same way as l (old acc = 5 times the factor, plus exp(x_i - 5) v_i)."
    if _near(answer, acc_new):
        hint = "that is the new acc; the output so far is acc / l."
    elif _near(answer, l_new):
        hint = "that is the new l; the output so far is acc / l."
    elif _near(answer, (_CY_ACC + 1.0) / l_new):
        hint = "acc needs the rescale factor exp(3 - 5) too, not only l."
    check_answer("output acc / l", answer, acc_new / l_new, rtol=5e-3, hint=hint)
