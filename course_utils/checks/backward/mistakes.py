"""Notebook 07's exercise 2: the float64 references of flash_attention_backward and its known
mistakes.

    _reference_backward(Q, K, V, O, dO, lse, Br, Bc, causal) -> (dQ, dK, dV)   float64
    _tiled_backward(...)        the tiled backward of section 5, tile by tile
    _backward_variant(..., bug=)  the tiled backward with one bug
    BACKWARD_MISTAKES           the named Mistakes, each with its variant as replay

Q (N_q, d), K (N_k, d), V (N_k, dv), O and dO (N_q, dv), lse (N_q,).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from course_utils.checks.engine.failures import Mistake
from course_utils.harness.constants import NEG_INF
from course_utils.references.backward import attention_backward_reference


# ---- exercise 2: flash_attention_backward ---------------------------------------------------
def _reference_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """The answer, from the oracle that materializes P (Br and Bc change nothing).

    A row with lse = -inf saw no key: its P is 0, so it adds nothing and gets dQ = 0. Its dO is
    set to 0 before the oracle runs, which gives exactly that (dV and dS of the row vanish).
    """
    no_key = np.isneginf(np.asarray(lse))
    dO_seen = np.where(no_key[:, None], 0.0, dO)
    return attention_backward_reference(Q, K, V, dO_seen, causal=causal)


def _tiled_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False, *, keys_outside=True):
    """A backward that follows every rule of exercise 2: the checks' own, for the loads.

    keys_outside=True: FlashAttention-2's order (K/V tiles outside, the inner loop starts at the
    first query tile that sees K_j). False: query tiles outside, dK and dV accumulated in place,
    the key loop stops at the diagonal. Either reads each tile only when it is used.
    """
    Nq, d = Q.shape
    Nk = K.shape[0]
    tau = 1.0 / math.sqrt(d)
    D = (dO * O).sum(axis=1)
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)

    def tile(q_i, do_i, k_j, v_j, i, j):
        rows = np.arange(i, i + len(q_i))
        cols = np.arange(j, j + len(k_j))
        s = tau * (q_i @ k_j.T)
        if causal and cols[-1] > rows[0]:
            s = np.where(cols[None, :] <= rows[:, None], s, NEG_INF)
        p = np.exp(s - lse_safe[rows, None])
        ds = p * (do_i @ v_j.T - D[rows, None])
        return tau * (ds @ k_j), tau * (ds.T @ q_i), p.T @ do_i

    if keys_outside:
        for j in range(0, Nk, Bc):
            k_j, v_j = K[j : j + Bc], V[j : j + Bc]
            dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)
            for i in range((j // Br) * Br if causal else 0, Nq, Br):
                dq, dk, dv = tile(Q[i : i + Br], dO[i : i + Br], k_j, v_j, i, j)
                dQ[i : i + Br] += dq
                dk_j += dk
                dv_j += dv
            dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j
        return dQ, dK, dV
    for i in range(0, Nq, Br):
        q_i, do_i = Q[i : i + Br], dO[i : i + Br]
        dq_i = np.zeros(q_i.shape)
        for j in range(0, Nk, Bc):
            if causal and j > i + len(q_i) - 1:
                break
            dq, dk, dv = tile(q_i, do_i, K[j : j + Bc], V[j : j + Bc], i, j)
            dq_i += dq
            dK[j : j + Bc] += dk
            dV[j : j + Bc] += dv
        dQ[i : i + Br] = dq_i
    return dQ, dK, dV


def _backward_variant(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False, *, bug):
    """The FlashAttention-2 backward with one mistake, as a learner would write it."""
    Nq, d = Q.shape
    Nk = len(K)
    tau = 1.0 / math.sqrt(d)
    tau_s = 1.0 if bug == "missing-scale" else tau
    tau_q = 1.0 if bug in ("unscaled-dq", "unscaled-both") else tau
    tau_k = 1.0 if bug in ("unscaled-dk", "unscaled-both") else tau
    acc = np.float32 if bug == "float32-acc" else np.float64
    D = (dO * O).sum(axis=1)
    if bug == "D-from-dP":
        D = (dO @ V.T).sum(axis=1)
    if bug == "unguarded":
        lse_used = lse
    else:
        lse_used = np.where(np.isneginf(lse), 0.0 if bug == "lse-zero" else np.inf, lse)
    if bug == "m-without-l":  # the forward's row max, as if it had been stored instead of lse
        S = tau * (Q @ K.T)
        if causal:
            S = np.where(np.tri(Nq, Nk, dtype=bool), S, NEG_INF)
        m = S.max(axis=1, initial=NEG_INF)
        lse_used = np.where(np.isneginf(lse), np.inf, m)
    q_end = (Nq // Br) * Br if bug in ("ragged-q", "ragged-both") else Nq
    k_end = (Nk // Bc) * Bc if bug in ("ragged-k", "ragged-both") else Nk
    dQ, dK, dV = np.zeros(Q.shape, acc), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, k_end, Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        cols = np.arange(j, j + len(k_j))
        dk_j, dv_j = np.zeros(k_j.shape, acc), np.zeros(v_j.shape, acc)
        for i in range(0, q_end, Br):
            q_i, do_i = Q[i : i + Br], dO[i : i + Br]
            rows = np.arange(i, i + len(q_i))
            if causal and bug != "no-mask" and j > rows[-1]:
                if bug == "skip-break":
                    break
                continue
            s = tau_s * (q_i @ k_j.T)
            crosses = cols[-1] > rows[0]
            local = np.tri(len(rows), len(cols), dtype=bool)
            if causal and bug == "tile-local-all":
                s = np.where(local, s, NEG_INF)
            elif causal and bug == "tile-local-cross" and crosses:
                s = np.where(local, s, NEG_INF)
            elif causal and bug == "tile-local-diag":
                if i // Br == j // Bc:
                    s = np.where(local, s, NEG_INF)
            elif causal and bug not in ("no-mask", "skip-without-mask"):
                if bug == "mask-strict":
                    visible = cols[None, :] < rows[:, None]
                else:
                    visible = cols[None, :] <= rows[:, None]
                s = np.where(visible, s, NEG_INF)
            if bug == "base2":
                p = np.exp2(s - lse_used[rows, None])
            elif bug == "base2-scaled":
                p = np.exp2(s * math.log2(math.e) - lse_used[rows, None])
            elif bug == "exp-overflow":
                p = np.exp(s) / np.exp(lse_used[rows, None])
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
            if bug == "dk-dv-overwritten":
                dv_j = dv_add
            else:
                dv_j += dv_add
            dp = do_i @ v_j.T
            D_i = D[rows]
            if bug == "D-per-tile":
                D_i = (p * dp).sum(axis=1)
            elif bug == "D-from-dP-tile":
                D_i = dp.sum(axis=1)
            if bug == "forgot-D":
                ds = p * dp
            elif bug == "sign":
                ds = p * (D_i[:, None] - dp)
            else:
                ds = p * (dp - D_i[:, None])
            dq_add = tau_q * (ds @ k_j)
            if bug == "dq-overwritten":
                dQ[i : i + Br] = dq_add
            else:
                dQ[i : i + Br] += dq_add
            dk_add = tau_k * (ds @ q_i if bug == "dk-no-transpose" else ds.T @ q_i)
            if bug == "dk-dv-overwritten":
                dk_j = dk_add
            else:
                dk_j += dk_add
        dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j
    if bug == "float32-acc":
        dK, dV = dK.astype(np.float32), dV.astype(np.float32)
    return dQ, dK, dV


def _float32_gradients(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """The right gradients, returned in float32 (as when dQ, dK, dV are allocated in float32)."""
    return tuple(g.astype(np.float32) for g in _tiled_backward(Q, K, V, O, dO, lse, Br, Bc, causal))


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
_TILE_LOCAL = (
    "np.tri of the tile compares the tile's own row and column numbers, 0..Br-1 and 0..Bc-1; "
    "it is the causal mask only for a square tile that sits exactly on the diagonal (Br == Bc, "
    "i == j). Compare global positions instead: rows = np.arange(i, i + Br_i), "
    "cols = np.arange(j, j + Bc_j), and np.where(cols[None, :] <= rows[:, None], s_ij, -np.inf)."
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
_FLOAT32 = (
    "dQ, dK and dV are sums over many tiles; in float32 every += rounds to about 7 significant "
    "digits, and the check compares to 1e-8. Keep them in float64 here: np.zeros(shape) is "
    "float64 (a GPU kernel accumulates in float32 and is compared with a looser tolerance)."
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
        "lse-guard-zero",
        "a row that saw no key gets lse = 0 in place of -inf, so its P = exp(S) is not 0",
        "0 is the forward's stand-in for a running max of -inf, where it only meets scores of "
        "-inf. Here the stand-in is subtracted from real scores: exp(S - 0) = exp(S) gives the "
        "row weights it never had. Use +inf, which makes P = 0: "
        "np.where(np.isneginf(lse), np.inf, lse).",
        "lse-zero",
    ),
    _bwd_mistake(
        "unsafe-exponent",
        "P computed as exp(S) / exp(lse): both overflow (inf / inf = NaN) for scores above ~709",
        "e^x overflows float64 for x > 709. Subtract first: P = exp(S - lse), whose exponent "
        "is never above 0 because lse_i >= max_j S_ij (section 3).",
        "exp-overflow",
    ),
    _bwd_mistake(
        "forgot-D",
        "forgot D: dS = P * dP",
        "The softmax couples the entries of a row: its Jacobian is diag(p) - p p^T. " + _D_RULE,
        "forgot-D",
    ),
    _bwd_mistake(
        "sign-flipped",
        "the sign of dS is flipped: dS = P * (D - dP)",
        "Raising S_ij moves probability to key j from the others, so the loss changes by P_ij "
        "times (dP_ij minus the row's average D_i): dS_ij = P_ij (dP_ij - D_i), as in exercise 1. "
        "With the sign flipped, dQ and dK come out negated (dV does not use dS and stays right).",
        "sign",
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
        "The sum in D_i runs over all keys of the row, not over one tile (so softmax_backward_rows "
        "of exercise 1 cannot be called on a tile); that is why it is computed from dO and O, "
        "which already hold the whole row. " + _D_RULE,
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
        "tile-local-mask",
        "the causal mask uses the tile's local indices (np.tri of each tile crossing the diagonal)",
        _TILE_LOCAL,
        "tile-local-cross",
    ),
    _bwd_mistake(
        "tile-local-mask",
        "the causal mask uses the tile's local indices (np.tri on the tiles with i == j only)",
        _TILE_LOCAL,
        "tile-local-diag",
    ),
    _bwd_mistake(
        "tile-local-mask",
        "the causal mask uses the tile's local indices (np.tri on every tile computed)",
        _TILE_LOCAL + " A tile below the diagonal needs no mask at all.",
        "tile-local-all",
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
    _bwd_mistake(
        "low-precision",
        "dQ, dK and dV accumulated in float32",
        _FLOAT32,
        "float32-acc",
    ),
    Mistake(
        "low-precision",
        "the gradients are returned in float32",
        _FLOAT32,
        _float32_gradients,
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
