"""Score tiles: which tiles of the N x N score matrix a FlashAttention-2 pass computes, in what
order, and the HBM elements each step moves (the model the tile-grid figures draw).

A tile is rows [i Br, (i + 1) Br) and keys [j Bc, (j + 1) Bc) of S, the last ones of each side
possibly shorter. Under a causal mask a tile is SKIP (no score visible: not even loaded), MASK
(crosses the diagonal: computed with the mask) or FULL (every score visible).

    tile_kind(r0, r1, c0, c1, causal)       the kind of one tile (notebook 03's rule)
    tile_kinds(N, Br, Bc, causal, Nk)       (ceil(N / Br), ceil(Nk / Bc)) kinds (notebook 03)
    tile_schedule(N, Br, Bc, causal)        the forward's tiles in visit order (query tiles outer)
    step_traffic / hbm_counters / flash_traffic
                                            the forward's HBM elements per step, so far, in all
                                            (mode "standard": three unfused kernels, 4N^2 + 4Nd)
    backward_schedule / dq_adds / backward_step_traffic / backward_counters / backward_traffic
                                            the same for the backward pass (K/V tile outside)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from course_utils._validate import positive_int
from course_utils.references.memory import flash_attention_traffic

SKIP, MASK, FULL = 0, 1, 2  # the three kinds of score tile under a causal mask
KIND_NAMES = {SKIP: "skip", MASK: "mask", FULL: "full"}
MODES = ("flash", "standard")


class Tile(NamedTuple):
    """One score tile: rows [i * Br, ...) and columns [j * Bc, ...) of S, and its kind."""

    i: int  # query-tile index (the thread block)
    j: int  # key/value-tile index
    kind: int  # SKIP, MASK or FULL


class HBMCount(NamedTuple):
    """HBM elements moved so far."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def _n_tiles(n: int, b: int) -> int:
    return -(-n // b)


def _span(t: int, b: int, n: int) -> tuple[int, int]:
    """Rows (or columns) [start, stop) of tile t with tile size b, clipped to n."""
    return t * b, min(n, (t + 1) * b)


def _size(t: int, b: int, n: int) -> int:
    """How many rows (or columns) tile t has: b, or fewer for a ragged last tile."""
    start, stop = _span(t, b, n)
    return stop - start


def tile_kind(r0: int, r1: int, c0: int, c1: int, causal: bool) -> int:
    """The kind of the score tile with query rows [r0, r1) and key columns [c0, c1).

    Under a causal mask query r sees key c only if c <= r. So the tile is skipped when its first
    key comes after its last query (c0 > r1 - 1), computed in full when its last key comes at or
    before its first query (c1 - 1 <= r0), and computed with the mask otherwise.
    """
    if not causal:
        return FULL
    if c0 > r1 - 1:
        return SKIP
    if c1 - 1 <= r0:
        return FULL
    return MASK


def _check_sizes(N, Br, Bc, d=None, Nk=None, causal=False):
    N, Br, Bc = positive_int(N, "N"), positive_int(Br, "Br"), positive_int(Bc, "Bc")
    Nk = N if Nk is None else positive_int(Nk, "Nk")
    if causal and Nk != N:
        raise ValueError(f"causal needs as many keys as queries, got N = {N}, Nk = {Nk}")
    if d is not None:
        d = positive_int(d, "d")
    return N, Br, Bc, d, Nk


def tile_kinds(N: int, Br: int, Bc: int, causal: bool = True, Nk: int | None = None) -> np.ndarray:
    """The kind (SKIP = 0, MASK = 1, FULL = 2) of every tile of the N x Nk score matrix.

    Args:
        N: query rows.  Br, Bc: tile rows and columns (any positive ints; the last tile of each
            side may be shorter).  causal: query r sees keys 0..r.  Nk: key columns (default N).

    Returns:
        An int array of shape (ceil(N / Br), ceil(Nk / Bc)); without causal every tile is FULL.
    """
    N, Br, Bc, _, Nk = _check_sizes(N, Br, Bc, Nk=Nk, causal=causal)
    kinds = np.empty((_n_tiles(N, Br), _n_tiles(Nk, Bc)), dtype=int)
    for i in range(kinds.shape[0]):
        r0, r1 = _span(i, Br, N)
        for j in range(kinds.shape[1]):
            c0, c1 = _span(j, Bc, Nk)
            kinds[i, j] = tile_kind(r0, r1, c0, c1, causal)
    return kinds


def tile_schedule(
    N: int, Br: int, Bc: int, causal: bool = False, Nk: int | None = None
) -> list[Tile]:
    """The score tiles a FlashAttention-2 forward computes, in visit order.

    Query tile i is one thread block; it visits the key/value tiles j = 0, 1, ... of its row and
    stops at the last one that is not skipped. Skipped tiles are not in the list.
    """
    kinds = tile_kinds(N, Br, Bc, causal, Nk)
    return [
        Tile(i, j, int(kinds[i, j]))
        for i in range(kinds.shape[0])
        for j in range(kinds.shape[1])
        if kinds[i, j] != SKIP
    ]


def n_steps(N: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash") -> int:
    """Steps of the animation: one per computed tile (flash), one per kernel and row stripe."""
    _check_mode(mode)
    if mode == "flash":
        return len(tile_schedule(N, Br, Bc, causal))
    return 3 * _n_tiles(positive_int(N, "N"), positive_int(Br, "Br"))


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def step_traffic(
    N: int, d: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash"
) -> tuple[np.ndarray, np.ndarray]:
    """HBM elements read and written by each step of the animation.

    flash (one step per computed tile (i, j), FA2 order): read K_j and V_j (2 Bc d); the first
    tile of a row also reads Q_i (Br d); the last one writes O_i (Br d). The Br logsumexp values
    written with O_i are left out, as in the traffic formula 2Nd + 2N^2 d / Br.
    standard (three kernels, one step per row stripe of Br queries): S = tau Q K^T reads Q_i and
    writes S_i (Br N), reading K (Nd) on its first stripe; P = softmax(S) reads S_i, writes P_i;
    O = P V reads P_i and writes O_i, reading V on its first stripe. A causal mask changes nothing
    here: the masked scores are written as -inf like the others. Total 4N^2 + 4Nd.

    Returns:
        (reads, writes): int arrays of shape (n_steps,).
    """
    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d, causal=causal)
    _check_mode(mode)
    reads, writes = [], []
    if mode == "flash":
        schedule = tile_schedule(N, Br, Bc, causal)
        for t, tile in enumerate(schedule):
            r = _size(tile.i, Br, N)
            c = _size(tile.j, Bc, N)
            first = t == 0 or schedule[t - 1].i != tile.i
            last = t == len(schedule) - 1 or schedule[t + 1].i != tile.i
            reads.append(2 * c * d + (r * d if first else 0))
            writes.append(r * d if last else 0)
    else:
        for kernel in range(3):
            for i in range(_n_tiles(N, Br)):
                r = _size(i, Br, N)
                once = N * d if i == 0 else 0  # K (kernel 1) or V (kernel 3), read once
                if kernel == 0:
                    reads.append(r * d + once)
                    writes.append(r * N)
                elif kernel == 1:
                    reads.append(r * N)
                    writes.append(r * N)
                else:
                    reads.append(r * N + once)
                    writes.append(r * d)
    return np.array(reads, dtype=np.int64), np.array(writes, dtype=np.int64)


def hbm_counters(
    step: int, N: int, d: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash"
) -> HBMCount:
    """HBM elements read and written after the first `step` steps (clipped to 0..n_steps)."""
    reads, writes = step_traffic(N, d, Br, Bc, causal, mode)
    step = int(min(max(step, 0), len(reads)))
    return HBMCount(int(reads[:step].sum()), int(writes[:step].sum()))


def flash_traffic(N: int, d: int, Br: int, Bc: int, causal: bool = False) -> int:
    """HBM elements of the FA2 forward: 2Nd + (K and V rows loaded) * 2d.

    Without causal every query tile loads all of K and V: 2Nd + ceil(N / Br) 2Nd, which is
    2Nd + 2N^2 d / Br when Br divides N. With causal, query tile i loads the K/V tiles up to the
    last one that is not skipped: min(N, Bc * ceil(last_row_i / Bc)) rows of each.
    """
    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d, causal=causal)
    if not causal:
        return flash_attention_traffic(N, d, Br)
    rows_loaded = sum(min(N, Bc * _n_tiles(_span(i, Br, N)[1], Bc)) for i in range(_n_tiles(N, Br)))
    return 2 * N * d + 2 * d * rows_loaded


# ---- the backward pass ----------------------------------------------------------------------
def backward_schedule(N: int, Br: int, Bc: int, causal: bool = False) -> list[Tile]:
    """The score tiles the FlashAttention-2 backward recomputes, in visit order.

    K/V tile j is one thread block (the outer loop); it visits the query tiles i = 0, 1, ... of its
    column (the inner loop), leaving out the skipped ones (above the diagonal).
    """
    kinds = tile_kinds(N, Br, Bc, causal)
    return [
        Tile(i, j, int(kinds[i, j]))
        for j in range(kinds.shape[1])
        for i in range(kinds.shape[0])
        if kinds[i, j] != SKIP
    ]


def n_backward_steps(N: int, Br: int, Bc: int, causal: bool = False) -> int:
    """Steps of the animation: one per recomputed score tile."""
    return len(backward_schedule(N, Br, Bc, causal))


def dq_adds(step: int, N: int, Br: int, Bc: int, causal: bool = False) -> np.ndarray:
    """How many times each query tile's dQ_i has been added to after `step` steps.

    Returns:
        An int array of shape (ceil(N / Br),); at the end, the number of tiles computed in row i.
    """
    schedule = backward_schedule(N, Br, Bc, causal)
    adds = np.zeros(_n_tiles(N, Br), dtype=int)
    for tile in schedule[: int(min(max(step, 0), len(schedule)))]:
        adds[tile.i] += 1
    return adds


def backward_step_traffic(
    N: int, d: int, Br: int, Bc: int, causal: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """HBM elements read and written by each step (tile (i, j)) of the backward pass.

    Each step reads Q_i and dO_i (2 r d), lse_i and D_i (2 r), and reads and writes dQ_i (r d each:
    the atomic add); the first step of a column reads K_j and V_j (2 c d), the last writes dK_j and
    dV_j (2 c d). r and c are the tile's rows and keys. The preprocessing D = rowsum(dO o O)
    (read 2Nd, write N) is left out.

    Returns:
        (reads, writes): int arrays of shape (n_backward_steps,).
    """
    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d, causal=causal)
    schedule = backward_schedule(N, Br, Bc, causal)
    reads, writes = [], []
    for t, tile in enumerate(schedule):
        r0, r1 = _span(tile.i, Br, N)
        c0, c1 = _span(tile.j, Bc, N)
        r, c = r1 - r0, c1 - c0
        first = t == 0 or schedule[t - 1].j != tile.j
        last = t == len(schedule) - 1 or schedule[t + 1].j != tile.j
        reads.append(2 * r * d + 2 * r + r * d + (2 * c * d if first else 0))
        writes.append(r * d + (2 * c * d if last else 0))
    return np.array(reads, dtype=np.int64), np.array(writes, dtype=np.int64)


def backward_counters(
    step: int, N: int, d: int, Br: int, Bc: int, causal: bool = False
) -> HBMCount:
    """HBM elements read and written after the first `step` steps (clipped to 0..n_steps)."""
    reads, writes = backward_step_traffic(N, d, Br, Bc, causal)
    step = int(min(max(step, 0), len(reads)))
    return HBMCount(int(reads[:step].sum()), int(writes[:step].sum()))


def backward_traffic(N: int, d: int, Br: int, Bc: int, causal: bool = False) -> int:
    """HBM elements of the whole backward pass (without the preprocessing of D).

    Without causal: every K/V tile streams all of Q, dO, lse, D and dQ (read and written), so
    ceil(N / Bc) N (4d + 2), plus K, V read and dK, dV written once, 4Nd.
    """
    return backward_counters(10**12, N, d, Br, Bc, causal).total
