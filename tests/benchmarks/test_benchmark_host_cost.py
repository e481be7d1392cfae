"""benchmarks.host_cost on a CPU machine: the per-call clock, the table, the command line."""

from __future__ import annotations

import math
import time

import pytest
import torch

from benchmarks import host_cost


def test_per_call_us_reads_the_host_before_the_final_sync():
    """A call that takes 2 ms of host time and a final sync that waits 30 ms (a GPU still busy):
    host counts the calls only, wall both, each divided by the number of calls."""
    syncs = []

    def sync():
        syncs.append(time.perf_counter())
        if len(syncs) == 2:
            time.sleep(0.03)

    host, wall = host_cost.per_call_us(lambda: time.sleep(0.002), 5, sync)
    assert len(syncs) == 2
    assert 2000 <= host < 10000, host
    assert wall >= host + 30000 / 5, (host, wall)


def _point(paths):
    return {"d": 64, "causal": True, "n": 1024, "paths": paths}


def test_table_says_which_path_the_host_bounds():
    nan = float("nan")
    text = host_cost.table(
        [
            _point(
                {
                    "teaching forward": {"do_bench": 337.3, "host": 266.4, "graph": 229.6},
                    "cuDNN forward": {"do_bench": 203.0, "host": 56.2, "graph": 208.3},
                    "cuDNN + grad": {"do_bench": 900.0, "host": 120.0, "graph": nan},
                }
            )
        ]
    )
    lines = text.splitlines()
    assert lines[0] == "| d | causal | N | path | do_bench | host | graph | host-bound |"
    assert "| 64 | True | 1024 | teaching forward | 337 | 266 | 230 | yes |" in lines
    assert "| 64 | True | 1024 | cuDNN forward | 203 | 56 | 208 | no |" in lines
    assert "| 64 | True | 1024 | cuDNN + grad | 900 | 120 | n/a | n/a |" in lines


def test_a_failing_path_is_recorded_not_raised(monkeypatch):
    monkeypatch.setattr(host_cost.torch.cuda, "synchronize", lambda: None)
    logged = []

    def refuses():
        raise ValueError("needs a Hopper GPU")

    result = host_cost.measure(refuses, 3, logged.append, "Gluon forward")
    assert all(math.isnan(result[key]) for key in host_cost.TIMINGS)
    assert "needs a Hopper GPU" in result["error"]
    assert "Gluon forward: FAILED: ValueError: needs a Hopper GPU" in logged[0]


def test_calls_must_be_positive():
    with pytest.raises(SystemExit):
        host_cost.main(["--calls", "0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path, capsys):
    assert host_cost.main(["--out", str(tmp_path), "--results", str(tmp_path / "R.md")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "R.md").exists()
