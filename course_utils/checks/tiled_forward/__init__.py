"""Checks of notebook 03 (the tiled FlashAttention forward in NumPy), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
mistakes.py (exercise 2's float64 reference and buggy forwards), quick.py (the quick checks).
"""

from course_utils.checks.tiled_forward.exercises import (
    FORWARD_STAGES,
    TILE_MAP_MISTAKES,
    check_causal_tile_map,
    check_flash_attention_forward,
    forward_rules,
    memory_allowed,
)
from course_utils.checks.tiled_forward.mistakes import FLASH_LSE_MISTAKES, FLASH_O_MISTAKES
from course_utils.checks.tiled_forward.quick import (
    check_quick_causal_tiles,
    check_quick_scores_mib,
    check_quick_traffic_ratio,
)

__all__ = [
    "FLASH_LSE_MISTAKES",
    "FLASH_O_MISTAKES",
    "FORWARD_STAGES",
    "TILE_MAP_MISTAKES",
    "check_causal_tile_map",
    "check_flash_attention_forward",
    "check_quick_causal_tiles",
    "check_quick_scores_mib",
    "check_quick_traffic_ratio",
    "forward_rules",
    "memory_allowed",
]
