"""Notebook 09's exercise 2: check_merge_splits, the learner's merge of the splits' partials.

check_merge_splits(merge_splits)   merge_splits(out_partial, lse_partial) -> (out, lse):
                                   out_partial (B, H, S, d), lse_partial (B, H, S) float32;
                                   out (B, H, d), lse (B, H)
MERGE_OUT_MISTAKES, MERGE_LSE_MISTAKES   the named Mistakes, each with a buggy merge
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.display import describe
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.kernels import (
    _nothing_on_stderr,
)
from course_utils.checks.engine.watch import _LearnerRaised, call_learner
from course_utils.checks.flash_decoding.compare import _as_array, _diagnose, _error, _failure
from course_utils.references.softmax import merge_partials


# ---- exercise 2: merge_splits --------------------------------------------------------------------
def _merge_reference(out_partial, lse_partial):
    """The lse merge in float64, split after split with references.softmax.merge_partials."""
    out = np.zeros(out_partial.shape[:2] + out_partial.shape[3:])
    lse = np.full(lse_partial.shape[:2], -np.inf)
    for s in range(lse_partial.shape[2]):
        out, lse = merge_partials(out, lse, out_partial[:, :, s], lse_partial[:, :, s])
    return out, lse


def _merge_variant(out_partial, lse_partial, *, bug):
    """The merge with one bug, in NumPy (float32 where the bug is an overflow)."""
    o, lse_s = out_partial, lse_partial
    with np.errstate(all="ignore"):
        m = lse_s.max(axis=2, keepdims=True)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        w = np.exp(lse_s - m_safe)
        total = w.sum(axis=2)
        right_lse = np.where(total > 0, m_safe[..., 0] + np.log(total), -np.inf)
        safe = np.where(total > 0, total, 1.0)[..., None]
        right_out = (w[..., None] * o).sum(axis=2) / safe
        if bug == "mean":
            return o.mean(axis=2), right_lse
        if bug == "mean-nonempty":
            full = np.isfinite(lse_s)
            n = full.sum(axis=2)[..., None]
            return (o * full[..., None]).sum(axis=2) / np.where(n > 0, n, 1), right_lse
        if bug == "no-shift":
            w32 = np.exp(lse_s.astype(np.float32)).astype(np.float64)
            w32 = np.where(w32 > np.finfo(np.float32).max, np.inf, w32)
            t32 = w32.sum(axis=2)
            return (w32[..., None] * o).sum(axis=2) / t32[..., None], np.log(t32)
        if bug == "empty-nan":
            w = np.exp(lse_s - m)
            total = w.sum(axis=2)
            return (w[..., None] * o).sum(axis=2) / total[..., None], m[..., 0] + np.log(total)
        if bug == "unnormalized":
            return (w[..., None] * o).sum(axis=2), right_lse
        if bug == "exp2":
            w2 = np.exp2(lse_s - m_safe)
            t2 = w2.sum(axis=2)
            out = (w2[..., None] * o).sum(axis=2) / np.where(t2 > 0, t2, 1.0)[..., None]
            return out, np.where(t2 > 0, m_safe[..., 0] + np.log2(t2), -np.inf)
        if bug == "lse-max":
            return right_out, m[..., 0]
        if bug == "lse-sum":
            return right_out, np.where(total > 0, np.log(np.exp(lse_s).sum(axis=2)), -np.inf)
    raise ValueError(bug)


def _merge_mistake(slug, title, explanation, bug):
    return Mistake(slug, title, explanation, functools.partial(_merge_variant, bug=bug))


_WEIGHTS = (
    "A chunk's out is normalized over its own keys; its weight in the answer is its share of the "
    "softmax mass, exp(lse_s - lse) with lse = log sum_s exp(lse_s). "
)
MERGE_OUT_MISTAKES = [
    _merge_mistake(
        "merge-ignores-lse",
        "the partials are averaged (the merge weights do not use lse)",
        _WEIGHTS + "A plain average gives a chunk of 3 tokens the weight of one of 3000.",
        "mean",
    ),
    _merge_mistake(
        "merge-ignores-lse",
        "the non-empty partials are averaged (the merge weights do not use lse)",
        _WEIGHTS + "Leaving the empty chunks out is right, but the others are not equal either.",
        "mean-nonempty",
    ),
    _merge_mistake(
        "empty-chunk-nan",
        "a sequence with no token (every lse_s = -inf) gives NaN",
        "When every chunk is empty the max is -inf and lse_s - max is -inf - (-inf) = NaN. "
        "Shift by 0 there (torch.where(m == -inf, 0, m)) and return out = 0, lse = -inf.",
        "empty-nan",
    ),
    _merge_mistake(
        "no-max-shift",
        "the weights are exp(lse_s), with no max subtracted",
        "lse_s reaches several hundred; exp(89) already overflows float32, and inf / inf is "
        "NaN. Subtract the largest lse first: w_s = exp(lse_s - max_s lse_s), at most 1.",
        "no-shift",
    ),
    _merge_mistake(
        "merge-unnormalized",
        "the weights exp(lse_s - max) are not divided by their sum",
        _WEIGHTS + "exp(lse_s - max) is a weight relative to the largest chunk; divide by their "
        "sum, or equivalently use exp(lse_s - lse).",
        "unnormalized",
    ),
    _merge_mistake(
        "exp-vs-exp2",
        "the weights use exp2 (and log2) on a natural-log lse",
        "lse_partial is in natural log: weights exp(lse_s - lse), not exp2.",
        "exp2",
    ),
]
MERGE_LSE_MISTAKES = [
    _merge_mistake(
        "merge-lse-max",
        "lse is the largest lse_s",
        "The merged lse is log sum_s exp(lse_s) = m + log sum_s exp(lse_s - m): larger than the "
        "max unless one chunk holds all the mass.",
        "lse-max",
    ),
    _merge_mistake(
        "no-max-shift",
        "lse = log(sum_s exp(lse_s)), with no max subtracted",
        "exp(lse_s) overflows for lse_s > 88 in float32 (and past 709 in float64): "
        "lse = m + log(sum_s exp(lse_s - m)).",
        "lse-sum",
    ),
]


@dataclass(frozen=True)
class MergeCase:
    label: str
    lse: tuple  # (batch, heads, num_splits) nested lists: the lse_partial
    d: int = 4
    seed: int = 0


def _merge_cases(seed, trials) -> list[MergeCase]:
    inf = -math.inf
    cases = [
        MergeCase("two splits with equal lse", (((0.5, 0.5),),)),
        MergeCase("three splits, lse 0, 2 and -1", (((0.0, 2.0, -1.0),),)),
        MergeCase("an empty split (lse -inf, out 0) between two", (((1.0, inf, 3.0),),)),
        MergeCase("lse 1000 apart: 500 and -500", (((500.0, -500.0),),)),
        MergeCase("every split empty (a sequence of length 0)", (((inf, inf, inf),),)),
        MergeCase("one split only", (((2.5,),),)),
        MergeCase("batch 2, 2 heads, lse near 300 and an empty row",
                  (((300.0, 301.0, inf), (inf, inf, inf)), ((-5.0, 0.0, 4.0), (250.0, inf, 249.0))),
                  d=6, seed=3),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        b, h, s = (int(x) for x in rng.integers(1, 4, size=3)) if t % 2 else (2, 3, 5)
        lse = rng.uniform(-400, 400, size=(b, h, s))
        lse[rng.random((b, h, s)) < 0.25] = -math.inf
        nested = tuple(tuple(tuple(float(x) for x in row) for row in head) for head in lse)
        cases.append(
            MergeCase(
                f"random case {t + 1}", nested, int(rng.integers(1, 9)), int(rng.integers(2**31))
            )
        )
    return cases


def _merge_inputs(case: MergeCase):
    import torch

    lse = np.array(case.lse, dtype=np.float64)
    rng = np.random.default_rng(case.seed)
    out = rng.standard_normal(lse.shape + (case.d,))
    out[np.isinf(lse)] = 0.0  # an empty chunk's partial
    out32, lse32 = out.astype(np.float32), lse.astype(np.float32)
    tensors = (torch.from_numpy(out32.copy()), torch.from_numpy(lse32.copy()))
    return tensors, (out32.astype(np.float64), lse32.astype(np.float64))


def _out_tolerance(lse_partial: np.ndarray) -> float:
    """The relative error a right float32 merge may make in out: 1e-5, or more for large lse.

    float32 holds an lse near L only to within half an ulp, up to 2^-24 * 2L absolute (2.4e-5 at
    L = 400), and each weight exp(lse_s - lse) inherits that error as a relative one. A merge that
    folds the splits in one by one (two at a time, as notebook 02 merges) rounds its running lse
    once per split: up to num_splits such errors. Every mistake the check names is off by far
    more (a factor, not a few ulps).
    """
    finite = np.abs(lse_partial[np.isfinite(lse_partial)])
    largest = float(finite.max()) if finite.size else 0.0
    return max(1e-5, 2.0**-23 * largest * lse_partial.shape[-1])


def check_merge_splits(merge_splits: Callable, seed: int | None = 0, trials: int = 4) -> None:
    """Check merge_splits(out_partial, lse_partial) -> (out, lse) on float32 torch tensors.

    out_partial: (batch, heads, num_splits, d), lse_partial: (batch, heads, num_splits), natural
    log, -inf (with out 0) for an empty chunk. Expected: out (batch, heads, d), lse (batch, heads)
    of the float64 lse merge, to a relative error of 1e-5 (out: more where float32 cannot do
    better, see _out_tolerance); out 0 and lse -inf where every chunk is empty.
    """
    name = "merge_splits"
    cases = _merge_cases(seed, trials)
    lse_tol, match_tol = 1e-5, 1e-4
    with _nothing_on_stderr():
        for case in cases:
            tensors, args = _merge_inputs(case)
            try:
                result = call_learner(merge_splits, *tensors, name=name)
            except NotImplementedError:
                raise
            except _LearnerRaised as err:
                raise CheckFailure(
                    f"✗ {name} raised {err.exc!r} on {case.label}.\n  input: lse_partial = "
                    f"{describe(args[1])}, out_partial of shape {args[0].shape}"
                ) from None
            if not isinstance(result, tuple | list) or len(result) != 2:
                raise CheckFailure(
                    f"✗ {name} must return the pair (out, lse), got {type(result).__name__}"
                )
            yours = tuple(_as_array(x) for x in result)
            expected = _merge_reference(*args)
            for which, what, mistakes in (
                (0, "out", MERGE_OUT_MISTAKES),
                (1, "lse", MERGE_LSE_MISTAKES + MERGE_OUT_MISTAKES),
            ):
                tol = _out_tolerance(args[1]) if which == 0 else lse_tol
                err = _error(yours[which], expected[which])
                if err < tol:
                    continue
                mistake = _diagnose(
                    which, yours[which], args, expected[which], mistakes, tol, match_tol
                )
                inputs = f"lse_partial = {describe(args[1])}, out_partial of shape {args[0].shape}"
                raise CheckFailure(
                    _failure(
                        name, case.label, inputs, what, yours[which], expected[which], err, tol,
                        mistake, "the lse merge: weights exp(lse_s - lse), an empty chunk "
                        "weighing 0, out 0 and lse -inf when every chunk is empty",
                    )
                )  # fmt: skip
    print(
        f"✓ {name}: {len(cases)} cases match the float64 lse merge (lse 1000 apart, empty "
        "chunks, every chunk empty, one split)"
    )
