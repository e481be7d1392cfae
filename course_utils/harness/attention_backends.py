"""Attention backends by name: what notebook 11's attention block calls its attention through.

A learner's block takes `attention` as a name or a function and turns it into a function with
resolve_attention; the check passes its own backends to the block. So the backends, and the
naive attention the "naive" one runs, must work while a notebook is graded: they are plumbing
(no exercise asks for them), and they live here, copied whole into the graded kernel.

    BACKENDS                            ("naive", "sdpa", "course")
    resolve_attention(attention)        -> attention(q, k, v, causal) -> out, (B, H, N, d)
    attention_label(attention)          a short name for tables and legends
    naive_attention_torch(q, k, v, causal, softmax_scale)
                                        softmax(tau q k^T [+ mask]) v in torch ops: autograd
                                        keeps P (..., Nq, Nk)

Backends, all (B, H, N, d) -> (B, H, N, d) with the scale 1/sqrt(d):

    "naive"   softmax(q k^T / sqrt(d)) v in torch ops: autograd keeps the N x N matrix P
    "sdpa"    torch.nn.functional.scaled_dot_product_attention (a fused kernel where one exists)
    "course"  course_utils.triton_attention.flash_attention (Triton; keeps q, k, v, out, lse)

torch is imported inside the functions only, so course_utils imports without it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from course_utils._validate import softmax_scale_or_default

BACKENDS = ("naive", "sdpa", "course")

__all__ = [
    "BACKENDS",
    "attention_label",
    "course_attention",
    "naive_attention",
    "naive_attention_torch",
    "resolve_attention",
    "sdpa_attention",
]


def _torch():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "this function needs PyTorch: pip install torch (Colab has it already)"
        ) from err
    return torch


def naive_attention_torch(q, k, v, causal: bool = False, softmax_scale: float | None = None):
    """softmax(tau q k^T [+ causal mask]) v in plain torch ops: autograd stores P.

    Args:
        q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) torch tensors.
        causal: query i sees keys 0..i only.  softmax_scale: tau; default 1/sqrt(d).

    Returns:
        out: (..., Nq, dv).
    """
    torch = _torch()
    tau = softmax_scale_or_default(softmax_scale, q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * tau  # (..., Nq, Nk); a scalar product saves no tensor
    if causal:
        # an additive constant mask: adding it saves nothing for the backward pass
        visible = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s + torch.zeros(visible.shape, dtype=s.dtype, device=s.device).masked_fill(
            ~visible, float("-inf")
        )
    p = torch.softmax(s, dim=-1)  # saved by softmax's and by the matmul's backward
    return p @ v


def sdpa_attention(q, k, v, causal):
    """torch's scaled_dot_product_attention, scale 1/sqrt(d). q, k, v: (B, H, N, d)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))


def naive_attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d) [+ causal mask]) v in plain torch ops; keeps P (B, H, N, N)."""
    return naive_attention_torch(q, k, v, causal=bool(causal))


def course_attention(q, k, v, causal):
    """The course's Triton FlashAttention (forward and backward kernels). q, k, v: (B, H, N, d)
    with 16 <= d <= 256; in Triton's interpreter without a GPU (slow: keep sizes tiny)."""
    from course_utils.triton_attention import flash_attention

    return flash_attention(q, k, v, bool(causal))


_BY_NAME = {"naive": naive_attention, "sdpa": sdpa_attention, "course": course_attention}


def resolve_attention(attention) -> Callable:
    """The function attention(q, k, v, causal) -> out that a name or an object stands for.

    Args:
        attention: "naive", "sdpa", "course", a callable (q, k, v, causal) -> out, or a
            torch.autograd.Function subclass whose forward takes (q, k, v, causal) or
            (q, k, v, causal, softmax_scale) (then called with softmax_scale=None: 1/sqrt(d)).

    Returns:
        A callable (q, k, v, causal) -> out; q, k, v and out of shape (B, H, N, d).
    """
    if isinstance(attention, str):
        if attention not in _BY_NAME:
            raise ValueError(
                f"attention must be one of {list(_BY_NAME)} or a callable (q, k, v, causal) -> "
                f"out, got the string {attention!r}"
            )
        return _BY_NAME[attention]
    if isinstance(attention, type) and issubclass(attention, _torch().autograd.Function):
        function = attention
        # forward(ctx, q, k, v, causal, softmax_scale): the default scale passed as None
        with_scale = len(inspect.signature(function.forward).parameters) >= 6

        def apply(q, k, v, causal):
            if with_scale:
                return function.apply(q, k, v, bool(causal), None)
            return function.apply(q, k, v, bool(causal))

        apply.__name__ = function.__name__
        return apply
    if callable(attention):
        return attention
    raise TypeError(
        f"attention must be one of {list(_BY_NAME)}, a callable (q, k, v, causal) -> out or an "
        f"autograd.Function, got {type(attention).__name__}"
    )


def attention_label(attention) -> str:
    """A short name for a backend, for tables and legends."""
    if isinstance(attention, str):
        return attention
    return getattr(attention, "__name__", type(attention).__name__)
