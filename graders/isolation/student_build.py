"""The course package as a graded notebook's kernel sees it: every answer taken out.

While a submission is graded, its kernel imports a copy of course_utils in which every function
that computes an exercise's answer (the references, the figures, the checks' own cases, replays
and private helpers, the Triton kernels) is a stub that raises ReferenceUnavailable when it is
called or one of its attributes is read (a kernel's `.fn`), and whose source is not there to
read (no `inspect.getsource` then `exec`). Names stay importable (a stubbed module keeps its
imports), so a notebook's imports work and only a call into an answer fails, named
`calls-reference` by the check.

One rule, by folder, so that adding an exercise never touches this file. Copied whole:

    harness/          what a learner's code may use (CountingMemory, the hardware facts, the ring
                      plumbing, the Triton skeletons and runners, the kernels' input checks)
    checks/engine/    the instrumentation the grader talks to (cases, watch, wire, remote)
    every __init__.py, and the package's top-level modules (_validate: input checks;
                      student_errors: the one-line error of an exercise not written yet)

Everything else is stubbed. No module of those may compute an answer (tests/harness/
test_student_build.py checks that none imports course_utils.references).

    build(dest, assignment) -> dest/course_utils

A notebook's demonstrations call that code too (the reference beside the learner's answer, a
figure, a check run by hand), so in a graded run they fail. `note_course_code` turns those
failures, in the cells nbgrader does not grade, into one plain line of the autograded notebook,
so that the feedback a student gets shows no error that is not theirs:

    note_course_code(nb) -> cells changed
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from graders.authoring.course import REPO

PACKAGE = REPO / "course_utils"

UNAVAILABLE = "course code, not available while a notebook is graded"  # in every stub's error

# Folders copied whole, relative to the package: no answer in them.
WHOLE_FOLDERS = ("harness/", "checks/engine/")


def copied_whole(rel: str) -> bool:
    """Whether the module at `rel` (a path relative to the package, "/"-separated) is copied
    whole into the graded kernel's package; every other module is stubbed."""
    return (
        rel.endswith("__init__.py")
        or "/" not in rel  # the package's top level: __init__, _validate, student_errors
        or rel.startswith(WHOLE_FOLDERS)
    )


# What an assignment's exercises may call besides (an earlier notebook's answer, allowed there):
# kept whole only in the build for that assignment.
# Notebook 08's autograd.Function runs the course's forward kernel: the forward is not that
# notebook's exercise, and the learner's own forward (notebook 06's step and finalize) is not in
# its namespace. The backward references stay stubbed.
ALLOWED = {
    "05_split_kv": {"references/softmax.py": {"merge_partials"}},
    "08_triton_backward": {
        "triton_attention/forward.py": {"flash_attention_fwd"},
        # its autotuning sets, which forward.py imports from config (not an answer)
        "triton_attention/config.py": {"FWD_FAMILIES", "family"},
    },
}


def _defined(stmt: ast.stmt) -> list[str]:
    """The top-level names a statement defines."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _used(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def strip_module(source: str, module: str, keep: set[str]) -> str:
    """The module's source with only `keep` (and the top-level names they use) left whole."""
    tree = ast.parse(source)
    imports = [
        s
        for s in tree.body
        if isinstance(s, ast.Import | ast.ImportFrom) and getattr(s, "module", "") != "__future__"
    ]
    definers: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for name in _defined(stmt):
            definers.setdefault(name, []).append(stmt)
    kept: set[str] = set()
    todo = [n for n in keep if n in definers]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        for stmt in definers[name]:
            todo += [n for n in _used(stmt) if n in definers and n not in kept]
    body = [ast.unparse(s) for s in imports]
    body.append(
        "from course_utils.checks.engine.failures import ReferenceUnavailable"
        " as _ReferenceUnavailable\n\n"
        "class _Stub:\n"
        '    """Calls the stub function it wraps; reading a public attribute (a kernel\'s .fn\n'
        '    or .src) raises the same error. inspect follows __wrapped__ to that function."""\n'
        "    def __init__(self, function):\n"
        "        self.__wrapped__ = function\n"
        "        self.__name__ = self.__qualname__ = function.__name__\n"
        "        self.__module__ = function.__module__\n"
        "    def __call__(self, *args, **kwargs):\n"
        "        return self.__wrapped__(*args, **kwargs)\n"
        "    def __getattr__(self, attr):\n"
        "        if attr.startswith('_'):  # Python's and IPython's own probes: as for any object\n"
        "            raise AttributeError(attr)\n"
        "        raise _ReferenceUnavailable(\n"
        f"            f'{module}.{{self.__name__}}.{{attr}} ({UNAVAILABLE})'\n"
        "        )\n\n"
        "def _stub(name):\n"
        "    def unavailable(*args, **kwargs):\n"
        "        raise _ReferenceUnavailable(\n"
        f"            f'{module}.{{name}} ({UNAVAILABLE})'\n"
        "        )\n"
        "    unavailable.__name__ = unavailable.__qualname__ = name\n"
        f"    unavailable.__module__ = {module!r}\n"
        "    return _Stub(unavailable)"
    )
    done: set[int] = set()
    for stmt in tree.body:
        names = _defined(stmt)
        if not names:
            continue
        if any(n in kept for n in names):
            if id(stmt) not in done:
                body.append(ast.unparse(stmt))
                done.add(id(stmt))
        else:
            body += [f"{n} = _stub({n!r})" for n in names if not n.startswith("__")]
    doc = f'"""{module}, as a graded notebook sees it: course code replaced by stubs."""'
    return "\n\n".join([doc, "from __future__ import annotations", *body]) + "\n"


PREBUILT = ".student_build"  # a grading template's folder of stripped packages, one per assignment


def prebuilt(template: Path, assignment: str) -> Path | None:
    """The stripped course_utils the template holds for `assignment` (build_all), or None."""
    path = Path(template) / PREBUILT / assignment / "course_utils"
    return path if path.is_dir() else None


def build_all(template: Path, assignments: list[str]) -> None:
    """Build each assignment's stripped package once into the grading template: the sandbox binds
    it read-only into every kernel of that assignment, so one copy serves them all."""
    for assignment in assignments:
        build(Path(template) / PREBUILT / assignment, assignment)


def build(dest: Path, assignment: str | None = None, package: Path = PACKAGE) -> Path:
    """Write the stripped course_utils for `assignment` under dest; returns dest/course_utils."""
    extra = ALLOWED.get(assignment or "", {})
    out = Path(dest) / "course_utils"
    shutil.rmtree(out, ignore_errors=True)
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if copied_whole(rel):
            shutil.copyfile(path, target)
            continue
        module = "course_utils." + rel.removesuffix(".py").replace("/", ".")
        keep = extra.get(rel, set())
        target.write_text(strip_module(path.read_text(), module, keep))
    return out


_STUBBED = re.compile(r"(course_utils\.[\w.]+) \(" + re.escape(UNAVAILABLE) + r"\)")
NOTE_CALLS = (
    "Not run while grading: this cell calls the course's own code ({name}), which the grader "
    "does not load. It runs in your notebook.\n"
)
NOTE_AFTER = (
    "Not run while grading: it needs what a cell above computes with the course's own code. "
    "It runs in your notebook.\n"
)


# What a later cell raises when an earlier one failed before defining what it uses
KNOCK_ON = {"NameError", "UnboundLocalError", "KeyError", "ExerciseNotReady"}


def note_course_code(nb) -> int:
    """Replace, in the code cells nbgrader does not grade, each error that a stub raised (or a
    printed line that quotes one: a demo that caught it), and each later error that follows
    from it (KNOCK_ON: a name or key the failed cell never defined), by one plain line that
    says so. An error before the first stub's, or of another kind, is the notebook's own and
    stays; graded cells (answers, tests, tasks) are never touched, so no score changes.
    Returns the number of cells changed."""
    import nbformat

    stubbed, changed = False, 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        graded = meta.get("grade") or meta.get("solution") or meta.get("task")
        outputs = cell.get("outputs", [])
        touched = False
        for i, out in enumerate(outputs):
            kind = out.get("output_type")
            if kind == "stream":  # a demo that caught the stub's error and printed it
                text = out.get("text", "")
                said = text if isinstance(text, str) else "".join(text)
            elif kind == "error":
                said = f"{out.get('ename', '')}: {out.get('evalue', '')}"
            else:
                continue
            found = _STUBBED.search(said)
            if found:
                stubbed = True
                note = NOTE_CALLS.format(name=found.group(1))
            elif stubbed and kind == "error" and out.get("ename") in KNOCK_ON:
                note = NOTE_AFTER
            else:
                continue
            if not graded:
                outputs[i] = nbformat.v4.new_output("stream", name="stdout", text=note)
                touched = True
        changed += touched
    return changed
