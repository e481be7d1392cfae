"""Notebook 03's quick checks: one number each (the expected numbers are computed here, not
written in the notebook).

    check_quick_scores_mib(answer)      one head's score matrix S at N = 16,384 in bf16, in MiB
    check_quick_causal_tiles(answer)    score tiles a causal kernel computes at N = 16,384, B = 128
    check_quick_traffic_ratio(answer)   standard / FlashAttention HBM traffic, d = 64, Br = 128
"""

from __future__ import annotations

from course_utils.checks.engine.quizzes import hinted_answer as _hinted

# ---- quick checks ----------------------------------------------------------------------------


def check_quick_scores_mib(answer) -> None:
    """One head's score matrix S at N = 16,384 in bf16, in MiB (2^20 bytes)."""
    N, bf16 = 16_384, 2
    expected = N * N * bf16 / 2**20
    _hinted(
        "memory of one head's S at N = 16,384 in bf16 (MiB)",
        answer,
        expected,
        [
            (N * N * bf16 / 1e6, "that is in MB (10^6 bytes); 1 MiB is 2^20 = 1,048,576 bytes"),
            (N * N * 4 / 2**20, "bf16 takes 2 bytes per number, not 4"),
            (N * N * 8 / 2**20, "bf16 takes 2 bytes per number, not 8"),
            (N * N / 2**20, "each number takes 2 bytes in bf16"),
        ],
        "S has N x N numbers of 2 bytes each; divide the bytes by 2^20 for MiB",
    )


def check_quick_causal_tiles(answer) -> None:
    """Score tiles a causal kernel computes at N = 16,384 with square tiles B = 128."""
    T = 16_384 // 128
    expected = T * (T + 1) // 2
    _hinted(
        "score tiles computed by a causal kernel (N = 16,384, B = 128)",
        answer,
        expected,
        [
            (T * T, "that is every tile; the tiles above the diagonal are skipped"),
            (T * (T - 1) // 2, "the T tiles on the diagonal are computed too (with the mask)"),
            (T * T / 2, "count exactly: the diagonal tiles are computed in full, not half"),
        ],
        "T = N / B tiles per side; row i of tiles computes tiles 0..i",
        rtol=0.0,
    )


def check_quick_traffic_ratio(answer) -> None:
    """Standard / FlashAttention HBM traffic for N = 16,384, d = 64, Br = 128 (about 2 Br / d)."""
    Br, d = 128, 64
    expected = 2 * Br / d  # the exact ratio at N = 16,384 is 3.98; both are accepted
    _hinted(
        "HBM traffic of standard attention / FlashAttention (Br = 128, d = 64)",
        answer,
        expected,
        [
            (d / (2 * Br), "that is FlashAttention / standard; the question asks the other way"),
            (
                Br / d,
                "that is Br / d = 128 / 64; the ratio is 2 Br / d: standard moves about 4N^2 "
                "elements, FlashAttention about 2N^2 d / Br (K and V, each read once per query "
                "tile)",
            ),
        ],
        "standard ~ 4N^2, FlashAttention ~ 2N^2 d / Br for N >> d; divide the two",
        rtol=0.02,
    )
