"""Finding submissions in a folder, and making a submitted notebook safe to grade.

Two layouts are understood:
    nbgrader:  PATH[/submitted]/<student>/<assignment>/<assignment>.ipynb
    flat:      PATH/<student>_<assignment>.ipynb   (an LMS export; any separator, any order)
               PATH/<student>.ipynb                with --assignment
"""

from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat


@dataclass(frozen=True)
class Submission:
    student: str
    assignment: str
    path: Path


def _student_id(raw: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).strip("_.-")
    return cleaned or "unknown"


def discover(
    path: Path, known: list[str], assignment: str | None = None
) -> tuple[list[Submission], list[str]]:
    """All submissions under `path` and a list of problems (files that could not be placed)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"PATH must be a folder of submissions, got {path}")
    if (path / "submitted").is_dir():
        path = path / "submitted"
    subs, problems = [], []
    for student_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        for a_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if a_dir.name not in known:
                problems.append(f"{a_dir}: not a course assignment ({', '.join(known)})")
                continue
            notebooks = sorted(a_dir.glob("*.ipynb"))
            exact = a_dir / f"{a_dir.name}.ipynb"
            if exact in notebooks:
                notebooks = [exact]
            if len(notebooks) != 1:
                problems.append(f"{a_dir}: expected one notebook, found {len(notebooks)}")
                continue
            subs.append(Submission(_student_id(student_dir.name), a_dir.name, notebooks[0]))
    for nb_path in sorted(path.glob("*.ipynb")):
        stem = nb_path.stem
        match = max((a for a in known if a in stem), key=len, default=None)
        if match is not None:
            student = stem.replace(match, " ")
        elif assignment is not None:
            student = stem
        else:
            problems.append(
                f"{nb_path.name}: no assignment id in the file name; pass --assignment "
                f"(one of {', '.join(known)})"
            )
            continue
        subs.append(Submission(_student_id(student), match or assignment, nb_path))
    if assignment is not None:
        subs = [s for s in subs if s.assignment == assignment]
    seen: dict[tuple[str, str], Submission] = {}
    for sub in subs:
        key = (sub.student, sub.assignment)
        if key in seen:
            problems.append(f"{sub.path}: second submission of {key[0]}/{key[1]} (kept the first)")
        else:
            seen[key] = sub
    return list(seen.values()), problems


def read_notebook(path: Path):
    """The notebook at `path`, or raise ValueError saying why it cannot be graded."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a valid notebook (JSON error: {exc})") from None
    try:
        nb = nbformat.from_dict(raw)
        nb = nbformat.convert(nb, 4) if nb.get("nbformat", 4) != 4 else nb
        nbformat.validate(nb)
    except Exception as exc:
        raise ValueError(f"not a valid notebook ({type(exc).__name__}: {exc})") from None
    return nb


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def restore_locked_cells(nb, release) -> list[str]:
    """Put back locked cells of the release that the student deleted; returns what was restored.

    nbgrader overwrites edited locked cells from the gradebook, but a deleted test cell would simply
    not run. Restoring it keeps the grade honest (its tests run) and the student is told.
    """
    present = {_grade_id(c) for c in nb.cells}
    restored = []
    order = [_grade_id(c) for c in release.cells]
    for idx, cell in enumerate(release.cells):
        gid = _grade_id(cell)
        meta = cell.metadata.get("nbgrader", {})
        if gid is None or gid in present or not (meta.get("locked") or meta.get("grade")):
            continue
        # insert after the nearest earlier release cell that the submission still has
        pos = 0
        for prev in reversed(order[:idx]):
            where = [i for i, c in enumerate(nb.cells) if prev and _grade_id(c) == prev]
            if where:
                pos = where[0] + 1
                break
        nb.cells.insert(pos, copy.deepcopy(cell))
        present.add(gid)
        restored.append(gid)
    return restored


# Names whose attributes a submission must not reassign: the grading depends on them.
_PROTECTED_ROOTS = {"numpy", "np", "course_utils", "cu", "builtins", "sys", "scipy", "math"}


def find_tampering(nb) -> list[str]:
    """Lines of student-editable code cells that patch numpy, course_utils, builtins or sys.

    Returns "cell <grade_id or index>: <code line>" for each assignment to an attribute of such a
    module, each setattr/delattr on one, and each write to sys.modules.
    """
    found = []
    for idx, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or meta.get("locked") or meta.get("grade"):
            continue
        source = "\n".join(
            line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))
        )
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        aliases = set(_PROTECTED_ROOTS)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    root = (getattr(node, "module", None) or alias.name).split(".")[0]
                    if root in _PROTECTED_ROOTS and isinstance(node, ast.Import):
                        aliases.add((alias.asname or alias.name).split(".")[0])
        label = _grade_id(cell) or f"#{idx}"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for target in targets:
                if _rooted_in(target, aliases):
                    found.append(f"cell {label}: {ast.unparse(node).splitlines()[0]}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
                and _rooted_in(node.args[0], aliases, allow_name=True)
            ):
                found.append(f"cell {label}: {ast.unparse(node)}")
    return found


def _rooted_in(node, aliases: set[str], allow_name: bool = False) -> bool:
    """True for `np.x`, `np.a.b`, `sys.modules[...]` (and a bare name when allow_name)."""
    if isinstance(node, ast.Name):
        return allow_name and node.id in aliases
    if isinstance(node, ast.Attribute | ast.Subscript):
        inner = node.value
        while isinstance(inner, ast.Attribute | ast.Subscript):
            inner = inner.value
        return isinstance(inner, ast.Name) and inner.id in aliases
    return False


def truncate_outputs(nb, limit: int = 64_000) -> list[str]:
    """Cut stream and text outputs longer than `limit` characters; returns the cells cut."""
    cut = []
    for idx, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text")
            if isinstance(text, str) and len(text) > limit:
                out["text"] = text[:limit] + f"\n... [output cut: {len(text):,} characters]\n"
                cut.append(_grade_id(cell) or f"#{idx}")
            data = out.get("data", {})
            plain = data.get("text/plain")
            if isinstance(plain, str) and len(plain) > limit:
                data["text/plain"] = plain[:limit] + "\n... [output cut]"
                cut.append(_grade_id(cell) or f"#{idx}")
            if len(out.get("traceback", [])) > 200:
                out["traceback"] = out["traceback"][:100] + ["... [traceback cut]"]
    return sorted(set(cut))
