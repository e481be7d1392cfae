"""Checks for notebook 08, the FlashAttention-2 backward in Triton.

    check_bwd_preprocess(kernel)        D = rowsum(dO * O) by the learner's preprocess kernel
    check_dkdv_kernel(kernel)           dK, dV by the learner's kernel (K/V stationary), given
                                        the check's own float32 lse and D; causal tile skipping
    check_dq_kernel(kernel)             dQ by the learner's kernel (Q stationary)

Exercise 4, the learner's torch.autograd.Function, is checked by function.py, over the cases and
runner of this module; the float64 references and the replays of known mistakes are in
emulation.py, the quick checks in quick.py.

Where things run. Each kernel is launched by course_utils.harness.triton_learner_backward
(run_learner_*), through call_learner: in the learner's kernel when a submission is graded, so
only tensors (and a count of tl.dot) come back. Everything else happens here, in the caller's
process: the float64 references (torch autograd of naive attention) and the float64 replays of
known mistakes (a mistake is named only when its replay matches the learner's output on the
failing case).

Tolerances (relative error, ||yours - expected|| / ||expected||): float32 in Triton's interpreter
1e-4 (the kernels' only error is float32 rounding, about 1e-7); float16 2e-3 in the interpreter;
on a GPU 1e-2 in float16 and 3e-2 in bfloat16 (tl.dot rounds P and dS to the input dtype);
1e-3 on the float32 state's case (STATE_CASE, in the visible and the hidden runs, interpreter and
GPU), which the right kernels get exactly (1e-8) and float16 accumulators miss by 0.1 or more.
Nothing the launches write reaches stderr (see engine.kernels._nothing_on_stderr).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.cases import _stage_header
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.feedback import closest_mistake, mismatch_lines
from course_utils.checks.engine.kernels import _nothing_on_stderr, _raised_failure, _rel_err
from course_utils.checks.engine.watch import _LearnerRaised, call_learner
from course_utils.checks.triton_backward.emulation import (
    DKDV_MISTAKES,
    DQ_MISTAKES,
    NO_CAUSAL_SKIP,
    PREPROCESS_MISTAKES,
    _delta_variant,
    emulate_backward,
    forward64,
)

__all__ = [
    "DKDV_MISTAKES",
    "DQ_MISTAKES",
    "PREPROCESS_MISTAKES",
    "check_bwd_preprocess",
    "check_dkdv_kernel",
    "check_dq_kernel",
]

_RUNNERS = "course_utils.harness.triton_learner_backward"
PREPROCESS_BLOCK_M = 32  # the launcher's rows per program of the preprocess kernel


# ---- cases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BwdCase:
    """One launch: shapes, tiles, dtype, the inputs' seed, and the check's stage."""

    label: str
    stage: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    causal: bool
    block_m: int = 16
    block_n: int = 16
    dtype: str = "float32"
    seed: int = 0
    softmax_scale: float | None = None
    exact: bool = False  # the float32 state's inputs (_exact_inputs)

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.d)

    kernel: str = "grad"  # "grad" (dK/dV or dQ), "preprocess" (D), "function" (exercise 4)

    def describe(self) -> str:
        if self.kernel == "preprocess":  # D = rowsum(dO * O) reads out and dO, writes D
            return (
                f"out and dO ({self.batch}, {self.heads}, {self.n_q}, {self.d}) {self.dtype}, "
                f"D ({self.batch}, {self.heads}, {self.n_q}) float32, BLOCK_M = "
                f"{PREPROCESS_BLOCK_M} rows per program"
            )
        text = (
            f"q ({self.batch}, {self.heads}, {self.n_q}, {self.d}), k and v "
            f"({self.batch}, {self.heads}, {self.n_k}, {self.d}), {self.dtype}, "
            f"causal={self.causal}, softmax_scale = {self.scale:.4g}"
        )
        if self.kernel == "function":  # learner_backward picks the tiles
            return text
        return text + f", BLOCK_M = {self.block_m}, BLOCK_N = {self.block_n}"

    def focus(self) -> str:
        parts = []
        if self.kernel == "preprocess":
            if self.n_q % PREPROCESS_BLOCK_M:
                parts.append("the ragged last tile of rows (rows past seqlen_q masked)")
        elif self.n_q % self.block_m or self.n_k % self.block_n:
            parts.append("the ragged last tiles (rows past seqlen_q or seqlen_k masked)")
        if self.causal:
            parts.append("the causal mask in the diagonal tile")
        if self.d & (self.d - 1):
            parts.append(f"d = {self.d} padded to a power of two (zero columns)")
        if self.batch * self.heads > 1:
            parts.append("the (batch, head) offsets")
        if self.dtype != "float32":
            parts.append(
                f"{self.dtype} inputs (products and sum in float32)" if self.kernel == "preprocess"
                else f"{self.dtype} inputs (P and dS cast to it for tl.dot, sums in float32)"
            )  # fmt: skip
        if not parts:
            parts.append("D on whole tiles" if self.kernel == "preprocess"
                         else "the formulas of the backward on whole tiles")  # fmt: skip
        return "; ".join(parts)


def _on_gpu() -> bool:
    from course_utils.triton_attention import INTERPRETER

    return not INTERPRETER


def _ampere_or_newer() -> bool:
    import torch

    return torch.cuda.get_device_capability()[0] >= 8


# The float32 state's case, float16, 4 tiles a side, whose every product and sum is exact in
# float32 (_exact_inputs): the right kernels are exact (their float16 outputs too), while a dK,
# dV or dQ summed in float16 rounds at every tile a partial sum much larger than the answer.
STATE_CASE = BwdCase(
    "float16, 4 tiles a side, sums much larger than the answer", "float32 state", 1, 2, 64, 64,
    16, False, 16, 16, "float16", seed=21, exact=True,
)  # fmt: skip
STATE_TOL = 1e-3
# The causal case whose tl.dot count (interpreter) is compared with its non-causal twin's: 6 of
# its 9 tile pairs see a key
SKIP_CASE = BwdCase("causal, three tiles a side", "causal", 1, 1, 48, 48, 16, True, seed=4)


def _exact_inputs(case: BwdCase, gen):
    """q, k, v, dO (float32, integers) of the float32 state's case: every score is 0, so P is
    1/N_k (a power of two) and dS = P * (dP - D) holds small integers times P. Head 0 certifies
    dV: every v row the same (dS = 0), dO of +-1000 whose second half cancels the first up to
    +-2 (dV = P * sum dO is small, its running sum is not). Head 1 certifies dK and dQ: q of
    +-1000 in the first half of the dimensions, k of +-1000 in the second (q . k = 0), dO and v
    of -2 .. 2, the second half of the queries (q, -dO) with q off by -2 .. 2, of the keys (k, -v)
    with k off by -2 .. 2, so that dK and dQ are small sums of large terms."""
    import torch

    def ints(lo, hi, *shape):
        return torch.randint(lo, hi + 1, shape, generator=gen).float()

    n, d, h = case.n_q, case.d, case.n_q // 2
    half_d = d // 2
    q, k, v, do = (torch.zeros(1, 2, n, d) for _ in range(4))
    v[0, 0] = ints(-2, 2, d)  # one row for every key
    do[0, 0, :h] = ints(-1000, 1000, h, d)
    do[0, 0, h:] = -do[0, 0, :h] + ints(-2, 2, h, d)
    q[0, 1, :h, :half_d] = ints(-1000, 1000, h, half_d)
    q[0, 1, h:, :half_d] = q[0, 1, :h, :half_d] + ints(-2, 2, h, half_d)
    do[0, 1, :h] = ints(-2, 2, h, d)
    do[0, 1, h:] = -do[0, 1, :h]
    k[0, 1, :h, half_d:] = ints(-1000, 1000, h, d - half_d)
    k[0, 1, h:, half_d:] = k[0, 1, :h, half_d:] + ints(-2, 2, h, d - half_d)
    v[0, 1, :h] = ints(-2, 2, h, d)
    v[0, 1, h:] = -v[0, 1, :h]
    return q, k, v, do


def _kernel_cases(seed, trials: int, fixed: bool = True) -> list[BwdCase]:
    """The fixed cases, stage by stage (unless fixed=False), then `trials` random ones."""
    if _on_gpu():
        cases = [
            BwdCase("one tile", "one tile", 1, 1, 64, 64, 64, False, 64, 64, "float16", 1),
            BwdCase("ragged lengths, N_q != N_k", "ragged lengths", 2, 2, 130, 200, 64, False,
                    64, 64, "float16", 2),
            BwdCase("causal, N = 333", "causal", 2, 3, 333, 333, 64, True, 64, 64, "float16", 3),
            BwdCase("d = 80 padded, bfloat16", "d padded", 1, 2, 257, 513, 80, False, 64, 64,
                    "bfloat16", 4),
            BwdCase("d = 128, causal, bfloat16", "d padded", 2, 2, 513, 513, 128, True, 64, 32,
                    "bfloat16", 5),
        ]  # fmt: skip
        if not _ampere_or_newer():
            cases = [dataclasses.replace(c, dtype="float16", block_m=32, block_n=32) for c in cases]
    else:
        cases = [
            BwdCase("one tile", "one tile", 1, 1, 16, 16, 16, False, seed=1),
            BwdCase("several tiles and heads", "several tiles", 1, 2, 32, 48, 16, False, seed=2),
            BwdCase("ragged lengths: N_q = 37, N_k = 29", "ragged lengths", 1, 2, 37, 29, 16,
                    False, seed=3),
            SKIP_CASE,
            BwdCase("causal, ragged N = 37, BLOCK_M != BLOCK_N", "causal", 1, 1, 37, 37, 16, True,
                    16, 32, seed=5),
            BwdCase("d = 24 padded to 32, softmax_scale = 0.3", "d padded", 1, 1, 20, 20, 24,
                    True, seed=6, softmax_scale=0.3),
            BwdCase("float16", "float16", 1, 1, 33, 33, 32, False, dtype="float16", seed=7),
        ]  # fmt: skip
    if not fixed:
        cases = []
    cases.append(STATE_CASE)  # in the hidden run too (fixed=False), on the GPU too
    rng = np.random.default_rng(seed)
    for t in range(trials):
        causal = bool(rng.integers(2))
        if _on_gpu():
            n_q, d, blocks, dtype = int(rng.integers(1, 700)), int(rng.choice([64, 128])), 64, \
                "float16"  # fmt: skip
            n_k = n_q if causal or rng.random() < 0.5 else int(rng.integers(1, 2 * n_q + 8))
            batch, heads = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        else:  # at most 3 x 4 tile pairs of 16 and 2 heads: each launch well under a second
            n_q, d, blocks, dtype = int(rng.integers(1, 41)), int(rng.choice([16, 24])), 16, \
                "float32"  # fmt: skip
            n_k = n_q if causal or rng.random() < 0.5 else int(rng.integers(1, n_q + 25))
            batch, heads = ((1, 1), (1, 2), (2, 1))[int(rng.integers(3))]
        cases.append(
            BwdCase(f"random case {t + 1}", "random", batch, heads, n_q, n_k, d, causal, blocks,
                    blocks, dtype, int(rng.integers(2**31)))
        )  # fmt: skip
    return cases


def _grad_err(yours: np.ndarray, expected: np.ndarray) -> float:
    """_rel_err with a floor under ||expected||: 0.01 per entry. A gradient that is 0 in exact
    arithmetic (one key: every P is 1 and dS = dP - D = 0) is float32 rounding noise in both the
    kernel and the float64 replay of its float32 inputs, and must not count as 100% wrong."""
    if yours.shape != expected.shape or not np.isfinite(yours).all():
        return math.inf
    floor = 1e-2 * math.sqrt(max(expected.size, 1))
    return float(np.linalg.norm(yours - expected) / max(np.linalg.norm(expected), floor))


def _tolerance(dtype: str) -> float:
    if _on_gpu():
        return {"float16": 1e-2, "bfloat16": 3e-2}.get(dtype, 1e-2)
    return {"float32": 1e-4, "float16": 2e-3}.get(dtype, 2e-2)


def _match_tolerance(dtype: str) -> float:
    return 1e-3 if dtype == "float32" and not _on_gpu() else 5e-2


def _inputs(case: BwdCase):
    """q, k, v, dO as CPU tensors of the case's dtype, their float64 copies, and float64
    lse and D (and float32 copies, what the kernels are given)."""
    import torch

    gen = torch.Generator().manual_seed(case.seed)
    shape_q = (case.batch, case.heads, case.n_q, case.d)
    shape_k = (case.batch, case.heads, case.n_k, case.d)
    q = 1.5 * torch.randn(shape_q, generator=gen)
    k, v = torch.randn(shape_k, generator=gen), torch.randn(shape_k, generator=gen)
    do = torch.randn(shape_q, generator=gen)
    if case.exact:
        q, k, v, do = _exact_inputs(case, gen)
    dtype = getattr(torch, case.dtype)
    tensors = tuple(t.to(dtype) for t in (q, k, v, do))
    q64, k64, v64, do64 = (t.double().numpy() for t in tensors)
    out64, lse64 = forward64(q64, k64, v64, case.causal, case.scale)
    delta64 = (out64 * do64).sum(axis=-1)
    lse32, delta32 = (torch.from_numpy(x).float() for x in (lse64, delta64))
    as64 = (q64, k64, v64, do64, out64, lse32.double().numpy(), delta32.double().numpy())
    return tensors, (lse32, delta32), as64


def _runner(kernel, run_name: str):
    """The course runner `run_name` with the learner's kernel bound, wherever the kernel lives."""
    if hasattr(kernel, "bound_into"):  # the grader's handle on the notebook kernel's function
        return kernel.bound_into(f"{_RUNNERS}:{run_name}")

    def launch(*args):
        from course_utils.harness import triton_learner_backward as learner_backward

        return getattr(learner_backward, run_name)(kernel, *args)

    return launch


# What the notebook gives the learner's kernels to call
GIVEN = ("load_tile", "store_tile")


# The casts that give tl.dot one dtype, kernel by kernel (the hint of a "same dtype" error)
DOT_HINTS = {
    "bwd_dkdv_kernel": "p_t and ds_t are float32, do and q the inputs' dtype: "
    "tl.dot(p_t.to(do.dtype), do) and tl.dot(ds_t.to(q.dtype), q).",
    "bwd_dq_kernel": "ds is float32 and k the input's dtype: tl.dot(ds.to(k.dtype), k).",
    "FlashAttentionTriton": "P and dS are float32: cast them to the inputs' dtype before "
    "tl.dot: p_t.to(do.dtype), ds_t.to(q.dtype) (dK/dV kernel), ds.to(k.dtype) (dQ kernel).",
}


def _call(name, runner, case, *args, allow):
    """call_learner, with the learner's compile or run errors turned into a CheckFailure."""
    try:
        return call_learner(runner, *args, name=name, allow=("launch", *GIVEN, *allow))
    except NotImplementedError:
        raise
    except _LearnerRaised as err:
        if isinstance(err.exc, TypeError) and "@triton.jit" in str(err.exc):
            raise CheckFailure(f"✗ {name}: {err.exc}") from None
        raise _raised_failure(name, case, err.exc, DOT_HINTS.get(name)) from None


def _failure(name, case, what, yours, expected, err, tol, mistake, stages) -> CheckFailure:
    rows = ("batch", "head", "query" if what in ("dq", "D") else "key")
    nan_note = " (the launcher fills the outputs with NaN: an element never stored shows up as NaN)"
    lines = [f"✗ {name} is wrong on {case.label}.", f"  input:    {case.describe()}"]
    lines += mismatch_lines(
        what, yours, expected, err, tol, mistake, case.focus(), rows=rows, nan_note=nan_note
    )
    text = "\n".join(lines)
    if stages and case.stage in stages:
        text = _stage_header(name, stages, case.stage) + text
    return CheckFailure(text)


def _stages(cases) -> list[str]:
    seen: list[str] = []
    for c in cases:
        if c.stage not in seen:
            seen.append(c.stage)
    return seen


def _diagnose(yours: tuple, args: tuple, expected: tuple, mistakes, pick, tol, match_tol):
    """The mistake whose replay is nearest yours on every compared output (and differs from
    right), or None."""

    def replays():
        for mistake in mistakes:
            theirs = pick(mistake.fn(*args))
            if not all(_rel_err(t, e) < tol for t, e in zip(theirs, expected, strict=True)):
                yield mistake, theirs

    return closest_mistake(yours, replays(), match_tol)


# ---- exercise 1: D ------------------------------------------------------------------------------
def _preprocess_cases(seed, trials: int, fixed: bool = True) -> list[BwdCase]:
    """D's cases, stage by stage (unless fixed=False), then a half-precision case (in the hidden
    run too: D summed in half precision shows only there), then `trials` random ones."""
    row = dict(kernel="preprocess")
    if _on_gpu():
        cases = [
            BwdCase("one tile of rows", "one tile", 1, 1, 32, 32, 64, False, dtype="float16",
                    seed=1),
            BwdCase("ragged rows, several heads", "ragged rows", 2, 3, 333, 333, 64, False,
                    dtype="float16", seed=3),
            BwdCase("d = 80 padded", "d padded", 1, 2, 257, 257, 80, False, dtype="float16",
                    seed=4),
        ]  # fmt: skip
        half = BwdCase("bfloat16, d = 128", "half precision", 2, 2, 513, 513, 128, False,
                       dtype="bfloat16" if _ampere_or_newer() else "float16", seed=5)  # fmt: skip
    else:
        cases = [
            BwdCase("one tile of rows", "one tile", 1, 1, 32, 32, 16, False, seed=1),
            BwdCase("ragged rows: N_q = 37", "ragged rows", 1, 1, 37, 37, 16, False, seed=3),
            BwdCase("several heads", "several heads", 2, 2, 40, 40, 16, False, seed=2),
            BwdCase("d = 24 padded to 32", "d padded", 1, 1, 20, 20, 24, False, seed=6),
        ]  # fmt: skip
        half = BwdCase(
            "float16", "half precision", 1, 1, 33, 33, 32, False, dtype="float16", seed=7
        )
    cases = [dataclasses.replace(c, **row) for c in cases] if fixed else []
    cases.append(dataclasses.replace(half, **row))
    randoms = [c for c in _kernel_cases(seed, trials, fixed=False) if not c.exact]
    return cases + [dataclasses.replace(c, n_k=c.n_q, causal=False, **row) for c in randoms]


def check_bwd_preprocess(
    kernel: Callable, seed: int | None = 0, trials: int = 1, fixed: bool = True
) -> None:
    """Check bwd_preprocess_kernel: D (B, H, N_q) float32 = rowsum(dO * O), against float64.

    fixed=False runs only the half-precision case and the `trials` random cases (the hidden
    tests, after the fixed ones)."""
    import torch

    name = "bwd_preprocess_kernel"
    with _nothing_on_stderr():
        cases = _preprocess_cases(seed, trials, fixed)
        runner = _runner(kernel, "run_learner_preprocess")
        stages = _stages(cases)
        for case in cases:
            (q, _, _, do), _, (_, _, _, do64, out64, _, _) = _inputs(case)
            out = torch.from_numpy(out64).to(q.dtype)  # the forward's out, in the input dtype
            out64 = out.double().numpy()
            delta = _call(name, runner, case, out, do, allow=("run_learner_preprocess",))
            yours = delta.double().numpy()
            expected = _delta_variant(out64, do64)[0]
            tol = 1e-4 if _on_gpu() else 1e-5  # float32 sums of exact products, any input dtype
            err = _rel_err(yours, expected)
            if err < tol:
                continue
            mistake = _diagnose(
                (yours,), (out64, do64), (expected,), PREPROCESS_MISTAKES, lambda r: r, tol,
                _match_tolerance(case.dtype),
            )  # fmt: skip
            raise _failure(name, case, "D", yours, expected, err, tol, mistake, stages)
    print(f"✓ {name}: {len(cases)} launches match float64 rowsum(dO * O) ({_where(cases)})")


def _where(cases) -> str:
    """The dtypes the cases ran in, and where: "float32 and float16, interpreter"."""
    dtypes = " and ".join(dict.fromkeys(c.dtype for c in cases))
    return f"{dtypes}, {'GPU' if _on_gpu() else 'interpreter'}"


# ---- exercises 2 and 3: dK/dV and dQ ------------------------------------------------------------
def _check_grad_kernel(name, kernel, run_name, outputs, mistakes, seed, trials, fixed) -> str:
    cases = _kernel_cases(seed, trials, fixed)
    runner = _runner(kernel, run_name)
    stages = _stages(cases)
    index = {"dq": 0, "dk": 1, "dv": 2}
    pick = lambda grads: tuple(grads[index[o]] for o in outputs)  # noqa: E731
    dots = {}  # case -> the launch's tl.dot count (None on a GPU)
    for case in cases:
        (q, k, v, do), (lse, delta), (q64, k64, v64, do64, _, lse64, delta64) = _inputs(case)
        result = _call(
            name, runner, case, q, k, v, do, lse, delta, case.causal, case.scale, case.block_m,
            case.block_n, allow=(run_name,),
        )  # fmt: skip
        yours = tuple(r.double().numpy() for r in result[: len(outputs)])
        dots[case] = result[-1]
        args = (q64, k64, v64, do64, lse64, delta64, case.causal, case.scale, case.block_m,
                case.block_n)  # fmt: skip
        expected = pick(emulate_backward(*args))
        tol = STATE_TOL if case.exact else _tolerance(case.dtype)
        errs = [_grad_err(y, e) for y, e in zip(yours, expected, strict=True)]
        if all(e < tol for e in errs):
            continue
        mistake = _diagnose(
            yours, args, expected, mistakes, pick, tol, _match_tolerance(case.dtype)
        )
        worst = int(np.argmax([e if math.isfinite(e) else np.inf for e in errs]))
        raise _failure(
            name, case, outputs[worst], yours[worst], expected[worst], errs[worst], tol, mistake,
            stages,
        )  # fmt: skip
    skip = _causal_skip_rule(name, runner, run_name, dots.get(SKIP_CASE)) if fixed else ""
    return (
        f"{len(cases)} launches match float64 ({_where(cases)}; ragged N, N_q != N_k, causal, "
        f"d padded, several heads, float32 state){skip}"
    )


def _causal_skip_rule(name, runner, run_name, causal_count) -> str:
    """The causal launch (SKIP_CASE, already run and right: causal_count, its tl.dot count) must
    run clearly fewer tl.dot than the same launch without the mask (launched here)."""
    if _on_gpu():  # the interpreter counts the products; a compiled kernel's cannot be counted
        return "; causal tile skipping is counted in the interpreter only, not on a GPU"
    case = SKIP_CASE
    (q, k, v, do), (lse, delta), _ = _inputs(dataclasses.replace(case, causal=False))
    result = _call(
        name, runner, case, q, k, v, do, lse, delta, False, case.scale, case.block_m,
        case.block_n, allow=(run_name,),
    )  # fmt: skip
    counts = (causal_count, result[-1])
    if counts[0] is None or counts[1] is None:
        return ""
    tiles = case.n_q // case.block_m  # tiles a side (block_m == block_n)
    if counts[0] > 0.75 * counts[1]:
        m = NO_CAUSAL_SKIP
        raise CheckFailure(
            f"✗ {name}: every value is right, but the causal launch does not skip work.\n"
            f"  input:    {case.describe()}\n"
            f"  yours:    {counts[0]} tl.dot with causal=True, {counts[1]} without\n"
            f"  expected: at most 75% of the non-causal count ({tiles * (tiles + 1) // 2} of "
            f"the {tiles * tiles} tile pairs see a key)\n"
            f"  likely mistake: {m.title} [misconception: {m.slug}]\n  {m.explanation}"
        )
    return f"; causal runs {counts[0]} tl.dot against {counts[1]}: the tiles above are skipped"


def check_dkdv_kernel(
    kernel: Callable, seed: int | None = 0, trials: int = 1, fixed: bool = True
) -> None:
    """Check bwd_dkdv_kernel: dK and dV given float32 lse and D, and its causal tile skipping."""
    name = "bwd_dkdv_kernel"
    with _nothing_on_stderr():
        what = _check_grad_kernel(
            name, kernel, "run_learner_dkdv", ("dk", "dv"), DKDV_MISTAKES, seed, trials, fixed
        )
    print(f"✓ {name}: {what}")


def check_dq_kernel(
    kernel: Callable, seed: int | None = 0, trials: int = 1, fixed: bool = True
) -> None:
    """Check bwd_dq_kernel: dQ given float32 lse and D, and its causal tile skipping."""
    name = "bwd_dq_kernel"
    with _nothing_on_stderr():
        what = _check_grad_kernel(
            name, kernel, "run_learner_dq", ("dq",), DQ_MISTAKES, seed, trials, fixed
        )
    print(f"✓ {name}: {what}")
