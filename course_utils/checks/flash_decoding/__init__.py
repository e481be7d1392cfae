"""Checks of notebook 09 (flash-decoding over a paged KV cache), as the notebook imports them.

exercises.py holds the checks of the exercises (their cases, rules and messages); the other parts:
compare.py (comparisons and failure lines), merge_splits.py (exercise 2, check_merge_splits),
quick.py (the quick checks).
"""

from course_utils.checks.flash_decoding.exercises import (
    CHUNK_LSE_MISTAKES,
    CHUNK_OUT_MISTAKES,
    DecodeCase,
    check_attend_chunk,
    decode_inputs,
    emulate_partials,
    reference_partials,
)
from course_utils.checks.flash_decoding.merge_splits import (
    MERGE_LSE_MISTAKES,
    MERGE_OUT_MISTAKES,
    check_merge_splits,
)
from course_utils.checks.flash_decoding.quick import check_quick_kv_bytes, check_quick_programs

__all__ = [
    "CHUNK_LSE_MISTAKES",
    "CHUNK_OUT_MISTAKES",
    "DecodeCase",
    "MERGE_LSE_MISTAKES",
    "MERGE_OUT_MISTAKES",
    "check_attend_chunk",
    "check_merge_splits",
    "check_quick_kv_bytes",
    "check_quick_programs",
    "decode_inputs",
    "emulate_partials",
    "reference_partials",
]
