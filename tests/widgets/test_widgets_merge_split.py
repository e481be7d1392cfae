"""The merge split slider: the data behind the picture, and the live figure itself.

Expected numbers come from direct softmax formulas written here and from the lesson's hand
example (e^x = 2, 1, 8, 4; values 1..4), never from course_utils.references.softmax.
"""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from course_utils.widgets.merge_split import (
    DEFAULT_SCORES,
    DEFAULT_VALUES,
    merge_split_figure,
    merge_split_state,
)

pytest.importorskip("ipywidgets")
pytestmark = pytest.mark.filterwarnings("error")


def direct(scores, values):
    """Softmax average and logsumexp over the finite scores; (0, -inf) when there are none."""
    keep = np.isfinite(scores)
    if not keep.any():
        return 0.0, -math.inf
    x, v = scores[keep], values[keep]
    p = np.exp(x - x.max())
    return float(p @ v / p.sum()), float(x.max() + np.log(p.sum()))


def test_lesson_example_split_in_the_middle():
    st = merge_split_state(np.log([2.0, 1.0, 8.0, 4.0]), [1.0, 2.0, 3.0, 4.0], split=2)
    assert st.lse_a == pytest.approx(math.log(3)) and st.o_a == pytest.approx(4 / 3)
    assert st.lse_b == pytest.approx(math.log(12)) and st.o_b == pytest.approx(10 / 3)
    assert (st.w_a, st.w_b) == pytest.approx((0.2, 0.8))
    assert st.merged == pytest.approx(44 / 15, abs=1e-15) and st.lse == pytest.approx(math.log(15))
    assert st.plain_average == pytest.approx(7 / 3)


@pytest.mark.parametrize("split", range(len(DEFAULT_SCORES) + 1))
def test_merged_equals_full_attention_for_every_split(split):
    st = merge_split_state(split=split)
    full, full_lse = direct(DEFAULT_SCORES, DEFAULT_VALUES)
    assert st.merged == pytest.approx(full, abs=1e-14) and st.full == pytest.approx(full)
    assert st.lse == pytest.approx(full_lse, abs=1e-14)
    assert st.w_a + st.w_b == pytest.approx(1.0, abs=1e-15)
    assert st.key_weights.sum() == pytest.approx(1.0)
    o_a, lse_a = direct(DEFAULT_SCORES[:split], DEFAULT_VALUES[:split])
    assert (st.o_a, st.lse_a) == pytest.approx((o_a, lse_a))
    assert st.w_a == pytest.approx(math.exp(lse_a - full_lse) if split else 0.0)
    # the plain average misses full attention by a visible amount
    assert st.error_plain > 0.2


@pytest.mark.parametrize("split", range(len(DEFAULT_SCORES) + 1))
def test_mask_b_gives_attention_over_a_alone(split):
    st = merge_split_state(split=split, mask_b=True)
    assert np.isneginf(st.lse_b) and st.w_b == 0.0 and st.o_b == 0.0
    assert np.isneginf(st.scores[split:]).all()
    o_a, lse_a = direct(DEFAULT_SCORES[:split], DEFAULT_VALUES[:split])
    assert st.merged == pytest.approx(o_a, abs=1e-14) and st.full == pytest.approx(o_a)
    assert st.lse == pytest.approx(lse_a) if split else np.isneginf(st.lse)
    assert not np.isnan([st.merged, st.w_a, st.w_b, *st.key_weights]).any()
    if split:
        assert st.w_a == 1.0
        assert st.plain_average == pytest.approx(o_a / 2)  # averaging with an empty set halves o


def test_random_scores_any_split():
    rng = np.random.default_rng(7)
    for n in (1, 3, 11):
        x, v = 4 * rng.normal(size=n), rng.normal(size=n)
        for split in range(n + 1):
            st = merge_split_state(x, v, split)
            assert st.merged == pytest.approx(direct(x, v)[0], abs=1e-13)


@pytest.mark.parametrize("bad", [-1, 9, 2.5, True])
def test_bad_split_is_refused(bad):
    with pytest.raises(ValueError, match="split"):
        merge_split_state(split=bad)


def test_figure_builds_redraws_and_has_a_static_png():
    fig = merge_split_figure()
    assert fig.controls["split"].max == len(DEFAULT_SCORES)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["split"].value = 6
    moved = fig.png()
    assert moved != first
    fig.controls["mask_b"].value = True
    assert fig.png() != moved
    assert "w_B = 0.0000" in fig.html.value
    bundle = fig._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]) == fig.png()


def test_figure_starting_masked_keeps_the_original_scores():
    fig = merge_split_figure(split=3, mask_b=True)
    fig.controls["mask_b"].value = False
    assert "w_B = 0.0000" not in fig.html.value
