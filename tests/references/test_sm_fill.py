"""The SM-fill model (references.sm_fill): blocks, SMs, waves, the time model.

Expected numbers are the lesson's (32 blocks for batch 1 and 32 heads; 64 and 512 blocks for
check yourself 5) and direct formulas written here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from course_utils.harness.hardware import H100_SXM
from course_utils.references.sm_fill import MERGE_OVERHEAD_US, sm_fill_state, time_vs_splits

pytestmark = pytest.mark.filterwarnings("error")

W = H100_SXM.hbm_bandwidth


def test_the_lessons_decode_step_uses_32_of_132_sms():
    st = sm_fill_state(batch=1, heads=32)
    assert (st.blocks, st.busy_sms, st.idle_sms, st.waves) == (32, 32, 100, 1)
    assert st.sm_busy.sum() == 32 and st.sm_busy[:32].all() and not st.sm_busy[32:].any()
    assert st.merge_s == 0.0 and st.partial_bytes == 0


def test_check_yourself_5():
    no_split = sm_fill_state(4, 16, 1)
    split = sm_fill_state(4, 16, 8)
    assert (no_split.blocks, no_split.busy_sms, no_split.waves) == (64, 64, 1)
    assert (split.blocks, split.busy_sms, split.waves) == (512, 132, 4)  # 3.88 -> 4 waves


@pytest.mark.parametrize(
    "batch, heads, splits, sms", [(1, 1, 1, 132), (3, 5, 7, 132), (64, 32, 1, 132), (2, 16, 4, 108)]
)
def test_blocks_busy_waves_and_the_round_robin(batch, heads, splits, sms):
    st = sm_fill_state(batch, heads, splits, num_sms=sms)
    blocks = batch * heads * splits
    assert st.blocks == blocks
    assert st.busy_sms == min(blocks, sms) == st.sm_busy.sum()
    assert st.waves == math.ceil(blocks / sms)
    assert st.blocks_per_sm.shape == (sms,) and st.blocks_per_sm.sum() == blocks
    assert st.blocks_per_sm.max() == st.waves
    assert st.blocks_per_sm.max() - st.blocks_per_sm.min() <= 1
    assert np.array_equal(st.blocks_per_sm > 0, st.sm_busy)


@settings(max_examples=200, deadline=None)
@given(
    batch=st_.integers(1, 128),
    heads=st_.integers(1, 128),
    splits=st_.integers(1, 64),
    kv_len=st_.integers(1, 200_000),
    sms=st_.integers(1, 200),
)
def test_invariants_for_any_grid(batch, heads, splits, kv_len, sms):
    st = sm_fill_state(batch, heads, splits, kv_len, num_sms=sms)
    assert st.blocks == batch * heads * splits
    assert st.busy_sms == min(st.blocks, sms) and st.waves == -(-st.blocks // sms)
    assert (st.waves - 1) * sms < st.blocks <= st.waves * sms
    assert st.blocks_per_sm.sum() == st.blocks
    assert st.attention_s >= st.full_bandwidth_s * (1 - 1e-12)
    assert (st.merge_s > 0) == (splits > 1)
    assert st.keys_per_block * splits >= kv_len > (st.keys_per_block - 1) * splits


def test_time_model_follows_the_busy_sms():
    st = sm_fill_state(1, 32, 1, kv_len=32_768, d=128)
    kv_bytes = 2 * 1 * 32 * 32_768 * 128 * 2  # K and V, bf16
    assert st.kv_bytes == kv_bytes
    assert st.full_bandwidth_s == pytest.approx(kv_bytes / W)
    assert st.attention_s == pytest.approx(kv_bytes / (W * 32 / 132))
    four = sm_fill_state(1, 32, 4, kv_len=32_768, d=128)
    assert four.attention_s == pytest.approx(kv_bytes / (W * 128 / 132))
    assert four.merge_s == pytest.approx(MERGE_OVERHEAD_US * 1e-6 + 2 * 32 * 4 * 129 * 4 / W)
    assert four.total_s == pytest.approx(four.attention_s + four.merge_s)
    assert st.total_s / four.total_s > 3.5  # close to 128 / 32 = 4 for a long cache


def test_a_full_gpu_gains_nothing_and_a_short_cache_little():
    # a large batch fills the GPU without splitting: every split only adds the merge
    ks, attn, total = time_vs_splits(64, 32, kv_len=4096)
    assert np.allclose(attn, attn[0]) and np.argmin(total) == 0
    assert (np.diff(total) > 0).all()
    # a short KV cache: the best split saves about a microsecond
    _, _, short = time_vs_splits(1, 32, kv_len=256)
    assert 0 < short[0] - short.min() < 2e-6
    # a long cache with 16 heads gains close to 132 / 16 = 8.25x (the paper: up to 8x)
    _, _, long = time_vs_splits(1, 16, kv_len=131_072)
    assert 7.5 < long[0] / long.min() < 132 / 16


def test_speedup_is_capped_by_the_idle_fraction():
    for batch, heads in [(1, 8), (2, 16), (1, 40)]:
        ks, _, total = time_vs_splits(batch, heads, kv_len=65_536)
        bound = 132 / min(batch * heads, 132)
        assert total[0] / total.min() <= bound + 1e-12


@pytest.mark.parametrize(
    "kwargs",
    [{"batch": 0, "heads": 1}, {"batch": 1, "heads": 2.5}, {"batch": True, "heads": 1}],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises((TypeError, ValueError)):
        sm_fill_state(**kwargs)
