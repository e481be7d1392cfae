"""The SM-fill chart (its data, the model, is tested in tests/references/test_sm_fill.py).

Expected numbers are the lesson's (32 blocks for batch 1 and 32 heads; 64 and 512 blocks for
check yourself 5) and direct formulas written here.
"""

from __future__ import annotations

import base64

import pytest

from course_utils.harness.hardware import H100_SXM
from course_utils.widgets.sm_fill import KV_LENGTHS, sm_fill_figure

pytest.importorskip("ipywidgets")
pytestmark = pytest.mark.filterwarnings("error")

W = H100_SXM.hbm_bandwidth


def test_figure_builds_redraws_and_has_a_static_png():
    fig = sm_fill_figure()
    assert fig.controls["kv_len"].options == KV_LENGTHS
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    assert "32/132" in fig.html.value
    fig.controls["splits"].value = 8
    moved = fig.png()
    assert moved != first
    assert "256" in fig.html.value and "132/132" in fig.html.value
    fig.controls["kv_len"].value = 256
    assert fig.png() != moved
    bundle = fig._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]) == fig.png()


def test_figure_refuses_a_kv_length_off_the_slider():
    with pytest.raises(ValueError, match="kv_len"):
        sm_fill_figure(kv_len=1000)
