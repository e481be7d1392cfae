"""CountingMemory: HBM plus an on-chip memory of M elements, counting every element moved.

The model of Dao et al. (2022, section 3.2): every array lives in HBM; a kernel loads tiles of them
into an on-chip memory (SRAM) of M elements, computes there for free, and stores tiles back. The
HBM traffic is the number of elements loaded plus stored (times bytes per element for bytes).

A CountingMemory accepts only what a thread block could do: a tile must fit in the M elements on
chip (OnChipMemoryError), and an output allocated with rows_from= (FlashAttention's O: rows_from
"Q", streamed "K", "V") is stored only from the query tile on chip, once every K/V row has passed
it, while a K/V tile is loaded only next to a query tile (ThreadBlockError). Its counters are
read-only, and it records every call in `operations`, so a check can replay them (record_loop
runs a learner's loop of notebook 04 on a fresh memory and returns those calls).

Counting is per tile, not per element, and a CountingMemory can run on shapes alone
(compute=False): counting FlashAttention at N = 16,384, d = 64, Br = Bc = 128 takes a fraction
of a second. It is the learner's instrument, not an answer: the traffic formulas and the course's
own counted runs of the attention algorithms are in references.memory.
"""

from __future__ import annotations

import html
import math
import numbers
from dataclasses import dataclass

import numpy as np

from course_utils._validate import positive_int

STATS_BYTES = 4  # m, l and lse are kept in fp32 whatever the dtype of Q, K, V


class OnChipMemoryError(ValueError):
    """A tile or scratch buffer does not fit in the M elements of on-chip memory."""


class ThreadBlockError(ValueError):
    """A load or store that no thread block could do (see CountingMemory.alloc, rows_from=).

    rule says which one:
        "stream-without-tile"  a tile of a streamed input (K) is loaded while no row tile that it
                               would be multiplied with (a tile of Q) is on chip;
        "rows-not-on-chip"     rows of an output (O) are stored that no row tile on chip holds:
                               they were never computed there (e.g. all of O at once, at the end);
        "stream-incomplete"    rows of an output are stored before every row of the streamed
                               inputs they depend on has passed through the chip since their row
                               tile was loaded (the output tile is not finished).
    missing: for "stream-incomplete", {input: [(r0, r1), ...]}, the row ranges not seen yet.
    streamed_any: for "stream-incomplete", whether any row of a streamed input was seen at all.
    """

    def __init__(self, message: str, rule: str, missing=None, streamed_any: bool = False):
        super().__init__(message)
        self.rule = rule
        self.missing = dict(missing or {})
        self.streamed_any = streamed_any


@dataclass(frozen=True)
class ArrayTraffic:
    """The HBM reads and writes of one array, in elements; bytes use `itemsize` per element."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int  # bytes counted per element (2 for bf16 even when the data is float64)
    reads: int
    writes: int

    @property
    def read_bytes(self) -> int:
        return self.reads * self.itemsize

    @property
    def write_bytes(self) -> int:
        return self.writes * self.itemsize

    @property
    def total_elements(self) -> int:
        return self.reads + self.writes

    @property
    def total_bytes(self) -> int:
        return self.total_elements * self.itemsize


class _HBMArray:
    """One array in HBM: its shape, byte size per element, data (None when counting shapes only).

    The counters are read-only properties; only the memory's load and store change them.
    """

    __slots__ = ("name", "shape", "dtype", "itemsize", "data", "_reads", "_writes")

    def __init__(self, name, shape, dtype, itemsize, data):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.itemsize = itemsize
        self.data = data
        self._reads = 0
        self._writes = 0

    @property
    def reads(self) -> int:
        return self._reads

    @property
    def writes(self) -> int:
        return self._writes


@dataclass(frozen=True)
class _OutputRule:
    """How the row tiles of an output are computed (see CountingMemory.alloc)."""

    rows_from: str
    streamed: tuple[str, ...]
    causal: bool


def _span(index, n: int, what: str) -> tuple[int, int]:
    """(start, stop) of a contiguous index: a slice, a range or a (start, stop) pair; stop <= n."""
    if type(index) is tuple and len(index) == 2 and type(index[0]) is type(index[1]) is int:
        start, stop = index[0], min(index[1], n)  # the common case, without the checks below
    elif isinstance(index, slice):
        if index.step not in (None, 1):
            raise ValueError(f"{what} must be contiguous (step 1), got {index}")
        start, stop, _ = index.indices(n)
    elif isinstance(index, range):
        if index.step != 1:
            raise ValueError(f"{what} must be contiguous (step 1), got {index}")
        start, stop = index.start, min(index.stop, n)
    elif (
        isinstance(index, tuple)
        and len(index) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in index)
    ):
        start, stop = int(index[0]), min(int(index[1]), n)
    else:
        raise TypeError(f"{what} must be a slice, a range or a (start, stop) pair, got {index!r}")
    if start < 0 or stop <= start:
        raise ValueError(f"{what} = {index!r} selects nothing in an axis of length {n}")
    return start, stop


def _shape(shape, name: str) -> tuple[int, ...]:
    """A shape of 1 or 2 positive ints (an int means a 1-D shape)."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple) or len(shape) not in (1, 2):
        raise TypeError(f"{name} must be a tuple of 1 or 2 positive ints, got {shape!r}")
    return tuple(positive_int(n, f"{name}[{k}]") for k, n in enumerate(shape))


def _fmt(n: int) -> str:
    return f"{n:,}"


def _rows_text(r0: int, r1: int) -> str:
    return f"row {r0}" if r1 - r0 == 1 else f"rows {r0}-{r1 - 1}"


def _ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """The (start, stop) runs of True in a 1-D boolean array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _ranges_text(ranges: list[tuple[int, int]], limit: int = 3) -> str:
    parts = [_rows_text(a, b) for a, b in ranges[:limit]]
    if len(ranges) > limit:
        parts.append(f"and {len(ranges) - limit} more ranges")
    return ", ".join(parts)


class _Seen:
    """Which elements of a streamed input have passed through the chip since a row tile came."""

    __slots__ = ("rows", "part", "shape")

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.rows = np.zeros(shape[0], dtype=bool)  # rows loaded with all their columns
        self.part = None  # (n, m) elements of rows loaded in column pieces, made when needed

    def mark(self, r0: int, r1: int, c0: int, c1: int) -> None:
        if len(self.shape) == 1 or (c0 == 0 and c1 == self.shape[1]):
            self.rows[r0:r1] = True
            return
        if self.part is None:
            self.part = np.zeros(self.shape, dtype=bool)
        self.part[r0:r1, c0:c1] = True

    def rows_seen(self) -> np.ndarray:
        return self.rows if self.part is None else self.rows | self.part.all(axis=1)

    def any(self) -> bool:
        return bool(self.rows.any() or (self.part is not None and self.part.any()))


class CountingMemory:
    """HBM plus an on-chip memory of M elements, counting every element moved between them.

    Arrays are put in HBM by name: `place` for inputs that are already there (placing is free),
    `alloc` for outputs. `load(name, rows, cols)` copies a tile onto the chip and counts its
    elements as reads; `store(name, rows, tile)` writes a tile back and counts writes. On chip,
    a tile sits in a named slot (by default the array's name) until `free(slot)` or until the next
    load into the same slot replaces it, as a kernel reuses its buffers; `scratch(slot, shape)`
    reserves on-chip space that comes from no array (the score tile, m and l). Putting more than
    M elements on chip at once raises OnChipMemoryError. M counts elements, not bytes.

    An output allocated with `rows_from` (and `streamed`) accepts only what a thread block could
    do: its row tiles are stored while they are on chip and finished (see `alloc`), and a tile of
    a streamed input is loaded only next to a row tile it is multiplied with; anything else raises
    ThreadBlockError. The counters are read-only, and every call is kept, in order, in
    `operations` (a check replays them on a memory of its own).

    With compute=False only shapes are kept: loads return None and stores take no data, but the
    counts are the same.

    Args:
        M: on-chip capacity in elements, a positive int, or None for unlimited.
        compute: keep and move the values (True) or count shapes only (False).

    Example:
        mem = CountingMemory(M=4096)
        mem.place("Q", Q)                      # Q: (N, d), already in HBM
        mem.alloc("O", Q.shape)
        q_i = mem.load("Q", slice(0, 64))      # read 64*d
        mem.store("O", slice(0, 64), 2 * q_i)  # write 64*d
        print(mem.table())
    """

    def __init__(self, M: int | None = None, *, compute: bool = True):
        M = None if M is None else positive_int(M, "M")
        if not isinstance(compute, (bool, np.bool_)):
            raise TypeError(f"compute must be True or False, got {compute!r}")
        self._M = M
        self._compute = bool(compute)
        self._arrays: dict[str, _HBMArray] = {}
        self._slots: dict[str, int] = {}  # slot -> elements it holds on chip
        self._held: dict[str, tuple | None] = {}  # slot -> (array, r0, r1, c0, c1)
        self._seen: dict[str, dict[str, np.ndarray]] = {}  # row-tile slot -> input -> rows seen
        self._rules: dict[str, _OutputRule] = {}  # output -> how its row tiles are computed
        self._sources: dict[str, tuple[str, ...]] = {}  # row-tile input -> inputs streamed past
        self._streams: dict[str, set[str]] = {}  # streamed input -> row-tile inputs it needs
        self._on_chip = 0
        self._peak = 0
        self._ops: list[tuple] = []  # every call, in order (refused ones too)

    @property
    def M(self) -> int | None:
        """On-chip capacity in elements (None: unlimited)."""
        return self._M

    @property
    def compute(self) -> bool:
        """Whether values are kept and moved (False: shapes only)."""
        return self._compute

    @property
    def operations(self) -> tuple[tuple, ...]:
        """Every call so far, in order, refused ones included: ("load", name, rows, cols, slot),
        ("store", name, rows, cols), ("scratch", slot, shape), ("free", slots), ("free_all",),
        ("place", name, shape, dtype, itemsize), ("alloc", name, shape, dtype, itemsize, rule),
        ("reset",)."""
        return tuple(self._ops)

    # ---- arrays in HBM -------------------------------------------------------------------
    def _add(self, name, shape, dtype, itemsize, data) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        if name in self._arrays:
            raise ValueError(f"an array named {name!r} is already in HBM")
        dtype = np.dtype(dtype)
        itemsize = dtype.itemsize if itemsize is None else positive_int(itemsize, "itemsize")
        self._arrays[name] = _HBMArray(name, shape, dtype, itemsize, data)

    def place(self, name: str, array=None, *, shape=None, dtype=None, itemsize=None) -> None:
        """Put an input array in HBM without counting anything (it is already there).

        Args:
            name: the array's name in the table, e.g. "Q".
            array: its values, 1-D (n,) or 2-D (n, m). Copied. Give either array or shape.
            shape: (n,) or (n, m) when counting shapes only (compute=False).
            dtype: the dtype for shape-only arrays; default float64.
            itemsize: bytes counted per element; default the dtype's itemsize (pass 2 to count
                float64 data as bf16).
        """
        if array is not None:
            if shape is not None or dtype is not None:
                raise TypeError(f"place({name!r}): give either array or shape/dtype, not both")
            arr = np.asarray(array)
            if arr.ndim not in (1, 2) or arr.size == 0:
                raise ValueError(f"{name} must be a non-empty 1-D or 2-D array, got {arr.shape}")
            data = np.array(arr) if self._compute else None
            self._add(name, arr.shape, arr.dtype, itemsize, data)
        else:
            if shape is None:
                raise TypeError(f"place({name!r}) needs an array, or a shape when counting shapes")
            if self._compute:
                raise ValueError(
                    f"place({name!r}, shape=...) gives no values, but this CountingMemory "
                    "computes; pass the array, or use CountingMemory(compute=False) to count "
                    "shapes only"
                )
            dtype = np.float64 if dtype is None else dtype
            self._add(name, _shape(shape, "shape"), dtype, itemsize, None)
        a = self._arrays[name]
        self._ops.append(("place", name, a.shape, a.dtype.name, a.itemsize))

    def alloc(
        self,
        name: str,
        shape,
        dtype=np.float64,
        *,
        itemsize=None,
        rows_from: str | None = None,
        streamed: tuple[str, ...] = (),
        causal: bool = False,
    ) -> None:
        """Reserve an output array in HBM, zero-filled when computing; nothing is counted.

        With rows_from, the output's rows are computed as a thread block computes them, and only
        such stores are accepted (ThreadBlockError otherwise): rows r0:r1 of the output come from
        the same rows of `rows_from` and from every row of each `streamed` input. So a store of
        rows r0:r1 needs a tile of `rows_from` holding those rows on chip, and every row of the
        streamed inputs must have been loaded since that tile was (rows 0 to r1 - 1 only, with
        causal=True); a load of a streamed input needs a tile of `rows_from` on chip to be
        multiplied with. FlashAttention's output: alloc("O", (N, d), rows_from="Q",
        streamed=("K", "V")).

        Args:
            name: the array's name, e.g. "O".
            shape: (n,) or (n, m).
            dtype: its dtype, default float64.
            itemsize: bytes counted per element; default the dtype's itemsize.
            rows_from: the input (already in HBM, n rows) whose row tile each row tile of this
                output is computed from; None: no rule.
            streamed: inputs (already in HBM) that stream past that row tile.
            causal: row r needs rows 0..r of the streamed inputs only.
        """
        shape = _shape(shape, "shape")
        rule = None
        if rows_from is not None:
            if isinstance(streamed, str):
                streamed = (streamed,)
            streamed = tuple(streamed)
            src = self._get(rows_from)
            for s in streamed:
                self._get(s)
            if src.shape[0] != shape[0]:
                raise ValueError(
                    f"alloc({name!r}, rows_from={rows_from!r}): {name} has {shape[0]} rows and "
                    f"{rows_from} {src.shape[0]}; a row tile of {name} comes from the same rows"
                )
            rule = _OutputRule(rows_from, streamed, _check_bool(causal, "causal"))
        elif streamed or causal:
            raise TypeError("streamed= and causal= need rows_from= (the row tile they stream past)")
        data = np.zeros(shape, dtype) if self._compute else None
        self._add(name, shape, dtype, itemsize, data)
        if rule is not None:
            self._rules[name] = rule
            both = dict.fromkeys(self._sources.get(rows_from, ()) + rule.streamed)
            self._sources[rows_from] = tuple(both)
            for s in rule.streamed:
                self._streams.setdefault(s, set()).add(rows_from)
        a = self._arrays[name]
        self._ops.append(("alloc", name, a.shape, a.dtype.name, a.itemsize, rule))

    def array(self, name: str) -> np.ndarray:
        """The values of an array in HBM, as the host reads them after the kernel (not counted)."""
        a = self._get(name)
        if a.data is None:
            raise ValueError(f"{name!r} has no values: this CountingMemory counts shapes only")
        return a.data

    def _get(self, name: str) -> _HBMArray:
        try:
            return self._arrays[name]
        except (KeyError, TypeError):
            placed = ", ".join(repr(n) for n in self._arrays) or "none"
            raise ValueError(f"no array named {name!r} in HBM (placed: {placed})") from None

    def _region(self, a: _HBMArray, rows, cols) -> tuple[int, int, int, int, int]:
        r0, r1 = _span(rows, a.shape[0], f"rows of {a.name!r}")
        if len(a.shape) == 1:
            if cols is not None:
                raise ValueError(f"{a.name!r} is 1-D {a.shape}: give rows only, not cols")
            return r0, r1, 0, 1, r1 - r0
        c0, c1 = (0, a.shape[1]) if cols is None else _span(cols, a.shape[1], f"cols of {a.name!r}")
        return r0, r1, c0, c1, (r1 - r0) * (c1 - c0)

    # ---- the thread-block rules ------------------------------------------------------------
    def _row_tiles(self, source: str) -> list[tuple[str, int, int]]:
        """(slot, r0, r1) of every tile of `source` on chip."""
        return [
            (slot, held[1], held[2])
            for slot, held in self._held.items()
            if held is not None and held[0] == source
        ]

    def _check_stream(self, name: str, r0: int, r1: int) -> None:
        """A tile of a streamed input needs a row tile to be multiplied with."""
        for source in self._streams.get(name, ()):
            if not self._row_tiles(source):
                raise ThreadBlockError(
                    f"load({name!r}, {_rows_text(r0, r1)}): no tile of {source!r} is on chip, so "
                    f"this tile of {name!r} has nothing to be multiplied with. A thread block "
                    f"loads its tile of {source!r} first; {name!r} streams past it.",
                    "stream-without-tile",
                )

    def _check_store(self, name: str, r0: int, r1: int) -> None:
        """Output rows are stored while their row tile is on chip, once they are finished."""
        rule = self._rules.get(name)
        if rule is None:
            return
        src = rule.rows_from
        tiles = [t for t in self._row_tiles(src) if t[1] <= r0 and r1 <= t[2]]
        if not tiles:
            on_chip = ", ".join(_rows_text(a, b) for _, a, b in self._row_tiles(src))
            where = (
                f"the tile of {src!r} on chip holds {on_chip}"
                if on_chip
                else f"no tile of {src!r} is on chip"
            )
            raise ThreadBlockError(
                f"store({name!r}, {_rows_text(r0, r1)}): {name} rows are computed next to the "
                f"same rows of {src!r}, but {where}. A thread block stores the {name} tile of the "
                f"{src} tile it holds, before it moves on to the next; {_rows_text(r0, r1)} of "
                f"{name} were never on chip together.",
                "rows-not-on-chip",
            )
        best = None
        for slot, _, _ in tiles:
            missing, any_seen = {}, False
            for s in rule.streamed:
                seen = self._seen[slot][s]
                rows = seen.rows_seen()
                any_seen = any_seen or seen.any()
                if rule.causal:
                    rows = rows[: min(r1, len(rows))]
                if not rows.all():
                    missing[s] = _ranges(~rows)
            if not missing:
                return
            if best is None:
                best = (missing, any_seen)
        missing, any_seen = best
        gaps = "; ".join(f"{s}: {_ranges_text(rg)}" for s, rg in missing.items())
        raise ThreadBlockError(
            f"store({name!r}, {_rows_text(r0, r1)}): this {name} tile is not finished. Since the "
            f"tile of {src!r} was loaded, these rows have not passed through the chip: {gaps}. "
            f"Every row of {', '.join(repr(s) for s in rule.streamed)} streams past the "
            f"{src} tile before its {name} tile is stored.",
            "stream-incomplete",
            missing,
            any_seen,
        )

    def _track_load(self, slot: str, name: str, r0: int, r1: int, c0: int, c1: int) -> None:
        """Note what the slot holds now, and which streamed rows each row tile has seen."""
        before = self._held.get(slot)
        self._held[slot] = (name, r0, r1, c0, c1)
        streams = self._sources.get(name)
        if streams is not None:
            if before is None or before[:3] != (name, r0, r1):  # the same rows again: kept
                seen = {s: _Seen(self._arrays[s].shape) for s in streams}
                for held in self._held.values():  # streamed tiles still on chip meet it too
                    if held is not None and held[0] in seen:
                        seen[held[0]].mark(*held[1:])
                self._seen[slot] = seen
        elif self._seen:
            self._seen.pop(slot, None)
        if name in self._streams:
            for seen in self._seen.values():
                if name in seen:
                    seen[name].mark(r0, r1, c0, c1)

    def _drop(self, slot: str) -> None:
        self._held.pop(slot, None)
        self._seen.pop(slot, None)

    # ---- the chip ------------------------------------------------------------------------
    def _occupy(self, slot: str, n: int, what: str) -> None:
        held = self._on_chip - self._slots.get(slot, 0)  # a slot's old contents are overwritten
        if self._M is not None and held + n > self._M:
            others = ", ".join(f"{s} {_fmt(k)}" for s, k in self._slots.items() if s != slot)
            raise OnChipMemoryError(
                f"on-chip memory overflow: {what} needs {_fmt(n)} elements, "
                f"{_fmt(held)} are already on chip ({others or 'nothing'}), "
                f"{_fmt(held + n)} > M = {_fmt(self._M)}"
            )
        self._slots[slot] = n
        self._on_chip = held + n
        if self._on_chip > self._peak:
            self._peak = self._on_chip

    def load(self, name: str, rows, cols=None, *, slot: str | None = None):
        """Read a tile of an HBM array onto the chip: counts (rows x cols) reads.

        Args:
            name: the array.
            rows: a contiguous slice, range or (start, stop) pair; clipped at the array's end,
                so the last, shorter tile of a ragged split needs no special case.
            cols: the same for the columns of a 2-D array; default all of them.
            slot: the on-chip buffer it goes into (default `name`); a previous tile in the same
                slot is replaced.

        Returns:
            A copy of the tile, shape (r,) or (r, c), or None when counting shapes only.

        Raises:
            OnChipMemoryError: the tile does not fit.  ThreadBlockError: see `alloc`.
        """
        self._ops.append(("load", name, rows, cols, slot))
        a = self._get(name)
        r0, r1, c0, c1, n = self._region(a, rows, cols)
        target = name if slot is None else slot
        if not isinstance(target, str) or not target:
            raise TypeError(f"slot must be a non-empty string, got {slot!r}")
        self._check_stream(name, r0, r1)
        self._occupy(target, n, f"a tile of {name!r}")
        self._track_load(target, name, r0, r1, c0, c1)
        a._reads += n
        if a.data is None:
            return None
        return a.data[r0:r1].copy() if a.data.ndim == 1 else a.data[r0:r1, c0:c1].copy()

    def store(self, name: str, rows, tile=None, *, cols=None) -> None:
        """Write a tile from the chip back to an HBM array: counts (rows x cols) writes.

        Args:
            name, rows, cols: the region, as in `load`.
            tile: its values, shape (r,) or (r, c); needed when computing, ignored otherwise.

        Raises:
            ThreadBlockError: an output allocated with rows_from= whose rows are not on chip, or
                not finished (see `alloc`).
        """
        self._ops.append(("store", name, rows, cols))
        a = self._get(name)
        r0, r1, c0, c1, n = self._region(a, rows, cols)
        self._check_store(name, r0, r1)
        if a.data is not None:
            region = (slice(r0, r1),) if a.data.ndim == 1 else (slice(r0, r1), slice(c0, c1))
            want = a.data[region].shape
            if tile is None or np.shape(tile) != want:
                got = None if tile is None else np.shape(tile)
                raise ValueError(f"store({name!r}): the tile must have shape {want}, got {got}")
            a.data[region] = tile
        a._writes += n

    def scratch(self, slot: str, shape):
        """Reserve on-chip space that comes from no HBM array (score tile, m, l, acc).

        Args:
            slot: its name on chip; reserving an existing slot again resizes it.
            shape: (n,) or (n, m) positive ints.

        Returns:
            float64 zeros of that shape when computing, else None.
        """
        self._ops.append(("scratch", slot, shape))
        if not isinstance(slot, str) or not slot:
            raise TypeError(f"slot must be a non-empty string, got {slot!r}")
        shape = _shape(shape, "shape")
        self._occupy(slot, math.prod(shape), f"scratch {slot!r}")
        self._held[slot] = None
        self._seen.pop(slot, None)
        return np.zeros(shape) if self._compute else None

    def free(self, *slots: str) -> None:
        """Release the named on-chip slots."""
        self._ops.append(("free", slots))
        for slot in slots:
            if slot not in self._slots:
                held = ", ".join(repr(s) for s in self._slots) or "none"
                raise ValueError(f"slot {slot!r} holds nothing on chip (held: {held})")
            self._on_chip -= self._slots.pop(slot)
            self._drop(slot)

    def free_all(self) -> None:
        """Release everything on chip (the end of a kernel)."""
        self._ops.append(("free_all",))
        self._release_all()

    def _release_all(self) -> None:
        self._slots.clear()
        self._held.clear()
        self._seen.clear()
        self._on_chip = 0

    @property
    def on_chip(self) -> int:
        """Elements on chip now."""
        return self._on_chip

    @property
    def peak_on_chip(self) -> int:
        """The most elements that were on chip at once."""
        return self._peak

    @property
    def slots(self) -> dict[str, int]:
        """Elements held on chip, by slot."""
        return dict(self._slots)

    # ---- counters ------------------------------------------------------------------------
    def count(self, name: str) -> ArrayTraffic:
        """The reads and writes of one array so far."""
        a = self._get(name)
        return ArrayTraffic(a.name, a.shape, a.dtype.name, a.itemsize, a.reads, a.writes)

    @property
    def counts(self) -> dict[str, ArrayTraffic]:
        """The reads and writes of every array, in the order they were placed."""
        return {name: self.count(name) for name in self._arrays}

    def traffic(self, *, exclude=(), in_bytes: bool = False) -> int:
        """Reads + writes of all arrays but those in `exclude` (names that must exist), in elements
        (or bytes with in_bytes=True)."""
        if isinstance(exclude, str):
            exclude = (exclude,)
        for name in exclude:
            self._get(name)  # a typo must not silently exclude nothing
        return sum(
            (a.reads + a.writes) * (a.itemsize if in_bytes else 1)
            for a in self._arrays.values()
            if a.name not in exclude
        )

    @property
    def reads(self) -> int:
        """All HBM reads so far, in elements (the same as total_reads)."""
        return self.total_reads

    @property
    def writes(self) -> int:
        """All HBM writes so far, in elements (the same as total_writes)."""
        return self.total_writes

    @property
    def total_reads(self) -> int:
        return sum(a.reads for a in self._arrays.values())

    @property
    def total_writes(self) -> int:
        return sum(a.writes for a in self._arrays.values())

    @property
    def total_elements(self) -> int:
        """All HBM reads plus writes, in elements."""
        return self.traffic()

    @property
    def total_bytes(self) -> int:
        """All HBM reads plus writes, in bytes (each array at its itemsize)."""
        return self.traffic(in_bytes=True)

    def reset(self) -> None:
        """Zero every counter and empty the chip; the arrays and their values stay in HBM.

        (`operations` keeps the calls made before, followed by ("reset",).)
        """
        self._ops.append(("reset",))
        for a in self._arrays.values():
            a._reads = a._writes = 0
        self._release_all()
        self._peak = 0

    # ---- display -------------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, ...]]:
        rows = [("array", "shape", "B/el", "reads", "writes", "read+write", "bytes")]
        for t in self.counts.values():
            shape = "x".join(str(n) for n in t.shape)
            rows.append(
                (
                    t.name,
                    shape,
                    str(t.itemsize),
                    _fmt(t.reads),
                    _fmt(t.writes),
                    _fmt(t.total_elements),
                    _fmt(t.total_bytes),
                )
            )
        rows.append(
            (
                "total",
                "",
                "",
                _fmt(self.total_reads),
                _fmt(self.total_writes),
                _fmt(self.total_elements),
                _fmt(self.total_bytes),
            )
        )
        return rows

    def _chip_line(self) -> str:
        cap = "unlimited" if self.M is None else _fmt(self.M)
        return f"on chip: peak {_fmt(self._peak)} of M = {cap} elements"

    def table(self) -> str:
        """The HBM read/write table: one row per array (elements, and bytes), then the totals."""
        rows = self._rows()
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]

        def line(r):
            cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
            return "  ".join(cells).rstrip()

        rule = "-" * len(line(rows[0]))
        body = [line(rows[0]), rule, *map(line, rows[1:-1]), rule, line(rows[-1])]
        return "\n".join([*body, self._chip_line()])

    def report(self) -> None:
        """Print the table."""
        print(self.table())

    def __repr__(self) -> str:
        mode = "" if self.compute else ", compute=False"
        return f"CountingMemory(M={self.M}{mode})\n{self.table()}"

    def _repr_html_(self) -> str:
        rows = self._rows()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = ""
        for k, r in enumerate(rows[1:], start=1):
            tag = "th" if k == len(rows) - 1 else "td"
            cells = "".join(
                f'<{tag} style="text-align:{"left" if i < 2 else "right"}">{html.escape(c)}</{tag}>'
                for i, c in enumerate(r)
            )
            body += f"<tr>{cells}</tr>"
        return (
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{html.escape(self._chip_line())}</p>"
        )


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def record_loop(fn, N: int, d: int, Br: int, Bc: int, M: int | None, rules: bool = True):
    """Run a learner's count_flash_forward(mem, N, d, Br, Bc) on a fresh memory; return its calls.

    The memory is shape-only, bf16 (2 bytes per element), with Q, K, V (N, d) placed and O (N, d)
    allocated (with rules: only what a thread block could do, see alloc's rows_from). Returns
    (calls, error): the memory's own record of the learner's calls, as plain tuples, and
    (exception type, message) when the loop raised, else None. A grader replays the calls on a
    memory of its own, so nothing the loop does to this memory can change a count.
    """
    mem = CountingMemory(M, compute=False)
    for name in ("Q", "K", "V"):
        mem.place(name, shape=(N, d), itemsize=2)
    rule = {"rows_from": "Q", "streamed": ("K", "V")} if rules else {}
    mem.alloc("O", (N, d), itemsize=2, **rule)
    record = mem._ops
    start = len(record)
    error = None
    try:
        fn(mem, N, d, Br, Bc)
    except NotImplementedError:
        raise
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    return [_plain_op(op) for op in record[start:]], error


def _plain_op(op: tuple) -> tuple:
    """An operation with NumPy scalars made Python numbers (so that it can travel as data)."""

    def plain(v):
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, tuple | list):
            return tuple(plain(x) for x in v)
        return v

    return tuple(plain(v) for v in op)
