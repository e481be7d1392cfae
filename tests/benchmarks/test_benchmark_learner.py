"""benchmarks.attention --learner-backward: a learner's autograd.Function, loaded and wrapped."""

from __future__ import annotations

import pytest
import torch

import course_utils.triton_attention as ta  # the interpreter before triton, without a GPU
from benchmarks import attention as bench


def test_an_autograd_function_is_called_as_apply_with_causal():
    fn = bench.learner_autograd(ta.FlashAttentionFunction, "m:F")
    gen = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the course kernel runs
    q, k, v = (
        torch.randn(1, 1, 20, 16, generator=gen).to(device).requires_grad_() for _ in range(3)
    )
    out = fn(q, k, v, True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, ref, atol=1e-5 if device == "cpu" else 2e-3)  # TF32 on a GPU
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_bad_learners_are_refused_by_name():
    with pytest.raises(SystemExit, match="--learner-backward m:x: expected a torch.autograd"):
        bench.learner_autograd(3, "m:x")
    with pytest.raises(SystemExit, match="--learner-backward wants module:function"):
        bench.load_learner("nocolon", "--learner-backward")
    with pytest.raises(SystemExit, match="cannot load it"):
        bench.load_learner("course_utils.references.gpt:NoSuchThing", "--learner-backward")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_without_a_gpu_it_says_so(capsys):
    spec = "course_utils.triton_attention.autograd:FlashAttentionFunction"
    assert bench.main(["--learner-backward", spec, "--no-append"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
