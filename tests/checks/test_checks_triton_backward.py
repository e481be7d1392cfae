"""The checks of notebook 08: right kernels pass in several styles, each named mistake is named.

The kernels are real @triton.jit functions. Triton reads a kernel's source from its file, so each
variant is written as a small module (the solution's source with one edit) and imported; the
checks launch it through course_utils.harness.triton_learner_backward, in Triton's interpreter
without a GPU, as a learner's would be.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from pathlib import Path

import pytest
import torch
from checkhelp import run_quietly, slug_of

import course_utils.triton_attention as ta  # noqa: F401  (the interpreter before triton)
from benchmarks import learner_solutions
from course_utils.checks import CheckFailure
from course_utils.checks.triton_backward import function as F
from course_utils.checks.triton_backward import kernels as C
from course_utils.checks.triton_backward import quick as Q

REPO = Path(__file__).resolve().parents[2]
_count = itertools.count()


SOURCE = learner_solutions.module_source("08_triton_backward")  # the four answer cells


def variant(tmp_path: Path, *edits: tuple[str, str], extra: str = ""):
    """The solution module with each (old, new) edit made once (old must be there)."""
    text = SOURCE
    for old, new in edits:
        assert old in text, f"the solution has no {old!r}"
        text = text.replace(old, new, 1)
    path = tmp_path / f"learner_{next(_count)}.py"
    path.write_text(text + extra)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def solution(tmp_path_factory):
    return variant(tmp_path_factory.mktemp("solution"))


def slug_for(check, fn) -> str:
    """The misconception the check names, or its whole message where it names none (so that
    a failing assertion shows what the check said)."""
    with pytest.raises(CheckFailure) as info:
        run_quietly(check, fn)
    return slug_of(info.value) or f"no misconception named in: {info.value}"


# ---- right answers ------------------------------------------------------------------------------
def test_solution_passes_every_check(solution):
    assert "✓ bwd_preprocess_kernel" in run_quietly(
        C.check_bwd_preprocess, solution.bwd_preprocess_kernel
    )
    out = run_quietly(C.check_dkdv_kernel, solution.bwd_dkdv_kernel)
    skip_said = "interpreter only" if torch.cuda.is_available() else "skipped"
    assert "✓ bwd_dkdv_kernel" in out and skip_said in out
    assert "✓ bwd_dq_kernel" in run_quietly(C.check_dq_kernel, solution.bwd_dq_kernel)
    assert "✓ FlashAttentionTriton" in run_quietly(
        F.check_attention_function, solution.FlashAttentionTriton
    )


NATURAL_LOG = (  # style 2: tl.exp in natural units, the scores masked to -inf before the exp
    ("s_t = tl.dot(k, tl.trans(q)) * qk_scale", "s_t = tl.dot(k, tl.trans(q)) * softmax_scale"),
    (
        "p_t = tl.where(visible, tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634), 0.0)",
        "s_t = tl.where(visible, s_t, float('-inf'))\n        p_t = tl.exp(s_t - lse[None, :])",
    ),
    ("s = tl.dot(q, tl.trans(k)) * qk_scale", "s = tl.dot(q, tl.trans(k)) * softmax_scale"),
    (
        "p = tl.where(visible, tl.math.exp2(s - lse[:, None] * 1.4426950408889634), 0.0)",
        "s = tl.where(visible, s, float('-inf'))\n        p = tl.exp(s - lse[:, None])",
    ),
)
SCALE_INSIDE = (  # style 3: the scale folded into dS inside the loop; D from tl.sum over axis -1
    (
        "ds_t = p_t * (dp_t - delta[None, :])",
        "ds_t = p_t * (dp_t - delta[None, :]) * softmax_scale",
    ),
    ("dk = dk * softmax_scale  #", "dk = dk  #"),
    ("ds = p * (dp - delta[:, None])", "ds = softmax_scale * (p * (dp - delta[:, None]))"),
    ("dq = dq * softmax_scale", "dq = dq"),
    ("axis=1)", "axis=-1)"),
)


BY_TILE_INDEX = (  # style 4: plain tl.load with its own masks for D; loops over tile indices
    (
        "o = load_tile(out_ptr + head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D)\n"
        "    do = load_tile(do_ptr + head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D)",
        "rows = start_m + tl.arange(0, BLOCK_M)\n"
        "    cols = tl.arange(0, BLOCK_D)\n"
        "    inside = (rows < seqlen_q)[:, None] & (cols < HEAD_DIM)[None, :]\n"
        "    at = head + rows[:, None] * HEAD_DIM + cols[None, :]\n"
        "    o = tl.load(out_ptr + at, mask=inside, other=0.0)\n"
        "    do = tl.load(do_ptr + at, mask=inside, other=0.0)",
    ),
    (
        "for start_m in range(lo, seqlen_q, BLOCK_M):",
        "for i in range(lo // BLOCK_M, tl.cdiv(seqlen_q, BLOCK_M)):\n        start_m = i * BLOCK_M",
    ),
    (
        "for start_n in range(0, hi, BLOCK_N):",
        "for j in range(0, tl.cdiv(hi, BLOCK_N)):\n        start_n = j * BLOCK_N",
    ),
)


@pytest.mark.parametrize(
    "edits",
    [NATURAL_LOG, SCALE_INSIDE, BY_TILE_INDEX],
    ids=["natural-log", "scale-inside", "by-tile"],
)
def test_other_right_styles_pass(tmp_path, edits):
    m = variant(tmp_path, *edits)
    run_quietly(C.check_bwd_preprocess, m.bwd_preprocess_kernel)
    run_quietly(C.check_dkdv_kernel, m.bwd_dkdv_kernel)
    run_quietly(C.check_dq_kernel, m.bwd_dq_kernel)


# ---- named mistakes of the kernels ------------------------------------------------------------
DKDV = [
    ("lse-not-subtracted", ("s_t - lse[None, :] * 1.4426950408889634", "s_t")),
    ("lse-units", ("s_t - lse[None, :] * 1.4426950408889634", "s_t - lse[None, :]")),
    ("exp-vs-exp2", ("tl.math.exp2(s_t - lse", "tl.exp(s_t - lse")),
    ("forgot-D", ("ds_t = p_t * (dp_t - delta[None, :])", "ds_t = p_t * dp_t")),
    ("ds-sign", ("ds_t = p_t * (dp_t - delta[None, :])", "ds_t = p_t * (delta[None, :] - dp_t)")),
    ("dk-not-scaled", ("dk = dk * softmax_scale  #", "dk = dk  #")),
    (
        "causal-off-by-one",
        ("offs_n[:, None] <= offs_m[None, :]", "offs_n[:, None] < offs_m[None, :]"),
    ),
    ("causal-mask-missing", ("visible = visible & (offs_n[:, None] <= offs_m[None, :])", "pass")),
    ("no-causal-skip", ("lo = (start_n // BLOCK_M) * BLOCK_M", "lo = 0")),
    ("head-offset-missing", ("bh = tl.program_id(1).to(tl.int64)\n    q_ptr", "bh = 0\n    q_ptr")),
]
DQ = [
    ("dq-not-scaled", ("dq = dq * softmax_scale", "dq = dq * 1.0")),
    ("lse-units", ("s - lse[:, None] * 1.4426950408889634", "s - lse[:, None]")),
    ("forgot-D", ("ds = p * (dp - delta[:, None])", "ds = p * dp")),
    ("causal-off-by-one",
     ("offs_n[None, :] <= offs_m[:, None]", "offs_n[None, :] <= offs_m[:, None] + 1")),
    ("no-causal-skip", ("hi = tl.minimum(start_m + BLOCK_M, seqlen_k)", "hi = seqlen_k")),
]  # fmt: skip
PREPROCESS = [
    ("head-offset-missing", ("head = bh * seqlen_q * HEAD_DIM", "head = 0")),
    ("d-in-half-precision", ("o.to(tl.float32) * do.to(tl.float32)", "o * do")),
]


def _counted_here(slug):
    """Causal tile skipping is counted by the interpreter; a compiled kernel's tl.dot cannot be
    counted, and the check says so in its verdict (see test_right_answers_pass)."""
    if slug == "no-causal-skip" and torch.cuda.is_available():
        pytest.skip("causal tile skipping is counted in the interpreter only")


@pytest.mark.parametrize("slug, edit", DKDV, ids=[s for s, _ in DKDV])
def test_dkdv_mistakes_are_named(tmp_path, slug, edit):
    _counted_here(slug)
    assert slug_for(C.check_dkdv_kernel, variant(tmp_path, edit).bwd_dkdv_kernel) == slug


@pytest.mark.parametrize("slug, edit", DQ, ids=[s for s, _ in DQ])
def test_dq_mistakes_are_named(tmp_path, slug, edit):
    _counted_here(slug)
    assert slug_for(C.check_dq_kernel, variant(tmp_path, edit).bwd_dq_kernel) == slug


# dK, dV, dQ accumulated in the inputs' dtype, cast back after each tile to keep the loop's types
HALF_DK = (
    (
        "dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)",
        "dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=k.dtype)",
    ),
    ("dk += tl.dot(ds_t.to(q.dtype), q)", "dk = (dk + tl.dot(ds_t.to(q.dtype), q)).to(k.dtype)"),
)
HALF_DV = (
    (
        "dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)",
        "dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=v.dtype)",
    ),
    ("dv += tl.dot(p_t.to(do.dtype), do)", "dv = (dv + tl.dot(p_t.to(do.dtype), do)).to(v.dtype)"),
)
HALF_DQ = (
    (
        "dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)",
        "dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=q.dtype)",
    ),
    ("dq += tl.dot(ds.to(k.dtype), k)", "dq = (dq + tl.dot(ds.to(k.dtype), k)).to(q.dtype)"),
)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize(
    "kernel, edits",
    [
        ("bwd_dkdv_kernel", HALF_DK + HALF_DV),
        ("bwd_dkdv_kernel", HALF_DK),
        ("bwd_dkdv_kernel", HALF_DV),
        ("bwd_dq_kernel", HALF_DQ),
    ],
    ids=["dk-dv", "dk", "dv", "dq"],
)
def test_half_precision_accumulators_are_named(tmp_path, kernel, edits, hidden):
    check = {"bwd_dkdv_kernel": C.check_dkdv_kernel, "bwd_dq_kernel": C.check_dq_kernel}[kernel]
    fn = getattr(variant(tmp_path, *edits), kernel)
    kwargs = {"seed": None, "trials": 3, "fixed": False} if hidden else {}
    with pytest.raises(CheckFailure) as info:
        run_quietly(check, fn, **kwargs)
    assert slug_of(info.value) == "half-precision-state", str(info.value)
    assert "float32 state" in str(info.value)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_float32_state_case_in_every_run(on_gpu, monkeypatch):
    monkeypatch.setattr(C, "_on_gpu", lambda: on_gpu)
    monkeypatch.setattr(C, "_ampere_or_newer", lambda: True)
    for seed, trials, fixed in ((0, 1, True), (None, 3, False)):
        cases = C._kernel_cases(seed, trials, fixed)
        assert [c.exact for c in cases].count(True) == 1
        assert C.STATE_CASE in cases and C.STATE_CASE.dtype == "float16"


@pytest.mark.parametrize("slug, edit", PREPROCESS, ids=[s for s, _ in PREPROCESS])
def test_preprocess_mistakes_are_named(tmp_path, slug, edit):
    kernel = variant(tmp_path, edit).bwd_preprocess_kernel
    assert slug_for(C.check_bwd_preprocess, kernel) == slug


# ---- named mistakes of the autograd.Function --------------------------------------------------
SAVE = "ctx.save_for_backward(q, k, v, out, lse)"
UNPACK = "q, k, v, out, lse = ctx.saved_tensors"
FUNCTION = [
    ("saves-probabilities",
     (SAVE, "ctx.save_for_backward(q, k, v, out, lse, q @ k.transpose(-1, -2))"),
     (UNPACK, "q, k, v, out, lse, _ = ctx.saved_tensors")),
    ("saves-extra", (SAVE, "ctx.save_for_backward(q, k, v, out, lse, lse * 2 + 1)"),
     (UNPACK, "q, k, v, out, lse, _ = ctx.saved_tensors")),
    ("saves-extra", (SAVE, SAVE + "\n        ctx.out_copy = out.clone()")),
    ("saves-missing", (SAVE, "ctx.save_for_backward(q, k, v, lse)"),
     (UNPACK, "q, k, v, lse = ctx.saved_tensors\n        out = ta.flash_attention_fwd("
              "q, k, v, ctx.causal, ctx.softmax_scale)[0]")),
    ("lse-dtype", (SAVE, "ctx.save_for_backward(q, k, v, out, lse.double())"),
     (UNPACK, UNPACK + "\n        lse = lse.float()")),
    ("lse-shape", (SAVE, "ctx.save_for_backward(q, k, v, out, lse[..., None])"),
     (UNPACK, UNPACK + "\n        lse = lse[..., 0]")),
    ("grads-swapped", ("return dq, dk, dv, None, None", "return dq, dv, dk, None, None")),
    ("scale-not-passed", ("lse, ctx.causal, ctx.softmax_scale", "lse, ctx.causal, None")),
    ("causal-not-passed", ("lse, ctx.causal, ctx.softmax_scale", "lse, False, ctx.softmax_scale")),
]  # fmt: skip


@pytest.mark.parametrize("case", FUNCTION, ids=[f"{f[0]}-{i}" for i, f in enumerate(FUNCTION)])
def test_function_mistakes_are_named(tmp_path, case):
    slug, *edits = case
    function = variant(tmp_path, *edits).FlashAttentionTriton
    assert slug_for(F.check_attention_function, function) == slug


def test_stub_raises_not_implemented(tmp_path):
    m = variant(
        tmp_path,
        ("o = load_tile(out_ptr", "raise NotImplementedError()\n    o = load_tile(out_ptr"),
    )
    with pytest.raises(NotImplementedError):
        C.check_bwd_preprocess(m.bwd_preprocess_kernel)


def test_not_a_triton_kernel_is_refused():
    with pytest.raises(CheckFailure, match="@triton.jit"):
        C.check_dq_kernel(lambda *a: None)


def test_bad_launcher_input_is_named(solution):
    from course_utils.harness.triton_learner_backward import learner_backward

    q = torch.zeros(1, 1, 8, 16, device="cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="lse must have shape"):
        learner_backward(
            solution.bwd_preprocess_kernel, solution.bwd_dkdv_kernel, solution.bwd_dq_kernel,
            q, q, q, q, q, torch.zeros(1, 1, 8, dtype=torch.float64),
        )  # fmt: skip


def test_quick_checks():
    run_quietly(Q.check_quick_matmuls, 7)
    run_quietly(Q.check_quick_causal_query_tiles, 13)
    run_quietly(Q.check_quick_saved_bytes, 4 * 4096 * 128 * 2 + 4096 * 4)
    with pytest.raises(CheckFailure, match="one-kernel"):
        Q.check_quick_matmuls(5)


# ---- the Function: its backward runs the learner's kernels, and nothing N_q x N_k ---------------
BODY = """        dq, dk, dv = learner_backward(
            bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel,
            dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
        )  # fmt: skip
        return dq, dk, dv, None, None"""
FORWARD = """        out, lse = ta.flash_attention_fwd(q, k, v, causal, softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)  # 4 N d + N numbers per head, no N x N
        ctx.causal, ctx.softmax_scale = causal, softmax_scale
        return out"""

# torch autograd of naive attention inside backward: right gradients, none of the kernels
NAIVE_AUTOGRAD = """        scale = ctx.softmax_scale or 1 / math.sqrt(q.shape[-1])
        with torch.enable_grad():
            x = [t.detach().requires_grad_() for t in (q, k, v)]
            s = scale * x[0] @ x[1].transpose(-1, -2)
            if ctx.causal:
                n = s.shape[-1]
                above = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
                s = s.masked_fill(above, float("-inf"))
            o = torch.softmax(s, dim=-1) @ x[2]
            dq, dk, dv = torch.autograd.grad(o, x, dout)
        return dq, dk, dv, None, None"""
# the softmax backward written out in torch, no autograd, no kernel
BY_HAND = """        scale = ctx.softmax_scale or q.shape[-1] ** -0.5
        p = torch.exp(scale * q @ k.transpose(-1, -2) - lse[..., None]).to(q.dtype)
        dv = p.transpose(-1, -2) @ dout
        dp = dout @ v.transpose(-1, -2)
        ds = p * (dp - (dout * out).sum(-1, keepdim=True))
        return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, dv, None, None"""
# the kernels for dQ and dK, but dV from P rebuilt in torch ("it is just one product")
DV_FROM_P = """        dq, dk, _ = learner_backward(
            bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel,
            dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
        )
        scale = ctx.softmax_scale or 1 / math.sqrt(q.shape[-1])
        p = torch.exp(scale * torch.einsum("bhid,bhjd->bhij", q, k) - lse.unsqueeze(-1))
        dv = torch.einsum("bhij,bhid->bhjd", p.to(dout.dtype), dout)
        return dq, dk, dv, None, None"""
COURSE_BACKWARD = """        dq, dk, dv = ta.flash_attention_bwd(
            dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale
        )
        return dq, dk, dv, None, None"""
NO_NONES = """        return learner_backward(
            bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel,
            dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
        )"""
DQ_DK_SWAPPED = BODY.replace("return dq, dk, dv, None, None", "return dk, dq, dv, None, None")
ONE_NONE = BODY.replace("return dq, dk, dv, None, None", "return dq, dk, dv, None")

FUNCTION_BACKWARDS = [
    ("backward-skips-kernels", NAIVE_AUTOGRAD),
    ("backward-skips-kernels", BY_HAND),
    ("rebuilds-p", DV_FROM_P),
    ("calls-reference", COURSE_BACKWARD),
    ("missing-nones", NO_NONES),
    ("missing-nones", ONE_NONE),
    ("grads-swapped", DQ_DK_SWAPPED),
]


@pytest.mark.parametrize(
    "slug, body",
    FUNCTION_BACKWARDS,
    ids=[f"{s}-{i}" for i, (s, _) in enumerate(FUNCTION_BACKWARDS)],
)
def test_function_backward_mistakes_are_named(tmp_path, slug, body):
    function = variant(tmp_path, (BODY, body)).FlashAttentionTriton
    with pytest.raises(CheckFailure) as info:
        run_quietly(F.check_attention_function, function)
    assert slug_of(info.value) == slug, str(info.value)
    text = str(info.value)
    if slug == "missing-nones":  # the learner's own return line, and what autograd said
        assert "your backward, line" in text and "return" in text and "PyTorch:" in text
    if slug == "backward-skips-kernels":
        assert "bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel" in text


def test_lse_saved_in_half_precision_is_lse_dtype(tmp_path):
    """lse cast to q's dtype: float32 in the first case (right), bfloat16 in the third, where
    learner_backward refuses it; the check names the saved dtype, not the launcher's error."""
    function = variant(
        tmp_path,
        (FORWARD, FORWARD.replace("out, lse)  #", "out, lse.to(q.dtype))  #")),
    ).FlashAttentionTriton
    with pytest.raises(CheckFailure) as info:
        run_quietly(F.check_attention_function, function)
    assert slug_of(info.value) == "lse-dtype", str(info.value)
    half = next(c.dtype for c, _ in F._function_cases() if c.dtype != "float32")
    assert f"lse is {half}" in str(info.value)


def test_lse_saved_in_float16_then_cast_back_is_lse_dtype(tmp_path):
    function = variant(
        tmp_path,
        (FORWARD, FORWARD.replace("out, lse)  #", "out, lse.half())  #")),
        (
            "q, k, v, out, lse = ctx.saved_tensors",
            "q, k, v, out, lse = ctx.saved_tensors\n        lse = lse.float()",
        ),
    ).FlashAttentionTriton
    assert slug_for(F.check_attention_function, function) == "lse-dtype"


# Right Functions in other styles: explicit attributes and indexing; a starred return with
# keywords and once_differentiable
ATTRIBUTES = (
    (
        FORWARD,
        """        out, lse = ta.flash_attention_fwd(q, k, v, causal, softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = causal
        ctx.scale = softmax_scale
        return out""",
    ),
    (
        "q, k, v, out, lse = ctx.saved_tensors",
        "saved = ctx.saved_tensors\n"
        "        q, k, v, out, lse = saved[0], saved[1], saved[2], saved[3], saved[4]",
    ),
    (
        BODY,
        """        grads = learner_backward(
            bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel,
            dout.contiguous(), q, k, v, out, lse, ctx.is_causal, ctx.scale,
        )
        return grads[0], grads[1], grads[2], None, None""",
    ),
)
STARRED = (
    (
        FORWARD,
        """        out, lse = ta.flash_attention_fwd(
            q, k, v, causal=causal, softmax_scale=softmax_scale
        )
        ctx.save_for_backward(*(q, k, v), out, lse)
        ctx.causal = causal
        ctx.softmax_scale = softmax_scale
        return out""",
    ),
    (
        "    @staticmethod\n    def backward(ctx, dout):",
        "    @staticmethod\n    @torch.autograd.function.once_differentiable\n"
        "    def backward(ctx, dout):",
    ),
    (
        BODY,
        """        q, k, v, out, lse = ctx.saved_tensors
        return (*learner_backward(bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel, dout,
                                  q, k, v, out, lse, causal=ctx.causal,
                                  softmax_scale=ctx.softmax_scale), None, None)""",
    ),
)


@pytest.mark.parametrize("edits", [ATTRIBUTES, STARRED], ids=["attributes", "starred"])
def test_other_right_functions_pass(tmp_path, edits):
    function = variant(tmp_path, *edits).FlashAttentionTriton
    out = run_quietly(F.check_attention_function, function)
    assert "✓ FlashAttentionTriton" in out


def test_function_pass_line_names_the_dtypes_it_ran(solution):
    out = run_quietly(F.check_attention_function, solution.FlashAttentionTriton)
    dtypes = " and ".join(dict.fromkeys(c.dtype for c, _ in F._function_cases()))
    assert dtypes in out and "launches your three kernels" in out
    said = set(re.findall(r"\b(float32|float16|bfloat16)\b", out.split("lse;")[1]))
    assert said == {c.dtype for c, _ in F._function_cases()}, out


# ---- what the kernels' messages say ------------------------------------------------------------
def test_preprocess_messages_describe_only_what_it_uses(tmp_path):
    kernel = variant(tmp_path, ("mask=offs_m < seqlen_q)", "mask=offs_m < seqlen_q - 1)"))
    with pytest.raises(CheckFailure) as info:
        run_quietly(C.check_bwd_preprocess, kernel.bwd_preprocess_kernel)
    text = str(info.value)
    assert "out and dO (" in text and "D (" in text
    assert f"BLOCK_M = {C.PREPROCESS_BLOCK_M}" in text
    for unused in ("k and v", "causal", "softmax_scale", "BLOCK_N"):
        assert unused not in text, text


def test_preprocess_block_is_the_launchers():
    from course_utils.harness import triton_learner_backward as lb

    assert C.PREPROCESS_BLOCK_M == lb.PREPROCESS_BLOCK_M


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's dtype error")
def test_dkdv_dot_dtype_hint_names_do(tmp_path):
    kernel = variant(tmp_path, ("tl.dot(p_t.to(do.dtype), do)", "tl.dot(p_t, do)"))
    with pytest.raises(CheckFailure) as info:
        run_quietly(C.check_dkdv_kernel, kernel.bwd_dkdv_kernel)
    text = str(info.value)
    assert "hint:" in text and "p_t.to(do.dtype), do" in text and "v.dtype" not in text, text


def test_random_cases_stay_small_in_the_interpreter(monkeypatch):
    """The hidden run's random cases (seed=None) keep the check cell under its time budget: at
    most 3 x 4 tile pairs of 16 and two heads each, in the interpreter."""
    monkeypatch.setattr(C, "_on_gpu", lambda: False)
    for seed in range(300):
        for c in C._kernel_cases(seed, 3, fixed=False):
            if c.stage == "random":
                pairs = -(-c.n_q // 16) * -(-c.n_k // 16) * c.batch * c.heads
                assert pairs <= 24, c
