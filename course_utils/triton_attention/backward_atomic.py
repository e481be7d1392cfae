"""A backward variant with dQ accumulated by atomic adds: five matrix products per tile pair.

The course backward (`backward.py`) computes dK, dV in one kernel and dQ in another, and both
recompute S = Q K^T and dP = dO V^T: seven N^2 d products where the gradients need five. Here one
kernel does all of it, FlashAttention-2's original way: each program keeps its key tile K_j, V_j
on chip, streams the query tiles past it, accumulates dK_j and dV_j in registers as before, and
adds its share of every query tile's gradient,

    dQ_i += tau dS_ij K_j        (BLOCK_M, d) fp32, by tl.atomic_add into an fp32 dQ in HBM,

so the programs of all the key tiles sum into one dQ. The price: N/BLOCK_N atomic read-modify-
writes of every dQ element (4 bytes each) instead of one store, a zeroed fp32 buffer, a cast at
the end, and a sum whose order is not fixed (dQ may differ between two runs in its last bits).

    flash_attention_bwd_atomic(do, q, k, v, out, lse, causal, softmax_scale, tma=False)
                             -> (dq, dk, dv); tma=True adds each dQ tile with one TMA bulk
                             reduce-add through a tensor descriptor (Hopper on)
    FlashAttentionAtomicDQ   torch.autograd.Function: the course forward, this backward
    FlashAttentionTmaDQ      the same with tma=True

A benchmark variant (issue 19), not the kernel the notebooks teach, and measured slower than the
course backward on an H200 (docs/journal.md, "Backward variants"): thread atomics at 0.91 of
it, TMA reduce-adds at 0.96 (geometric means over 12 points), so the autograd function keeps the
three kernels.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from course_utils._validate import softmax_scale_or_default
from course_utils.triton_attention import INTERPRETER
from course_utils.triton_attention.backward import (
    DKDV_FAMILIES,
    INTERPRETER_DKDV_CONFIG,
    PREPROCESS_BLOCK_M,
    _all_configs,
    _attn_bwd_preprocess_kernel,
    _check_backward_inputs,
    _launch_options,
    _load_query_tile,
    _load_rows,
    _pruner,
    _query_phases,
    _store_rows,
)
from course_utils.triton_attention.forward import (
    LOG2E,
    _bind_cuda_context,
    launch_flash_attention_fwd,
)


@triton.jit
def _atomic_inner(
    dk, dv, k, v,  # (BLOCK_N, BLOCK_D): the key tile's accumulators (fp32) and its K, V
    q_src, do_src, lse_src, delta_src,  # this head's Q, dO, lse and D
    dq_src,  # this head's fp32 dQ, or with DQ_TMA the (B*H, seqlen_q, d) descriptor of all of it
    bh, lo, hi, offs_n, seqlen_q, softmax_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    DQ_TMA: tl.constexpr,  # add dQ by the copy engine (a TMA reduce-add), not thread by thread
):  # fmt: skip
    """Stream query tiles lo..hi past k, v: accumulate dK, dV; add tau dS K into dQ."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta = _load_query_tile(
            q_src, do_src, lse_src, delta_src, start_m, seqlen_q, HEAD_DIM, BLOCK_D, BLOCK_M, MASKED
        )  # read 2 * BLOCK_M * d + 2 * BLOCK_M
        s_t = tl.dot(k, tl.trans(q)) * qk_scale  # S^T, (BLOCK_N, BLOCK_M), log2 units
        if MASKED:
            visible = offs_m[None, :] < seqlen_q
            if CAUSAL:
                visible = visible & (offs_m[None, :] >= offs_n[:, None])
            s_t = tl.where(visible, s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634)  # P^T
        dv = tl.dot(p_t.to(do.dtype), do, dv)  # dV_j += P^T dO
        dp_t = tl.dot(v, tl.trans(do))  # dP^T = V dO^T
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)  # dS^T
        dk = tl.dot(ds_t, q, dk)  # dK_j += dS^T Q
        dq = tl.dot(tl.trans(ds_t), k) * softmax_scale  # tau dS K_j, (BLOCK_M, BLOCK_D) fp32
        if DQ_TMA:
            # one bulk reduce-add of the tile; rows past seqlen_q, columns past d are dropped
            dq_src.atomic_add([bh.to(tl.int32), start_m, 0], dq.reshape(1, BLOCK_M, BLOCK_D))
        elif MASKED or BLOCK_D != HEAD_DIM:
            dq_ptrs = dq_src + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            in_bounds = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(dq_ptrs, dq, mask=in_bounds, sem="relaxed")  # RMW BLOCK_M*d fp32
        else:
            dq_ptrs = dq_src + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd_atomic_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,  # (B*H, N, HEAD_DIM) each, contiguous
    lse_ptr, delta_ptr,  # (B*H, seqlen_q) fp32
    dk_ptr, dv_ptr,  # (B*H, seqlen_k, HEAD_DIM) outputs, k's dtype
    dq_ptr,  # (B*H, seqlen_q, HEAD_DIM) fp32, zeroed: every key tile adds into it (or its
    #          descriptor, with DQ_TMA)
    seqlen_q, seqlen_k, softmax_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per program; BLOCK_N % BLOCK_M == 0 when CAUSAL
    CAUSAL: tl.constexpr,
    DQ_TMA: tl.constexpr,
):  # fmt: skip
    """dK, dV of BLOCK_N keys of one head, and their part of dQ: program (key tile, b*H + h)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    q_off = bh * seqlen_q * HEAD_DIM
    q_src, do_src = q_ptr + q_off, do_ptr + q_off
    if DQ_TMA:
        dq_src = dq_ptr
    else:
        dq_src = dq_ptr + q_off
    lse_src = lse_ptr + bh * seqlen_q
    delta_src = delta_ptr + bh * seqlen_q
    kv_off = bh * seqlen_k * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(k_ptr + kv_off, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True)
    v = _load_rows(v_ptr + kv_off, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    diag_end, full_start, full_end, ragged_start = _query_phases(
        start_n, seqlen_q, BLOCK_M, BLOCK_N, CAUSAL
    )
    if CAUSAL:
        dk, dv = _atomic_inner(
            dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, bh, start_n, diag_end, offs_n,
            seqlen_q, softmax_scale, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True, DQ_TMA,
        )  # fmt: skip
    dk, dv = _atomic_inner(
        dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, bh, full_start, full_end, offs_n,
        seqlen_q, softmax_scale, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, False, DQ_TMA,
    )  # fmt: skip
    dk, dv = _atomic_inner(
        dk, dv, k, v, q_src, do_src, lse_src, delta_src, dq_src, bh, ragged_start, seqlen_q, offs_n,
        seqlen_q, softmax_scale, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True, DQ_TMA,
    )  # fmt: skip
    # keys past seqlen_k (zeros) added nothing to dQ: their scores were masked or their k is 0
    dk = dk * softmax_scale
    _store_rows(dk_ptr + kv_off, dk.to(k.dtype), start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)
    _store_rows(dv_ptr + kv_off, dv.to(v.dtype), start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)


def _prepare_dq(nargs: dict) -> None:
    """Before each launch of a config: zero the fp32 dQ (every launch adds into it) and, for a
    descriptor, give it the config's tile."""
    dq = nargs["dq_ptr"]
    if nargs["DQ_TMA"]:
        dq.block_shape = [1, nargs["BLOCK_M"], nargs["BLOCK_D"]]
        dq.base.zero_()
    else:
        dq.zero_()


@functools.cache
def _autotuned_kernel():
    """The kernel in triton.autotune over the dK/dV kernel's families (GPU only)."""
    configs = [
        triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages,
                      pre_hook=_prepare_dq)
        for c in _all_configs(DKDV_FAMILIES)
    ]  # fmt: skip
    return triton.autotune(
        configs=configs,
        key=["seqlen_q", "seqlen_k", "HEAD_DIM", "CAUSAL", "DQ_TMA"],
        prune_configs_by={"early_config_prune": _pruner(DKDV_FAMILIES, "BLOCK_N")},
    )(_attn_bwd_atomic_kernel)


def flash_attention_bwd_atomic(
    do, q, k, v, out, lse, causal: bool = False, softmax_scale: float | None = None, *,
    config: triton.Config | None = None, tma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Gradients (dq, dk, dv) as `backward.flash_attention_bwd`, in one gradient kernel.

    Args and shapes as flash_attention_bwd; `config` (backward.make_config) for the kernel,
    autotuned on a GPU when None; tma: add dQ with the copy engine's reduce-add through a tensor
    descriptor (Hopper and later). Extra memory: an fp32 dQ of q's shape.
    """
    _check_backward_inputs(do, q, k, v, out, lse, causal)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    scale = float(softmax_scale_or_default(softmax_scale, d))
    if q.numel() == 0 or n_k == 0:
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if INTERPRETER and q.dtype == torch.bfloat16:  # the interpreter computes bfloat16 wrongly
        grads = flash_attention_bwd_atomic(
            *(t.float() for t in (do, q, k, v, out)), lse, causal, scale, config=config, tma=tma
        )
        return tuple(g.to(torch.bfloat16) for g in grads)
    do, q, k, v, out = (t.contiguous() for t in (do, q, k, v, out))
    lse = lse.contiguous()
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # zeroed by _prepare_dq
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    bh = batch * heads
    block_d = max(16, triton.next_power_of_2(d))
    _attn_bwd_preprocess_kernel[(triton.cdiv(n_q, PREPROCESS_BLOCK_M), bh)](
        out, do, delta, n_q, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=PREPROCESS_BLOCK_M
    )
    dq_arg = dq32
    if tma:
        if INTERPRETER:
            raise ValueError("tma=True needs a Hopper GPU (sm_90) or newer")
        _bind_cuda_context(q.device)
        dq_arg = TensorDescriptor(dq32, [bh, n_q, d], [n_q * d, d, 1], [1, 1, 1])
    args = (q, k, v, do, lse, delta, dk, dv, dq_arg, n_q, n_k, scale, scale * LOG2E)
    constants = {"HEAD_DIM": d, "BLOCK_D": block_d, "CAUSAL": causal, "DQ_TMA": tma}
    if INTERPRETER:
        config = config or INTERPRETER_DKDV_CONFIG
    if config is None:
        grid = lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), bh)  # noqa: E731
        _autotuned_kernel()[grid](*args, **constants)
    else:
        if causal and config.kwargs["BLOCK_N"] % config.kwargs["BLOCK_M"]:
            raise ValueError(f"causal needs BLOCK_N to be a multiple of BLOCK_M, got {config}")
        grid = (triton.cdiv(n_k, config.kwargs["BLOCK_N"]), bh)
        _prepare_dq({"dq_ptr": dq_arg, **constants, **config.kwargs})
        _attn_bwd_atomic_kernel[grid](*args, **constants, **_launch_options(config))
    return dq32.to(q.dtype), dk, dv


def _save_forward(ctx, q, k, v, causal, softmax_scale, tma):
    out, lse = launch_flash_attention_fwd(q, k, v, causal, softmax_scale)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.softmax_scale, ctx.tma = causal, softmax_scale, tma
    return out


class FlashAttentionAtomicDQ(torch.autograd.Function):
    """The course forward; the backward by `flash_attention_bwd_atomic` (one gradient kernel)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None):
        return _save_forward(ctx, q, k, v, causal, softmax_scale, tma=False)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_bwd_atomic(
            dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale, tma=ctx.tma
        )
        return dq, dk, dv, None, None


class FlashAttentionTmaDQ(FlashAttentionAtomicDQ):
    """As FlashAttentionAtomicDQ, with dQ added by TMA reduce-adds (Hopper and later)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None):
        return _save_forward(ctx, q, k, v, causal, softmax_scale, tma=True)
