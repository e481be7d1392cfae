"""The SM-fill chart: how many SMs a decode step keeps busy, with and without split-KV.

At decode each sequence has one query, so FlashAttention-2's grid has one thread block per
(sequence, head); split-KV gives each of the k chunks of a KV cache its own block:

    blocks = batch * heads * splits,   busy SMs = min(blocks, num_sms),
    waves = ceil(blocks / num_sms).

The time model: decode attention is memory-bound, and each busy SM pulls an equal share of the
HBM bandwidth, so streaming the KV cache takes

    t_attention = kv_bytes / (bandwidth * busy / num_sms),

and split-KV adds a merge kernel: a fixed cost of a few microseconds (a launch and a sync) plus
writing and reading the fp32 partials. The model leaves out the partly filled last wave, the
latency of a single block and the L2 cache; it is a picture of why, not a benchmark. The equal
share understates what one SM with enough loads in flight can pull, so the model overstates the
time without splitting: its speed-up is an upper estimate.

The figure only draws: the model is references.sm_fill (sm_fill_state, the tests check it).
"""

from __future__ import annotations

import math

import numpy as np

from course_utils.harness.hardware import H100_SXM
from course_utils.references.sm_fill import MAX_SPLITS, SmFillState, sm_fill_state, time_vs_splits

COLOR_BUSY = "#ff7f0e"  # orange: the SM streams the KV cache
COLOR_IDLE = "#8e44ad"  # violet: the SM has no block in the first wave
COLOR_MERGE = "#2ca02c"

KV_LENGTHS = tuple(2**p for p in range(7, 18))  # 128 ... 131,072 tokens


def _grid_shape(num_sms: int) -> tuple[int, int]:
    cols = math.ceil(math.sqrt(num_sms))
    return math.ceil(num_sms / cols), cols


def _fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def draw_sm_fill(fig, st: SmFillState) -> None:
    """Left: one square per SM (orange busy, violet idle in the first wave). Right: time vs k."""
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax_grid, ax_time = fig.subplots(1, 2, width_ratios=[1, 1.25])
    rows, cols = _grid_shape(st.num_sms)
    for i in range(st.num_sms):
        r, c = divmod(i, cols)
        color = COLOR_BUSY if st.sm_busy[i] else COLOR_IDLE
        ax_grid.add_patch(Rectangle((c, rows - 1 - r), 0.9, 0.9, color=color, linewidth=0))
        if st.waves > 1 and st.num_sms <= 200:
            ax_grid.text(
                c + 0.45,
                rows - 1 - r + 0.45,
                str(st.blocks_per_sm[i]),
                ha="center",
                va="center",
                fontsize=8 if st.blocks_per_sm[i] < 1000 else 6.5,
                color="white",
                fontweight="bold",
            )
    ax_grid.set_xlim(-0.1, cols)
    ax_grid.set_ylim(-0.1, rows)
    ax_grid.set_aspect("equal")
    ax_grid.axis("off")
    ax_grid.set_title(
        f"{st.batch} x {st.heads} x {st.splits} = {st.blocks} blocks: "
        f"{st.busy_sms} of {st.num_sms} SMs busy, {st.waves} wave{'s' if st.waves > 1 else ''}",
        fontsize=9,
    )
    ax_grid.legend(
        handles=[
            Patch(color=COLOR_BUSY, label="streams the KV cache"),
            Patch(color=COLOR_IDLE, label="idle"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=2,
        fontsize=8,
        frameon=False,
    )

    kw = {"d": st.d, "num_sms": st.num_sms}
    ks, attn, total = time_vs_splits(st.batch, st.heads, st.kv_len, **kw)
    ax_time.plot(ks, total * 1e6, color="black", label="attention + merge")
    ax_time.plot(ks, attn * 1e6, color=COLOR_BUSY, linestyle="--", label="attention only")
    ax_time.axhline(
        st.full_bandwidth_s * 1e6,
        color="gray",
        linestyle=":",
        label="every SM streaming",
    )
    best = int(ks[np.argmin(total)])
    ax_time.plot([st.splits], [st.total_s * 1e6], "o", color="black", markersize=8)
    ax_time.set_xscale("log", base=2)
    # a log axis around the data: a flat curve (a large batch fills the GPU) sits mid-axis
    # instead of pinned to the top of an axis that starts at 0
    ax_time.set_yscale("log")
    low = float(min(total.min(), attn.min(), st.full_bandwidth_s)) * 1e6
    high = float(max(total.max(), attn.max())) * 1e6
    ax_time.set_ylim(low / 1.6, high * 1.6)
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    ax_time.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_time.yaxis.set_major_formatter(plain)
    ax_time.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    ax_time.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
    ax_time.set_xlabel("splits k")
    ax_time.set_ylabel("modelled time per decode step (µs)")
    ax_time.set_title(
        f"KV cache {st.kv_len:,} tokens, {_fmt_bytes(st.kv_bytes)}: "
        f"k = {st.splits} takes {_fmt_time(st.total_s)} (best k = {best})",
        fontsize=9,
    )
    ax_time.legend(  # below the axes: it never covers the curve or the current-k marker
        fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False
    )
    ax_time.grid(True, which="both", alpha=0.25)


def _readout(st: SmFillState) -> str:
    base = sm_fill_state(st.batch, st.heads, 1, st.kv_len, st.d, num_sms=st.num_sms)
    merge = (
        f" + merge {_fmt_time(st.merge_s)}" if st.splits > 1 else " (no merge kernel without split)"
    )
    return (
        f"blocks = {st.batch} x {st.heads} x {st.splits} = {st.blocks}; busy SMs in the first "
        f"wave: {st.busy_sms}/{st.num_sms}; waves: {st.waves}; each block streams "
        f"{st.keys_per_block:,} keys.<br>"
        f"KV cache {_fmt_bytes(st.kv_bytes)} at {st.bandwidth_share:.0%} of the bandwidth: "
        f"attention {_fmt_time(st.attention_s)}{merge} = <b>{_fmt_time(st.total_s)}</b>; "
        f"without split {_fmt_time(base.total_s)} "
        f"(speed-up {base.total_s / st.total_s:.2f}x; the model's upper estimate)"
    )


def sm_fill_figure(
    batch: int = 1,
    heads: int = 32,
    splits: int = 1,
    kv_len: int = 32_768,
    d: int = 128,
    num_sms: int = H100_SXM.num_sms,
):
    """The SM-fill chart as a LiveFigure (display it as the last expression of a cell).

    Sliders for batch, heads, splits and the KV length (powers of 2 from 128 to 131,072 tokens).
    """
    import ipywidgets as w

    from course_utils.widgets._base import LiveFigure

    sm_fill_state(batch, heads, splits, kv_len, d, num_sms=num_sms)  # validates the arguments
    if kv_len not in KV_LENGTHS:
        raise ValueError(f"kv_len must be one of {KV_LENGTHS}, got {kv_len}")
    style = {"description_width": "initial"}
    controls = {
        "batch": w.IntSlider(value=batch, min=1, max=max(64, batch), description="batch"),
        "heads": w.IntSlider(value=heads, min=1, max=max(64, heads), description="heads"),
        "splits": w.IntSlider(
            value=splits, min=1, max=max(MAX_SPLITS, splits), description="splits k"
        ),
        "kv_len": w.SelectionSlider(
            options=list(KV_LENGTHS), value=kv_len, description="KV length", style=style
        ),
    }

    def state_of(state) -> SmFillState:
        return sm_fill_state(
            state["batch"], state["heads"], state["splits"], state["kv_len"], d, num_sms=num_sms
        )

    return LiveFigure(
        controls,
        lambda fig, state: draw_sm_fill(fig, state_of(state)),
        figsize=(10, 4.2),
        readout=lambda state: _readout(state_of(state)),
    )
