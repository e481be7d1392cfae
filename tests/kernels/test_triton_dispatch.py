"""Which kernels flash_attention runs: `autograd.pick_kernel`, the one place that swaps in the
Hopper kernels, and the `kernels` argument. On a CPU machine with stand-in Hopper modules (the
real ones need sm_90); the GPU tests of test_triton_forward_ws and test_triton_backward_ws check
the real choice on Hopper."""

from __future__ import annotations

import types

import pytest
import torch

import course_utils.triton_attention as ta
from course_utils.triton_attention import autograd


def _qkv(n=32, d=16):
    gen = torch.Generator().manual_seed(n + d)
    return [torch.randn(1, 2, n, d, generator=gen, requires_grad=True) for _ in range(3)]


def _fake_hopper(monkeypatch, preferred, supported, calls):
    """Hopper modules that answer `preferred` and `supported` as told and record launches."""

    def module(pass_):
        def launch(*args, **kwargs):
            calls.append(pass_)
            if pass_ == "forward":
                return autograd.launch_flash_attention_fwd(*args[:5])
            return autograd.flash_attention_bwd(*args[:8])

        return types.SimpleNamespace(
            preferred=lambda q, k, v, causal: preferred,
            supported=lambda q, k, v, causal: None if supported else "not this shape",
            flash_attention_fwd_ws=launch,
            flash_attention_bwd_ws=launch,
        )

    monkeypatch.setattr(autograd, "INTERPRETER", False)
    monkeypatch.setattr(autograd, "_hopper_module", module)


def test_the_interpreter_runs_the_teaching_kernels():
    q, k, v = _qkv()
    for pass_ in autograd.PASSES:
        for kernels in autograd.KERNELS:  # "hopper" too: CPU tensors, which it does not take
            assert autograd.pick_kernel(pass_, q, k, v, False, kernels) == "teaching"
    assert ta.pick_kernel is autograd.pick_kernel


@pytest.mark.parametrize(
    "kernels, preferred, supported, picked",
    [
        ("auto", True, True, "hopper"),
        ("auto", False, True, "teaching"),  # it takes the shape but was slower there
        ("hopper", False, True, "hopper"),
        ("hopper", True, False, "teaching"),  # it does not take the shape
        ("teaching", True, True, "teaching"),
    ],
)
def test_pick_kernel_asks_preferred_or_supported(monkeypatch, kernels, preferred, supported,
                                                 picked):  # fmt: skip
    _fake_hopper(monkeypatch, preferred, supported, [])
    q, k, v = _qkv()
    for pass_ in autograd.PASSES:
        assert autograd.pick_kernel(pass_, q, k, v, True, kernels) == picked


def test_flash_attention_launches_what_pick_kernel_names(monkeypatch):
    calls = []
    _fake_hopper(monkeypatch, True, True, calls)
    q, k, v = _qkv()
    ref = torch.autograd.grad(
        autograd.flash_attention(q, k, v, True, kernels="teaching").sum(), (q, k, v)
    )
    assert calls == []
    got = torch.autograd.grad(autograd.flash_attention(q, k, v, True).sum(), (q, k, v))
    assert calls == ["forward", "backward"]
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    calls.clear()
    out = autograd.FlashAttentionWS.apply(q, k, v, True)  # kernels="hopper"
    torch.autograd.grad(out.sum(), (q, k, v))
    assert calls == ["forward", "backward"]


def test_no_gluon_means_the_teaching_kernels(monkeypatch):
    monkeypatch.setattr(autograd, "INTERPRETER", False)
    monkeypatch.setattr(autograd, "_hopper_module", lambda pass_: None)
    q, k, v = _qkv()
    assert autograd.pick_kernel("forward", q, k, v, False, "hopper") == "teaching"


def test_unknown_choices_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="kernels must be one of"):
        autograd.flash_attention(q, k, v, kernels="gluon")
    with pytest.raises(ValueError, match="pass_ must be one of"):
        autograd.pick_kernel("fwd", q, k, v, False)


def test_the_autograd_function_keeps_its_signature():
    """forward(ctx, q, k, v, causal, softmax_scale, ...): resolve_attention passes the scale."""
    from course_utils.references.gpt import resolve_attention

    q, k, v = _qkv()
    out = resolve_attention(ta.FlashAttentionFunction)(q, k, v, True)
    torch.testing.assert_close(out, ta.flash_attention(q, k, v, True))
