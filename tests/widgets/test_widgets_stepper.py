"""The online-softmax stepper: the data behind the picture, and the live figure itself.

The expected numbers are the lesson's hand computation (e^x = 2, 1, 8, 4) and direct formulas
written here, never taken from course_utils.references.softmax.
"""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from course_utils.widgets.stepper import (
    DEFAULT_X,
    HUGE_SCORE,
    online_softmax_stepper,
    stepper_state,
)

pytest.importorskip("ipywidgets")
pytestmark = pytest.mark.filterwarnings("error")

LESSON_X = np.log([2.0, 1.0, 8.0, 4.0])
LESSON_V = np.array([1.0, 2.0, 3.0, 4.0])


def test_lesson_example_step_by_step():
    s0 = stepper_state(LESSON_X, LESSON_V, 2, 0)
    assert (s0.step, s0.n_blocks, s0.stop, s0.m, s0.l, s0.acc) == (0, 2, 0, -math.inf, 0.0, 0.0)
    assert s0.weights.shape == (0,) and not s0.done and math.isnan(s0.factor)

    s1 = stepper_state(LESSON_X, LESSON_V, 2, 1)
    assert (s1.start, s1.stop) == (0, 2)
    assert s1.m == pytest.approx(math.log(2)) and s1.factor == 0.0
    assert s1.l == pytest.approx(1.5) and s1.acc == pytest.approx(2.0)
    np.testing.assert_allclose(s1.weights, [1.0, 0.5])

    s2 = stepper_state(LESSON_X, LESSON_V, 2, 2)
    assert (s2.start, s2.stop) == (2, 4) and s2.done
    assert s2.factor == pytest.approx(0.25)
    assert s2.l == pytest.approx(1.875) and s2.acc == pytest.approx(5.5)
    np.testing.assert_allclose(s2.weights, [0.25, 0.125, 1.0, 0.5])
    np.testing.assert_allclose(s2.old_weights, s1.weights)
    assert s2.out == pytest.approx(44 / 15, abs=1e-15) and s2.exact == pytest.approx(44 / 15)
    assert s2.error < 1e-15
    assert s2.naive_sum == pytest.approx(15.0)


@pytest.mark.parametrize("block", [1, 2, 3, 5, 8, 20])
def test_weights_are_relative_to_the_running_max_and_shrink_by_the_factor(block):
    rng = np.random.default_rng(block)
    x, v = rng.normal(size=11) * 3, rng.normal(size=11)
    n_blocks = math.ceil(11 / block)
    for step in range(1, n_blocks + 1):
        s = stepper_state(x, v, block, step)
        seen = x[: s.stop]
        assert s.stop == min(step * block, 11) and s.start == (step - 1) * block
        np.testing.assert_allclose(s.weights, np.exp(seen - seen.max()), rtol=1e-14)
        assert s.l == pytest.approx(np.exp(seen - seen.max()).sum(), rel=1e-14)
        assert s.acc == pytest.approx(np.exp(seen - seen.max()) @ v[: s.stop], rel=1e-12)
        if step > 1:
            old = x[: s.start]
            assert s.factor == pytest.approx(np.exp(old.max() - seen.max()), rel=1e-14)
            # the old bars all shrink by the same factor
            np.testing.assert_allclose(s.weights[: s.start], s.factor * s.old_weights, rtol=1e-13)
    assert s.done and s.error < 1e-14
    p = np.exp(x - x.max())
    assert s.exact == pytest.approx(p @ v / p.sum(), rel=1e-14)


def test_step_is_clipped():
    assert stepper_state(LESSON_X, LESSON_V, 2, -3).step == 0
    assert stepper_state(LESSON_X, LESSON_V, 2, 99).step == 2


def test_huge_score_overflows_naive_not_online():
    x = DEFAULT_X.copy()
    x[5] = HUGE_SCORE
    s = stepper_state(x, np.ones(8), 2, 4)
    assert math.isinf(s.naive_sum) and math.isnan(s.naive_out)
    assert s.done and math.isfinite(s.out) and s.out == pytest.approx(1.0) and s.error < 1e-15
    assert stepper_state(x, np.ones(8), 2, 3).factor == 0.0  # exp(2.1 - 1000) underflows to 0


def test_masked_scores():
    x = np.array([-np.inf, -np.inf, 1.0, -np.inf, 2.0])
    s1 = stepper_state(x, np.arange(5.0), 2, 1)
    assert s1.m == -np.inf and s1.l == 0.0 and not np.isnan(s1.weights).any()
    s3 = stepper_state(x, np.arange(5.0), 2, 3)
    assert s3.out == pytest.approx((np.e * 4.0 + 2.0) / (np.e + 1.0))


@pytest.mark.parametrize(
    "args, error",
    [
        ((np.zeros(0), np.zeros(0), 2, 0), ValueError),
        ((np.zeros(3), np.zeros(2), 2, 0), ValueError),
        ((np.full(3, -np.inf), np.zeros(3), 2, 0), ValueError),
        ((np.zeros(3), np.zeros(3), 0, 0), ValueError),
    ],
)
def test_bad_inputs(args, error):
    with pytest.raises(error):
        stepper_state(*args)


def _button(fig, label):
    for child in fig.all_controls():
        if getattr(child, "description", None) == label and hasattr(child, "click"):
            return child
    raise AssertionError(f"no button {label!r}")


def test_figure_builds_steps_resets_and_has_a_png():
    fig = online_softmax_stepper()
    start = fig.png()
    assert start.startswith(b"\x89PNG") and fig.extra["step"] == 0
    _button(fig, "Next block").click()
    assert fig.extra["step"] == 1
    after = fig.png()
    assert after != start
    for _ in range(10):
        _button(fig, "Next block").click()
    assert fig.extra["step"] == 4  # 8 scores in blocks of 2
    assert "difference" in fig.html.value
    _button(fig, "Reset").click()
    assert fig.extra["step"] == 0 and fig.png() == start

    bundle = fig._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")


def test_block_slider_and_huge_toggle_start_over():
    fig = online_softmax_stepper(step=2)
    before = fig.png()
    fig.controls["block"].value = 3
    assert fig.extra["step"] == 0 and fig.png() != before
    _button(fig, "Next block").click()
    _button(fig, "Next block").click()
    fig.controls["huge"].value = True
    assert fig.extra["step"] == 0
    for _ in range(3):
        _button(fig, "Next block").click()
    assert "overflows" in fig.html.value and "difference" in fig.html.value


def test_custom_scores():
    fig = online_softmax_stepper(LESSON_X, LESSON_V, block=2, step=2)
    assert "2.93333333333333" in fig.html.value
