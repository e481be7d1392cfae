"""Checks of notebook 08 (the FlashAttention-2 backward in Triton), as the notebook imports them.

    check_bwd_preprocess, check_dkdv_kernel, check_dq_kernel   the three kernels (kernels.py)
    check_attention_function      the learner's torch.autograd.Function (function.py)
    check_quick_matmuls, check_quick_causal_query_tiles, check_quick_saved_bytes
                                  the quick checks (quick.py)

emulation.py holds the float64 references and the replays of the known mistakes.
"""

from course_utils.checks.triton_backward.function import check_attention_function
from course_utils.checks.triton_backward.kernels import (
    check_bwd_preprocess,
    check_dkdv_kernel,
    check_dq_kernel,
)
from course_utils.checks.triton_backward.quick import (
    check_quick_causal_query_tiles,
    check_quick_matmuls,
    check_quick_saved_bytes,
)

__all__ = [
    "check_attention_function",
    "check_bwd_preprocess",
    "check_dkdv_kernel",
    "check_dq_kernel",
    "check_quick_causal_query_tiles",
    "check_quick_matmuls",
    "check_quick_saved_bytes",
]
