"""What each misconception slug means: its title and explanation, for the class report.

A check names a misconception with a `[misconception: <slug>]` tag in its failure message; the
results keep only the slug. The words behind a slug live in the check modules (each entry of
course_utils/checks: a module, or a package read whole, such as triton_forward/ or the shared
engine/): every `Mistake(slug, title, explanation, fn)` and every wrong
`Option(key, text, slug, why)` of a concept question. This module collects them once, in the
grader's own process, by importing the check modules and walking their module-level values
(lists, tuples, dicts and dataclass fields of them): nothing runs in a student's kernel.

A few tags are written inline in a check's message (the hinted answers of a quick check:
"that adds the chunks' averages [misconception: normalize-then-add]"); for those the words
before the tag, read from the module's source without running it, are the title.

One slug can come back in several notebooks, sometimes with words fitted to each; `Catalogue.find`
prefers the words of the check modules that the assignment's notebook imports, then of those they
import (modules_of).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from graders.run import pipeline

CHECKS = "course_utils.checks"
_TAG = re.compile(r"\[misconception: ([A-Za-z0-9_-]+)\]")
_IMPORTED = re.compile(r"course_utils\.checks\.([A-Za-z_]\w*)")


@dataclass(frozen=True)
class Known:
    slug: str
    title: str
    explanation: str
    module: str  # the check module (or package) it was found in: "merge_partials", "engine", ...


class Catalogue:
    """slug -> what the checks say about it, from every module that defines it."""

    def __init__(self, entries: list[Known]):
        self.by_slug: dict[str, list[Known]] = {}
        for k in entries:
            same = self.by_slug.setdefault(k.slug, [])
            if all((o.title, o.explanation) != (k.title, k.explanation) for o in same):
                same.append(k)

    def __contains__(self, slug: str) -> bool:
        return slug in self.by_slug

    def __len__(self) -> int:
        return len(self.by_slug)

    def find(self, slug: str, assignment: str | None = None) -> Known | None:
        """The words for `slug`, those of the assignment's own check modules first; None for a
        slug no check module explains."""
        found = self.by_slug.get(slug)
        if not found:
            return None
        near = _depths(assignment) if assignment else {}
        far = len(near) + 1  # a module the notebook does not reach
        ranked = sorted(found, key=lambda k: (near.get(k.module, far), not k.explanation))
        return ranked[0]


def check_modules(root: Path = pipeline.REPO) -> list[str]:
    """The names of the check modules: the entries of course_utils/checks, modules and packages
    alike (a package, such as triton_forward or the engine, counts as one)."""
    folder = root / "course_utils" / "checks"
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]))


def _files(module_name: str, root: Path = pipeline.REPO) -> list[Path]:
    """The source files of one check module: its .py, or every .py of its package."""
    folder = root / "course_utils" / "checks"
    package = folder / module_name
    if (package / "__init__.py").is_file():
        return sorted(package.rglob("*.py"))
    single = folder / f"{module_name}.py"
    return [single] if single.is_file() else []


def modules_of(assignment: str, root: Path = pipeline.REPO) -> tuple[str, ...]:
    """The check modules the assignment's student notebook imports (its graded cells do), then
    those these import in turn (every notebook's checks reach the engine), nearest first."""
    near = _depths(assignment, root)
    return tuple(sorted(near, key=lambda m: (near[m], m)))


@cache
def _depths(assignment: str, root: Path = pipeline.REPO) -> dict[str, int]:
    """check module -> how far from the notebook: 0 for those its cells import, 1 for those they
    import, ...; a slug's words are taken from the nearest module that explains it."""
    path = root / "notebooks" / assignment / f"{assignment}.ipynb"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    depths = dict.fromkeys(sorted(set(_IMPORTED.findall(text))), 0)
    todo = list(depths)
    while todo:
        name = todo.pop(0)
        for used in _imports_of(name, root):
            if used not in depths:
                depths[used] = depths[name] + 1
                todo.append(used)
    return depths


@cache
def _imports_of(module_name: str, root: Path = pipeline.REPO) -> tuple[str, ...]:
    """The check modules one check module imports, read from its source (nothing is run); a
    package's files are read together, and its imports of its own parts are not counted."""
    folder = root / "course_utils" / "checks"
    found = set()
    for path in _files(module_name, root):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        # the dotted package of the file, relative to course_utils.checks ("", "triton_forward")
        here = path.parent.relative_to(folder).parts
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:  # from .loads import ...
                base = list(here[: len(here) - (node.level - 1)] if node.level > 1 else here)
                target = base + (node.module.split(".") if node.module else [])
                if target:
                    found.add(target[0])
                else:  # from . import triton_loads
                    found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.module == CHECKS:  # from course_utils.checks import triton_forward
                    found.update(a.name for a in node.names)
                elif node.module:  # from course_utils.checks.engine.rules import ...
                    found.update(_IMPORTED.findall(node.module))
            elif isinstance(node, ast.Import):
                found.update(m for a in node.names for m in _IMPORTED.findall(a.name))
    found.discard(module_name)
    return tuple(sorted(m for m in found if _files(m, root)))


def _walk(value, module: str, found: list[Known], seen: set[int], depth: int = 0) -> None:
    """Every Mistake and Option reachable from `value` through containers and dataclasses."""
    from course_utils.checks.engine.failures import Mistake
    from course_utils.checks.engine.quizzes import Option

    if depth > 6 or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Mistake):
        found.append(Known(value.slug, value.title, value.explanation, module))
    elif isinstance(value, Option):
        if value.slug:
            found.append(Known(value.slug, value.text, value.why or "", module))
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, module, found, seen, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            _walk(v, module, found, seen, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _walk(getattr(value, f.name, None), module, found, seen, depth + 1)


def from_objects(module_name: str) -> list[Known]:
    """The Mistakes and Options among the module-level values of one check module (of each of
    its parts, for a package)."""
    module = importlib.import_module(f"{CHECKS}.{module_name}")
    modules = [module]
    if hasattr(module, "__path__"):  # a package: its parts too
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{module.__name__}."):
            modules.append(importlib.import_module(info.name))
    found: list[Known] = []
    seen: set[int] = set()
    for m in modules:
        for name, value in vars(m).items():
            if not name.startswith("__"):
                _walk(value, module_name, found, seen)
    return found


def from_source(module_name: str, root: Path = pipeline.REPO) -> list[Known]:
    """The tags written inline in a module's string constants: the words before the tag are the
    title ("that adds the chunks' averages [misconception: normalize-then-add]")."""
    found = []
    for path in _files(module_name, root):
        text = path.read_text(encoding="utf-8")
        if "[misconception:" not in text:  # no tag written inline: nothing to parse
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in _TAG.finditer(node.value):
                    title = node.value[: m.start()].strip().strip(":;,.").strip()
                    if title:
                        found.append(Known(m.group(1), title, "", module_name))
    return found


@cache
def catalogue(root: Path = pipeline.REPO, modules: tuple[str, ...] | None = None) -> Catalogue:
    """Every slug the check modules explain (`modules`: those modules only, a quicker read when
    the assignments' own modules are enough). A module that cannot be imported here (a missing
    optional dependency) gives what its source says."""
    entries: list[Known] = []
    for name in check_modules(root) if modules is None else modules:
        try:
            entries += from_objects(name)
        except Exception:  # noqa: BLE001 (an import error of one module must not stop the report)
            pass
        entries += from_source(name, root)
    return Catalogue(entries)
