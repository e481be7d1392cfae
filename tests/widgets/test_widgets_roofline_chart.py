"""The roofline chart: the data behind the picture, and the live figure itself.

Expected numbers are written from the lesson (worked example (c): 644 us, 162 us, 69 us, 8.4 MB,
2.5 us; intensities d/2 and about Br; ridge 989 / 3.35 = 295) and from the formulas
4N^2 + 4Nd, 2Nd + ceil(N/Br) 2Nd, 4N^2 d, not taken from course_utils.references.roofline.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from course_utils.harness.hardware import A100, H100_SXM, H200
from course_utils.widgets.roofline_chart import (
    HARDWARE,
    N_VALUES,
    readout,
    roofline_figure,
    roofline_state,
)

pytest.importorskip("ipywidgets")
pytestmark = pytest.mark.filterwarnings("error")

US = 1e-6


def standard_bytes(N, d):
    return 2 * (4 * N * N + 4 * N * d)


def flash_bytes(N, d, Br):
    return 2 * (2 * N * d + -(-N // Br) * 2 * N * d)


def test_the_lessons_at_scale_example_on_the_h100():
    st = roofline_state(16384, 64, 128, H100_SXM)
    std, fl = st.bounds.standard, st.bounds.flash
    assert std.lower_bound_s / US == pytest.approx(644, abs=1)
    assert fl.lower_bound_s / US == pytest.approx(162, abs=1)
    assert std.compute_s / US == pytest.approx(69.5, abs=0.1) == fl.compute_s / US
    assert std.bound == fl.bound == "memory"
    assert std.nbytes == standard_bytes(16384, 64) and fl.nbytes == flash_bytes(16384, 64, 128)
    assert std.intensity == pytest.approx(64 / 2, rel=0.02)  # d / 2
    assert fl.intensity == pytest.approx(128, rel=0.01)  # about Br
    assert st.ridge == pytest.approx(295, abs=0.5)
    assert st.bounds.traffic_ratio == pytest.approx(2 * 128 / 64, rel=0.01)
    # the backward pass: P in bf16 against O plus N fp32 lse values
    assert st.backward.p_bytes == 512 * 2**20
    assert st.backward.flash_bytes == 16384 * 64 * 2 + 16384 * 4
    assert st.kv_bytes == 4 * 2**20 and st.kv_fits_l2


def test_l2_serving_rereads_makes_flash_compute_bound():
    st = roofline_state(16384, 64, 128, H100_SXM, l2=True)
    fl = st.bounds.flash
    assert fl.nbytes == 4 * 16384 * 64 * 2  # 4Nd elements: 8.4 MB
    assert fl.nbytes / 1e6 == pytest.approx(8.4, abs=0.05)
    assert fl.memory_s / US == pytest.approx(2.5, abs=0.05)
    assert fl.bound == "compute" and fl.lower_bound_s == fl.compute_s
    assert st.bounds.standard.nbytes == standard_bytes(16384, 64)  # standard is unchanged


def test_h200_with_measured_ceilings():
    st = roofline_state(16384, 64, 128, "H200 (measured)")
    assert st.hw is H200
    assert st.bounds.standard.lower_bound_s / US == pytest.approx(
        standard_bytes(16384, 64) / 4.26e12 / US
    )
    assert st.bounds.standard.compute_s == pytest.approx(4 * 16384**2 * 64 / 797e12)
    assert st.ridge == pytest.approx(797 / 4.26)


@pytest.mark.parametrize("hw", [H100_SXM, H200, A100])
@pytest.mark.parametrize("l2", [False, True])
def test_the_sweep_over_n(hw, l2):
    st = roofline_state(3000, 128, 64, hw, l2)  # an N that is not on the grid
    n = st.sweep_N
    assert 3000 in n and set(N_VALUES) <= set(n) and np.all(np.diff(n) > 0)
    compute = 4.0 * n**2 * 128 / hw.peak_flops
    assert st.sweep_compute_s == pytest.approx(compute)
    std = np.maximum(compute, [standard_bytes(int(k), 128) / hw.hbm_bandwidth for k in n])
    assert st.sweep_standard_s == pytest.approx(std)
    flash = [
        (4 * int(k) * 128 * 2 if l2 else flash_bytes(int(k), 128, 64)) / hw.hbm_bandwidth for k in n
    ]
    assert st.sweep_flash_s == pytest.approx(np.maximum(compute, flash))
    assert np.all(st.sweep_flash_s <= st.sweep_standard_s)
    i = int(np.flatnonzero(n == 3000)[0])
    assert st.sweep_standard_s[i] == st.bounds.standard.lower_bound_s


def test_kv_not_fitting_in_l2_is_reported():
    st = roofline_state(131072, 128, 128, A100)
    assert st.kv_bytes == 2 * 131072 * 128 * 2 > A100.l2_bytes and not st.kv_fits_l2
    assert "do not fit" in readout(st)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="hw must be"):
        roofline_state(hw="H300")
    with pytest.raises(TypeError, match="l2"):
        roofline_state(l2="yes")
    with pytest.raises(ValueError, match="N must be one of"):
        roofline_figure(N=1000)
    with pytest.raises(ValueError, match="Br must be one of"):
        roofline_figure(Br=100)


def test_readout_gives_bounds_and_backward_memory():
    text = readout(roofline_state())
    for piece in ("644 µs", "162 µs", "69.5 µs", "2.16 GB", "541 MB", "512 MiB", "64 KiB", "295"):
        assert piece in text, piece


def test_figure_builds_redraws_and_has_a_static_png():
    fig = roofline_figure()
    assert set(fig.controls) == {"N", "Br", "l2", "hw", "d"}
    assert list(fig.controls["hw"].options) == list(HARDWARE)
    first = fig.png()
    assert first.startswith(b"\x89PNG")
    fig.controls["N"].value = 1024
    moved = fig.png()
    assert moved != first and "N = 1,024" in fig.html.value
    fig.controls["l2"].value = True
    assert fig.png() != moved and "compute-bound" in fig.html.value
    fig.controls["hw"].value = "H200 (measured)"
    assert "H200 (measured)" in fig.html.value
    fig.controls["Br"].value = 64
    assert "Br = 64" in fig.html.value
    bundle = fig._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]) == fig.png()
