"""Triton's interpreter without two costs a GPU never pays: re-patching, and overflow checks.

Where there is no GPU, every launch runs in Triton's interpreter (NumPy, one program at a time),
and a few of its habits cost far more than the kernel's own arithmetic. Measured with py-spy on a
check of notebook 06's forward and on the capstone's training (journal, "Triton's interpreter
without the costs a GPU never pays"):

    re-patching   before a launch runs, the interpreter swaps every builtin of triton.language
                  (tl.load, tl.dot, tensor.__mul__, ...) for a NumPy version, walking the modules
                  with inspect.getmembers (`interpreter._patch_lang`), and swaps them back after.
                  Each call of a @triton.jit helper from inside the kernel walked them again,
                  although the launch had patched them already: a fifth to a third of a kernel's
                  time where a helper is called in its loop over tiles.
    overflow      every integer +, - and * (the offsets of every tile) was computed a second time
    checks        in int64 and compared with its type's range (`sanitize_overflow`), a quarter of
                  the course kernels' time in the capstone's training, and the comparison was
                  then thrown away: the interpreter's tl.device_assert does nothing unless its
                  options say `debug`, which they never do (Triton 3.6 and 3.9). The checks now
                  run only where their result is used (options with debug=True).

    install()     both, once per process (harness.triton_interpreter calls it in interpreter
                  mode); False where this Triton's interpreter lacks what it changes (then it
                  is left as it is)
    uninstall()   the interpreter as Triton ships it again (benchmarks.interpreter times both)

Nothing a kernel computes or raises changes: the same NumPy versions of the same builtins run, and
an int32 that overflows wraps, as before (and as on a GPU outside debug mode). The bounds guard
(harness.triton_bounds) checks every load and store, so an offset that wrapped is caught before it
is used.

Re-patching is skipped only while a launch of the same thread runs and has patched every language
module the helper sees (a helper whose module holds `triton.language.core` where the kernel's
holds `triton.language` is patched as before). Written against the interpreter of Triton 3.6 and
3.9.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

__all__ = ["install", "uninstall"]

_state = threading.local()  # per thread: depth of running launches, ids of patched modules
_ours: dict[str, object] = {}  # the wrappers install() put in place: uninstall() takes only those


def _languages(fn, lang_modules: tuple) -> frozenset[int]:
    """Ids of the triton.language modules `fn`'s globals hold (what _patch_lang would patch)."""
    return frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in lang_modules))


def _checks_only_when_used(builder) -> None:
    """The interpreter's overflow checks on exactly when its device_assert is (options.debug)."""
    options = builder.options
    if options.sanitize_overflow != options.debug:
        builder.options = dataclasses.replace(options, sanitize_overflow=options.debug)


def _wrap_launch(call, builder):
    """GridExecutor.__call__: counts this thread's running launches, and turns the overflow
    checks off first unless their result is used."""

    @functools.wraps(call)
    def launch(self, *args, **kwargs):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            _state.patched = set()
            _checks_only_when_used(builder)
        _state.depth = depth + 1
        try:
            return call(self, *args, **kwargs)
        finally:
            _state.depth = depth

    return launch


def _wrap_patch_lang(patch_lang, empty_scope, lang_modules: tuple):
    """_patch_lang(fn), skipped inside a launch that has patched every module fn sees."""
    every = frozenset(id(m) for m in lang_modules)

    @functools.wraps(patch_lang)
    def patch_once(fn):
        if getattr(_state, "depth", 0) > 0:
            if _state.patched >= every:  # all of them: no need to read fn's globals
                return empty_scope()
            langs = _languages(fn, lang_modules)
            if langs and langs <= _state.patched:
                return empty_scope()
            scope = patch_lang(fn)
            _state.patched |= langs
            return scope
        return patch_lang(fn)

    return patch_once


def install() -> bool:
    """Patch the language once per launch, overflow checks only when used (once per process).
    True when in place, False when this Triton's interpreter lacks what they change (then
    nothing is changed)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:
        return False
    if getattr(interpreter, "_course_speed_installed", False):
        return True
    executor = getattr(interpreter, "GridExecutor", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    core = getattr(tl, "core", None)
    if (
        executor is None
        or not callable(patch_lang)
        or scope is None
        or core is None
        or not dataclasses.is_dataclass(options)
        or not hasattr(options, "sanitize_overflow")
        or not hasattr(options, "debug")
    ):
        return False
    interpreter._patch_lang = _ours["patch_lang"] = _wrap_patch_lang(patch_lang, scope, (tl, core))
    executor.__call__ = _ours["launch"] = _wrap_launch(executor.__call__, builder)
    _checks_only_when_used(builder)
    interpreter._course_speed_installed = True
    return True


def uninstall() -> bool:
    """Undo install(): Triton's own _patch_lang and launcher, the overflow checks on. True when
    undone; False, and nothing changed, when it is not installed or something wrapped either
    function after install()."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    if not getattr(interpreter, "_course_speed_installed", False):
        return False
    executor = interpreter.GridExecutor
    if interpreter._patch_lang is not _ours.get("patch_lang") or (
        executor.__call__ is not _ours.get("launch")
    ):
        return False
    interpreter._patch_lang = interpreter._patch_lang.__wrapped__
    executor.__call__ = executor.__call__.__wrapped__
    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=True)
    interpreter._course_speed_installed = False
    return True
