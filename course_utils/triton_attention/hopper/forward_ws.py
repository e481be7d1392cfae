"""A warp-specialized FlashAttention forward for Hopper (sm_90), written in Gluon.

The teaching kernel (`../forward.py`) is one program of identical warps that issue their own loads
and wait for them. This variant splits each program's warps by job, as FlashAttention-3 (Shah
et al., 2024) does:

    loader      1 warp, 24 registers: TMA copies of each tile's Q, then K and V tiles into a
                ring of NUM_SLOTS shared-memory slots; mbarriers say when a slot is full and
                when it is free again.
    softmax x2  two warpgroups (4 warps each, 240 registers a thread), each owning 64 of the
                tile's BLOCK_M = 128 query rows: S = Q K^T and O += P V on the tensor cores
                (wgmma), the online softmax in between, out through shared memory and the TMA.

Inside each warpgroup the matrix products are overlapped with the softmax (FlashAttention-3's
"intra-warpgroup pipelining"): S_{j+1} = Q K_{j+1}^T and O += P_j V_j are issued together, and
the exponentials of S_{j+1} run while P_j V_j is still on the tensor cores. The two warpgroups run
independently, so one's softmax also overlaps the other's products; with `pingpong` they take
turns at the tensor cores (FlashAttention-3's ping-pong). Programs are persistent: one per SM,
each taking tiles in turn, so the loader brings the next tile's Q while the last one finishes
(`launch_policy` says when one program per tile is better). For short causal tiles at d = 64 two
programs share an SM (`BUDGETS[2]`: 64-key steps, 80 registers a thread, softmax warpgroups at
104), so that one program's tile starts and ends, where its tensor cores have nothing queued,
fall while the other is in its key loop.

Written in Gluon (`triton.experimental.gluon`), Triton's lower-level dialect, where layouts,
shared memory, barriers and warp partitions are explicit. It needs an sm_90 GPU: wgmma exists only
on Hopper. Shapes it takes (else `supported` says why not and `flash_attention_fwd_ws` refuses):
float16 or bfloat16, d in HEAD_DIMS, contiguous (B, H, N, d) tensors, N_Q a multiple of BLOCK_M
and N_K of BLOCK_N. HBM traffic is the teaching kernel's: q and out once, k and v once per
query tile (most re-reads served by L2, since a head's tiles run side by side).
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from course_utils._validate import softmax_scale_or_default
from course_utils.triton_attention.forward import _bind_cuda_context, _check_inputs, output_buffers
from course_utils.triton_attention.launch import LaunchCache, descriptor

# Triton 3.9 renamed the TMA copies (3.6, on the lent H200, has only the old names).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

LOG2E = 1.4426950408889634
MIN_TRITON = (3, 6)  # built and run on 3.6 (the H200), built on 3.9; Gluon's API moved before
TRITON_VERSION = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])
HEAD_DIMS = (64, 128)
BLOCK_M = 128  # query rows per program: two warpgroups of 64
WG_ROWS = 64  # query rows per softmax warpgroup (wgmma's M is 64 per warpgroup)
BLOCK_N = 128  # keys per step
NUM_BUF = {64: 4, 128: 2}  # K/V ring slots: 4 x 32 KB at d = 64, 2 x 64 KB at d = 128
LOADER_REGS = gl.constexpr(24)  # the fewest a warp can have: it only issues copies
SOFTMAX_REGS = gl.constexpr(240)  # per thread of each softmax warpgroup
SHARED_LIMIT = 232448  # bytes of shared memory a program may opt into on sm_90
MAXNREG = 168  # 12 warps x 32 threads x 168 = 64,512 <= the SM's 65,536 registers
SM_SHARED = 233472  # bytes of shared memory of one SM; each resident program reserves 1 KB


class Budget(NamedTuple):
    """What one program may use when `programs` of them share an SM."""

    block_n: int  # keys per step
    maxnreg: int  # registers a thread at launch (12 warps)
    softmax_regs: int  # registers a thread of the second softmax warpgroup after the hand-over


# One program per SM: all 64K registers. Two (d = 64 only): 12 x 32 x 80 = 30,720 registers each,
# so 64-key steps (S of 64 x 64 in fp32 is 32 registers a thread instead of 64).
BUDGETS = {1: Budget(BLOCK_N, MAXNREG, SOFTMAX_REGS.value), 2: Budget(64, 80, 104)}


@gluon.jit
def _num_rounds(n_tiles):
    """How many tiles this program takes. Tiles are dealt like cards in a snake: round r gives
    program p tile r*P + p when r is even and r*P + (P-1-p) when odd (P programs), so that where
    tile lengths fall along the schedule (causal) no program always draws the longer one."""
    P = gl.num_programs(0)
    full = n_tiles // P
    pos = _position(full)
    return full + (pos < n_tiles % P).to(gl.int32)


@gluon.jit
def _position(r):
    """This program's place in round r of the snake."""
    p = gl.program_id(0)
    return p + (r % 2) * (gl.num_programs(0) - 1 - 2 * p)


@gluon.jit
def _tile_coords(t, n_m, seqlen_k, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t of the schedule -> (query tile start_m, head bh, key tiles n_kv).

    Head by head, so that the programs running at once share a few heads' K and V in L2 (the
    other way round, one query tile of every head at once, lost up to a fifth with the causal
    mask at 4k: Gluon forward runs 3 and 4 in docs/journal.md). With
    the causal mask a head's longest query tiles come first, so the short ones fill the tail."""
    bh = t // n_m
    if CAUSAL:
        start_m = n_m - 1 - t % n_m
        n_kv = gl.cdiv((start_m + 1) * BM, BN)  # keys 0 .. the tile's last row
    else:
        start_m = t % n_m
        n_kv = seqlen_k // BN
    return start_m, bh, n_kv


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, seqlen_q, seqlen_k, n_bh,
            CAUSAL: gl.constexpr):  # fmt: skip
    """For each tile of this program: its two Q slices, then K and V tile by tile into the ring."""
    q_ready, q_free, k_ready, k_free, v_ready, v_free = bars
    NUM_SLOTS: gl.constexpr = k_bufs.type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    n_m = seqlen_q // (2 * ROWS)
    it = 0  # K/V tiles loaded so far: slot it % NUM_SLOTS, lap it // NUM_SLOTS
    for tile_i in range(_num_rounds(n_m * n_bh)):  # this program's tiles, in turn
        t = tile_i * gl.num_programs(0) + _position(tile_i)
        start_m, bh, n_kv = _tile_coords(t, n_m, seqlen_k, 2 * ROWS, BN, CAUSAL)
        row_q = bh * seqlen_q + start_m * (2 * ROWS)
        for wg in gl.static_range(2):
            # A fresh mbarrier counts as having completed phase 1: the first lap does not wait.
            mbarrier.wait(q_free.index(wg), (tile_i & 1) ^ 1)
            mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
            _tma_load(q_desc, [row_q + wg * ROWS, 0], q_ready.index(wg), q_smem.index(wg))
        for j in range(n_kv):
            slot = it % NUM_SLOTS
            phase = (it // NUM_SLOTS) & 1
            mbarrier.wait(k_free.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [bh * seqlen_k + j * BN, 0], k_ready.index(slot),
                      k_bufs.index(slot))  # fmt: skip  # read BN*d
            mbarrier.wait(v_free.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [bh * seqlen_k + j * BN, 0], v_ready.index(slot),
                      v_bufs.index(slot))  # fmt: skip  # read BN*d
            it += 1


@gluon.jit
def _take_turn(turns, wg: gl.constexpr, g, PINGPONG: gl.constexpr):
    """Ping-pong (FlashAttention-3): the warpgroups issue their matrix products in turn, so that
    one's softmax runs while the other's products are on the tensor cores. Issue round g of
    warpgroup 0 waits for round g - 1 of warpgroup 1 (round 0 goes at once), and round g of
    warpgroup 1 for round g of warpgroup 0."""
    if PINGPONG:
        mbarrier.wait(turns.index(wg), (g & 1) ^ (1 - wg))


@gluon.jit
def _pass_turn(turns, wg: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - wg), count=1)


@gluon.jit
def _softmax_step(s, m_i, l_i, j, first_masked, offs_m, qk_scale, BN: gl.constexpr):
    """Online softmax of one (64, BN) score tile: returns p (fp32), m_i, l_i and alpha."""
    if j >= first_masked:  # the tiles that cross the diagonal of these rows (causal)
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
        s = gl.where(offs_n[None, :] <= offs_m[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)  # qk_scale > 0 commutes with max
        p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)  # 0 on the first tile (m_i = -inf), 1 when the max stays
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _softmax_warpgroup(
    wg: gl.constexpr, q_smem, o_smem, k_bufs, v_bufs, bars, turns, o_desc, lse_ptr, seqlen_q,
    seqlen_k, n_bh, qk_scale, CAUSAL: gl.constexpr, O_VIA_Q: gl.constexpr,
    PINGPONG: gl.constexpr,
):  # fmt: skip
    """Rows wg*64 .. wg*64+63 of each of this program's tiles: S = Q K^T, online softmax,
    O += P V; then those rows of out and lse."""
    q_ready, q_free, k_ready, k_free, v_ready, v_free = bars
    NUM_SLOTS: gl.constexpr = k_bufs.type.shape[0]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    BN: gl.constexpr = k_bufs.type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    s_zero = gl.zeros([ROWS, BN], gl.float32, layout=s_layout)
    q = q_smem.index(wg)
    if O_VIA_Q:  # no room for an output buffer: out leaves through this Q slot
        o_buf = q
    else:
        o_buf = o_smem.index(wg)

    n_m = seqlen_q // (2 * ROWS)
    it = 0  # K/V tiles consumed so far, as the loader counts them
    g = 0  # rounds of matrix products issued so far (ping-pong turns)
    for tile_i in range(_num_rounds(n_m * n_bh)):  # this program's tiles, in turn
        t = tile_i * gl.num_programs(0) + _position(tile_i)
        start_m, bh, n_kv = _tile_coords(t, n_m, seqlen_k, 2 * ROWS, BN, CAUSAL)
        first_row = start_m * (2 * ROWS) + wg * ROWS  # of these rows, within the head
        offs_m = first_row + gl.arange(0, ROWS, layout=row_layout)
        n_mine = n_kv  # key tiles these rows compute
        if CAUSAL:
            first_masked = first_row // BN  # the first key tile with a key right of a row
            if BN < 2 * ROWS:  # the tile's last key tiles may lie right of all these rows
                n_mine = gl.cdiv(first_row + ROWS, BN)
        else:
            first_masked = n_kv  # none
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)

        mbarrier.wait(q_ready.index(wg), tile_i & 1)
        # Key tile 0: S_0, then its softmax, with nothing to overlap yet.
        slot = it % NUM_SLOTS
        mbarrier.wait(k_ready.index(slot), (it // NUM_SLOTS) & 1)
        _take_turn(turns, wg, g, PINGPONG)
        s_tok = warpgroup_mma(
            q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        _pass_turn(turns, wg, PINGPONG)
        g += 1
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        mbarrier.arrive(k_free.index(slot), count=1)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, 0, first_masked, offs_m, qk_scale, BN)
        p = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_mine):
            prev = it % NUM_SLOTS
            prev_phase = (it // NUM_SLOTS) & 1
            it += 1
            slot = it % NUM_SLOTS
            # Issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}; wait for S_j only.
            mbarrier.wait(k_ready.index(slot), (it // NUM_SLOTS) & 1)
            mbarrier.wait(v_ready.index(prev), prev_phase)
            acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
            _take_turn(turns, wg, g, PINGPONG)
            s_tok = warpgroup_mma(
                q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True
            )
            acc_tok = warpgroup_mma(p, v_bufs.index(prev), acc, is_async=True)
            _pass_turn(turns, wg, PINGPONG)
            g += 1
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
            mbarrier.arrive(k_free.index(slot), count=1)
            # The exponentials of tile j run while P_{j-1} V_{j-1} is on the tensor cores.
            p_next, m_i, l_i, alpha = _softmax_step(
                s, m_i, l_i, j, first_masked, offs_m, qk_scale, BN
            )
            acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p))
            mbarrier.arrive(v_free.index(prev), count=1)
            p = gl.convert_layout(p_next.to(dtype), p_layout)
        if not O_VIA_Q:  # every S of this tile is done: the next Q may come in meanwhile
            mbarrier.arrive(q_free.index(wg), count=1)
        slot = it % NUM_SLOTS
        mbarrier.wait(v_ready.index(slot), (it // NUM_SLOTS) & 1)
        acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
        _take_turn(turns, wg, g, PINGPONG)
        acc_tok = warpgroup_mma(p, v_bufs.index(slot), acc, is_async=True)
        _pass_turn(turns, wg, PINGPONG)
        g += 1
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p))
        mbarrier.arrive(v_free.index(slot), count=1)
        it += 1
        if CAUSAL and BN < 2 * ROWS:
            for _ in range(n_mine, n_kv):  # fully masked here: release the slot, take the turn
                slot = it % NUM_SLOTS
                phase = (it // NUM_SLOTS) & 1
                mbarrier.wait(k_ready.index(slot), phase)  # loaded: the lap before is released
                mbarrier.arrive(k_free.index(slot), count=1)
                mbarrier.wait(v_ready.index(slot), phase)
                mbarrier.arrive(v_free.index(slot), count=1)
                _take_turn(turns, wg, g, PINGPONG)
                _pass_turn(turns, wg, PINGPONG)
                g += 1
                it += 1

        # Normalize once; lse in natural-log units; out through shared memory and the TMA.
        out = acc / gl.convert_layout(l_i, o_row_layout)[:, None]
        lse = (m_i + gl.log2(l_i)) * (1.0 / 1.4426950408889634)
        gl.store(lse_ptr + bh * seqlen_q + offs_m, lse)  # write ROWS
        tma.store_wait(0)  # the previous tile's out has left o_buf
        o_buf.store(out.to(dtype))
        fence_async_shared()  # order the shared-memory writes before the TMA reads them
        _tma_store(o_desc, [bh * seqlen_q + first_row, 0], o_buf)  # write ROWS*d
        if O_VIA_Q:
            tma.store_wait(0)
            mbarrier.arrive(q_free.index(wg), count=1)
    tma.store_wait(0)


@gluon.jit
def _attn_fwd_ws_kernel(
    q_desc,  # (B*H*N_Q, d) queries, tiles of (64, d)
    k_desc,  # (B*H*N_K, d) keys, tiles of (BLOCK_N, d)
    v_desc,  # (B*H*N_K, d) values, tiles of (BLOCK_N, d)
    o_desc,  # (B*H*N_Q, d) output, tiles of (64, d)
    lse_ptr,  # (B*H, N_Q) fp32: natural-log lse
    seqlen_q,
    seqlen_k,
    n_bh,  # B * H
    qk_scale,  # softmax_scale * log2(e)
    CAUSAL: gl.constexpr,
    NUM_SLOTS: gl.constexpr,
    O_VIA_Q: gl.constexpr,  # out leaves through the Q slots (no room for its own buffers)
    PINGPONG: gl.constexpr,  # the two warpgroups issue their matrix products in turn
    SOFTMAX_R: gl.constexpr = SOFTMAX_REGS,  # registers a thread of the softmax warpgroup
):
    """Persistent: program p takes tiles p, p + P, p + 2P, ... of 128 queries of one head
    (with one program per tile it is the usual grid)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    if O_VIA_Q:
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [2, ROWS, HEAD_DIM], o_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_SLOTS, BN, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_SLOTS, BN, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_free.index(i), count=1)  # one warpgroup reads each Q slice
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # both warpgroups release a K/V slot
        mbarrier.init(v_free.index(i), count=2)
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    bars = (q_ready, q_free, k_ready, k_free, v_ready, v_free)

    softmax_args = (
        q_smem, o_smem, k_bufs, v_bufs, bars, turns, o_desc, lse_ptr, seqlen_q, seqlen_k, n_bh,
        qk_scale, CAUSAL, O_VIA_Q, PINGPONG,
    )  # fmt: skip
    loader_args = (
        q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, seqlen_q, seqlen_k, n_bh, CAUSAL,
    )  # fmt: skip
    gl.warp_specialize(
        [
            (_softmax_warpgroup, (0,) + softmax_args),
            (_softmax_warpgroup, (1,) + softmax_args),
            (_loader, loader_args),
        ],
        [4, 1],
        [SOFTMAX_R, LOADER_REGS],
    )


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str | None:
    """None when this kernel takes (q, k, v, causal) on q's device, else the reason it does not.
    The inputs are ones that pass the teaching kernel's checks (`forward._check_inputs`)."""
    if TRITON_VERSION < MIN_TRITON:
        return (
            f"needs Triton {'.'.join(map(str, MIN_TRITON))} or newer, this is {triton.__version__}"
        )
    if q.device.type != "cuda":
        return f"needs CUDA tensors, q is on {q.device}"
    capability = torch.cuda.get_device_capability(q.device)
    if capability[0] != 9:
        return f"needs a Hopper GPU (sm_90, wgmma), this one is sm_{capability[0]}{capability[1]}"
    if q.dtype not in _GL_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return f"needs float16 or bfloat16 q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        return "needs (B, H, N, d) q, k, v sharing B, H and d"
    if q.shape[3] not in HEAD_DIMS:
        return f"needs d in {HEAD_DIMS}, got {q.shape[3]}"
    if q.shape[2] % BLOCK_M or k.shape[2] % BLOCK_N or k.shape[2] == 0:
        return f"needs N_Q a multiple of {BLOCK_M} and N_K a positive multiple of {BLOCK_N}"
    if causal and q.shape[2] != k.shape[2]:
        return "causal needs N_Q == N_K"
    if not all(t.is_contiguous() for t in (q, k, v)):
        return "needs contiguous q, k, v"
    return None


def preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether `flash_attention` (kernels="auto") should run this kernel rather than the teaching
    one (`autograd.pick_kernel` asks): it
    takes the shape, and it was the faster of the two there on the H200 (docs/journal.md,
    Gluon forward run 6: 1.02 to 1.33 times the teaching kernel at every point but causal d = 64
    at 1k keys, where it lost with one program an SM, 273 against 299 TFLOP/s, and wins with two,
    318 against 297, as the teaching kernel's own two programs an SM do)."""
    return supported(q, k, v, causal) is None


@functools.cache
def shared_layout(block: tuple[int, ...], dtype) -> gl.NVMMASharedLayout:
    """The TMA's shared-memory layout for tiles of shape `block` and Gluon dtype `dtype`, built
    once per tile shape: each launch needs one per descriptor, and building one is several
    microseconds of Python (docs/journal.md, "Host cost per call at 1k keys")."""
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def _descriptor(t: torch.Tensor, rows: int, checked: bool = True) -> TensorDescriptor:
    """A 2-D (B*H*N, d) descriptor over a contiguous (B, H, N, d) tensor, tiles of (rows, d);
    checked=False skips the constructor's checks (`launch.descriptor`: a launch whose first
    descriptors of this shape were checked, over a 16-byte aligned tensor)."""
    d = t.shape[-1]
    flat = t.view(-1, d)
    layout = shared_layout((rows, d), _GL_DTYPES[t.dtype])
    return descriptor(
        TensorDescriptor, flat, [flat.shape[0], d], [d, 1], [rows, d], layout, checked
    )


def flash_attention_fwd_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    num_slots: int | None = None,
    persistent: bool | None = None,
    pingpong: bool | None = None,
    programs_per_sm: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`forward.flash_attention_fwd` through the warp-specialized kernel (Hopper only).

    Args and returns as `flash_attention_fwd`, plus: out and lse, contiguous tensors to write
    into (as `launch_flash_attention_fwd` takes them); num_slots, the K/V ring's depth (default
    NUM_BUF[d]); persistent, one program per SM looping over the tiles (else one per tile);
    pingpong, the warpgroups take turns at the tensor cores; programs_per_sm, 1, or 2 at d = 64
    (`BUDGETS`: 64-key steps, 80 registers a thread). None takes `launch_policy`'s.
    Raises ValueError naming what `supported` refuses (the teaching kernel takes
    every other shape).
    """
    _check_inputs(q, k, v, causal)  # tensors, dtypes, shapes, causal: the teaching kernel's errors
    reason = supported(q, k, v, causal)
    if reason is not None:
        raise ValueError(f"flash_attention_fwd_ws: {reason}")
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    scale = float(softmax_scale_or_default(softmax_scale, d))
    policy = launch_policy(d, n_q, n_k, causal)
    num_slots = policy.num_slots if num_slots is None else num_slots
    persistent = policy.persistent if persistent is None else persistent
    pingpong = policy.pingpong if pingpong is None else pingpong
    per_sm = policy.programs_per_sm if programs_per_sm is None else programs_per_sm
    if not isinstance(num_slots, int) or not 1 <= num_slots <= 4:
        raise ValueError(f"num_slots must be an int from 1 to 4, got {num_slots!r}")
    if per_sm not in BUDGETS or (per_sm == 2 and d != 64):
        raise ValueError(f"programs_per_sm must be 1, or 2 at d = 64; got {per_sm!r} at d = {d}")
    budget = BUDGETS[per_sm]
    if per_sm > 1 and shared_bytes(d, num_slots, True, budget.block_n) > program_shared(per_sm):
        raise ValueError(
            f"num_slots={num_slots} does not fit {per_sm} programs per SM at d = {d}: "
            f"{shared_bytes(d, num_slots, True, budget.block_n):,} bytes a program, at most "
            f"{program_shared(per_sm):,}"
        )
    out, lse = output_buffers(q, out, lse)
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    policy = LaunchPolicy(num_slots, bool(persistent), bool(pingpong), per_sm)
    launch(q, k, v, causal, scale, out, lse, policy)
    return out, lse


def forward_checked(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as `flash_attention_fwd_ws` with `launch_policy`'s launch, for inputs the
    caller checked (`forward._check_inputs`) and `supported` took: `autograd` calls this once
    per call after checking a shape once, so nothing here repeats a check."""
    batch, heads, n_q, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    launch(q, k, v, causal, scale, out, lse, launch_policy(d, n_q, k.shape[2], causal))
    return out, lse


_LAUNCHES = LaunchCache(_attn_fwd_ws_kernel)


def launch(q, k, v, causal: bool, scale: float, out, lse, policy: LaunchPolicy) -> None:
    """One launch of the kernel over checked inputs and buffers (contiguous, `supported`): the
    first at a key through the JIT with checked descriptors, later ones straight to the compiled
    kernel (`launch.LaunchCache`). Host cost: about 20 us of Triton's launcher, 4 descriptors."""
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    num_slots, persistent, pingpong, per_sm = policy
    budget = BUDGETS[per_sm]
    bn = budget.block_n
    device = q.device
    _bind_cuda_context(device)
    tiles = (n_q // BLOCK_M) * batch * heads
    if persistent:
        tiles = min(tiles, per_sm * _sm_count(device))
    aligned = all(t.data_ptr() % 16 == 0 for t in (q, k, v, out, lse))
    key = (q.dtype, device, n_q, n_k, batch * heads, tiles, causal, policy, aligned)
    checked = not aligned or key not in _LAUNCHES
    descriptors = (
        _descriptor(q, WG_ROWS, checked), _descriptor(k, bn, checked),
        _descriptor(v, bn, checked), _descriptor(out, WG_ROWS, checked),
    )  # fmt: skip
    constexprs = {
        "CAUSAL": causal, "NUM_SLOTS": num_slots,
        "O_VIA_Q": not own_out_buffer(d, num_slots, per_sm), "PINGPONG": bool(pingpong),
        "SOFTMAX_R": budget.softmax_regs,
    }  # fmt: skip
    args = (*descriptors, lse, n_q, n_k, batch * heads, scale * LOG2E)
    _LAUNCHES(key, (tiles,), args, constexprs, {"num_warps": 4, "maxnreg": budget.maxnreg})


class LaunchPolicy(NamedTuple):
    num_slots: int  # K/V ring depth
    persistent: bool  # one program per SM (else one per tile)
    pingpong: bool  # the warpgroups take turns at the tensor cores
    programs_per_sm: int = 1  # 2: BUDGETS[2], at d = 64 only


@functools.lru_cache(maxsize=256)
def launch_policy(d: int, n_q: int, n_k: int, causal: bool) -> LaunchPolicy:
    """How to launch at this shape, from the H200 runs in docs/journal.md (Gluon forward
    runs 4 and 6; run 6 timed each variant four times, in rotating order):

    - persistent except with the causal mask past 4k keys, where tiles of every length dealt out
      in advance leave some programs a third more work than others, and the GPU's own scheduling
      of one program per tile balances them (causal d = 128, 16k: 469 against 572 TFLOP/s);
    - 4 ring slots at d = 64 (3 within 2 % at every point), 2 at d = 128, where out then has its
      own buffers and the next tile's Q need not wait for it (3 slots: from 1 % faster to 4 %
      slower);
    - ping-pong turns at d = 128 up to 1k keys (583 against 530 TFLOP/s without the mask, equal
      with it); elsewhere they cost 0 to 2 %;
    - two programs an SM where `two_programs_per_sm` says (causal d = 64, 1k: 318 against 274
      TFLOP/s; at 4k one program an SM is faster, 402 against 355).
    """
    persistent = not causal or n_k <= 4096
    slots = NUM_BUF[d]
    per_sm = 2 if two_programs_per_sm(d, n_k, causal) else 1
    return LaunchPolicy(
        num_slots=slots,
        persistent=persistent,
        pingpong=d == 128 and n_k <= 1024,
        programs_per_sm=per_sm,
    )


def two_programs_per_sm(d: int, n_k: int, causal: bool) -> bool:
    """Where two programs share an SM (`BUDGETS[2]`): causal d = 64 up to 1k keys, whose short
    tiles (1 to 8 key steps) leave one program's tensor cores idle at each tile's start and end,
    which the other program fills (the Gluon forward with two programs an SM, 2026-12-04)."""
    return d == 64 and causal and n_k <= 1024


def shared_bytes(d: int, num_slots: int, own_out_buffer: bool, block_n: int = BLOCK_N) -> int:
    """Shared memory of one program, 2-byte elements: Q (and out) 128 x d, each ring slot K and
    V block_n x d; plus 1 KB for the barriers and alignment."""
    return 2 * d * (BLOCK_M * (2 if own_out_buffer else 1) + 2 * block_n * num_slots) + 1024


def program_shared(programs_per_sm: int = 1) -> int:
    """The shared memory one program may use when programs_per_sm of them share an SM."""
    return min(SHARED_LIMIT, SM_SHARED // programs_per_sm - 1024)


def own_out_buffer(d: int, num_slots: int, programs_per_sm: int = 1) -> bool:
    """Whether out gets its own staging buffers (else it goes through the Q slots, and the next
    tile's Q waits for it to leave)."""
    block_n = BUDGETS[programs_per_sm].block_n
    return shared_bytes(d, num_slots, True, block_n) <= program_shared(programs_per_sm)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def descriptor_signature(d: int, dtype: torch.dtype, rows: dict[str, int]) -> dict[str, str]:
    """{argument: Triton type} for 2-D (N, d) tensor descriptors with tiles of (rows[name], d),
    as `_descriptor` makes them: the signature of a compile without a GPU. The descriptors are
    built over a small CPU tensor, used for its type only."""
    from triton.runtime.jit import mangle_type

    fake = torch.empty((4 * max(rows.values()), d), dtype=dtype)
    return {
        name: mangle_type(
            TensorDescriptor(
                fake, list(fake.shape), list(fake.stride()), [r, d],
                shared_layout((r, d), _GL_DTYPES[dtype]),
            )
        )
        for name, r in rows.items()
    }  # fmt: skip


def compile_for_sm90(
    d: int = 128,
    causal: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    num_slots: int | None = None,
    pingpong: bool = False,
    programs_per_sm: int = 1,
):
    """Compile the kernel for sm_90 here, without a GPU (`cross_compile.compile_for`).

    Returns cross_compile.Compiled (shared_bytes, n_regs, spill_bytes, ptx, cubin): proof on a CPU
    machine that the kernel builds for Hopper, with its shared memory and registers.
    """
    from course_utils.triton_attention.cross_compile import compile_for

    if d not in HEAD_DIMS or dtype not in _GL_DTYPES:
        raise ValueError(f"d must be one of {HEAD_DIMS} and dtype float16 or bfloat16")
    num_slots = NUM_BUF[d] if num_slots is None else num_slots
    budget = BUDGETS[programs_per_sm]
    bn = budget.block_n
    signature = descriptor_signature(
        d, dtype, {"q_desc": WG_ROWS, "k_desc": bn, "v_desc": bn, "o_desc": WG_ROWS}
    )
    signature.update(lse_ptr="*fp32", seqlen_q="i32", seqlen_k="i32", n_bh="i32", qk_scale="fp32")
    return compile_for(
        _attn_fwd_ws_kernel, signature,
        {"CAUSAL": causal, "NUM_SLOTS": num_slots, "PINGPONG": pingpong,
         "O_VIA_Q": not own_out_buffer(d, num_slots, programs_per_sm),
         "SOFTMAX_R": budget.softmax_regs},
        target=(9, 0), num_warps=4, maxnreg=budget.maxnreg, divisible=("lse_ptr",),
    )  # fmt: skip
