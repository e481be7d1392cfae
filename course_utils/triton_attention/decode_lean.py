"""Flash-decoding with every SM given the same work: the cache split by pages across a fixed grid.

`decode.flash_decode` gives each (sequence, KV head) num_splits chunks, so its grid is
batch * kv_heads * num_splits programs. On a GPU of 132 SMs that hold four programs each, 32 KV
heads split 16 ways make 512 programs: 116 SMs run four and 16 run three, and the step lasts as
long as the SMs with four. No integer split fills 528 slots evenly. This variant (the idea of
LeanAttention and of stream-K matrix products) lays every group's pages end to end,

    unit u = g * max_pages + j     (group g = b * kv_heads + kv_head, its logical page j),

U = batch * kv_heads * max_pages units in all, and hands program p of P the units
[p * U // P, (p + 1) * U // P): every program gets the same number of pages, within one. With
P >= batch * kv_heads a program's range is at most max_pages long, so it touches one group or the
end of one and the start of the next: two segments, two partials (out, lse), the second empty
when the range stays in one group. The merge kernel finds the programs that touched its group,

    p(u) = ceil((u + 1) * P / U) - 1     (the program holding unit u),

from p(g * max_pages) to p((g + 1) * max_pages - 1), takes from each the segment that was g's
(the first if the program started in g, else the second), and merges them by lse as
`decode._decode_merge_kernel` does. Traffic: the same K and V bytes as flash_decode; partials
2 * P * group * (d + 1) floats written and read.

    flash_decode_lean(q, k_cache, v_cache, block_table, seq_lens) -> (out, lse)

Inputs, outputs and errors are flash_decode's (`decode.check_decode_inputs`). The work estimate is
the block table's width, as for flash_decode's splits (no device sync): sequences shorter than
max_pages leave their programs part idle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validate import softmax_scale_or_default
from . import INTERPRETER
from .decode import (
    FEW_SEQUENCES_TUNING,
    LOG2E,
    MIN_ROWS,
    _positive_int,
    check_decode_inputs,
    chunk_partial,
    num_sms,
    pdl_supported,
    tile_size,
)


@triton.jit
def _lean_partials_kernel(
    q_ptr,  # (batch, q_heads, d)
    k_ptr,  # (num_pages, page_size, kv_heads, d)
    v_ptr,
    table_ptr,  # (batch, max_pages) int32
    seq_lens_ptr,  # (batch,) int32
    out_part_ptr,  # (P, 2, GROUP, d) float32: each program's two segments
    lse_part_ptr,  # (P, 2, GROUP) float32
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_tb,
    kv_heads,
    max_pages,  # units per group
    total_units,  # U = batch * kv_heads * max_pages
    num_programs,  # P
    qk_scale,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The partials of program p's units: segment 0 in the group it starts in, segment 1 in the
    next group (empty if the range ends in the first)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    p = tl.program_id(0).to(tl.int64)
    first = p * total_units // num_programs  # int64: U * P may pass 2**31
    last = (p + 1) * total_units // num_programs  # one past the last unit
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    g0 = first // max_pages
    for seg in range(2):
        g = g0 + seg
        lo = tl.maximum(first, g * max_pages) - g * max_pages  # the segment's pages in group g
        hi = tl.minimum(last, (g + 1) * max_pages) - g * max_pages
        valid = hi > lo  # segment 1 of a range inside one group is empty (and g may be past G)
        g_safe = tl.where(valid, g, g0)
        b = g_safe // kv_heads
        kv_head = g_safe % kv_heads
        seq_len = tl.load(seq_lens_ptr + b)
        chunk_start = lo * PAGE_SIZE
        chunk_end = tl.where(valid, tl.minimum(hi * PAGE_SIZE, seq_len), chunk_start)
        heads = kv_head * GROUP + offs_h
        q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=h_mask[:, None] & d_mask[None, :], other=0.0)
        out, lse = chunk_partial(
            q, table_ptr + b * stride_tb, k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh,
            chunk_start, chunk_end, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
            BLOCK_H, HEAD_DIM, BLOCK_D, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        row = (p * 2 + seg) * GROUP + offs_h  # (p, seg, head in group)
        tl.store(lse_part_ptr + row, lse, mask=h_mask)
        out_ptrs = out_part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(out_ptrs, out, mask=h_mask[:, None] & d_mask[None, :])


@triton.jit
def _lean_merge_kernel(
    out_part_ptr,  # (P, 2, GROUP, d) float32
    lse_part_ptr,  # (P, 2, GROUP)
    out_ptr,  # (batch, q_heads, d), q's dtype
    lse_ptr,  # (batch * q_heads,) float32
    stride_ob,
    stride_oh,
    q_heads,
    max_pages,
    total_units,
    num_programs,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # at least the most programs one group's units can meet
    USE_PDL: tl.constexpr,
):
    """out and lse of one (sequence, query head) from the segments of the programs that read its
    group's pages."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # b * q_heads + h
    b = row // q_heads
    h = row % q_heads
    g = row // GROUP  # = b * kv_heads + h // GROUP, since q_heads = kv_heads * GROUP
    u_lo = g * max_pages
    u_hi = u_lo + max_pages - 1
    p_lo = ((u_lo + 1) * num_programs + total_units - 1) // total_units - 1
    p_hi = ((u_hi + 1) * num_programs + total_units - 1) // total_units - 1
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    progs = p_lo + offs_s
    s_mask = progs <= p_hi
    starts_here = (progs * total_units // num_programs) // max_pages == g
    seg = tl.where(starts_here, 0, 1)
    part = (progs * 2 + seg) * GROUP + h % GROUP  # (BLOCK_S,) rows of the partials
    lse_s = tl.load(lse_part_ptr + part, mask=s_mask, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every segment empty: weights exp(-inf) = 0
    w = tl.math.exp2((lse_s - m_safe) * 1.4426950408889634)
    total = tl.sum(w, 0)
    o_ptrs = out_part_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
    o_s = tl.load(o_ptrs, mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    total_safe = tl.where(total > 0, total, 1.0)
    out = tl.sum(w[:, None] * o_s, 0) / total_safe
    lse = tl.where(total > 0, m_safe + tl.log(total_safe), float("-inf"))
    tl.store(lse_ptr + row, lse)
    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def lean_programs(batch: int, kv_heads: int, max_pages: int, sms: int | None = None) -> int:
    """P: FEW_SEQUENCES_TUNING's programs_per_sm on every SM, at least one per group (so a
    program's range touches at most two groups) and at most one page each."""
    sms = num_sms() if sms is None else sms
    groups = batch * kv_heads
    wanted = int(FEW_SEQUENCES_TUNING["programs_per_sm"] * sms)
    return max(groups, min(wanted, groups * max_pages))


def flash_decode_lean(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float | None = None,
    num_programs: int | None = None,
    *,
    tile_tokens: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    check_values: bool = True,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_decode with the pages split evenly over a fixed grid of num_programs programs.

    Args:
        q, k_cache, v_cache, block_table, seq_lens, softmax_scale, check_values, pdl: as in
            `decode.flash_decode`.
        num_programs: P, at least batch * kv_heads and at most batch * kv_heads * max_pages;
            default `lean_programs` (4 per SM).
        tile_tokens, num_warps, num_stages: the launch, default FEW_SEQUENCES_TUNING's.

    Returns:
        out (batch, q_heads, d) in q's dtype, lse (batch, q_heads) float32, as flash_decode.
    """
    batch, q_heads, kv_heads, d, _, page_size, max_pages = check_decode_inputs(
        q, k_cache, v_cache, block_table, seq_lens, check_values=check_values
    )
    tau = float(softmax_scale_or_default(softmax_scale, d))
    groups = batch * kv_heads
    units = groups * max_pages
    if num_programs is None:
        num_programs = lean_programs(batch, kv_heads, max_pages)
    num_programs = _positive_int(num_programs, "num_programs")
    if batch and max_pages and not groups <= num_programs <= units:
        raise ValueError(
            f"num_programs must be between batch * kv_heads = {groups} and batch * kv_heads * "
            f"max_pages = {units}, got {num_programs}"
        )
    tuning = FEW_SEQUENCES_TUNING
    block_n = tile_size(page_size, None, tile_tokens, tuning["tile_tokens"])
    num_warps = _positive_int(num_warps or tuning["num_warps"], "num_warps")
    num_stages = _positive_int(num_stages or tuning["num_stages"], "num_stages")
    pdl = pdl_supported(q.device) if pdl is None else bool(pdl)
    if pdl and not pdl_supported(q.device):
        raise ValueError("pdl=True needs a CUDA GPU of compute capability 9.0 or later")

    out = torch.empty_like(q)
    lse = torch.empty((batch, q_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    if max_pages == 0:  # no token anywhere: empty sums
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if INTERPRETER and q.dtype == torch.bfloat16:  # the interpreter gets bfloat16 wrong
        out32, lse = flash_decode_lean(
            q.float(), k_cache.float(), v_cache.float(), block_table, seq_lens, tau,
            num_programs, tile_tokens=block_n, check_values=False,
        )  # fmt: skip
        return out32.to(q.dtype), lse

    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_table = block_table.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    group = q_heads // kv_heads
    out_part = torch.empty((num_programs, 2, group, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((num_programs, 2, group), dtype=torch.float32, device=q.device)
    _lean_partials_kernel[(num_programs,)](
        q, k_cache, v_cache, block_table, seq_lens, out_part, lse_part,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), kv_heads, max_pages, units, num_programs, tau * LOG2E,
        GROUP=group, BLOCK_H=max(MIN_ROWS, triton.next_power_of_2(group)), HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)), PAGE_SIZE=page_size, BLOCK_N=block_n,
        USE_PDL=pdl, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    most = -(-num_programs // groups) + 1  # programs one group's max_pages units can meet
    _lean_merge_kernel[(batch * q_heads,)](
        out_part, lse_part, out, lse, out.stride(0), out.stride(1), q_heads, max_pages, units,
        num_programs, GROUP=group, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_S=max(2, triton.next_power_of_2(most)), USE_PDL=pdl, num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out, lse
