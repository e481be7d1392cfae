"""The backward tile grid: its data (schedule, dQ adds, HBM counters) and its widget."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.widgets import backward_tiles as bt
from course_utils.widgets.tile_grid import SKIP, tile_kinds


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize(("N", "Br", "Bc"), [(1, 1, 1), (10, 4, 3), (10, 3, 4), (37, 5, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_schedule_is_column_by_column_and_covers_every_needed_tile(N, Br, Bc, causal):
    schedule = bt.backward_schedule(N, Br, Bc, causal)
    kinds = tile_kinds(N, Br, Bc, causal)
    # FA2 backward order: K/V tile j outside, query tiles i = 0, 1, ... inside
    assert [(t.j, t.i) for t in schedule] == sorted((t.j, t.i) for t in schedule)
    assert {(t.i, t.j) for t in schedule} == set(zip(*np.nonzero(kinds != SKIP), strict=True))
    assert all(kinds[t.i, t.j] == t.kind for t in schedule)
    assert bt.n_backward_steps(N, Br, Bc, causal) == len(schedule)


def test_dq_adds_count_the_tiles_of_each_row():
    N, B = 128, 16
    T = N // B
    end = bt.n_backward_steps(N, B, B)
    np.testing.assert_array_equal(bt.dq_adds(end, N, B, B), np.full(T, T))
    end = bt.n_backward_steps(N, B, B, causal=True)
    np.testing.assert_array_equal(bt.dq_adds(end, N, B, B, causal=True), np.arange(1, T + 1))
    # after the first column every query tile has been added to once
    np.testing.assert_array_equal(bt.dq_adds(T, N, B, B), np.ones(T, dtype=int))
    assert bt.dq_adds(0, N, B, B).sum() == 0 and bt.dq_adds(10**6, N, B, B).sum() == T * T


@pytest.mark.parametrize(
    ("N", "d", "Br", "Bc"), [(128, 8, 16, 16), (100, 16, 12, 32), (7, 4, 3, 2)]
)
def test_traffic_at_the_end_equals_the_formula(N, d, Br, Bc):
    """Without causal: ceil(N / Bc) passes over Q, dO, lse, D and dQ (read and written), plus K, V
    read once and dK, dV written once."""
    want = ceil_div(N, Bc) * N * (4 * d + 2) + 4 * N * d
    assert bt.backward_traffic(N, d, Br, Bc) == want
    reads, writes = bt.backward_step_traffic(N, d, Br, Bc)
    assert writes.sum() == ceil_div(N, Bc) * N * d + 2 * N * d  # dQ per column, dK and dV once


def test_causal_traffic_per_column():
    """Column j streams only the query tiles that are not skipped: rows from its first tile on."""
    N, d, B = 128, 8, 16
    T = N // B
    rows_streamed = sum(N - j * B for j in range(T))
    assert bt.backward_traffic(N, d, B, B, causal=True) == rows_streamed * (4 * d + 2) + 4 * N * d


@pytest.mark.parametrize("causal", [False, True])
def test_counters_grow_step_by_step(causal):
    N, d, Br, Bc = 37, 8, 5, 8
    totals = [
        bt.backward_counters(s, N, d, Br, Bc, causal).total
        for s in range(bt.n_backward_steps(N, Br, Bc, causal) + 1)
    ]
    assert totals[0] == 0 and all(b > a for a, b in zip(totals, totals[1:], strict=False))
    assert totals[-1] == bt.backward_traffic(N, d, Br, Bc, causal)


def test_figure_builds_redraws_and_has_a_static_png():
    pytest.importorskip("ipywidgets")
    fig = bt.backward_tiles_figure(N=64, Br=16, Bc=16, d=8)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["step"].value = 3
    after_step = fig.png()
    assert after_step != first
    fig.controls["causal"].value = True
    assert fig.controls["step"].max == bt.n_backward_steps(64, 16, 16, causal=True) == 10
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
        bt.backward_schedule(10, 0, 4)
