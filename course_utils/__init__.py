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

from .attention import (
    attention_reference,
    flash_attention_forward,
    split_kv_decode,
    split_kv_partials,
)
from .softmax import merge_partials, online_softmax_stats, online_softmax_steps

__all__ = [
    "attention_reference",
    "flash_attention_forward",
    "merge_partials",
    "online_softmax_stats",
    "online_softmax_steps",
    "split_kv_decode",
    "split_kv_partials",
]

__version__ = "0.1.0"
