"""Notebook 07's quick checks: one number each (the expected numbers are computed here, not
written in the notebook).

    check_quick_backward_flops_ratio(answer)   FlashAttention's backward FLOPs over the standard
                                               backward's (matmuls only): 10/8
    check_quick_lse_bytes(answer)              bytes of one head's lse at N = 32,768 (fp32)
    check_quick_p_over_lse(answer)             one head's P in bf16 over its lse in fp32
"""

from __future__ import annotations

from course_utils.checks.engine.quizzes import hinted_answer as _hinted

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
        rtol=0.0,
    )
