"""The roofline chart: one head's forward pass, standard attention against FlashAttention.

Left panel, the roofline: attainable FLOP/s against arithmetic intensity (FLOP/byte), log-log,
with the two versions as points. Standard attention sits at about d/2 FLOP/byte, FlashAttention
at about Br (or far to the right when L2 serves the K/V re-reads), and the ridge point P/W
separates memory-bound from compute-bound. Right panel, the time view: the minimum time
max(4N^2 d / P, bytes / W) of each version against N, with the compute line 4N^2 d / P.

Controls: N, Br, "L2 serves re-reads", the hardware (H100 SXM spec sheet, H200 with the course's
measured ceilings, A100) and the head dimension d. The readout gives the bounds and the memory
each version keeps for the backward pass (P in bf16, or O plus N fp32 lse values).

roofline_state is the pure data behind the picture (the tests check it); roofline_figure draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_utils.harness.hardware import A100, H100_SXM, H200, Hardware, MiB
from course_utils.references.roofline import (
    AttentionRoofline,
    BackwardMemory,
    attention_roofline,
    backward_memory_bytes,
)

HARDWARE = {hw.name: hw for hw in (H100_SXM, H200, A100)}
N_VALUES = tuple(2**k for k in range(8, 18))  # 256 .. 131,072
BR_VALUES = (16, 32, 64, 128, 256)
D_VALUES = (32, 64, 128, 256)

COLOR_STANDARD = "#d62728"
COLOR_FLASH = "#2ca02c"
COLOR_COMPUTE = "#1f77b4"  # the blue compute line
COLOR_ROOF = "black"


@dataclass(frozen=True)
class RooflineState:
    """Everything the roofline chart shows for one setting. Times in seconds, sizes in bytes."""

    N: int
    d: int
    Br: int
    hw: Hardware
    l2: bool  # FlashAttention's K/V re-reads served by L2 (traffic 4Nd)
    bounds: AttentionRoofline  # .standard and .flash TimeBounds at this N
    backward: BackwardMemory  # what each version keeps for the backward pass
    kv_bytes: int  # K and V of one head, 2 N d b: what L2 must hold to serve the re-reads
    sweep_N: np.ndarray  # (n,) sequence lengths of the right panel
    sweep_standard_s: np.ndarray  # (n,) lower bound of standard attention
    sweep_flash_s: np.ndarray  # (n,) lower bound of FlashAttention
    sweep_compute_s: np.ndarray  # (n,) 4 N^2 d / P, the same for both

    @property
    def ridge(self) -> float:
        """peak FLOP/s / bandwidth: the intensity where the roofline turns flat."""
        return self.hw.ridge_point

    @property
    def kv_fits_l2(self) -> bool:
        return self.kv_bytes <= self.hw.l2_bytes


def _hardware(hw) -> Hardware:
    if isinstance(hw, Hardware):
        return hw
    try:
        return HARDWARE[hw]
    except (KeyError, TypeError):
        names = ", ".join(repr(k) for k in HARDWARE)
        raise ValueError(f"hw must be a Hardware or one of {names}, got {hw!r}") from None


def roofline_state(
    N: int = 16384,
    d: int = 64,
    Br: int = 128,
    hw: Hardware | str = H100_SXM,
    l2: bool = False,
    bytes_per_element: int = 2,
) -> RooflineState:
    """The bounds of one head's forward pass at N, and the curves over N, on `hw`.

    Args:
        N: sequence length.  d: head dimension.  Br: FlashAttention's query tile rows.
        hw: a Hardware, or its name in HARDWARE ("H100 SXM", "H200 (measured)", "A100").
        l2: count FlashAttention's K/V re-reads as L2 hits (traffic 4Nd, the ideal case).
        bytes_per_element: 2 for bf16.

    Returns:
        RooflineState; the sweep covers N_VALUES and N itself, sorted.
    """
    hw = _hardware(hw)
    if not isinstance(l2, (bool, np.bool_)):
        raise TypeError(f"l2 must be True or False, got {l2!r}")
    l2 = bool(l2)
    bounds = attention_roofline(N, d, Br, hw, bytes_per_element, l2_serves_rereads=l2)
    sweep = np.array(sorted({*N_VALUES, bounds.N}))
    rows = [attention_roofline(int(n), d, Br, hw, bytes_per_element, l2) for n in sweep]
    return RooflineState(
        N=bounds.N,
        d=bounds.d,
        Br=bounds.Br,
        hw=hw,
        l2=l2,
        bounds=bounds,
        backward=backward_memory_bytes(N, d, bytes_per_element),
        kv_bytes=2 * N * d * bytes_per_element,
        sweep_N=sweep,
        sweep_standard_s=np.array([r.standard.lower_bound_s for r in rows]),
        sweep_flash_s=np.array([r.flash.lower_bound_s for r in rows]),
        sweep_compute_s=np.array([r.standard.compute_s for r in rows]),
    )


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.4g} {unit}"
    return f"{nbytes:,.0f} B"


def _decimal(nbytes: float) -> str:
    """Traffic in decimal units, as notebook 04 writes it (2.16 GB, 541 MB, 8.4 MB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.3g} {unit}"
    return f"{nbytes:,.0f} B"


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:,.3g} µs" if us < 1000 else f"{us:,.0f} µs"


def draw_roofline(fig, st: RooflineState) -> None:
    """Left: the roofline with both versions' points. Right: minimum time against N."""
    ax_roof, ax_time = fig.subplots(1, 2)
    hw, std, fl = st.hw, st.bounds.standard, st.bounds.flash
    peak_t = hw.peak_flops / 1e12

    lo, hi = 1.0, 2e5  # fixed, so that the points move when a control changes
    x = np.geomspace(lo, hi, 200)
    ax_roof.plot(x, np.minimum(hw.peak_flops, x * hw.hbm_bandwidth) / 1e12, color=COLOR_ROOF)
    ax_roof.axvline(st.ridge, color="gray", linestyle=":", linewidth=1)
    ax_roof.text(
        st.ridge * 1.1,
        peak_t * 1.4,
        f"ridge point {st.ridge:.0f} FLOP/byte",
        fontsize=8,
        color="gray",
    )
    for name, tb, color, marker in (
        ("standard", std, COLOR_STANDARD, "o"),
        ("FlashAttention" + (" (L2)" if st.l2 else ""), fl, COLOR_FLASH, "s"),
    ):
        y = min(hw.peak_flops, tb.intensity * hw.hbm_bandwidth) / 1e12
        ax_roof.plot([tb.intensity], [y], marker=marker, color=color, markersize=10, ls="none")
        ax_roof.annotate(
            f"{name}\n{tb.intensity:,.0f} FLOP/byte\n{tb.bound}-bound",
            (tb.intensity, y),
            textcoords="offset points",
            xytext=(10, -34) if tb.intensity < 1e4 else (-100, -34),  # under the roof
            fontsize=8,
            color=color,
        )
    ax_roof.set_xscale("log")
    ax_roof.set_yscale("log")
    ax_roof.set_xlim(lo, hi)
    ax_roof.set_ylim(hw.hbm_bandwidth * lo / 1e12 * 0.7, peak_t * 3)
    ax_roof.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax_roof.set_ylabel("attainable TFLOP/s")
    ax_roof.set_title(
        f"{hw.name}: {peak_t:,.0f} TFLOP/s, {hw.hbm_bandwidth / 1e12:.3g} TB/s", fontsize=10
    )

    n = st.sweep_N
    us = 1e6
    ax_time.plot(n, st.sweep_standard_s * us, color=COLOR_STANDARD, marker=".", label="standard")
    ax_time.plot(
        n,
        st.sweep_flash_s * us,
        color=COLOR_FLASH,
        marker=".",
        label="FlashAttention" + (" (L2 serves re-reads)" if st.l2 else ""),
    )
    ax_time.plot(
        n, st.sweep_compute_s * us, color=COLOR_COMPUTE, linestyle="--", label="compute 4N²d / P"
    )
    ax_time.axvline(st.N, color="gray", linewidth=1, alpha=0.7)
    for tb, color in ((std, COLOR_STANDARD), (fl, COLOR_FLASH)):
        ax_time.plot([st.N], [tb.lower_bound_s * us], "o", color=color, markersize=8)
    ax_time.set_xscale("log", base=2)
    ax_time.set_yscale("log")
    ax_time.set_xlabel("sequence length N")
    ax_time.set_ylabel("minimum time of one head (µs)")
    ax_time.set_title(
        f"one head, d = {st.d}, Br = {st.Br}\n"
        f"standard ≥ {_us(std.lower_bound_s)}, FlashAttention ≥ {_us(fl.lower_bound_s)}",
        fontsize=9,
    )
    ax_time.legend(fontsize=8, loc="upper left")
    ax_time.grid(True, which="major", alpha=0.3)


def readout(st: RooflineState) -> str:
    """The numbers under the picture, as HTML: bounds, ratio, and the backward-pass memory."""
    std, fl, bw = st.bounds.standard, st.bounds.flash, st.backward
    fits = "fit" if st.kv_fits_l2 else "do not fit"
    return (
        f"<b>N = {st.N:,}, d = {st.d}, Br = {st.Br}</b> on {st.hw.name}, one head, bf16. "
        f"Compute: ≥ {_us(std.compute_s)}. "
        f"<span style='color:{COLOR_STANDARD}'>Standard: {_decimal(std.nbytes)} moved, "
        f"{std.intensity:,.1f} FLOP/byte, ≥ {_us(std.lower_bound_s)} ({std.bound}-bound)</span>; "
        f"<span style='color:{COLOR_FLASH}'>FlashAttention: {_decimal(fl.nbytes)}, "
        f"{fl.intensity:,.1f} FLOP/byte, ≥ {_us(fl.lower_bound_s)} ({fl.bound}-bound)</span>. "
        f"Traffic ratio {st.bounds.traffic_ratio:.2f}x, ridge point {st.ridge:.0f} FLOP/byte. "
        f"K and V of one head ({_size(st.kv_bytes)}) {fits} in the "
        f"{st.hw.l2_bytes / MiB:g} MiB L2.<br>"
        f"<b>Kept for the backward pass</b>: standard keeps P, N² × 2 B = {_size(bw.p_bytes)}; "
        f"FlashAttention keeps O ({_size(bw.o_bytes)}) and N fp32 lse values "
        f"({_size(bw.lse_bytes)}): {_size(bw.flash_bytes)}, "
        f"{bw.standard_bytes / bw.flash_bytes:,.0f} times less."
    )


def roofline_figure(
    hw: Hardware | str = H100_SXM, N: int = 16384, d: int = 64, Br: int = 128, l2: bool = False
):
    """The roofline chart as a LiveFigure (display it as the last expression of a cell).

    Args:
        hw: the starting hardware (H100_SXM, H200 or A100, or its name).
        N: starting sequence length, a power of two in 256 .. 131,072.
        d: head dimension, one of D_VALUES.  Br: query tile rows, one of BR_VALUES.
        l2: start with "L2 serves re-reads" on.
    """
    import ipywidgets as w

    from course_utils.widgets._base import LiveFigure

    hw = _hardware(hw)
    if hw.name not in HARDWARE:
        raise ValueError(f"hw must be one of {', '.join(HARDWARE)}, got {hw.name!r}")
    for name, value, allowed in (("N", N, N_VALUES), ("d", d, D_VALUES), ("Br", Br, BR_VALUES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    controls = {
        "N": w.SelectionSlider(options=[(f"{n:,}", n) for n in N_VALUES], value=N, description="N"),
        "Br": w.SelectionSlider(options=list(BR_VALUES), value=Br, description="Br"),
        "l2": w.Checkbox(value=bool(l2), description="L2 serves re-reads"),
        "hw": w.Dropdown(options=list(HARDWARE), value=hw.name, description="hardware"),
        "d": w.Dropdown(options=list(D_VALUES), value=d, description="d"),
    }

    def state_of(state) -> RooflineState:
        return roofline_state(state["N"], state["d"], state["Br"], state["hw"], state["l2"])

    return LiveFigure(
        controls,
        lambda fig, state: draw_roofline(fig, state_of(state)),
        figsize=(11, 4.3),
        readout=lambda state: readout(state_of(state)),
    )
