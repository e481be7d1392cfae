"""Notebook 06's quick checks: one number each.

check_quick_num_programs(answer)        programs in the grid: batch 2, 4 heads, N = 1000,
                                        BLOCK_M = 64
check_quick_qk_scale(answer)            softmax_scale * log2(e) for d = 64
check_quick_causal_kv_tiles(answer)     K/V tiles that causal program 5 loads (N = 1000,
                                        BLOCK_M = 64, BLOCK_N = 32)
"""

from __future__ import annotations

import math

from course_utils.checks.engine.quizzes import hinted_answer as _hinted
from course_utils.checks.triton_forward.emulation import LN2, LOG2E

__all__ = ["check_quick_causal_kv_tiles", "check_quick_num_programs", "check_quick_qk_scale"]


def check_quick_num_programs(answer) -> None:
    """Programs launched for batch 2, 4 heads, N = 1000 queries, BLOCK_M = 64."""
    batch, heads, N, block_m = 2, 4, 1000, 64
    tiles = -(-N // block_m)
    _hinted(
        "programs in the grid (batch 2, 4 heads, N = 1000, BLOCK_M = 64)",
        answer,
        tiles * batch * heads,
        [
            ((N // block_m) * batch * heads, "N // BLOCK_M drops the ragged last tile: round up"),
            (tiles, "each (batch, head) pair gets its own row of programs: times batch * heads"),
            (tiles * heads, "the grid's second axis is batch * heads, not heads"),
            (tiles * batch, "the grid's second axis is batch * heads, not batch"),
            (N / block_m * batch * heads, "a program count is a whole number: ceil(N / BLOCK_M)"),
        ],
        "grid = (ceil(N / BLOCK_M), batch * heads); the number of programs is the product",
        rtol=0.0,
    )


def check_quick_qk_scale(answer) -> None:
    """qk_scale = softmax_scale * log2(e) for d = 64."""
    scale = 1.0 / math.sqrt(64)
    _hinted(
        "qk_scale for d = 64",
        answer,
        scale * LOG2E,
        [
            (scale, "that is softmax_scale alone; fold in log2(e) = 1.4427 for exp2"),
            (scale / LOG2E, "multiply by log2(e): exp(x) = exp2(x * log2(e))"),
            (scale * LN2, "log2(e) = 1 / ln(2) = 1.4427, not ln(2)"),
            (math.sqrt(64) * LOG2E, "softmax_scale is 1 / sqrt(d), not sqrt(d)"),
            (LOG2E / 64, "softmax_scale is 1 / sqrt(d) = 1/8, not 1 / d"),
        ],
        "qk_scale = (1 / sqrt(d)) * log2(e)",
    )


def check_quick_causal_kv_tiles(answer) -> None:
    """K/V tiles loaded by causal program pid_m = 5 (N = 1000, BLOCK_M = 64, BLOCK_N = 32)."""
    pid_m, N, block_m, block_n = 5, 1000, 64, 32
    hi = min((pid_m + 1) * block_m, N)
    _hinted(
        "K/V tiles loaded by causal program 5 (N = 1000, BLOCK_M = 64, BLOCK_N = 32)",
        answer,
        -(-hi // block_n),
        [
            (-(-N // block_n), "that is every K/V tile; causal skips those after the diagonal"),
            (pid_m * block_m // block_n, "the tiles on the diagonal are loaded too (and masked)"),
            (pid_m + 1, "count tiles of BLOCK_N = 32 keys, not of BLOCK_M = 64"),
        ],
        "the program's last query is (5 + 1) * 64 - 1; it loads keys 0 .. (5 + 1) * 64 - 1",
        rtol=0.0,
    )
