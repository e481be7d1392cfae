"""Checks for notebook 06, from NumPy tiles to a Triton kernel.

    check_tile_offsets(fn)                  tile_offsets(b, h, pid_m, strides, N, d, BLOCK_M,
                                            BLOCK_D) -> (offsets, mask), in NumPy; the last
                                            dimension is contiguous (strides[3] == 1)
    check_attention_kernel(step, finalize)  the learner's @triton.jit online_softmax_step and
                                            finalize_rows, run in course_utils.triton_attention.
                                            learner's kernel against float64 attention
    check_quick_num_programs(answer)        programs in the grid: batch 2, 4 heads, N = 1000,
                                            BLOCK_M = 64
    check_quick_qk_scale(answer)            softmax_scale * log2(e) for d = 64
    check_quick_causal_kv_tiles(answer)     K/V tiles that causal program 5 loads (N = 1000,
                                            BLOCK_M = 64, BLOCK_N = 32)

The kernel check launches the learner's functions on fresh random q, k, v, writing into outputs
filled with NaN (an element never written shows up): float32 (and one float16 case) in Triton's
interpreter on a CPU, float16 and bfloat16 on a GPU. It compares out and lse with float64
attention by relative error, ||yours - expected|| / ||expected||, smallest case first. To name a
mistake it compares the learner's output with float64 emulations of the kernel with one bug
each (KERNEL_OUT_MISTAKES, KERNEL_LSE_MISTAKES), to a tolerance that suits the dtype: a learner
who makes a known mistake in float16 on a GPU is told which one. (run_cases in _core matches
mistakes to 1e-6, right for float64 NumPy exercises, too tight for a kernel.) A mistake is named
only when its emulation matches; otherwise the message says that no known mistake matches, what
the failing launch exercises, and, as a note, whether the result has NaN or is merely close.

Nothing the launches write reaches stderr (Python warnings, sys.stderr, file descriptor 2): in a
graded cell any stderr costs the cell's points, and Triton 3.9 warns once, at its first compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.feedback import closest_mistake, mismatch_lines
from course_utils.checks.engine.interpreter_limits import interpreter_limit
from course_utils.checks.engine.quizzes import hinted_answer as _hinted
from course_utils.checks.engine.watch import _LearnerRaised, call_learner

__all__ = [
    "KERNEL_LSE_MISTAKES",
    "KERNEL_OUT_MISTAKES",
    "TILE_OFFSETS_MISTAKES",
    "check_attention_kernel",
    "check_quick_causal_kv_tiles",
    "check_quick_num_programs",
    "check_quick_qk_scale",
    "check_tile_offsets",
    "emulate_kernel",
]

LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453  # ln(2) = 1 / log2(e)


# ---- exercise 1: tile_offsets ------------------------------------------------------------------
def _tile_offsets_variant(
    b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D, *, bug: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The offsets and mask of one (BLOCK_M, BLOCK_D) tile, with one bug or none."""
    stride_b, stride_h, stride_n, stride_d = (int(s) for s in strides)
    first = pid_m if bug == "pid-not-multiplied" else pid_m * BLOCK_M
    rows = first + np.arange(BLOCK_M)
    cols = np.arange(BLOCK_D)
    base = 0 if bug == "head-offset-missing" else b * stride_b + h * stride_h
    row_stride = d if bug == "row-stride-d" else stride_n
    offsets = base + rows[:, None] * row_stride + cols[None, :] * stride_d
    row_ok = rows[:, None] <= N if bug == "mask-off-by-one" else rows[:, None] < N
    if bug == "rows-unmasked":
        row_ok = np.ones_like(row_ok)
    col_ok = np.ones_like(cols[None, :], dtype=bool) if bug == "cols-unmasked" else cols < d
    return offsets, row_ok & col_ok


def _tile_offsets_reference(b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D):
    return _tile_offsets_variant(b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D)


def _offsets_mistake(slug, title, explanation, bug=None):
    return Mistake(
        slug, title, explanation, functools.partial(_tile_offsets_variant, bug=bug or slug)
    )


TILE_OFFSETS_MISTAKES = [
    _offsets_mistake(
        "pid-not-multiplied",
        "the first row of the tile is pid_m, not pid_m * BLOCK_M",
        "Program pid_m owns the query tile that starts at row pid_m * BLOCK_M: "
        "rows = pid_m * BLOCK_M + np.arange(BLOCK_M). With pid_m alone the tiles overlap.",
    ),
    _offsets_mistake(
        "head-offset-missing",
        "the batch and head offset b * stride_b + h * stride_h is left out",
        "Every (batch, head) has its own (N, d) matrix; it starts b * strides[0] + h * strides[1] "
        "elements into the tensor. Without it every program reads head 0 of batch 0.",
    ),
    _offsets_mistake(
        "row-stride-d",
        "rows are taken to be d elements apart (strides[2] ignored)",
        "Rows are strides[2] elements apart, which is d only for a contiguous (B, H, N, d) tensor. "
        "A (B, N, H, d) tensor viewed as (B, H, N, d) has rows H * d apart: use the strides.",
    ),
    _offsets_mistake(
        "ragged-tile",
        "rows past the last one are not masked (the ragged last tile reads out of bounds)",
        "When BLOCK_M does not divide N the last tile runs past row N - 1; those rows must be "
        "masked: rows[:, None] < N. tl.load would read whatever lies after the tensor.",
        bug="rows-unmasked",
    ),
    _offsets_mistake(
        "mask-off-by-one",
        "the row mask keeps row N (rows <= N instead of rows < N)",
        "Rows are numbered 0 .. N - 1, so row r exists when r < N.",
    ),
    _offsets_mistake(
        "columns-unmasked",
        "the columns past d are not masked (BLOCK_D > d)",
        "tl.arange needs a power of two, so BLOCK_D is d rounded up (80 -> 128); the columns "
        "c >= d do not exist: mask with cols[None, :] < d as well as the rows.",
        bug="cols-unmasked",
    ),
]


def _strides(shape) -> tuple[int, ...]:
    """Element strides of a contiguous array of this shape."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _bnhd_strides(B, N, H, d) -> tuple[int, int, int, int]:
    """Strides of a contiguous (B, N, H, d) tensor seen as (B, H, N, d) (x.transpose(1, 2))."""
    sb, sn, sh, sd = _strides((B, N, H, d))
    return sb, sh, sn, sd


def _tile_offsets_cases(seed, trials):
    def case(label, b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D):
        assert strides[3] == 1, "the specification: the last dimension is contiguous"
        masked = [f"rows >= N = {N} (the ragged last tile)"] if (pid_m + 1) * BLOCK_M > N else []
        masked += [f"columns >= d = {d}"] if BLOCK_D > d else []
        focus = (
            "offsets[r, c] = b s0 + h s1 + (pid_m BLOCK_M + r) s2 + c for every r and c, and "
            + (f"the mask False for {' and '.join(masked)}" if masked else "the mask all True")
        )
        return Case(label, (b, h, pid_m, tuple(strides), N, d, BLOCK_M, BLOCK_D), focus=focus)

    cases = [
        case("one tile of a (1, 1, 4, 4) tensor: b = h = pid_m = 0, BLOCK_M = BLOCK_D = 4",
             0, 0, 0, _strides((1, 1, 4, 4)), 4, 4, 4, 4),
        case("the second tile (pid_m = 1) of a (1, 1, 8, 4) tensor, BLOCK_M = 4",
             0, 0, 1, _strides((1, 1, 8, 4)), 8, 4, 4, 4),
        case("head h = 2 of batch b = 1 in a (2, 3, 8, 4) tensor, pid_m = 1",
             1, 2, 1, _strides((2, 3, 8, 4)), 8, 4, 4, 4),
        case("the ragged last tile: N = 6, BLOCK_M = 4, pid_m = 1 (rows 4..7, two exist)",
             0, 0, 1, _strides((1, 1, 6, 4)), 6, 4, 4, 4),
        case("d = 3 padded to BLOCK_D = 4 (one column masked)",
             0, 0, 0, _strides((1, 1, 4, 3)), 4, 3, 4, 4),
        case("a (B, N, H, d) = (2, 6, 3, 4) tensor seen as (B, H, N, d): rows H * d apart",
             1, 1, 1, _bnhd_strides(2, 6, 3, 4), 6, 4, 4, 4),
        case("N = 1000, d = 64, BLOCK_M = 64: the last program (pid_m = 15), b = 1, h = 3",
             1, 3, 15, _strides((2, 4, 1000, 64)), 1000, 64, 64, 64),
        case("d = 80 padded to BLOCK_D = 128, N = 100, (B, N, H, d) layout",
             0, 1, 1, _bnhd_strides(1, 100, 2, 80), 100, 80, 64, 128),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        B, H = (int(x) for x in rng.integers(1, 4, size=2))
        N, d = int(rng.integers(1, 200)), int(rng.integers(1, 70))
        BLOCK_M = int(2 ** rng.integers(2, 7))
        BLOCK_D = max(4, 1 << (d - 1).bit_length())
        pid_m = int(rng.integers(0, -(-N // BLOCK_M)))
        b, h = int(rng.integers(B)), int(rng.integers(H))
        strides = _bnhd_strides(B, N, H, d) if rng.random() < 0.5 else _strides((B, H, N, d))
        label = (
            f"random case {t + 1}: (B, H, N, d) = ({B}, {H}, {N}, {d}), strides {strides}, "
            f"b = {b}, h = {h}, pid_m = {pid_m}, BLOCK_M = {BLOCK_M}, BLOCK_D = {BLOCK_D}"
        )
        cases.append(case(label, b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D))
    return cases


def check_tile_offsets(fn: Callable, seed: int | None = 0, trials: int = 10) -> None:
    """Check tile_offsets(b, h, pid_m, strides, N, d, BLOCK_M, BLOCK_D) -> (offsets, mask).

    offsets[r, c] = b*strides[0] + h*strides[1] + (pid_m*BLOCK_M + r)*strides[2] + c*strides[3],
    mask[r, c] = (pid_m*BLOCK_M + r < N) and (c < d); both of shape (BLOCK_M, BLOCK_D).

    The last dimension is contiguous, strides[3] == 1, in every case: the kernels of notebook 06
    load a row's columns at offs_d[None, :] with no stride (learner_attention copies a tensor
    whose last stride is not 1), and the notebook's specification says so. c * strides[3] and c
    give the same offsets; the other three strides take any value (a (B, N, H, d) view, too).

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    run_cases(
        "tile_offsets",
        fn,
        _tile_offsets_reference,
        _tile_offsets_cases(seed, trials),
        outputs=("offsets", "mask"),
        mistakes=TILE_OFFSETS_MISTAKES,
        rtol=0.0,
        atol=0.0,
        low_precision_below=None,
        summary="several heads and batches, ragged last tile, d < BLOCK_D, a (B, N, H, d) view",
    )


# ---- exercise 2: the kernel's step and finalize -------------------------------------------------
def emulate_kernel(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool,
    softmax_scale: float,
    block_m: int,
    block_n: int,
    *,
    exp: str = "2",
    scaled: bool = True,
    rescale: str = "both",
    combine: str = "online",
    divide: bool = True,
    ragged_mask: bool = True,
    causal_mask: str = "c<=r",
    lse_form: str = "e",
    old_max: str = "none",
    extra_scale: float = 1.0,
    causal_hi: str = "diagonal",
    pad_value: float = 0.0,
    empty: str = "nan",
    state: str = "float32",
) -> tuple[np.ndarray, np.ndarray]:
    """The learner's kernel in float64 NumPy, tile by tile as the skeleton runs it, with bugs.

    Without keyword arguments it is the right kernel. Each keyword switches one bug on:
    exp "e" (tl.exp for p and alpha) or "e-p" (tl.exp for p only); scaled=False (scores not
    multiplied by qk_scale); rescale "l-only" or "acc-only"; combine "normalize-add" or
    "normalize-average" (each tile's softmax @ v, then summed or averaged); divide=False (out =
    acc); ragged_mask=False (keys past seqlen_k, zero rows, keep score 0); causal_mask "c<r",
    "c<=r+1" or "none"; lse_form "2" (m + log2 l), "mixed" (m ln2 + log2 l), "m+ln" (m + ln l),
    "no-max" (ln l); old_max "p" (p = 2^(s - m_i), the old max) or "alpha" (alpha the wrong way
    round, 2^(m_new - m_i)): both are inf at the first tile, where m_i is -inf.
    For a kernel the learner writes whole (notebook 06's last exercise), also: extra_scale (the
    scores multiplied once more, by log2(e) or by softmax_scale: the scale folded twice);
    ragged_mask "off-by-one" (key seqlen_k, loaded as zeros, stays visible); causal_hi
    "block-short" (the loop stops at the query tile's first row: the diagonal block skipped) or
    "tile-short" (one BLOCK_N tile before the diagonal block's end); pad_value (what the kernel
    loads past the last key when ragged_mask is False: 0 for masked loads with other=0);
    empty "zero" (a row that saw no key gets out = 0 and lse = -inf, as a guarded kernel gives;
    "nan" is 0 / 0); state "float16" (the running max, sum and accumulator kept in the inputs'
    half precision: each rounded to float16 after every tile).

    Args:
        q: (B, H, Nq, d) float64.  k, v: (B, H, Nk, d).  causal, softmax_scale: the launch's.
        block_m, block_n: the tiles (BLOCK_M, BLOCK_N).

    Returns:
        out: (B, H, Nq, d).  lse: (B, H, Nq). NaN where the bug divides 0 by 0.
    """
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    qk_scale = (softmax_scale * LOG2E if scaled else 1.0) * extra_scale
    padded = -(-Nk // block_n) * block_n + block_n
    kp = np.full((B, H, padded, d), float(pad_value))
    vp = np.full((B, H, padded, d), float(pad_value))
    if ragged_mask == "off-by-one":  # the extra key is loaded with the right mask: zeros
        kp[:, :, Nk:], vp[:, :, Nk:] = 0.0, 0.0
    kp[:, :, :Nk], vp[:, :, :Nk] = k, v  # the skeleton loads zeros past the last key
    out = np.empty((B, H, Nq, d))
    lse = np.empty((B, H, Nq))
    with np.errstate(all="ignore"):
        for i0 in range(0, Nq, block_m):
            rows = np.arange(i0, min(i0 + block_m, Nq))
            q_i = q[:, :, rows]
            m = np.full((B, H, len(rows)), -np.inf)
            l = np.zeros((B, H, len(rows)))
            acc = np.zeros((B, H, len(rows), d))
            tiles = 0
            hi = min(i0 + block_m, Nk) if causal else Nk
            if causal and causal_hi == "block-short":
                hi = min(i0, Nk)
            elif causal and causal_hi == "tile-short":
                hi = min(i0 + block_m - block_n, Nk)
            for j0 in range(0, hi, block_n):
                cols = np.arange(j0, j0 + block_n)
                s = (q_i @ kp[:, :, cols].swapaxes(-1, -2)) * qk_scale
                visible = np.ones((len(rows), block_n), dtype=bool)
                if ragged_mask == "off-by-one":
                    visible &= cols[None, :] <= Nk
                elif ragged_mask:
                    visible &= cols[None, :] < Nk
                if causal:
                    visible &= {
                        "c<=r": cols[None, :] <= rows[:, None],
                        "c<r": cols[None, :] < rows[:, None],
                        "c<=r+1": cols[None, :] <= rows[:, None] + 1,
                        "none": np.ones_like(visible),
                    }[causal_mask]
                s = np.where(visible, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=-1))
                base_p = math.e if exp in ("e", "e-p") else 2.0
                base_alpha = math.e if exp == "e" else 2.0
                p = np.power(base_p, s - (m if old_max == "p" else m_new)[..., None])
                alpha = np.power(base_alpha, (m_new - m) if old_max == "alpha" else (m - m_new))
                v_j = vp[:, :, cols]
                if combine == "online":
                    l = (alpha * l if rescale != "acc-only" else l) + p.sum(axis=-1)
                    acc = (alpha[..., None] * acc if rescale != "l-only" else acc) + p @ v_j
                else:  # each tile's own softmax, then added up
                    l = alpha * l + p.sum(axis=-1)
                    acc = acc + (p / p.sum(axis=-1, keepdims=True)) @ v_j
                m = m_new
                if state == "float16":
                    m, l, acc = (x.astype(np.float16).astype(np.float64) for x in (m, l, acc))
                tiles += 1
            if combine == "online":
                o = acc / l[..., None] if divide else acc
            else:
                o = acc / tiles if combine == "normalize-average" else acc
            if empty == "zero":  # rows that saw no key: out 0, and lse -inf below
                o = np.where((l == 0)[..., None], 0.0, o)
            out[:, :, rows] = o
            lse[:, :, rows] = {
                "e": (m + np.log2(l)) * LN2,
                "2": m + np.log2(l),
                "mixed": m * LN2 + np.log2(l),
                "m+ln": m + np.log(l),
                "no-max": np.log(l),
            }[lse_form]
    return out, lse


def _reference_attention(q, k, v, causal, softmax_scale):
    """out and lse of attention in float64 NumPy, all heads at once (the scores materialized)."""
    s = softmax_scale * (q @ k.swapaxes(-1, -2))  # (B, H, Nq, Nk)
    if causal:
        s = np.where(np.tri(q.shape[2], k.shape[2], dtype=bool), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[..., 0]


HALF_STATE_TITLE = "the running max, sum or accumulator is kept in float16 (the inputs' dtype)"
HALF_STATE_EXPLANATION = (
    "m_i, l_i and acc must be float32 whatever the inputs' dtype: tl.full(..., dtype=tl.float32) "
    "and tl.zeros(..., dtype=tl.float32). In float16 each tile's update rounds them to 11 bits, "
    "and over a long row of keys those roundings add up; only the tiles loaded (q, k, v, and p "
    "for tl.dot) are in the inputs' dtype, and out is cast once, at the store."
)


def _kernel_mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, functools.partial(emulate_kernel, **bug))


_EXP2 = (
    "The kernel gets qk_scale = softmax_scale * log2(e) and works in base 2: "
    "exp(softmax_scale * s) = exp2(qk_scale * s). With tl.exp the scores are log2(e) = 1.44 "
    "times too sharp. Use tl.math.exp2 for p and for alpha = exp2(m_i - m_new)."
)
_CAUSAL = (
    "Query offs_m[i] sees key offs_n[j] exactly when offs_n[j] <= offs_m[i]: "
    "visible = (offs_n[None, :] < seqlen_k) & (offs_n[None, :] <= offs_m[:, None]) when CAUSAL. "
)
_LSE = (
    "lse must be in natural log: the backward pass recomputes p = exp(s - lse) and partial "
    "results merge with exp(lse_A - lse). m_i and log2(l_i) are in base 2, so "
    "lse = (m_i + log2(l_i)) * ln(2) = (m_i + log2(l_i)) / log2(e)."
)

_OLD_MAX = (
    "Before the first tile m_i is -inf, so exp2(s - m_i) and exp2(m_new - m_i) are +inf, and "
    "inf * 0 or inf / inf is NaN in every row. Both exponents are taken against the new max: "
    "p = exp2(s - m_new[:, None]) and alpha = exp2(m_i - m_new), which is at most 1 (0 at the "
    "first tile)."
)

KERNEL_OUT_MISTAKES = [
    _kernel_mistake("exp-vs-exp2", "tl.exp instead of tl.math.exp2 with the base-2 scale", _EXP2,
                    exp="e"),
    _kernel_mistake("exp-vs-exp2", "tl.exp for p (tl.math.exp2 for alpha)", _EXP2, exp="e-p"),
    _kernel_mistake(
        "missing-scale",
        "the scores are not multiplied by qk_scale",
        "s = tl.dot(q, tl.trans(k)) * qk_scale: qk_scale = softmax_scale * log2(e) holds both "
        "the 1/sqrt(d) of attention and the change to base 2. Without it the softmax is "
        "sqrt(d) * ln(2) times too sharp.",
        scaled=False,
    ),
    _kernel_mistake(
        "rescale-l-not-acc",
        "l_i is rescaled when the max grows, but acc is not",
        "acc and l_i are both sums relative to the running max; when it grows both are "
        "multiplied by alpha = exp2(m_i - m_new): acc = acc * alpha[:, None] + tl.dot(p, v).",
        rescale="l-only",
    ),
    _kernel_mistake(
        "rescale-acc-not-l",
        "acc is rescaled when the max grows, but l_i is not",
        "l_i is a sum relative to the running max as acc is: l_i = l_i * alpha + tl.sum(p, 1).",
        rescale="acc-only",
    ),
    _kernel_mistake(
        "normalize-then-add",
        "each tile's softmax is normalized on its own, then the tiles are added",
        "A tile's normalized output is only part of the answer; its weight is its share of the "
        "row's softmax mass, known only after the last tile. Keep acc unnormalized, rescale it "
        "by alpha, and divide by l_i once, in finalize_rows.",
        combine="normalize-add",
    ),
    _kernel_mistake(
        "normalize-then-average",
        "each tile's softmax is normalized on its own, then the tiles are averaged",
        "A plain average gives every tile the same weight; a tile's weight is its share of the "
        "softmax mass. Keep acc unnormalized and divide by l_i once, in finalize_rows.",
        combine="normalize-average",
    ),
    _kernel_mistake(
        "no-final-divide",
        "acc is not divided by l_i in finalize_rows",
        "acc = sum_j exp2(s_j - m_i) v_j is a weighted sum; out = acc / l_i[:, None], once, "
        "after the last tile.",
        divide=False,
    ),
    _kernel_mistake(
        "ragged-tile",
        "the keys past seqlen_k are not masked",
        "The last K/V tile runs past the last key when BLOCK_N does not divide seqlen_k; the "
        "skeleton loads zeros there, whose scores are 0, not -inf, and so get weight "
        "exp2(0 - m_i). Mask them: s = tl.where(offs_n[None, :] < seqlen_k, s, float('-inf')).",
        ragged_mask=False,
    ),
    _kernel_mistake(
        "causal-off-by-one",
        "the causal mask hides the diagonal (offs_n < offs_m)",
        _CAUSAL + "A query sees its own key; without it query 0 sees no key at all (NaN).",
        causal_mask="c<r",
    ),
    _kernel_mistake(
        "causal-off-by-one",
        "the causal mask lets each query see the next key (offs_n <= offs_m + 1)",
        _CAUSAL,
        causal_mask="c<=r+1",
    ),
    _kernel_mistake(
        "causal-mask-missing",
        "CAUSAL is ignored in the step",
        _CAUSAL + "The skeleton skips only the K/V tiles entirely after the diagonal; the tile "
        "that crosses it must be masked in online_softmax_step.",
        causal_mask="none",
    ),
    _kernel_mistake("exp2-old-max", "p computed against the old max: exp2(s - m_i)", _OLD_MAX,
                    old_max="p"),
    _kernel_mistake("exp2-old-max", "alpha the wrong way round: exp2(m_new - m_i)", _OLD_MAX,
                    old_max="alpha"),
]  # fmt: skip

KERNEL_LSE_MISTAKES = [
    _kernel_mistake("base2-lse", "lse left in base 2 (m_i + log2(l_i))", _LSE, lse_form="2"),
    _kernel_mistake("base2-lse", "lse mixes bases (m_i * ln 2 + log2(l_i))", _LSE,
                    lse_form="mixed"),
    _kernel_mistake("base2-lse", "lse mixes bases (m_i + ln(l_i), m_i in base 2)", _LSE,
                    lse_form="m+ln"),
    _kernel_mistake(
        "lse-without-max",
        "lse is log(l_i) without the running max",
        "l_i is a sum relative to the running max m_i; the logsumexp of the row is "
        "(m_i + log2(l_i)) * ln(2).",
        lse_form="no-max",
    ),
]  # fmt: skip


@dataclass(frozen=True)
class KernelCase:
    """One launch of the kernel: shapes, tiles, dtype and the inputs' seed."""

    label: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    causal: bool
    block_m: int
    block_n: int
    dtype: str = "float32"
    seed: int = 0
    late_max: bool = False  # the keys of the last K/V tile get larger scores

    def describe(self) -> str:
        return (
            f"q ({self.batch}, {self.heads}, {self.n_q}, {self.d}), k and v "
            f"({self.batch}, {self.heads}, {self.n_k}, {self.d}), {self.dtype}, "
            f"causal={self.causal}, BLOCK_M = {self.block_m}, BLOCK_N = {self.block_n}"
        )

    def focus(self) -> str:
        """The parts of exercise 2's specification this launch exercises (said on a failure
        that matches no known mistake)."""
        parts = []
        if self.late_max:
            parts.append("the rescale of acc and l_i by alpha when a later K/V tile raises the max")
        if self.n_k % self.block_n:
            parts.append(
                f"the mask of the keys past seqlen_k = {self.n_k} in the ragged last K/V tile"
            )
        if self.causal:
            parts.append(
                "the causal mask offs_n <= offs_m in the K/V tile that crosses the diagonal"
            )
        if self.d & (self.d - 1):
            block_d = max(16, 1 << (self.d - 1).bit_length())
            parts.append(f"d = {self.d} padded to BLOCK_D = {block_d} (zero columns)")
        if self.dtype != "float32":
            parts.append(
                f"{self.dtype} inputs: tl.dot(p.to(v.dtype), v), the state kept in float32"
            )
        if not parts and self.n_k > self.block_n:
            parts.append("the online softmax over several K/V tiles (the rescale by alpha)")
        if not parts:
            parts.append(
                "section 4's update on one K/V tile, and finalize_rows (out = acc / l_i, the lse "
                "in natural log)"
            )
        return "; ".join(parts)


def _ampere_or_newer() -> bool:
    """bfloat16 tl.dot and 128 x 64 tiles need an sm_80+ GPU (a Colab T4 is sm_75)."""
    import torch

    return torch.cuda.get_device_capability()[0] >= 8


def _for_older_gpu(case: KernelCase) -> KernelCase:
    """The same case in float16 with 64 x 32 tiles, which fit an older GPU's shared memory."""
    return dataclasses.replace(case, dtype="float16", block_m=64, block_n=32)


def _kernel_cases(seed, trials, on_gpu: bool) -> list[KernelCase]:
    if on_gpu:  # the compiled kernel: half precision, real tile sizes
        cases = [
            KernelCase("one tile", 1, 1, 64, 64, 64, False, 64, 64, "float16", 1),
            KernelCase("the last key tile raises the max", 1, 2, 64, 128, 64, False, 64, 64,
                       "float16", 2, late_max=True),
            KernelCase("ragged keys: N_k = 200", 2, 2, 130, 200, 64, False, 64, 64, "float16", 3),
            KernelCase("causal, ragged N = 333", 2, 3, 333, 333, 64, True, 128, 64, "float16", 4),
            KernelCase("d = 80 padded to 128, N_q != N_k", 1, 2, 257, 1023, 80, False, 128, 64,
                       "bfloat16", 5),
            KernelCase("d = 128, causal, N = 513", 2, 2, 513, 513, 128, True, 128, 64,
                       "bfloat16", 6),
        ]  # fmt: skip
    else:  # the interpreter: float32, small
        cases = [
            KernelCase("one tile", 1, 1, 16, 16, 16, False, 16, 16, "float32", 1),
            KernelCase("two K/V tiles, the second raises the max", 1, 1, 16, 32, 16, False, 16,
                       16, "float32", 2, late_max=True),
            KernelCase("ragged keys: N_k = 40, three K/V tiles of 16", 1, 2, 24, 40, 16, False,
                       16, 16, "float32", 3),
            KernelCase("causal, N = 40, BLOCK_M = 32, BLOCK_N = 16", 1, 2, 40, 40, 16, True, 32,
                       16, "float32", 4),
            KernelCase("causal, ragged N = 50, d = 32", 2, 1, 50, 50, 32, True, 16, 16,
                       "float32", 5),
            KernelCase("d = 24 padded to BLOCK_D = 32, N_q = 33, N_k = 70", 1, 2, 33, 70, 24,
                       False, 32, 16, "float32", 6),
            KernelCase("float16 inputs, causal, N = 40", 1, 2, 40, 40, 32, True, 32, 16,
                       "float16", 7),
        ]  # fmt: skip
    if on_gpu and not _ampere_or_newer():
        cases = [_for_older_gpu(c) for c in cases]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        causal = bool(rng.integers(2))
        if on_gpu:
            n_q = int(rng.integers(1, 700))
            d = int(rng.choice([64, 96, 128]))
            block_m, block_n = 128, 64
            dtype = str(rng.choice(["float16", "bfloat16"]))
            if not _ampere_or_newer():
                block_m, block_n, dtype = 64, 32, "float16"
        else:
            n_q = int(rng.integers(1, 65))
            d = int(rng.choice([16, 24, 32]))
            block_m, block_n = (int(x) for x in rng.choice([16, 32], size=2))
            dtype = "float32"
        n_k = n_q if causal or rng.random() < 0.5 else int(rng.integers(1, 2 * n_q + 16))
        batch, heads = (int(x) for x in rng.integers(1, 3, size=2))
        cases.append(
            KernelCase(
                f"random case {t + 1}",
                batch,
                heads,
                n_q,
                n_k,
                d,
                causal,
                block_m,
                block_n,
                dtype,
                int(rng.integers(2**31)),
            )  # fmt: skip
        )
    return cases


def _inputs(case: KernelCase, torch, device):
    """q, k, v on the device in the case's dtype, and their float64 NumPy copies."""
    gen = torch.Generator().manual_seed(case.seed)
    shape_q = (case.batch, case.heads, case.n_q, case.d)
    shape_k = (case.batch, case.heads, case.n_k, case.d)
    q = 2.0 * torch.randn(shape_q, generator=gen)  # spread scores: the max moves between tiles
    k = torch.randn(shape_k, generator=gen)
    v = torch.randn(shape_k, generator=gen)
    if case.late_max:
        k[:, :, -case.block_n :] *= 2.5
    dtype = getattr(torch, case.dtype)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    as64 = tuple(t.double().numpy() for t in (q, k, v))
    return tuple(t.to(device) for t in (q, k, v)), as64


def _rel_err(yours: np.ndarray, expected: np.ndarray) -> float:
    """||yours - expected|| / ||expected||; inf if yours has a NaN or an infinity."""
    if yours.shape != expected.shape or not np.isfinite(yours).all():
        return math.inf
    return float(np.linalg.norm(yours - expected) / max(np.linalg.norm(expected), 1e-300))


def _diagnose(which, yours, args, expected, mistakes, tol, match_tol):
    replays = (
        (mistake, (theirs,))
        for mistake in mistakes
        for theirs in [mistake.fn(*args)[which]]
        if _rel_err(theirs, expected) >= tol  # right on this case: not what went wrong
    )
    return closest_mistake((yours,), replays, match_tol)


def _kernel_failure(name, case, what, yours, expected, err, tol, mistake) -> str:
    """The failure message: the case, then _core.mismatch_lines (the worst row, the mistake only
    when a replay of it matches)."""
    lines = [f"✗ {name} is wrong on {case.label}.", f"  input:    {case.describe()}"]
    return "\n".join(lines + mismatch_lines(what, yours, expected, err, tol, mistake, case.focus()))


_OUT_OF_BOUNDS = ("store-out-of-bounds:", "load-out-of-bounds:")


def _raised_failure(name, case, exc, dot_hint: str | None = None) -> CheckFailure:
    """The learner's kernel did not compile or run: the innermost error, where it happened.

    dot_hint: the cast that fixes tl.dot's operands of two dtypes in this kernel (default the
    forward's, `tl.dot(p.to(v.dtype), v)`).

    A load or store outside the launch's tensors (course_utils.harness.triton_bounds'
    OutOfBoundsError, or its message when it comes from a notebook's kernel while a submission
    is graded) is the failure itself: its message names the tensor, the program, the elements
    and the mask, and its `[misconception: ...]` tag the mistake (store-unmasked,
    mask-one-dimension, mask-missing) when the mask makes it clear. Valid Triton that the
    interpreter refuses (interpreter_limits) is said to be the interpreter's limit, in one line
    with the way to write it that runs in both.
    """
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:  # outer call site first, root cause last
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__
    stray = [e for e in chain if str(e).startswith(_OUT_OF_BOUNDS)]
    if stray:
        text = "\n    ".join(str(stray[-1]).splitlines())
        return CheckFailure(
            f"✗ {name}: your kernel reached outside a tensor on {case.label}; the interpreter "
            f"stopped it before the access.\n  input: {case.describe()}\n    {text}"
        )
    where = [e for e in chain if type(e).__name__ == "CompilationError"]
    root = chain[-1]
    text = f"{type(root).__name__}: {root}".strip()
    if type(root).__name__ == "InterpreterError" or not str(root).strip():
        text = f"{type(root).__name__}: {root!r}"
    if where and where[-1] is not root:  # the compiler's excerpt of the line that failed
        lines = str(where[-1]).strip().splitlines()
        text = "\n".join(lines[-8:]) + "\n" + text
    lines = text.splitlines()
    short = "\n    ".join(lines[-14:])
    everything = " ".join(str(e) for e in chain)
    hint = ""
    limit = interpreter_limit(everything)
    if limit is not None:  # valid Triton: the interpreter's limit, said first, in one line
        return CheckFailure(
            f"✗ {name}: {limit}\n  on {case.label}; input: {case.describe()}\n    {short}"
        )
    if "same dtype" in everything:
        hint = "\n  hint: tl.dot needs two operands of one dtype; " + (
            dot_hint or "p is float32 and v is the input's dtype: tl.dot(p.to(v.dtype), v)."
        )
    return CheckFailure(
        f"✗ {name}: your kernel raised an error on {case.label}.\n  input: {case.describe()}\n"
        f"    {short}{hint}"
    )


@contextlib.contextmanager
def _nothing_on_stderr():
    """While the block runs, nothing reaches stderr: in a graded cell any stderr costs the cell.

    Silenced: Python warnings (Triton 3.9 warns once, at its first compile, that
    TRITON_DEFAULT_FP_FUSION is unset), NumPy's floating-point warnings (a wrong kernel's NaN),
    sys.stderr, and file descriptor 2, where the compiler's C++ code writes and which a Jupyter
    kernel forwards to the notebook as a stderr stream.
    """
    saved, sink = None, None
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        sink = tempfile.TemporaryFile()
        os.dup2(sink.fileno(), 2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 here: Python-level only
        if saved is not None:
            os.close(saved)
        saved = None
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stderr(io.StringIO()),
            np.errstate(all="ignore"),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
        if sink is not None:
            sink.close()


def _runner(step, finalize, run):
    """run(step, finalize, ...) with the learner's two functions bound, wherever they live."""
    if hasattr(step, "bound_into"):  # the grader's handles on the notebook kernel's functions
        return step.bound_into(f"{run.__module__}:{run.__name__}", finalize)

    def launch(q, k, v, causal, softmax_scale, block_m, block_n):
        return run(step, finalize, q, k, v, causal, softmax_scale, block_m, block_n)

    return launch


def check_attention_kernel(
    step: Callable, finalize: Callable, seed: int | None = 0, trials: int = 2
) -> None:
    """Check the learner's online_softmax_step and finalize_rows in the skeleton's kernel.

    Runs course_utils.harness.triton_learner.learner_attention(step, finalize, ...) into NaN-
    filled outputs and compares out and lse with float64 attention: relative error below 1e-5 in
    float32 and 2e-3 in float16 in the interpreter, below 1e-2 in float16 and bfloat16 on a GPU.

    Args:
        step, finalize: the learner's @triton.jit functions.
        seed: the random cases' seed (None: fresh ones).  trials: random cases after the fixed.

    Raises:
        NotImplementedError: step or finalize is still the exercise's stub.
        CheckFailure: a wrong result, with the smallest case, the worst row and the mistake.
    """
    name = "online_softmax_step + finalize_rows"
    with _nothing_on_stderr():  # the imports too: triton may warn when first imported
        launches, on_gpu = _check_attention_kernel(name, step, finalize, seed, trials)
    where = (
        "float16 and bfloat16 on the GPU" if on_gpu else "float32 and float16 in the interpreter"
    )
    print(
        f"✓ {name}: {launches} launches match float64 attention ({where}; ragged N, causal, "
        "N_q != N_k, d padded, several heads)"
    )


def _check_attention_kernel(name, step, finalize, seed, trials) -> tuple[int, bool]:
    """Launch every case and compare; raise CheckFailure on the first wrong one.

    Returns (the number of launches, whether they ran on a GPU).
    """
    import torch

    from course_utils.harness.triton_learner import (
        INTERPRETER,
        check_learner_function,
        run_learner_attention,
    )

    runner = _runner(step, finalize, run_learner_attention)
    if not hasattr(runner, "__course_call__"):  # a grader's handle is checked where it lives
        try:
            check_learner_function(step, "online_softmax_step")
            check_learner_function(finalize, "finalize_rows")
        except TypeError as err:
            raise CheckFailure(f"✗ {name}: {err}") from None
    on_gpu = not INTERPRETER
    device = "cuda" if on_gpu else "cpu"
    tolerances = {"float32": 1e-5, "float16": 2e-3} if not on_gpu else {}
    cases = _kernel_cases(seed, trials, on_gpu)
    for case in cases:
        (q, k, v), (q64, k64, v64) = _inputs(case, torch, device)
        scale = 1.0 / math.sqrt(case.d)
        try:
            out, lse = call_learner(
                runner, q, k, v, case.causal, scale, case.block_m, case.block_n,
                name=name, allow=("launch", "run_learner_attention"),
            )  # fmt: skip
        except NotImplementedError:
            raise
        except _LearnerRaised as err:  # the learner's code failed to compile or to run
            if isinstance(err.exc, TypeError) and "@triton.jit" in str(err.exc):
                raise CheckFailure(f"✗ {name}: {err.exc}") from None
            raise _raised_failure(name, case, err.exc) from None
        yours = (out.double().cpu().numpy(), lse.double().cpu().numpy())
        args = (q64, k64, v64, case.causal, scale, case.block_m, case.block_n)
        expected = _reference_attention(q64, k64, v64, case.causal, scale)
        tol = tolerances.get(case.dtype, 1e-2)
        # A replay matches within 1e-3 in float32 in the interpreter; half precision on a GPU
        # rounds p before P @ V, so out needs 5e-2, while lse (float32 from the scores) stays
        # within 1e-2: a looser lse tolerance let unrelated shifts pass for base2-lse
        loose = case.dtype != "float32" or on_gpu
        for which, what, mistakes, match_tol in (
            (0, "out", KERNEL_OUT_MISTAKES, 5e-2 if loose else 1e-3),
            (1, "lse", KERNEL_LSE_MISTAKES, 1e-2 if loose else 1e-3),
        ):
            err = _rel_err(yours[which], expected[which])
            if err < tol:
                continue
            mistake = _diagnose(
                which, yours[which], args, expected[which], mistakes, tol, match_tol
            )
            raise CheckFailure(
                _kernel_failure(name, case, what, yours[which], expected[which], err, tol, mistake)
            )
    return len(cases), on_gpu


# ---- quick checks --------------------------------------------------------------------------------


def check_quick_num_programs(answer) -> None:
    """Programs launched for batch 2, 4 heads, N = 1000 queries, BLOCK_M = 64."""
    batch, heads, N, block_m = 2, 4, 1000, 64
    tiles = -(-N // block_m)
    _hinted(
        "programs in the grid (batch 2, 4 heads, N = 1000, BLOCK_M = 64)",
        answer,
        tiles * batch * heads,
        [
            ((N // block_m) * batch * heads, "N // BLOCK_M drops the ragged last tile: round up"),
            (tiles, "each (batch, head) pair gets its own row of programs: times batch * heads"),
            (tiles * heads, "the grid's second axis is batch * heads, not heads"),
            (tiles * batch, "the grid's second axis is batch * heads, not batch"),
            (N / block_m * batch * heads, "a program count is a whole number: ceil(N / BLOCK_M)"),
        ],
        "grid = (ceil(N / BLOCK_M), batch * heads); the number of programs is the product",
        rtol=0.0,
    )


def check_quick_qk_scale(answer) -> None:
    """qk_scale = softmax_scale * log2(e) for d = 64."""
    scale = 1.0 / math.sqrt(64)
    _hinted(
        "qk_scale for d = 64",
        answer,
        scale * LOG2E,
        [
            (scale, "that is softmax_scale alone; fold in log2(e) = 1.4427 for exp2"),
            (scale / LOG2E, "multiply by log2(e): exp(x) = exp2(x * log2(e))"),
            (scale * LN2, "log2(e) = 1 / ln(2) = 1.4427, not ln(2)"),
            (math.sqrt(64) * LOG2E, "softmax_scale is 1 / sqrt(d), not sqrt(d)"),
            (LOG2E / 64, "softmax_scale is 1 / sqrt(d) = 1/8, not 1 / d"),
        ],
        "qk_scale = (1 / sqrt(d)) * log2(e)",
    )


def check_quick_causal_kv_tiles(answer) -> None:
    """K/V tiles loaded by causal program pid_m = 5 (N = 1000, BLOCK_M = 64, BLOCK_N = 32)."""
    pid_m, N, block_m, block_n = 5, 1000, 64, 32
    hi = min((pid_m + 1) * block_m, N)
    _hinted(
        "K/V tiles loaded by causal program 5 (N = 1000, BLOCK_M = 64, BLOCK_N = 32)",
        answer,
        -(-hi // block_n),
        [
            (-(-N // block_n), "that is every K/V tile; causal skips those after the diagonal"),
            (pid_m * block_m // block_n, "the tiles on the diagonal are loaded too (and masked)"),
            (pid_m + 1, "count tiles of BLOCK_N = 32 keys, not of BLOCK_M = 64"),
        ],
        "the program's last query is (5 + 1) * 64 - 1; it loads keys 0 .. (5 + 1) * 64 - 1",
        rtol=0.0,
    )
