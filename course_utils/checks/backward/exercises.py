"""Checks for notebook 07, the attention backward pass recomputed from lse.

    check_softmax_backward_rows(fn)        softmax_backward_rows(P, dP) -> dS, row by row
    check_flash_attention_backward(fn)     flash_attention_backward(Q, K, V, O, dO, lse, Br, Bc,
                                           causal) -> (dQ, dK, dV)
    check_quick_backward_flops_ratio(a)    FlashAttention / standard backward FLOPs
    check_quick_lse_bytes(a)               bytes of one head's lse at N = 32,768
    check_quick_p_over_lse(a)              one head's P in bf16 / its lse in fp32, N = 32,768

Every check runs the learner's function on cases ordered smallest first (the notebook's own
examples, then edge cases: square and ragged tiles, Br != Bc, Nq != Nk, dv != d, masked entries,
rows that saw no key, scores of several hundred; then random cases) and names the misconception
behind a wrong answer. The cases of exercise 2 come in four stages, the order in which the
notebook builds the function (STAGES: plain tiles, ragged tiles, causal mask, N_q != N_k), each
with its random cases after its fixed ones; a failure names the first failing stage and the
stages that pass (see _backward_cases). The buggy implementations that show each misconception
are in SOFTMAX_BACKWARD_MISTAKES and BACKWARD_MISTAKES; a mistake is named only when its replay
gives the learner's output on the failing case.

On each case the three gradients are compared one after the other: dV first (it needs only P),
then dK, then dQ. A mistake in recomputing P is then named by dV whatever else is wrong, and a
mistake in dS (the D term) or in a scale by dK or dQ.

Once every value is right, the rules of exercise 2 (section 9 of the notebook) are checked, each
on a case of its own (see _backward_rules):

    full-score-matrix         the peak of new allocations on N = N_k = 1024 (causal and not)
                              stays within the outputs, a copy of the inputs and 12 tiles: 712 KiB,
                              where P alone is 8 MiB (the notebook's solution peaks at 317 KiB)
    ignores-tile-size         every read of Q is at most Br rows, of K and V at most Bc rows;
                              dO, O and lse likewise, but each may also be read whole twice (the
                              preparation: D = rowsum(dO * O), the lse guard)
    causal-tiles-not-skipped  with causal=True, Q and K are read no more often than by one of the
                              checks' own loops that skip the tiles above the diagonal (K/V tiles
                              outside, or query tiles outside: the larger of the two bounds)

The inputs are read-only copies: `dP -= D`, `Q *= tau` or guarding lse in place is named
`mutates-input`, with the argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
from collections.abc import Callable

import numpy as np

from course_utils.checks.backward.mistakes import (
    BACKWARD_MISTAKES,
    _reference_backward,
    _tiled_backward,
)
from course_utils.checks.engine.cases import Case, _stage_header, _stage_order, frozen, run_cases
from course_utils.checks.engine.display import _arg_names
from course_utils.checks.engine.failures import MUTATES_INPUT, CheckFailure, Mistake
from course_utils.checks.engine.rules import Rule, bounded_loads_rule, memory_budget, tile_rule
from course_utils.checks.engine.tracing import TILE_READS
from course_utils.checks.engine.watch import pick_output
from course_utils.harness.constants import NEG_INF
from course_utils.references.attention import attention_reference
from course_utils.references.backward import softmax_backward


# ---- inputs are read-only: which one was written, and what to do about lse ---------------------
def _explained(failure: CheckFailure, fn: Callable, case: Case) -> CheckFailure:
    """The core's failure, and for a guarded lse a word on how to guard it without writing."""
    text = str(failure)
    if f"[misconception: {MUTATES_INPUT.slug}]" not in text:
        return failure
    names = _arg_names(fn, len(case.args), case.kwargs)
    lse_name = names[5] if len(names) > 5 else "lse"
    if f"input `{lse_name}`" in text:
        text += (
            f"\n  To guard {lse_name} (a row that saw no key has {lse_name} = -inf), build a new "
            f"array and subtract that: lse_safe = np.where(np.isneginf({lse_name}), np.inf, "
            f"{lse_name}); +inf, not 0, so that its P = exp(S - lse_safe) is 0."
        )
    return CheckFailure(text)


# ---- exercise 1: softmax_backward_rows ------------------------------------------------------
def _softmax_backward_variant(P, dP, *, bug):
    P, dP = np.asarray(P, dtype=float), np.asarray(dP, dtype=float)
    D = (P * dP).sum(axis=1, keepdims=True)
    if bug == "forgot-D":
        return P * dP
    if bug == "D-from-dP":
        return P * (dP - dP.sum(axis=1, keepdims=True))
    if bug == "diagonal-only":
        return P * (1 - P) * dP
    if bug == "D-columns":
        return P * (dP - (P * dP).sum(axis=0))
    if bug == "D-broadcast":
        return P * (dP - (P * dP).sum(axis=1))  # (rows,) lines up with the columns
    if bug == "sign":
        return P * (D - dP)
    raise ValueError(bug)


_SOFTMAX_BACKWARD = (
    "The softmax Jacobian is diag(p) - p p^T, so dS_ij = P_ij (dP_ij - D_i) with "
    "D_i = sum_j P_ij dP_ij: one number per row, subtracted from every entry of that row."
)

SOFTMAX_BACKWARD_MISTAKES = [
    Mistake(
        "forgot-D",
        "forgot D: dS = P * dP",
        "P_ij depends on every score of row i (through the normalizer), not only on S_ij. That "
        "coupling is the -p p^T part of the Jacobian, and it gives the term -P_ij D_i. "
        + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="forgot-D"),
    ),
    Mistake(
        "D-from-dP",
        "D_i is the row sum of dP (without the weights P)",
        "D_i is a weighted sum: sum_j P_ij dP_ij, the average of dP under the softmax weights "
        "(in attention: dO_i . O_i). " + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="D-from-dP"),
    ),
    Mistake(
        "diagonal-only",
        "only the diagonal of the Jacobian: dS = P * (1 - P) * dP",
        "p(1 - p) is dp_j/ds_j, but s_j changes every other p_k too (dp_k/ds_j = -p_k p_j). "
        "Summing over k gives P_ij (dP_ij - D_i). " + _SOFTMAX_BACKWARD,
        functools.partial(_softmax_backward_variant, bug="diagonal-only"),
    ),
    Mistake(
        "D-wrong-axis",
        "D summed over the rows (axis=0) instead of along each row",
        "Each row is its own softmax, so D_i sums over row i: (P * dP).sum(axis=1, "
        "keepdims=True), of shape (rows, 1).",
        functools.partial(_softmax_backward_variant, bug="D-columns"),
    ),
    Mistake(
        "D-wrong-axis",
        "D of shape (rows,) subtracted along the columns (keepdims or [:, None] missing)",
        "(P * dP).sum(axis=1) has shape (rows,); NumPy lines it up with the LAST axis, so D_j is "
        "subtracted from column j (for a square tile no error shows). Keep it a column: "
        "sum(axis=1, keepdims=True) or D[:, None].",
        functools.partial(_softmax_backward_variant, bug="D-broadcast"),
    ),
    Mistake(
        "sign-flipped",
        "the sign is flipped: dS = P * (D - dP)",
        "Raising S_ij moves probability to key j from the others, so the loss changes by "
        "P_ij times (dP_ij minus the row's average D_i): dS_ij = P_ij (dP_ij - D_i). Check "
        "with two keys by hand.",
        functools.partial(_softmax_backward_variant, bug="sign"),
    ),
]


def _softmax_rows(rng, rows, n, masked=0.0, empty_rows=(), spread=1.5):
    """(rows, n) softmax probabilities of random scores; masked entries and empty rows are 0."""
    s = spread * rng.standard_normal((rows, n))
    s[rng.random((rows, n)) < masked] = NEG_INF
    s[list(empty_rows)] = NEG_INF
    m = s.max(axis=1, keepdims=True, initial=NEG_INF)
    p = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    l = p.sum(axis=1, keepdims=True)
    return np.divide(p, l, out=np.zeros_like(p), where=l > 0)


_FOCUS_D = "D_i = sum_j P_ij dP_ij, one number per row, subtracted from every entry of row i"
_FOCUS_ZERO = "entries with P = 0 (masked keys, rows with no keys): their dS is 0"
_FOCUS_SHAPE = "tiles that are not square: D must stay a column of shape (rows, 1)"


def _softmax_backward_cases(seed, trials):
    rng = np.random.default_rng(0)
    row_p = np.array([[2.0, 1.0, 8.0, 4.0]]) / 15  # e^s = 2, 1, 8, 4
    row_dp = np.array([[1.0, 2.0, 3.0, 4.0]])  # dP = dO V^T with dO = 1, values 1..4
    two = np.array([[0.25, 0.75], [0.5, 0.5]])
    masked = np.array([[0.2, 0.0, 0.8], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])

    def case(label, P, dP, focus):
        return Case(label, frozen(P, dP), focus=focus)

    cases = [
        case(
            "two rows of two: P = [[1/4, 3/4], [1/2, 1/2]], dP = [[1, -1], [2, 0]]",
            two,
            np.array([[1.0, -1.0], [2.0, 0.0]]),
            _FOCUS_D,
        ),
        case("the row of section 4: P = [2, 1, 8, 4] / 15, dP = [1, 2, 3, 4]", row_p, row_dp,
             _FOCUS_D),
        case(
            "3 x 3: a masked entry (P = 0), a row with no keys (all 0), a one-hot row",
            masked,
            np.array([[1.0, 5.0, -2.0], [3.0, 1.0, 2.0], [0.5, -1.0, 4.0]]),
            _FOCUS_ZERO,
        ),
        case("a 4 x 4 tile", _softmax_rows(rng, 4, 4), rng.standard_normal((4, 4)), _FOCUS_D),
        case("a 3 x 7 tile (Br != Bc)", _softmax_rows(rng, 3, 7), rng.standard_normal((3, 7)),
             _FOCUS_SHAPE),
        case(
            "a 16 x 16 tile with masked entries",
            _softmax_rows(rng, 16, 16, masked=0.3),
            rng.standard_normal((16, 16)),
            _FOCUS_ZERO,
        ),
        case(
            "a 5 x 40 tile with two empty rows",
            _softmax_rows(rng, 5, 40, 0.1, (1, 3)),
            rng.standard_normal((5, 40)),
            _FOCUS_ZERO,
        ),
        case(
            "a 4 x 6 tile of scores several hundred apart (one-hot rows), dP of size 1000",
            _softmax_rows(rng, 4, 6, spread=300.0),
            1000 * rng.standard_normal((4, 6)),
            _FOCUS_D,
        ),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        rows, n = int(rng.integers(1, 25)), int(rng.integers(1, 49))
        empty = [r for r in range(rows) if rng.random() < 0.1]
        P = _softmax_rows(rng, rows, n, masked=float(rng.choice([0.0, 0.3])), empty_rows=empty)
        cases.append(
            case(f"random case {t + 1}: a {rows} x {n} tile", P, rng.standard_normal((rows, n)),
                 _FOCUS_SHAPE if rows != n else _FOCUS_D)
        )  # fmt: skip
    return cases


def check_softmax_backward_rows(fn: Callable, seed: int | None = 0, trials: int = 8) -> None:
    """Check softmax_backward_rows(P, dP) -> dS = P * (dP - D), D_i = sum_j P_ij dP_ij.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    name = "softmax_backward_rows"
    cases = _softmax_backward_cases(seed, trials)
    current = cases[0]
    try:
        for current in cases:
            with contextlib.redirect_stdout(io.StringIO()):
                run_cases(
                    name,
                    fn,
                    softmax_backward,
                    [current],
                    outputs=("dS",),
                    mistakes=SOFTMAX_BACKWARD_MISTAKES,  # never named where right on a case
                    rtol=1e-10,
                    atol=1e-12,
                    low_precision_below=1e-5,
                )
    except CheckFailure as failure:
        raise _explained(failure, fn, current) from None
    print(
        f"✓ {name}: {len(cases)} cases match the reference (masked entries, empty rows, "
        "Br != Bc, one-hot rows)"
    )


# ---- the cases --------------------------------------------------------------------------------
def _with_forward(Q, K, V, dO, causal=False, no_key_rows=()):
    """A consistent case (Q, K, V, O, dO, lse), read-only: O and lse from the course's forward.

    no_key_rows: rows marked as having seen no key (O = 0, lse = -inf, as for a padding row).
    """
    O, lse = attention_reference(Q, K, V, causal=causal)
    rows = list(no_key_rows)
    O[rows], lse[rows] = 0.0, NEG_INF
    return frozen(Q, K, V, O, dO, lse)


def _problem(rng, Nq, Nk, d, dv=None, spread=1.5, no_key_rows=(), causal=False):
    dv = d if dv is None else dv
    Q = spread * rng.standard_normal((Nq, d))
    K = spread * rng.standard_normal((Nk, d))
    V = rng.standard_normal((Nk, dv))
    dO = rng.standard_normal((Nq, dv))
    return _with_forward(Q, K, V, dO, causal, no_key_rows)


def _causal_problem(rng, N, d, dv=None, spread=1.5, no_key_rows=()):
    return _problem(rng, N, N, d, dv, spread, no_key_rows, causal=True)


_FOCUS_FORMULAS = (
    "the tile formulas of section 5: dV_j += P_ij^T dO_i, dK_j += tau dS_ij^T Q_i, "
    "dQ_i += tau dS_ij K_j, with P_ij = exp(S_ij - lse_i)"
)
_FOCUS_LSE = "P rebuilt from lse alone, one K/V tile at a time (no max, no sum)"
_FOCUS_CAUSAL = (
    "the causal mask: skip the tiles above the diagonal, mask the tiles that cross it with "
    "global indices (a query sees the keys c <= r)"
)
_FOCUS_OFF_CORNER = (
    "the causal mask with Br != Bc: the diagonal crosses tiles away from their corners, so the "
    "mask needs global row and column indices"
)
_FOCUS_RAGGED = "ragged last tiles: range(0, N, B) and slices that run past the end"
_FOCUS_SHAPES = "Nq != N_k and dv != d: the shapes of the five products of section 5"
_FOCUS_NO_KEYS = "rows that saw no key (lse = -inf, O = 0): their P is 0, with no NaN or inf"
_FOCUS_HUGE = "scores of several hundred: exp(S - lse) <= 1 never overflows (section 3)"

# The stages of exercise 2, in the order the notebook builds them (each adds one thing).
PLAIN, RAGGED, CAUSAL, NQ_NK = "plain tiles", "ragged tiles", "causal mask", "N_q != N_k"
STAGES = (PLAIN, RAGGED, CAUSAL, NQ_NK)


def _stage_of_random(t: int) -> str:
    """The stage of random case t: the random cases go round the stages."""
    return STAGES[t % len(STAGES)]


def _random_case(rng, t):
    """(problem, Br, Bc, causal, label, focus) of random case t, drawn to fit its stage."""
    stage = _stage_of_random(t)
    d, dv = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    causal, no_key = False, []
    if stage == PLAIN:  # N a multiple of both tile sizes
        Br, Bc = (int(b) for b in rng.choice([1, 2, 3, 4, 6, 8], size=2))
        step = math.lcm(Br, Bc)
        Nq = Nk = step * int(rng.integers(1, 40 // step + 1))
    else:
        Br, Bc = (int(b) for b in rng.integers(1, 17, size=2))
        Nq = Nk = int(rng.integers(1, 41))
    if stage == CAUSAL:
        causal = True
    if stage == NQ_NK:
        Nk = int(rng.choice([n for n in range(1, 41) if n != Nq]))
    if stage in (CAUSAL, NQ_NK):
        no_key = [r for r in range(Nq) if rng.random() < 0.15]
    label = f"random case {t + 1}: Nq = {Nq}, Nk = {Nk}, d = {d}, dv = {dv}, Br = {Br}, Bc = {Bc}"
    if no_key:
        label += f", {len(no_key)} row(s) without keys"
    focus = {PLAIN: _FOCUS_FORMULAS, RAGGED: _FOCUS_RAGGED, CAUSAL: _FOCUS_OFF_CORNER}.get(
        stage, _FOCUS_SHAPES
    )
    problem = _problem(rng, Nq, Nk, d, dv, no_key_rows=no_key, causal=causal)
    return stage, problem, Br, Bc, causal, label, _FOCUS_NO_KEYS if no_key else focus


def _backward_cases(seed, trials):
    """The cases of exercise 2, stage by stage (STAGES), smallest first inside each stage:

    plain tiles   non-causal, Br divides N_q and Bc divides N_k: the worked example of section 6
                  (one query, four keys), square tiles, Br != Bc, dv != d, scores of several
                  hundred, many tiles
    ragged tiles  non-causal, N_q = N_k: last tiles cut short, one tile larger than N
    causal mask   N_q = N_k, causal: square and off-corner tiles, rows marked as without key
    N_q != N_k    non-causal, more keys than queries or fewer, no keys at all (N_k = 0), rows
                  without keys (lse = -inf, O = 0)

    The random cases (trials of them) go round the four stages, each drawn to fit its stage,
    and follow that stage's fixed cases.
    """
    rng = np.random.default_rng(0)  # the fixed edge cases are the same every time

    def given(Q, K, V, dO):
        Q, K, V, dO = (np.array(a, dtype=float) for a in (Q, K, V, dO))
        return _with_forward(Q, K, V, dO)

    def case(stage, label, problem, Br=None, Bc=None, causal=False, focus=_FOCUS_FORMULAS):
        kwargs = {} if Br is None else {"Br": Br, "Bc": Bc}
        if causal:
            kwargs["causal"] = True
        label += ", causal" if causal else ""
        return Case(label, problem, kwargs, focus=focus, stage=stage)

    # d = 1 and q = 1: the keys are the scores (tau = 1); dO = 1, so dP = the values
    example = given([[1.0]], np.log([[2.0], [1.0], [8.0], [4.0]]), [[1], [2], [3], [4]], [[1.0]])
    whole = given([[1.0]], [[1], [3], [2], [5]], [[10], [20], [30], [40]], [[1.0]])
    two = given([[1.0], [2.0]], [[0.5], [-1.0]], [[1.0], [3.0]], [[1.0], [-1.0]])
    whole_two = given(
        [[1.0], [-1.0]], [[1], [3], [2], [5]], [[10], [20], [30], [40]], [[1.0], [0.5]]
    )
    # rows of scores near 800, 300, 0 and -650: the lse are more than 1000 apart
    huge = given(
        [[30.0, 27.0], [10.0, 12.0], [0.3, -0.2], [-22.0, -25.0]],
        rng.standard_normal((4, 2)) + [[20.0, 20.0]],
        rng.standard_normal((4, 2)),
        rng.standard_normal((4, 2)),
    )
    no_keys = given(
        rng.standard_normal((3, 2)), np.zeros((0, 2)), np.zeros((0, 2)), rng.standard_normal((3, 2))
    )
    cases = [
        case(PLAIN, "N = 2, d = 1, one 2 x 2 tile (Br = Bc = 2)", two, 2, 2),
        case(PLAIN, "the worked example of section 6: one query, scores ln [2, 1, 8, 4], values "
             "[1, 2, 3, 4], dO = 1, Bc = 2", example, 1, 2, focus=_FOCUS_LSE),
        case(PLAIN, "one query, scores [1, 3, 2, 5], values [10, 20, 30, 40], dO = 1, Bc = 2",
             whole, 1, 2, focus=_FOCUS_LSE),
        case(PLAIN, "two queries, scores +-[1, 3, 2, 5], values [10, 20, 30, 40], Br = Bc = 2",
             whole_two, 2, 2),
        case(PLAIN, "N = 4, d = 2, Br = Bc = 2", _problem(rng, 4, 4, 2), 2, 2),
        case(PLAIN, "N = 4, d = 2, Br = Bc = 2, scores near 800, 300, 0 and -650 (lse more "
             "than 1000 apart)", huge, 2, 2, focus=_FOCUS_HUGE),
        case(PLAIN, "N = 6, d = 3, dv = 2, Br = Bc = 3", _problem(rng, 6, 6, 3, 2), 3, 3,
             focus=_FOCUS_SHAPES),
        case(PLAIN, "N = 24, d = 4, Br = 4, Bc = 6 (many tiles, Br != Bc)",
             _problem(rng, 24, 24, 4), 4, 6),
        case(RAGGED, "N = 5, d = 4, Br = Bc = 8 (one tile, Br > N)", _problem(rng, 5, 5, 4),
             8, 8, focus=_FOCUS_RAGGED),
        case(RAGGED, "N = 7, d = 3, Br = 3, Bc = 2 (ragged tiles)", _problem(rng, 7, 7, 3), 3, 2,
             focus=_FOCUS_RAGGED),
        case(RAGGED, "N = 10, d = 4, default tiles Br = Bc = 16", _problem(rng, 10, 10, 4),
             focus=_FOCUS_RAGGED),
        case(RAGGED, "N = 37, d = 8, Br = 5, Bc = 6 (many tiles)", _problem(rng, 37, 37, 8), 5, 6,
             focus=_FOCUS_RAGGED),
        case(CAUSAL, "N = 3, d = 2, one tile (Br = Bc = 3)", _causal_problem(rng, 3, 2), 3, 3,
             True, focus=_FOCUS_CAUSAL),
        case(CAUSAL, "N = 4, d = 2, Br = Bc = 2", _causal_problem(rng, 4, 2), 2, 2, True,
             focus=_FOCUS_CAUSAL),
        case(CAUSAL, "N = 4, d = 2, Br = Bc = 1 (one score per tile)", _causal_problem(rng, 4, 2),
             1, 1, True, focus=_FOCUS_CAUSAL),
        case(CAUSAL, "N = 5, d = 4, Br = Bc = 8 (one tile, Br > N)", _causal_problem(rng, 5, 4),
             8, 8, True, focus=_FOCUS_CAUSAL),
        case(CAUSAL, "N = 7, d = 3, Br = 3, Bc = 2 (ragged, Br > Bc)", _causal_problem(rng, 7, 3),
             3, 2, True, focus=_FOCUS_OFF_CORNER),
        case(CAUSAL, "N = 7, d = 3, Br = 2, Bc = 3 (ragged, Br < Bc)", _causal_problem(rng, 7, 3),
             2, 3, True, focus=_FOCUS_OFF_CORNER),
        case(CAUSAL, "N = 9, d = 2, Br = 4, Bc = 3; rows 2 and 5 saw no key (lse = -inf, O = 0)",
             _causal_problem(rng, 9, 2, no_key_rows=(2, 5)), 4, 3, True, focus=_FOCUS_NO_KEYS),
        case(CAUSAL, "N = 12, d = 4, Br = 8, Bc = 3", _causal_problem(rng, 12, 4), 8, 3, True,
             focus=_FOCUS_OFF_CORNER),
        case(CAUSAL, "N = 37, d = 8, Br = 4, Bc = 3 (many tiles)", _causal_problem(rng, 37, 8),
             4, 3, True, focus=_FOCUS_CAUSAL),
        case(NQ_NK, "Nq = 3 queries and no keys at all (Nk = 0)", no_keys, 2, 2,
             focus=_FOCUS_NO_KEYS),
        case(NQ_NK, "Nq = 2 queries, Nk = 6 keys, d = 2, Br = 2, Bc = 3", _problem(rng, 2, 6, 2),
             2, 3, focus=_FOCUS_SHAPES),
        case(NQ_NK, "Nq = 9 queries, Nk = 4 keys, d = 2, Br = 4, Bc = 3", _problem(rng, 9, 4, 2),
             4, 3, focus=_FOCUS_SHAPES),
        case(NQ_NK, "Nq = 5 queries, Nk = 9 keys, d = 2, Br = 2, Bc = 4", _problem(rng, 5, 9, 2),
             2, 4, focus=_FOCUS_SHAPES),
        case(NQ_NK, "Nq = 8, Nk = 7, d = 2, Br = Bc = 2; rows 1 and 4 saw no key (lse = -inf, "
             "O = 0)", _problem(rng, 8, 7, 2, no_key_rows=(1, 4)), 2, 2, focus=_FOCUS_NO_KEYS),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    drawn = [_random_case(rng, t) for t in range(trials)]
    for stage in STAGES:  # after the fixed cases of their stage
        at = max(k for k, c in enumerate(cases) if c.stage == stage) + 1
        extra = [case(s, label, p, Br, Bc, causal, focus) for s, p, Br, Bc, causal, label, focus
                 in drawn if s == stage]  # fmt: skip
        cases[at:at] = extra
    return cases


# ---- the rules of exercise 2 --------------------------------------------------------------------
FULL_SCORE_MATRIX = Mistake(
    "full-score-matrix",
    "an array the size of the score matrix is built (S, P, dP, dS or a mask), or strips of it",
    "The point of the backward of section 5 is that P is never stored: each B_r x B_c tile of S, "
    "P, dP and dS is recomputed, used and thrown away. A product such as Q @ K.T or dO @ V.T, a "
    "mask np.tri(N, N_k), or strips of B_r x N_k scores hold far more than a few tiles. Compute "
    "them per tile, inside the two loops.",
    fn=lambda *a, **k: None,
)
IGNORES_TILE_SIZE = Mistake(
    "ignores-tile-size",
    "inputs read in pieces larger than the tiles (Br rows of Q, dO; Bc rows of K, V)",
    "The loops of section 5 read K_j = K[j:j + Bc], V_j likewise, Q_i = Q[i:i + Br] and dO_i "
    "likewise: every read of an input is one tile (B_r and B_c are what fits on chip). A "
    "product with the whole Q or K, or a strip of B_r x N_k scores, reads more at once. Only "
    "the preparation before the loops, D = rowsum(dO * O) and the guard of lse, reads whole "
    "arrays.",
    fn=lambda *a, **k: None,
)
NO_CAUSAL_SKIP = Mistake(
    "causal-tiles-not-skipped",
    "the tiles above the diagonal are read (and masked) instead of skipped",
    "A tile above the diagonal has no visible score: masking it gives the right values, but "
    "reading and computing it is wasted work, almost half of a causal head. Decide with the "
    "indices alone, before you slice Q_i (or K_j): with K/V tiles outside, start the query loop "
    "at (j // Br) * Br, or `continue` while i + Br_i - 1 < j; with query tiles outside, `break` "
    "out of the key loop once j > i + Br_i - 1. A test on the tile's scores comes too late: "
    + TILE_READS,
    fn=lambda *a, **k: None,
)
BACKWARD_RULE_MISTAKES = [FULL_SCORE_MATRIX, IGNORES_TILE_SIZE, NO_CAUSAL_SKIP]

_MEMORY_N, _MEMORY_D, _MEMORY_TILE = 1024, 4, 64


def _memory_case(causal: bool) -> Case:
    rng = np.random.default_rng(7)
    N, d, B = _MEMORY_N, _MEMORY_D, _MEMORY_TILE
    problem = _tiled_problem(rng, N, d, causal)
    label = f"N = N_k = {N}, d = {d}, Br = Bc = {B}" + (", causal" if causal else "")
    return Case(label, problem, {"Br": B, "Bc": B, "causal": causal}, focus=_FOCUS_FORMULAS)


def _tiled_problem(rng, N, d, causal):
    """A consistent case too large for the oracle's N x N matrices: O and lse from tiles."""
    Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
    tau = 1.0 / math.sqrt(d)
    O, lse = np.zeros((N, d)), np.zeros(N)
    for i in range(0, N, 256):  # 256-row strips: 2 MiB at a time, in the check's own code
        s = tau * (Q[i : i + 256] @ K.T)
        if causal:
            s = np.where(np.tri(len(s), N, i, dtype=bool), s, NEG_INF)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=1, keepdims=True)
        O[i : i + 256], lse[i : i + 256] = (p @ V) / l, (m + np.log(l))[:, 0]
    return frozen(Q, K, V, O, dO, lse)


def _memory_allowed(case: Case) -> int:
    """Outputs, one float64 copy of every input, 12 score tiles, 4 per-row vectors and 32 KiB."""
    Q, K, V = case.args[:3]
    Br, Bc = case.kwargs["Br"], case.kwargs["Bc"]
    inputs = sum(8 * np.size(a) for a in case.args)
    outputs = 8 * (Q.size + K.size + V.size)
    return outputs + inputs + 12 * (8 * Br * Bc) + 4 * (8 * max(len(Q), len(K))) + 32 * 2**10


def _memory_rule(causal: bool) -> Rule:
    case = _memory_case(causal)
    N, Nk = len(case.args[0]), len(case.args[1])
    return memory_budget(
        case,
        _memory_allowed(case),
        FULL_SCORE_MATRIX,
        forbidden=8 * N * Nk,
        what="never an N x N_k array: only the outputs, tiles and per-row vectors (the check "
        "measures what your function allocates)",
    )


def _tile_case() -> Case:
    rng = np.random.default_rng(8)
    problem = _problem(rng, 37, 29, 3, 2)
    return Case(
        "Nq = 37, Nk = 29, d = 3, dv = 2, Br = 8, Bc = 6",
        problem,
        {"Br": 8, "Bc": 6},
        focus=_FOCUS_RAGGED,
    )


_WHOLE_READS = 2  # D = rowsum(dO * O) and the lse guard read dO, O and lse whole, once or twice


def _tile_rule() -> Rule:
    case = _tile_case()
    Br, Bc = case.kwargs["Br"], case.kwargs["Bc"]
    what = "every read of Q, dO is a tile of at most Br rows, of K and V at most Bc rows"
    judges = [
        tile_rule(case, what, IGNORES_TILE_SIZE, arg=0, axis=0, limit=Br).judge,
        tile_rule(case, what, IGNORES_TILE_SIZE, arg=1, axis=0, limit=Bc).judge,
        tile_rule(case, what, IGNORES_TILE_SIZE, arg=2, axis=0, limit=Bc).judge,
        *(
            tile_rule(
                case, what, IGNORES_TILE_SIZE, arg=k, axis=0, limit=Br, whole_reads=_WHOLE_READS
            ).judge
            for k in (4, 3, 5)
        ),
    ]

    def judge(report, case):
        for j in judges:
            verdict = j(report, case)
            if verdict is not None:
                return verdict
        return None

    return Rule(case, judge, what, trace=(0, 1, 2, 3, 4, 5))


def _skip_case() -> Case:
    rng = np.random.default_rng(9)
    problem = _causal_problem(rng, 48, 2)
    kwargs = {"Br": 4, "Bc": 6, "causal": True}
    return Case("N = 48, d = 2, Br = 4, Bc = 6, causal", problem, kwargs, focus=_FOCUS_CAUSAL)


_SKIP_SLACK = 1.25  # tiles cut at other boundaries (np.array_split) may read a few rows more


def _skip_rule() -> Rule:
    """Q and K are read no more than by one of the checks' own two loops that skip.

    On the case, a loop that computes every tile reads Q (K/V tiles outside) or K (query tiles
    outside) about 1.8 times as often as one that skips; the slack allows tiles cut at other
    boundaries than multiples of Br and Bc.

    The learner may loop in either order, so each argument's bound is the larger of the two
    references' (K/V tiles outside read K once and Q per visible tile; query tiles outside the
    other way round); a tile sliced again right after itself counts once (LoadLog.record).
    """
    case = _skip_case()
    references = [
        functools.partial(_tiled_backward, keys_outside=True),
        functools.partial(_tiled_backward, keys_outside=False),
    ]
    return bounded_loads_rule(
        case,
        "with causal=True, skip the tiles above the diagonal: read no tile that has no "
        "visible score",
        NO_CAUSAL_SKIP,
        args=(0, 1),
        reference=references,
        slack=_SKIP_SLACK,
    )


@functools.cache
def _backward_rules() -> tuple[Rule, ...]:
    return (_memory_rule(False), _memory_rule(True), _tile_rule(), _skip_rule())


DQKV = ("dQ", "dK", "dV")


def check_flash_attention_backward(fn: Callable, seed: int | None = 0, trials: int = 10) -> None:
    """Check flash_attention_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False).

    It must return (dQ, dK, dV), compared with the naive backward (which materializes P) to
    1e-8, case by case: dV, then dK, then dQ. The cases come in four stages, the order in which
    the notebook builds the function, and a failure names the first failing stage:

        1. plain tiles    non-causal, Br divides N_q and Bc divides N_k (the worked example)
        2. ragged tiles   last tiles cut short, a tile larger than N
        3. causal mask    tiles skipped above the diagonal, masked across it; rows without keys
        4. N_q != N_k     more or fewer keys than queries, no keys at all, rows without keys

    Then the rules (see the module's docstring): no N x N_k array, tiles of Br and Bc rows, the
    tiles above the diagonal skipped.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    name = "flash_attention_backward"
    if not callable(fn):
        raise CheckFailure(f"{name}: expected a function, got {type(fn).__name__} {fn!r}")
    cases = _backward_cases(seed, trials)
    rounds = [
        (
            out_name,
            pick_output(fn, k, DQKV, name),
            lambda *a, k=k, **kw: _reference_backward(*a, **kw)[k],
            [
                Mistake(m.slug, m.title, m.explanation, pick_output(m.fn, k, DQKV, m.slug))
                for m in BACKWARD_MISTAKES
            ],
        )
        for k, out_name in ((2, "dV"), (1, "dK"), (0, "dQ"))
    ]
    settings = dict(rtol=1e-8, atol=1e-10, low_precision_below=1e-5)
    rules = _backward_rules()
    stages = _stage_order(cases)
    current = cases[0]
    try:
        for current in cases:  # stage by stage; on each case dV, then dK, then dQ
            unstaged = dataclasses.replace(current, stage="")  # the stage is said here, below
            for out_name, learner, reference, mistakes in rounds:
                try:
                    with contextlib.redirect_stdout(io.StringIO()):  # one pass line, at the end
                        run_cases(
                            name,
                            learner,
                            reference,
                            [unstaged],
                            outputs=(out_name,),
                            mistakes=mistakes,
                            **settings,
                        )
                except CheckFailure as failure:
                    header = _stage_header(name, stages, current.stage)
                    raise CheckFailure(header + str(failure)) from None
        for rule in rules:
            current = rule.case
            with contextlib.redirect_stdout(io.StringIO()):
                run_cases(
                    name,
                    fn,
                    _tiled_backward,
                    [],
                    outputs=DQKV,
                    mistakes=BACKWARD_MISTAKES,
                    rules=[rule],
                    **settings,
                )
    except CheckFailure as failure:
        raise _explained(failure, fn, current) from None
    print(
        f"✓ {name}: {len(cases)} cases match the reference in {len(stages)} stages "
        f"({', '.join(stages)}; dV, dK and dQ, rows without keys); {len(rules)} rules hold (no "
        "N x N_k array, Br x Bc tiles, the tiles above the diagonal skipped)"
    )
