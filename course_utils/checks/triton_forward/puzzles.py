"""Checks for notebook 06's four Triton puzzles (the whole forward kernel: forward.py).

    check_scale_tile(kernel)         puzzle 1: y = alpha * x on a ragged 2-D matrix, masked tiles
    check_softmax_rows(kernel)       puzzle 2: a numerically stable softmax, one program per row
    check_matmul(kernel)             puzzle 3: c = a @ b, float16 in, float32 accumulated, ragged
    check_row_block(kernel)          puzzle 4: one query tile's online softmax over K/V tiles

Each check launches the learner's kernel through a runner of course_utils.triton_attention.
puzzles (in the notebook's kernel when a submission is graded; only tensors travel back) on
fresh inputs, ragged ones included, and compares with a reference. The puzzles' inputs sit in
larger buffers whose spare cells hold a known number and whose output starts as NaN, so a write
outside the matrix shows, and a read outside it has a known value: a mistake is named only when
its emulation, the learner's kernel with that one bug replayed in NumPy, gives the learner's
output. Two mistakes whose replays give the same numbers (tl.exp, and log2(e) folded twice) are
told apart by the learner's source (common._nearest_mistake).

Some rules of the notebook leave the output right when they are broken: a load of a cell past the
matrix whose value only reaches cells never stored, K read twice. Once a case's values are right,
its loads are judged (loads.py: the runners record, in the interpreter, which elements of
each input every program loads). On a GPU the load rules are not checked, and the pass line says
so.

Without a GPU the kernels run in Triton's interpreter on small float32 (and float16) inputs;
on a GPU they are compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from course_utils.checks.engine.failures import Mistake
from course_utils.checks.engine.kernels import (
    HALF_STATE_EXPLANATION,
    HALF_STATE_TITLE,
)
from course_utils.checks.triton_forward.emulation import (
    KERNEL_OUT_MISTAKES,
    LN2,
    LOG2E,
    _reference_attention,
    emulate_kernel,
)
from course_utils.checks.triton_forward.loads import inside_rule, once_rule, rule_case
from course_utils.checks.triton_forward.runs import Puzzle, PuzzleCase, _check

__all__ = [
    "MATMUL_MISTAKES",
    "ROW_BLOCK_MISTAKES",
    "SCALE_TILE_MISTAKES",
    "SOFTMAX_ROWS_MISTAKES",
    "check_matmul",
    "check_row_block",
    "check_scale_tile",
    "check_softmax_rows",
]


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
    from course_utils.harness.triton_puzzles import run_scale_tile

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
    from course_utils.harness.triton_puzzles import run_softmax_rows

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
    from course_utils.harness.triton_puzzles import run_matmul

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
    from course_utils.harness.triton_puzzles import run_row_block

    puzzle = dataclasses.replace(ROW_BLOCK, run=run_row_block)
    _check(puzzle, kernel, _row_block_cases(seed, trials))
