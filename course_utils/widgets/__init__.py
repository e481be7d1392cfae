"""The course's interactive figures (ipywidgets + matplotlib, with a static PNG fallback)."""

from ._base import LiveFigure, render_png

__all__ = ["LiveFigure", "render_png"]
