"""No import circles among course_utils's modules, read from their source (no module is imported).

The graph has an edge M -> N for every absolute `import course_utils...` or `from course_utils...
import ...` in M, at module level or inside a function (a function-level import runs too, later):

    import a.b.c / from a.b.c import x    M -> a.b.c, and M -> a.b, M -> a: importing a.b.c runs
                                           the __init__ of a and a.b first (unless M lies inside
                                           that package, which is then initialised already)
    from a.b import c                      M -> a.b.c where c is a submodule, else M -> a.b (the
                                           name is read from a.b's __init__, which must have run)

A cycle in that graph is an import circle: whichever module of it is imported first, another
one meets it half-initialised. The test names each edge that lies on a cycle with the cycle.
Circles outside course_utils/triton_attention/ (other parts of the package) are listed in
KNOWN_ELSEWHERE and xfail there, each with its cycle, until they are broken.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "course_utils"
ROOT = PACKAGE.name

# Cycles found outside triton_attention/ (the kernels' area): (the cycle, module by module).
KNOWN_ELSEWHERE: list[tuple[str, ...]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """{dotted name: file} for every module of the package."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return name in known and known[name].name == "__init__.py"


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that importing `name` (its file at `path`) imports."""
    # Packages that are initialised before `name` runs: its parents, and itself if a package.
    running = set(_prefixes(name)[:-1]) | ({name} if _is_package(name, known) else set())
    targets: set[str] = set()

    def reach(target: str) -> None:
        for prefix in _prefixes(target):  # the packages on the way are initialised first
            if prefix in known and (prefix == target or prefix not in running):
                targets.add(prefix)

    package = name if _is_package(name, known) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT:
                    reach(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    reach(sub)
                else:  # a name defined in base's module (its __init__ for a package)
                    for prefix in _prefixes(base)[:-1]:
                        if prefix in known and prefix not in running:
                            targets.add(prefix)
                    if base in known:
                        targets.add(base)
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def _path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A shortest import path start -> ... -> goal, or None."""
    before = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            path = [node]
            while before[path[-1]] is not None:
                path.append(before[path[-1]])
            return path[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in before:
                before[nxt] = node
                todo.append(nxt)
    return None


def cyclic_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """{(a, b): a cycle a -> b -> ... -> a} for every edge that lies on a cycle."""
    found = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            back = _path(graph, b, a)
            if back is not None:
                found[(a, b)] = [a, *back]
    return found


def _edges(cycle: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))}


def test_the_graph_sees_function_level_and_package_imports(tmp_path):
    """The reader itself: a function-level import is an edge, a name from a package's __init__ is
    an edge to the package, a module's own parent packages are not."""
    pkg = tmp_path / ROOT
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text(f"from {ROOT}.sub.a import X\n")
    (pkg / "sub" / "a.py").write_text(f"X = 1\ndef f():\n    from {ROOT}.b import Y\n")
    (pkg / "sub" / "c.py").write_text(f"from {ROOT}.sub import X\n")
    (pkg / "b.py").write_text(f"import {ROOT}.sub.a\nY = 2\n")
    known = {module_name_in(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    got = {n: imports_of(n, p, known) for n, p in known.items()}
    assert got[f"{ROOT}.sub.a"] == {f"{ROOT}.b"}
    assert got[f"{ROOT}.sub.c"] == {f"{ROOT}.sub"}  # X is read from sub's __init__
    assert got[f"{ROOT}.b"] == {f"{ROOT}.sub", f"{ROOT}.sub.a"}  # sub's __init__ runs first
    assert got[f"{ROOT}.sub"] == {f"{ROOT}.sub.a"}
    assert set(cyclic_edges(got)) == {
        (f"{ROOT}.sub.a", f"{ROOT}.b"),
        (f"{ROOT}.b", f"{ROOT}.sub.a"),
        (f"{ROOT}.b", f"{ROOT}.sub"),
        (f"{ROOT}.sub", f"{ROOT}.sub.a"),
    }


def module_name_in(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_import_cycles():
    """No edge of the package's import graph lies on a cycle, but those of KNOWN_ELSEWHERE."""
    known = set().union(*map(_edges, KNOWN_ELSEWHERE)) if KNOWN_ELSEWHERE else set()
    new = {e: c for e, c in cyclic_edges(import_graph()).items() if e not in known}
    assert not new, "import circles:\n" + "\n".join(
        " -> ".join(c) for c in dict.fromkeys(tuple(c) for c in new.values())
    )


@pytest.mark.parametrize(
    "cycle",
    [
        pytest.param(c, id=" -> ".join(c), marks=pytest.mark.xfail(strict=True, reason="known"))
        for c in KNOWN_ELSEWHERE
    ],
)
def test_known_cycle_outside_the_kernels_is_broken(cycle):
    graph = import_graph()
    assert not _edges(cycle) <= {(a, b) for a in graph for b in graph[a]}, " -> ".join(cycle)


def test_kernels_import_one_way():
    """The teaching kernels and config never import the interface, autograd or the Hopper
    kernels; the Hopper kernels never import autograd or the interface; nothing in the kernels
    imports the compile tooling at module level but what compiles."""
    graph = import_graph()
    ta = f"{ROOT}.triton_attention"
    for low in ("forward", "backward", "decode", "config"):
        up = {ta, f"{ta}.autograd", f"{ta}.hopper.forward_ws", f"{ta}.hopper.backward_ws"}
        assert not graph[f"{ta}.{low}"] & up, (low, graph[f"{ta}.{low}"] & up)
    for hopper in ("forward_ws", "backward_ws", "backward_ws_kernel"):
        assert not graph[f"{ta}.hopper.{hopper}"] & {ta, f"{ta}.autograd"}, hopper
    assert f"{ta}.cross_compile" not in graph[ta]
    assert not graph[f"{ta}.config"] & {m for m in graph if m.startswith(f"{ta}.")}


def _top_level_imports(path: Path) -> list[str]:
    """The modules a file imports at its top level, in order."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_modules_that_import_triton_switch_on_the_interpreter_first():
    """Every module that imports triton at its top level imports harness.triton_interpreter
    before (outside triton_attention/, whose __init__ imports it before any kernel): so that
    importing any of them first, in a fresh process without a GPU, runs Triton's interpreter."""
    switch = f"{ROOT}.harness.triton_interpreter"
    late = []
    for name, path in modules().items():
        if name.startswith(f"{ROOT}.triton_attention.") or name == switch:
            continue
        names = _top_level_imports(path)
        first_triton = next((i for i, n in enumerate(names) if n.split(".")[0] == "triton"), None)
        if first_triton is not None and switch not in names[:first_triton]:
            late.append(name)
    assert not late, f"import {switch} before triton in {late}"
    init = _top_level_imports(PACKAGE / "triton_attention" / "__init__.py")
    assert init[init.index("__future__") + 1 if "__future__" in init else 0] == switch


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the interpreter is for machines without a GPU"
)
def test_a_harness_module_imported_first_runs_the_interpreter():
    import os
    import subprocess
    import sys

    code = (
        "import os\nimport course_utils.harness.triton_puzzles\n"
        "from triton.runtime import interpreter\n"
        "print(os.environ['TRITON_INTERPRET'], interpreter._course_bounds_installed)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert run.stdout.split() == ["1", "True"], run.stderr[-2000:]
