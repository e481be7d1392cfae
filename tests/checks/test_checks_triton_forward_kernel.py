"""Notebook 06: the kernel emulation, the quick checks, the skeleton runner, interpreter limits.

The emulation (checks/triton_forward/emulation.py) replays the skeleton kernel in float64 with one
bug at a time: without a bug it is attention, and each bug shows on some case. The skeleton's
runner (course_utils.harness.triton_learner) launches a learner's @triton.jit step and finalize
(Triton's interpreter without a GPU). The puzzles' and the whole forward's checks are tested in
test_checks_triton_forward_puzzles.py.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from checkhelp import run_quietly

import course_utils.triton_attention as ta
from course_utils.checks import CheckFailure
from course_utils.checks.engine.feedback import closest_mistake
from course_utils.checks.engine.kernels import _raised_failure, _rel_err
from course_utils.checks.triton_forward import emulation as T
from course_utils.checks.triton_forward import quick as Q
from course_utils.harness.triton_learner import (
    check_learner_function,
    learner_attention,
    make_learner_attention,
)

DEVICE = "cpu" if ta.INTERPRETER else "cuda"
# float32 against float32: exact in the interpreter up to rounding; tf32 tensor cores on a GPU.
TOL32 = 1e-4 if ta.INTERPRETER else 1e-2


# ---- the learner's answers, as the notebook's solution writes them ----------------------------
@triton.jit
def step(acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale, CAUSAL: tl.constexpr):
    s = tl.dot(q, tl.trans(k)) * qk_scale
    visible = offs_n[None, :] < seqlen_k
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def finalize(acc, m_i, l_i):
    return acc / l_i[:, None], (m_i + tl.math.log2(l_i)) * 0.6931471805599453


# ---- stubs, as the notebook hands them out ---------------------------------------------------
@triton.jit
def step_stub(acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale, CAUSAL: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


@triton.jit
def finalize_stub(acc, m_i, l_i):
    # YOUR CODE HERE
    raise NotImplementedError()


def test_stubs_and_plain_functions_are_refused_before_any_launch():
    q = torch.zeros(1, 1, 16, 16, device=DEVICE)
    for stubs in [(step_stub, finalize), (step, finalize_stub)]:
        with pytest.raises(NotImplementedError):
            learner_attention(*stubs, q, q, q)

    def plain(acc, m_i, l_i):
        return acc, m_i

    with pytest.raises(TypeError, match="@triton.jit"):
        check_learner_function(plain, "finalize_rows")


def test_a_kernel_is_validated_once_and_a_stub_every_time():
    """Launchers validate the learner's kernels on every call; an accepted kernel object is
    remembered (no second read of its source), a stub is refused each time it is launched."""
    from course_utils.harness import triton_learner as learner

    check_learner_function(step, "online_softmax_step")
    assert step in learner._ACCEPTED

    @triton.jit
    def stub(acc, m_i, l_i):
        raise NotImplementedError()

    for _ in range(2):
        with pytest.raises(NotImplementedError, match="not written yet"):
            check_learner_function(stub, "finalize_rows")
    assert stub not in learner._ACCEPTED


def test_emulation_without_bugs_is_attention():
    """The float64 emulation of the skeleton with no bug equals the direct float64 attention."""
    rng = np.random.default_rng(0)
    for causal, n_q, n_k, bm, bn in [(False, 33, 70, 32, 16), (True, 50, 50, 16, 32)]:
        q, k, v = (rng.standard_normal((2, 2, n, 24)) for n in (n_q, n_k, n_k))
        got = T.emulate_kernel(q, k, v, causal, 0.3, bm, bn)
        want = T._reference_attention(q, k, v, causal, 0.3)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# (causal, N_q, N_k, d, BLOCK_M, BLOCK_N, the last K/V tile raises the max): the interpreter's
# launches of the forward (one tile, two tiles, ragged keys, causal, d padded)
EMULATED = [
    (False, 16, 16, 16, 16, 16, False),
    (False, 16, 32, 16, 16, 16, True),
    (False, 24, 40, 16, 16, 16, False),
    (True, 40, 40, 16, 32, 16, False),
    (True, 50, 50, 32, 16, 16, False),
    (False, 33, 70, 24, 32, 16, False),
]


def _emulated_inputs(case, seed):
    causal, n_q, n_k, d, bm, bn, late_max = case
    rng = np.random.default_rng(seed)
    q = 2.0 * rng.standard_normal((1, 2, n_q, d))  # spread scores: the max moves between tiles
    k, v = (rng.standard_normal((1, 2, n_k, d)) for _ in "kv")
    if late_max:
        k[:, :, -bn:] *= 2.5
    return (q, k, v, causal, 1 / math.sqrt(d), bm, bn)


def test_every_out_mistake_is_shown_by_some_case():
    """Each emulated mistake differs from attention on at least one of these launches."""
    for mistake in T.KERNEL_OUT_MISTAKES + T.KERNEL_LSE_MISTAKES:
        which = 0 if mistake in T.KERNEL_OUT_MISTAKES else 1
        shown = False
        for seed, case in enumerate(EMULATED):
            args = _emulated_inputs(case, seed)
            theirs = mistake.fn(*args)[which]
            expected = T._reference_attention(*args[:5])[which]
            if _rel_err(theirs, expected) > 1e-2:
                shown = True
                break
        assert shown, mistake.title


def test_normalize_then_average_is_named_from_its_emulation():
    """No short kernel averages tiles (it needs a tile counter): its emulation is named."""
    args = _emulated_inputs(EMULATED[1], 1)
    theirs = T.emulate_kernel(*args, combine="normalize-average")[0]
    expected = T._reference_attention(*args[:5])[0]
    replays = (
        (m, (m.fn(*args)[0],))
        for m in T.KERNEL_OUT_MISTAKES
        if _rel_err(m.fn(*args)[0], expected) >= 1e-5
    )
    found = closest_mistake((theirs,), replays, 1e-3)
    assert found is not None and found.slug == "normalize-then-average"


def test_learner_attention_matches_the_course_kernel_and_the_benchmark_signature():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 45, 32, generator=gen).to(DEVICE) for _ in range(3))
    attention = make_learner_attention(step, finalize)
    for causal in (False, True):
        out, lse = attention(q, k, v, causal)
        ref_out, ref_lse = ta.flash_attention_fwd(q, k, v, causal)
        torch.testing.assert_close(out, ref_out, rtol=TOL32, atol=TOL32)
        torch.testing.assert_close(lse, ref_lse, rtol=TOL32, atol=TOL32)


def test_learner_attention_strided_bfloat16_and_empty_inputs():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=gen).to(DEVICE).transpose(1, 2) for _ in "qkv")
    out, lse = learner_attention(step, finalize, q, k, v, causal=True)
    ref_out, _ = ta.flash_attention_fwd(q, k, v, causal=True)
    torch.testing.assert_close(out, ref_out, rtol=TOL32, atol=TOL32)
    out16, _ = learner_attention(step, finalize, q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out16.dtype == torch.bfloat16
    assert (out16.float() - ta.flash_attention_fwd(q, k, v)[0]).abs().max() < 2e-2
    empty = torch.zeros(1, 2, 0, 16, device=DEVICE)
    out, lse = learner_attention(step, finalize, q[:, :, :3], empty, empty)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_learner_attention_refuses_bad_tiles():
    q = torch.zeros(1, 1, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        learner_attention(step, finalize, q, q, q, block_m=24)


# ---- quick checks --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, right, wrong",
    [
        (Q.check_quick_num_programs, 128, 120),
        (Q.check_quick_qk_scale, 0.125 * 1.4426950408889634, 0.125),
        (Q.check_quick_causal_kv_tiles, 12, 32),
    ],
)
def test_quick_checks(check, right, wrong):
    assert "✓" in run_quietly(check, right)
    with pytest.raises(CheckFailure, match="hint"):
        check(wrong)
    with pytest.raises(CheckFailure, match="no answer yet"):
        check(None)


def test_each_quick_question_names_the_variable_to_set():
    import json  # the notebook's JSON as Jupyter saves it: nbformat is not on the GPU machine
    import re
    from pathlib import Path

    name = "06_triton_forward"
    path = Path(__file__).parents[2] / "solutions" / name / f"{name}.ipynb"
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        cell["source"] = "".join(cell["source"])  # a list of lines on disk
    asked = {}
    for i, cell in enumerate(cells):
        found = re.search(r"check_quick_\w+\((answer_\w+)\)", cell["source"])
        if cell["cell_type"] == "code" and found:  # the question: the last markdown before it
            question = next(c for c in reversed(cells[: i - 1]) if c["cell_type"] == "markdown")
            asked[found.group(1)] = " ".join(question["source"].split())
    assert set(asked) == {"answer_num_programs", "answer_qk_scale", "answer_causal_kv_tiles"}
    for variable, question in asked.items():
        assert f"Set `{variable}`" in question, variable


# a launch as a check's failure names it (a label and a describe(), as the checks' cases have)
ONE_TILE = types.SimpleNamespace(
    label="one tile",
    describe=lambda: "q (1, 1, 16, 16), k and v (1, 1, 16, 16), float32, causal=False",
)


# ---- valid Triton that the interpreter refuses: one line, the interpreter's limit --------------
@triton.jit
def _mask_scalar_and_vector(x_ptr, y_ptr, n, start, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = (offs < n) & (start < n)  # a scalar condition and a vector one
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=offs < n)


@triton.jit
def _shape_from_a_tensor(x_ptr, y_ptr, n, start, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    H = x.shape[0]  # noqa: N806  (a learner's name)
    tl.store(y_ptr + offs, x + tl.zeros((H,), dtype=tl.float32))


@triton.jit
def _to_on_a_loop_index(x_ptr, y_ptr, n, start, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for first in tl.range(start, n, BLOCK):
        page = (first // BLOCK).to(tl.int64)
        tl.store(y_ptr + offs, tl.load(x_ptr + page * BLOCK + offs))


@pytest.mark.parametrize(
    "kernel, fix, gpu_runs",
    [
        (_mask_scalar_and_vector, "start + offs * 0 < n", True),
        (_shape_from_a_tensor, "tl.constexpr argument", False),  # Triton 3.6's compiler too
        (_to_on_a_loop_index, "tl.cast(start // PAGE_SIZE, tl.int64)", True),
    ],
    ids=["scalar-and-vector-mask", "shape-from-tensor", "int-to"],
)
def test_interpreter_limits_are_one_line(kernel, fix, gpu_runs):
    x, y = torch.randn(64, device=DEVICE), torch.zeros(64, device=DEVICE)
    if not ta.INTERPRETER and gpu_runs:  # valid Triton: compiled, it runs
        kernel[(1,)](x, y, 16, 0, BLOCK=16)
        return
    with pytest.raises(Exception) as info:
        kernel[(1,)](x, y, 16, 0, BLOCK=16)
    first, *rest = str(_raised_failure("online_softmax_step", ONE_TILE, info.value)).splitlines()
    said = "(it runs on a GPU)" if gpu_runs else "interpreter and its GPU compiler both refuse"
    assert said in first and fix in first, first
    assert "input: q (1, 1, 16, 16)" in rest[0]


def test_other_errors_are_not_called_interpreter_limits():
    from course_utils.checks.engine.interpreter_limits import interpreter_limit

    assert interpreter_limit("IndexError: list index out of range") is None
    text = str(_raised_failure("k", ONE_TILE, ValueError("operands must have the same dtype")))
    assert "interpreter" not in text and "tl.dot(p.to(v.dtype), v)" in text
