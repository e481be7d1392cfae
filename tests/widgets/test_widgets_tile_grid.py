"""The tile grid figure (its data, the tile model, is tested in tests/references/test_tiles.py)."""

from __future__ import annotations

import pytest

from course_utils.references import tiles
from course_utils.references.memory import flash_attention_traffic, standard_attention_traffic
from course_utils.widgets import tile_grid as tg


def test_figure_builds_redraws_and_has_a_static_png():
    pytest.importorskip("ipywidgets")
    fig = tg.tile_grid_figure(N=64, Br=16, Bc=16, d=8)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["step"].value = 3
    after_step = fig.png()
    assert after_step != first
    fig.controls["causal"].value = True
    assert fig.controls["step"].max == tiles.n_steps(64, 16, 16, causal=True)
    assert fig.png() != after_step
    fig.controls["mode"].value = "standard"
    assert fig.controls["step"].max == 3 * 4
    assert "step" in fig.html.value
    bundle = fig._repr_mimebundle_()
    assert "image/png" in bundle


def test_step_button_advances_and_wraps():
    pytest.importorskip("ipywidgets")
    import ipywidgets as w

    fig = tg.tile_grid_figure(N=32, Br=16, Bc=16, step=0)
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
        tiles.tile_kinds(10, 4, 4, causal=True, Nk=12)
    with pytest.raises(ValueError):
        tiles.n_steps(10, 4, 4, mode="fast")
    with pytest.raises(ValueError):
        tg.tile_grid_figure(N=2048)


def test_the_figure_shows_the_references_totals():
    fig = tg._full_state({"mode": "flash", "causal": False, "step": 0}, 64, 8, 16, 16)
    assert fig["standard_total"] == standard_attention_traffic(64, 8)
    assert fig["flash_total"] == flash_attention_traffic(64, 8, 16)
