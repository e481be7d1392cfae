"""FlashAttention-2 backward pass in Triton: recompute P from lse instead of storing it.

Three kernels, no atomics, each output written once:

    _attn_bwd_preprocess_kernel   D_i = rowsum(dO_i * O_i), fp32         one program per query tile
    _attn_bwd_dkdv_kernel         dK_j, dV_j: K_j and V_j stay on chip,  one program per key tile
                                  the query tiles stream past them
    _attn_bwd_dq_kernel           dQ_i: Q_i and dO_i stay on chip,        one program per query tile
                                  the key tiles stream past them

For a query tile i and a key tile j (tau = softmax_scale; Dao 2023, Algorithm 2):

    P_ij  = exp(tau Q_i K_j^T - lse_i)      recomputed, in exp2 form: exp2(s * tau * log2(e) - lse2)
    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - D_i)            the softmax backward; D_i = rowsum(dO_i * O_i)
    dQ_i += tau dS_ij K_j                   (dq kernel)
    dK_j += tau dS_ij^T Q_i                 (dkdv kernel)

Splitting dQ from dK, dV costs two extra matrix products per tile pair (S and dP are computed in
both kernels: 7 products instead of 5) but needs neither atomics nor a second pass over an fp32
dQ buffer. With causal=True the tiles above the diagonal are skipped and only the diagonal blocks
are masked (the loops run in two phases, as in the forward). Any N (the ragged last tile is
masked), any d in 16..256 (padded with zeros to a power of two), float16, bfloat16 and float32.

HBM traffic per head, N queries and keys, tiles Br x Bc: the dkdv kernel reads K, V once and
Q, dO, lse, D once per key tile (N/Bc times) and writes dK, dV once; the dq kernel reads Q, dO,
lse, D once and K, V once per query tile (N/Br times) and writes dQ once. Nothing of size N x N.

The kernels read contiguous (batch, heads, N, d) tensors: `flash_attention_bwd` copies any other
layout first (a copy of each input, cheap next to the N^2 d work).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from course_utils._validate import softmax_scale_or_default
from course_utils.harness.triton_interpreter import INTERPRETER
from course_utils.triton_attention.config import (
    DKDV_FAMILIES,
    DQ_FAMILIES,
    check_dtype_for,
    tile_config,
)
from course_utils.triton_attention.config import family as _family
from course_utils.triton_attention.forward import LOG2E, _check_inputs


@triton.jit
def _load_rows(
    ptr,  # one head's contiguous (n_rows, HEAD_DIM) matrix
    row,  # first row of the tile
    n_rows,  # rows of the matrix
    BLOCK_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    CHECK_ROWS: tl.constexpr,  # the tile may run past the last row
):
    """The (BLOCK_ROWS, BLOCK_D) tile at `row`, zero outside the matrix."""
    rows = row + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    ptrs = ptr + rows[:, None] * HEAD_DIM + cols[None, :]
    if CHECK_ROWS or BLOCK_D != HEAD_DIM:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
    return tl.load(ptrs)  # every element inside: no mask, the widest loads


@triton.jit
def _store_rows(
    ptr, tile, row, n_rows,
    BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Write the part of the (BLOCK_ROWS, BLOCK_D) `tile` that lies inside the matrix."""
    rows = row + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
    tl.store(ptr + rows[:, None] * HEAD_DIM + cols[None, :], tile, mask=mask)


@triton.jit
def _attn_bwd_preprocess_kernel(
    out_ptr,  # (B*H, seqlen_q, HEAD_DIM) forward output, contiguous
    do_ptr,  # (B*H, seqlen_q, HEAD_DIM) dO = dLoss/dout, contiguous
    delta_ptr,  # (B*H, seqlen_q) fp32: D_i = sum_k dO_ik O_ik
    seqlen_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """D for BLOCK_M rows of one head: read 2*BLOCK_M*d, write BLOCK_M."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # int64: B*H*N*d may pass 2**31
    head = bh * seqlen_q * HEAD_DIM
    o = _load_rows(out_ptr + head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True)
    do = _load_rows(do_ptr + head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    tl.store(delta_ptr + bh * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_query_tile(
    q_src, do_src, lse_src, delta_src,  # one head's Q, dO (seqlen_q, HEAD_DIM), lse, D (seqlen_q,)
    start_m, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,  # the tile may run past seqlen_q
):  # fmt: skip
    """Q_i, dO_i (BLOCK_M, BLOCK_D) and lse_i, D_i (BLOCK_M,) of the query tile at start_m."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(q_src, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED)
    do = _load_rows(do_src, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED)
    if MASKED:
        lse = tl.load(lse_src + offs_m, mask=offs_m < seqlen_q, other=0.0)
        delta = tl.load(delta_src + offs_m, mask=offs_m < seqlen_q, other=0.0)
    else:
        lse = tl.load(lse_src + offs_m)
        delta = tl.load(delta_src + offs_m)
    return q, do, lse, delta


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,  # (BLOCK_N, BLOCK_D) fp32: sum_i dS_ij^T Q_i, not yet times softmax_scale
    dv,  # (BLOCK_N, BLOCK_D) fp32: sum_i P_ij^T dO_i
    k,  # (BLOCK_N, BLOCK_D) this program's keys, input dtype
    v,  # (BLOCK_N, BLOCK_D) this program's values
    q_src,  # this head's queries (seqlen_q, HEAD_DIM)
    do_src,  # this head's dO
    lse_src,  # this head's lse (seqlen_q,), natural log
    delta_src,  # this head's D (seqlen_q,)
    lo,  # first query of this phase (a multiple of BLOCK_M)
    hi,  # one past the last query of this phase
    offs_n,  # (BLOCK_N,) key indices of this tile
    seqlen_q,
    qk_scale,  # softmax_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,  # the diagonal block, or queries past seqlen_q
):
    """Stream query tiles lo..hi past the keys k and values v; accumulate dK and dV."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta = _load_query_tile(
            q_src, do_src, lse_src, delta_src, start_m, seqlen_q, HEAD_DIM, BLOCK_D, BLOCK_M, MASKED
        )  # read 2 * BLOCK_M * d + 2 * BLOCK_M
        # Transposed scores, keys along rows: (BLOCK_N, BLOCK_M), so P^T feeds dV = P^T dO as is.
        s_t = tl.dot(k, tl.trans(q)) * qk_scale  # log2 units
        if MASKED:
            visible = offs_m[None, :] < seqlen_q
            if CAUSAL:
                visible = visible & (offs_m[None, :] >= offs_n[:, None])
            s_t = tl.where(visible, s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634)  # P^T, no max, no sum
        dv = tl.dot(p_t.to(do.dtype), do, dv)  # dV_j += P^T dO
        dp_t = tl.dot(v, tl.trans(do))  # dP^T = V dO^T, (BLOCK_N, BLOCK_M) fp32
        ds_t = p_t * (dp_t - delta[None, :])  # dS^T = P^T * (dP^T - D)
        dk = tl.dot(ds_t.to(q.dtype), q, dk)  # dK_j += dS^T Q
    return dk, dv


@triton.jit
def _query_phases(start_n, seqlen_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):  # fmt: skip
    """The query ranges a key tile at start_n streams: (diag_end, full_start, full_end,
    ragged_start). Causal: queries below start_n see none of its keys (skipped); the diagonal
    block, queries start_n .. diag_end, is masked; the queries after it see every key. Then the
    unmasked query tiles full_start .. full_end and the ragged last one, from ragged_start.
    """
    full_end = (seqlen_q // BLOCK_M) * BLOCK_M  # query tiles that lie inside seqlen_q
    if CAUSAL:
        diag_end = tl.minimum(start_n + BLOCK_N, seqlen_q)
        full_start = start_n + BLOCK_N
        ragged_start = tl.maximum(full_start, full_end)
    else:
        diag_end = start_n
        full_start = 0
        ragged_start = full_end
    return diag_end, full_start, full_end, ragged_start


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr,  # (B*H, seqlen_q, HEAD_DIM) queries, contiguous
    k_ptr,  # (B*H, seqlen_k, HEAD_DIM) keys, contiguous
    v_ptr,  # (B*H, seqlen_k, HEAD_DIM) values, contiguous
    do_ptr,  # (B*H, seqlen_q, HEAD_DIM) dO, contiguous
    lse_ptr,  # (B*H, seqlen_q) fp32 from the forward, natural log
    delta_ptr,  # (B*H, seqlen_q) fp32 D from the preprocess kernel
    dk_ptr,  # (B*H, seqlen_k, HEAD_DIM) output, k's dtype
    dv_ptr,  # (B*H, seqlen_k, HEAD_DIM) output
    seqlen_q,
    seqlen_k,
    softmax_scale,  # tau: dK = tau * sum dS^T Q
    qk_scale,  # tau * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per program; BLOCK_N % BLOCK_M == 0 when CAUSAL
    CAUSAL: tl.constexpr,  # query i sees keys 0..i only (seqlen_q == seqlen_k)
):
    """dK and dV for BLOCK_N keys of one head: program (key tile, b * H + h)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    q_src = q_ptr + bh * seqlen_q * HEAD_DIM
    do_src = do_ptr + bh * seqlen_q * HEAD_DIM
    lse_src = lse_ptr + bh * seqlen_q
    delta_src = delta_ptr + bh * seqlen_q
    kv_off = bh * seqlen_k * HEAD_DIM

    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(k_ptr + kv_off, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True)  # once
    v = _load_rows(v_ptr + kv_off, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True)  # once
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Keys past seqlen_k were loaded as zeros; their rows of dK, dV are computed but not stored.
    diag_end, full_start, full_end, ragged_start = _query_phases(
        start_n, seqlen_q, BLOCK_M, BLOCK_N, CAUSAL
    )
    if CAUSAL:
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_src, do_src, lse_src, delta_src, start_n, diag_end, offs_n,
            seqlen_q, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True,
        )  # fmt: skip
    dk, dv = _attn_bwd_dkdv_inner(
        dk, dv, k, v, q_src, do_src, lse_src, delta_src, full_start, full_end, offs_n,
        seqlen_q, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, False,
    )  # fmt: skip
    dk, dv = _attn_bwd_dkdv_inner(
        dk, dv, k, v, q_src, do_src, lse_src, delta_src, ragged_start, seqlen_q, offs_n,
        seqlen_q, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True,
    )  # the ragged last query tile  # fmt: skip

    dk = dk * softmax_scale
    _store_rows(dk_ptr + kv_off, dk.to(k.dtype), start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)
    _store_rows(dv_ptr + kv_off, dv.to(v.dtype), start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dq_inner(
    dq,  # (BLOCK_M, BLOCK_D) fp32: sum_j dS_ij K_j, not yet times softmax_scale
    q,  # (BLOCK_M, BLOCK_D) this program's queries
    do,  # (BLOCK_M, BLOCK_D) this program's dO
    lse2,  # (BLOCK_M,) lse in log2 units
    delta,  # (BLOCK_M,) D
    k_src,  # this head's keys (seqlen_k, HEAD_DIM)
    v_src,  # this head's values
    lo,  # first key of this phase (a multiple of BLOCK_N)
    hi,  # one past the last key of this phase
    offs_m,  # (BLOCK_M,) query indices of this tile
    seqlen_k,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,  # the diagonal block, or keys past seqlen_k
):
    """Stream key/value tiles lo..hi past the queries q; accumulate dQ."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(k_src, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED)  # BLOCK_N*d
        v = _load_rows(v_src, start_n, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED)  # BLOCK_N*d
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < seqlen_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        p = tl.math.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v))  # dP = dO V^T
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)  # dQ_i += dS K
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr,  # (B*H, seqlen_q, HEAD_DIM) queries, contiguous
    k_ptr,  # (B*H, seqlen_k, HEAD_DIM) keys, contiguous
    v_ptr,  # (B*H, seqlen_k, HEAD_DIM) values, contiguous
    do_ptr,  # (B*H, seqlen_q, HEAD_DIM) dO, contiguous
    lse_ptr,  # (B*H, seqlen_q) fp32, natural log
    delta_ptr,  # (B*H, seqlen_q) fp32 D
    dq_ptr,  # (B*H, seqlen_q, HEAD_DIM) output, q's dtype
    seqlen_q,
    seqlen_k,
    softmax_scale,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program; BLOCK_M % BLOCK_N == 0 when CAUSAL
    BLOCK_N: tl.constexpr,  # keys per loop step
    CAUSAL: tl.constexpr,
):
    """dQ for BLOCK_M queries of one head: program (query tile, b * H + h)."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m  # the longest rows first, as in the forward
    start_m = start_m * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    q_off = bh * seqlen_q * HEAD_DIM
    k_src = k_ptr + bh * seqlen_k * HEAD_DIM
    v_src = v_ptr + bh * seqlen_k * HEAD_DIM

    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(q_ptr + q_off, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True)  # once
    do = _load_rows(do_ptr + q_off, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True)  # once
    in_q = offs_m < seqlen_q
    lse2 = tl.load(lse_ptr + bh * seqlen_q + offs_m, mask=in_q, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + bh * seqlen_q + offs_m, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        full_end = start_m  # keys left of the diagonal block: seen by every query of the tile
        masked_end = tl.minimum(start_m + BLOCK_M, seqlen_k)  # keys past the diagonal: skipped
    else:
        full_end = (seqlen_k // BLOCK_N) * BLOCK_N
        masked_end = seqlen_k
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, 0, full_end, offs_m, seqlen_k, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False,
    )  # fmt: skip
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, full_end, masked_end, offs_m, seqlen_k, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True,
    )  # fmt: skip

    dq = dq * softmax_scale
    _store_rows(dq_ptr + q_off, dq.to(q.dtype), start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D)


# ---------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------

PREPROCESS_BLOCK_M = 64


def make_config(block_m: int, block_n: int, num_warps: int, num_stages: int) -> triton.Config:
    """A launch configuration of either gradient kernel: tiles, warps, pipeline depth.

    dkdv kernel: BLOCK_N keys stay on chip, BLOCK_M queries per loop step.
    dq kernel: BLOCK_M queries stay on chip, BLOCK_N keys per loop step.
    """
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages
    )


INTERPRETER_DKDV_CONFIG = make_config(block_m=32, block_n=64, num_warps=4, num_stages=1)
INTERPRETER_DQ_CONFIG = make_config(block_m=64, block_n=32, num_warps=4, num_stages=1)
"""The configurations used in the interpreter (autotuning needs a GPU)."""

# The autotuning sets, (BLOCK_M, BLOCK_N, num_warps, num_stages), one family per class of
# (d, dtype), `_family`: config.DKDV_FAMILIES and config.DQ_FAMILIES (kept there so that
# config.tile_config reads them without importing these kernels), imported above.


def _config_key(c: triton.Config) -> tuple:
    return (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)


def _pruner(families: dict, resident: str):
    """early_config_prune for one kernel: the family of (d, dtype), within shared memory.

    `resident` names the tile that stays on chip ("BLOCK_N" for dkdv, "BLOCK_M" for dq); two
    tiles of it (k and v, or q and dO) stay, two tiles of the other stream, num_stages deep.
    """
    streamed = "BLOCK_M" if resident == "BLOCK_N" else "BLOCK_N"

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        dtype = args["q_ptr"].dtype
        family = set(families[_family(args["HEAD_DIM"], dtype)])
        limit = torch.cuda.get_device_properties(args["q_ptr"].device)
        limit = limit.shared_memory_per_block_optin

        def shared_bytes(c):
            rows = 2 * c.kwargs[resident] + 2 * c.num_stages * c.kwargs[streamed]
            scores = c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]  # P or dS staged for a product
            return (rows * args["BLOCK_D"] + scores) * dtype.itemsize

        keep = [
            c
            for c in configs
            if _config_key(c) in family
            and shared_bytes(c) <= limit
            and not (args["CAUSAL"] and c.kwargs[resident] % c.kwargs[streamed])
        ]
        return keep or [min(configs, key=shared_bytes)]

    return prune


def _all_configs(families: dict) -> list[triton.Config]:
    unique = dict.fromkeys(c for family in families.values() for c in family)
    return [make_config(*c) for c in unique]


@functools.cache
def _autotuned_kernels():
    """(dkdv, dq) kernels wrapped in triton.autotune, keyed on the lengths and d; GPU only."""
    key = ["seqlen_q", "seqlen_k", "HEAD_DIM", "CAUSAL"]  # triton adds the tensors' dtypes
    dkdv = triton.autotune(
        configs=_all_configs(DKDV_FAMILIES),
        key=key,
        prune_configs_by={"early_config_prune": _pruner(DKDV_FAMILIES, "BLOCK_N")},
    )(_attn_bwd_dkdv_kernel)
    dq = triton.autotune(
        configs=_all_configs(DQ_FAMILIES),
        key=key,
        prune_configs_by={"early_config_prune": _pruner(DQ_FAMILIES, "BLOCK_M")},
    )(_attn_bwd_dq_kernel)
    return dkdv, dq


# ---------------------------------------------------------------------------------------------
# Python entry points
# ---------------------------------------------------------------------------------------------


def _check_backward_inputs(do, q, k, v, out, lse, causal) -> None:
    _check_inputs(q, k, v, causal)
    for name, t in (("do", do), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"{name} must have q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                f"{q.device}, got {tuple(t.shape)}, {t.dtype}, {t.device}"
            )
    if not isinstance(lse, torch.Tensor) or lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse)
        raise ValueError(f"lse must be a float32 tensor of shape {tuple(q.shape[:3])}, got {got}")


def flash_attention_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    dkdv_config: triton.Config | None = None,
    dq_config: triton.Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of out = softmax(s q k^T) v with the FlashAttention-2 Triton backward kernels.

    P is recomputed from q, k and lse tile by tile; nothing of size N x N is stored. On a machine
    without a CUDA GPU it runs in Triton's interpreter on CPU tensors (bfloat16 is computed in
    float32 there, as in the forward).

    Args:
        do: (batch, heads, seqlen_q, d) dLoss/dout, q's dtype.
        q: (batch, heads, seqlen_q, d), k, v: (batch, heads, seqlen_k, d), as in the forward.
        out: (batch, heads, seqlen_q, d) the forward's output.
        lse: (batch, heads, seqlen_q) float32, the forward's logsumexp (natural log).
        causal, softmax_scale: as in the forward.
        dkdv_config, dq_config: triton.Configs (see `make_config`) for the two gradient kernels;
            None autotunes on a GPU from sm_80 on, takes `config.tile_config` below sm_80 (a T4)
            and the interpreter configs in the interpreter.

    Returns:
        dq: (batch, heads, seqlen_q, d), dk, dv: (batch, heads, seqlen_k, d), contiguous, q's dtype.
    """
    _check_backward_inputs(do, q, k, v, out, lse, causal)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    scale = float(softmax_scale_or_default(softmax_scale, d))
    if q.numel() == 0 or n_k == 0:  # no query, or no key: out does not depend on q, k, v
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))

    if INTERPRETER and q.dtype == torch.bfloat16:
        # Triton's interpreter computes bfloat16 wrongly, without an error: run in float32.
        grads = flash_attention_bwd(
            *(t.float() for t in (do, q, k, v, out)), lse, causal, scale,
            dkdv_config=dkdv_config, dq_config=dq_config,
        )  # fmt: skip
        return tuple(g.to(torch.bfloat16) for g in grads)

    do, q, k, v, out = (t.contiguous() for t in (do, q, k, v, out))  # (B, H, N, d), row stride d
    lse = lse.contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    bh = batch * heads
    block_d = max(16, triton.next_power_of_2(d))

    # D = rowsum(dO * O): read 2 * N * d, write N per head.
    grid = (triton.cdiv(n_q, PREPROCESS_BLOCK_M), bh)
    _attn_bwd_preprocess_kernel[grid](
        out, do, delta, n_q, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=PREPROCESS_BLOCK_M
    )

    if not INTERPRETER:
        capability = torch.cuda.get_device_capability(q.device)
        if capability < (8, 0):
            # Turing (T4) and older: no bfloat16, 64 KiB of shared memory, no tensor cores in
            # Triton. The autotuning families are sized for Hopper: fixed tiles here.
            check_dtype_for(capability, q.dtype, name="q")
            if dkdv_config is None:
                dkdv_config = make_config(*tile_config(capability, d, q.dtype, "dkdv"))
            if dq_config is None:
                dq_config = make_config(*tile_config(capability, d, q.dtype, "dq"))

    constants = {"HEAD_DIM": d, "BLOCK_D": block_d, "CAUSAL": causal}
    common = (lse, delta)
    sizes = (n_q, n_k, scale, scale * LOG2E)
    if INTERPRETER:
        dkdv_config = dkdv_config or INTERPRETER_DKDV_CONFIG
        dq_config = dq_config or INTERPRETER_DQ_CONFIG
    tilings = ((dkdv_config, "BLOCK_N", "BLOCK_M"), (dq_config, "BLOCK_M", "BLOCK_N"))
    for cfg, resident, streamed in tilings:
        if causal and cfg is not None and cfg.kwargs[resident] % cfg.kwargs[streamed]:
            raise ValueError(f"causal needs {resident} to be a multiple of {streamed}, got {cfg}")

    dkdv_args = (q, k, v, do, *common, dk, dv, *sizes)
    dq_args = (q, k, v, do, *common, dq, *sizes)
    if dkdv_config is None or dq_config is None:
        dkdv_tuned, dq_tuned = _autotuned_kernels()
    if dkdv_config is None:
        grid = lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), bh)
        dkdv_tuned[grid](*dkdv_args, **constants)
    else:
        grid = (triton.cdiv(n_k, dkdv_config.kwargs["BLOCK_N"]), bh)
        _attn_bwd_dkdv_kernel[grid](*dkdv_args, **constants, **_launch_options(dkdv_config))
    if dq_config is None:
        grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), bh)
        dq_tuned[grid](*dq_args, **constants)
    else:
        grid = (triton.cdiv(n_q, dq_config.kwargs["BLOCK_M"]), bh)
        _attn_bwd_dq_kernel[grid](*dq_args, **constants, **_launch_options(dq_config))
    return dq, dk, dv


def _launch_options(config: triton.Config) -> dict:
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
