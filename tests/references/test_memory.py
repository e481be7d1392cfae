"""CountingMemory and the HBM traffic formulas: the counts of instrumented runs equal the formulas.

The expected values here are written from the lesson (section "HBM traffic" and "Causal masks"),
not taken from the implementation: closed forms such as 2Nd + 2N^2 d / Br, tile-by-tile sums,
or the lesson's numbers.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils.harness.counting_memory import CountingMemory, OnChipMemoryError, ThreadBlockError
from course_utils.references.attention import attention_reference
from course_utils.references.memory import (
    causal_flash_attention_traffic,
    causal_tile_count,
    count_flash_attention,
    count_standard_attention,
    flash1_attention_traffic,
    flash_attention_traffic,
    standard_attention_traffic,
)

sizes = st.integers(1, 160)
heads_dims = st.integers(1, 16)
tiles = st.integers(2, 48)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- CountingMemory ------------------------------------------------------------------------
def test_load_and_store_count_elements_and_bytes_per_array():
    mem = CountingMemory()
    Q = np.arange(20 * 4, dtype=np.float32).reshape(20, 4)
    mem.place("Q", Q)
    mem.alloc("O", (20, 4), itemsize=2)
    assert mem.total_elements == 0  # placing and allocating move nothing

    q = mem.load("Q", slice(0, 8))
    assert np.array_equal(q, Q[:8])
    q_tail = mem.load("Q", (16, 24), cols=slice(1, 3))  # clipped at row 20: a 4 x 2 tile
    assert np.array_equal(q_tail, Q[16:20, 1:3])
    mem.store("O", range(0, 8), 2 * q)

    assert mem.count("Q").reads == 8 * 4 + 4 * 2
    assert mem.count("Q").read_bytes == (8 * 4 + 4 * 2) * 4  # float32
    assert mem.count("O").writes == 32 and mem.count("O").write_bytes == 64  # counted as 2 B
    assert mem.total_elements == 40 + 32
    assert mem.total_bytes == 40 * 4 + 32 * 2
    assert np.array_equal(mem.array("O")[:8], 2 * Q[:8])
    assert np.array_equal(mem.array("O")[8:], np.zeros((12, 4)))


def test_a_load_into_the_same_slot_replaces_the_tile_on_chip():
    mem = CountingMemory(M=20)
    mem.place("K", np.ones((10, 2)))
    for j in range(0, 10, 5):  # each 5 x 2 tile replaces the last: 10 on chip, never 20
        mem.load("K", slice(j, j + 5))
    assert mem.on_chip == 10 and mem.peak_on_chip == 10
    assert mem.count("K").reads == 20  # but each load is counted
    mem.load("K", slice(0, 5), slot="K2")
    assert mem.on_chip == 20
    mem.free("K2")
    assert mem.on_chip == 10
    with pytest.raises(ValueError, match="K2"):
        mem.free("K2")


def test_scratch_takes_chip_space_but_no_traffic():
    mem = CountingMemory(M=100)
    s = mem.scratch("S", (8, 8))
    assert s.shape == (8, 8) and mem.on_chip == 64 and mem.total_elements == 0
    mem.scratch("m", 8)
    assert mem.slots == {"S": 64, "m": 8}
    mem.free_all()
    assert mem.on_chip == 0 and mem.peak_on_chip == 72


def test_overflow_error_names_the_array_the_request_what_is_on_chip_and_M():
    mem = CountingMemory(M=100)
    mem.place("Q", np.zeros((20, 8)))
    mem.place("K", np.zeros((20, 8)))
    mem.load("Q", slice(0, 10))  # 80 elements
    with pytest.raises(OnChipMemoryError) as err:
        mem.load("K", slice(0, 4))  # 32 more: 112 > 100
    msg = str(err.value)
    assert "'K'" in msg and "32" in msg and "80" in msg and "100" in msg
    assert isinstance(err.value, ValueError)
    assert mem.count("K").reads == 0  # a refused load is not counted


def test_overflow_in_an_attention_run_names_the_tile_that_did_not_fit():
    # scratch S, acc, m, l = 16 + 32 + 8 = 56, Q tile 32: 88 <= 100; the K tile makes 120
    with pytest.raises(OnChipMemoryError, match="'K'"):
        count_flash_attention(N=16, d=8, Br=4, Bc=4, M=100)


def test_shape_only_memory_counts_without_values():
    mem = CountingMemory(compute=False)
    mem.place("Q", shape=(1000, 64), dtype=np.float16)
    mem.alloc("O", (1000, 64), np.float16)
    assert mem.load("Q", slice(0, 100)) is None
    mem.store("O", slice(900, 1100))  # clipped: 100 rows
    assert mem.count("Q").read_bytes == 100 * 64 * 2
    assert mem.count("O").writes == 100 * 64
    with pytest.raises(ValueError, match="shapes only"):
        mem.array("O")


def test_table_repr_and_reset():
    mem = CountingMemory(M=1000)
    mem.place("Q", np.zeros((10, 3)))
    mem.alloc("lse", 10, itemsize=4)
    mem.load("Q", slice(0, 10))
    mem.store("lse", slice(0, 10), np.ones(10))
    text = mem.table()
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["array", "shape"]
    q_row = next(line for line in lines if line.startswith("Q "))
    assert q_row.split()[1:6] == ["10x3", "8", "30", "0", "30"]
    total_row = next(line for line in lines if line.startswith("total"))
    assert total_row.split()[1:4] == ["30", "10", "40"]
    assert "1,000" in text  # M
    assert text in repr(mem) and "<table>" in mem._repr_html_() and "lse" in mem._repr_html_()
    assert mem.traffic(exclude="lse") == 30
    assert mem.traffic(exclude=("Q",), in_bytes=True) == 40

    mem.reset()
    assert mem.total_elements == 0 and mem.on_chip == 0 and mem.peak_on_chip == 0
    assert mem.array("lse")[0] == 1.0  # HBM keeps its values


def test_report_prints_the_table(capsys):
    mem = CountingMemory()
    mem.place("V", np.zeros((2, 2)))
    mem.load("V", slice(0, 2))
    mem.report()
    assert capsys.readouterr().out.strip() == mem.table()


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda m: m.load("X", slice(0, 1)), ValueError, "'X'"),
        (lambda m: m.load("Q", slice(0, 4, 2)), ValueError, "contiguous"),
        (lambda m: m.load("Q", slice(5, 9)), ValueError, "selects nothing"),
        (lambda m: m.load("Q", [0, 1]), TypeError, "rows"),
        (lambda m: m.store("Q", slice(0, 2), np.zeros((3, 2))), ValueError, "shape"),
        (lambda m: m.place("Q", np.zeros(3)), ValueError, "already"),
        (lambda m: m.place("R", shape=(3, 3)), ValueError, "compute=False"),
        (lambda m: m.scratch("S", (0, 3)), ValueError, "shape"),
        (lambda m: m.load("l", slice(0, 2), cols=slice(0, 1)), ValueError, "1-D"),
        (lambda m: m.traffic(exclude=("Qx",)), ValueError, "Qx"),
    ],
)
def test_bad_memory_calls_raise_clear_errors(call, exc, word):
    mem = CountingMemory()
    mem.place("Q", np.zeros((5, 2)))
    mem.alloc("l", 5)
    with pytest.raises(exc, match=word):
        call(mem)


def test_bad_M_is_refused():
    with pytest.raises(ValueError, match="M"):
        CountingMemory(M=0)
    with pytest.raises(TypeError, match="compute"):
        CountingMemory(compute="no")


def test_counters_are_read_only():
    mem = CountingMemory(M=100, compute=False)
    mem.place("Q", shape=(4, 2))
    mem.load("Q", (0, 2))
    for name in ("reads", "writes", "total_reads", "total_writes", "total_elements", "M"):
        with pytest.raises(AttributeError):
            setattr(mem, name, 0)
    with pytest.raises(AttributeError):
        mem._arrays["Q"].reads = 0
    assert mem.reads == mem.total_reads == 4 and mem.writes == 0 and mem.M == 100


def test_operations_keep_every_call_in_order_refused_ones_too():
    mem = CountingMemory(M=10, compute=False)
    mem.place("X", shape=(8, 2))
    mem.alloc("Y", (8, 2))
    mem.load("X", (0, 4))
    with pytest.raises(OnChipMemoryError):
        mem.load("X", (0, 8), slot="big")
    mem.store("Y", slice(0, 4))
    mem.free("X")
    mem.reset()
    kinds = [op[0] for op in mem.operations]
    assert kinds == ["place", "alloc", "load", "load", "store", "free", "reset"]
    assert mem.operations[3] == ("load", "X", (0, 8), None, "big")
    assert mem.total_elements == 0  # the reset zeroed the counters, not the record


def _qkv(N=4, d=2, M=None, causal=False):
    mem = CountingMemory(M, compute=False)
    for name in ("Q", "K", "V"):
        mem.place(name, shape=(N, d))
    mem.alloc("O", (N, d), rows_from="Q", streamed=("K", "V"), causal=causal)
    return mem


def test_a_streamed_tile_needs_a_row_tile_on_chip():
    mem = _qkv()
    with pytest.raises(ThreadBlockError, match="nothing to be multiplied with") as err:
        mem.load("K", (0, 2))
    assert err.value.rule == "stream-without-tile" and isinstance(err.value, ValueError)
    assert mem.count("K").reads == 0 and mem.on_chip == 0  # refused: not counted
    mem.load("Q", (0, 2))
    mem.load("K", (0, 2))
    mem.free("Q")
    with pytest.raises(ThreadBlockError):
        mem.load("V", (0, 2))


def test_output_rows_are_stored_only_from_their_row_tile():
    mem = _qkv()
    for i0 in (0, 2):
        mem.load("Q", (i0, i0 + 2))
        for j0 in (0, 2):
            mem.load("K", (j0, j0 + 2))
            mem.load("V", (j0, j0 + 2))
    with pytest.raises(ThreadBlockError, match="holds rows 2-3") as err:
        mem.store("O", (0, 4))  # all of O at the end: rows 0-1 left the chip with Q_0
    assert err.value.rule == "rows-not-on-chip" and mem.count("O").writes == 0
    mem.store("O", (2, 3))  # part of the tile on chip is fine
    mem.store("O", (3, 4))
    mem.free_all()
    with pytest.raises(ThreadBlockError, match="no tile of 'Q' is on chip"):
        mem.store("O", (2, 4))


def test_an_output_tile_is_stored_only_once_every_streamed_row_has_passed():
    mem = _qkv()
    mem.load("Q", (0, 2))
    with pytest.raises(ThreadBlockError) as err:
        mem.store("O", (0, 2))
    assert err.value.rule == "stream-incomplete" and not err.value.streamed_any
    mem.load("K", (0, 2))
    mem.load("V", (0, 3))
    with pytest.raises(ThreadBlockError, match="K: rows 2-3; V: row 3") as err:
        mem.store("O", (0, 2))
    assert err.value.streamed_any and err.value.missing == {"K": [(2, 4)], "V": [(3, 4)]}
    mem.load("Q", (0, 2))  # the same rows again: what has streamed past them still counts
    mem.load("K", (2, 4))
    mem.load("V", (3, 4))
    mem.store("O", (0, 2))
    mem.load("Q", (2, 4))  # a new row tile starts from the K/V tiles still on chip
    with pytest.raises(ThreadBlockError, match="K: rows 0-1; V: rows 0-2"):
        mem.store("O", (2, 4))


def test_column_pieces_and_the_causal_rule():
    mem = _qkv(causal=True)
    mem.load("Q", (0, 2))
    mem.load("K", (0, 2), cols=(0, 1))
    mem.load("V", (0, 2))
    with pytest.raises(ThreadBlockError, match="K: rows 0-1"):
        mem.store("O", (0, 2))  # column 1 of K's rows 0-1 never came
    mem.load("K", (0, 2), cols=(1, 2))
    mem.store("O", (0, 2))  # causal: rows 0-1 need keys 0-1 only


def test_bad_rules_are_refused():
    mem = CountingMemory(compute=False)
    mem.place("Q", shape=(4, 2))
    mem.place("K", shape=(6, 2))
    with pytest.raises(ValueError, match="rows"):
        mem.alloc("O", (6, 2), rows_from="Q", streamed=("K",))
    with pytest.raises(ValueError, match="'X'"):
        mem.alloc("O", (4, 2), rows_from="Q", streamed=("X",))
    with pytest.raises(TypeError, match="rows_from"):
        mem.alloc("O", (4, 2), streamed=("K",))
    mem.alloc("O", (4, 2), rows_from="Q", streamed="K")  # one name is fine
    mem.load("Q", (0, 4))
    mem.load("K", (0, 6))  # more keys than queries
    mem.store("O", (0, 4))


def test_the_courses_fa2_run_keeps_the_thread_block_rules():
    run = count_flash_attention(N=10, d=4, Br=4, Bc=3, causal=True)
    rules = {op[1]: op[-1] for op in run.mem.operations if op[0] == "alloc"}
    assert rules["O"].rows_from == "Q" and rules["O"].streamed == ("K", "V")
    assert rules["O"].causal and rules["lse"] == rules["O"]


# ---- the formulas --------------------------------------------------------------------------
@given(sizes, heads_dims, tiles)
def test_flash_formula_is_the_lessons_when_Br_divides_N_and_uses_ceil_otherwise(N, d, Br):
    assert flash_attention_traffic(N * Br, d, Br) == 2 * (N * Br) * d + 2 * (N * Br) ** 2 * d // Br
    assert flash_attention_traffic(N, d, Br) == N * d + N * d + ceil_div(N, Br) * 2 * N * d


@given(sizes, heads_dims)
def test_standard_formula(N, d):
    assert standard_attention_traffic(N, d) == 4 * N * N + 4 * N * d


@given(st.integers(1, 60), heads_dims, tiles)
def test_causal_formulas_with_square_tiles_dividing_N(T, d, B):
    N = T * B
    assert causal_tile_count(N, B) == sum(i + 1 for i in range(T))  # tiles on or below diagonal
    assert causal_flash_attention_traffic(N, d, B) == N * d * (T + 3)  # 2Nd + (T+1)Nd of K, V
    assert flash1_attention_traffic(N, d, B, causal=True) * 2 == (
        4 * N * d + N * d * (T + 1) + 2 * N * T * (d + 2)
    )


def test_causal_tile_count_of_the_lesson():
    assert causal_tile_count(16_384, 128) == 8_256  # of 128^2 = 16,384 tiles


@given(sizes, heads_dims, tiles)
def test_flash1_formula_closed_form(N, d, Bc):
    Tc = ceil_div(N, Bc)
    assert flash1_attention_traffic(N, d, Bc) == (3 * Tc + 1) * N * d + 2 * (2 * Tc - 1) * N


@pytest.mark.parametrize(
    "fn, args, exc, word",
    [
        (standard_attention_traffic, (0, 64), ValueError, "N"),
        (standard_attention_traffic, (16, 64.0), TypeError, "d"),
        (flash_attention_traffic, (16, 8, True), TypeError, "Br"),
        (flash_attention_traffic, (16, 8, -2), ValueError, "Br"),
        (flash1_attention_traffic, (16, 8, 0), ValueError, "Bc"),
        (causal_tile_count, (16, None), TypeError, "B"),
        (causal_flash_attention_traffic, ("16", 8, 4), TypeError, "N"),
    ],
)
def test_formula_input_errors_name_the_argument(fn, args, exc, word):
    with pytest.raises(exc, match=rf"\b{word}\b"):
        fn(*args)


# ---- instrumented runs: counts ---------------------------------------------------------------
@given(sizes, heads_dims, tiles, tiles)
def test_fa2_counts_equal_the_formula_for_any_N_d_Br_Bc(N, d, Br, Bc):
    run = count_flash_attention(N=N, d=d, Br=Br, Bc=Bc)
    mem, Tr = run.mem, ceil_div(N, Br)
    assert mem.traffic(exclude="lse") == flash_attention_traffic(N, d, Br)
    assert mem.count("K").reads == mem.count("V").reads == Tr * N * d  # all of K, V per Q tile
    assert mem.count("Q").reads == mem.count("O").writes == N * d
    assert mem.count("lse").writes == N and mem.count("lse").write_bytes == 4 * N
    assert run.score_tiles == Tr * ceil_div(N, Bc)


@given(sizes, heads_dims, tiles)
def test_fa2_causal_counts_equal_the_formula(N, d, B):
    run = count_flash_attention(N=N, d=d, Br=B, Bc=B, causal=True)
    assert run.mem.traffic(exclude="lse") == causal_flash_attention_traffic(N, d, B)
    assert run.score_tiles == causal_tile_count(N, B)
    # tile by tile: query tile i loads K/V rows 0 .. min(N, (i+1)B)
    kv = sum(min(N, (i + 1) * B) for i in range(ceil_div(N, B)))
    assert run.mem.count("K").reads == kv * d


@given(sizes, heads_dims, tiles, tiles, st.booleans())
def test_fa1_counts_equal_the_formula(N, d, Br, Bc, causal):
    run = count_flash_attention(N=N, d=d, Br=Br, Bc=Bc, causal=causal, loop_order="fa1")
    mem = run.mem
    assert mem.total_elements == flash1_attention_traffic(N, d, Bc, Br, causal)
    assert mem.count("K").reads == mem.count("V").reads == N * d  # each K/V tile read once
    if not causal:
        Tc = ceil_div(N, Bc)
        assert mem.count("Q").reads == Tc * N * d
        assert mem.count("O").writes == Tc * N * d
        assert mem.count("O").reads == (Tc - 1) * N * d  # the first pass reads nothing
        assert mem.count("m").reads == mem.count("l").reads == (Tc - 1) * N
        assert run.score_tiles == Tc * ceil_div(N, Br)


@given(sizes, heads_dims, st.integers(1, 64))
def test_standard_counts_equal_the_formula(N, d, block_rows):
    mem = count_standard_attention(N=N, d=d, block_rows=block_rows).mem
    assert mem.total_elements == standard_attention_traffic(N, d)
    assert mem.count("S").writes == mem.count("S").reads == N * N
    assert mem.count("P").writes == mem.count("P").reads == N * N


def test_counting_with_values_counts_the_same_as_shapes_only():
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((3, 45, 6))
    for kw in ({}, {"causal": True}, {"loop_order": "fa1"}, {"loop_order": "fa1", "causal": True}):
        with_values = count_flash_attention(Q, K, V, Br=8, Bc=16, **kw).mem
        shapes = count_flash_attention(N=45, d=6, Br=8, Bc=16, **kw).mem
        assert with_values.counts == shapes.counts, kw


# ---- instrumented runs: values ---------------------------------------------------------------
@given(
    st.integers(1, 40),
    st.integers(1, 8),
    st.integers(1, 16),
    st.integers(1, 16),
    st.booleans(),
    st.sampled_from(["fa2", "fa1"]),
    st.integers(0, 2**32 - 1),
)
def test_instrumented_flash_attention_computes_the_reference(N, d, Br, Bc, causal, order, seed):
    rng = np.random.default_rng(seed)
    Q, K, V = 2 * rng.standard_normal((3, N, d))
    run = count_flash_attention(Q, K, V, Br=Br, Bc=Bc, causal=causal, loop_order=order)
    O_ref, lse_ref = attention_reference(Q, K, V, causal=causal)
    np.testing.assert_allclose(run.out, O_ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(run.lse, lse_ref, rtol=0, atol=1e-10)


def test_instrumented_flash_attention_with_more_keys_than_queries_and_dv_not_d():
    rng = np.random.default_rng(2)
    Q, K, V = (
        rng.standard_normal((7, 5)),
        rng.standard_normal((19, 5)),
        rng.standard_normal((19, 3)),
    )
    for order in ("fa2", "fa1"):
        run = count_flash_attention(Q, K, V, Br=3, Bc=4, loop_order=order, softmax_scale=0.3)
        O_ref, _ = attention_reference(Q, K, V, softmax_scale=0.3)
        np.testing.assert_allclose(run.out, O_ref, rtol=0, atol=1e-10)


@given(st.integers(1, 40), st.integers(1, 8), st.integers(1, 16), st.integers(0, 2**32 - 1))
def test_instrumented_standard_attention_computes_the_reference(N, d, block_rows, seed):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.standard_normal((3, N, d))
    run = count_standard_attention(Q, K, V, block_rows=block_rows)
    np.testing.assert_allclose(run.out, attention_reference(Q, K, V)[0], rtol=0, atol=1e-10)
    assert run.lse is None


def test_shape_only_runs_return_no_values():
    run = count_flash_attention(N=10, d=4, Br=4, Bc=4)
    assert run.out is None and run.lse is None


# ---- the on-chip budget of the lesson ------------------------------------------------------
@given(st.integers(8, 64), st.integers(1, 24), st.data())
def test_the_lessons_tile_budget_fits_in_M(d, k, data):
    M = 6 * d * k + data.draw(st.integers(0, 6 * d - 1))
    Br = max(1, M // (6 * d))  # the lesson's choice
    Bc = min(Br, d)
    N = 2 * Br + data.draw(st.integers(0, Br))
    mem = count_flash_attention(N=N, d=d, Br=Br, Bc=Bc, M=M).mem
    # Q_i and acc, K_j and V_j, the score tile, m and l are all on chip at once
    assert mem.peak_on_chip == 2 * Br * d + 2 * Bc * d + Br * Bc + 2 * Br
    assert mem.peak_on_chip <= 0.875 * M


@pytest.mark.parametrize("d, Br", [(64, 32), (128, 16), (16, 8), (8, 1)])
def test_twice_the_lessons_query_tile_overflows(d, Br):
    M = 6 * d * Br
    assert M // (6 * d) == Br
    count_flash_attention(N=4 * Br, d=d, Br=Br, Bc=min(Br, d), M=M)  # fits
    with pytest.raises(OnChipMemoryError, match="M = "):
        count_flash_attention(N=4 * Br, d=d, Br=2 * Br, Bc=min(2 * Br, d), M=M)


# ---- at scale ------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["fa2", "fa1"])
def test_counting_at_the_lessons_scale_is_fast(order):
    """Shape-only counting at N = 16,384, d = 64, Br = Bc = 128 takes well under a second
    (about 0.1 s for FA2 and 0.3 s for FA1 on a laptop core); 5 s leaves room for slow CI."""
    N, d, B = 16_384, 64, 128
    start = time.perf_counter()
    run = count_flash_attention(N=N, d=d, Br=B, Bc=B, loop_order=order)
    elapsed = time.perf_counter() - start
    if order == "fa2":
        assert run.mem.traffic(exclude="lse") == 2 * N * d + 2 * N * N * d // B
    else:
        T = N // B
        assert run.mem.total_elements == (3 * T + 1) * N * d + 2 * (2 * T - 1) * N
    assert run.score_tiles == (N // B) ** 2
    assert elapsed < 5.0


def test_counted_ratio_at_scale_is_the_lessons_2Br_over_d():
    N, d, B = 16_384, 64, 128
    flash = count_flash_attention(N=N, d=d, Br=B, Bc=B).mem.traffic(exclude="lse")
    standard = count_standard_attention(N=N, d=d).mem.total_elements
    assert round(standard / flash, 1) == 2 * B / d == 4.0
    causal = count_flash_attention(N=N, d=d, Br=B, Bc=B, causal=True).mem.traffic(exclude="lse")
    kv_full, kv_causal = flash - 2 * N * d, causal - 2 * N * d
    assert math.isclose(kv_causal / kv_full, 0.5, rel_tol=0.01)  # about half the K, V traffic


# ---- bad input to the runs -----------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        ({"N": 8, "d": 4, "Br": 0, "Bc": 4}, ValueError, "Br"),
        ({"N": 8, "d": 4, "Br": 4, "Bc": 2.0}, TypeError, "Bc"),
        ({"N": 8, "d": 4, "Br": 4, "Bc": 4, "loop_order": "fa3"}, ValueError, "loop_order"),
        ({"N": 8, "d": 4, "Br": 4, "Bc": 4, "causal": "yes"}, TypeError, "causal"),
        ({"N": 8, "d": 4, "Br": 4, "Bc": 4, "M": -1}, ValueError, "M"),
        ({"N": 8, "d": 0, "Br": 4, "Bc": 4}, ValueError, "d"),
        ({"N": 8, "Br": 4, "Bc": 4}, TypeError, "N and d"),
        ({"Q": np.zeros((4, 2)), "Br": 4, "Bc": 4}, TypeError, "Q, K, V"),
        ({"N": 8, "d": 4, "Br": 4, "Bc": 4, "bytes_per_element": 0}, ValueError, "bytes"),
    ],
)
def test_count_flash_attention_errors_name_the_argument(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        count_flash_attention(**kwargs)


def test_arrays_and_shapes_together_are_refused():
    Q = np.zeros((4, 2))
    with pytest.raises(TypeError, match="either"):
        count_flash_attention(Q, Q, Q, N=4, d=2, Br=2, Bc=2)
    with pytest.raises(ValueError, match="causal"):
        count_flash_attention(Q, np.zeros((5, 2)), np.zeros((5, 2)), Br=2, Bc=2, causal=True)
    with pytest.raises(ValueError, match="block_rows"):
        count_standard_attention(N=4, d=2, block_rows=0)
