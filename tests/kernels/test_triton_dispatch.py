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

# the teaching kernels launch where this machine runs them: the GPU, else the interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(n=32, d=16, device=DEVICE):
    gen = torch.Generator().manual_seed(n + d)
    return [torch.randn(1, 2, n, d, generator=gen).to(device).requires_grad_() for _ in range(3)]


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
            forward_checked=launch,  # what flash_attention calls once it checked a shape
            backward_checked=launch,
        )

    monkeypatch.setattr(autograd, "INTERPRETER", False)
    monkeypatch.setattr(autograd, "_PICKED", {})  # choices made with the real modules
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


def test_a_checked_shape_still_refuses_bad_inputs():
    """The choice is cached per shape once the inputs passed the checks; a bad call after a
    good one still gets the error that names the argument."""
    q, k, v = _qkv()
    autograd.flash_attention(q, k, v, True)
    for causal in (1, [True]):  # [True]: not even hashable
        with pytest.raises(TypeError, match="causal must be True or False"):
            autograd.flash_attention(q, k, v, causal)
    with pytest.raises(TypeError, match="share one dtype"):
        autograd.flash_attention(q, k.half(), v, True)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        autograd.flash_attention(q, k.detach().cpu().numpy(), v, True)


class _FakeJIT:
    """A stand-in for a @triton.jit kernel: kernel[grid](...) records the call and returns a
    compiled kernel whose [grid](*args) records direct launches."""

    def __init__(self, direct_fails=False):
        self.jit_calls, self.direct_calls = [], []
        self.direct_fails = direct_fails

        def fn(a, b, N, BLOCK: int, FLAG: bool = True):
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self

        return run

    def compiled(self, grid):
        def direct(*args):
            if self.direct_fails:
                raise TypeError("this Triton launches otherwise")
            self.direct_calls.append((grid, args))

        return direct


def test_launch_cache_compiles_once_then_launches_the_compiled_kernel(monkeypatch):
    from course_utils.triton_attention import launch

    monkeypatch.setattr(launch, "FAST", True)
    kernel = _FakeJIT()
    # kernel[(n,)] is the JIT's launch, returning the kernel itself as the compiled kernel, whose
    # [(n, 1, 1)] is the direct launch
    monkeypatch.setattr(_FakeJIT, "__getitem__", lambda self, grid: (
        (lambda *a, **kw: (self.jit_calls.append((grid, a, kw)), self)[1])
        if len(grid) == 1 else self.compiled(grid)
    ))  # fmt: skip
    cache = launch.LaunchCache(kernel)
    cache("k1", (4,), ("a", "b", 7), {"BLOCK": 16}, {"num_warps": 4})
    assert kernel.jit_calls == [((4,), ("a", "b", 7), {"BLOCK": 16, "num_warps": 4})]
    assert "k1" in cache and "k2" not in cache
    cache("k1", (4,), ("c", "d", 7), {"BLOCK": 16}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 1  # no second trip through the JIT
    assert kernel.direct_calls == [((4, 1, 1), ("c", "d", 7, 16, True))]  # constexprs, defaults


def test_launch_cache_falls_back_to_the_jit_when_direct_launches_fail(monkeypatch):
    from course_utils.triton_attention import launch

    monkeypatch.setattr(launch, "FAST", True)
    kernel = _FakeJIT(direct_fails=True)
    monkeypatch.setattr(_FakeJIT, "__getitem__", lambda self, grid: (
        (lambda *a, **kw: (self.jit_calls.append((grid, a, kw)), self)[1])
        if len(grid) == 1 else self.compiled(grid)
    ))  # fmt: skip
    cache = launch.LaunchCache(kernel)
    cache("k", (2,), ("a", "b", 3), {"BLOCK": 16}, {})
    with pytest.warns(RuntimeWarning, match="through the JIT from now on"):
        cache("k", (2,), ("a", "b", 3), {"BLOCK": 16}, {})
    assert len(kernel.jit_calls) == 2 and not launch.FAST and "k" not in cache
