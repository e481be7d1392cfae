"""Checks for notebook 06's Triton exercises: four puzzles, then the whole forward kernel.

    check_scale_tile(kernel)         puzzle 1: y = alpha * x on a ragged 2-D matrix, masked tiles
    check_softmax_rows(kernel)       puzzle 2: a numerically stable softmax, one program per row
    check_matmul(kernel)             puzzle 3: c = a @ b, float16 in, float32 accumulated, ragged
    check_row_block(kernel)          puzzle 4: one query tile's online softmax over K/V tiles
    check_attention_fwd(fn)          the learner's kernel and launcher attention_fwd(q, k, v,
                                     causal=False, softmax_scale=None) -> (out, lse)

Each check launches the learner's kernel through a runner of course_utils.triton_attention.
puzzles (in the notebook's kernel when a submission is graded; only tensors travel back) on
fresh inputs, ragged ones included, and compares with a reference. The puzzles' inputs sit in
larger buffers whose spare cells hold a known number and whose output starts as NaN, so a write
outside the matrix shows, and a read outside it has a known value: a mistake is named only when
its emulation, the learner's kernel with that one bug replayed in NumPy, gives the learner's
output. The forward check runs in stages (FORWARD_STAGES: one tile, batches and heads, ragged N,
a strided layout, N_q != N_k, head dims, causal, the causal loop's bound, dtypes, no keys, random
shapes, the float32 state) and names the first failing stage. Two mistakes whose replays give the
same numbers (tl.exp, and log2(e) folded twice) are told apart by the other output (lse), then by
the learner's source.

Some rules of the notebook leave the output right when they are broken: a load of a cell past the
matrix whose value only reaches cells never stored, K read twice, a launcher that computes with
torch. Once a case's values are right, its loads are judged (triton_loads: the runners record,
in the interpreter, which elements of each input every program loads), and the forward check
counts the launches of the learner's attention_fwd_kernel (on a GPU too). On a GPU the load
rules are not checked, and the pass line says so.

Causal attention here is the course's: query i sees keys 0..i, and causal needs N_q == N_k (the
references of course_utils and the course's kernels refuse the rest).

Without a GPU the kernels run in Triton's interpreter on small float32 (and float16) inputs;
on a GPU they are compiled and the forward check uses float16 and bfloat16.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._core import (
    CheckFailure,
    Mistake,
    _LearnerRaised,
    _norm_distance,
    call_learner,
    describe,
    matches_in_norm,
    mismatch_lines,
    worst_row,
)
from .triton_kernel import (
    HALF_STATE_EXPLANATION,
    HALF_STATE_TITLE,
    KERNEL_LSE_MISTAKES,
    KERNEL_OUT_MISTAKES,
    LN2,
    LOG2E,
    _ampere_or_newer,
    _nothing_on_stderr,
    _raised_failure,
    _reference_attention,
    emulate_kernel,
)
from .triton_loads import (
    broken,
    inside_rule,
    launches_rule,
    once_rule,
    reads_inputs_rule,
    rule_case,
)

__all__ = [
    "FORWARD_MISTAKES",
    "MATMUL_MISTAKES",
    "ROW_BLOCK_MISTAKES",
    "SCALE_TILE_MISTAKES",
    "SOFTMAX_ROWS_MISTAKES",
    "check_attention_fwd",
    "check_matmul",
    "check_row_block",
    "check_scale_tile",
    "check_softmax_rows",
]

DOT_DTYPE = Mistake(
    "dot-dtype-mismatch",
    "tl.dot gets a float32 p and a float16 (or bfloat16) v",
    "tl.dot needs two operands of one dtype. p is float32 (it comes from exp2 of float32 "
    "scores) and v has the input's dtype: cast p first, tl.dot(p.to(v.dtype), v). The "
    "accumulator stays float32.",
    None,
)
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


def _on_gpu() -> bool:
    from ..triton_attention import INTERPRETER

    return not INTERPRETER


# What the notebook gives the learner to call (the launcher's input checks)
GIVEN = ("check_attention_inputs",)


def _learner_fn(fn, run):
    """run with the learner's fn bound as first argument, wherever fn lives."""
    if hasattr(fn, "bound_into"):  # a grader's handle on the notebook kernel's function
        return fn.bound_into(f"{run.__module__}:{run.__name__}")
    return functools.partial(run, fn)


def _launch(name, fn, run, *args):
    """call_learner on the runner; the learner's errors become CheckFailures."""
    runner = _learner_fn(fn, run)
    try:
        return call_learner(runner, *args, name=name, allow=(run.__name__, "partial", *GIVEN))
    except NotImplementedError:
        raise
    except _LearnerRaised as err:
        if isinstance(err.exc, TypeError) and "@triton.jit" in str(err.exc):
            raise CheckFailure(f"✗ {name}: {err.exc}") from None
        raise _LearnerRaised(err.exc) from None


def _as_numpy(t) -> np.ndarray:
    return t.double().cpu().numpy()


def _error(yours: np.ndarray, expected: np.ndarray) -> float:
    """Relative error in norm; inf when the shapes differ, when yours has a NaN, or when the
    infinities (and the NaN a buffer keeps where nothing is written) are not in the same places."""
    if yours.shape != expected.shape:
        return math.inf
    special_y, special_e = ~np.isfinite(yours), ~np.isfinite(expected)
    if (special_y != special_e).any():
        return math.inf
    if not np.array_equal(yours[special_y], expected[special_e], equal_nan=True):
        return math.inf
    y, e = yours[~special_y], expected[~special_e]
    if y.size == 0:
        return 0.0
    return float(np.linalg.norm(y - e) / max(np.linalg.norm(e), 1e-30))


# ---- the puzzles' common machinery --------------------------------------------------------------
@dataclass(frozen=True)
class PuzzleCase:
    """One launch of a puzzle: what it is, its stage, its inputs and what it exercises."""

    label: str
    stage: str
    params: dict
    focus: str


@dataclass(frozen=True)
class Puzzle:
    """A puzzle: how to make a case's inputs, launch, compute the expected output buffer, and
    the mistakes (each an emulation of the buffer the kernel with that bug writes)."""

    name: str
    run: Callable  # the runner of course_utils.triton_attention.puzzles
    inputs: Callable  # (case, torch, device) -> (runner args after the kernel, numpy inputs)
    expected: Callable  # (case, numpy inputs) -> the expected output buffer
    mistakes: list  # Mistakes whose fn(case, numpy inputs) gives the buggy buffer
    tolerance: Callable  # (case, on_gpu) -> (tolerance, match tolerance)
    where: str  # how the buffer is described in a failure ("y_buf[r, c]")
    summary: str
    rules: Callable = lambda case: ()  # (case) -> the triton_loads Rules its loads must keep
    rules_summary: str = ""  # the rules, for the pass line


def _stage_line(name: str, stages: list[str], failed: str) -> str:
    k = stages.index(failed)
    passed = "; ".join(f"stage {i + 1} ({s}) passes" for i, s in enumerate(stages[:k]))
    line = f"✗ {name}: stage {k + 1} of {len(stages)} ({failed}) fails"
    return line + (f"; {passed}." if passed else ".")


def _run_puzzle(puzzle: Puzzle, kernel, cases: list[PuzzleCase]) -> int:
    import torch

    on_gpu = _on_gpu()
    device = "cuda" if on_gpu else "cpu"
    stages = list(dict.fromkeys(c.stage for c in cases))
    logged = []  # (case, its loads): the rules are judged once every value is right
    for case in cases:
        args, arrays = puzzle.inputs(case, torch, device)
        try:
            got, loads = _launch(puzzle.name, kernel, puzzle.run, *args)
        except _LearnerRaised as err:
            failure = _raised_failure(puzzle.name, _Described(case), err.exc)
            raise CheckFailure(
                _stage_line(puzzle.name, stages, case.stage)
                + "\n"
                + str(failure)
                + _dtype_hint(err.exc)
            ) from None
        yours = _as_numpy(got)
        expected = puzzle.expected(case, arrays)
        tol, match_tol = puzzle.tolerance(case, on_gpu)
        err = _error(yours, expected)
        if err <= tol:
            logged.append((case, loads))
            continue
        replays = (
            (m, theirs)
            for m in puzzle.mistakes
            for theirs in [m.fn(case, arrays)]
            if _error(theirs, expected) > tol  # harmless here: cannot be what went wrong
        )
        mistake = _nearest_mistake(yours, replays, match_tol, source=_learner_source(kernel))
        raise CheckFailure(
            _stage_line(puzzle.name, stages, case.stage)
            + "\n"
            + _puzzle_failure(puzzle, case, yours, expected, err, tol, mistake)
        )
    for case, loads in logged:
        rule_broken = broken(puzzle.name, puzzle.rules(case), loads, _Described(case).describe())
        if rule_broken:
            raise CheckFailure(rule_broken)
    return len(cases)


# What a learner's source shows when two mistakes' replays give the same numbers: exp(x) is
# exp2(x * log2(e)), so tl.exp on base-2 scores and log2(e) folded twice into the scale compute
# one thing; the source says which was written.
_SOURCE_EVIDENCE = {
    "exp-vs-exp2": lambda src: bool(re.search(r"\btl\.(math\.)?exp\(", src)),
    "scale-folded-twice": lambda src: "exp2" in src,
    "exp2-without-log2e": lambda src: "exp2" in src,
}


def _learner_source(fn) -> str:
    """The source of the learner's kernel (or launcher, and the kernels its code names), as far
    as this process can read it; "" for a grader's handle on a notebook's kernel."""
    found = []

    def read(obj):
        target = getattr(obj, "fn", obj)
        try:
            found.append(inspect.getsource(target))
        except (OSError, TypeError):
            pass

    if hasattr(fn, "bound_into"):
        return ""
    read(fn)
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        obj = names.get(name)
        if obj is not fn and callable(getattr(obj, "fn", None)):  # a @triton.jit kernel
            read(obj)
    return "\n".join(found)


def _nearest_mistake(yours, replays, tol, *, source="", second=None):
    """Of the mistakes whose replay matches yours (matches_in_norm within tol), the nearest.

    replays: (mistake, theirs) pairs, or (mistake, theirs, their second output) when `second`
    (the learner's other output, lse for out) is given. Replays within twice the nearest
    distance are a tie (two mistakes can compute the same numbers); a tie goes to the replay
    whose second output is nearest the learner's, then to the mistake the learner's source shows
    (_SOURCE_EVIDENCE), then to the first listed. None when no replay matches.
    """
    matched = {}
    for mistake, theirs, *other in replays:
        if not matches_in_norm(yours, theirs, tol):
            continue
        d1 = _norm_distance(yours, theirs)
        d2 = _norm_distance(second, other[0]) if second is not None and other else 0.0
        key = id(mistake)
        if key not in matched or (d1, d2) < matched[key][1:]:
            matched[key] = (mistake, d1, d2)
    if not matched:
        return None
    found = list(matched.values())
    nearest = min(d1 for _, d1, _ in found)
    found = [f for f in found if f[1] <= 2 * nearest + 1e-9]
    nearest2 = min(d2 for _, _, d2 in found)
    found = [f for f in found if f[2] <= 2 * nearest2 + 1e-9]
    shown = [f for f in found if _SOURCE_EVIDENCE.get(f[0].slug, lambda _: False)(source)]
    unshown = [f for f in found if f[0].slug in _SOURCE_EVIDENCE and f not in shown]
    if shown and unshown:
        found = shown
    return found[0][0]


class _Described:
    """What _raised_failure needs of a case: a label and a describe()."""

    def __init__(self, case):
        self.label = case.label
        self._case = case

    def describe(self) -> str:
        return ", ".join(f"{k} = {v}" for k, v in self._case.params.items() if k != "seed")


def _dtype_hint(exc) -> str:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(str(exc))
        exc = exc.__cause__
    if any("same dtype" in text for text in chain):
        return (
            f"\n  likely mistake: {DOT_DTYPE.title} [misconception: {DOT_DTYPE.slug}]\n"
            f"  {DOT_DTYPE.explanation}"
        )
    return ""


def _puzzle_failure(puzzle, case, yours, expected, err, tol, mistake) -> str:
    at = worst_row(yours, expected, lead=expected.ndim)
    where = puzzle.where.format(*at)
    inside = np.isfinite(expected[at])
    err_text = "NaN, inf or a write outside the matrix" if not math.isfinite(err) else f"{err:.2e}"
    lines = [
        f"  case: {case.label}",
        f"  input: {_Described(case).describe()}",
        f"  relative error: {err_text} (tolerance {tol:.0e}); the worst cell is {where}"
        + ("" if inside else ", outside the matrix (the output buffer starts as NaN there)"),
        f"  yours:    {describe(yours[at], 6)}",
        f"  expected: {describe(expected[at], 6)}",
    ]
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        written_outside = np.isnan(expected) & ~np.isnan(yours)
        if written_outside.any():
            lines.append(
                f"  note: your kernel wrote {int(written_outside.sum())} cells outside the matrix."
            )
        elif np.isnan(yours[np.isfinite(expected)]).any():
            lines.append("  note: some cells of the matrix were never written, or hold NaN.")
        lines.append(f"  No known mistake matches; this case exercises {case.focus}.")
    return "\n".join(lines)


def _passed(puzzle: Puzzle, launches: int, stages: list[str]) -> None:
    where = "compiled on the GPU" if _on_gpu() else "in the interpreter"
    print(
        f"✓ {puzzle.name}: {launches} launches match ({where}; {puzzle.summary})"
        + _rules_line(puzzle.rules_summary)
    )


def _rules_line(rules: str) -> str:
    """What the pass line says of the load rules: checked (in the interpreter, which records
    every load), or not checked on a GPU (no interpreter hook there)."""
    if not rules:
        return ""
    if _on_gpu():
        return f"; not checked on the GPU, only in the interpreter: {rules}"
    return f"; the interpreter's load log shows {rules}"


def _check(puzzle: Puzzle, kernel, cases) -> None:
    with _nothing_on_stderr():
        launches = _run_puzzle(puzzle, kernel, cases)
    _passed(puzzle, launches, [c.stage for c in cases])


# ---- puzzle 1: scale a ragged 2-D matrix, tile by tile ------------------------------------------
_READS_INSIDE = (
    "a cell past the matrix is never loaded: a masked load gives `other` there (0.0, or -inf "
    "in a max)"
)
PAD = 3.0  # what the spare cells of an input buffer hold: a read outside the matrix gets it
# y's rows are this many elements wider than x's (stride_y = stride_x + 5) in puzzles 1 and 2: a
# kernel that stores y with x's stride writes its rows in the wrong places
Y_EXTRA = 5


def _scale_inputs(case, torch, device):
    p = case.params
    gen = torch.Generator().manual_seed(p["seed"])
    x = torch.randn(p["n_rows"], p["n_cols"], generator=gen)
    args = (x.to(device), PAD, p["alpha"], p["BLOCK_R"], p["BLOCK_C"], Y_EXTRA)
    return args, x.double().numpy()


def _scale_variant(case, x, *, bug=None):
    """The (n_rows + BLOCK_R, n_cols + BLOCK_C + 3 + Y_EXTRA) buffer the kernel writes
    (x's rows are n_cols + BLOCK_C + 3 apart, y's 5 more), program by program, with one bug or
    none."""
    p = case.params
    n, m, br, bc, alpha = p["n_rows"], p["n_cols"], p["BLOCK_R"], p["BLOCK_C"], p["alpha"]
    shape = (n + br, m + bc + 3)
    y_shape = (shape[0], shape[1] + Y_EXTRA)
    x_buf = np.full(shape, PAD)
    x_buf[:n, :m] = x
    x_flat, y_flat = x_buf.reshape(-1), np.full(y_shape[0] * y_shape[1], np.nan)
    stride = m if bug == "row-stride-n-cols" else shape[1]
    stride_y = {"row-stride-n-cols": m, "y-stride-x": shape[1]}.get(bug, y_shape[1])
    for pr in range(-(-n // br)):
        for pc in range(-(-m // bc)):
            rows = (pr if bug == "pid-not-multiplied" else pr * br) + np.arange(br)
            cols = (pc if bug == "pid-not-multiplied" else pc * bc) + np.arange(bc)
            lim_r, lim_c = (n + 1, m + 1) if bug == "mask-off-by-one" else (n, m)
            row_ok = rows[:, None] < lim_r
            col_ok = cols[None, :] < lim_c
            if bug == "rows-only":
                col_ok = np.ones_like(col_ok)
            if bug == "cols-only":
                row_ok = np.ones_like(row_ok)
            mask = row_ok & col_ok
            offs = rows[:, None] * stride + cols[None, :]
            offs_y = rows[:, None] * stride_y + cols[None, :]
            store_mask = np.ones_like(mask) if bug in ("store-unmasked", "unmasked") else mask
            load_mask = np.ones_like(mask) if bug == "unmasked" else mask
            vals = np.where(load_mask, x_flat[np.where(load_mask, offs, 0)], 0.0)
            y_flat[offs_y[store_mask]] = (alpha * vals)[store_mask]
    return y_flat.reshape(y_shape)


def _scale_mistake(slug, title, explanation, bug):
    return Mistake(slug, title, explanation, functools.partial(_scale_variant, bug=bug))


SCALE_TILE_MISTAKES = [
    _scale_mistake(
        "store-unmasked",
        "the store has no mask: whole tiles are written, past the last row and column",
        "The last tile of each dimension runs past the matrix when the block does not divide its "
        "size; tl.store must get the same mask as tl.load, or it writes into memory that "
        "belongs to something else.",
        "store-unmasked",
    ),
    _scale_mistake(
        "store-unmasked",
        "neither the load nor the store is masked",
        "Both the load and the store need mask = (rows[:, None] < n_rows) & (cols[None, :] < "
        "n_cols): without it the ragged tiles read and write outside the matrix.",
        "unmasked",
    ),
    _scale_mistake(
        "mask-off-by-one",
        "the mask keeps row n_rows and column n_cols (<= instead of <)",
        "Rows are numbered 0 .. n_rows - 1: row r exists when r < n_rows, and column c when "
        "c < n_cols.",
        "mask-off-by-one",
    ),
    _scale_mistake(
        "mask-one-dimension",
        "only the rows are masked: the columns past n_cols are read and written",
        "A 2-D tile is ragged in both dimensions: mask = (rows[:, None] < n_rows) & "
        "(cols[None, :] < n_cols).",
        "rows-only",
    ),
    _scale_mistake(
        "mask-one-dimension",
        "only the columns are masked: the rows past n_rows are read and written",
        "A 2-D tile is ragged in both dimensions: mask = (rows[:, None] < n_rows) & "
        "(cols[None, :] < n_cols).",
        "cols-only",
    ),
    _scale_mistake(
        "row-stride-n-cols",
        "rows are taken to be n_cols elements apart (stride_x and stride_y ignored)",
        "Row r starts r * stride_x elements after x_ptr; stride_x is n_cols only when the "
        "matrix is contiguous. Here it is a slice of a wider buffer, as a view of a larger "
        "tensor often is: use the strides.",
        "row-stride-n-cols",
    ),
    _scale_mistake(
        "pid-not-multiplied",
        "the first row (column) of a tile is the program id, not program id * BLOCK",
        "Program (i, j) owns rows i * BLOCK_R .. and columns j * BLOCK_C ..; with the program id "
        "alone the tiles overlap and most of the matrix is never written.",
        "pid-not-multiplied",
    ),
    _scale_mistake(
        "stride-of-other-tensor",
        "y is stored with x's row stride (stride_x where stride_y belongs)",
        "Each tensor has its own strides: row r of y starts r * stride_y elements after y_ptr. "
        "Here y's rows are wider than x's (stride_y = stride_x + 5), as when y is a slice of "
        "another buffer: store at y_ptr + rows[:, None] * stride_y + cols[None, :].",
        "y-stride-x",
    ),
]


def _scale_cases(seed, trials):
    def case(label, stage, n, m, br, bc, alpha, s, focus):
        params = dict(n_rows=n, n_cols=m, BLOCK_R=br, BLOCK_C=bc, alpha=alpha, seed=s)
        return PuzzleCase(label, stage, params, focus)

    cases = [
        case("one 16 x 16 tile", "one tile", 16, 16, 16, 16, 2.0, 1,
             "the pointer arithmetic x_ptr + rows[:, None] * stride_x + cols[None, :]"),
        case("a 48 x 32 matrix in 16 x 16 tiles", "several tiles", 48, 32, 16, 16, -0.5, 2,
             "the tile of program (i, j): rows i * BLOCK_R + tl.arange(0, BLOCK_R), columns "
             "j * BLOCK_C + tl.arange(0, BLOCK_C)"),
        case("37 x 21 in 16 x 16 tiles: the last row and column of tiles are ragged", "ragged",
             37, 21, 16, 16, 1.5, 3, "the mask on both dimensions, for the load and the store"),
        case("5 x 40 in 8 x 32 tiles", "ragged", 5, 40, 8, 32, 0.25, 4,
             "the mask on both dimensions, for the load and the store"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        n, m = (int(x) for x in rng.integers(1, 70, size=2))
        br, bc = (int(x) for x in rng.choice([8, 16, 32], size=2))
        cases.append(
            case(f"random case {t + 1}", "ragged", n, m, br, bc, float(rng.normal()),
                 int(rng.integers(2**31)), "the mask on both dimensions")
        )  # fmt: skip
    return cases


SCALE_TILE = Puzzle(
    name="scale_tile_kernel",
    run=None,  # set below (the runner module imports triton)
    inputs=_scale_inputs,
    expected=lambda case, x: _scale_variant(case, x),
    mistakes=SCALE_TILE_MISTAKES,
    tolerance=lambda case, on_gpu: (1e-6, 1e-6),
    where="y_buf[{}, {}]",
    summary="several tiles, ragged rows and columns, rows wider than the matrix",
    rules=lambda case: (inside_rule(rule_case(case.label), ("x",), _READS_INSIDE),),
    rules_summary="no load of a cell outside x",
)


def check_scale_tile(kernel, seed: int | None = 0, trials: int = 2) -> None:
    """Check puzzle 1: scale_tile_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y,
    alpha, BLOCK_R, BLOCK_C) writes y = alpha * x, grid (cdiv(n_rows, BLOCK_R),
    cdiv(n_cols, BLOCK_C)), and nothing outside the (n_rows, n_cols) matrix."""
    from ..triton_attention.puzzles import run_scale_tile

    puzzle = dataclasses.replace(SCALE_TILE, run=run_scale_tile)
    _check(puzzle, kernel, _scale_cases(seed, trials))


# ---- puzzle 2: a numerically stable softmax per row ---------------------------------------------
def _softmax_inputs(case, torch, device):
    p = case.params
    gen = torch.Generator().manual_seed(p["seed"])
    x = p["spread"] * torch.randn(p["n_rows"], p["n_cols"], generator=gen) + p["shift"]
    return (x.to(device), PAD, Y_EXTRA), x.double().numpy()


def _softmax_variant(case, x, *, bug=None):
    """The (n_rows + 1, n_cols + BLOCK + Y_EXTRA) buffer the row kernel writes, in
    float32."""
    n, m = x.shape
    block = 1 << (m - 1).bit_length()
    x_buf = np.full((n + 1, m + block), PAD, dtype=np.float32)
    x_buf[:n, :m] = x
    y_buf = np.full((n + 1, m + block + Y_EXTRA), np.nan, dtype=np.float32)
    stride = m if bug == "row-stride-n-cols" else x_buf.shape[1]
    stride_y = {"row-stride-n-cols": m, "y-stride-x": x_buf.shape[1]}.get(bug, y_buf.shape[1])
    x_flat, y_flat = x_buf.reshape(-1), y_buf.reshape(-1)
    cols = np.arange(block)
    lim = m + 1 if bug == "mask-off-by-one" else m
    mask = cols < lim
    with np.errstate(all="ignore"):
        for r in range(n):
            offs = r * stride + cols
            if bug == "unmasked":
                row = x_flat[offs]
            else:
                other = np.float32(0.0 if bug == "missing-other" else -np.inf)
                row = np.where(mask, x_flat[np.where(mask, offs, 0)], other)
            e = np.exp(row) if bug == "unstable" else np.exp(row - row.max())
            y = e / e.sum(dtype=np.float32)
            keep = np.ones_like(mask) if bug in ("unmasked", "store-unmasked") else mask
            y_flat[(r * stride_y + cols)[keep]] = y[keep]
    return y_buf.astype(np.float64)


def _softmax_mistake(slug, title, explanation, bug):
    return Mistake(slug, title, explanation, functools.partial(_softmax_variant, bug=bug))


SOFTMAX_ROWS_MISTAKES = [
    _softmax_mistake(
        "missing-other",
        "the masked load has no other=-inf: the padding columns count as 0",
        "A masked tl.load fills the cells it skips with `other`, 0 by default (or undefined). A "
        "0 enters the max and adds exp(0 - max) to the sum: load with other=float('-inf'), "
        "whose exp is 0.",
        "missing-other",
    ),
    _softmax_mistake(
        "unstable-softmax",
        "exp(x) without subtracting the row's max first",
        "exp overflows float32 above about 88: a row with scores near 100 gives inf / inf = NaN. "
        "Softmax does not change when a constant is subtracted from the row: "
        "p = tl.exp(x - tl.max(x, 0)), and the largest exponent is 0.",
        "unstable",
    ),
    _softmax_mistake(
        "mask-off-by-one",
        "the mask keeps column n_cols (cols <= n_cols)",
        "Columns are numbered 0 .. n_cols - 1: mask = cols < n_cols.",
        "mask-off-by-one",
    ),
    _softmax_mistake(
        "mask-missing",
        "no mask: the BLOCK - n_cols cells after the row are read and written",
        "BLOCK is n_cols rounded up to a power of two (tl.arange needs one); the cells past "
        "n_cols are not the row's. Mask the load (other=-inf) and the store with cols < n_cols.",
        "unmasked",
    ),
    _softmax_mistake(
        "store-unmasked",
        "the store has no mask: cells after the row are written",
        "The load's mask keeps the padding out of the softmax; the store needs it too, or it "
        "writes past the row.",
        "store-unmasked",
    ),
    _softmax_mistake(
        "row-stride-n-cols",
        "rows are taken to be n_cols elements apart (stride_x and stride_y ignored)",
        "Row r starts r * stride_x elements after x_ptr; here the matrix is a slice of a wider "
        "buffer, so stride_x > n_cols: use the strides.",
        "row-stride-n-cols",
    ),
    _softmax_mistake(
        "stride-of-other-tensor",
        "y is stored with x's row stride (stride_x where stride_y belongs)",
        "Each tensor has its own strides: row r of y starts r * stride_y elements after y_ptr. "
        "Here y's rows are wider than x's (stride_y = stride_x + 5), as when y is a slice of "
        "another buffer, so y_ptr + row * stride_x + cols writes row r into the wrong place.",
        "y-stride-x",
    ),
]


def _softmax_cases(seed, trials):
    def case(label, stage, n, m, spread, shift, s, focus):
        params = dict(n_rows=n, n_cols=m, spread=spread, shift=shift, seed=s)
        return PuzzleCase(label, stage, params, focus)

    cases = [
        case("4 rows of 16 (BLOCK = n_cols)", "full rows", 4, 16, 1.0, 0.0, 1,
             "one program per row: x_ptr + row * stride_x + cols, then max, exp, sum"),
        case("3 rows of 50 (BLOCK = 64: 14 padding columns)", "ragged rows", 3, 50, 2.0, 0.0, 2,
             "the mask cols < n_cols, with other=-inf on the load"),
        case("5 rows of 7 (BLOCK = 8)", "ragged rows", 5, 7, 1.0, 0.0, 3,
             "the mask cols < n_cols, with other=-inf on the load"),
        case("2 rows of 20, scores near 100 (exp overflows float32)", "large scores", 2, 20,
             5.0, 100.0, 4, "the row max subtracted before exp"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        n, m = int(rng.integers(1, 8)), int(rng.integers(1, 130))
        cases.append(
            case(f"random case {t + 1}", "large scores", n, m, float(rng.uniform(1, 10)),
                 float(rng.uniform(-120, 120)), int(rng.integers(2**31)),
                 "the mask, other=-inf and the max subtraction")
        )  # fmt: skip
    return cases


SOFTMAX_ROWS = Puzzle(
    name="softmax_rows_kernel",
    run=None,
    inputs=_softmax_inputs,
    expected=lambda case, x: _softmax_reference(x),
    mistakes=SOFTMAX_ROWS_MISTAKES,
    tolerance=lambda case, on_gpu: (1e-5, 1e-4),
    where="y_buf[{}, {}]",
    summary="ragged rows, padding columns, scores near 100, y's rows wider than x's",
    rules=lambda case: (inside_rule(rule_case(case.label), ("x",), _READS_INSIDE),),
    rules_summary="no load of a cell past the row",
)


def _softmax_reference(x):
    n, m = x.shape
    block = 1 << (m - 1).bit_length()
    y = np.full((n + 1, m + block + Y_EXTRA), np.nan)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    y[:n, :m] = e / e.sum(axis=1, keepdims=True)
    return y


def check_softmax_rows(kernel, seed: int | None = 0, trials: int = 2) -> None:
    """Check puzzle 2: softmax_rows_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK)
    writes y[r] = softmax(x[r]), one program per row, BLOCK = next_power_of_2(n_cols)."""
    from ..triton_attention.puzzles import run_softmax_rows

    puzzle = dataclasses.replace(SOFTMAX_ROWS, run=run_softmax_rows)
    _check(puzzle, kernel, _softmax_cases(seed, trials))


# ---- puzzle 3: a matmul with ragged edges -------------------------------------------------------
MATMUL_PAD = 1.0  # the spare cells of a and b: a read past K adds to the product


def _matmul_inputs(case, torch, device):
    p = case.params
    gen = torch.Generator().manual_seed(p["seed"])
    a = torch.randn(p["M"], p["K"], generator=gen).half()
    b = torch.randn(p["K"], p["N"], generator=gen).half()
    blocks = (p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"])
    return (a.to(device), b.to(device), MATMUL_PAD, *blocks), (
        a.double().numpy(),
        b.double().numpy(),
    )


def _matmul_variant(case, ab, *, bug=None):
    """The (M + BLOCK_M, N + BLOCK_N) c buffer, tile by tile, with one bug or none."""
    a, b = ab
    p = case.params
    M, N, K = p["M"], p["N"], p["K"]
    bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
    a_buf = np.full((M + bm, K + bk), MATMUL_PAD)
    b_buf = np.full((K + bk, N + bn), MATMUL_PAD)
    a_buf[:M, :K], b_buf[:K, :N] = a, b
    c_buf = np.full((M + bm, N + bn), np.nan)
    lim_k = K + 1 if bug == "k-off-by-one" else K
    for i0 in range(0, M, bm):
        for j0 in range(0, N, bn):
            rows, cols = np.arange(i0, i0 + bm), np.arange(j0, j0 + bn)
            acc = np.zeros((bm, bn), dtype=np.float32)
            for k0 in range(0, K, bk):
                ks = np.arange(k0, k0 + bk)
                k_ok = np.ones(bk, bool) if bug == "k-unmasked" else ks < lim_k
                a_t = np.where((rows[:, None] < M) & k_ok[None, :], a_buf[np.ix_(rows, ks)], 0.0)
                b_t = np.where(k_ok[:, None] & (cols[None, :] < N), b_buf[np.ix_(ks, cols)], 0.0)
                prod = (a_t @ b_t).astype(np.float32)
                if bug == "fp16-acc":
                    acc = (acc + prod).astype(np.float16).astype(np.float32)
                elif bug == "fp16-dot":
                    acc = acc + prod.astype(np.float16).astype(np.float32)
                else:
                    acc = acc + prod
            c_buf[i0 : i0 + bm, j0 : j0 + bn] = acc
            if bug != "store-unmasked":  # cells outside the matrix are not written
                c_buf[i0 : i0 + bm, j0 : j0 + bn][(rows[:, None] >= M) | (cols[None, :] >= N)] = (
                    np.nan
                )
    return c_buf


def _matmul_mistake(slug, title, explanation, bug):
    return Mistake(slug, title, explanation, functools.partial(_matmul_variant, bug=bug))


_K_MASK = (
    "When BLOCK_K does not divide K, the last K step runs past column K - 1 of a and row K - 1 "
    "of b; those cells are not the matrices' and must read as 0: mask a with offs_k[None, :] < "
    "K and b with offs_k[:, None] < K, other=0.0."
)
MATMUL_MISTAKES = [
    _matmul_mistake("k-mask-missing", "the K dimension is not masked", _K_MASK, "k-unmasked"),
    _matmul_mistake("mask-off-by-one", "the K mask keeps index K (offs_k <= K)", _K_MASK,
                    "k-off-by-one"),
    _matmul_mistake(
        "store-unmasked",
        "the store of c has no mask: cells past row M or column N are written",
        "The ragged tiles of c run past the matrix; store with mask = (offs_m[:, None] < M) & "
        "(offs_n[None, :] < N).",
        "store-unmasked",
    ),
    _matmul_mistake(
        "acc-dtype",
        "the accumulator is float16",
        "Each K step adds a tile product to acc; in float16 every addition rounds to 11 bits and "
        "the error grows with K. Keep acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) and "
        "add with tl.dot(a, b, acc) (or acc += tl.dot(a, b)); cast only when storing.",
        "fp16-acc",
    ),
    _matmul_mistake(
        "acc-dtype",
        "each tile product is rounded to float16 before it is added",
        "tl.dot(a, b) of float16 tiles returns float32 by default; out_dtype=tl.float16 or a "
        ".to(tl.float16) rounds every partial product. Accumulate in float32.",
        "fp16-dot",
    ),
]  # fmt: skip


def _matmul_cases(seed, trials):
    def case(label, stage, M, N, K, bm, bn, bk, s, focus):
        params = dict(M=M, N=N, K=K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, seed=s)
        return PuzzleCase(label, stage, params, focus)

    cases = [
        case("one 16 x 16 tile, K = 16", "one tile", 16, 16, 16, 16, 16, 16, 1,
             "one tl.dot of a (BLOCK_M, BLOCK_K) tile of a by a (BLOCK_K, BLOCK_N) tile of b"),
        case("32 x 32, K = 64 in four steps of 16", "several K steps", 32, 32, 64, 16, 16, 16, 2,
             "the loop over K, accumulating in float32"),
        case("M = 37, N = 29, K = 32: ragged rows and columns", "ragged M and N", 37, 29, 32, 16,
             16, 16, 3, "the masks on M (a and c) and on N (b and c)"),
        case("M = 20, N = 18, K = 45: ragged K (45 = 2 * 16 + 13)", "ragged K", 20, 18, 45, 16,
             16, 16, 4, "the mask on K for a's columns and b's rows"),
        case("M = 16, N = 16, K = 320, float16 inputs", "long K", 16, 16, 320, 16, 16, 32, 5,
             "the float32 accumulator over many K steps"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        M, N, K = (int(x) for x in rng.integers(1, 70, size=3))
        cases.append(
            case(f"random case {t + 1}", "long K", M, N, K, 16, 16, 16,
                 int(rng.integers(2**31)), "the masks on M, N and K")
        )  # fmt: skip
    return cases


def _matmul_tolerance(case, on_gpu):
    return (1e-5, 2e-4) if not on_gpu else (1e-4, 5e-3)


MATMUL = Puzzle(
    name="matmul_kernel",
    run=None,
    inputs=_matmul_inputs,
    expected=lambda case, ab: _matmul_variant(case, ab),
    mistakes=MATMUL_MISTAKES,
    tolerance=_matmul_tolerance,
    where="c_buf[{}, {}]",
    summary="ragged M, N and K, float16 in, float32 accumulated",
    rules=lambda case: (inside_rule(rule_case(case.label), ("a", "b"), _READS_INSIDE),),
    rules_summary="no load of a cell past the matrices (rows of a past M, columns of b past N)",
)


def check_matmul(kernel, seed: int | None = 0, trials: int = 1) -> None:
    """Check puzzle 3: matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk,
    stride_cm, BLOCK_M, BLOCK_N, BLOCK_K) writes c = a @ b (a float16 (M, K), b float16 (K, N),
    c float32 (M, N)), grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))."""
    from ..triton_attention.puzzles import run_matmul

    puzzle = dataclasses.replace(MATMUL, run=run_matmul)
    _check(puzzle, kernel, _matmul_cases(seed, trials))


# ---- puzzle 4: one query tile's online softmax ------------------------------------------------
def _row_block_softmax_scale(p) -> float:
    """The softmax scale of a case: 1/sqrt(d), or ln 2 for the exact case (qk_scale = 1)."""
    return LN2 if p.get("exact") else 1 / math.sqrt(p["HEAD_DIM"])


def _row_block_inputs(case, torch, device):
    p = case.params
    gen = torch.Generator().manual_seed(p["seed"])
    shape_k = (p["seqlen_k"], p["HEAD_DIM"])
    if p.get("exact"):  # integer scores, qk_scale = 1: p = 2^(s - m) and every sum exact in float32
        q = torch.randint(-1, 2, (p["BLOCK_M"], p["HEAD_DIM"]), generator=gen).float()
        k = torch.randint(-1, 2, shape_k, generator=gen).float()
        v = torch.randint(-16, 17, shape_k, generator=gen) / 8.0
    else:
        q = 2.0 * torch.randn(p["BLOCK_M"], p["HEAD_DIM"], generator=gen)
        k = torch.randn(shape_k, generator=gen)
        v = torch.randn(shape_k, generator=gen)
    if p.get("late_max"):
        k[-p["BLOCK_N"] :] *= 2.5
    dtype = getattr(torch, p["dtype"])
    q, k, v = (t.to(dtype) for t in (q, k, v))
    qk_scale = _row_block_softmax_scale(p) * LOG2E
    args = (q.to(device), k.to(device), v.to(device), PAD, qk_scale, p["BLOCK_N"])
    return args, tuple(t.double().numpy() for t in (q, k, v))


def _row_block_variant(case, qkv, **bug):
    q, k, v = qkv
    p = case.params
    out, _ = emulate_kernel(
        q[None, None], k[None, None], v[None, None], False, _row_block_softmax_scale(p),
        p["BLOCK_M"], p["BLOCK_N"], **bug,
    )  # fmt: skip
    return out[0, 0]


def _row_block_reference(case, qkv):
    q, k, v = qkv
    scale = _row_block_softmax_scale(case.params)
    out, _ = _reference_attention(q[None, None], k[None, None], v[None, None], False, scale)
    return out[0, 0]


def _row_block_mistakes():
    found = []
    for m in KERNEL_OUT_MISTAKES:
        bug = m.fn.keywords
        if "causal_mask" in bug:
            continue
        found.append(dataclasses.replace(m, fn=functools.partial(_row_block_variant, **bug)))
    found.append(
        Mistake(
            "ragged-tile",
            "the keys past seqlen_k are loaded without a mask and not masked in the scores",
            "The last K/V tile runs past the last key; mask the loads (other=0.0) and set the "
            "scores of keys offs_n >= seqlen_k to -inf, so that their p is 0.",
            functools.partial(_row_block_variant, ragged_mask=False, pad_value=PAD),
        )
    )
    found.append(
        Mistake(
            "scale-folded-twice",
            "the scores multiplied by log2(e) again: qk_scale already holds it",
            "The runner passes qk_scale = softmax_scale * log2(e), both factors in one: "
            "s = tl.dot(q, tl.trans(k)) * qk_scale, then tl.math.exp2(s - m_new[:, None]). "
            "Multiplied by log2(e) once more, the softmax is 1.44 times too sharp.",
            functools.partial(_row_block_variant, extra_scale=LOG2E),
        )
    )
    found.append(
        Mistake(
            "half-precision-state",
            HALF_STATE_TITLE,
            HALF_STATE_EXPLANATION,
            functools.partial(_row_block_variant, state="float16"),
        )
    )
    return found


ROW_BLOCK_MISTAKES = _row_block_mistakes()


def _row_block_cases(seed, trials):
    def case(label, stage, bm, bn, d, n_k, dtype, s, focus, late_max=False, exact=False):
        params = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, seqlen_k=n_k, dtype=dtype, seed=s,
                      late_max=late_max)  # fmt: skip
        if exact:
            params["exact"] = True
        return PuzzleCase(label, stage, params, focus)

    cases = [
        case("one K/V tile: 16 queries, 16 keys, d = 16", "one tile", 16, 16, 16, 16,
             "float32", 1, "the scores times qk_scale, exp2, and out = acc / l_i"),
        case("three K/V tiles, the last raises the max", "several tiles", 16, 16, 32, 48,
             "float32", 2, "the rescale of acc and l_i by alpha = exp2(m_i - m_new)",
             late_max=True),
        case("seqlen_k = 70: the fifth tile of 16 keys holds 6", "ragged keys", 16, 16, 32, 70,
             "float32", 3, "the mask of the keys past seqlen_k (loads and scores)"),
        case("float16 inputs, seqlen_k = 40", "float16", 32, 16, 32, 40, "float16", 4,
             "tl.dot of float16 tiles: p.to(v.dtype) before the second product"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        cases.append(
            case(f"random case {t + 1}", "float16", 16, 16, 16, int(rng.integers(1, 80)),
                 "float16", int(rng.integers(2**31)), "the online softmax over ragged keys")
        )  # fmt: skip
    cases.append(case(*ROW_BLOCK_STATE_CASE, exact=True))
    return cases


# The float32 state's case: float16 q and k of -1, 0 and 1, v in steps of 1/8 and qk_scale = 1, so
# every score is an integer, every p = 2^(s - m) a float16 and every tile's sum exact in float32:
# a kernel with float32 m_i, l_i and acc is exact up to the final division (error near 1e-7),
# one that keeps them in float16 rounds them at every one of the 32 tiles (1e-4 to 1e-3).
ROW_BLOCK_STATE_CASE = (
    "float16 inputs, 32 K/V tiles of exact scores: only the final division rounds",
    "float32 state", 16, 16, 16, 512, "float16", 5,
    "m_i, l_i and acc in float32 whatever the inputs' dtype",
)  # fmt: skip
ROW_BLOCK_STATE_TOL = 1e-5


def _row_block_tolerance(case, on_gpu):
    if case.params.get("exact"):
        return ROW_BLOCK_STATE_TOL, 5e-2
    if case.params["dtype"] == "float16" or on_gpu:
        return 1e-2 if on_gpu else 3e-3, 5e-2
    return 1e-5, 1e-3


ROW_BLOCK = Puzzle(
    name="row_block_attention_kernel",
    run=None,
    inputs=_row_block_inputs,
    expected=_row_block_reference,
    mistakes=ROW_BLOCK_MISTAKES,
    tolerance=_row_block_tolerance,
    where="out[{}, {}]",
    summary="one and several K/V tiles, a late max, ragged keys, float16, float32 state",
    rules=lambda case: _row_block_rules(case),
    rules_summary="q, k and v read once each, no key past seqlen_k loaded",
)


def _row_block_rules(case):
    c = rule_case(case.label)
    once = "q is read once, k and v once each"
    return (
        inside_rule(c, ("q", "k", "v"), "the keys past seqlen_k are loaded masked (as 0)"),
        *(once_rule(c, name, once) for name in ("k", "v", "q")),
    )


def check_row_block(kernel, seed: int | None = 0, trials: int = 1) -> None:
    """Check puzzle 4: row_block_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seqlen_k,
    stride_q, stride_k, stride_v, stride_o, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM) writes
    out = softmax(q k^T / sqrt(d)) v for one (BLOCK_M, HEAD_DIM) query tile, float32. Its last
    case (ROW_BLOCK_STATE_CASE) is exact in float32 up to the final division: to 1e-5, it refuses
    a running max, sum or accumulator kept in float16."""
    from ..triton_attention.puzzles import run_row_block

    puzzle = dataclasses.replace(ROW_BLOCK, run=run_row_block)
    _check(puzzle, kernel, _row_block_cases(seed, trials))


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


def _forward_diagnose(which, yours, args, expected, mistakes, tol, match_tol, rows, other, source):
    """The mistake whose replay matches output `which` (0: out, 1: lse); ties go to the replay
    whose other output is nearest the learner's (`other`), then to what `source` shows."""

    def replays():
        for mistake in mistakes:
            q, k, v, causal, scale = args
            for bm, bn in _TILES:
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
    from ..triton_attention.puzzles import run_attention_fwd

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
    from ..triton_attention.puzzles import run_attention_fwd

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

    from ..triton_attention.puzzles import run_attention_fwd

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
                    which, y, args, e, mistakes, tol, match_tol, rows, other, source
                )
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
