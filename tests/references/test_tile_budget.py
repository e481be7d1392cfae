"""One tile-budget model behind every estimate of notebooks 03, 04 and 07."""

from __future__ import annotations

import pytest

from course_utils.harness.hardware import A100, H100_SXM
from course_utils.references.tile_budget import (
    backward_budget,
    elements_tiles,
    forward_budget,
    largest_square_tile,
    rule_of_thumb,
)

KiB = 1024


def test_forward_budget_of_a_real_kernel_fits_an_h100_sm():
    b = forward_budget(128, 128, 64)  # bf16 inputs, fp32 scores, acc and state
    assert b.bytes == 16 * KiB + 32 * KiB + 64 * KiB + 32 * KiB + 1 * KiB  # 145 KiB
    assert b.over(H100_SXM) is None
    assert "fits in the 228 KiB" in b.table(H100_SXM)


def test_backward_budget_is_flagged_over_the_h100_shared_memory():
    b = backward_budget(128, 128, 64)
    assert b.bytes == 257 * KiB
    flag = b.over(H100_SXM)
    assert flag is not None and "228 KiB" in flag and "29 KiB" in flag
    assert flag in b.table(H100_SXM)
    # with half the query rows it fits
    assert backward_budget(64, 128, 64).over(H100_SXM) is None


def test_rule_of_thumb_is_16_B_d_and_leaves_out_the_score_tile():
    assert rule_of_thumb(96, 128).bytes == 16 * 96 * 128 == A100.sram_per_sm
    thumb = lambda Br, Bc, d: rule_of_thumb(Br, d)  # noqa: E731
    assert largest_square_tile(A100.sram_per_sm, 128, thumb) == 96
    assert largest_square_tile(A100.sram_per_sm, 64, thumb) == 192
    # counting the fp32 score tile (and m, l) as well, B = 96 no longer fits at d = 128
    full = forward_budget(96, 96, 128, input_bytes=4)
    assert full.bytes > A100.sram_per_sm
    best = largest_square_tile(A100.sram_per_sm, 128, input_bytes=4)
    assert best < 96
    assert forward_budget(best, best, 128, input_bytes=4).bytes <= A100.sram_per_sm
    assert forward_budget(best + 1, best + 1, 128, input_bytes=4).bytes > A100.sram_per_sm


SIZES = [(M, d) for M in (48, 100, 1000, 4096, 10_000, 100_000) for d in (8, 16, 32, 64, 128)]


@pytest.mark.parametrize(("M", "d"), [(M, d) for M, d in SIZES if M >= 6 * d])  # the bound's range
def test_element_model_fills_at_most_seven_eighths(M, d):
    Br, Bc = elements_tiles(M, d)
    assert Br == M // (6 * d) and Bc == min(Br, d)
    assert forward_budget(Br, Bc, d, 1, 1).elements <= 0.875 * M


def test_without_names_an_unknown_part():
    with pytest.raises(ValueError, match="names: no part called"):
        forward_budget(8, 8, 8).without("dK_j")


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8"])
def test_bad_sizes_are_named(bad):
    with pytest.raises((ValueError, TypeError), match="Br"):
        forward_budget(bad, 8, 8)
