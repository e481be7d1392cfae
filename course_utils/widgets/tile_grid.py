"""The tile grid: the N x N score matrix cut into Br x Bc tiles, as a FlashAttention kernel sees it.

FlashAttention mode: one thread block keeps its query tile Q_i on chip (yellow) while the K/V tile
(magenta) moves along its row of tiles; each score tile it computes (blue) lives on chip only and
is thrown away after the online update. When the row is done the block writes O_i (green).
Standard mode: three kernels, one row stripe at a time; S and then P are written to HBM whole
(orange), and read back. The bars on the right count the HBM elements read and written so far.
With causal on, tiles above the diagonal are skipped (grey, hatched: not even loaded), tiles that
cross the diagonal are computed with the mask (their hidden scores grey), the others in full.

The figure only draws: what it draws comes from references.tiles (`tile_kinds`: skip / mask / full
for every tile, `tile_schedule`: the tiles a thread block visits, in order, `hbm_counters` and
`flash_traffic`: the HBM elements moved up to a step and in all) and references.memory
(`standard_attention_traffic`).
"""

from __future__ import annotations

import numpy as np

from course_utils.references.memory import standard_attention_traffic
from course_utils.references.tiles import (
    FULL,
    MASK,
    SKIP,
    _check_mode,
    _check_sizes,
    _n_tiles,
    _span,
    flash_traffic,
    hbm_counters,
    n_steps,
    tile_kinds,
    tile_schedule,
)
from course_utils.widgets._base import LiveFigure

MAGENTA, BLUE, YELLOW, GREEN = "#d6249f", "#3b75af", "#ffd23f", "#6ab04c"
ORANGE, DARK_ORANGE = "#f5a55a", "#e06c1f"
SKIP_GREY, MASKED_GREY = "#ececec", "#9e9e9e"
LIGHT_BLUE = "#b9d3ee"


# ---- drawing -------------------------------------------------------------------------------
def _hex(color: str) -> np.ndarray:
    color = color.lstrip("#")
    return np.array([int(color[k : k + 2], 16) / 255 for k in (0, 2, 4)] + [1.0])


def _describe_step(state: dict, N, Br, Bc) -> str:
    mode, step, total = state["mode"], state["step"], state["n_steps"]
    if step == 0:
        return f"{'FlashAttention' if mode == 'flash' else 'standard'}: step 0 of {total}"
    if mode == "flash":
        tile = state["schedule"][step - 1]
        r0, r1 = _span(tile.i, Br, N)
        c0, c1 = _span(tile.j, Bc, N)
        what = {MASK: ", masked", FULL: "", SKIP: ""}[tile.kind] if state["causal"] else ""
        return (
            f"FlashAttention, step {step} of {total}: thread block {tile.i} (rows {r0}-{r1 - 1}) "
            f"x K/V tile {tile.j} (keys {c0}-{c1 - 1}){what}"
        )
    kernel, i = divmod(step - 1, _n_tiles(N, Br))
    r0, r1 = _span(i, Br, N)
    name = ("S = tau Q K^T -> HBM", "P = softmax(S) -> HBM", "O = P V")[kernel]
    return f"standard, step {step} of {total}: kernel {kernel + 1} ({name}), rows {r0}-{r1 - 1}"


def paint_tiles(img, kinds, done, N: int, Br: int, Bc: int, hidden) -> None:
    """Paint skipped tiles grey and the tiles visited so far (`done`) blue, the last one darker.

    Scores hidden by the causal mask inside a computed tile are painted dark grey. img: (N, N, 4)
    RGBA, kinds: (T_r, T_c) tile kinds, hidden: (N, N) bool. Shared by the backward tile grid.
    """
    for i, j in zip(*np.nonzero(kinds == SKIP), strict=True):
        r0, r1 = _span(i, Br, N)
        c0, c1 = _span(j, Bc, N)
        img[r0:r1, c0:c1] = _hex(SKIP_GREY)
    computed = np.zeros((N, N), dtype=bool)
    for t, tile in enumerate(done):
        r0, r1 = _span(tile.i, Br, N)
        c0, c1 = _span(tile.j, Bc, N)
        img[r0:r1, c0:c1] = _hex(BLUE if t == len(done) - 1 else LIGHT_BLUE)
        computed[r0:r1, c0:c1] = True
    img[hidden & computed] = _hex(MASKED_GREY)  # scores set to -inf inside computed tiles


def _score_image(state: dict, N: int, Br: int, Bc: int) -> np.ndarray:
    """RGBA picture of the N x N score matrix at this step, one pixel per score."""
    img = np.ones((N, N, 4))
    causal, step = state["causal"], state["step"]
    rows, cols = np.arange(N)[:, None], np.arange(N)[None, :]
    hidden = (cols > rows) if causal else np.zeros((N, N), dtype=bool)
    if state["mode"] == "flash":
        paint_tiles(img, state["kinds"], state["schedule"][:step], N, Br, Bc, hidden)
    else:
        stripes = _n_tiles(N, Br)
        for s in range(step):
            kernel, i = divmod(s, stripes)
            r0, r1 = _span(i, Br, N)
            img[r0:r1] = _hex(ORANGE if kernel == 0 else DARK_ORANGE)
        if causal:  # the -inf scores are written too: a lighter shade of the same colour
            written = img[..., 0] < 1
            img[hidden & written] = _lighter(img[hidden & written])
    return img


def _lighter(rgba: np.ndarray) -> np.ndarray:
    """The shade of a colour that marks -inf scores written anyway (picture and legend agree)."""
    return 0.55 * rgba + 0.45


def draw_tile_grid(fig, state: dict, N: int, d: int, Br: int, Bc: int) -> None:
    """Draw one state of the tile grid (see the module docstring) on a matplotlib Figure."""
    from matplotlib.patches import Patch, Rectangle

    mode, causal, step = state["mode"], state["causal"], state["step"]
    grid = fig.add_gridspec(1, 2, width_ratios=(2.3, 1.0))
    ax, axc = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    Tr, Tc = _n_tiles(N, Br), _n_tiles(N, Bc)
    w = max(2.0, 0.07 * N)  # width of the Q, K/V and O strips
    gap = 0.4 * w

    ax.imshow(_score_image(state, N, Br, Bc), extent=(0, N, N, 0), interpolation="nearest")
    for i in range(1, Tr):
        ax.plot([0, N], [i * Br, i * Br], color="black", lw=0.6)
    for j in range(1, Tc):
        ax.plot([j * Bc, j * Bc], [0, N], color="black", lw=0.6)
    ax.add_patch(Rectangle((0, 0), N, N, fill=False, lw=1.2))
    if mode == "flash" and causal:
        kinds = state["kinds"]
        for i, j in zip(*np.nonzero(kinds == SKIP), strict=True):
            r0, r1 = _span(i, Br, N)
            c0, c1 = _span(j, Bc, N)
            ax.add_patch(
                Rectangle((c0, r0), c1 - c0, r1 - r0, fill=False, hatch="//", lw=0.0, ec="#a8a8a8")
            )

    # which Q rows, K/V tiles and O rows are active or done at this step
    q_active, kv_active, o_done = set(), set(), set()
    if mode == "flash" and step:
        tile = state["schedule"][step - 1]
        q_active, kv_active = {tile.i}, {tile.j}
        o_done = {t.i for t in state["schedule"][:step]} - {tile.i}
        if step == state["n_steps"]:
            o_done.add(tile.i)
    elif mode == "standard" and step:
        kernel, i = divmod(step - 1, Tr)
        if kernel == 0:
            q_active, kv_active = {i}, set(range(Tc))
        elif kernel == 2:
            kv_active = set(range(Tc))
            o_done = set(range(i + 1))
    for i in range(Tr):
        r0, r1 = _span(i, Br, N)
        ax.add_patch(Rectangle((-w - gap, r0), w, r1 - r0, ec="black", lw=0.6,
                               fc=YELLOW if i in q_active else "#f4f4f4"))  # fmt: skip
        ax.add_patch(Rectangle((N + gap, r0), w, r1 - r0, ec="black", lw=0.6,
                               fc=GREEN if i in o_done else "#f4f4f4"))  # fmt: skip
    for j in range(Tc):
        c0, c1 = _span(j, Bc, N)
        ax.add_patch(Rectangle((c0, -w - gap), c1 - c0, w, ec="black", lw=0.6,
                               fc=MAGENTA if j in kv_active else "#f4f4f4"))  # fmt: skip
    ax.text(-gap - w / 2, -gap - w / 2, "Q", ha="center", va="center", fontsize=11)
    ax.text(N + gap + w / 2, -gap - w / 2, "O", ha="center", va="center", fontsize=11)
    ax.text(N / 2, -2 * gap - w, "K, V tiles (keys)", ha="center", va="bottom", fontsize=9)
    ax.set_xlim(-w - 1.5 * gap, N + w + 1.5 * gap)
    ax.set_ylim(N + gap, -w - 4 * gap)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(_describe_step(state, N, Br, Bc), fontsize=9, x=0.01, ha="left")
    if mode == "flash":
        handles = [
            Patch(fc=YELLOW, ec="black", label="Q tile, on chip"),
            Patch(fc=MAGENTA, ec="black", label="K/V tile, on chip"),
            Patch(fc=BLUE, label="score tile, on chip only"),
            Patch(fc=LIGHT_BLUE, label="computed, discarded"),
            Patch(fc=GREEN, ec="black", label="O rows written"),
        ]
        if causal:
            handles += [
                Patch(fc=SKIP_GREY, hatch="//", ec="#a8a8a8", label="skipped (not loaded)"),
                Patch(fc=MASKED_GREY, label="masked score (-inf)"),
            ]
    else:
        handles = [
            Patch(fc=ORANGE, label="S written to HBM"),
            Patch(fc=DARK_ORANGE, label="P written to HBM"),
            Patch(fc=GREEN, ec="black", label="O rows written"),
        ]
        if causal:  # the same shades as the picture, one per kernel that wrote them
            handles += [
                Patch(fc=tuple(_lighter(_hex(ORANGE))), label="-inf scores of S, written anyway"),
                Patch(fc=tuple(_lighter(_hex(DARK_ORANGE))), label="0s of P, written anyway"),
            ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3,
              fontsize=7.5, frameon=False)  # fmt: skip

    # the HBM counters
    count = state["count"]
    std, fl = state["standard_total"], state["flash_total"]
    color = BLUE if mode == "flash" else DARK_ORANGE
    axc.barh([2], [count.reads], color=color, alpha=0.55, label="read")
    axc.barh([2], [count.writes], left=[count.reads], color=color, label="written")
    axc.barh([1], [fl], color="none", ec=BLUE, lw=1.5, hatch="..")
    axc.barh([0], [std], color="none", ec=DARK_ORANGE, lw=1.5, hatch="..")
    for y, value in ((2, count.total), (1, fl), (0, std)):
        axc.text(value + 0.02 * std, y, f"{value:,}", va="center", fontsize=8)
    axc.set_yticks([2, 1, 0])
    axc.set_yticklabels(["this run\nso far", "FlashAttn\nat the end", "standard\nat the end"])
    axc.tick_params(labelsize=8)
    axc.set_xlim(0, 1.45 * std)
    axc.set_xticks([])
    axc.set_title(f"HBM elements (N={N}, d={d})", fontsize=9)
    axc.legend(fontsize=7, loc="upper right", frameon=False)
    for side in ("top", "right"):
        axc.spines[side].set_visible(False)


def _full_state(controls: dict, N: int, d: int, Br: int, Bc: int) -> dict:
    """The widget values plus everything derived from them that the drawing needs."""
    mode, causal = controls["mode"], bool(controls["causal"])
    total = n_steps(N, Br, Bc, causal, mode)
    step = int(min(max(controls["step"], 0), total))
    return {
        "mode": mode,
        "causal": causal,
        "step": step,
        "n_steps": total,
        "kinds": tile_kinds(N, Br, Bc, causal),
        "schedule": tile_schedule(N, Br, Bc, causal),
        "count": hbm_counters(step, N, d, Br, Bc, causal, mode),
        "standard_total": standard_attention_traffic(N, d),
        "flash_total": flash_traffic(N, d, Br, Bc, causal),
    }


def _readout(state: dict, N: int, d: int, Br: int, Bc: int) -> str:
    count = state["count"]
    kinds = state["kinds"]
    computed = int((kinds != SKIP).sum())
    lines = [
        f"<b>step {state['step']} of {state['n_steps']}</b>: read {count.reads:,}, "
        f"written {count.writes:,} elements so far.",
        f"At the end: standard 4N&sup2; + 4Nd = {state['standard_total']:,}; FlashAttention "
        f"{state['flash_total']:,} (ratio {state['standard_total'] / state['flash_total']:.2f}; "
        f"2Br/d = {2 * Br / d:.2f}). FlashAttention also writes N = {N} lse values.",
    ]
    if state["mode"] == "flash":
        done = min(state["step"], len(state["schedule"]))
        line = f"Score tiles computed so far: {done} of the {computed} this pass computes"
        if state["causal"]:
            line += (
                f" ({int((kinds == MASK).sum())} of them with the mask; "
                f"{int((kinds == SKIP).sum())} of all {kinds.size} tiles skipped)"
            )
        lines.append(line + ".")
    else:
        lines.append(
            f"Standard attention computes and writes all {N * N:,} scores, "
            + ("the masked ones too (no tile is skipped)." if state["causal"] else "tile or not.")
        )
    return "<br>".join(lines)


def tile_grid_figure(
    N: int = 128,
    Br: int = 16,
    Bc: int = 16,
    d: int = 8,
    causal: bool = False,
    mode: str = "flash",
    step: int | None = None,
) -> LiveFigure:
    """The tile grid figure: Step / Play through a FlashAttention or a standard forward pass.

    Args:
        N: sequence length (queries = keys), at most 1024.
        Br, Bc: tile rows (queries per thread block) and columns (keys per K/V tile); at most 64
            tiles per side.
        d: head dimension (only the HBM counters use it).
        causal, mode ("flash" or "standard"), step: the starting state (default: mid-way).

    Returns:
        A LiveFigure; display it as the last expression of a cell.
    """
    import ipywidgets as w

    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d)
    _check_mode(mode)
    if N > 1024 or _n_tiles(N, Br) > 64 or _n_tiles(N, Bc) > 64:
        raise ValueError(
            f"keep N <= 1024 and at most 64 tiles per side, got N={N}, Br={Br}, Bc={Bc}"
        )
    total = n_steps(N, Br, Bc, causal, mode)
    if step is None:
        step = min(total, 2 * _n_tiles(N, Bc) + _n_tiles(N, Bc) // 2 + 1)
    mode_w = w.ToggleButtons(options=[("FlashAttention", "flash"), ("standard", "standard")],
                             value=mode, description="mode")  # fmt: skip
    causal_w = w.Checkbox(value=bool(causal), description="causal", indent=False)
    step_w = w.IntSlider(value=int(min(max(step, 0), total)), min=0, max=total, description="step")
    play = w.Play(value=step_w.value, min=0, max=total, interval=400, description="Play")
    w.jslink((play, "value"), (step_w, "value"))

    def advance(state):
        step_w.value = 0 if step_w.value >= step_w.max else step_w.value + 1
        return None  # the slider change redraws

    live = LiveFigure(
        {"mode": mode_w, "causal": causal_w, "step": step_w},
        lambda fig, s: draw_tile_grid(fig, _full_state(s, N, d, Br, Bc), N, d, Br, Bc),
        figsize=(10, 5.4),
        buttons={"Step": advance},
        play=play,
        readout=lambda s: _readout(_full_state(s, N, d, Br, Bc), N, d, Br, Bc),
    )

    def resize(_change):  # a new mode or mask has another number of steps
        new_total = n_steps(N, Br, Bc, causal_w.value, mode_w.value)
        step_w.max = play.max = new_total
        step_w.value = min(step_w.value, new_total)

    mode_w.observe(resize, names="value")
    causal_w.observe(resize, names="value")
    return live
