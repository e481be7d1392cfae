"""Checks for notebook 04 (counting HBM traffic, and the roofline).

    check_standard_attention_traffic(fn)  standard_attention_traffic(N, d) -> elements
    check_flash_attention_traffic(fn)     flash_attention_traffic(N, d, Br) -> elements
    check_count_flash_forward(fn)         count_flash_forward(mem, N, d, Br, Bc): the loop of
                                          FlashAttention-2 over a shape-only CountingMemory
    check_quick_ratio_d128(answer)        standard / FlashAttention traffic, d = 128, Br = 128
    check_quick_h200_standard_us(answer)  standard attention's memory time on the H200, in us
    check_quick_tile_rows(answer)         the largest tile B for d = 64 in 192 KB

All counts are elements per head, with the N logsumexp values left out (as in the lesson). The
formula checks compare with course_utils.memory; the loop check compares the learner's per-array
counts with course_utils' instrumented count_flash_attention (shape-only) and with the formula.

The loop check runs in two rounds. First, every case runs on a CountingMemory with the lesson's
on-chip budget M = 2 Br d + 2 Bc d + Br Bc + 2 Br (the tiles Q_i, o_i, K_j, V_j, S_ij and m, l):
a loop that puts all of K (or Q) on chip at once overflows there, even when its counts are right.
Then the counts are compared, case by case, smallest first, and a wrong count is matched against
the buggy loops below to name the mistake.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..memory import (
    CountingMemory,
    OnChipMemoryError,
    count_flash_attention,
    flash_attention_traffic,
    standard_attention_traffic,
)
from ..roofline import H200, attention_flops
from ._core import (
    Case,
    CheckFailure,
    Mistake,
    _LearnerRaised,
    call_learner,
    run_cases,
)
from ._core import (
    hinted_answer as _hinted,
)

__all__ = [
    "COUNT_MISTAKES",
    "FIT_MISTAKES",
    "FLASH_MISTAKES",
    "STANDARD_MISTAKES",
    "check_count_flash_forward",
    "check_flash_attention_traffic",
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
    "the last, shorter query tile is not counted as a tile",
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
        "course's count (and the lesson's formula) leaves those N elements out.",
        lambda N, d, Br: _flash(N, d, Br) + N,
    ),
    Mistake(*_BYTES, lambda N, d, Br: 2 * _flash(N, d, Br)),
    Mistake(*_BYTES, lambda N, d, Br: 4 * _flash(N, d, Br)),
]


def _standard_cases(seed, trials):
    cases = [
        Case("N = 3, d = 2", (3, 2)),
        Case("N = 1, d = 1 (one query, one key)", (1, 1)),
        Case("N = 8, d = 2", (8, 2)),
        Case("N = 3, d = 5 (d larger than N)", (3, 5)),
        Case("N = 100, d = 16", (100, 16)),
        Case("predict-first question: N = 4,096, d = 64", (4096, 64)),
        Case("the lesson's at-scale example: N = 16,384, d = 64", (16384, 64)),
        Case("N = 16,384, d = 128", (16384, 128)),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N, d = int(rng.integers(1, 70_000)), int(rng.integers(1, 257))
        cases.append(Case(f"random case {t + 1}: N = {N:,}, d = {d}", (N, d)))
    return cases


def _flash_cases(seed, trials):
    cases = [
        Case("N = 6, d = 2, Br = 2 (three query tiles)", (6, 2, 2)),
        Case("N = 10, d = 3, Br = 4 (ragged: the last tile has 2 rows)", (10, 3, 4)),
        Case("N = 5, d = 4, Br = 8 (Br > N: one query tile)", (5, 4, 8)),
        Case("N = 7, d = 2, Br = 1 (every row its own tile)", (7, 2, 1)),
        Case("N = 100, d = 16, Br = 32 (ragged)", (100, 16, 32)),
        Case("the textbook's N = 4,096, d = 64, Br = 128", (4096, 64, 128)),
        Case("the lesson's at-scale example: N = 16,384, d = 64, Br = 128", (16384, 64, 128)),
        Case("N = 16,384, d = 128, Br = 128", (16384, 128, 128)),
        Case("N = 16,385, d = 64, Br = 128 (one row more: one more query tile)", (16385, 64, 128)),
    ]
    rng = np.random.default_rng(seed)
    for t in range(trials):
        N, d = int(rng.integers(1, 70_000)), int(rng.integers(1, 257))
        Br = int(rng.integers(1, 513))
        cases.append(Case(f"random case {t + 1}: N = {N:,}, d = {d}, Br = {Br}", (N, d, Br)))
    return cases


def check_standard_attention_traffic(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(N, d) -> HBM elements of standard attention per head (4N^2 + 4Nd); ✓ or raise.

    Cases: tiny sizes, d > N, the lesson's sizes, then `trials` random (N, d) (seed=None: fresh).
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
        summary="tiny sizes, d > N, the lesson's N = 4,096 and 16,384, random sizes",
    )


def check_flash_attention_traffic(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check fn(N, d, Br) -> HBM elements of FlashAttention (FA2 order) per head; ✓ or raise.

    The reference is Nd + Nd + ceil(N / Br) 2Nd (lse not counted). Cases: several query tiles,
    a ragged last tile, Br > N, Br = 1, the lesson's sizes, then `trials` random (N, d, Br).
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
        summary="ragged tiles, Br > N, Br = 1, the lesson's sizes, random sizes",
    )


# ---- exercise 2: the loop over a CountingMemory ---------------------------------------------
ARRAYS = ("Q", "K", "V", "O")
OUTPUTS = ("reads of Q", "reads of K", "reads of V", "writes of O", "other traffic", "total")

# The methods of CountingMemory a learner's loop (and the check's set-up) may call.
_MEMORY_METHODS = (
    "__init__",
    "place",
    "alloc",
    "load",
    "store",
    "scratch",
    "free",
    "free_all",
    "count",
    "counts",
    "traffic",
    "table",
    "report",
    "on_chip",
    "peak_on_chip",
    "slots",
    "total_reads",
    "total_writes",
    "total_elements",
    "total_bytes",
    "__repr__",
    "_repr_html_",
    "_get",  # used by the check's own memory to see the size of a failed load
    "_region",
)


def tile_budget(d: int, Br: int, Bc: int) -> int:
    """On-chip elements of one FlashAttention thread block: 2 Br d + 2 Bc d + Br Bc + 2 Br.

    Q_i and o_i (Br x d each), K_j and V_j (Bc x d each), the score tile S_ij (Br x Bc), and the
    running max m and sum l (Br each), as listed in the lesson.
    """
    return 2 * Br * d + 2 * Bc * d + Br * Bc + 2 * Br


class _WatchedMemory(CountingMemory):
    """A CountingMemory that remembers what was last put on chip (to explain an overflow)."""

    def __init__(self, M=None):
        super().__init__(M, compute=False)
        self.last = ("", 0)  # (array, elements) of the last load, scratch: ("scratch S", 0)

    def load(self, name, rows, cols=None, *, slot=None):
        try:
            self.last = (name, self._region(self._get(name), rows, cols)[4])
        except (AttributeError, TypeError, ValueError):
            self.last = (name, 0)  # a bad request: load itself raises the error that says why
        return super().load(name, rows, cols, slot=slot)

    def scratch(self, slot, shape):
        self.last = (f"scratch {slot}", 0)
        return super().scratch(slot, shape)


def fresh_memory(N: int, d: int, M: int | None = None) -> CountingMemory:
    """The memory a check hands to count_flash_forward: shape-only, bf16 (2 bytes per element).

    Q, K, V (N, d) are placed in HBM and O (N, d) is allocated; nothing is counted yet.
    """
    mem = _WatchedMemory(M)
    for name in ("Q", "K", "V"):
        mem.place(name, shape=(N, d), itemsize=2)
    mem.alloc("O", (N, d), itemsize=2)
    return mem


def _counts(mem: CountingMemory) -> tuple[int, ...]:
    c = mem.counts
    other = c["O"].reads + sum(c[name].writes for name in ("Q", "K", "V"))
    total = sum(c[name].total_elements for name in ARRAYS)
    return (c["Q"].reads, c["K"].reads, c["V"].reads, c["O"].writes, other, total)


def _count_reference(*, N, d, Br, Bc):
    """The per-array counts of course_utils' instrumented FA2 run (shape-only, lse left out)."""
    c = count_flash_attention(N=N, d=d, Br=Br, Bc=Bc).mem.counts
    result = (
        c["Q"].reads,
        c["K"].reads,
        c["V"].reads,
        c["O"].writes,
        c["O"].reads + sum(c[name].writes for name in ("Q", "K", "V")),
        sum(c[name].total_elements for name in ARRAYS),
    )
    assert result[-1] == flash_attention_traffic(N, d, Br)  # the count is the formula
    return result


def _counted(loop: Callable) -> Callable:
    """loop(mem, N, d, Br, Bc) as a function of the case, N=, d=, Br=, Bc= -> the counts."""

    @functools.wraps(loop)
    def counted(*, N, d, Br, Bc):
        mem = fresh_memory(N, d)
        loop(mem, N, d, Br, Bc)
        return _counts(mem)

    return counted


# The buggy loops, written as a learner would write them.
def _loop_kv_read_once(mem, N, d, Br, Bc):
    for j0 in range(0, N, Bc):  # K and V streamed once, before the query loop
        mem.load("K", (j0, j0 + Bc))
        mem.load("V", (j0, j0 + Bc))
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


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


def _loop_swapped(mem, N, d, Br, Bc):
    for i0 in range(0, N, Bc):  # query tiles of Bc rows, K/V tiles of Br rows
        mem.load("Q", (i0, i0 + Bc))
        for j0 in range(0, N, Br):
            mem.load("K", (j0, j0 + Br))
            mem.load("V", (j0, j0 + Br))
        mem.store("O", (i0, i0 + Bc))


def _loop_v_missing(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_whole_outside(mem, N, d, Br, Bc):
    mem.load("K", (0, N))  # all of K and V on chip, once
    mem.load("V", (0, N))
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


def _loop_kv_whole_inside(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.load("K", (0, N))  # all of K and V, once per query tile: right counts, no fit
        mem.load("V", (0, N))
        mem.store("O", (i0, i0 + Br))


def _loop_q_whole(mem, N, d, Br, Bc):
    mem.load("Q", (0, N))  # all of Q on chip at once: right counts, no fit
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def _count_mistake(slug, title, explanation, loop, **kwargs):
    raw = functools.partial(loop, **kwargs) if kwargs else loop
    fn = _counted(raw)
    fn.raw = raw  # the buggy loop itself (the tests run it as a learner's answer)
    return Mistake(slug, title, explanation, fn)


_KV_ONCE = (
    "kv-read-once",
    "K and V are loaded once, outside the query loop",
    "Only one K/V tile fits on chip next to the query tile, so K and V must be streamed again "
    "for every query tile: the loop over K/V tiles goes INSIDE the loop over query tiles. Read "
    "once, K and V would have to stay on chip whole (N x d each), which they cannot.",
)
_FA1 = (
    "fa1-loop-order",
    "the FlashAttention-1 loop order (K/V tiles outside, query tiles inside)",
    "That order reads K and V once but re-reads Q and re-writes O once per K/V tile. This "
    "exercise asks for FlashAttention-2's order: query tiles outside (Q loaded once per tile, O "
    "stored once per tile), K/V tiles inside.",
)

COUNT_MISTAKES = [
    _count_mistake(*_KV_ONCE, _loop_kv_read_once),
    _count_mistake(
        "o-written-per-tile",
        "O is stored after every K/V tile instead of once per query tile",
        "The output tile stays on chip (as acc, with m and l) while the K/V tiles stream by; it "
        "is divided by l and stored once, after the inner loop. Put mem.store('O', ...) after "
        "the loop over K/V tiles, not inside it.",
        _loop_o_per_tile,
    ),
    _count_mistake(
        "q-read-per-tile",
        "Q is loaded for every K/V tile instead of once per query tile",
        "The query tile Q_i stays on chip for the whole inner loop: load it once, before the "
        "loop over K/V tiles. Loading it inside reads Q Tc = ceil(N / Bc) times.",
        _loop_q_per_tile,
    ),
    _count_mistake(
        "q-read-per-tile",
        "Q is loaded and O stored for every K/V tile (both belong outside the inner loop)",
        "Q_i and the output tile stay on chip for the whole inner loop: load Q_i once before the "
        "loop over K/V tiles and store O once after it.",
        _loop_q_and_o_per_tile,
    ),
    _count_mistake(*_FA1, _loop_fa1, read_o="after-first"),
    _count_mistake(*_FA1, _loop_fa1, read_o="always"),
    _count_mistake(*_FA1, _loop_fa1, read_o="never"),
    _count_mistake(*_RAGGED, _loop_ragged, which="both"),
    _count_mistake(*_RAGGED, _loop_ragged, which="q"),
    _count_mistake(*_RAGGED, _loop_ragged, which="kv"),
    _count_mistake(
        "br-bc-swapped",
        "Br and Bc are swapped (query tiles of Bc rows, K/V tiles of Br rows)",
        "Br is the number of query rows per tile (the outer loop, over Q and O); Bc the number "
        "of key rows per tile (the inner loop, over K and V).",
        _loop_swapped,
    ),
    _count_mistake(
        "k-or-v-missing",
        "V is never loaded (only K is streamed)",
        "The scores need K_j, and the output needs V_j: load both tiles in the inner loop.",
        _loop_v_missing,
    ),
]


# Loops whose counts are right or wrong but that cannot run on chip: named by the fit round.
FIT_MISTAKES = [
    Mistake(*_KV_ONCE, _loop_kv_whole_outside),
    Mistake(
        "kv-not-tiled",
        "all of K and V are loaded at once (not in tiles of Bc rows)",
        "K and V are N x d each; on chip there is room for one Bc x d tile of each. Stream them "
        "in the inner loop, one tile of Bc rows at a time: mem.load('K', (j0, j0 + Bc)).",
        _loop_kv_whole_inside,
    ),
    Mistake(
        "q-not-tiled",
        "all of Q is loaded at once (not one query tile of Br rows at a time)",
        "Only the current query tile Q_i (Br x d) fits on chip. Load it at the top of the outer "
        "loop: mem.load('Q', (i0, i0 + Br)); all of Q (N x d) does not fit.",
        _loop_q_whole,
    ),
]


def _count_cases(seed, trials):
    def case(label, N, d, Br, Bc):
        return Case(label, (), {"N": N, "d": d, "Br": Br, "Bc": Bc})

    cases = [
        case("N = 4, d = 2, Br = Bc = 2 (2 x 2 tiles)", 4, 2, 2, 2),
        case("N = 6, d = 2, Br = 3, Bc = 2 (Br != Bc)", 6, 2, 3, 2),
        case("N = 7, d = 2, Br = 3, Bc = 2 (ragged: short last tiles)", 7, 2, 3, 2),
        case("N = 5, d = 3, Br = 8, Bc = 2 (Br > N: one query tile)", 5, 3, 8, 2),
        case("N = 5, d = 3, Br = 2, Bc = 8 (Bc > N: one K/V tile)", 5, 3, 2, 8),
        case("N = 5, d = 2, Br = Bc = 1 (25 tiles of 1 x 1)", 5, 2, 1, 1),
        case("N = 64, d = 8, Br = Bc = 8 (K does not fit on chip whole)", 64, 8, 8, 8),
        case("the textbook's N = 4,096, d = 64, Br = Bc = 128 (32 x 32 tiles)", 4096, 64, 128, 128),
    ]
    rng = np.random.default_rng(seed)
    t = 0
    while t < trials:
        N, d = int(rng.integers(1, 257)), int(rng.integers(1, 33))
        Br, Bc = int(rng.integers(1, N + 5)), int(rng.integers(1, N + 5))
        if _ceil_div(N, Br) * _ceil_div(N, Bc) > 1500:  # keep the check fast
            continue
        t += 1
        cases.append(case(f"random case {t}: N = {N}, d = {d}, Br = {Br}, Bc = {Bc}", N, d, Br, Bc))
    return cases


def _overflow_mistake(mem: _WatchedMemory, d: int, Br: int, Bc: int) -> Mistake | None:
    """The likely mistake behind an on-chip overflow: which array is on chip as more than a tile.

    K or V larger than a Bc x d tile: read once before the query loop (no Q read yet) or loaded
    whole inside it; Q larger than a Br x d tile: Q not tiled.
    """
    held = mem.slots
    name, n = mem.last
    held[name] = max(held.get(name, 0), n)  # what the failed load asked for
    if held.get("K", 0) > Bc * d or held.get("V", 0) > Bc * d:
        return FIT_MISTAKES[0] if mem.count("Q").reads == 0 else FIT_MISTAKES[1]
    if held.get("Q", 0) > Br * d:
        return FIT_MISTAKES[2]
    return None


def _check_fits(fn: Callable, cases) -> None:
    """Run fn on every case with the lesson's on-chip budget; raise CheckFailure on an overflow.

    Other errors are left to the count round, which reports them with their input.
    """
    for case in cases:
        N, d, Br, Bc = (case.kwargs[k] for k in ("N", "d", "Br", "Bc"))
        M = tile_budget(d, Br, Bc)
        mem = fresh_memory(N, d, M)
        try:
            call_learner(fn, mem, N, d, Br, Bc, name="count_flash_forward", allow=_MEMORY_METHODS)
        except _LearnerRaised as err:
            if not isinstance(err.exc, OnChipMemoryError):
                continue
            mistake = _overflow_mistake(mem, d, Br, Bc)
            lines = [
                f"✗ count_flash_forward does not fit on chip on {case.label}.",
                f"  input:    N={N}, d={d}, Br={Br}, Bc={Bc}, with M = {M:,} elements on chip "
                "(2 Br d + 2 Bc d + Br Bc + 2 Br: Q_i, o_i, K_j, V_j, S_ij, m, l)",
                f"  {err.exc}",
            ]
            if mistake is not None:
                lines.append(f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]")
                lines.append(f"  {mistake.explanation}")
            else:
                lines.append(
                    "  Keep on chip only the tiles of one step: Q_i (Br x d), K_j and V_j "
                    "(Bc x d), and scratch no larger than the lesson's list."
                )
            raise CheckFailure("\n".join(lines)) from None


def check_count_flash_forward(fn, seed: int | None = 0, trials: int = 10) -> None:
    """Check fn(mem, N, d, Br, Bc), the FlashAttention-2 loop over a CountingMemory; ✓ or raise.

    fn gets a fresh shape-only CountingMemory with Q, K, V (N, d) placed and O (N, d) allocated
    (see fresh_memory) and should load and store tiles as the kernel does. Round 1 runs it with
    M = tile_budget(d, Br, Bc) on chip; round 2 compares its reads of Q, K, V, its writes of O,
    any other traffic and the total with count_flash_attention (shape-only) and the formula.
    Cases: 2 x 2 tiles, Br != Bc, ragged tiles, Br > N, Bc > N, 1 x 1 tiles, a case where K does
    not fit on chip, the textbook's N = 4,096, then `trials` random cases (seed=None: fresh).
    """
    cases = _count_cases(seed, trials)
    _check_fits(fn, cases)
    run_cases(
        "count_flash_forward",
        _counted(fn),
        _count_reference,
        cases,
        outputs=OUTPUTS,
        mistakes=COUNT_MISTAKES,
        rtol=0.0,
        atol=0.0,
        low_precision_below=None,
        allow=_MEMORY_METHODS,
        summary="per-array counts and the on-chip budget; ragged tiles, Br != Bc, Br > N",
    )


# ---- quick checks (the expected numbers are computed here, not written in the notebook) ------
def _near(a, b, rtol=0.02) -> bool:
    try:
        return abs(float(a) - b) <= rtol * abs(b)
    except (TypeError, ValueError):
        return False


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
    """The largest tile B with 16 B d bytes in 192 KB of SRAM (196,608 bytes), for d = 64."""
    sram, d = 192 * 1024, 64
    expected = sram // (16 * d)
    _hinted(
        "largest tile B for d = 64 in 192 KB",
        answer,
        expected,
        [
            (sram // (16 * 128), "96 is the answer for d = 128; here d = 64, so B doubles"),
            (192_000 / (16 * d), "192 KB here is 192 x 1024 = 196,608 bytes"),
            (sram / (4 * d), "each of the four B x d tiles takes 4 bytes per element: 16 B d"),
        ],
        "four B x d tiles of 4-byte floats take 16 B d bytes; solve 16 B d <= 196,608",
        rtol=1e-9,
    )
