"""The checks of notebook 01: a correct answer passes, every known mistake is named.

The correct implementations here are written independently of course_utils (the learner's
answers, as a learner would write them). Every warning is an error in this file.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

import course_utils as cu
from course_utils.checks import CheckFailure
from course_utils.checks import online_softmax as chk

pytestmark = pytest.mark.filterwarnings("error")


def good_stats(x, block):
    """Running (m, l) over the last axis of x; m = -inf, l = 0 for an all -inf row."""
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        l = np.exp(m - shift) * l + np.exp(xb - shift[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def good_attention(x, v, block):
    """One query's (o, lse) from the running (m, l, acc), divided once at the end."""
    m, l, acc = -np.inf, 0.0, np.zeros(np.shape(v)[1:])
    for start in range(0, len(x), block):
        xb, vb = x[start : start + block], v[start : start + block]
        m_new = max(m, xb.max())
        shift = 0.0 if m_new == -np.inf else m_new
        p, factor = np.exp(xb - shift), np.exp(m - shift)
        l = factor * l + p.sum()
        acc = factor * acc + p @ vb
        m = m_new
    if l == 0:
        return acc, -np.inf
    return acc / l, m + np.log(l)


def _run_quietly(check, fn, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        check(fn, **kwargs)
    return out.getvalue(), err.getvalue()


def _slugs(message: str) -> list[str]:
    return re.findall(r"\[misconception: ([\w-]+)\]", message)


CHECKS = [
    (chk.check_online_softmax_stats, good_stats, chk.STATS_MISTAKES),
    (chk.check_online_softmax_attention, good_attention, chk.ATTENTION_MISTAKES),
]


@pytest.mark.parametrize("check, good, _m", CHECKS)
def test_correct_answer_passes_quietly(check, good, _m):
    out, err = _run_quietly(check, good)
    assert out.startswith("✓ ") and out.count("\n") == 1, out
    assert err == ""


@pytest.mark.parametrize("check, good, _m", CHECKS)
def test_hidden_mode_fresh_inputs(check, good, _m):
    for _ in range(3):
        out, err = _run_quietly(check, good, seed=None, trials=60)
        assert out.startswith("✓ ") and err == ""


@pytest.mark.parametrize(
    "check, mistake",
    [(c, m) for c, _, ms in CHECKS for m in ms],
    ids=lambda p: getattr(p, "slug", getattr(p, "__name__", None)),
)
def test_every_mistake_is_named(check, mistake):
    def learner(*args):  # defined here, so it is not mistaken for course_utils' own function
        return mistake.fn(*args)

    with pytest.raises(CheckFailure) as info:
        _run_quietly(check, learner)
    assert _slugs(str(info.value)) == [mistake.slug], str(info.value)


def test_the_slugs_cover_the_named_misconceptions():
    stats = {m.slug for m in chk.STATS_MISTAKES}
    att = {m.slug for m in chk.ATTENTION_MISTAKES}
    assert stats == {
        "no-rescale",
        "own-block-max",
        "no-max-subtraction",
        "nan-masked",
        "low-precision",
    }
    assert att == stats | {"rescale-l-not-acc", "normalize-then-average"}


def test_float16_state_is_low_precision():
    def learner(x, v, block):
        o, lse = good_attention(np.asarray(x, np.float16), np.asarray(v, np.float16), block)
        return np.asarray(o, np.float64), np.float64(lse)

    with pytest.raises(CheckFailure) as info:
        _run_quietly(chk.check_online_softmax_attention, learner)
    assert _slugs(str(info.value)) == ["low-precision"]


def test_nan_only_from_the_final_division_is_named():
    def learner(x, v, block):
        m, l, acc = -np.inf, 0.0, np.zeros(np.shape(v)[1:])
        for start in range(0, len(x), block):
            xb, vb = x[start : start + block], v[start : start + block]
            m_new = max(m, xb.max())
            shift = 0.0 if m_new == -np.inf else m_new
            p, factor = np.exp(xb - shift), np.exp(m - shift)
            l, acc, m = factor * l + p.sum(), factor * acc + p @ vb, m_new
        return acc / l, m + np.log(l)  # 0 / 0 for a fully masked row

    with pytest.raises(CheckFailure) as info:
        _run_quietly(chk.check_online_softmax_attention, learner)
    assert "all -inf" in str(info.value) and _slugs(str(info.value)) == ["nan-masked"]


def test_not_implemented_propagates():
    def stub(*args):
        raise NotImplementedError()

    for check, _, _ in CHECKS:
        with pytest.raises(NotImplementedError):
            check(stub)


def test_calling_the_reference_is_refused():
    with pytest.raises(CheckFailure) as info:
        chk.check_online_softmax_stats(cu.online_softmax_stats)
    assert _slugs(str(info.value)) == ["calls-reference"]


def test_wrong_shape_and_wrong_arity_are_reported():
    with pytest.raises(CheckFailure, match="shape"):
        chk.check_online_softmax_stats(lambda x, b: (np.max(x), np.zeros(3)))
    with pytest.raises(CheckFailure, match="2 values"):
        chk.check_online_softmax_attention(lambda x, v, b: 1.0)
    with pytest.raises(CheckFailure, match="raised"):
        chk.check_online_softmax_stats(lambda x, b: 1 / 0)


def test_cases_start_with_the_worked_examples_and_are_deterministic():
    cases = chk._attention_cases(0, 5)
    assert "recall" in cases[0].label and "lesson" in cases[1].label
    assert "textbook's example" in cases[2].label
    again = chk._attention_cases(0, 5)
    for a, b in zip(cases, again, strict=True):
        for x, y in zip(a.args, b.args, strict=True):
            np.testing.assert_array_equal(x, y)
    o, lse = chk._online_attention_reference(*cases[1].args)
    assert o == pytest.approx(44 / 15) and lse == pytest.approx(np.log(15))
    o, _ = chk._online_attention_reference(*cases[2].args)
    assert o == pytest.approx(36.8806, abs=5e-5)
    o, _ = chk._online_attention_reference(*cases[0].args)
    assert o == pytest.approx(19.187, abs=5e-4)


@pytest.mark.parametrize(
    "quick, right, wrong, hint",
    [
        (chk.check_quick_rescale, np.exp(-2.0), np.exp(2.0), "<= 1"),
        (chk.check_quick_rescale, 0.135, 0.5, "exp(m_old - m_new)"),
        (chk.check_quick_new_l, 1 + 3 * np.exp(-2.0), 3 + np.exp(-2.0), "without rescaling"),
        (chk.check_quick_output, 1.193, 6 / (1 + 3 * np.exp(-2.0)), "acc needs"),
        (chk.check_quick_output, (1 + 5 * np.exp(-2.0)) / (1 + 3 * np.exp(-2.0)), 1.677, "acc /"),
    ],
)
def test_quick_checks(quick, right, wrong, hint):
    out, _ = _run_quietly(quick, right)
    assert out.startswith("✓")
    with pytest.raises(CheckFailure) as info:
        quick(wrong)
    assert hint in str(info.value)
    with pytest.raises(CheckFailure, match="no answer"):
        quick(None)
