"""Triton's interpreter patches triton.language once per launch, not once per helper call.

Before a launch runs a kernel, the interpreter swaps every builtin of `triton.language` (tl.load,
tl.dot, tensor.__mul__, ...) for a version that computes with NumPy, and swaps them back after
the launch: `interpreter._patch_lang(fn)`, which walks the modules with `inspect.getmembers`.
Each call of a `@triton.jit` helper from inside the kernel (`InterpretedFunction.__call__`) does
that walk again, although the launch has already patched the same modules. A kernel that calls a
helper in its loop over key tiles (notebook 06's `_update`, notebook 08's tile helpers) spent a
fifth to a third of its time there (py-spy on a check of notebook 06's forward; journal, "Triton's
interpreter patches once per launch").

`install()` wraps `_patch_lang`: while a launch of this thread runs, a helper whose
module sees only language modules that launch has patched already gets an empty patch scope
instead of a second walk. A helper that sees a module the launch did not patch (it imports
`triton.language.core` where the kernel imports `triton.language`) is patched as before. What the
kernel computes does not change: the same NumPy versions of the same builtins run.

Written against the interpreter of Triton 3.6 and 3.9, and defensively: where an attribute it
wraps is missing, install() leaves the interpreter as it is and returns False.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["install"]

_state = threading.local()  # per thread: depth of running launches, ids of patched modules


def _languages(fn, lang_modules: tuple) -> frozenset[int]:
    """Ids of the triton.language modules `fn`'s globals hold (what _patch_lang would patch)."""
    return frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in lang_modules))


def _wrap_launch(call):
    """GridExecutor.__call__, counting this thread's running launches."""

    @functools.wraps(call)
    def launch(self, *args, **kwargs):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            _state.patched = set()
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
    """Patch the language once per launch (once per process). True when in place, False when
    this Triton's interpreter lacks what it wraps (then nothing is changed)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:
        return False
    if getattr(interpreter, "_course_patch_once_installed", False):
        return True
    executor = getattr(interpreter, "GridExecutor", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    core = getattr(tl, "core", None)
    if executor is None or not callable(patch_lang) or scope is None or core is None:
        return False
    interpreter._patch_lang = _wrap_patch_lang(patch_lang, scope, (tl, core))
    executor.__call__ = _wrap_launch(executor.__call__)
    interpreter._course_patch_once_installed = True
    return True
