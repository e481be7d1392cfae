"""The checks of notebook 03: right answers pass, every named mistake is recognized by its slug."""

from __future__ import annotations

import contextlib
import functools
import io

import numpy as np
import pytest
from checkhelp import run_quietly

import course_utils as cu
from course_utils.checks import CheckFailure
from course_utils.checks import tiled as T
from course_utils.widgets.tile_grid import FULL, MASK, SKIP


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


def flash_attention_forward(Q, K, V, Br=16, Bc=16, causal=False):
    """A learner's answer to exercise 2, written here in the notebook's style."""
    N, d = Q.shape
    O, lse = np.zeros((N, V.shape[1])), np.full(N, -np.inf)
    for i in range(0, N, Br):
        q = Q[i : i + Br]
        rows = np.arange(i, i + len(q))
        m, l, acc = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), V.shape[1]))
        for j in range(0, len(K), Bc):
            if causal and j > rows[-1]:
                break
            cols = np.arange(j, min(j + Bc, len(K)))
            s = q @ K[cols].T / np.sqrt(d)
            if causal:
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            p = np.exp(s - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ V[cols]
            m = m_new
        seen = l > 0
        O[rows[seen]] = acc[seen] / l[seen, None]
        lse[rows[seen]] = m[seen] + np.log(l[seen])
    return O, lse


def quiet(fn):
    """fn under np.errstate(all='ignore'), defined in this module (not flagged as course code)."""

    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapped


# ---- reference answers pass ----------------------------------------------------------------
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


def test_course_reference_agrees_with_the_checks_cases():
    """The cases the check builds, run through cu.flash_attention_forward, match the oracle."""
    for case in T._flash_cases(seed=1, trials=30):
        O, lse = cu.flash_attention_forward(*case.args, **case.kwargs)
        O_ref, lse_ref = cu.attention_reference(*case.args, causal=case.kwargs.get("causal", False))
        np.testing.assert_allclose(O, O_ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(lse, lse_ref, rtol=1e-10, atol=1e-10)


def test_flash_cases_cover_the_required_shapes():
    cases = T._flash_cases(seed=0, trials=0)
    shapes = [(len(c.args[0]), len(c.args[1]), c.kwargs) for c in cases]
    assert any(nk == 0 for _, nk, _ in shapes)  # no keys
    assert any(nq != nk and nk > 0 for nq, nk, _ in shapes)  # Nq != Nk
    assert any(kw.get("Br", 16) > nq for nq, _, kw in shapes)  # Br > N
    assert any(kw.get("causal") and kw["Br"] != kw["Bc"] for _, _, kw in shapes)
    assert any(nq % kw.get("Br", 16) and nq > kw.get("Br", 16) for nq, _, kw in shapes)
    assert any(
        -(-nq // kw.get("Br", 16)) * -(-nq // kw.get("Bc", 16)) >= 100 for nq, _, kw in shapes
    )


def test_calling_the_course_reference_is_refused():
    with pytest.raises(CheckFailure, match="calls-reference"):
        T.check_flash_attention_forward(cu.flash_attention_forward)
    with pytest.raises(CheckFailure, match="calls-reference"):
        T.check_flash_attention_forward(
            lambda Q, K, V, Br=16, Bc=16, causal=False: cu.attention_reference(Q, K, V, causal)
        )


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
        T.check_causal_tile_map(lambda N, Br, Bc: mistake.fn(N, Br, Bc))
    assert f"[misconception: {mistake.slug}]" in str(info.value)
    assert mistake.title in str(info.value)


def test_ragged_tile_map_is_named():
    with pytest.raises(CheckFailure, match=r"\[misconception: ragged-tile\]"):
        T.check_causal_tile_map(lambda N, Br, Bc: causal_tile_map(N, Br, Bc)[: N // Br, : N // Bc])


def _learner_version(mistake):
    """The buggy forward as a learner would write it (the nan-masked Mistake is the unguarded
    correct algorithm)."""
    fn = mistake.fn
    if mistake.slug == "nan-masked":
        fn = functools.partial(T._flash_variant, guard=False)
    return quiet(fn)


@pytest.mark.parametrize(
    "mistake",
    T.FLASH_O_MISTAKES + T.FLASH_LSE_MISTAKES,
    ids=lambda m: m.slug + ": " + m.title,
)
def test_each_flash_mistake_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(_learner_version(mistake))
    assert f"[misconception: {mistake.slug}]" in str(info.value)
    assert mistake.title in str(info.value)


def test_every_slug_of_the_brief_is_recognized():
    slugs = {m.slug for m in T.FLASH_O_MISTAKES + T.FLASH_LSE_MISTAKES}
    for slug in [
        "missing-scale",
        "causal-off-by-one",
        "normalize-then-add",
        "normalize-then-average",
        "rescale-l-not-acc",
        "base2-lse",
        "no-final-divide",
        "ragged-tile",
        "nan-masked",
        "diagonal-tile-skipped",
    ]:
        assert slug in slugs


def test_flash_mistakes_are_named_on_fresh_random_cases_too():
    """In hidden mode (seed=None) a buggy function still fails with its own slug."""
    for mistake in T.FLASH_O_MISTAKES[1:6] + T.FLASH_LSE_MISTAKES:
        with pytest.raises(CheckFailure, match=rf"\[misconception: {mistake.slug}\]"):
            T.check_flash_attention_forward(_learner_version(mistake), seed=None, trials=5)


def test_low_precision_statistics_are_named():
    def float16_stats(Q, K, V, Br=16, Bc=16, causal=False):
        O, lse = flash_attention_forward(Q, K, V, Br, Bc, causal)
        return O.astype(np.float16), lse.astype(np.float16)

    with pytest.raises(CheckFailure, match=r"\[misconception: low-precision\]"):
        T.check_flash_attention_forward(float16_stats)


def test_wrong_return_type_is_explained():
    with pytest.raises(CheckFailure, match=r"must return the pair \(O, lse\)"):
        T.check_flash_attention_forward(
            lambda Q, K, V, Br=16, Bc=16, causal=False: flash_attention_forward(Q, K, V)[0]
        )


def test_failure_names_the_smallest_input():
    with pytest.raises(CheckFailure) as info:
        T.check_flash_attention_forward(quiet(functools.partial(T._flash_variant, divide=False)))
    message = str(info.value)
    assert "textbook example" in message and "yours:" in message and "expected:" in message


# ---- quick checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, right, wrong, hint",
    [
        (T.check_quick_scores_mib, 512, 536.870912, "MiB"),
        (T.check_quick_scores_mib, 512.0, 1024, "2 bytes"),
        (T.check_quick_causal_tiles, 8256, 8128, "diagonal"),
        (T.check_quick_causal_tiles, 8256, 16384, "skipped"),
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
