"""Checks of notebook 07 (the attention backward pass recomputed from lse), as the notebook
imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
mistakes.py (exercise 2's float64 references and buggy backwards), quick.py (the quick checks).
"""

from course_utils.checks.backward.exercises import (
    BACKWARD_RULE_MISTAKES,
    SOFTMAX_BACKWARD_MISTAKES,
    check_flash_attention_backward,
    check_softmax_backward_rows,
)
from course_utils.checks.backward.mistakes import BACKWARD_MISTAKES
from course_utils.checks.backward.quick import (
    check_quick_backward_flops_ratio,
    check_quick_lse_bytes,
    check_quick_p_over_lse,
)

__all__ = [
    "BACKWARD_MISTAKES",
    "BACKWARD_RULE_MISTAKES",
    "SOFTMAX_BACKWARD_MISTAKES",
    "check_flash_attention_backward",
    "check_quick_backward_flops_ratio",
    "check_quick_lse_bytes",
    "check_quick_p_over_lse",
    "check_softmax_backward_rows",
]
