"""Checks of notebook 01 (online softmax), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
mistakes.py (the float64 references and the buggy implementations, with the rule-breaking ones).
"""

from course_utils.checks.online_softmax.exercises import (
    EXAMPLE_V,
    EXAMPLE_X,
    FURTHER_V,
    FURTHER_X,
    LOCAL_V,
    LOCAL_X,
    NEG_INF,
    check_online_softmax_attention,
    check_online_softmax_stats,
    check_quick_new_l,
    check_quick_output,
    check_quick_rescale,
    check_quick_second_example,
)
from course_utils.checks.online_softmax.mistakes import (
    ATTENTION_MISTAKES,
    ATTENTION_RULE_MISTAKES,
    STATS_MISTAKES,
    STATS_RULE_MISTAKES,
)

__all__ = [
    "ATTENTION_MISTAKES",
    "ATTENTION_RULE_MISTAKES",
    "EXAMPLE_V",
    "EXAMPLE_X",
    "FURTHER_V",
    "FURTHER_X",
    "LOCAL_V",
    "LOCAL_X",
    "NEG_INF",
    "STATS_MISTAKES",
    "STATS_RULE_MISTAKES",
    "check_online_softmax_attention",
    "check_online_softmax_stats",
    "check_quick_new_l",
    "check_quick_output",
    "check_quick_rescale",
    "check_quick_second_example",
]
