"""The course package as a graded notebook's kernel sees it: every answer taken out.

While a submission is graded, its kernel imports a copy of course_utils in which every function that
computes an exercise's answer (the references, the figures' helpers, the checks' own cases, replays
and private helpers, the Triton kernels) is a stub that raises ReferenceUnavailable, and whose
source is not there to read (no `inspect.getsource` then `exec`). What a learner's code may use
stays whole: the checks' engine (checks/engine: the instrumentation the grader talks to), input
validation, the CountingMemory of notebook 04, the KeyParts of notebook 02 and notebook 11's
check_backend (harness), the hardware facts of the roofline module, the Triton skeletons of
notebooks 06, 08 and 09, the launchers of notebook 06's puzzles and the ring plumbing of notebook 10
(ring_comm: processes, RingComm, the runner; ring_guard: what a rank may use).
Names stay importable, so a notebook's imports work and only a call into an answer fails, named
`calls-reference` by the check.

    build(dest) -> dest/course_utils
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from graders.authoring.course import REPO

PACKAGE = REPO / "course_utils"

# Modules copied whole: no answer in them.
WHOLE = {
    "__init__.py",
    "_validate.py",
    "student_errors.py",
    "checks/__init__.py",
    # the checks' engine: cases, the instrumentation the grader talks to (watch, wire, remote),
    # the memory budget's refusal of torch, JAX, ... (no answer in it)
    "checks/engine/__init__.py",
    "checks/engine/array_libraries.py",
    "checks/engine/cases.py",
    "checks/engine/display.py",
    "checks/engine/failures.py",
    "checks/engine/feedback.py",
    "checks/engine/interpreter_limits.py",
    "checks/engine/kernels.py",
    "checks/engine/quizzes.py",
    "checks/engine/remote.py",
    "checks/engine/rules.py",
    "checks/engine/tracing.py",
    "checks/engine/watch.py",
    "checks/engine/wire.py",
    "harness/key_parts.py",  # notebook 02's key sets
    "harness/capstone_backend.py",  # notebook 11's check_backend, passed to the learner's block
    "harness/ring_comm.py",
    "harness/ring_guard.py",  # notebook 10's rank guard: instrumentation, run in the graded kernel
    "triton_attention/__init__.py",
    "harness/triton_bounds.py",  # the interpreter's bounds guard (no answer in it)
    "harness/triton_interpreter.py",  # the interpreter switch, before triton (no answer in it)
    "harness/triton_learner.py",
    "harness/decode_learner.py",
    "harness/triton_puzzles.py",
    "harness/triton_load_log.py",  # the puzzles' runners record the loads (no answer in it)
    "harness/triton_learner_backward.py",
    "widgets/__init__.py",
}
# Modules of which only these top-level names (and what they use) are kept; every other name
# becomes a stub. A module not listed here or in WHOLE keeps no name.
KEEP = {
    "references/memory.py": {
        "CountingMemory",
        "OnChipMemoryError",
        "ThreadBlockError",
        "ArrayTraffic",
        "STATS_BYTES",
        "record_loop",
    },
    "references/softmax.py": {"NEG_INF"},
    "references/ring_attention.py": {"SKIP", "FULL", "CAUSAL"},
    "references/roofline.py": {"Hardware", "A100", "H100_SXM", "H200"},
    "triton_attention/forward.py": {"_check_inputs"},
    # notebook 09's skeleton validates its inputs and picks num_splits as the course kernel does
    "triton_attention/decode.py": {
        "check_decode_inputs",
        "choose_num_splits",
        "pages_per_split",
        "LOG2E",
        "MAX_SPLITS",
        "MIN_ROWS",
    },
    "widgets/_base.py": {"LiveFigure"},
    # notebook 11: the learner's attention block turns a backend's name into the function
    "references/gpt.py": {"resolve_attention", "attention_label", "BACKENDS"},
    "references/backward.py": {"naive_attention_torch"},
}


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
        "def _stub(name):\n"
        "    def unavailable(*args, **kwargs):\n"
        "        raise _ReferenceUnavailable(\n"
        f"            f'{module}.{{name}} (course code, not available while a notebook is "
        "graded)'\n"
        "        )\n"
        "    unavailable.__name__ = unavailable.__qualname__ = name\n"
        f"    unavailable.__module__ = {module!r}\n"
        "    return unavailable"
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
        if rel in WHOLE:
            shutil.copyfile(path, target)
            continue
        module = "course_utils." + rel.removesuffix(".py").replace("/", ".")
        module = module.removesuffix(".__init__")
        keep = KEEP.get(rel, set()) | extra.get(rel, set())
        target.write_text(strip_module(path.read_text(), module, keep))
    return out
