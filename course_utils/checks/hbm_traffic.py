"""Checks for notebook 04 (counting HBM traffic, and the roofline).

    check_standard_attention_traffic(fn)  standard_attention_traffic(N, d) -> elements
    check_flash_attention_traffic(fn)     flash_attention_traffic(N, d, Br) -> elements
    check_count_flash_forward(fn)         count_flash_forward(mem, N, d, Br, Bc): the loop of
                                          FlashAttention-2 over a shape-only CountingMemory
    check_quick_ratio_d128(answer)        standard / FlashAttention traffic, d = 128, Br = 128
    check_quick_h200_standard_us(answer)  standard attention's memory time on the H200, in us
    check_quick_tile_rows(answer)         the largest tile B for d = 64 in 192 KiB (16 B d bytes)
    check_quick_a100_ridge(answer)        the A100's ridge point at 1.5 TB/s (208 FLOP/byte)
    check_quick_fa1_q_reads(answer)       Q-tile reads of FlashAttention-1's loop order at
                                          N = 4,096, B = 128 (1,024; the minimum is 32)

All counts are elements per head, with the N logsumexp values left out (as in the notebook). The
formula checks compare with course_utils.references.memory.

The loop check hands the learner's function a CountingMemory whose O only accepts what a thread
block could do (O = alloc(rows_from="Q", streamed=("K", "V")), see CountingMemory.alloc), with
the on-chip budget M = 2 Br d + 2 Bc d + Br Bc + 2 Br (the tiles Q_i, o_i, K_j, V_j, S_ij and m,
l). It never trusts that memory's counters: it takes the list of calls the memory recorded (a
reference it kept before the learner's code ran) and replays them on a memory of its own, so that
faked counters (`mem._arrays["K"]._reads = ...`, a patched `mem.count`) or a lifted budget
(`mem._M = None`) change nothing. On the replay, these are the rules, in the order they are met:

    kv-before-q        a K or V tile is loaded while no query tile is on chip (nothing to
                       multiply it with: K/V streamed before any Q, a loop that never loads Q)
    o-stored-off-chip  O rows are stored that the query tile on chip does not hold (all of O
                       once, at the end; O_i stored after the next Q tile replaced Q_i)
    o-before-kv        O_i is stored before any K/V row has passed Q_i (the tile is unfinished)
    q-not-tiled        a load of Q spans more than Br rows
    kv-not-tiled       a load of K or V spans more than Bc rows
    (no name)          the chip overflows M; O_i stored when only part of K/V has passed Q_i
                       (named only when a known buggy loop does the same, e.g. ragged-tile,
                       tile-end-off-by-one, o-written-per-tile; else "no known mistake")
    kv-tiles-too-small K and V are not streamed in ceil(N / Bc) tiles per query tile

Then the counts (reads of Q, K, V, writes of O, any other traffic, the total) are compared with
the formula. A broken rule or a wrong count is matched against the buggy loops (COUNT_MISTAKES):
one is named only when it behaves exactly as the learner's loop (the same first broken rule and
the same counts) on the failing case and on four small fixed cases.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from course_utils.checks._core import (
    Case,
    CheckFailure,
    Mistake,
    _LearnerRaised,
    describe,
    instrumented_call,
    run_cases,
)
from course_utils.checks._core import (
    hinted_answer as _hinted,
)
from course_utils.harness.counting_memory import CountingMemory, OnChipMemoryError, ThreadBlockError
from course_utils.harness.hardware import H100_SXM, H200
from course_utils.references.memory import flash_attention_traffic, standard_attention_traffic
from course_utils.references.roofline import attention_flops

__all__ = [
    "COUNT_MISTAKES",
    "FLASH_MISTAKES",
    "RULE_MISTAKES",
    "STANDARD_MISTAKES",
    "check_count_flash_forward",
    "check_flash_attention_traffic",
    "check_quick_a100_ridge",
    "check_quick_fa1_q_reads",
    "check_quick_h200_standard_us",
    "check_quick_ratio_d128",
    "check_quick_tile_rows",
    "check_standard_attention_traffic",
    "fresh_memory",
    "tile_budget",
]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- exercise 1: the formulas ----------------------------------------------------------------
_BYTES = (
    "bytes-not-elements",
    "counted bytes instead of elements",
    "The formulas count elements per head. Bytes are elements times 2 in bf16 (4 in fp32); "
    "multiply only when you turn the count into a time or a size.",
)
_Q_OR_O = (
    "q-or-o-missing",
    "an N x d read or write is missing (Q read once, O written once)",
    "Every version reads Q (N d elements) and writes the output O (N d) at least once. "
    "Count both, besides the reads of K and V.",
)

STANDARD_MISTAKES = [
    Mistake(
        "nxn-once",
        "the N x N matrix is counted fewer times than it crosses HBM",
        "Standard attention moves an N x N matrix four times: S is written by Q K^T, read by "
        "the softmax, P is written by the softmax and read by P V. That is 4N^2, not 2N^2 "
        "(once for S, once for P) or N^2; the Nd terms are Q, K, V read and O written: 4Nd.",
        fn,
    )
    for fn in (
        lambda N, d: 2 * N * N + 4 * N * d,
        lambda N, d: N * N + 4 * N * d,
        lambda N, d: 3 * N * N + 4 * N * d,
    )
] + [
    Mistake(*_Q_OR_O, lambda N, d: 4 * N * N + 3 * N * d),
    Mistake(
        "only-nxn",
        "only the N x N traffic is counted",
        "4N^2 is the larger part, but Q, K and V are read (3Nd) and O is written (Nd) too: "
        "the exact count is 4N^2 + 4Nd.",
        lambda N, d: 4 * N * N,
    ),
    Mistake(*_BYTES, lambda N, d: 2 * (4 * N * N + 4 * N * d)),
    Mistake(*_BYTES, lambda N, d: 4 * (4 * N * N + 4 * N * d)),
]


def _flash(N, d, Br, tiles=None):
    tiles = _ceil_div(N, Br) if tiles is None else tiles
    return 2 * N * d + tiles * 2 * N * d


_RAGGED = (
    "ragged-tile",
    "the last, shorter tile is not counted as a tile",
    "With N = 10 and Br = 4 there are three query tiles (rows 0-3, 4-7, 8-9), and the short last "
    "one still reads all of K and V. Use the number of tiles Tr = ceil(N / Br) = -(-N // Br); "
    "N // Br drops the last tile and N / Br counts a fraction of a pass over K and V.",
)

FLASH_MISTAKES = [
    Mistake(
        "kv-read-once",
        "K and V are counted once, not once per query tile",
        "Only one query tile fits on chip with its K/V tiles, so every query tile streams all of "
        "K and V again: 2Nd for each of the Tr = ceil(N / Br) query tiles, plus Nd for Q and Nd "
        "for O. Reading K and V once (4Nd in all) would need all of them on chip.",
        lambda N, d, Br: 4 * N * d,
    ),
    # Before q-or-o-missing: with a ragged last tile, ceil(N / Br) - 1 tiles plus Q and O is
    # the same number as ceil(N / Br) tiles without Q and O. The smallest case (Br divides N)
    # names q-or-o-missing; the first ragged case names ragged-tile.
    Mistake(*_RAGGED, lambda N, d, Br: _flash(N, d, Br, N // Br)),
    Mistake(*_RAGGED, lambda N, d, Br: 2 * N * d + 2 * N * N * d / Br),
    Mistake(*_Q_OR_O, lambda N, d, Br: N * d + _ceil_div(N, Br) * 2 * N * d),
    Mistake(*_Q_OR_O, lambda N, d, Br: _ceil_div(N, Br) * 2 * N * d),
    Mistake(
        "k-or-v-missing",
        "only one of K and V is re-read per query tile",
        "Each query tile needs the scores Q_i K_j^T and the values V_j of every K/V tile: it "
        "reads all of K AND all of V, 2Nd elements per query tile.",
        lambda N, d, Br: 2 * N * d + _ceil_div(N, Br) * N * d,
    ),
    Mistake(
        "lse-counted",
        "the N logsumexp values are counted",
        "FlashAttention-2 also writes one fp32 lse per row for the backward pass, but the "
        "course's count (and the notebook's formula) leaves those N elements out.",
        lambda N, d, Br: _flash(N, d, Br) + N,
    ),
    Mistake(*_BYTES, lambda N, d, Br: 2 * _flash(N, d, Br)),
    Mistake(*_BYTES, lambda N, d, Br: 4 * _flash(N, d, Br)),
]

_STANDARD_FOCUS = (
    "the three kernels of section 3: Q, K read and S written; S read and P written; P, V read "
    "and O written (4N^2 + 4Nd)"
)


def _standard_cases(seed, trials):
    def case(label, N, d, focus=_STANDARD_FOCUS):
        return Case(label, (N, d), focus=focus)

    cases = [
        case("N = 3, d = 2", 3, 2),
        case("N = 1, d = 1 (one query, one key)", 1, 1),
        case("the example of section 3: N = 8, d = 4", 8, 4),
        case(
            "N = 3, d = 5 (d larger than N)",
            3,
            5,
            "d > N: the Nd terms (Q, K, V read, O written) are larger than the N^2 terms here",
        ),
        case("N = 100, d = 16", 100, 16),
        case("question 1 of section 1: N = 4,096, d = 64", 4096, 64),
        case("the budget of section 5: N = 16,384, d = 64", 16384, 64),
        case("quick check 1: N = 16,384, d = 128", 16384, 128),
        case("N = 1,048,576, d = 128 (a context of a million tokens)", 2**20, 128),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N, d = int(rng.integers(1, 70_000)), int(rng.integers(1, 257))
        cases.append(case(f"random case {t + 1}: N = {N:,}, d = {d}", N, d))
    return cases


_FLASH_FOCUS = (
    "the formula of section 4: Q read once (Nd), O written once (Nd), all of K and V (2Nd) per "
    "query tile, Tr = ceil(N / Br) tiles"
)
_CEIL_FOCUS = (
    "the ceiling: a short last query tile is a tile too, and streams all of K and V "
    "(Tr = ceil(N / Br) = -(-N // Br))"
)
_ONE_TILE_FOCUS = "Br >= N: one query tile holds all N rows and streams K and V once"


def _flash_cases(seed, trials):
    def case(label, N, d, Br, focus=_FLASH_FOCUS):
        return Case(label, (N, d, Br), focus=focus)

    cases = [
        case("N = 6, d = 2, Br = 2 (three query tiles)", 6, 2, 2),
        case(
            "the ragged example of section 4: N = 10, d = 4, Br = 4 (tiles of 4, 4, 2 rows)",
            10,
            4,
            4,
            _CEIL_FOCUS,
        ),
        case("N = 5, d = 4, Br = 8 (Br > N: one query tile)", 5, 4, 8, _ONE_TILE_FOCUS),
        case("N = 8, d = 3, Br = 8 (Br = N: one query tile)", 8, 3, 8, _ONE_TILE_FOCUS),
        case("N = 9, d = 3, Br = 8 (a last tile of one row)", 9, 3, 8, _CEIL_FOCUS),
        case("N = 7, d = 2, Br = 1 (every row its own tile)", 7, 2, 1),
        case("N = 1, d = 1, Br = 1 (one row)", 1, 1, 1),
        case("N = 100, d = 16, Br = 32 (ragged)", 100, 16, 32, _CEIL_FOCUS),
        case("N = 50, d = 8, Br = 1,000,000 (Br far beyond N)", 50, 8, 10**6, _ONE_TILE_FOCUS),
        case("the run after exercise 2: N = 4,096, d = 64, Br = 128", 4096, 64, 128),
        case("the budget of section 5: N = 16,384, d = 64, Br = 128", 16384, 64, 128),
        case("quick check 1: N = 16,384, d = 128, Br = 128", 16384, 128, 128),
        case(
            "N = 16,385, d = 64, Br = 128 (one row more: one more query tile)",
            16385,
            64,
            128,
            _CEIL_FOCUS,
        ),
        case("N = 1,048,576, d = 128, Br = 128 (a million tokens)", 2**20, 128, 128),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N, d = int(rng.integers(1, 70_000)), int(rng.integers(1, 257))
        Br = int(rng.integers(1, 513))
        cases.append(case(f"random case {t + 1}: N = {N:,}, d = {d}, Br = {Br}", N, d, Br))
    return cases


def check_standard_attention_traffic(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(N, d) -> HBM elements of standard attention per head (4N^2 + 4Nd); ✓ or raise.

    Cases: tiny sizes, d > N, the notebook's sizes, a million tokens, then `trials` random (N, d)
    (seed=None: fresh).
    """
    run_cases(
        "standard_attention_traffic",
        fn,
        standard_attention_traffic,
        _standard_cases(seed, trials),
        outputs=("elements",),
        mistakes=STANDARD_MISTAKES,
        rtol=1e-12,
        atol=1e-6,
        low_precision_below=None,
        summary="tiny sizes, d > N, N = 4,096 and 16,384, a million tokens, random sizes",
    )


def check_flash_attention_traffic(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(N, d, Br) -> HBM elements of FlashAttention (FA2 order) per head; ✓ or raise.

    The reference is Nd + Nd + ceil(N / Br) 2Nd (lse not counted). Cases: several query tiles,
    ragged last tiles (one of a single row), Br = N, Br > N (far beyond), Br = 1, N = 1, the
    notebook's sizes, a million tokens, then `trials` random (N, d, Br).
    """
    run_cases(
        "flash_attention_traffic",
        fn,
        flash_attention_traffic,
        _flash_cases(seed, trials),
        outputs=("elements",),
        mistakes=FLASH_MISTAKES,
        rtol=1e-12,
        atol=1e-6,
        low_precision_below=None,
        summary="ragged tiles, Br = N, Br > N, Br = 1, N = 4,096 to a million, random sizes",
    )


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


# ---- the buggy loops, written as a learner would write them ---------------------------------
def _loop_fa2(mem, N, d, Br, Bc):
    """The check's own loop that follows every rule (the tests compare it with the formula)."""
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_read_once(mem, N, d, Br, Bc):
    for j0 in range(0, N, Bc):  # K and V streamed once, before the query loop
        mem.load("K", (j0, j0 + Bc))
        mem.load("V", (j0, j0 + Bc))
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_whole_outside(mem, N, d, Br, Bc):
    mem.load("K", (0, N))  # all of K and V on chip, once
    mem.load("V", (0, N))
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_before_q(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):  # streamed before the query tile is on chip
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


def _loop_o_at_end(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
    mem.store("O", (0, N))  # all of O once, after the loop


def _loop_o_before_kv(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))  # before any K/V tile has passed Q_i
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))


def _loop_o_per_tile(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
            mem.store("O", (i0, i0 + Br))  # written after every K/V tile


def _loop_q_per_tile(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("Q", (i0, i0 + Br))  # loaded again for every K/V tile
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_q_and_o_per_tile(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("Q", (i0, i0 + Br))
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
            mem.store("O", (i0, i0 + Br))


def _loop_fa1(mem, N, d, Br, Bc, *, read_o="after-first"):
    for j0 in range(0, N, Bc):  # K/V tiles outside, query tiles inside
        mem.load("K", (j0, j0 + Bc))
        mem.load("V", (j0, j0 + Bc))
        for i0 in range(0, N, Br):
            mem.load("Q", (i0, i0 + Br))
            if read_o == "always" or (read_o == "after-first" and j0 > 0):
                mem.load("O", (i0, i0 + Br))
            mem.store("O", (i0, i0 + Br))


def _loop_ragged(mem, N, d, Br, Bc, *, which="both"):
    Tr = N // Br if which in ("both", "q") else _ceil_div(N, Br)
    Tc = N // Bc if which in ("both", "kv") else _ceil_div(N, Bc)
    for i in range(Tr):
        mem.load("Q", (i * Br, (i + 1) * Br))
        for j in range(Tc):
            mem.load("K", (j * Bc, (j + 1) * Bc))
            mem.load("V", (j * Bc, (j + 1) * Bc))
        mem.store("O", (i * Br, (i + 1) * Br))


def _loop_end_inclusive(mem, N, d, Br, Bc, *, which="kv"):
    q_end = Br - 1 if which == "all" else Br  # (r0, r1) read as if r1 were the last row
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + q_end))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc - 1))
            mem.load("V", (j0, j0 + Bc - 1))
        mem.store("O", (i0, i0 + q_end))


def _loop_swapped(mem, N, d, Br, Bc):
    for i0 in range(0, N, Bc):  # query tiles of Bc rows, K/V tiles of Br rows
        mem.load("Q", (i0, i0 + Bc))
        for j0 in range(0, N, Br):
            mem.load("K", (j0, j0 + Br))
            mem.load("V", (j0, j0 + Br))
        mem.store("O", (i0, i0 + Bc))


def _loop_one_size(mem, N, d, Br, Bc, *, use="Br"):
    B = Br if use == "Br" else Bc  # the same tile size for both loops
    for i0 in range(0, N, B):
        mem.load("Q", (i0, i0 + B))
        for j0 in range(0, N, B):
            mem.load("K", (j0, j0 + B))
            mem.load("V", (j0, j0 + B))
        mem.store("O", (i0, i0 + B))


def _loop_v_missing(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_k_missing(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_no_store(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))


def _loop_kv_whole_inside(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.load("K", (0, N))  # all of K and V, once per query tile: right counts, no tiles
        mem.load("V", (0, N))
        mem.store("O", (i0, i0 + Br))


def _loop_q_whole(mem, N, d, Br, Bc):
    mem.load("Q", (0, N))  # all of Q on chip at once: right counts, no tiles
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_row_by_row(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j in range(N):  # K and V one row at a time: right counts, Bc ignored
            mem.load("K", (j, j + 1))
            mem.load("V", (j, j + 1))
        mem.store("O", (i0, i0 + Br))


def _mistake(slug, title, explanation, loop, **kwargs):
    fn = functools.partial(loop, **kwargs) if kwargs else loop
    return Mistake(slug, title, explanation, fn)


_KV_ONCE = (
    "kv-read-once",
    "K and V are loaded once, before the loop over query tiles",
    "Only one K/V tile fits on chip next to the query tile, so K and V must be streamed again "
    "for every query tile: the loop over K/V tiles goes INSIDE the loop over query tiles, after "
    "Q_i is loaded. Read once, K and V would have to stay on chip whole (N x d each).",
)
_FA1 = (
    "fa1-loop-order",
    "the FlashAttention-1 loop order (K/V tiles outside, query tiles inside)",
    "That order reads K and V once but re-reads Q and re-writes O once per K/V tile, with the "
    "partial outputs (and their m, l) kept in HBM. This exercise asks for FlashAttention-2's "
    "order: query tiles outside (Q_i loaded once, O_i stored once), K/V tiles inside.",
)
_END_INCLUSIVE = (
    "tile-end-off-by-one",
    "the tiles end one row early, as if the pair (r0, r1) included row r1",
    "A tile (r0, r1) holds rows r0 to r1 - 1 (like range and slices): a tile of Bc rows starting "
    "at j0 is (j0, j0 + Bc). With (j0, j0 + Bc - 1) each tile is one row short, and row "
    "j0 + Bc - 1 never reaches the chip.",
)
_ONE_SIZE = (
    "one-tile-size",
    "the same tile size for both loops (Br and Bc are not told apart)",
    "The outer loop takes query tiles of Br rows (Q and O); the inner loop takes K/V tiles of "
    "Bc rows. They may differ: use Br in the outer loop and Bc in the inner one.",
)

# Buggy loops that a check names when the learner's loop behaves exactly like one of them.
COUNT_MISTAKES = [
    _mistake(*_KV_ONCE, _loop_kv_read_once),
    _mistake(*_KV_ONCE, _loop_kv_whole_outside),
    _mistake(
        "o-written-per-tile",
        "O is stored after every K/V tile instead of once per query tile",
        "The output tile stays on chip (as acc, with m and l) while the K/V tiles stream by; it "
        "is divided by l and stored once, after the inner loop. Put mem.store('O', ...) after "
        "the loop over K/V tiles, not inside it.",
        _loop_o_per_tile,
    ),
    _mistake(
        "q-read-per-tile",
        "Q is loaded for every K/V tile instead of once per query tile",
        "The query tile Q_i stays on chip for the whole inner loop: load it once, before the "
        "loop over K/V tiles. Loading it inside reads Q Tc = ceil(N / Bc) times.",
        _loop_q_per_tile,
    ),
    _mistake(
        "q-read-per-tile",
        "Q is loaded and O stored for every K/V tile (both belong outside the inner loop)",
        "Q_i and the output tile stay on chip for the whole inner loop: load Q_i once before the "
        "loop over K/V tiles and store O once after it.",
        _loop_q_and_o_per_tile,
    ),
    _mistake(*_FA1, _loop_fa1, read_o="after-first"),
    _mistake(*_FA1, _loop_fa1, read_o="always"),
    _mistake(*_FA1, _loop_fa1, read_o="never"),
    _mistake(*_RAGGED, _loop_ragged, which="both"),
    _mistake(*_RAGGED, _loop_ragged, which="q"),
    _mistake(*_RAGGED, _loop_ragged, which="kv"),
    _mistake(*_END_INCLUSIVE, _loop_end_inclusive, which="kv"),
    _mistake(*_END_INCLUSIVE, _loop_end_inclusive, which="all"),
    _mistake(
        "br-bc-swapped",
        "Br and Bc are swapped (query tiles of Bc rows, K/V tiles of Br rows)",
        "Br is the number of query rows per tile (the outer loop, over Q and O); Bc the number "
        "of key rows per tile (the inner loop, over K and V).",
        _loop_swapped,
    ),
    _mistake(*_ONE_SIZE, _loop_one_size, use="Br"),
    _mistake(*_ONE_SIZE, _loop_one_size, use="Bc"),
    _mistake(
        "k-or-v-missing",
        "V is never loaded (only K is streamed)",
        "The scores need K_j, and the output needs V_j: load both tiles in the inner loop.",
        _loop_v_missing,
    ),
    _mistake(
        "k-or-v-missing",
        "K is never loaded (only V is streamed)",
        "The scores S_ij = tau Q_i K_j^T need K_j, and the output needs V_j: load both tiles in "
        "the inner loop.",
        _loop_k_missing,
    ),
    _mistake(
        "q-or-o-missing",
        "O is never stored",
        "The output tile O_i = acc / l_i is written back to HBM once per query tile, after the "
        "loop over K/V tiles: mem.store('O', (i0, i0 + Br)).",
        _loop_no_store,
    ),
]

# The rules, each with its name and a loop that breaks it as a learner would.
RULE_MISTAKES = {
    "kv-before-q": _mistake(
        "kv-before-q",
        "a K or V tile is loaded while no query tile is on chip",
        "A thread block multiplies each K/V tile with the query tile it holds (S_ij = tau Q_i "
        "K_j^T): with no Q_i on chip a K/V tile has nothing to meet. Load Q_i at the top of the "
        "outer loop, then stream the K/V tiles past it in the inner loop.",
        _loop_kv_before_q,
    ),
    "o-stored-off-chip": _mistake(
        "o-stored-off-chip",
        "O is stored for rows whose query tile is not on chip (e.g. all of O once, at the end)",
        "The output tile O_i = acc / l_i lives on chip next to Q_i only while the thread block "
        "works on query tile i; the next query tile takes its place. Store O_i at the end of "
        "each outer iteration, right after the loop over K/V tiles: mem.store('O', (i0, i0 + "
        "Br)), once per query tile.",
        _loop_o_at_end,
    ),
    "o-before-kv": _mistake(
        "o-before-kv",
        "O_i is stored before the K/V tiles have streamed past Q_i",
        "O_i depends on every key: it is finished only after the last K/V tile has been through "
        "the online softmax. Store it after the loop over K/V tiles, not before.",
        _loop_o_before_kv,
    ),
    "q-tile": _mistake(
        "q-not-tiled",
        "Q is loaded in pieces of more than Br rows (e.g. all of Q at once)",
        "Only the current query tile Q_i (Br x d) is on chip. Load it at the top of the outer "
        "loop, mem.load('Q', (i0, i0 + Br)); all of Q (N x d) does not fit for long sequences.",
        _loop_q_whole,
    ),
    "kv-tile": _mistake(
        "kv-not-tiled",
        "K or V is loaded in pieces of more than Bc rows (e.g. all of K at once)",
        "K and V are N x d each; on chip there is room for one Bc x d tile of each. Stream them "
        "in the inner loop, one tile of Bc rows at a time: mem.load('K', (j0, j0 + Bc)).",
        _loop_kv_whole_inside,
    ),
    "kv-tile-count": _mistake(
        "kv-tiles-too-small",
        "K and V are not streamed in tiles of Bc rows",
        "The inner loop takes Tc = ceil(N / Bc) K/V tiles per query tile, each of Bc rows (the "
        "last one may be shorter): for j0 in range(0, N, Bc). Smaller tiles move the same "
        "elements in more, slower steps, and leave Bc unused.",
        _loop_kv_row_by_row,
    ),
}

_RULE_WHAT = {
    "kv-before-q": "a K or V tile is loaded only while a query tile is on chip (it is "
    "multiplied with it)",
    "o-stored-off-chip": "O_i is stored while its query tile Q_i is on chip",
    "o-before-kv": "O_i is stored once every K/V tile has streamed past Q_i",
    "stream-incomplete": "O_i is stored once every K/V tile has streamed past Q_i",
    "q-tile": "Q is loaded in tiles of at most Br rows",
    "kv-tile": "K and V are loaded in tiles of at most Bc rows",
    "overflow": "everything on chip fits in M = 2 Br d + 2 Bc d + Br Bc + 2 Br elements (Q_i, "
    "o_i, K_j, V_j, S_ij, m, l)",
    "kv-tile-count": "K and V stream in Tc = ceil(N / Bc) tiles per query tile",
}
_RULE_FOCUS = {
    "stream-incomplete": "the tile bounds: a tile (r0, r1) holds rows r0 to r1 - 1, and every "
    "row of K and V, 0 to N - 1, passes through the chip once per query tile before O_i is "
    "stored",
    "overflow": "the on-chip budget: only the tiles of one step are on chip (a load into the same "
    "slot replaces the tile there), and scratch no larger than S_ij, acc, m and l",
}

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


# ---- messages ---------------------------------------------------------------------------------
def _input_text(case: Case) -> str:
    N, d, Br, Bc = _sizes(case)
    return (
        f"N = {N}, d = {d}, Br = {Br}, Bc = {Bc} (M = {tile_budget(d, Br, Bc):,} elements on chip)"
    )


def _op_text(op: tuple) -> str:
    kind, args = op[0], op[1:]
    if kind in ("load", "store"):
        name, rows, cols = args[0], args[1], args[2]
        text = f"mem.{kind}({name!r}, {rows!r}"
        if cols is not None:
            text += f", cols={cols!r}"
        if kind == "load" and args[3] is not None:
            text += f", slot={args[3]!r}"
        return text + ")"
    if kind == "scratch":
        return f"mem.scratch({args[0]!r}, {args[1]!r})"
    if kind == "free":
        return f"mem.free({', '.join(repr(s) for s in args[0])})"
    return f"mem.{kind}(...)"


def _likely(lines: list[str], mistake: Mistake | None, focus: str) -> None:
    if mistake is not None:
        lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
        lines.append(f"  {mistake.explanation}")
    else:
        lines.append(f"  No known mistake matches; this case exercises {focus}.")


def _breach_failure(fn: Callable, case: Case, breach: _Breach, ops) -> CheckFailure:
    if breach.kind == "error":
        return CheckFailure(
            f"✗ {NAME} raised {breach.detail} on {case.label}, at call {breach.index + 1} of your "
            f"loop, {_op_text(breach.op)}.\n  input:    {_input_text(case)}"
        )
    if breach.op is not None:
        where = f"call {breach.index + 1} of your loop, {_op_text(breach.op)}: "
    else:
        where = "after the loop: " if breach.kind == "kv-tile-count" else ""
    lines = [
        f"✗ {NAME} breaks a rule of the exercise on {case.label}: {_RULE_WHAT[breach.kind]}.",
        f"  input:    {_input_text(case)}",
        f"  refused:  {where}{breach.detail}",
    ]
    mistake = _diagnose(fn, case) or RULE_MISTAKES.get(breach.kind)
    _likely(lines, mistake, _RULE_FOCUS.get(breach.kind, case.focus))
    return CheckFailure("\n".join(lines))


def _count_failure(fn: Callable, case: Case, yours: tuple, expected: tuple) -> CheckFailure:
    bad = [(n, y, e) for n, y, e in zip(OUTPUTS, yours, expected, strict=True) if y != e]
    lines = [
        f"✗ {NAME} is wrong on {case.label}.",
        f"  input:    {_input_text(case)}",
        "  yours:    " + ", ".join(f"{n} = {describe(y)}" for n, y, _ in bad),
        "  expected: " + ", ".join(f"{n} = {describe(e)}" for n, _, e in bad),
    ]
    _likely(lines, _diagnose(fn, case), case.focus)
    return CheckFailure("\n".join(lines))


def check_count_flash_forward(fn, seed: int | None = 0, trials: int = 10) -> None:
    """Check fn(mem, N, d, Br, Bc), the FlashAttention-2 loop over a CountingMemory; ✓ or raise.

    fn gets a fresh shape-only CountingMemory (see fresh_memory: Q, K, V (N, d) placed, O (N, d)
    allocated with the thread-block rules, M = tile_budget(d, Br, Bc) on chip) and should load
    and store tiles as the kernel does. Its calls are replayed on the check's own memory: every
    rule of the module docstring must hold, then the reads of Q, K, V, the writes of O, any other
    traffic and the total must equal the formula. Cases: 2 x 2 tiles, one row, Br != Bc, ragged
    tiles (the notebook's example run), Br > N, Bc > N, 1 x 1 tiles, a case where K does not fit
    on chip, the notebook's N = 2,048 and 4,096, then `trials` random cases (seed=None: fresh).
    """
    cases = _count_cases(seed, trials)
    for case in cases:
        ops, raised = _run_learner(fn, case)
        replay = _replay(ops, case)
        if replay.breach is not None:
            raise _breach_failure(fn, case, replay.breach, ops)
        if isinstance(raised, ThreadBlockError | OnChipMemoryError):  # the record was tampered
            kind = "overflow" if isinstance(raised, OnChipMemoryError) else _error_kind(raised)
            raise _breach_failure(fn, case, _Breach(kind, len(ops), None, str(raised)), ops)
        if raised is not None:
            raise CheckFailure(
                f"✗ {NAME} raised {type(raised).__name__}: {raised} on {case.label}.\n"
                f"  input:    {_input_text(case)}"
            )
        expected = _expected(case)
        if replay.counts != expected:
            raise _count_failure(fn, case, replay.counts, expected)
        if not replay.tiles_ok:
            N, d, Br, Bc = _sizes(case)
            loads = [sum(1 for op in ops if op[0] == "load" and op[1] == x) for x in "KV"]
            tiles = _ceil_div(N, Br) * _ceil_div(N, Bc)
            detail = (
                f"K is loaded in {loads[0]} pieces and V in {loads[1]}; {_ceil_div(N, Br)} query "
                f"tiles x {_ceil_div(N, Bc)} K/V tiles make {tiles}"
            )
            raise _breach_failure(fn, case, _Breach("kv-tile-count", len(ops), None, detail), ops)
    print(
        f"✓ {NAME}: {len(cases)} cases match the reference; the thread-block rules hold (Q_i on "
        "chip before its K/V tiles, O_i stored from chip once finished, tiles of Br and Bc rows "
        "within M; ragged tiles, Br != Bc, Br > N)"
    )


# ---- quick checks (the expected numbers are computed here, not written in the notebook) ------
def check_quick_ratio_d128(answer) -> None:
    """Standard / FlashAttention HBM traffic for N = 16,384, d = 128, Br = 128 (about 2 Br / d)."""
    N, d, Br = 16_384, 128, 128
    expected = standard_attention_traffic(N, d) / flash_attention_traffic(N, d, Br)
    _hinted(
        "standard / FlashAttention traffic (N = 16,384, d = 128, Br = 128)",
        answer,
        expected,
        [
            (1 / expected, "that is FlashAttention / standard; the question asks the other way"),
            (4.0, "4 is the ratio for d = 64; with d = 128 each K/V re-read moves twice as much"),
        ],
        "standard ~ 4N^2, FlashAttention ~ 2N^2 d / Br for N >> d: the ratio is about 2 Br / d",
        rtol=0.02,
    )


def check_quick_h200_standard_us(answer) -> None:
    """Standard attention's memory-bound time for one head on the H200 (measured), N = 16,384,
    d = 64, bf16, in microseconds."""
    N, d, b = 16_384, 64, 2
    nbytes = standard_attention_traffic(N, d) * b
    expected = nbytes / H200.hbm_bandwidth * 1e6
    _hinted(
        "standard attention on the H200, N = 16,384, d = 64 (us)",
        answer,
        expected,
        [
            (nbytes / 3.35e12 * 1e6, "that is the H100 (3.35 TB/s); use the H200's 4.26 TB/s"),
            (nbytes / 4.8e12 * 1e6, "4.8 TB/s is the spec sheet; use the measured 4.26 TB/s"),
            (expected / 2, "each bf16 element is 2 bytes: bytes = 2 x elements"),
            (expected * 2, "bf16 takes 2 bytes per element, not 4"),
            (
                attention_flops(N, d) / H200.peak_flops * 1e6,
                "that is the compute time 4N^2 d / P; standard attention is memory-bound, so its "
                "bound is the bytes over the bandwidth",
            ),
            (expected * 1e-6, "give the answer in microseconds (1 us = 1e-6 s)"),
        ],
        "bytes = (4N^2 + 4Nd) x 2; time = bytes / bandwidth; 1 us = 1e-6 s",
        rtol=0.01,
    )


def check_quick_tile_rows(answer) -> None:
    """The largest tile B with 16 B d bytes in 192 KiB of shared memory (196,608 bytes), d = 64."""
    sram, d = 192 * 1024, 64
    expected = sram // (16 * d)
    _hinted(
        "largest tile B for d = 64 in 192 KiB",
        answer,
        expected,
        [
            (sram // (16 * 128), "96 is the answer for d = 128; here d = 64, so B doubles"),
            (192_000 / (16 * d), "192 KiB is 192 x 1024 = 196,608 bytes"),
            (sram / (4 * d), "each of the four B x d tiles takes 4 bytes per element: 16 B d"),
        ],
        "four B x d tiles of 4-byte floats take 16 B d bytes; solve 16 B d <= 196,608",
        rtol=1e-9,
    )


def check_quick_a100_ridge(answer) -> None:
    """The A100's ridge point at 1.5 TB/s: 312 TFLOP/s / 1.5 TB/s = 208 FLOP/byte."""
    peak, bandwidth = 312e12, 1.5e12
    expected = peak / bandwidth
    _hinted(
        "A100 ridge point at 1.5 TB/s (FLOP/byte)",
        answer,
        expected,
        [
            (peak / 2.0e12, "156 is the ridge at 2 TB/s; here the HBM gives 1.5 TB/s"),
            (bandwidth / peak, "that is bytes per FLOP; the ridge point is FLOPs per byte"),
            (H100_SXM.ridge_point, "that is the H100's ridge (989 / 3.35); use the A100's numbers"),
        ],
        "ridge point = peak FLOP/s / HBM bytes/s",
        rtol=0.01,
    )


def check_quick_fa1_q_reads(answer) -> None:
    """Q-tile reads of FlashAttention-1's loop order (K, V outer) at N = 4,096 and B = 128."""
    N, B = 4096, 128
    tiles = N // B
    expected = tiles * tiles
    _hinted(
        "Q-tile reads, K/V tiles in the outer loop (N = 4,096, B = 128)",
        answer,
        expected,
        [
            (
                tiles,
                "32 is the minimum, each Q tile once; with K, V outside, every K/V tile reads "
                "all 32 Q tiles again",
            ),
            (N, "count tiles, not rows: there are N / B = 32 Q tiles"),
            (tiles * N, "each pass reads the 32 Q tiles, not 4,096 rows one by one"),
        ],
        "the outer loop has N / B K/V tiles, and each of its iterations reads every Q tile",
        rtol=1e-9,
    )
