"""The SM-fill model: how many SMs a decode step keeps busy, with and without split-KV.

At decode each sequence has one query, so FlashAttention-2's grid has one thread block per
(sequence, head); split-KV gives each of the k chunks of a KV cache its own block:

    blocks = batch * heads * splits,   busy SMs = min(blocks, num_sms),
    waves = ceil(blocks / num_sms).

The time model: decode attention is memory-bound, and each busy SM pulls an equal share of the
HBM bandwidth, so streaming the KV cache takes

    t_attention = kv_bytes / (bandwidth * busy / num_sms),

and split-KV adds a merge kernel: a fixed cost of a few microseconds (a launch and a sync) plus
writing and reading the fp32 partials. The model leaves out the partly filled last wave, the
latency of a single block and the L2 cache; it is a picture of why, not a benchmark. The equal
share understates what one SM with enough loads in flight can pull, so the model overstates the
time without splitting: its speed-up is an upper estimate.

    sm_fill_state(batch, heads, splits, kv_len, d, num_sms=...) -> SmFillState  (notebook 05's
                                      decode_grid is its blocks, busy_sms and waves)
    time_vs_splits(batch, heads, kv_len, splits) -> (splits, attention_s, total_s)

widgets.sm_fill draws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_utils._validate import positive_int
from course_utils.harness.hardware import H100_SXM

MERGE_OVERHEAD_US = 3.0  # the merge kernel's launch and sync, microseconds
MAX_SPLITS = 64


@dataclass(frozen=True)
class SmFillState:
    """One decode step under the SM-fill model. Times in seconds, sizes in bytes."""

    batch: int
    heads: int
    splits: int  # k: chunks per KV cache
    kv_len: int  # tokens in each sequence's KV cache
    d: int  # head dimension
    num_sms: int
    blocks: int  # batch * heads * splits thread blocks
    busy_sms: int  # min(blocks, num_sms): SMs with a block in the first wave
    waves: int  # ceil(blocks / num_sms)
    sm_busy: np.ndarray  # (num_sms,) bool: SM i has a block in the first wave
    blocks_per_sm: np.ndarray  # (num_sms,) int: blocks SM i runs over all waves (round robin)
    keys_per_block: int  # ceil(kv_len / splits): the chunk each block streams
    kv_bytes: int  # 2 * batch * heads * kv_len * d * bytes_per_element (K and V)
    partial_bytes: int  # fp32 (o, lse) partials, written then read: 0 without split
    bandwidth_share: float  # busy_sms / num_sms
    attention_s: float  # kv_bytes / (hbm_bandwidth * bandwidth_share)
    merge_s: float  # 0 without split; overhead + partial_bytes / hbm_bandwidth
    full_bandwidth_s: float  # kv_bytes / hbm_bandwidth: every SM streaming

    @property
    def total_s(self) -> float:
        return self.attention_s + self.merge_s

    @property
    def idle_sms(self) -> int:
        return self.num_sms - self.busy_sms


def _positive_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def sm_fill_state(
    batch: int,
    heads: int,
    splits: int = 1,
    kv_len: int = 16_384,
    d: int = 128,
    *,
    num_sms: int = H100_SXM.num_sms,
    hbm_bandwidth: float = H100_SXM.hbm_bandwidth,
    bytes_per_element: int = 2,
    merge_overhead_us: float = MERGE_OVERHEAD_US,
) -> SmFillState:
    """Blocks, busy SMs, waves and modelled time of one decode step of attention.

    Args:
        batch: sequences decoded together.  heads: attention heads (each its own KV cache).
        splits: k, chunks per KV cache (1: FlashAttention-2's grid, no split).
        kv_len: tokens in each KV cache.  d: head dimension.
        num_sms: SMs of the GPU (132 on an H100).  hbm_bandwidth: bytes/s (3.35e12).
        bytes_per_element: of K and V (2: bf16).
        merge_overhead_us: fixed cost of the merge kernel, microseconds (only when splits > 1).

    Returns:
        SmFillState.
    """
    batch, heads = positive_int(batch, "batch"), positive_int(heads, "heads")
    splits, kv_len = positive_int(splits, "splits"), positive_int(kv_len, "kv_len")
    d, num_sms = positive_int(d, "d"), positive_int(num_sms, "num_sms")
    b = positive_int(bytes_per_element, "bytes_per_element")
    bandwidth = _positive_real(hbm_bandwidth, "hbm_bandwidth")
    if isinstance(merge_overhead_us, bool) or not merge_overhead_us >= 0:
        raise ValueError(f"merge_overhead_us must be >= 0, got {merge_overhead_us!r}")

    blocks = batch * heads * splits
    busy = min(blocks, num_sms)
    waves = -(-blocks // num_sms)
    sm_index = np.arange(num_sms)
    blocks_per_sm = blocks // num_sms + (sm_index < blocks % num_sms)
    kv_bytes = 2 * batch * heads * kv_len * d * b
    # each block writes (o: d floats, lse: 1 float) in fp32; the merge kernel reads them back
    partial_bytes = 2 * batch * heads * splits * (d + 1) * 4 if splits > 1 else 0
    share = busy / num_sms
    merge_s = merge_overhead_us * 1e-6 + partial_bytes / bandwidth if splits > 1 else 0.0
    return SmFillState(
        batch=batch,
        heads=heads,
        splits=splits,
        kv_len=kv_len,
        d=d,
        num_sms=num_sms,
        blocks=blocks,
        busy_sms=busy,
        waves=waves,
        sm_busy=sm_index < busy,
        blocks_per_sm=blocks_per_sm.astype(int),
        keys_per_block=-(-kv_len // splits),
        kv_bytes=kv_bytes,
        partial_bytes=partial_bytes,
        bandwidth_share=share,
        attention_s=kv_bytes / (bandwidth * share),
        merge_s=merge_s,
        full_bandwidth_s=kv_bytes / bandwidth,
    )


def time_vs_splits(batch, heads, kv_len, splits=range(1, MAX_SPLITS + 1), **kwargs):
    """Modelled decode attention time for each k in `splits`.

    Returns:
        (splits, attention_s, total_s): three float arrays of shape (len(splits),).
    """
    states = [sm_fill_state(batch, heads, k, kv_len, **kwargs) for k in splits]
    ks = np.array([s.splits for s in states], dtype=float)
    return ks, np.array([s.attention_s for s in states]), np.array([s.total_s for s in states])
