"""The warp-specialized Gluon backward (backward_ws) against the course backward and SDPA's.

    python -m benchmarks.backward_ws --out DIR --results DIR/RESULTS.md

The grid of benchmarks.attention (batch * N = 16k tokens, heads * d = 2048, bf16). At each point one
forward (the autograd function's) gives out and lse; then the backward alone of every variant: the
course's three autotuned kernels (`flash_attention_bwd`), the Gluon kernel's variants (`sN`: an
N-slot Q/dO ring; `split`: at d = 128 the warpgroups share dS^T and each adds half of dQ_i's
columns, `own`: each adds its own keys' part; `m128`: 128-query steps at d = 64; `-lag`: each step's
dQ one step late from two dS^T buffers; `P-`: persistent programs, each taking its next key tile
from a counter; `-dealt`: their tiles dealt in advance instead; `-st`: their dK and dV by the
threads' stores, not the TMA; `-tma`: one program a key tile with them through the TMA; `variants`
lists them), and SDPA's flash, cuDNN and efficient backends (torch.autograd.grad on a kept graph).
Each variant's dq, dk, dv are checked against SDPA's before timing; then all are timed 1 + --rounds
times in rotating order (median kept). TFLOP/s count five N^2 d products (2.5 times the forward's
FLOPs) for every variant. The table goes last on stdout, to DIR/backward_ws.json and to a markdown
section appended to --results. Without a Hopper GPU it says so and exits 0.
"""

from __future__ import annotations

import functools

import torch

from benchmarks.attention import (
    BWD_FACTOR,
    CHECK_TOL,
    SDPA_BACKENDS,
    attention_flops,
    fmt,
    geomean,
    rel_diff,
    sdpa_fn,
    time_in_rounds,
    time_ms,
)
from benchmarks.forward_ws import run_hopper_grid


def variants(d: int) -> list[tuple[str, dict]]:
    """(name, options of flash_attention_bwd_ws) timed at head dimension d. `m128`: 128-query steps
    (d = 64; the default there); `-lag`: two dS^T buffers, each step's dQ one step late; `P-`:
    persistent programs (one per SM, each taking its next key tile from a counter, head by head, at
    every point: `dynamic=True`), the others one program per key tile; `-dealt`: persistent with the
    tiles dealt in advance (`dynamic=False`); `-k1`: persistent with one K buffer (the others two:
    the next tile's K loaded early, the lag carried across tiles); `-st`: persistent with dK and dV
    stored by the threads (the others' persistent programs copy them out by the TMA, `dkdv_tma`);
    `-tma`: one program a key tile with dK and dV copied out by the TMA (the others of its kind
    store them)."""
    tiles = {"persistent": False}
    if d == 128:
        return [
            ("split-s2", {"num_slots": 2, "dq_split": True, "dq_lag": False, **tiles}),
            ("own-s2", {"num_slots": 2, "dq_split": False, "dq_lag": False, **tiles}),
            ("split-s2-lag", {"num_slots": 2, "dq_split": True, "dq_lag": True, **tiles}),
            ("split-s2-tma", {"num_slots": 2, "dq_split": True, "dq_lag": False,
                              "dkdv_tma": True, **tiles}),
            ("split-s2-lag-tma", {"num_slots": 2, "dq_split": True, "dq_lag": True,
                                  "dkdv_tma": True, **tiles}),
            ("P-split-s2-lag-k1", {"num_slots": 2, "dq_split": True, "dq_lag": True,
                                   "persistent": True, "k_bufs": 1, "dynamic": True}),
            ("P-split-s2-lag", {"num_slots": 2, "dq_split": True, "dq_lag": True,
                                "persistent": True, "k_bufs": 2, "dynamic": True}),
            ("P-split-s2-lag-dealt", {"num_slots": 2, "dq_split": True, "dq_lag": True,
                                      "persistent": True, "k_bufs": 2, "dynamic": False}),
            ("P-split-s2-lag-st", {"num_slots": 2, "dq_split": True, "dq_lag": True,
                                   "persistent": True, "k_bufs": 2, "dkdv_tma": False,
                                   "dynamic": True}),
        ]  # fmt: skip
    persistent_lag = {
        "num_slots": 2, "block_m": 128, "dq_lag": True, "persistent": True, "dynamic": True
    }  # fmt: skip
    return [
        ("m128-s2", {"num_slots": 2, "block_m": 128, "dq_lag": False, **tiles}),
        ("m128-s3", {"num_slots": 3, "block_m": 128, "dq_lag": False, **tiles}),
        ("m128-s2-lag", {"num_slots": 2, "block_m": 128, "dq_lag": True, **tiles}),
        (
            "m128-s2-lag-tma",
            {"num_slots": 2, "block_m": 128, "dq_lag": True, "dkdv_tma": True, **tiles},
        ),
        ("s2", {"num_slots": 2, "block_m": 64, "dq_lag": False, **tiles}),
        ("P-m128-s2-lag-k1", {**persistent_lag, "k_bufs": 1}),
        ("P-m128-s2-lag", {**persistent_lag, "k_bufs": 2}),
        ("P-m128-s2-lag-dealt", {**persistent_lag, "k_bufs": 2, "dynamic": False}),
        ("P-m128-s2-lag-st", {**persistent_lag, "k_bufs": 2, "dkdv_tma": False}),
    ]


def is_gluon(name: str) -> bool:
    return name not in ("course", *SDPA_BACKENDS)


def bench_point(d, causal, n, batch, heads, log, rounds: int = 3) -> dict | None:
    from course_utils.triton_attention.autograd import _forward
    from course_utils.triton_attention.backward import flash_attention_bwd
    from course_utils.triton_attention.hopper.backward_ws import flash_attention_bwd_ws

    gen = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * int(causal) + n)
    q, k, v, do = (
        torch.randn(batch, heads, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(4)
    )
    flops = BWD_FACTOR * attention_flops(batch, heads, n, d, causal)
    log(f"d={d} causal={causal} N={n} B={batch} H={heads}: {flops / 1e12:.2f} TFLOP backward")
    out, lse = _forward(q, k, v, causal, None)
    fns = {"course": lambda: flash_attention_bwd(do, q, k, v, out, lse, causal)}
    for name, options in variants(d):
        fns[name] = functools.partial(
            flash_attention_bwd_ws, do, q, k, v, out, lse, causal, **options
        )
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = None
    for name in SDPA_BACKENDS:
        try:
            out_b = sdpa_fn(name, qg, kg, vg, causal)()
        except RuntimeError as e:
            log(f"    {name:<10} FAILED: {str(e).splitlines()[0][:120]}")
            continue
        fns[name] = functools.partial(
            torch.autograd.grad, out_b, (qg, kg, vg), do, retain_graph=True
        )
        if ref is None:
            ref = fns[name]()
    if ref is None:
        log("    no SDPA backend ran; skipping this point")
        return None
    results = {}
    for name, fn in fns.items():
        try:
            grads = fn()
            torch.cuda.synchronize()
            diff = max(rel_diff(x, r) for x, r in zip(grads, ref, strict=True))
            if not diff < CHECK_TOL:
                log(f"    {name:<10} WRONG: relative difference to SDPA {diff:.1e}; not timed")
                results[name] = {"error": "wrong", "diff": diff, "tflops": float("nan")}
                continue
            results[name] = {"diff": diff, "ms": time_ms(fn)}
        except Exception as e:  # a refused shape, a compile error: record and go on
            log(f"    {name:<10} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            results[name] = {"error": str(e), "tflops": float("nan")}
    time_in_rounds(fns, results, flops, rounds, log)
    return {"d": d, "causal": causal, "n": n, "batch": batch, "heads": heads, "results": results}


def table(points) -> str:
    names = []
    for p in points:
        names += [k for k in p["results"] if k not in names]
    order = ["course", *[n for n in names if is_gluon(n)], *SDPA_BACKENDS]
    names = [n for n in order if n in names]
    head = ["d", "causal", "N", *names, "best/cuDNN", "best/flash", "best/course"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {"cudnn": [], "flash": [], "course": []}
    for p in points:
        r = p["results"]
        best = max((v["tflops"] for k, v in r.items() if is_gluon(k)), default=float("nan"))
        cells = [p["d"], p["causal"], p["n"]]
        cells += [fmt(r.get(n, {}).get("tflops", float("nan"))) for n in names]
        for key in ratios:
            x = best / r.get(key, {}).get("tflops", float("nan"))
            cells.append(fmt(x, 2))
            if x == x:
                ratios[key].append(x)
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    for key, values in ratios.items():
        if values:
            lines.append(
                f"- best Gluon variant / {key}: geometric mean {geomean(values):.2f}, "
                f"lowest {min(values):.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_hopper_grid(
        "backward_ws", __doc__.splitlines()[0], argv, bench_point, table,
        "Warp-specialized Gluon backward (issue 19)",
        "backward TFLOP/s (five N^2 d products) from the median of {timings} timings per "
        "variant, the order rotating between rounds",
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
