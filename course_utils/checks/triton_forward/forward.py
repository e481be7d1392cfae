"""Check of notebook 06's whole forward: the learner's kernel and launcher.

    check_attention_fwd(fn)          the learner's attention_fwd(q, k, v, causal=False,
                                     softmax_scale=None) -> (out, lse) and the kernel it launches

The check calls the learner's attention_fwd through course_utils.harness.triton_puzzles.
run_attention_fwd (in the notebook's kernel when a submission is graded; only tensors travel
back) in stages (FORWARD_STAGES: one tile, batches and heads, ragged N, a strided layout,
N_q != N_k, head dims, causal, the causal loop's bound, dtypes, no keys, random shapes, the
float32 state) and names the first failing stage. A mistake is named when its replay
(emulation.emulate_kernel with that one bug, every tile size tried) gives the learner's
output; two mistakes whose replays give the same numbers (tl.exp, and log2(e) folded twice) are
told apart by the other output (lse), then by the learner's source. Some mistakes are told by a
second run: the batch and head offsets (_offsets_diagnose: which (b, h) are right), the launcher
computing with torch (_TorchAttentionMath, a TorchFunctionMode), bfloat16 not upcast in the
interpreter (_bf16_diagnose: the same case run in float32).

Some rules of the notebook leave the output right when they are broken: a load past the matrix,
K read twice, a launcher that computes with torch. Once a case's values are right, its loads are
judged (loads.py), and the check counts the launches of the learner's attention_fwd_kernel
(on a GPU too). On a GPU the load rules are not checked, and the pass line says so.

Causal attention here is the course's: query i sees keys 0..i, and causal needs N_q == N_k (the
references of course_utils and the course's kernels refuse the rest).

Without a GPU the kernel runs in Triton's interpreter on small float32 (and float16) inputs;
on a GPU it is compiled and the check uses float16 and bfloat16.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.feedback import mismatch_lines
from course_utils.checks.engine.kernels import (
    HALF_STATE_EXPLANATION,
    HALF_STATE_TITLE,
    _dtype_hint,
    _nothing_on_stderr,
    _raised_failure,
)
from course_utils.checks.engine.watch import _LearnerRaised
from course_utils.checks.triton_forward.common import (
    _ampere_or_newer,
    _as_numpy,
    _error,
    _launch,
    _learner_source,
    _nearest_mistake,
    _on_gpu,
    _rules_line,
    _stage_line,
)
from course_utils.checks.triton_forward.emulation import (
    KERNEL_LSE_MISTAKES,
    KERNEL_OUT_MISTAKES,
    LN2,
    LOG2E,
    _reference_attention,
    emulate_kernel,
)
from course_utils.checks.triton_forward.loads import (
    broken,
    inside_rule,
    launches_rule,
    once_rule,
    reads_inputs_rule,
    rule_case,
)

__all__ = ["FORWARD_MISTAKES", "FORWARD_STAGES", "check_attention_fwd"]

LOADS_ABOVE_DIAGONAL = Mistake(
    "loads-above-diagonal",
    "the causal loop loads K/V tiles past the query tile's diagonal block",
    "A causal query tile with rows i0 .. i0 + BLOCK_M - 1 needs keys 0 .. i0 + BLOCK_M - 1 only; "
    "a tile of keys past that is masked to p = 0 everywhere, so loading it costs memory traffic "
    "and time for nothing (half the work at long N). Stop the loop at "
    "min((pid_m + 1) * BLOCK_M, seqlen_k). This case filled the keys and values past that bound "
    "with NaN: p = 0 times NaN is NaN in tl.dot, so a load there shows in the output.",
    None,
)


# Hooks of this module that run inside the learner's call (the reference watch skips them)
INSTRUMENTS = ("__torch_function__",)


# ---- the whole forward: the learner's kernel and launcher ---------------------------------------
@dataclass(frozen=True)
class ForwardCase:
    """One call of the learner's attention_fwd: shapes, dtype, layout, the inputs' seed, and
    for the poisoned case the row from which keys and values are NaN."""

    label: str
    stage: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    causal: bool
    dtype: str = "float32"
    seed: int = 0
    layout: str = "contiguous"
    softmax_scale: float | None = None  # None: 1/sqrt(d)
    poison_from: int | None = None  # keys >= this are NaN; only rows < this are compared
    late_max: bool = False
    negative: bool = False  # every score q.k near -3: a key of score 0 would outweigh any real key
    exact: bool = False  # the float32 state's inputs (_exact_state_inputs)

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1 / math.sqrt(self.d)

    def describe(self) -> str:
        text = (
            f"q ({self.batch}, {self.heads}, {self.n_q}, {self.d}), k and v ({self.batch}, "
            f"{self.heads}, {self.n_k}, {self.d}), {self.dtype}, causal={self.causal}"
        )
        if self.softmax_scale is not None:
            text += f", softmax_scale={self.softmax_scale}"
        if self.layout == "bnhd":
            text += ", stored as (B, N, H, d) and seen as (B, H, N, d): rows H * d apart"
        if self.poison_from is not None:
            text += f", keys and values from row {self.poison_from} on are NaN"
        if self.exact:
            text += (
                ", q and k of -1, 0 and 1 (the first half of the queries 0), v from 512 to 2112 "
                "in steps of 64: integer scores in base 2"
            )
        if self.negative:
            text += (
                ", every score below zero, near -3 (a key past the end, scored 0, would weigh "
                "as much as twenty real keys)"
            )
        return text


_STAGE_FOCUS = {
    "one tile": "the grid, the pointers and one K/V loop with the online softmax in exp2 form",
    "batch and heads": "the offsets of program_id(1) = b * H + h: b * stride_b + h * stride_h on "
    "q, k, v and out, and row b * H + h of lse",
    "ragged N": "the masks of the ragged last query tile and of the keys past seqlen_k",
    "strided layout": "the strides: every pointer built from stride_b, stride_h and stride_n",
    "N_q != N_k": "seqlen_q and seqlen_k used in their places (q and out, k and v)",
    "head dims": "d padded to BLOCK_D, a power of two: columns offs_d < d masked on the loads "
    "of q, k, v and the store of out",
    "causal": "the causal mask offs_n <= offs_m on the diagonal block, and the loop's end",
    "causal loop bound": "the causal loop stops at min((pid_m + 1) * BLOCK_M, seqlen_k)",
    "dtypes": "float16/bfloat16 inputs: tl.dot(p.to(v.dtype), v), out in q's dtype, lse float32",
    "no keys": "N_k = 0: out = 0 and lse = -inf, without a launch that divides 0 by 0",
    "random shapes": "every stage above on a random shape: ragged N, N_q != N_k or causal, "
    "several batches and heads",
    "float32 state": "m_i, l_i and acc in float32 whatever the inputs' dtype",
}

# The float32 state's case, on the interpreter and on the GPU: float16 inputs whose scores are
# integers in base 2 (q and k of -1, 0 and 1, softmax_scale = ln 2, so qk_scale = 1), so every p
# is a power of two and every sum exact in float32. The queries that are 0 weigh all 512 keys
# alike: acc sums 512 values of v near 1300, past float16's 65504 (a float16 acc overflows to
# inf). lse, float32, is right to 3e-8 with float32 state (measured: the solution's, and three
# other styles of tiles and loops) and off by 3e-5 to 9e-5 with a float16 l_i (tiles of 16 to
# 64 keys): the tolerance 1e-6 leaves both 25 times away. out, stored in float16, cannot tell
# (2.2e-4 right, 3e-4 to 7e-4 with a float16 l_i).
STATE_CASE = dict(batch=1, heads=1, n_q=32, n_k=512, d=16, causal=False, dtype="float16",
                  seed=17, softmax_scale=LN2, exact=True)  # fmt: skip
STATE_LSE_TOL = 1e-6
# The forward's stages in order: each isolates what its focus says, after the stages it needs (the
# batch offsets before the ragged masks, the head dims before causal, whose cases have d = 32)
FORWARD_STAGES = (
    "one tile", "batch and heads", "ragged N", "strided layout", "N_q != N_k", "head dims",
    "causal", "causal loop bound", "dtypes", "no keys", "random shapes", "float32 state",
)  # fmt: skip


def _forward_cases(seed, trials, on_gpu: bool) -> list[ForwardCase]:
    C = ForwardCase
    if on_gpu:
        cases = [
            C("one head, N = 128", "one tile", 1, 1, 128, 128, 64, False, "float16", 1),
            C("4 heads, N = 256, softmax_scale = 0.3", "one tile", 2, 2, 256, 256, 64, False,
              "float16", 2, softmax_scale=0.3, late_max=True),
            C("batch 2, 3 heads, N = 256 (a multiple of every tile)", "batch and heads", 2, 3,
              256, 256, 64, False, "float16", 18),
            C("ragged N = 333", "ragged N", 2, 2, 333, 333, 64, False, "float16", 3),
            C("ragged N = 333, every score below zero", "ragged N", 1, 2, 333, 333, 64, False,
              "float16", 16, negative=True),
            C("a (B, N, H, d) tensor seen as (B, H, N, d)", "strided layout", 2, 3, 200, 200, 64,
              False, "float16", 4, layout="bnhd"),
            C("N_q = 257, N_k = 1023", "N_q != N_k", 1, 2, 257, 1023, 64, False, "float16", 5),
            C("N_q = 700, N_k = 100", "N_q != N_k", 1, 2, 700, 100, 64, False, "float16", 6),
            C("causal, N = 513", "causal", 2, 2, 513, 513, 64, True, "float16", 7),
            C("causal, keys and values past row 256 poisoned", "causal loop bound", 1, 2, 300,
              300, 64, True, "float16", 8, poison_from=256),
            C("d = 80 padded to 128, N = 300", "head dims", 1, 2, 300, 300, 80, False, "float16",
              9),
            C("d = 128, N = 384", "head dims", 1, 2, 384, 384, 128, False, "float16", 10),
            C("d = 16, N = 200", "head dims", 1, 2, 200, 200, 16, False, "float16", 11),
            C("bfloat16, causal, N = 513, d = 128", "dtypes", 2, 2, 513, 513, 128, True,
              "bfloat16", 12),
            C("float32, N_q = 100, N_k = 300", "dtypes", 1, 2, 100, 300, 64, False, "float32",
              13),
            C("N_k = 0: no key at all", "no keys", 1, 2, 40, 0, 64, False, "float16", 14),
        ]  # fmt: skip
    else:
        cases = [
            C("one head, N = 32, d = 16", "one tile", 1, 1, 32, 32, 16, False, "float32", 1),
            C("2 heads, N = 64, softmax_scale = 0.3, a later tile raises the max", "one tile",
              1, 2, 64, 64, 16, False, "float32", 2, softmax_scale=0.3, late_max=True),
            C("batch 2, 2 heads, N = 64 (a multiple of every tile)", "batch and heads", 2, 2, 64,
              64, 16, False, "float32", 18),
            C("ragged N = 50", "ragged N", 1, 1, 50, 50, 16, False, "float32", 3),
            C("ragged N = 50, every score below zero", "ragged N", 1, 1, 50, 50, 16, False,
              "float32", 16, negative=True),
            C("a (B, N, H, d) tensor seen as (B, H, N, d)", "strided layout", 2, 2, 24, 24, 16,
              False, "float32", 4, layout="bnhd"),
            C("N_q = 33, N_k = 70", "N_q != N_k", 1, 2, 33, 70, 16, False, "float32", 5),
            C("N_q = 70, N_k = 20", "N_q != N_k", 1, 1, 70, 20, 16, False, "float32", 6),
            C("causal, N = 40", "causal", 1, 2, 40, 40, 16, True, "float32", 7),
            C("causal, ragged N = 50, d = 32", "causal", 1, 1, 50, 50, 32, True, "float32", 8),
            C("causal, keys and values past row 128 poisoned", "causal loop bound", 1, 1, 136,
              136, 16, True, "float32", 9, poison_from=128),
            C("d = 24 padded to 32", "head dims", 1, 1, 20, 20, 24, False, "float32", 10),
            C("d = 80 padded to 128", "head dims", 1, 1, 20, 20, 80, False, "float32", 11),
            C("d = 128", "head dims", 1, 1, 20, 20, 128, False, "float32", 12),
            C("float16, causal, N = 40", "dtypes", 1, 2, 40, 40, 32, True, "float16", 13),
            C("bfloat16 (your launcher runs it in float32 in the interpreter), N_q = 24, "
              "N_k = 40", "dtypes", 1, 1, 24, 40, 64, False, "bfloat16", 14),
            C("N_k = 0: no key at all", "no keys", 1, 2, 5, 0, 16, False, "float32", 15),
        ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        causal = bool(rng.integers(2))
        if on_gpu:
            n_q, d = int(rng.integers(1, 700)), int(rng.choice([64, 96, 128]))
            dtype = str(rng.choice(["float16", "bfloat16"]))
        else:
            n_q, d, dtype = int(rng.integers(1, 65)), int(rng.choice([16, 24, 32])), "float32"
        n_k = n_q if causal or rng.random() < 0.5 else int(rng.integers(1, 2 * n_q + 16))
        batch, heads = (int(x) for x in rng.integers(1, 3, size=2))
        cases.append(
            C(f"random case {t + 1}", "random shapes", batch, heads, n_q, n_k, d, causal, dtype,
              int(rng.integers(2**31)))
        )  # fmt: skip
    cases.append(C("float16, N_k = 512: sums past 65504, lse to 1e-6", "float32 state",
                   **STATE_CASE))  # fmt: skip
    if on_gpu and not _ampere_or_newer():  # a T4 (sm_75) has no bfloat16 tl.dot: float16
        cases = [dataclasses.replace(c, dtype="float16") if c.dtype == "bfloat16" else c
                 for c in cases]  # fmt: skip
    return sorted(cases, key=lambda c: FORWARD_STAGES.index(c.stage))


def _forward_inputs(case: ForwardCase, torch, device):
    gen = torch.Generator().manual_seed(case.seed)
    shape_q = (case.batch, case.heads, case.n_q, case.d)
    shape_k = (case.batch, case.heads, case.n_k, case.d)
    q = 2.0 * torch.randn(shape_q, generator=gen)  # spread scores: the max moves between tiles
    k = torch.randn(shape_k, generator=gen)
    v = torch.randn(shape_k, generator=gen)
    if case.exact:  # see STATE_CASE
        q = torch.randint(-1, 2, shape_q, generator=gen).float()
        q[:, :, : case.n_q // 2] = 0.0
        k = torch.randint(-1, 2, shape_k, generator=gen).float()
        v = 64.0 * torch.randint(8, 34, shape_k, generator=gen).float()
    if case.late_max and case.n_k > 16:
        k[:, :, -16:] *= 2.5
    if case.negative:  # q.k = -sum |q_i| |k_i| < 0 for every pair, scaled to a mean of -3:
        # each real key keeps a weight near e^-3 (representable in float16), while a key past
        # the end scored 0 weighs as much as twenty of them
        q, k = q.abs() + 0.5, -(k.abs() + 0.5)
        q = q * (3.0 / float((q @ k.transpose(-1, -2)).mean().abs() * case.scale))
    dtype = getattr(torch, case.dtype)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    as64 = tuple(t.double().numpy() for t in (q, k, v))
    if case.poison_from is not None:
        k, v = k.clone(), v.clone()
        k[:, :, case.poison_from :] = float("nan")
        v[:, :, case.poison_from :] = float("nan")
    return tuple(t.to(device) for t in (q, k, v)), as64


def _forward_expected(case: ForwardCase, q, k, v):
    if case.n_k == 0:
        return np.zeros(q.shape), np.full(q.shape[:3], -np.inf)
    return _reference_attention(q, k, v, case.causal, case.scale)


# Mistakes of the whole kernel, in the order they are tried: emulations of emulate_kernel with
# one bug (the tiles BLOCK_M and BLOCK_N are the learner's choice, so each is tried with every
# power of two from 16 to 128).
_SCALE_TWICE = (
    "qk_scale = softmax_scale * log2(e) already holds both factors: the launcher computes it "
    "once and the kernel multiplies the raw scores q.k by it, and by nothing else."
)


def _fwd_mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, functools.partial(emulate_kernel, **bug))


def _forward_mistakes() -> list[Mistake]:
    own = [
        _fwd_mistake(
            "scale-folded-twice",
            "the scores multiplied by log2(e) twice",
            _SCALE_TWICE,
            extra_scale=LOG2E,
        ),
        _fwd_mistake(
            "exp2-without-log2e",
            "tl.math.exp2 on scores scaled by softmax_scale alone: log2(e) never folded in",
            "exp(x) = exp2(x * log2(e)): the kernel works in base 2 only when the scores carry "
            "the factor log2(e). The launcher passes qk_scale = softmax_scale * log2(e) "
            "(1.4427 times softmax_scale); with softmax_scale alone the softmax is 1.44 times too "
            "flat.",
            extra_scale=LN2,
        ),
        _fwd_mistake(
            "mask-off-by-one",
            "the key mask keeps key seqlen_k (offs_n <= seqlen_k)",
            "Keys are numbered 0 .. seqlen_k - 1: the score of key offs_n is kept when offs_n < "
            "seqlen_k. Key seqlen_k does not exist; loaded as zeros, it gets weight "
            "exp2(0 - m_i).",
            ragged_mask="off-by-one",
        ),
        _fwd_mistake(
            "causal-tile-bound",
            "the causal loop stops before the diagonal block (at pid_m * BLOCK_M)",
            "The query tile's own diagonal block holds the keys i0 .. i0 + BLOCK_M - 1, half of "
            "which each query sees (its own key included): the loop runs to "
            "min((pid_m + 1) * BLOCK_M, seqlen_k), the last tiles masked with offs_n <= offs_m.",
            causal_hi="block-short",
        ),
        _fwd_mistake(
            "causal-tile-bound",
            "the causal loop stops one BLOCK_N tile short of the diagonal block's end",
            "The loop over K/V runs to min((pid_m + 1) * BLOCK_M, seqlen_k): the last query of "
            "the tile, (pid_m + 1) * BLOCK_M - 1, sees every key up to itself.",
            causal_hi="tile-short",
        ),
    ]
    scale_default = [
        Mistake(
            "softmax-scale-ignored",
            "softmax_scale is ignored: the kernel always uses 1/sqrt(d)",
            "softmax_scale defaults to 1/sqrt(d) only when it is None; a number given by the "
            "caller is the scale: qk_scale = softmax_scale * log2(e).",
            lambda q, k, v, causal, scale, bm, bn, **kw: emulate_kernel(
                q, k, v, causal, 1 / math.sqrt(q.shape[-1]), bm, bn, **kw
            ),
        )
    ]
    twice = [
        Mistake(
            "scale-folded-twice",
            "the scores multiplied by softmax_scale twice",
            _SCALE_TWICE,
            lambda q, k, v, causal, scale, bm, bn, **kw: emulate_kernel(
                q, k, v, causal, scale, bm, bn, extra_scale=scale, **kw
            ),
        )
    ]
    return [*KERNEL_OUT_MISTAKES, *own, *twice, *scale_default, HALF_STATE]


HALF_STATE = _fwd_mistake(
    "half-precision-state", HALF_STATE_TITLE, HALF_STATE_EXPLANATION, state="float16"
)
FORWARD_MISTAKES = _forward_mistakes()
FORWARD_LSE_MISTAKES = [*KERNEL_LSE_MISTAKES, HALF_STATE]
LAUNCHER_SKIPS_KERNEL = Mistake(
    "launcher-skips-kernel",
    "attention_fwd computes attention with torch, not with your kernel",
    "The exercise is the Triton kernel: attention_fwd launches attention_fwd_kernel, which "
    "computes out and lse tile by tile. Your launcher called torch's attention math "
    "(F.scaled_dot_product_attention, softmax or a matmul of q and k) on this case; it "
    "materializes the N x N scores the kernel exists to avoid, and here it read the keys past "
    "the diagonal, which this case filled with NaN.",
    None,
)
BF16_IN_INTERPRETER = Mistake(
    "bf16-in-interpreter",
    "the launcher hands bfloat16 tensors to the kernel in the interpreter, which computes "
    "bfloat16 wrong without an error",
    "Your kernel is right in float32 on the same numbers: the dot products are not at fault. "
    "Triton's CPU interpreter computes bfloat16 wrongly and silently (a GPU does not). As the "
    "launcher's step 6 says: when ta.INTERPRETER and q.dtype == torch.bfloat16, run the kernel "
    "on q.float(), k.float(), v.float() and return out.to(torch.bfloat16) (lse stays float32).",
    None,
)
BATCH_OFFSET = Mistake(
    "head-offset-missing",
    "batch 0 is right and the later batches are not: the batch offset b * stride_b is missing "
    "(or b is taken wrong from program_id(1))",
    "Program (pid_m, b * H + h) works on batch b = program_id(1) // H and head h = "
    "program_id(1) % H; each (b, h) matrix starts b * stride_b + h * stride_h elements into q, k, "
    "v and out (lse's row is b * H + h). Without b * stride_b every batch reads batch 0.",
    None,
)
HEAD_OFFSET = Mistake(
    "head-offset-missing",
    "head 0 of each batch is right and the other heads are not: the head offset h * stride_h is "
    "missing (or h is taken wrong from program_id(1))",
    BATCH_OFFSET.explanation,
    None,
)
EMPTY_KEYS = Mistake(
    "empty-keys",
    "N_k = 0 gives NaN: the kernel divides 0 by 0",
    "With no key, l_i stays 0 and acc / l_i is 0 / 0. The sum over no key is empty: out = 0 and "
    "lse = log(0) = -inf. Answer N_k == 0 in the launcher (out.zero_(), lse.fill_(-inf)) before "
    "launching, or divide by tl.where(l_i > 0, l_i, 1.0) in the kernel.",
    None,
)
_TILES = [(bm, bn) for bm in (32, 64, 16, 128) for bn in (16, 32, 64, 128)]


def _forward_diagnose(
    which, yours, args, expected, mistakes, tol, match_tol, rows, other, source, tiles=None
):
    """The mistake whose replay matches output `which` (0: out, 1: lse); ties go to the replay
    whose other output is nearest the learner's (`other`), then to what `source` shows.

    tiles: (BLOCK_M, BLOCK_N) of the learner's launch when the harness saw it: each mistake is
    replayed with those tiles only (the computation the kernel did), not with all 16 pairs of
    _TILES, which on a GPU's cases took 30 s and more for an answer no replay matched."""
    shapes = [tuple(tiles)] if tiles else _TILES

    def replays():
        for mistake in mistakes:
            q, k, v, causal, scale = args
            for bm, bn in shapes:
                for empty in ("nan", "zero"):
                    both = mistake.fn(q, k, v, causal, scale, bm, bn, empty=empty)
                    theirs = both[which][:, :, rows]
                    if _error(theirs, expected) > tol:  # right on this case: not what went wrong
                        yield mistake, theirs, both[1 - which][:, :, rows]

    return _nearest_mistake(yours, replays(), match_tol, source=source, second=other)


def _offsets_diagnose(yours, expected, tol) -> Mistake | None:
    """BATCH_OFFSET or HEAD_OFFSET when out is right for batch 0 (head 0) and wrong for a later
    one; yours, expected: (B, H, N_q, d)."""
    right = np.array([[_error(yours[b, h], expected[b, h]) <= tol for h in range(yours.shape[1])]
                      for b in range(yours.shape[0])])  # fmt: skip
    if right.all() or not right[0, 0]:
        return None
    if right[0].all():
        return BATCH_OFFSET
    if right[:, 0].all():
        return HEAD_OFFSET
    return None


class _TorchAttentionMath:
    """While open, records the torch functions of attention math called on tensors (SDPA,
    softmax, matmul...): a launcher that calls them computes without its kernel."""

    NAMES = frozenset({"scaled_dot_product_attention", "softmax", "log_softmax", "matmul",
                       "__matmul__", "__rmatmul__", "bmm", "baddbmm", "einsum", "exp"})  # fmt: skip

    def __init__(self):
        from torch.overrides import TorchFunctionMode

        seen = self.seen = []

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in _TorchAttentionMath.NAMES:
                    seen.append(func.__name__)
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _computes_with_torch(name, attention_fwd, launch_args) -> bool:
    """Whether the learner's attention_fwd, run once more on the case, calls torch's attention
    math; False where this process cannot see (a grader's handle on a notebook's kernel)."""
    from course_utils.harness.triton_puzzles import run_attention_fwd

    if hasattr(attention_fwd, "bound_into"):
        return False
    try:
        with _TorchAttentionMath() as watch:
            _launch(name, attention_fwd, run_attention_fwd, *launch_args)
    except Exception:  # the diagnosis only: the first run's failure stands
        return False
    return bool(watch.seen)


def _forward_failure(name, stages, case, what, yours, expected, err, tol, mistake) -> str:
    lines = [_stage_line(name, stages, case.stage), f"  case: {case.label}",
             f"  input: {case.describe()}"]  # fmt: skip
    focus = _STAGE_FOCUS[case.stage]
    return "\n".join(lines + mismatch_lines(what, yours, expected, err, tol, mistake, focus))


def _shape_failure(name, stages, case, out, lse, dtype) -> str | None:
    want_out = (case.batch, case.heads, case.n_q, case.d)
    want_lse = want_out[:3]
    problems = []
    if tuple(out.shape) != want_out:
        problems.append(f"out has shape {tuple(out.shape)}, expected {want_out}")
    elif str(out.dtype) != f"torch.{dtype}":
        problems.append(f"out is {out.dtype}, expected q's dtype torch.{dtype}")
    if tuple(lse.shape) != want_lse:
        problems.append(f"lse has shape {tuple(lse.shape)}, expected (batch, heads, N_q) = "
                        f"{want_lse}")  # fmt: skip
    elif str(lse.dtype) != "torch.float32":
        problems.append(f"lse is {lse.dtype}, expected torch.float32")
    if not problems:
        return None
    return "\n".join(
        [_stage_line(name, stages, case.stage), f"  case: {case.label}",
         f"  input: {case.describe()}", *(f"  {p}" for p in problems)]
    )  # fmt: skip


def _bf16_diagnose(name, attention_fwd, launch_args, expected, tols) -> Mistake | None:
    """BF16_IN_INTERPRETER when the learner's attention_fwd is right on the same bfloat16 case
    run in float32 (the interpreter computes bfloat16 wrong): the launcher did not upcast."""
    from course_utils.harness.triton_puzzles import run_attention_fwd

    q, k, v, *rest = launch_args
    try:
        out, lse, _ = _launch(
            name, attention_fwd, run_attention_fwd, q.float(), k.float(), v.float(), *rest
        )
    except Exception:  # the diagnosis only: the first run's failure stands
        return None
    right = all(_error(_as_numpy(t), e) <= 1e-5 for t, e in zip((out, lse), expected, strict=True))
    return BF16_IN_INTERPRETER if right else None


def check_attention_fwd(attention_fwd: Callable, seed: int | None = 0, trials: int = 1) -> None:
    """Check the learner's attention_fwd(q, k, v, causal=False, softmax_scale=None) -> (out, lse)
    and the kernel it launches, stage by stage, against float64 attention.

    out: (batch, heads, N_q, d) in q's dtype; lse: (batch, heads, N_q) float32, natural log.
    Causal: query i sees keys 0..i (N_q == N_k). Tolerances, relative in norm: 1e-5 in float32
    and 3e-3 in float16/bfloat16 in the interpreter; 1e-2 on a GPU (tf32 or half precision);
    and lse to 1e-6 on the float32 state's case (STATE_CASE), whose float16 sums are exact in
    float32, so that a running max, sum or accumulator kept in float16 fails.

    Raises:
        NotImplementedError: attention_fwd is still the exercise's stub.
        CheckFailure: the first failing stage, the case, the worst row and the mistake.
    """
    name = "attention_fwd"
    with _nothing_on_stderr():
        launches, on_gpu = _check_attention_fwd(name, attention_fwd, seed, trials)
    where = (
        "float16 and bfloat16 on the GPU" if on_gpu else "float32 and float16 in the interpreter"
    )
    print(
        f"✓ {name}: {launches} calls match float64 attention ({where}; stages: batches and heads, "
        "ragged N, a strided layout, N_q != N_k, d = 16 to 128, causal, no loads above the "
        "diagonal, dtypes, no keys, random shapes, float32 state)" + _forward_rules_line()
    )


def _check_attention_fwd(name, attention_fwd, seed, trials) -> tuple[int, bool]:
    import torch

    from course_utils.harness.triton_puzzles import run_attention_fwd

    on_gpu = _on_gpu()
    device = "cuda" if on_gpu else "cpu"
    cases = _forward_cases(seed, trials, on_gpu)
    stages = list(dict.fromkeys(c.stage for c in cases))
    source = None  # read once, on the first failure
    logged = []  # (case, its loads): the rules are judged once every value is right
    for case in cases:
        (q, k, v), (q64, k64, v64) = _forward_inputs(case, torch, device)
        launch_args = (q, k, v, case.causal, case.scale, case.layout)
        try:
            record = case.stage in _LOGGED_STAGES
            got = _launch(name, attention_fwd, run_attention_fwd, *launch_args, record)
        except _LearnerRaised as err:
            failure = _raised_failure(name, case, err.exc)
            raise CheckFailure(
                _stage_line(name, stages, case.stage) + "\n" + str(failure) + _dtype_hint(err.exc)
            ) from None
        out_t, lse_t, loads = got
        shape_problem = _shape_failure(name, stages, case, out_t, lse_t, case.dtype)
        if shape_problem:
            raise CheckFailure(shape_problem)
        yours = (_as_numpy(out_t), _as_numpy(lse_t))
        expected = _forward_expected(case, q64, k64, v64)
        rows = slice(None) if case.poison_from is None else slice(0, case.poison_from)
        if on_gpu:
            tol = 1e-2
        else:
            tol = 1e-5 if case.dtype == "float32" else 3e-3
        tols = (tol, STATE_LSE_TOL if case.exact else tol)
        match_tol = 1e-3 if case.dtype == "float32" and not on_gpu else 5e-2
        args = (q64, k64, v64, case.causal, case.scale)
        for which, what, mistakes in (
            (0, "out", FORWARD_MISTAKES),
            (1, "lse", FORWARD_LSE_MISTAKES),
        ):
            y, e = yours[which][:, :, rows], expected[which][:, :, rows]
            err, tol = _error(y, e), tols[which]
            if err <= tol:
                continue
            mistake = None
            if source is None:
                source = _learner_source(attention_fwd)
            if case.n_k == 0:
                mistake = EMPTY_KEYS if np.isnan(y).any() else None
            elif case.poison_from is not None and np.isnan(y).any():
                torch_math = _computes_with_torch(name, attention_fwd, launch_args)
                mistake = LAUNCHER_SKIPS_KERNEL if torch_math else LOADS_ABOVE_DIAGONAL
            elif case.dtype == "bfloat16" and not on_gpu:
                mistake = _bf16_diagnose(name, attention_fwd, launch_args, expected, tols)
            else:
                other = yours[1 - which][:, :, rows]
                mistake = _forward_diagnose(
                    which, y, args, e, mistakes, tol, match_tol, rows, other, source,
                    loads.get("tiles"),
                )  # fmt: skip
            if mistake is None and which == 0 and case.batch * case.heads > 1:
                mistake = _offsets_diagnose(y, e, tol)
            raise CheckFailure(_forward_failure(name, stages, case, what, y, e, err, tol, mistake))
        logged.append((case, loads))
    for case, loads in logged:
        rule_broken = broken(name, _forward_rules(case), loads, case.describe())
        if rule_broken:
            raise CheckFailure(rule_broken)
    return len(cases), on_gpu


# The stages whose loads are recorded and judged (the load log costs time in the interpreter):
# several heads, ragged N_q and N_k, a strided layout, causal tiles
_LOGGED_STAGES = ("one tile", "batch and heads", "ragged N", "strided layout", "N_q != N_k",
                  "causal")  # fmt: skip
_FORWARD_RULES = (
    "the kernel reads every element of q, k and v, none past N_q or N_k, and k and v once per "
    "program"
)


def _forward_rules_line() -> str:
    """The pass line's words on the rules: the launches are counted on a GPU too."""
    return "; attention_fwd launches attention_fwd_kernel" + _rules_line(_FORWARD_RULES)


def _forward_rules(case: ForwardCase) -> tuple:
    """The load rules of one call: the launcher launches the learner's attention_fwd_kernel; no
    load reads past q's, k's or v's rows (the guard band _laid_out puts after them); one program
    reads each element of k and v once; and on the first stage's cases (contiguous, float32:
    nothing for a launcher to copy) the kernel reads all of q, k and v."""
    c = rule_case(case.label)
    rules = [
        launches_rule(c, "attention_fwd_kernel"),
        inside_rule(c, ("q", "k", "v"), "the query tile and the K/V tiles are loaded masked"),
        *(once_rule(c, n, "each program reads its K/V tiles once") for n in ("k", "v")),
    ]
    if case.stage == "one tile" and case.dtype == "float32" and case.layout == "contiguous":
        rules.append(reads_inputs_rule(c, ("q", "k", "v")))
    if case.n_k == 0:  # nothing to launch for: an empty sum is answered by the launcher
        rules = rules[1:]
    return tuple(rules)
