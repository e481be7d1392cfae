"""The checks of notebook 03: right answers pass in several styles, every named mistake and every
broken rule is recognized by its slug, and the check cell stays fast."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import time

import numpy as np
import pytest
import scipy.special
from checkhelp import as_learner, run_quietly, slug_of

import course_utils as cu
from course_utils.checks import CheckFailure
from course_utils.checks import tiled_forward as T
from course_utils.checks.engine.watch import instrumented_call
from course_utils.checks.tiled_forward import exercises as T_exercises
from course_utils.references.tiles import FULL, MASK, SKIP, tile_kind, tile_kinds

try:  # a learner's forward in torch (the memory budget refuses it); a NumPy-only lab has none
    import torch
except ImportError:
    torch = None


def causal_tile_map(N, Br, Bc):
    """A learner's answer to exercise 1, written here (not a course_utils function)."""
    kinds = np.empty((-(-N // Br), -(-N // Bc)), dtype=int)
    for i in range(kinds.shape[0]):
        last_row = min(N, (i + 1) * Br) - 1
        for j in range(kinds.shape[1]):
            first_key, last_key = j * Bc, min(N, (j + 1) * Bc) - 1
            if first_key > last_row:
                kinds[i, j] = SKIP
            elif last_key <= i * Br:
                kinds[i, j] = FULL
            else:
                kinds[i, j] = MASK
    return kinds


# ---- learners' forwards: right ones in several styles ------------------------------------------
def flash_attention_forward(Q, K, V, Br=16, Bc=16, causal=False):
    """Exercise 2 in the notebook's style: query tiles outside, K/V tiles inside, break early."""
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        for j in range(0, len(K), Bc):
            if causal and j > rows[-1]:
                break
            k_j, v_j = K[j : j + Bc], V[j : j + Bc]
            cols = np.arange(j, j + len(k_j))
            s = q @ k_j.T / np.sqrt(d)
            if causal:
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - m_safe[:, None])
            alpha = np.exp(m - m_safe)
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v_j
            m = m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def forward_row_loops(Q, K, V, Br=16, Bc=16, causal=False):
    """Explicit loops over the rows of each query tile, reading the loaded K/V tile (not K)."""
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))  # float32-proof
    N, d = Q.shape
    tau = 1 / math.sqrt(d)
    O = np.zeros((N, V.shape[1]))
    lse = np.full(N, -np.inf)
    for i in range(0, N, Br):
        q_tile = Q[i : i + Br]
        state = [[-np.inf, 0.0, np.zeros(V.shape[1])] for _ in range(len(q_tile))]
        k_end = min(len(K), i + len(q_tile)) if causal else len(K)
        for j in range(0, k_end, Bc):
            k_tile, v_tile = K[j : j + Bc], V[j : j + Bc]
            for r in range(len(q_tile)):
                scores = tau * (k_tile @ q_tile[r])  # (Bc,): one query row against the tile
                if causal:
                    scores = np.where(np.arange(j, j + len(k_tile)) <= i + r, scores, -np.inf)
                m_old, l_old, acc_old = state[r]
                m_new = max(m_old, float(scores.max()))
                if m_new == -np.inf:
                    continue
                w = np.exp(scores - m_new)
                scale = math.exp(m_old - m_new)
                state[r] = [m_new, scale * l_old + w.sum(), scale * acc_old + w @ v_tile]
        for r, (m, l, acc) in enumerate(state):
            if l > 0:
                O[i + r] = acc / l
                lse[i + r] = m + math.log(l)
    return O, lse


def forward_einsum(Q, K, V, Br=16, Bc=16, causal=False):
    """np.einsum tiles, astype copies, Q scaled up front, an additive -inf bias for the mask."""
    Q = Q.astype(np.float64) / np.sqrt(Q.shape[1])
    K, V = K.astype(np.float64), V.astype(np.float64)
    O_parts, lse_parts = [], []
    for i in range(0, len(Q), Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))[:, None]
        m = np.full(len(q), -np.inf)
        l = np.zeros(len(q))
        acc = np.zeros((len(q), V.shape[1]))
        for j in range(0, len(K), Bc):
            if causal and j > rows[-1, 0]:
                break
            s = np.einsum("rd,cd->rc", q, K[j : j + Bc])
            if causal:
                s = s + np.where(np.arange(j, j + s.shape[1])[None, :] > rows, -np.inf, 0.0)
            m_new = np.maximum(m, s.max(axis=1))
            shift = np.where(np.isfinite(m_new), m_new, 0.0)
            p = np.exp(s - shift[:, None])
            alpha = np.exp(m - shift)
            l = l * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + np.einsum("rc,cd->rd", p, V[j : j + Bc])
            m = m_new
        with np.errstate(divide="ignore", invalid="ignore"):
            O_parts.append(np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1.0)[:, None], 0.0))
            lse_parts.append(np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf))
    if not O_parts:
        return np.zeros((0, V.shape[1])), np.zeros(0)
    return np.concatenate(O_parts), np.concatenate(lse_parts)


def forward_transposed_split(Q, K, V, Br=16, Bc=16, causal=False):
    """K.T sliced by columns, np.array_split of the visible keys per query tile."""
    N, d = Q.shape
    KT = K.T  # (d, N_k): a view
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        n_keys = rows[-1] + 1 if causal else len(K)
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        n_tiles = -(-n_keys // Bc)
        bounds = np.array_split(np.arange(n_keys), n_tiles) if n_tiles else []
        for cols in bounds:
            j0, j1 = int(cols[0]), int(cols[-1]) + 1
            s = (q @ KT[:, j0:j1]) / math.sqrt(d)
            if causal:
                s[cols[None, :] > rows[:, None]] = -np.inf
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(m_new == -np.inf, 0.0, m_new)
            p = np.exp(s - safe[:, None])
            alpha = np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(1), alpha[:, None] * acc + p @ V[j0:j1], m_new
        ok = l > 0
        O[i : i + len(q)][ok] = acc[ok] / l[ok, None]
        lse[i : i + len(q)][ok] = m[ok] + np.log(l[ok])
    return O, lse


def forward_array_split(Q, K, V, Br=16, Bc=16, causal=False):
    """np.array_split of K and V per query tile (of the visible keys only, when causal)."""
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        keys, values = (K[: rows[-1] + 1], V[: rows[-1] + 1]) if causal else (K, V)
        n = -(-len(keys) // Bc)
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        start = 0
        tiles = zip(np.array_split(keys, n), np.array_split(values, n), strict=True) if n else ()
        for k_j, v_j in tiles:
            cols = np.arange(start, start + len(k_j))
            start += len(k_j)
            s = q @ k_j.T / math.sqrt(d)
            if causal:
                s = np.where(cols <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_j, m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def forward_clipped_at_diagonal(Q, K, V, Br=16, Bc=16, causal=False):
    """Stops exactly at the diagonal: the last K/V tile is clipped to the keys the rows see."""
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        end = rows[-1] + 1 if causal else len(K)
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        for j in range(0, end, Bc):
            k_j, v_j = K[j : min(j + Bc, end)], V[j : min(j + Bc, end)]
            s = q @ k_j.T / math.sqrt(d)
            if causal:
                s = np.where(np.arange(j, j + len(k_j)) <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_j, m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def forward_split_every_tile(Q, K, V, Br=16, Bc=16, causal=False):
    """np.array_split of all of K and V per query tile (views), breaking at the diagonal."""
    N, d = Q.shape
    n = -(-len(K) // Bc)
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        k_tiles = np.array_split(K, n) if n else []
        v_tiles = np.array_split(V, n) if n else []
        start = 0
        for k_j, v_j in zip(k_tiles, v_tiles, strict=True):
            if causal and start > rows[-1]:
                break  # the views above the diagonal are never computed with
            cols = np.arange(start, start + len(k_j))
            start += len(k_j)
            s = q @ k_j.T / math.sqrt(d)
            if causal:
                s = np.where(cols <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_j, m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def forward_key_loops(Q, K, V, Br=16, Bc=16, causal=False):
    """Python loops: Q scaled whole up front (a scaled copy, as section 4 suggests); per query
    tile and K/V tile, a loop over the tile's keys for the score columns and for acc, a loop
    over the query rows for the running state; the causal stop decided before slicing."""
    N, d = Q.shape
    Qs = Q * (1 / math.sqrt(d))
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Qs[i : i + Br]
        n_q = len(q)
        m, l = [-math.inf] * n_q, [0.0] * n_q
        acc = np.zeros((n_q, V.shape[1]))
        for j in range(0, len(K), Bc):
            if causal and j > i + n_q - 1:
                break
            k_j, v_j = K[j : j + Bc], V[j : j + Bc]
            s = np.empty((n_q, len(k_j)))
            for c in range(len(k_j)):
                s[:, c] = q @ k_j[c]
                if causal:
                    s[:, c] = np.where(np.arange(i, i + n_q) >= j + c, s[:, c], -np.inf)
            p = np.zeros(s.shape)
            for r in range(n_q):
                m_new = max(m[r], float(s[r].max()))
                if m_new == -math.inf:
                    continue
                p[r] = np.exp(s[r] - m_new)
                scale = math.exp(m[r] - m_new)
                l[r] = l[r] * scale + float(p[r].sum())
                acc[r] *= scale
                m[r] = m_new
            for c in range(len(v_j)):
                acc += p[:, c : c + 1] * v_j[c]
        for r in range(n_q):
            if l[r] > 0:
                O[i + r] = acc[r] / l[r]
                lse[i + r] = m[r] + math.log(l[r])
    return O, lse


RIGHT_STYLES = [
    flash_attention_forward,
    forward_row_loops,
    forward_einsum,
    forward_transposed_split,
    forward_array_split,
    forward_split_every_tile,
    forward_clipped_at_diagonal,
    forward_key_loops,
]


# ---- learners' forwards that break a rule (right values) ---------------------------------------
def full_softmax(Q, K, V, Br=16, Bc=16, causal=False):
    """The whole score matrix and scipy's softmax: right values, no tiles at all."""
    N, d = Q.shape
    if len(K) == 0:
        return np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    S = Q @ K.T / math.sqrt(d)
    if causal:
        S = np.where(np.tri(N, len(K), dtype=bool), S, -np.inf)
    return scipy.special.softmax(S, axis=1) @ V, scipy.special.logsumexp(S, axis=1)


def tiles_of_a_whole_s(Q, K, V, Br=16, Bc=16, causal=False):
    """S = Q K^T built once, then cut into tiles for the online update."""
    S = Q @ K.T / math.sqrt(Q.shape[1])
    return _online_over(S, V, Br, Bc, causal)


def _online_over(S, V, Br, Bc, causal):
    N, Nk = S.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        rows = np.arange(i, min(i + Br, N))
        m, l, acc = np.full(len(rows), -np.inf), np.zeros(len(rows)), np.zeros((len(rows), 1))
        acc = np.zeros((len(rows), V.shape[1]))
        for j in range(0, Nk, Bc):
            s = S[i : i + Br, j : j + Bc]
            if causal:
                s = np.where(np.arange(j, j + s.shape[1]) <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ V[j : j + Bc], m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def _tiled(Q, K, V, Br, Bc, causal, *, q_rows=None, kv_rows=None, stop="break", mask="tile"):
    """The notebook-style forward with one rule broken (the keyword picks which)."""
    N, d = Q.shape
    Nk = len(K)
    Bq = Br if q_rows is None else (q_rows or N)
    Bk = Bc if kv_rows is None else (kv_rows or max(Nk, 1))
    tri = np.tri(N, Nk, dtype=bool) if causal and mask == "whole" else None
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Bq):
        q = Q[i : i + Bq]
        rows = np.arange(i, i + len(q))
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        stripe = []
        for j in range(0, Nk, Bk):
            k_j, v_j = K[j : j + Bk], V[j : j + Bk]  # views: nothing is read yet
            cols = np.arange(j, j + len(k_j))
            if stop == "after-use":
                s = q @ k_j.T / math.sqrt(d)
                if causal and (cols > rows[-1]).all():  # too late: the tile is read
                    break
            if causal and stop == "break" and j > rows[-1]:
                break
            s = q @ k_j.T / math.sqrt(d)
            if causal:
                ok = cols[None, :] <= rows[:, None] if tri is None else tri[rows][:, cols]
                s = np.where(ok, s, -np.inf)
            if mask == "stripe":  # the tiles of the query tile joined into one row stripe
                stripe.append((s, v_j))
                continue
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_j, m_new
        if mask == "stripe" and stripe:
            s_row = np.concatenate([s for s, _ in stripe], axis=1)
            m = s_row.max(axis=1)
            p = np.exp(s_row - np.where(np.isneginf(m), 0.0, m)[:, None])
            l, start = p.sum(axis=1), 0
            for s, v_j in stripe:
                acc = acc + p[:, start : start + s.shape[1]] @ v_j
                start += s.shape[1]
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def rows_stream_the_keys(Q, K, V, Br=16, Bc=16, causal=False):
    """Each query row of a tile streams through all the K/V tiles on its own."""
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q_tile = Q[i : i + Br]
        for r in range(len(q_tile)):
            row = i + r
            m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])
            for j in range(0, row + 1 if causal else len(K), Bc):
                k_j, v_j = K[j : j + Bc], V[j : j + Bc]
                s = k_j @ q_tile[r] / math.sqrt(d)
                if causal:
                    s = np.where(np.arange(j, j + len(k_j)) <= row, s, -np.inf)
                m_new = max(m, float(s.max()))
                p, alpha = np.exp(s - m_new), math.exp(m - m_new)
                l, acc, m = alpha * l + p.sum(), alpha * acc + p @ v_j, m_new
            if l > 0:
                O[row], lse[row] = acc / l, m + math.log(l)
    return O, lse


def _rule_breaker(**how):
    def learner(Q, K, V, Br=16, Bc=16, causal=False):
        return _tiled(Q, K, V, Br, Bc, causal, **how)

    return learner


RULE_BREAKERS = [
    ("whole S and scipy's softmax", full_softmax, "full-score-matrix"),
    ("S built whole, then tiled", tiles_of_a_whole_s, "full-score-matrix"),
    ("np.tri(N, N) mask", _rule_breaker(mask="whole"), "over-memory-budget"),
    ("a row stripe of score tiles", _rule_breaker(mask="stripe"), "over-memory-budget"),
    ("one K/V tile of all keys", _rule_breaker(kv_rows=0), "ignores-tile-size"),
    ("K/V tiles of a fixed 16", _rule_breaker(kv_rows=16), "ignores-tile-size"),
    ("K/V tiles of Br rows", _rule_breaker(kv_rows=8), "ignores-tile-size"),
    ("all queries at once", _rule_breaker(q_rows=0), "ignores-tile-size"),
    ("query tiles of a fixed 16", _rule_breaker(q_rows=16), "ignores-tile-size"),
    ("never stops, masks everything", _rule_breaker(stop="never"), "no-causal-skip"),
    ("computes the tile, then breaks", _rule_breaker(stop="after-use"), "no-causal-skip"),
    ("re-reads K for every query row", rows_stream_the_keys, "tile-reloaded"),
]


def quiet(fn):
    """fn under np.errstate(all='ignore'), defined in this module (not flagged as course code)."""

    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapped


# ---- right answers pass ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, fn",
    [
        (T.check_causal_tile_map, causal_tile_map),
        (T.check_flash_attention_forward, flash_attention_forward),
    ],
)
def test_right_answer_passes_with_one_pass_line(check, fn):
    printed = run_quietly(check, fn)
    assert printed.count("✓") == 1 and printed.endswith("\n") and printed.count("\n") == 1


@pytest.mark.parametrize("fn", RIGHT_STYLES[1:], ids=lambda f: f.__name__)
def test_right_forwards_in_other_styles_pass_every_rule(fn):
    printed = run_quietly(T.check_flash_attention_forward, fn)
    assert "✓" in printed and "3 rules hold" in printed


@pytest.mark.parametrize(
    "check, fn",
    [
        (T.check_causal_tile_map, causal_tile_map),
        (T.check_flash_attention_forward, flash_attention_forward),
    ],
)
def test_hidden_mode_fresh_inputs_pass(check, fn):
    for _ in range(2):
        assert "✓" in run_quietly(check, fn, seed=None, trials=25)


def test_the_check_cell_is_fast():
    """The graded cells (visible and hidden calls) take well under a second of CPU each (CPU
    time: other processes on a busy CI machine do not count)."""
    quietly = contextlib.redirect_stdout(io.StringIO())
    start = time.process_time()
    with quietly:
        T.check_flash_attention_forward(flash_attention_forward)
        T.check_flash_attention_forward(flash_attention_forward, seed=None, trials=40)
    forward = time.process_time() - start
    with quietly:
        T.check_causal_tile_map(causal_tile_map)
        T.check_causal_tile_map(causal_tile_map, seed=None, trials=40)
    tile_map = time.process_time() - start - forward
    assert forward < 2.0 and tile_map < 0.5, (forward, tile_map)


def test_course_reference_agrees_with_the_checks_cases():
    """The cases the check builds, run through cu.flash_attention_forward, match the oracle."""
    for case in T_exercises._flash_cases(seed=1, trials=30):
        O, lse = cu.flash_attention_forward(*case.args, **case.kwargs)
        O_ref, lse_ref = cu.attention_reference(*case.args, causal=case.kwargs.get("causal", False))
        np.testing.assert_allclose(O, O_ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(lse, lse_ref, rtol=1e-10, atol=1e-10)


def test_rule_following_replay_is_exact_and_the_fast_reference_agrees():
    """_flash_variant without a bug is right (it bounds the loads), and the memory case's tiled
    reference agrees with attention_reference."""
    for case in T_exercises._flash_cases(seed=2, trials=20):
        for got, want in zip(
            T_exercises._flash_variant(*case.args, **case.kwargs),
            cu.attention_reference(*case.args, causal=case.kwargs.get("causal", False)),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    case = T_exercises._MEMORY_CASE
    for got, want in zip(
        T_exercises._reference_forward(*case.args, **case.kwargs),
        cu.attention_reference(*case.args, causal=True),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_flash_cases_cover_the_required_shapes():
    cases = T_exercises._flash_cases(seed=0, trials=0)
    shapes = [(len(c.args[0]), len(c.args[1]), c.kwargs) for c in cases]
    assert any(nk == 0 for _, nk, _ in shapes)  # no keys
    assert any(nq != nk and nk > 0 for nq, nk, _ in shapes)  # Nq != Nk
    assert any(kw.get("Br", 16) > nq for nq, _, kw in shapes)  # Br > N
    assert any(kw.get("causal") and kw["Br"] != kw["Bc"] for _, _, kw in shapes)
    assert any(nq % kw.get("Br", 16) and nq > kw.get("Br", 16) for nq, _, kw in shapes)
    assert any(
        -(-nq // kw.get("Br", 16)) * -(-nq // kw.get("Bc", 16)) >= 100 for nq, _, kw in shapes
    )
    assert all(c.focus for c in cases)


def test_the_forward_cases_come_in_the_four_stages_of_the_notebook():
    """plain tiles, ragged tiles, causal mask, N_q != N_k: contiguous, in that order, and each
    case belongs to its stage; the worked examples open the first one."""
    for seed, trials in ((0, 10), (3, 40)):
        cases = T_exercises._flash_cases(seed=seed, trials=trials)
        order = [c.stage for c in cases]
        runs = [s for k, s in enumerate(order) if k == 0 or order[k - 1] != s]
        assert (
            runs
            == list(T.FORWARD_STAGES)
            == [
                "plain tiles",
                "ragged tiles",
                "causal mask",
                "N_q != N_k",
            ]
        )
        for c in cases:
            Nq, Nk = len(c.args[0]), len(c.args[1])
            Br, Bc = c.kwargs.get("Br", 16), c.kwargs.get("Bc", 16)
            causal = c.kwargs.get("causal", False)
            if c.stage == "plain tiles":
                assert not causal and Nq % Br == 0 and Nk % Bc == 0, c.label
            elif c.stage == "ragged tiles":
                assert not causal and Nq == Nk and (Nq % Br or Nq % Bc), c.label
            elif c.stage == "causal mask":
                assert causal and Nq == Nk, c.label
            else:
                assert not causal and Nq != Nk, c.label
        stage_of = {c.label: c.stage for c in cases}
        assert any(len(c.args[1]) == 0 for c in cases if c.stage == "N_q != N_k")
        assert any(
            c.kwargs.get("Br", 16) > len(c.args[0]) for c in cases if c.stage == "ragged tiles"
        )
        assert stage_of[cases[0].label] == "plain tiles" and "section 5a" in cases[0].label
        assert any("several hundred" in c.label for c in cases if c.stage == "plain tiles")
        for stage in T.FORWARD_STAGES:  # random cases smallest first, after the fixed ones
            drawn = [c for c in cases if c.stage == stage and c.label.startswith("random")]
            sizes = [len(c.args[0]) * len(c.args[1]) for c in drawn]
            assert sizes == sorted(sizes) and len(drawn) >= trials // 4
            mine = [c.label for c in cases if c.stage == stage]
            assert mine[len(mine) - len(drawn) :] == [c.label for c in drawn]


def _ragged_query_tile_dropped(Q, K, V, Br=16, Bc=16, causal=False):
    N = (len(Q) // Br) * Br
    O, lse = flash_attention_forward(Q[:N], K, V, Br, Bc, causal)
    return np.vstack([O, np.zeros((len(Q) - N, V.shape[1]))]), np.hstack(
        [lse, np.zeros(len(Q) - N)]
    )


def _no_keys_lse_zero(Q, K, V, Br=16, Bc=16, causal=False):
    if len(K) == 0:
        return np.zeros((len(Q), V.shape[1])), np.zeros(len(Q))
    return flash_attention_forward(Q, K, V, Br, Bc, causal)


def _no_scale(Q, K, V, Br=16, Bc=16, causal=False):
    return flash_attention_forward(Q * math.sqrt(Q.shape[1]), K, V, Br, Bc, causal)


def _mask_hides_diagonal(Q, K, V, Br=16, Bc=16, causal=False):
    return T_exercises._flash_variant(Q, K, V, Br, Bc, causal, visible="c < r")


@pytest.mark.parametrize(
    "learner, header",
    [
        (
            _no_scale,
            "✗ flash_attention_forward: stage 1 of 4 (plain tiles) fails. Still to check after "
            "it: ragged tiles, causal mask, N_q != N_k.",
        ),
        (
            _ragged_query_tile_dropped,
            "✗ flash_attention_forward: stage 2 of 4 (ragged tiles) fails; stage 1 (plain tiles) "
            "passes. Still to check after it: causal mask, N_q != N_k.",
        ),
        (
            _mask_hides_diagonal,
            "✗ flash_attention_forward: stage 3 of 4 (causal mask) fails; stage 1 (plain tiles) "
            "passes; stage 2 (ragged tiles) passes. Still to check after it: N_q != N_k.",
        ),
        (
            _no_keys_lse_zero,
            "✗ flash_attention_forward: stage 4 of 4 (N_q != N_k) fails; stage 1 (plain tiles) "
            "passes; stage 2 (ragged tiles) passes; stage 3 (causal mask) passes.",
        ),
    ],
    ids=["plain", "ragged", "causal", "lengths"],
)
def test_the_first_failing_stage_is_named(learner, header):
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(as_learner(quiet(learner)))
    message = str(info.value)
    assert message.startswith(header + "\n✗ flash_attention_forward is wrong on "), message


def test_labels_speak_of_the_notebook():
    cases = T_exercises._flash_cases(seed=0, trials=3) + T_exercises._tile_map_cases(
        seed=0, trials=3
    )
    rule_cases = [r.case for r in T.forward_rules()]
    for case in cases + rule_cases:
        assert not any(w in case.label.lower() for w in ("textbook", "lesson", "check yourself"))
        assert case.focus
    assert "section 5a" in cases[0].label and "section 5b" in cases[1].label


# ---- the rules -----------------------------------------------------------------------------
def test_the_rule_cases_are_what_the_brief_asks():
    tiles, memory, skip = T.forward_rules()
    assert tiles.case.kwargs["Br"] != tiles.case.kwargs["Bc"]
    assert skip.case.kwargs["causal"] and skip.case.kwargs["Br"] != skip.case.kwargs["Bc"]
    Q, K, V = memory.case.args
    allowed = T.memory_allowed(len(Q), len(K), Q.shape[1], V.shape[1], 64, 64)
    assert 8 * len(Q) * len(K) >= 10 * allowed  # S is at least ten times the budget
    assert len(Q) * len(K) >= allowed  # a bool mask of N x N_k is over the budget too


def test_the_solution_peak_is_well_within_the_budget():
    report = instrumented_call(
        flash_attention_forward,
        T_exercises._MEMORY_CASE.args,
        T_exercises._MEMORY_CASE.kwargs,
        name="flash_attention_forward",
        memory=True,
    )
    Q, K, V = T_exercises._MEMORY_CASE.args
    assert report.peak < T.memory_allowed(len(Q), len(K), 16, 16, 64, 64) / 3


@pytest.mark.parametrize("what, fn, slug", RULE_BREAKERS, ids=[r[0] for r in RULE_BREAKERS])
def test_each_broken_rule_is_named(what, fn, slug):
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(fn)
    message = str(info.value)
    assert slug_of(info.value) == slug, message
    assert "gives the right values but breaks a rule" in message
    assert "measured:" in message


def test_a_whole_score_matrix_is_reported_in_bytes():
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(full_softmax)
    message = str(info.value)
    assert "MiB at its peak" in message and "the budget is" in message and "8.0 MiB" in message


@pytest.mark.parametrize(
    "replay",
    [
        T_exercises.FULL_SCORES,
        T_exercises.IGNORES_BC,
        T_exercises.IGNORES_BR,
        T_exercises.NO_CAUSAL_SKIP,
        T_exercises.SLICED_ABOVE,
    ],
    ids=lambda m: m.slug + ": " + m.title,
)
def test_the_modules_rule_breaking_replays_are_named(replay):
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(as_learner(replay.fn))
    assert slug_of(info.value) == replay.slug and replay.title in str(info.value)


def presplit_never_skip(Q, K, V, Br=16, Bc=16, causal=False):
    """K/V tiles cut once before the query loop, and no tile ever skipped."""
    tiles = [(j, K[j : j + Bc], V[j : j + Bc]) for j in range(0, len(K), Bc)]
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        for j, k_j, v_j in tiles:
            s = q @ k_j.T / math.sqrt(d)
            if causal:
                s = np.where(np.arange(j, j + len(k_j)) <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
            l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_j, m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def test_tiles_cut_before_the_query_loop_still_count_per_query_tile():
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(presplit_never_skip)
    assert slug_of(info.value) == "no-causal-skip"


def test_an_input_changed_in_place_is_named():
    def scales_q_in_place(Q, K, V, Br=16, Bc=16, causal=False):
        Q *= 1 / math.sqrt(Q.shape[1])  # folds tau into Q: the caller's Q changes
        return flash_attention_forward(Q * math.sqrt(Q.shape[1]), K, V, Br, Bc, causal)

    def centers_keys_in_place(Q, K, V, Br=16, Bc=16, causal=False):
        K -= K.mean(axis=0)  # each row's scores shift by a constant: same softmax
        return flash_attention_forward(Q, K, V, Br, Bc, causal)

    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(scales_q_in_place)
    assert slug_of(info.value) == "mutates-input"
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(centers_keys_in_place)
    assert slug_of(info.value) == "mutates-input" and "`K`" in str(info.value)


# ---- borrowing the course's code ---------------------------------------------------------------
def test_calling_the_course_reference_is_refused():
    with pytest.raises(CheckFailure, match="calls-reference"):
        T.check_flash_attention_forward(cu.flash_attention_forward)
    with pytest.raises(CheckFailure, match="calls-reference"):
        T.check_flash_attention_forward(
            lambda Q, K, V, Br=16, Bc=16, causal=False: cu.attention_reference(Q, K, V, causal)
        )
    with pytest.raises(CheckFailure, match="calls-reference"):
        T.check_flash_attention_forward(
            lambda Q, K, V, Br=16, Bc=16, causal=False: T_exercises._flash_variant(
                Q, K, V, Br, Bc, causal
            )
        )


@pytest.mark.parametrize(
    "borrowed",
    [
        tile_kinds,  # its default is causal=True: the very answer
        functools.partial(tile_kinds, causal=True),
        lambda N, Br, Bc: tile_kinds(N, Br, Bc, causal=True),
        lambda N, Br, Bc: np.array(tile_kinds(N, Br, Bc)).astype(int),
        lambda N, Br, Bc: np.array(
            [
                [tile_kind(i * Br, min(N, i * Br + Br), j * Bc, min(N, j * Bc + Bc), True)]
                for i in range(-(-N // Br))
                for j in range(-(-N // Bc))
            ]
        ).reshape(-(-N // Br), -(-N // Bc)),
        lambda N, Br, Bc: T_exercises._tile_map_reference(N, Br, Bc),
    ],
    ids=["tile_kinds", "partial", "lambda", "copied", "tile_kind per tile", "check's own"],
)
def test_the_figures_tile_kinds_is_refused_as_an_answer(borrowed):
    """Notebook 03 imports tile_kinds (for its figure); returning its answer is calls-reference."""
    with pytest.raises(CheckFailure) as info:
        T.check_causal_tile_map(borrowed)
    assert slug_of(info.value) == "calls-reference", str(info.value)


@pytest.mark.parametrize("check", [T.check_causal_tile_map, T.check_flash_attention_forward])
def test_not_implemented_propagates(check):
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check(stub)


# ---- every named mistake is recognized -------------------------------------------------------
@pytest.mark.parametrize("mistake", T.TILE_MAP_MISTAKES, ids=lambda m: m.slug + ": " + m.title)
def test_each_tile_map_mistake_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        T.check_causal_tile_map(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug
    assert mistake.title in str(info.value)


def test_ragged_tile_map_is_named():
    with pytest.raises(CheckFailure, match=r"\[misconception: ragged-tile\]"):
        T.check_causal_tile_map(lambda N, Br, Bc: causal_tile_map(N, Br, Bc)[: N // Br, : N // Bc])


def test_an_unknown_tile_map_mistake_points_at_the_spec():
    def swapped(N, Br, Bc):  # the last row of tiles all FULL when it is ragged
        kinds = causal_tile_map(N, Br, Bc)
        if N > Br and N % Br:
            kinds[-1] = FULL
        return kinds

    with pytest.raises(CheckFailure) as info:
        T.check_causal_tile_map(swapped)
    assert slug_of(info.value) is None
    assert "No known mistake matches; this case exercises the ragged last tile" in str(info.value)


@pytest.mark.parametrize(
    "mistake",
    T.FLASH_O_MISTAKES + T.FLASH_LSE_MISTAKES,
    ids=lambda m: m.slug + ": " + m.title,
)
def test_each_flash_mistake_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(as_learner(quiet(mistake.fn)))
    assert slug_of(info.value) == mistake.slug, str(info.value)
    assert mistake.title in str(info.value)


def test_every_slug_of_the_brief_is_recognized():
    slugs = {m.slug for m in T.FLASH_O_MISTAKES + T.FLASH_LSE_MISTAKES}
    for slug in [
        "missing-scale",
        "causal-off-by-one",
        "normalize-then-add",
        "normalize-then-average",
        "rescale-l-not-acc",
        "rescale-acc-not-l",
        "base2-lse",
        "no-final-divide",
        "ragged-tile",
        "nan-masked",
        "diagonal-tile-skipped",
        "low-precision",
        "no-max-shift",
        "alpha-as-ratio",
        "tile-max-not-row-max",
    ]:
        assert slug in slugs


def test_flash_mistakes_are_named_on_fresh_random_cases_too():
    """In hidden mode (seed=None) a buggy function still fails with its own slug."""
    for mistake in T.FLASH_O_MISTAKES[1:11] + T.FLASH_LSE_MISTAKES:
        with pytest.raises(CheckFailure, match=rf"\[misconception: {mistake.slug}\]"):
            T.check_flash_attention_forward(as_learner(quiet(mistake.fn)), seed=None, trials=5)


def test_rescaling_acc_but_not_l_is_named_as_a_learner_writes_it():
    def forgets_l(Q, K, V, Br=16, Bc=16, causal=False):
        N, d = Q.shape
        O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
        for i in range(0, N, Br):
            q = Q[i : i + Br]
            rows = np.arange(i, i + len(q))
            m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
            for j in range(0, len(K), Bc):
                if causal and j > rows[-1]:
                    break
                k_j, v_j = K[j : j + Bc], V[j : j + Bc]
                s = q @ k_j.T / math.sqrt(d)
                if causal:
                    s = np.where(np.arange(j, j + len(k_j)) <= rows[:, None], s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                safe = np.where(np.isneginf(m_new), 0.0, m_new)
                p, alpha = np.exp(s - safe[:, None]), np.exp(m - safe)
                l = l + p.sum(axis=1)  # the bug: l keeps its old scale
                acc = alpha[:, None] * acc + p @ v_j
                m = m_new
            seen = l > 0
            O[rows[seen]] = acc[seen] / l[seen, None]
            lse[rows[seen]] = m[seen] + np.log(l[seen])
        return O, lse

    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(forgets_l)
    assert slug_of(info.value) == "rescale-acc-not-l"
    assert "section 5a" in str(info.value)  # the max grows from 3 to 5 there


def test_float32_statistics_are_named_low_precision():
    def float32_everything(Q, K, V, Br=16, Bc=16, causal=False):
        Q, K, V = (a.astype(np.float32) for a in (Q, K, V))  # "faster", as on a GPU
        return flash_attention_forward(Q, K, V, Br, Bc, causal)

    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(float32_everything)
    assert slug_of(info.value) == "low-precision"


@pytest.mark.parametrize(
    "wrong",
    [
        lambda O, lse: (O.astype(np.float16), lse.astype(np.float16)),  # no float16 replay
        lambda O, lse: (O, lse + 1e-3),  # a constant offset is not low precision
        lambda O, lse: (O * (1 + 1e-4), lse),
    ],
    ids=["float16", "lse offset", "O scaled"],
)
def test_low_precision_is_never_a_catch_all(wrong):
    def learner(Q, K, V, Br=16, Bc=16, causal=False):
        return wrong(*flash_attention_forward(Q, K, V, Br, Bc, causal))

    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(learner)
    assert slug_of(info.value) is None, str(info.value)
    assert "No known mistake matches" in str(info.value)


@pytest.mark.parametrize(
    "bug, focus",
    [
        ("no-keys", "no keys at all (N_k = 0)"),
        ("keys-as-queries", "N_k != N"),
        ("ragged-mask", "the causal mask"),
    ],
)
def test_an_unknown_mistake_points_at_the_part_of_the_spec(bug, focus):
    def learner(Q, K, V, Br=16, Bc=16, causal=False):
        if bug == "no-keys" and len(K) == 0:
            return np.zeros((len(Q), V.shape[1])), np.zeros(len(Q))  # lse = 0, not -inf
        if bug == "keys-as-queries" and 2 < len(Q) < len(K):
            K, V = K[: len(Q)], V[: len(Q)]  # loops the keys up to N, not N_k
        O, lse = flash_attention_forward(Q, K, V, Br, Bc, causal)
        if bug == "ragged-mask" and causal and len(Q) % Br:
            O = O.copy()
            O[-1] = V[-1]  # the last row of a ragged causal tile sees only its own key
        return O, lse

    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(learner)
    assert slug_of(info.value) is None, str(info.value)
    assert f"No known mistake matches; this case exercises {focus}" in str(info.value)


def test_wrong_return_type_is_explained():
    with pytest.raises(CheckFailure, match=r"must return the pair \(O, lse\)"):
        T.check_flash_attention_forward(
            lambda Q, K, V, Br=16, Bc=16, causal=False: flash_attention_forward(Q, K, V)[0]
        )


def test_failure_names_the_smallest_input():
    with pytest.raises(CheckFailure) as info:
        divide = next(m for m in T.FLASH_O_MISTAKES if m.slug == "no-final-divide")
        T.check_flash_attention_forward(as_learner(quiet(divide.fn)))
    message = str(info.value)
    assert "no-final-divide" in message
    assert "example of section 5a" in message and "yours:" in message and "expected:" in message


# ---- quick checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, right, wrong, hint",
    [
        (T.check_quick_scores_mib, 512, 536.870912, "MiB"),
        (T.check_quick_scores_mib, 512.0, 1024, "2 bytes"),
        (T.check_quick_causal_tiles, 8256, 8128, "diagonal"),
        (T.check_quick_causal_tiles, 8256, 16384, "skipped"),
        (T.check_quick_causal_tiles, 8256, 8192, "exactly"),
        (T.check_quick_traffic_ratio, 4, 0.25, "other way"),
        (T.check_quick_traffic_ratio, 3.985, 2, "d = 128"),
    ],
)
def test_quick_checks(check, right, wrong, hint):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(right)
    assert "✓" in out.getvalue()
    with pytest.raises(CheckFailure, match=hint):
        check(wrong)
    with pytest.raises(CheckFailure, match="no answer yet"):
        check(None)


def test_quick_check_integer_answer_prints_as_an_integer():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        T.check_quick_causal_tiles(8256)
    assert "8256 is right" in out.getvalue()


# ---- issue 39: one meaning of r1, c1 (exclusive ends); the recall answer; the Br / d hint --------
def _solution_cells():
    import nbformat

    from graders.run.pipeline import REPO

    nb = nbformat.read(REPO / "solutions/03_tiled_forward/03_tiled_forward.ipynb", 4)
    return [c.source for c in nb.cells]


def test_hint_3_section_6_and_the_feedback_use_r1_c1_as_exclusive_ends():
    """Hint 3's rule, run with r1 and c1 one past the tile's last row and key (as section 6
    defines them), gives the course's tile map; the feedback states the same comparisons."""
    cells = _solution_cells()
    hint = next(s for s in cells if "Hint 3 · pseudo-code" in s and "kinds[i, j]" in s)
    rule = hint.split("kinds[i, j] = ", 1)[1].splitlines()[0]
    expr = rule.replace(", else", " else").replace("SKIP if", "SKIP if").strip()
    assert "one past its last (r1 clipped at N)" in hint
    for N, Br, Bc in [(8, 4, 4), (4, 1, 2), (5, 8, 8), (30, 8, 5), (17, 3, 7), (9, 1, 1)]:
        got = np.empty((-(-N // Br), -(-N // Bc)), dtype=int)
        for i in range(got.shape[0]):
            r0, r1 = i * Br, min(N, (i + 1) * Br)
            for j in range(got.shape[1]):
                c0, c1 = j * Bc, min(N, (j + 1) * Bc)
                scope = dict(r0=r0, r1=r1, c0=c0, c1=c1, SKIP=SKIP, MASK=MASK, FULL=FULL)
                got[i, j] = eval(expr, {}, scope)
        assert np.array_equal(got, tile_kinds(N, Br, Bc, causal=True)), (N, Br, Bc)
    section6 = next(s for s in cells if s.startswith("## 6. Causal masking"))
    assert "$c_0 > r_1 - 1$" in section6 and "$c_1 - 1 \\le r_0$" in section6
    assert "c0 > r1 - 1" in T_exercises._OFF_BY_ONE and "c1 - 1 <= r0" in T_exercises._OFF_BY_ONE


def test_the_recall_answer_states_the_numbers_of_the_16_b_d_rule():
    text = next(s for s in _solution_cells() if "**Recall question.** An SM has 192 KiB" in s)
    sram = 192 * 1024
    assert sram // (16 * 64) == 192 and sram // (16 * 128) == 96 and 16 * 96 * 128 == sram
    assert "$B \\le 196{,}608 / 1{,}024 = 192$" in text and "$B = 96$ of $d = 128$" in text
    assert "half the head dimension" not in text


def test_quick_check_3_answered_with_br_over_d_gets_a_hint_about_br_over_d():
    with pytest.raises(CheckFailure) as info:
        T.check_quick_traffic_ratio(128 / 64)
    assert "Br / d" in str(info.value) and "the ratio for d = 128" not in str(info.value)


# ---- another array library: the memory budget (tracemalloc) cannot see its allocations --------
def forward_with_torch_sdpa(Q, K, V, Br=16, Bc=16, causal=False):
    """A learner's shortcut: torch's fused attention for O and a full logsumexp for lse."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.tensor(np.asarray(a)) for a in (Q, K, V))
    s = q @ k.T / math.sqrt(Q.shape[1])  # the N x N_k scores the exercise forbids
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(s, dim=1)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]
    empty = torch.isneginf(lse)  # causal rows past the keys: no key, out 0
    return torch.where(empty[:, None], 0.0, out).numpy(), lse.numpy()


def forward_torch_tiles(Q, K, V, Br=16, Bc=16, causal=False):
    """The notebook's loops, tile by tile, in torch (imported at the top: a global)."""
    N, d = Q.shape
    q_all, k_all, v_all = (torch.tensor(np.asarray(a)) for a in (Q, K, V))
    O, lse = (
        torch.zeros(N, V.shape[1], dtype=q_all.dtype),
        torch.full((N,), -math.inf, dtype=torch.float64),
    )
    for i in range(0, N, Br):
        q = q_all[i : i + Br]
        rows = torch.arange(i, i + len(q))
        m = torch.full((len(q),), -math.inf, dtype=q.dtype)
        l, acc = (
            torch.zeros(len(q), dtype=q.dtype),
            torch.zeros(len(q), V.shape[1], dtype=torch.float64),
        )
        for j in range(0, len(K), Bc):
            if causal and j > rows[-1]:
                break
            cols = torch.arange(j, min(j + Bc, len(K)))
            s = q @ k_all[j : j + Bc].T / math.sqrt(d)
            if causal:
                s = torch.where(cols[None, :] <= rows[:, None], s, -math.inf)
            m_new = torch.maximum(m, s.max(dim=1).values)
            m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
            p, alpha = torch.exp(s - m_safe[:, None]), torch.exp(m - m_safe)
            l, acc = alpha * l + p.sum(1), alpha[:, None] * acc + p @ v_all[j : j + Bc].double()
            m = m_new
        seen = l > 0
        O[rows[seen]] = (acc[seen] / l[seen, None]).to(O.dtype)
        lse[rows[seen]] = (m[seen] + torch.log(l[seen])).to(lse.dtype)
    return O.numpy(), lse.numpy()


@pytest.mark.parametrize(
    "fn", [forward_with_torch_sdpa, forward_torch_tiles], ids=lambda f: f.__name__
)
def test_a_forward_written_with_torch_is_named(fn):
    pytest.importorskip("torch")
    with pytest.raises(CheckFailure) as info:
        run_quietly(T.check_flash_attention_forward, fn)
    message = str(info.value)
    assert slug_of(info.value) == "array-library-in-numpy-exercise", message
    assert "computes with torch" in message


def test_torch_reached_without_its_name_is_seen_by_its_calls():
    pytest.importorskip("torch")

    def sneaky(Q, K, V, Br=16, Bc=16, causal=False):
        import importlib

        lib = importlib.import_module("to" + "rch")
        s = lib.tensor(np.asarray(Q)) @ lib.tensor(np.asarray(K)).T
        return s.numpy()

    with pytest.raises(CheckFailure) as info:
        instrumented_call(
            sneaky,
            T_exercises._MEMORY_CASE.args,
            T_exercises._MEMORY_CASE.kwargs,
            name="f",
            memory=True,
        )
    assert slug_of(info.value) == "array-library-in-numpy-exercise", str(info.value)


def test_other_array_libraries_are_named_by_what_the_code_refers_to():
    import types

    from course_utils.checks.engine.array_libraries import libraries_named

    jnp = types.ModuleType("jax.numpy")  # JAX is not installed here: a module of that name

    def helper(x):
        return jnp.exp(x)

    def with_jax(Q, K, V, Br=16, Bc=16, causal=False):
        return helper(Q)

    def imports_cupy(Q, K, V, Br=16, Bc=16, causal=False):
        import cupy  # noqa: F401 (never run: read, not called)

    def numpy_only(Q, K, V, Br=16, Bc=16, causal=False):
        return flash_attention_forward(Q, K, V, Br, Bc, causal)

    assert libraries_named(with_jax) == {"JAX"}
    assert libraries_named(imports_cupy) == {"CuPy"}
    assert libraries_named(numpy_only) == set()
    assert libraries_named(forward_with_torch_sdpa) == {"torch"}


@pytest.mark.parametrize("fn", RIGHT_STYLES, ids=lambda f: f.__name__)
def test_numpy_forwards_pass_the_budget_with_torch_imported(fn):
    pytest.importorskip("torch")  # imported: the torch watch is on, and sees no torch call
    report = instrumented_call(
        fn,
        T_exercises._MEMORY_CASE.args,
        T_exercises._MEMORY_CASE.kwargs,
        name="forward",
        memory=True,
    )
    assert report.peak is not None and report.peak > 0


def test_the_budget_never_imports_torch():
    """A NumPy-only lab has no torch: the refusal reads sys.modules, it imports nothing."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from course_utils.checks.tiled_forward import exercises as T\n"
        "from course_utils.checks.engine.watch import instrumented_call\n"
        "def numpy_forward(Q, K, V, Br=16, Bc=16, causal=False):\n"
        "    return Q @ K.T\n"
        "r = instrumented_call(numpy_forward, T._MEMORY_CASE.args, T._MEMORY_CASE.kwargs,\n"
        "                      name='f', memory=True)\n"
        "assert r.peak > 0 and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
