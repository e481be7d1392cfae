"""The attention backward pass against PyTorch autograd (float64), finite differences, the lesson.

References are independent of course_utils: torch.nn.functional.scaled_dot_product_attention and
an explicit softmax formula in torch, both differentiated by autograd in float64; central finite
differences of the forward oracle. Every warning is an error here. The torch tests are skipped
when torch is missing (course_utils itself never needs it).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils.references.attention import attention_reference
from course_utils.references.backward import (
    SavedBytes,
    attention_backward_flops,
    attention_backward_reference,
    flash_attention_backward,
    naive_attention_torch,
    saved_bytes_naive_vs_fused,
    saved_tensor_bytes,
    saved_tensors,
    softmax_backward,
)

pytestmark = pytest.mark.filterwarnings("error")

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the NumPy tests still run
    torch = F = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")

RTOL, ATOL = 1e-8, 1e-11


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------


def torch_grads(Q, K, V, dO, causal=False, softmax_scale=None, explicit=False):
    """(dQ, dK, dV) of O = attention(Q, K, V) against dO, by torch autograd in float64.

    explicit=False: scaled_dot_product_attention. explicit=True: softmax(tau Q K^T + mask) V
    written out. Inputs are (N, d) NumPy arrays; torch sees them as (1, 1, N, d).
    """
    q, k, v = (torch.tensor(a, dtype=torch.float64)[None, None].requires_grad_() for a in (Q, K, V))
    if explicit:
        tau = 1.0 / math.sqrt(Q.shape[1]) if softmax_scale is None else softmax_scale
        s = tau * q @ k.transpose(-1, -2)
        if causal:
            hidden = torch.ones(len(Q), len(K), dtype=torch.bool).triu(1)
            s = s.masked_fill(hidden, float("-inf"))
        out = torch.softmax(s, dim=-1) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    out.backward(torch.tensor(dO, dtype=torch.float64)[None, None])
    return tuple(t.grad[0, 0].numpy() for t in (q, k, v))


def forward(Q, K, V, causal=False, softmax_scale=None):
    return attention_reference(Q, K, V, causal=causal, softmax_scale=softmax_scale)


def random_problem(seed, Nq, Nk, d, dv, spread=1.0):
    rng = np.random.default_rng(seed)
    Q = spread * rng.standard_normal((Nq, d))
    K = spread * rng.standard_normal((Nk, d))
    V = rng.standard_normal((Nk, dv))
    dO = rng.standard_normal((Nq, dv))
    return Q, K, V, dO


def assert_grads_close(got, want, rtol=RTOL, atol=ATOL):
    for name, g, w in zip(("dQ", "dK", "dV"), got, want, strict=True):
        assert g.shape == w.shape, f"{name}: shape {g.shape}, expected {w.shape}"
        assert g.dtype == np.float64, f"{name}: dtype {g.dtype}"
        assert np.isfinite(g).all(), f"{name} is not finite"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def flash_grads(Q, K, V, dO, Br, Bc, causal=False, softmax_scale=None):
    O, lse = forward(Q, K, V, causal, softmax_scale)
    return flash_attention_backward(
        Q, K, V, O, dO, lse, Br=Br, Bc=Bc, causal=causal, softmax_scale=softmax_scale
    )


# ---------------------------------------------------------------------------------------------
# Both backward passes against torch
# ---------------------------------------------------------------------------------------------


@st.composite
def backward_problem(draw, max_n=24, max_d=8):
    causal = draw(st.booleans())
    Nq = draw(st.integers(1, max_n))
    Nk = Nq if causal else draw(st.integers(1, max_n))
    d, dv = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    spread = draw(st.sampled_from([0.3, 1.0, 2.5]))
    problem = random_problem(draw(st.integers(0, 2**32 - 1)), Nq, Nk, d, dv, spread)
    softmax_scale = draw(st.one_of(st.none(), st.floats(0.05, 3.0)))
    Br, Bc = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    return problem, causal, softmax_scale, Br, Bc


@needs_torch
@given(case=backward_problem())
def test_flash_backward_equals_torch_autograd(case):
    (Q, K, V, dO), causal, softmax_scale, Br, Bc = case
    want = torch_grads(Q, K, V, dO, causal, softmax_scale)
    assert_grads_close(flash_grads(Q, K, V, dO, Br, Bc, causal, softmax_scale), want)


@needs_torch
@given(case=backward_problem())
def test_reference_backward_equals_torch_autograd(case):
    (Q, K, V, dO), causal, softmax_scale, _, _ = case
    got = attention_backward_reference(Q, K, V, dO, causal=causal, softmax_scale=softmax_scale)
    assert_grads_close(got, torch_grads(Q, K, V, dO, causal, softmax_scale, explicit=True))


@needs_torch
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("N", "Br", "Bc"),
    [
        (1, 1, 1),
        (1, 16, 16),  # one tile larger than N
        (7, 3, 2),  # ragged, Br > Bc
        (7, 2, 3),  # ragged, Br < Bc
        (10, 4, 4),
        (12, 8, 3),
        (37, 4, 3),  # 10 x 13 tiles
        (64, 1, 1),  # one score per tile: 4096 tiles
        (100, 16, 12),  # the lesson's N = 100, not a multiple of the tiles
    ],
)
def test_flash_backward_grid_of_shapes(N, Br, Bc, causal):
    Q, K, V, dO = random_problem(N * 1000 + Br * 10 + Bc, N, N, 5, 3)
    want = torch_grads(Q, K, V, dO, causal)
    assert_grads_close(flash_grads(Q, K, V, dO, Br, Bc, causal), want)


@needs_torch
@pytest.mark.parametrize(("Nq", "Nk"), [(1, 9), (9, 1), (5, 12), (12, 5), (31, 17)])
def test_flash_backward_more_or_fewer_keys_than_queries(Nq, Nk):
    Q, K, V, dO = random_problem(Nq * 100 + Nk, Nq, Nk, 6, 4)
    want = torch_grads(Q, K, V, dO)
    for Br, Bc in [(1, 1), (4, 3), (3, 4), (64, 64)]:
        assert_grads_close(flash_grads(Q, K, V, dO, Br, Bc), want)


@needs_torch
def test_flash_backward_large_scores_do_not_overflow():
    """Scores near 700 overflow exp(S) but never exp(S - lse): the exponent is <= 0."""
    Q, K, V, dO = random_problem(5, 20, 20, 4, 4, spread=1.0)
    K = 1.0 + 0.01 * K  # every score is about tau * sum(q) ...
    Q = Q + 350.0  # ... around 700, and differ by a few units
    got = flash_grads(Q, K, V, dO, 4, 4)
    assert_grads_close(got, torch_grads(Q, K, V, dO), atol=1e-9)


def test_the_two_backwards_agree_on_the_lesson_size():
    Q, K, V, dO = random_problem(0, 100, 100, 32, 32)
    for causal in (False, True):
        want = attention_backward_reference(Q, K, V, dO, causal=causal)
        assert_grads_close(flash_grads(Q, K, V, dO, 16, 16, causal), want, rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# Rows without keys: zero gradients, never NaN
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_at_all_gives_zero_gradients(causal):
    rng = np.random.default_rng(1)
    Nq = 0 if causal else 3
    Q, K, V = rng.standard_normal((Nq, 2)), np.zeros((0, 2)), np.zeros((0, 3))
    dO = rng.standard_normal((Nq, 3))
    O, lse = forward(Q, K, V, causal)
    assert np.isneginf(lse).all()
    for dQ, dK, dV in (
        flash_attention_backward(Q, K, V, O, dO, lse, Br=2, Bc=2, causal=causal),
        attention_backward_reference(Q, K, V, dO, causal=causal),
    ):
        assert dQ.shape == (Nq, 2) and dK.shape == (0, 2) and dV.shape == (0, 3)
        assert not dQ.any()


@needs_torch
@pytest.mark.parametrize(("Br", "Bc"), [(1, 1), (2, 3), (16, 16)])
def test_rows_marked_without_keys_have_zero_gradients_and_add_nothing(Br, Bc):
    """lse = -inf (a padding row the forward gave no key): P = 0 for that row.

    Its dQ is 0, and dK, dV are those of the other rows alone (checked against torch on them).
    """
    Q, K, V, dO = random_problem(2, 7, 5, 3, 2)
    padding = np.array([False, True, False, False, True, False, True])
    O, lse = forward(Q, K, V)
    O[padding], lse[padding] = 0.0, -np.inf
    dQ, dK, dV = flash_attention_backward(Q, K, V, O, dO, lse, Br=Br, Bc=Bc)
    assert np.isfinite(dQ).all() and np.isfinite(dK).all() and np.isfinite(dV).all()
    assert not dQ[padding].any()
    keep = ~padding
    want = torch_grads(Q[keep], K, V, dO[keep])
    assert_grads_close((dQ[keep], dK, dV), want)


def test_rows_marked_without_keys_under_a_causal_mask():
    """The masked scores of such a row are -inf and lse is -inf: still 0, not NaN."""
    Q, K, V, dO = random_problem(3, 6, 6, 3, 2)
    O, lse = forward(Q, K, V, causal=True)
    O[2], lse[2] = 0.0, -np.inf
    dQ, dK, dV = flash_attention_backward(Q, K, V, O, dO, lse, Br=2, Bc=2, causal=True)
    assert np.isfinite(dQ).all() and np.isfinite(dK).all() and np.isfinite(dV).all()
    assert not dQ[2].any()
    # dV without row 2: sum over the other rows of P^T dO
    S = Q @ K.T / math.sqrt(3)
    S[np.triu_indices(6, 1)] = -np.inf
    P = np.exp(S - np.where(np.isneginf(lse), np.inf, lse)[:, None])
    np.testing.assert_allclose(dV, P.T @ dO, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# The algebra: the D identity, the softmax backward, finite differences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_D_identity(causal):
    """D_i = rowsum(dO o O)_i = rowsum(P o dP)_i, with dP = dO V^T."""
    Q, K, V, dO = random_problem(4, 30, 30, 8, 5)
    O, _ = forward(Q, K, V, causal)
    S = Q @ K.T / math.sqrt(8)
    if causal:
        S[np.triu_indices(30, 1)] = -np.inf
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    dP = dO @ V.T
    np.testing.assert_allclose((dO * O).sum(axis=1), (P * dP).sum(axis=1), rtol=1e-12)


@needs_torch
def test_softmax_backward_equals_torch():
    rng = np.random.default_rng(5)
    s = torch.tensor(rng.standard_normal((6, 9)), dtype=torch.float64, requires_grad=True)
    p = torch.softmax(s, dim=1)
    dP = rng.standard_normal((6, 9))
    p.backward(torch.tensor(dP))
    got = softmax_backward(p.detach().numpy(), dP)
    np.testing.assert_allclose(got, s.grad.numpy(), rtol=1e-12, atol=1e-15)
    # rows sum to 0: adding a constant to a row of scores does not change the softmax
    np.testing.assert_allclose(got.sum(axis=1), 0.0, atol=1e-14)


def test_softmax_backward_of_an_empty_row_is_zero():
    P = np.array([[0.0, 0.0, 0.0], [0.25, 0.75, 0.0]])
    dP = np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 5.0]])
    dS = softmax_backward(P, dP)
    np.testing.assert_array_equal(dS[0], 0.0)
    assert dS[1, 2] == 0.0  # a masked entry (P = 0) gets no gradient


@pytest.mark.parametrize("causal", [False, True])
def test_reference_backward_equals_finite_differences(causal):
    """Central differences of L = sum(O o dO) with the forward oracle, entry by entry."""
    Q, K, V, dO = random_problem(6, 3, 3, 2, 2)
    Nk = 3
    if not causal:
        Q, K, V, dO = random_problem(6, 3, 4, 2, 2)
        Nk = 4
    grads = attention_backward_reference(Q, K, V, dO, causal=causal)
    h = 1e-6
    for arg, grad in zip((Q, K, V), grads, strict=True):
        numeric = np.zeros_like(arg)
        for idx in np.ndindex(arg.shape):
            saved = arg[idx]
            arg[idx] = saved + h
            up = (forward(Q, K, V, causal)[0] * dO).sum()
            arg[idx] = saved - h
            down = (forward(Q, K, V, causal)[0] * dO).sum()
            arg[idx] = saved
            numeric[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert grads[1].shape == (Nk, 2)


def test_lse_is_used_as_given():
    """P is exp(S - lse): the backward trusts lse (shifting it by c scales every P by e^-c)."""
    Q, K, V, dO = random_problem(7, 5, 5, 2, 2)
    O, lse = forward(Q, K, V)
    zero_do = np.zeros_like(dO)
    _, _, dV = flash_attention_backward(Q, K, V, O, dO, lse)
    _, _, dV_shift = flash_attention_backward(Q, K, V, O, dO, lse + math.log(2.0))
    np.testing.assert_allclose(dV_shift, dV / 2, rtol=1e-12)
    assert not any(g.any() for g in flash_attention_backward(Q, K, V, O, zero_do, lse))


def test_flash_backward_never_builds_the_score_matrix():
    N, d = 1024, 16
    Q, K, V, dO = random_problem(8, N, N, d, d)
    O, lse = forward(Q, K, V)
    tracemalloc.start()
    flash_attention_backward(Q, K, V, O, dO, lse, Br=64, Bc=64)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < N * N * 8 / 8  # far below one N x N float64 matrix (8 MiB)


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------


def test_backward_flops():
    N, d = 1024, 64
    assert attention_backward_flops(N, d) == 10 * N * N * d
    assert attention_backward_flops(N, d, recompute=False) == 8 * N * N * d
    assert attention_backward_flops(N, d) / attention_backward_flops(N, d, recompute=False) == 1.25
    assert attention_backward_flops(N, d, causal=True) == 5 * N * N * d
    assert attention_backward_flops(N, d, batch=2, heads=3) == 6 * 10 * N * N * d


def test_forward_plus_backward_ratio_is_close_to_the_measured_one():
    """(4 + 10) / (4 + 8) = 7/6 more matmul FLOPs; Dao et al. measured 75.2 / 66.6 = 1.13."""
    N, d = 1024, 64
    fwd = 4 * N * N * d
    ratio = (fwd + attention_backward_flops(N, d)) / (
        fwd + attention_backward_flops(N, d, recompute=False)
    )
    assert ratio == pytest.approx(7 / 6)
    assert abs(ratio - 75.2 / 66.6) < 0.05


# ---------------------------------------------------------------------------------------------
# Memory kept for the backward pass (saved-tensor hooks)
# ---------------------------------------------------------------------------------------------


@needs_torch
def test_lesson_memory_numbers():
    """N = 1000, d = 64, fp32: naive keeps q, k, v and P; the fused kernel q, k, v, out, lse."""
    N, d = 1000, 64
    got = saved_bytes_naive_vs_fused(N, d)
    assert isinstance(got, SavedBytes)
    assert got.naive == 4 * (3 * N * d + N * N) == 4_768_000
    assert got.fused == 4 * (4 * N * d + N) == 1_028_000
    assert sorted(t.nbytes for t in got.naive_tensors) == [256_000] * 3 + [4_000_000]
    assert sorted(t.nbytes for t in got.fused_tensors) == [4_000] + [256_000] * 4
    assert got.ratio == pytest.approx(4_768_000 / 1_028_000)


@needs_torch
def test_memory_gap_grows_like_N_squared():
    small, large = saved_bytes_naive_vs_fused(128, 16), saved_bytes_naive_vs_fused(256, 16)
    assert large.naive - 4 * 3 * 256 * 16 == 4 * (small.naive - 4 * 3 * 128 * 16)  # P: N^2
    assert large.fused == 2 * small.fused  # q, k, v, out, lse: linear in N


@needs_torch
def test_causal_naive_keeps_no_extra_mask():
    got = saved_bytes_naive_vs_fused(200, 8, causal=True)
    assert got.naive == 4 * (3 * 200 * 8 + 200 * 200)


@needs_torch
def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(10, 10, dtype=torch.float64, requires_grad=True)
    assert saved_tensor_bytes(lambda t: (t * t).sum(), x) == 800  # x saved twice, counted once
    assert saved_tensor_bytes(lambda t: t.transpose(0, 1) @ t, x) == 800  # a view: same storage
    assert saved_tensor_bytes(lambda t: (t + 1).sum(), x) == 0  # an add saves nothing
    assert len(saved_tensors(lambda t: torch.exp(t) * t, x)) == 2  # exp's output, and x
    no_grad = torch.randn(10, 10)
    assert saved_tensor_bytes(lambda t: (t * t).sum(), no_grad) == 0


@needs_torch
def test_naive_attention_torch_matches_sdpa_in_float64():
    Q, K, V, _ = random_problem(9, 12, 12, 4, 3)
    q, k, v = (torch.tensor(a)[None, None] for a in (Q, K, V))
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        got = naive_attention_torch(q, k, v, causal=causal)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got = naive_attention_torch(q, k, v, softmax_scale=0.3)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------


def _good():
    Q, K, V, dO = random_problem(10, 4, 4, 3, 2)
    O, lse = forward(Q, K, V)
    return {"Q": Q, "K": K, "V": V, "O": O, "dO": dO, "lse": lse}


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"O": np.zeros((4, 3))}, ValueError, r"O must have the shape of dO"),
        ({"dO": np.zeros((3, 2))}, ValueError, r"dO must have the shape of O"),
        ({"lse": np.zeros(3)}, ValueError, r"lse must have shape \(Nq,\)"),
        ({"lse": np.zeros((4, 1))}, ValueError, r"lse must have 1 dimensions"),
        ({"lse": np.array([0.0, np.nan, 0.0, 0.0])}, ValueError, r"lse contains NaN"),
        ({"lse": np.array([0.0, np.inf, 0.0, 0.0])}, ValueError, r"lse contains \+inf"),
        ({"dO": np.full((4, 2), np.inf)}, ValueError, r"dO contains inf"),
        ({"Q": np.ones((4, 3), dtype=int)}, TypeError, r"Q must be an array of real floats"),
        ({"K": np.zeros((4, 2))}, ValueError, r"Q and K must share the head dimension"),
        ({"V": np.zeros((5, 2))}, ValueError, r"K and V must have the same number of keys"),
        ({"Br": 0}, ValueError, r"Br must be a positive integer"),
        ({"Bc": 2.0}, TypeError, r"Bc must be a positive integer"),
        ({"causal": "yes"}, TypeError, r"causal must be True or False"),
        ({"softmax_scale": -1.0}, ValueError, r"softmax_scale must be finite and positive"),
    ],
)
def test_flash_backward_input_errors_name_the_argument(change, error, match):
    kwargs = _good() | change
    with pytest.raises(error, match=match):
        flash_attention_backward(**kwargs)


def test_causal_needs_as_many_queries_as_keys():
    Q, K, V, dO = random_problem(11, 3, 5, 2, 2)
    O, lse = forward(Q, K, V)
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        flash_attention_backward(Q, K, V, O, dO, lse, causal=True)
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        attention_backward_reference(Q, K, V, dO, causal=True)


def test_overflowing_scores_are_refused():
    Q = np.full((2, 2), 1e200)
    dO = np.ones((2, 2))
    with pytest.raises(ValueError, match="overflows"):
        attention_backward_reference(Q, Q, Q, dO)
    with pytest.raises(ValueError, match="overflows"):
        flash_attention_backward(Q, Q, Q, dO, dO, np.zeros(2))


def test_other_input_errors():
    with pytest.raises(ValueError, match=r"dO must have the shape of O"):
        ones = np.ones((2, 2)), np.ones((3, 2)), np.ones((3, 4))
        attention_backward_reference(*ones, np.ones((2, 3)))
    with pytest.raises(ValueError, match="P and dP must have the same shape"):
        softmax_backward(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="P must have 2 dimensions"):
        softmax_backward(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="N must be a positive integer"):
        attention_backward_flops(0, 64)
    with pytest.raises(TypeError, match="recompute must be True or False"):
        attention_backward_flops(8, 64, recompute=1)
    with pytest.raises(TypeError, match="causal must be True or False"):
        attention_backward_flops(8, 64, causal=None)
