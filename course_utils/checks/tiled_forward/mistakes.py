"""Notebook 03's exercise 2: the float64 reference of flash_attention_forward and its known
mistakes.

    _reference_forward(Q, K, V, Br, Bc, causal) -> (O, lse)   float64
    _flash_variant(Q, K, V, Br, Bc, causal, **bug)            the tiled forward with one bug
    FLASH_O_MISTAKES, FLASH_LSE_MISTAKES                       the named Mistakes of O and lse

Q (N_q, d), K (N_k, d), V (N_k, dv); O (N_q, dv), lse (N_q,).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from course_utils.checks.engine.failures import Mistake
from course_utils.references.attention import attention_reference
from course_utils.references.attention import flash_attention_forward as _tiled_reference

# ---- exercise 2: flash_attention_forward -----------------------------------------------------
_LARGE = (
    2**20
)  # score matrices of this many entries or more are compared with a tiled reference (faster)


def _reference_forward(Q, K, V, Br=16, Bc=16, causal=False):
    """The answer: attention_reference, which materializes S (Br and Bc change nothing).

    On the memory case (N = N_k = 1024) the course's own tiled forward, with large tiles, gives
    the same values (to ~1e-13) in a fraction of the time.
    """
    if len(Q) * len(K) >= _LARGE:
        return _tiled_reference(Q, K, V, Br=128, Bc=128, causal=causal)
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
    rescale_l=True,
    divide=True,
    ragged_q=True,
    ragged_k=True,
    lse_base="e",
    guard=True,
    shift=True,
    alpha_rule="difference",
    row_max=True,
    dtype=np.float64,
    lse_dtype=None,
    q_tile=None,
    kv_tile=None,
    scores="tiles",
):
    """A tiled forward with one (or no) mistake, in the plain style of a learner's first attempt.

    With no keyword-only argument it follows every rule of the exercise: Q is read once per
    query tile, K and V in tiles of Bc rows, and a causal loop stops before it reads the first
    K/V tile above the diagonal. It is the check's measure of how much of K and V a rule-following
    loop reads (bounded_loads_rule).

    Args as flash_attention_forward; the keyword-only args pick the mistake:
        scale: multiply scores by 1/sqrt(d).  visible: the causal mask, "c <= r" (right),
        "c < r", "c <= r + 1", or "tile-local" (np.tri on each tile's local indices).
        skip: how tiles above the diagonal are found: "position" (right), "at-last-row"
        (c0 >= last row, off by one), "tile-index" (j > i), "never" (every tile is computed and
        masked: right values, breaks the rule) or "after-use" (the tile's scores are computed,
        then the loop stops: right values, breaks the rule).  diagonal: tiles crossing the
        diagonal are "mask"ed, "skip"ped, or computed with "no-mask".  combine: "online", or
        "normalize-add" / "normalize-average" (each tile's softmax output added / averaged).
        rescale_acc, rescale_l: rescale acc (and l) when the max grows.  divide: divide acc by l
        at the end.  ragged_q, ragged_k: keep the ragged last query / key tile.  lse_base: "e",
        "2" (the log2 of the sum), "mixed" (m + log2 l), or "no-max" (log l alone).  guard:
        replace a running max of -inf by 0 before subtracting it (no NaN for a row with no keys
        yet).  shift: subtract the running max before exp (False: p = exp(s), which overflows
        for scores above 709).  alpha_rule: "difference" (exp(m_old - m_new), right) or "ratio"
        (exp(m_old) / exp(m_new): inf / inf for scores of several hundred).  row_max: one max per
        row (False: one max for the whole tile, so a row far below it underflows to 0).
        dtype: the type of the inputs, the scores and the running statistics (float32:
        low precision).  lse_dtype: the type of the lse array alone (default dtype).
        q_tile, kv_tile: the tile sizes actually used instead of Br, Bc (0: one
        tile of everything; right values, breaks the tile rule).  scores: "tiles", or "whole"
        (S = Q K^T built once, then sliced: right values, breaks the memory budget).
    """
    Q, K, V = (np.asarray(a, dtype=dtype) for a in (Q, K, V))
    Nq, d = Q.shape
    Nk, dv = len(K), V.shape[1]
    Br = Br if q_tile is None else (q_tile or max(Nq, 1))
    Bc = Bc if kv_tile is None else (kv_tile or max(Nk, 1))
    tau = dtype(1.0 / math.sqrt(d) if scale else 1.0)
    S = tau * (Q @ K.T) if scores == "whole" else None
    O = np.zeros((Nq, dv), dtype=dtype)
    lse = np.full(Nq, -np.inf, dtype=lse_dtype or dtype)
    q_stop = Nq if ragged_q else (Nq // Br) * Br
    k_stop = Nk if ragged_k else (Nk // Bc) * Bc
    for ti, i in enumerate(range(0, q_stop, Br)):
        q = Q[i : i + Br]  # once per query tile
        rows = np.arange(i, i + len(q))
        m = np.full(len(rows), -np.inf if shift else 0.0, dtype=dtype)
        l = np.zeros(len(rows), dtype=dtype)
        acc = np.zeros((len(rows), dv), dtype=dtype)
        o_sum = np.zeros_like(acc)
        n_tiles = 0
        for tj, j in enumerate(range(0, k_stop, Bc)):
            cols = np.arange(j, min(j + Bc, Nk))
            k_j = v_j = s = None
            if causal and skip == "after-use":  # the tile's scores first, then the loop stops
                k_j, v_j = K[j : j + Bc], V[j : j + Bc]
                s = tau * (q @ k_j.T)
                if j > rows[-1]:
                    break
            if causal:
                if skip == "tile-index":
                    above, crosses = tj > ti, tj == ti
                else:
                    above = {
                        "position": j > rows[-1],
                        "after-use": j > rows[-1],
                        "at-last-row": j >= rows[-1],
                        "never": False,
                    }[skip]
                    crosses = cols[-1] > rows[0]
                if above:
                    continue
                if crosses and diagonal == "skip":
                    continue
            if k_j is None:  # after the skip: a skipped tile is never read
                k_j, v_j = K[j : j + Bc], V[j : j + Bc]
            if S is None:
                s = tau * (q @ k_j.T) if s is None else s
            else:
                s = S[i : i + len(q), j : j + len(k_j)]
            if causal:
                if visible == "tile-local":
                    s = np.where(np.tri(len(rows), len(cols), dtype=bool), s, -np.inf)
                elif crosses and diagonal == "mask":
                    r, c = rows[:, None], cols[None, :]
                    seen = {"c <= r": c <= r, "c < r": c < r, "c <= r + 1": c <= r + 1}[visible]
                    s = np.where(seen, s, -np.inf)
            n_tiles += 1
            if not shift:
                m_new = np.zeros(len(rows), dtype=dtype)
            elif row_max:
                m_new = np.maximum(m, s.max(axis=1))
            else:  # one max for the whole tile (and the rows of the query tile)
                m_new = np.maximum(m, s.max(initial=-np.inf))
            m_sub = np.where(np.isneginf(m_new), 0.0, m_new).astype(dtype) if guard else m_new
            p = np.exp(s - m_sub[:, None])
            alpha = np.exp(m - m_sub) if alpha_rule == "difference" else np.exp(m) / np.exp(m_sub)
            if combine != "online":  # this tile's own softmax output, normalized on its own
                m_t = s.max(axis=1)
                p_t = np.exp(s - np.where(np.isneginf(m_t), 0.0, m_t)[:, None])
                l_t = p_t.sum(axis=1)
                o_sum += np.divide(p_t @ v_j, l_t[:, None], where=l_t[:, None] > 0, out=0 * acc)
            l = (alpha * l if rescale_l else l) + p.sum(axis=1)
            acc = (alpha[:, None] * acc if rescale_acc else acc) + p @ v_j
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
_LOW_PRECISION = (
    "Your values agree with the reference to about 7 digits, as a computation in float32 does "
    "(here the inputs, the scores or m_i, l_i, acc are float32). This exercise runs in float64 "
    "to 1e-10: keep everything float64 (np.zeros(..) is float64; np.zeros_like(x) and astype "
    "take x's type). On a GPU the statistics are float32, never bf16."
)

FLASH_O_MISTAKES = [
    Mistake(
        "nan-masked",
        "NaN from a row with no keys (the -inf max is subtracted)",
        "With no key at all (N_k = 0), or before a row has seen a key, m_i is -inf and "
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
        "rescale-acc-not-l",
        "acc is rescaled when the max grows, but l is not",
        "l and acc are both sums of exp(s - m) relative to the current max; when the max grows "
        "both must be multiplied by alpha = exp(m_old - m_new): l = alpha * l + p.sum(axis=1). "
        "An l left unrescaled holds old terms at their old scale, so acc / l is too small.",
        rescale_l=False,
    ),
    _flash_mistake(
        "no-max-shift",
        "exp(s) without subtracting the running max (overflows for scores above 709)",
        "exp(710) is inf in float64, and inf / inf is NaN. The online softmax keeps the running "
        "max m_i of each row and computes exp(s - m_new), which is at most 1, and rescales the "
        "old sums by alpha = exp(m_old - m_new) when the max grows.",
        shift=False,
    ),
    _flash_mistake(
        "alpha-as-ratio",
        "the rescale factor is exp(m_old) / exp(m_new) (inf / inf for large scores)",
        "exp(m_old) and exp(m_new) overflow separately once the scores pass 709, although their "
        "ratio is a fine number. Compute the difference first: alpha = exp(m_old - m_new).",
        alpha_rule="ratio",
    ),
    _flash_mistake(
        "tile-max-not-row-max",
        "one max for the whole tile instead of one per row",
        "Each query row has its own softmax, so each row keeps its own running max: "
        "s.max(axis=1), not s.max(). With one max for the tile, a row whose scores are far below "
        "another row's has exp(s - m) = 0 for all its keys (it underflows) and loses its output.",
        row_max=False,
    ),
    _flash_mistake(
        "tile-max-not-row-max",
        "one max for the whole tile instead of one per row (and 0 / 0 gives NaN)",
        "Each query row has its own softmax, so each row keeps its own running max: "
        "s.max(axis=1), not s.max(). With one max for the tile, a row whose scores are far below "
        "another row's has exp(s - m) = 0 for all its keys (it underflows) and loses its output.",
        row_max=False,
        guard=False,
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
FLASH_O_MISTAKES.append(  # last: it matches any answer computed in float32
    _flash_mistake("low-precision", "the computation runs in float32", _LOW_PRECISION,
                   dtype=np.float32)
)  # fmt: skip

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
    _flash_mistake(
        "low-precision",
        "lse is stored in float32",
        _LOW_PRECISION,
        lse_dtype=np.float32,
    ),
]


def _qkv(rng, Nq, Nk, d, spread=1.5):
    Q = spread * rng.standard_normal((Nq, d))
    K = spread * rng.standard_normal((Nk, d))
    V = rng.standard_normal((Nk, d))
    return Q, K, V
