"""Notebook 06's skeleton kernel emulated in float64 NumPy, with one bug at a time.

    emulate_kernel(q, k, v, causal, softmax_scale, block_m, block_n, **bug) -> (out, lse)
                                        the kernel's loop over K/V tiles, base 2, tile by tile;
                                        each keyword names one bug (exp=, scaled=, combine=, ...)
    KERNEL_OUT_MISTAKES, KERNEL_LSE_MISTAKES
                                        the mistakes of the kernel's step and finalize, each
                                        with the emulation of its bug as its replay
    _reference_attention(q, k, v, causal, softmax_scale) -> (out, lse), float64, all heads

q, k, v have shape (B, H, N, d) (k and v: N_k rows); out (B, H, N_q, d), lse (B, H, N_q). The
forward's check (forward.py) and the row-block puzzle (puzzles.py) name a mistake when its replay
gives the learner's output: a kernel's output matches its emulation to the dtype's tolerance, so a
learner who makes a known mistake in float16 on a GPU is told which one (run_cases matches
mistakes to 1e-6, right for float64 NumPy exercises, too tight for a kernel).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from course_utils.checks.engine.failures import Mistake

__all__ = ["KERNEL_LSE_MISTAKES", "KERNEL_OUT_MISTAKES", "emulate_kernel"]

LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453  # ln(2) = 1 / log2(e)


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
