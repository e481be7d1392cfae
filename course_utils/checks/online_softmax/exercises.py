"""Checks for notebook 01 (online softmax): the running (m, l) and one query's (out, lse).

Each check runs the learner's function on the notebook's worked examples first, then on edge
cases (a huge score, -inf entries, a row that is all -inf, an empty stream), then on random
inputs. The buggy functions (mistakes.py) are the misconceptions a check can name; cases are ordered
so that each bug first fails on an input where only its own buggy function matches:

    the scores s = (2, 4, 1, 3) of quick check 4 (block 2 does not raise the max) separate
        "own-block-max" from "no-rescale" (which is right as long as the max never grows);
    the example of section 4(b) (block 2 raises the max) catches "no-rescale" and
        "rescale-l-not-acc";
    a score of 1000 catches "no-max-subtraction" in the attention output (exp(1000) = inf);
    a leading block of -inf scores and an all -inf row catch "nan-masked";
    a float32 replay of the whole update names "low-precision" (only when it matches).

Once every value is right, the rule of the exercise is checked: the function reads each score
once, in blocks of `block` (and, for the attention, each value once, with its score). The input
is traced (see _core.LoadLog) on a batch big enough that a whole row is many blocks long:

    a read wider than a block (x.max(), np.exp(x - x.max()), scipy's logsumexp: the safe
        softmax of section 2)                                                -> whole-stream
    a score read twice (a pass for the max, then one for the sum)            -> multi-pass
    all values read at once at the end (p @ v with the whole v)              -> values-read-whole

No memory budget: a learner may legitimately copy the input first (x.astype(np.float64), or the
float64 copy of float32 scores), and that copy is as large as the row-sized temporaries the rule
forbids (np.exp(x - m) is one row of the same size), so no budget can be 10x below the forbidden
array and above every correct answer. The loads are what certify streaming: they see the reads
themselves, whatever is allocated.
"""

from __future__ import annotations

import numpy as np

from course_utils.checks.engine.cases import Case, frozen, run_cases
from course_utils.checks.engine.quizzes import hinted_answer
from course_utils.checks.engine.rules import single_pass_rule, tile_rule
from course_utils.checks.online_softmax.mistakes import (
    ATTENTION_MISTAKES,
    ATTENTION_RULE_MISTAKES,
    STATS_MISTAKES,
    STATS_RULE_MISTAKES,
    _online_attention_reference,
    _stats_reference,
)

NEG_INF = -np.inf

# The example of section 4(b): e^x = (2, 1, 8, 4), values (1, 2, 3, 4), two blocks of two.
EXAMPLE_X, EXAMPLE_V = frozen(np.log([2.0, 1.0, 8.0, 4.0]), np.array([1.0, 2.0, 3.0, 4.0]))
# The example of section 4(c), in the block-local form (block 2 raises the max from 3 to 5) ...
LOCAL_X, LOCAL_V = frozen(np.array([1.0, 3.0, 2.0, 5.0]), np.array([10.0, 20.0, 30.0, 40.0]))
# ... and quick check 4 (block 2 has max 3 < 4: the running max does not grow).
FURTHER_X, FURTHER_V = frozen(np.array([2.0, 4.0, 1.0, 3.0]), np.array([5.0, 15.0, 25.0, 35.0]))


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


_FOCUS_RESCALE = (
    "the rescale: when a block raises the max, the old l (and acc) are multiplied by "
    "exp(m_old - m_new)"
)
_FOCUS_BLOCKS = "any block size: block = 1, and block > n (the last block may be shorter)"
_FOCUS_HUGE = "a huge score: every exponent must be x_i - m <= 0, so nothing overflows"
_FOCUS_MASKED = (
    "-inf scores: a block (or row) that is all -inf keeps m = -inf and l = 0, without NaN "
    "(use a finite stand-in for the max)"
)
_FOCUS_EMPTY = "an empty stream: m = -inf and l = 0, of shape x.shape[:-1]"
_FOCUS_BATCH = "a batch of rows: the last axis is the stream, m and l have shape x.shape[:-1]"
_FOCUS_VECTOR = "vector values: acc and out have shape v.shape[1:] = (d,)"
_FOCUS_EMPTY_QUERY = (
    "a query with no finite score: out = 0 (zeros of shape v.shape[1:]) and lse = -inf, no NaN"
)


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
            "the scores s = (2, 4, 1, 3), block 2 (the second block, (1, 3), does not raise the "
            "running max 4)",
            (FURTHER_X, 2),
            focus=_FOCUS_RESCALE,
        ),
        Case(
            "the example x = ln(2, 1, 8, 4) of section 4(b), block 2 (block 2 raises the max)",
            (EXAMPLE_X, 2),
            focus=_FOCUS_RESCALE,
        ),
        Case("the example s = (1, 3, 2, 5) of section 4(c), block 2", (LOCAL_X, 2)),
        Case(
            "the example x = ln(2, 1, 8, 4) read one score at a time (block 1)",
            (EXAMPLE_X, 1),
            focus=_FOCUS_BLOCKS,
        ),
        Case(
            "one block larger than the stream (block 10 > n = 4)",
            (LOCAL_X, 10),
            focus=_FOCUS_BLOCKS,
        ),
        Case("an empty stream (n = 0)", (np.zeros(0), 3), focus=_FOCUS_EMPTY),
        Case(
            "a huge score (1000) in a ragged stream of 5, block 2",
            (np.array([0.5, -1.0, 1000.0, 3.0, 999.0]), 2),
            focus=_FOCUS_HUGE,
        ),
        Case(
            "-inf scores, the first block all -inf, block 2",
            (np.array([NEG_INF, NEG_INF, 1.0, NEG_INF, 2.0]), 2),
            focus=_FOCUS_MASKED,
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
            focus=_FOCUS_MASKED,
        ),
        Case(
            "a batch of shape (2, 3, 10), block 4: the stream is the last axis",
            (np.random.default_rng(1).standard_normal((2, 3, 10)) * 4, 4),
            focus=_FOCUS_BATCH,
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
            "the scores s = (2, 4, 1, 3), v = (5, 15, 25, 35), block 2 (the second block, "
            "(1, 3), does not raise the running max 4)",
            (FURTHER_X, FURTHER_V, 2),
            focus=_FOCUS_RESCALE,
        ),
        Case(
            "the example of section 4(b): x = ln(2, 1, 8, 4), v = (1, 2, 3, 4), block 2",
            (EXAMPLE_X, EXAMPLE_V, 2),
            focus=_FOCUS_RESCALE,
        ),
        Case(
            "the example of section 4(c): s = (1, 3, 2, 5), v = (10, 20, 30, 40), block 2",
            (LOCAL_X, LOCAL_V, 2),
        ),
        Case(
            "the example of section 4(b) read one score at a time (block 1)",
            (EXAMPLE_X, EXAMPLE_V, 1),
            focus=_FOCUS_BLOCKS,
        ),
        Case(
            "one block larger than the stream (block 10 > n = 4)",
            (LOCAL_X, LOCAL_V, 10),
            focus=_FOCUS_BLOCKS,
        ),
        Case(
            "vector values v of shape (5, 3), block 2 (ragged)",
            (rng1.standard_normal(5) * 2, rng1.standard_normal((5, 3)), 2),
            focus=_FOCUS_VECTOR,
        ),
        Case(
            "a huge score (1000), values of shape (5, 2), block 2",
            (
                np.array([0.5, -1.0, 1000.0, 3.0, 999.0]),
                np.array([[1.0, 0.0], [2.0, -1.0], [3.0, 0.5], [4.0, 2.0], [5.0, 1.0]]),
                2,
            ),
            focus=_FOCUS_HUGE,
        ),
        Case(
            "-inf scores, the first block all -inf, block 2",
            (
                np.array([NEG_INF, NEG_INF, 1.0, NEG_INF, 2.0]),
                np.array([7.0, -7.0, 1.0, 100.0, 3.0]),
                2,
            ),
            focus=_FOCUS_MASKED,
        ),
        Case(
            "a row of 5 scores, all -inf (fully masked), values (5, 2), block 2",
            (np.full(5, NEG_INF), np.arange(10.0).reshape(5, 2), 2),
            focus=_FOCUS_EMPTY_QUERY,
        ),
        Case(
            "an empty stream (n = 0), values of shape (0, 2)",
            (np.zeros(0), np.zeros((0, 2)), 3),
            focus=_FOCUS_EMPTY_QUERY,
        ),
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
# The rule: each score once, in blocks of `block` (checked once every value is right)
# ---------------------------------------------------------------------------------------------

_RULE_N, _RULE_BLOCK = 40, 6  # a row is 7 blocks long (the last one 4 scores)


def _stats_rule_case() -> Case:
    x = 3.0 * np.random.default_rng(11).standard_normal((3, _RULE_N))
    x[0, : _RULE_BLOCK + 2] = NEG_INF  # row 0: the first block all -inf
    x[2, 17] = 800.0  # row 2: a huge score in block 3
    return Case(
        f"a batch of 3 rows of {_RULE_N} scores, block {_RULE_BLOCK} (7 blocks a row)",
        (x, _RULE_BLOCK),
    )


def _attention_rule_case() -> Case:
    rng = np.random.default_rng(12)
    x = 3.0 * rng.standard_normal(_RULE_N)
    x[: _RULE_BLOCK + 2] = NEG_INF
    x[17] = 800.0
    v = rng.standard_normal((_RULE_N, 3))
    return Case(
        f"one query with {_RULE_N} keys, values of shape ({_RULE_N}, 3), block {_RULE_BLOCK}",
        (x, v, _RULE_BLOCK),
    )


def _stats_rules() -> list:
    case = _stats_rule_case()
    whole, multi = STATS_RULE_MISTAKES[0], STATS_RULE_MISTAKES[1]
    return [
        tile_rule(
            case,
            f"read the scores in blocks of `block` (here {_RULE_BLOCK}), never a whole row at once",
            whole,
            arg=0,
            axis=1,
            limit=_RULE_BLOCK,
        ),
        single_pass_rule(case, "read each score once (one pass)", multi, arg=0),
    ]


def _attention_rules() -> list:
    case = _attention_rule_case()
    whole, multi, values = ATTENTION_RULE_MISTAKES[:3]
    block = _RULE_BLOCK
    return [
        tile_rule(
            case,
            f"read the scores in blocks of `block` (here {block}), never the whole row at once",
            whole,
            arg=0,
            axis=0,
            limit=block,
        ),
        single_pass_rule(case, "read each score once (one pass)", multi, arg=0),
        tile_rule(
            case,
            f"read the values in blocks of `block` (here {block}) too, with their scores",
            values,
            arg=1,
            axis=0,
            limit=block,
        ),
        single_pass_rule(case, "read each value once", multi, arg=1),
    ]


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def check_online_softmax_stats(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(x, block) -> (m, l) against course_utils.online_softmax_stats; print ✓ or raise.

    Cases: the notebook's examples, block 1 and block > n, an empty stream, a huge score, -inf
    scores, an all -inf row in a batch, a 3-D batch, then `trials` random inputs (seed=None:
    fresh ones). Then the rule, on a batch of 3 rows of 40 scores: each score is read once, in
    blocks of `block`.
    """
    run_cases(
        "online_softmax_stats",
        fn,
        _stats_reference,
        _stats_cases(seed, trials),
        outputs=("m", "l"),
        mistakes=STATS_MISTAKES,
        summary="worked examples, any block size, huge and -inf scores, batches of rows; "
        "each score read once, in blocks",
        rules=_stats_rules(),
    )


def check_online_softmax_attention(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(x, v, block) -> (o, lse) against the direct softmax average; print ✓ or raise.

    Cases: the notebook's examples, block 1 and block > n, vector values, a huge score, -inf
    scores, an all -inf row, an empty stream, then `trials` random inputs (seed=None: fresh).
    Then the rule, on 40 keys: each score and each value is read once, in blocks of `block`.
    """
    run_cases(
        "online_softmax_attention",
        fn,
        _online_attention_reference,
        _attention_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=ATTENTION_MISTAKES,
        summary="worked examples, scalar and vector values, huge and -inf scores, masked rows; "
        "scores and values read once, in blocks",
        rules=_attention_rules(),
    )


# ---------------------------------------------------------------------------------------------
# Quick checks (the expected numbers are computed here, not written in the notebook)
# ---------------------------------------------------------------------------------------------

# Quick checks 2 and 3: state m = 3, l = 2, acc = 5; a block with scores (5, 3), values (1, 0).
_QC_M, _QC_L, _QC_ACC = 3.0, 2.0, 5.0
_QC_X, _QC_V = frozen(np.array([5.0, 3.0]), np.array([1.0, 0.0]))


def _quick_state():
    m_new = max(_QC_M, _QC_X.max())
    factor = np.exp(_QC_M - m_new)
    p = np.exp(_QC_X - m_new)
    return factor * _QC_L + p.sum(), factor * _QC_ACC + p @ _QC_V


def check_quick_rescale(answer) -> None:
    """Quick check 1: the factor for the old l and acc when the max goes from 3 to 5."""
    hinted_answer(
        "rescale factor",
        answer,
        np.exp(3.0 - 5.0),
        [
            (
                np.exp(5.0 - 3.0),
                "that is exp(m_new - m_old) = e^2; the old terms must shrink, so the factor "
                "is <= 1.",
            )
        ],
        "the factor is exp(m_old - m_new); it is at most 1, since the old terms must shrink.",
        rtol=5e-3,
    )


def check_quick_new_l(answer) -> None:
    """Quick check 2: the new l after the block (5, 3)."""
    l_new, _ = _quick_state()
    hinted_answer(
        "new l",
        answer,
        l_new,
        [
            (
                _QC_L + np.exp(0.0) + np.exp(-2.0),
                "you added the new terms to the old l = 2 without rescaling it by exp(3 - 5).",
            )
        ],
        "rescale the old l = 2 by exp(3 - 5), then add exp(x_i - 5) for the two new scores.",
        rtol=5e-3,
    )


def check_quick_output(answer) -> None:
    """Quick check 3: the output so far, acc / l, after the block (5, 3)."""
    l_new, acc_new = _quick_state()
    hinted_answer(
        "output acc / l",
        answer,
        acc_new / l_new,
        [
            (acc_new, "that is the new acc; the output so far is acc / l."),
            (l_new, "that is the new l; the output so far is acc / l."),
            ((_QC_ACC + 1.0) / l_new, "acc needs the rescale factor exp(3 - 5) too, not only l."),
        ],
        "compute acc the same way as l (old acc = 5 times the factor, plus exp(x_i - 5) v_i).",
        rtol=5e-3,
    )


def check_quick_second_example(answer) -> None:
    """Scores (2, 4, 1, 3), values (5, 15, 25, 35), blocks of two: the output (about 19.187).

    Block 2's max (3) is below the running max (4): the old sums keep factor 1, and the new
    block's sums (taken relative to its own max) are scaled by exp(3 - 4).
    """
    x, v = FURTHER_X, FURTHER_V
    w = np.exp(x - x.max())
    expected = float(w @ v / w.sum())
    blocks = [(x[:2], v[:2]), (x[2:], v[2:])]
    own = [(np.exp(b - b.max()), bv) for b, bv in blocks]  # each block relative to its own max
    unscaled = sum(p @ bv for p, bv in own) / sum(p.sum() for p, _ in own)
    o1, o2 = (float(p @ bv / p.sum()) for p, bv in own)  # each block's output alone
    # both blocks have the same mass relative to their own max, so averaging their outputs gives
    # the unscaled sum: one value, one hint that names the averaging
    assert np.isclose((o1 + o2) / 2, unscaled)
    hinted_answer(
        "output for scores (2, 4, 1, 3), values (5, 15, 25, 35)",
        answer,
        expected,
        [
            (
                unscaled,
                f"that is the plain average of the two blocks' outputs, ({o1:.2f} + {o2:.2f}) / 2 "
                "(the "
                "same number as summing both blocks relative to their own maxes, with no "
                "rescale). The blocks do not count equally: weigh each by its mass. Block 2 does "
                "not raise the max: it stays 4, so block 1's sums keep the factor 1, and block "
                "2's terms are e^{x_i - 4}, e^{-1} times their values relative to its own max 3",
            ),
            (o1, "that is block 1's output alone"),
            (o2, "that is block 2's output alone"),
            (float(v.mean()), "that is the plain mean of the values; weight them by e^{x_i}"),
        ],
        "keep (m, l, acc); at block 2 the max stays 4, so the old sums keep factor 1 and the new "
        "terms are e^{x_i - 4}; the output is acc / l",
        rtol=1e-4,
    )
