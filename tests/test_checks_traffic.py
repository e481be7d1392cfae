"""The checks of notebook 04: right answers pass quietly, every named mistake is recognized.

The "learner" functions here are written in this file (formulas from the lesson, the loop of
FlashAttention-2), so the checks' guard against calling course_utils does not fire.
"""

from __future__ import annotations

import pytest
from checkhelp import as_learner, run_quietly, slug_of

from course_utils.checks import traffic as checks
from course_utils.checks._core import CheckFailure


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here
# ---------------------------------------------------------------------------------------------
def good_standard(N, d):
    return 4 * N * N + 4 * N * d


def good_flash(N, d, Br):
    return 2 * N * d + -(-N // Br) * 2 * N * d


def good_flash_float(N, d, Br):
    """A float answer with an integer value is fine."""
    return float(2 * N * d + 2 * N * d * -(-N // Br))


def good_loop(mem, N, d, Br, Bc):
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


def loop_with_nxn_scratch(mem, N, d, Br, Bc):
    mem.scratch("S", (N, N))  # the whole score matrix on chip
    good_loop(mem, N, d, Br, Bc)


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "fn", "name"),
    [
        (checks.check_standard_attention_traffic, good_standard, "standard_attention_traffic"),
        (checks.check_flash_attention_traffic, good_flash, "flash_attention_traffic"),
        (checks.check_flash_attention_traffic, good_flash_float, "flash_attention_traffic"),
        (checks.check_count_flash_forward, good_loop, "count_flash_forward"),
        (checks.check_count_flash_forward, good_loop_with_scratch, "count_flash_forward"),
    ],
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
    ):
        assert "✓" in run_quietly(check, fn, seed=None, trials=trials)


def test_cases_start_small_and_cover_the_edge_cases():
    std = checks._standard_cases(0, 3)
    assert std[0].args == (3, 2)
    assert any(d > N for N, d in (c.args for c in std))
    flash = [c.args for c in checks._flash_cases(0, 3)]
    assert flash[0] == (6, 2, 2)
    assert any(N % Br for N, _, Br in flash)  # ragged
    assert any(Br > N for N, _, Br in flash)
    assert any(Br == 1 for _, _, Br in flash)
    assert (16384, 64, 128) in flash  # the lesson's at-scale example
    loops = [c.kwargs for c in checks._count_cases(0, 3)]
    assert loops[0] == {"N": 4, "d": 2, "Br": 2, "Bc": 2}
    assert any(k["Br"] != k["Bc"] for k in loops)
    assert any(k["N"] % k["Br"] and k["N"] % k["Bc"] for k in loops)
    assert any(k["Br"] > k["N"] for k in loops) and any(k["Bc"] > k["N"] for k in loops)
    assert {"N": 4096, "d": 64, "Br": 128, "Bc": 128} in loops  # textbook recall question 6
    # some case cannot hold all of K next to a query tile with the lesson's budget
    assert any(
        k["N"] * k["d"] + k["Br"] * k["d"] > checks.tile_budget(k["d"], k["Br"], k["Bc"])
        for k in loops
    )


# ---------------------------------------------------------------------------------------------
# Every named mistake is recognized
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


@pytest.mark.parametrize("mistake", checks.COUNT_MISTAKES, ids=_ids)
def test_loop_mistakes_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(as_learner(mistake.fn.raw))
    assert slug_of(info.value) == mistake.slug, str(info.value)
    assert "is wrong on" in str(info.value)


@pytest.mark.parametrize("mistake", checks.FIT_MISTAKES, ids=_ids)
def test_loops_that_do_not_fit_on_chip_are_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(as_learner(mistake.fn))
    text = str(info.value)
    assert slug_of(info.value) == mistake.slug, text
    assert "does not fit on chip" in text and "on-chip memory overflow" in text


def test_brief_mistakes_are_all_covered():
    assert {"nxn-once", "bytes-not-elements", "q-or-o-missing"} <= {
        m.slug for m in checks.STANDARD_MISTAKES
    }
    assert {"kv-read-once", "q-or-o-missing", "bytes-not-elements", "ragged-tile"} <= {
        m.slug for m in checks.FLASH_MISTAKES
    }
    assert {"kv-read-once", "o-written-per-tile", "q-read-per-tile"} <= {
        m.slug for m in checks.COUNT_MISTAKES
    }
    assert "kv-read-once" in {m.slug for m in checks.FIT_MISTAKES}


def test_right_counts_that_do_not_fit_are_refused():
    """Loading all of K once per query tile gives FA2's counts, but not on a real chip."""
    kv_whole = next(m for m in checks.FIT_MISTAKES if m.slug == "kv-not-tiled")
    mem = checks.fresh_memory(64, 8)
    kv_whole.fn(mem, 64, 8, 8, 8)
    assert mem.traffic() == good_flash(64, 8, 8)  # the counts alone look right


def test_a_huge_scratch_is_refused_without_a_wrong_name():
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(loop_with_nxn_scratch)
    assert "does not fit on chip" in str(info.value) and slug_of(info.value) is None


def test_calling_the_reference_is_refused():
    import course_utils as cu

    with pytest.raises(CheckFailure) as info:
        checks.check_flash_attention_traffic(lambda N, d, Br: cu.flash_attention_traffic(N, d, Br))
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:
        checks.check_count_flash_forward(
            lambda mem, N, d, Br, Bc: cu.count_flash_attention(N=N, d=d, Br=Br, Bc=Bc)
        )
    assert slug_of(info.value) == "calls-reference"
    with pytest.raises(CheckFailure) as info:
        checks.check_standard_attention_traffic(cu.standard_attention_traffic)
    assert slug_of(info.value) == "calls-reference"


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
    assert "N=4, d=2, Br=2, Bc=2" in str(info.value)


def test_fresh_memory_and_budget():
    mem = checks.fresh_memory(10, 3, M=50)
    assert [t.shape for t in mem.counts.values()] == [(10, 3)] * 4
    assert list(mem.counts) == ["Q", "K", "V", "O"]
    assert all(t.itemsize == 2 for t in mem.counts.values()) and mem.total_elements == 0
    assert mem.M == 50 and not mem.compute
    # the lesson's list: Q_i and o_i, K_j and V_j, S_ij, m and l
    assert checks.tile_budget(64, 128, 64) == 2 * 128 * 64 + 2 * 64 * 64 + 128 * 64 + 2 * 128


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
