"""A bank of synthetic submissions, made from the solutions, with the exact score each must get.

Used by tests/test_grading.py and benchmarks/grading.py. Every entry is a notebook (or raw bytes)
plus the set of graded cells that must fail; the expected score is the notebook's points minus the
points of those cells, computed from the solution's metadata, never typed in by hand.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import pipeline
from .authoring import KERNELSPEC

TIMEOUT_FOR_BANK = 10  # seconds per cell: the infinite loop must be cut quickly in tests


@dataclass
class Entry:
    name: str
    notebook: object  # a NotebookNode, or bytes for a broken file
    failing: set[str]  # graded cells that must score 0
    status: str = "graded"
    misconception: dict[str, str] = field(default_factory=dict)  # cell -> slug expected
    problem: str | None = None  # a phrase the grader must report


@dataclass
class Exercise:
    answer: str  # grade_id of the answer cell
    function: str | None  # the function it defines, if any
    tests: list[str]  # grade_ids of the test cells that check it


def exercises(assignment: str, root: Path = pipeline.REPO) -> list[Exercise]:
    """The answer cells of an assignment, each with the test cells that follow it."""
    nb = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", 4)
    found: list[Exercise] = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            m = re.search(r"^def (\w+)\(", cell.source, re.M)
            found.append(Exercise(meta["grade_id"], m.group(1) if m else None, []))
        elif meta.get("grade") and found:
            found[-1].tests.append(meta["grade_id"])
    return [e for e in found if e.tests]


def points(assignment: str, root: Path = pipeline.REPO) -> dict[str, float]:
    nb = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", 4)
    return {
        c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }


def expected_score(assignment: str, entry: Entry) -> float:
    if entry.status == "invalid-notebook" or entry.status == "needs-review":
        return 0.0
    pts = points(assignment)
    return sum(p for gid, p in pts.items() if gid not in entry.failing)


def _set_answer(nb, grade_id: str, source: str):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source
            return nb
    raise KeyError(grade_id)


def _mistakes_for(assignment: str, ex: Exercise):
    """Mistakes of the assignment's checks module whose function has this exercise's name/args."""
    import importlib

    from course_utils.checks import Mistake

    nb = nbformat.read(pipeline.REPO / "solutions" / assignment / f"{assignment}.ipynb", 4)
    modules = set(re.findall(r"from (course_utils\.checks\.\w+) import", _all_sources(nb)))
    solution_src = next(
        c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ex.answer
    )
    params = re.search(rf"def {ex.function}\(([^)]*)\)", solution_src).group(1)
    wanted = [p.split("=")[0].strip() for p in params.split(",") if p.strip()]
    seen = {}
    for mod_name in sorted(modules):
        mod = importlib.import_module(mod_name)
        for value in vars(mod).values():
            items = value if isinstance(value, list | tuple) else [value]
            for m in items:
                if not isinstance(m, Mistake) or m.slug in seen:
                    continue
                try:
                    names = list(inspect.signature(m.fn).parameters)
                except (TypeError, ValueError):
                    continue
                if (
                    names[: len(wanted)] == wanted
                    and inspect.isfunction(m.fn)
                    and m.fn.__closure__ is None
                    and m.fn.__name__ != "<lambda>"
                ):
                    seen[m.slug] = (mod_name, m)
    return list(seen.values())


def _all_sources(nb) -> str:
    return "\n".join(c.source for c in nb.cells)


def _as_learner_code(mod_name: str, fn, name: str) -> str:
    """Answer-cell code that defines `name` as a copy of a buggy function, as if typed in."""
    return (
        "import types as _types\n"
        f"import {mod_name} as _bank\n"
        f"{name} = _types.FunctionType(_bank.{fn.__name__}.__code__, vars(_bank), {name!r},\n"
        f"                             _bank.{fn.__name__}.__defaults__)\n"
        f"{name}.__module__ = '__main__'\n"
    )


def build(assignment: str, root: Path = pipeline.REPO) -> list[Entry]:
    """The bank for one assignment: good, untouched, each misconception, broken and adversarial."""
    solved = pipeline.solved_notebook(assignment, root)
    untouched = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", 4)
    exs = [e for e in exercises(assignment, root) if e.function]
    all_tests = set(points(assignment, root))
    first, last = exs[0], exs[-1]
    bank = [Entry("full", solved, set()), Entry("untouched", untouched, all_tests)]

    def variant(name, failing, edit, **kw):
        nb = copy.deepcopy(solved)
        edit(nb)
        bank.append(Entry(name, nb, set(failing), **kw))

    import course_utils

    for ex in exs:
        for mod_name, mistake in _mistakes_for(assignment, ex):
            code = _as_learner_code(mod_name, mistake.fn, ex.function)
            variant(
                f"mistake:{mistake.slug}:{ex.function}",
                ex.tests,
                lambda nb, ex=ex, code=code: _set_answer(nb, ex.answer, code),
                misconception={ex.tests[0]: mistake.slug},
            )
        if not hasattr(course_utils, ex.function):
            continue  # the course has no reference of that name to call
        variant(
            f"calls-reference:{ex.function}",
            ex.tests,
            lambda nb, ex=ex: _set_answer(
                nb,
                ex.answer,
                f"import course_utils as _cu\n\n\ndef {ex.function}(*args, **kwargs):\n"
                f"    return _cu.{ex.function}(*args, **kwargs)\n",
            ),
            misconception={ex.tests[0]: "calls-reference"},
        )
    src = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in solved.cells}
    variant(
        "infinite-loop",
        first.tests,
        lambda nb: _set_answer(nb, first.answer, "while True:\n    pass\n" + src[first.answer]),
    )
    variant(
        "sys-exit",
        first.tests,
        lambda nb: _set_answer(nb, first.answer, "import sys\n\nsys.exit(3)\n" + src[first.answer]),
    )
    # the kernel dies in the last exercise's answer: every test cell from there on scores 0
    after_last = _tests_from(assignment, last.answer, root)
    variant(
        "os-exit",
        after_last,
        lambda nb: _set_answer(nb, last.answer, "import os\n\nos._exit(1)\n"),
        problem="kernel died",
    )
    variant(
        "memory-bomb",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            "def _bomb():\n    hog = []\n    while True:\n"
            "        hog.append(bytearray(2**28))\n\n\n_bomb()\n",
        ),
    )
    variant(
        "huge-output",
        set(),
        lambda nb: _set_answer(nb, first.answer, src[first.answer] + "\nprint('x' * 3_000_000)\n"),
        problem="output",
    )
    warn = (
        "import sys\nimport warnings\n\n"
        "warnings.warn('a harmless warning from the answer cell')\n"
        "print('a note on stderr', file=sys.stderr)\n"
    )
    variant(
        "warnings",
        set(),
        lambda nb: _set_answer(nb, first.answer, warn + src[first.answer]),
    )
    broken_first = f"def {first.function}(*args, **kwargs):\n    raise ValueError('not done yet')\n"
    variant(
        "edited-test-cell",
        first.tests,
        lambda nb: (
            _set_answer(nb, first.answer, broken_first),
            _set_answer(nb, first.tests[0], "print('✓ all good')"),
        ),
    )
    variant(
        "deleted-test-cell",
        first.tests,
        lambda nb: (
            _set_answer(nb, first.answer, broken_first),
            nb.cells.remove(_cell(nb, first.tests[0])),
        ),
        problem="deleted",
    )
    variant(
        "changed-cell-ids",
        set(),
        lambda nb: [c.__setitem__("id", f"renamed-{i}") for i, c in enumerate(nb.cells)],
    )
    variant(
        "patched-allclose",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            broken_first + "\n\nimport numpy as np\n\nnp.allclose = lambda *a, **k: True\n",
        ),
        status="needs-review",
        problem="tampering",
    )
    check_mod = re.search(r"from (course_utils\.checks\.\w+) import (\w+)", src[first.tests[0]])
    variant(
        "patched-check",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            broken_first + f"\n\nimport {check_mod.group(1)} as _checks\n\n"
            f"_checks.{check_mod.group(2)} = lambda *a, **k: print('✓ passed')\n",
        ),
        status="needs-review",
        problem="tampering",
    )
    bank.append(
        Entry("not-json", b"{ this is not a notebook", all_tests, status="invalid-notebook")
    )
    return bank


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _tests_from(assignment: str, answer: str, root: Path) -> set[str]:
    """The graded cells at or after the answer cell `answer`."""
    nb = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", 4)
    ids = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    start = next(i for i, m in enumerate(ids) if m.get("grade_id") == answer)
    return {m["grade_id"] for m in ids[start:] if m.get("grade")}


def write(entries: list[Entry], folder: Path, assignment: str, layout: str = "nbgrader") -> None:
    """Write the bank as submissions: nbgrader's submitted/<student>/<assignment>/ or flat."""
    for entry in entries:
        student = re.sub(r"[^A-Za-z0-9_.-]+", "-", entry.name)
        if layout == "nbgrader":
            path = Path(folder) / "submitted" / student / assignment / f"{assignment}.ipynb"
        else:
            path = Path(folder) / f"{student}_{assignment}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(entry.notebook, bytes):
            path.write_bytes(entry.notebook)
        else:
            entry.notebook.metadata["kernelspec"] = dict(KERNELSPEC)
            path.write_text(json.dumps(entry.notebook, indent=1))


def student_id(entry: Entry) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", entry.name).strip("_.-")
