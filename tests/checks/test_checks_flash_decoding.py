"""The checks of notebook 09: right answers in three styles pass, each named mistake is recognized.

The kernel's mistakes are real @triton.jit functions with one bug each, written the way a learner
would, launched in the skeleton of course_utils.harness.decode_learner (Triton's
interpreter without a GPU). They are made from one right answer by a one-line edit, written to a
module file (Triton reads a jit function's source) and imported.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from checkhelp import run_quietly, slug_of

import course_utils.triton_attention as ta
from course_utils.checks import CheckFailure
from course_utils.checks import flash_decoding as F
from course_utils.checks.flash_decoding import exercises as F_exercises

RIGHT = """
import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # a global a kernel reads must be a constexpr


@triton.jit
def attend_chunk(q, k_ptr, v_ptr, table_ptr, chunk_start, chunk_end, qk_scale, stride_page,
                 stride_tok, offs_d, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr):
    m_i = tl.full([q.shape[0]], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([q.shape[0]], dtype=tl.float32)
    acc = tl.zeros([q.shape[0], q.shape[1]], dtype=tl.float32)
    offs_t = tl.arange(0, PAGE_SIZE)
    d_mask = offs_d < HEAD_DIM
    for start in range(chunk_start, chunk_end, PAGE_SIZE):
        page = tl.load(table_ptr + start // PAGE_SIZE).to(tl.int64)
        n_mask = start + offs_t < chunk_end
        ptrs = page * stride_page + offs_t[:, None] * stride_tok + offs_d[None, :]
        mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + ptrs, mask=mask, other=0.0)
        v = tl.load(v_ptr + ptrs, mask=mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    lse = tl.where(l_i > 0, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    return acc / l_safe[:, None], lse
"""

# Another right style: a loop over page numbers, natural-log lse from m_i * ln 2 + ln(l_i).
BY_PAGE = """
import triton
import triton.language as tl


@triton.jit
def attend_chunk(q, k_ptr, v_ptr, table_ptr, chunk_start, chunk_end, qk_scale, stride_page,
                 stride_tok, offs_d, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr):
    rows: tl.constexpr = q.shape[0]
    m_i = tl.zeros([rows], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([rows], dtype=tl.float32)
    acc = tl.zeros(q.shape, dtype=tl.float32)
    slots = tl.arange(0, PAGE_SIZE)
    for j in range(chunk_start // PAGE_SIZE, tl.cdiv(chunk_end, PAGE_SIZE)):
        phys = tl.load(table_ptr + j)
        tokens = j * PAGE_SIZE + slots
        ok = tokens < chunk_end
        off = phys.to(tl.int64) * stride_page + slots[:, None] * stride_tok + offs_d[None, :]
        ok2 = ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptr + off, mask=ok2, other=0.0)
        v = tl.load(v_ptr + off, mask=ok2, other=0.0)
        s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        scale_old = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        acc = acc * scale_old[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * scale_old + tl.sum(p, axis=1)
        m_i = m_new
    empty = l_i == 0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    ln_l = tl.log(tl.where(empty, 1.0, l_i))
    lse = tl.where(empty, float("-inf"), m_i * 0.6931471805599453 + ln_l)
    return out, lse
"""

# A third: one masked load per page through a 2-D mask, then the max taken before the loads of v.
MASK_2D = RIGHT.replace(
    "        k = tl.load(k_ptr + ptrs, mask=mask, other=0.0)\n",
    "        k = tl.load(k_ptr + ptrs, mask=mask, other=0.0).to(tl.float32).to(q.dtype)\n",
).replace(
    "    return acc / l_safe[:, None], lse",
    "    out = acc * (1.0 / l_safe)[:, None]\n    return out, lse",
)

CHUNK_BUGS = {
    "block-table-ignored": (
        "page = tl.load(table_ptr + start // PAGE_SIZE).to(tl.int64)",
        "page = start // PAGE_SIZE",
    ),
    "pages-assumed-contiguous": (
        "page = tl.load(table_ptr + start // PAGE_SIZE).to(tl.int64)",
        "page = (tl.load(table_ptr) + start // PAGE_SIZE).to(tl.int64)",
    ),
    "mask-off-by-one": (
        "n_mask = start + offs_t < chunk_end",
        "n_mask = start + offs_t <= chunk_end",
    ),
    "ragged-page": ('        s = tl.where(n_mask[None, :], s, float("-inf"))\n', ""),
    "exp-vs-exp2": ("tl.math.exp2(", "tl.exp("),
    "no-max-shift": (
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n"
        "        alpha = tl.math.exp2(m_i - m_new)\n"
        "        p = tl.math.exp2(s - m_new[:, None])\n"
        "        l_i = l_i * alpha + tl.sum(p, 1)\n"
        "        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)\n"
        "        m_i = m_new\n",
        "        p = tl.math.exp2(s)\n"
        "        l_i = l_i + tl.sum(p, 1)\n"
        "        acc = acc + tl.dot(p.to(v.dtype), v)\n"
        "        m_i = tl.maximum(m_i, tl.max(s, 1))\n",
    ),
    "empty-chunk-nan": (
        "    return acc / l_safe[:, None], lse",
        "    return acc / l_i[:, None], (m_i + tl.math.log2(l_i)) * LN2",
    ),
    "base2-lse": ("(m_i + tl.math.log2(l_safe)) * LN2", "m_i + tl.math.log2(l_safe)"),
    # p (float32) straight into tl.dot with a float16 v: the compiler refuses two dtypes
    "dot-dtype-mismatch": ("tl.dot(p.to(v.dtype), v)", "tl.dot(p, v)"),
}


# The running state in the inputs' dtype (float16 here), with the casts that keep the loop's
# types: m_i, l_i and acc all in q.dtype, or acc alone, or l_i alone.
_HALF_ACC = [
    (
        "    acc = tl.zeros([q.shape[0], q.shape[1]], dtype=tl.float32)",
        "    acc = tl.zeros([q.shape[0], q.shape[1]], dtype=q.dtype)",
    ),
    (
        "        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
        "        acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(q.dtype)",
    ),
]
_HALF_L = [
    (
        "    l_i = tl.zeros([q.shape[0]], dtype=tl.float32)",
        "    l_i = tl.zeros([q.shape[0]], dtype=q.dtype)",
    ),
    (
        "        l_i = l_i * alpha + tl.sum(p, 1)",
        "        l_i = (l_i * alpha + tl.sum(p, 1)).to(q.dtype)",
    ),
    (
        "    l_safe = tl.where(l_i > 0, l_i, 1.0)",
        "    l_safe = tl.where(l_i > 0, l_i, 1.0).to(tl.float32)",
    ),
]
_HALF_M = [
    (
        '    m_i = tl.full([q.shape[0]], float("-inf"), dtype=tl.float32)',
        '    m_i = tl.full([q.shape[0]], float("-inf"), dtype=q.dtype)',
    ),
    ("        m_i = m_new\n", "        m_i = m_new.to(q.dtype)\n"),
]


def _replaced(source, pairs):
    for right, wrong in pairs:
        assert right in source, right
        source = source.replace(right, wrong)
    return source


HALF_STATES = {
    "m-l-acc": _replaced(RIGHT, _HALF_M + _HALF_L + _HALF_ACC),
    "acc": _replaced(RIGHT, _HALF_ACC),
    "l": _replaced(RIGHT, _HALF_L),
}


def _module(tmp_path, name, source):
    path = tmp_path / f"{name.replace('-', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.attend_chunk


@pytest.mark.parametrize("style", ["right", "by-page", "mask-2d"])
def test_right_attend_chunk_styles_pass(tmp_path, style):
    source = {"right": RIGHT, "by-page": BY_PAGE, "mask-2d": MASK_2D}[style]
    out = run_quietly(F.check_attend_chunk, _module(tmp_path, style, source), seed=None)
    assert out.startswith("✓ attend_chunk")


@pytest.mark.parametrize("slug", sorted(CHUNK_BUGS))
def test_each_chunk_mistake_is_named(tmp_path, slug):
    right, wrong = CHUNK_BUGS[slug]
    assert right in RIGHT
    fn = _module(tmp_path, slug, RIGHT.replace(right, wrong))
    with pytest.raises(CheckFailure) as failure:
        run_quietly(F.check_attend_chunk, fn)
    assert slug_of(failure.value) == slug, str(failure.value)


@pytest.mark.parametrize("which", sorted(HALF_STATES))
def test_half_precision_state_is_named(tmp_path, which):
    fn = _module(tmp_path, f"half_{which}", HALF_STATES[which])
    with pytest.raises(CheckFailure) as failure:
        run_quietly(F.check_attend_chunk, fn, seed=None, trials=3)  # as the hidden tests run
    assert slug_of(failure.value) == "half-precision-state", str(failure.value)
    assert "16 pages per split of exact scores" in str(failure.value)


def test_hidden_call_runs_only_random_cases_after_a_pass(tmp_path):
    right = _module(tmp_path, "again", RIGHT)
    assert "match" in run_quietly(F.check_attend_chunk, right)
    fixed = len(F_exercises._chunk_cases(0, 0, not ta.INTERPRETER))
    again = run_quietly(F.check_attend_chunk, right, seed=None, trials=3)
    assert f"3 random launches (and the {fixed} fixed ones above)" in again, again
    # used once: a third call runs them all again, and so does a visible call (seed 0)
    assert "random" not in run_quietly(F.check_attend_chunk, right, seed=None, trials=0)
    assert "random" not in run_quietly(F.check_attend_chunk, right, trials=0)
    # another function (a wrong one, defined after the pass) runs the fixed cases again
    assert "match" in run_quietly(F.check_attend_chunk, right, trials=0)
    wrong = _module(tmp_path, "again_wrong", RIGHT.replace(*CHUNK_BUGS["mask-off-by-one"]))
    with pytest.raises(CheckFailure) as failure:
        run_quietly(F.check_attend_chunk, wrong, seed=None, trials=3)
    assert slug_of(failure.value) == "mask-off-by-one"


@pytest.mark.parametrize("on_gpu", [False, True])
def test_float32_state_case_in_every_run(on_gpu):
    for seed, trials in ((0, 2), (None, 3)):
        cases = F_exercises._chunk_cases(seed, trials, on_gpu)
        assert sum(c.exact for c in cases) == 1
        assert next(c for c in cases if c.exact).dtype == "float16"


def test_stub_and_plain_function_are_refused(tmp_path):
    stub = RIGHT.split("    m_i =")[0] + "    raise NotImplementedError()\n"
    with pytest.raises(NotImplementedError):
        F.check_attend_chunk(_module(tmp_path, "stub", stub))
    with pytest.raises(CheckFailure, match="@triton.jit"):
        F.check_attend_chunk(lambda *a: None)


# ---- the merge --------------------------------------------------------------------------------
def merge_where(out_partial, lse_partial):
    m = lse_partial.max(dim=2, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lse_partial - m)
    total = w.sum(dim=2)
    out = (w[..., None] * out_partial).sum(dim=2) / torch.where(total > 0, total, 1.0)[..., None]
    return out, torch.where(total > 0, m[..., 0] + torch.log(total), float("-inf"))


def merge_logsumexp(out_partial, lse_partial):
    lse = torch.logsumexp(lse_partial, dim=2)  # -inf when every chunk is empty
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w = torch.exp(lse_partial - safe[..., None])
    return (w[..., None] * out_partial).sum(dim=2), lse


def merge_pairwise(out_partial, lse_partial):
    o, lse = out_partial[:, :, 0], lse_partial[:, :, 0]
    for s in range(1, lse_partial.shape[2]):
        o2, l2 = out_partial[:, :, s], lse_partial[:, :, s]
        new = torch.logaddexp(lse, l2)
        safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        o = torch.exp(lse - safe)[..., None] * o + torch.exp(l2 - safe)[..., None] * o2
        lse = new
    return o, lse


@pytest.mark.parametrize("fn", [merge_where, merge_logsumexp, merge_pairwise])
def test_right_merges_pass(fn):
    assert run_quietly(F.check_merge_splits, fn, seed=None, trials=10).startswith("✓")


@pytest.mark.parametrize("fn", [merge_where, merge_logsumexp, merge_pairwise])
def test_right_merges_pass_on_many_random_cases(fn):
    # a right float32 merge of lse values near 300 is off by ~1e-5 (the ulp of its running lse):
    # the check once rejected merge_pairwise on such a case; 300 seeds of 10 random cases each
    for seed in range(300):
        assert run_quietly(F.check_merge_splits, fn, seed=seed, trials=10).startswith("✓"), seed


def merge_mean(out_partial, lse_partial):
    return out_partial.mean(dim=2), torch.logsumexp(lse_partial, dim=2)


def merge_no_shift(out_partial, lse_partial):
    w = torch.exp(lse_partial)
    return (w[..., None] * out_partial).sum(2) / w.sum(2)[..., None], torch.log(w.sum(2))


def merge_nan(out_partial, lse_partial):
    m = lse_partial.max(dim=2, keepdim=True).values
    w = torch.exp(lse_partial - m)
    return (w[..., None] * out_partial).sum(2) / w.sum(2)[..., None], m[..., 0] + torch.log(
        w.sum(2)
    )


def merge_lse_max(out_partial, lse_partial):
    out, _ = merge_where(out_partial, lse_partial)
    return out, lse_partial.max(dim=2).values


def merge_unnormalized(out_partial, lse_partial):
    m = lse_partial.max(dim=2, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lse_partial - m)
    return (w[..., None] * out_partial).sum(2), torch.logsumexp(lse_partial, dim=2)


@pytest.mark.parametrize(
    "fn, slug",
    [
        (merge_mean, "merge-ignores-lse"),
        (merge_no_shift, "no-max-shift"),
        (merge_nan, "empty-chunk-nan"),
        (merge_lse_max, "merge-lse-max"),
        (merge_unnormalized, "merge-unnormalized"),
    ],
)
def test_each_merge_mistake_is_named(fn, slug):
    with pytest.raises(CheckFailure) as failure:
        run_quietly(F.check_merge_splits, fn)
    assert slug_of(failure.value) == slug, str(failure.value)


def test_replays_without_bug_equal_the_reference():
    case = F.DecodeCase("t", 4, 2, 16, 16, (1, 40, 0), 3, seed=9)
    _, (q, k, v, table, lens) = F.decode_inputs(case)
    ref = F.reference_partials(q, k, v, table, lens, 0.25, 3)
    emu = F.emulate_partials(q, k, v, table, lens, 0.25, 3)
    np.testing.assert_allclose(emu[0], ref[0], atol=1e-12)
    np.testing.assert_array_equal(np.isinf(emu[1]), np.isinf(ref[1]))
    assert np.isinf(ref[1]).any()  # the case has empty chunks


def test_quick_checks():
    run_quietly(F.check_quick_programs, 8 * 8 * 4)
    with pytest.raises(CheckFailure, match="KV heads"):
        F.check_quick_programs(8 * 32 * 4)
    run_quietly(F.check_quick_kv_bytes, 2 * 65536 * 8 * 128 * 2)
    with pytest.raises(CheckFailure, match="K and V"):
        F.check_quick_kv_bytes(65536 * 8 * 128 * 2)
    assert math.isclose(2 * 65536 * 8 * 128 * 2, 268435456)
    assert ta.INTERPRETER in (True, False)


def test_a_plain_global_in_the_kernel_is_named_on_any_machine(tmp_path):
    """The interpreter runs a kernel that reads a plain global; a GPU refuses to compile it. The
    check says so on a CPU too, with the fix."""
    plain = RIGHT.replace("LN2 = tl.constexpr(0.6931471805599453)", "LN2 = 0.6931471805599453")
    assert plain != RIGHT
    with pytest.raises(CheckFailure) as failure:
        run_quietly(F.check_attend_chunk, _module(tmp_path, "plain_global", plain))
    assert "LN2 = tl.constexpr(0.6931471805599453)" in str(failure.value), str(failure.value)


# ---- an error inside the learner's attend_chunk, run as notebook 09's "Try it" cell does ---------
LOOP_VARIABLE_AS_TENSOR = (
    "page = tl.load(table_ptr + start // PAGE_SIZE).to(tl.int64)",
    "page = tl.load(table_ptr + start.to(tl.int64) // PAGE_SIZE).to(tl.int64)",
)


def _try_it(attend_chunk):
    """Notebook 09's Try-it cell: the learner's partials on two sequences, GQA 4/2, three splits."""
    from course_utils.harness.decode_learner import learner_decode_partials

    tensors, _ = F.decode_inputs(F.DecodeCase("try", 4, 2, 16, 16, (37, 5), 3, seed=1))
    return learner_decode_partials(attend_chunk, *tensors, num_splits=3)


@pytest.mark.skipif(not ta.INTERPRETER, reason="on a GPU the loop variable is a tensor")
def test_a_loop_variable_used_as_a_tensor_is_one_line_with_the_fix(tmp_path):
    from course_utils.harness.decode_learner import AttendChunkError

    right, wrong = LOOP_VARIABLE_AS_TENSOR
    fn = _module(tmp_path, "loop_var", RIGHT.replace(right, wrong))
    with pytest.raises(AttendChunkError) as raised:
        _try_it(fn)
    shown = raised.value._render_traceback_()  # what IPython prints instead of a traceback
    assert len(shown) == 1 and "\n" not in shown[0], shown
    assert wrong in shown[0] and "'int' object has no attribute 'to'" in shown[0], shown[0]
    assert "tl.cast(start, tl.int64)" in shown[0], shown[0]
    # the fix it names runs, and the check still reports the error with its input
    fixed = RIGHT.replace(right, right.replace("start //", "tl.cast(start, tl.int64) //"))
    assert fixed != RIGHT
    out_partial, _ = _try_it(_module(tmp_path, "loop_var_fixed", fixed))
    assert torch.isfinite(out_partial).all()
    with pytest.raises(CheckFailure, match="has no attribute 'to'"):
        run_quietly(F.check_attend_chunk, fn)


def test_an_error_outside_attend_chunk_keeps_its_traceback(tmp_path):
    from course_utils.harness.decode_learner import attend_chunk_error

    fn = _module(tmp_path, "right_for_errors", RIGHT)
    try:
        raise ValueError("raised by the launcher, not by attend_chunk")
    except ValueError as err:
        assert attend_chunk_error(fn, err) is None
