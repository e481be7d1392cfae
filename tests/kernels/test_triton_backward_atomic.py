"""The backward variant with dQ by atomic adds (issue 19) against float64 autograd.

Shapes as the course backward's tests: ragged lengths, N_Q != N_K, d not a power of two, causal
and not; in the interpreter on CPU tensors, and on a GPU (marked `gpu`) through the autotuner
and the autograd function.
"""

from __future__ import annotations

import pytest
import torch
from test_triton_backward import (
    GPU_TOL,
    TOL,
    cancelled_terms,
    make_generator,
    make_inputs,
    reference_grads,
    rel_err,
    requires_gpu,
)

from course_utils.triton_attention import INTERPRETER, flash_attention_fwd
from course_utils.triton_attention.backward import make_config
from course_utils.triton_attention.backward_atomic import (
    FlashAttentionAtomicDQ,
    FlashAttentionTmaDQ,
    flash_attention_bwd_atomic,
)

SHAPES = [
    (1, 2, 97, 97, 64, True),
    (2, 1, 50, 77, 80, False),
    (1, 2, 70, 33, 40, False),
    (2, 1, 1, 1, 16, True),
]


def check(q, k, v, do, causal, tol, config=None, autograd=False, function=FlashAttentionAtomicDQ):
    if autograd:
        out = function.apply(q, k, v, causal, None)
        grads = torch.autograd.grad(out, (q, k, v), do)
    else:
        out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach(), causal)
        grads = flash_attention_bwd_atomic(do, q, k, v, out, lse, causal, config=config)
    ref = reference_grads(q, k, v, do, causal)
    terms = cancelled_terms(q, k, v, do, causal)  # one key per row: dq = dk = 0
    for name, x, r, like, t in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), ref, (q, q, k, v), terms, strict=True
    ):
        assert x.shape == like.shape and x.dtype == like.dtype, name
        err = rel_err(x, r, t)
        assert err < tol, f"{name}: relative error {err:.2e} for q {tuple(q.shape)}, {causal}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64(shape, dtype):
    batch, heads, n_q, n_k, d, causal = shape
    q, k, v, do = make_inputs(make_generator("atomic", shape, dtype), batch, heads, n_q, n_k, d,
                              dtype)  # fmt: skip
    check(
        q, k, v, do, causal, TOL[dtype], config=None if INTERPRETER else make_config(32, 64, 4, 2)
    )


@pytest.mark.parametrize("tiling", [(16, 64), (32, 32), (16, 16)])
def test_any_tiling_causal(tiling):
    q, k, v, do = make_inputs(make_generator("atomic", tiling), 1, 2, 70, 70, 32, torch.float32)
    check(q, k, v, do, True, TOL[torch.float32], config=make_config(*tiling, 4, 2))


def test_causal_tiling_must_nest():
    q, k, v, do = make_inputs(make_generator("nest"), 1, 1, 40, 40, 16, torch.float32)
    out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach(), True)
    with pytest.raises(ValueError, match="BLOCK_N to be a multiple of BLOCK_M"):
        flash_attention_bwd_atomic(do, q, k, v, out, lse, True, config=make_config(32, 16, 4, 1))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_autotuned_autograd_function(d, causal):
    q, k, v, do = make_inputs(make_generator("atomic-gpu", d, causal), 2, 4, 777, 777, d,
                              torch.bfloat16)  # fmt: skip
    check(q, k, v, do, causal, GPU_TOL[torch.bfloat16], autograd=True)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="TMA reduce-adds need a Hopper GPU",
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 80])
def test_gpu_tma_reduce_autograd_function(d, causal):
    q, k, v, do = make_inputs(make_generator("tma-gpu", d, causal), 2, 3, 555, 555, d,
                              torch.bfloat16)  # fmt: skip
    check(q, k, v, do, causal, GPU_TOL[torch.bfloat16], autograd=True,
          function=FlashAttentionTmaDQ)  # fmt: skip


def test_tma_needs_a_hopper_gpu():
    if not INTERPRETER:
        pytest.skip("checks the interpreter's refusal")
    q, k, v, do = make_inputs(make_generator("tma-cpu"), 1, 1, 20, 20, 16, torch.float32)
    out, lse = flash_attention_fwd(q.detach(), k.detach(), v.detach(), False)
    with pytest.raises(ValueError, match="tma=True needs a Hopper GPU"):
        flash_attention_bwd_atomic(do, q, k, v, out, lse, tma=True)
