"""graders/ in layers: no module imports one of a layer above its own, and no import cycle.

Layers, lowest first (graders/__init__.py says what each holds): authoring, isolation, intake,
run, outputs, then the command (graders/grade.py, graders/__main__.py). Every import counts,
at the top of a module or inside a function (a lazy import is still a dependency), read from
the source with `ast`: nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "graders"
LAYERS = ("authoring", "isolation", "intake", "run", "outputs")  # lowest first
COMMAND = len(LAYERS)  # graders/grade.py, graders/__main__.py: above every layer


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    """The layer index of a graders module: its sub-package's, else the command's."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        raise AssertionError(f"{module}: in no layer; add its folder to LAYERS")
    return COMMAND


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(graders module imported, line) for every import in the module's source."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def resolve(name: str) -> str | None:
        """The graders module `name` is, or lies in (a function or class of it); None outside."""
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # `from ..x import y` in graders.run.cluster: graders.x
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
            targets = [
                f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin
                for a in node.names
            ]
        for target in targets:
            if target.split(".")[0] != "graders":
                continue
            resolved = resolve(target)
            if resolved is not None and resolved != module:
                found.append((resolved, node.lineno))
    return found


def graph() -> dict[str, list[tuple[str, int]]]:
    found = modules()
    return {m: imports(m, p, set(found)) for m, p in found.items()}


LAYERS_NAMED = (*LAYERS, "the command")


def upward(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import of a module of a higher layer, said in one line. A package's __init__ (a
    docstring) is no module of a layer: `import graders.run.pipeline` imports the module."""
    packages = {m for m, p in modules().items() if p.name == "__init__.py"}
    return [
        f"{m} (line {line}) imports {target}: {LAYERS_NAMED[layer(target)]} is above "
        f"{LAYERS_NAMED[layer(m)]}"
        for m, targets in edges.items()
        for target, line in targets
        if target not in packages and layer(target) > layer(m)
    ]


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_every_sub_package_is_a_layer():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(LAYERS), "a folder of graders/ that is no layer, or a layer gone"
    for name in LAYERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc, f"graders/{name}/__init__.py: say the layer's job in its docstring"


def test_no_module_imports_a_layer_above_its_own():
    edges = graph()
    assert sum(len(t) for t in edges.values()) > 20  # the parser does see the imports
    assert upward(edges) == []


def test_no_import_cycle_among_graders_modules():
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    "source, target, above",
    [
        ("from ..outputs import report\n", "graders.outputs.report", True),
        ("def f():\n    from graders.grade import grade\n", "graders.grade", True),
        ("import graders.run.pipeline\n", "graders.run.pipeline", True),
        ("from .sandbox import REPO\n", "graders.isolation.sandbox", False),
        ("from ..authoring import course\n", "graders.authoring.course", False),
    ],
)
def test_the_scan_sees_every_spelling_of_an_import(tmp_path, source, target, above):
    """Relative, absolute and lazy imports alike, read as if they were the source of
    graders/isolation/cgroups.py (a module of the second layer)."""
    path = tmp_path / "cgroups.py"
    path.write_text(source)
    found = imports("graders.isolation.cgroups", path, set(modules()))
    assert [t for t, _ in found] == [target]
    assert bool(upward({"graders.isolation.cgroups": found})) == above


def test_the_cycle_finder_finds_a_cycle():
    edges = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert cycles(edges) == [["a", "b", "c"]]
