"""The roofline module reproduces the numbers of the lesson and of the textbook.

Expected values come from the lesson's worked example (c) "At scale", its roofline section, and
the textbook's tile sizing (16 B d bytes in 192 KB); they are rounded as the lesson rounds them.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils.harness.hardware import A100, H100_SXM, H200, Hardware
from course_utils.references.roofline import (
    arithmetic_intensity,
    at_scale_example,
    attention_flops,
    attention_roofline,
    backward_memory_bytes,
    max_tile_rows,
    time_lower_bounds,
)

MiB, GiB, us = 2**20, 2**30, 1e-6


# ---- the lesson's worked example (c) -------------------------------------------------------
@pytest.fixture(scope="module")
def example():
    return at_scale_example()  # N = 16,384, d = 64, Br = 128, 16 heads, bf16, H100 SXM


def test_at_scale_memory(example):
    assert example.s_bytes_per_head / MiB == 512
    assert example.s_bytes_all_heads / GiB == 8
    assert example.lse_bytes_all_heads / MiB == 1


def test_at_scale_compute(example):
    assert f"{example.flops_per_head:.3g}" == "6.87e+10"
    assert round(example.compute_s / us) == 69


def test_at_scale_standard_traffic(example):
    assert f"{example.standard_elements:.3g}" == "1.08e+09"
    assert round(example.standard_bytes / 1e9, 2) == 2.16
    assert round(example.standard_s / us) == 644
    assert round(example.standard_over_compute) == 9


def test_at_scale_flash_traffic(example):
    assert f"{example.flash_elements:.3g}" == "2.71e+08"
    assert round(example.flash_bytes / 1e6) == 541
    assert round(example.flash_s / us) == 162
    assert round(example.traffic_ratio, 1) == 4.0 == 2 * example.Br / example.d


def test_at_scale_with_l2(example):
    assert example.kv_bytes_per_head / MiB == 4
    assert example.kv_fits_l2
    assert round(example.l2_bytes / 1e6, 1) == 8.4
    assert round(example.l2_s / us, 1) == 2.5
    assert example.l2_s < example.compute_s  # then the kernel is compute-bound


def test_at_scale_summary_shows_the_lessons_numbers(example):
    text = example.summary()
    for piece in ("512 MiB", "8 GiB", "1 MiB", "69 us", "644 us", "541 MB", "162 us", "8.4 MB"):
        assert piece in text, piece
    assert "2.5 us" in text and "compute-bound" in text


def test_check_yourself_d128_halves_the_gain():
    assert round(at_scale_example(d=128).traffic_ratio, 1) == 2.0


def test_at_scale_fields_are_not_rounded(example):
    assert example.compute_s == example.flops_per_head / H100_SXM.peak_flops
    assert isinstance(example.standard_bytes, int)
    names = {f.name for f in dataclasses.fields(example)}
    assert {"compute_s", "standard_s", "flash_s", "l2_s"} <= names


# ---- hardware ------------------------------------------------------------------------------
def test_ridge_points():
    assert round(H100_SXM.ridge_point) == 295  # 989 / 3.35
    assert A100.ridge_point == pytest.approx(312 / 2.0)
    assert H200.ridge_point == pytest.approx(797 / 4.26)
    assert H200.peak_flops == 797e12 and H200.hbm_bandwidth == 4.26e12  # measured, not spec


def test_hardware_is_frozen_and_checked():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100_SXM.peak_flops = 1.0
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        Hardware("bad", 1e12, 0.0, 1, 1, 1)
    with pytest.raises(TypeError, match="num_sms"):
        Hardware("bad", 1e12, 1e12, 1, 1.5, 1)


def test_a100_sram_is_the_textbooks_192_KB():
    assert A100.sram_per_sm == 196_608 and A100.num_sms == 108


# ---- tile sizing ---------------------------------------------------------------------------
def test_tile_rows_of_the_textbook():
    assert max_tile_rows(196_608, 128) == 96
    assert max_tile_rows(196_608, 64) == 192


@given(st.integers(1, 2**20), st.integers(1, 256), st.integers(1, 8), st.integers(1, 8))
def test_max_tile_rows_is_the_largest_that_fits(sram, d, b, arrays):
    B = max_tile_rows(sram, d, b, arrays)
    assert B * arrays * b * d <= sram < (B + 1) * arrays * b * d


# ---- FLOPs, intensity, bounds --------------------------------------------------------------
@given(st.integers(1, 10_000), st.integers(1, 256), st.integers(1, 8), st.integers(1, 32))
def test_attention_flops(N, d, batch, heads):
    full = attention_flops(N, d, batch=batch, heads=heads)
    assert full == 4 * N * N * d * batch * heads
    assert attention_flops(N, d, causal=True, batch=batch, heads=heads) * 2 == full


@given(st.floats(1.0, 1e18), st.floats(1.0, 1e15))
def test_time_lower_bounds_pick_the_larger_time(flops, nbytes):
    t = time_lower_bounds(flops, nbytes, H100_SXM)
    assert t.compute_s == flops / 989e12 and t.memory_s == nbytes / 3.35e12
    assert t.lower_bound_s == max(t.compute_s, t.memory_s)
    assert t.intensity == arithmetic_intensity(flops, nbytes)
    below_ridge = t.intensity < H100_SXM.ridge_point
    if not math.isclose(t.intensity, H100_SXM.ridge_point, rel_tol=1e-9):
        assert t.bound == ("memory" if below_ridge else "compute")


def test_roofline_intensities_of_the_lesson():
    r = attention_roofline(16_384, 64, 128)
    assert r.standard.intensity == pytest.approx(64 / 2, rel=0.01)  # d / 2 FLOP/byte
    assert r.flash.intensity == pytest.approx(128, rel=0.01)  # Br FLOP/byte
    assert r.standard.bound == r.flash.bound == "memory"  # both below the ridge, 295
    assert r.traffic_ratio == pytest.approx(4, rel=0.01)
    assert r.speedup == pytest.approx(r.standard.memory_s / r.flash.memory_s)


def test_roofline_with_l2_counts_4Nd_and_is_compute_bound():
    N, d = 16_384, 64
    r = attention_roofline(N, d, 128, l2_serves_rereads=True)
    assert r.flash.nbytes == 4 * N * d * 2
    assert r.flash.bound == "compute"
    assert r.flash.lower_bound_s == r.flash.compute_s
    assert r.standard == attention_roofline(N, d, 128).standard  # L2 does not hold S


def test_roofline_on_the_measured_h200():
    r = attention_roofline(16_384, 64, 128, hw=H200)
    assert r.flash.memory_s == pytest.approx(541_065_216 / 4.26e12)


def test_backward_memory_of_the_lesson():
    m = backward_memory_bytes(16_384, 64, heads=16)
    assert m.standard_bytes / GiB == 8  # P: 512 MiB per head
    assert m.lse_bytes / MiB == 1
    assert m.flash_bytes == 16 * 16_384 * 64 * 2 + m.lse_bytes  # O in bf16 plus the lse


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: attention_flops(0, 64), ValueError, "N"),
        (lambda: attention_flops(16, 64, causal=1), TypeError, "causal"),
        (lambda: attention_flops(16, 64, heads=0), ValueError, "heads"),
        (lambda: arithmetic_intensity(0, 1), ValueError, "flops"),
        (lambda: arithmetic_intensity(1, float("nan")), ValueError, "nbytes"),
        (lambda: arithmetic_intensity(True, 1), TypeError, "flops"),
        (lambda: time_lower_bounds(1, 1, "H100"), TypeError, "hw"),
        (lambda: attention_roofline(16, 8, 0), ValueError, "Br"),
        (lambda: attention_roofline(16, 8, 4, l2_serves_rereads="yes"), TypeError, "l2_"),
        (lambda: max_tile_rows(196_608, 0), ValueError, "d"),
        (lambda: max_tile_rows(196_608.0, 64), TypeError, "sram_bytes"),
        (lambda: backward_memory_bytes(16, 8, bytes_per_element=0), ValueError, "bytes_per"),
        (lambda: at_scale_example(hw=None), TypeError, "hw"),
    ],
)
def test_errors_name_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
