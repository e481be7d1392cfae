"""The checks of notebook 04: right answers pass quietly, every rule and named mistake is caught.

The "learner" functions here are written in this file (formulas from the notebook, the loop of
FlashAttention-2, in several styles), so the checks' guard against calling course_utils does not
fire; the checks' own buggy loops run through tests/checkhelp.as_learner.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of

import course_utils as cu
from course_utils.checks import hbm_traffic as checks
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.hbm_traffic import exercises as checks_exercises
from course_utils.checks.hbm_traffic import loops as checks_loops
from course_utils.checks.hbm_traffic import replay as checks_replay
from course_utils.harness.counting_memory import CountingMemory, ThreadBlockError


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here: the formulas
# ---------------------------------------------------------------------------------------------
def good_standard(N, d):
    return 4 * N * N + 4 * N * d


def good_standard_by_kernel(N, d):
    scores = 2 * N * d + N * N
    softmax = 2 * N * N
    output = N * N + 2 * N * d
    return np.int64(scores + softmax + output)  # a NumPy integer is fine


def good_flash(N, d, Br):
    return 2 * N * d + -(-N // Br) * 2 * N * d


def good_flash_float(N, d, Br):
    """A float answer with an integer value is fine."""
    return float(2 * N * d + 2 * N * d * -(-N // Br))


def good_flash_math_ceil(N, d, Br):
    return N * d + N * d + math.ceil(N / Br) * (N * d + N * d)


def good_flash_tile_by_tile(N, d, Br):
    kv = sum(2 * N * d for _ in range(0, N, Br))  # every query tile streams all of K and V
    return N * d + kv + N * d


# ---------------------------------------------------------------------------------------------
# Learners' answers: the loop, in different styles
# ---------------------------------------------------------------------------------------------
def good_loop(mem, N, d, Br, Bc):
    """The notebook's solution: pairs (r0, r1), clipped by the memory."""
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def good_loop_with_scratch(mem, N, d, Br, Bc):
    """The full on-chip footprint of the kernel (S, acc, m, l), with slices: exactly the budget."""
    mem.scratch("S", (Br, Bc))
    mem.scratch("acc", (Br, d))
    mem.scratch("m", (Br,))
    mem.scratch("l", (Br,))
    for i0 in range(0, N, Br):
        mem.load("Q", slice(i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", slice(j0, j0 + Bc))
            mem.load("V", slice(j0, j0 + Bc))
        mem.store("O", slice(i0, min(N, i0 + Br)))
    mem.free_all()


def good_loop_tile_indices(mem, N, d, Br, Bc):
    """Tile indices, bounds clipped by hand, ranges, V before K, the store in two halves."""
    Tr, Tc = -(-N // Br), -(-N // Bc)
    for i in range(Tr):
        r0, r1 = i * Br, min(N, (i + 1) * Br)
        mem.load("Q", range(r0, r1), slot="q_tile")
        for j in range(Tc):
            c0, c1 = j * Bc, min(N, (j + 1) * Bc)
            mem.load("V", range(c0, c1))
            mem.load("K", range(c0, c1))
        mid = (r0 + r1 + 1) // 2
        mem.store("O", (r0, mid))
        if mid < r1:
            mem.store("O", (mid, r1))
        mem.free("q_tile")


def good_loop_array_split(mem, N, d, Br, Bc):
    """Tiles from np.array_split (Tc tiles of at most Bc rows), a while loop, lse stored too."""
    mem.alloc("lse", (N,), itemsize=4)  # FA2 writes lse as well; the exercise leaves it out
    kv_tiles = np.array_split(np.arange(N), -(-N // Bc))
    i0 = 0
    while i0 < N:
        i1 = min(i0 + Br, N)
        mem.load("Q", (i0, i1))
        for tile in kv_tiles:
            rows = (int(tile[0]), int(tile[-1]) + 1)
            mem.load("K", rows)
            mem.load("V", rows)
        mem.store("O", (i0, i1))
        mem.store("lse", (i0, i1))
        i0 = i1


def good_loop_that_looks_around(mem, N, d, Br, Bc):
    """Reads the memory's public API while it works: the allowed methods and properties."""
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        assert mem.on_chip <= mem.M and mem.slots["Q"] > 0
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))
    info = (mem.count("K").read_bytes, mem.counts["O"].write_bytes, mem.peak_on_chip, mem.reads)
    assert mem.total_elements == mem.traffic() and len(mem.operations) > 0 and all(info) >= 0
    assert mem.count("Q") == mem.counts["Q"] and "total" in mem.table() and repr(mem)


GOOD_LOOPS = [
    good_loop,
    good_loop_with_scratch,
    good_loop_tile_indices,
    good_loop_array_split,
    good_loop_that_looks_around,
]


# ---------------------------------------------------------------------------------------------
# Learners' loops that break a rule, written as students wrote them
# ---------------------------------------------------------------------------------------------
def store_all_of_o_at_the_end(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", slice(i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", slice(j0, j0 + Bc))
            mem.load("V", slice(j0, j0 + Bc))
    mem.store("O", slice(0, N))  # one big write: right counts


def store_o_tiles_after_the_loop(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
    for i0 in range(0, N, Br):  # the O tiles are long gone from the chip
        mem.store("O", (i0, i0 + Br))


def stream_kv_before_q(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.load("Q", (i0, i0 + Br))  # right counts, but K/V came first
        mem.store("O", (i0, i0 + Br))


def store_o_before_the_stream(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))


def whole_k_and_v_per_query_tile(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.load("K", (0, N))
        mem.load("V", (0, N))
        mem.store("O", (i0, i0 + Br))


def whole_q_first(mem, N, d, Br, Bc):
    mem.load("Q", (0, N))
    for i0 in range(0, N, Br):
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
        mem.store("O", (i0, i0 + Br))


def kv_tiles_of_one_row(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j in range(N):
            mem.load("K", (j, j + 1))
            mem.load("V", (j, j + 1))
        mem.store("O", (i0, i0 + Br))


def kv_tiles_one_row_short(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc - 1))
            mem.load("V", (j0, j0 + Bc - 1))
        mem.store("O", (i0, i0 + Br))


def last_kv_tile_one_row_short(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, min(j0 + Bc, N - 1)))
            mem.load("V", (j0, min(j0 + Bc, N - 1)))
        mem.store("O", (i0, i0 + Br))


def swallows_the_refusal(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        for j0 in range(0, N, Bc):
            mem.load("K", (j0, j0 + Bc))
            mem.load("V", (j0, j0 + Bc))
    try:
        mem.store("O", (0, N))
    except ValueError:
        pass


RULE_BREAKERS = [
    (store_all_of_o_at_the_end, "o-stored-off-chip"),
    (store_o_tiles_after_the_loop, "o-stored-off-chip"),
    (swallows_the_refusal, "o-stored-off-chip"),
    (stream_kv_before_q, "kv-before-q"),
    (store_o_before_the_stream, "o-before-kv"),
    (whole_k_and_v_per_query_tile, "kv-not-tiled"),
    (whole_q_first, "q-not-tiled"),
    (kv_tiles_of_one_row, "kv-tiles-too-small"),
    (kv_tiles_one_row_short, "tile-end-off-by-one"),
]


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "fn", "name"),
    [
        (checks.check_standard_attention_traffic, good_standard, "standard_attention_traffic"),
        (
            checks.check_standard_attention_traffic,
            good_standard_by_kernel,
            "standard_attention_traffic",
        ),
        (checks.check_flash_attention_traffic, good_flash, "flash_attention_traffic"),
        (checks.check_flash_attention_traffic, good_flash_float, "flash_attention_traffic"),
        (checks.check_flash_attention_traffic, good_flash_math_ceil, "flash_attention_traffic"),
        (checks.check_flash_attention_traffic, good_flash_tile_by_tile, "flash_attention_traffic"),
    ]
    + [(checks.check_count_flash_forward, fn, "count_flash_forward") for fn in GOOD_LOOPS],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else None,
)
def test_right_answers_pass_with_one_line(check, fn, name):
    printed = run_quietly(check, fn)
    assert printed.startswith(f"✓ {name}:") and printed.count("\n") == 1


@pytest.mark.parametrize("trials", [0, 30])
def test_hidden_mode_fresh_inputs_pass(trials):
    for check, fn in (
        (checks.check_standard_attention_traffic, good_standard),
        (checks.check_flash_attention_traffic, good_flash),
        (checks.check_count_flash_forward, good_loop),
        (checks.check_count_flash_forward, good_loop_array_split),
    ):
        assert "✓" in run_quietly(check, fn, seed=None, trials=trials)


def test_the_checks_are_fast():
    """The test cells (visible and hidden) stay under a second each: about 0.05 s for the
    formulas and 0.3 s for the loop (visible and hidden together) on one core; CPU time, so that
    a busy machine does not make it fail."""
    for check, fn, trials in (
        (checks.check_standard_attention_traffic, good_standard, 200),
        (checks.check_flash_attention_traffic, good_flash, 200),
        (checks.check_count_flash_forward, good_loop, 40),
    ):
        start = time.process_time()
        run_quietly(check, fn)
        run_quietly(check, fn, seed=None, trials=trials)
        assert time.process_time() - start < 2.0, check.__name__


def test_cases_start_small_and_cover_the_edge_cases():
    std = checks_exercises._standard_cases(0, 3)
    assert std[0].args == (3, 2)
    assert any(d > N for N, d in (c.args for c in std))
    assert any(N >= 2**20 for N, _ in (c.args for c in std))
    flash = [c.args for c in checks_exercises._flash_cases(0, 3)]
    assert flash[0] == (6, 2, 2)
    assert any(N % Br for N, _, Br in flash)  # ragged
    assert any(N % Br == 1 and N > Br for N, _, Br in flash)  # a last tile of one row
    assert any(Br > N for N, _, Br in flash) and any(Br == N for N, _, Br in flash)
    assert any(Br == 1 for _, _, Br in flash) and (1, 1, 1) in flash
    assert (16384, 64, 128) in flash and (10, 4, 4) in flash  # the notebook's examples
    loops = [c.kwargs for c in checks_exercises._count_cases(0, 3)]
    assert loops[0] == {"N": 4, "d": 2, "Br": 2, "Bc": 2}
    assert any(k["Br"] != k["Bc"] for k in loops)
    assert any(k["N"] % k["Br"] and k["N"] % k["Bc"] for k in loops)
    assert any(k["Br"] > k["N"] for k in loops) and any(k["Bc"] > k["N"] for k in loops)
    assert {"N": 4096, "d": 64, "Br": 128, "Bc": 128} in loops  # the run after exercise 2
    assert {"N": 10, "d": 4, "Br": 4, "Bc": 3} in loops  # the example run of section 4
    # some case cannot hold all of K next to a query tile with the notebook's budget
    assert any(
        k["N"] * k["d"] + k["Br"] * k["d"] > checks.tile_budget(k["d"], k["Br"], k["Bc"])
        for k in loops
    )


def test_labels_speak_of_the_notebook():
    ex = checks_exercises
    cases = ex._standard_cases(0, 0) + ex._flash_cases(0, 0) + ex._count_cases(0, 0)
    for case in cases:
        assert not any(w in case.label.lower() for w in ("lesson", "textbook", "recall")), case
        assert case.focus


# ---------------------------------------------------------------------------------------------
# The formulas: every named mistake is recognized, and values print as the integers they are
# ---------------------------------------------------------------------------------------------
def _ids(m):
    return m.slug  # pytest numbers repeated slugs; ids must be the same in every worker


@pytest.mark.parametrize("mistake", checks.STANDARD_MISTAKES, ids=_ids)
def test_standard_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_standard_attention_traffic(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize("mistake", checks.FLASH_MISTAKES, ids=_ids)
def test_flash_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_flash_attention_traffic(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_formula_values_print_as_integers():
    with pytest.raises(CheckFailure) as info:
        checks.check_flash_attention_traffic(lambda N, d, Br: 2 * N * d + 2 * N * N * d)
    text = str(info.value)
    assert "expected: elements = 96" in text and "96.0" not in text
    assert "No known mistake matches; this case exercises the formula of section 4" in text


# ---------------------------------------------------------------------------------------------
# The loop: every rule and every named mistake
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mistake", checks.COUNT_MISTAKES, ids=_ids)
def test_loop_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


@pytest.mark.parametrize("mistake", list(checks.RULE_MISTAKES.values()), ids=_ids)
def test_each_rule_is_named_with_its_own_loop(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)
    assert "breaks a rule of the exercise" in str(info.value)


@pytest.mark.parametrize(("loop", "slug"), RULE_BREAKERS, ids=lambda v: getattr(v, "__name__", v))
def test_students_loops_that_break_a_rule_are_named(loop, slug):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(loop)
    text = str(info.value)
    assert slug_of(info.value) == slug, text
    assert "breaks a rule of the exercise" in text and "refused:" in text


def test_the_rule_breakers_have_the_right_counts():
    """Without the rules, the loops that store O at the end or stream K/V first look right."""
    for loop in (store_all_of_o_at_the_end, stream_kv_before_q, store_o_before_the_stream):
        mem = checks_replay.fresh_memory(64, 8, rules=False)
        loop(mem, 64, 8, 8, 8)
        assert mem.traffic() == good_flash(64, 8, 8)
        with pytest.raises(ThreadBlockError):
            loop(checks_replay.fresh_memory(64, 8), 64, 8, 8, 8)


def test_a_kv_tile_one_row_short_is_not_called_kv_read_once():
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(kv_tiles_one_row_short)
    assert slug_of(info.value) == "tile-end-off-by-one"
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(last_kv_tile_one_row_short)
    text = str(info.value)
    assert slug_of(info.value) is None, text
    assert "No known mistake matches; this case exercises the tile bounds" in text
    assert "K: row 3; V: row 3" in text  # the rows that never reached the chip


def test_a_mistake_is_named_only_when_its_replay_matches_on_every_fingerprint_case():
    """A loop that is right on the small fixed cases and wrong elsewhere matches no replay."""

    def wrong_only_for_long_sequences(mem, N, d, Br, Bc):
        good_loop(mem, N, d, Br, Bc)
        if N > 50:
            mem.load("K", (0, 1), slot="extra")

    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(wrong_only_for_long_sequences)
    assert slug_of(info.value) is None and "No known mistake matches" in str(info.value)


def test_a_huge_scratch_overflows_without_a_wrong_name():
    def loop_with_nxn_scratch(mem, N, d, Br, Bc):
        mem.scratch("S", (N, N))  # the whole score matrix on chip
        good_loop(mem, N, d, Br, Bc)

    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(loop_with_nxn_scratch)
    text = str(info.value)
    assert "on-chip memory overflow" in text and slug_of(info.value) is None
    assert "the on-chip budget" in text


# ---------------------------------------------------------------------------------------------
# Faked counters change nothing: the check replays the calls on its own memory
# ---------------------------------------------------------------------------------------------
def _right_counters(mem, N, d, Br):
    Tr = -(-N // Br)
    arrays = mem._arrays
    arrays["Q"]._reads, arrays["O"]._writes = N * d, N * d
    arrays["K"]._reads = arrays["V"]._reads = Tr * N * d


def fakes_the_counters(mem, N, d, Br, Bc):
    _right_counters(mem, N, d, Br)  # moves nothing


def fakes_the_counters_of_a_wrong_loop(mem, N, d, Br, Bc):
    for i0 in range(0, N, Br):  # K and V once per query tile... of two
        mem.load("Q", (i0, i0 + Br))
        if i0 == 0:
            for j0 in range(0, N, Bc):
                mem.load("K", (j0, j0 + Bc))
                mem.load("V", (j0, j0 + Bc))
    _right_counters(mem, N, d, Br)
    mem.count = lambda name, _orig=mem.count: _orig(name)  # a patched method on the instance


def lifts_the_budget(mem, N, d, Br, Bc):
    mem._M = None
    whole_k_and_v_per_query_tile(mem, N, d, Br, Bc)


def switches_the_rules_off(mem, N, d, Br, Bc):
    mem._rules.clear()
    mem._streams.clear()
    store_all_of_o_at_the_end(mem, N, d, Br, Bc)


def empties_the_record(mem, N, d, Br, Bc):
    mem._ops = []
    for i0 in range(0, N, Br):
        mem.load("Q", (i0, i0 + Br))
        mem.store("O", (i0, i0 + Br))


@pytest.mark.parametrize(
    ("loop", "slug"),
    [
        (fakes_the_counters, None),
        (fakes_the_counters_of_a_wrong_loop, None),
        (lifts_the_budget, "kv-not-tiled"),
        (switches_the_rules_off, "o-stored-off-chip"),
        (empties_the_record, "o-before-kv"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_faking_the_memory_does_not_pass(loop, slug):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(loop)
    assert slug_of(info.value) == slug, str(info.value)


def test_the_counters_cannot_be_written():
    mem = checks_replay.fresh_memory(4, 2)
    for name in ("reads", "writes", "total_reads", "total_elements", "M", "compute", "on_chip"):
        with pytest.raises(AttributeError):
            setattr(mem, name, 0)
    with pytest.raises(AttributeError):
        mem.count("K").reads = 5  # a frozen record
    with pytest.raises(CheckFailure, match="raised AttributeError"):
        checks.check_count_flash_forward(lambda mem, N, d, Br, Bc: setattr(mem, "reads", 48))


def test_patching_the_memory_class_is_named_and_undone():
    store = CountingMemory._check_store

    def patches_the_class(mem, N, d, Br, Bc):
        CountingMemory._check_store = lambda *args: None
        store_all_of_o_at_the_end(mem, N, d, Br, Bc)

    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(patches_the_class)
    assert slug_of(info.value) == "disables-check"
    assert CountingMemory._check_store is store


# ---------------------------------------------------------------------------------------------
# The reference watch, errors, the memory handed out
# ---------------------------------------------------------------------------------------------
def test_calling_the_reference_is_refused():
    with pytest.raises(CheckFailure) as info:
        checks.check_flash_attention_traffic(lambda N, d, Br: cu.flash_attention_traffic(N, d, Br))
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(
            lambda mem, N, d, Br, Bc: cu.count_flash_attention(N=N, d=d, Br=Br, Bc=Bc)
        )
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:  # the check's own rule-following loop
        checks.check_count_flash_forward(
            lambda mem, N, d, Br, Bc: checks_loops._loop_fa2(mem, N, d, Br, Bc)
        )
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:
        checks.check_standard_attention_traffic(cu.standard_attention_traffic)
    assert slug_of(info.value) == "calls-reference"


def test_the_allowed_methods_are_the_memorys_and_run_nothing_whole():
    allowed = set(checks_replay._MEMORY_METHODS)
    assert not allowed & {"count_flash_attention", "_flash2", "_flash1", "__init__"}
    api = {n for n in dir(CountingMemory) if not n.startswith("_")} | {"__repr__", "_repr_html_"}
    assert api <= allowed, api - allowed


def test_not_implemented_propagates():
    def stub(*args):
        raise NotImplementedError()

    for check in (
        checks.check_standard_attention_traffic,
        checks.check_flash_attention_traffic,
        checks.check_count_flash_forward,
    ):
        with pytest.raises(NotImplementedError):
            check(stub)


def test_a_crash_is_reported_with_its_input():
    def writes_lse(mem, N, d, Br, Bc):
        good_loop(mem, N, d, Br, Bc)
        mem.store("lse", (0, N))  # no such array in the check's memory

    with pytest.raises(CheckFailure, match=r"raised ValueError.*no array named 'lse'") as info:
        checks.check_count_flash_forward(writes_lse)
    assert "N = 4, d = 2, Br = 2, Bc = 2" in str(info.value)

    def divides_by_zero(mem, N, d, Br, Bc):
        good_loop(mem, N, d, Br, Bc)
        return 1 / 0

    with pytest.raises(CheckFailure, match="raised ZeroDivisionError"):
        checks.check_count_flash_forward(divides_by_zero)


def test_fresh_memory_and_budget():
    mem = checks_replay.fresh_memory(10, 3, M=50)
    assert [t.shape for t in mem.counts.values()] == [(10, 3)] * 4
    assert list(mem.counts) == ["Q", "K", "V", "O"]
    assert all(t.itemsize == 2 for t in mem.counts.values()) and mem.total_elements == 0
    assert mem.M == 50 and not mem.compute
    # section 11's list: Q_i and o_i, K_j and V_j, S_ij, m and l
    assert checks.tile_budget(64, 128, 64) == 2 * 128 * 64 + 2 * 64 * 64 + 128 * 64 + 2 * 128


@pytest.mark.parametrize("seed", [0, 1])
def test_the_checks_own_loop_follows_every_rule_and_counts_what_the_course_counts(seed):
    for case in checks_exercises._count_cases(seed, 10):
        N, d, Br, Bc = checks_exercises._sizes(case)
        mem = checks_replay.fresh_memory(N, d, checks.tile_budget(d, Br, Bc))
        start = len(mem.operations)
        checks_loops._loop_fa2(mem, N, d, Br, Bc)
        replay = checks_exercises._replay(mem.operations[start:], case)
        assert replay.breach is None and replay.tiles_ok
        course = cu.count_flash_attention(N=N, d=d, Br=Br, Bc=Bc).mem
        assert replay.counts == checks_replay._counts(course) == checks_exercises._expected(case)


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------
def test_quick_ratio_d128():
    assert "✓" in run_quietly(checks.check_quick_ratio_d128, 2)
    assert "✓" in run_quietly(checks.check_quick_ratio_d128, 1.99)
    with pytest.raises(CheckFailure, match="d = 64"):
        checks.check_quick_ratio_d128(4)
    with pytest.raises(CheckFailure, match="the other way"):
        checks.check_quick_ratio_d128(0.5)
    with pytest.raises(CheckFailure, match="no answer yet"):
        checks.check_quick_ratio_d128(None)


def test_quick_h200_standard_us():
    nbytes = (4 * 16384**2 + 4 * 16384 * 64) * 2
    assert "✓" in run_quietly(checks.check_quick_h200_standard_us, nbytes / 4.26e12 * 1e6)
    assert "✓" in run_quietly(checks.check_quick_h200_standard_us, 506)
    with pytest.raises(CheckFailure, match="H100"):
        checks.check_quick_h200_standard_us(644)
    with pytest.raises(CheckFailure, match="2 bytes"):
        checks.check_quick_h200_standard_us(253)
    with pytest.raises(CheckFailure, match="compute time"):
        checks.check_quick_h200_standard_us(86.2)
    with pytest.raises(CheckFailure, match="microseconds"):
        checks.check_quick_h200_standard_us(5.06e-4)
    with pytest.raises(CheckFailure, match="spec sheet"):
        checks.check_quick_h200_standard_us(nbytes / 4.8e12 * 1e6)


def test_quick_tile_rows():
    assert "✓" in run_quietly(checks.check_quick_tile_rows, 192)
    with pytest.raises(CheckFailure, match="d = 128"):
        checks.check_quick_tile_rows(96)
    with pytest.raises(CheckFailure, match="196,608"):
        checks.check_quick_tile_rows(187.5)
    with pytest.raises(CheckFailure):
        checks.check_quick_tile_rows(193)
    with pytest.raises(CheckFailure):
        checks.check_quick_tile_rows("192?")


def test_quick_a100_ridge():
    assert "✓" in run_quietly(checks.check_quick_a100_ridge, 208)
    assert "✓" in run_quietly(checks.check_quick_a100_ridge, 312e12 / 1.5e12)
    with pytest.raises(CheckFailure, match="2 TB/s"):
        checks.check_quick_a100_ridge(156)
    with pytest.raises(CheckFailure, match="bytes per FLOP"):
        checks.check_quick_a100_ridge(1.5 / 312)
    with pytest.raises(CheckFailure, match="H100"):
        checks.check_quick_a100_ridge(989 / 3.35)
    with pytest.raises(CheckFailure):
        checks.check_quick_a100_ridge(250)
    with pytest.raises(CheckFailure, match="no answer yet"):
        checks.check_quick_a100_ridge(None)


def test_quick_fa1_q_reads():
    assert "✓" in run_quietly(checks.check_quick_fa1_q_reads, 1024)
    assert "✓" in run_quietly(checks.check_quick_fa1_q_reads, 32 * 32)
    with pytest.raises(CheckFailure, match="minimum"):
        checks.check_quick_fa1_q_reads(32)
    with pytest.raises(CheckFailure, match="tiles, not rows"):
        checks.check_quick_fa1_q_reads(4096)
    with pytest.raises(CheckFailure):
        checks.check_quick_fa1_q_reads(1056)
    with pytest.raises(CheckFailure, match="no answer yet"):
        checks.check_quick_fa1_q_reads(None)
