"""The decode benchmarks' CPU parts: the occupancy arithmetic, the profiler's step split, and a
clear exit without a GPU."""

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


@pytest.mark.parametrize("order", ["shuffled", "ordered"])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("page", [16, 64])
def test_page_cache_puts_every_token_where_the_table_says(layout, page, order):
    """The benchmark's paged cache, built on CPU: token t of sequence b, head h is in
    cache[table[b, t // page], t % page, h], in either storage layout."""
    gen = torch.Generator().manual_seed(page)
    k, v = (torch.randn(2, 3, 128, 8, generator=gen) for _ in range(2))
    k_cache, v_cache, table = decode.page_cache(k, v, page, gen, layout, order)
    assert k_cache.shape == (2 * 128 // page, page, 3, 8) and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(2 * 128 // page))  # a permutation
    in_order = table.flatten().tolist() == list(range(2 * 128 // page))
    assert in_order == (order == "ordered")
    if layout == "hnd":  # one head's page is contiguous
        assert k_cache.stride(1) == 8 and k_cache.stride(2) == page * 8
    t = torch.arange(128)
    for b in range(2):
        for cache, x in ((k_cache, k), (v_cache, v)):
            got = cache[table[b, t // page].long(), t % page]  # (128, heads, d)
            assert torch.equal(got.permute(1, 0, 2), x[b])
    with pytest.raises(ValueError, match="layout must be 'nhd' or 'hnd'"):
        decode.page_cache(k, v, page, gen, "nchw")
    with pytest.raises(ValueError, match="order must be 'shuffled' or 'ordered'"):
        decode.page_cache(k, v, page, gen, layout, "sorted")


def test_decode_profile_splits_the_kernels_into_steps_at_each_flush():
    from types import SimpleNamespace as NS

    from benchmarks import decode_profile as prof

    def kernel(name, start, end):
        return NS(
            name=name,
            time_range=NS(start=start, end=end),
            device_type=prof.torch.autograd.DeviceType.CUDA,
        )

    host = NS(name="cudaLaunchKernel", time_range=NS(start=0, end=1), device_type=None)
    events = [
        kernel("merge", 60.0, 62.0), kernel("flush", 0.0, 10.0), kernel("partials", 11.0, 58.0),
        kernel("flush", 100.0, 110.0), kernel("partials", 112.0, 160.0), host,
        kernel("merge", 163.0, 164.0), kernel("stray", -5.0, -1.0),
    ]  # fmt: skip
    steps = prof.step_kernels(events, {"flush"})
    assert [[k[0] for k in s] for s in steps] == [["partials", "merge"], ["partials", "merge"]]
    lines = prof.summarize(steps)
    assert "partials" in lines[0] and "47.50 us" in lines[0]  # median of 47 and 48
    assert "merge" in lines[1] and "gap before it   2.50 us" in lines[1]  # median of 2 and 3
    assert "first start to last end:    51.50 us" in lines[2]  # median of 51 and 52
    assert prof.short("x" * 60 + "(int)") == "x" * 45 + "..."


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU machine gets")
def test_decode_profile_without_a_gpu_exits_2(capsys):
    from benchmarks import decode_profile

    assert decode_profile.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
