"""Traced arrays: which elements of an input the learner's code loads, and in which pieces.

    traced(a) -> (Traced, LoadLog)   an array of shape a.shape that records its loads
    LoadLog                          per element of the input, how many loads read it; each
                                     load's flat element indices (TILE_READS says the rule)

The Rules (engine.rules) judge the LoadLogs that instrumented_call (engine.watch) returns.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

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
