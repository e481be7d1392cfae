"""Where the course is: the repository, its nbgrader config file, and its assignments.

    REPO          the repository root (solutions/, notebooks/, course_utils/)
    CONFIG_FILE   graders/authoring/nbgrader_config.py, the course's nbgrader configuration
    assignments(root) -> ["01_online_softmax", ...]   every solutions/NN_topic/NN_topic.ipynb

The lowest layer of graders/: every other layer may read these, nothing here imports them.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = Path(__file__).resolve().parent / "nbgrader_config.py"


def assignments(root: Path = REPO) -> list[str]:
    """The assignment ids, in course order: every solutions/NN_topic/NN_topic.ipynb."""
    src = Path(root) / "solutions"
    return sorted(p.name for p in src.iterdir() if (p / f"{p.name}.ipynb").is_file())
