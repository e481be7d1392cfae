"""The device code of the warp-specialized Gluon backward for Hopper (sm_90): `_attn_bwd_ws_kernel`.

Its design (a TMA loader warp, two gradient warpgroups on wgmma, dQ added by TMA reduce-adds),
its measured defaults and its launch are in `backward_ws`, the module to import; this one holds
the @gluon.jit functions only, so that each module stays one idea and under 800 lines.

    _bwd_loader        the loader warp: K, V of a key tile, then Q_i, dO_i (lse_i, D_i) per step
    _bwd_warpgroup     one gradient warpgroup: its 64 keys' dK, dV and its part of each dQ_i
    _attn_bwd_ws_kernel
                       the kernel: shared memory, mbarriers and gl.warp_specialize over the three
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from course_utils.triton_attention.hopper.forward_ws import (
    _num_rounds,
    _position,
    _tma_load,
    _tma_store,
)

# Triton 3.9 renamed the barrier among a partition's threads (3.6, on the lent H200: the old name).
_thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


def _tma_reduce_add_builtin():
    """Gluon's TMA reduce-add (shared -> global, `cp.reduce.async.bulk.tensor ... add`).

    Triton 3.9 exposes it as `tma.async_atomic_add`. Triton 3.6 (the lent H200's) has the same
    operation in its compiler (`ttng.async_tma_reduce`, which `tl` descriptors' atomic_add lower
    to) but no Gluon name for it: this builtin emits it directly there.
    """
    if hasattr(tma, "async_atomic_add"):
        return tma.async_atomic_add
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def async_atomic_add(tensor_desc, coord, src, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(
            ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
        )

    return async_atomic_add


_tma_reduce_add = _tma_reduce_add_builtin()
# A shared-memory view of another dtype and shape: `reinterpret` in Triton 3.9, `_reinterpret`
# in 3.6.
_PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


KEY_MAJOR_TILES = gl.constexpr(128)  # key tiles a head from which `_key_tile` deals by key tile
LOADER_REGS = gl.constexpr(24)
GRAD_REGS = gl.constexpr(240)


@gluon.jit
def _bwd_loader(q_desc, k_desc, v_desc, do_desc, lse_src, delta_src, q_bufs, do_bufs, k_smem,
                v_smem, lse_bufs, delta_bufs, tile_ids, tile_src, bars, seqlen_q, seqlen_k, n_bh,
                CAUSAL):  # fmt: skip
    """For each of this program's key tiles: its K into buffer tile_i % K_BUFS (once both
    warpgroups are done with the tile that last used it), its V (once both have computed the
    last tile's final dP^T), then Q_i and dO_i step by step into the ring, with lse_i beside Q_i
    and D_i beside dO_i when they come through the TMA too (lse_bufs of (SLOTS, BM)). With two
    K buffers the next tile's K arrives while this tile's last steps run, and its V while their
    dQ products, dK and dV finish.

    Dynamic (tile_ids of (K_BUFS, 1)): the tiles are not dealt in advance. A program's first tile
    is its program id; while it loads one tile it takes the number of its next from the counter
    at tile_src (one atomic add a tile: tile P + the count), so a program that runs ahead takes
    more tiles. Each tile's number goes into tile_ids[buffer] before its K's barrier is armed,
    where the warpgroups read it once K is there; a number past the last tile tells them to
    stop."""
    k_ready, k_free = bars[0], bars[1]
    K_BUFS: gl.constexpr = k_smem.type.shape[0]
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    DYNAMIC: gl.constexpr = tile_ids.type.shape[1] == 1
    loads = (q_desc, k_desc, v_desc, do_desc, lse_src, delta_src, q_bufs, do_bufs, k_smem, v_smem,
             lse_bufs, delta_bufs, bars, seqlen_q, seqlen_k)  # fmt: skip
    n_kt = seqlen_k // BN
    it = 0  # Q/dO loads so far: slot it % SLOTS, lap it // SLOTS
    if DYNAMIC:
        lane_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        lane = gl.arange(0, 32, layout=lane_layout)
        n_tiles = n_kt * n_bh
        t = gl.program_id(0)
        tile_i = 0
        while t < n_tiles:
            start_n, bh, first = _tile_of(t, n_kt, n_bh, BM, BN, CAUSAL)
            kb = tile_i % K_BUFS
            # A fresh mbarrier counts as having completed phase 1: the first lap does not wait.
            mbarrier.wait(k_free.index(kb), ((tile_i // K_BUFS) & 1) ^ 1)
            _publish_tile(tile_ids.index(kb), t)
            # the next tile's number: one lane's atomic add, read after this tile's loads
            taken = gl.atomic_add(tile_src + lane * 0, lane * 0 + 1, mask=lane == 0, sem="relaxed")
            it = _load_tile(loads, tile_i, start_n, bh, first, it)
            t = gl.num_programs(0) + gl.sum(gl.where(lane == 0, taken, 0), axis=0)
            tile_i += 1
        kb = tile_i % K_BUFS  # the end: a number past the last tile, K's barrier armed with it
        mbarrier.wait(k_free.index(kb), ((tile_i // K_BUFS) & 1) ^ 1)
        _publish_tile(tile_ids.index(kb), t)
        mbarrier.arrive(k_ready.index(kb), count=1)
    else:
        for tile_i in range(_num_rounds(n_kt * n_bh)):
            start_n, bh, first = _key_tile(tile_i, n_kt, n_bh, BM, BN, CAUSAL)
            kb = tile_i % K_BUFS
            mbarrier.wait(k_free.index(kb), ((tile_i // K_BUFS) & 1) ^ 1)
            it = _load_tile(loads, tile_i, start_n, bh, first, it)


@gluon.jit
def _load_tile(loads, tile_i, start_n, bh, first, it):
    """The loader's work for one key tile, its K buffer free: K (read BN*d) and V (read BN*d),
    then Q_i, dO_i (with lse_i, D_i) for each query tile from `first`. it: the Q/dO loads
    before it (ring slot it % SLOTS); returns it after this tile's."""
    (q_desc, k_desc, v_desc, do_desc, lse_src, delta_src, q_bufs, do_bufs, k_smem, v_smem,
     lse_bufs, delta_bufs, bars, seqlen_q, seqlen_k) = loads  # fmt: skip
    k_ready, k_free, v_ready, v_free, q_ready, q_free, do_ready, do_free, ds_ready, ds_free = bars
    SLOTS: gl.constexpr = q_bufs.type.shape[0]
    K_BUFS: gl.constexpr = k_smem.type.shape[0]
    BM: gl.constexpr = q_desc.block_type.shape[0]
    STATS_TMA: gl.constexpr = lse_bufs.type.shape[1] == BM
    STATS_BYTES: gl.constexpr = BM * 4 if STATS_TMA else 0
    BN: gl.constexpr = k_desc.block_type.shape[0]
    kb = tile_i % K_BUFS
    mbarrier.expect(k_ready.index(kb), k_desc.block_type.nbytes)
    _tma_load(k_desc, [bh * seqlen_k + start_n * BN, 0], k_ready.index(kb), k_smem.index(kb))
    mbarrier.wait(v_free, (tile_i & 1) ^ 1)  # read BN*d above, BN*d below
    mbarrier.expect(v_ready, v_desc.block_type.nbytes)
    _tma_load(v_desc, [bh * seqlen_k + start_n * BN, 0], v_ready, v_smem)
    for step in range(seqlen_q // BM - first):
        i = first + step
        slot = it % SLOTS
        phase = (it // SLOTS) & 1
        row = bh * seqlen_q + i * BM
        mbarrier.wait(q_free.index(slot), phase ^ 1)
        mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes + STATS_BYTES)
        _tma_load(q_desc, [row, 0], q_ready.index(slot), q_bufs.index(slot))  # read BM*d
        if STATS_TMA:
            _tma_load(lse_src, [row], q_ready.index(slot), lse_bufs.index(slot))  # read BM
        mbarrier.wait(do_free.index(slot), phase ^ 1)
        mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes + STATS_BYTES)
        _tma_load(do_desc, [row, 0], do_ready.index(slot), do_bufs.index(slot))  # read BM*d
        if STATS_TMA:
            _tma_load(delta_src, [row], do_ready.index(slot), delta_bufs.index(slot))
        it += 1
    return it


@gluon.jit
def _publish_tile(tile_id, t):
    """The loader (one warp) writes tile number t into tile_id, a (1,) int32 buffer, before it
    arms the barrier the warpgroups wait on (its arrive releases the write to them)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    tile_id.store(gl.full([1], t, gl.int32, layout=layout))
    _thread_barrier()  # every lane's write is done before lane 0 arrives


@gluon.jit
def _published_tile(tile_id):
    """A warpgroup (four warps) reads the tile number the loader wrote (`_publish_tile`), once
    the barrier it was published with has completed."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.max(tile_id.load(layout), axis=0)


@gluon.jit
def _key_tile(tile_i, n_kt, n_bh, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """This program's tile_i-th key tile -> (start_n, bh, first query tile), the tiles dealt to
    the programs in a snake (`forward_ws._position`). They go head by head, key tiles in order
    inside a head, so the programs running at once share a few heads' Q and dO in L2; with the
    causal mask key tile j sees N_Q - j * BLOCK_N queries, so a head's longest tiles start first.
    Persistent programs with the mask and KEY_MAJOR_TILES key tiles a head or more are dealt by
    key tile instead, the longest (j = 0) of every head first, so each round deals tiles of about
    one length (head by head, the snake left one program 1.5 times the mean work at N = 16k:
    Gluon backward run 4). Below that, head by head: dealt by key tile at 1k and 4k keys the
    persistent programs ran 0.65 to 0.78 times as fast as one program a tile (H100, journal
    "Backward at short lengths", 2026-12-05), most likely because the programs at once read 132
    heads' Q and dO, more than L2 holds; head by head they ran 1.03 to 1.04 times as fast (H200,
    same section), and at 1k on 132 SMs the snake deals each program key tiles j and 7 - j in
    turn, the same work for all."""
    t = tile_i * gl.num_programs(0) + _position(tile_i)
    return _tile_of(t, n_kt, n_bh, BM, BN, CAUSAL)


@gluon.jit
def _tile_of(t, n_kt, n_bh, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t of the schedule (`_key_tile`'s order) -> (start_n, bh, first query tile)."""
    if CAUSAL and gl.num_programs(0) < n_kt * n_bh and n_kt >= KEY_MAJOR_TILES:
        start_n = t // n_bh
        bh = t % n_bh
    else:
        bh = t // n_kt
        start_n = t % n_kt
    if CAUSAL:
        first = (start_n * BN) // BM  # earlier query tiles see none of these keys
    else:
        first = start_n * 0
    return start_n, bh, first


@gluon.jit
def _issue_scores(k_rows, v_rows, q_bufs, do_bufs, q_ready, do_ready, it, st_zero):
    """Step it's S^T = K Q_i^T and dP^T = V dO_i^T, issued on the tensor cores (not waited for)."""
    SLOTS: gl.constexpr = q_bufs.type.shape[0]
    slot = it % SLOTS
    phase = (it // SLOTS) & 1
    mbarrier.wait(q_ready.index(slot), phase)
    st_tok = warpgroup_mma(
        k_rows, q_bufs.index(slot).permute((1, 0)), st_zero, use_acc=False, is_async=True
    )
    mbarrier.wait(do_ready.index(slot), phase)
    dpt_tok = warpgroup_mma(
        v_rows, do_bufs.index(slot).permute((1, 0)), st_zero, use_acc=False, is_async=True
    )
    return st_tok, dpt_tok


@gluon.jit
def _bwd_warpgroup(
    wg: gl.constexpr, q_bufs, do_bufs, k_smem, v_smem, ds_smem, lse_bufs, delta_bufs, tile_ids,
    dq_stage, bars, dq_dst, dk_dst, dv_dst, lse_src, delta_src, seqlen_q, seqlen_k, n_bh,
    qk_scale, sm_scale, CAUSAL,
):  # fmt: skip
    """Keys wg*64 .. wg*64+63 of each of this program's key tiles: dK and dV over every query
    tile, and this warpgroup's part of each dQ_i. The tiles: dealt in advance (`_key_tile`), or
    with tile_ids of (K_BUFS, 1) the ones the loader took (`_bwd_loader`), read as each K arrives.

    With dq_stage (64, 64) slots (DQ_TMA), dq_dst is a descriptor over the fp32 dQ and each part
    of dQ_i goes through this warpgroup's slots and one TMA reduce-add; else dq_dst is a pointer
    and the threads add their registers with atomics (and dq_stage's (128, 32) slots, where
    dk_dst is a descriptor, hold only dK and dV on their way out, `_store_dk_dv`)."""
    k_ready = bars[0]
    BM: gl.constexpr = q_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = q_bufs.type.shape[2]
    K_BUFS: gl.constexpr = k_smem.type.shape[0]
    KR: gl.constexpr = k_smem.type.shape[1] // 2
    # dQ_i is computed in (64, 64) parts. DQ_SPLIT (ds_smem one (BN, BM) buffer): each
    # warpgroup computes half of its columns (d = 128) or rows (BM = 128) over all BN keys,
    # after both have written their dS^T. Else (ds_smem (2, KR, BM)): each computes all of dQ_i
    # over its own KR keys, in HEAD_DIM / DQ_N products, with no wait for the other. (Told by
    # the buffer's shape: constexprs passed through warp_specialize arrive as tensors.)
    # DQ_LAG (ds_smem (2, BN, BM)): shared as with DQ_SPLIT, in two buffers, each step's dQ one
    # step late (`_bwd_tile_lagged`).
    DQ_LAG: gl.constexpr = len(ds_smem.type.shape) == 3 and ds_smem.type.shape[1] == 2 * KR
    DQ_SPLIT: gl.constexpr = len(ds_smem.type.shape) == 2
    DYNAMIC: gl.constexpr = tile_ids.type.shape[1] == 1
    DQ_N: gl.constexpr = 64
    DQ_M: gl.constexpr = 64
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16]
    )  # S^T, dP^T: (KR keys, BM queries)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )  # dK, dV: (KR, d)
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DQ_N, 16]
    )  # a (DQ_M, DQ_N) part of dQ_i

    v_rows = v_smem.slice(wg * KR, KR)  # (KR, d)
    if DQ_LAG:  # `_bwd_tile_lagged` takes ds_smem whole (ds_rows and dq_a: unused)
        ds_rows = ds_smem
        dq_a = ds_smem
        dq_row0 = 0
        dq_col0 = 0
    elif DQ_SPLIT:
        ds_rows = ds_smem.slice(wg * KR, KR)  # this warpgroup's dS^T: (KR, BM)
        if BM == 2 * DQ_M:  # BM = 128 (d = 64): each warpgroup takes 64 of dQ_i's rows
            dq_a = ds_smem.slice(wg * DQ_M, DQ_M, dim=1).permute((1, 0))  # dS: (DQ_M, BN)
            dq_row0 = wg * DQ_M
            dq_col0 = 0
        else:  # BM = 64 (d = 128): half of dQ_i's columns
            dq_a = ds_smem.permute((1, 0))  # dS: (BM, BN)
            dq_row0 = 0
            dq_col0 = wg * DQ_N
    else:
        ds_rows = ds_smem.index(wg)  # (KR, BM)
        dq_a = ds_rows.permute((1, 0))  # (BM, KR)
        dq_row0 = 0
        dq_col0 = 0
    st_zero = gl.zeros([KR, BM], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([DQ_M, DQ_N], gl.float32, layout=dq_layout)
    kv_zero = gl.zeros([KR, HEAD_DIM], gl.float32, layout=kv_layout)
    dq_rows = dq_row0 + gl.arange(0, DQ_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = dq_col0 + gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
    dq_offs = dq_rows[:, None] * HEAD_DIM + dq_cols[None, :]  # int32, within a query tile
    q_rows = gl.arange(0, BM, layout=gl.SliceLayout(0, st_layout))
    key_rows = gl.arange(0, KR, layout=gl.SliceLayout(1, st_layout))
    n_kt = seqlen_k // (2 * KR)
    # The Q/dO ring's buffers and barriers, and lse's and D's sources (descriptors or pointers).
    q_ready, do_ready = bars[4], bars[6]
    ring = (q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, do_ready, lse_src, delta_src)
    # With the lag and two K buffers (CARRY) the lag runs on across key tiles: a tile's last dQ
    # product is computed in the next tile's first step, beside its dV and dK, from the K buffer
    # the last tile used (handed back to the loader right after), so that neither end of a tile
    # runs a product alone. pend_row, pend_kb: the query row (in the flat dQ) and K buffer of the
    # step whose dQ is pending.
    CARRY: gl.constexpr = DQ_LAG and K_BUFS == 2
    done = 0  # steps of the earlier tiles: ring slots and barrier phases continue from there
    pend_row = 0
    pend_kb = 0
    per_tile = (ring, k_smem, v_rows, ds_smem, ds_rows, dq_a, dq_offs, dq_stage, bars, dq_dst,
                dk_dst, dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, kv_zero, st_zero,
                dq_zero, q_rows, key_rows, CAUSAL)  # fmt: skip
    if DYNAMIC:  # the tiles the loader took from the counter, in the order it took them
        n_tiles = n_kt * n_bh
        tile_i = 0
        mbarrier.wait(k_ready.index(0), 0)
        t = _published_tile(tile_ids.index(0))
        while t < n_tiles:
            start_n, bh, first = _tile_of(t, n_kt, n_bh, BM, 2 * KR, CAUSAL)
            done, pend_row, pend_kb = _grad_tile(
                wg, per_tile, tile_i, start_n, bh, first, done, pend_row, pend_kb
            )
            tile_i += 1
            mbarrier.wait(k_ready.index(tile_i % K_BUFS), (tile_i // K_BUFS) & 1)
            t = _published_tile(tile_ids.index(tile_i % K_BUFS))
    else:
        for tile_i in range(_num_rounds(n_kt * n_bh)):
            start_n, bh, first = _key_tile(tile_i, n_kt, n_bh, BM, 2 * KR, CAUSAL)
            mbarrier.wait(k_ready.index(tile_i % K_BUFS), (tile_i // K_BUFS) & 1)
            done, pend_row, pend_kb = _grad_tile(
                wg, per_tile, tile_i, start_n, bh, first, done, pend_row, pend_kb
            )
    if CARRY and done > 0:  # the program's last step's dQ, pending since its tile ended
        _lagged_dq_drain(ds_smem, k_smem.index(pend_kb), dq_stage, bars, dq_dst, wg, done - 1,
                         pend_row, dq_zero)  # fmt: skip
    tma.store_wait(0)  # the last copies out have read dq_stage before the program ends


@gluon.jit
def _grad_tile(wg: gl.constexpr, per_tile, tile_i, start_n, bh, first, done, pend_row, pend_kb):
    """One key tile of a warpgroup, its K (buffer tile_i % K_BUFS) arrived: V awaited, then every
    query step (`_bwd_tile_lagged` or `_bwd_tile`), its dK and dV written out. per_tile: what
    `_bwd_warpgroup` set up for all its tiles (wg apart: a constexpr, which a tuple would not
    keep). Returns (done, pend_row, pend_kb) after it."""
    (ring, k_smem, v_rows, ds_smem, ds_rows, dq_a, dq_offs, dq_stage, bars, dq_dst, dk_dst,
     dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, kv_zero, st_zero, dq_zero, q_rows, key_rows,
     CAUSAL) = per_tile  # fmt: skip
    BM: gl.constexpr = ring[0].type.shape[1]
    K_BUFS: gl.constexpr = k_smem.type.shape[0]
    KR: gl.constexpr = k_smem.type.shape[1] // 2
    DQ_LAG: gl.constexpr = len(ds_smem.type.shape) == 3 and ds_smem.type.shape[1] == 2 * KR
    CARRY: gl.constexpr = DQ_LAG and K_BUFS == 2
    k0 = start_n * (2 * KR) + wg * KR  # first key of this warpgroup, within the head
    offs_k = k0 + key_rows
    dk = kv_zero
    dv = kv_zero
    n_steps = seqlen_q // BM - first
    k_tile = k_smem.index(tile_i % K_BUFS)  # (BN, d)
    k_rows = k_tile.slice(wg * KR, KR)  # (KR, d)
    mbarrier.wait(bars[2], tile_i & 1)  # V
    if DQ_LAG:
        done, pend_row, pend_kb = _bwd_tile_lagged(
            wg, ring, k_smem, tile_i, k_rows, v_rows, ds_smem, dq_stage, bars, dq_dst,
            dk_dst, dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, bh, k0, offs_k, first,
            n_steps, done, pend_row, dk, dv, st_zero, dq_zero, q_rows, CAUSAL,
        )  # fmt: skip
    else:
        done = _bwd_tile(
            wg, ring, k_tile, k_rows, v_rows, ds_rows, dq_a, dq_offs, dq_stage, bars,
            dq_dst, dk_dst, dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, bh, k0, offs_k,
            first, n_steps, done, dk, dv, st_zero, dq_zero, q_rows, CAUSAL,
        )  # fmt: skip
    if not CARRY:
        # Every product of this tile has read K, and dK's and dV's stores are issued. (With
        # one buffer the next tile's K waits for them.)
        mbarrier.arrive(bars[1].index(tile_i % K_BUFS), count=1)
    return done, pend_row, pend_kb


@gluon.jit
def _step_grads(ring, k_rows, v_rows, it, i, bh, seqlen_q, k0, offs_k, q_rows, dk, dv, st_zero,
                qk_scale, CAUSAL):  # fmt: skip
    """Step it of a warpgroup (query tile i): S^T, P^T, dP^T and dS^T (KR keys x BM queries),
    and dV += P^T dO_i, dK += dS^T Q_i issued on the tensor cores, not waited for. ring: the
    Q/dO ring's buffers and barriers, and lse's and D's sources (`_bwd_warpgroup`). Returns
    (dv_tok, dk_tok, pt_a, dst_a, dst): the products' tokens, their register operands (live
    until the products are waited for) and dS^T in q's dtype, tau not applied."""
    q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, do_ready, lse_src, delta_src = ring
    SLOTS: gl.constexpr = q_bufs.type.shape[0]
    BM: gl.constexpr = q_bufs.type.shape[1]
    KR: gl.constexpr = k_rows.type.shape[0]
    STATS_TMA: gl.constexpr = lse_bufs.type.shape[1] == BM
    dtype: gl.constexpr = q_bufs.dtype
    col_layout: gl.constexpr = gl.SliceLayout(0, st_zero.type.layout)  # a query per column
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2)
    slot = it % SLOTS
    offs_q = i * BM + q_rows
    q_i = q_bufs.index(slot)
    do_i = do_bufs.index(slot)
    # lse_i and D_i: read from the ring's shared memory (the loader's TMA put them beside Q_i
    # and dO_i) just when they are needed, so that they take no registers while S^T and
    # dP^T are on the tensor cores; else loaded from HBM first, every thread its columns
    # (64-bit pointers that cost registers, and the loads' latency to hide).
    if not STATS_TMA:
        lse_hbm = gl.load(lse_src + bh * seqlen_q + offs_q)  # read BM
        delta_hbm = gl.load(delta_src + bh * seqlen_q + offs_q)  # read BM
    st_tok, dpt_tok = _issue_scores(k_rows, v_rows, q_bufs, do_bufs, q_ready, do_ready, it, st_zero)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))
    if STATS_TMA:
        lse2 = lse_bufs.index(slot).load(col_layout) * 1.4426950408889634
    else:
        lse2 = lse_hbm * 1.4426950408889634
    pt = gl.exp2(st * qk_scale - lse2[None, :])  # P^T, (KR, BM)
    if CAUSAL:
        if i * BM < k0 + KR:  # the tile crosses the diagonal: query < key is masked
            pt = gl.where(offs_k[:, None] <= offs_q[None, :], pt, 0.0)
    pt = pt.to(dtype)  # the fp32 P^T is not kept: registers (dS^T is rounded to dtype anyway)
    pt_a = gl.convert_layout(pt, a_layout)
    dv_tok = warpgroup_mma(pt_a, do_i, dv, is_async=True)  # dV += P^T dO_i, while dS^T
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt_tok,))
    if STATS_TMA:
        delta = delta_bufs.index(slot).load(col_layout)
    else:
        delta = delta_hbm
    dst = (pt.to(gl.float32) * (dpt - delta[None, :])).to(dtype)  # dS^T, tau applied later
    dst_a = gl.convert_layout(dst, a_layout)
    dk_tok = warpgroup_mma(dst_a, q_i, dk, is_async=True)  # dK += dS^T Q_i
    return dv_tok, dk_tok, pt_a, dst_a, dst


@gluon.jit
def _send_dq(dq, dq_stage, part, dq_dst, row, col):
    """A (64, 64) fp32 part of dQ_i from the registers to shared memory (stage slot `part`) and
    into HBM by one TMA reduce-add at (row, col): read-modify-write 64*64 fp32, in L2, by the
    copy engine. The slot must be free (`tma.store_wait` seen by every thread)."""
    dq_buf = dq_stage.index(part)
    dq_buf.store(dq)
    fence_async_shared()  # the writes before the copy engine reads them
    _tma_reduce_add(dq_dst, [row, col], dq_buf)


@gluon.jit
def _bwd_tile(
    wg: gl.constexpr, ring, k_smem, k_rows, v_rows, ds_rows, dq_a, dq_offs, dq_stage, bars,
    dq_dst, dk_dst, dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, bh, k0, offs_k, first,
    n_steps, done, dk, dv, st_zero, dq_zero, q_rows, CAUSAL,
):  # fmt: skip
    """One key tile of a warpgroup: n_steps query tiles from `first`, then its dK and dV
    written out. `done`: the steps of the program's earlier tiles (slots and phases go on from
    there); returns done + n_steps. ring: as `_step_grads` takes it."""
    k_ready, k_free, v_ready, v_free, q_ready, q_free, do_ready, do_free, ds_ready, ds_free = bars
    q_bufs = ring[0]
    SLOTS: gl.constexpr = q_bufs.type.shape[0]
    BM: gl.constexpr = q_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = q_bufs.type.shape[2]
    KR: gl.constexpr = k_rows.type.shape[0]
    DQ_SPLIT: gl.constexpr = dq_a.type.shape[1] == 2 * KR  # dS over both warpgroups' keys
    DQ_TMA: gl.constexpr = dq_stage.type.shape[1] == 64
    DQ_N: gl.constexpr = 64
    DQ_M: gl.constexpr = 64
    DQ_PARTS: gl.constexpr = 1 if DQ_SPLIT else HEAD_DIM // DQ_N
    # Where this warpgroup's part of dQ_i starts (as `_bwd_warpgroup` splits it; constexprs, which
    # a slice of shared memory needs): split by rows at BM = 128, by columns at BM = 64.
    SPLIT_ROWS: gl.constexpr = DQ_SPLIT and BM == 2 * DQ_M
    DQ_ROW0: gl.constexpr = wg * DQ_M if SPLIT_ROWS else 0
    DQ_COL0: gl.constexpr = wg * DQ_N if DQ_SPLIT and not SPLIT_ROWS else 0
    # With the mask and 64-query steps, the second warpgroup's keys all lie right of the first
    # query tile (queries 128 j .. 128 j + 63, keys 128 j + 64 ..): when it adds its own part of
    # dQ_i it skips that step, only handing its ring slot back (the loader loaded it for both).
    skip = 0
    if not DQ_SPLIT and wg == 1 and BM == KR:  # (CAUSAL arrives as a tensor: a run-time test)
        if CAUSAL:
            phase = (done // SLOTS) & 1
            mbarrier.wait(q_ready.index(done % SLOTS), phase)  # this lap's: arrive after it
            mbarrier.wait(do_ready.index(done % SLOTS), phase)
            mbarrier.arrive(q_free.index(done % SLOTS), count=1)
            mbarrier.arrive(do_free.index(done % SLOTS), count=1)
            skip = 1
    for step in range(skip, n_steps):
        it = done + step  # the program's step count: ring slot, barrier phases
        i = first + step
        slot = it % SLOTS
        dv_tok, dk_tok, pt_a, dst_a, dst = _step_grads(
            ring, k_rows, v_rows, it, i, bh, seqlen_q, k0, offs_k, q_rows, dk, dv, st_zero,
            qk_scale, CAUSAL,
        )  # fmt: skip
        # In the tile's last step dP^T, V's last reader, is done: V goes back to the loader.
        mbarrier.arrive(v_free, count=1, pred=step == n_steps - 1)

        # dS^T into shared memory, where the dQ product reads it as dS.
        if DQ_SPLIT:  # both warpgroups' last dQ products have read ds_smem
            mbarrier.wait(ds_free.index(0), (it & 1) ^ 1)
        if DQ_TMA:  # the last step's reduce-adds have read dq_stage (the barrier below: all see it)
            tma.store_wait(0)
        ds_rows.store(dst)
        fence_async_shared()
        _thread_barrier()  # every thread of the warpgroup has written its part
        if DQ_SPLIT:  # and the other warpgroup its half
            mbarrier.arrive(ds_ready.index(0), count=1)
            mbarrier.wait(ds_ready.index(0), it & 1)
        if not DQ_TMA:
            dq_tile = dq_dst + (bh * seqlen_q + i * BM).to(gl.int64) * HEAD_DIM  # scalar pointer
        for h in gl.static_range(DQ_PARTS):
            if DQ_SPLIT:
                dq_b = k_smem.slice(DQ_COL0, DQ_N, dim=1)  # (BN, DQ_N)
            else:
                dq_b = k_rows.slice(h * DQ_N, DQ_N, dim=1)  # (KR, DQ_N)
            dq_tok = warpgroup_mma(dq_a, dq_b, dq_zero, use_acc=False, is_async=True)
            if h == 0:
                dv, dk, dq, pt_a, dst_a = warpgroup_mma_wait(
                    num_outstanding=0, deps=(dv_tok, dk_tok, dq_tok, pt_a, dst_a)
                )
                mbarrier.arrive(q_free.index(slot), count=1)  # dK, dV have read Q_i, dO_i
                mbarrier.arrive(do_free.index(slot), count=1)
                if DQ_SPLIT:
                    mbarrier.arrive(ds_free.index(0), count=1)
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok,))
            if DQ_TMA:
                _send_dq(
                    dq, dq_stage, wg * DQ_PARTS + h, dq_dst, bh * seqlen_q + i * BM + DQ_ROW0,
                    DQ_COL0 + h * DQ_N,
                )  # fmt: skip
            else:  # read-modify-write 64*DQ_N fp32, in L2, by the threads
                gl.atomic_add(dq_tile + h * DQ_N + dq_offs, dq, sem="relaxed")

    _store_dk_dv(dk, dv, dk_dst, dv_dst, bh * seqlen_k + k0, sm_scale, dq_stage, wg)
    return done + n_steps


@gluon.jit
def _store_dk_dv(dk, dv, dk_dst, dv_dst, row0, sm_scale, dq_stage, wg: gl.constexpr):
    """A warpgroup's (KR, d) dK (times tau) and dV into rows row0.. of the flat (B*H*N_K, d)
    gradients: write 2 KR d. dk_dst, dv_dst: descriptors (the launch's dkdv_tma, the default
    of persistent programs: `_store_dk_dv_tma`) or pointers (the threads' own stores)."""
    KR: gl.constexpr = dk.type.shape[0]
    HEAD_DIM: gl.constexpr = dk.type.shape[1]
    if dk_dst.dtype.is_ptr():
        dtype: gl.constexpr = dk_dst.dtype.element_ty
        rows = row0 + gl.arange(0, KR, layout=gl.SliceLayout(1, dk.type.layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dk.type.layout))
        offs = rows[:, None] * HEAD_DIM + cols[None, :]
        gl.store(dk_dst + offs, (dk * sm_scale).to(dtype))  # write KR*d
        gl.store(dv_dst + offs, dv.to(dtype))  # write KR*d
    else:
        _store_dk_dv_tma(dk, dv, dk_dst, dv_dst, row0, sm_scale, dq_stage, wg)


@gluon.jit
def _store_dk_dv_tma(dk, dv, dk_dst, dv_dst, row0, sm_scale, dq_stage, wg: gl.constexpr):
    """dK and dV through shared memory and the TMA, as FlashAttention-3's epilogue. Staged in
    this warpgroup's first dq_stage slot (16 KB: dK, then dV at d = 128; both at once at
    d = 64) once its last copy has read the slot, and not waited for: the copies run on while
    the next tile starts, and the slot's next writer waits for them (`tma.store_wait`). The
    threads' stores took 2.5 to 3.3 us a key tile in a persistent program (H100, 2026-12-06):
    the wgmma layout gives each warp instruction 8 rows of 16 bytes."""
    KR: gl.constexpr = dk.type.shape[0]
    HEAD_DIM: gl.constexpr = dk.type.shape[1]
    dtype: gl.constexpr = dk_dst.dtype
    PER_WG: gl.constexpr = dq_stage.type.shape[0] // 2  # slots per warpgroup
    SLOT_BYTES: gl.constexpr = dq_stage.type.shape[1] * dq_stage.type.shape[2] * 4
    N_BUF: gl.constexpr = 2 if SLOT_BYTES >= 2 * KR * HEAD_DIM * 2 else 1
    slot = dq_stage.index(wg * PER_WG)
    if _PUBLIC_REINTERPRET:
        bufs = slot.reinterpret(dtype, [N_BUF, KR, HEAD_DIM], dk_dst.layout)
    else:
        bufs = slot._reinterpret(dtype, [N_BUF, KR, HEAD_DIM], dk_dst.layout)
    tma.store_wait(0)  # the slot's last copy out (a dQ part, or the last tile's dV) has read it
    _thread_barrier()
    bufs.index(0).store((dk * sm_scale).to(dtype))
    fence_async_shared()  # the writes before the copy engine reads them
    _tma_store(dk_dst, [row0, 0], bufs.index(0))  # write KR*d
    if N_BUF == 1:
        tma.store_wait(0)
        _thread_barrier()
    bufs.index(N_BUF - 1).store(dv.to(dtype))
    fence_async_shared()
    _tma_store(dv_dst, [row0, 0], bufs.index(N_BUF - 1))  # write KR*d


@gluon.jit
def _lagged_dq(ds_smem, k_smem, ds_ready, wg: gl.constexpr, it, dq_zero):
    """Step it's dQ product, issued (not waited for) once both warpgroups have written their
    halves of its dS^T (buffer it % 2): this warpgroup's half of dQ_i's columns (BM = 64,
    d = 128) or rows (BM = 128, d = 64), over all BN keys."""
    BM: gl.constexpr = ds_smem.type.shape[2]
    DQ_M: gl.constexpr = 64
    DQ_N: gl.constexpr = 64
    buf = ds_smem.index(it % 2)  # dS^T: (BN, BM)
    mbarrier.wait(ds_ready.index(it % 2), (it // 2) & 1)
    if BM == 2 * DQ_M:
        dq_a = buf.slice(wg * DQ_M, DQ_M, dim=1).permute((1, 0))  # dS: (DQ_M, BN)
        dq_b = k_smem  # (BN, d = 64)
    else:
        dq_a = buf.permute((1, 0))  # dS: (BM, BN)
        dq_b = k_smem.slice(wg * DQ_N, DQ_N, dim=1)  # (BN, DQ_N)
    return warpgroup_mma(dq_a, dq_b, dq_zero, use_acc=False, is_async=True)


@gluon.jit
def _dq_done(dq, ds_smem, ds_free, dq_stage, dq_dst, wg: gl.constexpr, it, row_i):
    """Step it's dQ part is computed: this warpgroup hands its dS^T buffer back, and the part
    goes into HBM by one TMA reduce-add (row_i: the query tile's first row in the flat dQ)."""
    BM: gl.constexpr = ds_smem.type.shape[2]
    mbarrier.arrive(ds_free.index(it % 2), count=1)
    if BM == 128:
        _send_dq(dq, dq_stage, wg, dq_dst, row_i + wg * 64, 0)
    else:
        _send_dq(dq, dq_stage, wg, dq_dst, row_i, wg * 64)


@gluon.jit
def _lagged_dq_drain(ds_smem, k_tile, dq_stage, bars, dq_dst, wg: gl.constexpr, it, row_i, dq_zero):
    """Step it's dQ product with nothing beside it (a tile's or a program's last step): issued,
    waited for and sent once dq_stage is free."""
    dq_tok = _lagged_dq(ds_smem, k_tile, bars[8], wg, it, dq_zero)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok,))
    tma.store_wait(0)
    _thread_barrier()
    _dq_done(dq, ds_smem, bars[9], dq_stage, dq_dst, wg, it, row_i)


@gluon.jit
def _bwd_tile_lagged(
    wg: gl.constexpr, ring, k_smem, tile_i, k_rows, v_rows, ds_smem, dq_stage, bars, dq_dst,
    dk_dst, dv_dst, seqlen_q, seqlen_k, qk_scale, sm_scale, bh, k0, offs_k, first, n_steps,
    done, pend_row, dk, dv, st_zero, dq_zero, q_rows, CAUSAL,
):  # fmt: skip
    """`_bwd_tile` with the warpgroups sharing dS^T through two buffers, each step's dQ product
    one step late: step it writes its dS^T half into buffer it % 2 and then computes the dQ of
    step it - 1, whose other half the other warpgroup wrote a step ago, so neither waits for
    the other inside a step (FlashAttention-3's two dS stages). k_smem: all K buffers, this
    tile's is tile_i % K_BUFS. With one buffer the tile's last dQ goes after the loop; with two
    (CARRY, `_bwd_warpgroup`) it is left pending for the next tile's first step, and this one's
    first step computes the one pending from the tile before (pend_row: its row in the flat dQ;
    its K is in the other buffer), then hands that K buffer back. Returns (done + n_steps, the
    last step's row, this tile's K buffer): the step left pending."""
    k_ready, k_free, v_ready, v_free, q_ready, q_free, do_ready, do_free, ds_ready, ds_free = bars
    q_bufs = ring[0]
    SLOTS: gl.constexpr = q_bufs.type.shape[0]
    BM: gl.constexpr = q_bufs.type.shape[1]
    KR: gl.constexpr = k_rows.type.shape[0]
    K_BUFS: gl.constexpr = k_smem.type.shape[0]
    CARRY: gl.constexpr = K_BUFS == 2
    kb = tile_i % K_BUFS
    row_q = bh * seqlen_q + first * BM  # the key tile's first query row in the flat dQ
    for step in range(n_steps):
        it = done + step
        i = first + step
        slot = it % SLOTS
        dv_tok, dk_tok, pt_a, dst_a, dst = _step_grads(
            ring, k_rows, v_rows, it, i, bh, seqlen_q, k0, offs_k, q_rows, dk, dv, st_zero,
            qk_scale, CAUSAL,
        )  # fmt: skip
        # In the tile's last step dP^T, V's last reader, is done: V goes back to the loader.
        mbarrier.arrive(v_free, count=1, pred=step == n_steps - 1)
        # dS^T into buffer it % 2 once both warpgroups' dQ of step it - 2 have read it.
        mbarrier.wait(ds_free.index(it % 2), ((it // 2) & 1) ^ 1)
        tma.store_wait(0)  # the last reduce-add has read dq_stage (the barrier: all see it)
        ds_smem.index(it % 2).slice(wg * KR, KR).store(dst)
        fence_async_shared()
        _thread_barrier()  # every thread of the warpgroup has written its part
        mbarrier.arrive(ds_ready.index(it % 2), count=1)
        # The previous step's dQ, while dV and dK run: this tile's, or with CARRY the last
        # tile's (not in the program's first step).
        if CARRY:
            has_prev = it > 0
        else:
            has_prev = step > 0
        if has_prev:
            row_prev = row_q + (step - 1) * BM
            if CARRY:  # in the first step: the last tile's (its K in the other buffer)
                first_step = (step == 0).to(gl.int32)
                k_prev = k_smem.index(kb ^ first_step)
                row_prev += first_step * (pend_row - row_prev)
            else:
                k_prev = k_smem.index(0)
            dq_tok = _lagged_dq(ds_smem, k_prev, ds_ready, wg, it - 1, dq_zero)
            dv, dk, dq, pt_a, dst_a = warpgroup_mma_wait(
                num_outstanding=0, deps=(dv_tok, dk_tok, dq_tok, pt_a, dst_a)
            )
            _dq_done(dq, ds_smem, ds_free, dq_stage, dq_dst, wg, it - 1, row_prev)
            if CARRY:  # the last tile's K has had its last reader
                mbarrier.arrive(k_free.index(kb ^ 1), count=1, pred=step == 0)
        else:
            dv, dk, pt_a, dst_a = warpgroup_mma_wait(
                num_outstanding=0, deps=(dv_tok, dk_tok, pt_a, dst_a)
            )
        mbarrier.arrive(q_free.index(slot), count=1)  # dK, dV have read Q_i, dO_i
        mbarrier.arrive(do_free.index(slot), count=1)
    last_row = row_q + (n_steps - 1) * BM
    if not CARRY:
        _lagged_dq_drain(ds_smem, k_smem.index(0), dq_stage, bars, dq_dst, wg,
                         done + n_steps - 1, last_row, dq_zero)  # fmt: skip
    _store_dk_dv(dk, dv, dk_dst, dv_dst, bh * seqlen_k + k0, sm_scale, dq_stage, wg)
    return done + n_steps, last_row, kb


@gluon.jit
def _attn_bwd_ws_kernel(
    q_desc,  # (B*H*N_Q, d), tiles of (BLOCK_M, d)
    k_desc,  # (B*H*N_K, d), tiles of (BLOCK_N, d)
    v_desc,  # (B*H*N_K, d), tiles of (BLOCK_N, d)
    do_desc,  # (B*H*N_Q, d), tiles of (BLOCK_M, d)
    dq_dst,  # (B*H*N_Q, d) fp32, zeroed: sum over key tiles of dS K (tau applied by the host);
    # a descriptor with tiles of (64, 64) when DQ_TMA, else a pointer
    dk_dst,  # (B*H*N_K, d), q's dtype: a descriptor with tiles of (64, d), or a pointer
    dv_dst,  # (B*H*N_K, d), as dk_dst
    lse_src,  # (B*H*N_Q,) fp32, natural log: a descriptor with tiles of BLOCK_M when STATS_TMA,
    # else a pointer
    delta_src,  # (B*H*N_Q,) fp32: D = rowsum(dO * O), as lse_src
    tile_src,  # (1,) int32, zeroed: with DYNAMIC the count of tiles taken past the first P
    seqlen_q,
    seqlen_k,
    n_bh,  # B*H
    qk_scale,  # tau * log2(e)
    sm_scale,  # tau
    CAUSAL: gl.constexpr,
    NUM_SLOTS: gl.constexpr,
    DQ_SPLIT: gl.constexpr,  # the warpgroups split dQ_i's columns (d = 128 only)
    DQ_TMA: gl.constexpr,  # dQ added by TMA reduce-adds from shared memory, not thread atomics
    STATS_TMA: gl.constexpr,  # lse_i and D_i come through the TMA with Q_i and dO_i
    DQ_LAG: gl.constexpr,  # DQ_SPLIT's dS^T in two buffers, each step's dQ one step late
    K_BUFS: gl.constexpr = 1,  # K's buffers: 2 lets persistent programs load the next tile's early
    DYNAMIC: gl.constexpr = False,  # each program takes its next key tile from tile_src's counter
):
    """grid (P,): P programs take the B*H*N_K/BLOCK_N key tiles in turn (`_key_tile`), or with
    DYNAMIC each its next when it is ready for one (`_bwd_loader`); with P = the number of
    tiles, one each."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    q_bufs = gl.allocate_shared_memory(dtype, [NUM_SLOTS, BM, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [NUM_SLOTS, BM, HEAD_DIM], do_desc.layout)
    # K in K_BUFS buffers (two: the next tile's arrives during this one's last steps), V in one
    k_smem = gl.allocate_shared_memory(dtype, [K_BUFS, BN, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, HEAD_DIM], v_desc.layout)
    if DQ_LAG:  # two of DQ_SPLIT's buffers, used in turn
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_layout)
    elif DQ_SPLIT:  # dS^T of both warpgroups, read whole by each one's dQ product
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [BN, BM], ds_layout)
    else:  # one (BN / 2, BM) dS^T per warpgroup
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN // 2, BM], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BN // 2, BM], ds_layout)
    # The staging of dQ_i's parts for the TMA, (64, 64) fp32 each: warpgroup wg's part h in
    # slot wg * DQ_PARTS + h.
    DQ_PARTS: gl.constexpr = 1 if DQ_SPLIT else HEAD_DIM // 64
    if DQ_TMA:
        dq_stage = gl.allocate_shared_memory(gl.float32, [2 * DQ_PARTS, 64, 64], dq_dst.layout)
    elif not dk_dst.dtype.is_ptr():  # only dK's and dV's staging (`_store_dk_dv`): 16 KB each
        stage_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([128, 32], gl.float32)
        dq_stage = gl.allocate_shared_memory(gl.float32, [2, 128, 32], stage_layout)
    else:  # unused
        unused_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, 32], gl.float32)
        dq_stage = gl.allocate_shared_memory(gl.float32, [1, 8, 32], unused_layout)
    if STATS_TMA:  # lse_i and D_i in the ring, beside Q_i and dO_i: (NUM_SLOTS, BM) fp32 each
        lse_bufs = gl.allocate_shared_memory(gl.float32, [NUM_SLOTS, BM], lse_src.layout)
        delta_bufs = gl.allocate_shared_memory(gl.float32, [NUM_SLOTS, BM], delta_src.layout)
    else:  # unused
        stats_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8], gl.float32)
        lse_bufs = gl.allocate_shared_memory(gl.float32, [1, 8], stats_layout)
        delta_bufs = gl.allocate_shared_memory(gl.float32, [1, 8], stats_layout)
    # With DYNAMIC the number of the tile in each K buffer (`_publish_tile`); else unused, its
    # shape (1, 2) telling the partitions so (constexprs arrive there as tensors).
    ids_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # as mbarriers
    if DYNAMIC:
        tile_ids = gl.allocate_shared_memory(gl.int32, [K_BUFS, 1], ids_layout)
    else:
        tile_ids = gl.allocate_shared_memory(gl.int32, [1, 2], ids_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [K_BUFS, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [K_BUFS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    do_free = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(K_BUFS):
        mbarrier.init(k_ready.index(b), count=1)
        mbarrier.init(k_free.index(b), count=2)  # both warpgroups are done with a tile's K
    mbarrier.init(v_ready, count=1)
    mbarrier.init(v_free, count=2)  # both warpgroups have computed a tile's last dP^T
    for b in gl.static_range(2):  # (the second buffer's only with DQ_LAG)
        mbarrier.init(ds_ready.index(b), count=2)  # both warpgroups have written their dS^T
        mbarrier.init(ds_free.index(b), count=2)  # both warpgroups' dQ products have read it
    for s in gl.static_range(NUM_SLOTS):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(do_ready.index(s), count=1)
        mbarrier.init(q_free.index(s), count=2)  # both warpgroups release a slot
        mbarrier.init(do_free.index(s), count=2)
    bars = (k_ready, k_free, v_ready, v_free, q_ready, q_free, do_ready, do_free, ds_ready, ds_free)
    grad_args = (
        bars, dq_dst, dk_dst, dv_dst, lse_src, delta_src, seqlen_q, seqlen_k, n_bh, qk_scale,
        sm_scale, CAUSAL,
    )  # fmt: skip
    smem = (q_bufs, do_bufs, k_smem, v_smem, ds_smem, lse_bufs, delta_bufs, tile_ids)
    loader_args = (
        q_desc, k_desc, v_desc, do_desc, lse_src, delta_src, q_bufs, do_bufs, k_smem, v_smem,
        lse_bufs, delta_bufs, tile_ids, tile_src, bars, seqlen_q, seqlen_k, n_bh, CAUSAL,
    )  # fmt: skip
    gl.warp_specialize(
        [
            (_bwd_warpgroup, (0,) + smem + (dq_stage,) + grad_args),
            (_bwd_warpgroup, (1,) + smem + (dq_stage,) + grad_args),
            (_bwd_loader, loader_args),
        ],
        [4, 1],
        [GRAD_REGS, LOADER_REGS],
    )
