"""benchmarks/capstone.py: the parts that run without a GPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks import capstone


def test_slope_is_the_log_log_exponent_and_leaves_out_oom_points():
    ns = [1024, 2048, 4096, 8192]
    assert capstone.slope(ns, [n * n for n in ns]) == pytest.approx(2.0)
    assert capstone.slope(ns, [3 * n for n in ns[:3]] + [None]) == pytest.approx(1.0)
    assert capstone.slope(ns, [None, None, None, 5]) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_without_a_gpu_it_says_so(capsys):
    assert capstone.main(["--no-append"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
