"""benchmarks.backward_ws on a CPU machine: its variants, its table and its exit without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import course_utils.triton_attention  # noqa: F401  (first: the interpreter switch)
from benchmarks import backward_ws as bench

without_a_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")


def test_variants_per_head_dim():
    """Every variant names a launch the kernel takes: known options, buffers that fit."""
    import inspect

    from course_utils.triton_attention.hopper import backward_ws as bws

    options = set(inspect.signature(bws.flash_attention_bwd_ws).parameters)
    for d in (64, 128):
        names = [n for n, _ in bench.variants(d)]
        assert len(set(names)) == len(names) and names[0] == ("split-s2" if d == 128 else "m128-s2")
        for name, kw in bench.variants(d):
            assert set(kw) <= options, (name, kw)
            opts = bws.launch_options(d, False, **kw)  # refuses buffers past shared memory
            parts = name.split("-")
            assert opts["dq_lag"] == ("lag" in parts), (name, opts)
            assert f"s{opts['num_slots']}" in parts, (name, opts)
            assert opts["persistent"] == name.startswith("P-"), (name, opts)
            assert opts["k_bufs"] == (1 if "k1" in parts or not opts["persistent"] else 2), name
            by_tma = (opts["persistent"] and "st" not in parts) or "tma" in parts
            assert opts["dkdv_tma"] == by_tma, name
            assert opts["dynamic"] == (opts["persistent"] and "dealt" not in parts), name
    assert dict(bench.variants(128))["own-s2"] == {
        "num_slots": 2, "dq_split": False, "dq_lag": False, "persistent": False
    }  # fmt: skip
    assert bench.is_gluon("own-s2") and not bench.is_gluon("course")
    assert not bench.is_gluon("cudnn")


def _point(n, values):
    results = {k: {"tflops": v} for k, v in values.items()}
    return {"d": 128, "causal": True, "n": n, "batch": 1, "heads": 16, "results": results}


def test_table_takes_the_best_gluon_variant_per_point():
    points = [
        _point(1024, {"course": 300.0, "split-s2": 250.0, "own-s2": 270.0, "cudnn": 400.0}),
        _point(4096, {"course": 350.0, "split-s2": 360.0, "own-s2": 330.0, "cudnn": 450.0}),
    ]
    text = bench.table(points)
    assert text.splitlines()[0].startswith("| d | causal | N | course | split-s2 | own-s2 |")
    assert "| 128 | True | 1024 | 300 | 250 | 270 | 400 | 0.68 | n/a | 0.90 |" in text
    gm = math.sqrt(270 / 400 * 360 / 450)
    assert f"best Gluon variant / cudnn: geometric mean {gm:.2f}, lowest 0.68" in text


@without_a_gpu
def test_backward_ws_without_a_hopper_gpu_says_so(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path), "--results", str(tmp_path / "R.md")]) == 0
    assert "needs a Hopper GPU" in capsys.readouterr().out
    assert not (tmp_path / "R.md").exists()
