"""The checks of notebook 07: right answers in several styles pass, every named mistake and every
broken rule is recognized by its slug.

The correct implementations here are written independently of course_utils (a learner's answers,
as learners write them). The buggy replays of the check module run through checkhelp.as_learner.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import math
import time

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of

import course_utils.references.backward as B
from course_utils.checks import CheckFailure
from course_utils.checks import backward as C
from course_utils.checks.backward import exercises as C_exercises
from course_utils.checks.backward import mistakes as C_mistakes
from course_utils.checks.engine.rules import traced_loads
from course_utils.checks.engine.watch import instrumented_call
from course_utils.references.attention import attention_reference


# ---- exercise 1: right answers -------------------------------------------------------------
def softmax_backward_rows(P, dP):
    """The notebook's answer: D as a column."""
    D = (P * dP).sum(axis=1, keepdims=True)
    return P * (dP - D)


def softmax_backward_einsum(P, dP):
    """D by einsum, subtracted through [:, None]."""
    D = np.einsum("ij,ij->i", P, dP)
    return P * dP - P * D[:, None]


def softmax_backward_row_loop(P, dP):
    """One row at a time, after converting with astype."""
    P, dP = P.astype(np.float64), dP.astype(np.float64)
    dS = np.empty_like(P)
    for r in range(len(P)):
        dS[r] = P[r] * (dP[r] - P[r] @ dP[r])
    return dS


SOFTMAX_STYLES = [softmax_backward_rows, softmax_backward_einsum, softmax_backward_row_loop]


# ---- exercise 2: right answers, in the styles learners write them -----------------------------
def flash_attention_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """K/V tiles outside (the notebook's order); Q[rows] is sliced twice per tile."""
    Nq, d = Q.shape
    tau = 1.0 / math.sqrt(d)
    D = (dO * O).sum(axis=1)
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        cols = np.arange(j, j + len(k_j))
        dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)
        for i in range(0, Nq, Br):
            rows = np.arange(i, min(i + Br, Nq))
            if causal and j > rows[-1]:
                continue
            s = tau * Q[rows] @ k_j.T
            if causal:
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            p = np.exp(s - lse_safe[rows, None])
            dv_j += p.T @ dO[rows]
            ds = p * (dO[rows] @ v_j.T - D[rows, None])
            dQ[rows] += tau * ds @ k_j
            dk_j += tau * ds.T @ Q[rows]
        dK[cols], dV[cols] = dk_j, dv_j
    return dQ, dK, dV


def backward_queries_outside(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Query tiles outside, dQ_i on chip, dK and dV accumulated in place; break at the diagonal."""
    N, d = Q.shape
    tau = d**-0.5
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for i in range(0, N, Br):
        q, do, o = Q[i : i + Br], dO[i : i + Br], O[i : i + Br]
        L = lse[i : i + Br]
        L = np.where(L == -np.inf, np.inf, L)
        D = np.sum(do * o, axis=1)
        last = i + len(q) - 1
        dq = np.zeros_like(q)
        for j in range(0, K.shape[0], Bc):
            if causal and j > last:
                break
            k, v = K[j : j + Bc], V[j : j + Bc]
            s = q @ k.T * tau
            if causal:
                r = np.arange(i, i + len(q))[:, None]
                c = np.arange(j, j + len(k))[None, :]
                s[c > r] = -np.inf
            p = np.exp(s - L[:, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[:, None])
            dq += ds @ k * tau
            dK[j : j + Bc] += ds.T @ q * tau
        dQ[i : i + Br] = dq
    return dQ, dK, dV


def backward_einsum_split(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Tiles as index sets from np.array_split, products by einsum, a tile-local np.tri with the
    tile's offset (np.tri(rows, cols, k=i - j) is the global mask)."""
    tau = 1 / np.sqrt(Q.shape[1])
    D = np.einsum("nd,nd->n", dO, O)
    no_key = np.isneginf(lse)
    q_tiles = np.array_split(np.arange(len(Q)), max(1, -(-len(Q) // Br)))
    dQ = np.zeros((len(Q), Q.shape[1]))
    dK = np.zeros((len(K), K.shape[1]))
    dV = np.zeros((len(V), V.shape[1]))
    for j in range(0, len(K), Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        for rows in q_tiles:
            if len(rows) == 0 or (causal and rows[-1] < j):
                continue
            i = int(rows[0])
            q_i, do_i = Q[i : i + len(rows)], dO[i : i + len(rows)]
            s = tau * np.einsum("rd,cd->rc", q_i, k_j)
            if causal:
                s = np.where(np.tri(len(rows), len(k_j), k=i - j, dtype=bool), s, -np.inf)
            lse_i = np.where(no_key[rows], np.inf, lse[i : i + len(rows)])
            p = np.exp(s - lse_i[:, None])
            dv_j = np.einsum("rc,rv->cv", p, do_i)
            ds = p * (np.einsum("rv,cv->rc", do_i, v_j) - D[rows][:, None])
            dQ[rows] += tau * np.einsum("rc,cd->rd", ds, k_j)
            dK[j : j + Bc] += tau * np.einsum("rc,rd->cd", ds, q_i)
            dV[j : j + Bc] += dv_j
    return dQ, dK, dV


def backward_astype_diagonal_start(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Every input converted with astype first (float32 inputs work too); the inner loop starts
    at the query tile that holds row j."""
    Q, K, V, O, dO, lse = (a.astype(np.float64) for a in (Q, K, V, O, dO, lse))
    N, d = Q.shape
    tau = 1.0 / math.sqrt(d)
    D = (dO * O).sum(-1)
    safe = lse.copy()
    safe[np.isneginf(safe)] = np.inf
    dQ, dK, dV = np.zeros((N, d)), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, len(K), Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        dk_j, dv_j = np.zeros_like(k_j), np.zeros_like(v_j)
        start = (j // Br) * Br if causal else 0
        for i in range(start, N, Br):
            q_i, do_i = Q[i : i + Br], dO[i : i + Br]
            s = (q_i @ k_j.T) * tau
            if causal:
                mask = np.arange(j, j + len(k_j)) > np.arange(i, i + len(q_i))[:, None]
                s = np.where(mask, -np.inf, s)
            p = np.exp(s - safe[i : i + Br, None])
            dv_j += p.T @ do_i
            ds = p * (do_i @ v_j.T - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k_j
            dk_j += tau * ds.T @ q_i
        dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j
    return dQ, dK, dV


def backward_row_loops(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Python loops over the rows of each query tile: K/V tiles outside, the skip decided before
    slicing; each row q_i[r], do_i[r] of the sliced tiles is read twice, free on chip."""
    N, d = Q.shape
    tau = 1 / math.sqrt(d)
    D = (dO * O).sum(axis=1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]
        dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)
        cols = np.arange(j, j + len(k_j))
        for i in range(0, N, Br):
            if causal and min(i + Br, N) - 1 < j:
                continue
            q_i, do_i = Q[i : i + Br], dO[i : i + Br]
            for r in range(len(q_i)):
                s = tau * (k_j @ q_i[r])
                if causal:
                    s = np.where(cols <= i + r, s, -np.inf)
                p = np.exp(s - L[i + r])
                dv_j += np.outer(p, do_i[r])
                ds = p * (v_j @ do_i[r] - D[i + r])
                dQ[i + r] += tau * (ds @ k_j)
                dk_j += tau * np.outer(ds, q_i[r])
        dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j
    return dQ, dK, dV


BACKWARD_STYLES = [
    flash_attention_backward,
    backward_queries_outside,
    backward_einsum_split,
    backward_astype_diagonal_start,
    backward_row_loops,
]

CHECKS = [
    (C.check_softmax_backward_rows, softmax_backward_rows),
    (C.check_flash_attention_backward, flash_attention_backward),
]


# ---- right answers pass ----------------------------------------------------------------------
@pytest.mark.parametrize(("check", "fn"), CHECKS)
def test_right_answer_passes_with_one_pass_line(check, fn):
    printed = run_quietly(check, fn)
    assert printed.count("✓") == 1 and printed.endswith("\n") and printed.count("\n") == 1


@pytest.mark.parametrize("fn", SOFTMAX_STYLES, ids=lambda f: f.__name__)
def test_softmax_backward_in_other_styles_passes(fn):
    assert "✓" in run_quietly(C.check_softmax_backward_rows, fn)


@pytest.mark.parametrize("fn", BACKWARD_STYLES, ids=lambda f: f.__name__)
def test_backward_in_other_styles_passes_every_rule(fn):
    printed = run_quietly(C.check_flash_attention_backward, fn)
    assert "✓" in printed and "4 rules hold" in printed


def test_a_style_that_converts_its_inputs_handles_float32_inputs():
    rng = np.random.default_rng(5)
    Q, K, V, dO = (rng.standard_normal((20, 4)).astype(np.float32) for _ in range(4))
    O, lse = attention_reference(Q, K, V, causal=True)
    got = backward_astype_diagonal_start(Q, K, V, O.astype(np.float32), dO, lse, 8, 4, True)
    want = B.attention_backward_reference(Q, K, V, dO, causal=True)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("check", "fn"), CHECKS)
def test_hidden_mode_fresh_inputs_pass(check, fn):
    for _ in range(2):
        assert "✓" in run_quietly(check, fn, seed=None, trials=25)


def test_the_check_cells_are_fast():
    """Both graded cells (the visible and the hidden call) stay around a second or two."""
    C_exercises._backward_rules()  # built once per process (the memory cases)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        C.check_softmax_backward_rows(softmax_backward_rows)
        C.check_flash_attention_backward(flash_attention_backward)
    visible = time.perf_counter() - start
    with contextlib.redirect_stdout(io.StringIO()):
        C.check_softmax_backward_rows(softmax_backward_rows, seed=None, trials=40)
        C.check_flash_attention_backward(flash_attention_backward, seed=None, trials=40)
    assert visible < 3.0 and time.perf_counter() - start < 8.0


# ---- the cases -------------------------------------------------------------------------------
def test_the_course_backward_and_the_checks_own_loops_agree_with_the_oracle():
    """cu.flash_attention_backward (tested against torch) and the checks' two rule-following loops
    match the oracle on every case, including the rows marked as having seen no key."""
    for case in C_exercises._backward_cases(seed=1, trials=30):
        want = C_exercises._reference_backward(*case.args, **case.kwargs)
        for got in (
            B.flash_attention_backward(*case.args, **case.kwargs),
            C_exercises._tiled_backward(*case.args, **case.kwargs),
            C_exercises._tiled_backward(*case.args, **case.kwargs, keys_outside=False),
        ):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_the_rule_cases_are_consistent_and_their_reference_is_right():
    for rule in C_exercises._backward_rules():
        Q, K, V, O, dO, lse = rule.case.args
        causal = rule.case.kwargs.get("causal", False)
        O_ref, lse_ref = attention_reference(Q, K, V, causal=causal)
        np.testing.assert_allclose(O, O_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse, lse_ref, rtol=1e-12)
        got = C_exercises._tiled_backward(*rule.case.args, **rule.case.kwargs)
        want = B.attention_backward_reference(Q, K, V, dO, causal=causal)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_cases_are_consistent_forward_results():
    """O and lse of every case are the forward's (or 0 and -inf for a row marked without keys)."""
    for case in C_exercises._backward_cases(seed=2, trials=20):
        Q, K, V, O, dO, lse = case.args
        O_ref, lse_ref = attention_reference(Q, K, V, causal=case.kwargs.get("causal", False))
        marked = np.isneginf(lse) & np.isfinite(lse_ref)
        np.testing.assert_allclose(O[~marked], O_ref[~marked], rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(lse[~marked], lse_ref[~marked])
        assert not O[marked].any()
        assert all(not a.flags.writeable for a in case.args)


def test_backward_cases_cover_the_required_shapes():
    cases = C_exercises._backward_cases(seed=0, trials=0)
    shapes = [(len(c.args[0]), len(c.args[1]), c.args[2].shape[1], c.kwargs) for c in cases]
    tiles = [(kw.get("Br", 16), kw.get("Bc", 16)) for *_, kw in shapes]
    assert any(nk == 0 for _, nk, _, _ in shapes)  # no keys
    assert any(np.isneginf(c.args[5]).any() and len(c.args[1]) > 0 for c in cases)  # marked rows
    assert any(np.isneginf(c.args[5]).any() and c.kwargs.get("causal") for c in cases)
    assert any(nq != nk and nk > 0 for nq, nk, _, _ in shapes)  # Nq != Nk
    assert any(dv != c.args[0].shape[1] for c, (_, _, dv, _) in zip(cases, shapes, strict=True))
    assert any(br > nq for (br, _), (nq, *_) in zip(tiles, shapes, strict=True))  # Br > N
    assert any(kw.get("causal") and kw["Br"] != kw["Bc"] for *_, kw in shapes)
    assert any(nq % br and nq > br for (br, _), (nq, *_) in zip(tiles, shapes, strict=True))
    assert any(
        -(-nq // br) * -(-nk // bc) >= 100
        for (br, bc), (nq, nk, *_) in zip(tiles, shapes, strict=True)
    )
    # scores of several hundred, and lse more than 1000 apart
    finite_lse = [c.args[5][np.isfinite(c.args[5])] for c in cases]
    assert any(np.ptp(lse) > 1000 for lse in finite_lse if lse.size)
    # the first case has a square tile, so a missing transpose shows as a wrong value
    assert tiles[0][0] == tiles[0][1] == len(cases[0].args[0]) == len(cases[0].args[1])


def test_labels_speak_of_the_notebook_and_every_case_has_a_focus():
    cases = C_exercises._backward_cases(seed=0, trials=3) + C_exercises._softmax_backward_cases(
        seed=0, trials=3
    )
    cases += [rule.case for rule in C_exercises._backward_rules()]
    for case in cases:
        assert not any(w in case.label.lower() for w in ("textbook", "lesson", "check yourself"))
        assert case.focus
    assert "section 6" in C_exercises._backward_cases(0, 0)[1].label
    assert "section 4" in C_exercises._softmax_backward_cases(0, 0)[1].label


# ---- the stages of exercise 2 -----------------------------------------------------------------
def _shape(case):
    Q, K = case.args[:2]
    Br, Bc = case.kwargs.get("Br", 16), case.kwargs.get("Bc", 16)
    return len(Q), len(K), Br, Bc, case.kwargs.get("causal", False)


@pytest.mark.parametrize("seed", [0, 1, None])
def test_the_cases_come_in_the_four_stages_and_each_case_fits_its_stage(seed):
    cases = C_exercises._backward_cases(seed=seed, trials=20)
    stages = [c.stage for c in cases]
    assert list(dict.fromkeys(stages)) == list(
        C_exercises.STAGES
    )  # every stage, in order, contiguous
    assert C_exercises.STAGES == ("plain tiles", "ragged tiles", "causal mask", "N_q != N_k")
    for case in cases:
        nq, nk, br, bc, causal = _shape(case)
        no_key = np.isneginf(case.args[5]).any()
        if case.stage == "plain tiles":
            assert not causal and not no_key and nq % br == 0 and nk % bc == 0, case.label
        elif case.stage == "ragged tiles":
            assert not causal and not no_key and nq == nk, case.label
        elif case.stage == "causal mask":
            assert causal and nq == nk, case.label
        else:
            assert not causal and (nq != nk or no_key), case.label
    # the worked example is the second case of stage 1; each stage has ragged or larger tiles
    assert "worked example" in cases[1].label and cases[1].stage == "plain tiles"
    ragged = [c for c in cases if c.stage == "ragged tiles"]
    assert any(nq % br for nq, _, br, _, _ in map(_shape, ragged))
    assert any(br > nq for nq, _, br, _, _ in map(_shape, ragged))
    last = [c for c in cases if c.stage == "N_q != N_k"]
    assert any(len(c.args[1]) == 0 for c in last)  # no keys at all
    assert any(np.isneginf(c.args[5]).any() and len(c.args[1]) > 0 for c in last)
    causal_cases = [c for c in cases if c.stage == "causal mask"]
    assert any(np.isneginf(c.args[5]).any() for c in causal_cases)


def test_the_fixed_cases_of_each_stage_come_smallest_first():
    cases = [c for c in C_exercises._backward_cases(seed=0, trials=0)]
    for stage in C_exercises.STAGES:
        sizes = [len(c.args[0]) * max(1, len(c.args[1])) for c in cases if c.stage == stage]
        sizes = sizes[1:] if stage == "N_q != N_k" else sizes  # N_k = 0 first: the empty case
        assert sizes == sorted(sizes), (stage, sizes)


def _learner(bug):
    def fn(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        return C_mistakes._backward_variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug=bug)

    fn.__course_test_double__ = True  # a replay of the module, with a learner's signature
    return fn


def backward_guard_only_when_causal(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Right, except that lse is guarded only with causal=True (as if only a mask made -inf)."""
    N, d = Q.shape
    tau = 1 / math.sqrt(d)
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse) if causal else lse
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        for i in range(0, N, Br):
            rows = np.arange(i, min(i + Br, N))
            if causal and rows[-1] < j:
                continue
            q, do = Q[i : i + Br], dO[i : i + Br]
            s = tau * q @ k.T
            if causal:
                s = np.where(np.arange(j, j + len(k))[None, :] <= rows[:, None], s, -np.inf)
            with np.errstate(all="ignore"):
                p = np.exp(s - L[rows, None])
                dV[j : j + Bc] += p.T @ do
                ds = p * (do @ v.T - D[rows, None])
                dQ[i : i + Br] += tau * ds @ k
                dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


@pytest.mark.parametrize(
    ("fn", "k", "slug"),
    [
        (_learner("forgot-D"), 1, "forgot-D"),
        (_learner("missing-scale"), 1, "missing-scale"),
        (_learner("ragged-q"), 2, "ragged-tile"),
        (_learner("ragged-k"), 2, "ragged-tile"),
        (_learner("no-mask"), 3, "causal-mask-missing"),
        (_learner("skip-break"), 3, "causal-loop-break"),
        (_learner("unguarded"), 3, "nan-masked"),
        (backward_guard_only_when_causal, 4, "nan-masked"),
    ],
    ids=["forgot-D", "missing-scale", "ragged-q", "ragged-k", "no-mask", "skip-break",
         "unguarded", "guard-only-when-causal"],
)  # fmt: skip
def test_a_failure_names_its_stage_and_the_stages_that_pass(fn, k, slug):
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(fn)
    message = str(info.value)
    first = message.splitlines()[0]
    assert first.startswith(
        f"✗ flash_attention_backward: stage {k} of 4 ({C_exercises.STAGES[k - 1]}) fails"
    ), message
    for passed in range(1, k):
        assert f"stage {passed} ({C_exercises.STAGES[passed - 1]}) passes" in first
    later = ", ".join(C_exercises.STAGES[k:])
    assert (f"Still to check after it: {later}." in first) == (k < 4)
    assert slug_of(info.value) == slug, message
    assert "is wrong on" in message.splitlines()[1]


def test_the_pass_line_names_the_stages():
    printed = run_quietly(C.check_flash_attention_backward, flash_attention_backward)
    assert "in 4 stages (plain tiles, ragged tiles, causal mask, N_q != N_k;" in printed


# ---- calling the course's code ---------------------------------------------------------------
def test_calling_the_course_reference_is_refused():
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_flash_attention_backward(B.flash_attention_backward)
    with pytest.raises(
        CheckFailure, match=r"calls course_utils\.references\.backward\.flash_attention_back"
    ):
        C.check_flash_attention_backward(
            lambda Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False: B.flash_attention_backward(
                Q, K, V, O, dO, lse, Br, Bc, causal
            )
        )
    with pytest.raises(
        CheckFailure, match=r"calls course_utils\.references\.backward\.attention_backward"
    ):
        C.check_flash_attention_backward(
            lambda Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False: B.attention_backward_reference(
                Q, K, V, dO, causal
            )
        )
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_softmax_backward_rows(lambda P, dP: B.softmax_backward(P, dP))
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_softmax_backward_rows(B.softmax_backward)


@pytest.mark.parametrize(
    "borrowed",
    [
        lambda *a, **k: C_exercises._tiled_backward(*a, **k),
        lambda *a, **k: C_exercises._tiled_backward(*a, **k, keys_outside=False),
        lambda *a, **k: C_mistakes._backward_variant(*a, **k, bug="none"),
        lambda *a, **k: C_exercises._reference_backward(*a, **k),
    ],
    ids=["tiled", "queries-outside", "variant-none", "oracle"],
)
def test_borrowing_the_checks_own_helpers_is_refused(borrowed):
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(borrowed)
    assert slug_of(info.value) == "calls-reference"


def test_calling_the_forward_reference_is_refused_too():
    def uses_forward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        attention_reference(Q, K, V, causal=causal)
        return flash_attention_backward(Q, K, V, O, dO, lse, Br, Bc, causal)

    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_flash_attention_backward(uses_forward)


@pytest.mark.parametrize(("check", "fn"), CHECKS)
def test_not_implemented_propagates(check, fn):
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check(stub)


def test_not_a_function():
    with pytest.raises(CheckFailure, match="expected a function"):
        C.check_flash_attention_backward(None)
    with pytest.raises(CheckFailure, match="expected a function"):
        C.check_softmax_backward_rows(3)


# ---- every named mistake is recognized -------------------------------------------------------
@pytest.mark.parametrize(
    "mistake", C.SOFTMAX_BACKWARD_MISTAKES, ids=lambda m: m.slug + ": " + m.title
)
def test_each_softmax_backward_mistake_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        C.check_softmax_backward_rows(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug
    assert mistake.title in str(info.value)


@pytest.mark.parametrize("mistake", C.BACKWARD_MISTAKES, ids=lambda m: m.slug + ": " + m.title)
def test_each_backward_mistake_is_named(mistake):
    """Its slug is named, with its own title or that of a mistake of the same slug that gives the
    same answer on the failing case (e.g. dQ unscaled, and dQ and dK unscaled, seen by dQ)."""
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)
    same_slug = [m.title for m in C.BACKWARD_MISTAKES if m.slug == mistake.slug]
    assert any(title in str(info.value) for title in same_slug)


def test_every_slug_of_the_notebook_is_recognized():
    slugs = {m.slug for m in C.BACKWARD_MISTAKES + C.BACKWARD_RULE_MISTAKES}
    for slug in [
        "forgot-D",
        "m-without-l",
        "unscaled-dq-dk",
        "D-from-dP",
        "D-per-tile",
        "missing-transpose",
        "causal-mask-missing",
        "base2-lse",
        "nan-masked",
        "ragged-tile",
        "tile-local-mask",
        "low-precision",
        "lse-guard-zero",
        "unsafe-exponent",
        "full-score-matrix",
        "ignores-tile-size",
        "causal-tiles-not-skipped",
    ]:
        assert slug in slugs
    assert {"forgot-D", "D-from-dP", "diagonal-only", "D-wrong-axis"} <= {
        m.slug for m in C.SOFTMAX_BACKWARD_MISTAKES
    }


def test_a_flipped_ds_sign_written_by_a_learner_is_named():
    """Issue 39: dS = P * (D - dP) in the tiled backward (the mistake exercise 1 and notebook 08
    name) got "no known mistake"; the replay with the sign flipped now matches it."""
    source = inspect.getsource(backward_astype_diagonal_start)
    flipped = source.replace("p * (do_i @ v_j.T - D[i : i + Br, None])",
                             "p * (D[i : i + Br, None] - do_i @ v_j.T)")  # fmt: skip
    assert flipped != source
    namespace = {"np": np, "math": math}
    exec(compile(flipped, "<learner>", "exec"), namespace)
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(namespace["backward_astype_diagonal_start"])
    assert slug_of(info.value) == "sign-flipped", str(info.value)
    assert "No known mistake" not in str(info.value)


def test_backward_mistakes_are_named_on_fresh_random_cases_too():
    """In hidden mode (seed=None) a buggy function still fails with its own slug."""
    for mistake in C.BACKWARD_MISTAKES[3:14]:
        with pytest.raises(CheckFailure, match=rf"\[misconception: {mistake.slug}\]"):
            C.check_flash_attention_backward(as_learner(mistake.fn), seed=None, trials=5)


def test_two_mistakes_at_once_name_the_one_in_dV_first():
    """forgot-D leaves dV right; a missing transpose of P shows in dV, the first round."""

    def two_bugs(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        variant = C_mistakes._backward_variant
        dQ, dK, _ = variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug="forgot-D")
        dV = variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug="dv-no-transpose")[2]
        return dQ, dK, dV

    with pytest.raises(CheckFailure, match=r"\[misconception: missing-transpose\]"):
        C.check_flash_attention_backward(as_learner(two_bugs))


# ---- misconceptions written by hand, as learners write them ------------------------------------
def backward_tile_local_mask(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """np.tri of the tile as the causal mask of every tile that crosses the diagonal."""
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        for i in range(0, len(Q), Br):
            last = min(i + Br, len(Q)) - 1
            if causal and j > last:
                continue
            q, do, k, v = Q[i : i + Br], dO[i : i + Br], K[j : j + Bc], V[j : j + Bc]
            s = tau * q @ k.T
            if causal and j + len(k) - 1 > i:
                s = np.where(np.tri(len(q), len(k), dtype=bool), s, -np.inf)
            p = np.exp(s - L[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def test_a_tile_local_mask_is_named_as_such_never_as_low_precision():
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(backward_tile_local_mask)
    message = str(info.value)
    assert slug_of(info.value) == "tile-local-mask", message
    assert "low-precision" not in message and "float32" not in message


@pytest.mark.parametrize("offset", [1e-3, 0.05, 0.5])
def test_a_constant_offset_in_lse_is_not_called_low_precision(offset):
    def shifted(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        return flash_attention_backward(Q, K, V, O, dO, lse + offset, Br, Bc, causal)

    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(shifted)
    message = str(info.value)
    assert slug_of(info.value) is None and "low-precision" not in message
    assert "No known mistake matches; this case exercises" in message


def float32_gradients(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    grads = flash_attention_backward(Q, K, V, O, dO, lse, Br, Bc, causal)
    return tuple(g.astype(np.float32) for g in grads)


def float32_accumulators(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Query tiles outside, with dQ, dK, dV in float32 (as a GPU kernel keeps them)."""
    tau = Q.shape[1] ** -0.5
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = (np.zeros(a.shape, np.float32) for a in (Q, K, V))
    for i in range(0, len(Q), Br):
        q, do = Q[i : i + Br], dO[i : i + Br]
        for j in range(0, len(K), Bc):
            if causal and j > i + len(q) - 1:
                break
            k, v = K[j : j + Bc], V[j : j + Bc]
            s = q @ k.T * tau
            if causal:
                r, c = np.arange(i, i + len(q))[:, None], np.arange(j, j + len(k))[None, :]
                s = np.where(c > r, -np.inf, s)
            p = np.exp(s - L[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[i : i + Br, None])
            dQ[i : i + Br] += ds @ k * tau
            dK[j : j + Bc] += ds.T @ q * tau
    return dQ, dK, dV


@pytest.mark.parametrize("fn", [float32_gradients, float32_accumulators], ids=lambda f: f.__name__)
def test_float32_gradients_written_by_a_learner_are_low_precision(fn):
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(fn)
    assert slug_of(info.value) == "low-precision"


def test_a_zero_stand_in_for_lse_is_named():
    def zero_guard(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        return flash_attention_backward(
            Q, K, V, O, dO, np.where(np.isneginf(lse), 0.0, lse), Br, Bc, causal
        )

    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(zero_guard)
    assert slug_of(info.value) == "lse-guard-zero"


# ---- inputs changed in place ----------------------------------------------------------------
def test_dP_changed_in_place_is_named():
    def in_place(P, dP):
        D = (P * dP).sum(axis=1, keepdims=True)
        dP -= D
        return P * dP

    with pytest.raises(CheckFailure) as info:
        C.check_softmax_backward_rows(in_place)
    assert slug_of(info.value) == "mutates-input" and "`dP`" in str(info.value)


def test_Q_scaled_in_place_is_named():
    def scaled(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        Q *= 1.0
        return flash_attention_backward(Q, K, V, O, dO, lse, Br, Bc, causal)

    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(scaled)
    assert slug_of(info.value) == "mutates-input" and "`Q`" in str(info.value)


@pytest.mark.parametrize("stand_in", [np.inf, 0.0])
def test_lse_guarded_in_place_is_named_and_told_to_guard_a_new_array(stand_in):
    def guarded(Q, K, V, O, dO, L, Br=16, Bc=16, causal=False):
        L[np.isneginf(L)] = stand_in
        return flash_attention_backward(Q, K, V, O, dO, L, Br, Bc, causal)

    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(guarded)
    message = str(info.value)
    assert slug_of(info.value) == "mutates-input" and "input `L` in place" in message
    assert "lse_safe = np.where(np.isneginf(L), np.inf, L)" in message
    assert "L[" not in message  # never told to write into it


# ---- the rules -----------------------------------------------------------------------------
def backward_whole_p(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """The issue's cheat: the standard backward, with P rebuilt whole from lse."""
    tau = 1 / math.sqrt(Q.shape[1])
    S = tau * Q @ K.T
    if causal:
        S = np.where(np.tri(len(Q), len(K), dtype=bool), S, -np.inf)
    P = np.exp(S - np.where(np.isneginf(lse), np.inf, lse)[:, None])
    dS = P * (dO @ V.T - (dO * O).sum(1)[:, None])
    return tau * dS @ K, tau * dS.T @ Q, P.T @ dO


def backward_storing_p_tiles(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Reads in tiles, but keeps every tile of P in one N x N_k array (the standard backward)."""
    tau = 1 / math.sqrt(Q.shape[1])
    L = np.where(np.isneginf(lse), np.inf, lse)
    P = np.zeros((len(Q), len(K)))
    for i in range(0, len(Q), Br):
        for j in range(0, len(K), Bc):
            if causal and j > min(i + Br, len(Q)) - 1:
                continue
            s = tau * Q[i : i + Br] @ K[j : j + Bc].T
            if causal:
                r, c = np.arange(i, i + len(s))[:, None], np.arange(j, j + s.shape[1])[None, :]
                s = np.where(c <= r, s, -np.inf)
            P[i : i + Br, j : j + Bc] = np.exp(s - L[i : i + Br, None])
    D = (dO * O).sum(1)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        for i in range(0, len(Q), Br):
            if causal and j > min(i + Br, len(Q)) - 1:
                continue
            p, do = P[i : i + Br, j : j + Bc], dO[i : i + Br]
            ds = p * (do @ V[j : j + Bc].T - D[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            dQ[i : i + Br] += tau * ds @ K[j : j + Bc]
            dK[j : j + Bc] += tau * ds.T @ Q[i : i + Br]
    return dQ, dK, dV


def backward_whole_causal_mask(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Tiles everywhere, but the causal mask built once for all N x N_k scores."""
    visible = np.tri(len(Q), len(K), dtype=bool) if causal else None
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        for i in range(0, len(Q), Br):
            if causal and j > min(i + Br, len(Q)) - 1:
                continue
            q, do, k, v = Q[i : i + Br], dO[i : i + Br], K[j : j + Bc], V[j : j + Bc]
            s = tau * q @ k.T
            if causal:
                s = np.where(visible[i : i + Br, j : j + Bc], s, -np.inf)
            p = np.exp(s - L[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_fixed_tiles(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Br and Bc ignored: tiles of 16 whatever the caller asks."""
    return flash_attention_backward(Q, K, V, O, dO, lse, 16, 16, causal)


def backward_br_for_both(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Bc ignored: K/V tiles of Br rows."""
    return flash_attention_backward(Q, K, V, O, dO, lse, Br, Br, causal)


def backward_dO_whole_per_tile(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """dP of the tile cut from a strip dO @ V_j^T (N x Bc): all of dO read for every tile."""
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        for i in range(0, len(Q), Br):
            if causal and j > min(i + Br, len(Q)) - 1:
                continue
            q = Q[i : i + Br]
            s = tau * q @ k.T
            if causal:
                r, c = np.arange(i, i + len(q))[:, None], np.arange(j, j + len(k))[None, :]
                s = np.where(c <= r, s, -np.inf)
            p = np.exp(s - L[i : i + Br, None])
            dp = (dO @ v.T)[i : i + Br]
            dV[j : j + Bc] += p.T @ dO[i : i + Br]
            ds = p * (dp - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_d_in_the_loop(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """D recomputed from all of dO and O for every K/V tile, instead of once before the loops."""
    tau = 1 / math.sqrt(Q.shape[1])
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        D = (dO * O).sum(1)
        for i in range(0, len(Q), Br):
            if causal and j > min(i + Br, len(Q)) - 1:
                continue
            q, do = Q[i : i + Br], dO[i : i + Br]
            s = tau * q @ k.T
            if causal:
                r, c = np.arange(i, i + len(q))[:, None], np.arange(j, j + len(k))[None, :]
                s = np.where(c <= r, s, -np.inf)
            p = np.exp(s - L[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_mask_only(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Every tile computed; the causal mask alone hides the future keys."""
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        for i in range(0, len(Q), Br):
            q, do = Q[i : i + Br], dO[i : i + Br]
            s = tau * q @ k.T
            if causal:
                r, c = np.arange(i, i + len(q))[:, None], np.arange(j, j + len(k))[None, :]
                s = np.where(c <= r, s, -np.inf)
            p = np.exp(s - L[i : i + Br, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[i : i + Br, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_skip_after_reading(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Slices the tile before the skip test: a slice is no read until it is computed with (the
    text: a tile computed with and then skipped counts; a slice never computed with is no read)."""
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        for i in range(0, len(Q), Br):
            q, do = Q[i : i + Br], dO[i : i + Br]
            rows = np.arange(i, i + len(q))
            if causal and rows[-1] < j:
                continue
            s = tau * q @ k.T
            if causal:
                s = np.where(np.arange(j, j + len(k))[None, :] <= rows[:, None], s, -np.inf)
            p = np.exp(s - L[rows, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[rows, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_skip_after_computing(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Computes the tile's scores, then skips it when they are all masked: too late."""
    tau = 1 / math.sqrt(Q.shape[1])
    D = (dO * O).sum(1)
    L = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for j in range(0, len(K), Bc):
        k, v = K[j : j + Bc], V[j : j + Bc]
        for i in range(0, len(Q), Br):
            q, do = Q[i : i + Br], dO[i : i + Br]
            rows = np.arange(i, i + len(q))
            s = tau * q @ k.T
            if causal:
                s = np.where(np.arange(j, j + len(k))[None, :] <= rows[:, None], s, -np.inf)
                if np.isneginf(s).all():
                    continue
            p = np.exp(s - L[rows, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[rows, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def backward_queries_outside_no_break(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """Query tiles outside, every K/V tile visited (the mask alone hides the future keys)."""
    tau = 1 / math.sqrt(Q.shape[1])
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for i in range(0, len(Q), Br):
        q, do = Q[i : i + Br], dO[i : i + Br]
        D = (do * O[i : i + Br]).sum(1)
        L = np.where(np.isneginf(lse[i : i + Br]), np.inf, lse[i : i + Br])
        r = np.arange(i, i + len(q))[:, None]
        for j in range(0, len(K), Bc):
            k, v = K[j : j + Bc], V[j : j + Bc]
            s = tau * q @ k.T
            if causal:
                s = np.where(np.arange(j, j + len(k))[None, :] <= r, s, -np.inf)
            p = np.exp(s - L[:, None])
            dV[j : j + Bc] += p.T @ do
            ds = p * (do @ v.T - D[:, None])
            dQ[i : i + Br] += tau * ds @ k
            dK[j : j + Bc] += tau * ds.T @ q
    return dQ, dK, dV


def test_a_slice_taken_before_the_skip_test_is_no_read():
    out = run_quietly(C.check_flash_attention_backward, backward_skip_after_reading)
    assert out.startswith("✓ ")


RULE_BREAKERS = [
    ("P built whole", backward_whole_p, "full-score-matrix"),
    ("every tile of P stored", backward_storing_p_tiles, "full-score-matrix"),
    ("a whole causal mask", backward_whole_causal_mask, "full-score-matrix"),
    ("tiles of 16 whatever Br, Bc", backward_fixed_tiles, "ignores-tile-size"),
    ("K/V tiles of Br rows", backward_br_for_both, "ignores-tile-size"),
    ("strips of dP = dO V_j^T", backward_dO_whole_per_tile, "full-score-matrix"),
    ("D recomputed per K/V tile", backward_d_in_the_loop, "ignores-tile-size"),
    ("no skip, mask only", backward_mask_only, "causal-tiles-not-skipped"),
    ("computed, then skipped", backward_skip_after_computing, "causal-tiles-not-skipped"),
    ("queries outside, no break", backward_queries_outside_no_break, "causal-tiles-not-skipped"),
]


@pytest.mark.parametrize(("what", "fn", "slug"), RULE_BREAKERS, ids=[r[0] for r in RULE_BREAKERS])
def test_each_broken_rule_is_named(what, fn, slug):
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(fn)
    message = str(info.value)
    assert slug_of(info.value) == slug, message
    assert "gives the right values but breaks a rule" in message and "measured:" in message
    assert len(message.splitlines()) <= 8


def test_a_whole_p_is_reported_in_bytes():
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(backward_whole_p)
    message = str(info.value)
    assert "MiB at its peak" in message and "the budget is" in message
    assert "the forbidden array alone is 8.0 MiB" in message


def test_the_memory_cases_are_what_the_brief_asks():
    memory = [r for r in C_exercises._backward_rules() if r.memory]
    assert len(memory) == 2 and {r.case.kwargs["causal"] for r in memory} == {False, True}
    for rule in memory:
        Q, K = rule.case.args[:2]
        allowed = C_exercises._memory_allowed(rule.case)
        assert 8 * len(Q) * len(K) >= 10 * allowed  # P alone is ten times the budget
        assert len(Q) * len(K) >= allowed  # and so is a bool mask of N x N_k


@pytest.mark.parametrize("fn", BACKWARD_STYLES, ids=lambda f: f.__name__)
def test_the_peak_of_right_answers_is_well_within_the_budget(fn):
    for rule in (r for r in C_exercises._backward_rules() if r.memory):
        report = instrumented_call(fn, rule.case.args, rule.case.kwargs, name="x", memory=True)
        assert report.peak < 0.75 * C_exercises._memory_allowed(rule.case)


def test_the_skip_rule_leaves_room_between_the_two_kinds_of_loop():
    """On the skip case, computing every tile reads Q (or K) far more than the slack allows."""
    case = C_exercises._backward_rules()[-1].case
    bound = [
        traced_loads(functools.partial(C_exercises._tiled_backward, keys_outside=k), case, (0, 1))
        for k in (True, False)
    ]
    for fn in (backward_mask_only, backward_queries_outside_no_break):
        loads = traced_loads(fn, case, (0, 1))
        worst = max(
            int(loads[a].counts.sum()) / max(int(b[a].counts.sum()) for b in bound) for a in (0, 1)
        )
        assert worst > 1.3 * C_exercises._SKIP_SLACK


# ---- messages ------------------------------------------------------------------------------
def test_failure_names_the_smallest_input_and_shows_both_values_in_a_few_lines():
    def forgot_d(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        return C_mistakes._backward_variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug="forgot-D")

    forgot_d.__course_test_double__ = True  # a replay of the module, with a learner's signature
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(forgot_d)
    message = str(info.value)
    assert "N = 2, d = 1, one 2 x 2 tile" in message
    assert "yours:" in message and "expected:" in message and "dK" in message
    assert "Q = [[1.], [2.]]" in message and "lse = " in message
    assert len(message.splitlines()) <= 10


def test_wrong_return_type_is_explained():
    with pytest.raises(CheckFailure, match=r"must return the triple \(dQ, dK, dV\)"):
        C.check_flash_attention_backward(lambda *a, **k: flash_attention_backward(*a, **k)[:2])


def test_a_shape_error_is_reported_with_its_input():
    def broken(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        return Q @ K, K, V

    with pytest.raises(CheckFailure, match=r"raised ValueError.*\n  input:"):
        C.check_flash_attention_backward(broken)


# ---- quick checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "right", "wrong", "hint"),
    [
        (C.check_quick_backward_flops_ratio, 1.25, 0.8, "other way"),
        (C.check_quick_backward_flops_ratio, 10 / 8, 7 / 6, "forward \\+ backward"),
        (C.check_quick_backward_flops_ratio, 5 / 4, 0.25, "not the extra fraction"),
        (C.check_quick_lse_bytes, 131_072, 65_536, "fp32"),
        (C.check_quick_lse_bytes, 4 * 32_768, 128, "KiB"),
        (C.check_quick_lse_bytes, 131072.0, 262_144, "4 bytes per number, not 8"),
        (C.check_quick_p_over_lse, 16_384, 32_768, "2 bytes per number"),
        (C.check_quick_p_over_lse, 2 * 2**30 / (128 * 2**10), 65_536, "other way round"),
        (C.check_quick_p_over_lse, 16384.0, 1 / 16_384, "lse / P"),
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


# ---- another array library: the memory budget (tracemalloc) cannot see its allocations --------
def backward_with_torch(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """A learner's shortcut: the whole P (N x N_k) in torch, from the given lse."""
    import torch

    q, k, v, o, do, lse_t = (torch.tensor(np.asarray(a)) for a in (Q, K, V, O, dO, lse))
    tau = 1.0 / math.sqrt(Q.shape[1])
    s = tau * q @ k.T
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
    lse_safe = torch.where(torch.isneginf(lse_t), math.inf, lse_t)  # a row with no key: P = 0
    p = torch.exp(s - lse_safe[:, None])
    ds = p * (do @ v.T - (do * o).sum(1, keepdim=True))
    return (tau * ds @ k).numpy(), (tau * ds.T @ q).numpy(), (p.T @ do).numpy()


def test_a_backward_written_with_torch_is_named():
    pytest.importorskip("torch")
    with pytest.raises(CheckFailure) as info:
        run_quietly(C.check_flash_attention_backward, backward_with_torch)
    message = str(info.value)
    assert slug_of(info.value) == "array-library-in-numpy-exercise", message
    assert "computes with torch" in message


@pytest.mark.parametrize("fn", BACKWARD_STYLES, ids=lambda f: f.__name__)
def test_numpy_backwards_pass_the_budget_with_torch_imported(fn):
    pytest.importorskip("torch")  # imported: the torch watch is on, and sees no torch call
    case = C_exercises._memory_case(True)
    report = instrumented_call(fn, case.args, case.kwargs, name="backward", memory=True)
    assert report.peak is not None and report.peak <= C_exercises._memory_allowed(case)
