"""Bounds-checked memory in Triton's interpreter: a stray tl.load or tl.store raises, never lands.

In the interpreter a pointer is a raw address in this Python process, and `tl.store` writes
through it with no check at all. A store without its mask (the most common Triton mistake there
is) writes past the end of a torch tensor into whatever the process keeps there: the kernel
segfaults, hangs, or dies a cell later. A GPU would fault, or silently corrupt another buffer.

`install()` (run once by course_utils.triton_attention in interpreter mode) wraps the
interpreter's memory module and its launcher so that, during a launch, every load, store and
atomic is checked against the memory of the tensors that launch was given before the
interpreter's NumPy code touches it:

    the launch      GridExecutor.__call__ and _init_args_hst: each tensor argument (tuples and
                    tensor descriptors included) contributes its whole storage, [storage start,
                    storage start + nbytes), so the guard bands the course's checks allocate
                    around a view stay readable and writable
    each access     the active lanes (mask true) of the pointer tile must lie, whole elements,
                    inside one argument's storage: a min/max and one searchsorted when they do
    a stray access  OutOfBoundsError, raised before anything is read or written. Its message
                    starts with the slug (`store-out-of-bounds`, `load-out-of-bounds`) and names
                    the kernel, the argument, the program id, the first elements outside (with
                    their index in the tensor), the mask that would have covered them and, when
                    it is clear, the likely mistake as the checks tag it ([misconception: ...])

The same launcher wrapper turns the stub nbgrader leaves in an exercise (a bare
`raise NotImplementedError()` in a @triton.jit function) into NotWrittenError, one line that
names the function, instead of the interpreter's traceback through its own frames.

Written against the interpreter of Triton 3.6 and 3.9, and defensively: where an attribute it
wraps is missing, install() leaves the interpreter as it is and returns False.
"""

from __future__ import annotations

import collections
import functools
import os
from dataclasses import dataclass

import numpy as np

from course_utils.student_errors import NotWrittenError

__all__ = ["OutOfBoundsError", "install"]

_EXAMPLES = 3  # elements named in the message


class OutOfBoundsError(IndexError):
    """A kernel's load or store reached outside every tensor its launch was given.

    Attributes: slug ("store-out-of-bounds" or "load-out-of-bounds"), kernel, argument (the
    pointer's argument name), program_id, mistake (the checks' misconception slug, or None).
    In a notebook it shows as its message alone (IPython calls _render_traceback_).
    """

    def __init__(self, message: str, *, slug: str, kernel: str, argument: str, program_id,
                 mistake: str | None):  # fmt: skip
        super().__init__(message)
        self.slug, self.kernel, self.argument = slug, kernel, argument
        self.program_id, self.mistake = program_id, mistake

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]


@dataclass(frozen=True)
class _Tensor:
    """One tensor argument of a launch: its name, where it starts, its layout."""

    name: str
    data_ptr: int
    shape: tuple
    strides: tuple
    itemsize: int
    dtype: str


class _Launch:
    """The kernel being launched and the memory it may touch: sorted, disjoint storages."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.starts = np.zeros(0, dtype=np.uint64)
        self.ends = np.zeros(0, dtype=np.uint64)
        self.tensors: list[list[_Tensor]] = []  # per storage, the arguments that view it

    def set_arguments(self, named: list[tuple[str, object]]) -> None:
        storages: dict[int, tuple[int, list[_Tensor]]] = {}
        for name, t in named:
            try:
                storage = t.untyped_storage()
                start, nbytes = int(storage.data_ptr()), int(storage.nbytes())
                dtype = str(t.dtype).removeprefix("torch.")
                layout = (tuple(t.shape), tuple(t.stride()), int(t.element_size()), dtype)
                info = _Tensor(name, int(t.data_ptr()), *layout)
            except Exception:  # not a torch tensor after all: nothing to check against
                continue
            if nbytes == 0:
                continue
            end, views = storages.setdefault(start, (start + nbytes, []))
            storages[start] = (max(end, start + nbytes), views)
            views.append(info)
        order = sorted(storages)
        self.starts = np.array(order, dtype=np.uint64)
        self.ends = np.array([storages[s][0] for s in order], dtype=np.uint64)
        self.tensors = [storages[s][1] for s in order]


_ACTIVE: list[_Launch] = []  # the launches under way (the interpreter runs one at a time)
# Recorders of the loads (load_log.LoadRecorder): told of each launch, begin(kernel name, its
# Python function), and of each load that passed the check, load(ptrs, mask)
LISTENERS: list = []


def _tensors_of(value, name: str):
    """(name, tensor) for a launch argument: a tensor, a TensorWrapper, a tuple or descriptor."""
    if isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _tensors_of(item, f"{name}[{i}]")
        return
    if type(value).__name__ == "TensorWrapper":
        value = getattr(value, "base", value)
    if type(value).__name__ == "TensorDescriptor":
        value = getattr(value, "base", None)
    if hasattr(value, "data_ptr") and hasattr(value, "untyped_storage"):
        yield name, value


# ---- the check of one access -------------------------------------------------------------------
def _check(op: str, ptrs, mask, itemsize: int, call: str | None = None) -> None:
    """Raise OutOfBoundsError when an active lane of ptrs lies outside the launch's storages."""
    if not _ACTIVE or not _ACTIVE[-1].starts.size:
        return
    launch = _ACTIVE[-1]
    ptrs = np.asarray(ptrs)
    if ptrs.dtype.kind not in "iu":
        return  # not an address tile: left to the interpreter
    ptrs = ptrs.astype(np.uint64, copy=False)
    if mask is None:
        active = ptrs.reshape(-1)
    else:
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
        active = ptrs[mask]
    if active.size == 0:
        return
    lo, hi = active.min(), active.max()
    i = int(np.searchsorted(launch.starts, lo, side="right")) - 1
    if i >= 0 and int(hi) + itemsize <= int(launch.ends[i]):
        return  # the fast path: every lane inside one storage
    _raise(launch, op, ptrs, mask, itemsize, call or f"tl.{op}")


def _raise(launch: _Launch, op: str, ptrs: np.ndarray, mask, itemsize: int, call: str) -> None:
    flat = ptrs.reshape(-1)
    on = np.ones(flat.shape, dtype=bool) if mask is None else mask.reshape(-1)
    which = np.searchsorted(launch.starts, flat, side="right").astype(np.int64) - 1
    safe = np.clip(which, 0, None)
    inside = (which >= 0) & (flat.astype(object) + itemsize <= launch.ends[safe].astype(object))
    inside = inside.astype(bool)
    counts = np.bincount(safe[on & inside], minlength=len(launch.starts))
    if counts.any():
        home = int(counts.argmax())
    else:  # no lane inside any tensor: the storage that ends last before the first lane
        first = int(flat[on].min())
        before = [k for k, e in enumerate(launch.ends) if int(e) <= first]
        home = before[-1] if before else 0
    bad = on & ~(inside & (which == home))
    tensor = _home_tensor(launch.tensors[home], flat[on & inside & (which == home)], flat[bad])
    lanes = np.argwhere(bad.reshape(ptrs.shape))
    kind = _mask_kind(ptrs.shape, mask)
    mistake = _MISTAKE[(op, kind)] if (op, kind) in _MISTAKE else None
    slug = f"{op}-out-of-bounds"
    message = _message(launch, op, call, slug, tensor, ptrs, lanes, int(bad.sum()),
                       int(on.sum()), itemsize, kind, mistake)  # fmt: skip
    raise OutOfBoundsError(message, slug=slug, kernel=launch.kernel, argument=tensor.name,
                           program_id=_program_id(), mistake=mistake)  # fmt: skip


def _home_tensor(views: list[_Tensor], inside: np.ndarray, outside: np.ndarray) -> _Tensor:
    """The argument the access was meant for: the last view starting at or before its lanes."""
    anchor = int(inside.min()) if inside.size else int(outside.min())
    starting = [t for t in views if t.data_ptr <= anchor]
    return max(starting, key=lambda t: t.data_ptr) if starting else views[0]


def _mask_kind(shape: tuple, mask) -> str:
    """none (no lane masked off), rows or cols (a 2-D mask that varies along one axis only),
    or partial (a mask that lets these lanes through)."""
    if mask is None or mask.all():
        return "none"
    if len(shape) == 2 and shape[0] > 1 and shape[1] > 1:
        if (mask == mask[:, :1]).all():
            return "rows"
        if (mask == mask[:1, :]).all():
            return "cols"
    return "partial"


_MISTAKE = {  # (op, mask kind) -> the misconception slug the checks use
    ("store", "none"): "store-unmasked",
    ("load", "none"): "mask-missing",
    ("store", "rows"): "mask-one-dimension",
    ("store", "cols"): "mask-one-dimension",
    ("load", "rows"): "mask-one-dimension",
    ("load", "cols"): "mask-one-dimension",
}


def _program_id() -> tuple:
    try:
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        pid, dims = tuple(builder.grid_idx), tuple(builder.grid_dim)
    except Exception:
        return ()
    used = max([1] + [k + 1 for k, n in enumerate(dims) if n > 1])
    return pid[:used]


def _index_in(tensor: _Tensor, element: int) -> tuple | None:
    """The index of a flat element offset in tensor, dims taken widest stride first."""
    order = sorted(range(len(tensor.shape)), key=lambda k: -tensor.strides[k])
    index, rest = [0] * len(tensor.shape), element
    for k in order:
        stride = tensor.strides[k]
        if stride <= 0:
            return None
        index[k], rest = divmod(rest, stride) if k != order[-1] else (rest // stride, 0)
    return tuple(index)


def _lane_indices(tensor: _Tensor, ptrs: np.ndarray, lanes: np.ndarray, itemsize: int):
    """The tensor index of each lane, when the tile is affine in its lanes along the tensor's
    dimensions (base + rows * stride_row + cols, the usual case); else None."""
    if not tensor.shape or ptrs.ndim == 0:
        return None
    origin = int(ptrs[(0,) * ptrs.ndim])
    offset, remainder = divmod(origin - tensor.data_ptr, itemsize)
    if remainder or offset < 0:
        return None
    base = _index_in(tensor, offset)
    if base is None or any(b >= n for b, n in zip(base, tensor.shape, strict=True)):
        return None
    dims = []
    for axis, size in enumerate(ptrs.shape):
        if size == 1:
            dims.append(None)
            continue
        step_at = [0] * ptrs.ndim
        step_at[axis] = 1
        step = (int(ptrs[tuple(step_at)]) - origin) // itemsize
        matches = [k for k, s in enumerate(tensor.strides) if s == step and tensor.shape[k] > 1]
        if not matches:
            return None
        dims.append(matches[-1])
    grid = np.indices(ptrs.shape).reshape(ptrs.ndim, -1).T.astype(np.int64)
    strides = np.array([0 if d is None else tensor.strides[d] for d in dims], dtype=np.int64)
    predicted = origin + itemsize * (grid @ strides)
    if not np.array_equal(predicted.astype(np.uint64), ptrs.reshape(-1)):
        return None
    found = []
    for lane in lanes:
        index = list(base)
        for axis, d in enumerate(dims):
            if d is not None:
                index[d] += int(lane[axis])
        found.append(tuple(index))
    return found


_DIM_NAMES = {2: ("row", "col")}


def _example(tensor: _Tensor, address: int, index: tuple | None, itemsize: int) -> str:
    element, remainder = divmod(address - tensor.data_ptr, itemsize)
    where = f"element {element}" + ("" if not remainder else f" (+{remainder} bytes)")
    if index is None:
        return where
    names = _DIM_NAMES.get(len(index))
    if len(index) == 1:
        return where
    if names:
        return f"{where} ({names[0]} {index[0]}, {names[1]} {index[1]})"
    return f"{where} ([{', '.join(str(i) for i in index)}])"


def _advice(op: str, kind: str, ndim: int) -> str:
    verb = "store" if op == "store" else "load"
    both = (
        "mask both dimensions: rows and cols, mask = (rows[:, None] < n_rows) & "
        "(cols[None, :] < n_cols), and pass it to every tl.load and tl.store of the tile"
    )
    if kind == "rows":
        return f"The {verb}'s mask covers the rows only, not the columns past the last: {both}."
    if kind == "cols":
        return f"The {verb}'s mask covers the columns only, not the rows past the last: {both}."
    if kind == "none" and ndim >= 2:
        return f"No lane of this tile is masked off: {both}."
    if kind == "none":
        how = "tl.store(ptrs, x, mask=offs < n)" if op == "store" else "tl.load(ptrs, "
        how += "" if op == "store" else "mask=offs < n, other=0.0)"
        return f"No lane of this tile is masked off: mask the {verb} with `offs < n`: {how}."
    return (
        f"The {verb}'s mask lets these lanes through: compare each index with the size of its "
        "dimension (offs < n, not <=), for every dimension of the tile."
    )


_TITLES = {
    "store-unmasked": "the store has no mask: the tile's lanes past the end are written",
    "mask-missing": "the load has no mask: the tile's lanes past the end are read",
    "mask-one-dimension": "a 2-D tile masked on one dimension only",
}


def _message(launch, op, call, slug, tensor, ptrs, lanes, n_bad, n_on, itemsize, kind, mistake):
    pid = _program_id()
    flat_lanes = lanes[:_EXAMPLES]
    addresses = [int(ptrs[tuple(lane)]) for lane in flat_lanes]
    indices = _lane_indices(tensor, ptrs, flat_lanes, itemsize) or [None] * len(addresses)
    shape = " x ".join(str(n) for n in tensor.shape) or "scalar"
    numel = int(np.prod(tensor.shape)) if tensor.shape else 1
    examples = ", ".join(
        _example(tensor, a, ix, itemsize) for a, ix in zip(addresses, indices, strict=True)
    )
    verb = "writes" if op == "store" else "reads"
    lines = [
        f"{slug}: {launch.kernel}'s {call} through {tensor.name} (program id "
        f"{', '.join(str(p) for p in pid) if pid else '?'}) {verb} outside the tensor "
        f"{tensor.name} points into ({shape}, {tensor.dtype}, {numel} elements, strides "
        f"{tensor.strides}): {n_bad} of the {n_on} lanes it {verb[:-1]}s, e.g. {examples}. "
        "Nothing was " + ("written" if op == "store" else "read") + ".",
        "  " + _advice(op, kind, ptrs.ndim),
    ]
    if mistake is not None:
        lines.append(f"  likely mistake: {_TITLES[mistake]} [misconception: {mistake}]")
    return "\n".join(lines)


# ---- the hooks ---------------------------------------------------------------------------------
class _GuardedMemory:
    """The interpreter's C++ memory module with every access checked first; the rest delegated."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load(self, ptrs, mask, other, dtype, *rest):
        _check("load", ptrs, mask, _itemsize(dtype, other))
        if _ACTIVE:
            for listener in LISTENERS:
                listener.load(ptrs, mask)
        return self._inner.load(ptrs, mask, other, dtype, *rest)

    def store(self, ptrs, value, mask, *rest):
        _check("store", ptrs, mask, _itemsize(None, value))
        return self._inner.store(ptrs, value, mask, *rest)

    def atomic_cas(self, ptrs, cmp, val, *rest):
        _check("store", ptrs, None, _itemsize(None, cmp), "atomic_cas")
        return self._inner.atomic_cas(ptrs, cmp, val, *rest)

    def atomic_rmw(self, op, ptrs, val, mask, *rest):
        _check("store", ptrs, mask, _itemsize(None, val), "atomic operation")
        return self._inner.atomic_rmw(op, ptrs, val, mask, *rest)


def _itemsize(dtype, value) -> int:
    try:
        return int(np.dtype(dtype).itemsize) if dtype is not None else int(value.itemsize)
    except Exception:
        return 1


def _stub_name(exc: BaseException) -> str | None:
    """The function whose bare `raise NotImplementedError()` is behind exc (a chain), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotWrittenError):
            return exc.name
        if isinstance(exc, NotImplementedError) and not exc.args:
            tb, frame = exc.__traceback__, None
            while tb is not None:
                frame, tb = tb.tb_frame, tb.tb_next
            if frame is None or _in_triton(frame.f_code.co_filename):
                return None  # Triton's own, not a learner's stub
            return frame.f_code.co_name
        exc = exc.__cause__ or exc.__context__
    return None


def _in_triton(filename: str) -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.abspath(filename).startswith(os.path.dirname(os.path.abspath(triton.__file__)))


def _bounds_error(exc: BaseException) -> OutOfBoundsError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OutOfBoundsError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _wrap_call(call):
    @functools.wraps(call)
    def guarded_call(self, *args, **kwargs):
        _ACTIVE.append(_Launch(getattr(self.fn, "__name__", "the kernel")))
        for listener in LISTENERS:
            listener.begin(_ACTIVE[-1].kernel, self.fn)
        try:
            return call(self, *args, **kwargs)
        except Exception as exc:
            found = _bounds_error(exc)
            if found is not None:
                raise found.with_traceback(None) from None
            stub = _stub_name(exc)
            if stub is not None:
                raise NotWrittenError(stub) from None
            raise
        finally:
            _ACTIVE.pop()

    return guarded_call


def _wrap_init_args(init_args):
    @functools.wraps(init_args)
    def recording_init_args(self, args_dev, kwargs, *rest):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs, *rest)
        if _ACTIVE:
            names = list(getattr(self, "arg_names", []))
            named = collections.deque()
            for i, value in enumerate(args_hst):
                named.extend(_tensors_of(value, names[i] if i < len(names) else f"arg {i}"))
            for key, value in kwargs_hst.items():
                named.extend(_tensors_of(value, key))
            _ACTIVE[-1].set_arguments(list(named))
        return args_hst, kwargs_hst

    return recording_init_args


def install() -> bool:
    """Check every access of every kernel the interpreter launches (once per process).

    Returns True when the checks are in place, False when this Triton's interpreter lacks
    what they wrap (then nothing is changed).
    """
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    if getattr(interpreter, "_course_bounds_installed", False):
        return True
    executor = getattr(interpreter, "GridExecutor", None)
    memory = getattr(interpreter, "_interpreter", None)
    needed = ("load", "store", "atomic_cas", "atomic_rmw")
    if (
        executor is None
        or memory is None
        or not all(hasattr(memory, n) for n in needed)
        or not callable(getattr(executor, "_init_args_hst", None))
        or not hasattr(interpreter, "interpreter_builder")
    ):
        return False
    interpreter._interpreter = _GuardedMemory(memory)
    executor.__call__ = _wrap_call(executor.__call__)
    executor._init_args_hst = _wrap_init_args(executor._init_args_hst)
    interpreter._course_bounds_installed = True
    return True
