"""Where a decode step's time goes: every kernel of the step on the device, ours and cuDNN's.

`benchmarks.decode` times a whole step (a CUDA graph replay between two events, L2 flushed
before each). This script opens the step up with the profiler (CUPTI): for flash_decode and for
SDPA's cuDNN backend, each as a CUDA graph replay after the same L2 flush, it lists the kernels
the step runs with their mean device time, the gaps between them, and the span from the first
kernel's start to the last one's end, beside the event-timed step (`triton.testing.do_bench`).
If the course step and cuDNN's differ by a microsecond, this says whether it is in the partials
kernel, the merge, or between them.

    python -m benchmarks.decode_profile [--points 1,32,8192 ...] [--page-size 16]
        [--layout nhd] [--q-heads 32] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.decode import D, graphed, paged_inputs, sdpa_runner, time_ms

L2_FLUSH_BYTES = 256 * 2**20  # what triton.testing.do_bench zeroes before each timed call


def short(name: str, width: int = 48) -> str:
    """A kernel's name cut to `width` characters (cuDNN's are hundreds long)."""
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def is_kernel(event) -> bool:
    return getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA


def step_kernels(events, flush_names: set[str]) -> list[list[tuple[str, float, float]]]:
    """The profiler's kernels split into steps: each flush kernel starts a new step; returns per
    step the (name, start_us, end_us) of its kernels in start order."""
    kernels = sorted(
        ((e.name, e.time_range.start, e.time_range.end) for e in events if is_kernel(e)),
        key=lambda k: k[1],
    )
    steps: list[list[tuple[str, float, float]]] = []
    for name, start, end in kernels:
        if name in flush_names:
            steps.append([])
        elif steps:
            steps[-1].append((name, start, end))
    return [s for s in steps if s]


def summarize(steps) -> list[str]:
    """Per kernel position in the step: mean duration and the mean gap before it; the span."""
    lines = []
    width = min(len(s) for s in steps)
    for i in range(width):
        durations = [s[i][2] - s[i][1] for s in steps]
        gaps = [s[i][1] - s[i - 1][2] for s in steps] if i else [0.0]
        lines.append(
            f"    kernel {i}: {short(steps[0][i][0]):<48} {statistics.median(durations):8.2f} us"
            + (f"   gap before it {statistics.median(gaps):6.2f} us" if i else "")
        )
    spans = [s[width - 1][2] - s[0][1] for s in steps]
    lines.append(f"    first start to last end: {statistics.median(spans):8.2f} us (median)")
    return lines


def profile(fn, steps: int) -> list[list[tuple[str, float, float]]]:
    """`steps` calls of fn, each after an L2 flush, under the profiler; the kernels by step."""
    activities = [torch.profiler.ProfilerActivity.CUDA]
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    with torch.profiler.profile(activities=activities) as prof:  # the flush's kernel, named
        flush.zero_()
        torch.cuda.synchronize()
    flush_names = {e.name for e in prof.events() if is_kernel(e)}
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    return step_kernels(prof.events(), flush_names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=["1,32,8192"], metavar="B,KVH,N")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--layout", choices=["nhd", "hnd"], default="nhd", help="see page_cache")
    parser.add_argument(
        "--order", choices=["shuffled", "ordered"], default="shuffled", help="see page_cache"
    )
    parser.add_argument(
        "--q-heads", type=int, help="query heads (default 32, or kv_heads if 32 is no multiple)"
    )
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.decode_profile needs a CUDA GPU; there is none here.", file=sys.stderr)
        return 2
    from course_utils.triton_attention import flash_decode
    from course_utils.triton_attention.decode import choose_num_splits

    gen = torch.Generator(device="cuda").manual_seed(0)
    for text in args.points:
        batch, kv_heads, n = (int(x) for x in text.split(","))
        q_heads = args.q_heads or (32 if 32 % kv_heads == 0 else kv_heads)
        q, k_cache, v_cache, table, lens, k, v = paged_inputs(
            batch, kv_heads, n, args.page_size, gen, args.layout, q_heads, args.order
        )
        kv_bytes = 2 * batch * kv_heads * n * D * 2
        flash_decode(q, k_cache, v_cache, table, lens)  # checks the inputs once, compiles
        variants = {
            "course": lambda q=q, kc=k_cache, vc=v_cache, t=table, lens=lens: flash_decode(
                q, kc, vc, t, lens, check_values=False
            ),
            "cudnn": sdpa_runner("cudnn", q, k, v)[0],
        }
        splits = choose_num_splits(batch, kv_heads, n, args.page_size)
        print(
            f"batch {batch}, q_heads {q_heads}, kv_heads {kv_heads}, N {n}, page "
            f"{args.page_size} {args.layout}, {splits} splits",
            flush=True,
        )
        for name, fn in variants.items():
            replay = graphed(fn)
            ms = time_ms(replay)
            steps = profile(replay, args.steps)
            print(f"  {name}: do_bench {ms * 1e3:.2f} us ({kv_bytes / ms / 1e6:.0f} GB/s)")
            if not steps:
                print("    (the profiler recorded no kernel of the step)")
                continue
            print("\n".join(summarize(steps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
