"""The warp-specialized Gluon forward (forward_ws) against the course kernel and SDPA's backends.

    python -m benchmarks.forward_ws --out DIR --results DIR/RESULTS.md

The grid of benchmarks.attention (batch * N = 16k tokens, heads * d = 2048, bf16), each point
checked against SDPA's output before it is timed. Variants: the course's autotuned kernel, the
Gluon kernel at the two deepest K/V rings that fit in shared memory, with and without ping-pong
turns (`sN`, `sN-pp`), and SDPA's flash, cuDNN and efficient backends, all in one run, each timed
1 + --rounds times in rotating order (median kept). The table (TFLOP/s, and the best Gluon
variant against cuDNN, flash and the course kernel) goes last on stdout, to DIR/forward_ws.json
and to a markdown section appended to --results. Without a Hopper GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import shlex
import sys
from pathlib import Path

import torch

from benchmarks.attention import (
    SDPA_BACKENDS,
    attention_flops,
    fmt,
    geomean,
    grid,
    measure,
    nvidia_smi,
    sdpa_fn,
    sdpa_reference,
    time_in_rounds,
    versions,
)

HERE = Path(__file__).resolve().parent


def ring_depths(d: int) -> list[int]:
    """The K/V ring depths whose buffers fit in an H200's shared memory at head dimension d."""
    from course_utils.triton_attention.hopper.forward_ws import SHARED_LIMIT, shared_bytes

    return [depth for depth in (2, 3, 4) if shared_bytes(d, depth, False) <= SHARED_LIMIT]


def ratio_columns(points) -> tuple[list[dict], dict]:
    """For each point the best Gluon variant's (`s*`) TFLOP/s over cuDNN's, flash's and the
    course's; their geometric means and minima over the points."""
    rows = []
    for p in points:
        r = p["results"]
        best = max((v["tflops"] for k, v in r.items() if k.startswith("s")), default=float("nan"))
        rows.append({key: best / r[key]["tflops"] for key in ("cudnn", "flash", "course")})
    summary = {}
    for key in ("cudnn", "flash", "course"):
        values = [row[key] for row in rows if row[key] == row[key]]
        summary[key] = (geomean(values), min(values) if values else float("nan"))
    return rows, summary


def table(points) -> str:
    """The markdown table: TFLOP/s of every variant, then the best Gluon variant's ratios."""
    names = sorted({k for p in points for k in p["results"]}, key=_variant_order)
    head = ["d", "causal", "N", *names, "best/cuDNN", "best/flash", "best/course"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows, summary = ratio_columns(points)
    for p, row in zip(points, rows, strict=True):
        cells = [p["d"], p["causal"], p["n"]]
        cells += [fmt(p["results"].get(v, {}).get("tflops", float("nan"))) for v in names]
        cells += [fmt(row[key], 2) for key in ("cudnn", "flash", "course")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    for key, (gm, lo) in summary.items():
        lines.append(f"- best Gluon variant / {key}: geometric mean {gm:.2f}, lowest {lo:.2f}")
    return "\n".join(lines)


def _variant_order(name: str):
    gluon = ["s2", "s2-pp", "s3", "s3-pp", "s4", "s4-pp", "s4-x2", "s4-pp-x2"]
    order = ["course", *gluon, *SDPA_BACKENDS]
    return order.index(name) if name in order else len(order)


def variants(d: int) -> list[tuple[str, dict]]:
    """(name, options) of the Gluon kernel: `sN` an N-slot K/V ring, `-pp` with ping-pong turns;
    the two deepest rings that fit at this d; at d = 64 also `-x2`, two programs an SM (64-key
    steps, 80 registers a thread), the others one program an SM whatever `launch_policy` says.
    Persistent or not as `launch_policy` says."""
    one = [
        (
            f"s{depth}" + ("-pp" if pingpong else ""),
            {"num_slots": depth, "pingpong": pingpong, "programs_per_sm": 1},
        )
        for depth in ring_depths(d)[-2:]
        for pingpong in (False, True)
    ]
    two = [
        (f"s4{'-pp' if pingpong else ''}-x2", {"num_slots": 4, "pingpong": pingpong,
                                               "programs_per_sm": 2})
        for pingpong in (False, True)
    ]  # fmt: skip
    return one + (two if d == 64 else [])


def bench_point(d, causal, n, batch, heads, log, rounds: int = 3) -> dict | None:
    """Check every variant once, then time them all `rounds` more times in turn (the order
    rotating each round, so that no variant always runs first or last); TFLOP/s from the median
    time. Run-to-run differences of up to a tenth between variants timed once each in a fixed
    order (Gluon forward runs 4 and 5) are why."""
    from course_utils.triton_attention import flash_attention_fwd
    from course_utils.triton_attention.hopper.forward_ws import flash_attention_fwd_ws

    gen = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * int(causal) + n)
    q, k, v = (
        torch.randn(batch, heads, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    flops = attention_flops(batch, heads, n, d, causal)
    log(f"d={d} causal={causal} N={n} B={batch} H={heads}: {flops / 1e12:.2f} TFLOP")
    ref = sdpa_reference(q, k, v, causal)
    if ref is None:
        log("    no SDPA backend ran; skipping this point")
        return None
    fns = {"course": lambda: flash_attention_fwd(q, k, v, causal)}
    for name, options in variants(d):
        fns[name] = functools.partial(flash_attention_fwd_ws, q, k, v, causal, **options)
    for name in SDPA_BACKENDS:
        fns[name] = sdpa_fn(name, q, k, v, causal)
    results = {name: measure(name, fn, ref, flops, log) for name, fn in fns.items()}
    time_in_rounds(fns, results, flops, rounds, log)
    return {"d": d, "causal": causal, "n": n, "batch": batch, "heads": heads, "results": results}


def run_hopper_grid(module: str, description: str, argv, bench_point, table, title, legend) -> int:
    """The command line shared by the Gluon benchmarks (this one and benchmarks.backward_ws):
    parse --d --n --causal --rounds --out --results, run bench_point(d, causal, n, batch, heads,
    log, rounds) over the grid, write the JSON to --out/<module>.json and a section titled
    `title` with the `legend` line ({timings}: 1 + rounds) and table(points) to --results."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--rounds", type=int, default=3, help="timings after the first")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--results", type=Path, default=HERE.parent / "docs" / "journal.md")
    args = parser.parse_args(argv)
    command = f"python -m benchmarks.{module} " + shlex.join(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print(f"{module}: needs a Hopper GPU (sm_90); nothing measured")
        return 0
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    device = torch.cuda.get_device_name()

    def log(msg):
        print(msg, flush=True)

    log(f"{device}; {versions()}; clocks: {nvidia_smi('clocks.sm,clocks.max.sm,power.draw')}")
    points = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        point = bench_point(d, causal, n, batch, heads, log, args.rounds)
        if point is not None:
            points.append(point)
    text = table(points)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device": device, "versions": versions(), "command": command, "points": points}
    (args.out / f"{module}.json").write_text(json.dumps(summary, indent=1))
    section = (
        f"\n## {title}, bf16, {device}, {datetime.date.today().isoformat()}\n\n"
        f"- {versions()}\n- command: `{command}`\n- {legend.format(timings=1 + args.rounds)}"
        "\n\n" + text + "\n"
    )
    with open(args.results, "a") as f:
        f.write(section)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_hopper_grid(
        "forward_ws", __doc__.splitlines()[0], argv, bench_point, table,
        "Warp-specialized Gluon forward (issue 19)",
        "TFLOP/s from the median of {timings} timings per variant (the order rotating between "
        "rounds); `sN`: the Gluon kernel with an N-slot K/V ring, `-pp` with ping-pong turns, "
        "persistent or not as `launch_policy` says",
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
