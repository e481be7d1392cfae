"""Checks for notebook 07, the attention backward pass recomputed from lse.

    check_softmax_backward_rows(fn)        softmax_backward_rows(P, dP) -> dS, row by row
    check_flash_attention_backward(fn)     flash_attention_backward(Q, K, V, O, dO, lse, Br, Bc,
                                           causal) -> (dQ, dK, dV)
    check_quick_backward_flops_ratio(a)    FlashAttention / standard backward FLOPs
    check_quick_lse_bytes(a)               bytes of one head's lse at N = 32,768
    check_quick_p_over_lse(a)              one head's P in bf16 / its lse in fp32, N = 32,768

Every check runs the learner's function on cases ordered smallest first (the lesson's and the
textbook's worked examples, then edge cases: square and ragged tiles, Br != Bc, Nq != Nk, dv != d,
masked entries, rows that saw no key; then random cases) and names the misconception behind a
wrong answer. The buggy implementations that show each misconception are in
SOFTMAX_BACKWARD_MISTAKES and BACKWARD_MISTAKES.

On each case the three gradients are compared one after the other: dV first (it needs only P),
then dK, then dQ. A mistake in recomputing P is then named by dV whatever else is wrong, and a
mistake in dS (the D term) or in a scale by dK or dQ.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import sys
from collections.abc import Callable

import numpy as np

from ..attention import attention_reference
from ..backward import attention_backward_reference, softmax_backward
from ..softmax import NEG_INF
from ._core import (
    CALLS_REFERENCE,
    Case,
    CheckFailure,
    Mistake,
    pick_output,
    run_cases,
)
from ._core import hinted_answer as _hinted

__all__ = [
    "BACKWARD_MISTAKES",
    "SOFTMAX_BACKWARD_MISTAKES",
    "check_flash_attention_backward",
    "check_quick_backward_flops_ratio",
    "check_quick_lse_bytes",
    "check_quick_p_over_lse",
    "check_softmax_backward_rows",
]


# ---- the course's answer must not be called -------------------------------------------------
class _CalledBackwardReference(BaseException):
    """Raised out of the learner's call (past call_learner's `except Exception`)."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


_WATCHED = ("course_utils.backward",)


def _refusing_reference(fn: Callable) -> Callable:
    """fn, watched for calls into course_utils.backward (the answers of this notebook).

    _core watches the forward's modules; this adds the backward's, chaining with its profiler.
    """

    @functools.wraps(fn)
    def watched(*args, **kwargs):
        outer = sys.getprofile()
        hit: list[str] = []

        def profile(frame, event, arg):
            if outer is not None:
                outer(frame, event, arg)
            if event == "call" and not hit:
                module = frame.f_globals.get("__name__", "")
                if module in _WATCHED:
                    hit.append(f"{module}.{frame.f_code.co_name}")

        sys.setprofile(profile)
        try:
            result = fn(*args, **kwargs)
        finally:
            sys.setprofile(outer)
        if hit:
            raise _CalledBackwardReference(hit[0])
        return result

    return watched


def _calls_reference_failure(name: str, where: str) -> CheckFailure:
    m = CALLS_REFERENCE
    return CheckFailure(
        f"✗ {name} calls {where}.\n"
        f"  likely mistake: {m.title} [misconception: {m.slug}]\n  {m.explanation}"
    )


# ---- exercise 1: softmax_backward_rows ------------------------------------------------------
def _softmax_backward_variant(P, dP, *, bug):
    P, dP = np.asarray(P, dtype=float), np.asarray(dP, dtype=float)
    D = (P * dP).sum(axis=1, keepdims=True)
    if bug == "forgot-D":
        return P * dP
    if bug == "D-from-dP":
        return P * (dP - dP.sum(axis=1, keepdims=True))
    if bug == "diagonal-only":
        return P * (1 - P) * dP
    if bug == "D-columns":
        return P * (dP - (P * dP).sum(axis=0))
    if bug == "D-broadcast":
        return P * (dP - (P * dP).sum(axis=1))  # (rows,) lines up with the columns
    if bug == "sign":
        return P * (D - dP)
    raise ValueError(bug)


_SOFTMAX_BACKWARD = (
    "The softmax Jacobian is diag(p) - p p^T, so dS_ij = P_ij (dP_ij - D_i) with "
    "D_i = sum_j P_ij dP_ij: one number per row, subtracted from every entry of that row."
)

SOFTMAX_BACKWARD_MISTAKES = [
    Mistake(
        "forgot-D",
        "forgot D: dS = P * dP",
        "P_ij depends on every score of row i (through the normalizer), not only on S_ij. That "
        "coupling is the -p p^T part of the Jacobian, and it gives the term -P_ij D_i. "
        + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="forgot-D"),
    ),
    Mistake(
        "D-from-dP",
        "D_i is the row sum of dP (without the weights P)",
        "D_i is a weighted sum: sum_j P_ij dP_ij, the average of dP under the softmax weights "
        "(in attention: dO_i . O_i). " + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="D-from-dP"),
    ),
    Mistake(
        "diagonal-only",
        "only the diagonal of the Jacobian: dS = P * (1 - P) * dP",
        "p(1 - p) is dp_j/ds_j, but s_j changes every other p_k too (dp_k/ds_j = -p_k p_j). "
        "Summing over k gives P_ij (dP_ij - D_i). " + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="diagonal-only"),
    ),
    Mistake(
        "D-wrong-axis",
        "D summed over the rows (axis=0) instead of along each row",
        "Each row is its own softmax, so D_i sums over row i: (P * dP).sum(axis=1, "
        "keepdims=True), of shape (rows, 1).",
        functools.partial(_softmax_backward_variant, bug="D-columns"),
    ),
    Mistake(
        "D-wrong-axis",
        "D of shape (rows,) subtracted along the columns (keepdims or [:, None] missing)",
        "(P * dP).sum(axis=1) has shape (rows,); NumPy lines it up with the LAST axis, so D_j is "
        "subtracted from column j (for a square tile no error shows). Keep it a column: "
        "sum(axis=1, keepdims=True) or D[:, None].",
        functools.partial(_softmax_backward_variant, bug="D-broadcast"),
    ),
    Mistake(
        "sign-flipped",
        "the sign is flipped: dS = P * (D - dP)",
        "Raising S_ij moves probability to key j from the others, so the loss changes by "
        "P_ij times (dP_ij minus the row's average D_i): dS_ij = P_ij (dP_ij - D_i). Check "
        "with two keys by hand.",
        functools.partial(_softmax_backward_variant, bug="sign"),
    ),
]


def _softmax_rows(rng, rows, n, masked=0.0, empty_rows=()):
    """(rows, n) softmax probabilities of random scores; masked entries and empty rows are 0."""
    s = 1.5 * rng.standard_normal((rows, n))
    s[rng.random((rows, n)) < masked] = NEG_INF
    s[list(empty_rows)] = NEG_INF
    m = s.max(axis=1, keepdims=True, initial=NEG_INF)
    p = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    l = p.sum(axis=1, keepdims=True)
    return np.divide(p, l, out=np.zeros_like(p), where=l > 0)


def _softmax_backward_cases(seed, trials):
    rng = np.random.default_rng(0)
    lesson_p = np.array([[2.0, 1.0, 8.0, 4.0]]) / 15  # e^s = 2, 1, 8, 4
    lesson_dp = np.array([[1.0, 2.0, 3.0, 4.0]])  # dP = dO V^T with dO = 1, values 1..4
    two = np.array([[0.25, 0.75], [0.5, 0.5]])
    masked = np.array([[0.2, 0.0, 0.8], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    cases = [
        Case(
            "two rows of two: P = [[1/4, 3/4], [1/2, 1/2]], dP = [[1, -1], [2, 0]]",
            (two, np.array([[1.0, -1.0], [2.0, 0.0]])),
        ),
        Case("the lesson's row: P = [2, 1, 8, 4] / 15, dP = [1, 2, 3, 4]", (lesson_p, lesson_dp)),
        Case(
            "3 x 3: a masked entry (P = 0), a row with no keys (all 0), a one-hot row",
            (masked, np.array([[1.0, 5.0, -2.0], [3.0, 1.0, 2.0], [0.5, -1.0, 4.0]])),
        ),
        Case("a 4 x 4 tile", (_softmax_rows(rng, 4, 4), rng.standard_normal((4, 4)))),
        Case("a 3 x 7 tile (Br != Bc)", (_softmax_rows(rng, 3, 7), rng.standard_normal((3, 7)))),
        Case(
            "a 16 x 16 tile with masked entries",
            (_softmax_rows(rng, 16, 16, masked=0.3), rng.standard_normal((16, 16))),
        ),
        Case(
            "a 5 x 40 tile with two empty rows",
            (_softmax_rows(rng, 5, 40, 0.1, (1, 3)), rng.standard_normal((5, 40))),
        ),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        rows, n = int(rng.integers(1, 25)), int(rng.integers(1, 49))
        empty = [r for r in range(rows) if rng.random() < 0.1]
        P = _softmax_rows(rng, rows, n, masked=float(rng.choice([0.0, 0.3])), empty_rows=empty)
        cases.append(
            Case(f"random case {t + 1}: a {rows} x {n} tile", (P, rng.standard_normal((rows, n))))
        )
    return cases


def check_softmax_backward_rows(fn: Callable, seed: int | None = 0, trials: int = 8) -> None:
    """Check softmax_backward_rows(P, dP) -> dS = P * (dP - D), D_i = sum_j P_ij dP_ij.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    name = "softmax_backward_rows"
    cases = _softmax_backward_cases(seed, trials)
    try:
        run_cases(
            name,
            _refusing_reference(fn) if callable(fn) else fn,
            softmax_backward,
            cases,
            outputs=("dS",),
            mistakes=SOFTMAX_BACKWARD_MISTAKES,  # never named where right on a case (_core)
            rtol=1e-10,
            atol=1e-12,
            summary="masked entries, empty rows, Br != Bc",
        )
    except _CalledBackwardReference as called:
        raise _calls_reference_failure(name, called.where) from None


# ---- exercise 2: flash_attention_backward ---------------------------------------------------
def _reference_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """The answer, from the oracle that materializes P (Br and Bc change nothing).

    Rows with lse = -inf saw no key: their P is 0, so they add nothing and get dQ = 0; the oracle
    runs on the other rows (such rows appear only in the cases without a causal mask).
    """
    keep = ~np.isneginf(np.asarray(lse))
    if keep.all():
        return attention_backward_reference(Q, K, V, dO, causal=causal)
    assert not causal, "rows without keys are made only for cases without a mask"
    dQ = np.zeros_like(Q, dtype=float)
    dQ[keep], dK, dV = attention_backward_reference(Q[keep], K, V, dO[keep])
    return dQ, dK, dV


def _backward_variant(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False, *, bug):
    """The FlashAttention-2 backward with one mistake, as a learner would write it."""
    Nq, d = Q.shape
    Nk = len(K)
    tau = 1.0 / math.sqrt(d)
    tau_s = 1.0 if bug == "missing-scale" else tau
    tau_q = 1.0 if bug in ("unscaled-dq", "unscaled-both") else tau
    tau_k = 1.0 if bug in ("unscaled-dk", "unscaled-both") else tau
    D = (dO * O).sum(axis=1)
    if bug == "D-from-dP":
        D = (dO @ V.T).sum(axis=1)
    lse_used = lse if bug == "unguarded" else np.where(np.isneginf(lse), np.inf, lse)
    if bug == "m-without-l":  # the forward's row max, as if it had been stored instead of lse
        S = tau * (Q @ K.T)
        if causal:
            S = np.where(np.tri(Nq, Nk, dtype=bool), S, NEG_INF)
        m = S.max(axis=1, initial=NEG_INF)
        lse_used = np.where(np.isneginf(lse), np.inf, m)
    q_end = (Nq // Br) * Br if bug in ("ragged-q", "ragged-both") else Nq
    k_end = (Nk // Bc) * Bc if bug in ("ragged-k", "ragged-both") else Nk
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, k_end, Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        cols = np.arange(j, j + len(k_j))
        dk_j, dv_j = np.zeros_like(k_j), np.zeros_like(v_j)
        for i in range(0, q_end, Br):
            q_i, do_i = Q[i : i + Br], dO[i : i + Br]
            rows = np.arange(i, i + len(q_i))
            if causal and bug != "no-mask" and j > rows[-1]:
                if bug == "skip-break":
                    break
                continue
            s = tau_s * (q_i @ k_j.T)
            if causal and bug not in ("no-mask", "skip-without-mask"):
                if bug == "mask-strict":
                    visible = cols[None, :] < rows[:, None]
                else:
                    visible = cols[None, :] <= rows[:, None]
                s = np.where(visible, s, NEG_INF)
            if bug == "base2":
                p = np.exp2(s - lse_used[rows, None])
            elif bug == "base2-scaled":
                p = np.exp2(s * math.log2(math.e) - lse_used[rows, None])
            elif bug in ("tile-max", "tile-softmax"):
                m_t = s.max(axis=1, keepdims=True)
                p = np.exp(s - np.where(np.isneginf(m_t), 0.0, m_t))
                if bug == "tile-softmax":
                    l_t = p.sum(axis=1, keepdims=True)
                    p = np.divide(p, l_t, out=np.zeros_like(p), where=l_t > 0)
                p[np.isneginf(lse[rows])] = 0.0  # keep the rows without keys empty
            else:
                p = np.exp(s - lse_used[rows, None])
            dv_add = p @ do_i if bug == "dv-no-transpose" else p.T @ do_i
            dv_j = dv_add if bug == "dk-dv-overwritten" else dv_j + dv_add
            dp = do_i @ v_j.T
            D_i = D[rows]
            if bug == "D-per-tile":
                D_i = (p * dp).sum(axis=1)
            elif bug == "D-from-dP-tile":
                D_i = dp.sum(axis=1)
            ds = p * dp if bug == "forgot-D" else p * (dp - D_i[:, None])
            dq_add = tau_q * (ds @ k_j)
            if bug == "dq-overwritten":
                dQ[i : i + Br] = dq_add
            else:
                dQ[i : i + Br] += dq_add
            dk_add = tau_k * (ds @ q_i if bug == "dk-no-transpose" else ds.T @ q_i)
            dk_j = dk_add if bug == "dk-dv-overwritten" else dk_j + dk_add
        dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j
    return dQ, dK, dV


def _bwd_mistake(slug, title, explanation, bug):
    return Mistake(slug, title, explanation, functools.partial(_backward_variant, bug=bug))


_P_FROM_LSE = (
    "The forward's lse_i = m_i + log l_i holds both the max and the sum: "
    "P_ij = exp(S_ij - m_i) / l_i = exp(S_ij - lse_i), with S_ij = tau Q_i K_j^T recomputed "
    "and masked exactly as in the forward."
)
_D_RULE = (
    "dS_ij = P_ij o (dP_ij - D_i) with D_i = sum over ALL keys of P_ij dP_ij, which equals "
    "dO_i . O_i: compute D = (dO * O).sum(axis=1) once, before the loops."
)
_MASK_RULE = (
    "The backward must see exactly the scores the forward saw: skip the K/V tiles above the "
    "diagonal and mask the tiles that cross it with global indices, "
    "np.where(cols[None, :] <= rows[:, None], s_ij, -np.inf)."
)
_TRANSPOSE = (
    "Follow the shapes: P_ij is (Br, Bc), dO_i is (Br, dv), so dV_j (Bc, dv) += P_ij^T dO_i; "
    "dS_ij is (Br, Bc), Q_i is (Br, d), so dK_j (Bc, d) += tau dS_ij^T Q_i. With square tiles "
    "the wrong product has the right shape, so no error warns you."
)
_SCALE = (
    "S = tau Q K^T, so dQ = tau dS K and dK = tau dS^T Q: the chain rule brings the scale "
    "tau = 1/sqrt(d) into both. (dV needs none: O = P V.)"
)
_RAGGED = (
    "When Br (or Bc) does not divide N, the last tile is shorter but still there. Loop with "
    "range(0, N, Br) and slice Q[i:i + Br]; slicing past the end is fine in NumPy."
)

BACKWARD_MISTAKES = [
    _bwd_mistake(
        "nan-masked",
        "inf or NaN from a row that saw no key (exp(S - lse) with lse = -inf)",
        "A row the forward gave no key has O = 0 and lse = -inf, and S - lse is +inf (or "
        "-inf - (-inf) = NaN where masked). Its P must be 0: subtract "
        "np.where(np.isneginf(lse), np.inf, lse) instead, and the row gets zero gradients.",
        "unguarded",
    ),
    _bwd_mistake(
        "forgot-D",
        "forgot D: dS = P * dP",
        "The softmax couples the entries of a row: its Jacobian is diag(p) - p p^T. " + _D_RULE,
        "forgot-D",
    ),
    _bwd_mistake(
        "m-without-l",
        "P recomputed as exp(S - m) with the row max m, without dividing by l",
        "exp(S - m) is the unnormalized weight; the softmax divides by l = sum exp(S - m). "
        + _P_FROM_LSE,
        "m-without-l",
    ),
    _bwd_mistake(
        "m-without-l",
        "P recomputed as exp(S - m) with the max of the tile, without dividing by l",
        "Neither the tile's max nor the tile's sum is the row's: the forward saw all keys. "
        + _P_FROM_LSE,
        "tile-max",
    ),
    _bwd_mistake(
        "tile-local-softmax",
        "P recomputed as the softmax of the tile alone",
        "Each tile's softmax sums to 1 over its own keys, but the row's softmax sums to 1 over all "
        "of them. " + _P_FROM_LSE,
        "tile-softmax",
    ),
    _bwd_mistake(
        "unscaled-dq-dk", "dQ is not multiplied by the softmax scale", _SCALE, "unscaled-dq"
    ),
    _bwd_mistake(
        "unscaled-dq-dk", "dK is not multiplied by the softmax scale", _SCALE, "unscaled-dk"
    ),
    _bwd_mistake(
        "unscaled-dq-dk",
        "dQ and dK are not multiplied by the softmax scale",
        _SCALE,
        "unscaled-both",
    ),
    _bwd_mistake(
        "missing-scale",
        "the recomputed scores are not multiplied by 1/sqrt(d)",
        "The forward's scores are S = tau Q K^T with tau = 1/sqrt(d), and lse was computed from "
        "them; recompute the same S, or P = exp(S - lse) is wrong (and may exceed 1).",
        "missing-scale",
    ),
    _bwd_mistake(
        "D-from-dP",
        "D_i is the row sum of dP = dO V^T (without the weights P)",
        "D_i is a weighted sum, sum_j P_ij dP_ij. " + _D_RULE,
        "D-from-dP",
    ),
    _bwd_mistake(
        "D-from-dP",
        "D_i is the row sum of the tile's dP_ij (without the weights P)",
        "D_i is a weighted sum over the whole row, sum_j P_ij dP_ij. " + _D_RULE,
        "D-from-dP-tile",
    ),
    _bwd_mistake(
        "D-per-tile",
        "D_i = rowsum(P_ij * dP_ij) of the current tile only",
        "The sum in D_i runs over all keys of the row, not over one tile; that is why it is "
        "computed from dO and O, which already hold the whole row. " + _D_RULE,
        "D-per-tile",
    ),
    _bwd_mistake(
        "missing-transpose",
        "dV_j += P_ij dO_i (the transpose of P is missing)",
        _TRANSPOSE,
        "dv-no-transpose",
    ),
    _bwd_mistake(
        "missing-transpose",
        "dK_j += tau dS_ij Q_i (the transpose of dS is missing)",
        _TRANSPOSE,
        "dk-no-transpose",
    ),
    _bwd_mistake(
        "dq-not-accumulated",
        "dQ_i is overwritten by each K/V tile instead of accumulated",
        "dQ_i = tau sum_j dS_ij K_j sums over every K/V tile: dQ[i:i + Br] += ..., starting "
        "from zeros. (On a GPU the K/V tiles run in parallel, and this += is an atomic add.)",
        "dq-overwritten",
    ),
    _bwd_mistake(
        "dk-dv-not-accumulated",
        "dK_j and dV_j are overwritten by each query tile instead of accumulated",
        "dV_j = sum_i P_ij^T dO_i and dK_j = tau sum_i dS_ij^T Q_i sum over every query tile: "
        "start dk_j, dv_j at zero before the inner loop, add with +=, write them after it.",
        "dk-dv-overwritten",
    ),
    _bwd_mistake(
        "causal-mask-missing",
        "the backward ignores the causal mask",
        _MASK_RULE + " Without the mask P_ij = exp(S_ij - lse_i) is not 0 for a future key.",
        "no-mask",
    ),
    _bwd_mistake(
        "causal-mask-missing",
        "tiles above the diagonal are skipped, but tiles crossing it are not masked",
        _MASK_RULE + " Skipping tiles is half of the mask.",
        "skip-without-mask",
    ),
    _bwd_mistake(
        "causal-loop-break",
        "the query loop breaks at the first skipped tile (the forward's break, in the backward)",
        "In the forward the skipped K/V tiles come last in a row, so break works there. In the "
        "backward the loop over query tiles runs down a column of K_j, and the skipped tiles "
        "(above the diagonal) come FIRST: skip them with continue, or start the loop at the "
        "query tile that holds row j, (j // Br) * Br.",
        "skip-break",
    ),
    _bwd_mistake(
        "causal-off-by-one",
        "the causal mask hides the diagonal (c < r instead of c <= r)",
        _MASK_RULE + " A query sees its own key.",
        "mask-strict",
    ),
    _bwd_mistake(
        "base2-lse",
        "P recomputed with exp2 from the natural-log lse",
        "lse is in natural log, so P = exp(S - lse). A kernel that uses exp2 for speed must "
        "convert both terms: exp2(S * log2(e) - lse * log2(e)).",
        "base2",
    ),
    _bwd_mistake(
        "base2-lse",
        "P = exp2(S * log2(e) - lse): the scores converted to base 2, lse not",
        "exp2(x log2 e) = exp(x) only if every term of x is converted: "
        "exp2((S - lse) * log2(e)). lse is in natural log.",
        "base2-scaled",
    ),
]
for _bug, _where in (("ragged-q", "query"), ("ragged-k", "key"), ("ragged-both", "query and key")):
    BACKWARD_MISTAKES.append(
        _bwd_mistake(
            "ragged-tile",
            f"the ragged last {_where} tile is dropped (N // B tiles instead of ceil(N / B))",
            _RAGGED,
            _bug,
        )
    )


def _problem(rng, Nq, Nk, d, dv=None, spread=1.5, no_key_rows=()):
    """A consistent case (Q, K, V, O, dO, lse): O and lse from the forward pass of the course.

    no_key_rows: rows marked as having seen no key (O = 0, lse = -inf, as for a padding row).
    """
    dv = d if dv is None else dv
    Q = spread * rng.standard_normal((Nq, d))
    K = spread * rng.standard_normal((Nk, d))
    V = rng.standard_normal((Nk, dv))
    dO = rng.standard_normal((Nq, dv))
    return _with_forward(Q, K, V, dO, False, no_key_rows, attention_reference)


def _with_forward(Q, K, V, dO, causal, no_key_rows, forward):
    O, lse = forward(Q, K, V, causal=causal)
    rows = list(no_key_rows)
    O[rows], lse[rows] = 0.0, NEG_INF
    return Q, K, V, O, dO, lse


def _causal_problem(rng, N, d, dv=None, spread=1.5):
    dv = d if dv is None else dv
    Q = spread * rng.standard_normal((N, d))
    K = spread * rng.standard_normal((N, d))
    V = rng.standard_normal((N, dv))
    dO = rng.standard_normal((N, dv))
    return _with_forward(Q, K, V, dO, True, (), attention_reference)


def _backward_cases(seed, trials):
    rng = np.random.default_rng(0)  # the fixed edge cases are the same every time

    def given(Q, K, V, dO):
        Q, K, V, dO = (np.array(a, dtype=float) for a in (Q, K, V, dO))
        return _with_forward(Q, K, V, dO, False, (), attention_reference)

    def case(label, problem, Br=None, Bc=None, causal=False):
        kwargs = {} if Br is None else {"Br": Br, "Bc": Bc}
        if causal:
            kwargs["causal"] = True
        return Case(label + (", causal" if causal else ""), problem, kwargs)

    # d = 1 and q = 1: the keys are the scores (tau = 1); dO = 1, so dP = the values
    lesson = given([[1.0]], np.log([[2.0], [1.0], [8.0], [4.0]]), [[1], [2], [3], [4]], [[1.0]])
    textbook = given([[1.0]], [[1], [3], [2], [5]], [[10], [20], [30], [40]], [[1.0]])
    two = given([[1.0], [2.0]], [[0.5], [-1.0]], [[1.0], [3.0]], [[1.0], [-1.0]])
    textbook_two = given(
        [[1.0], [-1.0]], [[1], [3], [2], [5]], [[10], [20], [30], [40]], [[1.0], [0.5]]
    )
    no_keys = given(
        rng.standard_normal((3, 2)), np.zeros((0, 2)), np.zeros((0, 2)), rng.standard_normal((3, 2))
    )
    cases = [
        case("N = 2, d = 1, one 2 x 2 tile (Br = Bc = 2)", two, 2, 2),
        case("the lesson example: one query, scores ln [2, 1, 8, 4], values [1, 2, 3, 4], "
             "dO = 1, Bc = 2", lesson, 1, 2),
        case("the textbook example: one query, scores [1, 3, 2, 5], values [10, 20, 30, 40], "
             "dO = 1, Bc = 2", textbook, 1, 2),
        case("two queries against the textbook keys, Br = Bc = 2", textbook_two, 2, 2),
        case("N = 4, d = 2, Br = Bc = 2", _problem(rng, 4, 4, 2), 2, 2),
        case("N = 4, d = 2, Br = Bc = 2", _causal_problem(rng, 4, 2), 2, 2, True),
        case("N = 3, d = 2, one tile (Br = Bc = 3)", _causal_problem(rng, 3, 2), 3, 3, True),
        case("N = 4, d = 2, Br = Bc = 1 (one score per tile)", _causal_problem(rng, 4, 2),
             1, 1, True),
        case("N = 6, d = 3, dv = 2, Br = Bc = 3", _problem(rng, 6, 6, 3, 2), 3, 3),
        case("N = 7, d = 3, Br = 3, Bc = 2 (ragged tiles)", _problem(rng, 7, 7, 3), 3, 2),
        case("N = 7, d = 3, Br = 3, Bc = 2 (ragged, Br > Bc)", _causal_problem(rng, 7, 3),
             3, 2, True),
        case("N = 7, d = 3, Br = 2, Bc = 3 (ragged, Br < Bc)", _causal_problem(rng, 7, 3),
             2, 3, True),
        case("Nq = 5 queries, Nk = 9 keys, d = 2, Br = 2, Bc = 4", _problem(rng, 5, 9, 2), 2, 4),
        case("Nq = 9 queries, Nk = 4 keys, d = 2, Br = 4, Bc = 3", _problem(rng, 9, 4, 2), 4, 3),
        case("N = 5, d = 4, Br = Bc = 8 (one tile, Br > N)", _causal_problem(rng, 5, 4),
             8, 8, True),
        case("N = 10, d = 4, default tiles Br = Bc = 16", _problem(rng, 10, 10, 4)),
        case("N = 12, d = 4, Br = 8, Bc = 3", _causal_problem(rng, 12, 4), 8, 3, True),
        case("Nq = 3 queries and no keys at all (Nk = 0)", no_keys, 2, 2),
        case("Nq = 6, Nk = 5, d = 2, Br = Bc = 2; rows 1 and 4 saw no key (lse = -inf, O = 0)",
             _problem(rng, 6, 5, 2, no_key_rows=(1, 4)), 2, 2),
        case("N = 37, d = 8, Br = 4, Bc = 3 (many tiles)", _causal_problem(rng, 37, 8),
             4, 3, True),
        case("N = 37, d = 8, Br = 5, Bc = 6 (many tiles)", _problem(rng, 37, 37, 8), 5, 6),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        causal = bool(rng.integers(2))
        Nq = int(rng.integers(1, 41))
        Nk = Nq if causal or rng.random() < 0.5 else int(rng.integers(1, 41))
        d, dv = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        Br, Bc = (int(b) for b in rng.integers(1, 17, size=2))
        label = (
            f"random case {t + 1}: Nq = {Nq}, Nk = {Nk}, d = {d}, dv = {dv}, Br = {Br}, Bc = {Bc}"
        )
        if causal:
            problem = _causal_problem(rng, Nq, d, dv)
        else:
            no_key = [r for r in range(Nq) if rng.random() < 0.15]
            problem = _problem(rng, Nq, Nk, d, dv, no_key_rows=no_key)
            if no_key:
                label += f", {len(no_key)} row(s) without keys"
        cases.append(case(label, problem, Br, Bc, causal))
    return cases


DQKV = ("dQ", "dK", "dV")


def check_flash_attention_backward(fn: Callable, seed: int | None = 0, trials: int = 10) -> None:
    """Check flash_attention_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False).

    It must return (dQ, dK, dV), compared with the naive backward (which materializes P) to
    1e-8, case by case (smallest first): dV, then dK, then dQ.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    name = "flash_attention_backward"
    if not callable(fn):
        raise CheckFailure(f"{name}: expected a function, got {type(fn).__name__} {fn!r}")
    cases = _backward_cases(seed, trials)
    watched = _refusing_reference(fn)
    rounds = [
        (
            out_name,
            pick_output(watched, k, DQKV, name),
            lambda *a, k=k, **kw: _reference_backward(*a, **kw)[k],
            [
                Mistake(m.slug, m.title, m.explanation, pick_output(m.fn, k, DQKV, m.slug))
                for m in BACKWARD_MISTAKES
            ],
        )
        for k, out_name in ((2, "dV"), (1, "dK"), (0, "dQ"))
    ]
    try:
        for case in cases:  # smallest first; on each case dV, then dK, then dQ
            for out_name, learner, reference, mistakes in rounds:
                with contextlib.redirect_stdout(io.StringIO()):  # one pass line, at the end
                    run_cases(
                        name,
                        learner,
                        reference,
                        [case],
                        outputs=(out_name,),
                        mistakes=mistakes,
                        rtol=1e-8,
                        atol=1e-10,
                    )
    except _CalledBackwardReference as called:
        raise _calls_reference_failure(name, called.where) from None
    print(
        f"✓ {name}: {len(cases)} cases match the reference (dV, dK and dQ; causal and not, "
        "ragged N, Br != Bc, Nq != Nk, rows without keys)"
    )


# ---- quick checks ---------------------------------------------------------------------------


def check_quick_backward_flops_ratio(answer) -> None:
    """FlashAttention backward FLOPs / standard backward FLOPs (matmuls only): 10/8."""
    _hinted(
        "backward FLOPs, FlashAttention / standard",
        answer,
        10 / 8,
        [
            (8 / 10, "that is standard / FlashAttention; the question asks the other way"),
            (14 / 12, "that is forward + backward; the question asks about the backward alone"),
            (0.25, "give the ratio (about 1.x), not the extra fraction"),
            (10.0, "10 N^2 d is the count itself; divide it by the standard count"),
        ],
        "count the matmuls: standard has dV, dP, dQ, dK; FlashAttention also recomputes S",
    )


def check_quick_lse_bytes(answer) -> None:
    """Bytes of one head's lse at N = 32,768 (fp32)."""
    N = 32_768
    _hinted(
        "bytes of one head's lse at N = 32,768",
        answer,
        4 * N,
        [
            (2 * N, "lse is kept in fp32 (4 bytes), not bf16"),
            (8 * N, "fp32 takes 4 bytes per number, not 8"),
            (N, "each lse value takes 4 bytes"),
            (128, "that is in KiB; give bytes"),
            (4 * N * N, "lse is one number per row, not per score"),
        ],
        "one fp32 number (4 bytes) per query row",
        rtol=0.0,
    )


def check_quick_p_over_lse(answer) -> None:
    """One head's P in bf16 over its lse in fp32, N = 32,768: 2 N^2 / 4 N = N / 2."""
    N = 32_768
    _hinted(
        "P in bf16 / lse in fp32 at N = 32,768",
        answer,
        2 * N * N / (4 * N),
        [
            (N, "P takes 2 bytes per number (bf16), lse 4 (fp32)"),
            (2 * N, "P is in bf16 (2 bytes) and lse in fp32 (4 bytes), not the other way round"),
            (4 * N / (2 * N * N), "that is lse / P; the question asks the other way"),
        ],
        "P: N^2 numbers of 2 bytes; lse: N numbers of 4 bytes",
        rtol=1e-6,
    )
