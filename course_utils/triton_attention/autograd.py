"""FlashAttention with autograd: the Triton forward and backward kernels as one torch function.

The forward saves only what the backward needs to recompute P tile by tile: q, k, v, out and the
per-row logsumexp lse, so (4 N d + N) numbers per head where naive attention also keeps the
N x N matrix P. For N = 1000, d = 64 in float32 that is 1,028,000 bytes instead of 4,768,000.
"""

from __future__ import annotations

import functools

import torch

from course_utils.triton_attention import INTERPRETER
from course_utils.triton_attention.backward import flash_attention_bwd
from course_utils.triton_attention.forward import _check_inputs, launch_flash_attention_fwd


def _forward(q, k, v, causal, softmax_scale):
    """(out, lse): the warp-specialized Gluon kernel on Hopper where it takes the shape and is
    the faster one (`forward_ws.preferred`), the teaching kernel everywhere else."""
    _check_inputs(q, k, v, causal)  # `preferred` reads shapes and devices of valid tensors
    forward_ws = None if INTERPRETER else _gluon_forward()
    if forward_ws is not None and forward_ws.preferred(q, k, v, causal):
        return forward_ws.flash_attention_fwd_ws(q, k, v, causal, softmax_scale)
    return launch_flash_attention_fwd(q, k, v, causal, softmax_scale)


@functools.cache
def _gluon_forward():
    """The forward_ws module, or None where this Triton has no Gluon Hopper API to import (the
    course allows triton >= 3.1; forward_ws.supported refuses the versions it was not built on)."""
    try:
        from course_utils.triton_attention import forward_ws
    except ImportError:
        return None
    return forward_ws


@functools.cache
def _gluon_backward():
    """The backward_ws module, or None where this Triton has no Gluon Hopper API to import."""
    try:
        from course_utils.triton_attention import backward_ws
    except ImportError:
        return None
    return backward_ws


def _backward(dout, q, k, v, out, lse, causal, softmax_scale):
    """(dq, dk, dv): the warp-specialized Gluon backward on Hopper where it is the faster one
    (`backward_ws.preferred`), the course's three kernels everywhere else."""
    backward_ws = None if INTERPRETER else _gluon_backward()
    if backward_ws is not None and backward_ws.preferred(q, k, v, causal):
        return backward_ws.flash_attention_bwd_ws(
            dout.contiguous(), q, k, v, out, lse, causal, softmax_scale
        )
    return flash_attention_bwd(dout, q, k, v, out, lse, causal, softmax_scale)


class FlashAttentionFunction(torch.autograd.Function):
    """out = softmax(s q k^T) v; saves q, k, v, out, lse; backward by `_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale):
        out, lse = _forward(q, k, v, causal, softmax_scale)  # checks the inputs
        ctx.save_for_backward(q, k, v, out, lse)  # 4 N d + N numbers per head, no N x N
        ctx.causal, ctx.softmax_scale = causal, softmax_scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention out = softmax(s q k^T) v by the FlashAttention-2 Triton kernels, with autograd.

    s = softmax_scale, 1/sqrt(d) by default. The backward recomputes P from q, k and lse; autograd
    keeps q, k, v, out and lse only. On a machine without a CUDA GPU it runs in Triton's
    interpreter on CPU tensors (bfloat16 computed in float32 there; see the package docstring).

    Args:
        q: (batch, heads, seqlen_q, d) queries, float16, bfloat16 or float32, 16 <= d <= 256.
        k: (batch, heads, seqlen_k, d) keys, q's dtype and device.
        v: (batch, heads, seqlen_k, d) values.
        causal: query i sees keys 0..i only (needs seqlen_q == seqlen_k).
        softmax_scale: s, a positive float; default 1/sqrt(d).

    Returns:
        out: (batch, heads, seqlen_q, d), q's dtype; differentiable in q, k and v.
    """
    return FlashAttentionFunction.apply(q, k, v, causal, softmax_scale)
