"""The machinery behind every learner-facing check: run cases, compare, name the mistake.

A check runs the learner's function on a list of cases ordered from smallest to largest, compares
each result with the reference, and either prints one pass line (to stdout) or raises CheckFailure
with: the smallest failing input, the learner's value, the expected value, and, when the learner's
output matches a known buggy implementation (a Mistake), the misconception by name. The tag
``[misconception: <slug>]`` in a failure message lets the graders count misconceptions in a class.

Right values are not enough: an exercise teaches an algorithm, and its stated rules (stream the
scores once, never build the N x N_k score matrix, read K/V in tiles, skip the tiles above the
diagonal, build the decode from your own partials) are Rules, checked here by one mechanism:

    read-only inputs   every array handed to the learner is a read-only copy, so `x -= shift`
                       raises at once and is named `mutates-input`, with the argument;
    a memory budget    the peak of new allocations (tracemalloc sees NumPy's buffers) on a case
                       where the forbidden array is many times the budget;
    traced inputs      Traced arrays record which of their elements the learner's code loads,
                       and in which pieces (a slice is a load; arithmetic on a loaded tile is not);
    spied helpers      calls of the learner's own helper functions, with their arguments;
    a reference watch  any call into course_utils (references, figures' and checks' helpers)
                       from the learner's function is named `calls-reference`.

`instrumented_call` runs the learner's function under all of these and returns a CallReport: plain
data (values, bytes, load counts), which the Rules judge. It is the only place that runs learner
code, so the same cases, budgets and diagnoses can run in the learner's process (a notebook) or be
asked for by a grader that compares in a process of its own (graders.verdicts).

The learner's function runs with warnings silenced and stderr captured: an nbgrader test cell that
writes to stderr scores 0, and a correct solution must never lose points for a harmless warning.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import math
import os
import re
import site
import sys
import sysconfig
import tracemalloc
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from course_utils.checks._array_libraries import array_libraries_used


class CheckFailure(AssertionError):
    """A check found a wrong result; the message explains what and why.

    In a notebook it shows as its message alone: the frames inside the checks would only hide
    what the message says (IPython calls _render_traceback_ instead of printing a traceback).
    """

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines() or [type(self).__name__]


class ReferenceUnavailable(RuntimeError):
    """Raised by a course reference that is switched off (while a submission is graded)."""


_SLUG = re.compile(r"\[misconception: ([A-Za-z0-9_-]+)\]")


def misconception_slug(text: str) -> str | None:
    """The slug of the first `[misconception: slug]` tag in a failure message, or None."""
    found = _SLUG.search(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Mistake:
    """A known misconception and a buggy implementation that shows it.

    fn has the exercise's signature; when the learner's output matches fn's output on the failing
    case, the failure message names the mistake and explains the fix.
    """

    slug: str  # short id, e.g. "plain-average"
    title: str  # one line, e.g. "plain average in the merge"
    explanation: str  # why it is wrong and what to do instead
    fn: Callable = field(repr=False, compare=False)


@dataclass(frozen=True)
class Case:
    """One input of a check: label for the report, positional args for the function.

    focus: the part of the exercise's specification this case exercises ("the causal mask: a
    query sees the keys c <= r"); said when the case fails and no known mistake matches.
    stage: for an exercise checked in stages (plain tiles, then ragged, then causal, ...), the
    stage this case belongs to; run_cases names the first failing stage and the ones that pass.
    """

    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    focus: str = ""
    stage: str = ""  # the stage of a staged check ("ragged tiles"); cases come stage by stage


def frozen(*arrays: np.ndarray):
    """Make a check module's own example arrays read-only, in place; returns them (one or a tuple).

    A learner's `x -= shift` on an example would otherwise change it for the rest of the kernel's
    life, and later messages would show inputs that no longer match their labels.
    """
    for a in arrays:
        a.flags.writeable = False
    return arrays[0] if len(arrays) == 1 else arrays


# ---------------------------------------------------------------------------------------------
# Describing values in feedback
# ---------------------------------------------------------------------------------------------

_SMALL = 12  # arrays with more elements than this are summarized, not printed


def describe(value, precision: int = 6) -> str:
    """A short, readable repr of a number or array for feedback messages.

    Integers stay integers; arrays of more than 12 elements are summarized by shape and range.
    """
    if isinstance(value, bool | np.bool_):
        return repr(bool(value))
    if isinstance(value, types.FunctionType):
        return _function_name(value)
    try:
        ndim = np.ndim(value)
    except ValueError:  # e.g. a list of index arrays of different lengths
        return repr(value)
    if isinstance(value, np.ndarray) or ndim > 0:
        try:
            arr = np.asarray(value)
        except ValueError:
            return repr(value)
        if arr.dtype.kind not in "fciub":
            return repr(value)
        if arr.size > _SMALL:
            return _summary(arr, precision)
        if arr.dtype.kind in "iub":
            body = np.array2string(arr, max_line_width=10_000, separator=", ")
        else:
            body = np.array2string(arr, precision=precision, max_line_width=10_000, separator=", ")
        body = re.sub(r"\s*\n\s*", " ", body)  # one line, whatever the shape
        return f"{body} (shape {arr.shape})" if arr.ndim > 1 else body
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.{precision}g}"
    return repr(value)


def _function_name(fn: types.FunctionType) -> str:
    """A function as feedback shows it: its name (a check's own backend), no address."""
    return fn.__qualname__


def _summary(arr: np.ndarray, precision: int = 4) -> str:
    """'float64 array of shape (64, 16), values in [-2.1, 3.4]' (with -inf / NaN counts)."""
    text = f"{arr.dtype} array of shape {arr.shape}"
    if arr.size == 0 or arr.dtype.kind not in "fiub":
        return text
    a = arr.astype(np.float64)
    finite = a[np.isfinite(a)]
    if finite.size:
        text += f", values in [{finite.min():.{precision}g}, {finite.max():.{precision}g}]"
    extras = [
        f"{int(n)} {what}"
        for n, what in ((np.isneginf(a).sum(), "-inf"), (np.isposinf(a).sum(), "+inf"))
        if n
    ]
    if np.isnan(a).any():
        extras.append(f"{int(np.isnan(a).sum())} NaN")
    return text + (f" ({', '.join(extras)})" if extras else "")


def _arg_names(fn: Callable, n: int, kwargs: dict) -> list[str]:
    """Names of fn's first n positional parameters (or 'argument k'), then the kwargs' names."""
    try:
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    names = names[:n] + [f"argument {k + 1}" for k in range(len(names), n)]
    return names + list(kwargs)


def _describe_args(case: Case, names: Sequence[str] | None = None) -> str:
    values = list(case.args) + list(case.kwargs.values())
    names = list(names or []) or [None] * len(case.args) + list(case.kwargs)
    parts = []
    for name, value in zip(names, values, strict=False):
        text = describe(value)
        parts.append(f"{name} = {text}" if name else text)
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Traced arrays: which elements of an input the learner's code loads, and in which pieces
# ---------------------------------------------------------------------------------------------


# The rule of the traced inputs, in the words of the notebooks' exercise texts and of the
# mistakes' explanations (one sentence everywhere, so that text, check and message agree).
TILE_READS = (
    "A tile sliced once is on chip from the first time you compute with it: reading it again in "
    "any way (its elements, its rows, a loop over it, a second loop) is free; slicing the input "
    "again is a second read."
)


class LoadLog:
    """The loads of one traced input: how often each element was loaded, and each load's elements.

    The rule, in the words of the notebooks (TILE_READS): a tile sliced once is on chip from the
    first time you compute with it; reading it again in any way is free; slicing the input again
    is a second read.

    A *tile* is a slice or a gather of the input (`K[j:j + Bc]`, `x[..., s:e]`, `x[r]`, `K[idx]`).
    Its elements are loaded the first time the learner computes with them (a NumPy slice alone is
    a view: a tile sliced and never computed with is not read). After that they are on chip: any
    later read of the tile or of a piece of it (`tile.max()`, `tile[j] * w`, `float(tile[i])`,
    `for v in tile`, `tile[a:b]`, a second loop over it) is free, and so are the arrays derived
    from it element by element. One tile of each input is on chip at a time: computing with
    another tile of the same input evicts it (K/V tiles cut once before the query loop are read
    again each time). The whole input (and its views: K.T, reshape) is no tile: it never fits on
    chip, so every computation with it (`x.max()`, `Q @ K.T`, `logsumexp(x)`, `float(x[i])`) loads
    what it reads again. Conversions (`np.asarray`, `astype`, `copy`) and same-shape element-wise
    arithmetic (`K * scale`, `x - m`) give arrays that share their source's tile, or stay the
    whole input. The same elements loaded twice in a row count once.

    Attributes:
        shape: the input's shape.  counts: int64 array of that shape, loads per element.
        loads: one sorted array of flat element indices per load, in order (a tile read piece by
        piece, element by element in a loop, is one load per piece, each element in one of them).
    """

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)
        self.counts = np.zeros(self.shape, dtype=np.int64)
        self.loads: list[np.ndarray] = []
        self.on_chip = None  # the tile of this input last computed with (see Traced._load)
        self.chip = np.zeros(self.counts.size, dtype=bool)  # which of its elements are loaded

    def record(self, idx) -> None:
        """Count one load of the elements idx (flat indices); the same tile loaded again right
        after itself is still on chip and is not counted twice."""
        flat = np.unique(np.asarray(idx, dtype=np.int64).ravel())
        if flat.size == 0:
            return
        if self.loads and self.loads[-1].size == flat.size and np.array_equal(self.loads[-1], flat):
            return
        self.counts.reshape(-1)[flat] += 1
        self.loads.append(flat)

    def extend(self, i: int, idx) -> None:
        """Add the elements idx (flat indices, none of them in it yet) to load i: a tile read
        piece by piece (its rows, its elements in a loop) is one load, as wide as what it read."""
        flat = np.unique(np.asarray(idx, dtype=np.int64).ravel())
        self.counts.reshape(-1)[flat] += 1
        self.loads[i] = np.union1d(self.loads[i], flat)

    def positions(self, load: np.ndarray, axis: int) -> np.ndarray:
        """The distinct positions along `axis` that one load touches."""
        return np.unique(np.unravel_index(load, self.shape)[axis]) if self.shape else load

    def widest(self, axis: int) -> int:
        """The most positions along `axis` touched by a single load (0 when nothing was loaded)."""
        return max((len(self.positions(ld, axis)) for ld in self.loads), default=0)

    def position_loads(self, axis: int) -> np.ndarray:
        """For each position along `axis`, how many loads touched it."""
        out = np.zeros(self.shape[axis], dtype=np.int64)
        for ld in self.loads:
            out[self.positions(ld, axis)] += 1
        return out

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "loads": list(self.loads)}

    @classmethod
    def from_dict(cls, data: dict) -> LoadLog:
        log = cls(tuple(data["shape"]))
        for ld in data["loads"]:
            log.record(np.asarray(ld, dtype=np.int64))
        return log


class _Buffer:
    """One memory buffer that holds traced elements: its address and each element's origin."""

    __slots__ = ("ptr", "itemsize", "origin")

    def __init__(self, arr: np.ndarray, origin: np.ndarray):
        self.ptr = arr.__array_interface__["data"][0]
        self.itemsize = arr.itemsize
        self.origin = np.ascontiguousarray(origin, dtype=np.int64).reshape(-1)

    def holds(self, arr: np.ndarray) -> bool:
        ptr = arr.__array_interface__["data"][0]
        return self.ptr <= ptr < self.ptr + max(1, self.origin.size) * self.itemsize


# numpy functions that only look at shape or make views: they neither load nor stop the tracing
_VIEW_FUNCTIONS = {
    "shape", "ndim", "size", "result_type", "can_cast", "iscomplexobj", "isrealobj",
    "may_share_memory", "shares_memory", "transpose", "reshape", "swapaxes", "moveaxis",
    "squeeze", "expand_dims", "ravel", "atleast_1d", "atleast_2d", "atleast_3d", "diagonal",
    "broadcast_to", "flip", "fliplr", "flipud", "rollaxis", "copy", "asarray", "asanyarray",
    "ascontiguousarray", "array_equal", "empty_like", "zeros_like", "ones_like", "full_like",
    "split", "array_split", "hsplit", "vsplit", "dsplit",
}  # fmt: skip
_SHAPE_ONLY = {
    "shape", "ndim", "size", "result_type", "can_cast", "iscomplexobj", "isrealobj",
    "may_share_memory", "shares_memory", "empty_like", "zeros_like", "ones_like", "full_like",
}  # fmt: skip


class _Tile:
    """One tile of an input: a slice or gather of it, shared by every piece cut from it (rows,
    elements, sub-slices) and by everything derived from it element by element, so that reading
    the tile again in any way is free while it is on chip (LoadLog.on_chip, LoadLog.chip).

    The whole input (and its views: K.T, reshape) is no tile: it never fits on chip, so every
    computation with it is a load of what it reads again; a slice of it starts a new tile.
    """

    __slots__ = ("whole", "extent", "load")

    def __init__(self, whole: bool = False, extent: np.ndarray | None = None):
        self.whole = whole
        self.extent = extent  # the flat indices of the input elements the tile holds
        self.load = None  # while on chip, the index of its load in LoadLog.loads


class Traced(np.ndarray):
    """A read-only array that records its loads into a LoadLog (see LoadLog for what counts).

    Made by `traced(a)`; the learner sees an ordinary ndarray. Indexing the input gives a *tile*:
    a view (or a copy, for fancy indexing) whose elements are loaded, and counted, the first time
    they are computed with or read as numbers; after that the tile, every piece of it (rows,
    elements, iteration) and whatever is derived from it element by element are on chip, free.
    Views (.T, reshape), conversions (astype, copy, np.asarray) and same-shape element-wise
    arithmetic (K * scale) share their source's tile.
    """

    _log: LoadLog | None = None
    _buf: _Buffer | None = None
    _tile: _Tile | None = None

    def __array_finalize__(self, obj):
        log = getattr(obj, "_log", None)
        if log is None or not isinstance(obj, Traced):
            return
        self._log, self._tile = log, obj._tile
        if obj._buf is not None and obj._buf.holds(self):
            self._buf = obj._buf  # a view (.T, reshape, ravel, [None]): same elements
        elif self.size == obj.size:  # a copy made in C (flatten, round): element by element
            self._buf = _Buffer(self, obj._origin_index().ravel())
        else:  # something we cannot map: count the source as loaded, stop tracing
            obj._use()
            self._log = None

    @property
    def _loaded(self) -> bool:
        """Every element of this array is on chip (the whole input never is)."""
        log, tile = self._log, self._tile
        if log is None or tile.whole or log.on_chip is not tile:
            return False
        return bool(log.chip[self._origin_index()].all())

    def _use(self) -> None:
        """This array takes part in a computation: load what of it is not on chip."""
        if self._log is not None:
            self._load(self._origin_index())

    def _load(self, idx) -> None:
        """Load the input elements idx (flat indices) of this array's tile.

        The whole input loads them every time. A tile loads only those of its elements not yet on
        chip, however they are read (whole, by pieces, element by element). One tile of each
        input is on chip at a time: computing with another tile of the same input evicts it, but
        for the elements both hold (the same tile sliced again right after itself stays on chip).
        """
        log, tile = self._log, self._tile
        if tile.whole:
            log.record(idx)
            return
        if log.on_chip is not tile:  # evict the other tile, but for the elements both hold
            kept = tile.extent[log.chip[tile.extent]]
            log.chip[:] = False
            log.chip[kept] = True
            log.on_chip, tile.load = tile, None
        flat = np.asarray(idx, dtype=np.int64).ravel()
        new = np.unique(flat[~log.chip[flat]])
        if new.size == 0:
            return
        if tile.load is None:
            log.record(new)
            tile.load = len(log.loads) - 1
        else:
            log.extend(tile.load, new)
        log.chip[new] = True

    def _piece_tile(self, key, idx) -> _Tile:
        """The tile of self[key]: the same tile for its rows and elements (`tile[j]`) and for any
        piece once some of it is on chip; a new tile for a slice of the whole input, or a slice
        cut from a view not yet read (`row = x[r]`, then `row[s:s + block]`: the blocks are the
        tiles)."""
        tile, log = self._tile, self._log
        if tile.whole:
            return _Tile(extent=np.asarray(idx).ravel())
        ints = key if isinstance(key, tuple) else (key,)
        if all(isinstance(k, int | np.integer) for k in ints):
            return tile
        if log.on_chip is tile and tile.load is not None:
            return tile
        return _Tile(extent=np.asarray(idx).ravel())

    def _origin_index(self) -> np.ndarray:
        """For each element of self, the flat index of the input element it holds."""
        buf = self._buf
        offset = (self.__array_interface__["data"][0] - buf.ptr) // buf.itemsize
        strides = tuple(s // buf.itemsize * 8 for s in self.strides)
        return np.lib.stride_tricks.as_strided(
            buf.origin[offset:], shape=self.shape, strides=strides, writeable=False
        )

    def _plain(self) -> np.ndarray:
        return self.view(np.ndarray)

    def _derived(self, arr: np.ndarray, origin: np.ndarray, tile: _Tile) -> Traced:
        """Wrap arr, a new plain array, as a Traced array holding the given origin indices."""
        out = arr.view(Traced)
        out._log, out._tile, out._buf = self._log, tile, _Buffer(arr, origin)
        return out

    # -- tiles ---------------------------------------------------------------------------------

    def __getitem__(self, key):
        plain = self._plain()
        res = plain[_plain_key(key)]
        if self._log is None:
            return res
        idx = self._origin_index()[_plain_key(key)]
        if not isinstance(res, np.ndarray):  # an element read as a number: loaded now
            self._load(idx)
            return res
        out = res.view(Traced)
        out._log = self._log
        out._tile = self._piece_tile(key, idx)
        view = self._buf.holds(res) and np.shares_memory(res, plain)
        out._buf = self._buf if view else _Buffer(res, idx)
        if not view:  # a gather (K[idx], x[mask]) copies, so it reads now
            out._use()
        return out

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain_in = tuple(_unwrap(a) for a in inputs)
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        result = getattr(ufunc, method)(*plain_in, **kwargs)
        fresh = [
            a for a in inputs if isinstance(a, Traced) and a._log is not None and not a._loaded
        ]
        elementwise = method == "__call__" and ufunc.signature is None and ufunc.nout == 1
        shaped = [a for a in fresh if np.shape(result) == a.shape]
        # a transform of one input: the other operands are smaller (a scalar, a broadcast row);
        # np.maximum(m, x_i) with m as large as x_i is new state, not x_i transformed
        smaller = shaped and all(a is shaped[0] or np.size(a) < shaped[0].size for a in inputs)
        if elementwise and len(fresh) == 1 and smaller and isinstance(result, np.ndarray):
            src = shaped[0]  # K * scale, x - m, np.exp(x): the same elements, transformed
            if out is not None and isinstance(out[0], Traced):
                return out[0]
            return src._derived(result, src._origin_index().copy(), src._tile)
        for a in fresh:
            a._use()
        if out is not None and len(out) == 1:
            return out[0]
        return result

    def __array_function__(self, func, types, args, kwargs):
        name = func.__name__
        if name == "copy" and isinstance(args[0], Traced):
            return args[0].copy()
        if name in ("take", "compress") and isinstance(args[0], Traced):
            return getattr(args[0], name)(*args[1:], **kwargs)
        if name in _VIEW_FUNCTIONS and name not in _SHAPE_ONLY:
            return super().__array_function__(func, types, args, kwargs)
        plain_args, plain_kwargs = _unwrap_all(args), _unwrap_all(kwargs)
        if name not in _SHAPE_ONLY:
            for a in _traced_in((args, kwargs)):
                a._use()
        return func(*plain_args, **plain_kwargs)

    # -- conversions keep the tracing ----------------------------------------------------------

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        if self._log is None:
            return self._plain().astype(dtype, order=order, casting=casting, copy=copy)
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        res = np.array(self._plain(), dtype=dtype, order="C", copy=True)
        return self._derived(res, self._origin_index().copy(), self._tile)

    def copy(self, order="C"):
        if self._log is None:
            return self._plain().copy(order=order)
        res = np.array(self._plain(), order="C", copy=True)
        return self._derived(res, self._origin_index().copy(), self._tile)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    # -- C-level methods that read without a ufunc: a use of what they read ----------------------

    def _whole(self):
        self._use()
        return self._plain()

    def tolist(self):
        return self._whole().tolist()

    def item(self, *args):
        return self._whole().item(*args)

    def tobytes(self, order="C"):
        return self._whole().tobytes(order)

    def dot(self, b, out=None):
        return np.dot(self, b, out=out)

    def argmax(self, *a, **k):
        return self._whole().argmax(*a, **k)

    def argmin(self, *a, **k):
        return self._whole().argmin(*a, **k)

    def argsort(self, *a, **k):
        return self._whole().argsort(*a, **k)

    def nonzero(self):
        return self._whole().nonzero()

    def take(self, indices, axis=None, out=None, mode="raise"):
        if axis is None:
            return self.reshape(-1)[np.asarray(indices)]
        key = (slice(None),) * (axis % self.ndim) + (np.asarray(indices),)
        return self[key]

    def compress(self, condition, axis=None, out=None):
        return self.take(np.flatnonzero(np.asarray(condition)), axis=axis)

    def round(self, decimals=0, out=None):
        return np.round(self._whole(), decimals)

    def __float__(self):
        return float(self._whole())

    def __int__(self):
        return int(self._whole())

    def __index__(self):
        return self._whole().__index__()

    def __bool__(self):
        return bool(self._whole())

    def __reduce__(self):
        return self._plain().__reduce__()


def _plain_key(key):
    if isinstance(key, tuple):
        return tuple(_unwrap(k) for k in key)
    return _unwrap(key)


def _unwrap(a):
    return a.view(np.ndarray) if isinstance(a, Traced) else a


def _unwrap_all(value):
    if isinstance(value, Traced):
        return value.view(np.ndarray)
    if isinstance(value, tuple | list):
        return type(value)(_unwrap_all(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap_all(v) for k, v in value.items()}
    return value


def _traced_in(value):
    if isinstance(value, Traced):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _traced_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _traced_in(v)


def traced(a) -> tuple[Traced, LoadLog]:
    """A read-only traced copy of a (C order) and the LoadLog it fills."""
    base = np.array(a, order="C", copy=True)
    log = LoadLog(base.shape)
    t = base.view(Traced)
    t._log, t._buf = log, _Buffer(base, np.arange(base.size, dtype=np.int64))
    t._tile = _Tile(whole=True)
    t.flags.writeable = False
    return t, log


@contextlib.contextmanager
def _conversions_keep_tracing():
    """While the learner's code runs, np.asarray / np.array of a Traced array keep it Traced.

    (NumPy's converters return a plain ndarray for a subclass; the learner's
    `x = np.asarray(x, dtype=np.float64)` would otherwise end the tracing at its first line.)
    """
    saved = {n: getattr(np, n) for n in ("asarray", "array", "ascontiguousarray")}

    def keep(converter):
        @functools.wraps(converter)
        def convert(a, dtype=None, *args, **kwargs):
            if isinstance(a, Traced) and a._log is not None:
                copy = kwargs.get("copy", converter is saved["array"])
                if dtype is not None and np.dtype(dtype) != a.dtype:
                    return a.astype(dtype)
                return a.copy() if copy else a
            return converter(a, dtype, *args, **kwargs)

        return convert

    try:
        for n, conv in saved.items():
            setattr(np, n, keep(conv))
        yield
    finally:
        for n, conv in saved.items():
            setattr(np, n, conv)


# ---------------------------------------------------------------------------------------------
# Running the learner's function: read-only inputs, the reference watch, spies, memory
# ---------------------------------------------------------------------------------------------

# Modules of course_utils a learner's function may run without calling a reference: this file
# (the instrumentation itself), input validation, and the interpreter's bounds guard (it wraps
# Triton's own load and store, so its frames run below the learner's kernel).
_INFRASTRUCTURE = (
    "course_utils.checks._core",
    "course_utils.checks._remote",
    "course_utils.checks._wire",
    "course_utils._validate",
    "course_utils.harness.triton_bounds",
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


def _frame_kind(frame, _cache: dict = {}) -> str:  # noqa: B006 (a cache)
    """'course', 'infrastructure', 'library' or 'learner': who wrote the code a frame runs.

    Course code that hooks a library's internals (a counter wrapped around the interpreter's
    tl.dot) is infrastructure: its module names the hooks in `INSTRUMENTS`.
    """
    code = frame.f_code
    kind = _cache.get(code)
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
        _cache[code] = kind
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

    def __call__(self, frame, event, arg):
        if event != "call" or self.off or self.called is not None:
            return
        name = frame.f_code.co_name
        if _frame_kind(frame) != "course" or name in self.allow:
            return
        if name == "<module>":  # importing a course module is not calling it
            return
        if _caller_kind(frame, self.top) == "learner":
            self.called = f"{frame.f_globals.get('__name__')}.{name}"


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
            sys.setprofile(watch)
            try:
                result = fn(*call_args, **call_kwargs)
            finally:
                switched_off = sys.getprofile() is not watch
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


# ---------------------------------------------------------------------------------------------
# Comparing values
# ---------------------------------------------------------------------------------------------


def close(yours, expected, *, rtol: float, atol: float) -> bool:
    """True when yours matches expected elementwise; equal infinities match, NaN never does."""
    try:
        y = np.asarray(yours, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape or np.isnan(y).any():
        return False
    same_inf = np.isinf(e) & (y == e)
    finite = ~np.isinf(e)
    if np.isinf(y[finite]).any():
        return False
    ok = np.abs(y[finite] - e[finite]) <= atol + rtol * np.abs(e[finite])
    return bool(ok.all() and (same_inf | finite).all())


def max_abs_error(yours, expected) -> float:
    """Largest |yours - expected| over the finite entries of expected (inf if shapes differ)."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape:
        return np.inf
    finite = np.isfinite(e)
    if not finite.any():
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(y[finite] - e[finite])
    return float(np.where(np.isnan(diff), np.inf, diff).max())


def _worst(yours, expected, *, rtol: float, atol: float) -> tuple[tuple, int]:
    """The index of the worst wrong entry, and how many entries are wrong."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(np.isinf(e) & (y == e), 0.0, np.abs(y - e))
        wrong = ~(diff <= atol + rtol * np.where(np.isfinite(e), np.abs(e), 0.0))
    score = np.where(np.isnan(diff), np.inf, diff)
    score = np.where(wrong, score, -1.0)
    return np.unravel_index(int(np.argmax(score)), y.shape), int(wrong.sum())


MUTATES_INPUT = Mistake(
    slug="mutates-input",
    title="the function changes an input array in place",
    explanation=(
        "Your function writes into an array it was given (x -= shift, o1 *= w, Q *= tau, "
        "dP -= D). The caller still needs that array: the check hands you read-only copies to "
        "catch this. Compute into a new array (x = x - shift) or copy first (x = x.copy())."
    ),
    fn=lambda *a, **k: None,
)

FOREIGN_ARRAYS = Mistake(
    slug="array-library-in-numpy-exercise",
    title="a NumPy exercise computed with another array library",
    explanation=(
        "The exercise's memory budget counts what NumPy allocates (tracemalloc); torch, JAX, "
        "CuPy, TensorFlow, Numba and MLX allocate outside its sight, so it cannot tell a tiled "
        "computation from one that builds the forbidden array. Write it with NumPy arrays: the "
        "point is the algorithm, which a fused library call would hide."
    ),
    fn=lambda *a, **k: None,
)


def _array_library_message(name: str, libraries: Sequence[str]) -> str:
    """The failure of a memory-budgeted call that used torch, JAX, ... (_array_libraries)."""
    return (
        f"✗ {name} computes with {' and '.join(libraries)} in a NumPy exercise, where the memory "
        f"budget sees only NumPy's arrays.\n"
        f"  likely mistake: {FOREIGN_ARRAYS.title} [misconception: {FOREIGN_ARRAYS.slug}]\n"
        f"  {FOREIGN_ARRAYS.explanation}"
    )


DISABLES_CHECK = Mistake(
    slug="disables-check",
    title="the function switches off the check's instrumentation",
    explanation=(
        "The check watches which functions your code calls; setting sys.setprofile (or settrace) "
        "inside the exercise turns that off. Leave the interpreter's hooks alone."
    ),
    fn=lambda *a, **k: None,
)

NAN_MISTAKE = Mistake(
    slug="nan-masked",
    title="NaN from a fully masked row or an empty set",
    explanation=(
        "exp(-inf - (-inf)) is NaN. When the running max (or an lse) is still -inf, the rescale "
        "factor must be 0 and the row must stay empty: subtract a finite stand-in "
        "(np.where(m == -inf, 0, m)) instead of -inf. An empty set has weight 0, o = 0, lse = -inf."
    ),
    fn=lambda *a, **k: None,
)


LOW_PRECISION_MISTAKE = Mistake(
    slug="low-precision",
    title="running statistics kept in low precision",
    explanation=(
        "Your result is close but not exact, as when m, l, acc or lse are kept in float16, "
        "bfloat16 or float32. Keep the running statistics in float64 here (float32 on a GPU, "
        "never bf16): they sum many terms, and bf16 has only about 3 significant digits."
    ),
    fn=lambda *a, **k: None,
)

CALLS_REFERENCE = Mistake(
    slug="calls-reference",
    title="the answer calls the course's own code",
    explanation=(
        "The exercise is to write the algorithm yourself; calling a course_utils function "
        "(a reference, a figure's or a check's helper) scores 0. Use them only to compare, as the "
        "notebook does."
    ),
    fn=lambda *a, **k: None,
)


def calls_reference(fn: Callable) -> bool:
    """True when fn is (or wraps without change) a function of the course_utils package."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", "") or ""
    return module == "course_utils" or module.startswith("course_utils.")


def _as_tuple(result, n: int):
    if n == 1:
        return (result,)
    if not isinstance(result, tuple | list) or len(result) != n:
        got = type(result).__name__ + (
            f" of length {len(result)}" if hasattr(result, "__len__") else ""
        )
        raise CheckFailure(f"expected your function to return {n} values as a tuple, got {got}")
    return tuple(result)


# ---------------------------------------------------------------------------------------------
# Rules: how the answer is computed
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How the learner must compute, checked on one case once every value is right.

    The case runs under instrumented_call with the given instruments; judge(report, case) returns
    None when the rule holds, or (Mistake, what was measured) when it is broken.

    what: the rule in the notebook's words ("never build an N x N_k array").
    """

    case: Case
    judge: Callable[[CallReport, Case], tuple[Mistake, str] | None]
    what: str
    trace: tuple = ()
    memory: bool = False
    spy: tuple[str, ...] = ()


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; powers of 2, as the notebooks count memory."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def memory_budget(case: Case, allowed: int, mistake: Mistake, *, forbidden: int, what: str) -> Rule:
    """A Rule: the peak of new allocations while fn runs on case stays within `allowed` bytes.

    forbidden: the size of the array the rule forbids (at least 10x allowed on a good case).
    """

    def judge(report: CallReport, case: Case):
        if report.peak is None or report.peak <= allowed:
            return None
        return mistake, (
            f"your function allocated {fmt_bytes(report.peak)} at its peak; the budget is "
            f"{fmt_bytes(allowed)} (the forbidden array alone is {fmt_bytes(forbidden)})"
        )

    return Rule(case, judge, what, memory=True)


def traced_loads(fn: Callable, case: Case, trace: tuple) -> dict[str, LoadLog]:
    """The LoadLogs of one of the checks' own implementations (a reference) on case."""

    def own(*a, **k):
        return fn(*a, **k)

    own.__course_test_double__ = True  # the checks' own code: not a learner's call into it
    own.__signature__ = inspect.signature(fn)
    report = instrumented_call(own, case.args, case.kwargs, name="reference", trace=trace)
    return {key: report.loads[report.traced[key]] for key in trace}


def tile_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    arg: int | str,
    axis: int,
    limit: int,
    whole_reads: int = 0,
):
    """A Rule: no single load of argument `arg` spans more than `limit` positions along `axis`
    (e.g. K is read in tiles of at most Bc rows; a stream in blocks of at most `block`).

    whole_reads: how many loads of the whole array are allowed besides the tiles (a preparation
    step such as D = rowsum(dO * O) reads dO and O whole once).
    """

    def judge(report: CallReport, case: Case):
        log = _log_of(report, arg)
        name = _name_of(report, arg)
        whole = [ld for ld in log.loads if ld.size == log.counts.size]
        if whole_reads and len(whole) > whole_reads:
            return mistake, (
                f"`{name}` is read whole {len(whole)} times; the exercise needs at most "
                f"{whole_reads}, the rest in tiles"
            )
        pieces = [ld for ld in log.loads if not (whole_reads and ld.size == log.counts.size)]
        widest = max((len(log.positions(ld, axis)) for ld in pieces), default=0)
        if widest <= limit:
            return None
        return mistake, (
            f"one read of `{name}` spans {widest} of its {log.shape[axis]} positions along "
            f"axis {axis}; a tile may span at most {limit}"
        )

    return Rule(case, judge, what, trace=(arg,))


def single_pass_rule(case: Case, what: str, mistake: Mistake, *, arg: int | str):
    """A Rule: no element of argument `arg` is loaded twice (one streaming pass)."""

    def judge(report: CallReport, case: Case):
        log = _log_of(report, arg)
        most = int(log.counts.max(initial=0))
        if most <= 1:  # elements never read are allowed (a masked key's value is not needed)
            return None
        name = _name_of(report, arg)
        return (
            mistake,
            f"some elements of `{name}` are read {most} times (one pass reads each once)",
        )

    return Rule(case, judge, what, trace=(arg,))


def bounded_loads_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    args: tuple,
    reference: Callable | Sequence[Callable],
    slack: float = 1.0,
):
    """A Rule: the traced `args` are loaded no more often in all than a rule-following loop loads
    them.

    reference: one (or several) of the checks' own implementations that follow the rule (e.g. a
    tiled forward that stops at the diagonal; a backward in each loop order); their loads are
    measured on the same case with the same tracer, and each argument's bound is the largest.
    slack: the learner may load up to slack times that bound (tiles cut at other boundaries).
    """
    references = list(reference) if isinstance(reference, list | tuple) else [reference]

    def judge(report: CallReport, case: Case):
        bounds = [traced_loads(ref, case, args) for ref in references]
        for arg in args:
            log = _log_of(report, arg)
            ref_total = max(int(b[arg].counts.sum()) for b in bounds)
            total, allowed = int(log.counts.sum()), int(slack * ref_total)
            if total > allowed:
                name = _name_of(report, arg)
                return mistake, (
                    f"`{name}` is read {total:,} element-times in all; a loop that follows the "
                    f"rule reads it {ref_total:,} times"
                )
        return None

    return Rule(case, judge, what, trace=tuple(args))


def partition_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    args: tuple,
    axis: int,
    groups: Callable[[Case], Sequence],
    unit: str = "part",
):
    """A Rule: no single load of the traced `args` touches positions (along `axis`) of two groups.

    groups(case): the groups, a sequence of index arrays (the key sets of attention by parts, the
    chunks of a split-KV decode): each is a worker's own data, computed on its own.
    """

    def judge(report: CallReport, case: Case):
        for arg in args:
            log = _log_of(report, arg)
            owner = np.full(log.shape[axis], -1)
            for g, idx in enumerate(groups(case)):
                owner[np.asarray(idx, dtype=np.intp)] = g
            for load in log.loads:
                rows = np.unique(np.unravel_index(load, log.shape)[axis])
                touched = np.unique(owner[rows])
                if len(touched) > 1:
                    name = _name_of(report, arg)
                    return mistake, (
                        f"one read of `{name}` takes {len(rows)} of its {log.shape[axis]} rows, "
                        f"from {len(touched)} different {unit}s; each {unit} is read on its own"
                    )
        return None

    return Rule(case, judge, what, trace=tuple(args))


def calls_rule(
    case: Case,
    what: str,
    mistake: Mistake,
    *,
    helper: str,
    at_least: int | Callable[[Case], int],
    check: Callable[[list, Case], str | None] | None = None,
):
    """A Rule: the learner's function calls its own `helper` (a function of the notebook) at
    least `at_least` times; check(calls, case), if given, may refuse the calls' arguments with a
    message (e.g. a decode that calls its split_kv_partials with num_splits = 1)."""

    def judge(report: CallReport, case: Case):
        calls = report.calls.get(helper, [])
        need = at_least(case) if callable(at_least) else at_least
        if len(calls) < need:
            times = f"{len(calls)} time" + ("s" if len(calls) != 1 else "")
            return mistake, f"your {helper} was called {times}; the exercise needs at least {need}"
        problem = check(calls, case) if check is not None else None
        return None if problem is None else (mistake, problem)

    return Rule(case, judge, what, spy=(helper,))


def _name_of(report: CallReport, arg) -> str:
    return report.traced.get(arg, str(arg))


def _log_of(report: CallReport, arg) -> LoadLog:
    return report.loads[_name_of(report, arg)]


def _rule_message(name: str, rule: Rule, mistake: Mistake, measured: str, names) -> str:
    return "\n".join(
        [
            f"✗ {name} gives the right values but breaks a rule of the exercise on "
            f"{rule.case.label}: {rule.what}.",
            f"  input:    {_describe_args(rule.case, names)}",
            f"  measured: {measured}",
            f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]",
            f"  {mistake.explanation}",
        ]
    )


# ---------------------------------------------------------------------------------------------
# Running a check
# ---------------------------------------------------------------------------------------------


def run_cases(
    name: str,
    fn: Callable,
    reference: Callable,
    cases: Sequence[Case],
    *,
    outputs: Sequence[str],
    mistakes: Sequence[Mistake] = (),
    rtol: float = 1e-10,
    atol: float = 1e-10,
    summary: str = "",
    low_precision_below: float | None = 5e-2,
    allow: tuple[str, ...] = (),
    rules: Sequence[Rule] = (),
) -> None:
    """Run fn and reference on every case; check the rules; print one pass line or raise.

    Args:
        name: the exercise, as the learner knows it (e.g. "merge_partials").
        fn: the learner's function.  reference: the correct one, same signature.
        cases: smallest first, so the first failure is the smallest input that shows it.
        outputs: names of the returned values, e.g. ("o", "lse"); one name: a single value.
        mistakes: known buggy implementations, tried in order to name the learner's mistake.
            One is named only when its output on the failing case matches the learner's.
        rtol, atol: tolerance of the comparison with the reference.
        summary: appended to the pass line (what was covered).
        low_precision_below: a finite result within this relative error that matches no known
            mistake is described as close but not exact (None: never); it names no mistake.
        allow: names of course_utils functions the learner may call (earlier notebooks' answers).
        rules: how the answer must be computed (memory budget, loads, helpers), checked after
            every value is right, each on its own case.
    """
    if calls_reference(fn):
        raise CheckFailure(
            f"✗ {name}: your function is course_utils' own ({fn.__module__}.{fn.__name__}).\n"
            f"  likely mistake: {CALLS_REFERENCE.title} [misconception: {CALLS_REFERENCE.slug}]\n"
            f"  {CALLS_REFERENCE.explanation}"
        )
    settings = dict(
        outputs=outputs,
        mistakes=mistakes,
        rtol=rtol,
        atol=atol,
        low_precision_below=low_precision_below,
        allow=allow,
    )
    stages = _stage_order(cases)
    for case in cases:
        try:
            _run_case(name, fn, reference, case, **settings)
        except CheckFailure as failure:
            if not stages:
                raise
            raise CheckFailure(_stage_header(name, stages, case.stage) + str(failure)) from None
    for rule in rules:
        report = _run_case(
            name,
            fn,
            reference,
            rule.case,
            trace=rule.trace,
            memory=rule.memory,
            spy=rule.spy,
            **settings,
        )
        verdict = rule.judge(report, rule.case)
        if verdict is not None:
            names = _arg_names(fn, len(rule.case.args), rule.case.kwargs)
            raise CheckFailure(_rule_message(name, rule, *verdict, names))
    count = f"{len(cases)} case" + ("s match" if len(cases) != 1 else " matches")
    extra = f"; {len(rules)} rule" + ("s" if len(rules) != 1 else "") + " hold" if rules else ""
    extra = extra.replace(" rule hold", " rule holds")
    print(f"✓ {name}: {count} the reference{extra}" + (f" ({summary})" if summary else ""))


def _stage_order(cases: Sequence[Case]) -> list[str]:
    """The stages of cases in order (empty when the check is not staged); cases must come
    stage by stage, so that the first failure is in the first failing stage."""
    stages: list[str] = []
    for case in cases:
        if case.stage and (not stages or stages[-1] != case.stage):
            if case.stage in stages:
                raise ValueError(f"cases of stage {case.stage!r} are not contiguous")
            stages.append(case.stage)
    if stages and any(not c.stage for c in cases):
        raise ValueError("a staged check needs a stage on every case")
    return stages


def _stage_header(name: str, stages: list[str], failed: str) -> str:
    k = stages.index(failed)
    passed = "; ".join(f"stage {i + 1} ({s}) passes" for i, s in enumerate(stages[:k]))
    later = ", ".join(stages[k + 1 :])
    line = f"✗ {name}: stage {k + 1} of {len(stages)} ({failed}) fails"
    line += f"; {passed}" if passed else ""
    line += f". Still to check after it: {later}." if later else "."
    return line + "\n"


def _run_case(
    name, fn, reference, case, *, outputs, mistakes, rtol, atol, low_precision_below, allow, **instr
) -> CallReport:
    """One case: the learner's call (instrumented), then the comparison; raise on a wrong value."""
    expected = _as_tuple(reference(*case.args, **case.kwargs), len(outputs))
    names = _arg_names(fn, len(case.args), case.kwargs)
    try:
        report = instrumented_call(fn, case.args, case.kwargs, name=name, allow=allow, **instr)
    except _LearnerRaised as err:
        raise CheckFailure(
            f"✗ {name} raised {err} on {case.label}.\n  input: {_describe_args(case, names)}"
        ) from None
    yours = _as_tuple(report.result, len(outputs))
    for out_name, y, e in zip(outputs, yours, expected, strict=True):
        if np.shape(y) != np.shape(e):
            if np.size(y) == np.size(e) and close(
                np.reshape(y, np.shape(e)), e, rtol=rtol, atol=atol
            ):
                why = "the values are right but"
            else:
                why = ""
            raise CheckFailure(
                f"✗ {name}: {why + ' ' if why else ''}{out_name} has shape {np.shape(y)}, "
                f"expected {np.shape(e)} on {case.label}.\n  input: {_describe_args(case, names)}"
            )
    bad = [
        (out_name, y, e)
        for out_name, y, e in zip(outputs, yours, expected, strict=True)
        if not close(y, e, rtol=rtol, atol=atol)
    ]
    if bad:
        mistake = diagnose(yours, case, mistakes, len(outputs), expected)
        note = None
        if mistake is None:
            if any(np.isnan(np.asarray(y, dtype=float)).any() for _, y, _ in bad):
                note = "your result has NaN where the expected value is a number or ±inf"
            elif low_precision_below is not None:
                rel = max(_relative_error(y, e) for _, y, e in bad)
                if rel < low_precision_below:
                    note = (
                        f"your values are close (relative error {rel:.1e}) but not within the "
                        f"tolerance ({rtol:g})"
                    )
        raise CheckFailure(
            _failure_message(name, case, bad, mistake, names, rtol=rtol, atol=atol, note=note)
        )
    return report


def diagnose(
    yours: tuple, case: Case, mistakes: Sequence[Mistake], n: int, expected: tuple | None = None
) -> Mistake | None:
    """The first mistake whose output on this case matches the learner's output, or None.

    A mistake that happens to give the right answer on this case (given `expected`) cannot be
    what went wrong, so it is never named.
    """
    for mistake in mistakes:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                theirs = _as_tuple(mistake.fn(*case.args, **case.kwargs), n)
        except Exception:
            continue
        if expected is not None and all(
            close(t, e, rtol=1e-10, atol=1e-10) for t, e in zip(theirs, expected, strict=True)
        ):
            continue
        if all(_matches(y, t) for y, t in zip(yours, theirs, strict=True)):
            return mistake
    return None


def _matches(yours, theirs) -> bool:
    try:
        y = np.asarray(yours, dtype=np.float64)
        t = np.asarray(theirs, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if y.shape != t.shape:
        return False
    both_nan = np.isnan(y) & np.isnan(t)
    with np.errstate(invalid="ignore"):
        near = np.isclose(y, t, rtol=1e-6, atol=1e-9, equal_nan=False) | both_nan
    return bool(near.all())


def matches_in_norm(yours: np.ndarray, theirs: np.ndarray, tol: float) -> bool:
    """yours matches a mistake's output (a kernel check's emulation or replay): NaN, +inf and
    -inf in the same places, and the finite rest within tol in norm, relative to ||theirs||."""
    if yours.shape != theirs.shape:
        return False
    special_y, special_t = ~np.isfinite(yours), ~np.isfinite(theirs)
    if (special_y != special_t).any():
        return False
    if not np.array_equal(yours[special_y], theirs[special_t], equal_nan=True):
        return False
    y, t = yours[~special_y], theirs[~special_t]
    if y.size == 0:
        return True
    return float(np.linalg.norm(y - t)) <= tol * max(float(np.linalg.norm(t)), 1e-30)


def worst_row(yours: np.ndarray, expected: np.ndarray, lead: int = 3) -> tuple[int, ...]:
    """The index over the first `lead` axes of the row with the largest difference: NaN counts
    as largest, the same infinity (or NaN) on both sides as none."""
    with np.errstate(all="ignore"):
        diff = np.abs(yours - expected)
    alike = (np.isnan(yours) & np.isnan(expected)) | (np.isinf(yours) & (yours == expected))
    diff = np.where(alike, 0.0, np.where(np.isnan(diff), np.inf, diff))
    lead = min(lead, diff.ndim)
    per_row = diff.reshape(*diff.shape[:lead], -1).max(axis=-1)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(per_row)), per_row.shape))


def mismatch_lines(
    what: str,
    yours: np.ndarray,
    expected: np.ndarray,
    err: float,
    tol: float,
    mistake: Mistake | None,
    focus: str,
    *,
    rows: Sequence[str] = ("batch", "head", "query"),
    nan_note: str = "",
) -> list[str]:
    """The lines every kernel check prints under its own header when an output is wrong: the
    relative error and the worst row (named by `rows`, the output's leading axes), yours and the
    expected values there (a row's first six entries, or one value), then the mistake, but only
    when a replay of it matched; otherwise what the case exercises, with a note on NaN (and
    `nan_note`) or on a result that is merely close."""
    idx = worst_row(yours, expected, len(rows))
    at = ", ".join(str(i) for i in idx)
    where = ", ".join(f"{name} {i}" for name, i in zip(rows, idx, strict=False))
    err_text = "NaN or inf" if not math.isfinite(err) else f"{err:.2e}"
    lines = [
        f"  relative error of {what}: {err_text} (tolerance {tol:.0e}); the worst row is {where}:"
    ]
    if yours.shape != expected.shape:
        lines.append(f"  yours has shape {yours.shape}, expected {expected.shape}")
    elif yours.ndim > len(idx):
        lines.append(f"  yours:    {what}[{at}, :6] = {describe(yours[idx][:6], 5)}")
        lines.append(f"  expected: {what}[{at}, :6] = {describe(expected[idx][:6], 5)}")
    else:
        lines.append(f"  yours:    {what}[{at}] = {describe(yours[idx], 7)}")
        lines.append(f"  expected: {what}[{at}] = {describe(expected[idx], 7)}")
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
        return lines
    if np.isnan(yours).any():
        lines.append(
            f"  note: your {what} has NaN in {int(np.isnan(yours).sum())} of {yours.size} "
            f"entries{nan_note}."
        )
    elif math.isfinite(err) and err < 5e-2:
        lines.append(
            f"  note: your values are close (relative error {err:.1e}) but not within the "
            f"tolerance ({tol:.0e})."
        )
    lines.append(f"  No known mistake matches; this case exercises {focus}.")
    return lines


def closest_mistake(yours: tuple, replays, tol: float) -> Mistake | None:
    """Of the mistakes whose replay matches yours (every output, matches_in_norm within tol), the
    nearest one; None when none matches.

    yours: the learner's outputs, a tuple of arrays. replays: (mistake, their outputs) pairs in
    the order the check prefers them; the caller leaves out a mistake that is right on this case
    (it cannot be what went wrong). Taking the nearest, not the first, keeps a loose tolerance
    (half precision on a GPU) from naming a neighbouring mistake that shrinks the output by a
    similar factor; replays within twice the nearest distance (two mistakes that compute the
    same thing, such as tl.exp on log2 scores and log2(e) folded twice) count as a tie, which
    goes to the first in order.
    """
    matched = []
    for mistake, theirs in replays:
        pairs = list(zip(yours, theirs, strict=True))
        if all(matches_in_norm(y, t, tol) for y, t in pairs):
            matched.append((mistake, max(_norm_distance(y, t) for y, t in pairs)))
    if not matched:
        return None
    nearest = min(distance for _, distance in matched)
    return next(m for m, distance in matched if distance <= 2 * nearest + 1e-9)


def _norm_distance(yours: np.ndarray, theirs: np.ndarray) -> float:
    """||y - t|| / ||t|| over the finite entries (matches_in_norm has checked the rest)."""
    finite = np.isfinite(theirs)
    y, t = yours[finite], theirs[finite]
    if y.size == 0:
        return 0.0
    return float(np.linalg.norm(y - t)) / max(float(np.linalg.norm(t)), 1e-30)


def _relative_error(yours, expected) -> float:
    """max |y - e| / max(1, max |e|) over finite entries; inf on NaN or mismatched infinities."""
    y = np.asarray(yours, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if y.shape != e.shape or np.isnan(y).any() or (np.isinf(y) != np.isinf(e)).any():
        return np.inf
    finite = np.isfinite(e)
    if not finite.any():
        return 0.0
    scale = max(1.0, float(np.abs(e[finite]).max()))
    return float(np.abs(y[finite] - e[finite]).max()) / scale


def _failure_message(
    name: str,
    case: Case,
    bad,
    mistake: Mistake | None,
    names=None,
    *,
    rtol=1e-10,
    atol=1e-10,
    note: str | None = None,
) -> str:
    lines = [f"✗ {name} is wrong on {case.label}.", f"  input:    {_describe_args(case, names)}"]
    for out_name, y, e in bad:
        if np.size(e) <= _SMALL:
            digits = 6 if describe(y) != describe(e) else 15  # close: show where they differ
            lines.append(f"  yours:    {out_name} = {describe(y, digits)}")
            lines.append(f"  expected: {out_name} = {describe(e, digits)}")
            err = max_abs_error(y, e)
            if np.isfinite(err) and err > 0:
                lines.append(f"  largest difference in {out_name}: {err:.3g}")
        else:
            where, count = _worst(y, e, rtol=rtol, atol=atol)
            at = f"{out_name}[{', '.join(str(int(i)) for i in where)}]"
            yv, ev = np.asarray(y)[where], np.asarray(e)[where]
            lines.append(
                f"  {out_name}: {count} of {np.size(e)} entries are wrong (shape {np.shape(e)}); "
                f"the worst is {at}"
            )
            lines.append(f"  yours:    {at} = {describe(yv)}")
            lines.append(f"  expected: {at} = {describe(ev)}")
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        if note:
            lines.append(f"  note: {note}.")
        focus = case.focus or f"the specification of {name} (its docstring)"
        lines.append(f"  No known mistake matches; this case exercises {focus}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Quick checks: one number (or choice) per question
# ---------------------------------------------------------------------------------------------


def tolerance_phrase(rtol: float) -> str:
    """How a quick check's tolerance reads beside its question and in its feedback: "exact" for
    an integer count (rtol below 1e-6), else the relative tolerance in percent ("0.5%")."""
    if rtol < 1e-6:
        return "exact"
    return f"{rtol * 100:.10g}%"


def significant_digits(rtol: float) -> int:
    """Digits that always meet a relative tolerance: rounding to N significant digits is off by
    at most 5 x 10^-N of the value (leading digit 1), so N = ceil(log10(5 / rtol))."""
    return max(2, math.ceil(math.log10(5.0 / rtol) - 1e-9))


def check_answer(
    label: str,
    yours,
    expected,
    *,
    rtol: float = 1e-3,
    atol: float = 1e-9,
    hint: str = "",
    near: bool = True,
) -> None:
    """Check a numeric quick-check answer; print a pass line or raise CheckFailure with a hint.

    An answer within 10 times the tolerance (and `near`: the hint is not one for a known wrong
    value) is a right result given with too few digits: the reply asks for more digits instead
    of the hint, which would send the learner re-deriving a right result.
    """
    if yours is None or yours is Ellipsis:
        raise CheckFailure(f"{label}: no answer yet (replace the placeholder with a number)")
    if isinstance(yours, str):
        raise CheckFailure(f"✗ {label}: the answer is the text {yours!r}; give a number")
    if close(yours, expected, rtol=rtol, atol=atol):
        print(f"✓ {label}: {describe(yours)} is right")
        return
    try:
        flat = np.ravel(np.asarray(yours, dtype=np.float64))
    except (TypeError, ValueError):
        flat = None
    if flat is not None and flat.size == 1 and np.ndim(yours) > np.ndim(expected):
        if close(flat[0], expected, rtol=rtol, atol=atol):
            raise CheckFailure(
                f"✗ {label}: the value is right, but it is {type(yours).__name__} of shape "
                f"{np.shape(yours)}; give a plain number (for example float(...) of it)"
            )
    tolerance = tolerance_phrase(rtol)
    if near and rtol >= 1e-6 and close(yours, expected, rtol=10 * rtol, atol=10 * atol):
        raise CheckFailure(
            f"✗ {label}: {describe(yours, 8)} is close, but not within the tolerance "
            f"({tolerance}): give {significant_digits(rtol)} significant digits (or the "
            f"expression itself, such as np.exp(-1))."
        )
    msg = f"✗ {label}: {describe(yours)} is not right (tolerance: {tolerance})."
    raise CheckFailure(msg + (f"\n  hint: {hint}" if hint else ""))


def hinted_answer(
    label: str, yours, expected, wrong_answers, default_hint: str, rtol: float = 1e-3
) -> None:
    """check_answer whose hint is chosen by the wrong answer given, when it is a known one.

    wrong_answers: (value, hint) pairs, e.g. (8 / 10, "that is the ratio the other way round").
    An answer gets the hint of the nearest known wrong value when it lies within 1% of it and
    closer to it than to any other known value (the right one included): windows never overlap.
    Any other wrong answer gets default_hint, or, within 10 times the tolerance of the right
    value, the request for more digits (check_answer).
    """
    hint, known_wrong = default_hint, False
    try:
        value = float(yours)
    except (TypeError, ValueError):
        value = None
    if value is not None and np.isfinite(value):
        known = [float(expected)] + [float(w) for w, _ in wrong_answers]
        for k, (wrong, why) in enumerate(wrong_answers):
            wrong = float(wrong)
            others = [abs(o - wrong) for j, o in enumerate(known) if j != k + 1 and o != wrong]
            window = max(1e-2, rtol) * abs(wrong)
            if others:
                window = min(window, 0.5 * min(others))
            if abs(value - wrong) <= window:
                hint, known_wrong = why, True
                break
    check_answer(label, yours, expected, rtol=rtol, hint=hint, near=not known_wrong)


@dataclass(frozen=True)
class Option:
    """One option of a concept question.

    key: what the learner types ("a", "b", ...; "true" or "false" for a true/false question).
    text: the option as the notebook shows it.  slug: the misconception a learner who picks it
    holds (None for a right option).  why: the feedback when it is picked: why it is right, or
    what is wrong with it.
    """

    key: str
    text: str
    slug: str | None = None
    why: str = ""


@dataclass(frozen=True)
class Question:
    """A graded concept question: one right option (or `pick` right ones), each wrong option tied
    to a named misconception so that the class report counts them.

    label: short name in feedback.  prompt: the question (markdown).  variable: the name the
    learner sets in the answer cell.  pick: how many options to choose (1: a single choice).
    The notebook shows `markdown()`; tests/checks/test_concepts.py checks that it does.
    """

    label: str
    prompt: str
    options: tuple[Option, ...]
    variable: str
    pick: int = 1

    def __post_init__(self):
        keys = [o.key for o in self.options]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.label}: option keys repeat: {keys}")
        right = [o for o in self.options if o.slug is None]
        if len(right) != self.pick:
            raise ValueError(f"{self.label}: {len(right)} right options, expected {self.pick}")
        if any(o.slug is not None and not o.why for o in self.options):
            raise ValueError(f"{self.label}: every wrong option needs its explanation")

    @property
    def right(self) -> frozenset[str]:
        return frozenset(o.key for o in self.options if o.slug is None)

    @property
    def true_false(self) -> bool:
        return {o.key for o in self.options} == {"true", "false"}

    def markdown(self) -> str:
        """The question as the notebook shows it: prompt, options, and how to answer."""
        if self.true_false:
            how = f"Set `{self.variable}` to `True` or `False`."
            return f"{self.prompt}\n\n{how}"
        lines = [self.prompt, ""]
        options = sorted(self.options, key=lambda o: o.key)
        lines += [f"- **({o.key})** {o.text}" for o in options]
        letters = ", ".join(f'`"{o.key}"`' for o in options)
        if self.pick == 1:
            how = f"Set `{self.variable}` to the letter of your choice as a string ({letters})."
        else:
            how = (
                f"Choose {self.pick}. Set `{self.variable}` to a string with the letters of your "
                f"{self.pick} choices, in any order."
            )
        return "\n".join(lines) + f"\n\n{how}"


_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


def _chosen_keys(question: Question, yours) -> frozenset[str]:
    """The option keys the learner chose; CheckFailure when the answer is not a choice."""
    label = question.label
    if yours is None or yours is Ellipsis:
        raise CheckFailure(
            f"{label}: no answer yet (set {question.variable} to "
            + ("True or False)" if question.true_false else "a letter, as a string)")
        )
    if question.true_false:
        if isinstance(yours, bool | np.bool_):
            return frozenset({"true" if yours else "false"})
        if isinstance(yours, str) and yours.strip().lower() in _TRUE | _FALSE:
            return frozenset({"true" if yours.strip().lower() in _TRUE else "false"})
        raise CheckFailure(f"✗ {label}: {describe(yours)} is not True or False")
    if isinstance(yours, str):
        letters = [c for c in yours.lower() if c.isalnum()]
    elif isinstance(yours, list | tuple | set | frozenset) and all(
        isinstance(x, str) for x in yours
    ):
        letters = [c for x in yours for c in x.lower() if c.isalnum()]
    else:
        raise CheckFailure(
            f"✗ {label}: the answer is {type(yours).__name__} {describe(yours)}; give the "
            f'letter of an option as a string, for example "a"'
        )
    keys = {o.key for o in question.options}
    unknown = sorted(set(letters) - keys)
    if unknown or not letters:
        raise CheckFailure(
            f"✗ {label}: {yours!r} is not one of the options ({', '.join(sorted(keys))})"
        )
    if len(set(letters)) != question.pick:
        raise CheckFailure(
            f"✗ {label}: you chose {len(set(letters))} option(s); choose exactly {question.pick}"
        )
    return frozenset(letters)


_LATEX_SYMBOLS = {
    r"\times": "×", r"\Theta": "Θ", r"\le": "≤", r"\ge": "≥", r"\ell": "ℓ", r"\propto": "∝",
    r"\top": "ᵀ", r"\infty": "∞", r"\log": "log", r"\max": "max", r"\min": "min", r"\exp": "exp",
    r"\cdot": "·", r"\sqrt": "√", r"\sum": "Σ", r"\,": " ", "{,}": ",",
}  # fmt: skip
_SUPERSCRIPT = str.maketrans("0123456789+-()nijkT", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾ⁿⁱʲᵏᵀ")
_SUBSCRIPT = str.maketrans("0123456789+-()ijkrs", "₀₁₂₃₄₅₆₇₈₉₊₋₍₎ᵢⱼₖᵣₛ")
_MATH = re.compile(r"\$([^$]*)\$")
_SCRIPT = re.compile(r"([\^_])(\{([^{}]*)\}|\w)")


def _math_plain(math_text: str) -> str:
    """One $...$ of a concept option as plain text (N \\times N -> N×N, N^2 d -> N²d)."""
    text = math_text
    for name in ("mathrm", "text", "tilde"):
        text = re.sub(rf"\\{name}\s*\{{([^{{}}]*)\}}", r"\1", text)
    text = re.sub(r"\\tilde\s*(\w)", "\\1\u0303", text)
    for latex, symbol in sorted(_LATEX_SYMBOLS.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(re.escape(latex) + r"(?![A-Za-z])", lambda _m, s=symbol: s, text)

    def script(m: re.Match) -> str:
        body = m.group(3) if m.group(3) is not None else m.group(2)
        table = _SUPERSCRIPT if m.group(1) == "^" else _SUBSCRIPT
        converted = body.translate(table)
        if all(c != d or c in "ᵀ" for c, d in zip(converted, body, strict=True)):
            return converted
        return m.group(1) + (f"({body})" if len(body) > 1 else body)

    while (scripted := _SCRIPT.sub(script, text)) != text:  # innermost braces first
        text = scripted
    text = re.sub(r"(?<=[²³⁴ⁿᵀ])\s+(?=[A-Za-z])", "", text)  # N^2 d: N²d
    text = re.sub(r"\s*×\s*", "×", text)
    return text.replace("{", "").replace("}", "").replace("\\", "")


def plain_text(markdown: str) -> str:
    """A concept option's markdown as feedback prints it: math in plain Unicode, no LaTeX
    ($N \\times N$ -> N×N, $\\Theta(N^2 d)$ -> Θ(N²d)); feedback is plain text, and it is the
    only place where an option's text becomes feedback (check_choice)."""
    return _MATH.sub(lambda m: _math_plain(m.group(1)), markdown).replace("**", "")


def _shown(key: str) -> str:
    return {"true": "True", "false": "False"}.get(key, f"({key})")


def check_choice(question: Question, yours) -> None:
    """Check the answer to a concept question: print why it is right, or raise CheckFailure
    naming the misconception of the (first) wrong option chosen."""
    chosen = _chosen_keys(question, yours)
    by_key = {o.key: o for o in question.options}
    if chosen == question.right:
        why = " ".join(by_key[k].why for k in sorted(chosen) if by_key[k].why)
        shown = " and ".join(_shown(k) for k in sorted(chosen))
        verb = "is" if len(chosen) == 1 else "are"
        print(f"✓ {question.label}: {shown} {verb} right." + (f" {why}" if why else ""))
        return
    wrong = next(by_key[k] for k in sorted(chosen) if k not in question.right)
    shown = _shown(wrong.key)
    raise CheckFailure(
        f"✗ {question.label}: {shown} is not right.\n"
        f"  likely mistake: {plain_text(wrong.text)} [misconception: {wrong.slug}]\n"
        f"  {wrong.why}"
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
