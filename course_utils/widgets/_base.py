"""LiveFigure: an ipywidgets figure drawn with matplotlib, with a static PNG fallback.

The figure is drawn off-screen (Agg) into PNG bytes shown by an ipywidgets.Image, so it behaves
the same in JupyterLab, classic Notebook, VS Code and Colab, whatever matplotlib backend is active.
Its MIME bundle carries both the widget view and a PNG of the current state: a live front end shows
the widget, a static viewer (GitHub, nbviewer, an exported HTML) shows the picture.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Mapping

from matplotlib.figure import Figure  # drawn without pyplot: the notebook's backend is untouched


def render_png(draw: Callable[[Figure, Mapping], None], state: Mapping, figsize, dpi=100) -> bytes:
    """Draw `state` with `draw(fig, state)` on a fresh off-screen figure; return PNG bytes."""
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    draw(fig, state)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# Control widths: a slider needs room to be dragged, a label must never be cut.
SLIDER_WIDTH = "300px"
DROPDOWN_WIDTH = "220px"
MIN_CONTROL_WIDTH = 120  # px: no control is narrower (the browser test measures it)


def _lay_out_control(ctrl) -> None:
    """Give a control a width it can be used at, and a label that is never truncated."""
    import ipywidgets as w

    if hasattr(ctrl, "style") and hasattr(ctrl.style, "description_width"):
        ctrl.style.description_width = "initial"  # the whole label, not 'FlashAtt...'
    if isinstance(ctrl, w.ToggleButtons):
        ctrl.style.button_width = "auto"
        ctrl.layout.width = "auto"
    elif isinstance(ctrl, w.widgets.widget_int._BoundedInt | w.SelectionSlider | w.FloatSlider):
        ctrl.layout.width = SLIDER_WIDTH
    elif isinstance(ctrl, w.Dropdown):
        ctrl.layout.width = DROPDOWN_WIDTH
    elif isinstance(ctrl, w.Checkbox):
        ctrl.indent = False
        ctrl.layout.width = "auto"
        ctrl.layout.min_width = f"{MIN_CONTROL_WIDTH}px"
    elif isinstance(ctrl, w.Button):
        ctrl.layout.width = "auto"
        ctrl.layout.min_width = f"{MIN_CONTROL_WIDTH}px"


class LiveFigure:
    """Controls (ipywidgets) + a picture redrawn from their values on every change.

    Layout, shared by every figure: the controls in one row that wraps (no control is squeezed
    below MIN_CONTROL_WIDTH, no label is cut), an optional Play control with its label, then
    the picture at its natural size (figsize x 100 px per inch, never upscaled; a narrow
    window scrolls it instead of shrinking its text), then the readout.

    Args:
        controls: {name: widget}; each widget's `.value` goes into the state under its name.
            Buttons (no value) are allowed: give `on_click` handlers through `buttons`.
        draw: draw(fig, state) draws the state on a matplotlib Figure.
        figsize: (width, height) in inches.
        derive: optional state -> extra entries (e.g. a step counter kept outside the widgets).
        buttons: {label: callback(state) -> dict of updates to `extra`}.
        readout: optional state -> HTML text shown under the picture.
        play: an ipywidgets.Play that animates one of the controls (shown with its label).
    """

    DPI = 100
    # the widest picture that fits a notebook's output area at natural size in a 1280 px window
    # with JupyterLab's file browser open (about 850 px): wider figures are scaled to this width
    MAX_WIDTH_IN = 8.4

    def __init__(
        self,
        controls: Mapping,
        draw: Callable[[Figure, Mapping], None],
        figsize=(9, 4),
        *,
        extra: dict | None = None,
        buttons: Mapping[str, Callable[[dict], dict]] | None = None,
        readout: Callable[[Mapping], str] | None = None,
        play=None,
    ):
        import ipywidgets as w

        self.controls = dict(controls)
        self.extra = dict(extra or {})
        if figsize[0] > self.MAX_WIDTH_IN:
            figsize = (self.MAX_WIDTH_IN, figsize[1] * self.MAX_WIDTH_IN / figsize[0])
        self._draw, self._figsize, self._readout = draw, figsize, readout
        width_px = round(figsize[0] * self.DPI)
        self.image = w.Image(
            format="png", layout=w.Layout(width=f"{width_px}px", max_width="none", height="auto")
        )
        self.html = w.HTML()
        row = list(self.controls.values())
        for label, callback in (buttons or {}).items():
            button = w.Button(description=label)
            button.on_click(lambda _b, cb=callback: self._update(cb(self.state)))
            row.append(button)
        for ctrl in row:
            _lay_out_control(ctrl)
        if play is not None:
            play.layout.min_width = f"{MIN_CONTROL_WIDTH}px"
            animate = w.HBox(
                [w.Label("animate:"), play],
                layout=w.Layout(align_items="center", width="auto", overflow="visible"),
            )
            row.insert(0, animate)
        for ctrl in self.controls.values():
            ctrl.observe(lambda _change: self.refresh(), names="value")
        wrap = w.Layout(flex_flow="row wrap", align_items="center", grid_gap="4px 18px")
        self.row = w.HBox(row, layout=wrap)
        self.picture = w.Box([self.image], layout=w.Layout(overflow="auto", max_width="100%"))
        self.widget = w.VBox([self.row, self.picture, self.html])
        # names for the browser test (tests/browser/test_browser.py) and for styling
        self.widget.add_class("course-live-figure")
        self.row.add_class("course-controls")
        self.image.add_class("course-picture")
        self.refresh()

    def all_controls(self) -> list:
        """Every control the figure shows (the Play control's group unpacked), in order."""
        import ipywidgets as w

        found = []
        for child in self.row.children:
            found.extend(child.children if isinstance(child, w.HBox) else [child])
        return found

    @property
    def state(self) -> dict:
        """The current values of the controls, plus the extra state."""
        state = {name: ctrl.value for name, ctrl in self.controls.items()}
        state.update(self.extra)
        return state

    def _update(self, changes: dict | None) -> None:
        """Apply a button's changes to the extra state; None means it set controls itself."""
        if changes is None:  # a control change already redrew the picture
            return
        self.extra.update(changes)
        self.refresh()

    def refresh(self) -> None:
        """Redraw the picture (and the readout) from the current state."""
        state = self.state
        self.image.value = render_png(self._draw, state, self._figsize, dpi=self.DPI)
        if self._readout is not None:
            self.html.value = self._readout(state)

    def png(self) -> bytes:
        """The current picture as PNG bytes."""
        return bytes(self.image.value)

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        data = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
        data["image/png"] = base64.b64encode(self.png()).decode("ascii")
        data["text/plain"] = f"<{type(self).__name__}: live figure; static picture attached>"
        return data
