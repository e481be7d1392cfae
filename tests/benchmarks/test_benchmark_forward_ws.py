"""benchmarks.forward_ws on a CPU machine: its variants, its table, and its exit without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import course_utils.triton_attention  # noqa: F401  (first: the interpreter switch)
from benchmarks import forward_ws as bench


def test_ring_depths_fit_in_shared_memory():
    assert bench.ring_depths(64) == [2, 3, 4]
    assert bench.ring_depths(128) == [2, 3]  # 4 slots of 64 KB do not fit beside Q


def test_variants_cover_depths_and_pingpong():
    names = [name for name, _ in bench.variants(128)]
    assert names == ["s2", "s2-pp", "s3", "s3-pp"]
    # one program an SM said outright: where launch_policy picks two, `s4` must still be one
    one = {"num_slots": 4, "pingpong": True, "programs_per_sm": 1}
    assert dict(bench.variants(64))["s4-pp"] == one
    two = {"num_slots": 4, "pingpong": False, "programs_per_sm": 2}
    assert dict(bench.variants(64))["s4-x2"] == two
    assert not any(name.endswith("-x2") for name in names)  # d = 128: one program an SM


def _point(n, course, s3, s4, cudnn, flash=300.0):
    results = {"course": course, "s3": s3, "s4": s4, "cudnn": cudnn, "flash": flash}
    results = {k: {"tflops": v} for k, v in results.items()}
    return {"d": 64, "causal": False, "n": n, "batch": 1, "heads": 32, "results": results}


def test_table_takes_the_best_variant_per_point():
    points = [_point(1024, 400.0, 380.0, 420.0, 440.0), _point(4096, 400.0, 460.0, 450.0, 460.0)]
    rows, summary = bench.ratio_columns(points)
    assert rows[0]["cudnn"] == pytest.approx(420 / 440)
    assert rows[1]["cudnn"] == pytest.approx(1.0)
    assert summary["cudnn"][0] == pytest.approx(math.sqrt(420 / 440))
    assert summary["cudnn"][1] == pytest.approx(420 / 440)
    text = bench.table(points)
    assert "| 64 | False | 1024 | 400 | 380 | 420 | 300 | 440 | 0.95 |" in text
    assert "best Gluon variant / course: geometric mean" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_without_a_hopper_gpu_it_says_so(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path), "--results", str(tmp_path / "R.md")]) == 0
    assert "needs a Hopper GPU" in capsys.readouterr().out
    assert not (tmp_path / "R.md").exists()


def test_time_in_rounds_rotates_and_keeps_the_median(monkeypatch):
    """Every variant with a first time is timed `rounds` more times, each round starting one
    variant later; the median is kept; failed variants are left alone."""
    from benchmarks import attention

    order = []
    clock = {"a": iter([3.0, 1.0]), "b": iter([5.0, 6.0])}
    fns = {"a": lambda: None, "b": lambda: None, "bad": lambda: None}
    names = {fn: name for name, fn in fns.items()}
    monkeypatch.setattr(
        attention, "time_ms", lambda fn: order.append(names[fn]) or next(clock[names[fn]])
    )
    results = {"a": {"ms": 2.0}, "b": {"ms": 4.0}, "bad": {"error": "wrong", "tflops": 0.0}}
    lines = []
    attention.time_in_rounds(fns, results, 1e9, 2, lines.append)
    assert order == ["a", "b", "b", "a"]
    assert results["a"]["ms_all"] == [2.0, 3.0, 1.0] and results["a"]["ms"] == 2.0
    assert results["b"]["ms"] == 5.0 and results["b"]["tflops"] == 1e9 / 5.0 * 1e-9
    assert results["bad"] == {"error": "wrong", "tflops": 0.0}
    assert lines and "median of rounds" in lines[0]
    attention.time_in_rounds({}, {}, 1e9, 3, lines.append)  # nothing timed: nothing to do
    # the backward's labels are (variant, timing) pairs: the same rotation
    order.clear()
    fns = {("a", "bwd"): fns["a"], ("a", "fwd_bwd"): fns["b"]}
    names = {fns[("a", "bwd")]: "a", fns[("a", "fwd_bwd")]: "b"}
    clock = {"a": iter([1.0, 1.0]), "b": iter([2.0, 2.0])}
    times = attention.rotate_rounds(fns, {("a", "bwd"): 1.5, ("a", "fwd_bwd"): 2.5}, 2)
    assert order == ["a", "b", "b", "a"]
    assert times == {("a", "bwd"): [1.5, 1.0, 1.0], ("a", "fwd_bwd"): [2.5, 2.0, 2.0]}


def test_attention_table_rates_a_learner_against_cudnn_and_flash():
    """benchmarks.attention --learner (the autograd function's forward, say): its own ratio
    columns and summary, a refused backend left out of the lowest."""
    from benchmarks import attention

    def point(n, course, learner, cudnn, flash):
        res = {"course": course, "learner": learner, "cudnn": cudnn, "flash": flash}
        res["efficient"] = 100.0
        return {"d": 64, "causal": True, "n": n, "batch": 1, "heads": 1,
                "results": {k: {"tflops": v} for k, v in res.items()}}  # fmt: skip

    points = [point(1024, 300, 320, 340, 216), point(4096, 380, 410, 410, float("nan"))]
    names = ["course", "learner", "flash", "cudnn", "efficient"]
    md, gm_course, min_flash = attention.table(points, names)
    head = md.splitlines()[0]
    assert "learner/cuDNN" in head and "learner/flash" in head and "course/cuDNN" in head
    assert md.splitlines()[2].count("|") == len(names) + 10
    gm, low, low_flash = attention.ratios(points, "learner")
    assert low == 320 / 340 and abs(gm - math.sqrt(320 / 340 * 1.0)) < 1e-12
    assert low_flash == 320 / 216  # the NaN flash point left out
    assert abs(gm_course - math.sqrt(300 / 340 * 380 / 410)) < 1e-12 and min_flash == 300 / 216


def test_keep_median_names_the_backwards_timings():
    """The backward keeps bwd_ and fwd_bwd_ medians side by side in one variant's entry."""
    from benchmarks import attention

    entry = {"diff": 0.0}
    attention.keep_median(entry, [4.0, 2.0, 3.0], 2.5e9, prefix="bwd_")
    attention.keep_median(entry, [5.0, 7.0, 6.0], 3.5e9, prefix="fwd_bwd_")
    assert entry["bwd_ms"] == 3.0 and entry["bwd_tflops"] == 2.5e9 / 3.0 * 1e-9
    assert entry["fwd_bwd_ms"] == 6.0 and entry["fwd_bwd_ms_all"] == [5.0, 7.0, 6.0]
    assert entry["diff"] == 0.0 and "ms" not in entry
