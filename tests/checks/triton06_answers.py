"""Notebook 06's puzzle answers as the solution writes them, and right answers in other styles.

Imported by tests/checks/test_checks_triton_forward_puzzles.py
(after course_utils.triton_attention, which turns
on the interpreter without a GPU). Each kernel here is what a learner could hand in.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import course_utils.triton_attention as ta
from course_utils.harness.triton_puzzles import check_attention_inputs
from course_utils.triton_attention.config import tile_config

LOG2E = 1.4426950408889634


# ---- puzzle 1: masked load and store of a ragged 2-D tile ---------------------------------------
@triton.jit
def scale_tile_kernel(
    x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, alpha,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], alpha * x, mask=mask)


# ---- puzzle 2: a numerically stable softmax per row ---------------------------------------------
@triton.jit
def softmax_rows_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=float("-inf"))
    p = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride_y + cols, p / tl.sum(p, 0), mask=cols < n_cols)


# ---- puzzle 3: a matmul tile with ragged edges --------------------------------------------------
@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + offs_m[:, None] * stride_am + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :],
            mask=(offs_k[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask=mask)


# ---- puzzle 4: one query tile's online softmax over K/V tiles ------------------------------------
@triton.jit
def row_block_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, seqlen_k, stride_q, stride_k, stride_v, stride_o, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_q + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seqlen_k, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = offs_n[:, None] < seqlen_k
        k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + offs_n[:, None] * stride_v + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(offs_n[None, :] < seqlen_k, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + offs_m[:, None] * stride_o + offs_d[None, :], out)


# ---- the whole forward: kernel and launcher (every K/V tile masked; the solution notebook's
# kernel loads full tiles without a mask: test_checks_triton_forward_puzzles.py checks both) ---
@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    num_heads, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // num_heads).to(tl.int64)
    off_h = (bh % num_heads).to(tl.int64)
    q_ptr += off_b * stride_qb + off_h * stride_qh
    k_ptr += off_b * stride_kb + off_h * stride_kh
    v_ptr += off_b * stride_vb + off_h * stride_vh
    out_ptr += off_b * stride_ob + off_h * stride_oh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_qn + offs_d[None, :], mask=q_mask, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        full_end = pid_m * BLOCK_M  # tiles wholly left of the diagonal
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seqlen_k)  # the diagonal block's end
    else:
        full_end = (seqlen_k // BLOCK_N) * BLOCK_N
        hi = seqlen_k
    for phase in tl.static_range(2):
        lo = 0 if phase == 0 else full_end
        end = full_end if phase == 0 else hi
        for start_n in range(lo, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(
                k_ptr + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0
            )
            v = tl.load(
                v_ptr + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0
            )
            s = tl.dot(q, tl.trans(k)) * qk_scale
            if phase == 1:
                visible = offs_n[None, :] < seqlen_k
                if CAUSAL:
                    visible = visible & (offs_n[None, :] <= offs_m[:, None])
                s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

    out = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634
    tl.store(lse_ptr + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)
    out_ptrs = out_ptr + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def attention_fwd(q, k, v, causal=False, softmax_scale=None):
    check_attention_inputs(q, k, v, causal)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if ta.INTERPRETER and q.dtype == torch.bfloat16:  # the interpreter gets bf16 wrong
        out, lse = attention_fwd(q.float(), k.float(), v.float(), causal, softmax_scale)
        return out.to(torch.bfloat16), lse
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if n_k == 0 or n_q == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if ta.INTERPRETER:
        block_m, block_n, warps, stages = 64, 64, 4, 1  # fewer, larger tiles: faster here
    else:
        capability = torch.cuda.get_device_capability(q.device)
        block_m, block_n, warps, stages = tile_config(capability, d, q.dtype)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    attention_fwd_kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        heads, n_q, n_k, softmax_scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out, lse
