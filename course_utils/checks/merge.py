"""Checks of notebook 02 (merging partial softmax results): merge_partials, attention_by_parts.

A partial result over a key set A is the pair (o_A, lse_A): the softmax average of the values of A
and the logsumexp of A's scores. Two partials over disjoint sets merge into the result over A u B:

    lse = log(e^lse_A + e^lse_B),   o = e^(lse_A - lse) o_A + e^(lse_B - lse) o_B.

Each check runs the learner's function on cases ordered from the lesson's hand example to random
inputs, compares with course_utils (merge_partials, attention_reference) and, on a mismatch,
names the misconception whose buggy implementation reproduces the learner's output.
"""

from __future__ import annotations

import numpy as np

from .. import attention_reference
from .. import merge_partials as _reference_merge
from ._core import NAN_MISTAKE, Case, Mistake, check_answer, run_cases

NEG_INF = -np.inf
LN = np.log


# ---------------------------------------------------------------------------------------------
# Buggy merges: each shows one misconception (same signature as merge_partials)
# ---------------------------------------------------------------------------------------------


def _safe(lse):
    """lse with -inf replaced by 0, so that lse_i - lse never evaluates -inf - (-inf)."""
    return np.where(np.isneginf(lse), 0.0, lse)


def _col(w, o):
    """Weights of shape (rows,) lined up with o of shape (rows,) or (rows, d)."""
    return w[..., None] if np.ndim(o) > np.ndim(w) else w


def _right_lse(o1, lse1, o2, lse2):
    return np.logaddexp(lse1, lse2)


def _max_lse(o1, lse1, o2, lse2):
    return np.maximum(lse1, lse2)


def _mean_lse(o1, lse1, o2, lse2):
    return (lse1 + lse2) / 2


def _merge(o1, lse1, o2, lse2):
    """A correct merge, for the buggy attention_by_parts below (they must not call the reference:
    the check would take that for the learner calling it)."""
    return _merge_right_o(o1, lse1, o2, lse2), np.logaddexp(lse1, lse2)


def _merge_right_o(o1, lse1, o2, lse2):
    lse = _safe(np.logaddexp(lse1, lse2))
    return _col(np.exp(lse1 - lse), o1) * o1 + _col(np.exp(lse2 - lse), o2) * o2


def _plain_average(o1, lse1, o2, lse2):
    return (o1 + o2) / 2


def _normalize_then_add(o1, lse1, o2, lse2):
    return o1 + o2


def _unnormalized(o1, lse1, o2, lse2):
    return _col(np.exp(lse1), o1) * o1 + _col(np.exp(lse2), o2) * o2


def _lse_as_weights(o1, lse1, o2, lse2):
    w1 = lse1 / (lse1 + lse2)
    return _col(w1, o1) * o1 + _col(1 - w1, o2) * o2


def _swapped(o1, lse1, o2, lse2):
    lse = _safe(np.logaddexp(lse1, lse2))
    return _col(np.exp(lse2 - lse), o1) * o1 + _col(np.exp(lse1 - lse), o2) * o2


def _with_lse(o_rule, *lse_rules):
    """Buggy merges that combine one wrong rule for o with each of the given rules for lse."""
    return [lambda *a, f=o_rule, g=g: (f(*a), g(*a)) for g in lse_rules]


def _max_lse_merge(o1, lse1, o2, lse2):
    lse = np.maximum(lse1, lse2)  # forgets log(1 + e^-|lse1 - lse2|)
    s = _safe(lse)
    return _col(np.exp(lse1 - s), o1) * o1 + _col(np.exp(lse2 - s), o2) * o2, lse


def _max_lse_only(o1, lse1, o2, lse2):
    return _merge_right_o(o1, lse1, o2, lse2), np.maximum(lse1, lse2)


def _base2_both(o1, lse1, o2, lse2):
    lse = np.logaddexp2(lse1, lse2)  # log2(2^lse1 + 2^lse2)
    s = _safe(lse)
    return _col(np.exp2(lse1 - s), o1) * o1 + _col(np.exp2(lse2 - s), o2) * o2, lse


def _base2_weights(o1, lse1, o2, lse2):
    lse = np.logaddexp(lse1, lse2)
    s = _safe(lse)
    return _col(np.exp2(lse1 - s), o1) * o1 + _col(np.exp2(lse2 - s), o2) * o2, lse


def _base2_lse(o1, lse1, o2, lse2):
    lse = np.logaddexp2(lse1, lse2)
    s = _safe(lse)
    return _col(np.exp(lse1 - s), o1) * o1 + _col(np.exp(lse2 - s), o2) * o2, lse


def _exp_overflow(o1, lse1, o2, lse2):
    e1, e2 = np.exp(lse1), np.exp(lse2)  # inf for lse > 709 (88 in float32), 0 below -745
    total = e1 + e2
    return _col(e1 / total, o1) * o1 + _col(e2 / total, o2) * o2, np.log(total)


def _unguarded(o1, lse1, o2, lse2):
    lse = np.logaddexp(lse1, lse2)
    w1, w2 = np.exp(lse1 - lse), np.exp(lse2 - lse)  # NaN when both sets are empty
    return _col(w1, o1) * o1 + _col(w2, o2) * o2, lse


def _flat_weights(o1, lse1, o2, lse2):
    lse = np.logaddexp(lse1, lse2)
    s = _safe(lse)
    return np.exp(lse1 - s) * o1 + np.exp(lse2 - s) * o2, lse  # (rows,) against (rows, d)


_LSE_VARIANTS = (_right_lse, _max_lse, _mean_lse)

_MERGE_MISTAKE_SPECS = [
    (
        "plain-average",
        "plain average of the two outputs",
        "(o_A + o_B) / 2 weighs both sets equally, but a set holds a share of the softmax mass "
        "that depends on its scores: w_A = e^(lse_A - lse). Use o = w_A o_A + w_B o_B with "
        "lse = np.logaddexp(lse_A, lse_B).",
        _with_lse(_plain_average, *_LSE_VARIANTS),
    ),
    (
        "normalize-then-add",
        "adding the normalized outputs of the two sets",
        "o_A and o_B are each normalized over their own set (each is an average), so o_A + o_B "
        "counts the values twice. Weight them by their shares of the mass, w_A = e^(lse_A - lse) "
        "and w_B = e^(lse_B - lse), which add up to 1.",
        _with_lse(_normalize_then_add, *_LSE_VARIANTS),
    ),
    (
        "unnormalized-weights",
        "weights e^lse_A, e^lse_B not divided by the total mass",
        "e^lse_A is the mass of set A (the sum of its e^score), not its share. Divide by the total "
        "e^lse = e^lse_A + e^lse_B: the weight is e^(lse_A - lse), computed in the log domain.",
        _with_lse(_unnormalized, *_LSE_VARIANTS),
    ),
    (
        "lse-as-weights",
        "weights proportional to lse itself",
        "lse is a logarithm of a mass, so lse_A / (lse_A + lse_B) is not a share of anything "
        "(it is not even positive when an lse is negative). Exponentiate: w_A = e^(lse_A - lse).",
        _with_lse(_lse_as_weights, *_LSE_VARIANTS),
    ),
    (
        "swapped-weights",
        "the weights of the two sets swapped",
        "Each output takes its own set's weight: o = e^(lse_A - lse) o_A + e^(lse_B - lse) o_B. "
        "The set with the larger lse holds more of the mass and must pull o towards its o.",
        _with_lse(_swapped, *_LSE_VARIANTS),
    ),
    (
        "lse-max",
        "merged lse = max(lse_A, lse_B)",
        "The merged lse is log(e^lse_A + e^lse_B) = max + log(1 + e^-|lse_A - lse_B|): the max "
        "alone forgets the smaller set's mass. np.logaddexp(lse_A, lse_B) computes it stably.",
        [_max_lse_merge, _max_lse_only],
    ),
    (
        "base2-lse",
        "base-2 and natural logarithms mixed",
        "lse here is a natural log (lse = log sum e^score), so merge with np.logaddexp and np.exp. "
        "np.logaddexp2 / np.exp2 belong to kernels that keep every score in base 2 (scaled by "
        "log2(e)); mixing the two bases gives wrong weights and a wrong lse.",
        [_base2_both, _base2_weights, _base2_lse],
    ),
    (NAN_MISTAKE.slug, NAN_MISTAKE.title, NAN_MISTAKE.explanation, [_unguarded]),
    (
        "exp-overflow",
        "e^lse computed directly (overflows for large lse)",
        "e^lse_A / (e^lse_A + e^lse_B) is right on paper, but e^lse overflows to inf once lse "
        "> 709 in float64 (> 88 in float32) and underflows to 0 below -745, giving inf/inf or "
        "0/0 = NaN. Stay in the log domain: lse = np.logaddexp(lse_A, lse_B), "
        "w_A = np.exp(lse_A - lse).",
        [_exp_overflow],
    ),
    (
        "weights-not-broadcast",
        "weights of shape (rows,) multiplied into o of shape (rows, d) without a new axis",
        "With vector values o has shape (rows, d) and the weights shape (rows,). w * o lines w up "
        "with the last axis (d), so when rows == d it silently scales columns instead of rows. "
        "Use w[:, None] * o (or w[..., None]) when o has one more axis than lse.",
        [_flat_weights],
    ),
]


def _only_if_wrong(fn, reference):
    """fn, refusing (by raising) the inputs where it agrees with the reference.

    A buggy implementation can be right on some inputs (overflow needs a huge lse, a swap needs
    unequal weights). There it must not be named: a learner whose result is merely close to the
    reference would match it.
    """

    def buggy(*args):
        theirs, expected = fn(*args), reference(*args)
        if all(
            np.allclose(t, e, rtol=1e-12, atol=1e-12, equal_nan=True)
            for t, e in zip(theirs, expected, strict=True)
        ):
            raise ValueError("this mistake gives the right answer on this input")
        return theirs

    buggy.raw = fn  # the buggy implementation itself (the tests run it as a learner's answer)
    return buggy


MERGE_MISTAKES: list[Mistake] = [
    Mistake(slug, title, explanation, _only_if_wrong(fn, _reference_merge))
    for slug, title, explanation, fns in _MERGE_MISTAKE_SPECS
    for fn in fns
]


# ---------------------------------------------------------------------------------------------
# check_merge_partials
# ---------------------------------------------------------------------------------------------


def _rows(*values):
    return np.array(values, dtype=np.float64)


def _merge_cases(seed, trials: int) -> list[Case]:
    cases = [
        Case(
            "the lesson's merge: A = (4/3, ln 3), B = (10/3, ln 12), one row, scalar values",
            (_rows(4 / 3), _rows(LN(3)), _rows(10 / 3), _rows(LN(12))),
        ),
        Case(
            "one row, vector values (d = 2)",
            (_rows([1.0, -2.0]), _rows(LN(5)), _rows([4.0, 2.0]), _rows(LN(20))),
        ),
        Case(
            "3 rows, d = 3 (as many rows as value components)",
            (
                _rows([1.0, 0.0, 2.0], [3.0, -1.0, 0.5], [-2.0, 4.0, 1.0]),
                _rows(0.0, 2.0, -1.0),
                _rows([0.0, 2.0, 1.0], [1.0, 1.0, -3.0], [5.0, 0.0, 2.0]),
                _rows(1.5, -0.5, 0.7),
            ),
        ),
        Case(
            "2 rows, one empty set each (lse = -inf, o = 0): B empty in row 0, A in row 1",
            (_rows(2.5, 0.0), _rows(0.4, NEG_INF), _rows(0.0, -1.5), _rows(NEG_INF, 1.2)),
        ),
        Case(
            "2 rows with large and very negative lse (e^lse over- and underflows)",
            (_rows(1.0, 3.0), _rows(1000.0, -1000.0), _rows(2.0, -1.0), _rows(998.0, -1001.0)),
        ),
        Case(
            "3 rows, d = 2: both sets empty in row 0 (o = 0, lse = -inf expected)",
            (
                _rows([0.0, 0.0], [0.0, 0.0], [1.0, 2.0]),
                _rows(NEG_INF, NEG_INF, 0.3),
                _rows([0.0, 0.0], [-1.0, 3.0], [2.0, -2.0]),
                _rows(NEG_INF, 2.2, 1.1),
            ),
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
        lse1[rng.random(rows) < 0.2] = NEG_INF
        lse2[rng.random(rows) < 0.2] = NEG_INF
        o1 = np.where(_col(np.isneginf(lse1), np.empty(shape)), 0.0, rng.normal(size=shape))
        o2 = np.where(_col(np.isneginf(lse2), np.empty(shape)), 0.0, rng.normal(size=shape))
        what = f"d = {d}" if d else "scalar values"
        cases.append(Case(f"random case {t + 1}: {rows} rows, {what}", (o1, lse1, o2, lse2)))
    return cases


def check_merge_partials(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check merge_partials(o1, lse1, o2, lse2) -> (o, lse) against course_utils.merge_partials.

    Cases: the lesson's merge, vector values, rows == d, empty sets, huge lse, both sets empty,
    then `trials` random batches (seed=None: fresh ones).
    """
    run_cases(
        "merge_partials",
        fn,
        _reference_merge,
        _merge_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=MERGE_MISTAKES,
        summary="scalar and vector values, empty sets, both empty, lse up to 1000",
    )


# ---------------------------------------------------------------------------------------------
# check_attention_by_parts
# ---------------------------------------------------------------------------------------------


class KeyParts(np.ndarray):
    """A sequence of index arrays (one per key set) that prints as `[0, 2] | [1] | []`.

    Iterating gives the index arrays; len() and indexing work as on a list.
    """

    def __repr__(self) -> str:
        return "parts " + " | ".join(str([int(i) for i in p]) for p in self)

    __str__ = __repr__


def key_parts(*parts) -> KeyParts:
    """KeyParts from lists of key indices, e.g. key_parts([0, 2], [1, 3], [])."""
    out = np.empty(len(parts), dtype=object)
    for i, p in enumerate(parts):
        out[i] = np.asarray(p, dtype=np.intp).reshape(-1)
    return out.view(KeyParts)


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


def _parts_reference(q, K, V, parts):
    return attention_reference(q, K, V)


_PARTS_MISTAKES: list[Mistake] = (
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
        Mistake(
            "skips-a-part",
            "the last part is never merged",
            "Every part must enter the merge. Start from the empty result (o = 0, lse = -inf: "
            "weight 0, the merge's identity) and merge each part in turn.",
            _by_parts(_merge, skip_last=True),
        ),
    ]
)


PARTS_MISTAKES: list[Mistake] = [
    Mistake(m.slug, m.title, m.explanation, _only_if_wrong(m.fn, _parts_reference))
    for m in _PARTS_MISTAKES
]


def _lesson_qkv():
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


def _parts_cases(seed, trials: int) -> list[Case]:
    q, K, V = _lesson_qkv()
    rng = np.random.default_rng(12345)  # the fixed cases do not depend on seed
    q7, K7, V7 = rng.normal(size=(1, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    q3, K10, V10 = rng.normal(size=(3, 4)), rng.normal(size=(10, 4)), rng.normal(size=(10, 2))
    cases = [
        Case(
            "the lesson's example: scores (ln 2, 0, ln 8, ln 4), values 1..4, parts {0,1}, {2,3}",
            (q, K, V, key_parts([0, 1], [2, 3])),
        ),
        Case(
            "the lesson's example, non-contiguous parts {0,2}, {1,3}",
            (q, K, V, key_parts([0, 2], [1, 3])),
        ),
        Case(
            "the lesson's example, parts {3}, {} (empty), {2, 0, 1}",
            (q, K, V, key_parts([3], [], [2, 0, 1])),
        ),
        Case(
            "one query, d = 4, 7 keys in shuffled parts {6,0,3}, {1,5}, {4,2}",
            (q7, K7, V7, key_parts([6, 0, 3], [1, 5], [4, 2])),
        ),
        Case(
            "3 queries, d = 4, 10 keys in 5 ragged parts (one empty, one singleton)",
            (q3, K10, V10, key_parts([9, 2, 5, 0], [], [7], [1, 8, 3], [4, 6])),
        ),
        Case(
            "no keys at all (a fully masked row): one empty part, o = 0 and lse = -inf expected",
            (q7, K7[:0], V7[:0], key_parts([])),
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


def check_attention_by_parts(fn, seed: int | None = 0, trials: int = 15) -> None:
    """Check attention_by_parts(q, K, V, parts) -> (o, lse) against cu.attention_reference.

    parts splits the keys 0..Nk-1 into disjoint sets (every key in exactly one set); the merged
    result must equal attention over all keys. Cases: the lesson's example with several splits,
    shuffled and empty parts, several queries, no keys at all, then `trials` random cases.
    """
    run_cases(
        "attention_by_parts",
        fn,
        _parts_reference,
        _parts_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=PARTS_MISTAKES,
        summary="shuffled, ragged and empty parts, several queries, no keys",
    )


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def _near(answer, value) -> bool:
    """True when a quick-check answer is a number within 0.1% of value (False for anything else)."""
    try:
        return bool(np.ndim(answer) == 0 and np.isclose(float(answer), value, rtol=1e-3))
    except (TypeError, ValueError):
        return False


def _merge_hint(answer, o_a, lse_a, o_b, lse_b) -> str:
    e_a, e_b = np.exp(lse_a), np.exp(lse_b)
    known = {
        "plain-average": (
            (o_a + o_b) / 2,
            "that is the plain average; the sets hold different shares of the mass",
        ),
        "normalize-then-add": (o_a + o_b, "that adds two averages; weight them instead"),
        "unnormalized-weights": (
            e_a * o_a + e_b * o_b,
            "divide by the total mass e^lse_A + e^lse_B",
        ),
        "swapped-weights": ((e_b * o_a + e_a * o_b) / (e_a + e_b), "the weights are swapped"),
    }
    for slug, (value, text) in known.items():
        if _near(answer, value):
            return text + f" [misconception: {slug}]"
    return "e^lse_A and e^lse_B are the two sets' masses; each weight is its mass over the total."


def check_quick_merge(answer) -> None:
    """Quick check: merge (o_A, lse_A) = (2, ln 1) with (o_B, lse_B) = (5, ln 3) (scalar values)."""
    args = (2.0, LN(1.0), 5.0, LN(3.0))
    expected = float(_reference_merge(*args)[0])
    check_answer("merged o", answer, expected, hint=_merge_hint(answer, *args))


def check_quick_merge_second(answer) -> None:
    """Check yourself 2: merge (o_A, lse_A) = (1, ln 2) with (o_B, lse_B) = (4, ln 6): o."""
    args = (1.0, LN(2.0), 4.0, LN(6.0))
    expected = float(_reference_merge(*args)[0])
    check_answer("merged o", answer, expected, hint=_merge_hint(answer, *args))


def check_quick_merged_lse(answer) -> None:
    """Check yourself 2, continued: the merged lse of (1, ln 2) and (4, ln 6)."""
    expected = float(np.logaddexp(LN(2.0), LN(6.0)))
    hint = "lse = log(e^lse_A + e^lse_B), a natural log of the total mass"
    if _near(answer, LN(6.0)):
        hint = "that is max(lse_A, lse_B); add set A's mass too [misconception: lse-max]"
    elif _near(answer, 8.0):
        hint = "8 is the total mass e^lse; lse is its natural log"
    elif _near(answer, np.log2(8.0)):
        hint = "that is log2 of the mass; lse uses the natural log [misconception: base2-lse]"
    check_answer("merged lse", answer, expected, hint=hint)
