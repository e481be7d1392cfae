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

from collections.abc import Callable

import numpy as np

from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.display import describe
from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.hbm_traffic.loops import (
    _RAGGED,
    _RULE_FOCUS,
    _RULE_WHAT,
    RULE_MISTAKES,
    _ceil_div,
)
from course_utils.checks.hbm_traffic.replay import (
    NAME,
    OUTPUTS,
    _Breach,
    _count_cases,
    _diagnose,
    _error_kind,
    _expected,
    _replay,
    _run_learner,
    _sizes,
    tile_budget,
)
from course_utils.harness.counting_memory import OnChipMemoryError, ThreadBlockError
from course_utils.references.memory import flash_attention_traffic, standard_attention_traffic

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
