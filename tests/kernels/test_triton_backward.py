"""The Triton FlashAttention-2 backward kernels and the autograd function against float64 autograd.

Without a CUDA GPU the kernels run in Triton's interpreter on CPU tensors (slow, so the shapes are
small); the tests marked `gpu` run only where torch sees a CUDA GPU. The reference gradients are
those of float64 SDPA, through torch's autograd, on the same (rounded) inputs and dO.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.triton_attention import (
    INTERPRETER,
    flash_attention,
    flash_attention_bwd,
    flash_attention_fwd,
)
from course_utils.triton_attention.backward import DKDV_FAMILIES, DQ_FAMILIES, make_config

DEVICE = "cpu" if INTERPRETER else "cuda"
HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")

# Relative error bounds of each gradient against float64. In the interpreter float32 is computed
# in float32 (about 4e-7 seen); float16 rounds P and dS to float16 before their products (about
# 3e-4); bfloat16 runs in float32 there and loses the rounding of inputs' gradients (about 2e-3).
INTERPRETER_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 5e-3}
# On the GPU, float32 goes through the tensor cores as tf32.
GPU_TOL = {torch.float32: 5e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL = INTERPRETER_TOL if INTERPRETER else GPU_TOL


def make_generator(*key) -> torch.Generator:
    """A generator seeded from the test's parameters: fresh inputs per case, same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def make_inputs(gen, batch, heads, n_q, n_k, d, dtype, device=DEVICE, scale=1.0):
    """q, k, v (requires_grad) of shape (batch, heads, N, d) and dO of q's shape."""
    q = scale * torch.randn(batch, heads, n_q, d, generator=gen)
    k = torch.randn(batch, heads, n_k, d, generator=gen)
    v = torch.randn(batch, heads, n_k, d, generator=gen)
    do = torch.randn(batch, heads, n_q, d, generator=gen)
    q, k, v, do = (t.to(dtype=dtype, device=device) for t in (q, k, v, do))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def reference_grads(q, k, v, do, causal=False, softmax_scale=None):
    """(out, dq, dk, dv) by float64 SDPA and autograd, on the CPU."""
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=softmax_scale)
    return (out, *torch.autograd.grad(out, (q64, k64, v64), do.cpu().double()))


def rel_err(x: torch.Tensor, ref: torch.Tensor, terms: float = 0.0) -> float:
    """||x - ref|| / ||ref||, or / terms where ref is a cancellation; NaN in x gives inf.

    terms: the norm of the terms whose difference ref is (cancelled_terms). Where ||ref|| is
    below a tenth of it, the error is measured against the terms: rounding is relative to them.
    """
    x = x.detach().cpu().double()
    if torch.isnan(x).any():
        return math.inf
    denom = ref.norm().item()
    if denom < 0.1 * terms:
        denom = terms
    return ((x - ref).norm() / (denom if denom > 0 else 1.0)).item()


def cancelled_terms(q, k, v, do, causal=False, softmax_scale=None) -> tuple[float, ...]:
    """For (out, dq, dk, dv): the norm of the terms each is a difference of (0: no difference).

    dq = scale * dS @ k and dk = scale * dS^T @ q with dS = P * (dP - D), the difference of two
    sums of d products. With one key per query row P = 1 and dP = D, so dq = dk = 0 exactly,
    and a kernel returns its rounding of dP - D: float32 about 1e-7 * sqrt(d) of |dP| + |D|,
    TF32 (float32 tl.dot on a GPU) about 5e-4 * sqrt(d). Against the terms
    scale * (P * (|dP| + |D|)) @ k (and @ q) that rounding is small; against 0 it is infinite.
    With 10 to 80 keys per row, dq and dk were 0.28-0.98 of their terms (median 0.67) over 500
    random cases, so there the error stays relative to the gradient itself; with two keys they
    fell to 0.05 of them, and are then measured against the terms.
    """
    q64, k64, v64, do64 = (t.detach().cpu().double() for t in (q, k, v, do))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = scale * q64 @ k64.transpose(-1, -2)
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()  # as SDPA: top-left
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, dim=-1)
    dp = do64 @ v64.transpose(-1, -2)
    d_row = (do64 * (p @ v64)).sum(-1, keepdim=True)  # D = rowsum(dO * O)
    ds_terms = p * (dp.abs() + d_row.abs())
    dq_terms = scale * ds_terms @ k64
    dk_terms = scale * ds_terms.transpose(-1, -2) @ q64
    return 0.0, dq_terms.norm().item(), dk_terms.norm().item(), 0.0


def check_grads(q, k, v, do, causal, tol, softmax_scale=None, **configs):
    """The autograd function's out and gradients (or the kernels' with configs) vs float64."""
    if configs:
        out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach(), causal, softmax_scale)
        grads = flash_attention_bwd(do, q, k, v, out, lse, causal, softmax_scale, **configs)
    else:
        out = flash_attention(q, k, v, causal, softmax_scale)
        grads = torch.autograd.grad(out, (q, k, v), do)
    ref = reference_grads(q, k, v, do, causal, softmax_scale)
    terms = cancelled_terms(q, k, v, do, causal, softmax_scale)
    case = f"q {tuple(q.shape)}, k {tuple(k.shape)}, {q.dtype}, causal={causal}, {configs}"
    for name, x, r, like, t in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), ref, (q, q, k, v), terms, strict=True
    ):
        assert x.shape == like.shape and x.dtype == like.dtype, f"{name}: {x.shape} {x.dtype}"
        err = rel_err(x, r, t)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.0e} for {case}"


# (batch, heads, N_Q, N_K, d, causal): ragged lengths (not multiples of any tile), N_Q != N_K
# (both ways), d = 80 (padded to 128 inside), one query and one key.
SHAPES = [
    (1, 2, 97, 97, 64, True),
    (2, 1, 50, 77, 80, False),
    (1, 1, 100, 100, 16, False),
    (1, 2, 70, 33, 64, False),
    (1, 1, 70, 70, 80, True),
    (2, 1, 1, 1, 16, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64(shape, dtype):
    batch, heads, n_q, n_k, d, causal = shape
    gen = make_generator(shape, dtype)
    q, k, v, do = make_inputs(gen, batch, heads, n_q, n_k, d, dtype)
    check_grads(q, k, v, do, causal, TOL[dtype])


# Tilings (dkdv BLOCK_M x BLOCK_N, dq BLOCK_M x BLOCK_N) the interpreter configs never use: several
# masked query steps in one diagonal block, square tiles, the smallest tiles tl.dot allows.
TILINGS = [((16, 64), (64, 16)), ((32, 32), (32, 32)), ((16, 16), (16, 16)), ((64, 128), (128, 64))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "tiling", TILINGS, ids=lambda t: f"dkdv{t[0][0]}x{t[0][1]}-dq{t[1][0]}x{t[1][1]}"
)
def test_any_tiling(tiling, causal):
    (dkdv_m, dkdv_n), (dq_m, dq_n) = tiling
    n_k = 70 if causal else 45
    gen = make_generator(tiling, causal)
    q, k, v, do = make_inputs(gen, 1, 2, 70, n_k, 32, torch.float32)
    configs = {
        "dkdv_config": make_config(dkdv_m, dkdv_n, num_warps=4, num_stages=2),
        "dq_config": make_config(dq_m, dq_n, num_warps=4, num_stages=2),
    }
    check_grads(q, k, v, do, causal, TOL[torch.float32], **configs)


def test_causal_tiling_must_nest():
    gen = make_generator("nest")
    q, k, v, do = make_inputs(gen, 1, 1, 40, 40, 16, torch.float32)
    out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach(), True)
    bad = make_config(64, 32, num_warps=4, num_stages=1)  # dkdv: BLOCK_N must hold whole BLOCK_M
    with pytest.raises(ValueError, match="causal needs BLOCK_N to be a multiple of BLOCK_M"):
        flash_attention_bwd(do, q, k, v, out, lse, True, dkdv_config=bad)


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 80),
    n_k=st.integers(1, 80),
    d=st.integers(16, 80),
    causal=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_any_length_and_head_dim(n, n_k, d, causal, seed):
    """Property: any N and any d in 16..80 (padded to a power of two inside) match float64."""
    n_k = n if causal else n_k
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = make_inputs(gen, 1, 1, n, n_k, d, torch.float32)
    check_grads(q, k, v, do, causal, TOL[torch.float32])


def test_softmax_scale_and_large_scores():
    """Scores near 100: P = exp(s - lse) stays in [0, 1]; a custom scale reaches dq and dk."""
    gen = make_generator("scale")
    q, k, v, do = make_inputs(gen, 1, 2, 60, 60, 32, torch.float32, scale=40.0)
    # peaked softmax: a larger condition number. On a GPU float32 products run in TF32 (the
    # forward's out alone is 1.3e-3 off there, measured on the H200): the GPU tolerance.
    tol = 1e-4 if INTERPRETER else GPU_TOL[torch.float32]
    check_grads(q, k, v, do, False, tol)
    check_grads(q, k, v, do, True, tol, softmax_scale=0.05)


def test_strided_inputs_and_a_broadcast_gradient():
    """q, k, v as views of (B, N, H, d) tensors; out.sum() gives dO with zero strides."""
    gen = make_generator("strided")
    q, k, v = (
        t.detach().transpose(1, 2).requires_grad_()
        for t in make_inputs(gen, 2, 50, 3, 3, 32, torch.float32)[:3]
    )
    assert not q.is_contiguous()
    flash_attention(q, k, v, causal=True).sum().backward()
    ref = reference_grads(q, k, v, torch.ones(q.shape), causal=True)
    for name, x, r in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref[1:], strict=True):
        assert x.shape == r.shape
        assert rel_err(x, r) < TOL[torch.float32], name


def test_only_some_inputs_require_grad():
    gen = make_generator("some")
    q, k, v, do = make_inputs(gen, 1, 1, 30, 30, 16, torch.float32)
    k = k.detach()
    (dq, dv) = torch.autograd.grad(flash_attention(q, k, v), (q, v), do)
    _, ref_dq, _, ref_dv = reference_grads(q, k, v, do)
    assert rel_err(dq, ref_dq) < TOL[torch.float32] and rel_err(dv, ref_dv) < TOL[torch.float32]


def test_no_keys_or_no_queries_gives_zero_gradients():
    gen = make_generator("empty")
    q, k, v, do = make_inputs(gen, 2, 3, 5, 0, 16, torch.float32)
    dq, dk, dv = torch.autograd.grad(flash_attention(q, k, v), (q, k, v), do)
    assert torch.equal(dq, torch.zeros_like(q)) and dk.shape == k.shape and dv.shape == v.shape
    q, k, v, do = make_inputs(gen, 1, 2, 0, 7, 16, torch.float32)
    dq, dk, dv = torch.autograd.grad(flash_attention(q, k, v), (q, k, v), do)
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(k))


# --------------------------------------------------------------------------------------------
# What autograd keeps for the backward pass
# --------------------------------------------------------------------------------------------


def saved_storages(fn, *args, **kwargs) -> dict[int, torch.Tensor]:
    """The tensors autograd saves while fn runs, one per storage (views and repeats count once)."""
    seen: dict[int, torch.Tensor] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return seen


def naive_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v in plain torch ops: autograd keeps P, N x N."""
    p = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)  # (B,H,N,N)
    return p @ v


def test_saves_only_q_k_v_out_and_lse():
    """The lesson's case, N = 1000, d = 64, float32: 4,768,000 bytes naive vs 1,028,000 fused."""
    n, d = 1000, 64
    gen = make_generator("saved")
    q, k, v, _ = make_inputs(gen, 1, 1, n, n, d, torch.float32)
    outs = []
    fused = saved_storages(lambda: outs.append(flash_attention(q, k, v)))
    naive = saved_storages(naive_attention, q, k, v)

    nbytes = lambda saved: sum(t.untyped_storage().nbytes() for t in saved.values())
    out = outs[0]
    ptrs = {t.untyped_storage().data_ptr() for t in (q, k, v, out)}
    assert ptrs <= set(fused), "q, k, v and out are saved as they are, not copied"
    (lse,) = (t for p, t in fused.items() if p not in ptrs)  # the one other tensor
    assert lse.shape == (1, 1, n) and lse.dtype == torch.float32
    assert nbytes(fused) == 4 * (4 * n * d) + 4 * n == 1_028_000
    assert nbytes(naive) == 4 * (3 * n * d + n * n) == 4_768_000  # q, k, v and P


# --------------------------------------------------------------------------------------------
# Errors name the argument
# --------------------------------------------------------------------------------------------


def test_autograd_function_checks_its_inputs_as_the_forward_does():
    q = torch.zeros(1, 1, 4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="16..256"):
        flash_attention(q, q, q)
    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="causal=True"):
        flash_attention(q, q[:, :, :3], q[:, :, :3], causal=True)


def test_backward_errors_name_the_argument():
    gen = make_generator("errors")
    q, k, v, do = make_inputs(gen, 1, 2, 8, 8, 16, torch.float32)
    out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach())
    with pytest.raises(ValueError, match="do must have q's shape"):
        flash_attention_bwd(do[:, :1], q, k, v, out, lse)
    with pytest.raises(ValueError, match="out must have q's shape"):
        flash_attention_bwd(do, q, k, v, out.half(), lse)
    with pytest.raises(ValueError, match="lse must be a float32 tensor"):
        flash_attention_bwd(do, q, k, v, out, lse.double())
    with pytest.raises(TypeError, match="do must be a torch.Tensor"):
        flash_attention_bwd(None, q, k, v, out, lse)


# --------------------------------------------------------------------------------------------
# GPU only: the compiled kernels, half precision, the first config of each family by hand.
# --------------------------------------------------------------------------------------------

GPU_SHAPES = [
    (2, 3, 1024, 1024, 64, True),
    (1, 4, 257, 1023, 128, False),
    (2, 2, 513, 513, 80, True),
    (1, 2, 300, 300, 256, False),
]


def _first_configs(d: int, dtype: torch.dtype) -> dict:
    family = "large" if d > 128 or dtype.itemsize > 2 else ("d<=64" if d <= 64 else "d<=128")
    return {
        "dkdv_config": make_config(*DKDV_FAMILIES[family][0]),
        "dq_config": make_config(*DQ_FAMILIES[family][0]),
    }


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_gradients_match_float64(shape, dtype):
    batch, heads, n_q, n_k, d, causal = shape
    gen = make_generator(shape, dtype)
    q, k, v, do = make_inputs(gen, batch, heads, n_q, n_k, d, dtype)
    check_grads(q, k, v, do, causal, GPU_TOL[dtype], **_first_configs(d, dtype))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_autotuned_autograd_function(dtype):
    gen = make_generator("autotuned", dtype)
    q, k, v, do = make_inputs(gen, 2, 4, 777, 777, 128, dtype)
    check_grads(q, k, v, do, True, GPU_TOL[dtype])
