"""Notebook 08's quick checks: one number each.

check_quick_matmuls(answer)             matrix products of one K/V tile's backward step
check_quick_causal_query_tiles(answer)  query tiles a causal K/V program visits
check_quick_saved_bytes(answer)         bytes the backward keeps from the forward
"""

from __future__ import annotations

from course_utils.checks.engine.quizzes import hinted_answer as _hinted


# ---- quick checks -------------------------------------------------------------------------------
def check_quick_matmuls(answer) -> None:
    """Matrix products per (query tile, key tile) pair in the two-kernel backward (dK/dV, dQ)."""
    _hinted(
        "tile-pair matrix products of the dK/dV kernel and the dQ kernel together",
        answer,
        7,
        [
            (5, "that is the one-kernel backward (S, dV, dP, dK, dQ); the dQ kernel recomputes S "
                "and dP: 4 + 3"),
            (8, "the dQ kernel needs no P^T dO: S, dP and dS K, three products"),
            (4, "that is the dK/dV kernel alone: S, P^T dO, dP, dS^T Q; add the dQ kernel's"),
            (3, "that is the dQ kernel alone: S, dP, dS K; add the dK/dV kernel's four"),
        ],
        "dK/dV: S, dV += P^T dO, dP, dK += dS^T Q; dQ: S, dP, dQ += dS K",
        rtol=0.0,
    )  # fmt: skip


def check_quick_causal_query_tiles(answer) -> None:
    """Query tiles the causal dK/dV program of key tile 3 visits (N = 1000, BLOCK_M = BLOCK_N
    = 64)."""
    n, block, j = 1000, 64, 3
    tiles = -(-n // block) - j
    _hinted(
        "query tiles visited by causal dK/dV program 3 (N = 1000, BLOCK_M = BLOCK_N = 64)",
        answer,
        tiles,
        [
            (-(-n // block), "that is every query tile; the ones before the diagonal are skipped"),
            (j + 1, "those are the tiles a dQ program on the diagonal visits; the dK/dV program "
                    "visits the queries at and after its keys"),
            (tiles - 1, "the diagonal tile is visited too (and masked)"),
        ],
        "keys 192..255 are seen by queries 192..999: query tiles 3, 4, ..., 15",
        rtol=0.0,
    )  # fmt: skip


def check_quick_saved_bytes(answer) -> None:
    """Bytes saved for the backward per head: q, k, v, out in bf16 and lse in float32, N = 4096,
    d = 128."""
    n, d = 4096, 128
    right = 4 * n * d * 2 + n * 4
    _hinted(
        "bytes saved per head (N = 4096, d = 128, bf16 tensors, float32 lse)",
        answer,
        right,
        [
            (right + n * n * 2, "P is not saved: the backward recomputes it from lse"),
            (4 * n * d * 2 + n * 2, "lse is float32: 4 bytes per row"),
            (4 * n * d * 4 + n * 4, "q, k, v and out are bf16: 2 bytes each"),
            (3 * n * d * 2 + n * 4, "out is saved too (for D = rowsum(dO * O))"),
        ],
        "4 N d numbers of 2 bytes (q, k, v, out) and N of 4 bytes (lse)",
        rtol=0.0,
    )  # fmt: skip
