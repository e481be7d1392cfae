"""Checks of notebook 02 (merging partial softmax results): merge_partials, attention_by_parts.

A partial result over a key set A is the pair (o_A, lse_A): the softmax average of the values of A
and the logsumexp of A's scores. Two partials over disjoint sets merge into the result over A u B:

    lse = log(e^lse_A + e^lse_B),   o = e^(lse_A - lse) o_A + e^(lse_B - lse) o_B.

Each check runs the learner's function on cases ordered from the notebook's worked example to
random inputs, compares with course_utils (merge_partials, attention_reference) and, on a mismatch,
names the misconception whose buggy implementation reproduces the learner's output. The merge's
cases reach the edges the notebook allows: lse of 10^4, lse 1000 and more apart (where the ratio
e^(lse_A - lse_B) overflows), empty sets against huge lse, both sets empty.

attention_by_parts has two rules, checked once every value is right:

    the parts are computed separately: K and V are traced, and no single read may take the keys
        (or values) of two different parts; one softmax over all of K reads every part at once
                                                                                -> full-softmax
    the parts are merged with the learner's own merge_partials (the notebook asks for it): its
        calls are counted                                                       -> merge-not-used

No memory budget: the forbidden array is the Nq x Nk score matrix, but a correct answer may copy
K and V first (np.asarray(K, dtype=float), K.astype(...)), which is Nk x d, more than the scores
whenever d >= Nq; no budget can lie 10x below the one and above the other. The loads see the
reads themselves, which is what the rule is about.
"""

from __future__ import annotations

import numpy as np

from course_utils import attention_reference
from course_utils import merge_partials as _reference_merge
from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import NAN_MISTAKE, Mistake
from course_utils.checks.engine.quizzes import hinted_answer
from course_utils.checks.engine.rules import Rule, calls_rule, partition_rule
from course_utils.checks.merge_partials.mistakes import (
    MERGE_MISTAKES,
    _col,
    _merge,
    _normalize_then_add,
    _plain_average,
    _safe,
)
from course_utils.harness.key_parts import KeyParts, key_parts

NEG_INF = -np.inf
LN = np.log


# check_merge_partials
# ---------------------------------------------------------------------------------------------


def _rows(*values):
    return np.array(values, dtype=np.float64)


_F_WEIGHTS = (
    "the weights: w_A = e^(lse_A - lse) and w_B = e^(lse_B - lse), with lse = log(e^lse_A + "
    "e^lse_B); they add up to 1"
)
_F_VECTOR = "vector values: o of shape (rows, d), one weight per row (w[:, None] * o)"
_F_EMPTY = "an empty set (lse = -inf, o = 0): weight 0, the other set's (o, lse) unchanged"
_F_LARGE = "large lse: stay in the log domain (np.logaddexp, weights e^(lse_A - lse) <= 1)"
_F_GAP = (
    "two lse far apart: the heavier set gets weight 1 and the lighter one 0 (e^-1000 is 0), "
    "with no inf / inf on the way"
)
_F_BOTH = "both sets empty: o = 0 and lse = -inf, never exp(-inf - (-inf))"


def _merge_cases(seed, trials: int) -> list[Case]:
    cases = [
        Case(
            "the worked example x = ln(2, 1, 8, 4) of section 4: A = (4/3, ln 3), "
            "B = (10/3, ln 12), one row, scalar values",
            (_rows(4 / 3), _rows(LN(3)), _rows(10 / 3), _rows(LN(12))),
            focus=_F_WEIGHTS,
        ),
        Case(
            "one row, vector values (d = 2)",
            (_rows([1.0, -2.0]), _rows(LN(5)), _rows([4.0, 2.0]), _rows(LN(20))),
            focus=_F_VECTOR,
        ),
        Case(
            "3 rows, d = 3 (as many rows as value components)",
            (
                _rows([1.0, 0.0, 2.0], [3.0, -1.0, 0.5], [-2.0, 4.0, 1.0]),
                _rows(0.0, 2.0, -1.0),
                _rows([0.0, 2.0, 1.0], [1.0, 1.0, -3.0], [5.0, 0.0, 2.0]),
                _rows(1.5, -0.5, 0.7),
            ),
            focus=_F_VECTOR,
        ),
        Case(
            "2 rows, one empty set each (lse = -inf, o = 0): B empty in row 0, A in row 1",
            (_rows(2.5, 0.0), _rows(0.4, NEG_INF), _rows(0.0, -1.5), _rows(NEG_INF, 1.2)),
            focus=_F_EMPTY,
        ),
        Case(
            "2 rows with large and very negative lse (e^lse over- and underflows)",
            (_rows(1.0, 3.0), _rows(1000.0, -1000.0), _rows(2.0, -1.0), _rows(998.0, -1001.0)),
            focus=_F_LARGE,
        ),
        Case(
            "4 rows, d = 2, lse 1000 and more apart: lse_A - lse_B = 1000, -1000, 3000, 10^4",
            (
                _rows([1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [-2.0, 1.5]),
                _rows(1000.0, 0.0, 2500.0, 10005.0),
                _rows([-1.0, 4.0], [2.0, 2.5], [1.0, 1.0], [0.0, -3.0]),
                _rows(0.0, 1000.0, -500.0, 5.0),
            ),
            focus=_F_GAP,
        ),
        Case(
            "3 rows, scalar values: an empty set against lse = 1000, -1000 and 10^4",
            (
                _rows(0.0, 1.5, -2.0),
                _rows(NEG_INF, -1000.0, 1e4),
                _rows(4.0, 0.0, 0.0),
                _rows(1000.0, NEG_INF, NEG_INF),
            ),
            focus=_F_EMPTY,
        ),
        Case(
            "3 rows, d = 2: both sets empty in row 0 (o = 0, lse = -inf expected)",
            (
                _rows([0.0, 0.0], [0.0, 0.0], [1.0, 2.0]),
                _rows(NEG_INF, NEG_INF, 0.3),
                _rows([0.0, 0.0], [-1.0, 3.0], [2.0, -2.0]),
                _rows(NEG_INF, 2.2, 1.1),
            ),
            focus=_F_BOTH,
        ),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        rows = int(rng.integers(1, 9))
        d = int(rng.integers(0, 6))  # 0: scalar values, o of shape (rows,)
        shape = (rows, d) if d else (rows,)
        offset = float(rng.choice([0.0, 0.0, 300.0, -300.0, 800.0]))
        lse1 = offset + 3 * rng.standard_normal(rows)
        lse2 = offset + 3 * rng.standard_normal(rows)
        if rng.random() < 0.4:  # some rows 750 to 3000 apart, either way
            far = rng.random(rows) < 0.5
            lse2[far] += rng.choice([-1.0, 1.0], size=far.sum()) * rng.uniform(750, 3000, far.sum())
        lse1[rng.random(rows) < 0.2] = NEG_INF
        lse2[rng.random(rows) < 0.2] = NEG_INF
        o1 = np.where(_col(np.isneginf(lse1), np.empty(shape)), 0.0, rng.normal(size=shape))
        o2 = np.where(_col(np.isneginf(lse2), np.empty(shape)), 0.0, rng.normal(size=shape))
        what = f"d = {d}" if d else "scalar values"
        cases.append(Case(f"random case {t + 1}: {rows} rows, {what}", (o1, lse1, o2, lse2)))
    return cases


def check_merge_partials(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check merge_partials(o1, lse1, o2, lse2) -> (o, lse) against course_utils.merge_partials.

    Cases: the worked example of section 4, vector values, rows == d, empty sets, huge lse, lse
    1000 and more apart, empty sets against huge lse, both sets empty, then `trials` random
    batches (seed=None: fresh ones). Inputs are read-only: a merge into o1 is `mutates-input`.
    """
    run_cases(
        "merge_partials",
        fn,
        _reference_merge,
        _merge_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=MERGE_MISTAKES,
        summary="scalar and vector values, empty sets, both empty, lse up to 10^4 and 1000 and "
        "more apart",
    )


# ---------------------------------------------------------------------------------------------
# check_attention_by_parts
# ---------------------------------------------------------------------------------------------


def _part_stats(q, K, V, idx, tau, *, lse_rule="right"):
    """(o, lse) of the query rows over the keys idx, by a plain softmax; (0, -inf) if empty."""
    if len(idx) == 0:
        return np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    s = tau * (q @ K[idx].T)  # (Nq, len(idx))
    m = s.max(axis=1)
    p = np.exp(s - m[:, None])
    l = p.sum(axis=1)
    o = (p @ V[idx]) / l[:, None]
    lse = {"right": m + np.log(l), "max": m, "log2": m + np.log2(l)}[lse_rule]
    return o, lse


def _by_parts(merge, *, lse_rule="right", scale=True, contiguous=False, skip_last=False):
    """A buggy attention_by_parts built from a merge and the given per-part mistakes."""

    def attention_by_parts(q, K, V, parts):
        q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
        tau = 1 / np.sqrt(q.shape[1]) if scale else 1.0
        o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
        parts = list(parts)[:-1] if skip_last else list(parts)
        for idx in parts:
            idx = np.asarray(idx, dtype=np.intp)
            if contiguous and len(idx):
                idx = np.arange(idx.min(), idx.max() + 1)
            o_p, lse_p = _part_stats(q, K, V, idx, tau, lse_rule=lse_rule)
            o, lse = merge(o, lse, o_p, lse_p)
        return o, lse

    return attention_by_parts


def _merge_o_rule(o_rule):
    return lambda o1, lse1, o2, lse2: (o_rule(o1, lse1, o2, lse2), np.logaddexp(lse1, lse2))


def _first_part_plain(rule):
    """The parts merged with a wrong rule for o, starting from the first part (not the empty set).

    Starting from (0, -inf) would make the first merge an average with an empty set, which
    learners who average or add do not write.
    """

    def attention_by_parts(q, K, V, parts):
        q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
        tau = 1 / np.sqrt(q.shape[1])
        stats = [_part_stats(q, K, V, np.asarray(i, dtype=np.intp), tau) for i in parts]
        o, lse = stats[0]
        for o_p, lse_p in stats[1:]:
            o, lse = rule(o, lse, o_p, lse_p), np.logaddexp(lse, lse_p)
        return o, lse

    return attention_by_parts


def _mean_of_parts(rule):
    """All parts' outputs averaged (or summed) at once, as a learner would with np.mean."""

    def attention_by_parts(q, K, V, parts):
        q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
        tau = 1 / np.sqrt(q.shape[1])
        stats = [_part_stats(q, K, V, np.asarray(i, dtype=np.intp), tau) for i in parts]
        os = np.stack([s[0] for s in stats])
        lse = np.logaddexp.reduce(np.stack([s[1] for s in stats]), axis=0)
        return (os.mean(axis=0) if rule == "mean" else os.sum(axis=0)), lse

    return attention_by_parts


def _parts_nan_on_empty(q, K, V, parts):
    """An empty part's softmax taken anyway: l = 0, o = 0 / 0 = NaN, and 0 * NaN stays NaN."""
    q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        idx = np.asarray(idx, dtype=np.intp)
        s = tau * (q @ K[idx].T)
        m = s.max(axis=1, initial=NEG_INF)
        p = np.exp(s - _safe(m)[:, None])
        l = p.sum(axis=1)
        o, lse = _merge(o, lse, (p @ V[idx]) / l[:, None], m + np.log(l))
    return o, lse


def _parts_reference(q, K, V, parts):
    return attention_reference(q, K, V)


PARTS_MISTAKES: list[Mistake] = (
    [
        Mistake(
            "plain-average",
            "plain average of the parts' outputs",
            "Each part's o is an average over its own keys; a part with more softmax mass "
            "(larger lse) must count more. Merge with weights e^(lse_part - lse), i.e. with "
            "your merge_partials.",
            fn,
        )
        for fn in (
            _first_part_plain(_plain_average),
            _mean_of_parts("mean"),
            _by_parts(_merge_o_rule(_plain_average)),
        )
    ]
    + [
        Mistake(
            "normalize-then-add",
            "adding the normalized outputs of the parts",
            "Each part's o is already normalized over its own keys, so their sum counts the values "
            "once per part. Merge with weights e^(lse_part - lse), i.e. with your merge_partials.",
            fn,
        )
        for fn in (_first_part_plain(_normalize_then_add), _mean_of_parts("sum"))
    ]
    + [
        Mistake(
            "m-not-lse",
            "the part's max score used as its lse",
            "A part's lse is m + log(l) = log sum e^score, not its max m: the max forgets how many "
            "keys share the mass. Return lse_part = m + np.log(l).",
            _by_parts(_merge, lse_rule="max"),
        ),
        Mistake(
            "base2-lse",
            "a part's lse in base 2 (m + log2 l)",
            "The merge expects natural logs: lse_part = m + np.log(l). A base-2 log gives "
            "each part the wrong share of the mass.",
            _by_parts(_merge, lse_rule="log2"),
        ),
        Mistake(
            "missing-softmax-scale",
            "scores not scaled by 1/sqrt(d)",
            "Attention scores are tau q.k with tau = 1/sqrt(d), as in cu.attention_reference. "
            "Compute s = (q @ K[idx].T) / np.sqrt(d).",
            _by_parts(_merge, scale=False),
        ),
        Mistake(
            "contiguous-parts",
            "each part taken as the contiguous range from its smallest to its largest index",
            "A part is any set of key indices, not a slice: gather its keys with K[idx] "
            "and V[idx].",
            _by_parts(_merge, contiguous=True),
        ),
        Mistake(NAN_MISTAKE.slug, NAN_MISTAKE.title, NAN_MISTAKE.explanation, _parts_nan_on_empty),
        Mistake(
            "skips-a-part",
            "the last part is never merged",
            "Every part must enter the merge. Start from the empty result (o = 0, lse = -inf: "
            "weight 0, the merge's identity) and merge each part in turn.",
            _by_parts(_merge, skip_last=True),
        ),
    ]
)


def _example_qkv():
    """One query whose scores are (ln 2, 0, ln 8, ln 4) (d = 1, tau = 1), values (1, 2, 3, 4)."""
    q = np.array([[1.0]])
    K = np.log([[2.0], [1.0], [8.0], [4.0]])
    V = np.array([[1.0], [2.0], [3.0], [4.0]])
    return q, K, V


def _random_partition(rng, n: int) -> KeyParts:
    """A random split of range(n) into 1..6 parts: shuffled, ragged, some parts empty."""
    k = int(rng.integers(1, 7))
    labels = rng.integers(0, k, size=n)
    parts = [rng.permutation(np.flatnonzero(labels == p)) for p in range(k)]
    return key_parts(*parts)


_F_PARTS_MERGE = "each part's (o, lse), merged into the running result with merge_partials"
_F_PARTS_GATHER = "a part is any set of key indices: gather its keys and values with K[idx], V[idx]"
_F_PARTS_EMPTY = (
    "an empty part is (o, lse) = (0, -inf), the merge's identity; with no keys at all, o = 0 and "
    "lse = -inf"
)
_F_PARTS_SCALE = "the scores tau q.k with tau = 1/sqrt(d), d = q.shape[1]"


def _parts_cases(seed, trials: int) -> list[Case]:
    q, K, V = _example_qkv()
    rng = np.random.default_rng(12345)  # the fixed cases do not depend on seed
    q7, K7, V7 = rng.normal(size=(1, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    q3, K10, V10 = rng.normal(size=(3, 4)), rng.normal(size=(10, 4)), rng.normal(size=(10, 2))
    cases = [
        Case(
            "the example of section 2 (scores ln 2, 0, ln 8, ln 4; values 1..4), split as in "
            "section 4: parts {0,1}, {2,3}",
            (q, K, V, key_parts([0, 1], [2, 3])),
            focus=_F_PARTS_MERGE,
        ),
        Case(
            "the example of section 2, non-contiguous parts {0,2}, {1,3}",
            (q, K, V, key_parts([0, 2], [1, 3])),
            focus=_F_PARTS_GATHER,
        ),
        Case(
            "the example of section 2, parts {3}, {} (empty), {2, 0, 1}",
            (q, K, V, key_parts([3], [], [2, 0, 1])),
            focus=_F_PARTS_EMPTY,
        ),
        Case(
            "one query, d = 4, 7 keys in shuffled parts {6,0,3}, {1,5}, {4,2}",
            (q7, K7, V7, key_parts([6, 0, 3], [1, 5], [4, 2])),
            focus=_F_PARTS_SCALE,
        ),
        Case(
            "3 queries, d = 4, 10 keys in 5 ragged parts (one empty, one singleton)",
            (q3, K10, V10, key_parts([9, 2, 5, 0], [], [7], [1, 8, 3], [4, 6])),
            focus=_F_PARTS_GATHER,
        ),
        Case(
            "no keys at all (a fully masked row): one empty part, o = 0 and lse = -inf expected",
            (q7, K7[:0], V7[:0], key_parts([])),
            focus=_F_PARTS_EMPTY,
        ),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        nq, d, dv = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 5))
        nk = int(rng.integers(0, 25))
        scale = float(rng.choice([1.0, 3.0, 10.0]))  # sharp and flat softmaxes
        qs, Ks = scale * rng.normal(size=(nq, d)), rng.normal(size=(nk, d))
        Vs = rng.normal(size=(nk, dv))
        parts = _random_partition(rng, nk)
        label = f"random case {t + 1}: {nq} queries, {nk} keys, d = {d}, {len(parts)} parts"
        cases.append(Case(label, (qs, Ks, Vs, parts)))
    return cases


# ---------------------------------------------------------------------------------------------
# The rules of attention_by_parts: parts computed separately, merged with merge_partials
# ---------------------------------------------------------------------------------------------


def _parts_full_softmax(q, K, V, parts):
    """One softmax over all the keys (the naive way of section 2): the parts are never used."""
    q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
    if len(K) == 0:
        return np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    s = (q @ K.T) / np.sqrt(q.shape[1])
    m = s.max(axis=1)
    p = np.exp(s - m[:, None])
    l = p.sum(axis=1)
    return (p @ V) / l[:, None], m + np.log(l)


def _parts_inline_merge(q, K, V, parts):
    """Every part on its own, but merged by a formula written out here, not by merge_partials."""
    q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        o_p, lse_p = _part_stats(q, K, V, np.asarray(idx, dtype=np.intp), tau)
        new = np.logaddexp(lse, lse_p)
        safe = _safe(new)
        o = np.exp(lse - safe)[:, None] * o + np.exp(lse_p - safe)[:, None] * o_p
        lse = new
    return o, lse


def _parts_rule_case() -> Case:
    rng = np.random.default_rng(2024)
    q, K, V = 2 * rng.normal(size=(3, 8)), rng.normal(size=(30, 8)), rng.normal(size=(30, 4))
    order = rng.permutation(30)
    parts = key_parts(order[:9], [], order[9:16], order[16:17], order[17:])
    return Case(
        "3 queries, 30 keys (d = 8) in 5 shuffled parts of 9, 0, 7, 1 and 13 keys",
        (q, K, V, parts),
    )


FULL_SOFTMAX = Mistake(
    "full-softmax",
    "one softmax over all the keys instead of one per part",
    "attention_by_parts computes each part on its own, as a worker that holds only that part's "
    "keys would: s = tau * q @ K[idx].T with V[idx], the part's (o, lse), then a merge. A softmax "
    "over all of K at once (q @ K.T, or a logsumexp over every score) gives the same numbers "
    "without any part: it is the naive way of section 2, not the exercise.",
    fn=_parts_full_softmax,
)

MERGE_NOT_USED = Mistake(
    "merge-not-used",
    "the parts are not merged with your merge_partials",
    "Exercise 2 builds on exercise 1: merge each part's (o, lse) into the running result by "
    "calling your merge_partials (by that name), starting from the empty partial (0, -inf). "
    "A merge written out again, or a k-way formula, is not what the exercise asks; the check "
    "counts the calls.",
    fn=_parts_inline_merge,
)

PARTS_RULE_MISTAKES = [FULL_SOFTMAX, MERGE_NOT_USED]


def _parts_rules() -> list[Rule]:
    case = _parts_rule_case()
    return [
        partition_rule(
            case,
            "compute each part separately: no read of K or V may take keys of two parts",
            FULL_SOFTMAX,
            args=(1, 2),
            axis=0,
            groups=lambda case: list(case.args[3]),
        ),
        calls_rule(
            case,
            "merge the parts with your merge_partials",
            MERGE_NOT_USED,
            helper="merge_partials",
            at_least=lambda case: sum(1 for idx in case.args[3] if len(idx)) - 1,
        ),
    ]


def check_attention_by_parts(fn, seed: int | None = 0, trials: int = 15) -> None:
    """Check attention_by_parts(q, K, V, parts) -> (o, lse) against cu.attention_reference.

    parts splits the keys 0..Nk-1 into disjoint sets (every key in exactly one set); the merged
    result must equal attention over all keys. Cases: the example of sections 2 and 4 with
    several splits, shuffled and empty parts, several queries, no keys at all, then `trials`
    random cases. Then the rules, on 30 keys in 5 parts: no read of K or V takes keys of two
    parts, and the parts are merged by calls of the learner's merge_partials.
    """
    run_cases(
        "attention_by_parts",
        fn,
        _parts_reference,
        _parts_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=PARTS_MISTAKES,
        summary="shuffled, ragged and empty parts, several queries, no keys; each part read on "
        "its own and merged with merge_partials",
        rules=_parts_rules(),
    )


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def _merge_wrong_answers(o_a, lse_a, o_b, lse_b) -> list[tuple[float, str]]:
    """The merged o that each known mistake gives, with its hint (hinted_answer's windows)."""
    e_a, e_b = np.exp(lse_a), np.exp(lse_b)
    known = [
        (
            (o_a + o_b) / 2,
            "that is the plain average; the sets hold different shares of the mass",
            "plain-average",
        ),
        (o_a + o_b, "that adds two averages; weight them instead", "normalize-then-add"),
        (
            e_a * o_a + e_b * o_b,
            "divide by the total mass e^lse_A + e^lse_B",
            "unnormalized-weights",
        ),
        ((e_b * o_a + e_a * o_b) / (e_a + e_b), "the weights are swapped", "swapped-weights"),
    ]
    return [(value, f"{text} [misconception: {slug}]") for value, text, slug in known]


_MERGE_HINT = (
    "e^lse_A and e^lse_B are the two sets' masses; each weight is its mass over the total."
)


def check_quick_merge(answer) -> None:
    """Quick check 1: merge (o_A, lse_A) = (2, ln 1) with (o_B, lse_B) = (5, ln 3): the merged o."""
    args = (2.0, LN(1.0), 5.0, LN(3.0))
    expected = float(_reference_merge(*args)[0])
    hinted_answer("merged o", answer, expected, _merge_wrong_answers(*args), _MERGE_HINT)


def check_quick_merge_second(answer) -> None:
    """Quick check 2: merge (o_A, lse_A) = (1, ln 2) with (o_B, lse_B) = (4, ln 6): the merged o."""
    args = (1.0, LN(2.0), 4.0, LN(6.0))
    expected = float(_reference_merge(*args)[0])
    hinted_answer("merged o", answer, expected, _merge_wrong_answers(*args), _MERGE_HINT)


def check_quick_merged_lse(answer) -> None:
    """Quick check 2, continued: the merged lse of (1, ln 2) and (4, ln 6)."""
    hinted_answer(
        "merged lse",
        answer,
        float(np.logaddexp(LN(2.0), LN(6.0))),
        [
            (LN(6.0), "that is max(lse_A, lse_B); add set A's mass too [misconception: lse-max]"),
            (8.0, "8 is the total mass e^lse; lse is its natural log"),
            (
                np.log2(8.0),
                "that is log2 of the mass; lse uses the natural log [misconception: base2-lse]",
            ),
        ],
        "lse = log(e^lse_A + e^lse_B), a natural log of the total mass",
    )
