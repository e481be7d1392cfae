"""course_utils: reference implementations, checks and figures for the FlashAttention course.

One idea per module:
    softmax     online softmax statistics, the logsumexp merge of partial results
    attention   naive attention (the oracle), tiled FlashAttention forward, split-KV decoding
    memory      CountingMemory (an HBM + on-chip model) and the HBM traffic formulas
    roofline    FLOPs, arithmetic intensity, time lower bounds, hardware numbers
    checks      learner-facing checks with named misconceptions (used by the notebooks)
    widgets     the interactive figures
    triton_attention  Triton GPU kernels (imported lazily: needs torch and triton)

Everything except GPU timing runs on a CPU-only machine.
"""

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
    naive_attention_torch,
    saved_bytes_naive_vs_fused,
    saved_tensor_bytes,
    softmax_backward,
)
from course_utils.references.memory import (
    CountingMemory,
    OnChipMemoryError,
    causal_flash_attention_traffic,
    causal_tile_count,
    count_flash_attention,
    count_standard_attention,
    flash1_attention_traffic,
    flash_attention_traffic,
    standard_attention_traffic,
)
from course_utils.references.roofline import (
    A100,
    H100_SXM,
    H200,
    Hardware,
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
