"""Checks for notebook 09, flash-decoding over a paged KV cache.

    check_attend_chunk(attend_chunk)     the learner's @triton.jit chunk loop, launched in
                                         course_utils.harness.decode_learner's skeleton;
                                         each chunk's (out, lse) against float64 attention over
                                         the chunk's tokens (course_utils.attention_reference)
    check_merge_splits(merge_splits)     merge_splits(out_partial, lse_partial) -> (out, lse),
                                         against the float64 lse merge of references.softmax
    check_quick_programs(answer)         programs of the partials grid: batch 8, 32 query heads,
                                         8 KV heads, num_splits 4
    check_quick_kv_bytes(answer)         bytes of K and V one decode step reads: batch 1, 8 KV
                                         heads, 65,536 tokens, d = 128, bf16

The cases are built so that each named mistake shows: the pages of every sequence sit in shuffled
physical order among pages of garbage (block_table ignored, or pages assumed contiguous, read the
wrong numbers); the slots of a sequence's last page past its length hold garbage (a mask off by
one reads one of them); lengths are ragged, with a length of 1, a length of 0, and splits past a
sequence's end (empty chunks: out 0, lse -inf, never NaN); one case has scores of several hundred,
where exp2 without the max shift overflows float32; grouped-query attention with groups of 1, 2
and 4 query heads per KV head.

A mistake is named only when its replay (a float64 NumPy emulation of the kernel or merge with
that one bug; float32 where the bug is an overflow) reproduces the learner's output on the failing
case; otherwise the message says which part of the specification the case exercises. Launches
write into NaN-filled buffers, so an element never written shows up. Nothing reaches stderr (a
graded cell would lose its points): see engine.kernels._nothing_on_stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.kernels import (
    HALF_STATE_EXPLANATION,
    HALF_STATE_TITLE,
    _dtype_hint,
    _nothing_on_stderr,
    _raised_failure,
)
from course_utils.checks.engine.watch import _LearnerRaised, call_learner
from course_utils.checks.flash_decoding.compare import _as_array, _diagnose, _error, _failure
from course_utils.references.attention import attention_reference

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ---- inputs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeCase:
    """One launch: shapes, the sequences' lengths, the splits, the dtype and the inputs' seed."""

    label: str
    q_heads: int
    kv_heads: int
    d: int
    page_size: int
    lens: tuple[int, ...]  # seq_lens, one per sequence
    num_splits: int
    dtype: str = "float32"
    seed: int = 0
    q_scale: float = 1.0  # q is drawn N(0, q_scale^2): 100 gives scores of several hundred
    exact: bool = False  # the float32 state's inputs: integer scores in base 2 (decode_inputs)

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(d), or ln 2 for the exact case (qk_scale = 1: the scores stay integers)."""
        return LN2 if self.exact else 1.0 / math.sqrt(self.d)

    @property
    def batch(self) -> int:
        return len(self.lens)

    @property
    def max_pages(self) -> int:
        return max(1, max(-(-n // self.page_size) for n in self.lens))

    @property
    def pages_per_split(self) -> int:
        return max(1, -(-self.max_pages // self.num_splits))

    def describe(self) -> str:
        return (
            f"q ({self.batch}, {self.q_heads}, {self.d}), {self.kv_heads} KV heads, page_size "
            f"{self.page_size}, seq_lens {list(self.lens)}, num_splits {self.num_splits} "
            f"({self.pages_per_split} page(s) per split), {self.dtype}"
        ) + (
            ", q and k of -1, 0 and 1, v in steps of 1/8, softmax_scale ln 2: integer scores "
            "in base 2"
            if self.exact
            else ""
        )

    def focus(self) -> str:
        """The parts of the specification this case exercises (said when no mistake matches)."""
        parts = []
        if self.batch > 1 or self.max_pages > 1:
            parts.append(
                "the block-table lookup (pages in shuffled physical order, garbage in between)"
            )
        if any(n % self.page_size for n in self.lens):
            parts.append("the mask of the slots past seq_len in a sequence's last page")
        chunks = [
            min(n, (s + 1) * self.pages_per_split * self.page_size)
            - s * self.pages_per_split * self.page_size
            for n in self.lens
            for s in range(self.num_splits)
        ]
        if any(c <= 0 for c in chunks):
            parts.append("empty chunks (out 0 and lse -inf, no NaN)")
        if self.q_scale > 10:
            parts.append("scores of several hundred (the max shift keeps exp2 finite)")
        if self.q_heads > self.kv_heads:
            parts.append(
                f"grouped-query attention ({self.q_heads // self.kv_heads} rows per group)"
            )
        if self.exact:
            return "the running max m_i, sum l_i and accumulator acc kept in float32"
        if self.dtype != "float32":
            parts.append(f"{self.dtype} inputs: tl.dot(p.to(v.dtype), v), the state in float32")
        return "; ".join(parts) or "the online softmax over the chunk's pages, and the lse"


def decode_inputs(case: DecodeCase):
    """The case's tensors (CPU torch) and their float64 NumPy copies.

    Returns:
        (q, k_cache, v_cache, block_table, seq_lens) as torch tensors, and (q, k, v, table,
        lens) as float64 / int64 NumPy arrays. The cache holds the sequences' pages in shuffled
        order among garbage pages, with max_pages spare pages at the end, so that a kernel that
        ignores the block table still reads inside the cache; the unused slots of each last page
        and the table's unused entries point at garbage.
    """
    import torch

    rng = np.random.default_rng(case.seed)
    page = case.page_size
    pages_of = [-(-n // page) for n in case.lens]
    pool = sum(pages_of) + 2  # the sequences' pages and two garbage pages, shuffled
    num_pages = pool + case.max_pages
    shape = (num_pages, page, case.kv_heads, case.d)
    k = rng.standard_normal(shape)
    v = rng.standard_normal(shape)
    k[pool:] *= 3.0  # garbage far from the real keys: a wrong page changes the answer
    order = rng.permutation(pool)
    # physical page 0 goes to a garbage slot: a sequence starting there would make "block table
    # ignored" (page j) and "pages assumed contiguous" (block_table[b, 0] + j) read the same pages
    zero = int(np.flatnonzero(order == 0)[0])
    order[zero], order[-1] = order[-1], order[zero]
    table = rng.integers(0, num_pages, size=(case.batch, case.max_pages))
    taken = 0
    for b, n_pages in enumerate(pages_of):
        table[b, :n_pages] = order[taken : taken + n_pages]
        taken += n_pages
        tail = case.lens[b] % page
        if tail:  # the last page's unused slots: garbage a mask off by one would read
            last = table[b, n_pages - 1]
            k[last, tail:] = 3.0 * rng.standard_normal((page - tail, case.kv_heads, case.d))
            v[last, tail:] = 5.0 + rng.standard_normal((page - tail, case.kv_heads, case.d))
    q = case.q_scale * rng.standard_normal((case.batch, case.q_heads, case.d))
    if case.exact:  # every p = 2^(s - m) a float16 and every sum exact in float32
        q, k = (np.rint(np.clip(x, -1.0, 1.0)) for x in (q, k))
        v = np.rint(8.0 * v) / 8.0
    dtype = getattr(torch, case.dtype)
    tensors = (
        torch.from_numpy(q).to(dtype),
        torch.from_numpy(k).to(dtype),
        torch.from_numpy(v).to(dtype),
        torch.from_numpy(table).to(torch.int32),
        torch.tensor(case.lens, dtype=torch.int32),
    )
    as64 = tuple(t.double().numpy() for t in tensors[:3]) + (
        table.astype(np.int64),
        np.asarray(case.lens, dtype=np.int64),
    )
    return tensors, as64


def _chunks(lens, max_pages, num_splits, page):
    """(b, split, start, end) of every chunk: split s holds logical pages s*P .. (s+1)*P - 1."""
    per = max(1, -(-max_pages // num_splits))
    for b, n in enumerate(lens):
        for s in range(num_splits):
            start = s * per * page
            yield b, s, start, max(start, min(start + per * page, int(n)))


def reference_partials(q, k, v, table, lens, softmax_scale, num_splits):
    """Each chunk's (out, lse) in float64: course_utils.attention_reference on its tokens.

    Args:
        q: (batch, q_heads, d).  k, v: (num_pages, page_size, kv_heads, d).
        table: (batch, max_pages) ints.  lens: (batch,) ints.  softmax_scale: tau.

    Returns:
        out_partial (batch, q_heads, num_splits, d), lse_partial (batch, q_heads, num_splits);
        0 and -inf for an empty chunk.
    """
    batch, q_heads, d = q.shape
    page, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    out = np.zeros((batch, q_heads, num_splits, d))
    lse = np.full((batch, q_heads, num_splits), -np.inf)
    for b, s, start, end in _chunks(lens, table.shape[1], num_splits, page):
        if end <= start:
            continue
        toks = np.arange(start, end)
        phys = table[b, toks // page]
        for kvh in range(kv_heads):
            rows = slice(kvh * group, (kvh + 1) * group)
            keys, values = k[phys, toks % page, kvh], v[phys, toks % page, kvh]
            out[b, rows, s], lse[b, rows, s] = attention_reference(
                q[b, rows], keys, values, False, softmax_scale
            )
    return out, lse


def emulate_partials(
    q,
    k,
    v,
    table,
    lens,
    softmax_scale,
    num_splits,
    *,
    pages: str = "table",
    mask: str = "right",
    exp: str = "2",
    shift: bool = True,
    lse_form: str = "e",
    empty: str = "guarded",
    state: str = "float32",
):
    """The skeleton with the learner's chunk loop, page by page, in NumPy, with one bug or none.

    pages: "table" (block_table[b, j]), "ignored" (physical page = logical page j) or
    "contiguous" (block_table[b, 0] + j). mask: "right" (slot t kept when t < chunk_end),
    "off-by-one" (t <= chunk_end), "scores" (loads masked to 0, scores not set to -inf) or "none"
    (no mask: the garbage slots count). exp: "2" or "e" (tl.exp with the base-2 scale).
    shift=False: p = exp2(s) with no running max, in float32 (overflows past 2^128); m_i is
    still the running max, for lse_form.
    lse_form: "e" ((m + log2 l) ln 2), "2" (m + log2 l), "no-max" (log2(l) ln 2).
    empty: "guarded" (out 0, lse -inf) or "nan" (out = acc / l, 0 / 0 for an empty chunk).
    state: "float16" (m_i, l_i and acc rounded to float16 after every page).

    Returns:
        out_partial (batch, q_heads, num_splits, d), lse_partial (batch, q_heads, num_splits).
    """
    batch, q_heads, d = q.shape
    page, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    qk_scale = softmax_scale * LOG2E
    base = math.e if exp == "e" else 2.0
    out = np.zeros((batch, q_heads, num_splits, d))
    lse = np.full((batch, q_heads, num_splits), -np.inf)
    with np.errstate(all="ignore"):
        for b, s, start, end in _chunks(lens, table.shape[1], num_splits, page):
            for kvh in range(kv_heads):
                rows = slice(kvh * group, (kvh + 1) * group)
                qg = q[b, rows]
                m = np.full(group, -np.inf)
                l = np.zeros(group)
                acc = np.zeros((group, d))
                for p0 in range(start, end, page):
                    j = p0 // page
                    phys = {
                        "table": table[b, j],
                        "ignored": j,
                        "contiguous": table[b, 0] + j,
                    }[pages]
                    offs = p0 + np.arange(page)
                    keep = {
                        "right": offs < end,
                        "off-by-one": offs <= end,
                        "scores": offs < end,
                        "none": np.ones(page, dtype=bool),
                    }[mask]
                    kk, vv = k[phys, :, kvh], v[phys, :, kvh]
                    if mask == "scores":  # loads masked to zero, scores left at q . 0 = 0
                        kk = np.where((offs < end)[:, None], kk, 0.0)
                        vv = np.where((offs < end)[:, None], vv, 0.0)
                        keep = np.ones(page, dtype=bool)
                    sc = np.where(keep[None, :], (qg @ kk.T) * qk_scale, -np.inf)
                    if not shift:  # float32, as the kernel: exp2 overflows past 2^128
                        p = np.exp2(sc.astype(np.float32)).astype(np.float64)
                        p = np.where(p > np.finfo(np.float32).max, np.inf, p)
                        l = l + p.sum(axis=1)
                        acc = acc + p @ vv
                        m = np.maximum(m, sc.max(axis=1))
                        continue
                    m_new = np.maximum(m, sc.max(axis=1))
                    alpha = np.power(base, m - m_new)
                    pm = np.power(base, sc - m_new[:, None])
                    l = l * alpha + pm.sum(axis=1)
                    acc = acc * alpha[:, None] + pm @ vv
                    m = m_new
                    if state == "float16":
                        m, l, acc = (x.astype(np.float16).astype(np.float64) for x in (m, l, acc))
                if empty == "nan" or l.all():
                    o = acc / l[:, None]
                else:
                    o = np.where((l > 0)[:, None], acc / np.where(l > 0, l, 1.0)[:, None], 0.0)
                lg = np.log2(l)
                ls = {"e": (m + lg) * LN2, "2": m + lg, "no-max": lg * LN2}[lse_form]
                if empty != "nan":
                    ls = np.where(l > 0, ls, -np.inf)
                out[b, rows, s], lse[b, rows, s] = o, ls
    return out, lse


# ---- exercise 1: attend_chunk --------------------------------------------------------------------
def _chunk_mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, functools.partial(emulate_partials, **bug))


_TABLE = (
    "Logical page j of the sequence is physical page block_table[b, j]: load it, "
    "page = tl.load(table_ptr + start // PAGE_SIZE), and address the page's tokens from "
    "page * stride_page. An engine hands out pages as they free up, so one sequence's pages are "
    "anywhere in the cache and in any order."
)
_LSE = (
    "lse must be in natural log, as the merge weighs chunks by exp(lse_s - lse): "
    "lse = (m_i + log2(l_i)) * ln(2), with m_i and log2(l_i) in base 2."
)

CHUNK_OUT_MISTAKES = [
    _chunk_mistake(
        "block-table-ignored",
        "the block table is not used: logical page j is read from physical page j",
        _TABLE,
        pages="ignored",
    ),
    _chunk_mistake(
        "pages-assumed-contiguous",
        "the pages are taken to be contiguous: block_table[b, 0] + j",
        _TABLE + " Only the first lookup is not enough: look every page up.",
        pages="contiguous",
    ),
    _chunk_mistake(
        "mask-off-by-one",
        "the last page's mask keeps slot chunk_end (offs_n <= chunk_end)",
        "Tokens chunk_start .. chunk_end - 1 are the chunk's, so the mask is offs_n < chunk_end. "
        "With <= the slot after a sequence's last token, which holds whatever the page held "
        "before, joins the softmax.",
        mask="off-by-one",
    ),
    _chunk_mistake(
        "ragged-page",
        "the slots past chunk_end are loaded as zeros, but their scores are not set to -inf",
        "A zero key has score 0, not -inf, so it still takes weight exp2(0 - m_i) in l_i: "
        "s = tl.where(offs_n[None, :] < chunk_end, s, float('-inf')).",
        mask="scores",
    ),
    _chunk_mistake(
        "ragged-page",
        "the slots past chunk_end are not masked at all",
        "The last page of a sequence is partly filled; the slots past its length hold stale "
        "numbers. Mask the loads and set those scores to -inf.",
        mask="none",
    ),
    _chunk_mistake(
        "exp-vs-exp2",
        "tl.exp with the base-2 scale",
        "qk_scale = softmax_scale * log2(e) puts the scores in base 2; use tl.math.exp2 for p and "
        "for alpha. tl.exp makes the softmax log2(e) = 1.44 times too sharp.",
        exp="e",
    ),
    _chunk_mistake(
        "no-max-shift",
        "p = exp2(s) with no running max subtracted",
        "Scores of a few hundred (large activations, long contexts) make exp2(s) overflow "
        "float32 past 2^128: inf / inf = NaN. Keep the running max m_i and use "
        "p = exp2(s - m_new[:, None]), alpha = exp2(m_i - m_new).",
        shift=False,
        lse_form="no-max",
    ),
    _chunk_mistake(
        "no-max-shift",
        "p = exp2(s) with no max subtracted, and lse = (max + log2(l_i)) ln 2",
        "Without the shift l_i = sum exp2(s) already holds the max: lse = log2(l_i) ln 2, and "
        "exp2(s) overflows float32 past 2^128 (scores of a few hundred). Keep the running max: "
        "p = exp2(s - m_new[:, None]), alpha = exp2(m_i - m_new), lse = (m_i + log2(l_i)) ln 2.",
        shift=False,
    ),
    _chunk_mistake(
        "empty-chunk-nan",
        "an empty chunk divides 0 by 0",
        "A split past a sequence's end holds no token: the loop does not run, l_i = 0, and "
        "acc / l_i is NaN, which the merge spreads to the whole answer. Return out = 0 and "
        "lse = -inf there: divide by tl.where(l_i > 0, l_i, 1.0).",
        empty="nan",
    ),
    _chunk_mistake(
        "half-precision-state", HALF_STATE_TITLE, HALF_STATE_EXPLANATION, state="float16"
    ),
]

CHUNK_LSE_MISTAKES = [
    _chunk_mistake("base2-lse", "lse left in base 2 (m_i + log2(l_i))", _LSE, lse_form="2"),
    _chunk_mistake(
        "lse-without-max",
        "lse is log(l_i) without the running max",
        "l_i is a sum relative to the running max m_i: " + _LSE,
        lse_form="no-max",
    ),
]


# The float32 state's case: 256 tokens, 16 pages per split, float16 q and k of -1, 0 and 1, v in
# steps of 1/8 and qk_scale = 1: the scores are integers, every p = 2^(s - m) is a float16 and
# every sum exact in float32, so out_partial and lse_partial (float32) are exact up to the final
# division and log with float32 state, while a float16 m_i, l_i or acc rounds at every page.
STATE_CHUNK_CASE = DecodeCase(
    "float16, 16 pages per split of exact scores: only the final division rounds", 2, 1, 16, 16,
    (256,), 1, "float16", seed=9, exact=True,
)  # fmt: skip
STATE_TOLS = (1e-5, 1e-6)  # out_partial, lse_partial: measured 7e-8 and below with float32 state;
# with a float16 m_i, l_i or acc, out_partial is off by 1.8e-4 or more, lse_partial (l_i) by 3e-5


def _chunk_cases(seed, trials, on_gpu: bool) -> list[DecodeCase]:
    small = 32 if on_gpu else 16  # d
    cases = [
        DecodeCase("one sequence of 10 tokens in one page, one split", 1, 1, small, 16, (10,),
                   1, seed=1),
        DecodeCase("45 tokens in three shuffled pages, two splits, GQA 2/1", 2, 1, small, 16,
                   (45,), 2, seed=2),
        DecodeCase("ragged batch: lengths 1, 40 and 17, three splits (empty chunks)", 2, 1,
                   small, 16, (1, 40, 17), 3, seed=3),
        DecodeCase("a sequence of length 0 beside one of 20", 2, 1, small, 16, (0, 20), 2,
                   seed=4),
        DecodeCase("scores of several hundred (q drawn 100 times larger)", 2, 1, small, 16,
                   (50,), 2, seed=5, q_scale=100.0),
        DecodeCase("d = 24 padded to 32, GQA 8/2, pages of 32 tokens", 8, 2, 24, 32, (70, 33), 2,
                   seed=6),
        DecodeCase("float16 inputs, 60 tokens, three splits", 4, 2, small, 16, (60,), 3,
                   "float16", seed=7),
    ]  # fmt: skip
    if on_gpu:  # half precision, a GPU's sizes
        cases = [dataclasses.replace(c, dtype="float16") for c in cases] + [
            DecodeCase("bfloat16, d = 128, GQA 32/8, 1000 and 777 tokens", 32, 8, 128, 16,
                       (1000, 777), 5, "bfloat16", seed=8),
        ]  # fmt: skip
    cases.append(dataclasses.replace(STATE_CHUNK_CASE, d=small))
    rng = np.random.default_rng(seed)
    for t in range(trials):
        kv_heads = int(rng.integers(1, 3))
        group = int(rng.choice([1, 2, 4]))
        page = int(rng.choice([16, 32]))
        batch = int(rng.integers(1, 3))  # at most 2 x 2 x 4 programs: each costs ~0.1 s
        lens = tuple(int(x) for x in rng.integers(0, 4 * page, size=batch))
        case = DecodeCase(
            f"random case {t + 1}",
            kv_heads * group,
            kv_heads,
            int(rng.choice([16, 32])) if not on_gpu else int(rng.choice([64, 128])),
            page,
            lens,
            int(rng.integers(1, 5)),
            "float32" if not on_gpu else str(rng.choice(["float16", "bfloat16"])),
            seed=int(rng.integers(2**31)),
        )
        cases.append(case)
    return cases


def _chunk_runner(attend_chunk):
    """run_learner_partials with attend_chunk bound, wherever the learner's function lives."""
    path = "course_utils.harness.decode_learner:run_learner_partials"
    if hasattr(attend_chunk, "bound_into"):  # the grader's handle on the notebook's function
        return attend_chunk.bound_into(path)
    from course_utils.harness.decode_learner import run_learner_partials

    def launch(q, k_cache, v_cache, block_table, seq_lens, softmax_scale, num_splits):
        return run_learner_partials(
            attend_chunk, q, k_cache, v_cache, block_table, seq_lens, softmax_scale, num_splits
        )

    return launch


def check_attend_chunk(attend_chunk: Callable, seed: int | None = 0, trials: int = 2) -> None:
    """Check the learner's @triton.jit attend_chunk in the skeleton's partials kernel.

    Each case's out_partial and lse_partial (NaN-filled before the launch) are compared with
    float64 attention over each chunk's tokens: relative error below 1e-5 in float32 and 3e-3 in
    float16 in the interpreter, 2e-2 in half precision on a GPU; -inf exactly where a chunk is
    empty. The float32 state's case (STATE_CHUNK_CASE, on the interpreter and on the GPU) is
    exact in float32 up to the final division: to 1e-5 (out) and 1e-6 (lse), it refuses a
    running max, sum or accumulator kept in float16. A call with seed=None right after a pass on
    the same function (the hidden tests, after the visible call in the same cell) runs only its
    random cases: the fixed ones are seeded, the same launches, and passed a moment ago.

    Raises:
        NotImplementedError: attend_chunk is still the exercise's stub.
        CheckFailure: a wrong result, with the case, the worst row and the mistake it shows.
    """
    name = "attend_chunk"
    with _nothing_on_stderr():
        launches, reused, on_gpu = _check_attend_chunk(name, attend_chunk, seed, trials)
    where = (
        "float16 and bfloat16 on the GPU" if on_gpu else "float32 and float16 in the interpreter"
    )
    if reused:  # the hidden tests' call, after the visible one on the same function
        launches = f"{launches} random launches (and the {reused} fixed ones above)"
    else:
        launches = f"{launches} launches"
    print(
        f"✓ {name}: {launches} match float64 attention on every chunk ({where}; shuffled "
        "pages, ragged lengths, 0 and 1 tokens, empty chunks, GQA, scores of several hundred)"
    )


def _check_attend_chunk(name, attend_chunk, seed, trials) -> tuple[int, int, bool]:
    from course_utils.harness.triton_learner import check_learner_function
    from course_utils.triton_attention import INTERPRETER

    runner = _chunk_runner(attend_chunk)
    if not hasattr(runner, "__course_call__"):
        try:
            check_learner_function(attend_chunk, name)
        except TypeError as err:
            raise CheckFailure(f"✗ {name}: {err}") from None
    on_gpu = not INTERPRETER
    cases = _chunk_cases(seed, trials, on_gpu)
    fixed = len(_chunk_cases(0, 0, on_gpu))  # the same for every seed: the first cases
    key = (attend_chunk, getattr(attend_chunk, "src", None), on_gpu)
    # consumed by this call: only the call right after a full pass (the hidden tests' call, in the
    # same cell as the visible one) may reuse it, and only with fresh random cases (seed None)
    previous = _FIXED_PASSED.pop("key", None)
    reused = fixed if seed is None and previous == key else 0
    cases = cases[reused:]  # after the visible call on the same function: the random ones only
    for case in cases:
        tensors, (q64, k64, v64, table, lens) = decode_inputs(case)
        scale = case.softmax_scale
        try:
            result = call_learner(
                runner, *tensors, scale, case.num_splits, name=name,
                allow=("launch", "run_learner_partials"),
            )  # fmt: skip
        except NotImplementedError:
            raise
        except _LearnerRaised as err:
            if isinstance(err.exc, TypeError) and "@triton.jit" in str(err.exc):
                raise CheckFailure(f"✗ {name}: {err.exc}") from None
            raise _chunk_raised(name, case, err.exc) from None
        yours = tuple(_as_array(x) for x in result)
        args = (q64, k64, v64, table, lens, scale, case.num_splits)
        expected = reference_partials(*args)
        tol = {"float32": 1e-5, "float16": 3e-3}[case.dtype] if not on_gpu else 2e-2
        if on_gpu and case.dtype == "float32":
            tol = 5e-3  # tl.dot rounds float32 to tf32 on a GPU
        match_tol = 1e-3 if case.dtype == "float32" and not on_gpu else 5e-2
        for which, what, mistakes in (
            (0, "out_partial", CHUNK_OUT_MISTAKES),
            (1, "lse_partial", CHUNK_LSE_MISTAKES + CHUNK_OUT_MISTAKES),
        ):
            if case.exact:
                tol = STATE_TOLS[which]
            err = _error(yours[which], expected[which])
            if err < tol:
                continue
            mistake = _diagnose(
                which, yours[which], args, expected[which], mistakes, tol, match_tol
            )
            raise CheckFailure(
                _failure(
                    name, case.label, case.describe(), what, yours[which], expected[which], err,
                    tol, mistake, case.focus(),
                )
            )  # fmt: skip
    if not reused:
        _FIXED_PASSED["key"] = key
    return len(cases), reused, on_gpu


# The attend_chunk (the function object and its source) whose call of the check just passed the
# fixed cases: the hidden tests call the check again at once, on the same function, with random
# cases added (seed None), and the fixed cases (seeded: the same launches) would only run twice.
# Any other call in between forgets it, so a learner who edits a helper of attend_chunk and runs
# the check cell again gets every fixed case again (the visible call never reuses).
_FIXED_PASSED: dict = {}


def _chunk_raised(name, case, exc) -> CheckFailure:
    """The kernel's error with its input; tl.dot's operands of two dtypes named as the mistake
    (dot-dtype-mismatch, as notebook 06 names it) instead of the generic hint."""
    failure = _raised_failure(name, case, exc)
    named = _dtype_hint(exc)
    if not named:
        return failure
    return CheckFailure(str(failure).split("\n  hint: ")[0] + named)
