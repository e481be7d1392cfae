"""Checks of notebook 02 (merging partial softmax results), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
mistakes.py (the buggy merges and MERGE_MISTAKES).
"""

from course_utils.checks.merge_partials.exercises import (
    FULL_SOFTMAX,
    LN,
    MERGE_NOT_USED,
    NEG_INF,
    PARTS_MISTAKES,
    PARTS_RULE_MISTAKES,
    check_attention_by_parts,
    check_merge_partials,
    check_quick_merge,
    check_quick_merge_second,
    check_quick_merged_lse,
)
from course_utils.checks.merge_partials.mistakes import MERGE_MISTAKES

__all__ = [
    "PARTS_MISTAKES",
    "MERGE_MISTAKES",
    "FULL_SOFTMAX",
    "LN",
    "MERGE_NOT_USED",
    "NEG_INF",
    "PARTS_RULE_MISTAKES",
    "check_attention_by_parts",
    "check_merge_partials",
    "check_quick_merge",
    "check_quick_merge_second",
    "check_quick_merged_lse",
]
