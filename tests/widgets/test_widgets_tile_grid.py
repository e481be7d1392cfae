"""The tile grid figure: its data (tile kinds, schedule, HBM counters) and its widget."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.widgets import tile_grid as tg
from course_utils.widgets.tile_grid import FULL, MASK, SKIP


def brute_force_kinds(N, Br, Bc):
    """Tile kinds from the element-level causal mask (c <= r visible)."""
    visible = np.tri(N, dtype=bool)
    kinds = np.empty((-(-N // Br), -(-N // Bc)), dtype=int)
    for i in range(kinds.shape[0]):
        for j in range(kinds.shape[1]):
            tile = visible[i * Br : (i + 1) * Br, j * Bc : (j + 1) * Bc]
            kinds[i, j] = SKIP if not tile.any() else (FULL if tile.all() else MASK)
    return kinds


@pytest.mark.parametrize(
    "N, Br, Bc", [(1, 1, 1), (8, 4, 4), (10, 4, 3), (10, 3, 4), (37, 5, 2), (5, 8, 8), (64, 1, 1)]
)
def test_tile_kinds_match_the_element_mask(N, Br, Bc):
    np.testing.assert_array_equal(tg.tile_kinds(N, Br, Bc), brute_force_kinds(N, Br, Bc))
    assert (tg.tile_kinds(N, Br, Bc, causal=False) == FULL).all()


def test_skipped_tiles_are_exactly_those_above_the_diagonal():
    for N, B in [(16, 4), (1024, 128), (100, 16)]:
        kinds = tg.tile_kinds(N, B, B)
        T = kinds.shape[0]
        above = np.triu(np.ones((T, T), dtype=bool), k=1)
        np.testing.assert_array_equal(kinds == SKIP, above)
        assert (np.diag(kinds) == MASK).all() if B > 1 else (np.diag(kinds) == FULL).all()
        assert len(tg.tile_schedule(N, B, B, causal=True)) == T * (T + 1) // 2


def test_causal_count_at_scale():
    assert int((tg.tile_kinds(16_384, 128, 128) != SKIP).sum()) == 8_256


def test_schedule_is_row_by_row_and_skips_nothing_it_needs():
    schedule = tg.tile_schedule(10, 4, 3, causal=True)
    kinds = tg.tile_kinds(10, 4, 3)
    assert schedule == sorted(schedule)  # FA2 order: query tile i, then key tiles j = 0, 1, ...
    assert {(t.i, t.j) for t in schedule} == set(zip(*np.nonzero(kinds != SKIP), strict=True))
    assert all(kinds[t.i, t.j] == t.kind for t in schedule)
    assert len(tg.tile_schedule(10, 4, 3)) == 3 * 4


@pytest.mark.parametrize("N, d, B", [(128, 8, 16), (96, 16, 32), (64, 64, 8)])
def test_counters_at_the_end_equal_the_formulas(N, d, B):
    end = tg.n_steps(N, B, B, mode="standard")
    assert tg.hbm_counters(end, N, d, B, B, mode="standard").total == 4 * N * N + 4 * N * d
    end = tg.n_steps(N, B, B)
    assert tg.hbm_counters(end, N, d, B, B).total == 2 * N * d + 2 * N * N * d // B
    causal_end = tg.n_steps(N, B, B, causal=True)
    T = N // B
    causal = 2 * N * d + 2 * d * sum(min(N, (i + 1) * B) for i in range(T))
    assert tg.hbm_counters(causal_end, N, d, B, B, causal=True).total == causal
    assert causal == tg.flash_traffic(N, d, B, B, causal=True)
    # standard attention writes the masked scores too: causal changes nothing there
    assert tg.hbm_counters(10**6, N, d, B, B, causal=True, mode="standard").total == (
        tg.standard_traffic(N, d)
    )


@pytest.mark.parametrize("N, Br, Bc, causal", [(100, 16, 12, True), (37, 5, 8, False)])
def test_counters_grow_step_by_step_to_flash_traffic(N, Br, Bc, causal):
    d = 8
    totals = [
        tg.hbm_counters(s, N, d, Br, Bc, causal).total
        for s in range(tg.n_steps(N, Br, Bc, causal) + 1)
    ]
    assert totals[0] == 0 and all(b > a for a, b in zip(totals, totals[1:], strict=False))
    assert totals[-1] == tg.flash_traffic(N, d, Br, Bc, causal)
    reads, writes = tg.step_traffic(N, d, Br, Bc, causal)
    assert writes.sum() == N * d  # O written once, row tile by row tile


def test_figure_builds_redraws_and_has_a_static_png():
    pytest.importorskip("ipywidgets")
    fig = tg.tile_grid_figure(N=64, Br=16, Bc=16, d=8)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["step"].value = 3
    after_step = fig.png()
    assert after_step != first
    fig.controls["causal"].value = True
    assert fig.controls["step"].max == tg.n_steps(64, 16, 16, causal=True)
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
        tg.tile_kinds(10, 4, 4, causal=True, Nk=12)
    with pytest.raises(ValueError):
        tg.n_steps(10, 4, 4, mode="fast")
    with pytest.raises(ValueError):
        tg.tile_grid_figure(N=2048)


def test_totals_agree_with_the_memory_module():
    memory = pytest.importorskip("course_utils.references.memory")
    for N in (1, 37, 100, 128):
        for B in (1, 16, 50):
            assert tg.standard_traffic(N, 8) == memory.standard_attention_traffic(N, 8)
            assert tg.flash_traffic(N, 8, B, B) == memory.flash_attention_traffic(N, 8, B)
            assert tg.flash_traffic(N, 8, B, B, causal=True) == (
                memory.causal_flash_attention_traffic(N, 8, B)
            )
