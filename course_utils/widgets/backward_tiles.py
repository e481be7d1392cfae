"""The backward tile grid: the N x N score matrix as the FlashAttention-2 backward pass visits it.

One thread block owns a K/V tile (magenta column): K_j and V_j stay on chip with the accumulators
dK_j and dV_j, which are written to HBM once, when the column is done (green). The query tiles
Q_i (with dO_i, lse_i and D_i, yellow) stream down the column; at each step the block recomputes
the tile P_ij from lse_i (dark blue), uses it and discards it (light blue), and adds its share into
the rows dQ_i in HBM (orange): the atomic add. With causal on, tiles above the diagonal are skipped
(grey, hatched) and the tiles crossing it are masked (their hidden scores grey).

The figure only draws: what it draws comes from references.tiles (`backward_schedule`: the tiles
in visit order, `dq_adds`: how many times each dQ_i has been added to, `backward_counters` and
`backward_traffic`: HBM elements moved up to a step and in all).
"""

from __future__ import annotations

import numpy as np

from course_utils.references.tiles import (
    MASK,
    SKIP,
    _check_sizes,
    _n_tiles,
    _span,
    backward_counters,
    backward_schedule,
    backward_traffic,
    dq_adds,
    n_backward_steps,
    tile_kinds,
)
from course_utils.widgets._base import LiveFigure
from course_utils.widgets.tile_grid import (
    BLUE,
    GREEN,
    LIGHT_BLUE,
    MAGENTA,
    MASKED_GREY,
    ORANGE,
    SKIP_GREY,
    YELLOW,
    _hex,
    paint_tiles,
)

__all__ = ["backward_tiles_figure"]

LIGHT_GREEN = "#c8e6b5"


# ---- drawing -------------------------------------------------------------------------------
def _score_image(state: dict, N: int, Br: int, Bc: int) -> np.ndarray:
    """RGBA picture of the N x N score matrix at this step, one pixel per score."""
    img = np.ones((N, N, 4))
    rows, cols = np.arange(N)[:, None], np.arange(N)[None, :]
    hidden = (cols > rows) if state["causal"] else np.zeros((N, N), dtype=bool)
    paint_tiles(img, state["kinds"], state["schedule"][: state["step"]], N, Br, Bc, hidden)
    return img


def _describe_step(state: dict, N: int, Br: int, Bc: int) -> str:
    step, total = state["step"], state["n_steps"]
    if step == 0:
        return f"backward: step 0 of {total} (D = rowsum(dO * O) computed before the loops)"
    tile = state["schedule"][step - 1]
    r0, r1 = _span(tile.i, Br, N)
    c0, c1 = _span(tile.j, Bc, N)
    what = ", masked" if tile.kind == MASK and state["causal"] else ""
    return (
        f"backward, step {step} of {total}: thread block {tile.j} (keys {c0}-{c1 - 1}) "
        f"x query tile {tile.i} (rows {r0}-{r1 - 1}){what}"
    )


def draw_backward_tiles(fig, state: dict, N: int, d: int, Br: int, Bc: int) -> None:
    """Draw one state of the backward tile grid (see the module docstring)."""
    from matplotlib.patches import Patch, Rectangle

    causal, step, schedule = state["causal"], state["step"], state["schedule"]
    grid = fig.add_gridspec(1, 2, width_ratios=(2.3, 1.0))
    ax, axc = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    Tr, Tc = _n_tiles(N, Br), _n_tiles(N, Bc)
    w = max(2.0, 0.07 * N)  # width of the side strips
    gap = 0.4 * w

    ax.imshow(_score_image(state, N, Br, Bc), extent=(0, N, N, 0), interpolation="nearest")
    for i in range(1, Tr):
        ax.plot([0, N], [i * Br, i * Br], color="black", lw=0.6)
    for j in range(1, Tc):
        ax.plot([j * Bc, j * Bc], [0, N], color="black", lw=0.6)
    ax.add_patch(Rectangle((0, 0), N, N, fill=False, lw=1.2))
    for i, j in zip(*np.nonzero(state["kinds"] == SKIP), strict=True):
        r0, r1 = _span(i, Br, N)
        c0, c1 = _span(j, Bc, N)
        ax.add_patch(
            Rectangle((c0, r0), c1 - c0, r1 - r0, fill=False, hatch="//", lw=0.0, ec="#a8a8a8")
        )

    current = schedule[step - 1] if step else None
    columns_done = {t.j for t in schedule[:step]} - ({current.j} if current else set())
    if step == state["n_steps"] and current is not None:
        columns_done.add(current.j)
    if current is not None:  # the thread block's column: K_j, V_j stationary
        c0, c1 = _span(current.j, Bc, N)
        ax.add_patch(Rectangle((c0, 0), c1 - c0, N, fill=False, ec=MAGENTA, lw=2.0))

    adds = state["dq_adds"]
    most = max(1, int(adds.max()))
    for i in range(Tr):
        r0, r1 = _span(i, Br, N)
        active = current is not None and current.i == i
        ax.add_patch(Rectangle((-w - gap, r0), w, r1 - r0, ec="black", lw=0.6,
                               fc=YELLOW if active else "#f4f4f4"))  # fmt: skip
        shade = _hex(ORANGE) * (adds[i] / most) + np.array([0.96, 0.96, 0.96, 1.0]) * (
            1 - adds[i] / most
        )
        shade[3] = 1.0
        ax.add_patch(Rectangle((N + gap, r0), w, r1 - r0, ec="black",
                               lw=1.8 if active else 0.6, fc=shade))  # fmt: skip
        if adds[i] and r1 - r0 >= 0.05 * N:
            ax.text(N + gap + w / 2, (r0 + r1) / 2, str(adds[i]), ha="center", va="center",
                    fontsize=7)  # fmt: skip
    for j in range(Tc):
        c0, c1 = _span(j, Bc, N)
        on_chip = current is not None and current.j == j and j not in columns_done
        ax.add_patch(Rectangle((c0, -w - gap), c1 - c0, w, ec="black", lw=0.6,
                               fc=MAGENTA if current is not None and current.j == j
                               else "#f4f4f4"))  # fmt: skip
        fc = GREEN if j in columns_done else (LIGHT_GREEN if on_chip else "#f4f4f4")
        ax.add_patch(Rectangle((c0, N + gap), c1 - c0, w, ec="black", lw=0.6, fc=fc))
    ax.text(-gap - w / 2, -gap - w / 2, "Q, dO", ha="right", va="center", fontsize=9)
    ax.text(N + gap + w / 2, -gap - w / 2, "dQ", ha="center", va="center", fontsize=10)
    ax.text(N / 2, -2 * gap - w, "K, V tiles (keys)", ha="center", va="bottom", fontsize=9)
    ax.text(-gap, N + gap + w / 2, "dK, dV", ha="right", va="center", fontsize=9)
    ax.set_xlim(-w - 3 * gap, N + w + 1.5 * gap)
    ax.set_ylim(N + w + 2 * gap, -w - 4 * gap)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(_describe_step(state, N, Br, Bc), fontsize=9, x=0.01, ha="left")
    handles = [
        Patch(fc=MAGENTA, ec="black", label="K/V tile, on chip"),
        Patch(fc=YELLOW, ec="black", label="Q, dO tile, streamed"),
        Patch(fc=BLUE, label="P tile recomputed"),
        Patch(fc=LIGHT_BLUE, label="recomputed, discarded"),
        Patch(fc=ORANGE, ec="black", label="dQ rows: atomic adds"),
        Patch(fc=LIGHT_GREEN, ec="black", label="dK, dV on chip"),
        Patch(fc=GREEN, ec="black", label="dK, dV written"),
    ]
    if causal:
        handles += [
            Patch(fc=SKIP_GREY, hatch="//", ec="#a8a8a8", label="skipped"),
            Patch(fc=MASKED_GREY, label="masked score"),
        ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3,
              fontsize=7.5, frameon=False)  # fmt: skip

    count, total = state["count"], state["total"]
    axc.barh([1], [count.reads], color=BLUE, alpha=0.55, label="read")
    axc.barh([1], [count.writes], left=[count.reads], color=BLUE, label="written")
    axc.barh([0], [total], color="none", ec=BLUE, lw=1.5, hatch="..")
    for y, value in ((1, count.total), (0, total)):
        axc.text(value + 0.02 * total, y, f"{value:,}", va="center", fontsize=8)
    axc.set_yticks([1, 0])
    axc.set_yticklabels(["so far", "at the end"])
    axc.tick_params(labelsize=8)
    axc.set_xlim(0, 1.45 * total)
    axc.set_xticks([])
    axc.set_title(f"HBM elements (N={N}, d={d})", fontsize=9)
    axc.legend(fontsize=7, loc="upper right", frameon=False)
    for side in ("top", "right"):
        axc.spines[side].set_visible(False)


def _full_state(controls: dict, N: int, d: int, Br: int, Bc: int) -> dict:
    causal = bool(controls["causal"])
    schedule = backward_schedule(N, Br, Bc, causal)
    step = int(min(max(controls["step"], 0), len(schedule)))
    return {
        "causal": causal,
        "step": step,
        "n_steps": len(schedule),
        "schedule": schedule,
        "kinds": tile_kinds(N, Br, Bc, causal),
        "dq_adds": dq_adds(step, N, Br, Bc, causal),
        "count": backward_counters(step, N, d, Br, Bc, causal),
        "total": backward_traffic(N, d, Br, Bc, causal),
    }


def _readout(state: dict, N: int, Br: int, Bc: int) -> str:
    count, adds = state["count"], state["dq_adds"]
    return "<br>".join(
        [
            f"<b>step {state['step']} of {state['n_steps']}</b>: read {count.reads:,}, written "
            f"{count.writes:,} elements so far; the whole backward moves {state['total']:,}.",
            f"P tiles recomputed: {state['step']} of {state['n_steps']}; atomic adds into dQ so "
            f"far: {int(adds.sum())} (per query tile: {', '.join(str(a) for a in adds)}).",
        ]
    )


def backward_tiles_figure(
    N: int = 128,
    Br: int = 16,
    Bc: int = 16,
    d: int = 8,
    causal: bool = False,
    step: int | None = None,
) -> LiveFigure:
    """The backward tile grid: Step / Play through the FlashAttention-2 backward pass.

    Args:
        N: sequence length (queries = keys), at most 1024.
        Br, Bc: query and key tile sizes; at most 64 tiles per side.
        d: head dimension (only the HBM counters use it).
        causal, step: the starting state (default: in the second column).

    Returns:
        A LiveFigure; display it as the last expression of a cell.
    """
    import ipywidgets as w

    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d)
    if N > 1024 or _n_tiles(N, Br) > 64 or _n_tiles(N, Bc) > 64:
        raise ValueError(
            f"keep N <= 1024 and at most 64 tiles per side, got N={N}, Br={Br}, Bc={Bc}"
        )
    total = n_backward_steps(N, Br, Bc, causal)
    if step is None:
        step = min(total, _n_tiles(N, Br) + _n_tiles(N, Br) // 2 + 1)
    causal_w = w.Checkbox(value=bool(causal), description="causal", indent=False)
    step_w = w.IntSlider(value=int(min(max(step, 0), total)), min=0, max=total, description="step")
    play = w.Play(value=step_w.value, min=0, max=total, interval=400, description="Play")
    w.jslink((play, "value"), (step_w, "value"))

    def advance(state):
        step_w.value = 0 if step_w.value >= step_w.max else step_w.value + 1
        return None  # the slider change redraws

    live = LiveFigure(
        {"causal": causal_w, "step": step_w},
        lambda fig, s: draw_backward_tiles(fig, _full_state(s, N, d, Br, Bc), N, d, Br, Bc),
        figsize=(10, 5.6),
        buttons={"Step": advance},
        play=play,
        readout=lambda s: _readout(_full_state(s, N, d, Br, Bc), N, Br, Bc),
    )

    def resize(_change):  # the mask changes the number of steps
        new_total = n_backward_steps(N, Br, Bc, causal_w.value)
        step_w.max = play.max = new_total
        step_w.value = min(step_w.value, new_total)

    causal_w.observe(resize, names="value")
    return live
