"""Array libraries that a NumPy exercise's memory budget cannot see, found while the learner runs.

The budget (`_core.memory_budget`) measures the peak of new allocations with tracemalloc, which
sees NumPy's buffers and nothing that torch, JAX, CuPy, TensorFlow, Numba or MLX allocate with
their own allocators: a forward written with torch (scaled_dot_product_attention plus a full
logsumexp, the N x N_k matrix the exercise forbids) would pass with a peak of a few bytes. So a
call measured for the budget refuses these libraries, by one rule for every NumPy exercise:

    named       the learner's function, its closures and the helpers it calls from its own module
                (the notebook's globals), read with `dis`: an `import torch` anywhere in them, or a
                global that is such a library, or comes from one (`F`, `jnp`, a function
                imported `from torch.nn.functional import ...`);
    imported    a library absent from sys.modules before the call and present after it;
    called      with torch already imported, a TorchFunctionMode sees every torch function and
                tensor method the call runs, however it was reached.

Nothing here imports a library: a NumPy-only lab (notebooks 01-05 and 07) has no torch.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import sys
import types

# module roots -> the name the feedback uses
LIBRARIES = {
    "torch": "torch",
    "jax": "JAX",
    "jaxlib": "JAX",
    "cupy": "CuPy",
    "tensorflow": "TensorFlow",
    "numba": "Numba",
    "mlx": "MLX",
}

# the TorchFunctionMode's hook: infrastructure for the reference watch (_core._frame_kind), not a
# course function that the learner's code calls
INSTRUMENTS = ("__torch_function__",)


def _library_of(value) -> str | None:
    """The library a global's value is or comes from (a module, a function, a class), or None."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None)
        if not isinstance(name, str):
            name = getattr(type(value), "__module__", "") or ""
    return LIBRARIES.get(name.split(".")[0])


def _codes(code: types.CodeType):
    """code and the code objects nested in it (inner functions, comprehensions, lambdas)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def libraries_named(fn, depth: int = 4) -> set[str]:
    """The array libraries fn names: imports, globals, closures, and helpers of its own module."""
    found: set[str] = set()
    seen: set = set()

    def visit(f, depth):
        f = inspect.unwrap(f) if callable(f) else f
        f = getattr(f, "__func__", f)  # a bound method
        code = getattr(f, "__code__", None)
        if code is None or code in seen or depth < 0:
            return
        seen.add(code)
        names = getattr(f, "__globals__", {})
        for cell in getattr(f, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                check(cell.cell_contents, names, depth)
        for inner in _codes(code):
            for ins in dis.get_instructions(inner):
                if ins.opname == "IMPORT_NAME":
                    library = LIBRARIES.get(str(ins.argval).split(".")[0])
                    if library:
                        found.add(library)
                elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in names:
                    check(names[ins.argval], names, depth)

    def check(value, names, depth):
        library = _library_of(value)
        if library:
            found.add(library)
        elif getattr(value, "__globals__", None) is names:  # a helper of the learner's module
            visit(value, depth - 1)

    visit(fn, depth)
    return found


@contextlib.contextmanager
def array_libraries_used(fn):
    """While the block runs fn: yields a list, filled after the block with the array libraries
    (their feedback names, sorted) that fn names, imports or, for torch, calls."""
    found: list[str] = []
    named = libraries_named(fn)
    before = {root for root in LIBRARIES if root in sys.modules}
    mode = _torch_calls_class()() if "torch" in sys.modules else contextlib.nullcontext()
    try:
        with mode:
            yield found
    finally:
        imported = {LIBRARIES[r] for r in LIBRARIES if r in sys.modules and r not in before}
        called = {"torch"} if getattr(mode, "called", False) else set()
        found.extend(sorted(named | imported | called))


@functools.cache
def _torch_calls_class():
    """TorchCalls, made on first use: torch is imported by then (array_libraries_used checks)."""
    from torch.overrides import TorchFunctionMode

    class TorchCalls(TorchFunctionMode):
        """Notes that a torch function or tensor method ran; runs it unchanged."""

        called = False

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.called = True
            return func(*args, **(kwargs or {}))

    return TorchCalls
