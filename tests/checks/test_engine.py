"""The checks' engine: what the reference watch calls infrastructure exists, it tells a learner's
code from the course's by identity, the engine stands alone (the grader copies it whole into a
graded kernel), and no check module grows past ~800 lines."""

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


def test_memory_the_learner_never_writes_reads_nan():
    """An output the learner allocates and forgets to fill (a head the kernel skips, the ragged
    last tile) must fail however the allocator recycles memory: a freed buffer that held the
    right values once made such a kernel pass on CI. Inside the call np.empty, np.empty_like and
    torch's empty tensors hold NaN; what the learner writes is untouched; after it, nothing of
    the switch is left."""
    import numpy as np
    import torch

    right = np.linspace(-1.0, 1.0, 4096).reshape(64, 64)

    def learner(x, t):
        half = np.empty_like(x)
        half[:32] = x[:32]  # the rows past 32 are never written
        return half, np.empty((8, 8)), np.empty(4, dtype=np.int64), torch.empty(2, 3, 64)

    import torch.utils.deterministic as deterministic

    before = (np.empty, np.empty_like, torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              deterministic.fill_uninitialized_memory)  # fmt: skip
    half, fresh, ints, tensor = watch.call_learner(learner, right, torch.ones(1), name="learner")
    np.testing.assert_array_equal(half[:32], right[:32])
    assert np.isnan(half[32:]).all() and np.isnan(fresh).all() and torch.isnan(tensor).all()
    assert ints.dtype == np.int64  # integers have no NaN: left as they come
    after = (np.empty, np.empty_like, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             deterministic.fill_uninitialized_memory)  # fmt: skip
    assert all(a is b for a, b in zip(after, before, strict=True)), (before, after)


def test_traced_inputs_keep_their_kind_under_the_nan_fill():
    """np.empty_like of a Traced input still records the learner's loads of that input."""
    import numpy as np

    def learner(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = 2 * x[i]
        return out

    report = watch.instrumented_call(learner, (np.arange(6.0),), name="learner", trace=(0,))
    np.testing.assert_array_equal(report.result, 2 * np.arange(6.0))
    assert report.loads, "the traced input recorded no load"


def test_the_nan_fill_costs_no_compiler_import():
    """torch.use_deterministic_algorithms imports torch._inductor (about 1 s, once per process:
    every student's first check, every graded notebook's kernel); the fill needs only the switch
    it sets, so a learner's call must leave torch._inductor unimported."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from course_utils.checks.engine.watch import call_learner\n"
        "out = call_learner(lambda: torch.empty(4), name='f')\n"
        "print(bool(torch.isnan(out).all()), 'torch._inductor' in sys.modules)\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["True", "False"], got.stdout + got.stderr


def test_a_learner_helper_equal_to_a_course_one_is_still_the_learners():
    """Code objects compare equal without their file: a learner's helper with a course helper's
    name and body, at the same line, is equal to it (name, bytecode, constants, first line). The
    watch keyed by the code object scored such a learner 0 ("calls __main__._tiles"); keyed by
    identity, a learner calling their own copy after the course one was seen is not calling the
    reference."""
    import inspect
    import textwrap

    import pytest

    from course_utils.checks.engine.failures import CheckFailure
    from course_utils.references import memory

    course = memory._tiles
    lines, first = inspect.getsourcelines(course)
    cell = {"__name__": "__main__"}  # a notebook cell, compiled as ipykernel names its file
    source = "\n" * (first - 1) + textwrap.dedent("".join(lines))
    exec(compile(source, "/tmp/ipykernel_4242/2093650311.py", "exec"), cell)
    own = cell["_tiles"]
    assert own.__code__ == course.__code__ and own.__code__ is not course.__code__

    def calls_the_course(N):
        return course(N, 64)

    def calls_its_own(N):
        return own(N, 64)

    with pytest.raises(CheckFailure, match="calls-reference"):
        watch.instrumented_call(calls_the_course, (100,), name="tiles")
    assert watch.instrumented_call(calls_its_own, (100,), name="tiles").result == 2
