"""Notebook 02's buggy merges: each shows one misconception (same signature as merge_partials).

merge(o1, lse1, o2, lse2) -> (o, lse)   o1, o2 of shape (d,) or (rows, d); lse1, lse2 of
                                        shape () or (rows,)
MERGE_MISTAKES                          the named Mistakes of check_merge_partials, built
                                        from _MERGE_MISTAKE_SPECS
"""

from __future__ import annotations

import functools

import numpy as np

from course_utils.checks.engine.failures import LOW_PRECISION_MISTAKE, NAN_MISTAKE, Mistake

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


def _ratio_overflow(o1, lse1, o2, lse2, *, flip=False, lse_form="log1p", guarded=True):
    """The weights from the ratio r = e^(lse1 - lse2): w1 = r / (1 + r), w2 = 1 / (1 + r).

    Right on paper, and right while the two lse are close; r overflows to inf once lse1 - lse2 >
    709 and inf / inf is NaN. flip: r = e^(lse2 - lse1) instead (overflows the other way).
    lse_form: "log1p" (lse = lse2 + log(1 + r), inf as well) or "logaddexp" (a right lse).
    guarded: the empty sets (lse = -inf) handled apart with np.where, as a learner does to pass
    the notebook's empty-set rows; unguarded, an empty set already gives r = inf.
    """
    lse1, lse2 = np.asarray(lse1, dtype=np.float64), np.asarray(lse2, dtype=np.float64)
    a, b = (lse2, lse1) if flip else (lse1, lse2)
    r = np.exp(a - b)
    wa, wb = r / (1 + r), 1 / (1 + r)
    lse = b + np.log1p(r) if lse_form == "log1p" else np.logaddexp(lse1, lse2)
    w1, w2 = (wb, wa) if flip else (wa, wb)
    if guarded:
        e1, e2 = np.isneginf(lse1), np.isneginf(lse2)
        w1 = np.where(e1, 0.0, np.where(e2, 1.0, w1))
        w2 = np.where(e2, 0.0, np.where(e1, 1.0, w2))
        lse = np.where(e1, lse2, np.where(e2, lse1, lse))
    return _col(w1, o1) * o1 + _col(w2, o2) * o2, lse


def _ratio_overflow_guarded(o1, lse1, o2, lse2):
    return _ratio_overflow(o1, lse1, o2, lse2)


_RATIO_VARIANTS = [_ratio_overflow_guarded] + [
    functools.partial(_ratio_overflow, flip=flip, lse_form=form, guarded=guarded)
    for guarded in (True, False)
    for flip in (False, True)
    for form in ("log1p", "logaddexp")
][1:]


def _merge_in(dtype):
    """The right merge computed in a lower precision (the statistics kept in float32 or float16)."""

    def merge(o1, lse1, o2, lse2):
        o1, lse1, o2, lse2 = (np.asarray(a).astype(dtype) for a in (o1, lse1, o2, lse2))
        lse = np.logaddexp(lse1, lse2)
        safe = np.where(np.isneginf(lse), dtype(0), lse)
        w1, w2 = np.exp(lse1 - safe), np.exp(lse2 - safe)
        return _col(w1, o1) * o1 + _col(w2, o2) * o2, lse

    return merge


def _merge_float32(o1, lse1, o2, lse2):
    return _merge_in(np.float32)(o1, lse1, o2, lse2)


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
        "ratio-overflow",
        "weights from the ratio e^(lse_A - lse_B), which overflows when the lse are far apart",
        "w_A = r / (1 + r) with r = e^(lse_A - lse_B) is right on paper, but r is inf once the two "
        "lse are more than 709 apart (an empty set, lse = -inf, is infinitely far), and "
        "inf / inf is NaN. Two lse 1000 apart are common: a set whose scores are all much "
        "larger. Take both weights against the merged lse, which is never below either: "
        "lse = np.logaddexp(lse_A, lse_B), w_A = np.exp(lse_A - lse) <= 1.",
        _RATIO_VARIANTS,
    ),
    (
        LOW_PRECISION_MISTAKE.slug,
        LOW_PRECISION_MISTAKE.title,
        LOW_PRECISION_MISTAKE.explanation,
        [_merge_float32, _merge_in(np.float16)],
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


# A mistake is named only when its output on the failing case matches the learner's, and never
# on a case where it happens to give the right answer (core's diagnose): each replay below may be
# harmless on some inputs (a swap needs unequal weights, the ratio a gap beyond 709).
MERGE_MISTAKES: list[Mistake] = [
    Mistake(slug, title, explanation, fn)
    for slug, title, explanation, fns in _MERGE_MISTAKE_SPECS
    for fn in fns
]


# ---------------------------------------------------------------------------------------------
