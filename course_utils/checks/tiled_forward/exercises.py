"""Checks for notebook 03, the tiled FlashAttention forward in NumPy.

    check_causal_tile_map(fn)            causal_tile_map(N, Br, Bc) -> (Tr, Tc) tile kinds
    check_flash_attention_forward(fn)    flash_attention_forward(Q, K, V, Br, Bc, causal)
    check_quick_scores_mib(answer)       one head's score matrix at N = 16,384 in bf16, in MiB
    check_quick_causal_tiles(answer)     causal score tiles computed at N = 16,384, B = 128
    check_quick_traffic_ratio(answer)    standard / FlashAttention HBM traffic, Br = 128, d = 64

Every check runs the learner's function on cases ordered smallest first and names the
misconception behind a wrong answer, only when a buggy implementation that shows it reproduces
the learner's output (TILE_MAP_MISTAKES, FLASH_O_MISTAKES, FLASH_LSE_MISTAKES); otherwise it says
which part of the specification the failing case exercises.

The forward pass is checked in four stages, the order in which the notebook asks to build it:
plain tiles (no mask, tiles that divide the lengths, the worked examples of section 5 first), then
ragged tiles (N not a multiple of Br or Bc, Br != Bc, a tile larger than N), then the causal mask,
then N_q != N_k (N_k = 0 included); inside a stage the fixed cases come smallest first, then the
random ones. A failure names its stage and the stages that pass (FORWARD_STAGES, Case.stage).

It is checked in two rounds: O on every case first, then lse. A mistake in O (the mask, the
rescale, the tiles) is then named whatever the learner did with lse, and a base-2 lse is named
once O is right. Then the rules the exercise states (forward_rules): Q, K and V read in
tiles of Br and Bc rows (traced inputs), no N x N_k array (a memory budget), and, with the causal
mask, no K/V tile above the diagonal read (loads bounded by the check's own tiled loop).

The learner's function gets read-only copies of its inputs (an in-place `Q *= tau` is named
`mutates-input`), and any call into course_utils from it (the notebook imports `tile_kinds`, whose
answer is exercise 1's) is named `calls-reference`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
from collections.abc import Callable

import numpy as np

from course_utils.checks.engine.cases import Case, frozen, run_cases
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.rules import Rule, bounded_loads_rule, memory_budget, tile_rule
from course_utils.checks.engine.tracing import TILE_READS
from course_utils.checks.engine.watch import _LearnerRaised, call_learner, pick_output
from course_utils.checks.tiled_forward.mistakes import (
    FLASH_LSE_MISTAKES,
    FLASH_O_MISTAKES,
    _flash_variant,
    _qkv,
    _reference_forward,
)
from course_utils.references.tiles import FULL, MASK, SKIP, tile_kinds


# ---- exercise 1: causal_tile_map -------------------------------------------------------------
def _tile_map_reference(N, Br, Bc):
    return tile_kinds(N, Br, Bc, causal=True)


def _tile_map_variant(N, Br, Bc, *, rule):
    """A causal tile map with one wrong rule; rule names the mistake."""
    Tr, Tc = -(-N // Br), -(-N // Bc)
    kinds = np.empty((Tr, Tc), dtype=int)
    for i in range(Tr):
        r0, r1 = i * Br, min(N, (i + 1) * Br)
        for j in range(Tc):
            c0, c1 = j * Bc, min(N, (j + 1) * Bc)
            skip, full = c0 > r1 - 1, c1 - 1 <= r0
            if rule == "skip-at-last-row":  # c0 >= r1 - 1: skips a tile with one visible score
                skip = c0 >= r1 - 1
            elif rule == "full-strict":  # c1 - 1 < r0: a tile touching the diagonal is masked
                full = c1 - 1 < r0
            elif rule == "skip-first-row":  # compares the first key with the first query
                skip = c0 > r0
            elif rule == "full-last-row":  # compares the last key with the last query
                full = c1 - 1 <= r1 - 1
            elif rule == "tile-index":  # compares tile numbers, right only when Br == Bc
                skip, full = j > i, j < i
            kind = SKIP if skip else (FULL if full else MASK)
            if rule == "diagonal-skipped" and kind == MASK:
                kind = SKIP
            kinds[i, j] = kind
    return kinds


def _tile_map_mistake(slug, title, explanation, rule):
    return Mistake(slug, title, explanation, functools.partial(_tile_map_variant, rule=rule))


_OFF_BY_ONE = (
    "Query r sees key c exactly when c <= r. A tile (rows r0..r1-1, keys c0..c1-1) is skipped "
    "only if even its last row sees none of its keys: c0 > r1 - 1. It needs no mask only if even "
    "its first row sees all of its keys: c1 - 1 <= r0. Check both with a 1 x 1 tile on the "
    "diagonal (visible, no mask needed)."
)

TILE_MAP_MISTAKES = [
    _tile_map_mistake(
        "causal-off-by-one",
        "a causal comparison off by one (skipped a tile whose first key is the last query)",
        _OFF_BY_ONE,
        "skip-at-last-row",
    ),
    _tile_map_mistake(
        "causal-off-by-one",
        "a causal comparison off by one (a tile that needs no mask marked MASK)",
        _OFF_BY_ONE,
        "full-strict",
    ),
    _tile_map_mistake(
        "tile-wrong-corner",
        "compared the wrong corner of the tile (its first query row decides the skip)",
        "A tile may be skipped only if NO row of it sees any of its keys; the row that sees the "
        "most keys is the last one, r1 - 1. Skip when c0 > r1 - 1.",
        "skip-first-row",
    ),
    _tile_map_mistake(
        "tile-wrong-corner",
        "compared the wrong corner of the tile (its last query row decides FULL)",
        "A tile needs no mask only if EVERY row sees all of its keys; the row that sees the "
        "fewest is the first one, r0. FULL when c1 - 1 <= r0.",
        "full-last-row",
    ),
    _tile_map_mistake(
        "tile-index-not-position",
        "compared tile numbers (j > i) instead of positions",
        "Tile numbers line up with the diagonal only when Br == Bc. Compare element positions: "
        "the tile covers rows i*Br .. min(N, (i+1)*Br) - 1 and keys j*Bc .. min(N, (j+1)*Bc) - 1.",
        "tile-index",
    ),
    _tile_map_mistake(
        "diagonal-tile-skipped",
        "tiles that cross the diagonal are skipped instead of masked",
        "A tile that crosses the diagonal holds visible scores (those with c <= r) as well as "
        "hidden ones; skipping it drops the visible ones. Compute it and mask the hidden scores.",
        "diagonal-skipped",
    ),
]

RAGGED_TILE_MAP = Mistake(
    "ragged-tile",
    "the ragged last tile is dropped (N // Br tiles instead of ceil(N / Br))",
    "When Br does not divide N the last tile is shorter but still there: use -(-N // Br) "
    "(ceil) tiles, and clip each tile's rows and keys to N.",
    fn=lambda *a, **k: None,
)


def _tile_map_cases(seed, trials):
    rules = "the rules of section 6: SKIP when c0 > r1 - 1, FULL when c1 - 1 <= r0, else MASK"
    ragged = "the ragged last tile: ceil(N / B) tiles, the last one clipped at N"
    positions = "Br != Bc: compare positions (rows i*Br.., keys j*Bc..), not tile numbers"
    cases = [
        Case("N = 8, Br = Bc = 4 (2 x 2 tiles)", (8, 4, 4), focus=rules),
        Case("N = 4, Br = 1, Bc = 2", (4, 1, 2), focus=positions),
        Case("N = 5, Br = Bc = 8 (one tile, Br > N)", (5, 8, 8),
             focus="a tile larger than N: one tile, clipped at N"),
        Case("N = 6, Br = Bc = 1 (1 x 1 tiles: the sanity check of exercise 1)", (6, 1, 1),
             focus="1 x 1 tiles: a query sees its own key, so the diagonal tiles are FULL"),
        Case("N = 10, Br = Bc = 4 (ragged last tile)", (10, 4, 4), focus=ragged),
        Case("N = 10, Br = 4, Bc = 3 (the staircase printed after exercise 1)", (10, 4, 3),
             focus=positions),
        Case("N = 10, Br = 3, Bc = 4 (Br != Bc)", (10, 3, 4), focus=positions),
        Case("N = 12, Br = 6, Bc = 2", (12, 6, 2), focus=positions),
        Case("N = 1024, Br = Bc = 128 (the 8 x 8 map of section 6)", (1024, 128, 128),
             focus=rules),
        Case("N = 1000, Br = 128, Bc = 64", (1000, 128, 64), focus=ragged + ", with Br != Bc"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N = int(rng.integers(1, 300))
        Br, Bc = (int(b) for b in rng.integers(1, 48, size=2))
        label = f"random case {t + 1}: N = {N}, Br = {Br}, Bc = {Bc}"
        cases.append(Case(label, (N, Br, Bc), focus=rules))
    return cases


def _ragged_shape(fn, cases, name):
    """Name the ragged-tile mistake when the map has N // Br x N // Bc tiles (shape mismatch)."""
    for case in cases:
        N, Br, Bc = case.args
        want = (-(-N // Br), -(-N // Bc))
        try:
            got = np.shape(call_learner(fn, *case.args, name=name))
        except _LearnerRaised:
            return  # run_cases reports it with its input
        if got == want:
            continue
        if got == (N // Br, N // Bc) or (want[0] > N // Br and got[0] == N // Br):
            m = RAGGED_TILE_MAP
            raise CheckFailure(
                f"✗ {name}: the tile map has shape {got}, expected {want} on {case.label}.\n"
                f"  likely mistake: {m.title} [misconception: {m.slug}]\n  {m.explanation}"
            )
        return


def check_causal_tile_map(fn: Callable, seed: int | None = 0, trials: int = 12) -> None:
    """Check causal_tile_map(N, Br, Bc) -> int array (ceil(N/Br), ceil(N/Bc)) of SKIP/MASK/FULL.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
    """
    name = "causal_tile_map"
    cases = _tile_map_cases(seed, trials)
    if callable(fn):
        _ragged_shape(fn, cases, name)
    run_cases(
        name,
        fn,
        _tile_map_reference,
        cases,
        outputs=("tile map",),
        mistakes=TILE_MAP_MISTAKES,  # a mistake right on a case is never named there (_core)
        rtol=0.0,
        atol=0.0,
        summary="ragged N, Br != Bc, Br > N",
        low_precision_below=None,
    )


# ---- the rules of exercise 2: how the answer is computed -------------------------------------
FULL_SCORES = Mistake(
    "full-score-matrix",
    "the N x N_k score matrix (S, or P) is built whole",
    "The point of the tiled forward is that no N x N_k array ever exists: per query tile you "
    "hold Q_i, one K_j and V_j, the Br x Bc score tile and m_i, l_i, acc. Compute "
    "s_ij = tau * (q_i @ k_j.T) inside the loop over K/V tiles, and never call a softmax (or a "
    "logsumexp) on all the scores.",
    functools.partial(_flash_variant, scores="whole"),
)
OVER_BUDGET = Mistake(
    "over-memory-budget",
    "far more than a few tiles are held at once",
    "Per query tile you may hold Q_i, one K_j and V_j, the score tile and m_i, l_i, acc, besides "
    "O, lse and a copy of the inputs. Look for an array that grows with N_k: a causal mask built "
    "whole (np.tri(N, N_k): build each tile's mask from its global indices instead), the score "
    "tiles of a query tile joined into one Br x N_k row (np.concatenate), a list of all tiles.",
    lambda *a, **k: None,
)
IGNORES_BC = Mistake(
    "ignores-tile-size",
    "K and V are not read in tiles of Bc rows",
    "The inner loop reads one K/V tile of Bc rows at a time: K[j:j + Bc] and V[j:j + Bc] for "
    "j in range(0, N_k, Bc). Reading all the keys at once (K.T for the whole row of scores) or "
    "a tile size of your own (a fixed 16, or Br) ignores the Bc the caller asked for.",
    functools.partial(_flash_variant, kv_tile=0),
)
IGNORES_BR = Mistake(
    "ignores-tile-size",
    "Q is not read in tiles of Br rows",
    "The outer loop takes one query tile of Br rows at a time: Q[i:i + Br] for i in "
    "range(0, N, Br), kept for the whole inner loop. Reading all the queries at once, or a tile "
    "size of your own, ignores the Br the caller asked for.",
    functools.partial(_flash_variant, q_tile=0),
)
NO_CAUSAL_SKIP = Mistake(
    "no-causal-skip",
    "the K/V tiles above the diagonal are read too (the causal loop never stops early)",
    "With causal=True a query tile whose last row is r1 - 1 needs no key after r1 - 1: break out "
    "of the K/V loop when j > r1 - 1, before slicing K[j:j + Bc]. Masking those tiles to -inf "
    "gives the right values, but reads (and computes) about twice the tiles a causal kernel does.",
    functools.partial(_flash_variant, skip="never"),
)
SLICED_ABOVE = Mistake(
    "no-causal-skip",
    "a K/V tile above the diagonal is computed with before the loop stops",
    "Decide first, then compute: test j > r1 - 1 (the tile's first key after its last query) "
    "with the indices alone, and break before any arithmetic with K[j:j + Bc] or V[j:j + Bc]. "
    "A test such as (s == -inf).all() on the tile's scores comes too late: " + TILE_READS,
    functools.partial(_flash_variant, skip="after-use"),
)
KV_RELOADED = Mistake(
    "tile-reloaded",
    "K and V rows are read more than once per query tile",
    "A thread block loads its K/V tile once and uses it for all its Br rows: slice "
    "k_j = K[j:j + Bc] once, then work on k_j (q_i @ k_j.T, or a loop over the rows of q_i that "
    "reads k_j, not K). " + TILE_READS,
    lambda *a, **k: None,
)

_TILE_CASE = Case(
    "N = 30 queries, N_k = 44 keys, d = 4, Br = 8, Bc = 5 (Br != Bc, ragged tiles)",
    (*_qkv(np.random.default_rng(7), 30, 44, 4),),
    {"Br": 8, "Bc": 5},
    focus="the tile sizes: Q in tiles of Br rows, K and V in tiles of Bc rows",
)
_SKIP_CASE = Case(
    "N = 48, d = 4, Br = 6, Bc = 8 (Br < Bc), causal",
    (*_qkv(np.random.default_rng(8), 48, 48, 4),),
    {"Br": 6, "Bc": 8, "causal": True},
    focus="the causal loop: it stops before the first K/V tile above the diagonal",
)
_MEMORY_N, _MEMORY_D, _MEMORY_B = 1024, 8, 64
_MEMORY_CASE = Case(
    f"N = N_k = {_MEMORY_N}, d = {_MEMORY_D}, Br = Bc = {_MEMORY_B}, causal",
    (*_qkv(np.random.default_rng(9), _MEMORY_N, _MEMORY_N, _MEMORY_D),),
    {"Br": _MEMORY_B, "Bc": _MEMORY_B, "causal": True},
    focus="the memory budget: O, lse, a copy of the inputs and a few tiles",
)
frozen(*_TILE_CASE.args, *_SKIP_CASE.args, *_MEMORY_CASE.args)


def memory_allowed(Nq, Nk, d, dv, Br, Bc, item=8) -> int:
    """Bytes the tiled forward may allocate: O and lse, two copies of each input (an astype and a
    scaled copy, say), and six of each tile (Br x Bc scores, Br x d, Bc x d, Br x dv)."""
    outputs = Nq * dv + Nq
    inputs = 2 * (Nq * d + Nk * d + Nk * dv)
    tiles = 6 * (Br * Bc + Br * d + Bc * d + Br * dv)
    return item * (outputs + inputs + tiles)


def _tile_rules() -> Rule:
    """Q in tiles of at most Br rows, K and V in tiles of at most Bc rows, on the tile case.

    Q @ K.T on the whole Q and K (the first step of building S) passes here: the memory rule,
    checked next, names it with its bytes.
    """
    case, (Br, Bc) = _TILE_CASE, (_TILE_CASE.kwargs["Br"], _TILE_CASE.kwargs["Bc"])
    what = "Q is read in tiles of Br rows, K and V in tiles of Bc rows"
    parts = [
        tile_rule(case, what, IGNORES_BC, arg=1, axis=0, limit=Bc),
        tile_rule(case, what, IGNORES_BC, arg=2, axis=0, limit=Bc),
        tile_rule(case, what, IGNORES_BR, arg=0, axis=0, limit=Br),
    ]
    Nq, Nk = len(case.args[0]), len(case.args[1])

    def judge(report, case):
        loads = {k: report.loads[report.traced[k]] for k in (0, 1)}
        if loads[0].widest(0) >= Nq and loads[1].widest(0) >= Nk:
            return None  # all of Q against all of K: S itself, for the memory rule to measure
        for part in parts:
            verdict = part.judge(report, case)
            if verdict is not None:
                return verdict
        return None

    return Rule(case, judge, what, trace=(0, 1, 2))


def _memory_rule() -> Rule:
    case = _MEMORY_CASE
    Q, K, V = case.args
    Br, Bc = case.kwargs["Br"], case.kwargs["Bc"]
    forbidden = 8 * len(Q) * len(K)
    allowed = memory_allowed(len(Q), len(K), Q.shape[1], V.shape[1], Br, Bc)
    base = memory_budget(
        case, allowed, FULL_SCORES, forbidden=forbidden, what="never build an N x N_k array"
    )

    def judge(report, case):
        verdict = base.judge(report, case)
        if verdict is None:
            return None
        # half of S in float64 (or all of it in float32): the scores; less, something else
        mistake = FULL_SCORES if 2 * report.peak >= forbidden else OVER_BUDGET
        return mistake, verdict[1]

    return dataclasses.replace(base, judge=judge)


def _skip_rule() -> Rule:
    # K/V tiles cut once before the query loop count once per query tile: one tile of each input
    # is on chip at a time (Traced._use), as in a thread block.
    case = _SKIP_CASE
    base = bounded_loads_rule(
        case,
        "with causal=True, stop before the first K/V tile above the diagonal (do not read it)",
        NO_CAUSAL_SKIP,
        args=(1, 2),
        reference=_flash_variant,
    )
    Tr = -(-len(case.args[0]) // case.kwargs["Br"])

    def judge(report, case):
        verdict = base.judge(report, case)
        if verdict is None:
            return None
        log = report.loads[report.traced[1]]
        if int(log.counts.max(initial=0)) > Tr:  # more reads than query tiles
            return KV_RELOADED, verdict[1]
        if log.position_loads(0)[-1] >= Tr:  # every query tile read the last key
            return NO_CAUSAL_SKIP, verdict[1]
        return SLICED_ABOVE, verdict[1]

    return dataclasses.replace(base, judge=judge)


def forward_rules() -> list[Rule]:
    """The rules of exercise 2, checked in this order once every value is right."""
    return [_tile_rules(), _memory_rule(), _skip_rule()]


# The stages of exercise 2, in the order the notebook asks to build them: the cases come stage by
# stage, smallest first inside each, so the first failure is named with its stage (run_cases).
PLAIN, RAGGED, CAUSAL, LENGTHS = "plain tiles", "ragged tiles", "causal mask", "N_q != N_k"
FORWARD_STAGES = (PLAIN, RAGGED, CAUSAL, LENGTHS)


def _random_forward_case(rng, stage):
    """Sizes (Nq, Nk, d, Br, Bc) of a random case that belongs to `stage`."""
    d = int(rng.integers(1, 9))
    if stage == PLAIN:  # every tile full: N a multiple of Br and of Bc
        Br, Bc = (int(b) for b in rng.integers(1, 9, size=2))
        step = math.lcm(Br, Bc)
        N = step * int(rng.integers(1, max(1, 48 // step) + 1))
        return N, N, d, Br, Bc
    while True:
        Nq, Nk = (int(n) for n in rng.integers(1, 49, size=2))
        Br, Bc = (int(b) for b in rng.integers(1, 21, size=2))
        if stage == LENGTHS and Nq != Nk:
            return Nq, Nk, d, Br, Bc
        if stage == CAUSAL:
            return Nq, Nq, d, Br, Bc
        if stage == RAGGED and (Nq % Br or Nq % Bc):
            return Nq, Nq, d, Br, Bc


def _flash_cases(seed, trials):
    rng = np.random.default_rng(0)  # the fixed edge cases are the same every time
    one_query = np.array([[1.0]])  # with d = 1 and tau = 1 the keys are the scores
    keys_5a = np.array([[1.0], [3.0], [2.0], [5.0]])
    values_5a = np.array([[10.0], [20.0], [30.0], [40.0]])
    keys_5b = np.log([[2.0], [1.0], [8.0], [4.0]])
    values_5b = np.array([[1.0], [2.0], [3.0], [4.0]])
    keys_5a_large = np.array([[715.0], [720.0], [721.0], [719.0]])  # exp(720) overflows
    keys_apart = np.array([[700.0], [690.0], [710.0], [705.0]])  # row 2 sees the negatives
    two_queries = np.array([[1.0], [-1.0]])
    no_keys = (rng.standard_normal((3, 2)), np.zeros((0, 2)), np.zeros((0, 2)))

    update = "the update of section 4 (m_i, l_i and acc rescaled by alpha when the max grows)"
    mask = "the causal mask: query r sees the keys c <= r, with global indices"
    ragged = "ragged last tiles: range(0, N, Br), the last tile clipped at N"
    big = "a tile larger than N (one tile, clipped at N)"
    large = "scores of several hundred: exp(s - m_new) with each row's own running max"
    positions = "Br != Bc (compare positions, not tile numbers)"
    lengths = "N_k != N: the query tiles cut Q, the key tiles cut K and V"

    def case(stage, label, qkv, Br=None, Bc=None, causal=False, focus=update):
        kwargs = {} if Br is None else {"Br": Br, "Bc": Bc}
        if causal:
            kwargs["causal"] = True
        label += ", causal" if causal else ""
        return Case(label, qkv, kwargs, focus=focus, stage=stage)

    fixed = {
        PLAIN: [  # no mask, every tile full; the worked examples are one query row
            case(PLAIN, "the example of section 5a: scores (1, 3, 2, 5), values (10, 20, 30, 40), "
                 "Bc = 2", (one_query, keys_5a, values_5a), 1, 2),
            case(PLAIN, "the example of section 5b: e^scores = (2, 1, 8, 4), values (1, 2, 3, 4), "
                 "Bc = 2", (one_query, keys_5b, values_5b), 1, 2),
            case(PLAIN, "the example of section 5a with scores of several hundred: "
                 "(715, 720, 721, 719)", (one_query, keys_5a_large, values_5a), 1, 2,
                 focus=large),
            case(PLAIN, "two queries against the keys of section 5a, Br = Bc = 2",
                 (two_queries, keys_5a, values_5a), 2, 2),
            case(PLAIN, "two queries whose scores are 1400 apart: +-(700, 690, 710, 705), "
                 "Br = Bc = 2", (two_queries, keys_apart, values_5a), 2, 2, focus=large),
            case(PLAIN, "N = 4, d = 2, Br = Bc = 2", _qkv(rng, 4, 4, 2), 2, 2),
        ],
        RAGGED: [  # no mask; tiles that do not divide N, Br != Bc, a tile larger than N
            case(RAGGED, "N = 7, d = 3, Br = 3, Bc = 2 (ragged tiles)", _qkv(rng, 7, 7, 3), 3, 2,
                 focus=ragged),
            case(RAGGED, "N = 7, d = 3, Br = 2, Bc = 3 (ragged, Br < Bc)", _qkv(rng, 7, 7, 3),
                 2, 3, focus=ragged),
            case(RAGGED, "N = 10, d = 4, default tiles Br = Bc = 16", _qkv(rng, 10, 10, 4),
                 focus=big),
            case(RAGGED, "N = 37, d = 8, Br = 5, Bc = 6 (many tiles)", _qkv(rng, 37, 37, 8), 5, 6,
                 focus=update + ", over many ragged tiles"),
        ],
        CAUSAL: [
            case(CAUSAL, "N = 3, d = 2, one tile (Br = Bc = 3)", _qkv(rng, 3, 3, 2), 3, 3, True,
                 mask),
            case(CAUSAL, "N = 4, d = 2, Br = Bc = 2", _qkv(rng, 4, 4, 2), 2, 2, True, mask),
            case(CAUSAL, "N = 4, d = 2, Br = Bc = 1 (one score per tile)", _qkv(rng, 4, 4, 2), 1,
                 1, True, mask + " (a 1 x 1 tile on the diagonal is visible)"),
            case(CAUSAL, "N = 5, d = 4, Br = Bc = 8 (one tile, Br > N)", _qkv(rng, 5, 5, 4), 8, 8,
                 True, mask + ", in " + big),
            case(CAUSAL, "N = 7, d = 3, Br = 3, Bc = 2 (ragged, Br > Bc)", _qkv(rng, 7, 7, 3), 3,
                 2, True, mask + ", with ragged tiles and " + positions),
            case(CAUSAL, "N = 7, d = 3, Br = 2, Bc = 3 (ragged, Br < Bc)", _qkv(rng, 7, 7, 3), 2,
                 3, True, mask + ", with ragged tiles and " + positions),
            case(CAUSAL, "N = 9, d = 3, Br = 4, Bc = 3, scores of several hundred",
                 _qkv(rng, 9, 9, 3, spread=18.0), 4, 3, True, large + ", under the causal mask"),
            case(CAUSAL, "N = 12, d = 4, Br = 8, Bc = 3", _qkv(rng, 12, 12, 4), 8, 3, True,
                 mask + ", with " + positions),
            case(CAUSAL, "N = 37, d = 8, Br = 4, Bc = 3 (many tiles)", _qkv(rng, 37, 37, 8), 4, 3,
                 True, mask + ", over many tiles"),
            case(CAUSAL, "N = 100, d = 32, Br = 16, Bc = 12 (the size of the cell after exercise "
                 "2)", _qkv(rng, 100, 100, 32), 16, 12, True, mask + ", with Br != Bc"),
        ],
        LENGTHS: [  # no mask; as many keys as you like, none at all included
            case(LENGTHS, "N = 3 queries and no keys at all (N_k = 0)", no_keys, 2, 2,
                 focus="no keys at all (N_k = 0): O = 0 and lse = -inf, without NaN"),
            case(LENGTHS, "N = 9 queries, N_k = 4 keys, d = 2, Br = 4, Bc = 3",
                 _qkv(rng, 9, 4, 2), 4, 3, focus=lengths),
            case(LENGTHS, "N = 5 queries, N_k = 9 keys, d = 2, Br = 2, Bc = 4",
                 _qkv(rng, 5, 9, 2), 2, 4, focus=lengths),
        ],
    }  # fmt: skip
    focus = {PLAIN: update, RAGGED: ragged, CAUSAL: mask, LENGTHS: lengths}
    drawn = {stage: [] for stage in FORWARD_STAGES}
    rng = np.random.default_rng(seed)
    for t in range(trials):  # the random cases, spread over the stages in turn
        stage = FORWARD_STAGES[t % len(FORWARD_STAGES)]
        Nq, Nk, d, Br, Bc = _random_forward_case(rng, stage)
        drawn[stage].append((Nq * Nk, t, (Nq, Nk, d, Br, Bc), _qkv(rng, Nq, Nk, d)))
    cases, t = [], 0
    for stage in FORWARD_STAGES:  # the fixed cases, then the random ones smallest first
        cases += fixed[stage]
        for _, _, (Nq, Nk, d, Br, Bc), qkv in sorted(drawn[stage], key=lambda x: x[:2]):
            t += 1
            label = f"random case {t}: N = {Nq}, N_k = {Nk}, d = {d}, Br = {Br}, Bc = {Bc}"
            cases.append(case(stage, label, qkv, Br, Bc, stage == CAUSAL, focus[stage]))
    return cases


def check_flash_attention_forward(fn: Callable, seed: int | None = 0, trials: int = 10) -> None:
    """Check flash_attention_forward(Q, K, V, Br=16, Bc=16, causal=False) -> (O, lse).

    Compared with attention_reference to 1e-10, in four stages, the order in which the notebook
    asks to build the function; a failure names its stage and the stages that pass:

        1. plain tiles   no mask, tiles that divide the lengths (the worked examples of section 5,
                         one query row against four keys; two rows; scores of several hundred);
        2. ragged tiles  no mask, N not a multiple of Br or Bc, Br != Bc, a tile larger than N;
        3. causal mask   causal=True: the tiles above the diagonal skipped, the tiles that cross
                         it masked with global indices, on square, ragged and unequal tiles;
        4. N_q != N_k    no mask, fewer or more keys than queries, and no keys at all (N_k = 0:
                         O = 0, lse = -inf).

    O is compared first on every case, then lse. Then the rules of the exercise (forward_rules),
    each on its own case:

        tiles      Q is read in tiles of at most Br rows, K and V in tiles of at most Bc rows
                   (traced inputs, N = 30, N_k = 44, Br = 8, Bc = 5): `ignores-tile-size`;
        memory     at N = N_k = 1024, d = 8, Br = Bc = 64, causal, the peak of new allocations
                   stays within memory_allowed(...) (720 KiB; S alone is 8 MiB):
                   `full-score-matrix` (`over-memory-budget` below half of S: a whole mask,
                   a row of score tiles joined);
        skip       causal, N = 48, Br = 6, Bc = 8: K and V are read no more often than by a loop
                   that stops before the first tile above the diagonal: `no-causal-skip`
                   (`tile-reloaded` when rows are read more often than there are query tiles).

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases, spread over the four stages, after each stage's fixed
            ones.
    """
    name = "flash_attention_forward"
    if not callable(fn):
        raise CheckFailure(f"{name}: expected a function, got {type(fn).__name__} {fn!r}")
    cases = _flash_cases(seed, trials)
    for k, out_name, mistakes in ((0, "O", FLASH_O_MISTAKES), (1, "lse", FLASH_LSE_MISTAKES)):
        named = [
            Mistake(m.slug, m.title, m.explanation, pick_output(m.fn, k, ("O", "lse"), m.slug))
            for m in mistakes
        ]
        run = functools.partial(
            run_cases,
            name,
            pick_output(fn, k, ("O", "lse"), name),
            lambda *a, k=k, **kw: _reference_forward(*a, **kw)[k],
            cases,
            outputs=(out_name,),
            mistakes=named,
            rtol=1e-10,
            atol=1e-10,
        )
        if k == 0:  # one pass line in the end: swallow the first round's
            with contextlib.redirect_stdout(io.StringIO()):
                run()
        else:
            run(
                summary="O then lse, in 4 stages: plain tiles, ragged tiles, causal mask, "
                "N_q != N_k (N_k = 0 too), with scores of several hundred; tiles of Br and Bc, "
                "no N x N_k array, causal tiles skipped",
                rules=forward_rules(),
            )
