"""Notebook 04's exercise 2: the buggy loops over a CountingMemory, written as a learner would
write them, and the mistakes they show.

    loop(mem, N, d, Br, Bc)     reads and writes tiles of Q, K, V and O through mem (a
                                CountingMemory); each _loop_* has one bug (_loop_fa2 has none)
    COUNT_MISTAKES              the named Mistakes of wrong counts, each with its loop
    RULE_MISTAKES               {rule: Mistake}: a loop that breaks the memory's rule
"""

from __future__ import annotations

import functools

from course_utils.checks.engine.failures import Mistake


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


_RAGGED = (
    "ragged-tile",
    "the last, shorter tile is not counted as a tile",
    "With N = 10 and Br = 4 there are three query tiles (rows 0-3, 4-7, 8-9), and the short last "
    "one still reads all of K and V. Use the number of tiles Tr = ceil(N / Br) = -(-N // Br); "
    "N // Br drops the last tile and N / Br counts a fraction of a pass over K and V.",
)


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
