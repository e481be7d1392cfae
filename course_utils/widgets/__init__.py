"""The course's interactive figures (ipywidgets + matplotlib, with a static PNG fallback)."""

from course_utils.widgets._base import LiveFigure, render_png

__all__ = ["LiveFigure", "render_png"]
