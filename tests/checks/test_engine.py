"""The checks' engine: what the reference watch calls infrastructure exists, the engine stands
alone (the grader copies it whole into a graded kernel), and no check module grows past ~800
lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from course_utils.checks.engine import watch

CHECKS = Path(__file__).resolve().parents[2] / "course_utils" / "checks"


def test_the_watch_names_modules_that_exist():
    """_INFRASTRUCTURE names modules by dotted path: a renamed module would silently become
    'course' code, and the engine's own frames would count as calls into the course."""
    for dotted in watch._INFRASTRUCTURE:
        importlib.import_module(dotted)
    assert "course_utils.checks.engine.watch" in watch._INFRASTRUCTURE


def test_the_engine_imports_nothing_of_the_course_but_itself():
    """Nothing in engine/ computes an answer: it imports no notebook's checks, no reference, no
    widget; only itself and the harness (the grader copies both whole and stubs the rest)."""
    for path in sorted((CHECKS / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("course_utils"):
                    whole = ("course_utils.checks.engine", "course_utils.harness")
                    assert name.startswith(whole), (path.name, name)


def test_no_check_module_passes_800_lines():
    for path in sorted(CHECKS.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 800, (path.relative_to(CHECKS), lines)
