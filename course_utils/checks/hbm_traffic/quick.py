"""Notebook 04's quick checks: one number each (the expected numbers are computed here, not
written in the notebook).

    check_quick_ratio_d128(answer)        standard / FlashAttention HBM traffic, N = 16,384,
                                          d = 128, Br = 128
    check_quick_h200_standard_us(answer)  standard attention's memory-bound time for one head
                                          on the H200
    check_quick_tile_rows(answer)         the largest tile B with 16 B d bytes in 192 KiB, d = 64
    check_quick_a100_ridge(answer)        the A100's ridge point at 1.5 TB/s, in FLOP/byte
    check_quick_fa1_q_reads(answer)       Q-tile reads of FlashAttention-1's loop order
"""

from __future__ import annotations

from course_utils.checks.engine.quizzes import hinted_answer as _hinted
from course_utils.harness.hardware import H100_SXM, H200
from course_utils.references.memory import (
    flash_attention_traffic,
    standard_attention_traffic,
)
from course_utils.references.roofline import attention_flops


# ---- quick checks (the expected numbers are computed here, not written in the notebook) ------
def check_quick_ratio_d128(answer) -> None:
    """Standard / FlashAttention HBM traffic for N = 16,384, d = 128, Br = 128 (about 2 Br / d)."""
    N, d, Br = 16_384, 128, 128
    expected = standard_attention_traffic(N, d) / flash_attention_traffic(N, d, Br)
    _hinted(
        "standard / FlashAttention traffic (N = 16,384, d = 128, Br = 128)",
        answer,
        expected,
        [
            (1 / expected, "that is FlashAttention / standard; the question asks the other way"),
            (4.0, "4 is the ratio for d = 64; with d = 128 each K/V re-read moves twice as much"),
        ],
        "standard ~ 4N^2, FlashAttention ~ 2N^2 d / Br for N >> d: the ratio is about 2 Br / d",
        rtol=0.02,
    )


def check_quick_h200_standard_us(answer) -> None:
    """Standard attention's memory-bound time for one head on the H200 (measured), N = 16,384,
    d = 64, bf16, in microseconds."""
    N, d, b = 16_384, 64, 2
    nbytes = standard_attention_traffic(N, d) * b
    expected = nbytes / H200.hbm_bandwidth * 1e6
    _hinted(
        "standard attention on the H200, N = 16,384, d = 64 (us)",
        answer,
        expected,
        [
            (nbytes / 3.35e12 * 1e6, "that is the H100 (3.35 TB/s); use the H200's 4.26 TB/s"),
            (nbytes / 4.8e12 * 1e6, "4.8 TB/s is the spec sheet; use the measured 4.26 TB/s"),
            (expected / 2, "each bf16 element is 2 bytes: bytes = 2 x elements"),
            (expected * 2, "bf16 takes 2 bytes per element, not 4"),
            (
                attention_flops(N, d) / H200.peak_flops * 1e6,
                "that is the compute time 4N^2 d / P; standard attention is memory-bound, so its "
                "bound is the bytes over the bandwidth",
            ),
            (expected * 1e-6, "give the answer in microseconds (1 us = 1e-6 s)"),
        ],
        "bytes = (4N^2 + 4Nd) x 2; time = bytes / bandwidth; 1 us = 1e-6 s",
        rtol=0.01,
    )


def check_quick_tile_rows(answer) -> None:
    """The largest tile B with 16 B d bytes in 192 KiB of shared memory (196,608 bytes), d = 64."""
    sram, d = 192 * 1024, 64
    expected = sram // (16 * d)
    _hinted(
        "largest tile B for d = 64 in 192 KiB",
        answer,
        expected,
        [
            (sram // (16 * 128), "96 is the answer for d = 128; here d = 64, so B doubles"),
            (192_000 / (16 * d), "192 KiB is 192 x 1024 = 196,608 bytes"),
            (sram / (4 * d), "each of the four B x d tiles takes 4 bytes per element: 16 B d"),
        ],
        "four B x d tiles of 4-byte floats take 16 B d bytes; solve 16 B d <= 196,608",
        rtol=1e-9,
    )


def check_quick_a100_ridge(answer) -> None:
    """The A100's ridge point at 1.5 TB/s: 312 TFLOP/s / 1.5 TB/s = 208 FLOP/byte."""
    peak, bandwidth = 312e12, 1.5e12
    expected = peak / bandwidth
    _hinted(
        "A100 ridge point at 1.5 TB/s (FLOP/byte)",
        answer,
        expected,
        [
            (peak / 2.0e12, "156 is the ridge at 2 TB/s; here the HBM gives 1.5 TB/s"),
            (bandwidth / peak, "that is bytes per FLOP; the ridge point is FLOPs per byte"),
            (H100_SXM.ridge_point, "that is the H100's ridge (989 / 3.35); use the A100's numbers"),
        ],
        "ridge point = peak FLOP/s / HBM bytes/s",
        rtol=0.01,
    )


def check_quick_fa1_q_reads(answer) -> None:
    """Q-tile reads of FlashAttention-1's loop order (K, V outer) at N = 4,096 and B = 128."""
    N, B = 4096, 128
    tiles = N // B
    expected = tiles * tiles
    _hinted(
        "Q-tile reads, K/V tiles in the outer loop (N = 4,096, B = 128)",
        answer,
        expected,
        [
            (
                tiles,
                "32 is the minimum, each Q tile once; with K, V outside, every K/V tile reads "
                "all 32 Q tiles again",
            ),
            (N, "count tiles, not rows: there are N / B = 32 Q tiles"),
            (tiles * N, "each pass reads the 32 Q tiles, not 4,096 rows one by one"),
        ],
        "the outer loop has N / B K/V tiles, and each of its iterations reads every Q tile",
        rtol=1e-9,
    )
