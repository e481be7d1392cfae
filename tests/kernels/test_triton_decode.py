"""The course's flash-decoding kernel (course_utils.triton_attention.decode) against NumPy.

Paged caches with the pages of each sequence shuffled among garbage pages, ragged lengths (0, 1,
page-aligned and not), splits past a sequence's end, grouped-query attention, float16 and float32
(bfloat16 on a GPU), compared with naive float64 attention over each sequence's tokens and with
course_utils.split_kv_decode. Without a GPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_utils as cu
import course_utils.triton_attention as ta
from course_utils.checks.flash_decoding import DecodeCase, decode_inputs
from course_utils.triton_attention.decode import (
    MAX_SPLITS,
    NOMINAL_SMS,
    choose_num_splits,
    flash_decode,
)

DEVICE = "cpu" if ta.INTERPRETER else "cuda"


def _naive(q, k, v, table, lens, scale=None):
    """float64 out (batch, q_heads, d), lse (batch, q_heads): attention over each sequence."""
    batch, q_heads, d = q.shape
    page, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    out, lse = np.zeros((batch, q_heads, d)), np.full((batch, q_heads), -np.inf)
    for b in range(batch):
        toks = np.arange(int(lens[b]))
        phys = table[b, toks // page]
        for h in range(q_heads):
            keys = k[phys, toks % page, h // group]
            values = v[phys, toks % page, h // group]
            o, l = cu.attention_reference(q[b, h][None], keys, values, False, scale)
            out[b, h], lse[b, h] = o[0], l[0]
    return out, lse


def _run(case: DecodeCase, num_splits=None, **kw):
    tensors, (q, k, v, table, lens) = decode_inputs(case)
    tensors = [t.to(DEVICE) for t in tensors]
    out, lse = flash_decode(*tensors, num_splits=num_splits, **kw)
    assert out.dtype == tensors[0].dtype and lse.dtype == torch.float32
    assert out.shape == tensors[0].shape and lse.shape == tensors[0].shape[:2]
    return out.double().cpu().numpy(), lse.double().cpu().numpy(), _naive(q, k, v, table, lens)


def _tol(dtype: str) -> float:
    if dtype == "float32":
        return 1e-5 if ta.INTERPRETER else 5e-3  # tf32 tensor cores on a GPU
    return 3e-3 if dtype == "float16" else 2e-2


def _assert_close(out, lse, ref, tol):
    out64, lse64 = ref
    assert np.isfinite(out).all(), "out has NaN or inf"
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(lse64))
    assert (lse[np.isinf(lse64)] < 0).all()
    assert (out[np.isinf(lse64)] == 0).all(), "a sequence of length 0 must give out = 0"
    err = np.linalg.norm(out - out64) / max(np.linalg.norm(out64), 1e-30)
    assert err < tol, err
    fin = np.isfinite(lse64)
    np.testing.assert_allclose(lse[fin], lse64[fin], rtol=tol, atol=tol)


GRID = [
    # q_heads, kv_heads, d, page, lens, num_splits
    (1, 1, 16, 16, (1,), 1),
    (4, 4, 32, 16, (1, 16, 17, 0), 3),  # MHA, page-aligned and not, length 0
    (8, 2, 32, 16, (100, 37), 4),  # GQA 4
    (6, 2, 24, 32, (70,), 2),  # GQA 3 (padded to 16 rows), d not a power of two
    (8, 1, 64, 16, (200, 3, 64), 8),  # MQA, splits past the short sequences' ends
    (2, 1, 16, 64, (129,), 1),
    (4, 2, 16, 16, (0, 0), 2),  # every sequence empty
    (4, 2, 16, 16, (50,), None),  # num_splits chosen by the model
    (6, 2, 24, 64, (1, 64, 65, 130), 3),  # 64-token pages: the large-page tile, d not 2^k
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("params", GRID)
def test_matches_naive_attention(params, dtype):
    q_heads, kv_heads, d, page, lens, splits = params
    case = DecodeCase("grid", q_heads, kv_heads, d, page, lens, splits or 1, dtype, seed=len(lens))
    out, lse, ref = _run(case, splits)
    _assert_close(out, lse, ref, _tol(dtype))


def test_unused_slots_may_hold_nan():
    # slots past a sequence's length, and pages no sequence uses, hold NaN: nothing may leak
    case = DecodeCase("nan", 8, 2, 32, 16, (37, 5, 16), 3, "float32", seed=3)
    tensors, (q, k, v, table, lens) = decode_inputs(case)
    tensors = [t.to(DEVICE) for t in tensors]
    q_t, k_t, v_t, table_t, lens_t = tensors
    k_nan, v_nan = k_t.clone(), v_t.clone()
    page = k_t.shape[1]
    used = torch.zeros(k_t.shape[:2], dtype=torch.bool, device=DEVICE)
    for b, n in enumerate(lens_t.tolist()):
        for t in range(n):
            used[table_t[b, t // page], t % page] = True
    k_nan[~used] = float("nan")
    v_nan[~used] = float("nan")
    out, lse = flash_decode(q_t, k_nan, v_nan, table_t, lens_t, num_splits=3)
    ref = _naive(q, k, v, table, lens)
    _assert_close(out.double().cpu().numpy(), lse.double().cpu().numpy(), ref, _tol("float32"))


@pytest.mark.parametrize("params", [GRID[1], GRID[2], GRID[4]])
def test_head_major_pages_are_a_view(params):
    # a cache stored (num_pages, kv_heads, page_size, d), head-major within a page as FlashInfer's
    # HND layout, passed as its (num_pages, page_size, kv_heads, d) view: the strides say it all
    q_heads, kv_heads, d, page, lens, splits = params
    case = DecodeCase("hnd", q_heads, kv_heads, d, page, lens, splits, "float32", seed=13)
    tensors, (q, k, v, table, lens_np) = decode_inputs(case)
    q_t, k_t, v_t, table_t, lens_t = (t.to(DEVICE) for t in tensors)
    k_hnd, v_hnd = (x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for x in (k_t, v_t))
    assert k_hnd.stride(1) == d  # consecutive slots of one head are d elements apart
    if kv_heads > 1:  # (a size-1 dimension's stride is arbitrary)
        assert k_hnd.stride(2) == page * d
    out, lse = flash_decode(q_t, k_hnd, v_hnd, table_t, lens_t, num_splits=splits)
    ref = _naive(q, k, v, table, lens_np)
    _assert_close(out.double().cpu().numpy(), lse.double().cpu().numpy(), ref, _tol("float32"))


@pytest.mark.gpu
@pytest.mark.skipif(ta.INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [4096, 8192, 65536])
def test_gpu_head_major_pages_at_scale(n):
    # the benchmark's shape (batch 1, 32 KV heads, d 128, pages of 16 shuffled): the same cache
    # stored token-major and head-major gives the same answer, with the default launch
    gen = torch.Generator(device="cuda").manual_seed(n)
    pages, page, heads, d = n // 16, 16, 32, 128
    q = torch.randn(1, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(pages, page, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(pages, page, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    table = torch.randperm(pages, device="cuda", generator=gen).view(1, pages).to(torch.int32)
    lens = torch.full((1,), n, device="cuda", dtype=torch.int32)
    out, lse = flash_decode(q, k, v, table, lens)
    k_hnd, v_hnd = (x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for x in (k, v))
    out_hnd, lse_hnd = flash_decode(q, k_hnd, v_hnd, table, lens)
    torch.cuda.synchronize()
    assert torch.allclose(out_hnd.float(), out.float(), atol=1e-2, rtol=1e-2)
    assert torch.allclose(lse_hnd, lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("pages_per_tile", [1, 2, 4])
def test_several_pages_per_tile(pages_per_tile):
    case = DecodeCase("tiles", 4, 2, 32, 16, (75, 16, 1), 2, seed=5)
    out, lse, ref = _run(case, 2, pages_per_tile=pages_per_tile)
    _assert_close(out, lse, ref, _tol("float32"))


@pytest.mark.parametrize(
    "page, tile, lens",
    [(64, 16, (130, 64, 1)), (64, 32, (200, 0, 63)), (32, 16, (75, 33)), (16, 64, (90, 17))],
)
def test_tiles_inside_large_pages(page, tile, lens):
    # tile_tokens below the page size: several tiles per page (one table entry each), the
    # ragged last tile inside a page; above it, several pages per tile as pages_per_tile does
    case = DecodeCase("tile in page", 8, 2, 32, page, lens, 3, "float32", seed=page + tile)
    out, lse, ref = _run(case, 3, tile_tokens=tile)
    _assert_close(out, lse, ref, _tol("float32"))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"tile_tokens": 24}, "tile_tokens must be a power of two >= 16, got 24"),
        ({"tile_tokens": 8}, "tile_tokens must be a power of two >= 16, got 8"),
        ({"tile_tokens": 0}, "tile_tokens must be a positive int, got 0"),
        ({"tile_tokens": 32, "pages_per_tile": 2}, "give pages_per_tile or tile_tokens, not both"),
        ({"pages_per_tile": 3}, "pages_per_tile must be a power of two, got 3"),
    ],
)
def test_bad_tile_is_refused(kw, match):
    tensors, _ = decode_inputs(DecodeCase("bad tile", 4, 2, 16, 16, (20,), 1, "float32", seed=1))
    with pytest.raises(ValueError, match=match):
        flash_decode(*(t.to(DEVICE) for t in tensors), **kw)


def test_bfloat16():
    case = DecodeCase("bf16", 8, 2, 64, 16, (90, 33), 3, "bfloat16", seed=6)
    out, lse, ref = _run(case, 3)
    _assert_close(out, lse, ref, 2e-2)


def test_large_scores_stay_finite():
    case = DecodeCase("big", 4, 2, 16, 16, (60,), 3, seed=7, q_scale=100.0)
    out, lse, ref = _run(case, 3)
    _assert_close(out, lse, ref, _tol("float32"))


def test_agrees_with_numpy_split_kv_decode():
    """One contiguous sequence: the kernel, course_utils.split_kv_decode and naive agree."""
    case = DecodeCase("numpy", 1, 1, 16, 16, (47,), 3, seed=8)
    tensors, (q, k, v, table, lens) = decode_inputs(case)
    keys = k[table[0, np.arange(47) // 16], np.arange(47) % 16, 0]
    values = v[table[0, np.arange(47) // 16], np.arange(47) % 16, 0]
    o_np, lse_np = cu.split_kv_decode(q[0, 0], keys, values, 3)
    out, lse = flash_decode(*[t.to(DEVICE) for t in tensors], num_splits=3)
    np.testing.assert_allclose(out[0, 0].double().cpu().numpy(), o_np, atol=_tol("float32"))
    assert math.isclose(float(lse[0, 0]), float(lse_np), rel_tol=_tol("float32"))


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lens=st.lists(st.integers(0, 70), min_size=1, max_size=3),
    group=st.sampled_from([1, 2, 4]),
    splits=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_split_gives_the_same_answer(lens, group, splits, seed):
    case = DecodeCase("hyp", 2 * group, 2, 16, 16, tuple(lens), splits, seed=seed)
    out, lse, ref = _run(case, splits)
    _assert_close(out, lse, ref, _tol("float32"))


def _inputs(batch=2, q_heads=4, kv_heads=2, d=16, page=16, num_pages=6, max_pages=3):
    q = torch.randn(batch, q_heads, d, device=DEVICE)
    k = torch.randn(num_pages, page, kv_heads, d, device=DEVICE)
    table = torch.zeros(batch, max_pages, dtype=torch.int32, device=DEVICE)
    lens = torch.full((batch,), 20, dtype=torch.int32, device=DEVICE)
    return q, k, k.clone(), table, lens


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (lambda a: (a[0][0], *a[1:]), ValueError, r"q must have shape \(batch, q_heads, d\)"),
        (lambda a: (a[0], a[1][0], *a[2:]), ValueError, "k_cache must have shape"),
        (
            lambda a: (a[0][:, :3], *a[1:]),
            ValueError,
            "q_heads = q.shape.1. = 3 must be a multiple",
        ),
        (lambda a: (a[0].double(), *a[1:]), TypeError, "q must be float16, bfloat16 or float32"),
        (lambda a: (a[0].half(), *a[1:]), TypeError, "share one dtype"),
        (lambda a: (*a[:3], a[3].float(), a[4]), TypeError, "block_table must be an int32"),
        (lambda a: (*a[:3], a[3][:1], a[4]), ValueError, "one row per sequence"),
        (lambda a: (*a[:3], a[3] + 6, a[4]), ValueError, r"block_table\[0, 0\] = 6"),
        (lambda a: (*a[:4], a[4] + 100), ValueError, r"seq_lens\[0\] = 120 must be in 0..48"),
        (lambda a: (*a[:4], a[4] - 21), ValueError, r"seq_lens\[0\] = -1"),
        (lambda a: (*a[:4], a[4][None]), ValueError, r"seq_lens must have shape \(batch,\)"),
        (lambda a: (*a[:2], a[2][:, :, :1], *a[3:]), ValueError, "one shape"),
    ],
)
def test_bad_input_names_the_argument(edit, error, match):
    with pytest.raises(error, match=match):
        flash_decode(*edit(_inputs()))


def test_bad_page_size_and_splits():
    q, k, v, table, lens = _inputs(page=8)
    with pytest.raises(ValueError, match="page_size"):
        flash_decode(q, k, v, table, lens)
    q, k, v, table, lens = _inputs()
    with pytest.raises(ValueError, match="num_splits"):
        flash_decode(q, k, v, table, lens, num_splits=0)
    with pytest.raises(ValueError, match="num_splits"):
        flash_decode(q, k, v, table, lens, num_splits=MAX_SPLITS + 1)
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_decode(q, k, v, table, lens, softmax_scale=-1.0)


def test_pdl_only_where_the_gpu_has_it():
    assert ta.decode.pdl_capable((9, 0)) and ta.decode.pdl_capable((10, 0))
    assert not ta.decode.pdl_capable((8, 9)) and not ta.decode.pdl_capable((7, 5))
    q, k, v, table, lens = _inputs()
    if not ta.decode.pdl_supported(q.device):
        with pytest.raises(ValueError, match="pdl=True needs a CUDA GPU of compute capability 9"):
            flash_decode(q, k, v, table, lens, pdl=True)
    out, lse = flash_decode(q, k, v, table, lens, pdl=False)
    out_default, lse_default = flash_decode(q, k, v, table, lens)  # pdl where supported
    torch.testing.assert_close(out_default, out, rtol=0, atol=0)
    torch.testing.assert_close(lse_default, lse, rtol=0, atol=0)


def test_tuning_follows_the_grid_and_the_page_size():
    from course_utils.triton_attention import decode

    # 8 * 32 caches fill 132 SMs: the large-grid settings, whatever the page size
    assert decode.default_tuning(8, 32, 132, 256) == decode.DEFAULT_TUNING
    # few caches: 64-token tiles inside pages of 64 tokens or more, else 32-token tiles
    assert decode.default_tuning(1, 32, 132, 64) == decode.FEW_SEQUENCES_LARGE_PAGES_TUNING
    assert decode.default_tuning(1, 32, 132, 256) == decode.FEW_SEQUENCES_LARGE_PAGES_TUNING
    assert decode.default_tuning(1, 32, 132, 32) == decode.FEW_SEQUENCES_TUNING
    assert decode.default_tuning(1, 32, 132) == decode.FEW_SEQUENCES_TUNING
    # a copy: a caller may change it without changing the defaults
    decode.default_tuning(1, 32, 132, 64)["num_stages"] = 99
    assert decode.FEW_SEQUENCES_LARGE_PAGES_TUNING["num_stages"] == 3


def test_choose_num_splits_follows_the_sm_fill_model():
    # batch 1, 8 KV heads, 64k tokens: 8 caches cannot fill 132 SMs, so as many splits as keep
    # every SM at 4 programs: floor(4 * 132 / 8) = 66
    assert choose_num_splits(1, 8, 65536, 16, sms=132) == 66
    # rounded down, never past 4 programs on an SM: 32 KV heads -> floor(528 / 32) = 16, not 17
    assert choose_num_splits(1, 32, 65536, 16, sms=132) == 16
    assert 1 * 32 * choose_num_splits(1, 32, 65536, 16, sms=132) <= 4 * 132
    # the same with the model's other settings given
    assert choose_num_splits(1, 8, 65536, 16, sms=132, programs_per_sm=2) == 33
    # 8 * 32 = 256 caches fill the SMs: floor(528 / 256) = 2
    assert choose_num_splits(8, 32, 65536, 16, sms=132) == 2
    # a grid past 4 programs per SM without splitting: one split
    assert choose_num_splits(64, 8, 65536, 16, sms=132) == 1
    assert choose_num_splits(128, 8, 65536, 16, sms=132) == 1
    # short caches: chunks of at least 256 tokens
    assert choose_num_splits(1, 8, 1024, 16, sms=132) == 4
    assert choose_num_splits(1, 8, 1024, 16, sms=132, min_tokens_per_split=128) == 8
    assert choose_num_splits(1, 1, 0, 16, sms=132) == 1
    assert 1 <= choose_num_splits(1, 1, 10**7, 16) <= MAX_SPLITS
    if ta.INTERPRETER:
        assert choose_num_splits(1, 8, 65536, 16) == choose_num_splits(
            1, 8, 65536, 16, sms=NOMINAL_SMS
        )
    with pytest.raises(ValueError, match="kv_heads"):
        choose_num_splits(1, 0, 100)
