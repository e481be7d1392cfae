"""The warp-specialized Gluon forward (forward_ws) against the course kernel and SDPA's backends.

    python -m benchmarks.forward_ws --out DIR --results DIR/RESULTS.md

The grid of benchmarks.attention (batch * N = 16k tokens, heads * d = 2048, bf16), each point
checked against SDPA's output before it is timed. Variants: the course's autotuned kernel, the
Gluon kernel at each K/V ring depth that fits in shared memory (`ws-sN`), and SDPA's flash, cuDNN
and efficient backends, all in one run. The table (TFLOP/s, and the best ring depth against cuDNN,
flash and the course kernel) goes last on stdout, to DIR/forward_ws.json and to a markdown
section appended to --results. Without a Hopper GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
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
    versions,
)

HERE = Path(__file__).resolve().parent


def ring_depths(d: int) -> list[int]:
    """The K/V ring depths whose buffers fit in an H200's shared memory at head dimension d."""
    from course_utils.triton_attention.forward_ws import SHARED_LIMIT, shared_bytes

    return [depth for depth in (2, 3, 4) if shared_bytes(d, depth, False) <= SHARED_LIMIT]


def ratio_columns(points) -> tuple[list[dict], dict]:
    """For each point the default launch's (`ws`) TFLOP/s over cuDNN's, flash's and the
    course's, and the best ws variant's over cuDNN's; their geometric means and minima."""
    rows = []
    for p in points:
        r = p["results"]
        ws = r["ws"]["tflops"]
        best = max((v["tflops"] for k, v in r.items() if k.startswith("ws")), default=float("nan"))
        rows.append(
            {
                "cudnn": ws / r["cudnn"]["tflops"],
                "flash": ws / r["flash"]["tflops"],
                "course": ws / r["course"]["tflops"],
                "best/cudnn": best / r["cudnn"]["tflops"],
            }
        )
    summary = {}
    for key in ("cudnn", "flash", "course", "best/cudnn"):
        values = [row[key] for row in rows if row[key] == row[key]]
        summary[key] = (geomean(values), min(values) if values else float("nan"))
    return rows, summary


def table(points) -> str:
    names = sorted({k for p in points for k in p["results"]}, key=_variant_order)
    head = ["d", "causal", "N", *names, "ws/cuDNN", "ws/flash", "ws/course", "best/cuDNN"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows, summary = ratio_columns(points)
    for p, row in zip(points, rows, strict=True):
        cells = [p["d"], p["causal"], p["n"]]
        cells += [fmt(p["results"].get(v, {}).get("tflops", float("nan"))) for v in names]
        cells += [fmt(row[key], 2) for key in ("cudnn", "flash", "course", "best/cudnn")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    for key, (gm, lo) in summary.items():
        name = key if "/" in key else f"ws/{key}"
        lines.append(f"- {name}: geometric mean {gm:.2f}, lowest {lo:.2f}")
    return "\n".join(lines)


def _variant_order(name: str):
    order = ["course", "ws", "ws-pp", "ws-alt-s2", "ws-alt-s3", *SDPA_BACKENDS]
    return order.index(name) if name in order else len(order)


def variants(d: int, n: int, causal: bool) -> list[tuple[str, dict]]:
    """(name, options): `ws` launches as `launch_policy` says (what the autograd function runs),
    `ws-pp` the same with ping-pong turns, `ws-alt` with the other ring depth."""
    from course_utils.triton_attention.forward_ws import launch_policy

    policy = launch_policy(d, n, n, causal)
    other = {2: 3, 3: 2, 4: 3}[policy.num_slots]
    return [
        ("ws", {}),
        ("ws-pp", {"pingpong": True}),
        (f"ws-alt-s{other}", {"num_slots": other}),
    ]


def bench_point(d, causal, n, batch, heads, log) -> dict | None:
    from course_utils.triton_attention import flash_attention_fwd
    from course_utils.triton_attention.forward_ws import flash_attention_fwd_ws

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
    results = {"course": measure("course", lambda: flash_attention_fwd(q, k, v, causal), ref,
                                 flops, log)}  # fmt: skip
    for name, options in variants(d, n, causal):

        def run(options=options):
            return flash_attention_fwd_ws(q, k, v, causal, **options)

        results[name] = measure(name, run, ref, flops, log)
    for name in SDPA_BACKENDS:
        results[name] = measure(name, sdpa_fn(name, q, k, v, causal), ref, flops, log)
    return {"d": d, "causal": causal, "n": n, "batch": batch, "heads": heads, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.forward_ws " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_ws: needs a Hopper GPU (sm_90); nothing measured")
        return 0
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    device = torch.cuda.get_device_name()

    def log(msg):
        print(msg, flush=True)

    log(f"{device}; {versions()}; clocks: {nvidia_smi('clocks.sm,clocks.max.sm,power.draw')}")
    points = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        point = bench_point(d, causal, n, batch, heads, log)
        if point is not None:
            points.append(point)
    text = table(points)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device": device, "versions": versions(), "command": command, "points": points}
    (args.out / "forward_ws.json").write_text(json.dumps(summary, indent=1))
    section = (
        f"\n## Warp-specialized Gluon forward (issue 19), bf16, {device}, "
        f"{datetime.date.today().isoformat()}\n\n- {versions()}\n- command: `{command}`\n"
        "- TFLOP/s; `ws`: the Gluon kernel launched as `forward_ws.launch_policy` says (what the "
        "autograd function runs); `ws-pp`: the same with ping-pong turns; `ws-alt-sN`: with an "
        "N-slot K/V ring instead\n\n" + text + "\n"
    )
    with open(args.results, "a") as f:
        f.write(section)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
