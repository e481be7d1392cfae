"""The checks of notebook 02: right answers pass quietly, every named mistake is recognized.

The "learner" functions here are written in this file (a correct merge, a correct
attention_by_parts), so the checks' run-time guard against calling course_utils does not fire.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of
from scipy.special import logsumexp

from course_utils.checks import merge_partials as checks
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.merge_partials import exercises as checks_exercises

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here
# ---------------------------------------------------------------------------------------------


def merge_partials(o1, lse1, o2, lse2):
    """The merge as a learner writes it: logaddexp, weights with a finite stand-in for -inf.

    Named merge_partials: attention_by_parts below calls it by that name, as the notebook asks
    (the check counts those calls).
    """
    lse = np.logaddexp(lse1, lse2)
    safe = np.where(np.isneginf(lse), 0.0, lse)
    w1, w2 = np.exp(lse1 - safe), np.exp(lse2 - safe)
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    return w1 * o1 + w2 * o2, lse


good_merge = merge_partials


def merge_by_max(o1, lse1, o2, lse2):
    """float copies first; lse = max + log1p(e^-|gap|) by hand; weights against the max."""
    o1, o2 = np.array(o1, dtype=float), np.asarray(o2).astype(np.float64)
    lse1, lse2 = np.asarray(lse1, dtype=float), np.asarray(lse2, dtype=float)
    m = np.maximum(lse1, lse2)
    m_safe = np.where(np.isinf(m), 0.0, m)
    a, b = np.exp(lse1 - m_safe), np.exp(lse2 - m_safe)  # <= 1, the larger one is 1
    total = a + b
    lse = np.where(total > 0, m_safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    w1 = np.where(total > 0, a / np.where(total > 0, total, 1.0), 0.0)
    w2 = np.where(total > 0, b / np.where(total > 0, total, 1.0), 0.0)
    if o1.ndim > lse1.ndim:
        w1, w2 = w1[..., None], w2[..., None]
    return w1 * o1 + w2 * o2, lse


def merge_nan_to_num(o1, lse1, o2, lse2):
    """No stand-in: the NaN of -inf - (-inf) is turned into a weight of 0 afterwards."""
    lse = np.logaddexp(lse1, lse2)
    w1 = np.nan_to_num(np.exp(lse1 - lse))
    w2 = np.nan_to_num(np.exp(lse2 - lse))
    return np.einsum("r,r...->r...", w1, o1) + np.einsum("r,r...->r...", w2, o2), lse


def merge_row_by_row(o1, lse1, o2, lse2):
    """A Python loop over the rows, with math on each pair of numbers."""
    o = np.zeros(np.shape(o1))
    lse = np.full(np.shape(lse1), -np.inf)
    for r in range(len(lse1)):
        a, b = float(lse1[r]), float(lse2[r])
        if a == b == -math.inf:
            continue
        hi, lo = max(a, b), min(a, b)
        lse[r] = hi + math.log1p(math.exp(lo - hi))
        o[r] = math.exp(a - lse[r]) * o1[r] + math.exp(b - lse[r]) * o2[r]
    return o, lse


def good_by_parts(q, K, V, parts):
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        idx = np.asarray(idx, dtype=int)
        if len(idx) == 0:
            continue
        s = tau * (q @ K[idx].T)
        m = s.max(axis=1)
        p = np.exp(s - m[:, None])
        l = p.sum(axis=1)
        o, lse = merge_partials(o, lse, (p @ V[idx]) / l[:, None], m + np.log(l))
    return o, lse


def by_parts_key_by_key(q, K, V, parts):
    """float copies; inside a part, an online softmax one key at a time; then the merge."""
    q, K, V = q.astype(np.float64), np.array(K, dtype=float), np.asarray(V, dtype=float)
    tau = 1 / math.sqrt(q.shape[1])
    o, lse = np.zeros((q.shape[0], V.shape[1])), np.full(q.shape[0], -np.inf)
    for idx in parts:
        m, l = np.full(len(q), -np.inf), np.zeros(len(q))
        acc = np.zeros((len(q), V.shape[1]))
        for j in idx:
            s = tau * (q @ K[j])
            m_new = np.maximum(m, s)
            f, w = np.exp(m - m_new), np.exp(s - m_new)
            l, acc, m = f * l + w, f[:, None] * acc + w[:, None] * V[j], m_new
        if len(idx):
            o, lse = merge_partials(o, lse, acc / l[:, None], m + np.log(l))
    return o, lse


def by_parts_loops(q, K, V, parts):
    """Python loops: per part one gather of K and V; per query, the max in one loop over the
    part's keys, then a loop per key for the weights and the sum; then the merge."""
    tau = 1 / math.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), -np.inf)
    for idx in parts:
        if len(idx) == 0:
            continue
        K_p, V_p = K[np.asarray(idx, dtype=int)], V[np.asarray(idx, dtype=int)]
        o_p, lse_p = np.zeros((len(q), V.shape[1])), np.zeros(len(q))
        for r in range(len(q)):
            scores = [tau * float(q[r] @ K_p[j]) for j in range(len(K_p))]
            m = -math.inf
            for x in scores:
                m = max(m, x)
            l, acc = 0.0, np.zeros(V.shape[1])
            for j in range(len(K_p)):
                w = math.exp(scores[j] - m)
                l += w
                acc = acc + w * V_p[j]
            o_p[r], lse_p[r] = acc / l, m + math.log(l)
        o, lse = merge_partials(o, lse, o_p, lse_p)
    return o, lse


def by_parts_tree(q, K, V, parts):
    """Boolean masks to gather each part; the partials merged pairwise, as a tree."""
    tau = q.shape[1] ** -0.5
    partials = []
    for idx in parts:
        if len(idx) == 0:
            continue
        mask = np.zeros(len(K), dtype=bool)
        mask[idx] = True
        s = tau * q @ K[mask].T
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        partials.append((p @ V[mask] / p.sum(axis=1, keepdims=True), m[:, 0] + np.log(p.sum(1))))
    if not partials:
        return np.zeros((len(q), V.shape[1])), np.full(len(q), -np.inf)
    while len(partials) > 1:
        pairs = zip(partials[0::2], partials[1::2], strict=False)
        merged = [merge_partials(*a, *b) for a, b in pairs]
        partials = merged + partials[2 * len(merged) :]
    return partials[0]


def naive_merge(o1, lse1, o2, lse2):
    """No guard: both sets empty gives exp(-inf - (-inf)) = NaN."""
    lse = np.logaddexp(lse1, lse2)
    w1, w2 = np.exp(lse1 - lse), np.exp(lse2 - lse)
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    return w1 * o1 + w2 * o2, lse


def float32_merge(o1, lse1, o2, lse2):
    args = (np.asarray(a, dtype=np.float32) for a in (o1, lse1, o2, lse2))
    return good_merge(*args)


def ratio_merge(o1, lse1, o2, lse2):
    """w1 = r / (1 + r) with r = e^(lse1 - lse2), the empty sets handled apart."""
    r = np.exp(lse1 - lse2)
    w1, w2 = r / (1 + r), 1 / (1 + r)
    lse = lse2 + np.log1p(r)
    e1, e2 = np.isneginf(lse1), np.isneginf(lse2)
    w1 = np.where(e1, 0.0, np.where(e2, 1.0, w1))
    w2 = np.where(e2, 0.0, np.where(e1, 1.0, w2))
    lse = np.where(e1, lse2, np.where(e2, lse1, lse))
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    return w1 * o1 + w2 * o2, lse


def merge_into_o1(o1, lse1, o2, lse2):
    """Right numbers, but written into the caller's o1."""
    lse = np.logaddexp(lse1, lse2)
    safe = np.where(np.isneginf(lse), 0.0, lse)
    w1, w2 = np.exp(lse1 - safe), np.exp(lse2 - safe)
    if np.ndim(o1) > np.ndim(lse1):
        w1, w2 = w1[:, None], w2[:, None]
    o1 *= w1
    o1 += w2 * o2
    return o1, lse


def by_parts_nan_on_empty(q, K, V, parts):
    """An empty part gives m = -inf, l = 0 and o = 0/0 = NaN."""
    tau = 1 / np.sqrt(q.shape[1])
    o, lse = np.zeros((len(q), V.shape[1])), np.full(len(q), NEG_INF)
    for idx in parts:
        s = tau * (q @ K[idx].T)
        m = s.max(axis=1, initial=NEG_INF)
        p = np.exp(s - np.where(np.isneginf(m), 0.0, m)[:, None])
        l = p.sum(axis=1)
        o, lse = merge_partials(o, lse, (p @ V[idx]) / l[:, None], m + np.log(l))
    return o, lse


def by_parts_one_softmax(q, K, V, parts):
    """One softmax over all keys: right numbers, no parts."""
    if len(K) == 0:
        return np.zeros((len(q), V.shape[1])), np.full(len(q), -np.inf)
    s = q @ K.T / np.sqrt(q.shape[1])
    lse = logsumexp(s, axis=1)
    return np.exp(s - lse[:, None]) @ V, lse


def by_parts_k_way(q, K, V, parts):
    """Each part on its own, then one k-way merge with np.logaddexp.reduce (no merge_partials)."""
    tau = 1 / np.sqrt(q.shape[1])
    os, lses = [np.zeros((len(q), V.shape[1]))], [np.full(len(q), -np.inf)]
    for idx in parts:
        if len(idx):
            s = tau * q @ K[idx].T
            lse_p = logsumexp(s, axis=1)
            os.append(np.exp(s - lse_p[:, None]) @ V[idx])
            lses.append(lse_p)
    lses = np.stack(lses)
    lse = np.logaddexp.reduce(lses, axis=0)
    safe = np.where(np.isneginf(lse), 0.0, lse)
    return np.einsum("kq,kqd->qd", np.exp(lses - safe), np.stack(os)), lse


MERGE_STYLES = [good_merge, merge_by_max, merge_nan_to_num, merge_row_by_row]
PARTS_STYLES = [good_by_parts, by_parts_key_by_key, by_parts_tree, by_parts_loops]


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("good", MERGE_STYLES, ids=lambda f: f.__name__)
def test_merge_check_passes_right_answers_in_every_style(good):
    printed = run_quietly(checks.check_merge_partials, good)
    assert printed.startswith("✓ merge_partials:") and printed.count("\n") == 1


@pytest.mark.parametrize("good", PARTS_STYLES, ids=lambda f: f.__name__)
def test_parts_check_passes_right_answers_in_every_style(good):
    printed = run_quietly(checks.check_attention_by_parts, good)
    assert printed.startswith("✓ attention_by_parts:") and printed.count("\n") == 1
    assert "2 rules hold" in printed


@pytest.mark.parametrize("trials", [0, 60])
def test_hidden_mode_fresh_inputs_pass(trials):
    assert "✓" in run_quietly(checks.check_merge_partials, good_merge, seed=None, trials=trials)
    assert "✓" in run_quietly(
        checks.check_attention_by_parts, good_by_parts, seed=None, trials=trials
    )


def test_cases_start_with_the_worked_example_and_cover_the_edge_cases():
    cases = checks_exercises._merge_cases(0, 5)
    assert "worked example x = ln(2, 1, 8, 4) of section 4" in cases[0].label
    o1, lse1, o2, lse2 = cases[0].args
    assert (o1[0], o2[0]) == pytest.approx((4 / 3, 10 / 3))
    assert np.exp([lse1[0], lse2[0]]) == pytest.approx([3.0, 12.0])
    lses = np.concatenate([np.concatenate([c.args[1], c.args[3]]) for c in cases])
    assert np.isneginf(lses).any() and np.nanmax(lses) >= 1e4  # empty sets, e^lse overflows
    with np.errstate(invalid="ignore"):
        gaps = np.concatenate([c.args[1] - c.args[3] for c in cases])
        assert (gaps >= 1000).any() and (gaps <= -1000).any()  # the ratio overflows both ways
        assert np.isposinf(gaps).any() and np.isneginf(gaps).any()  # one set empty, either
    both_empty = [c for c in cases if (np.isneginf(c.args[1]) & np.isneginf(c.args[3])).any()]
    assert both_empty
    parts_cases = checks_exercises._parts_cases(0, 5)
    assert any(len(p) == 0 for c in parts_cases for p in c.args[3])  # an empty part
    assert any(c.args[1].shape[0] == 0 for c in parts_cases)  # no keys at all
    for c in cases + parts_cases:
        assert "lesson" not in c.label and "textbook" not in c.label, c.label


# ---------------------------------------------------------------------------------------------
# Every named mistake is recognized
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mistake",
    checks_exercises.MERGE_MISTAKES,
    ids=[f"{m.slug}-{i}" for i, m in enumerate(checks_exercises.MERGE_MISTAKES)],
)
def test_merge_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize(
    "mistake",
    checks_exercises.PARTS_MISTAKES + checks.PARTS_RULE_MISTAKES,
    ids=[
        f"{m.slug}-{i}"
        for i, m in enumerate(checks_exercises.PARTS_MISTAKES + checks.PARTS_RULE_MISTAKES)
    ],
)
def test_parts_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_brief_mistakes_are_all_covered():
    merge_slugs = {m.slug for m in checks_exercises.MERGE_MISTAKES}
    assert {
        "plain-average",
        "normalize-then-add",
        "unnormalized-weights",
        "base2-lse",
        "nan-masked",
        "lse-max",
        "swapped-weights",
        "ratio-overflow",
        "low-precision",
    } <= merge_slugs
    assert {m.slug for m in checks.PARTS_RULE_MISTAKES} == {"full-softmax", "merge-not-used"}


def test_nan_from_both_sets_empty_is_named():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(naive_merge)
    assert slug_of(info.value) == "nan-masked"
    assert "both sets empty" in str(info.value)


def test_nan_from_an_empty_part_is_named():
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(by_parts_nan_on_empty)
    assert slug_of(info.value) == "nan-masked"
    assert "parts [3] | [] | [2, 0, 1]" in str(info.value)  # the parts are printed readably


def test_float32_is_low_precision_by_its_replay():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(float32_merge)
    assert slug_of(info.value) == "low-precision"


def test_the_ratio_form_fails_on_lse_1000_apart_and_is_named():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(ratio_merge)
    message = str(info.value)
    assert slug_of(info.value) == "ratio-overflow", message
    assert "1000 and more apart" in message


def test_merging_into_o1_is_named_with_the_argument():
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(merge_into_o1)
    assert slug_of(info.value) == "mutates-input" and "`o1`" in str(info.value)


@pytest.mark.parametrize(
    "learner, slug, measured",
    [
        (by_parts_one_softmax, "full-softmax", "30 of its 30 rows"),
        (by_parts_k_way, "merge-not-used", "called 0 times"),
    ],
    ids=lambda p: getattr(p, "__name__", p),
)
def test_breaking_a_parts_rule_is_named_although_the_values_are_right(learner, slug, measured):
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(learner)
    message = str(info.value)
    assert "gives the right values but breaks a rule" in message and measured in message
    assert slug_of(info.value) == slug, message


def test_a_part_read_together_with_another_is_refused():
    """Two parts gathered in one read (K[a + b]) is a read across parts, even if split later."""

    def two_at_once(q, K, V, parts):
        parts = [np.asarray(p, dtype=int) for p in parts]
        Kall, Vall = K[np.concatenate(parts)], V[np.concatenate(parts)]
        o, lse, start = np.zeros((len(q), V.shape[1])), np.full(len(q), -np.inf), 0
        for idx in parts:
            Kp, Vp = Kall[start : start + len(idx)], Vall[start : start + len(idx)]
            start += len(idx)
            if len(idx):
                s = q @ Kp.T / np.sqrt(q.shape[1])
                lse_p = logsumexp(s, axis=1)
                o, lse = merge_partials(o, lse, np.exp(s - lse_p[:, None]) @ Vp, lse_p)
        return o, lse

    with pytest.raises(CheckFailure) as info:
        checks.check_attention_by_parts(two_at_once)
    assert slug_of(info.value) == "full-softmax"


def test_mistakes_that_agree_with_the_reference_are_not_named():
    """Swapping equal weights changes nothing: such an input must not name the mistake."""
    from course_utils.checks.engine.cases import Case
    from course_utils.checks.engine.feedback import diagnose

    swapped = [m for m in checks_exercises.MERGE_MISTAKES if m.slug == "swapped-weights"]
    args = (np.array([1.0]), np.array([0.5]), np.array([3.0]), np.array([0.5]))
    expected = checks_exercises._reference_merge(*args)
    yours = swapped[0].fn(*args)
    assert diagnose(yours, Case("equal weights", args), swapped, 2, expected) is None


def test_calling_the_reference_is_refused():
    import course_utils as cu

    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials(lambda *a: cu.merge_partials(*a))
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:  # the checks' own helpers are the course's too
        checks.check_attention_by_parts(
            lambda q, K, V, p: checks_exercises._parts_reference(q, K, V, p)
        )
    assert slug_of(info.value) == "calls-reference"


def test_not_implemented_propagates():
    def stub(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_merge_partials(stub)
    with pytest.raises(NotImplementedError):
        checks.check_attention_by_parts(stub)


def test_a_crash_is_reported_with_its_input():
    def crashes(q, K, V, parts):
        return q[99], q  # IndexError

    with pytest.raises(CheckFailure, match=r"raised IndexError.* on the example of section 2"):
        checks.check_attention_by_parts(crashes)


def test_key_parts_behave_like_a_list_of_index_arrays():
    parts = checks_exercises.key_parts([2, 0], [], [1])
    assert len(parts) == 3 and [list(p) for p in parts] == [[2, 0], [], [1]]
    assert parts[0].dtype == np.intp and repr(parts) == "parts [2, 0] | [] | [1]"


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def test_quick_merge():
    assert "✓" in run_quietly(checks.check_quick_merge, 4.25)
    assert "✓" in run_quietly(checks.check_quick_merge, (1 * 2 + 3 * 5) / 4)
    with pytest.raises(CheckFailure, match="plain-average"):
        checks.check_quick_merge(3.5)
    with pytest.raises(CheckFailure, match="normalize-then-add"):
        checks.check_quick_merge(7.0)
    with pytest.raises(CheckFailure, match="no answer yet"):
        checks.check_quick_merge(None)
    with pytest.raises(CheckFailure):
        checks.check_quick_merge("4.25?")


def test_quick_merge_second_and_its_lse():
    assert "✓" in run_quietly(checks.check_quick_merge_second, 3.25)
    with pytest.raises(CheckFailure, match="swapped-weights"):
        checks.check_quick_merge_second(0.75 * 1 + 0.25 * 4)
    with pytest.raises(CheckFailure, match="unnormalized-weights"):
        checks.check_quick_merge_second(2 * 1 + 6 * 4)
    assert "✓" in run_quietly(checks.check_quick_merged_lse, math.log(8))
    assert "✓" in run_quietly(checks.check_quick_merged_lse, 2.0794)
    with pytest.raises(CheckFailure, match="lse-max"):
        checks.check_quick_merged_lse(math.log(6))
    with pytest.raises(CheckFailure, match="base2-lse"):
        checks.check_quick_merged_lse(3.0)
    with pytest.raises(CheckFailure, match="natural log"):
        checks.check_quick_merged_lse(8.0)
    with pytest.raises(CheckFailure, match="the value is right, but it is ndarray"):
        checks.check_quick_merged_lse(np.array([math.log(8)]))  # right value, wrong type
