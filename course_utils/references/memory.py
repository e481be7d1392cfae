"""HBM traffic of attention: the formulas, and the attention algorithms run on a CountingMemory.

The model of Dao et al. (2022, section 3.2), counted by harness.counting_memory.CountingMemory
(HBM plus an on-chip memory of M elements; the learner's instrument in notebook 04). The
instrumented runs below count exactly what the formulas say:

    standard attention        4N^2 + 4Nd                      standard_attention_traffic
    FlashAttention-2 order    2Nd + ceil(N/Br) 2Nd            flash_attention_traffic
    FlashAttention-1 order    (3Tc + 1)Nd + 2(2Tc - 1)N       flash1_attention_traffic
    causal, square tiles      2Nd + 2d sum_i min(N, (i+1)B)   causal_flash_attention_traffic

    count_standard_attention(Q, K, V | N=, d=)          -> CountedAttention (S and P in HBM)
    count_flash_attention(Q, K, V | N=, d=, Br=, Bc=)   -> CountedAttention (FA2 or FA1 order)

All counts are per head, in elements; the N logsumexp values that FlashAttention-2 writes are
kept in their own array "lse" and left out of its formula, as in notebook 04.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_utils._validate import as_float_array, check_qkv, positive_int, softmax_scale_or_default
from course_utils.harness.constants import NEG_INF
from course_utils.harness.counting_memory import STATS_BYTES, CountingMemory
from course_utils.references.softmax import _finite_or_zero


# ---- traffic formulas (elements, per head) -------------------------------------------------
def _tiles(N: int, B: int) -> int:
    return -(-N // B)


def standard_attention_traffic(N: int, d: int) -> int:
    """HBM elements moved by standard attention: 4N^2 + 4Nd.

    Three kernels, each reading its inputs once and writing its output once:
    S = tau Q K^T (read 2Nd, write N^2), P = softmax(S) (read N^2, write N^2),
    O = P V (read N^2 + Nd, write Nd).

    Args:
        N: sequence length.  d: head dimension.

    Returns:
        An int, elements per head.
    """
    N, d = positive_int(N, "N"), positive_int(d, "d")
    return 4 * N * N + 4 * N * d


def flash_attention_traffic(N: int, d: int, Br: int) -> int:
    """HBM elements moved by FlashAttention in the FA2 loop order: 2Nd + 2N^2 d / Br.

    Q is read once (Nd) and O written once (Nd); each of the Tr = ceil(N / Br) query tiles reads
    all of K and V (2Nd). So the count is Nd + Nd + Tr 2Nd, which is 2Nd + 2N^2 d / Br when Br
    divides N. The N logsumexp values written for the backward pass are not counted.

    Args:
        N: sequence length.  d: head dimension.  Br: query tile rows (may exceed or not divide N).

    Returns:
        An int, elements per head.
    """
    N, d, Br = positive_int(N, "N"), positive_int(d, "d"), positive_int(Br, "Br")
    return 2 * N * d + _tiles(N, Br) * 2 * N * d


def flash1_attention_traffic(
    N: int, d: int, Bc: int, Br: int | None = None, causal: bool = False
) -> int:
    """HBM elements moved in the FlashAttention-1 loop order: (3Tc + 1)Nd + 2(2Tc - 1)N.

    Outer loop over the Tc = ceil(N / Bc) K/V tiles, each read once (2Nd in all); inner loop over
    the query tiles. Each query tile keeps its state in HBM between K/V tiles: O (d per row, kept
    normalized) and m, l (1 each per row). What is counted, per visit of a query tile by a K/V
    tile: Q read; O, m, l written; O, m, l read, except on the first visit (K/V tile 0), when the
    state starts on chip (O = 0, m = -inf, l = 0) and nothing is read or initialized in HBM.
    No separate lse array is written: m and l are the saved statistics.

    Without a mask every query tile is visited Tc times, giving
    2Nd + Tc Nd (Q) + (2Tc - 1)(Nd + 2N) (O, m, l). With causal=True a query tile with rows
    [i0, i1) is visited only by the ceil(i1 / Bc) K/V tiles that start at or before its last row;
    for square tiles B dividing N, with T = N / B: 2Nd + Nd (T + 1) / 2 + N T (d + 2).

    Args:
        N: sequence length.  d: head dimension.  Bc: K/V tile rows.
        Br: query tile rows; matters only with causal=True (default Bc).
        causal: skip the query tiles entirely above the diagonal.

    Returns:
        An int, elements per head.
    """
    N, d, Bc = positive_int(N, "N"), positive_int(d, "d"), positive_int(Bc, "Bc")
    Br = Bc if Br is None else positive_int(Br, "Br")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    total = 2 * N * d  # K and V, each tile read once
    for i0 in range(0, N, Br):
        i1 = min(i0 + Br, N)
        visits = _tiles(i1, Bc) if causal else _tiles(N, Bc)
        total += (i1 - i0) * (visits * d + (2 * visits - 1) * (d + 2))
    return total


def causal_tile_count(N: int, B: int) -> int:
    """Score tiles on or below the diagonal with square B x B tiles: T(T + 1)/2, T = ceil(N/B).

    Args:
        N: sequence length.  B: tile size (Br = Bc = B).

    Returns:
        An int; of the T^2 tiles, the others (entirely above the diagonal) are skipped.
    """
    T = _tiles(positive_int(N, "N"), positive_int(B, "B"))
    return T * (T + 1) // 2


def causal_flash_attention_traffic(N: int, d: int, B: int) -> int:
    """HBM elements of causal FlashAttention (FA2 order, square tiles): Nd (T + 3) when B | N.

    Query tile i (rows [iB, (i + 1)B)) loads only the K/V tiles 0..i, min(N, (i + 1)B) rows of
    each of K and V; Q is read once and O written once. So the count is
    2Nd + 2d sum_{i<T} min(N, (i + 1)B) = 2Nd + 2d (B T(T + 1)/2 - (TB - N)), T = ceil(N / B):
    about half of the K/V traffic of flash_attention_traffic. The lse values are not counted.

    Args:
        N: sequence length.  d: head dimension.  B: tile size (Br = Bc = B).

    Returns:
        An int, elements per head.
    """
    N, d, B = positive_int(N, "N"), positive_int(d, "d"), positive_int(B, "B")
    T = _tiles(N, B)
    return 2 * N * d + 2 * d * (B * T * (T + 1) // 2 - (T * B - N))


# ---- instrumented runs ---------------------------------------------------------------------
@dataclass
class CountedAttention:
    """An instrumented attention run: the memory with its counts, and the outputs if computed."""

    mem: CountingMemory  # its table() is the read/write table of the run
    out: np.ndarray | None  # (N, dv) when computed from arrays, else None
    lse: np.ndarray | None  # (N,) for FlashAttention runs that computed, else None
    score_tiles: int  # how many tiles of S were computed (on chip or, for standard, at all)


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _setup(Q, K, V, N, d, M, causal, softmax_scale, bytes_per_element):
    """The memory with Q, K, V placed, whether from arrays or from shapes (N, d)."""
    b = positive_int(bytes_per_element, "bytes_per_element")
    given = [x is not None for x in (Q, K, V)]
    if any(given):
        if not all(given):
            raise TypeError("give all of Q, K, V (to compute), or none of them and N, d (to count)")
        if N is not None or d is not None:
            raise TypeError("N and d come from the arrays: give either Q, K, V or N, d")
        Q = as_float_array(Q, "Q", ndim=2)
        K = as_float_array(K, "K", ndim=2)
        V = as_float_array(V, "V", ndim=2)
        check_qkv(Q, K, V, causal)
        if len(Q) == 0 or len(K) == 0:
            raise ValueError(f"Q and K need at least one row, got {Q.shape} and {K.shape}")
        mem = CountingMemory(M, compute=True)
        for name, x in (("Q", Q), ("K", K), ("V", V)):
            mem.place(name, x, itemsize=b)
        tau = softmax_scale_or_default(softmax_scale, Q.shape[1])
        return mem, len(Q), len(K), V.shape[1], tau, b
    if N is None or d is None:
        raise TypeError("give Q, K, V (to compute), or N and d (to count shapes only)")
    N, d = positive_int(N, "N"), positive_int(d, "d")
    mem = CountingMemory(M, compute=False)
    for name in ("Q", "K", "V"):
        mem.place(name, shape=(N, d), itemsize=b)
    return mem, N, N, d, None, b


def count_standard_attention(
    Q=None,
    K=None,
    V=None,
    *,
    N: int | None = None,
    d: int | None = None,
    block_rows: int = 128,
    softmax_scale: float | None = None,
    bytes_per_element: int = 2,
) -> CountedAttention:
    """Standard attention as three kernels over a CountingMemory: 4N^2 + 4Nd elements.

    Kernel 1, S = tau Q K^T: K stays on chip, Q is streamed in row blocks; S written to HBM.
    Kernel 2, P = softmax(S): row blocks of S read, P written. Kernel 3, O = P V: V stays on chip,
    row blocks of P read, O written. Each kernel reads every input once; on-chip space is
    unlimited (the course's count, the least any unfused implementation moves).

    Args:
        Q: (N, d), K: (N_k, d), V: (N_k, dv) float arrays to compute with; or None, None, None
            and N, d to count shapes only.
        N, d: sequence length and head dimension of a shape-only count.
        block_rows: rows per block of the streamed matrix (changes no count).
        softmax_scale: tau; default 1/sqrt(d).
        bytes_per_element: bytes counted per element of Q, K, V, S, P, O (2: bf16).

    Returns:
        CountedAttention with the memory (arrays Q, K, V, S, P, O), out (N, dv) when computed,
        lse None, and score_tiles = the number of row blocks of S.
    """
    mem, Nq, Nk, dv, tau, b = _setup(Q, K, V, N, d, None, False, softmax_scale, bytes_per_element)
    block_rows = positive_int(block_rows, "block_rows")
    for name, shape in (("S", (Nq, Nk)), ("P", (Nq, Nk)), ("O", (Nq, dv))):
        mem.alloc(name, shape, itemsize=b)

    k = mem.load("K", slice(0, Nk))  # kernel 1: read Nk*d once
    for i in range(0, Nq, block_rows):
        q_i = mem.load("Q", slice(i, i + block_rows))  # read Br*d
        mem.store("S", slice(i, i + block_rows), None if q_i is None else tau * (q_i @ k.T))
    mem.free_all()  # write N*N in all

    for i in range(0, Nq, block_rows):  # kernel 2: read N*N, write N*N
        s_i = mem.load("S", slice(i, i + block_rows))
        if s_i is not None:
            p_i = np.exp(s_i - s_i.max(axis=1, keepdims=True))
            s_i = p_i / p_i.sum(axis=1, keepdims=True)
        mem.store("P", slice(i, i + block_rows), s_i)
    mem.free_all()

    v = mem.load("V", slice(0, Nk))  # kernel 3: read Nk*dv once
    for i in range(0, Nq, block_rows):
        p_i = mem.load("P", slice(i, i + block_rows))  # read N*N in all
        mem.store("O", slice(i, i + block_rows), None if p_i is None else p_i @ v)  # write N*dv
    mem.free_all()

    out = mem.array("O").copy() if mem.compute else None
    return CountedAttention(mem, out, None, _tiles(Nq, block_rows))


def count_flash_attention(
    Q=None,
    K=None,
    V=None,
    *,
    Br: int,
    Bc: int,
    N: int | None = None,
    d: int | None = None,
    causal: bool = False,
    loop_order: str = "fa2",
    M: int | None = None,
    softmax_scale: float | None = None,
    bytes_per_element: int = 2,
) -> CountedAttention:
    """Tiled FlashAttention forward over a CountingMemory, in either loop order.

    loop_order="fa2": query tiles outside, K/V tiles inside; counts flash_attention_traffic
    (or causal_flash_attention_traffic) plus N lse writes in the array "lse".
    loop_order="fa1": K/V tiles outside, query tiles inside, state (O, m, l) kept in HBM;
    counts flash1_attention_traffic exactly (see there for what is counted).
    On chip: the Q tile (Br x d), O or acc (Br x dv), the K and V tiles (Bc x d, Bc x dv), the
    score tile S (Br x Bc), and m, l (Br each): with M set, a tile budget that is too large
    raises OnChipMemoryError. With causal=True the tiles entirely above the diagonal are skipped
    and never loaded.

    Args:
        Q: (N, d), K: (N_k, d), V: (N_k, dv) float arrays to compute with (N_k = N if causal);
            or leave them None and give N, d to count shapes only.
        Br, Bc: query and key tile rows, positive ints (need not divide N).
        N, d: sequence length and head dimension of a shape-only count.
        causal: query i sees keys 0..i only.
        loop_order: "fa2" or "fa1".
        M: on-chip capacity in elements; None for unlimited.
        softmax_scale: tau; default 1/sqrt(d).
        bytes_per_element: bytes counted per element of Q, K, V, O (2: bf16); m, l, lse count 4.

    Returns:
        CountedAttention: mem (the counts), out (N, dv) and lse (N,) float64 when computed from
        arrays (equal to attention_reference), and score_tiles, the number of S tiles computed.
    """
    causal = _check_bool(causal, "causal")
    Br, Bc = positive_int(Br, "Br"), positive_int(Bc, "Bc")
    if loop_order not in ("fa2", "fa1"):
        raise ValueError(f'loop_order must be "fa2" or "fa1", got {loop_order!r}')
    mem, Nq, Nk, dv, tau, b = _setup(Q, K, V, N, d, M, causal, softmax_scale, bytes_per_element)
    run = _flash2 if loop_order == "fa2" else _flash1
    return run(mem, Nq, Nk, dv, tau, b, Br, Bc, causal)


def _update(q_i, k_j, m_i, tau, i0, j0, causal):
    """One tile of the online softmax: (m_new, p, alpha), p = exp(S_ij - m_new), alpha rescale."""
    s_ij = tau * (q_i @ k_j.T)  # (Br, Bc), on chip
    if causal and j0 + len(k_j) - 1 > i0:  # the tile crosses the diagonal
        rows = np.arange(i0, i0 + len(q_i))[:, None]
        s_ij = np.where(np.arange(j0, j0 + len(k_j))[None, :] <= rows, s_ij, NEG_INF)
    m_new = np.maximum(m_i, s_ij.max(axis=1))
    m_safe = _finite_or_zero(m_new)
    return m_new, np.exp(s_ij - m_safe[:, None]), np.exp(m_i - m_safe)


def _flash2(mem, Nq, Nk, dv, tau, b, Br, Bc, causal):
    # the thread-block rules: O_i and lse_i are stored next to Q_i, after every K/V tile it needs
    rule = dict(rows_from="Q", streamed=("K", "V"), causal=causal)
    mem.alloc("O", (Nq, dv), itemsize=b, **rule)
    mem.alloc("lse", (Nq,), itemsize=STATS_BYTES, **rule)
    br, bc = min(Br, Nq), min(Bc, Nk)
    for slot, shape in (("S", (br, bc)), ("acc", (br, dv)), ("m", (br,)), ("l", (br,))):
        mem.scratch(slot, shape)  # buffers of the kernel, reused by every query tile
    tiles = 0
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        q_i = mem.load("Q", (i0, i1))  # read Br*d, once per query tile
        if mem.compute:
            m_i, l_i, acc = np.full(i1 - i0, NEG_INF), np.zeros(i1 - i0), np.zeros((i1 - i0, dv))
        k_end = min(Nk, i1) if causal else Nk  # causal: no key beyond the tile's last row
        for j0 in range(0, k_end, Bc):
            k_j = mem.load("K", (j0, j0 + Bc))  # read Bc*d
            v_j = mem.load("V", (j0, j0 + Bc))  # read Bc*dv
            tiles += 1
            if mem.compute:
                m_i, p, alpha = _update(q_i, k_j, m_i, tau, i0, j0, causal)
                l_i = alpha * l_i + p.sum(axis=1)
                acc = alpha[:, None] * acc + p @ v_j
        if mem.compute:
            mem.store("O", (i0, i1), acc / l_i[:, None])  # write Br*dv, once per query tile
            mem.store("lse", (i0, i1), m_i + np.log(l_i))  # write Br
        else:
            mem.store("O", (i0, i1))
            mem.store("lse", (i0, i1))
    mem.free_all()
    if not mem.compute:
        return CountedAttention(mem, None, None, tiles)
    return CountedAttention(mem, mem.array("O").copy(), mem.array("lse").copy(), tiles)


def _flash1(mem, Nq, Nk, dv, tau, b, Br, Bc, causal):
    mem.alloc("O", (Nq, dv), itemsize=b)
    mem.alloc("m", (Nq,), itemsize=STATS_BYTES)
    mem.alloc("l", (Nq,), itemsize=STATS_BYTES)
    mem.scratch("S", (min(Br, Nq), min(Bc, Nk)))
    compute, tiles = mem.compute, 0
    for j0 in range(0, Nk, Bc):
        k_j = mem.load("K", (j0, j0 + Bc))  # read Bc*d, once in the whole kernel
        v_j = mem.load("V", (j0, j0 + Bc))  # read Bc*dv, once
        for i0 in range(0, Nq, Br):
            i1 = min(i0 + Br, Nq)
            if causal and i1 - 1 < j0:  # every row of this query tile is before key j0
                continue
            q_i = mem.load("Q", (i0, i1))  # read Br*d, once per K/V tile
            if j0 == 0:  # first visit: the state starts on chip, nothing to read from HBM
                mem.scratch("O", (i1 - i0, dv))
                mem.scratch("m", (i1 - i0,))
                mem.scratch("l", (i1 - i0,))
                if compute:
                    o_i, m_i, l_i = np.zeros((i1 - i0, dv)), np.full(i1 - i0, NEG_INF), 0.0
            else:
                o_i = mem.load("O", (i0, i1))  # read Br*dv
                m_i = mem.load("m", (i0, i1))  # read Br
                l_i = mem.load("l", (i0, i1))  # read Br
            tiles += 1
            if compute:
                m_i, p, alpha = _update(q_i, k_j, m_i, tau, i0, j0, causal)
                l_old = alpha * l_i
                l_i = l_old + p.sum(axis=1)  # > 0: every row sees key 0 on its first visit
                o_i = (l_old[:, None] * o_i + p @ v_j) / l_i[:, None]
            mem.store("O", (i0, i1), o_i if compute else None)  # write Br*dv, every visit
            mem.store("m", (i0, i1), m_i if compute else None)  # write Br
            mem.store("l", (i0, i1), l_i if compute else None)  # write Br
    mem.free_all()
    if not compute:
        return CountedAttention(mem, None, None, tiles)
    lse = mem.array("m") + np.log(mem.array("l"))  # the host combines them; not counted
    return CountedAttention(mem, mem.array("O").copy(), lse, tiles)
