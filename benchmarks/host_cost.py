"""Host cost per call against GPU time: is a path bound by the kernels or by the Python that
launches them?

    python -m benchmarks.host_cost --n 1024 --out DIR --results DIR/RESULTS.md

At each point of the benchmarks.attention grid (bf16; by default the 1k points, where a forward
runs 170 to 360 us on an H200), every path is timed three ways:

- `do_bench`: `triton.testing.do_bench`'s median, as the other benchmarks time it;
- host: `--calls` calls in a row, the clock read before the final synchronize: the host's
  enqueue time a call (Python, argument handling, launches). Above the GPU time, the host bounds
  the path, and `do_bench` measures the host;
- graph: the replay of a CUDA graph of one call, timed by `do_bench`: the GPU's time alone.

Paths: the teaching forward (`launch_flash_attention_fwd`), the Gluon forward where it takes the
shape, the autograd function's forward (`autograd._forward`), SDPA's cuDNN forward; the course
backward, the Gluon backward, the autograd function's backward (`autograd._backward`); and a
forward plus `torch.autograd.grad` through `flash_attention` and through SDPA's cuDNN backend.
A path a GPU cannot run, or whose capture fails, gets n/a and the reason in the log. The table
(microseconds a call) goes last on stdout, to DIR/host_cost.json and to a markdown section
appended to --results. Needs a CUDA GPU (exit 2 without one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.attention import HERE, fmt, grid, sdpa_fn, time_ms, versions
from benchmarks.decode import graphed

TIMINGS = ("do_bench", "host", "graph")


def per_call_us(fn, calls: int, sync) -> tuple[float, float]:
    """(host, wall) in microseconds a call: `calls` calls of fn in a row after sync(); host is
    read before the final sync(), wall after it."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    sync()
    done = time.perf_counter()
    return (enqueued - start) / calls * 1e6, (done - start) / calls * 1e6


def bench_us(fn) -> float:
    return time_ms(fn) * 1e3


def paths(d: int, causal: bool, n: int, batch: int, heads: int) -> dict:
    """{name: zero-argument call} at one point; a None call: the path does not take the shape."""
    from course_utils.triton_attention import autograd, flash_attention
    from course_utils.triton_attention.backward import flash_attention_bwd
    from course_utils.triton_attention.forward import launch_flash_attention_fwd
    from course_utils.triton_attention.hopper import backward_ws, forward_ws

    gen = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * int(causal) + n)
    q, k, v, do = (
        torch.randn(batch, heads, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(4)
    )
    out, lse = autograd._forward(q, k, v, causal, None)
    gluon = forward_ws.supported(q, k, v, causal) is None
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    cudnn = sdpa_fn("cudnn", qg, kg, vg, causal)

    def course_fwd_bwd():
        return torch.autograd.grad(flash_attention(qg, kg, vg, causal), (qg, kg, vg), do)

    def cudnn_fwd_bwd():
        return torch.autograd.grad(cudnn(), (qg, kg, vg), do)

    return {
        "teaching forward": lambda: launch_flash_attention_fwd(q, k, v, causal),
        "Gluon forward": (lambda: forward_ws.flash_attention_fwd_ws(q, k, v, causal))
        if gluon
        else None,
        "autograd forward": lambda: autograd._forward(q, k, v, causal, None),
        "cuDNN forward": sdpa_fn("cudnn", q, k, v, causal),
        "course backward": lambda: flash_attention_bwd(do, q, k, v, out, lse, causal),
        "Gluon backward": (
            lambda: backward_ws.flash_attention_bwd_ws(do, q, k, v, out, lse, causal)
        )
        if gluon
        else None,
        "autograd backward": lambda: autograd._backward(do, q, k, v, out, lse, causal, None),
        "flash_attention + grad": course_fwd_bwd,
        "cuDNN + grad": cudnn_fwd_bwd,
    }


def measure(fn, calls: int, log, name: str) -> dict:
    """do_bench, host and graph microseconds of fn (each NaN where it failed, with the reason)."""
    nan = float("nan")
    result = {key: nan for key in TIMINGS}
    try:
        fn()  # first call: compiles, autotunes
        torch.cuda.synchronize()
        result["do_bench"] = bench_us(fn)
        result["host"], result["wall"] = per_call_us(fn, calls, torch.cuda.synchronize)
    except Exception as e:  # a refused shape, a compile error: record and go on
        log(f"    {name}: FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return {**result, "error": str(e)}
    try:
        result["graph"] = bench_us(graphed(fn))  # warmed up on a side stream, then captured
    except Exception as e:  # a path that cannot be captured: its other timings stand
        log(f"    {name}: no graph: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        result["graph_error"] = str(e)
    log(
        f"    {name:<24} do_bench {result['do_bench']:8.1f}  host {result['host']:8.1f}  "
        f"graph {result['graph']:8.1f} us"
    )
    return result


def profile(fn, calls: int, top: int = 30) -> str:
    """cProfile of `calls` calls of fn (after one warm-up call): the `top` functions by their own
    time, so a host-bound path shows which Python work to cache or move out of the call."""
    import cProfile
    import io
    import pstats

    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(top)
    return stream.getvalue()


def table(points: list[dict]) -> str:
    """Markdown: one row a point and path, microseconds a call, and whether the host bounds it
    (host enqueue above the graph's GPU time)."""
    lines = [
        "| d | causal | N | path | do_bench | host | graph | host-bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        for name, r in p["paths"].items():
            measured = r["host"] == r["host"] and r["graph"] == r["graph"]  # neither NaN
            bound = r["host"] > r["graph"] if measured else None
            cells = [p["d"], p["causal"], p["n"], name]
            cells += [fmt(r[key]) for key in TIMINGS]
            cells.append("n/a" if bound is None else ("yes" if bound else "no"))
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--n", type=int, nargs="+", default=[1024])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--calls", type=int, default=200, help="calls in a row for `host`")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="CALLS",
        help="also profile the autograd paths over CALLS calls (cProfile, to DIR/host_profile.txt)",
    )
    parser.add_argument("--results", type=Path, default=HERE.parent / "docs" / "journal.md")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    if not torch.cuda.is_available():
        print("benchmarks.host_cost needs a CUDA GPU; there is none here.", file=sys.stderr)
        return 2
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    device = torch.cuda.get_device_name()
    print(f"{device}; {versions()}", flush=True)
    points = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        print(f"d={d} causal={causal} N={n} B={batch} H={heads}", flush=True)
        results = {}
        point_paths = paths(d, causal, n, batch, heads)
        for name, fn in point_paths.items():
            if fn is not None:
                results[name] = measure(fn, args.calls, print, name)
        if args.profile:
            args.out.mkdir(parents=True, exist_ok=True)
            with open(args.out / "host_profile.txt", "a") as f:
                for name in ("autograd forward", "autograd backward", "flash_attention + grad"):
                    f.write(f"\n==== d={d} causal={causal} N={n}: {name}\n")
                    f.write(profile(point_paths[name], args.profile))
        points.append({"d": d, "causal": causal, "n": n, "paths": results})
    text = table(points)
    command = "python -m benchmarks.host_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device": device, "versions": versions(), "command": command, "points": points}
    (args.out / "host_cost.json").write_text(json.dumps(summary, indent=1))
    with open(args.results, "a") as f:
        f.write(
            f"\n## Host cost per call, bf16, {device}, {datetime.date.today().isoformat()}\n\n"
            f"- {versions()}\n- command: `{command}`\n- microseconds a call: do_bench's "
            f"median; host, {args.calls} calls enqueued in a row; graph, a CUDA graph's "
            "replay (the GPU alone)\n\n" + text + "\n"
        )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
