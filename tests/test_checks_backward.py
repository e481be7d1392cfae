"""The checks of notebook 07: right answers pass, every named mistake is recognized by its slug."""

from __future__ import annotations

import contextlib
import functools
import io
import math

import numpy as np
import pytest
from checkhelp import run_quietly

import course_utils.backward as B
from course_utils.checks import CheckFailure
from course_utils.checks import backward as C


def softmax_backward_rows(P, dP):
    """A learner's answer to exercise 1, written here (not a course_utils function)."""
    D = (P * dP).sum(axis=1, keepdims=True)
    return P * (dP - D)


def flash_attention_backward(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
    """A learner's answer to exercise 2, written here in the notebook's style."""
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


def quiet(fn):
    """fn under np.errstate(all='ignore'), defined in this module (not flagged as course code)."""

    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapped


CHECKS = [
    (C.check_softmax_backward_rows, softmax_backward_rows),
    (C.check_flash_attention_backward, flash_attention_backward),
]


# ---- reference answers pass ----------------------------------------------------------------
@pytest.mark.parametrize(("check", "fn"), CHECKS)
def test_right_answer_passes_with_one_pass_line(check, fn):
    printed = run_quietly(check, fn)
    assert printed.count("✓") == 1 and printed.endswith("\n") and printed.count("\n") == 1


@pytest.mark.parametrize(("check", "fn"), CHECKS)
def test_hidden_mode_fresh_inputs_pass(check, fn):
    for _ in range(2):
        assert "✓" in run_quietly(check, fn, seed=None, trials=25)


def test_the_course_backward_agrees_with_the_checks_answer():
    """cu.flash_attention_backward (tested against torch) matches the oracle on every case,
    including the rows marked as having seen no key."""
    for case in C._backward_cases(seed=1, trials=30):
        got = B.flash_attention_backward(*case.args, **case.kwargs)
        want = C._reference_backward(*case.args, **case.kwargs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_cases_are_consistent_forward_results():
    """O and lse of every case are the forward's (or 0 and -inf for a row marked without keys)."""
    from course_utils.attention import attention_reference

    for case in C._backward_cases(seed=2, trials=20):
        Q, K, V, O, dO, lse = case.args
        O_ref, lse_ref = attention_reference(Q, K, V, causal=case.kwargs.get("causal", False))
        marked = np.isneginf(lse) & np.isfinite(lse_ref)
        np.testing.assert_allclose(O[~marked], O_ref[~marked], rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(lse[~marked], lse_ref[~marked])
        assert not O[marked].any()


def test_backward_cases_cover_the_required_shapes():
    cases = C._backward_cases(seed=0, trials=0)
    shapes = [(len(c.args[0]), len(c.args[1]), c.args[2].shape[1], c.kwargs) for c in cases]
    tiles = [(kw.get("Br", 16), kw.get("Bc", 16)) for *_, kw in shapes]
    assert any(nk == 0 for _, nk, _, _ in shapes)  # no keys
    assert any(np.isneginf(c.args[5]).any() and len(c.args[1]) > 0 for c in cases)  # marked rows
    assert any(nq != nk and nk > 0 for nq, nk, _, _ in shapes)  # Nq != Nk
    assert any(dv != c.args[0].shape[1] for c, (_, _, dv, _) in zip(cases, shapes, strict=True))
    assert any(br > nq for (br, _), (nq, *_) in zip(tiles, shapes, strict=True))  # Br > N
    assert any(kw.get("causal") and kw["Br"] != kw["Bc"] for *_, kw in shapes)
    assert any(nq % br and nq > br for (br, _), (nq, *_) in zip(tiles, shapes, strict=True))
    assert any(
        -(-nq // br) * -(-nk // bc) >= 100
        for (br, bc), (nq, nk, *_) in zip(tiles, shapes, strict=True)
    )
    # the first case has a square tile, so a missing transpose shows as a wrong value
    assert tiles[0][0] == tiles[0][1] == len(cases[0].args[0]) == len(cases[0].args[1])


def test_calling_the_course_reference_is_refused():
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_flash_attention_backward(B.flash_attention_backward)
    with pytest.raises(CheckFailure, match=r"calls course_utils\.backward\.flash_attention_back"):
        C.check_flash_attention_backward(
            lambda Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False: B.flash_attention_backward(
                Q, K, V, O, dO, lse, Br, Bc, causal
            )
        )
    with pytest.raises(CheckFailure, match=r"calls course_utils\.backward\.attention_backward"):
        C.check_flash_attention_backward(
            lambda Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False: B.attention_backward_reference(
                Q, K, V, dO, causal
            )
        )
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_softmax_backward_rows(lambda P, dP: B.softmax_backward(P, dP))
    with pytest.raises(CheckFailure, match=r"\[misconception: calls-reference\]"):
        C.check_softmax_backward_rows(B.softmax_backward)


def test_calling_the_forward_reference_is_refused_too():
    from course_utils.attention import attention_reference

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
        C.check_softmax_backward_rows(quiet(mistake.fn))
    assert f"[misconception: {mistake.slug}]" in str(info.value)
    assert mistake.title in str(info.value)


@pytest.mark.parametrize("mistake", C.BACKWARD_MISTAKES, ids=lambda m: m.slug + ": " + m.title)
def test_each_backward_mistake_is_named(mistake):
    """Its slug is named, with its own title or that of a mistake of the same slug that gives the
    same answer on the failing case (e.g. dQ unscaled, and dQ and dK unscaled, seen by dQ)."""
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(quiet(mistake.fn))
    assert f"[misconception: {mistake.slug}]" in str(info.value)
    same_slug = [m.title for m in C.BACKWARD_MISTAKES if m.slug == mistake.slug]
    assert any(title in str(info.value) for title in same_slug)


def test_every_slug_of_the_brief_is_recognized():
    slugs = {m.slug for m in C.BACKWARD_MISTAKES}
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
    ]:
        assert slug in slugs
    assert {"forgot-D", "D-from-dP", "diagonal-only", "D-wrong-axis"} <= {
        m.slug for m in C.SOFTMAX_BACKWARD_MISTAKES
    }


def test_backward_mistakes_are_named_on_fresh_random_cases_too():
    """In hidden mode (seed=None) a buggy function still fails with its own slug."""
    for mistake in C.BACKWARD_MISTAKES[1:12]:
        with pytest.raises(CheckFailure, match=rf"\[misconception: {mistake.slug}\]"):
            C.check_flash_attention_backward(quiet(mistake.fn), seed=None, trials=5)


def test_two_mistakes_at_once_name_the_one_in_dV_first():
    """forgot-D leaves dV right; a missing transpose of P shows in dV, the first round."""

    def two_bugs(Q, K, V, O, dO, lse, Br=16, Bc=16, causal=False):
        dQ, dK, _ = C._backward_variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug="forgot-D")
        dV = C._backward_variant(Q, K, V, O, dO, lse, Br, Bc, causal, bug="dv-no-transpose")[2]
        return dQ, dK, dV

    with pytest.raises(CheckFailure, match=r"\[misconception: missing-transpose\]"):
        C.check_flash_attention_backward(quiet(two_bugs))


def test_low_precision_is_named():
    def float32_grads(*args, **kwargs):
        return tuple(g.astype(np.float32) for g in flash_attention_backward(*args, **kwargs))

    with pytest.raises(CheckFailure, match=r"\[misconception: low-precision\]"):
        C.check_flash_attention_backward(float32_grads)


def test_wrong_return_type_is_explained():
    with pytest.raises(CheckFailure, match=r"must return the triple \(dQ, dK, dV\)"):
        C.check_flash_attention_backward(lambda *a, **k: flash_attention_backward(*a, **k)[:2])


def test_failure_names_the_smallest_input_and_shows_both_values():
    forgot_d = functools.partial(C._backward_variant, bug="forgot-D")
    with pytest.raises(CheckFailure) as info:
        C.check_flash_attention_backward(quiet(forgot_d))
    message = str(info.value)
    assert "N = 2, d = 1, one 2 x 2 tile" in message
    assert "yours:" in message and "expected:" in message and "dK" in message


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
