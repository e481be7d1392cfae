"""Running the learner's function: read-only inputs, the reference watch, spies, memory.

`instrumented_call` runs the learner's function under these instruments and returns a
CallReport: plain data (values, bytes, load counts), which the Rules (engine.rules) judge.

    read-only inputs   every array handed to the learner is a read-only copy, so `x -= shift`
                       raises at once and is named `mutates-input`, with the argument;
    a memory budget    the peak of new allocations (tracemalloc sees NumPy's buffers);
    unwritten memory   np.empty, np.empty_like and torch's empty tensors hold NaN, so an output
                       the code forgets to write fails even where the allocator hands back a
                       freed buffer that held the right values (a reference's, a run before);
    traced inputs      Traced arrays (engine.tracing) record which elements the code loads;
    spied helpers      calls of the learner's own helper functions, with their arguments;
    a reference watch  any call into course_utils (references, figures' and checks' helpers)
                       from the learner's function is named `calls-reference`.

It is the only place that runs learner code, so the same cases, budgets and diagnoses can run in
the learner's process (a notebook) or be asked for by a grader that compares in a process of its
own (graders.isolation.remote, through engine.remote).

The learner's function runs with warnings silenced and stderr captured: an nbgrader test cell that
writes to stderr scores 0, and a correct solution must never lose points for a harmless warning.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import site
import sys
import sysconfig
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from course_utils.checks.engine.array_libraries import array_libraries_used
from course_utils.checks.engine.display import _arg_names
from course_utils.checks.engine.failures import (
    CALLS_REFERENCE,
    DISABLES_CHECK,
    MUTATES_INPUT,
    CheckFailure,
    ReferenceUnavailable,
    _array_library_message,
)
from course_utils.checks.engine.tracing import Traced, _conversions_keep_tracing, traced

if TYPE_CHECKING:
    from course_utils.checks.engine.tracing import LoadLog


# ---------------------------------------------------------------------------------------------
# Running the learner's function: read-only inputs, the reference watch, spies, memory
# ---------------------------------------------------------------------------------------------

# Modules of course_utils a learner's function may run without calling a reference: the checks'
# engine (the instrumentation itself, the comparisons and messages it runs beside the learner's
# code), input validation, and the interpreter's wrappers (the bounds guard around Triton's own
# load and store, the speed-ups around its launcher and language patching: their frames run
# below the learner's kernel). Dotted paths, matched as prefixes.
_INFRASTRUCTURE = (
    "course_utils.checks.engine.cases",
    "course_utils.checks.engine.display",
    "course_utils.checks.engine.failures",
    "course_utils.checks.engine.feedback",
    "course_utils.checks.engine.quizzes",
    "course_utils.checks.engine.remote",
    "course_utils.checks.engine.rules",
    "course_utils.checks.engine.tracing",
    "course_utils.checks.engine.watch",
    "course_utils.checks.engine.wire",
    "course_utils._validate",
    "course_utils.harness.triton_bounds",
    "course_utils.harness.triton_interpreter_speed",
)

# Where the libraries live: frames of these files are neither the course's nor the learner's.
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.realpath(p) + os.sep
            for p in [
                *(sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib")),
                *(site.getsitepackages() if hasattr(site, "getsitepackages") else []),
                *(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))),
            ]
            if p
        }
    )
)


# id(code object) -> _frame_kind's answer, read first by the watch's hook. Keyed by id: a code
# object's own hash is computed afresh at each lookup (from its name, bytecode and constants), and
# two code objects compare equal without their file, so a learner's helper written as a course
# helper, at its line, would take the course's kind (test_engine.py). _SEEN keeps each code object
# alive, so that its id is never another's while it is a key.
_KINDS: dict[int, str] = {}
_SEEN: list = []


def _frame_kind(frame) -> str:
    """'course', 'infrastructure', 'library' or 'learner': who wrote the code a frame runs.

    Course code that hooks a library's internals (a counter wrapped around the interpreter's
    tl.dot) is infrastructure: its module names the hooks in `INSTRUMENTS`.
    """
    code = frame.f_code
    kind = _KINDS.get(id(code))
    if kind is None:
        module = frame.f_globals.get("__name__", "") or ""
        filename = code.co_filename
        if module.split(".")[0] == "course_utils":
            instruments = frame.f_globals.get("INSTRUMENTS", ())
            infrastructure = module.startswith(_INFRASTRUCTURE) or code.co_name in instruments
            kind = "infrastructure" if infrastructure else "course"
        elif filename.startswith("<frozen") or (
            os.path.isabs(filename) and os.path.realpath(filename).startswith(_LIBRARY_DIRS)
        ):
            kind = "library"
        else:
            kind = "learner"
        _SEEN.append(code)
        _KINDS[id(code)] = kind
    return kind


def _caller_kind(frame, top) -> str:
    """'course' or 'learner': who called the code of frame, library and infrastructure frames
    skipped (Triton's interpreter, torch's autograd, the interpreter's bounds guard).

    top: the frame that called the learner's function. Reaching it means the answer itself is
    course code (passed as the answer, or wrapped in a functools.partial): 'learner'.
    """
    caller = frame.f_back
    while caller is not None:
        if caller is top:
            return "learner"
        kind = _frame_kind(caller)
        if kind in ("course", "learner"):
            return kind
        caller = caller.f_back
    return "course"


class _ReferenceCallWatch:
    """A profile hook that notes whether the learner's code calls a course_utils function.

    Every function shipped in course_utils counts (references, figures' helpers such as tile_kinds
    and sm_fill_state, the checks' own helpers) except the instrumentation itself, when the code
    that calls it (library frames skipped: Triton's interpreter, torch's autograd, functools) is
    the learner's. Functions named in `allow` may be called (an earlier notebook's answer, the
    methods of an exercise's API, the check's runner). Course code calls its own helpers freely,
    but learner code that course code runs (a kernel launched by the runner, a ring rank, a
    block given an attention backend) is watched again: an answer cannot hide a reference call
    inside an allowed runner.
    """

    def __init__(self, allow: tuple[str, ...] = (), off: bool = False):
        self.called: str | None = None
        self.allow = set(allow)
        self.off = off
        self.top = None  # the frame that calls the learner's function
        self.hook = self._hook()  # what sys.setprofile is given

    def _hook(self):
        """The profile function. It runs at every call, return and C call of the learner's code
        and all it runs (in Triton's interpreter a sixth of a check's time went into it), so the
        common case is kept short: a closure (its call costs about a third less than an
        instance's __call__), _frame_kind's cache read inline by the code object's id, the
        function's name looked at only for course code."""
        if self.off:
            return lambda frame, event, arg: None
        watch, allow, kinds = self, self.allow, _KINDS

        def hook(frame, event, arg):
            if event != "call" or watch.called is not None:
                return
            code = frame.f_code
            if (kinds.get(id(code)) or _frame_kind(frame)) != "course":
                return
            name = code.co_name
            if name in allow or name == "<module>":  # importing a module is not calling it
                return
            if _caller_kind(frame, watch.top) == "learner":
                watch.called = f"{frame.f_globals.get('__name__')}.{name}"

        return hook

    def __call__(self, frame, event, arg):
        self.hook(frame, event, arg)


@dataclass
class CallReport:
    """What one instrumented call of the learner's function did. Plain data, so that a grader can
    receive it from the process that ran the learner's code.

    result: the returned value (Traced arrays made plain).  peak: bytes of new allocations at the
    peak (when measured).  loads: {argument name: LoadLog} of the traced arguments.  calls: {helper
    name: [(args, kwargs), ...]} for the spied helpers.
    """

    result: object = None
    peak: int | None = None
    loads: dict[str, LoadLog] = field(default_factory=dict)
    calls: dict[str, list] = field(default_factory=dict)
    traced: dict = field(default_factory=dict)  # trace key (position or keyword) -> name in loads


def _freeze(value):
    """A read-only deep copy of the arrays in value (tuples, lists and dicts rebuilt)."""
    if isinstance(value, np.ndarray):
        copy = value.copy()
        if copy.dtype == object:
            for i in np.ndindex(copy.shape):
                copy[i] = _freeze(copy[i])
        copy.flags.writeable = False
        return copy
    if isinstance(value, tuple | list):
        return type(value)(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _writable_copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple | list):
        return type(value)(_writable_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _writable_copy(v) for k, v in value.items()}
    return value


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and _equal_nan(a, b)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return True


def _equal_nan(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return all(_same(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
    try:
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    except TypeError:
        return bool(np.array_equal(a, b))


def _is_read_only_error(exc: BaseException) -> bool:
    return isinstance(exc, ValueError) and "read-only" in str(exc)


def _mutated_argument(fn, args, kwargs, names) -> str | None:
    """Run fn on writable copies; the name of the first argument it changes, if any."""
    copies_a, copies_k = _writable_copy(args), _writable_copy(kwargs)
    with _quiet():
        try:
            fn(*copies_a, **copies_k)
        except Exception:
            pass
    values = list(args) + list(kwargs.values())
    changed = list(copies_a) + list(copies_k.values())
    for name, before, after in zip(names, values, changed, strict=False):
        if not _same(before, after):
            return name
    # a write that changed no value on this case (x[x == -inf] = 0 with no -inf): make one
    # argument read-only at a time until the write raises
    keys = list(range(len(args))) + list(kwargs)
    for name, key in zip(names, keys, strict=False):
        trial_a, trial_k = list(_writable_copy(args)), _writable_copy(kwargs)
        if isinstance(key, int):
            trial_a[key] = _freeze(args[key])
        else:
            trial_k[key] = _freeze(kwargs[key])
        with _quiet():
            try:
                fn(*trial_a, **trial_k)
            except Exception as exc:
                if _is_read_only_error(exc):
                    return name
    return None


@contextlib.contextmanager
def _quiet():
    with (
        warnings.catch_warnings(),
        np.errstate(all="ignore"),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _unwritten_reads_nan():
    """While the block runs, new uninitialized float arrays hold NaN: np.empty and np.empty_like
    (the module's functions, as learners call them) and torch's empty tensors (torch's
    fill_uninitialized_memory, which works under its deterministic mode; torch is switched only
    when something imported it already). Restores what was there before."""
    saved_np = np.empty, np.empty_like

    def poisoned(make):
        @functools.wraps(make)
        def made(*args, **kwargs):
            array = make(*args, **kwargs)
            if isinstance(array, np.ndarray) and array.dtype.kind in "fc":
                array.view(np.ndarray).fill(np.nan)  # the buffer, past any subclass's hooks
            return array

        return made

    torch = sys.modules.get("torch")
    switch_torch = torch is not None and hasattr(torch, "use_deterministic_algorithms")
    if switch_torch:
        import torch.utils.deterministic as deterministic

        was = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            deterministic.fill_uninitialized_memory,
        )
        # warn_only: an op with no deterministic kernel warns (silenced by _quiet), never raises.
        # The C switch itself: torch.use_deterministic_algorithms also imports torch._inductor
        # (1 s, once per process) to set a compiler flag that the fill does not read.
        switch = getattr(torch._C, "_set_deterministic_algorithms", None)
        switch = switch or torch.use_deterministic_algorithms
        switch(True, warn_only=True)
        deterministic.fill_uninitialized_memory = True
    np.empty, np.empty_like = poisoned(saved_np[0]), poisoned(saved_np[1])
    try:
        yield
    finally:
        np.empty, np.empty_like = saved_np
        if switch_torch:
            switch(was[0], warn_only=was[1])
            deterministic.fill_uninitialized_memory = was[2]


@contextlib.contextmanager
def _spying(fn: Callable, names: tuple[str, ...], calls: dict[str, list]):
    """Record the calls of the learner's own helpers (globals of fn) while the block runs."""
    namespace = getattr(getattr(fn, "__wrapped__", fn), "__globals__", None)
    saved = {}
    for name in names:
        calls[name] = []
        target = namespace.get(name) if namespace is not None else None
        if not callable(target):
            continue

        def spy(*a, _target=target, _log=calls[name], **k):
            _log.append((a, k))
            return _target(*a, **k)

        saved[name] = target
        namespace[name] = functools.wraps(target)(spy)
    try:
        yield
    finally:
        for name, target in saved.items():
            namespace[name] = target


def _plain_result(value):
    if isinstance(value, Traced):
        return np.array(value.view(np.ndarray))
    if isinstance(value, tuple | list):
        return type(value)(_plain_result(v) for v in value)
    return value


def instrumented_call(
    fn: Callable,
    args: tuple,
    kwargs: dict | None = None,
    *,
    name: str,
    allow: tuple[str, ...] = (),
    trace: tuple = (),
    memory: bool = False,
    spy: tuple[str, ...] = (),
) -> CallReport:
    """Call the learner's fn on read-only copies of args, under the watch; return a CallReport.

    trace: the arguments (positions or keyword names) handed over as Traced arrays.
    memory: measure the peak of new allocations during the call (tracemalloc), and refuse
        torch, JAX, CuPy, TensorFlow, Numba and MLX, whose allocations it cannot see
        (`array-library-in-numpy-exercise`, _array_libraries).
    spy: names of the learner's own helpers (in fn's globals) whose calls are recorded.

    Raises NotImplementedError unchanged (an exercise not done yet), _LearnerRaised for any other
    exception of the learner's code, and CheckFailure for a mutated input (`mutates-input`), a
    call into course_utils (`calls-reference`) or a switched-off watch.
    """
    remote = getattr(fn, "__course_call__", None)
    if remote is not None:  # a grader's handle on a function that lives in another process
        return remote(
            args, kwargs or {}, name=name, allow=allow, trace=trace, memory=memory, spy=spy
        )
    if not callable(fn):
        raise CheckFailure(f"{name}: expected a function, got {type(fn).__name__} {fn!r}")
    kwargs = dict(kwargs or {})
    names = _arg_names(fn, len(args), kwargs)
    call_args, call_kwargs = list(_freeze(args)), _freeze(kwargs)
    report = CallReport()
    for key in trace:
        if isinstance(key, int):
            report.traced[key] = names[key]
            call_args[key], report.loads[names[key]] = traced(args[key])
        else:
            report.traced[key] = key
            call_kwargs[key], report.loads[key] = traced(kwargs[key])
    # tests/checkhelp.py marks the checks' own buggy replays, run as if a learner wrote them
    watch = _ReferenceCallWatch(allow, off=getattr(fn, "__course_test_double__", False))
    previous = sys.getprofile()
    started_tracemalloc = False
    switched_off = False
    try:
        with (
            _quiet(),
            _unwritten_reads_nan(),
            _spying(fn, spy, report.calls),
            _conversions_keep_tracing() if trace else contextlib.nullcontext(),
            array_libraries_used(fn) if memory else contextlib.nullcontext(()) as libraries,
        ):
            if memory:
                started_tracemalloc = not tracemalloc.is_tracing()
                if started_tracemalloc:
                    tracemalloc.start()
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
            watch.top = sys._getframe()
            sys.setprofile(watch.hook)
            try:
                result = fn(*call_args, **call_kwargs)
            finally:
                switched_off = sys.getprofile() is not watch.hook
                sys.setprofile(previous)
                if memory:
                    report.peak = max(0, tracemalloc.get_traced_memory()[1] - base)
                    if started_tracemalloc:
                        tracemalloc.stop()
    except NotImplementedError:
        raise
    except ReferenceUnavailable as exc:
        raise CheckFailure(_calls_reference_message(name, str(exc))) from None
    except Exception as exc:
        if watch.called:  # it called course code, which then raised: that is what went wrong
            raise CheckFailure(_calls_reference_message(name, watch.called)) from None
        if _is_read_only_error(exc):
            arg = _mutated_argument(fn, args, kwargs, names) or "one of its input arrays"
            raise CheckFailure(_mutation_message(name, arg, exc)) from None
        raise _LearnerRaised(exc) from exc
    if switched_off:
        raise CheckFailure(
            f"✗ {name} switches off the check's watch (sys.setprofile) while it runs.\n"
            f"  likely mistake: {DISABLES_CHECK.title} [misconception: {DISABLES_CHECK.slug}]\n"
            f"  {DISABLES_CHECK.explanation}"
        )
    if watch.called:
        raise CheckFailure(_calls_reference_message(name, watch.called))
    if libraries:
        raise CheckFailure(_array_library_message(name, libraries))
    report.result = _plain_result(result)
    return report


def call_learner(fn: Callable, *args, name: str, allow: tuple[str, ...] = (), **kwargs):
    """The learner's fn(*args, **kwargs) on read-only inputs, quietly, under the watch.

    NotImplementedError passes through unchanged (an exercise not done yet). Any other exception
    becomes _LearnerRaised, reported with its input by the caller. A mutated input raises
    CheckFailure (`mutates-input`), a call into course_utils CheckFailure (`calls-reference`).
    """
    return instrumented_call(fn, args, kwargs, name=name, allow=allow).result


class _LearnerRaised(Exception):
    def __init__(self, exc: Exception):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.exc = exc


def _calls_reference_message(name: str, what: str) -> str:
    return (
        f"✗ {name} calls {what}.\n"
        f"  likely mistake: {CALLS_REFERENCE.title} [misconception: {CALLS_REFERENCE.slug}]\n"
        f"  {CALLS_REFERENCE.explanation}"
    )


def _mutation_message(name: str, arg: str, exc: Exception) -> str:
    return (
        f"✗ {name} changes its input `{arg}` in place ({exc}).\n"
        f"  likely mistake: {MUTATES_INPUT.title} [misconception: {MUTATES_INPUT.slug}]\n"
        f"  {MUTATES_INPUT.explanation}"
    )


def pick_output(fn: Callable, k: int, names: tuple[str, ...], name: str) -> Callable:
    """A function returning output k of fn, after checking fn returns len(names) values.

    Lets run_cases compare one output at a time (O first, then lse), so a mistake in O is named
    whatever the learner did with lse.
    """
    if hasattr(fn, "picked"):  # a grader's handle on a function in another process
        return fn.picked(k, names, name)

    @functools.wraps(fn)
    def picked(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not isinstance(out, tuple | list) or len(out) != len(names):
            kind = type(out).__name__ + (
                f" of length {len(out)}" if hasattr(out, "__len__") else ""
            )
            what = {2: "the pair", 3: "the triple"}.get(len(names), f"{len(names)} values")
            raise TypeError(f"{name} must return {what} ({', '.join(names)}), got {kind}")
        return out[k]

    return picked
