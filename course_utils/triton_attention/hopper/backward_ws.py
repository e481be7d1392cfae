"""A warp-specialized FlashAttention backward for Hopper (sm_90), written in Gluon.

The course backward (`../backward.py`) runs two gradient kernels, one for dK and dV and one for dQ,
so that no program writes where another does; S and dP are computed in both (seven N^2 d matrix
products). This variant computes all three gradients in one pass over the tile pairs, as
FlashAttention-2 and -3 do: five products, dQ added into an fp32 buffer.

One program per key tile of BLOCK_N = 128 keys (or, with persistent=True, one per SM taking
key tiles in turn: with dynamic, each its next tile from a counter when it is ready for one, so
that a program slowed by its tiles or its place in L2 leaves the rest to the others); each
program's warps split by job:

    loader      1 warp: TMA copies of a key tile's K and V, then of each query tile's Q_i and
                dO_i (BLOCK_M = 64 rows, 128 at d = 64), with its lse_i and D_i, into a ring of
                NUM_SLOTS slots (mbarriers say when a slot is full and when it is free). V,
                whose last reader is a tile's last dP^T, is handed back right after it; with
                persistent programs K has two buffers (k_bufs): the next tile's K
                arrives while this tile's last steps still read the other, so the next tile's
                operands are in shared memory when its first step starts
    gradient x2 two warpgroups, each owning 64 of the 128 keys: on the tensor cores (wgmma)

                    S^T  = K Q_i^T           P^T = exp(tau S^T - lse_i)    (64 keys x BLOCK_M)
                    dP^T = V dO_i^T          dS^T = P^T * (dP^T - D_i)
                    dV  += P^T dO_i          dK  += dS^T Q_i               (registers, 64 x d)
                    dQ_i += dS K             (shared memory, then one TMA reduce-add into HBM)

                and at a key tile's end its dK and dV: in persistent programs (dkdv_tma)
                written into the warpgroup's dQ staging in shared memory and copied out by the
                TMA while the next tile starts, else stored by the threads

dS^T goes through shared memory, where the dQ product reads it transposed. With dq_split the two
warpgroups share their dS^T halves (an mbarrier between them) and each computes half of dQ_i over
all 128 keys: half its columns at d = 128 (32 accumulator registers a thread instead of 64, half
the adds), half its rows with 128-query steps at d = 64. Otherwise each warpgroup adds its own
keys' part of dQ_i and never waits for the other (with the mask, at d = 128, that was faster).
With dq_lag (the default at d = 64, and at d = 128 with the mask) the shared dS^T has two
buffers and each step computes the previous step's dQ (FlashAttention-3's two dS stages): the
other warpgroup has had a whole step to write its half, so the two need not meet inside a step
and their exponential phases drift apart, leaving the tensor cores less idle. With two K buffers
the lag runs on across a persistent program's key tiles: a tile's last dQ product goes into the
next tile's first step, so that no product runs alone at either end of a tile.
dQ_i leaves as FlashAttention-3 sends it: written to shared memory in fp32 and added
into HBM by one TMA bulk reduce-add (`cp.reduce.async.bulk.tensor ... add`), not by the threads'
atomics; Triton 3.6 has the operation but no Gluon name for it, so `_tma_reduce_add` emits it.
lse_i and D_i are read from the ring just when the exponentials and dS^T need them: a thread
holds 16 (32) query columns of each, which it would otherwise keep in registers, with their
64-bit addresses, through the step's products.

HBM traffic per head, N queries and keys: K, V read once; Q, dO, lse and D once per key tile
(N / 128 times, most re-reads from L2); dK, dV written once (by the TMA); dQ
read-modified-written in fp32 once per key tile (by the TMA, in L2; twice without dq_split),
then scaled and cast once. Shapes it takes: `forward_ws.supported` (Hopper, float16 or
bfloat16, d 64 or 128, contiguous, lengths multiples of 128).

Measured on the H200 (docs/journal.md, "Gluon backward" runs 1 to 9, each variant against the
others, the course backward and SDPA's in one run): the TMA reduce-add made it 1.12 to 1.36 times
faster than with the threads' atomics; lse and D through the TMA 1.04 to 1.23 times; 128-query
steps at d = 64 1.01 to 1.07 times; the lagged dQ 1.00 to 1.17 times where it is the default.
From 4k keys it ran at 0.90 to 1.00 of cuDNN and 1.03 to 1.32 times the course backward then;
with dK and dV copied out by the TMA (H100, 2026-12-06, journal "dK and dV through the TMA")
the autograd function's backward ran at 0.95 to 1.08 of cuDNN up to 4k keys, 1.08 to 1.26 times
the course's at 1k. `flash_attention` runs it wherever it takes the shape (`preferred`, asked
by `autograd.pick_kernel`). Lost and taken
out or left off: issuing each step's S^T and dP^T during the step before (spills at d = 128:
0.57 to 0.71 times as fast). Persistent programs were level or behind at 4k and 16k keys in run 5
(dealt by key tile with the mask); dealt head by head they are ahead up to 4k keys on an H200
(2026-12-05, `persistent_default`), and so the default there; at d = 64 at every length, past
4k keys with dK and dV stored by the threads (H100, 2026-12-06, `dkdv_tma_default`).
`python -m benchmarks.backward_ws` times it.

This module is the host side (the launch, its options and their measured defaults, `preferred`,
`compile_for_sm90`); the @gluon.jit device code is `backward_ws_kernel`.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental.gluon import language as gl

from course_utils._validate import softmax_scale_or_default
from course_utils.triton_attention.backward import (
    PREPROCESS_BLOCK_M,
    _attn_bwd_preprocess_kernel,
    _check_backward_inputs,
)
from course_utils.triton_attention.forward import _bind_cuda_context
from course_utils.triton_attention.hopper.backward_ws_kernel import _attn_bwd_ws_kernel
from course_utils.triton_attention.hopper.forward_ws import (
    _GL_DTYPES,
    HEAD_DIMS,
    SHARED_LIMIT,
    TensorDescriptor,
    _descriptor,
    _sm_count,
    descriptor_signature,
    shared_layout,
    supported,
)
from course_utils.triton_attention.launch import LaunchCache, descriptor

LOG2E = 1.4426950408889634
BLOCK_M = 64  # query rows per step (block_m=128 at d = 64: FlashAttention-3's step there)
BLOCK_MS = (64, 128)
DQ_ROWS = 64  # rows of dQ_i in one product and one reduce-add: a warpgroup's wgmma M
BLOCK_N = 128  # keys per program: two warpgroups of 64
NUM_SLOTS = 2  # Q/dO ring depth (3 at d = 64 without the mask: `num_slots_default`)
DQ_TMA_DEFAULT = True  # dQ by TMA reduce-adds (False: by the threads' atomics, runs 1 and 2)
PERSISTENT_MAX_KEYS = 4096  # persistent programs by default up to this many keys
STATS_TMA_DEFAULT = True  # lse_i, D_i through the TMA with Q_i, dO_i (False: loaded every step)
MAXNREG = 168  # as forward_ws: 12 warps x 32 threads x 168 <= 65,536 registers


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


def flash_attention_bwd_ws(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    num_slots: int | None = None,
    dq_split: bool | None = None,
    dq_tma: bool = DQ_TMA_DEFAULT,
    persistent: bool | None = None,
    stats_tma: bool = STATS_TMA_DEFAULT,
    block_m: int | None = None,
    dq_lag: bool | None = None,
    k_bufs: int | None = None,
    dkdv_tma: bool | None = None,
    dynamic: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) as `backward.flash_attention_bwd`, by the warp-specialized kernel
    (Hopper only; ValueError naming what `forward_ws.supported` refuses).

    Args and shapes as flash_attention_bwd; num_slots: the Q/dO ring's depth (1 to 3);
    dq_split: at d = 128 the two warpgroups share their dS^T and each computes half of dQ_i's
    columns (half the adds; without dq_lag a wait for each other every step), else each adds
    its own keys' part of all columns (default `dq_split_default(d, causal, dq_lag)`); dq_tma:
    each part of dQ_i is added by one TMA reduce-add from shared memory (True) or by the
    threads' atomic adds (False);
    persistent: one program per SM takes the key tiles in turn, so one tile's dK and dV are
    written while the next one's K and V arrive (False: one program per key tile; default
    `persistent_default(d, causal, N_K)`); stats_tma:
    the loader brings each query tile's lse and D into shared memory with Q_i and dO_i (True),
    else each gradient thread loads its 2 x 16 of them from HBM every step; block_m: query rows
    per step, 64 or (at d = 64 only) 128, where the warpgroups share dS^T and each computes 64
    rows of dQ_i (default `block_m_default(d)`); dq_lag: where the warpgroups share dS^T, two
    dS^T buffers and each step's dQ product one step late, so that they do not wait for each
    other inside a step (needs dq_tma; default `dq_lag_default(d, causal, persistent)`);
    k_bufs: K's shared-memory buffers, 1 or 2 (with 2 a persistent program loads its next key
    tile's K while this one's last steps run; default `k_bufs_default`); dkdv_tma: each key
    tile's dK and dV leave through shared memory and TMA copies that run on while the next tile
    starts (default: with persistent programs), else by the threads' own stores; dynamic:
    persistent programs take each next key tile from a counter when they are ready for one,
    not dealt in advance (default `dynamic_default(persistent, causal)`).
    Defaults and refusals: `launch_options`. Extra memory: an fp32 dQ of q's shape.
    """
    _check_backward_inputs(do, q, k, v, out, lse, causal)
    reason = supported(q, k, v, causal)
    if reason is not None:
        raise ValueError(f"flash_attention_bwd_ws: {reason}")
    batch, heads, n_q, d = q.shape
    for name, t in (("do", do), ("out", out), ("lse", lse)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if persistent is None:
        persistent = persistent_default(d, causal, k.shape[2])
    opts = launch_options(
        d, causal, num_slots, dq_split, dq_tma, stats_tma, block_m, dq_lag, bool(persistent),
        k_bufs, dkdv_tma, n_k=k.shape[2], dynamic=dynamic,
    )  # fmt: skip
    scale = float(softmax_scale_or_default(softmax_scale, d))
    if q.numel() == 0:  # no query: out does not depend on q, k, v (as the course backward)
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    return launch(do, q, k, v, out, lse, causal, scale, opts)


def backward_checked(do, q, k, v, out, lse, causal: bool, scale: float):
    """(dq, dk, dv) as `flash_attention_bwd_ws` with the default options, for what `autograd`
    saved and checked once per shape (q, k, v, out contiguous, `supported`, lse its own) and a
    contiguous do of out's shape and dtype: nothing here repeats a check."""
    d, n_k = q.shape[3], k.shape[2]
    persistent = persistent_default(d, causal, n_k)
    opts = _default_options(d, causal, persistent, dkdv_tma_default(persistent, n_k))
    return launch(do, q, k, v, out, lse, causal, scale, opts)


@functools.lru_cache(maxsize=16)
def _default_options(d: int, causal: bool, persistent: bool, dkdv_tma: bool) -> dict:
    """launch_options' defaults for the two choices that depend on the keys, kept per shape."""
    return launch_options(d, causal, persistent=persistent, dkdv_tma=dkdv_tma)


_PREPROCESS = LaunchCache(_attn_bwd_preprocess_kernel)
_LAUNCHES = LaunchCache(_attn_bwd_ws_kernel)


def launch(do, q, k, v, out, lse, causal: bool, scale: float, opts: dict):
    """The two launches of the backward (D = rowsum(dO * O), then the gradients) over checked
    inputs, with `launch_options`' opts: the first at a key through the JIT with checked
    descriptors, later ones straight to the compiled kernels (`launch.LaunchCache`)."""
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    num_slots, dq_split, block_m = opts["num_slots"], opts["dq_split"], opts["block_m"]
    dq_tma, stats_tma, dq_lag = opts["dq_tma"], opts["stats_tma"], opts["dq_lag"]
    bh = batch * heads
    device = q.device
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=device)
    aligned = all(t.data_ptr() % 16 == 0 for t in (do, q, k, v, out))
    grid = (triton.cdiv(n_q, PREPROCESS_BLOCK_M), bh)
    _PREPROCESS(
        (q.dtype, device, n_q, bh, d, aligned),
        grid,
        (out, do, delta, n_q),
        {"HEAD_DIM": d, "BLOCK_D": d, "BLOCK_M": PREPROCESS_BLOCK_M},
        {},
    )  # read 2 N d, write N per head
    # dQ in fp32 and, after it, the counter of dynamic launches: zeroed by one fill
    zeroed = torch.zeros(q.numel() + 4, dtype=torch.float32, device=device)
    dq32 = zeroed[: q.numel()].view(q.shape)
    counter = zeroed[q.numel() :].view(torch.int32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _bind_cuda_context(device)
    if stats_tma and lse.data_ptr() % 16:  # the TMA wants a 16-byte aligned base
        lse = lse.clone()
    n_tiles = n_k // BLOCK_N * bh
    # persistent: one program per SM (its shared memory allows no second), tiles in turn
    programs = min(n_tiles, _sm_count(device)) if opts["persistent"] else n_tiles
    key = (q.dtype, device, n_q, n_k, bh, programs, causal, tuple(opts.items()), aligned,
           lse.data_ptr() % 16 == 0)  # fmt: skip
    checked = not aligned or key not in _LAUNCHES
    dq_dst = _dq_descriptor(dq32, checked) if dq_tma else dq32
    if opts["dkdv_tma"]:
        dk_dst, dv_dst = _descriptor(dk, DQ_ROWS, checked), _descriptor(dv, DQ_ROWS, checked)
    else:
        dk_dst, dv_dst = dk, dv
    if stats_tma:
        lse_src = _stats_descriptor(lse, block_m, checked)
        delta_src = _stats_descriptor(delta, block_m, checked)
    else:
        lse_src, delta_src = lse, delta
    args = (
        _descriptor(q, block_m, checked), _descriptor(k, BLOCK_N, checked),
        _descriptor(v, BLOCK_N, checked), _descriptor(do, block_m, checked), dq_dst, dk_dst,
        dv_dst,
        lse_src, delta_src, counter, n_q, n_k, bh, scale * LOG2E, scale,
    )  # fmt: skip
    constexprs = {
        "CAUSAL": causal, "NUM_SLOTS": num_slots, "DQ_SPLIT": dq_split, "DQ_TMA": dq_tma,
        "STATS_TMA": stats_tma, "DQ_LAG": dq_lag, "K_BUFS": opts["k_bufs"],
        "DYNAMIC": opts["dynamic"],
    }  # fmt: skip
    _LAUNCHES(key, (programs,), args, constexprs, {"num_warps": 4, "maxnreg": MAXNREG})
    dq = torch.empty_like(q)
    torch.mul(dq32, scale, out=dq)  # scaled in fp32, cast as stored: one elementwise kernel
    return dq, dk, dv


def launch_options(
    d: int, causal: bool, num_slots: int | None = None, dq_split: bool | None = None,
    dq_tma: bool = DQ_TMA_DEFAULT, stats_tma: bool = STATS_TMA_DEFAULT,
    block_m: int | None = None, dq_lag: bool | None = None, persistent: bool = False,
    k_bufs: int | None = None, dkdv_tma: bool | None = None, n_k: int | None = None,
    dynamic: bool | None = None,
) -> dict:  # fmt: skip
    """The kernel's options at head dimension d, as a launch and `compile_for_sm90` take them
    (persistent: the launch's grid, which moves the lag's default; n_k: the keys, where known): each
    None replaced by its measured default (`block_m_default`, `dq_lag_default`, `dq_split_default`,
    `num_slots_default`, `k_bufs_default`, `dkdv_tma_default`, `dynamic_default`), dq_split as
    the kernel reads it (True where the warpgroups share dS^T), and a ValueError naming the
    argument for a combination the kernel cannot take or whose buffers pass the H200's shared
    memory (`shared_bytes`)."""
    block_m = block_m_default(d) if block_m is None else block_m
    if block_m not in BLOCK_MS or (block_m == 128 and d != 64):
        raise ValueError(
            f"block_m must be one of {BLOCK_MS} (128 only at d = 64: at d = 128 the step's "
            f"accumulators pass a thread's 240 registers), got {block_m!r} at d = {d}"
        )
    # At d = 64 and 64 rows a half would be 32 columns, below a wgmma tile; at 128 rows the
    # warpgroups always split dQ_i's rows (each one's own keys' part would take 64 registers).
    can_share = block_m == 128 or (d == 128 and (dq_split is None or bool(dq_split)))
    if dq_lag is None:
        dq_lag = dq_lag_default(d, causal, persistent) and can_share and bool(dq_tma)
    dq_lag = bool(dq_lag)
    dq_split = dq_split_default(d, causal, dq_lag) if dq_split is None else bool(dq_split)
    dq_split = (dq_split and d == 128) or block_m == 128
    if dq_lag and not (dq_split and dq_tma):
        raise ValueError(
            "dq_lag needs the warpgroups to share dS^T (dq_split at d = 128, or block_m=128) "
            f"and dq_tma, got dq_split={dq_split}, dq_tma={dq_tma} at d = {d}"
        )
    num_slots = num_slots_default(d, causal, dq_lag) if num_slots is None else num_slots
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or not 1 <= num_slots <= 3:
        raise ValueError(f"num_slots must be an int from 1 to 3, got {num_slots!r}")
    dkdv_tma = dkdv_tma_default(persistent, n_k) if dkdv_tma is None else bool(dkdv_tma)
    if k_bufs is None:
        with_two = shared_bytes(
            d, num_slots, dq_split, dq_tma, stats_tma, block_m, dq_lag, 2, dkdv_tma
        )
        k_bufs = k_bufs_default(persistent, with_two)
    if isinstance(k_bufs, bool) or not isinstance(k_bufs, int) or k_bufs not in (1, 2):
        raise ValueError(f"k_bufs must be 1 or 2, got {k_bufs!r}")
    dynamic = dynamic_default(persistent, causal) if dynamic is None else dynamic
    if not isinstance(dynamic, bool) or (dynamic and not persistent):
        raise ValueError(
            "dynamic must be True or False, and True only with persistent programs (one program "
            f"a key tile has no next tile to take), got dynamic={dynamic!r}, "
            f"persistent={persistent!r}"
        )
    need = shared_bytes(
        d, num_slots, dq_split, dq_tma, stats_tma, block_m, dq_lag, k_bufs, dkdv_tma
    )
    if need > SHARED_LIMIT:
        raise ValueError(
            f"num_slots={num_slots}, dq_split={dq_split}, dq_tma={dq_tma}, "
            f"stats_tma={stats_tma}, block_m={block_m}, dq_lag={dq_lag}, k_bufs={k_bufs} at "
            f"d = {d} need {need} bytes of shared memory, more than the {SHARED_LIMIT} a "
            "program can have"
        )
    return {
        "num_slots": num_slots, "dq_split": dq_split, "dq_tma": bool(dq_tma),
        "stats_tma": bool(stats_tma), "block_m": block_m, "dq_lag": dq_lag,
        "persistent": bool(persistent), "k_bufs": k_bufs, "dkdv_tma": dkdv_tma,
        "dynamic": dynamic,
    }  # fmt: skip


def k_bufs_default(persistent: bool, shared_with_two: int) -> int:
    """K's buffers: 2 for persistent programs where the second fits in shared memory
    (shared_with_two: the program's bytes with two), so that the loader brings the next key
    tile's K while this tile's last steps still read the other, and the lag runs on across
    tiles; else 1 (one program a key tile has no next tile). Measured on an H100, 2026-12-06
    (journal "dK and dV through the TMA"), two against one in the same rotating rounds, with
    dK and dV copied out by the TMA: 1.01 to 1.09 times at 1k keys and at d = 64, with the mask
    or without; level at d = 128, 4k (0.98 to 1.00). (With the threads' stores the day's earlier
    rounds had the mask at 0.98 to 0.99 times.)"""
    return 2 if persistent and shared_with_two <= SHARED_LIMIT else 1


def dkdv_tma_default(persistent: bool, n_k: int | None = None) -> bool:
    """Whether dK and dV leave through shared memory and TMA copies: for persistent programs up to
    PERSISTENT_MAX_KEYS keys (n_k None: taken as within them). Measured on an H100, 2026-12-06
    (journal "dK and dV through the TMA", "The backward's grid twice"): ahead where a program goes
    on to another key tile soon (1.03 to 1.31 times at 1k to 4k keys; 1.07 times the threads' stores
    at d = 128, 4k); behind with one program a key tile (0.87 of cuDNN at d = 128, 16k, against 0.94
    to 0.99 with the stores) and, at 16k, for the persistent programs too (at d = 64 the stores ran
    461 and 420 TFLOP/s against 448 and 403 by the TMA, without and with the mask)."""
    return bool(persistent) and (n_k is None or n_k <= PERSISTENT_MAX_KEYS)


def dynamic_default(persistent: bool, causal: bool = False) -> bool:
    """Whether persistent programs take each next key tile from a counter (`_bwd_loader`) rather
    than a share dealt in advance: without the mask. Measured on an H100, 2026-12-07 07:38-07:41 UTC
    (journal "Tiles taken from a counter, rebuilt on main"), both in the same rotating rounds, d =
    128: without the mask 371 against 370 TFLOP/s at 1k keys and 477 against 454 at 4k (cuDNN 400
    and 482), so a program slowed by its tiles or its place in L2 leaves the rest to the others;
    with the mask 260 against 278 at 1k and 386 against 408 at 4k (cuDNN 287 and 435): there key
    tiles differ in length, the counter hands them out head by head and the last long ones start
    late, where the dealt snake gives every program the same work."""
    return bool(persistent) and not causal


def block_m_default(d: int) -> int:
    """Query rows per step at head dimension d: 128 at d = 64 (up to 1.07 times as fast as 64
    in Gluon backward run 7, docs/journal.md), 64 at d = 128 (128 does not fit)."""
    return 128 if d == 64 else BLOCK_M


def dq_lag_default(d: int, causal: bool, persistent: bool = False) -> bool:
    """Whether each step's dQ comes one step late from two dS^T buffers: at d = 64, and at
    d = 128 with the mask or with persistent programs (Gluon backward run 9, docs/journal.md:
    1.00 to 1.11 times the best unlagged variant at d = 64, 1.06 to 1.17 times at d = 128 with
    the mask). At d = 128 without the mask, one program per key tile, it lost (0.96 to 0.98
    times the shared dS^T without the lag); with persistent programs it won there (1.03 to
    1.05 times at 1k to 4k keys, H200, journal "Backward at short lengths", 2026-12-05)."""
    return d == 64 or causal or persistent


def persistent_default(d: int, causal: bool, n_k: int) -> bool:
    """Whether one program per SM takes the key tiles in turn (else one program per key tile):
    up to PERSISTENT_MAX_KEYS keys. Measured on an H200, 2026-12-05 (journal "Backward at short
    lengths"), persistent against one program a tile, with the defaults of each: d = 128 with
    the mask 1.03 to 1.04 times at 1k to 4k keys; without it, lagged, 1.02 to 1.04 times the
    unlagged default; d = 64 without the mask 1.02 to 1.05 times. d = 64 with the mask, level
    at 2k and 0.96 times at 4k then, is 1.15, 1.05 and 1.02 times at 1k, 2k and 4k (255 against
    222 TFLOP/s at 1k) since dK and dV leave through the TMA with the lag carried across tiles
    (H100, 2026-12-06). Past PERSISTENT_MAX_KEYS, at d = 64 too (with the threads' stores,
    `dkdv_tma_default`; H100, 2026-12-06, 16k keys: 461 against 401 TFLOP/s for one program a
    tile without the mask, 420 against 413 with it, cuDNN 438 and 409); at d = 128 one program a
    tile stays (495 against 489 without the mask, 500 against 466 with it). causal: what the
    next measurement may split on (it does not now)."""
    del causal
    return n_k <= PERSISTENT_MAX_KEYS or d == 64


def num_slots_default(d: int, causal: bool, dq_lag: bool = False) -> int:
    """The Q/dO ring's depth: 3 at d = 64 without the mask and without the lag (1.00 to 1.03
    times as fast as 2 in Gluon backward runs 7 and 8), else 2 (with the mask 3 lost 1 to 6 %;
    with the lag's second dS^T buffer 3 slots pass shared memory at d = 64)."""
    return 3 if d == 64 and not causal and not dq_lag else NUM_SLOTS


def dq_split_default(d: int, causal: bool, dq_lag: bool = False) -> bool:
    """Whether the warpgroups share dS^T at d = 128: without the mask (half the dQ reduce-adds:
    1.06 to 1.09 times as fast in runs 7 and 8), and with the lag, which needs it. With the mask
    and without the lag each adds its own keys' part (1.11 to 1.15 times as fast as sharing
    without the lag: no wait for each other every step)."""
    return d == 128 and (dq_lag or not causal)


def preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether `flash_attention` (kernels="auto") should run this kernel rather than the course
    backward (`autograd.pick_kernel` asks): wherever it takes the shape. From 2k keys it was
    1.03 to 1.32 times the course backward (H200, Gluon backward run 9); at 1k keys, with dK
    and dV through the TMA, 1.17 to 1.26 times at d = 128 and 1.08 to 1.13 times at d = 64
    (H100, 2026-12-06, rotating rounds), where the course's kernels had been ahead at d = 64."""
    return supported(q, k, v, causal) is None


DQ_COLS = 64  # columns of dQ_i in one product and one reduce-add


def _dq_descriptor(dq32: torch.Tensor, checked: bool = True) -> TensorDescriptor:
    """A 2-D (B*H*N_Q, d) descriptor over the fp32 dQ, tiles of (64, 64): the reduce-adds'
    (checked=False: `forward_ws._descriptor`'s)."""
    d = dq32.shape[-1]
    flat = dq32.view(-1, d)
    layout = shared_layout((DQ_ROWS, DQ_COLS), gl.float32)
    block = [DQ_ROWS, DQ_COLS]
    return descriptor(TensorDescriptor, flat, [flat.shape[0], d], [d, 1], block, layout, checked)


def _stats_descriptor(
    t: torch.Tensor, block_m: int = BLOCK_M, checked: bool = True
) -> TensorDescriptor:
    """A 1-D (B*H*N_Q,) descriptor over the fp32 lse or D, tiles of block_m: the loader's
    (checked=False: `forward_ws._descriptor`'s)."""
    flat = t.view(-1)
    layout = shared_layout((block_m,), gl.float32)
    return descriptor(TensorDescriptor, flat, [flat.numel()], [1], [block_m], layout, checked)


def shared_bytes(
    d: int, num_slots: int, dq_split: bool, dq_tma: bool, stats_tma: bool = STATS_TMA_DEFAULT,
    block_m: int = BLOCK_M, dq_lag: bool = False, k_bufs: int = 1, dkdv_tma: bool = False,
) -> int:  # fmt: skip
    """Shared memory of one program, in bytes: the Q/dO ring (with lse and D when stats_tma), K
    (k_bufs times) and V, dS^T (twice with dq_lag), each warpgroup's fp32 staging of its dQ_i
    parts (with dq_tma; with dkdv_tma dK and dV go out through it too, 16 KB a warpgroup
    without dq_tma), and up to 1 KB for the mbarriers and the alignment between buffers."""
    elem = 2
    ring = 2 * num_slots * block_m * d * elem
    kv = (k_bufs + 1) * BLOCK_N * d * elem
    ds = BLOCK_N * block_m * elem * (2 if dq_lag else 1)
    parts = 1 if dq_split else d // DQ_COLS
    # without dq_tma the staging is there for dK's and dV's copies out only: 16 KB a warpgroup
    stage = 2 * (parts if dq_tma else int(dkdv_tma)) * DQ_ROWS * DQ_COLS * 4
    stats = 2 * num_slots * block_m * 4 if stats_tma else 0
    return ring + stats + kv + ds + stage + 1024


def compile_for_sm90(d: int = 128, causal: bool = False, dtype: torch.dtype = torch.bfloat16,
                     num_slots: int | None = None, dq_split: bool | None = None,
                     dq_tma: bool = DQ_TMA_DEFAULT, stats_tma: bool = STATS_TMA_DEFAULT,
                     block_m: int | None = None, dq_lag: bool | None = None,
                     persistent: bool = False, k_bufs: int | None = None,
                     dkdv_tma: bool | None = None, dynamic: bool | None = None):  # fmt: skip
    """Compile the kernel for sm_90 here, without a GPU (`cross_compile.compile_for`): proof on a
    CPU machine that it builds for Hopper, with its shared memory, registers and PTX (persistent:
    the defaults of a persistent launch, which take K's second buffer and dK, dV by the TMA).
    The lengths count as multiples of 16, as a launch with N a multiple of 128 specializes
    them. Options that resolve to the same launch (`launch_options`) are compiled once per
    process: the same Compiled comes back, to be read, not changed."""
    if d not in HEAD_DIMS or dtype not in _GL_DTYPES:
        raise ValueError(f"d must be one of {HEAD_DIMS} and dtype float16 or bfloat16")
    opts = launch_options(
        d, causal, num_slots, dq_split, dq_tma, stats_tma, block_m, dq_lag, persistent, k_bufs,
        dkdv_tma, dynamic=dynamic,
    )  # fmt: skip
    return _compile_for_sm90(d, bool(causal), dtype, tuple(sorted(opts.items())))


@functools.cache
def _compile_for_sm90(d: int, causal: bool, dtype: torch.dtype, options: tuple):
    from triton.runtime.jit import mangle_type

    from course_utils.triton_attention.cross_compile import compile_for

    opts = dict(options)
    block_m, dq_tma, stats_tma = opts["block_m"], opts["dq_tma"], opts["stats_tma"]
    signature = descriptor_signature(
        d, dtype, {"q_desc": block_m, "k_desc": BLOCK_N, "v_desc": BLOCK_N, "do_desc": block_m}
    )
    if dq_tma:
        signature["dq_dst"] = mangle_type(_dq_descriptor(torch.empty((4 * BLOCK_M, d))))
    else:
        signature["dq_dst"] = "*fp32"
    if opts["dkdv_tma"]:
        signature.update(descriptor_signature(d, dtype, {"dk_dst": DQ_ROWS, "dv_dst": DQ_ROWS}))
    else:
        elem = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype]
        signature.update(dk_dst=elem, dv_dst=elem)
    if stats_tma:
        stats = mangle_type(_stats_descriptor(torch.empty(4 * block_m), block_m))
    else:
        stats = "*fp32"
    signature.update(
        lse_src=stats, delta_src=stats, tile_src="*i32",
        seqlen_q="i32", seqlen_k="i32", n_bh="i32", qk_scale="fp32", sm_scale="fp32",
    )  # fmt: skip
    divisible = ["seqlen_q", "seqlen_k"]
    divisible += [] if opts["dkdv_tma"] else ["dk_dst", "dv_dst"]
    divisible += [] if dq_tma else ["dq_dst"]
    divisible += [] if stats_tma else ["lse_src", "delta_src"]
    return compile_for(
        _attn_bwd_ws_kernel, signature,
        {
            "CAUSAL": causal, "NUM_SLOTS": opts["num_slots"], "DQ_SPLIT": opts["dq_split"],
            "DQ_TMA": dq_tma, "STATS_TMA": stats_tma, "DQ_LAG": opts["dq_lag"],
            "K_BUFS": opts["k_bufs"], "DYNAMIC": opts["dynamic"],
        },
        target=(9, 0), num_warps=4, maxnreg=MAXNREG, divisible=tuple(divisible),
    )  # fmt: skip
