"""The graded kernel's course package (graders/isolation/student_build.py): one rule, by folder.

harness/ and checks/engine/ are copied whole, with every __init__.py and the package's top-level
modules; everything else is a stub. So nothing copied whole may compute an answer: no such module
imports course_utils.references (nor a figure, nor a notebook's checks), and an __init__.py only
re-exports.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from graders.isolation import student_build

PACKAGE = student_build.PACKAGE
FOLDERS = [PACKAGE / f.rstrip("/") for f in student_build.WHOLE_FOLDERS]


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _whole_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if student_build.copied_whole(_rel(p))]


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, at any depth (function bodies too),
    relative imports resolved, `from course_utils import x` read as course_utils.x."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ("course_utils." + _rel(path).removesuffix(".py").replace("/", ".")).split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            found.append((node.lineno, base))
    return found


# Where answers live: a module copied whole may import none of these.
ANSWERS = ("course_utils.references", "course_utils.widgets")


def _answer_imports(path: Path) -> list[str]:
    return [
        f"{_rel(path)}:{line} imports {module}"
        for line, module in _imported_modules(path)
        if module == ANSWERS
        or module.startswith(tuple(a + "." for a in ANSWERS))
        or module in ANSWERS
    ]


def test_the_rule_is_folders_with_no_list_of_names():
    assert not hasattr(student_build, "KEEP") and not hasattr(student_build, "WHOLE")
    assert student_build.WHOLE_FOLDERS == ("harness/", "checks/engine/")
    if (PACKAGE / "checks" / "engine").is_dir():
        # the move into checks/engine has landed: the transition's lists go (see student_build)
        assert not hasattr(student_build, "_UNTIL_ENGINE_KEEP"), "delete _UNTIL_ENGINE_*"
    for rel in ("harness/counting_memory.py", "harness/kernel_inputs.py", "_validate.py"):
        assert student_build.copied_whole(rel)
    for rel in ("references/softmax.py", "widgets/_base.py", "checks/online_softmax.py"):
        assert not student_build.copied_whole(rel)


def test_no_module_copied_whole_imports_an_answer():
    # an __init__.py re-exports by name, and a name it takes from a stubbed module is a stub
    whole = [p for p in _whole_modules() if p.name != "__init__.py"]
    assert any(_rel(p).startswith("harness/") for p in whole)
    leaks = [line for p in whole for line in _answer_imports(p)]
    assert not leaks, "modules copied whole into the graded kernel import answers:\n" + "\n".join(
        leaks
    )


def test_an_init_module_only_re_exports():
    """course_utils/__init__.py re-exports references by name (stubs in the graded kernel): no
    __init__.py defines a function or a class of its own."""
    for path in PACKAGE.rglob("__init__.py"):
        tree = ast.parse(path.read_text())
        defined = [
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        assert not defined, f"{_rel(path)} defines {defined}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return student_build.build(tmp_path_factory.mktemp("student-build"))


def test_harness_and_engine_are_copied_whole(built):
    copied = [p for folder in FOLDERS if folder.is_dir() for p in sorted(folder.rglob("*.py"))]
    assert len(copied) >= 10
    for path in copied:
        assert (built / _rel(path)).read_bytes() == path.read_bytes(), _rel(path)


def test_a_reference_is_a_stub_whose_source_is_gone(built):
    code = (
        "import inspect\n"
        "from course_utils.checks.engine.failures import ReferenceUnavailable\n"
        "from course_utils.references import softmax, tiles\n"
        "from course_utils.harness.counting_memory import CountingMemory\n"
        "calls = ((softmax.online_softmax_stats, ([1.0], 1)), (tiles.tile_kinds, (4, 2, 2)))\n"
        "for f, args in calls:\n"
        "    try:\n"
        "        f(*args)\n"
        "    except ReferenceUnavailable as e:\n"
        "        print('stub', f.__name__)\n"
        "    assert 'exp' not in inspect.getsource(f) and 'range' not in inspect.getsource(f)\n"
        "print(type(CountingMemory(M=8)).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(built.parent), "PATH": ""},
        cwd=built.parent,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == [
        "stub online_softmax_stats",
        "stub tile_kinds",
        "CountingMemory",
    ], out.stdout


def _nb(*cells):
    import nbformat

    v4 = nbformat.v4
    nb = v4.new_notebook()
    for grade_id, outputs in cells:
        cell = v4.new_code_cell("x")
        if grade_id:
            cell.metadata["nbgrader"] = {"grade_id": grade_id, "grade": True, "solution": False}
        cell.outputs = [
            v4.new_output("error", ename=ename, evalue=evalue, traceback=[])
            for ename, evalue in outputs
        ]
        nb.cells.append(cell)
    return nb


def _stub_error(name="course_utils.references.attention.attention_reference"):
    return ("ReferenceUnavailable", f"{name} ({student_build.UNAVAILABLE})")


def test_a_stubs_error_and_what_follows_from_it_become_one_line():
    nb = _nb(
        (None, [("ZeroDivisionError", "division by zero")]),  # the notebook's own, before: kept
        (None, [_stub_error()]),
        (None, [("NameError", "name 'out' is not defined")]),  # follows from the stub's
        ("f_tests", [_stub_error()]),  # a graded cell: never touched
        (None, [("ValueError", "bad shape")]),  # another kind: the learner's own, kept
        (None, [("ExerciseNotReady", f"exercise 1 ({_stub_error()[1]})")]),
    )
    assert student_build.note_course_code(nb) == 3
    kinds = [[o.get("ename") or o.get("text") for o in c.outputs] for c in nb.cells]
    assert kinds[0] == ["ZeroDivisionError"] and kinds[4] == ["ValueError"]
    assert kinds[3] == ["ReferenceUnavailable"]
    assert "(course_utils.references.attention.attention_reference)" in kinds[1][0]
    assert kinds[2][0] == student_build.NOTE_AFTER
    assert kinds[5][0].startswith("Not run while grading: this cell calls the course's own code")


def test_the_stubs_raise_the_message_the_note_looks_for(tmp_path):
    source = "def attention_reference(q, k, v):\n    return q\n"
    stubbed = student_build.strip_module(source, "course_utils.references.attention", set())
    namespace = {}
    exec(compile(stubbed, "stub", "exec"), namespace)
    with pytest.raises(Exception) as raised:
        namespace["attention_reference"](1, 2, 3)
    with pytest.raises(Exception) as read:  # a kernel's .fn, as a demo prints its source
        namespace["attention_reference"].fn  # noqa: B018
    nb = _nb(*[(None, [(type(e.value).__name__, str(e.value))]) for e in (raised, read)])
    assert student_build.note_course_code(nb) == 2
    assert (
        "(course_utils.references.attention.attention_reference.fn)" in nb.cells[1].outputs[0].text
    )
    # what Python, IPython and inspect ask of any object still works
    stub = namespace["attention_reference"]
    assert not hasattr(stub, "_repr_html_") and not hasattr(stub, "__signature__")
    assert str(inspect.signature(stub)) == "(*args, **kwargs)"
    assert stub.__name__ == "attention_reference"


def test_a_demo_that_printed_the_stubs_error_is_noted_too():
    import nbformat

    nb = _nb((None, []))
    said = f"This Triton cannot build the kernel: ReferenceUnavailable: {_stub_error()[1]}\n"
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=said)]
    assert student_build.note_course_code(nb) == 1
    assert nb.cells[0].outputs[0]["text"].startswith("Not run while grading")
    assert student_build.UNAVAILABLE not in nb.cells[0].outputs[0]["text"]
