"""Checks of notebook 04 (counting HBM traffic, and the roofline), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
replay.py (exercise 2's cases, the learner's loop replayed on the check's own memory), loops.py (the
buggy loops and their mistakes), quick.py (the quick checks).
"""

from course_utils.checks.hbm_traffic.exercises import (
    FLASH_MISTAKES,
    STANDARD_MISTAKES,
    check_count_flash_forward,
    check_flash_attention_traffic,
    check_standard_attention_traffic,
)
from course_utils.checks.hbm_traffic.loops import COUNT_MISTAKES, RULE_MISTAKES
from course_utils.checks.hbm_traffic.quick import (
    check_quick_a100_ridge,
    check_quick_fa1_q_reads,
    check_quick_h200_standard_us,
    check_quick_ratio_d128,
    check_quick_tile_rows,
)
from course_utils.checks.hbm_traffic.replay import fresh_memory, tile_budget

__all__ = [
    "COUNT_MISTAKES",
    "FLASH_MISTAKES",
    "RULE_MISTAKES",
    "STANDARD_MISTAKES",
    "check_count_flash_forward",
    "check_flash_attention_traffic",
    "check_quick_a100_ridge",
    "check_quick_fa1_q_reads",
    "check_quick_h200_standard_us",
    "check_quick_ratio_d128",
    "check_quick_tile_rows",
    "check_standard_attention_traffic",
    "fresh_memory",
    "tile_budget",
]
