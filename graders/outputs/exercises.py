"""The exercises of each assignment, in the notebook's order: what the report calls each
graded cell.

exercise_outline(assignment) -> (Exercise(grade_id, title, points), ...)   the release's cells
cell_order(results, assignments) -> [(assignment, Exercise), ...]   those, then any cell the
                                                                    results hold that the
                                                                    release does not
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

from graders.run import pipeline


class Exercise(NamedTuple):
    grade_id: str  # the graded test cell's id: the feedback page's "Grade cell: <id>"
    title: str
    points: float


# A markdown heading ("### Exercise 1: the running max (4 points)") or a paragraph's bold lead
# ("**Quick check 2.** The running state ..."): what may name the graded cell that follows
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)[\s#]*$")
_BOLD_LEAD = re.compile(r"^\s*\*\*(.+?)\*\*")
_POINTS = re.compile(r"\s*\(\s*\d+(?:\.\d+)?\s+points?\s*\)\s*$", re.IGNORECASE)
# A numbered label ("Exercise 2: ...", "Quick check 1", "Puzzle 3: ..."), after a section's number
# or not ("6. Exercise 2: the loop"): an exercise's own title, never a step inside its text
_SECTION_NUMBER = re.compile(r"^\d+(?:\.\d+)*\.\s+")
_LABEL = re.compile(r"^[A-Za-z][A-Za-z ]{0,30}?\s\d+\b")


class _Title(NamedTuple):
    text: str
    heading: bool  # a markdown heading, not a bold lead
    label: bool  # a numbered label (_LABEL)


def _titles(markdown: str) -> list[_Title]:
    found = []
    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        m = heading or _BOLD_LEAD.match(line)
        if m:
            title = _POINTS.sub("", m.group(1).replace("`", "")).strip().rstrip(".:").strip()
            plain = _SECTION_NUMBER.sub("", title)
            if _LABEL.match(plain):
                found.append(_Title(plain, bool(heading), True))
            elif title:
                found.append(_Title(title, bool(heading), False))
    return found


def _pick(titles: list[_Title]) -> str:
    """The title of a graded cell among the markdown's titles since the graded cell before: the
    last numbered label, else the last heading, else the last bold lead. A bold lead inside an
    exercise's text ("**The rules.**", "**Ragged tiles.**") never wins over the exercise's own
    heading; a numbered bold lead ("**Quick check 2.**") wins over its section's heading."""
    for wanted in (lambda t: t.label, lambda t: t.heading, lambda t: True):
        chosen = [t.text for t in titles if wanted(t)]
        if chosen:
            return chosen[-1]
    return ""


def _name_of(grade_id: str) -> str:
    """An exercise's name from its test cell's id: "merge_partials_tests" -> "merge partials"."""
    return re.sub(r"_tests?$", "", grade_id).replace("_", " ").strip() or grade_id


@cache
def exercise_outline(assignment: str, root: Path = pipeline.REPO) -> tuple[Exercise, ...]:
    """The graded test cells of the release notebook notebooks/<a>/<a>.ipynb in its order: id,
    title and points (nbgrader's metadata). The title is picked among the headings and bold leads
    of the markdown since the graded cell before (_pick); with none, the title before that with
    the exercise's name ("Quick check 2 (quick merged lse)"), else the name alone. () when there
    is no release notebook (the report then lists the cells it finds in the results)."""
    path = Path(root) / "notebooks" / assignment / f"{assignment}.ipynb"
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    outline: list[Exercise] = []
    since: list[_Title] = []
    last = ""
    for cell in nb.get("cells", []):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "markdown":
            since += _titles(source)
        elif meta.get("grade") and not meta.get("solution") and meta.get("grade_id"):
            gid = meta["grade_id"]
            if since:
                title = last = _pick(since)
            else:  # a second graded cell under one heading: the heading and the cell's name
                title = f"{last} ({_name_of(gid)})" if last else _name_of(gid)
            outline.append(Exercise(gid, title, _points(meta)))
            since = []
    return tuple(outline)


def _points(meta: dict) -> float:
    try:
        return float(meta.get("points") or 0)
    except (TypeError, ValueError):
        return 0.0


def cell_order(results: list[dict], assignments: list[str]) -> list[tuple[str, Exercise]]:
    """(assignment, exercise) for every graded cell: the release's order and words, then any
    cell the results have that the release does not (its id as title, its points as graded)."""
    order = []
    for a in assignments:
        known = exercise_outline(a)
        order += [(a, ex) for ex in known]
        ids = {ex.grade_id for ex in known}
        extra: dict[str, float] = {}
        for r in results:
            if r["assignment"] == a:
                for gid, c in r.get("cells", {}).items():
                    if gid not in ids:
                        extra[gid] = max(extra.get(gid, 0.0), float(c.get("max_score") or 0))
        order += [(a, Exercise(gid, gid, pts)) for gid, pts in sorted(extra.items())]
    return order
