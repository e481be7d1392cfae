"""Notebook 09's quick checks: one number each.

check_quick_programs(answer)   programs of the partials grid: batch 8, 32 query heads,
                               8 KV heads, num_splits 4
check_quick_kv_bytes(answer)   bytes of K and V one decode step reads: batch 1, 8 KV heads,
                               65,536 tokens, d 128, bf16
"""

from __future__ import annotations

from course_utils.checks.engine.quizzes import hinted_answer as _hinted


# ---- quick checks --------------------------------------------------------------------------------
def check_quick_programs(answer) -> None:
    """Programs of the partials grid: batch 8, 32 query heads, 8 KV heads, num_splits 4."""
    batch, q_heads, kv_heads, splits = 8, 32, 8, 4
    _hinted(
        "programs of the partials kernel (batch 8, 32 query heads, 8 KV heads, 4 splits)",
        answer,
        batch * kv_heads * splits,
        [
            (batch * q_heads * splits, "one program serves a whole group of query heads: count "
             "KV heads, not query heads"),
            (batch * kv_heads, "each (sequence, KV head) gets num_splits programs, one per chunk"),
            (kv_heads * splits, "every sequence of the batch has its own programs: times batch"),
            (q_heads * splits, "count (sequence, KV head, split) triples"),
        ],
        "grid = (batch * kv_heads, num_splits)",
        rtol=0.0,
    )  # fmt: skip


def check_quick_kv_bytes(answer) -> None:
    """Bytes of K and V one decode step reads: batch 1, 8 KV heads, 65,536 tokens, d 128, bf16."""
    n, kv_heads, d, size = 65_536, 8, 128, 2
    right = 2 * n * kv_heads * d * size
    _hinted(
        "bytes of K and V read (1 sequence, 65,536 tokens, 8 KV heads, d = 128, bfloat16)",
        answer,
        right,
        [
            (right * 4, "with GQA the 32 query heads share 8 KV heads: each KV head is read once"),
            (right // 2, "both K and V are read: times 2"),
            (right * 2, "bfloat16 is 2 bytes per element, not 4"),
            (right // size, "that is elements; bytes are twice as many in bfloat16"),
        ],
        "2 (K and V) * tokens * kv_heads * d * 2 bytes",
        rtol=1e-6,
    )  # fmt: skip
