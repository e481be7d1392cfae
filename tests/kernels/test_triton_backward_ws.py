"""The warp-specialized Gluon backward (issue 19) against float64, and its sm_90 build.

On a CPU machine: a compile for sm_90 (shared memory within the H200's 227 KB, warpgroup MMAs,
the register hand-over and the dQ atomics in the PTX) and the refusals. On a Hopper GPU (marked
`gpu`): dq, dk, dv against float64 autograd, with the forward's own lse.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from test_triton_backward import GPU_TOL, make_generator, make_inputs, reference_grads
from test_triton_backward import rel_err as grad_err
from test_triton_forward_ws import SHAPES  # one tile, several, N_Q != N_K, many programs

from course_utils.triton_attention.autograd import FlashAttentionWS
from course_utils.triton_attention.hopper import backward_ws as bws
from course_utils.triton_attention.hopper import backward_ws_kernel as bws_kernel
from course_utils.triton_attention.hopper import forward_ws as ws

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
H200_SHARED = 232448
# the sm_90 builds on one worker: options that resolve to one launch are compiled once there
on_one_worker = pytest.mark.xdist_group("sm90-backward")
# shared_bytes' arguments after d, as launch_options names them
SHARED_KEYS = ("num_slots", "dq_split", "dq_tma", "stats_tma", "block_m", "dq_lag", "k_bufs",
               "dkdv_tma")  # fmt: skip


# The sm_90 builds below, three choices: (d, block_m), causal, (dq_tma, stats_tma). Each of the
# build's assertions follows one choice (the stats' copies stats_tma, dQ's adds dq_tma, the rest
# every build), so the builds are a pairwise design: the nine pairings of (d, block_m) with the
# TMA choices, causal alternating, hold every pair of values of any two choices. The full product
# (18 builds, 57 s of one core with Triton's cache empty, as on CI, 2026-12-07) built each pair
# two or three times. Every combination of the product is still held to shared memory by the
# host's count (test_every_combination_fits_by_the_count), which
# test_shared_bytes_is_what_the_compiler_allocates holds to the compiler.
D_BLOCK_M = [(64, 64), (64, 128), (128, 64)]
DQ_STATS_TMA = [(True, True), (False, True), (True, False)]
BUILDS = [
    (d, block_m, bool((i + j) % 2), dq_tma, stats_tma)
    for i, (d, block_m) in enumerate(D_BLOCK_M)
    for j, (dq_tma, stats_tma) in enumerate(DQ_STATS_TMA)
]


def test_the_builds_hold_every_pair_of_choices():
    columns = [
        [(d, block_m) for d, block_m, _, _, _ in BUILDS],
        [causal for _, _, causal, _, _ in BUILDS],
        [(dq_tma, stats_tma) for _, _, _, dq_tma, stats_tma in BUILDS],
    ]
    values = [D_BLOCK_M, [False, True], DQ_STATS_TMA]
    for a, b in itertools.combinations(range(3), 2):
        pairs = set(zip(columns[a], columns[b], strict=True))
        assert pairs == set(itertools.product(values[a], values[b])), (a, b)


@pytest.mark.parametrize("dq_tma, stats_tma", DQ_STATS_TMA)
@pytest.mark.parametrize("d, block_m", D_BLOCK_M)
@pytest.mark.parametrize("causal", [False, True])
def test_every_combination_fits_by_the_count(d, block_m, causal, dq_tma, stats_tma):
    opts = bws.launch_options(d, causal, dq_tma=dq_tma, stats_tma=stats_tma, block_m=block_m)
    assert bws.shared_bytes(d, *[opts[k] for k in SHARED_KEYS]) <= H200_SHARED


@on_one_worker
@pytest.mark.parametrize("d, block_m, causal, dq_tma, stats_tma", BUILDS)
def test_builds_for_sm90(d, block_m, causal, dq_tma, stats_tma):
    compiled = bws.compile_for_sm90(d, causal, dq_tma=dq_tma, stats_tma=stats_tma, block_m=block_m)
    ptx = compiled.ptx
    # lse_i and D_i: 1-D TMA copies into shared memory, or the threads' loads from HBM
    stats_copies = "cp.async.bulk.tensor.1d.shared::" in ptx  # ::cluster (3.6), ::cta (3.9)
    assert stats_copies == stats_tma
    assert ("ld.global" in ptx) == (not stats_tma)
    assert compiled.shared_bytes <= H200_SHARED, compiled.shared_bytes
    assert compiled.n_regs <= bws.MAXNREG
    assert "wgmma.mma_async" in ptx
    thread_atomics = "red.global" in ptx or "atom.global" in ptx
    tma_adds = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add" in ptx
    assert (tma_adds, thread_atomics) == (dq_tma, not dq_tma), (tma_adds, thread_atomics)
    assert _dk_dv_by_the_tma(ptx) is False  # one program a key tile: the threads' own stores
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{bws_kernel.LOADER_REGS.value}" in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{bws_kernel.GRAD_REGS.value}" in ptx


def _dk_dv_by_the_tma(ptx: str) -> bool:
    """True where dK and dV leave by TMA stores only, False where by the threads' own stores."""
    tma = re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx)
    threads = "st.global" in ptx
    assert bool(tma) != threads, (bool(tma), threads)
    return bool(tma)


@on_one_worker
@pytest.mark.parametrize(
    "d, causal, dkdv_tma", [(64, True, None), (128, False, None), (128, True, False)]
)
def test_persistent_programs_send_dk_dv_through_the_tma(d, causal, dkdv_tma):
    """A persistent program's dK and dV go through shared memory and TMA copies by default (the
    threads' stores, from the wgmma layout, took 2.5 to 3.3 us a key tile), in the
    warpgroups' dQ staging: no shared memory added; dkdv_tma=False keeps the threads' stores.
    (d = 64 stages dK and dV at once, d = 128 one after the other.)"""
    compiled = bws.compile_for_sm90(d, causal, persistent=True, dkdv_tma=dkdv_tma)
    assert _dk_dv_by_the_tma(compiled.ptx) is (dkdv_tma is None)
    assert compiled.shared_bytes <= bws.SHARED_LIMIT
    opts = bws.launch_options(d, causal, persistent=True, dkdv_tma=dkdv_tma)
    assert opts["dkdv_tma"] is (dkdv_tma is None)
    assert bws.shared_bytes(d, *[opts[k] for k in SHARED_KEYS]) == bws.shared_bytes(
        d, *[opts[k] for k in SHARED_KEYS[:-1]], not opts["dkdv_tma"]
    )  # with dq_tma the dQ staging holds them


@on_one_worker
@pytest.mark.parametrize("d, causal", [(128, False), (64, True)])
def test_persistent_programs_take_their_tiles_from_one_counter(d, causal):
    """Without the mask a persistent launch deals no tiles in advance by default: the loader
    takes each next key tile with one atomic add on the launch's counter (the only thread atomic
    in the kernel: dQ goes by the TMA's reduce-adds) and hands its number to the warpgroups
    through a few bytes of shared memory; dynamic=False builds the dealt schedule, with no
    atomic at all, the default with the mask (where the counter lost, `dynamic_default`)."""
    opts = bws.launch_options(d, causal, persistent=True)
    assert opts["dynamic"] is (not causal)
    assert bws.launch_options(d, causal)["dynamic"] is False  # one program a key tile
    taken = bws.compile_for_sm90(d, causal, persistent=True, dynamic=True)
    dealt = bws.compile_for_sm90(d, causal, persistent=True, dynamic=False)
    assert re.findall(r"atom\.global\.\w+\.\w+\.add\.u32", taken.ptx) == [
        "atom.global.gpu.relaxed.add.u32"
    ]
    assert "atom.global" not in dealt.ptx and "red.global" not in dealt.ptx
    for compiled in (taken, dealt):
        assert compiled.shared_bytes <= bws.SHARED_LIMIT
    assert taken.shared_bytes - dealt.shared_bytes <= 64  # the tile numbers, K_BUFS x 4 bytes


@on_one_worker
@pytest.mark.parametrize(
    "d, num_slots, dq_split, block_m, dq_lag, k_bufs",
    [(64, 2, False, 64, False, 1), (64, 3, False, 64, False, 1), (64, 2, True, 128, False, 1),
     (64, 3, True, 128, False, 1), (128, 2, True, 64, False, 1), (128, 2, False, 64, False, 1),
     (128, 2, True, 64, True, 2), (64, 2, True, 128, True, 2)],
)  # fmt: skip
def test_shared_bytes_is_what_the_compiler_allocates(d, num_slots, dq_split, block_m, dq_lag,
                                                     k_bufs):  # fmt: skip
    """The host's count (which refuses a combination too large) against a real sm_90 build: it
    counts the buffers and 1 KB for the mbarriers and alignment, the compiler a few hundred.
    The lagged launches with K's second buffer (persistent programs' default) are the largest:
    at d = 128 within 1.5 KB of what a program may have."""
    counted = bws.shared_bytes(
        d, num_slots, dq_split, dq_tma=True, block_m=block_m, dq_lag=dq_lag, k_bufs=k_bufs
    )
    compiled = bws.compile_for_sm90(
        d, False, num_slots=num_slots, dq_split=dq_split, dq_tma=True, block_m=block_m,
        dq_lag=dq_lag, k_bufs=k_bufs,
    )  # fmt: skip
    assert counted <= bws.SHARED_LIMIT
    assert compiled.shared_bytes <= counted <= compiled.shared_bytes + 1024, (
        counted,
        compiled.shared_bytes,
    )


@on_one_worker
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_the_default_launch_builds_within_shared_memory(d, causal):
    """The launch policy measured in Gluon backward runs 7 to 9 (128-query steps at d = 64; the
    lagged dQ at d = 64 and at d = 128 with the mask, so two slots there; at d = 128 without
    the mask dS^T shared, no lag) builds within what the host counts."""
    opts = bws.launch_options(d, causal)
    picked = (opts["block_m"], opts["num_slots"], opts["dq_split"], opts["dq_lag"])
    assert picked == {
        (64, False): (128, 2, True, True), (64, True): (128, 2, True, True),
        (128, False): (64, 2, True, False), (128, True): (64, 2, True, True),
    }[d, causal]  # fmt: skip
    counted = bws.shared_bytes(d, opts["num_slots"], opts["dq_split"], dq_tma=True,
                               block_m=opts["block_m"], dq_lag=opts["dq_lag"])  # fmt: skip
    compiled = bws.compile_for_sm90(d, causal)
    assert compiled.shared_bytes <= counted <= min(compiled.shared_bytes + 1024, bws.SHARED_LIMIT)
    spelled = {key: opts[key] for key in ("num_slots", "dq_split", "block_m", "dq_lag")}
    assert bws.compile_for_sm90(d, causal, **spelled) is compiled  # the same launch: compiled once


@pytest.mark.parametrize(
    "d, causal, given, expected",
    [(128, True, {"dq_split": False}, {"dq_split": False, "dq_lag": False}),
     (128, True, {"dq_split": 0}, {"dq_split": False, "dq_lag": False}),
     (128, True, {"dq_lag": False}, {"dq_split": False, "num_slots": 2}),
     (64, False, {"dq_lag": False}, {"dq_split": True, "num_slots": 3}),
     (64, False, {"block_m": 64}, {"dq_split": False, "dq_lag": False, "num_slots": 3}),
     (64, True, {"dq_tma": False}, {"dq_lag": False}),
     (128, False, {"dq_lag": True}, {"dq_split": True, "dq_lag": True}),
     (128, False, {"persistent": True}, {"dq_split": True, "dq_lag": True, "persistent": True}),
     (128, False, {"persistent": True, "dq_lag": False}, {"dq_split": True, "dq_lag": False})],
)  # fmt: skip
def test_a_choice_given_moves_the_defaults_that_depend_on_it(d, causal, given, expected):
    """Turning off what the lag needs (a shared dS^T, TMA reduce-adds) turns the lag's default
    off instead of refusing; without the lag the defaults of runs 7 and 8 come back."""
    opts = bws.launch_options(d, causal, **given)
    assert {key: opts[key] for key in expected} == expected, opts


@pytest.mark.parametrize(
    "d, causal, n_k, expected, by_tma",
    [(128, False, 1024, True, True), (128, True, 4096, True, True),
     (128, True, 8192, False, False), (128, False, 16384, False, False),
     (64, False, 2048, True, True), (64, True, 1024, True, True),
     (64, False, 16384, True, False), (64, True, 8192, True, False)],
)  # fmt: skip
def test_persistent_programs_by_default_only_where_they_were_ahead(
    d, causal, n_k, expected, by_tma
):
    """Persistent programs (dealt head by head) up to 4k keys (H200, 2026-12-05; d = 64 with the
    mask since dK and dV leave by the TMA, H100, 2026-12-06), and at d = 64 past 4k keys too,
    there with dK and dV by the threads' stores (H100, 2026-12-06, 16k keys); the default a
    launch takes (`_default_options`, `launch_options` given n_k) follows, and at d = 128
    without the mask brings the lagged dQ with it."""
    assert bws.persistent_default(d, causal, n_k) is expected
    assert bws.dkdv_tma_default(expected, n_k) is by_tma
    opts = bws._default_options(d, causal, expected, by_tma)
    assert opts == bws.launch_options(d, causal, persistent=expected, n_k=n_k)
    assert opts["persistent"] is expected
    assert opts["dkdv_tma"] is by_tma
    assert opts["dq_lag"] is (d == 64 or causal or expected)


@pytest.mark.parametrize(
    "d, causal, persistent, k_bufs",
    [(128, False, True, 2), (64, False, True, 2), (128, True, True, 2), (64, True, True, 2),
     (128, True, False, 1), (64, False, False, 1)],
)  # fmt: skip
def test_a_second_k_buffer_for_persistent_programs_where_it_fits(d, causal, persistent, k_bufs):
    """Persistent programs get K's second buffer by default, with the mask or without (it fits
    beside the lag's buffers at both head dimensions, and carries the lag across tiles); one
    program a key tile has no next tile to load it for."""
    opts = bws.launch_options(d, causal, persistent=persistent)
    assert opts["k_bufs"] == k_bufs, opts
    counted = bws.shared_bytes(
        d, opts["num_slots"], opts["dq_split"], opts["dq_tma"], opts["stats_tma"],
        opts["block_m"], opts["dq_lag"], k_bufs,
    )  # fmt: skip
    assert counted <= bws.SHARED_LIMIT


def test_one_k_buffer_where_two_do_not_fit_and_two_when_asked():
    # without a shared dS^T, at d = 128 each warpgroup's own dQ parts take the second one's room
    assert bws.launch_options(128, False, dq_split=False, persistent=True)["k_bufs"] == 1
    assert bws.launch_options(128, True, persistent=True, k_bufs=2)["k_bufs"] == 2


REFUSED = [
    (128, {"block_m": 128}, "block_m must be one of .* got 128 at d = 128"),
    (64, {"block_m": 32}, "block_m must be one of .* got 32 at d = 64"),
    (64, {"block_m": 96}, "block_m must be one of .* got 96 at d = 64"),
    (128, {"dq_split": False, "dq_lag": True}, "dq_lag needs .* got dq_split=False"),
    (64, {"dq_tma": False, "dq_lag": True}, "dq_lag needs .* dq_tma=False"),
    (64, {"num_slots": 3}, "num_slots=3, .* dq_lag=True, .* d = 64 need .* more than the 232448"),
    (64, {"num_slots": 0}, "num_slots must be an int from 1 to 3, got 0"),
    (128, {"num_slots": 3, "dq_split": False},
     "num_slots=3, dq_split=False, dq_tma=True, .* at d = 128 need .* more than the 232448"),
    (128, {"k_bufs": 3}, "k_bufs must be 1 or 2, got 3"),
    (128, {"k_bufs": True}, "k_bufs must be 1 or 2, got True"),
    (128, {"k_bufs": 2.0}, "k_bufs must be 1 or 2, got 2.0"),
    (128, {"dq_split": False, "k_bufs": 2},
     "dq_split=False, .* k_bufs=2 at d = 128 need .* more than the 232448"),
    (128, {"dynamic": True}, "dynamic must be .* True only with persistent .* persistent=False"),
    (64, {"dynamic": 1}, "dynamic must be True or False.* got dynamic=1"),
]  # fmt: skip


@pytest.mark.parametrize("d, options, message", REFUSED)
def test_a_launch_it_cannot_take_is_refused_by_name(d, options, message):
    """A step size it has no layout for, a lagged dQ without a shared dS^T or the TMA's adds,
    buffers past the H200's shared memory: a ValueError naming the argument (`launch_options`,
    which the launch and the sm_90 compile both call, before anything runs)."""
    with pytest.raises(ValueError, match=message):
        bws.launch_options(d, False, **options)
    with pytest.raises(ValueError, match=message):
        bws.compile_for_sm90(d, False, **options)


def test_two_ds_buffers_and_three_slots_pass_shared_memory_at_d64():
    # 128-query steps: three Q/dO slots (96 KB) and two (128, 128) dS^T buffers (64 KB)
    assert bws.shared_bytes(64, 3, True, dq_tma=True, block_m=128, dq_lag=True) > bws.SHARED_LIMIT
    assert bws.shared_bytes(64, 2, True, dq_tma=True, block_m=128, dq_lag=True) <= bws.SHARED_LIMIT


@on_one_worker
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_the_lagged_dq_builds_with_its_barriers(d, causal):
    """Two dS^T buffers: the kernel waits on and arrives at two mbarriers for each (ready and
    free), and adds dQ by TMA reduce-adds only."""
    compiled = bws.compile_for_sm90(d, causal, num_slots=2, dq_split=True, dq_lag=True)
    ptx = compiled.ptx
    assert compiled.shared_bytes <= bws.SHARED_LIMIT
    assert "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add" in ptx
    assert "red.global" not in ptx and "atom.global" not in ptx


def test_the_largest_ring_with_tma_staging_is_refused_at_d128():
    # own keys at d = 128: four fp32 (64, 64) staging tiles; with three Q/dO slots, 240 KB
    assert bws.shared_bytes(128, 3, False, dq_tma=True) > bws.SHARED_LIMIT
    assert bws.shared_bytes(128, 3, False, dq_tma=False) <= bws.SHARED_LIMIT


def test_refuses_what_the_forward_refuses():
    gen = make_generator("bws-cpu")
    q, k, v, do = make_inputs(gen, 1, 2, 256, 256, 64, torch.bfloat16, device="cpu")
    out, lse = torch.zeros_like(q), torch.zeros(q.shape[:3])
    assert "needs CUDA tensors" in ws.supported(q, k, v, False)
    # on a CPU machine the kernel refuses them; on a GPU machine the teaching kernel's checks do
    with pytest.raises(ValueError, match="needs CUDA tensors|must be CUDA tensors"):
        bws.flash_attention_bwd_ws(do, q, k, v, out, lse)


def test_bad_lse_gets_the_teaching_kernels_error():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = make_inputs(make_generator("bws-lse"), 1, 2, 256, 256, 64, torch.bfloat16,
                              device=device)  # fmt: skip
    lse = torch.zeros(q.shape[:2], device=device)
    with pytest.raises(ValueError, match="lse must be a float32 tensor of shape"):
        bws.flash_attention_bwd_ws(do, q, k, v, torch.zeros_like(q), lse)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64(shape, causal, dtype):
    batch, heads, n_q, n_k, d = shape
    if causal and n_q != n_k:
        pytest.skip("causal needs N_Q == N_K")
    q, k, v, do = make_inputs(make_generator("bws", shape, causal, dtype), batch, heads, n_q, n_k,
                              d, dtype, device="cuda")  # fmt: skip
    out = FlashAttentionWS.apply(q, k, v, causal)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref = reference_grads(q, k, v, do, causal)
    for name, x, r in zip(("out", "dq", "dk", "dv"), (out, *grads), ref, strict=True):
        assert grad_err(x, r) < GPU_TOL[dtype], (name, grad_err(x, r))


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_any_ring_depth_and_a_scale(num_slots):
    q, k, v, do = make_inputs(make_generator("bws-depth", num_slots), 1, 2, 512, 768, 128,
                              torch.bfloat16, device="cuda", scale=4.0)  # fmt: skip
    out, lse = ws.flash_attention_fwd_ws(q.detach(), k.detach(), v.detach(), False, 0.3)
    grads = bws.flash_attention_bwd_ws(do, q, k, v, out, lse, False, 0.3, num_slots=num_slots)
    ref = reference_grads(q, k, v, do, False, 0.3)[1:]
    for name, x, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert grad_err(x, r) < GPU_TOL[torch.bfloat16], (name, grad_err(x, r))


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dq_tma, persistent", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dq_split", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape", [(2, 2, 1024, 1024, 128), (3, 20, 512, 512, 128), (2, 3, 768, 512, 64)]
)
def test_every_way_of_adding_dq(shape, causal, dq_split, dq_tma, persistent):
    """The warpgroups sharing dS^T (d = 128: half of dQ's columns each) or not (each its keys),
    dQ added by TMA reduce-adds or by the threads' atomics, one program per SM taking key tiles
    in turn (persistent; 60 heads of 4 key tiles: more tiles than SMs) or one per key tile."""
    check_against_float64(shape, causal, dq_split=dq_split, dq_tma=dq_tma, persistent=persistent)


def check_against_float64(shape, causal, **options):
    """dq, dk, dv of flash_attention_bwd_ws(**options) against float64 autograd, bf16 inputs."""
    batch, heads, n_q, n_k, d = shape
    if causal and n_q != n_k:
        pytest.skip("causal needs N_Q == N_K")
    gen = make_generator("bws-options", shape, causal, sorted(options.items()))
    q, k, v, do = make_inputs(gen, batch, heads, n_q, n_k, d, torch.bfloat16, device="cuda")
    out, lse = ws.flash_attention_fwd_ws(q.detach(), k.detach(), v.detach(), causal)
    grads = bws.flash_attention_bwd_ws(do, q, k, v, out, lse, causal, **options)
    ref = reference_grads(q, k, v, do, causal)[1:]
    for name, x, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert grad_err(x, r) < GPU_TOL[torch.bfloat16], (name, grad_err(x, r))


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stats_tma", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape, block_m",
    [((2, 2, 1024, 1024, 64), 128), ((3, 20, 512, 512, 64), 128), ((2, 3, 768, 512, 64), 128),
     ((2, 3, 768, 512, 64), 64), ((3, 20, 512, 512, 128), 64)],
)  # fmt: skip
def test_each_step_size_and_source_of_lse(shape, block_m, causal, stats_tma, persistent):
    """128-query steps at d = 64 (the warpgroups split dQ_i's rows), and lse_i and D_i brought
    by the loader's TMA or loaded by every thread, against float64."""
    check_against_float64(
        shape, causal, block_m=block_m, stats_tma=stats_tma, persistent=persistent
    )


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape", [(2, 2, 1024, 1024, 128), (3, 20, 512, 512, 128), (2, 3, 768, 512, 128),
              (2, 2, 1024, 1024, 64), (3, 20, 512, 512, 64), (2, 3, 768, 512, 64)]
)  # fmt: skip
def test_the_lagged_dq_against_float64(shape, causal, persistent):
    """Each step's dQ one step late, from two dS^T buffers (one query tile a key tile at most:
    512 keys and queries with the mask), with one program per key tile or persistent."""
    check_against_float64(
        shape, causal, num_slots=2, dq_split=True, dq_lag=True, persistent=persistent
    )


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("k_bufs", [1, 2])
@pytest.mark.parametrize("lag", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape", [(3, 20, 512, 512, 128), (4, 40, 1024, 1024, 128), (4, 40, 1024, 1024, 64)]
)
def test_persistent_programs_with_one_or_two_k_buffers(shape, causal, lag, k_bufs):
    """Persistent programs taking 2 to 10 key tiles each: with two K buffers the loader brings
    the next tile's K (and, once the last dP^T is done, its V) while this tile finishes; tile
    after tile the buffers and their barriers' phases must line up, with and without the lag
    (the warpgroups share dS^T: at d = 128 each one's own dQ parts leave no room for K's second
    buffer)."""
    check_against_float64(shape, causal, persistent=True, k_bufs=k_bufs, dq_split=True, dq_lag=lag)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape", [(1, 2, 1024, 1024, 128), (4, 40, 1024, 1024, 128), (3, 20, 512, 512, 64),
              (4, 40, 1024, 1024, 64), (2, 3, 768, 512, 128)]
)  # fmt: skip
def test_tiles_taken_from_the_counter_or_dealt(shape, causal, dynamic):
    """Persistent programs that take each next key tile from the launch's counter (the default
    without the mask) or a share dealt in advance (with it), each way with and without the mask:
    fewer tiles than SMs (16: every program one tile, then the number past the last), up to 10 tiles
    a program, N_Q != N_K; twice in a row, since the counter must start from zero at every
    launch."""
    for _ in range(2):
        check_against_float64(shape, causal, persistent=True, dynamic=dynamic)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dkdv_tma", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(4, 40, 1024, 1024, 128), (4, 40, 1024, 1024, 64)])
def test_dk_dv_by_the_tma_or_the_threads_either_launch(shape, causal, dkdv_tma):
    """dK and dV through the TMA in programs of one key tile, and by the threads' stores in
    persistent programs (where the lag is carried across tiles): the defaults the other way
    round, right either way."""
    check_against_float64(shape, causal, persistent=not dkdv_tma, dkdv_tma=dkdv_tma)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("d, options, message", REFUSED)
def test_the_launch_refuses_before_running(d, options, message):
    """The same refusals from flash_attention_bwd_ws on real tensors, before any launch."""
    q, k, v, do = make_inputs(make_generator("bws-refuse", d, sorted(options.items())), 1, 2,
                              256, 256, d, torch.bfloat16, device="cuda")  # fmt: skip
    out, lse = ws.flash_attention_fwd_ws(q, k, v, False)
    with pytest.raises(ValueError, match=message):
        bws.flash_attention_bwd_ws(do, q, k, v, out, lse, **options)


def test_the_autograd_function_prefers_it_only_on_hopper():
    q, k, v, _ = make_inputs(make_generator("bws-pref"), 1, 2, 2048, 2048, 128, torch.bfloat16,
                             device="cpu")  # fmt: skip
    assert not bws.preferred(q, k, v, False)  # CPU tensors: the course backward


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize(
    "n, d, causal, runs_it",
    [(2048, 128, True, True), (1024, 128, False, True), (1024, 128, True, True),
     (1024, 64, False, True), (1024, 64, True, True), (2048, 64, True, True),
     (192, 64, False, False)],
)  # fmt: skip
def test_the_autograd_function_runs_it_where_preferred(n, d, causal, runs_it, monkeypatch):
    """Wherever it takes the shape, the autograd function's backward is this kernel, and its
    gradients are right; elsewhere (192 queries: not a multiple of its 128) the course's."""
    from course_utils import triton_attention as ta

    calls = []
    real = bws.launch  # every backward through this kernel launches here
    monkeypatch.setattr(bws, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, do = make_inputs(make_generator("bws-auto", n, d, causal), 1, 2, n, n, d,
                              torch.bfloat16, device="cuda")  # fmt: skip
    out = ta.flash_attention(q, k, v, causal)
    grads = torch.autograd.grad(out, (q, k, v), do.transpose(2, 3).contiguous().transpose(2, 3))
    assert len(calls) == int(runs_it)
    ref = reference_grads(q, k, v, do, causal)[1:]
    for name, x, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert grad_err(x, r) < GPU_TOL[torch.bfloat16], (name, grad_err(x, r))
