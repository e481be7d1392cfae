"""The instructor notebooks as text: source/NN_topic.md (jupytext's MyST markdown) is the source,
solutions/NN_topic/NN_topic.ipynb (with nbgrader's metadata) is built from it.

    python -m graders build [ASSIGNMENT ...]        source/*.md -> solutions/*.ipynb
    python -m graders import-notebook PATH.ipynb    solutions/*.ipynb -> source/*.md (once, or to
                                                    take back an edit made in Jupyter)

A markdown cell is prose, a code cell is a ```{code-cell}``` block. Each cell says its nbgrader
role in one short option (code cells) or in the `+++ {...}` line before it (markdown cells):

    :solution: merge_rows            an answer cell (### BEGIN SOLUTION regions become the stub)
    :tests: merge_rows_tests         a graded, locked test cell worth `points`
    :points: 5
    :locked: setup                   a locked cell (students cannot edit it)
    :task: explain_speed             a manually graded task (markdown), with `points`
    :id: hints-ex1                   the cell's id (nbgrader's autograde needs them unique)

A cell with a role has the id of its grade id (`_` as `-`) unless it names another; a cell without
a role must name its id, so ids stay the same when cells are added or moved. The setup cell
(`:locked: setup`) is written by the build from course.toml (graders.authoring.setup_source),
whatever its body in the text. Any other metadata is kept as it is.

Both directions are deterministic, and text -> notebook -> text is the identity (import_notebook
checks that the notebook it reads builds back byte for byte).

    to_text(nb, assignment) -> str          notebook_bytes(text, assignment) -> str (the .ipynb)
    build(root, only, source) -> [paths]    import_notebook(path, source) -> path
    release(root, only) -> (built, badges, released)   build, README's badges, then nbgrader
"""

from __future__ import annotations

import copy
from pathlib import Path

from graders import authoring

SOURCE = "source"  # the folder of the text notebooks, at the repository's root
FMT = "md:myst"
ROLES = ("solution", "tests", "locked", "task")
SETUP_ID = "setup"
SETUP_BODY = "# The setup cell: `python -m graders build` writes it from course.toml."
NB_METADATA = {"kernelspec": authoring.KERNELSPEC, "language_info": {"name": "python"}}
# jupytext_version would change every file with each jupytext release: left out of the text
VERSION_LINE = "    jupytext_version:"


class NotebookTextError(ValueError):
    """A text notebook (or a notebook to convert) that the build cannot express; names where."""


def _nbgrader(role: str, grade_id: str, points) -> dict:
    """nbgrader's cell metadata (schema 3) for a role, as its Create Assignment toolbar writes."""
    meta = {
        "grade": role == "tests",
        "grade_id": grade_id,
        "locked": role in ("tests", "locked", "task"),
        "schema_version": 3,
        "solution": role == "solution",
        "task": role == "task",
    }
    if role in ("tests", "task"):
        meta["points"] = points
    return meta


def _role_of(meta: dict) -> str | None:
    """The role whose metadata `meta` is (None when no role writes exactly this)."""
    for role in ROLES:
        if _nbgrader(role, meta.get("grade_id"), meta.get("points")) == meta:
            return role
    return None


def _default_id(grade_id: str | None) -> str | None:
    return grade_id.replace("_", "-") if grade_id else None


def _repo_url(repo_url: str | None) -> str:
    return repo_url or authoring.REPO_URL


# --- notebook -> text ------------------------------------------------------------------------


def to_text(nb, assignment: str, where: str = "") -> str:
    """The text form of instructor notebook `nb` (nbformat v4); NotebookTextError names a cell
    whose metadata no short option expresses."""
    import jupytext
    import nbformat

    where = where or f"{assignment}.ipynb"
    if dict(nb.metadata) != NB_METADATA:
        raise NotebookTextError(
            f"{where}: notebook metadata {dict(nb.metadata)} is not the course's"
        )
    text_nb = nbformat.v4.new_notebook(metadata={"kernelspec": dict(authoring.KERNELSPEC)})
    for i, cell in enumerate(nb.cells):
        meta = copy.deepcopy(dict(cell.metadata))
        grader = meta.pop("nbgrader", None)
        short: dict = {}
        grade_id = None
        if grader is not None:
            role = _role_of(grader)
            if role is None:
                raise NotebookTextError(
                    f"{where}: cell {i} ({cell.get('id')}): nbgrader metadata {grader} is none "
                    f"of the roles {', '.join(ROLES)}"
                )
            grade_id = grader["grade_id"]
            short[role] = grade_id
            if "points" in grader:
                short["points"] = grader["points"]
        if cell.get("id") != _default_id(grade_id):
            short["id"] = cell["id"]
        clash = set(short) & set(meta)
        if clash:
            raise NotebookTextError(f"{where}: cell {i}: metadata {sorted(clash)} is reserved")
        source = cell.source
        if grade_id == SETUP_ID:
            source = SETUP_BODY
        if cell.cell_type == "code":
            if cell.get("outputs") or cell.get("execution_count") is not None:
                raise NotebookTextError(f"{where}: cell {i} has outputs: clear them first")
            new = nbformat.v4.new_code_cell(source, metadata={**short, **meta})
        elif cell.cell_type == "markdown":
            if cell.get("attachments"):
                raise NotebookTextError(f"{where}: cell {i} has attachments (not kept in text)")
            new = nbformat.v4.new_markdown_cell(source, metadata={**short, **meta})
        else:
            raise NotebookTextError(f"{where}: cell {i} is a {cell.cell_type} cell")
        text_nb.cells.append(new)
    text = jupytext.writes(text_nb, fmt=FMT)
    return "".join(line for line in text.splitlines(True) if not line.startswith(VERSION_LINE))


# --- text -> notebook ------------------------------------------------------------------------


def from_text(text: str, assignment: str, where: str = "", repo_url: str | None = None):
    """The instructor notebook (nbformat v4) that a text notebook describes."""
    import jupytext
    import nbformat

    where = where or f"{SOURCE}/{assignment}.md"
    parsed = jupytext.reads(text, fmt=FMT)
    nb = nbformat.v4.new_notebook(metadata=copy.deepcopy(NB_METADATA))
    seen: dict[str, int] = {}
    for i, cell in enumerate(parsed.cells):
        meta = dict(cell.metadata)
        roles = [r for r in ROLES if r in meta]
        if len(roles) > 1:
            raise NotebookTextError(f"{where}: cell {i} has two roles: {', '.join(roles)}")
        cell_id = meta.pop("id", None)
        points = meta.pop("points", None)
        extra = {}
        grade_id = None
        if roles:
            role = roles[0]
            grade_id = meta.pop(role)
            if not isinstance(grade_id, str) or not grade_id:
                raise NotebookTextError(f"{where}: cell {i}: `{role}` needs a grade id")
            if (role in ("tests", "task")) != (points is not None):
                raise NotebookTextError(
                    f"{where}: cell {i} ({grade_id}): `points` goes with tests and task cells"
                )
            extra["nbgrader"] = _nbgrader(role, grade_id, points)
        elif points is not None:
            raise NotebookTextError(f"{where}: cell {i}: `points` without `tests` or `task`")
        cell_id = cell_id or _default_id(grade_id)
        if not cell_id:
            raise NotebookTextError(
                f"{where}: cell {i} has no id: give it one (`:id: NAME` in a code cell's "
                f'options, +++ {{"id": "NAME"}} before a markdown cell), unique in the notebook'
            )
        if cell_id in seen:
            raise NotebookTextError(
                f"{where}: cells {seen[cell_id]} and {i} share the id {cell_id!r} "
                "(nbgrader's autograde fails on it)"
            )
        seen[cell_id] = i
        source = cell.source
        if grade_id == SETUP_ID:
            source = authoring.setup_source(assignment, _repo_url(repo_url))
        metadata = {**meta, **extra}
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(source, metadata=metadata)
        else:
            new = nbformat.v4.new_markdown_cell(source, metadata=metadata)
        new["id"] = cell_id
        nb.cells.append(new)
    return nb


def notebook_json(nb) -> str:
    """The file's text, as nbformat.write writes it (sorted keys, one-space indent, newline)."""
    import nbformat

    nbformat.validate(nb)
    out = nbformat.writes(nb)
    return out if out.endswith("\n") else out + "\n"


def notebook_bytes(text: str, assignment: str, where: str = "", repo_url: str | None = None):
    """The .ipynb file's text built from a text notebook."""
    return notebook_json(from_text(text, assignment, where, repo_url))


# --- the folders -----------------------------------------------------------------------------


def source_files(source: Path) -> list[Path]:
    """The text notebooks of a source folder, in course order."""
    return sorted(Path(source).glob("*.md"))


def course_settings(root: Path):
    """The settings of the course at `root`: its course.toml, else the repository's."""
    from graders import settings

    own = Path(root) / "course.toml"
    return settings.load(own if own.is_file() else None)


def build(root: Path, only: list[str] | None = None, source: Path | None = None) -> list[Path]:
    """Write root/solutions/<a>/<a>.ipynb from source/<a>.md for every text notebook (or `only`),
    the setup cells from root's course.toml; returns the files that changed (one whose text is
    already right is left untouched). source: default root/source."""
    root = Path(root)
    source = Path(source) if source else root / SOURCE
    repo_url = course_settings(root).repository
    files = {p.stem: p for p in source_files(source)}
    if only:
        missing = [a for a in only if a not in files]
        if missing:
            raise ValueError(f"no text notebook {', '.join(missing)} under {source}")
        files = {a: files[a] for a in only}
    written = []
    for assignment, path in files.items():
        out = root / "solutions" / assignment / f"{assignment}.ipynb"
        where = f"{source.name}/{path.name}"
        text = notebook_bytes(path.read_text(encoding="utf-8"), assignment, where, repo_url)
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            written.append(out)
    return written


def release(root: Path, only: list[str] | None = None, source: Path | None = None):
    """What `python -m graders release` does at `root`: build solutions/ from source/, point the
    Colab badges of README.md and docs/ at course.toml's repository, then generate notebooks/
    with nbgrader. Returns (solutions changed, badge files changed, notebooks released)."""
    from graders import pipeline

    built = build(root, only, source)
    badges = authoring.sync_badge_files(root, course_settings(root).colab_url)
    return built, badges, pipeline.release(root, only)


def import_notebook(path: Path, source: Path) -> Path:
    """Write source/<a>.md from the instructor notebook at `path` (.../<a>.ipynb); returns it.

    Raises NotebookTextError when the text would not build back to the same bytes (the setup
    cell apart: the build writes that one from course.toml, and a warning says when it differed).
    """
    import nbformat

    path = Path(path)
    assignment = path.stem
    raw = path.read_text(encoding="utf-8")
    nb = nbformat.reads(raw, as_version=4)
    text = to_text(nb, assignment, str(path))
    expected = raw
    setup = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == SETUP_ID]
    if setup and setup[0].source != authoring.setup_source(assignment):
        print(f"warning: {path}: its setup cell is not course.toml's; the build writes that one")
        setup[0].source = authoring.setup_source(assignment)
        expected = notebook_json(nb)
    if notebook_bytes(text, assignment, str(path)) != expected:
        raise NotebookTextError(f"{path}: its text form would not build back to the same file")
    out = Path(source) / f"{assignment}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out
