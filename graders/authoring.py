"""Helpers to write instructor notebooks with the right nbgrader metadata.

The source of each notebook is its text, source/NN_topic.md (graders/notebook_text.py builds
solutions/ from it). These helpers write a notebook from a script (handy when one is first
drafted); `python -m graders import-notebook` then turns it into its text:

    cells = [setup_cell(), md("# Title"), solution("def f(x):\n    ### BEGIN SOLUTION ..."),
             tests("check_f(f)", grade_id="f_tests", points=2)]
    write_notebook(cells, "solutions/12_new_topic/12_new_topic.ipynb")

The Colab setup cell and the Colab badges are made here from course.toml's repository
(graders/settings.py): setup_source, colab_link, sync_badges. tests/notebooks/test_notebooks.py
checks that every notebook starts with exactly its setup cell.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from graders import settings

# The repository that Colab opens the notebooks from and installs course_utils from: course.toml's
# `repository` (graders/settings.py). After changing it run `python -m graders release`.
REPO_URL = settings.load().repository
COLAB_URL = settings.load().colab_url

SETUP_TEMPLATE = """\
# Setup: on Colab, or anywhere course_utils is missing, install the course package first.
try:
    import course_utils
except ImportError:
    import subprocess
    import sys

    class CourseSetupError(Exception):
        def _render_traceback_(self):  # IPython shows this one line, not a traceback
            return [str(self)]

    _url = "{repo_url}"
    _pip = [sys.executable, "-m", "pip", "install", "--quiet", f"course_utils @ git+{{_url}}"]
    if subprocess.run(_pip, capture_output=True).returncode != 0:
        raise CourseSetupError(
            f"✗ The course package could not be installed from {{_url}}: check the network "
            "(on Colab: Runtime > Restart session, then run this cell again), or the "
            "repository URL in the course's settings (`repository` in course.toml)."
        ) from None
    import course_utils"""
SETUP_SOURCE = SETUP_TEMPLATE.format(repo_url=REPO_URL)

# The notebooks that need more than the NumPy track, and what: their setup cell checks for these
# modules and, where one is missing, says in one line how to add it (`python3 course.py gpu`
# locally; Colab has both; Triton has no macOS wheels).
GPU_NEEDS = {
    "06_triton_forward": ("torch", "triton"),
    "08_triton_backward": ("torch", "triton"),
    "09_flash_decoding": ("torch", "triton"),
    "10_ring_attention": ("torch",),
    "11_capstone": ("torch", "triton"),
}
GPU_COMMAND = "python3 course.py gpu"

GPU_SETUP_SOURCE = """

# This notebook also needs {names}: Colab has them; `{command}` adds them here.
import importlib.util

_missing = [m for m in {modules} if importlib.util.find_spec(m) is None]
if _missing:
    import platform
    import sys

    class CourseSetupError(Exception):
        def _render_traceback_(self):  # IPython shows this one line, not a traceback
            return [str(self)]

    if "google.colab" in sys.modules:
        _fix = "Runtime > Disconnect and delete runtime, then run this cell again"
    elif "triton" in _missing and platform.system() != "Linux":
        _fix = "Triton has no wheels here: open this notebook on Colab (its badge in README.md)"
    else:
        _fix = "run `{command}` in the course folder, then Kernel > Restart Kernel"
    raise CourseSetupError(f"✗ This notebook needs {{' and '.join(_missing)}}: {{_fix}}.")"""


def setup_source(assignment: str | None = None, repo_url: str | None = None) -> str:
    """The first cell of `assignment`'s notebook: SETUP_SOURCE (installing from `repo_url`,
    default course.toml's repository), and for a notebook that needs torch or Triton (GPU_NEEDS)
    a check that names the one command that installs them."""
    base = SETUP_TEMPLATE.format(repo_url=repo_url or REPO_URL)
    needs = GPU_NEEDS.get(assignment or "")
    if not needs:
        return base
    return base + GPU_SETUP_SOURCE.format(
        names=" and ".join("Triton" if m == "triton" else m for m in needs),
        modules="(" + ", ".join(f'"{m}"' for m in needs) + ("," if len(needs) == 1 else "") + ")",
        command=GPU_COMMAND,
    )


# A Colab badge's link to a notebook of the course: COLAB_URL/blob/main/notebooks/... (README.md).
_COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/[^/\s)\]]+/[^/\s)\]]+/blob/")


def colab_link(assignment: str, colab_url: str | None = None) -> str:
    """The address at which Colab opens the student notebook of `assignment`."""
    return f"{colab_url or COLAB_URL}/blob/main/notebooks/{assignment}/{assignment}.ipynb"


def sync_badges(text: str, colab_url: str | None = None) -> str:
    """`text` (README.md) with every Colab link pointed at `colab_url` (default: course.toml's)."""
    return _COLAB_LINK.sub((colab_url or COLAB_URL) + "/blob/", text)


def sync_badge_files(root: Path, colab_url: str | None = None) -> list[Path]:
    """Point the Colab badges of root's README.md and docs/*.md at `colab_url` (default:
    course.toml's); returns the files changed."""
    root = Path(root)
    changed = []
    for path in [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = sync_badges(text, colab_url)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _meta(grade_id: str, *, grade: bool, solution: bool, locked: bool, points=None) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def md(text: str, grade_id: str | None = None):
    """A markdown cell; with a grade_id it is locked (students cannot edit it)."""
    meta = _meta(grade_id, grade=False, solution=False, locked=True) if grade_id else {}
    return nbformat.v4.new_markdown_cell(text.strip("\n"), metadata=meta)


def code(source: str, grade_id: str | None = None):
    """A code cell; with a grade_id it is locked (read-only for the students)."""
    meta = _meta(grade_id, grade=False, solution=False, locked=True) if grade_id else {}
    return nbformat.v4.new_code_cell(source.strip("\n"), metadata=meta)


def solution(source: str, grade_id: str):
    """An answer cell: ### BEGIN SOLUTION / ### END SOLUTION regions become the stub."""
    meta = _meta(grade_id, grade=False, solution=True, locked=False)
    return nbformat.v4.new_code_cell(source.strip("\n"), metadata=meta)


def tests(source: str, grade_id: str, points: float):
    """A graded, locked test cell; ### BEGIN HIDDEN TESTS regions are removed from the release."""
    meta = _meta(grade_id, grade=True, solution=False, locked=True, points=points)
    return nbformat.v4.new_code_cell(source.strip("\n"), metadata=meta)


def setup_cell(assignment: str | None = None):
    """The first cell of every notebook (locked): installs course_utils on Colab, and in the
    Triton notebooks says how to add torch and Triton where they are missing."""
    return code(setup_source(assignment), grade_id="setup")


def write_notebook(cells, path: str | Path) -> Path:
    """Write an instructor notebook with stable cell ids (its grade_id, or its position)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(cells):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell["id"] = gid.replace("_", "-") if gid else f"cell-{i:03d}"
    nb.cells = list(cells)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    nbformat.write(nb, str(path))
    return path


def concept_cells(name: str, number: int | None = None) -> list:
    """The three cells of a graded concept question of course_utils.checks.concepts: the question
    (markdown, from the question itself), the answer cell, and the graded test cell (1 point).

    number: shown as "Concept check n." before the prompt.
    """
    from course_utils.checks.concepts import QUESTIONS

    q = QUESTIONS[name]
    gid = "concept_" + name.replace("-", "_")
    head = f"**Concept check {number}.** " if number is not None else ""
    answer = f'"{sorted(q.right)[0]}"' if q.pick == 1 else f'"{"".join(sorted(q.right))}"'
    if q.true_false:
        answer = str("true" in q.right)
    cells = [
        md(head + q.markdown()),
        solution(
            f"# Set {q.variable} (replace the two lines below).\n"
            f"### BEGIN SOLUTION\n{q.variable} = {answer}\n### END SOLUTION",
            grade_id=gid,
        ),
        tests(
            "from course_utils.checks.concepts import check_concept\n\n"
            f'check_concept("{name}", {q.variable})',
            grade_id=gid + "_tests",
            points=1,
        ),
    ]
    for cell in cells[1:]:
        cell["id"] = cell.metadata["nbgrader"]["grade_id"].replace("_", "-")
    return cells
