"""The tile grid: the N x N score matrix cut into Br x Bc tiles, as a FlashAttention kernel sees it.

FlashAttention mode: one thread block keeps its query tile Q_i on chip (yellow) while the K/V tile
(magenta) moves along its row of tiles; each score tile it computes (blue) lives on chip only and
is thrown away after the online update. When the row is done the block writes O_i (green).
Standard mode: three kernels, one row stripe at a time; S and then P are written to HBM whole
(orange), and read back. The bars on the right count the HBM elements read and written so far.
With causal on, tiles above the diagonal are skipped (grey, hatched: not even loaded), tiles that
cross the diagonal are computed with the mask (their hidden scores grey), the others in full.

Everything drawn comes from pure functions the tests check: `tile_kinds` (skip / mask / full for
every tile), `tile_schedule` (the tiles a thread block visits, in order), `step_traffic` and
`hbm_counters` (the HBM elements moved by each step and up to a step).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from course_utils._validate import positive_int
from course_utils.widgets._base import LiveFigure

SKIP, MASK, FULL = 0, 1, 2  # the three kinds of score tile under a causal mask
KIND_NAMES = {SKIP: "skip", MASK: "mask", FULL: "full"}
MODES = ("flash", "standard")

MAGENTA, BLUE, YELLOW, GREEN = "#d6249f", "#3b75af", "#ffd23f", "#6ab04c"
ORANGE, DARK_ORANGE = "#f5a55a", "#e06c1f"
SKIP_GREY, MASKED_GREY = "#ececec", "#9e9e9e"
LIGHT_BLUE = "#b9d3ee"


class Tile(NamedTuple):
    """One score tile: rows [i * Br, ...) and columns [j * Bc, ...) of S, and its kind."""

    i: int  # query-tile index (the thread block)
    j: int  # key/value-tile index
    kind: int  # SKIP, MASK or FULL


class HBMCount(NamedTuple):
    """HBM elements moved so far."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def _n_tiles(n: int, b: int) -> int:
    return -(-n // b)


def _span(t: int, b: int, n: int) -> tuple[int, int]:
    """Rows (or columns) [start, stop) of tile t with tile size b, clipped to n."""
    return t * b, min(n, (t + 1) * b)


def _size(t: int, b: int, n: int) -> int:
    """How many rows (or columns) tile t has: b, or fewer for a ragged last tile."""
    start, stop = _span(t, b, n)
    return stop - start


def tile_kind(r0: int, r1: int, c0: int, c1: int, causal: bool) -> int:
    """The kind of the score tile with query rows [r0, r1) and key columns [c0, c1).

    Under a causal mask query r sees key c only if c <= r. So the tile is skipped when its first
    key comes after its last query (c0 > r1 - 1), computed in full when its last key comes at or
    before its first query (c1 - 1 <= r0), and computed with the mask otherwise.
    """
    if not causal:
        return FULL
    if c0 > r1 - 1:
        return SKIP
    if c1 - 1 <= r0:
        return FULL
    return MASK


def _check_sizes(N, Br, Bc, d=None, Nk=None, causal=False):
    N, Br, Bc = positive_int(N, "N"), positive_int(Br, "Br"), positive_int(Bc, "Bc")
    Nk = N if Nk is None else positive_int(Nk, "Nk")
    if causal and Nk != N:
        raise ValueError(f"causal needs as many keys as queries, got N = {N}, Nk = {Nk}")
    if d is not None:
        d = positive_int(d, "d")
    return N, Br, Bc, d, Nk


def tile_kinds(N: int, Br: int, Bc: int, causal: bool = True, Nk: int | None = None) -> np.ndarray:
    """The kind (SKIP = 0, MASK = 1, FULL = 2) of every tile of the N x Nk score matrix.

    Args:
        N: query rows.  Br, Bc: tile rows and columns (any positive ints; the last tile of each
            side may be shorter).  causal: query r sees keys 0..r.  Nk: key columns (default N).

    Returns:
        An int array of shape (ceil(N / Br), ceil(Nk / Bc)); without causal every tile is FULL.
    """
    N, Br, Bc, _, Nk = _check_sizes(N, Br, Bc, Nk=Nk, causal=causal)
    kinds = np.empty((_n_tiles(N, Br), _n_tiles(Nk, Bc)), dtype=int)
    for i in range(kinds.shape[0]):
        r0, r1 = _span(i, Br, N)
        for j in range(kinds.shape[1]):
            c0, c1 = _span(j, Bc, Nk)
            kinds[i, j] = tile_kind(r0, r1, c0, c1, causal)
    return kinds


def tile_schedule(
    N: int, Br: int, Bc: int, causal: bool = False, Nk: int | None = None
) -> list[Tile]:
    """The score tiles a FlashAttention-2 forward computes, in visit order.

    Query tile i is one thread block; it visits the key/value tiles j = 0, 1, ... of its row and
    stops at the last one that is not skipped. Skipped tiles are not in the list.
    """
    kinds = tile_kinds(N, Br, Bc, causal, Nk)
    return [
        Tile(i, j, int(kinds[i, j]))
        for i in range(kinds.shape[0])
        for j in range(kinds.shape[1])
        if kinds[i, j] != SKIP
    ]


def n_steps(N: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash") -> int:
    """Steps of the animation: one per computed tile (flash), one per kernel and row stripe."""
    _check_mode(mode)
    if mode == "flash":
        return len(tile_schedule(N, Br, Bc, causal))
    return 3 * _n_tiles(positive_int(N, "N"), positive_int(Br, "Br"))


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def step_traffic(
    N: int, d: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash"
) -> tuple[np.ndarray, np.ndarray]:
    """HBM elements read and written by each step of the animation.

    flash (one step per computed tile (i, j), FA2 order): read K_j and V_j (2 Bc d); the first
    tile of a row also reads Q_i (Br d); the last one writes O_i (Br d). The Br logsumexp values
    written with O_i are left out, as in the traffic formula 2Nd + 2N^2 d / Br.
    standard (three kernels, one step per row stripe of Br queries): S = tau Q K^T reads Q_i and
    writes S_i (Br N), reading K (Nd) on its first stripe; P = softmax(S) reads S_i, writes P_i;
    O = P V reads P_i and writes O_i, reading V on its first stripe. A causal mask changes nothing
    here: the masked scores are written as -inf like the others. Total 4N^2 + 4Nd.

    Returns:
        (reads, writes): int arrays of shape (n_steps,).
    """
    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d, causal=causal)
    _check_mode(mode)
    reads, writes = [], []
    if mode == "flash":
        schedule = tile_schedule(N, Br, Bc, causal)
        for t, tile in enumerate(schedule):
            r = _size(tile.i, Br, N)
            c = _size(tile.j, Bc, N)
            first = t == 0 or schedule[t - 1].i != tile.i
            last = t == len(schedule) - 1 or schedule[t + 1].i != tile.i
            reads.append(2 * c * d + (r * d if first else 0))
            writes.append(r * d if last else 0)
    else:
        for kernel in range(3):
            for i in range(_n_tiles(N, Br)):
                r = _size(i, Br, N)
                once = N * d if i == 0 else 0  # K (kernel 1) or V (kernel 3), read once
                if kernel == 0:
                    reads.append(r * d + once)
                    writes.append(r * N)
                elif kernel == 1:
                    reads.append(r * N)
                    writes.append(r * N)
                else:
                    reads.append(r * N + once)
                    writes.append(r * d)
    return np.array(reads, dtype=np.int64), np.array(writes, dtype=np.int64)


def hbm_counters(
    step: int, N: int, d: int, Br: int, Bc: int, causal: bool = False, mode: str = "flash"
) -> HBMCount:
    """HBM elements read and written after the first `step` steps (clipped to 0..n_steps)."""
    reads, writes = step_traffic(N, d, Br, Bc, causal, mode)
    step = int(min(max(step, 0), len(reads)))
    return HBMCount(int(reads[:step].sum()), int(writes[:step].sum()))


def standard_traffic(N: int, d: int) -> int:
    """HBM elements of standard attention, causal or not: 4N^2 + 4Nd."""
    return 4 * N * N + 4 * N * d


def flash_traffic(N: int, d: int, Br: int, Bc: int, causal: bool = False) -> int:
    """HBM elements of the FA2 forward: 2Nd + (K and V rows loaded) * 2d.

    Without causal every query tile loads all of K and V: 2Nd + ceil(N / Br) 2Nd, which is
    2Nd + 2N^2 d / Br when Br divides N. With causal, query tile i loads the K/V tiles up to the
    last one that is not skipped: min(N, Bc * ceil(last_row_i / Bc)) rows of each.
    """
    N, Br, Bc, d, _ = _check_sizes(N, Br, Bc, d, causal=causal)
    if not causal:
        return 2 * N * d + _n_tiles(N, Br) * 2 * N * d
    rows_loaded = sum(min(N, Bc * _n_tiles(_span(i, Br, N)[1], Bc)) for i in range(_n_tiles(N, Br)))
    return 2 * N * d + 2 * d * rows_loaded


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
        "standard_total": standard_traffic(N, d),
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
