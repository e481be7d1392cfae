"""The warp-specialized Gluon forward (issue 19) against float64, and its sm_90 build.

On a CPU machine: the shapes it refuses, with the reason, and a compile for sm_90 (shared memory
within the H200's 227 KB, no register spills, warpgroup MMAs and register reallocation in the
PTX). On a Hopper GPU (marked `gpu`): outputs and lse against float64 SDPA, written in full.
"""

from __future__ import annotations

import pytest
import torch
from test_triton_forward import GPU_TOL, make_generator, make_qkv, reference, rel_err

from course_utils.triton_attention import INTERPRETER
from course_utils.triton_attention.hopper import forward_ws as ws

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
H200_SHARED = 232448  # bytes of shared memory a block may opt into on sm_90


@pytest.mark.parametrize("d", ws.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_builds_for_sm90(d, causal):
    compiled = ws.compile_for_sm90(d, causal)
    ptx = compiled.ptx
    assert compiled.shared_bytes <= H200_SHARED, compiled.shared_bytes
    counted = ws.shared_bytes(d, ws.NUM_BUF[d], True)  # the policy's rings keep out's own buffers
    assert compiled.shared_bytes <= counted <= compiled.shared_bytes + 1024, counted
    assert compiled.spill_bytes == 0, f"{compiled.spill_bytes} bytes of register spills"
    assert compiled.n_regs <= ws.MAXNREG
    assert ".reqntid 384" in ptx  # 12 warps: two softmax warpgroups and the loader's
    assert "wgmma.mma_async" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{ws.LOADER_REGS.value}" in ptx  # the loader gives up
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{ws.SOFTMAX_REGS.value}" in ptx  # the softmax takes


@pytest.mark.parametrize("causal", [False, True])
def test_two_programs_per_sm_build_for_sm90(causal):
    """At d = 64, BUDGETS[2]: 64-key steps and 80 registers a thread, so that two programs'
    registers (2 x 384 threads) and shared memory fit in one SM."""
    compiled = ws.compile_for_sm90(64, causal, programs_per_sm=2)
    assert compiled.n_regs <= ws.BUDGETS[2].maxnreg
    assert 2 * 384 * compiled.n_regs <= 65536
    assert 2 * (compiled.shared_bytes + 1024) <= ws.SM_SHARED
    assert compiled.shared_bytes <= ws.shared_bytes(64, ws.NUM_BUF[64], True, 64)
    assert compiled.spill_bytes <= 64, compiled.spill_bytes  # 32 with Triton 3.6: a few pairs
    softmax = ws.BUDGETS[2].softmax_regs
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{softmax}" in compiled.ptx


def _cpu_qkv(n_q=256, n_k=256, d=64, dtype=torch.bfloat16):
    return make_qkv(make_generator("ws", n_q, n_k, d), 1, 2, n_q, n_k, d, dtype, device="cpu")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({}, "needs CUDA tensors"),
        ({"n_q": 200}, "needs CUDA tensors"),  # the device is checked first
    ],
)
def test_refuses_cpu_tensors_with_the_reason(change, reason):
    q, k, v = _cpu_qkv(**change)
    assert reason in ws.supported(q, k, v, False)
    # on a CPU machine the kernel refuses them; on a GPU machine the teaching kernel's checks do
    with pytest.raises(ValueError, match=f"{reason}|must be CUDA tensors"):
        ws.flash_attention_fwd_ws(q, k, v)


def test_refuses_a_causal_flag_that_is_not_a_bool():
    q, k, v = _cpu_qkv()
    with pytest.raises(TypeError, match="causal must be True or False"):
        ws.flash_attention_fwd_ws(q, k, v, causal=1)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize(
    "change, reason",
    [
        ({"n_q": 200}, "N_Q a multiple of 128"),
        ({"n_k": 200}, "N_K a positive multiple of 128"),
        ({"d": 80}, "needs d in"),
        ({"dtype": torch.float32}, "float16 or bfloat16"),
    ],
)
def test_refuses_other_shapes_with_the_reason(change, reason):
    q, k, v = (t.cuda() for t in _cpu_qkv(**change))
    assert reason in ws.supported(q, k, v, False)
    with pytest.raises(ValueError, match=reason):
        ws.flash_attention_fwd_ws(q, k, v)


# (batch, heads, N_Q, N_K, d): one tile, several, N_Q != N_K, heads that share a 2-D descriptor.
SHAPES = [
    (1, 1, 128, 128, 64),
    (2, 3, 512, 512, 64),
    (1, 2, 384, 1024, 128),
    (2, 2, 1024, 1024, 128),
    (1, 1, 256, 128, 128),
    (4, 16, 1024, 1024, 64),  # 256 tiles: more than an H200's 132 SMs, programs loop
    (3, 20, 512, 512, 128),  # 240 tiles, uneven over the programs
]


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(shape, persistent, causal, dtype):
    batch, heads, n_q, n_k, d = shape
    if causal and n_q != n_k:
        pytest.skip("causal needs N_Q == N_K")
    q, k, v = make_qkv(make_generator("ws", shape, causal, dtype), batch, heads, n_q, n_k, d,
                       dtype, device="cuda")  # fmt: skip
    out = torch.full_like(q, float("nan"))  # unwritten elements would stay NaN
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device="cuda")
    ws.flash_attention_fwd_ws(q, k, v, causal, out=out, lse=lse, persistent=persistent)
    ref_out, ref_lse = reference(q, k, v, causal)
    tol = GPU_TOL[dtype]
    assert rel_err(out, ref_out) < tol, rel_err(out, ref_out)
    assert rel_err(lse, ref_lse) < tol, rel_err(lse, ref_lse)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape",
    [(1, 2, 256, 256, 64), (4, 16, 1024, 1024, 64), (3, 20, 512, 512, 128)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_pingpong_turns(shape, causal, persistent):
    """The warpgroups taking turns at the tensor cores: same results (a wrong turn deadlocks)."""
    batch, heads, n_q, n_k, d = shape
    q, k, v = make_qkv(make_generator("ws-pp", shape, causal), batch, heads, n_q, n_k, d,
                       torch.bfloat16, device="cuda")  # fmt: skip
    out, lse = ws.flash_attention_fwd_ws(q, k, v, causal, pingpong=True, persistent=persistent)
    ref_out, ref_lse = reference(q, k, v, causal)
    assert rel_err(out, ref_out) < GPU_TOL[torch.bfloat16]
    assert rel_err(lse, ref_lse) < GPU_TOL[torch.bfloat16]


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 128, 128, 64), (2, 3, 512, 512, 64), (4, 16, 1024, 1024, 64), (1, 2, 384, 1024, 64),
     (16, 32, 1024, 1024, 64)],
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
def test_two_programs_per_sm(shape, causal, persistent, pingpong):
    """64-key steps, 80 registers a thread, two programs an SM: same results as float64, every
    row written (many tiles a program with the mask: the case that once hung)."""
    batch, heads, n_q, n_k, d = shape
    if causal and n_q != n_k:
        pytest.skip("causal needs N_Q == N_K")
    q, k, v = make_qkv(make_generator("ws-x2", shape, causal, pingpong), batch, heads, n_q, n_k,
                       d, torch.bfloat16, device="cuda")  # fmt: skip
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device="cuda")
    ws.flash_attention_fwd_ws(q, k, v, causal, out=out, lse=lse, persistent=persistent,
                              pingpong=pingpong, programs_per_sm=2)  # fmt: skip
    ref_out, ref_lse = reference(q, k, v, causal)
    assert rel_err(out, ref_out) < GPU_TOL[torch.bfloat16], rel_err(out, ref_out)
    assert rel_err(lse, ref_lse) < GPU_TOL[torch.bfloat16], rel_err(lse, ref_lse)


@requires_hopper
@pytest.mark.gpu
def test_two_programs_per_sm_only_at_d64():
    q, k, v = (t.cuda() for t in _cpu_qkv(d=128))
    with pytest.raises(ValueError, match="programs_per_sm must be 1, or 2 at d = 64"):
        ws.flash_attention_fwd_ws(q, k, v, programs_per_sm=2)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_any_ring_depth_and_large_scores(num_slots):
    """Scores up to ~100 (scale 10): the online softmax must rescale, every ring depth."""
    q, k, v = make_qkv(make_generator("ws-depth", num_slots), 1, 2, 512, 768, 128,
                       torch.bfloat16, device="cuda", scale=10.0)  # fmt: skip
    out, lse = ws.flash_attention_fwd_ws(q, k, v, False, 0.2, num_slots=num_slots)
    ref_out, ref_lse = reference(q, k, v, False, 0.2)
    assert rel_err(out, ref_out) < GPU_TOL[torch.bfloat16]
    assert rel_err(lse, ref_lse) < GPU_TOL[torch.bfloat16]


def test_interpreter_machines_do_not_launch_it():
    """Without a GPU the module imports (the CPU tests above need it) and says why it cannot run."""
    if not INTERPRETER:
        pytest.skip("a GPU machine")
    q, k, v = _cpu_qkv()
    assert "CUDA" in ws.supported(q, k, v, True)


@requires_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_runs_it_and_its_lse_serves_the_backward(causal, monkeypatch):
    """flash_attention's forward goes through this kernel where `preferred`; the backward,
    which recomputes P from its lse, gives float64's gradients."""
    from test_triton_backward import GPU_TOL as BWD_TOL
    from test_triton_backward import make_inputs, reference_grads
    from test_triton_backward import rel_err as bwd_err

    from course_utils.triton_attention import flash_attention

    calls = []
    real = ws.launch  # every forward through this kernel launches here
    monkeypatch.setattr(ws, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    shape = (2, 2, 256, 256, 128)
    q, k, v, do = make_inputs(make_generator("ws-autograd", causal), *shape, torch.bfloat16,
                              device="cuda")  # fmt: skip
    assert ws.preferred(q, k, v, causal)
    out = flash_attention(q, k, v, causal)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert calls, "the autograd function did not run the Gluon forward"
    for name, x, r in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), reference_grads(q, k, v, do, causal), strict=True
    ):
        assert bwd_err(x, r) < BWD_TOL[torch.bfloat16], name


def test_launch_policy_follows_the_measurements():
    """Run 6 of the Gluon forward: persistent but for causal past 4k keys, 4 slots at d = 64 and
    2 at d = 128, ping-pong at d = 128 up to 1k keys; two programs an SM at causal d = 64, 1k."""
    assert ws.launch_policy(64, 1024, 1024, False)[:3] == (4, True, False)
    assert ws.launch_policy(128, 1024, 1024, True)[:3] == (2, True, True)
    assert ws.launch_policy(128, 16384, 16384, True)[:3] == (2, False, False)
    assert ws.launch_policy(128, 16384, 16384, False)[:3] == (2, True, False)
    # two programs an SM at causal d = 64 up to 1k keys only (the run of 2026-12-04)
    assert ws.launch_policy(64, 1024, 1024, True) == (4, True, False, 2)
    assert ws.launch_policy(64, 4096, 4096, True).programs_per_sm == 1
    assert ws.launch_policy(64, 1024, 1024, False).programs_per_sm == 1
    assert ws.launch_policy(128, 1024, 1024, True).programs_per_sm == 1
    for d in ws.HEAD_DIMS:  # every policy fits in shared memory with out's own buffers
        policy = ws.launch_policy(d, 4096, 4096, False)
        assert ws.own_out_buffer(d, policy.num_slots)


def test_the_autograd_function_keeps_the_teaching_kernel_without_hopper():
    q, k, v = _cpu_qkv()
    assert not ws.preferred(q, k, v, False)


def test_refuses_a_triton_it_was_not_built_on(monkeypatch):
    q, k, v = _cpu_qkv()
    monkeypatch.setattr(ws, "TRITON_VERSION", (3, 5))
    assert "needs Triton 3.6 or newer" in ws.supported(q, k, v, False)
    assert not ws.preferred(q, k, v, False)


def test_bad_inputs_get_the_teaching_kernels_errors():
    q, k, v = _cpu_qkv()
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        ws.flash_attention_fwd_ws(q, k.tolist(), v)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        ws.flash_attention_fwd_ws(q, k, v[:, :, :128])
