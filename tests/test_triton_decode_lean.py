"""decode_lean: flash-decoding with the pages spread evenly over a fixed grid, against NumPy.

The same paged caches as tests/test_triton_decode.py (shuffled pages among garbage pages, ragged
lengths, GQA, empty sequences), at grids from one program per group to one page per program,
and counts of programs that put a range's end in the next group at every offset.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import course_utils.triton_attention as ta
from course_utils.checks.flash_decoding import DecodeCase, decode_inputs
from course_utils.triton_attention.decode import flash_decode
from course_utils.triton_attention.decode_lean import flash_decode_lean, lean_programs
from tests.test_triton_decode import DEVICE, _assert_close, _naive, _tol

CASES = [
    # q_heads, kv_heads, d, page, lens
    (1, 1, 16, 16, (1,)),
    (4, 4, 32, 16, (1, 16, 17, 0)),  # MHA, page-aligned and not, length 0
    (8, 2, 32, 16, (100, 37)),  # GQA 4
    (6, 2, 24, 32, (70,)),  # GQA 3, d not a power of two
    (8, 1, 64, 16, (200, 3, 64)),  # MQA, short sequences among a long one
    (4, 2, 16, 16, (0, 0)),  # every sequence empty
]


def _programs(case: DecodeCase) -> list[int | None]:
    groups = case.batch * case.kv_heads
    units = groups * case.max_pages
    return sorted(
        {None, groups, min(groups + 1, units), min(2 * groups + 1, units), units}, key=str
    )


def _run(case, **kw):
    tensors, (q, k, v, table, lens) = decode_inputs(case)
    tensors = [t.to(DEVICE) for t in tensors]
    out, lse = flash_decode_lean(*tensors, **kw)
    assert out.dtype == tensors[0].dtype and out.shape == tensors[0].shape
    assert lse.dtype == torch.float32 and lse.shape == tensors[0].shape[:2]
    return out.double().cpu().numpy(), lse.double().cpu().numpy(), _naive(q, k, v, table, lens)


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p[0]}q{p[1]}kv-d{p[2]}-p{p[3]}")
def test_matches_naive_attention_at_every_grid(params):
    q_heads, kv_heads, d, page, lens = params
    case = DecodeCase("lean", q_heads, kv_heads, d, page, lens, 1, "float32", seed=len(lens) + d)
    for programs in _programs(case):
        out, lse, ref = _run(case, num_programs=programs)
        _assert_close(out, lse, ref, _tol("float32"))


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_tiles_and_pages(tile):
    case = DecodeCase("lean tiles", 8, 2, 32, 32, (130, 65, 1), 1, "float16", seed=tile)
    out, lse, ref = _run(case, num_programs=7, tile_tokens=tile)
    _assert_close(out, lse, ref, _tol("float16"))


def test_bfloat16_and_agrees_with_flash_decode():
    case = DecodeCase("lean bf16", 8, 2, 64, 16, (90, 33), 1, "bfloat16", seed=6)
    out, lse, ref = _run(case, num_programs=5)
    _assert_close(out, lse, ref, 2e-2)
    tensors = [t.to(DEVICE) for t in decode_inputs(case)[0]]
    out2, lse2 = flash_decode(*tensors, num_splits=3)
    np.testing.assert_allclose(lse, lse2.double().cpu().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "programs, match",
    [(3, "num_programs must be between batch \\* kv_heads = 4"), (0, "positive int")],
)
def test_bad_num_programs_is_refused(programs, match):
    tensors, _ = decode_inputs(DecodeCase("bad", 4, 2, 16, 16, (20, 5), 1, "float32", seed=1))
    with pytest.raises(ValueError, match=match):
        flash_decode_lean(*(t.to(DEVICE) for t in tensors), num_programs=programs)


def test_lean_programs_fills_the_sms_within_the_bounds():
    assert lean_programs(1, 32, 512, sms=132) == 528  # 4 per SM: 16.5 pages' worth per group
    assert lean_programs(8, 32, 512, sms=132) == 528  # 256 groups: about two programs each
    assert lean_programs(32, 32, 512, sms=132) == 1024  # more groups than slots: one each
    assert lean_programs(1, 2, 3, sms=132) == 6  # at most one page per program


@pytest.mark.gpu
@pytest.mark.skipif(ta.INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("n, kv_heads", [(8192, 32), (65536, 32), (8192, 8), (1000, 3)])
def test_gpu_agrees_with_flash_decode_at_scale(n, kv_heads):
    gen = torch.Generator(device="cuda").manual_seed(n + kv_heads)
    pages, page, d = -(-n // 16), 16, 128
    q_heads = 32 if 32 % kv_heads == 0 else kv_heads
    q = torch.randn(2, q_heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(
        2 * pages, page, kv_heads, d, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    v = torch.randn_like(k)
    table = torch.randperm(2 * pages, device="cuda", generator=gen).view(2, pages).to(torch.int32)
    lens = torch.tensor([n, n // 3], device="cuda", dtype=torch.int32)  # ragged
    ref_out, ref_lse = flash_decode(q, k, v, table, lens)
    for pdl in (False, True):
        out, lse = flash_decode_lean(q, k, v, table, lens, pdl=pdl)
        torch.cuda.synchronize()
        assert torch.allclose(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
        assert torch.allclose(lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_a_group_that_meets_three_programs():
    # 3 groups of 5 pages over 5 programs of 3 pages: group 1 (pages 5..9) is read by programs
    # 1 (3..5), 2 (6..8) and 3 (9..11): ceil(P / G) + 1 = 3 partials to merge for it
    case = DecodeCase("three", 6, 3, 16, 16, (80,), 1, "float32", seed=9)
    out, lse, ref = _run(case, num_programs=5)
    _assert_close(out, lse, ref, _tol("float32"))
