"""The backward tile grid figure (its data, the tile model, is tested in
tests/references/test_tiles.py)."""

from __future__ import annotations

import pytest

from course_utils.references import tiles
from course_utils.widgets import backward_tiles as bt


def test_figure_builds_redraws_and_has_a_static_png():
    pytest.importorskip("ipywidgets")
    fig = bt.backward_tiles_figure(N=64, Br=16, Bc=16, d=8)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["step"].value = 3
    after_step = fig.png()
    assert after_step != first
    fig.controls["causal"].value = True
    assert fig.controls["step"].max == tiles.n_backward_steps(64, 16, 16, causal=True) == 10
    assert fig.png() != after_step
    assert "atomic adds" in fig.html.value
    assert "image/png" in fig._repr_mimebundle_()


def test_step_button_advances_and_wraps():
    pytest.importorskip("ipywidgets")
    import ipywidgets as w

    fig = bt.backward_tiles_figure(N=32, Br=16, Bc=16, step=0)
    buttons = [c for c in fig.all_controls() if isinstance(c, w.Button)]
    (step_button,) = [b for b in buttons if b.description == "Step"]
    assert any(isinstance(c, w.Play) for c in fig.all_controls())
    step_button.click()
    assert fig.controls["step"].value == 1
    fig.controls["step"].value = fig.controls["step"].max
    step_button.click()
    assert fig.controls["step"].value == 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        bt.backward_tiles_figure(N=2048)
    with pytest.raises(ValueError):
        bt.backward_tiles_figure(N=128, Br=1)
    with pytest.raises(ValueError, match="Br must be a positive integer"):
        tiles.backward_schedule(10, 0, 4)
