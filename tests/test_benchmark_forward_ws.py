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
