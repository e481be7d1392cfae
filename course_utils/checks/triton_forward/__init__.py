"""Checks of notebook 06 (the forward kernel in Triton), as the notebook imports them.

    check_scale_tile, check_softmax_rows, check_matmul, check_row_block
                                  the four puzzles (puzzles.py, run by runs.py)
    check_attention_fwd           the whole forward: kernel and launcher (forward.py)
    check_quick_num_programs, check_quick_qk_scale, check_quick_causal_kv_tiles
                                  the quick checks (quick.py)

The parts: emulation.py (the skeleton kernel in float64 with one bug at a time, the kernel's
mistakes), loads.py (rules on what a kernel loads, from the interpreter's load log), common.py
(the launch through a runner, the comparison, the choice among matching replays).
"""

from course_utils.checks.triton_forward.forward import check_attention_fwd
from course_utils.checks.triton_forward.puzzles import (
    check_matmul,
    check_row_block,
    check_scale_tile,
    check_softmax_rows,
)
from course_utils.checks.triton_forward.quick import (
    check_quick_causal_kv_tiles,
    check_quick_num_programs,
    check_quick_qk_scale,
)

__all__ = [
    "check_attention_fwd",
    "check_matmul",
    "check_quick_causal_kv_tiles",
    "check_quick_num_programs",
    "check_quick_qk_scale",
    "check_row_block",
    "check_scale_tile",
    "check_softmax_rows",
]
