"""Notebook 04's exercise 2 (count_flash_forward): its cases, and a learner's loop replayed on
the check's own CountingMemory.

The learner's count_flash_forward(mem, N, d, Br, Bc) runs on a memory that records its calls
(loads, stores, frees: ops); the check replays those ops on a fresh memory of its own, so a loop
that patches CountingMemory cannot change what the check counts.

    _run_learner(fn, case) -> (ops, raised)      the learner's calls, as plain tuples
    _replay(ops, case) -> _Replay                the counts, or the first broken rule (_Breach)
    _behaviour(ops, raised, case)                what a loop did, to compare with the buggy loops
    _count_cases(seed, trials), _diagnose(fn, case)
                                                 the cases, and the buggy loop (loops.py) that
                                                 behaves as the learner's did
    fresh_memory(N, d, M), tile_budget(d, Br, Bc)
                                                 the memory a case hands the loop
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.cases import Case
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.watch import _LearnerRaised, instrumented_call
from course_utils.checks.hbm_traffic.loops import (
    COUNT_MISTAKES,
    _ceil_div,
)
from course_utils.harness.counting_memory import CountingMemory, OnChipMemoryError, ThreadBlockError
from course_utils.references.memory import flash_attention_traffic

# ---- exercise 2: the loop over a CountingMemory ---------------------------------------------
NAME = "count_flash_forward"
OUTPUTS = ("reads of Q", "reads of K", "reads of V", "writes of O", "other traffic", "total")

# The CountingMemory methods and properties the learner's loop may use (the reference watch lets
# them run; they only move or report tiles of the learner's own memory). Not allowed: anything
# that runs a whole loop (count_flash_attention, the checks' replays below).
_MEMORY_METHODS = (
    "place",
    "alloc",
    "load",
    "store",
    "scratch",
    "free",
    "free_all",
    "reset",
    "array",
    "count",
    "counts",
    "traffic",
    "table",
    "report",
    "operations",
    "on_chip",
    "peak_on_chip",
    "slots",
    "reads",
    "writes",
    "total_reads",
    "total_writes",
    "total_elements",
    "total_bytes",
    "read_bytes",  # ArrayTraffic, as returned by mem.count(name)
    "write_bytes",
    "M",
    "compute",
    "__repr__",
    "_repr_html_",
    "__eq__",
    "__hash__",
)


def tile_budget(d: int, Br: int, Bc: int) -> int:
    """On-chip elements of one FlashAttention thread block: 2 Br d + 2 Bc d + Br Bc + 2 Br.

    Q_i and o_i (Br x d each), K_j and V_j (Bc x d each), the score tile S_ij (Br x Bc), and the
    running max m and sum l (Br each), as listed in section 11 of the notebook.
    """
    return 2 * Br * d + 2 * Bc * d + Br * Bc + 2 * Br


def fresh_memory(N: int, d: int, M: int | None = None, *, rules: bool = True) -> CountingMemory:
    """The memory a check hands to count_flash_forward: shape-only, bf16 (2 bytes per element).

    Q, K, V (N, d) are placed in HBM and O (N, d) is allocated; nothing is counted yet. With
    rules=True (what the learner gets) O accepts only what a thread block could do:
    alloc("O", ..., rows_from="Q", streamed=("K", "V")), see CountingMemory.alloc.
    """
    mem = CountingMemory(M, compute=False)
    for name in ("Q", "K", "V"):
        mem.place(name, shape=(N, d), itemsize=2)
    rule = {"rows_from": "Q", "streamed": ("K", "V")} if rules else {}
    mem.alloc("O", (N, d), itemsize=2, **rule)
    return mem


def _sizes(case: Case) -> tuple[int, int, int, int]:
    k = case.kwargs
    return k["N"], k["d"], k["Br"], k["Bc"]


def _expected(case: Case) -> tuple[int, ...]:
    """Q read once, K and V once per query tile, O written once, nothing else (lse left out)."""
    N, d, Br, _ = _sizes(case)
    Tr = _ceil_div(N, Br)
    return (N * d, Tr * N * d, Tr * N * d, N * d, 0, flash_attention_traffic(N, d, Br))


def _counts(mem: CountingMemory) -> tuple[int, ...]:
    """The six compared numbers; every array but an "lse" of the learner's counts as traffic."""
    c = mem.counts
    main = (c["Q"].reads, c["K"].reads, c["V"].reads, c["O"].writes)
    total = sum(t.total_elements for name, t in c.items() if name != "lse")
    return (*main, total - sum(main), total)


# ---- replaying a loop's calls on the check's own memory ------------------------------------
@dataclass(frozen=True)
class _Breach:
    """The first call of a loop that a thread block could not make, or that the exercise forbids.

    kind: "kv-before-q", "o-stored-off-chip", "o-before-kv", "stream-incomplete", "q-tile",
    "kv-tile", "overflow", "kv-tile-count" (checked after the counts) or "error" (a call that
    raises: a bad name or range).  index: which call (0-based).  detail: what was measured.
    """

    kind: str
    index: int
    op: tuple | None
    detail: str


@dataclass(frozen=True)
class _Replay:
    breach: _Breach | None  # the first broken rule, if any
    counts: tuple[int, ...] | None  # the six numbers, when every call went through
    tiles_ok: bool | None  # K and V each loaded Tr * Tc times (None: not reached)


_STORE_RULES = {"stream-without-tile": "kv-before-q", "rows-not-on-chip": "o-stored-off-chip"}


def _error_kind(exc: ThreadBlockError) -> str:
    kind = _STORE_RULES.get(exc.rule)
    if kind is None:
        kind = "stream-incomplete" if exc.streamed_any else "o-before-kv"
    return kind


def _apply(mem: CountingMemory, op: tuple) -> None:
    kind = op[0]
    if kind == "load":
        _, name, rows, cols, slot = op
        mem.load(name, rows, cols, slot=slot)
    elif kind == "store":
        _, name, rows, cols = op
        mem.store(name, rows, cols=cols)
    elif kind == "scratch":
        mem.scratch(op[1], op[2])
    elif kind == "free":
        mem.free(*op[1])
    elif kind in ("free_all", "reset"):  # a reset empties the chip; what moved stays counted
        mem.free_all()
    elif kind == "place":
        _, name, shape, dtype, itemsize = op
        mem.place(name, shape=shape, dtype=dtype, itemsize=itemsize)
    elif kind == "alloc":
        _, name, shape, dtype, itemsize, rule = op
        how = {}
        if rule is not None:
            how = {"rows_from": rule.rows_from, "streamed": rule.streamed, "causal": rule.causal}
        mem.alloc(name, shape, dtype, itemsize=itemsize, **how)
    else:  # pragma: no cover - the memory records no other kind
        raise ValueError(f"unknown operation {op!r}")


def _tile_breach(mem: CountingMemory, op: tuple, k: int, Br: int, Bc: int) -> _Breach | None:
    """Before a load: the stream rule (a query tile on chip), then the tile sizes."""
    if op[0] != "load" or op[1] not in ("Q", "K", "V"):
        return None
    _, name, rows, cols, _ = op
    try:
        r0, r1, *_ = mem._region(mem._get(name), rows, cols)
    except (ValueError, TypeError):
        return None  # the load itself raises the error that says why
    try:
        mem._check_stream(name, r0, r1)
    except ThreadBlockError as exc:
        return _Breach("kv-before-q", k, op, str(exc))
    limit, what = (Br, "Br") if name == "Q" else (Bc, "Bc")
    if r1 - r0 > limit:
        return _Breach(
            "q-tile" if name == "Q" else "kv-tile",
            k,
            op,
            f"this tile of {name!r} has {r1 - r0} rows; a tile has at most {what} = {limit}",
        )
    return None


def _replay(ops, case: Case, *, strict: bool = True) -> _Replay:
    """The loop's calls, in order, on a memory of the check's own.

    strict: the learner's memory (the thread-block rules, M = tile_budget), plus the tile sizes
    and the tile count of the exercise; else no rule and no limit (to count what the whole loop
    does).
    """
    N, d, Br, Bc = _sizes(case)
    mem = fresh_memory(N, d, tile_budget(d, Br, Bc) if strict else None, rules=strict)
    for k, op in enumerate(ops):
        if strict and (breach := _tile_breach(mem, op, k, Br, Bc)) is not None:
            return _Replay(breach, None, None)
        try:
            _apply(mem, op)
        except ThreadBlockError as exc:
            return _Replay(_Breach(_error_kind(exc), k, op, str(exc)), None, None)
        except OnChipMemoryError as exc:
            return _Replay(_Breach("overflow", k, op, str(exc)), None, None)
        except (ValueError, TypeError) as exc:
            return _Replay(_Breach("error", k, op, f"{type(exc).__name__}: {exc}"), None, None)
    tiles = _ceil_div(N, Br) * _ceil_div(N, Bc)
    loads = [sum(1 for op in ops if op[0] == "load" and op[1] == x) for x in ("K", "V")]
    return _Replay(None, _counts(mem), loads == [tiles, tiles])


# What the replay relies on, as it was when this module was imported: a loop that patches the
# class (CountingMemory.store = ...) would change the check's own memory too.
_PRISTINE = {cls: dict(vars(cls)) for cls in (CountingMemory, ThreadBlockError, OnChipMemoryError)}

DISABLES_CHECK = Mistake(
    "disables-check",
    "the function changes CountingMemory itself",
    "Your loop replaces a method or attribute of the CountingMemory class (or of its errors), "
    "which the check's own memory uses too. Use the memory you are given as it is: load, store, "
    "scratch and free tiles.",
    lambda *a, **k: None,
)


def _memory_untouched() -> None:
    for cls, saved in _PRISTINE.items():
        now = vars(cls)
        changed = sorted(
            set(saved) ^ set(now) | {k for k in saved if k in now and now[k] is not saved[k]}
        )
        if changed:
            for k in changed:  # put the class back for the rest of the kernel's life
                if k in saved:
                    setattr(cls, k, saved[k])
                else:
                    delattr(cls, k)
            raise CheckFailure(
                f"✗ {NAME} changes {cls.__name__}.{changed[0]} while it runs.\n"
                f"  likely mistake: {DISABLES_CHECK.title} "
                f"[misconception: {DISABLES_CHECK.slug}]\n  {DISABLES_CHECK.explanation}"
            )


def _remote_error(error) -> Exception | None:
    """The exception a loop raised in the notebook's kernel, rebuilt from (type name, message)."""
    if error is None:
        return None
    kind, message = error
    if kind == "ThreadBlockError":
        return ThreadBlockError(message, "unknown")
    if kind == "OnChipMemoryError":
        return OnChipMemoryError(message)
    return type(str(kind), (Exception,), {})(message)


def _run_learner(fn: Callable, case: Case, *, strict: bool = True):
    """The learner's loop on a fresh memory: (the calls it made, the exception it raised).

    The list of calls is the memory's own record, taken before the learner's code runs: replacing
    mem._ops, or faking any counter, does not change what the check replays.
    """
    N, d, Br, Bc = _sizes(case)
    M = tile_budget(d, Br, Bc) if strict else None
    if hasattr(fn, "bound_into"):  # a grader's handle: the loop runs in the notebook's kernel
        runner = fn.bound_into("course_utils.harness.counting_memory:record_loop")
        try:
            ops, error = instrumented_call(
                runner,
                (N, d, Br, Bc, M, strict),
                name=NAME,
                allow=("record_loop", *_MEMORY_METHODS),
            ).result
        except _LearnerRaised as err:
            return [], err.exc
        return [tuple(op) for op in ops], _remote_error(error)
    mem = fresh_memory(N, d, M, rules=strict)
    record = mem._ops
    start = len(record)
    raised = None
    try:
        instrumented_call(fn, (mem, N, d, Br, Bc), name=NAME, allow=_MEMORY_METHODS)
    except _LearnerRaised as err:
        raised = err.exc
    finally:
        _memory_untouched()
    return list(record[start:]), raised


def _behaviour(ops, raised, case: Case) -> tuple:
    """What a loop does on a case: its first broken rule, its counts, its tile count."""
    strict = _replay(ops, case)
    whole = _replay(ops, case, strict=False)
    kind = None if strict.breach is None else strict.breach.kind
    return (kind, whole.counts, strict.tiles_ok, None if raised is None else type(raised).__name__)


_FINGERPRINT_SIZES = ((4, 2, 2, 2), (7, 2, 3, 2), (10, 4, 4, 3), (9, 3, 2, 4))


def _case(label: str, N: int, d: int, Br: int, Bc: int, focus: str = "") -> Case:
    focus = focus or (
        "the loop of section 4: Q_i loaded once per query tile, every K/V tile streamed past it, "
        "O_i stored once"
    )
    return Case(label, (), {"N": N, "d": d, "Br": Br, "Bc": Bc}, focus=focus)


_RAGGED_FOCUS = (
    "the short last tiles: a tile that runs past N is clipped, and the short last query tile "
    "streams all of K and V too"
)


def _count_cases(seed, trials):
    cases = [
        _case("N = 4, d = 2, Br = Bc = 2 (2 x 2 tiles)", 4, 2, 2, 2),
        _case("N = 1, d = 1, Br = Bc = 1 (one row)", 1, 1, 1, 1),
        _case(
            "N = 6, d = 2, Br = 3, Bc = 2 (Br != Bc)",
            6,
            2,
            3,
            2,
            "Br != Bc: query tiles of Br rows in the outer loop, K/V tiles of Bc rows inside",
        ),
        _case("N = 7, d = 2, Br = 3, Bc = 2 (ragged: short last tiles)", 7, 2, 3, 2, _RAGGED_FOCUS),
        _case(
            "the example run of section 4: N = 10, d = 4, Br = 4, Bc = 3 (query tiles of 4, 4, 2 "
            "rows, K/V tiles of 3, 3, 3, 1)",
            10,
            4,
            4,
            3,
            _RAGGED_FOCUS,
        ),
        _case(
            "N = 5, d = 3, Br = 8, Bc = 2 (Br > N: one query tile)",
            5,
            3,
            8,
            2,
            "Br > N: one query tile, clipped to the N rows",
        ),
        _case(
            "N = 5, d = 3, Br = 2, Bc = 8 (Bc > N: one K/V tile)",
            5,
            3,
            2,
            8,
            "Bc > N: one K/V tile per query tile, clipped to the N rows",
        ),
        _case("N = 5, d = 2, Br = Bc = 1 (25 tiles of 1 x 1)", 5, 2, 1, 1),
        _case("N = 64, d = 8, Br = Bc = 8 (K does not fit on chip whole)", 64, 8, 8, 8),
        _case(
            "the tile budget of section 11: N = 2,048, d = 64, Br = 128, Bc = 64", 2048, 64, 128, 64
        ),
        _case("the run after exercise 2: N = 4,096, d = 64, Br = Bc = 128", 4096, 64, 128, 128),
    ]
    rng = np.random.default_rng(seed)
    t = 0
    while t < trials:
        N, d = int(rng.integers(1, 257)), int(rng.integers(1, 33))
        Br, Bc = int(rng.integers(1, N + 5)), int(rng.integers(1, N + 5))
        if _ceil_div(N, Br) * _ceil_div(N, Bc) > 1500:  # keep the check fast
            continue
        t += 1
        label = f"random case {t}: N = {N}, d = {d}, Br = {Br}, Bc = {Bc}"
        cases.append(_case(label, N, d, Br, Bc))
    return cases


@functools.lru_cache(maxsize=4096)
def _mistake_behaviour(index: int, N: int, d: int, Br: int, Bc: int) -> tuple:
    case = _case("", N, d, Br, Bc)
    mem = fresh_memory(N, d, rules=False)
    start = len(mem._ops)
    raised = None
    try:
        COUNT_MISTAKES[index].fn(mem, N, d, Br, Bc)
    except Exception as exc:  # a buggy loop may crash (a tile of no rows): that is behaviour too
        raised = exc
    return _behaviour(mem._ops[start:], raised, case)


def _diagnose(fn: Callable, case: Case) -> Mistake | None:
    """The buggy loop that does exactly what the learner's loop does, on the failing case and on
    the small fixed cases (the first broken rule, the counts, the tile count), or None."""
    others = [_case("", *sizes) for sizes in _FINGERPRINT_SIZES if sizes != _sizes(case)]
    cases = [case, *others]
    theirs = [_behaviour(*_run_learner(fn, c, strict=False), c) for c in cases]
    right = (None, _expected(case), True, None)
    for k, mistake in enumerate(COUNT_MISTAKES):
        replay = [_mistake_behaviour(k, *_sizes(c)) for c in cases]
        if replay[0] != right and replay == theirs:
            return mistake
    return None
