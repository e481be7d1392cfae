"""The checks of notebook 05: right answers pass quietly, every named mistake is recognized.

The "learner" functions here are written in this file (per-chunk NumPy, a merge, the grid
counts), so the checks' run-time guard against calling course_utils does not fire.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of

import course_utils as cu
from course_utils.checks import split_kv as checks
from course_utils.checks._core import CheckFailure

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here
# ---------------------------------------------------------------------------------------------


def good_partials(q, K, V, num_splits):
    d, dv, nk = q.shape[0], V.shape[1], K.shape[0]
    chunk = -(-nk // num_splits)
    out_partial, lse_partial = np.zeros((num_splits, dv)), np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        k_s, v_s = K[s * chunk : (s + 1) * chunk], V[s * chunk : (s + 1) * chunk]
        if len(k_s) == 0:
            continue
        scores = (k_s @ q) / np.sqrt(d)
        m = scores.max()
        p = np.exp(scores - m)
        out_partial[s], lse_partial[s] = p @ v_s / p.sum(), m + np.log(p.sum())
    return out_partial, lse_partial


def own_merge(o1, lse1, o2, lse2):
    lse = np.logaddexp(lse1, lse2)
    safe = 0.0 if lse == NEG_INF else lse
    return np.exp(lse1 - safe) * o1 + np.exp(lse2 - safe) * o2, lse


def good_decode(q, K, V, num_splits):
    out_partial, lse_partial = good_partials(q, K, V, num_splits)
    o, lse = out_partial[0], lse_partial[0]
    for s in range(1, num_splits):
        o, lse = own_merge(o, lse, out_partial[s], lse_partial[s])
    return o, lse


def decode_with_course_merge(q, K, V, num_splits):
    """As the notebook's solution: the learner's partials merged with cu.merge_partials."""
    out_partial, lse_partial = good_partials(q, K, V, num_splits)
    o, lse = out_partial[0], lse_partial[0]
    for s in range(1, num_splits):
        o, lse = cu.merge_partials(o, lse, out_partial[s], lse_partial[s])
    return o, lse


def decode_calling_reference(q, K, V, num_splits):
    out_partial, lse_partial = cu.split_kv_partials(q, K, V, num_splits)
    return good_decode(q, K, V, num_splits)


def good_grid(batch, heads, num_splits, num_sms=132):
    blocks = batch * heads * num_splits
    return blocks, min(blocks, num_sms), -(-blocks // num_sms)


def not_done(*args, **kwargs):
    raise NotImplementedError()


CHECKS = {
    "split_kv_partials": (checks.check_split_kv_partials, good_partials),
    "split_kv_decode": (checks.check_split_kv_decode, good_decode),
    "decode_grid": (checks.check_decode_grid, good_grid),
}


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKS)
def test_right_answer_passes_with_one_line(name):
    check, good = CHECKS[name]
    printed = run_quietly(check, good)
    assert printed.startswith(f"✓ {name}:") and printed.count("\n") == 1


@pytest.mark.parametrize("name", CHECKS)
def test_hidden_mode_fresh_inputs_pass(name):
    check, good = CHECKS[name]
    assert "✓" in run_quietly(check, good, seed=None, trials=60)


def test_decode_may_call_course_merge_partials():
    assert "✓ split_kv_decode" in run_quietly(
        checks.check_split_kv_decode, decode_with_course_merge
    )


def test_decode_calling_the_reference_partials_is_flagged():
    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_decode(decode_calling_reference)
    assert slug_of(info.value) == "calls-reference"


def test_passing_course_utils_function_is_flagged():
    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_partials(cu.split_kv_partials)
    assert slug_of(info.value) == "calls-reference"


@pytest.mark.parametrize("name", CHECKS)
def test_not_implemented_propagates(name):
    check, _ = CHECKS[name]
    with pytest.raises(NotImplementedError):
        check(not_done)


def test_cases_cover_the_edges():
    cases = checks._split_cases(0, 30)
    q, K, V, k = cases[0].args
    out, lse = cu.split_kv_partials(q, K, V, k)
    assert out[:, 0] == pytest.approx([4 / 3, 10 / 3]) and np.exp(lse) == pytest.approx([3, 12])
    nks = [(c.args[1].shape[0], c.args[3]) for c in cases]
    assert any(k > nk for nk, k in nks)  # more chunks than keys
    assert any(k == 1 for _, k in nks)
    assert any(nk % k and k <= nk for nk, k in nks)  # ragged last chunk
    # an empty chunk with k <= Nk (Nk = 4, k = 3: chunks of 2, 2, 0)
    assert any(k <= nk and (k - 1) * -(-nk // k) >= nk for nk, k in nks)
    assert any(c.args[0].shape[0] > 1 for c in cases)  # d > 1: the scale matters
    grid = checks._grid_cases(0, 5)
    assert [c.args for c in grid[:3]] == [(1, 32, 1), (4, 16, 1), (4, 16, 8)]


def test_decode_check_compares_with_full_attention():
    rng = np.random.default_rng(3)
    q, K, V = rng.normal(size=4), rng.normal(size=(9, 4)), rng.normal(size=(9, 2))
    o, lse = checks._decode_reference(q, K, V, 3)
    full_o, full_lse = cu.attention_reference(q[None], K, V)
    assert np.array_equal(o, full_o[0]) and lse == full_lse[0]


# ---------------------------------------------------------------------------------------------
# Every named mistake is recognized
# ---------------------------------------------------------------------------------------------


def _ids(m):
    return m.slug  # pytest numbers repeated slugs; ids must be the same in every worker


@pytest.mark.parametrize("mistake", checks.PARTIALS_MISTAKES, ids=_ids)
def test_partials_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_partials(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize("mistake", checks.DECODE_MISTAKES, ids=_ids)
def test_decode_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_decode(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize("mistake", checks.GRID_MISTAKES, ids=_ids)
def test_grid_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_decode_grid(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_the_briefs_mistakes_are_all_there():
    partial_slugs = {m.slug for m in checks.PARTIALS_MISTAKES}
    decode_slugs = {m.slug for m in checks.DECODE_MISTAKES}
    assert {"dropped-tail", "nan-masked", "missing-softmax-scale", "base2-lse"} <= partial_slugs
    assert {
        "plain-average",
        "normalize-then-add",
        "nan-masked",
        "empty-chunk-weight",
        "dropped-tail",
        "missing-softmax-scale",
        "base2-lse",
    } <= decode_slugs


def test_nan_from_an_empty_chunk_is_named_in_a_learners_own_code():
    def unguarded(q, K, V, num_splits):
        chunk = -(-len(K) // num_splits)
        out, lse = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
        for s in range(num_splits):
            k_s, v_s = K[s * chunk : (s + 1) * chunk], V[s * chunk : (s + 1) * chunk]
            scores = (k_s @ q) / np.sqrt(len(q))
            m = scores.max(initial=NEG_INF)
            p = np.exp(scores - m)
            out[s], lse[s] = p @ v_s / p.sum(), m + np.log(p.sum())
        return out, lse

    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_partials(unguarded)
    assert slug_of(info.value) == "nan-masked"
    assert "k = 3" in str(info.value)  # the first failing case is the smallest with an empty chunk


def test_array_split_chunks_are_named():
    def balanced(q, K, V, num_splits):
        out, lse = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
        for s, idx in enumerate(np.array_split(np.arange(len(K)), num_splits)):
            if len(idx):
                scores = (K[idx] @ q) / np.sqrt(len(q))
                m = scores.max()
                p = np.exp(scores - m)
                out[s], lse[s] = p @ V[idx] / p.sum(), m + np.log(p.sum())
        return out, lse

    with pytest.raises(CheckFailure) as info:
        checks.check_split_kv_partials(balanced)
    assert slug_of(info.value) == "chunk-size"

    # any partition of the keys merges to full attention: the decode check accepts it
    def decode(q, K, V, num_splits):
        out, lse = balanced(q, K, V, num_splits)
        o, total = out[0], lse[0]
        for s in range(1, num_splits):
            o, total = own_merge(o, total, out[s], lse[s])
        return o, total

    assert "✓" in run_quietly(checks.check_split_kv_decode, decode)


def test_a_learner_that_raises_gets_its_input():
    def broken(q, K, V, num_splits):
        return good_partials(q, K, V, num_splits) if num_splits < 3 else K[99]

    with pytest.raises(CheckFailure, match="raised IndexError"):
        checks.check_split_kv_partials(broken)


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check, right, wrong, hint_slug",
    [
        (checks.check_quick_blocks_no_split, 64, 512, None),
        (checks.check_quick_blocks_split, 512, 64, "ignores-splits"),
        (checks.check_quick_blocks_split, 4 * 16 * 8, 132, "busy-exceeds-sms"),
        (checks.check_quick_chunk_merge, 5.0, 8 / 3, "plain-average"),
        (checks.check_quick_chunk_merge, 0.25 * 2 + 0.75 * 6, 4.0, "plain-average"),
        (checks.check_quick_chunk_merge, 5.0, 8.0, "normalize-then-add"),
        (checks.check_quick_chunk_merge, 5.0, 10 / 3, "empty-chunk-weight"),
    ],
)
def test_quick_checks(check, right, wrong, hint_slug):
    assert run_quietly(check, right).startswith("✓")
    with pytest.raises(CheckFailure) as info:
        check(wrong)
    assert slug_of(info.value) == hint_slug


def test_quick_checks_refuse_placeholders():
    for check in (checks.check_quick_blocks_no_split, checks.check_quick_chunk_merge):
        with pytest.raises(CheckFailure, match="no answer"):
            check(None)
        with pytest.raises(CheckFailure):
            check("sixty-four")


def test_quick_merge_is_the_lse_merge():
    (o0, l0), (o1, l1), (o2, l2) = checks.QUICK_MERGE_PARTIALS
    o, lse = cu.merge_partials(o0, l0, o1, l1)
    o, lse = cu.merge_partials(o, lse, o2, l2)
    assert float(o) == pytest.approx(5.0) and float(lse) == pytest.approx(math.log(4))
