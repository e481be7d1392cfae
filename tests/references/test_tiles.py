"""The tile model the tile-grid figures draw (references.tiles): tile kinds, the forward's and the
backward's schedules, and the HBM elements each step moves."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.references import tiles
from course_utils.references.tiles import FULL, MASK, SKIP, tile_kinds


def brute_force_kinds(N, Br, Bc):
    """Tile kinds from the element-level causal mask (c <= r visible)."""
    visible = np.tri(N, dtype=bool)
    kinds = np.empty((-(-N // Br), -(-N // Bc)), dtype=int)
    for i in range(kinds.shape[0]):
        for j in range(kinds.shape[1]):
            tile = visible[i * Br : (i + 1) * Br, j * Bc : (j + 1) * Bc]
            kinds[i, j] = SKIP if not tile.any() else (FULL if tile.all() else MASK)
    return kinds


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize(
    "N, Br, Bc", [(1, 1, 1), (8, 4, 4), (10, 4, 3), (10, 3, 4), (37, 5, 2), (5, 8, 8), (64, 1, 1)]
)
def test_tile_kinds_match_the_element_mask(N, Br, Bc):
    np.testing.assert_array_equal(tiles.tile_kinds(N, Br, Bc), brute_force_kinds(N, Br, Bc))
    assert (tiles.tile_kinds(N, Br, Bc, causal=False) == FULL).all()


def test_skipped_tiles_are_exactly_those_above_the_diagonal():
    for N, B in [(16, 4), (1024, 128), (100, 16)]:
        kinds = tiles.tile_kinds(N, B, B)
        T = kinds.shape[0]
        above = np.triu(np.ones((T, T), dtype=bool), k=1)
        np.testing.assert_array_equal(kinds == SKIP, above)
        assert (np.diag(kinds) == MASK).all() if B > 1 else (np.diag(kinds) == FULL).all()
        assert len(tiles.tile_schedule(N, B, B, causal=True)) == T * (T + 1) // 2


def test_causal_count_at_scale():
    assert int((tiles.tile_kinds(16_384, 128, 128) != SKIP).sum()) == 8_256


def test_schedule_is_row_by_row_and_skips_nothing_it_needs():
    schedule = tiles.tile_schedule(10, 4, 3, causal=True)
    kinds = tiles.tile_kinds(10, 4, 3)
    assert schedule == sorted(schedule)  # FA2 order: query tile i, then key tiles j = 0, 1, ...
    assert {(t.i, t.j) for t in schedule} == set(zip(*np.nonzero(kinds != SKIP), strict=True))
    assert all(kinds[t.i, t.j] == t.kind for t in schedule)
    assert len(tiles.tile_schedule(10, 4, 3)) == 3 * 4


@pytest.mark.parametrize("N, d, B", [(128, 8, 16), (96, 16, 32), (64, 64, 8)])
def test_counters_at_the_end_equal_the_formulas(N, d, B):
    end = tiles.n_steps(N, B, B, mode="standard")
    assert tiles.hbm_counters(end, N, d, B, B, mode="standard").total == 4 * N * N + 4 * N * d
    end = tiles.n_steps(N, B, B)
    assert tiles.hbm_counters(end, N, d, B, B).total == 2 * N * d + 2 * N * N * d // B
    causal_end = tiles.n_steps(N, B, B, causal=True)
    T = N // B
    causal = 2 * N * d + 2 * d * sum(min(N, (i + 1) * B) for i in range(T))
    assert tiles.hbm_counters(causal_end, N, d, B, B, causal=True).total == causal
    assert causal == tiles.flash_traffic(N, d, B, B, causal=True)
    # standard attention writes the masked scores too: causal changes nothing there
    assert tiles.hbm_counters(10**6, N, d, B, B, causal=True, mode="standard").total == (
        4 * N * N + 4 * N * d
    )


@pytest.mark.parametrize("N, Br, Bc, causal", [(100, 16, 12, True), (37, 5, 8, False)])
def test_counters_grow_step_by_step_to_flash_traffic(N, Br, Bc, causal):
    d = 8
    totals = [
        tiles.hbm_counters(s, N, d, Br, Bc, causal).total
        for s in range(tiles.n_steps(N, Br, Bc, causal) + 1)
    ]
    assert totals[0] == 0 and all(b > a for a, b in zip(totals, totals[1:], strict=False))
    assert totals[-1] == tiles.flash_traffic(N, d, Br, Bc, causal)
    reads, writes = tiles.step_traffic(N, d, Br, Bc, causal)
    assert writes.sum() == N * d  # O written once, row tile by row tile


@pytest.mark.parametrize(("N", "Br", "Bc"), [(1, 1, 1), (10, 4, 3), (10, 3, 4), (37, 5, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_schedule_is_column_by_column_and_covers_every_needed_tile(N, Br, Bc, causal):
    schedule = tiles.backward_schedule(N, Br, Bc, causal)
    kinds = tile_kinds(N, Br, Bc, causal)
    # FA2 backward order: K/V tile j outside, query tiles i = 0, 1, ... inside
    assert [(t.j, t.i) for t in schedule] == sorted((t.j, t.i) for t in schedule)
    assert {(t.i, t.j) for t in schedule} == set(zip(*np.nonzero(kinds != SKIP), strict=True))
    assert all(kinds[t.i, t.j] == t.kind for t in schedule)
    assert tiles.n_backward_steps(N, Br, Bc, causal) == len(schedule)


def test_dq_adds_count_the_tiles_of_each_row():
    N, B = 128, 16
    T = N // B
    end = tiles.n_backward_steps(N, B, B)
    np.testing.assert_array_equal(tiles.dq_adds(end, N, B, B), np.full(T, T))
    end = tiles.n_backward_steps(N, B, B, causal=True)
    np.testing.assert_array_equal(tiles.dq_adds(end, N, B, B, causal=True), np.arange(1, T + 1))
    # after the first column every query tile has been added to once
    np.testing.assert_array_equal(tiles.dq_adds(T, N, B, B), np.ones(T, dtype=int))
    assert tiles.dq_adds(0, N, B, B).sum() == 0 and tiles.dq_adds(10**6, N, B, B).sum() == T * T


@pytest.mark.parametrize(
    ("N", "d", "Br", "Bc"), [(128, 8, 16, 16), (100, 16, 12, 32), (7, 4, 3, 2)]
)
def test_traffic_at_the_end_equals_the_formula(N, d, Br, Bc):
    """Without causal: ceil(N / Bc) passes over Q, dO, lse, D and dQ (read and written), plus K, V
    read once and dK, dV written once."""
    want = ceil_div(N, Bc) * N * (4 * d + 2) + 4 * N * d
    assert tiles.backward_traffic(N, d, Br, Bc) == want
    reads, writes = tiles.backward_step_traffic(N, d, Br, Bc)
    assert writes.sum() == ceil_div(N, Bc) * N * d + 2 * N * d  # dQ per column, dK and dV once


def test_causal_traffic_per_column():
    """Column j streams only the query tiles that are not skipped: rows from its first tile on."""
    N, d, B = 128, 8, 16
    T = N // B
    rows_streamed = sum(N - j * B for j in range(T))
    assert (
        tiles.backward_traffic(N, d, B, B, causal=True) == rows_streamed * (4 * d + 2) + 4 * N * d
    )


@pytest.mark.parametrize("causal", [False, True])
def test_counters_grow_step_by_step(causal):
    N, d, Br, Bc = 37, 8, 5, 8
    totals = [
        tiles.backward_counters(s, N, d, Br, Bc, causal).total
        for s in range(tiles.n_backward_steps(N, Br, Bc, causal) + 1)
    ]
    assert totals[0] == 0 and all(b > a for a, b in zip(totals, totals[1:], strict=False))
    assert totals[-1] == tiles.backward_traffic(N, d, Br, Bc, causal)


def test_totals_agree_with_the_memory_module():
    from course_utils.references import memory

    for N in (1, 37, 100, 128):
        for B in (1, 16, 50):
            assert tiles.flash_traffic(N, 8, B, B) == memory.flash_attention_traffic(N, 8, B)
            assert tiles.flash_traffic(N, 8, B, B, causal=True) == (
                memory.causal_flash_attention_traffic(N, 8, B)
            )
