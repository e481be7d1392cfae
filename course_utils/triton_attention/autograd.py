"""FlashAttention with autograd: the Triton forward and backward kernels as one torch function.

The forward saves only what the backward needs to recompute P tile by tile: q, k, v, out and the
per-row logsumexp lse, so (4 N d + N) numbers per head where naive attention also keeps the
N x N matrix P. For N = 1000, d = 64 in float32 that is 1,028,000 bytes instead of 4,768,000.

Which kernels run is decided in one place, `pick_kernel`, by the `kernels` argument of
`flash_attention`:

    "auto"      (the default) for each pass, the Hopper kernel (hopper.forward_ws,
                hopper.backward_ws) where it was measured the faster on the H200 (its `preferred`:
                a Hopper GPU, a shape it takes, and for the backward 2k keys or more, or d = 128),
                the teaching kernel (forward.py, backward.py) everywhere else, the interpreter
                included
    "teaching"  the teaching kernels, always
    "hopper"    for each pass, the Hopper kernel wherever it takes the inputs (its `supported`),
                the teaching kernel elsewhere (`FlashAttentionWS`, a benchmark variant)

The Hopper modules are imported only when a pass may use them (never in the interpreter under
"auto"), and where this Triton has no Gluon API to import they are not used.
"""

from __future__ import annotations

import functools

import torch

from course_utils._validate import softmax_scale_or_default
from course_utils.harness.triton_interpreter import INTERPRETER
from course_utils.triton_attention.backward import flash_attention_bwd
from course_utils.triton_attention.forward import _check_inputs, launch_flash_attention_fwd

KERNELS = ("auto", "teaching", "hopper")
"""The values of `flash_attention`'s `kernels` argument (see the module docstring)."""

PASSES = ("forward", "backward")


@functools.cache
def _hopper_module(pass_: str):
    """hopper.forward_ws or hopper.backward_ws, or None where this Triton has no Gluon Hopper API
    to import (the course allows triton >= 3.1; forward_ws.supported refuses the versions it was
    not built on)."""
    try:
        if pass_ == "forward":
            from course_utils.triton_attention.hopper import forward_ws as module
        else:
            from course_utils.triton_attention.hopper import backward_ws as module
    except ImportError:
        return None
    return module


def pick_kernel(pass_: str, q, k, v, causal: bool, kernels: str = "auto") -> str:
    """ "hopper" or "teaching": the kernel that runs `pass_` of flash_attention(q, k, v, causal).

    The one place that swaps in the Hopper kernels (see the module docstring for `kernels`).

    Args:
        pass_: "forward" or "backward".
        q, k, v: (batch, heads, N, d) tensors that pass the teaching kernel's checks
            (`forward._check_inputs`): the Hopper kernels' tests read their shapes and devices.
        causal: the causal mask.
        kernels: "auto", "teaching" or "hopper".
    """
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels == "teaching" or (kernels == "auto" and INTERPRETER):
        return "teaching"
    module = _hopper_module(pass_)
    if module is None:
        return "teaching"
    if kernels == "auto":
        takes = module.preferred(q, k, v, causal)
    else:
        takes = module.supported(q, k, v, causal) is None
    return "hopper" if takes else "teaching"


_PICKED: dict = {}  # (pass_, kernels, _inputs_key(...)) -> pick_kernel's answer, inputs checked
_MAX_PICKED = 1024


def _inputs_key(q, k, v, causal) -> tuple | None:
    """Everything `_check_inputs` and `pick_kernel` read of the inputs (types, shapes, dtypes,
    devices, contiguity, causal), or None where one is not a tensor or causal not a bool (those
    are checked on every call, and refused): a shape checked once needs no second check (about
    20 us of Python a call at 1k keys, benchmarks/host_cost.py)."""
    if type(causal) is not bool:
        return None
    try:
        return (
            type(q), type(k), type(v), q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, q.is_contiguous(), k.is_contiguous(),
            v.is_contiguous(), causal,
        )  # fmt: skip
    except (AttributeError, TypeError):
        return None


def _picked(pass_: str, q, k, v, causal, kernels: str) -> str:
    """pick_kernel(pass_, ...) for inputs that pass `_check_inputs` (ValueError or TypeError
    naming the argument otherwise), both done once per `_inputs_key`."""
    key = (pass_, kernels, _inputs_key(q, k, v, causal))
    kind = _PICKED.get(key) if key[2] is not None else None
    if kind is None:
        _check_inputs(q, k, v, causal)  # `pick_kernel` reads shapes and devices of valid tensors
        kind = pick_kernel(pass_, q, k, v, causal, kernels)
        if key[2] is not None:
            if len(_PICKED) >= _MAX_PICKED:
                _PICKED.clear()
            _PICKED[key] = kind
    return kind


def _forward(q, k, v, causal, softmax_scale, kernels="auto"):
    """(out, lse) by the kernel `pick_kernel` names for the forward."""
    if _picked("forward", q, k, v, causal, kernels) == "hopper":
        scale = float(softmax_scale_or_default(softmax_scale, q.shape[3]))
        return _hopper_module("forward").forward_checked(q, k, v, causal, scale)
    return launch_flash_attention_fwd(q, k, v, causal, softmax_scale)


def _backward(dout, q, k, v, out, lse, causal, softmax_scale, kernels="auto"):
    """(dq, dk, dv) by the kernel `pick_kernel` names for the backward; q, k, v, out and lse are
    what `_forward` took and returned."""
    if _picked("backward", q, k, v, causal, kernels) == "hopper":
        backward_ws = _hopper_module("backward")
        dout = dout.contiguous()
        if dout.shape == out.shape and dout.dtype == out.dtype and dout.device == out.device:
            scale = float(softmax_scale_or_default(softmax_scale, q.shape[3]))
            return backward_ws.backward_checked(dout, q, k, v, out, lse, causal, scale)
        return backward_ws.flash_attention_bwd_ws(
            dout, q, k, v, out, lse, causal, softmax_scale
        )  # refuses dout, naming it
    return flash_attention_bwd(dout, q, k, v, out, lse, causal, softmax_scale)


class FlashAttentionFunction(torch.autograd.Function):
    """out = softmax(s q k^T) v; saves q, k, v, out, lse; backward by `_backward`.

    forward(ctx, q, k, v, causal=False, softmax_scale=None, kernels="auto").
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None, kernels="auto"):
        out, lse = _forward(q, k, v, causal, softmax_scale, kernels)  # checks the inputs
        ctx.save_for_backward(q, k, v, out, lse)  # 4 N d + N numbers per head, no N x N
        ctx.causal, ctx.softmax_scale, ctx.kernels = causal, softmax_scale, kernels
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale, ctx.kernels)
        return dq, dk, dv, None, None, None


class FlashAttentionWS(FlashAttentionFunction):
    """FlashAttentionFunction with kernels="hopper": each pass by the Hopper kernel wherever it
    takes the inputs, else by the teaching one. A benchmark variant: `python -m
    benchmarks.attention --backward --learner-backward
    course_utils.triton_attention.autograd:FlashAttentionWS`."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None, kernels="hopper"):
        return FlashAttentionFunction.forward(ctx, q, k, v, causal, softmax_scale, kernels)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    kernels: str = "auto",
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
        kernels: "auto" (the Hopper kernels where they were measured the faster, the teaching
            kernels elsewhere), "teaching" or "hopper" (the Hopper kernels wherever they take
            the inputs): `pick_kernel` decides, pass by pass.

    Returns:
        out: (batch, heads, seqlen_q, d), q's dtype; differentiable in q, k and v.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    return FlashAttentionFunction.apply(q, k, v, causal, softmax_scale, kernels)
