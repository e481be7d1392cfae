"""The merge split slider: cut eight keys into A and B, merge the two partial results by lse.

A slider picks the split point s: set A holds the first s keys, set B the rest. Each set returns
its own softmax average o and its logsumexp lse; the merge weights them by e^(lse_set - lse) and
lands exactly on full attention, for every s. The plain average of o_A and o_B, the common
mistake, is drawn beside it in magenta. "mask B" sets B's scores to -inf: B is empty (lse = -inf,
weight 0) and the merge equals attention over A alone.

merge_split_state is the pure data behind the picture (the tests check it); merge_split_figure
draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_utils.harness.constants import NEG_INF
from course_utils.references.softmax import merge_partials, softmax_partial

# Eight keys of one query: scores q.k (already scaled) and scalar values.
DEFAULT_SCORES = np.array([0.4, 1.6, -0.8, 0.9, 2.3, -0.2, 1.2, 0.1])
DEFAULT_VALUES = np.array([1.0, 4.0, 2.0, 6.0, 7.0, 3.0, 5.0, 2.5])

COLOR_A = "#1f77b4"  # set A
COLOR_B = "#ff7f0e"  # set B
COLOR_MERGED = "black"
COLOR_FULL = "#2ca02c"
COLOR_PLAIN = "magenta"  # the common mistake
COLOR_MASKED = "#bbbbbb"


@dataclass(frozen=True)
class MergeSplitState:
    """What the merge split figure shows for one split point.

    All weights are floats in [0, 1]; an empty set has lse = -inf, o = 0 and weight 0.
    """

    split: int  # A = keys [0, split), B = keys [split, n)
    mask_b: bool  # B's scores set to -inf
    scores: np.ndarray  # (n,) the scores used, -inf where masked
    values: np.ndarray  # (n,) scalar values
    o_a: float  # softmax average of A's values (0 if A is empty)
    lse_a: float  # log sum_{i in A} e^score_i (-inf if empty)
    o_b: float
    lse_b: float
    lse: float  # merged lse = logaddexp(lse_a, lse_b)
    w_a: float  # e^(lse_a - lse): A's share of the softmax mass
    w_b: float  # e^(lse_b - lse)
    merged: float  # w_a o_a + w_b o_b
    plain_average: float  # (o_a + o_b) / 2, the common mistake
    full: float  # direct softmax average over every key that is not masked
    full_lse: float  # its lse
    key_weights: np.ndarray  # (n,) softmax weight of each key over the unmasked keys

    @property
    def error_merged(self) -> float:
        """|merged - full|: rounding only."""
        return abs(self.merged - self.full)

    @property
    def error_plain(self) -> float:
        """|plain average - full|: the size of the mistake."""
        return abs(self.plain_average - self.full)


def merge_split_state(scores=None, values=None, split: int = 4, mask_b: bool = False):
    """The merge of A = keys [0, split) and B = keys [split, n), next to full attention.

    Args:
        scores: (n,) scores of one query (default: DEFAULT_SCORES, eight keys).
        values: (n,) scalar values (default: DEFAULT_VALUES).
        split: 0..n; 0 makes A empty, n makes B empty.
        mask_b: set every score of B to -inf (a fully masked set).

    Returns:
        MergeSplitState.
    """
    scores = np.array(DEFAULT_SCORES if scores is None else scores, dtype=np.float64)
    values = np.array(DEFAULT_VALUES if values is None else values, dtype=np.float64)
    if scores.ndim != 1 or scores.shape != values.shape:
        raise ValueError(
            f"scores and values must be 1-D of one length: {scores.shape}, {values.shape}"
        )
    n = len(scores)
    if isinstance(split, bool) or not 0 <= int(split) <= n or int(split) != split:
        raise ValueError(f"split must be an integer in 0..{n}, got {split!r}")
    split = int(split)
    if mask_b:
        scores[split:] = NEG_INF
    o_a, lse_a = softmax_partial(scores[:split], values[:split])
    o_b, lse_b = softmax_partial(scores[split:], values[split:])
    merged, lse = merge_partials(o_a, lse_a, o_b, lse_b)
    lse_safe = 0.0 if lse == NEG_INF else float(lse)
    full, full_lse = softmax_partial(scores, values)
    key_weights = np.exp(scores - lse_safe) if lse != NEG_INF else np.zeros(n)
    return MergeSplitState(
        split=split,
        mask_b=bool(mask_b),
        scores=scores,
        values=values,
        o_a=o_a,
        lse_a=lse_a,
        o_b=o_b,
        lse_b=lse_b,
        lse=float(lse),
        w_a=float(np.exp(lse_a - lse_safe)),
        w_b=float(np.exp(lse_b - lse_safe)),
        merged=float(merged),
        plain_average=(o_a + o_b) / 2,
        full=full,
        full_lse=full_lse,
        key_weights=key_weights,
    )


def _fmt_lse(x: float) -> str:
    return "-inf" if x == NEG_INF else f"{x:.3f}"


def draw_merge_split(fig, st: MergeSplitState) -> None:
    """Left: each key's softmax weight, colored by set. Right: o_A, o_B, the merge, the mistake."""
    ax_keys, ax_out = fig.subplots(1, 2, width_ratios=[1.35, 1])
    n = len(st.scores)
    x = np.arange(n)
    masked = np.isneginf(st.scores)
    colors = [
        COLOR_MASKED if masked[i] else (COLOR_A if i < st.split else COLOR_B) for i in range(n)
    ]
    ax_keys.bar(x, st.key_weights, color=colors, edgecolor="black", linewidth=0.5)
    for i in range(n):
        label = f"v={st.values[i]:g}" + ("\nmasked" if masked[i] else "")
        ax_keys.text(x[i], st.key_weights[i] + 0.01, label, ha="center", va="bottom", fontsize=8)
    ax_keys.axvline(st.split - 0.5, color="black", linestyle="--", linewidth=1.2)
    top = 1.4 * max(0.3, float(st.key_weights.max())) + 0.05
    ax_keys.set_ylim(0, top)
    ax_keys.set_xlim(-0.6, n - 0.4)
    ax_keys.text(
        -0.5,
        top * 0.97,
        f"A: lse_A = {_fmt_lse(st.lse_a)}\nw_A = {st.w_a:.3f}",
        color=COLOR_A,
        va="top",
        ha="left",
        fontsize=9,
    )
    ax_keys.text(
        n - 0.5,
        top * 0.97,
        f"B: lse_B = {_fmt_lse(st.lse_b)}\nw_B = {st.w_b:.3f}",
        color=COLOR_B,
        va="top",
        ha="right",
        fontsize=9,
    )
    ax_keys.set_xticks(x, [f"k{i + 1}" for i in x])
    ax_keys.set_ylabel("softmax weight of each key")
    ax_keys.set_title(f"split s = {st.split}: A = first {st.split} keys, B = the rest", fontsize=10)

    rows = [
        ("o_A", st.o_a, COLOR_A, st.lse_a == NEG_INF),
        ("o_B", st.o_b, COLOR_B, st.lse_b == NEG_INF),
        ("merged", st.merged, COLOR_MERGED, False),
        ("full attention", st.full, COLOR_FULL, False),
        ("plain average", st.plain_average, COLOR_PLAIN, False),
    ]
    lo = min(st.values.min(), 0.0) - 0.5
    hi = st.values.max() + 0.5
    for y, (name, value, color, empty) in enumerate(reversed(rows)):
        ax_out.hlines(y, lo, hi, color="#eeeeee", linewidth=1, zorder=0)
        marker = "o" if name != "full attention" else "s"
        face = "none" if empty or name == "full attention" else color
        size = 13 if name == "full attention" else 8
        ax_out.plot([value], [y], marker=marker, markersize=size, color=color, mfc=face, mew=2)
        text = f"{value:.4f}" + (" (empty set)" if empty else "")
        ax_out.text(value, y + 0.28, text, ha="center", fontsize=8, color=color)
    ax_out.axvline(st.full, color=COLOR_FULL, linewidth=1, alpha=0.6, zorder=0)
    ax_out.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax_out.set_ylim(-0.6, len(rows) - 0.3)
    ax_out.set_xlim(lo, hi)
    ax_out.set_xlabel("output (value scale)")
    ax_out.set_title(
        f"merged - full = {st.merged - st.full:.1e}\nplain average - full = "
        f"{st.plain_average - st.full:+.3f}",
        fontsize=9,
    )


def _readout(st: MergeSplitState) -> str:
    b_note = " (masked: weight 0)" if st.mask_b else ""
    return (
        f"<b>A</b>: o_A = {st.o_a:.4f}, lse_A = {_fmt_lse(st.lse_a)}, w_A = {st.w_a:.4f} &nbsp; "
        f"<b>B</b>{b_note}: o_B = {st.o_b:.4f}, lse_B = {_fmt_lse(st.lse_b)}, "
        f"w_B = {st.w_b:.4f}<br>"
        f"merged = {st.merged:.6f}, full attention = {st.full:.6f}, "
        f"<span style='color:magenta'>plain average = {st.plain_average:.6f}</span>"
    )


def merge_split_figure(scores=None, values=None, split: int = 4, mask_b: bool = False):
    """The merge split slider as a LiveFigure (display it as the last expression of a cell).

    Args:
        scores, values: (n,) scores and scalar values of one query (default: eight keys).
        split: initial split point, 0..n.  mask_b: start with set B masked.
    """
    import ipywidgets as w

    from course_utils.widgets._base import LiveFigure

    base = merge_split_state(scores, values, split, mask_b)  # validates the arguments
    scores = np.array(DEFAULT_SCORES if scores is None else scores, dtype=np.float64)
    values = base.values
    n = len(values)
    controls = {
        "split": w.IntSlider(value=base.split, min=0, max=n, description="split s"),
        "mask_b": w.Checkbox(value=bool(mask_b), description="mask B"),
    }

    def state_of(state) -> MergeSplitState:
        return merge_split_state(scores, values, state["split"], state["mask_b"])

    return LiveFigure(
        controls,
        lambda fig, state: draw_merge_split(fig, state_of(state)),
        figsize=(10, 3.8),
        readout=lambda state: _readout(state_of(state)),
    )
