"""Attention in float64 NumPy: the naive oracle, the tiled FlashAttention forward, split-KV decode.

Notation (FlashAttention papers): Q (Nq, d), K (Nk, d), V (Nk, dv); scores S = tau Q K^T with
tau = softmax_scale = 1/sqrt(d); O = softmax(S) V row by row; lse_i = log sum_j exp(S_ij), natural
log. A row with no visible key (Nk = 0) has O = 0 and lse = -inf.
"""

from __future__ import annotations

import numpy as np

from course_utils._validate import as_float_array, check_qkv, positive_int, softmax_scale_or_default
from course_utils.harness.constants import NEG_INF
from course_utils.references.softmax import _finite_or_zero, merge_partials


def _inputs(Q, K, V, causal, softmax_scale):
    Q = as_float_array(Q, "Q", ndim=2)
    K = as_float_array(K, "K", ndim=2)
    V = as_float_array(V, "V", ndim=2)
    check_qkv(Q, K, V, causal)
    return Q, K, V, softmax_scale_or_default(softmax_scale, Q.shape[1])


def _check_scores(s: np.ndarray) -> None:
    """Finite inputs can still overflow Q K^T; say so instead of returning a wrong 'no keys'."""
    if not np.isfinite(s).all():
        raise ValueError(
            "Q K^T overflows float64 (scores reach inf): the inputs are too large; scale Q or K"
        )


def attention_reference(
    Q, K, V, causal: bool = False, softmax_scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention that materializes the Nq x Nk score matrix: the oracle for the course.

    O = softmax(tau Q K^T [+ causal mask]) V,   lse_i = log sum_j exp(S_ij).

    Args:
        Q: (Nq, d) queries.  K: (Nk, d) keys.  V: (Nk, dv) values.
        causal: query i sees keys 0..i only (needs Nq == Nk).
        softmax_scale: tau; default 1/sqrt(d).

    Returns:
        O: (Nq, dv) float64.  lse: (Nq,) float64 (-inf, with O = 0, for a row with no keys).
    """
    Q, K, V, tau = _inputs(Q, K, V, causal, softmax_scale)
    with np.errstate(over="ignore", invalid="ignore"):
        S = tau * (Q @ K.T)  # read Nd + Nd, write N*N
    _check_scores(S)
    if causal:
        S = np.where(np.tri(len(Q), len(K), dtype=bool), S, NEG_INF)
    m = S.max(axis=1, initial=NEG_INF)  # read N*N
    m_safe = _finite_or_zero(m)
    P = np.exp(S - m_safe[:, None])  # read N*N, write N*N (unnormalized)
    l = P.sum(axis=1)
    O = np.zeros((len(Q), V.shape[1]))
    seen = l > 0
    O[seen] = (P[seen] @ V) / l[seen, None]  # read N*N + N*dv, write N*dv
    with np.errstate(divide="ignore"):
        lse = m + np.log(l)  # log(0) = -inf for an empty row
    return O, np.where(seen, lse, NEG_INF)


def flash_attention_forward(
    Q,
    K,
    V,
    Br: int = 16,
    Bc: int = 16,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Tiled attention forward in the FlashAttention-2 loop order, with the online softmax.

    Outer loop: query tiles Q_i (Br rows), kept "on chip". Inner loop: key/value tiles K_j, V_j
    (Bc rows) streamed past it. Each row keeps m_i, l_i and an unnormalized acc, rescaled by
    exp(m_old - m_new) when its max grows and divided by l_i once at the end. With causal=True the
    tiles entirely above the diagonal are skipped (never loaded) and only tiles that cross the
    diagonal are masked. N need not be a multiple of Br or Bc.

    Args:
        Q: (Nq, d), K: (Nk, d), V: (Nk, dv); Nq may differ from Nk unless causal.
        Br, Bc: query and key tile sizes, positive ints.
        causal: query i sees keys 0..i only.
        softmax_scale: tau; default 1/sqrt(d).

    Returns:
        O: (Nq, dv), lse: (Nq,), both float64; agrees with attention_reference to ~1e-12.
    """
    Q, K, V, tau = _inputs(Q, K, V, causal, softmax_scale)
    Br, Bc = positive_int(Br, "Br"), positive_int(Bc, "Bc")
    Nq, Nk, dv = len(Q), len(K), V.shape[1]
    O, lse = np.zeros((Nq, dv)), np.full(Nq, NEG_INF)
    for i in range(0, Nq, Br):
        q_i = Q[i : i + Br]  # read Br*d, once per query tile
        rows = np.arange(i, i + len(q_i))
        m_i = np.full(len(q_i), NEG_INF)
        l_i = np.zeros(len(q_i))
        acc = np.zeros((len(q_i), dv))
        # causal: the last key any row of this tile may see is rows[-1]
        k_end = min(Nk, rows[-1] + 1) if causal else Nk
        for j in range(0, k_end, Bc):
            k_j, v_j = K[j : j + Bc], V[j : j + Bc]  # read 2*Bc*d per tile
            with np.errstate(over="ignore", invalid="ignore"):
                s_ij = tau * (q_i @ k_j.T)  # (Br, Bc) stays on chip
            _check_scores(s_ij)
            if causal and j + len(k_j) - 1 > rows[0]:  # tile crosses the diagonal
                cols = np.arange(j, j + len(k_j))
                s_ij = np.where(cols[None, :] <= rows[:, None], s_ij, NEG_INF)
            m_new = np.maximum(m_i, s_ij.max(axis=1))
            m_safe = _finite_or_zero(m_new)  # a fully masked row stays at -inf without NaN
            p_ij = np.exp(s_ij - m_safe[:, None])
            alpha = np.exp(m_i - m_safe)  # rescale factor, 0 on the first tile
            l_i = alpha * l_i + p_ij.sum(axis=1)
            acc = alpha[:, None] * acc + p_ij @ v_j
            m_i = m_new
        seen = l_i > 0
        O[rows[seen]] = acc[seen] / l_i[seen, None]  # write Br*dv, once per query tile
        lse[rows[seen]] = m_i[seen] + np.log(l_i[seen])
    return O, lse


def _decode_inputs(q, K, V, num_splits):
    q = as_float_array(q, "q", ndim=(1, 2))
    K = as_float_array(K, "K", ndim=2)
    V = as_float_array(V, "V", ndim=2)
    if q.shape[-1] != K.shape[1]:
        raise ValueError(
            f"q and K must share the head dimension d: q has shape {q.shape}, K {K.shape}"
        )
    check_qkv(np.atleast_2d(q), K, V, causal=False)
    return q, K, V, positive_int(num_splits, "num_splits")


def split_kv_partials(
    q, K, V, num_splits: int, softmax_scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention of the query rows over each of `num_splits` chunks of the KV cache.

    The Nk keys are cut into contiguous chunks of ceil(Nk / num_splits) keys (the last one may be
    shorter; with more splits than keys the extra chunks are empty). Each chunk is what one thread
    block of a flash-decoding kernel would handle.

    Args:
        q: (d,) one query, or (rows, d) several (decode: batch x heads rows).
        K: (Nk, d), V: (Nk, dv): the KV cache.
        num_splits: number of chunks, a positive int (may exceed Nk).

    Returns:
        out_partial: (num_splits, dv) or (num_splits, rows, dv): normalized output of each chunk
            (0 for an empty chunk).
        lse_partial: (num_splits,) or (num_splits, rows): its logsumexp (-inf for an empty chunk).
    """
    q, K, V, num_splits = _decode_inputs(q, K, V, num_splits)
    chunk = -(-len(K) // num_splits) if len(K) else 1
    Q = np.atleast_2d(q)
    out_partial = np.zeros((num_splits, len(Q), V.shape[1]))
    lse_partial = np.full((num_splits, len(Q)), NEG_INF)
    for s in range(num_splits):
        k_s, v_s = K[s * chunk : (s + 1) * chunk], V[s * chunk : (s + 1) * chunk]
        out_partial[s], lse_partial[s] = attention_reference(Q, k_s, v_s, False, softmax_scale)
    if q.ndim == 1:
        return out_partial[:, 0], lse_partial[:, 0]
    return out_partial, lse_partial


def split_kv_decode(
    q, K, V, num_splits: int, softmax_scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Flash-decoding: attention of q over the KV cache, computed per chunk and merged by lse.

    Args and shapes as split_kv_partials.

    Returns:
        o: (dv,) or (rows, dv), lse: () or (rows,): equal to attention over all keys.
    """
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits, softmax_scale)
    o, lse = out_partial[0], lse_partial[0]
    for s in range(1, len(out_partial)):  # the second kernel: merge the partials, in order
        o, lse = merge_partials(o, lse, out_partial[s], lse_partial[s])
    return o, lse
