"""The ring's schedule as a picture: which K/V block each rank holds at each step, and which of
its 2 x 2 (query chunk, key chunk) pairs it computes under the zig-zag causal layout.

    ring_schedule_figure(P, causal) -> matplotlib Figure   (static; one panel per step)
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from course_utils.harness.ring_comm import CAUSAL, FULL, SKIP
from course_utils.references.ring_attention import ring_schedule

_COLOURS = {FULL: "#4c72b0", CAUSAL: "#dd8452", SKIP: "#eeeeee"}


def ring_schedule_figure(P: int = 4, causal: bool = True):
    """A grid of P ranks (rows) by P steps (columns).

    Each cell shows the block the rank holds at that step ("K/V of rank src") and a 2 x 2 square:
    rows are the rank's query chunks (front r, back 2P-1-r), columns the block's key chunks
    (front src, back 2P-1-src); blue computed whole, orange computed with the causal mask, grey
    skipped (fully masked). An arrow-free reading: the block in a cell moves one row down (to rank
    r + 1) in the next column.
    """
    if isinstance(P, bool) or not isinstance(P, int) or not 1 <= P <= 8:
        raise ValueError(f"P must be an int in 1..8, got {P!r}")
    schedule = ring_schedule(P, causal)
    fig, ax = plt.subplots(figsize=(1.6 * P + 1.6, 1.25 * P + 1.0))
    for step in range(P):
        for rank in range(P):
            src, pairs = schedule[step][rank]
            x0, y0 = step * 1.6, (P - 1 - rank) * 1.25
            for a in (0, 1):
                for b in (0, 1):
                    ax.add_patch(
                        Rectangle(
                            (x0 + 0.15 + 0.4 * b, y0 + 0.55 - 0.4 * a),
                            0.38,
                            0.38,
                            facecolor=_COLOURS[pairs[a][b]],
                            edgecolor="#555555",
                            linewidth=0.6,
                        )
                    )
            ax.text(x0 + 1.02, y0 + 0.55, f"K/V of\nrank {src}", fontsize=8, va="center")
    ax.set_xlim(0, 1.6 * P)
    ax.set_ylim(-0.1, 1.25 * P)
    ax.set_xticks([s * 1.6 + 0.75 for s in range(P)])
    ax.set_xticklabels([f"step {s}" for s in range(P)])
    ax.set_yticks([(P - 1 - r) * 1.25 + 0.55 for r in range(P)])
    ax.set_yticklabels([f"rank {r}" for r in range(P)])
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    mode = "causal, zig-zag layout" if causal else "no mask"
    ax.set_title(f"Ring of {P} ranks ({mode}): rows of each square = query chunks, columns = "
                 "key chunks", fontsize=9)  # fmt: skip
    ax.legend(
        handles=[
            Patch(facecolor=_COLOURS[FULL], label="computed"),
            Patch(facecolor=_COLOURS[CAUSAL], label="causal mask"),
            Patch(facecolor=_COLOURS[SKIP], label="skipped"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.04),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return fig
