"""The decode benchmarks' CPU parts: the occupancy arithmetic, and a clear exit without a GPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks import decode, decode_splits


def test_programs_per_sm_takes_the_tightest_limit():
    # the partials kernel on the H200 (decode run 8): 90 registers, 21,632 B of shared memory,
    # 4 warps -> shared memory allows 10, registers 5 (90 -> 96 per thread, 12,288 per program)
    assert decode_splits.programs_per_sm(90, 21632, 4) == 5
    # 116 registers (-> 120), 39,168 B: registers allow 4, shared memory 5
    assert decode_splits.programs_per_sm(116, 39168, 4) == 4
    # shared memory the limit: 72 KB a program -> 3
    assert decode_splits.programs_per_sm(64, 72192, 4) == 3
    # threads the limit: 16 warps a program, 2,048 threads an SM -> 4
    assert decode_splits.programs_per_sm(16, 0, 16) == 4
    # an sm_75 (T4): 64 KB of shared memory, 1,024 threads
    assert (
        decode_splits.programs_per_sm(64, 21632, 4, shared_per_sm=65536, threads_per_sm=1024) == 2
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU machine gets")
@pytest.mark.parametrize("module", [decode, decode_splits])
def test_without_a_gpu_the_benchmarks_say_so(module, capsys):
    assert module.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
