"""course_utils: the FlashAttention course's package: answers, a learner's tools, checks, figures.

One folder per kind of code:
    references        the answers: every exercise's reference (softmax, attention, memory, ...)
    harness           what a learner may use: CountingMemory, hardware facts, the ring transport,
                      the Triton skeletons and runners (copied whole into a graded kernel)
    widgets           the interactive figures: they only draw
    checks            the learner-facing checks, one module per notebook, with named mistakes
    triton_attention  Triton GPU kernels (imported lazily: needs torch and triton)

The names below are re-exported for the notebooks (`cu.attention_reference`, `cu.CountingMemory`,
`cu.H100_SXM`, ...). Everything except GPU timing runs on a CPU-only machine.
"""

from course_utils.harness.attention_backends import naive_attention_torch
from course_utils.harness.counting_memory import CountingMemory, OnChipMemoryError
from course_utils.harness.hardware import A100, H100_SXM, H200, Hardware
from course_utils.references import backward  # notebook 07 calls cu.backward.*
from course_utils.references.attention import (
    attention_reference,
    flash_attention_forward,
    split_kv_decode,
    split_kv_partials,
)
from course_utils.references.backward import (
    attention_backward_flops,
    attention_backward_reference,
    flash_attention_backward,
    saved_bytes_naive_vs_fused,
    saved_tensor_bytes,
    softmax_backward,
)
from course_utils.references.memory import (
    causal_flash_attention_traffic,
    causal_tile_count,
    count_flash_attention,
    count_standard_attention,
    flash1_attention_traffic,
    flash_attention_traffic,
    standard_attention_traffic,
)
from course_utils.references.roofline import (
    arithmetic_intensity,
    at_scale_example,
    attention_flops,
    attention_roofline,
    backward_memory_bytes,
    max_tile_rows,
    time_lower_bounds,
)
from course_utils.references.softmax import (
    merge_partials,
    online_softmax_stats,
    online_softmax_steps,
)

__all__ = [
    "backward",
    "attention_backward_flops",
    "attention_backward_reference",
    "flash_attention_backward",
    "naive_attention_torch",
    "saved_bytes_naive_vs_fused",
    "saved_tensor_bytes",
    "softmax_backward",
    "A100",
    "H100_SXM",
    "H200",
    "CountingMemory",
    "Hardware",
    "OnChipMemoryError",
    "arithmetic_intensity",
    "at_scale_example",
    "attention_flops",
    "attention_roofline",
    "backward_memory_bytes",
    "causal_flash_attention_traffic",
    "causal_tile_count",
    "count_flash_attention",
    "count_standard_attention",
    "flash1_attention_traffic",
    "flash_attention_traffic",
    "max_tile_rows",
    "standard_attention_traffic",
    "time_lower_bounds",
    "attention_reference",
    "flash_attention_forward",
    "merge_partials",
    "online_softmax_stats",
    "online_softmax_steps",
    "split_kv_decode",
    "split_kv_partials",
]

__version__ = "0.1.0"

# In a notebook, an answer not written yet stops with one line naming it (student_errors).
from course_utils import student_errors as _student_errors  # noqa: E402

_student_errors.install()
