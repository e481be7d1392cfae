"""Checks for notebook 03, the tiled FlashAttention forward in NumPy.

    check_causal_tile_map(fn)            causal_tile_map(N, Br, Bc) -> (Tr, Tc) tile kinds
    check_flash_attention_forward(fn)    flash_attention_forward(Q, K, V, Br, Bc, causal)
    check_quick_scores_mib(answer)       one head's score matrix at N = 16,384 in bf16, in MiB
    check_quick_causal_tiles(answer)     causal score tiles computed at N = 16,384, B = 128
    check_quick_traffic_ratio(answer)    standard / FlashAttention HBM traffic, Br = 128, d = 64

Every check runs the learner's function on cases ordered smallest first (the worked examples of
the lesson and the textbook, then edge cases: ragged lengths, Br != Bc, Br > N, Nq != Nk, no keys;
then random cases) and names the misconception behind a wrong answer. The buggy implementations
that show each misconception are in TILE_MAP_MISTAKES, FLASH_O_MISTAKES and FLASH_LSE_MISTAKES.

The forward pass is checked in two rounds: O on every case first, then lse. A mistake in O (the
mask, the rescale, the tiles) is then named whatever the learner did with lse, and a base-2 lse is
named once O is right.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
from collections.abc import Callable

import numpy as np

from ..attention import attention_reference
from ..widgets.tile_grid import FULL, MASK, SKIP, tile_kinds
from ._core import (
    Case,
    CheckFailure,
    Mistake,
    _LearnerRaised,
    call_learner,
    pick_output,
    run_cases,
)
from ._core import (
    hinted_answer as _hinted,
)

__all__ = [
    "FLASH_LSE_MISTAKES",
    "FLASH_O_MISTAKES",
    "TILE_MAP_MISTAKES",
    "check_causal_tile_map",
    "check_flash_attention_forward",
    "check_quick_causal_tiles",
    "check_quick_scores_mib",
    "check_quick_traffic_ratio",
]


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
    cases = [
        Case("N = 8, Br = Bc = 4 (2 x 2 tiles)", (8, 4, 4)),
        Case("N = 4, Br = 1, Bc = 2", (4, 1, 2)),
        Case("N = 5, Br = Bc = 8 (one tile, Br > N)", (5, 8, 8)),
        Case("N = 6, Br = Bc = 1 (one score per tile)", (6, 1, 1)),
        Case("N = 10, Br = Bc = 4 (ragged last tile)", (10, 4, 4)),
        Case("N = 10, Br = 4, Bc = 3 (Br != Bc)", (10, 4, 3)),
        Case("N = 10, Br = 3, Bc = 4 (Br != Bc)", (10, 3, 4)),
        Case("N = 12, Br = 6, Bc = 2", (12, 6, 2)),
        Case("N = 1024, Br = Bc = 128 (8 x 8 tiles)", (1024, 128, 128)),
        Case("N = 1000, Br = 128, Bc = 64", (1000, 128, 64)),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N = int(rng.integers(1, 300))
        Br, Bc = (int(b) for b in rng.integers(1, 48, size=2))
        cases.append(Case(f"random case {t + 1}: N = {N}, Br = {Br}, Bc = {Bc}", (N, Br, Bc)))
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


# ---- exercise 2: flash_attention_forward -----------------------------------------------------
def _reference_forward(Q, K, V, Br=16, Bc=16, causal=False):
    """The answer: attention_reference, which materializes S (Br and Bc change nothing)."""
    return attention_reference(Q, K, V, causal=causal)


def _flash_variant(
    Q,
    K,
    V,
    Br=16,
    Bc=16,
    causal=False,
    *,
    scale=True,
    visible="c <= r",
    skip="position",
    diagonal="mask",
    combine="online",
    rescale_acc=True,
    divide=True,
    ragged_q=True,
    ragged_k=True,
    lse_base="e",
    guard=True,
):
    """A tiled forward with one (or no) mistake, in the plain style of a learner's first attempt.

    Args as flash_attention_forward; the keyword-only args pick the mistake:
        scale: multiply scores by 1/sqrt(d).  visible: the causal mask, "c <= r" (right),
        "c < r", "c <= r + 1", or "tile-local" (np.tri on each tile's local indices).
        skip: how tiles above the diagonal are found: "position" (right), "at-last-row"
        (c0 >= last row, off by one) or "tile-index" (j > i).  diagonal: tiles crossing the
        diagonal are "mask"ed, "skip"ped, or computed with "no-mask".  combine: "online", or
        "normalize-add" / "normalize-average" (each tile's softmax output added / averaged).
        rescale_acc: rescale acc as well as l.  divide: divide acc by l at the end.
        ragged_q, ragged_k: keep the ragged last query / key tile.  lse_base: "e", "2" (the
        log2 of the sum) or "mixed" (m + log2 l), or "no-max" (log l alone).  guard: replace a
        running max of -inf by 0 before subtracting it (no NaN for a row with no keys yet).
    """
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    Nq, d = Q.shape
    Nk = len(K)
    tau = 1.0 / math.sqrt(d) if scale else 1.0
    O = np.zeros((Nq, V.shape[1]))
    lse = np.full(Nq, -np.inf)
    q_stop = Nq if ragged_q else (Nq // Br) * Br
    k_stop = Nk if ragged_k else (Nk // Bc) * Bc
    for ti, i in enumerate(range(0, q_stop, Br)):
        rows = np.arange(i, min(i + Br, Nq))
        m = np.full(len(rows), -np.inf)
        l = np.zeros(len(rows))
        acc = np.zeros((len(rows), V.shape[1]))
        o_sum = np.zeros_like(acc)
        n_tiles = 0
        for tj, j in enumerate(range(0, k_stop, Bc)):
            cols = np.arange(j, min(j + Bc, Nk))
            s = tau * (Q[rows] @ K[cols].T)
            if causal:
                if skip == "tile-index":
                    above, crosses = tj > ti, tj == ti
                else:
                    above = j >= rows[-1] if skip == "at-last-row" else j > rows[-1]
                    crosses = cols[-1] > rows[0]
                if above:
                    continue
                if crosses and diagonal == "skip":
                    continue
                if visible == "tile-local":
                    s = np.where(np.tri(len(rows), len(cols), dtype=bool), s, -np.inf)
                elif crosses and diagonal == "mask":
                    r, c = rows[:, None], cols[None, :]
                    seen = {"c <= r": c <= r, "c < r": c < r, "c <= r + 1": c <= r + 1}[visible]
                    s = np.where(seen, s, -np.inf)
            n_tiles += 1
            m_new = np.maximum(m, s.max(axis=1))
            m_sub = np.where(np.isneginf(m_new), 0.0, m_new) if guard else m_new
            p = np.exp(s - m_sub[:, None])
            alpha = np.exp(m - m_sub)
            if combine != "online":  # this tile's own softmax output, normalized on its own
                m_t = s.max(axis=1)
                p_t = np.exp(s - np.where(np.isneginf(m_t), 0.0, m_t)[:, None])
                l_t = p_t.sum(axis=1)
                o_sum += np.divide(p_t @ V[cols], l_t[:, None], where=l_t[:, None] > 0, out=0 * acc)
            l = alpha * l + p.sum(axis=1)
            acc = (alpha[:, None] * acc if rescale_acc else acc) + p @ V[cols]
            m = m_new
        if combine == "normalize-add":
            out = o_sum
        elif combine == "normalize-average":
            out = o_sum / max(n_tiles, 1)
        elif not divide:
            out = acc
        elif guard:
            out = np.divide(acc, l[:, None], where=l[:, None] > 0, out=np.zeros_like(acc))
        else:
            out = acc / l[:, None]
        O[rows] = out
        with np.errstate(divide="ignore"):
            lse[rows] = {
                "e": m + np.log(l),
                "2": (m + np.log(l)) / math.log(2),
                "mixed": m + np.log2(l),
                "no-max": np.log(l),
            }[lse_base]
    return O, lse


def _flash_mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, functools.partial(_flash_variant, **bug))


_MASK_RULE = (
    "Query r (a global row index) sees key c (a global column index) exactly when c <= r: "
    "np.where(cols[None, :] <= rows[:, None], s, -np.inf) with rows = i + arange(Br_i) and "
    "cols = j + arange(Bc_j)."
)
_RAGGED = (
    "When Br (or Bc) does not divide N, the last tile is shorter but still there. Loop with "
    "range(0, N, Br) and slice Q[i:i + Br]; slicing past the end is fine in NumPy."
)

FLASH_O_MISTAKES = [
    Mistake(
        "nan-masked",
        "NaN from a row with no keys (the -inf max is subtracted)",
        "With no key at all (Nk = 0), or before a row has seen a key, m_i is -inf and "
        "exp(s - m_i) or exp(m_old - m_new) is exp(-inf - (-inf)) = NaN, and acc / l is 0 / 0. "
        "Subtract np.where(m_new == -inf, 0, m_new) instead, and write O = 0, lse = -inf for a "
        "row whose l is 0.",
        functools.partial(_flash_variant, guard=False),
    ),
    _flash_mistake(
        "missing-scale",
        "the scores are not multiplied by 1/sqrt(d)",
        "The scores are S = Q K^T / sqrt(d) (tau = 1/sqrt(d)); without the scale the softmax is "
        "too sharp for d > 1. Scale the score tile before the max and the exp.",
        scale=False,
    ),
    _flash_mistake(
        "normalize-then-add",
        "each tile's softmax output is normalized on its own, then the tiles are added",
        "A tile's normalized output is only part of the answer; its weight is its share of the "
        "row's softmax mass, which is known only at the end. Keep acc unnormalized, rescale it "
        "by exp(m_old - m_new) when the max grows, and divide by l once at the end.",
        combine="normalize-add",
    ),
    _flash_mistake(
        "normalize-then-average",
        "each tile's softmax output is normalized on its own, then the tiles are averaged",
        "A plain average gives every tile the same weight, but a tile's weight is its share of "
        "the softmax mass. Keep acc unnormalized, rescale it with l, divide once at the end.",
        combine="normalize-average",
    ),
    _flash_mistake(
        "rescale-l-not-acc",
        "l is rescaled when the max grows, but acc is not",
        "acc and l are both sums of exp(s - m) relative to the current max; when the max grows "
        "both must be multiplied by alpha = exp(m_old - m_new): acc = alpha[:, None] * acc + "
        "p @ V_j.",
        rescale_acc=False,
    ),
    _flash_mistake(
        "no-final-divide",
        "acc is not divided by l at the end",
        "acc = sum_j exp(s_j - m) v_j is unnormalized; the output is acc / l[:, None], once, "
        "after the last K/V tile.",
        divide=False,
    ),
    _flash_mistake(
        "causal-off-by-one",
        "the causal mask hides the diagonal (c < r instead of c <= r)",
        _MASK_RULE + " A query sees its own key.",
        visible="c < r",
    ),
    _flash_mistake(
        "causal-off-by-one",
        "the causal mask hides the diagonal (c < r), and the empty row gives NaN",
        _MASK_RULE + " A query sees its own key.",
        visible="c < r",
        guard=False,
    ),
    _flash_mistake(
        "causal-off-by-one",
        "the causal mask lets each query see one future key (c <= r + 1)",
        _MASK_RULE,
        visible="c <= r + 1",
    ),
    _flash_mistake(
        "causal-off-by-one",
        "the loop stops one tile early (a K/V tile starting at the last query row is skipped)",
        "A K/V tile starting at key j is needed while j <= the tile's last query row i + Br_i - 1; "
        "skip (break) only when j > i + Br_i - 1.",
        skip="at-last-row",
    ),
    _flash_mistake(
        "diagonal-tile-skipped",
        "the causal mask is applied by skipping whole tiles that cross the diagonal",
        "A tile that crosses the diagonal holds visible scores too; skipping it drops them. "
        "Compute it and set only the scores with c > r to -inf.",
        diagonal="skip",
    ),
    _flash_mistake(
        "diagonal-tile-skipped",
        "the causal mask is applied by skipping whole diagonal tiles (and 0 / 0 gives NaN)",
        "A tile that crosses the diagonal holds visible scores too; skipping it drops them, and "
        "the first rows are left with no key at all. Compute it and mask only c > r.",
        diagonal="skip",
        guard=False,
    ),
    _flash_mistake(
        "causal-skip-without-mask",
        "tiles above the diagonal are skipped, but tiles crossing it are not masked",
        "Skipping the tiles above the diagonal is half of the causal mask. A tile that crosses "
        "the diagonal still holds future keys: set the scores with c > r to -inf there.",
        diagonal="no-mask",
    ),
    _flash_mistake(
        "tile-local-mask",
        "the causal mask uses the tile's local indices (np.tri of the tile)",
        "np.tri(Br, Bc) is the right mask only for a square tile that sits exactly on the "
        "diagonal. Use global indices: " + _MASK_RULE,
        visible="tile-local",
    ),
    _flash_mistake(
        "tile-index-not-position",
        "the causal loop compares tile numbers (j > i) instead of positions",
        "Tile numbers line up with the diagonal only when Br == Bc. Skip a K/V tile when its "
        "first key j*Bc is after the tile's last query row, and mask with global indices.",
        skip="tile-index",
    ),
]
for _q, _k, _where in (
    (False, True, "query"),
    (True, False, "key"),
    (False, False, "query and key"),
):
    for _guard in (True, False):
        FLASH_O_MISTAKES.append(
            _flash_mistake(
                "ragged-tile",
                f"the ragged last {_where} tile is dropped (N // B tiles instead of ceil(N / B))",
                _RAGGED,
                ragged_q=_q,
                ragged_k=_k,
                guard=_guard,
            )
        )

_LSE_EXPLANATION = (
    "lse_i = m_i + log(l_i) in natural log: the backward pass recomputes P = exp(S - lse), and "
    "the merge of partial results uses exp(lse_A - lse). A base-2 kernel (exp2, log2) must "
    "convert back: multiply a base-2 lse by ln 2."
)
FLASH_LSE_MISTAKES = [
    _flash_mistake("base2-lse", "lse in base 2 (log2 of the sum)", _LSE_EXPLANATION, lse_base="2"),
    _flash_mistake("base2-lse", "lse mixes bases (m + log2 l)", _LSE_EXPLANATION, lse_base="mixed"),
    _flash_mistake(
        "lse-without-max",
        "lse is log(l) without the running max",
        "l_i is the sum of exp(s - m_i), relative to the max; the logsumexp of the row is "
        "m_i + log(l_i).",
        lse_base="no-max",
    ),
]


def _qkv(rng, Nq, Nk, d, spread=1.5):
    Q = spread * rng.standard_normal((Nq, d))
    K = spread * rng.standard_normal((Nk, d))
    V = rng.standard_normal((Nk, d))
    return Q, K, V


def _flash_cases(seed, trials):
    rng = np.random.default_rng(0)  # the fixed edge cases are the same every time
    one_query = np.array([[1.0]])  # with d = 1 and tau = 1 the keys are the scores
    textbook_k = np.array([[1.0], [3.0], [2.0], [5.0]])
    textbook_v = np.array([[10.0], [20.0], [30.0], [40.0]])
    lesson_k = np.log([[2.0], [1.0], [8.0], [4.0]])
    lesson_v = np.array([[1.0], [2.0], [3.0], [4.0]])
    no_keys = (rng.standard_normal((3, 2)), np.zeros((0, 2)), np.zeros((0, 2)))

    def case(label, qkv, Br=None, Bc=None, causal=False):
        kwargs = {} if Br is None else {"Br": Br, "Bc": Bc}
        if causal:
            kwargs["causal"] = True
        return Case(label + (", causal" if causal else ""), qkv, kwargs)

    cases = [
        case("the textbook example: scores [1, 3, 2, 5], values [10, 20, 30, 40], Bc = 2",
             (one_query, textbook_k, textbook_v), 1, 2),
        case("the lesson example: scores ln [2, 1, 8, 4], values [1, 2, 3, 4], Bc = 2",
             (one_query, lesson_k, lesson_v), 1, 2),
        case("two queries against the textbook keys, Br = Bc = 2",
             (np.array([[1.0], [-1.0]]), textbook_k, textbook_v), 2, 2),
        case("N = 4, d = 2, Br = Bc = 2", _qkv(rng, 4, 4, 2), 2, 2),
        case("N = 3, d = 2, one tile (Br = Bc = 3)", _qkv(rng, 3, 3, 2), 3, 3, True),
        case("N = 4, d = 2, Br = Bc = 2", _qkv(rng, 4, 4, 2), 2, 2, True),
        case("N = 4, d = 2, Br = Bc = 1 (one score per tile)", _qkv(rng, 4, 4, 2), 1, 1, True),
        case("N = 7, d = 3, Br = 3, Bc = 2 (ragged tiles)", _qkv(rng, 7, 7, 3), 3, 2),
        case("N = 7, d = 3, Br = 3, Bc = 2 (ragged, Br > Bc)", _qkv(rng, 7, 7, 3), 3, 2, True),
        case("N = 7, d = 3, Br = 2, Bc = 3 (ragged, Br < Bc)", _qkv(rng, 7, 7, 3), 2, 3, True),
        case("Nq = 5 queries, Nk = 9 keys, d = 2, Br = 2, Bc = 4", _qkv(rng, 5, 9, 2), 2, 4),
        case("N = 5, d = 4, Br = Bc = 8 (one tile, Br > N)", _qkv(rng, 5, 5, 4), 8, 8, True),
        case("N = 10, d = 4, default tiles Br = Bc = 16", _qkv(rng, 10, 10, 4)),
        case("N = 12, d = 4, Br = 8, Bc = 3", _qkv(rng, 12, 12, 4), 8, 3, True),
        case("Nq = 3 queries and no keys at all (Nk = 0)", no_keys, 2, 2),
        case("N = 37, d = 8, Br = 4, Bc = 3 (many tiles)", _qkv(rng, 37, 37, 8), 4, 3, True),
        case("N = 37, d = 8, Br = 5, Bc = 6 (many tiles)", _qkv(rng, 37, 37, 8), 5, 6),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        causal = bool(rng.integers(2))
        Nq = int(rng.integers(1, 49))
        Nk = Nq if causal or rng.random() < 0.5 else int(rng.integers(1, 49))
        d = int(rng.integers(1, 9))
        Br, Bc = (int(b) for b in rng.integers(1, 21, size=2))
        label = f"random case {t + 1}: Nq = {Nq}, Nk = {Nk}, d = {d}, Br = {Br}, Bc = {Bc}"
        cases.append(case(label, _qkv(rng, Nq, Nk, d), Br, Bc, causal))
    return cases


def check_flash_attention_forward(fn: Callable, seed: int | None = 0, trials: int = 10) -> None:
    """Check flash_attention_forward(Q, K, V, Br=16, Bc=16, causal=False) -> (O, lse).

    Compared with attention_reference to 1e-10: first O on every case, then lse.

    Args:
        fn: the learner's function.  seed: random cases' seed (None: fresh ones).
        trials: how many random cases after the fixed ones.
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
            run(summary="O then lse; causal and not, ragged N, Br != Bc, Br > N, Nq != Nk, Nk = 0")


# ---- quick checks ----------------------------------------------------------------------------


def check_quick_scores_mib(answer) -> None:
    """One head's score matrix S at N = 16,384 in bf16, in MiB (2^20 bytes)."""
    N, bf16 = 16_384, 2
    expected = N * N * bf16 / 2**20
    _hinted(
        "memory of one head's S at N = 16,384 in bf16 (MiB)",
        answer,
        expected,
        [
            (N * N * bf16 / 1e6, "that is in MB (10^6 bytes); 1 MiB is 2^20 = 1,048,576 bytes"),
            (N * N * 4 / 2**20, "bf16 takes 2 bytes per number, not 4"),
            (N * N * 8 / 2**20, "bf16 takes 2 bytes per number, not 8"),
            (N * N / 2**20, "each number takes 2 bytes in bf16"),
        ],
        "S has N x N numbers of 2 bytes each; divide the bytes by 2^20 for MiB",
    )


def check_quick_causal_tiles(answer) -> None:
    """Score tiles a causal kernel computes at N = 16,384 with square tiles B = 128."""
    T = 16_384 // 128
    expected = T * (T + 1) // 2
    _hinted(
        "score tiles computed by a causal kernel (N = 16,384, B = 128)",
        answer,
        expected,
        [
            (T * T, "that is every tile; the tiles above the diagonal are skipped"),
            (T * (T - 1) // 2, "the T tiles on the diagonal are computed too (with the mask)"),
            (T * T / 2, "count exactly: the diagonal tiles are computed in full, not half"),
        ],
        "T = N / B tiles per side; row i of tiles computes tiles 0..i",
        rtol=0.0,
    )


def check_quick_traffic_ratio(answer) -> None:
    """Standard / FlashAttention HBM traffic for N = 16,384, d = 64, Br = 128 (about 2 Br / d)."""
    Br, d = 128, 64
    expected = 2 * Br / d  # the exact ratio at N = 16,384 is 3.98; both are accepted
    _hinted(
        "HBM traffic of standard attention / FlashAttention (Br = 128, d = 64)",
        answer,
        expected,
        [
            (d / (2 * Br), "that is FlashAttention / standard; the question asks the other way"),
            (2.0, "2 is the ratio for d = 128; here d = 64"),
        ],
        "standard ~ 4N^2, FlashAttention ~ 2N^2 d / Br for N >> d; divide the two",
        rtol=0.02,
    )
