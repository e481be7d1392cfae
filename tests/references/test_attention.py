"""Attention: the naive oracle against PyTorch, the tiled forward and split-KV decode against it.

References are independent of course_utils: torch.nn.functional.scaled_dot_product_attention in
float64, and the direct formula softmax(tau Q K^T) V with scipy. Every warning is an error here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.special import softmax as scipy_softmax

import course_utils.references.attention as attention_module
from course_utils import (
    attention_reference,
    flash_attention_forward,
    split_kv_decode,
    split_kv_partials,
)

pytestmark = pytest.mark.filterwarnings("error")

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------


def torch_attention(Q, K, V, causal=False, softmax_scale=None):
    """O by PyTorch's scaled_dot_product_attention, float64 on the CPU. Q (Nq, d) ... O (Nq, dv)."""
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a))[None, None] for a in (Q, K, V))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    return out[0, 0].numpy()  # (1, 1, Nq, dv) -> (Nq, dv)


def scores(Q, K, causal=False, softmax_scale=None):
    """S = tau Q K^T with -inf above the diagonal when causal; (Nq, Nk)."""
    tau = 1.0 / math.sqrt(Q.shape[1]) if softmax_scale is None else softmax_scale
    S = tau * (Q @ K.T)
    if causal:
        S[np.triu_indices(len(Q), k=1, m=len(K))] = NEG_INF
    return S


def direct_attention(Q, K, V, causal=False, softmax_scale=None):
    """(O, lse) by the formula: softmax of the scores, then the average of V; scipy, float64."""
    S = scores(Q, K, causal, softmax_scale)
    return scipy_softmax(S, axis=1) @ V, logsumexp(S, axis=1)


def random_qkv(seed, Nq, Nk, d, dv, scale=1.0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(scale=scale, size=(Nq, d)),
        rng.normal(size=(Nk, d)),
        rng.normal(size=(Nk, dv)),
    )


def assert_attention_close(got, want, tol):
    (O, lse), (O_ref, lse_ref) = got, want
    assert O.shape == O_ref.shape and lse.shape == lse_ref.shape
    assert O.dtype == lse.dtype == np.float64
    assert not np.isnan(O).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(O, O_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, lse_ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# attention_reference
# ---------------------------------------------------------------------------------------------


@st.composite
def attention_problem(draw, max_n=24, max_d=16):
    causal = draw(st.booleans())
    Nq = draw(st.integers(1, max_n))
    Nk = Nq if causal else draw(st.integers(1, max_n))
    d, dv = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    scale = draw(st.sampled_from([0.3, 1.0, 3.0]))
    Q, K, V = random_qkv(draw(st.integers(0, 2**32 - 1)), Nq, Nk, d, dv, scale)
    softmax_scale = draw(st.one_of(st.none(), st.floats(0.01, 4.0)))
    return Q, K, V, causal, softmax_scale


@given(problem=attention_problem())
def test_reference_equals_torch_sdpa(problem):
    Q, K, V, causal, softmax_scale = problem
    O, lse = attention_reference(Q, K, V, causal=causal, softmax_scale=softmax_scale)
    O_torch = torch_attention(Q, K, V, causal, softmax_scale)
    S = torch.from_numpy(scores(Q, K, causal, softmax_scale))
    lse_torch = torch.logsumexp(S, dim=1).numpy()
    assert_attention_close((O, lse), (O_torch, lse_torch), 1e-12)
    assert_attention_close((O, lse), direct_attention(Q, K, V, causal, softmax_scale), 1e-12)


@pytest.mark.parametrize(("Nq", "Nk"), [(1, 1), (1, 9), (9, 1), (5, 12), (12, 5), (31, 17)])
def test_reference_rectangular(Nq, Nk):
    Q, K, V = random_qkv(Nq * 100 + Nk, Nq, Nk, 6, 3)
    got = attention_reference(Q, K, V)
    assert got[0].shape == (Nq, 3) and got[1].shape == (Nq,)
    assert_attention_close(got, (torch_attention(Q, K, V), logsumexp(scores(Q, K), axis=1)), 1e-12)


def test_reference_causal_rows_see_their_prefix_only():
    Q, K, V = random_qkv(3, 8, 8, 4, 2)
    O, lse = attention_reference(Q, K, V, causal=True)
    # row 0 sees only key 0: O = V[0], lse = tau q0.k0
    np.testing.assert_allclose(O[0], V[0], rtol=1e-14)
    assert lse[0] == pytest.approx(Q[0] @ K[0] / 2.0, rel=1e-14)
    # row i is plain attention over keys 0..i
    for i in range(8):
        O_i, lse_i = direct_attention(Q[i : i + 1], K[: i + 1], V[: i + 1])
        np.testing.assert_allclose(O[i], O_i[0], rtol=1e-12, atol=1e-13)
        assert lse[i] == pytest.approx(lse_i[0], rel=1e-13, abs=1e-13)


@pytest.mark.parametrize("Nq", [1, 4])
def test_reference_empty_key_set(Nq):
    Q = np.ones((Nq, 3))
    O, lse = attention_reference(Q, np.zeros((0, 3)), np.zeros((0, 5)))
    assert O.shape == (Nq, 5) and lse.shape == (Nq,)
    np.testing.assert_array_equal(O, np.zeros((Nq, 5)))
    assert np.all(np.isneginf(lse))


def test_reference_applies_one_over_sqrt_d():
    # d = 4, q.k0 = 4 and q.k1 = 0: scaled scores (2, 0); unscaled they would be (4, 0)
    Q = np.array([[2.0, 0.0, 0.0, 0.0]])
    K = np.array([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    V = np.array([[1.0], [0.0]])
    O, lse = attention_reference(Q, K, V)
    w = math.exp(2.0) / (math.exp(2.0) + 1.0)
    assert O[0, 0] == pytest.approx(w, rel=1e-15)
    assert lse[0] == pytest.approx(math.log(math.exp(2.0) + 1.0), rel=1e-15)
    assert O[0, 0] != pytest.approx(math.exp(4.0) / (math.exp(4.0) + 1.0), rel=1e-3)
    # softmax_scale overrides tau
    O1, lse1 = attention_reference(Q, K, V, softmax_scale=1.0)
    assert lse1[0] == pytest.approx(math.log(math.exp(4.0) + 1.0), rel=1e-15)
    assert O1[0, 0] == pytest.approx(math.exp(4.0) / (math.exp(4.0) + 1.0), rel=1e-15)


@pytest.mark.parametrize("d", [1, 2, 7, 64])
def test_reference_default_scale_is_explicit_one_over_sqrt_d(d):
    Q, K, V = random_qkv(d, 5, 6, d, 3, scale=2.0)
    default = attention_reference(Q, K, V)
    explicit = attention_reference(Q, K, V, softmax_scale=1.0 / math.sqrt(d))
    assert_attention_close(default, explicit, 1e-14)
    if d > 1:  # tau = 1 is a different softmax
        assert not np.allclose(attention_reference(Q, K, V, softmax_scale=1.0)[1], default[1])


@pytest.mark.parametrize("softmax_scale", [0.05, 0.5, 1.0, 2.5])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_softmax_scale_matches_torch(softmax_scale, causal):
    Q, K, V = random_qkv(11, 9, 9, 5, 4)
    O, lse = attention_reference(Q, K, V, causal=causal, softmax_scale=softmax_scale)
    np.testing.assert_allclose(O, torch_attention(Q, K, V, causal, softmax_scale), rtol=1e-12)
    S = scores(Q, K, causal, softmax_scale)
    np.testing.assert_allclose(lse, logsumexp(S, axis=1), rtol=1e-12, atol=1e-12)


def test_reference_large_scores_do_not_overflow():
    Q, K, V = random_qkv(5, 6, 7, 4, 2, scale=1000.0)  # scores of order 1e3, exp overflows
    O, lse = attention_reference(Q, K, V)
    assert np.all(np.isfinite(O)) and np.all(np.isfinite(lse))
    assert_attention_close((O, lse), (torch_attention(Q, K, V), logsumexp(scores(Q, K), 1)), 1e-12)


def test_reference_does_not_modify_its_inputs():
    Q, K, V = random_qkv(2, 4, 4, 3, 2)
    copies = [a.copy() for a in (Q, K, V)]
    attention_reference(Q, K, V, causal=True)
    for a, c in zip((Q, K, V), copies, strict=True):
        np.testing.assert_array_equal(a, c)


# ---------------------------------------------------------------------------------------------
# flash_attention_forward
# ---------------------------------------------------------------------------------------------


@st.composite
def tiled_problem(draw):
    causal = draw(st.booleans())
    Nq = draw(st.integers(1, 70))
    Nk = Nq if causal else draw(st.integers(1, 70))
    d, dv = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    Br, Bc = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    scale = draw(st.sampled_from([0.5, 1.0, 4.0]))
    Q, K, V = random_qkv(draw(st.integers(0, 2**32 - 1)), Nq, Nk, d, dv, scale)
    softmax_scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    return Q, K, V, Br, Bc, causal, softmax_scale


@given(problem=tiled_problem())
def test_flash_equals_reference(problem):
    Q, K, V, Br, Bc, causal, softmax_scale = problem
    got = flash_attention_forward(Q, K, V, Br=Br, Bc=Bc, causal=causal, softmax_scale=softmax_scale)
    want = attention_reference(Q, K, V, causal=causal, softmax_scale=softmax_scale)
    assert_attention_close(got, want, 1e-10)
    # and the oracle itself is independent of course_utils
    assert_attention_close(got, direct_attention(Q, K, V, causal, softmax_scale), 1e-10)


RAGGED = [
    (17, 17, 16, 16),  # one row / key past the last full tile
    (33, 33, 8, 5),  # neither tile divides N
    (5, 5, 16, 16),  # Br, Bc > N
    (5, 5, 3, 100),
    (1, 1, 1, 1),
    (23, 23, 1, 7),
    (23, 23, 7, 1),
    (10, 37, 4, 6),
    (37, 10, 6, 4),
    (3, 50, 20, 20),
]


@pytest.mark.parametrize(
    ("Nq", "Nk", "Br", "Bc", "causal"),
    [
        (*case, causal)
        for case in RAGGED
        for causal in (False, True)
        if not causal or case[0] == case[1]
    ],
)
def test_flash_ragged_tiles(Nq, Nk, Br, Bc, causal):
    Q, K, V = random_qkv(Nq + 7 * Nk + Br, Nq, Nk, 8, 3, scale=2.0)
    got = flash_attention_forward(Q, K, V, Br=Br, Bc=Bc, causal=causal)
    assert_attention_close(got, direct_attention(Q, K, V, causal), 1e-12)
    assert_attention_close(got, attention_reference(Q, K, V, causal=causal), 1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_lesson_example(causal):
    # N = 100, d = 32, Br = Bc = 16: N is not a multiple of the tiles
    Q, K, V = random_qkv(0, 100, 100, 32, 32)
    O, lse = flash_attention_forward(Q, K, V, Br=16, Bc=16, causal=causal)
    O_ref, lse_ref = attention_reference(Q, K, V, causal=causal)
    assert np.abs(O - O_ref).max() < 1e-12
    assert np.abs(lse - lse_ref).max() < 1e-12
    assert np.abs(O - torch_attention(Q, K, V, causal)).max() < 1e-12


def test_flash_default_tiles_and_large_scores():
    Q, K, V = random_qkv(9, 40, 40, 4, 4, scale=300.0)  # scores of order 1e2..1e3
    got = flash_attention_forward(Q, K, V, causal=True)
    assert_attention_close(got, direct_attention(Q, K, V, causal=True), 1e-10)


@pytest.mark.parametrize("Nq", [1, 5, 20])
def test_flash_empty_key_set(Nq):
    O, lse = flash_attention_forward(np.ones((Nq, 3)), np.zeros((0, 3)), np.zeros((0, 2)), 4, 4)
    assert O.shape == (Nq, 2) and lse.shape == (Nq,)
    np.testing.assert_array_equal(O, np.zeros((Nq, 2)))
    assert np.all(np.isneginf(lse))


def test_flash_empty_query_set():
    O, lse = flash_attention_forward(np.zeros((0, 3)), np.ones((5, 3)), np.ones((5, 2)), 4, 4)
    assert O.shape == (0, 2) and lse.shape == (0,)


@pytest.mark.parametrize(("Nq", "Nk"), [(4, 5), (5, 4), (1, 2)])
def test_flash_causal_needs_square(Nq, Nk):
    Q, K, V = random_qkv(1, Nq, Nk, 3, 3)
    with pytest.raises(ValueError, match="causal"):
        flash_attention_forward(Q, K, V, Br=2, Bc=2, causal=True)


@pytest.mark.parametrize(("N", "Br", "Bc"), [(32, 8, 8), (37, 8, 5), (20, 3, 7), (9, 16, 2)])
def test_flash_causal_ignores_future_keys(N, Br, Bc):
    # rows j+1.. of K and V cannot change rows 0..j of the output, whatever they hold
    Q, K, V = random_qkv(N, N, N, 4, 3)
    O, lse = flash_attention_forward(Q, K, V, Br=Br, Bc=Bc, causal=True)
    rng = np.random.default_rng(N)
    for j in (0, N // 3, N - 2):
        K2, V2 = K.copy(), V.copy()
        K2[j + 1 :] = rng.normal(scale=1e3, size=K2[j + 1 :].shape)
        V2[j + 1 :] = rng.normal(scale=1e6, size=V2[j + 1 :].shape)
        O2, lse2 = flash_attention_forward(Q, K2, V2, Br=Br, Bc=Bc, causal=True)
        np.testing.assert_allclose(O2[: j + 1], O[: j + 1], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(lse2[: j + 1], lse[: j + 1], rtol=1e-14, atol=1e-15)


class RecordingArray(np.ndarray):
    """An ndarray that logs (name, start, stop) for every slice of its rows; slices are plain."""

    def __getitem__(self, key):
        log = getattr(self, "_log", None)
        if log is not None and isinstance(key, slice):
            start, stop, _ = key.indices(self.shape[0])
            log.append((self._name, start, stop))
        return np.asarray(super().__getitem__(key))


@pytest.fixture
def tile_log(monkeypatch):
    """Wrap Q, K, V in RecordingArray as flash_attention_forward validates them.

    The function turns its inputs into plain float64 arrays first (np.asarray drops a subclass),
    so the recorder is attached right after that step, where the tiles are sliced from.
    """
    log = []
    validate = attention_module.as_float_array

    def recording(value, name, **kwargs):
        arr = validate(value, name, **kwargs)
        if name in ("Q", "K", "V"):
            arr = arr.view(RecordingArray)
            arr._log, arr._name = log, name
        return arr

    monkeypatch.setattr(attention_module, "as_float_array", recording)
    return log


def tiles_read(log):
    """{query tile (start, stop): [key tile starts read while it was on chip]} from the log."""
    per_q_tile, current = {}, None
    for name, start, stop in log:
        if name == "Q":
            current = (start, stop)
            per_q_tile[current] = []
        elif name == "K":
            assert current is not None, "a K tile was read before any Q tile"
            per_q_tile[current].append(start)
    return per_q_tile


@pytest.mark.parametrize(
    ("N", "Br", "Bc"), [(64, 16, 16), (100, 16, 16), (37, 8, 5), (20, 3, 7), (9, 16, 2), (12, 1, 1)]
)
def test_flash_causal_skips_tiles_above_the_diagonal(tile_log, N, Br, Bc):
    Q, K, V = random_qkv(N, N, N, 4, 3)
    got = flash_attention_forward(Q, K, V, Br=Br, Bc=Bc, causal=True)
    assert_attention_close(got, direct_attention(Q, K, V, causal=True), 1e-12)
    per_q_tile = tiles_read(tile_log)
    assert per_q_tile, "no Q/K tile slices were recorded: the test's hook no longer sees the tiles"
    assert sorted(per_q_tile) == [(i, min(i + Br, N)) for i in range(0, N, Br)]
    for (q_start, q_stop), k_starts in per_q_tile.items():
        last_row = q_stop - 1
        # every tile that holds a visible key is read, each once, and none above the diagonal
        assert sorted(k_starts) == list(range(0, last_row + 1, Bc)), (q_start, q_stop, k_starts)
    n_read = sum(len(k) for k in per_q_tile.values())
    n_all = math.ceil(N / Br) * math.ceil(N / Bc)
    assert n_read < n_all or N <= max(Br, Bc)
    if Br == Bc and N % Br == 0:  # square tiles: T (T + 1) / 2 of the T^2 tiles
        T = N // Br
        assert n_read == T * (T + 1) // 2


def test_flash_non_causal_reads_every_tile(tile_log):
    # the same hook without the mask: every (query tile, key tile) pair, so the hook sees tiles
    N, Br, Bc = 40, 16, 16
    Q, K, V = random_qkv(1, N, N, 4, 3)
    flash_attention_forward(Q, K, V, Br=Br, Bc=Bc, causal=False)
    per_q_tile = tiles_read(tile_log)
    assert len(per_q_tile) == 3
    for k_starts in per_q_tile.values():
        assert sorted(k_starts) == [0, 16, 32]


def test_flash_does_not_modify_its_inputs():
    Q, K, V = random_qkv(2, 9, 9, 3, 2)
    copies = [a.copy() for a in (Q, K, V)]
    flash_attention_forward(Q, K, V, Br=4, Bc=3, causal=True)
    for a, c in zip((Q, K, V), copies, strict=True):
        np.testing.assert_array_equal(a, c)


# ---------------------------------------------------------------------------------------------
# split_kv_partials and split_kv_decode
# ---------------------------------------------------------------------------------------------


@st.composite
def decode_problem(draw):
    Nk = draw(st.integers(1, 40))
    num_splits = draw(st.integers(1, Nk + 5))
    d, dv = draw(st.integers(1, 8)), draw(st.integers(1, 6))
    rows = draw(st.one_of(st.none(), st.integers(1, 4)))  # None: one query q of shape (d,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.5, 2.0, 6.0]))
    q = rng.normal(scale=scale, size=(d,) if rows is None else (rows, d))
    K, V = rng.normal(size=(Nk, d)), rng.normal(size=(Nk, dv))
    softmax_scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    return q, K, V, num_splits, softmax_scale


@given(problem=decode_problem())
def test_split_kv_decode_equals_full_attention(problem):
    q, K, V, num_splits, softmax_scale = problem
    o, lse = split_kv_decode(q, K, V, num_splits, softmax_scale=softmax_scale)
    O_ref, lse_ref = direct_attention(np.atleast_2d(q), K, V, softmax_scale=softmax_scale)
    if q.ndim == 1:
        O_ref, lse_ref = O_ref[0], lse_ref[0]
    assert o.shape == np.shape(O_ref) and lse.shape == np.shape(lse_ref)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(o, O_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-12, atol=1e-12)


@given(problem=decode_problem())
def test_split_kv_partials_are_contiguous_ceil_chunks(problem):
    q, K, V, num_splits, softmax_scale = problem
    Nk, dv = V.shape
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits, softmax_scale=softmax_scale)
    lead = (num_splits,) if q.ndim == 1 else (num_splits, len(q))
    assert out_partial.shape == lead + (dv,) and lse_partial.shape == lead
    assert not np.isnan(out_partial).any() and not np.isnan(lse_partial).any()
    chunk = math.ceil(Nk / num_splits)
    for s in range(num_splits):
        k_s, v_s = K[s * chunk : (s + 1) * chunk], V[s * chunk : (s + 1) * chunk]
        if len(k_s) == 0:  # more splits than chunks of keys: empty, weight 0
            assert np.all(np.isneginf(lse_partial[s]))
            np.testing.assert_array_equal(out_partial[s], np.zeros(lead[1:] + (dv,)))
            continue
        O_s, lse_s = direct_attention(np.atleast_2d(q), k_s, v_s, softmax_scale=softmax_scale)
        if q.ndim == 1:
            O_s, lse_s = O_s[0], lse_s[0]
        np.testing.assert_allclose(out_partial[s], O_s, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse_partial[s], lse_s, rtol=1e-12, atol=1e-12)
    # the partials merge to full attention with the weights exp(lse_s - lse) (merged here by hand)
    lse = logsumexp(lse_partial, axis=0)
    w = np.exp(lse_partial - lse)  # (num_splits,) or (num_splits, rows)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=1e-12)
    o = np.einsum("s...,s...v->...v", w, out_partial)
    O_ref, lse_ref = direct_attention(np.atleast_2d(q), K, V, softmax_scale=softmax_scale)
    np.testing.assert_allclose(np.atleast_2d(o), O_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.atleast_1d(lse), lse_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("Nk", "num_splits", "sizes"),
    [
        (10, 1, [10]),
        (10, 3, [4, 4, 2]),
        (10, 4, [3, 3, 3, 1]),
        (10, 6, [2, 2, 2, 2, 2, 0]),
        (10, 10, [1] * 10),
        (3, 8, [1, 1, 1, 0, 0, 0, 0, 0]),
        (1, 2, [1, 0]),
    ],
)
def test_split_kv_chunk_sizes(Nk, num_splits, sizes):
    # a chunk with k keys of equal score has lse = log k + score: read the sizes off the lse
    q = np.zeros(3)
    K, V = np.ones((Nk, 3)), np.arange(Nk, dtype=float)[:, None]
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(lse_partial, np.log(sizes), rtol=1e-15, atol=1e-15)
    starts = np.cumsum([0, *sizes[:-1]])
    for s, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        want = (2 * start + size - 1) / 2 if size else 0.0  # the mean of the key indices
        assert out_partial[s, 0] == pytest.approx(want, rel=1e-14, abs=1e-15)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("q_shape", [(4,), (2, 4)])
def test_split_kv_empty_cache(num_splits, q_shape):
    q, K, V = np.ones(q_shape), np.zeros((0, 4)), np.zeros((0, 2))
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits)
    assert out_partial.shape == (num_splits, *q_shape[:-1], 2)
    assert np.all(out_partial == 0.0) and np.all(np.isneginf(lse_partial))
    o, lse = split_kv_decode(q, K, V, num_splits)
    assert o.shape == (*q_shape[:-1], 2) and lse.shape == q_shape[:-1]
    assert np.all(o == 0.0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("num_splits", [1, 2, 5, 16, 64, 70])
def test_split_kv_decode_matches_torch(num_splits):
    rng = np.random.default_rng(num_splits)
    q, K, V = rng.normal(size=(6, 16)), rng.normal(size=(64, 16)), rng.normal(size=(64, 8))
    o, lse = split_kv_decode(q, K, V, num_splits)
    np.testing.assert_allclose(o, torch_attention(q, K, V), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, logsumexp(scores(q, K), axis=1), rtol=1e-12)
    # one query row (d,) gives the same as the first row of a batch
    o1, lse1 = split_kv_decode(q[0], K, V, num_splits)
    assert o1.shape == (8,) and lse1.shape == ()
    np.testing.assert_allclose(o1, o[0], rtol=1e-14, atol=1e-15)
    assert float(lse1) == pytest.approx(lse[0], rel=1e-14)
