"""Checks of notebook 05 (split-KV decoding), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
mistakes.py (the buggy partials and merges, the named mistakes, the references).
"""

from course_utils.checks.split_kv.exercises import (
    GRID_MISTAKES,
    LN,
    NEG_INF,
    NUM_SMS,
    QUICK_MERGE_PARTIALS,
    check_decode_grid,
    check_quick_blocks_no_split,
    check_quick_blocks_split,
    check_quick_chunk_merge,
    check_split_kv_decode,
    check_split_kv_partials,
)
from course_utils.checks.split_kv.mistakes import DECODE_MISTAKES, PARTIALS_MISTAKES

__all__ = [
    "PARTIALS_MISTAKES",
    "DECODE_MISTAKES",
    "GRID_MISTAKES",
    "LN",
    "NEG_INF",
    "NUM_SMS",
    "QUICK_MERGE_PARTIALS",
    "check_decode_grid",
    "check_quick_blocks_no_split",
    "check_quick_blocks_split",
    "check_quick_chunk_merge",
    "check_split_kv_decode",
    "check_split_kv_partials",
]
