"""The online-softmax stepper: one query reads its scores block by block (notebook 01).

Top row: the scores, the block just read in magenta. Below: the weights exp(x_i - m) of the scores
seen so far, relative to the current max m; when a block raises the max, every old bar shrinks by
the same rescale factor exp(m_old - m_new) (the dashed outlines are the bars before the block).
The yellow panel holds the state (m, l, acc, factor) and, after the last block, acc / l next to the
exact softmax average. "huge score" puts one score at 1000: the naive sum of e^x overflows to inf,
the online state does not.

The picture is drawn from `stepper_state(x, v, block, step)`, a pure function the tests check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_utils._validate import as_float_array, positive_int
from course_utils.references.softmax import online_softmax_steps, softmax_partial
from course_utils.widgets._base import LiveFigure

# Eight scores whose max grows three times with blocks of 2, and their (scalar) values.
DEFAULT_X = np.array([0.5, 1.2, -0.3, 2.1, 0.4, 1.0, 2.9, -0.8])
DEFAULT_V = np.array([1.0, -0.5, 2.0, 0.3, 1.5, -1.0, 0.8, 2.5])
HUGE_SCORE = 1000.0  # exp(1000) overflows float64 (the limit is about exp(709.8))

MAGENTA, BLUE, YELLOW, GREY = "#d6249f", "#3b75af", "#fff3b0", "#9a9a9a"


@dataclass(frozen=True)
class StepperState:
    """Everything the stepper draws after `step` blocks (step 0: nothing read yet)."""

    x: np.ndarray  # scores, (n,)
    v: np.ndarray  # values, (n,)
    block: int
    step: int  # blocks read so far, 0..n_blocks
    n_blocks: int
    start: int  # the block just read is x[start:stop]; start = stop = 0 before the first one
    stop: int  # scores seen so far
    m: float  # running max (-inf before the first block)
    factor: float  # exp(m_old - m_new) of the last block (nan before the first block)
    l: float  # sum over seen scores of exp(x_i - m)
    acc: float  # sum over seen scores of exp(x_i - m) v_i
    weights: np.ndarray  # exp(x_i - m) for i < stop, relative to the current max, (stop,)
    old_weights: np.ndarray  # the weights before the last block, relative to m_old, (start,)
    done: bool  # every block read
    out: float  # acc / l once done, else nan
    exact: float  # the direct softmax average sum_i softmax(x)_i v_i
    error: float  # |out - exact| once done, else nan
    naive_sum: float  # sum_i exp(x_i) without the max: inf when a score is huge
    naive_out: float  # sum exp(x_i) v_i / sum exp(x_i): nan (inf / inf) when a score is huge


def stepper_state(x, v, block: int, step: int) -> StepperState:
    """The state of one query after reading `step` blocks of `block` scores.

    Args:
        x: scores, shape (n,), n >= 1, finite or -inf (not all -inf).
        v: scalar values, shape (n,).
        block: scores per block (positive int; larger than n means one block).
        step: blocks read so far; clipped to 0..number of blocks.

    Returns:
        A StepperState (weights (stop,), old_weights (start,), the rest numbers).
    """
    x = as_float_array(x, "x", ndim=1, allow_inf=True)
    v = as_float_array(v, "v", ndim=1)
    if len(x) == 0 or len(v) != len(x):
        raise ValueError(f"x and v must have the same length >= 1, got {x.shape} and {v.shape}")
    if np.isneginf(x).all():
        raise ValueError("at least one score must be finite")
    block = positive_int(block, "block")
    steps = online_softmax_steps(x, v, block)
    step = int(min(max(step, 0), len(steps)))
    exact = softmax_partial(x, v)[0]
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow is what the toggle shows
        e = np.exp(x)
        naive_sum = float(e.sum())
        naive_out = float((e * v).sum() / naive_sum)
    if step == 0:
        return StepperState(
            x, v, block, 0, len(steps), 0, 0, -math.inf, math.nan, 0.0, 0.0,
            np.zeros(0), np.zeros(0), False, math.nan, exact, math.nan, naive_sum, naive_out,
        )  # fmt: skip
    cur = steps[step - 1]
    old_weights = steps[step - 2].weights if step > 1 else np.zeros(0)
    done = step == len(steps)
    out = float(cur.acc / cur.l) if done else math.nan
    return StepperState(
        x, v, block, step, len(steps), cur.start, cur.stop, cur.m, cur.factor, cur.l,
        float(cur.acc), cur.weights, old_weights, done, out, exact,
        abs(out - exact) if done else math.nan, naive_sum, naive_out,
    )  # fmt: skip


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _state_lines(s: StepperState) -> list[str]:
    lines = [f"block {s.step} of {s.n_blocks}" + (" (nothing read yet)" if s.step == 0 else "")]
    lines += [f"m      = {_fmt(s.m)}", f"factor = {_fmt(s.factor)}"]
    lines += [f"l      = {_fmt(s.l)}", f"acc    = {_fmt(s.acc)}"]
    if s.done:
        lines += ["", f"acc / l = {s.out:.12g}", f"exact   = {s.exact:.12g}"]
        lines += [f"|diff|  = {s.error:.1e}"]
    lines += ["", "naive (no max):", f"sum e^x = {_fmt(s.naive_sum)}"]
    lines += [f"average = {_fmt(s.naive_out)}"]
    return lines


def draw_stepper(fig, s: StepperState) -> None:
    """Draw a StepperState on a matplotlib Figure: scores, weight bars, state panel."""
    n = len(s.x)
    grid = fig.add_gridspec(2, 2, width_ratios=(3.2, 1.1), height_ratios=(1, 3))
    ax_x, ax_w = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
    ax_s = fig.add_subplot(grid[:, 1])

    for i, xi in enumerate(s.x):
        color = MAGENTA if s.start <= i < s.stop else ("#cfe0f1" if i < s.start else "white")
        ax_x.add_patch(_box(i, color))
        label = "-inf" if np.isneginf(xi) else (f"{xi:.0f}" if abs(xi) >= 100 else f"{xi:.2g}")
        ax_x.text(i, 0.5, label, ha="center", va="center", fontsize=10,
                  color="white" if color == MAGENTA else "black")  # fmt: skip
    for b in range(s.block, n, s.block):
        ax_x.axvline(b - 0.5, color="black", lw=1.5)
    ax_x.set_xlim(-0.5, n - 0.5)
    ax_x.set_ylim(0, 1)
    ax_x.set_yticks([])
    ax_x.set_xticks(range(n))
    ax_x.set_title(f"scores x_i, blocks of {s.block} (magenta: the block just read)", fontsize=10)

    idx = np.arange(s.stop)
    ax_w.bar(idx, s.weights, width=0.7, color=BLUE, label="exp(x_i - m), now")
    if s.start and s.factor < 1:
        ax_w.bar(np.arange(s.start), s.old_weights, width=0.7, fill=False, ls="--",
                 edgecolor=GREY, label="before this block (relative to m_old)")  # fmt: skip
        ax_w.text(0.02, 0.97, f"the max grew: old bars x {s.factor:.3g}",
                  transform=ax_w.transAxes, va="top", color=MAGENTA, fontsize=10)  # fmt: skip
    ax_w.set_xlim(-0.5, n - 0.5)
    ax_w.set_ylim(0, 1.35)  # headroom for the legend and the note
    ax_w.set_yticks([0, 0.25, 0.5, 0.75, 1])
    ax_w.set_xticks(range(n))
    ax_w.set_xlabel("key index i")
    ax_w.set_ylabel("weight relative to the max")
    ax_w.set_title(f"weights of the scores seen so far (m = {_fmt(s.m)})", fontsize=10)
    ax_w.legend(loc="upper right", fontsize=8, frameon=False)

    ax_s.axis("off")
    ax_s.text(0.04, 0.98, "\n".join(_state_lines(s)), transform=ax_s.transAxes, va="top",
              family="monospace", fontsize=9.5,
              bbox={"boxstyle": "round", "facecolor": YELLOW, "edgecolor": "#c9a800"})  # fmt: skip


def _box(i, color):
    from matplotlib.patches import Rectangle

    return Rectangle((i - 0.45, 0.05), 0.9, 0.9, facecolor=color, edgecolor=GREY)


def _readout(s: StepperState) -> str:
    msg = (
        f"<b>block {s.step} of {s.n_blocks}</b>: m = {_fmt(s.m)}, factor = {_fmt(s.factor)}, "
        f"l = {_fmt(s.l)}, acc = {_fmt(s.acc)}"
    )
    if s.done:
        msg += (
            f"<br>acc / l = {s.out:.15g}, exact softmax average = {s.exact:.15g}, "
            f"difference {s.error:.1e}"
        )
    if math.isinf(s.naive_sum):
        msg += "<br>naive e^x: the sum overflows to inf and the average is inf / inf = nan"
    return msg


def online_softmax_stepper(x=None, v=None, block: int = 2, *, huge: bool = False, step: int = 0):
    """The online-softmax stepper figure (a LiveFigure; displays as a widget or a PNG).

    Args:
        x: scores (n,) (default: eight scores whose max grows three times); v: values (n,).
        block: initial block size (the slider goes from 1 to n).
        huge: start with the "huge score" toggle on (one score set to 1000).
        step: blocks already read when the figure appears.

    Buttons: "Next block" reads one more block, "Reset" goes back to no block read. Changing
    the block size or the toggle starts over.
    """
    import ipywidgets as w

    x = DEFAULT_X if x is None else as_float_array(x, "x", ndim=1, allow_inf=True)
    v = DEFAULT_V if v is None else as_float_array(v, "v", ndim=1)
    n = len(x)
    huge_at = min(5, n - 1)
    block_slider = w.IntSlider(value=positive_int(block, "block"), min=1, max=max(n, 2),
                               description="block")  # fmt: skip
    huge_box = w.Checkbox(value=bool(huge), description=f"huge score ({HUGE_SCORE:.0f})")
    holder = {}

    def start_over(_change):  # registered before LiveFigure's redraw, so it runs first
        if "fig" in holder:
            holder["fig"].extra["step"] = 0

    block_slider.observe(start_over, names="value")
    huge_box.observe(start_over, names="value")

    def state_of(st) -> StepperState:
        xs = x.copy()
        if st["huge"]:
            xs[huge_at] = HUGE_SCORE
        return stepper_state(xs, v, st["block"], st["step"])

    def next_block(st):
        return {"step": min(st["step"] + 1, state_of(st).n_blocks)}

    fig = LiveFigure(
        {"block": block_slider, "huge": huge_box},
        lambda f, st: draw_stepper(f, state_of(st)),
        figsize=(9.6, 4.4),
        extra={"step": int(step)},
        buttons={"Next block": next_block, "Reset": lambda st: {"step": 0}},
        readout=lambda st: _readout(state_of(st)),
    )
    holder["fig"] = fig
    return fig
