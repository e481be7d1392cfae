"""The Triton FlashAttention-2 forward kernel against float64 attention.

Without a CUDA GPU the kernel runs in Triton's interpreter on CPU tensors (slow, so the shapes are
small); the tests marked `gpu` run only where torch sees a CUDA GPU. Every run writes into outputs
filled with NaN first, so an element the kernel forgets to write fails the test.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import zlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.triton_attention import (
    INTERPRETER,
    flash_attention_fwd,
    launch_flash_attention_fwd,
)
from course_utils.triton_attention.forward import make_config

DEVICE = "cpu" if INTERPRETER else "cuda"
HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")

# Relative error bounds against float64. In the interpreter float32 is computed in float32;
# float16 loses most to rounding p and the output to float16 (about 3e-4); bfloat16 runs in
# float32 there and loses only the final rounding of the output (about 2e-3).
INTERPRETER_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}
# On the GPU, float32 goes through the tensor cores as tf32 (about 3e-4).
GPU_TOL = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL = INTERPRETER_TOL if INTERPRETER else GPU_TOL


def make_generator(*key) -> torch.Generator:
    """A generator seeded from the test's parameters: fresh inputs per case, same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def make_qkv(gen, batch, heads, n_q, n_k, d, dtype, device=DEVICE, scale=1.0):
    """Random q, k, v of shape (batch, heads, N, d), drawn on the CPU and moved to `device`."""
    q = scale * torch.randn(batch, heads, n_q, d, generator=gen)
    k = torch.randn(batch, heads, n_k, d, generator=gen)
    v = torch.randn(batch, heads, n_k, d, generator=gen)
    return tuple(t.to(dtype=dtype, device=device) for t in (q, k, v))


def reference(q, k, v, causal=False, softmax_scale=None):
    """out by float64 SDPA, lse = logsumexp of the float64 scaled scores."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    s = scale * (q @ k.transpose(-2, -1))  # (B, H, N_Q, N_K)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return out, torch.logsumexp(s, dim=-1)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref||; NaN anywhere in x gives inf (NaN never passes)."""
    x = x.detach().cpu().double()
    if torch.isnan(x).any():
        return math.inf
    return ((x - ref).norm() / ref.norm()).item()


def run_poisoned(q, k, v, causal=False, softmax_scale=None, **launch):
    """Run the kernel into outputs filled with NaN, so unwritten elements show up."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    return launch_flash_attention_fwd(q, k, v, causal, softmax_scale, out=out, lse=lse, **launch)


def check_against_reference(q, k, v, causal, tol, softmax_scale=None, **launch):
    out, lse = run_poisoned(q, k, v, causal, softmax_scale, **launch)
    ref_out, ref_lse = reference(q, k, v, causal, softmax_scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    err_out, err_lse = rel_err(out, ref_out), rel_err(lse, ref_lse)
    shape = f"q {tuple(q.shape)}, k {tuple(k.shape)}, {q.dtype}, causal={causal}, {launch}"
    assert err_out < tol, f"out: relative error {err_out:.2e} >= {tol:.0e} for {shape}"
    assert err_lse < tol, f"lse: relative error {err_lse:.2e} >= {tol:.0e} for {shape}"


# (batch, heads, N_Q, N_K, d, causal): ragged lengths (not multiples of any tile), N_Q != N_K,
# d = 80 (padded to 128 inside), one query and one key.
SHAPES = [
    (1, 2, 97, 97, 64, True),
    (2, 1, 50, 77, 80, False),
    (1, 1, 100, 100, 16, False),
    (1, 2, 33, 129, 64, False),
    (1, 1, 70, 70, 80, True),
    (2, 1, 1, 1, 16, True),
]


def test_interpreter_is_chosen_without_a_gpu():
    assert INTERPRETER == (not HAS_GPU)
    if INTERPRETER:
        assert os.environ.get("TRITON_INTERPRET") == "1"


def _python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}
    )


@pytest.mark.skipif(HAS_GPU, reason="the interpreter is for machines without a GPU")
def test_triton_imported_first_is_refused_with_a_clear_error():
    """Without a GPU, triton imported before the subpackage cannot interpret: say so."""
    run = _python("import triton\nimport course_utils.triton_attention")
    assert run.returncode != 0
    assert "RuntimeError" in run.stderr and "before triton is imported" in run.stderr


@pytest.mark.skipif(HAS_GPU, reason="the interpreter is for machines without a GPU")
def test_triton_imported_first_works_with_the_variable_set():
    code = (
        "import triton, torch\n"
        "from course_utils.triton_attention import flash_attention_fwd\n"
        "q = torch.randn(1, 1, 20, 16)\n"
        "print(bool(torch.isfinite(flash_attention_fwd(q, q, q)[0]).all()))\n"
    )
    run = _python(code, TRITON_INTERPRET="1")
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(shape, dtype):
    batch, heads, n_q, n_k, d, causal = shape
    gen = make_generator(shape, dtype)
    q, k, v = make_qkv(gen, batch, heads, n_q, n_k, d, dtype)
    check_against_reference(q, k, v, causal, TOL[dtype])


# Tile shapes the default config never uses: one key tile wider than the query tile, several
# masked key steps inside one diagonal block, and tiles as small as tl.dot allows.
TILINGS = [(16, 16), (32, 16), (64, 16), (16, 64), (64, 64)]


# The causal loop needs BLOCK_M to be a multiple of BLOCK_N, so (16, 64) runs without the mask only.
TILING_CASES = [(t, c) for t in TILINGS for c in (False, True) if not (c and t[0] % t[1])]


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize(
    "tiling, causal", TILING_CASES, ids=[f"{t[0]}x{t[1]}-causal{c}" for t, c in TILING_CASES]
)
def test_any_tiling_and_tile_movement(tiling, causal, tma):
    block_m, block_n = tiling
    n_k = 70 if causal else 45
    gen = make_generator(tiling, causal, tma)
    q, k, v = make_qkv(gen, 1, 2, 70, n_k, 32, torch.float32)
    config = make_config(block_m, block_n, num_warps=4, num_stages=2)
    check_against_reference(q, k, v, causal, TOL[torch.float32], config=config, tma=tma)


@settings(max_examples=12, deadline=None)
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
    q, k, v = make_qkv(gen, 1, 1, n, n_k, d, torch.float32)
    check_against_reference(q, k, v, causal, TOL[torch.float32])


def test_softmax_scale_and_large_scores():
    """Scores near 100 overflow exp() without the running max; a custom scale is honoured."""
    gen = make_generator("scale")
    q, k, v = make_qkv(gen, 1, 2, 60, 60, 32, torch.float32, scale=40.0)
    check_against_reference(q, k, v, False, TOL[torch.float32])
    check_against_reference(q, k, v, True, TOL[torch.float32], softmax_scale=0.05)


def test_strided_inputs():
    """q, k, v as views of (B, N, H, d) tensors: strides other than the contiguous ones."""
    gen = make_generator("strided")
    q, k, v = (t.transpose(1, 2) for t in make_qkv(gen, 2, 50, 3, 3, 32, torch.float32))
    assert not q.is_contiguous()
    check_against_reference(q, k, v, True, TOL[torch.float32])
    out, _ = flash_attention_fwd(q, k, v, causal=True)
    assert out.shape == q.shape


def test_public_function_returns_new_tensors():
    gen = make_generator("public")
    q, k, v = make_qkv(gen, 1, 1, 40, 40, 16, torch.float16)
    out, lse = flash_attention_fwd(q, k, v)
    ref_out, ref_lse = reference(q, k, v)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert rel_err(out, ref_out) < TOL[torch.float16] and rel_err(lse, ref_lse) < 1e-5


def test_no_keys_gives_zero_output_and_minus_infinite_lse():
    gen = make_generator("empty")
    q, k, v = make_qkv(gen, 2, 3, 5, 0, 16, torch.float32)
    out, lse = run_poisoned(q, k, v)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, float("-inf")))


def test_no_queries_gives_empty_outputs():
    gen = make_generator("no queries")
    q, k, v = make_qkv(gen, 1, 2, 0, 7, 16, torch.float32)
    out, lse = flash_attention_fwd(q, k, v)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def _bad_input_cases():
    gen = make_generator("errors")
    q, k, v = make_qkv(gen, 1, 2, 8, 8, 16, torch.float32)
    meta = torch.empty_like(k, device="meta")
    return [
        ("ndim", (q[0], k, v), {}, ValueError, "q must have 4 dimensions"),
        ("not a tensor", (q.tolist(), k, v), {}, TypeError, "q must be a torch.Tensor"),
        ("int dtype", (q, k.int(), v), {}, TypeError, "k must be float16, bfloat16 or float32"),
        ("mixed dtypes", (q, k.half(), v), {}, TypeError, "share one dtype"),
        ("k vs v", (q, k, v[:, :, :5]), {}, ValueError, "k and v must have the same shape"),
        ("heads", (q, k[:, :1], v[:, :1]), {}, ValueError, "q and k must share batch, heads"),
        ("d too small", tuple(t[..., :8] for t in (q, k, v)), {}, ValueError, "16..256"),
        ("causal N", (q, k[:, :, :5], v[:, :, :5]), {"causal": True}, ValueError, "causal=True"),
        ("causal type", (q, k, v), {"causal": 1}, TypeError, "causal must be True or False"),
        ("scale", (q, k, v), {"softmax_scale": -1.0}, ValueError, "softmax_scale"),
        ("devices", (q, meta, v), {}, ValueError, "on one device"),
    ]


@pytest.mark.parametrize("case", _bad_input_cases(), ids=lambda c: c[0])
def test_errors_name_the_argument(case):
    _, args, kwargs, error, message = case
    with pytest.raises(error, match=message):
        flash_attention_fwd(*args, **kwargs)


def test_head_dim_too_large_is_refused():
    q = torch.zeros(1, 1, 4, 257)
    with pytest.raises(ValueError, match="16..256"):
        flash_attention_fwd(q, q, q)


# --------------------------------------------------------------------------------------------
# GPU only: the compiled kernel, half precision, the sizes of the benchmark's smaller points.
# --------------------------------------------------------------------------------------------

GPU_SHAPES = [
    (2, 3, 1000, 1000, 64, True),
    (1, 4, 257, 1023, 128, False),
    (2, 2, 513, 513, 80, True),
    (1, 2, 300, 300, 256, False),
    (1, 2, 129, 129, 96, True),
    (4, 8, 1024, 1024, 128, True),
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_matches_float64(shape, dtype, tma):
    batch, heads, n_q, n_k, d, causal = shape
    gen = make_generator(shape, dtype, tma)
    q, k, v = make_qkv(gen, batch, heads, n_q, n_k, d, dtype)
    big = d > 128
    config = make_config(64 if big else 128, 64, num_warps=8, num_stages=2)
    check_against_reference(q, k, v, causal, GPU_TOL[dtype], config=config, tma=tma)


@pytest.mark.gpu
@requires_gpu
def test_gpu_autotuned_path_for_each_dtype():
    """The same shape in three dtypes: each dtype tunes its own configs (float32 needs smaller)."""
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        gen = make_generator("autotuned", dtype)
        q, k, v = make_qkv(gen, 2, 4, 777, 777, 128, dtype)
        check_against_reference(q, k, v, True, GPU_TOL[dtype])


def test_descriptors_only_where_the_strides_allow_them():
    """`_tma_possible` (which picks descriptors on Hopper): (batch, heads) must fold into one
    dimension, and data pointers and the strides of heads and rows must be 16-byte aligned."""
    from course_utils.triton_attention.forward import _tma_possible

    base = torch.zeros(2, 3, 40, 64, dtype=torch.bfloat16)
    assert _tma_possible(base, base, base, base)
    one_batch = torch.zeros(1, 3, 40, 64, dtype=torch.bfloat16)
    assert _tma_possible(one_batch, one_batch, one_batch, one_batch)
    heads_first = torch.zeros(3, 2, 40, 64, dtype=torch.bfloat16).transpose(0, 1)  # no fold
    assert not _tma_possible(base, heads_first, base, base)
    assert _tma_possible(heads_first[:1], one_batch, one_batch, one_batch)  # one batch folds
    shifted = torch.zeros(2 * 3 * 40 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 40, 64)
    assert not _tma_possible(base, base, shifted, base)  # data pointer 2 bytes off
    rows = torch.zeros(2, 3, 40, 68, dtype=torch.bfloat16)[..., :60]  # rows of 136 bytes
    narrow = torch.zeros(2, 3, 40, 60, dtype=torch.bfloat16)  # the same in a contiguous tensor
    assert not _tma_possible(rows, rows, rows, rows)
    assert not _tma_possible(narrow, narrow, narrow, narrow)
    wide = torch.zeros(2, 3, 40, 72, dtype=torch.bfloat16)[..., :64]  # rows of 144 bytes
    assert _tma_possible(wide, wide, wide, wide)


@pytest.mark.gpu
@requires_gpu
def test_gpu_descriptors_from_a_fresh_thread_and_from_backward():
    """Tensor descriptors need a current CUDA context; a new thread (a user's worker, autograd's
    backward thread, where a learner may recompute the forward) has none until a runtime call."""
    import threading

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor descriptors (TMA) need a Hopper GPU")
    gen = make_generator("thread", torch.bfloat16)
    q, k, v = make_qkv(gen, 1, 2, 100, 130, 64, torch.bfloat16)
    expected, _ = launch_flash_attention_fwd(q, k, v, False, tma=True)
    found = {}

    def worker():
        try:
            found["out"] = launch_flash_attention_fwd(q, k, v, False, tma=True)[0]
            torch.cuda.synchronize()
        except Exception as e:  # the failure is reported below, in the test's thread
            found["error"] = e

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "error" not in found, f"forward in a fresh thread: {found.get('error')!r}"
    torch.testing.assert_close(found["out"], expected, rtol=0, atol=0)

    class RecomputesInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return flash_attention_fwd(q, k, v, False)[0]

        @staticmethod
        def backward(ctx, dout):  # runs on autograd's device thread
            out = launch_flash_attention_fwd(*ctx.saved_tensors, False, tma=True)[0]
            return out * 0 + dout[..., :1].sum(), None, None

    qg = q.detach().requires_grad_()
    (dq,) = torch.autograd.grad(RecomputesInBackward.apply(qg, k, v).sum(), qg)
    assert torch.isfinite(dq).all()
