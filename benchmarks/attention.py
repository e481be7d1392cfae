"""Attention on the GPU: the course's Triton kernels against PyTorch SDPA's backends.

    python -m benchmarks.attention                        # the forward, the grid below, bf16
    python -m benchmarks.attention --learner mod:func     # add a learner's kernel, same signature
    python -m benchmarks.attention --sweep                # also time each launch config by hand
    python -m benchmarks.attention --backward             # forward + backward (autograd) instead
    python -m benchmarks.attention --learner-backward mod:FlashAttentionTriton  # yours, fwd + bwd

Grid, as in the FlashAttention-2 paper's benchmarks: batch * N = 16k tokens, hidden
2048 = heads * d, d in {64, 128}, N in {1k, 4k, 16k}, causal and not. Work: 4 * B * H * N^2 * d
FLOPs (the two matmuls), half of it when causal. Each variant's output is checked against SDPA's
before it is timed; a time is the median of triton.testing.do_bench after a warm-up (autotuning
included), and each variant is timed 1 + --rounds times in rotating order, the median kept.

--backward times the course's autograd function (`flash_attention`) and SDPA's backends with
autograd: forward + backward (a fresh forward, then torch.autograd.grad) and the backward alone
(torch.autograd.grad on one kept graph, retain_graph=True), each measured, not subtracted. The
backward's work is counted as 2.5 times the forward's (five N^2 d products: S, dP, dV, dQ, dK,
though the course kernels do seven, S and dP twice); so fwd+bwd TFLOP/s = 3.5 * forward FLOPs /
time and bwd TFLOP/s = 2.5 * forward FLOPs / time. Output and gradients are checked against
SDPA's before timing.

Writes the table last on stdout, a plot (--plot), the raw numbers as JSON and a markdown section
(--out), and appends that section to docs/journal.md (--results). Without a CUDA GPU it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEVICE = "cuda"
TOKENS = 16 * 1024  # batch * N
HIDDEN = 2048  # heads * d
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}
CHECK_TOL = 2e-2  # relative difference to SDPA's output; both are bf16 kernels (~3e-3 apart)


def attention_flops(batch: int, heads: int, n: int, d: int, causal: bool) -> float:
    """4 * B * H * N^2 * d: S = q k^T and out = P v, 2 FLOPs per multiply-add; half if causal."""
    flops = 4.0 * batch * heads * n * n * d
    return flops / 2 if causal else flops


def grid(head_dims, lengths, causals):
    """(d, causal, N, batch, heads) for each point: batch * N = TOKENS, heads * d = HIDDEN."""
    return [
        (d, causal, n, TOKENS // n, HIDDEN // d)
        for d in head_dims
        for causal in causals
        for n in lengths
    ]


def rel_diff(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    return float("inf") if torch.isnan(x).any() else ((x - ref).norm() / ref.norm()).item()


def time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rotate_rounds(fns: dict, first: dict, rounds: int) -> dict:
    """{label: [first time, then `rounds` more]} in ms: each round times every fns[label] whose
    label is in `first`, the order rotating one step a round so that none always runs first or
    last. Variants timed once each in a fixed order differed by up to a tenth from run to run on
    the H200 (Gluon forward runs 4 and 5)."""
    labels = list(first)
    times = {label: [first[label]] for label in labels}
    for r in range(rounds if labels else 0):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            times[label].append(time_ms(fns[label]))
    return times


def keep_median(entry: dict, times: list, flops: float, prefix: str = "") -> None:
    """entry[prefix + "ms"], the median of times; prefix + "tflops" for `flops` of work in it;
    prefix + "ms_all", every time."""
    ms = statistics.median(times)
    entry.update(
        {f"{prefix}ms": ms, f"{prefix}tflops": flops / ms * 1e-9, f"{prefix}ms_all": times}
    )


def time_in_rounds(fns: dict, results: dict, flops: float, rounds: int, log) -> None:
    """`rotate_rounds` over each variant of `results` with a first time ("ms", from `measure`);
    keep the median (ms, tflops; every time in ms_all)."""
    first = {n: r["ms"] for n, r in results.items() if "error" not in r and n in fns}
    for name, times in rotate_rounds(fns, first, rounds).items():
        keep_median(results[name], times, flops)
    if rounds and first:
        log("    median of rounds: " + ", ".join(f"{n} {results[n]['tflops']:.0f}" for n in first))


def nvidia_smi(query: str) -> str:
    cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"


CLOCKS = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu"


def sdpa_fn(backend_name: str, q, k, v, causal: bool):
    """A zero-argument call of SDPA restricted to one backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name])

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def sdpa_reference(q, k, v, causal: bool):
    """The output of the first SDPA backend that runs on these inputs (None if none does): the
    reference every variant of a point is checked against."""
    for name in SDPA_BACKENDS:
        try:
            return sdpa_fn(name, q, k, v, causal)()
        except RuntimeError:  # this backend refuses the shape: the next one
            continue
    return None


def load_learner(spec: str, option: str = "--learner"):
    module_name, _, func_name = spec.partition(":")
    if not func_name:
        raise SystemExit(f"{option} wants module:function, got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"{option} {spec}: cannot load it ({type(e).__name__}: {e})") from None


def learner_autograd(obj, spec: str):
    """f(q, k, v, causal) -> out from a learner's torch.autograd.Function (notebook 08's
    FlashAttentionTriton: forward(ctx, q, k, v, causal, softmax_scale=None)) or a function."""
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        from course_utils.references.gpt import (
            resolve_attention,  # passes softmax_scale=None if it has one
        )

        return resolve_attention(obj)
    if callable(obj):
        return obj
    raise SystemExit(
        f"--learner-backward {spec}: expected a torch.autograd.Function subclass or a function "
        f"(q, k, v, causal) -> out, got {type(obj).__name__}"
    )


def measure(name, fn, ref, flops, log) -> dict:
    """Run fn once (warm-up, autotuning), check it against ref, then time it."""
    try:
        result = fn()
        out = result[0] if isinstance(result, tuple) else result
        torch.cuda.synchronize()
        diff = rel_diff(out, ref)
        if not diff < CHECK_TOL:
            log(f"    {name:<10} WRONG: relative difference to SDPA {diff:.2e}; not timed")
            return {"tflops": float("nan"), "ms": float("nan"), "diff": diff, "error": "wrong"}
        ms = time_ms(fn)
    except Exception as e:  # a backend that refuses a shape, a compile error: record and go on
        log(f"    {name:<10} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return {"tflops": float("nan"), "ms": float("nan"), "diff": float("nan"), "error": str(e)}
    tflops = flops / ms * 1e-9
    log(f"    {name:<10} {ms:8.3f} ms {tflops:7.1f} TFLOP/s  (diff to SDPA {diff:.1e})")
    return {"tflops": tflops, "ms": ms, "diff": diff}


def sweep_configs(d: int):
    """(label, tma, config): each config of the course kernel's autotuning family for this d,
    launched by hand with tensor descriptors (tma) and with pointer loads."""
    from course_utils.triton_attention.forward import CONFIG_FAMILIES, _family, make_config

    for tma in (True, False):
        for block_m, block_n, w, s, regs in CONFIG_FAMILIES[_family(d, torch.bfloat16)]:
            label = f"{'tma' if tma else 'ptr'}-{block_m}x{block_n}-w{w}-s{s}"
            label += f"-r{regs}" if regs else ""
            yield label, tma, make_config(block_m, block_n, w, s, maxnreg=regs)


def geomean(values) -> float:
    values = [v for v in values if v == v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def fmt(x: float, digits: int = 0) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def table(points, variants) -> tuple[str, float, float]:
    """The markdown table; geo-mean course/cudnn and min course/flash. With a learner's
    variant, its ratios to cuDNN and flash too (`ratios` sums them up)."""
    rated = ["course", *(["learner"] if "learner" in variants else [])]
    ratio_head = [f"{name}/{base}" for name in rated for base in ("cuDNN", "flash")]
    head = ["d", "causal", "N", "B x H", *variants, *ratio_head, "config"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        r = p["results"]
        cells = [p["d"], p["causal"], p["n"], f"{p['batch']} x {p['heads']}"]
        cells += [fmt(r[v]["tflops"]) for v in variants]
        for name in rated:
            cells += [fmt(r[name]["tflops"] / r[base]["tflops"], 2) for base in ("cudnn", "flash")]
        cells.append(p.get("config", ""))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    gm_cudnn, _, min_flash = ratios(points, "course")
    return "\n".join(lines), gm_cudnn, min_flash


def ratios(points, name: str) -> tuple[float, float, float]:
    """Variant `name` over the grid: geometric mean and lowest of its ratio to cuDNN, lowest
    ratio to flash (NaN points, a backend that refused the shape, left out of the lowest)."""
    vs_cudnn = [p["results"][name]["tflops"] / p["results"]["cudnn"]["tflops"] for p in points]
    vs_flash = [p["results"][name]["tflops"] / p["results"]["flash"]["tflops"] for p in points]
    finite_c = [x for x in vs_cudnn if x == x]
    finite_f = [x for x in vs_flash if x == x]
    nan = float("nan")
    return (
        geomean(vs_cudnn),
        min(finite_c) if finite_c else nan,
        min(finite_f) if finite_f else nan,
    )


def plot(
    points, variants, path: Path, metric="tflops", ylabel="forward TFLOP/s (bf16)", what="forward"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(p["d"], p["causal"]) for p in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels, strict=True):
        pts = sorted(
            (p for p in points if (p["d"], p["causal"]) == (d, causal)), key=lambda p: p["n"]
        )
        ns = [p["n"] for p in pts]
        for v in variants:
            ax.plot(ns, [p["results"][v][metric] for p in pts], marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in ns])
        ax.set_title(f"d = {d}, {'causal' if causal else 'not causal'}")
        ax.set_xlabel("sequence length N")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Attention {what}, {torch.cuda.get_device_name()}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def versions() -> str:
    import triton

    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
        f"{torch.backends.cudnn.version()}), triton {triton.__version__}, "
        f"python {platform.python_version()}"
    )


def autotuned_config() -> str:
    """The config the course kernel's autotuner chose last, as text."""
    from course_utils.triton_attention.forward import _autotuned_kernel

    c = getattr(_autotuned_kernel(torch.bfloat16), "best_config", None)
    if c is None:
        return ""
    text = f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}"
    return text + (f" r{c.maxnreg}" if c.maxnreg else "")


def bench_point(
    d, causal, n, batch, heads, learner, sweep, log, rounds: int = 0
) -> tuple[dict | None, list]:
    """Check and time every variant at one grid point, then `rounds` more times in rotating
    order (`time_in_rounds`); with sweep, each hand-launched config (timed once)."""
    from course_utils.triton_attention import flash_attention_fwd, launch_flash_attention_fwd

    gen = torch.Generator(device=DEVICE).manual_seed(1000 * d + 10 * int(causal) + n)
    q, k, v = (
        torch.randn(batch, heads, n, d, generator=gen, device=DEVICE, dtype=torch.bfloat16)
        for _ in range(3)
    )  # (B, H, N, d) each
    flops = attention_flops(batch, heads, n, d, causal)
    log(f"d={d} causal={causal} N={n} B={batch} H={heads}: {flops / 1e12:.2f} TFLOP")
    ref = sdpa_reference(q, k, v, causal)
    if ref is None:
        log("    no SDPA backend ran; skipping this point")
        return None, []
    fns = {"course": lambda: flash_attention_fwd(q, k, v, causal)}
    if learner is not None:
        fns["learner"] = lambda: learner(q, k, v, causal)
    for name in SDPA_BACKENDS:
        fns[name] = sdpa_fn(name, q, k, v, causal)
    results = {}
    for name, fn in fns.items():
        results[name] = measure(name, fn, ref, flops, log)
        if name == "course":
            config = autotuned_config()  # the autotuner's pick, read before anything else runs
    time_in_rounds(fns, results, flops, rounds, log)
    sweep_rows = []
    for label, tma, cfg in sweep_configs(d) if sweep else ():

        def run(cfg=cfg, tma=tma):
            return launch_flash_attention_fwd(q, k, v, causal, config=cfg, tma=tma)

        row = measure(label, run, ref, flops, log)
        sweep_rows.append({"d": d, "causal": causal, "n": n, "variant": label, **row})
    point = {"d": d, "causal": causal, "n": n, "batch": batch, "heads": heads}
    return {**point, "config": config, "results": results}, sweep_rows


def same_point(row: dict, point: dict) -> bool:
    return (row["d"], row["causal"], row["n"]) == (point["d"], point["causal"], point["n"])


def report_sweep(points, sweep_rows, out: Path, log) -> None:
    """Write sweep.csv; log the best configs per point and each tile-movement mode's best."""
    with open(out / "sweep.csv", "w", newline="") as f:
        fields = ["d", "causal", "n", "variant", "tflops", "ms", "diff"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(sweep_rows)
    log("\nsweep: the best hand-launched configs per point (TFLOP/s)")
    for p in points:
        rows = [r for r in sweep_rows if same_point(r, p) and r["tflops"] == r["tflops"]]
        rows.sort(key=lambda r: -r["tflops"])
        best = ", ".join(f"{r['variant']} {r['tflops']:.0f}" for r in rows[:4])
        log(f"  d={p['d']} causal={p['causal']} N={p['n']}: {best}")
    for tma in (True, False):
        prefix = "tma-" if tma else "ptr-"
        best_ratios = []
        for p in points:
            mine = [r for r in sweep_rows if same_point(r, p) and r["variant"].startswith(prefix)]
            rows = [r["tflops"] for r in mine if r["tflops"] == r["tflops"]]
            best_ratios.append(
                max(rows) / p["results"]["cudnn"]["tflops"] if rows else float("nan")
            )
        log(
            f"  {prefix[:3]}: best config per point, geo-mean ratio to cuDNN "
            f"{geomean(best_ratios):.3f}"
        )


def _precompile_task(task) -> str:
    """Compile (and launch once, small) one config pair of the course kernels: fills the cache."""
    kind, d, causal, index = task
    from course_utils.triton_attention import backward, forward

    q, k, v, do = (
        torch.randn(1, 1, 1024, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(4)
    )  # lengths divisible by 16, as the grid's, so the compiled specializations match
    if kind == "fwd":
        family = forward.CONFIG_FAMILIES[forward._family(d, torch.bfloat16)]
        forward.launch_flash_attention_fwd(
            q, k, v, causal, config=forward.make_config(*family[index])
        )
    else:
        fam = backward._family(d, torch.bfloat16)
        dkdv = backward.make_config(*backward.DKDV_FAMILIES[fam][index])
        dq = backward.make_config(*backward.DQ_FAMILIES[fam][index])
        out, lse = forward.flash_attention_fwd(q, k, v, causal)
        if causal and (
            dkdv.kwargs["BLOCK_N"] % dkdv.kwargs["BLOCK_M"]
            or dq.kwargs["BLOCK_M"] % dq.kwargs["BLOCK_N"]
        ):
            return f"{task}: skipped"
        backward.flash_attention_bwd(do, q, k, v, out, lse, causal, dkdv_config=dkdv, dq_config=dq)
    torch.cuda.synchronize()
    return f"{task}: ok"


def precompile(head_dims, causals, workers: int, backward: bool, log) -> None:
    """Compile every autotuning config of the course kernels in parallel processes first.

    Triton's autotuner compiles its configs one after another, on one CPU core; compiled kernels
    land in Triton's on-disk cache, so the benchmark's autotuning then only times them.
    """
    import concurrent.futures
    import multiprocessing
    import time

    from course_utils.triton_attention import backward as bwd
    from course_utils.triton_attention import forward as fwd

    tasks = []
    for d in head_dims:
        for causal in causals:
            n_fwd = len(fwd.CONFIG_FAMILIES[fwd._family(d, torch.bfloat16)])
            tasks += [("fwd", d, causal, i) for i in range(n_fwd)]
            if backward:
                family = bwd._family(d, torch.bfloat16)
                n_bwd = min(len(bwd.DKDV_FAMILIES[family]), len(bwd.DQ_FAMILIES[family]))
                tasks += [("bwd", d, causal, i) for i in range(n_bwd)]
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(_precompile_task, t) for t in tasks]
        for f in futures:
            try:
                f.result()
            except Exception as e:  # the autotuner meets it again and reports it
                log(f"    precompile: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    log(f"precompiled {len(tasks)} config sets in {time.perf_counter() - start:.0f} s")


# ---------------------------------------------------------------------------------------------
# --backward: forward + backward through autograd
# ---------------------------------------------------------------------------------------------

BWD_FACTOR = 2.5  # backward FLOPs / forward FLOPs: five N^2 d products against two


def differentiable_fn(name: str, learner, causal: bool):
    """f(q, k, v) -> out with autograd: the course function, a learner's, or one SDPA backend."""
    if name == "course":
        from course_utils.triton_attention import flash_attention

        return lambda q, k, v: flash_attention(q, k, v, causal)
    if name == "learner":
        return lambda q, k, v: _first(learner(q, k, v, causal))
    return lambda q, k, v: sdpa_fn(name, q, k, v, causal)()


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def measure_bwd(name, fn, q, k, v, do, ref, flops, log, timers: dict | None = None) -> dict:
    """Check out and dq, dk, dv against ref, then time fwd+bwd and the backward alone; the two
    timed calls go into timers[(name, "bwd")] and timers[(name, "fwd_bwd")] for more rounds."""
    nan = float("nan")
    try:
        out = fn(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        diffs = [rel_diff(x, r) for x, r in zip((out, *grads), ref, strict=True)]
        diff = max(diffs)
        if not diff < CHECK_TOL:
            detail = ", ".join(
                f"{n} {e:.1e}" for n, e in zip(("out", "dq", "dk", "dv"), diffs, strict=True)
            )
            log(f"    {name:<10} WRONG: relative difference to SDPA {detail}; not timed")
            return {"fwd_bwd_tflops": nan, "bwd_tflops": nan, "diff": diff, "error": "wrong"}
        calls = {
            "bwd": lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
            "fwd_bwd": lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do),
        }
        bwd_ms, fwd_bwd_ms = time_ms(calls["bwd"]), time_ms(calls["fwd_bwd"])
        if timers is not None:
            timers.update({(name, metric): call for metric, call in calls.items()})
    except Exception as e:  # a backend that refuses a shape, a compile error: record and go on
        log(f"    {name:<10} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return {"fwd_bwd_tflops": nan, "bwd_tflops": nan, "diff": nan, "error": str(e)}
    result = {
        "fwd_bwd_ms": fwd_bwd_ms,
        "bwd_ms": bwd_ms,
        "fwd_bwd_tflops": (1 + BWD_FACTOR) * flops / fwd_bwd_ms * 1e-9,
        "bwd_tflops": BWD_FACTOR * flops / bwd_ms * 1e-9,
        "diff": diff,
        "diffs": diffs,
    }
    log(
        f"    {name:<10} fwd+bwd {fwd_bwd_ms:8.3f} ms {result['fwd_bwd_tflops']:6.1f} TFLOP/s, "
        f"bwd {bwd_ms:8.3f} ms {result['bwd_tflops']:6.1f} TFLOP/s  "
        f"(max diff to SDPA, out/dq/dk/dv {diff:.1e})"
    )
    return result


def autotuned_bwd_configs() -> str:
    """The configs the course backward's autotuners chose last: dkdv and dq, as text."""
    from course_utils.triton_attention.backward import _autotuned_kernels

    texts = []
    for name, kernel in zip(("dkdv", "dq"), _autotuned_kernels(), strict=True):
        c = getattr(kernel, "best_config", None)
        if c is not None:
            texts.append(
                f"{name} {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}"
            )
    return ", ".join(texts)


def bench_point_bwd(
    d, causal, n, batch, heads, variants, learner, log, rounds: int = 0
) -> dict | None:
    """Check and time forward + backward of every variant at one grid point, then each of its
    two timings `rounds` more times in rotating order (`rotate_rounds`), the medians kept."""
    gen = torch.Generator(device=DEVICE).manual_seed(1000 * d + 10 * int(causal) + n + 7)
    q, k, v, do = (
        torch.randn(batch, heads, n, d, generator=gen, device=DEVICE, dtype=torch.bfloat16)
        for _ in range(4)
    )  # (B, H, N, d) each
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    flops = attention_flops(batch, heads, n, d, causal)
    log(
        f"d={d} causal={causal} N={n} B={batch} H={heads}: forward {flops / 1e12:.2f} TFLOP, "
        f"backward {BWD_FACTOR * flops / 1e12:.2f}"
    )
    ref = None
    for name in SDPA_BACKENDS:  # the first backend that runs gives the reference
        try:
            out = differentiable_fn(name, learner, causal)(q, k, v)
            ref = (out.detach(), *torch.autograd.grad(out, (q, k, v), do))
            break
        except RuntimeError:
            continue
    if ref is None:
        log("    no SDPA backend ran; skipping this point")
        return None
    results, config, timers = {}, "", {}
    for name in variants:
        fn = differentiable_fn(name, learner, causal)
        results[name] = measure_bwd(name, fn, q, k, v, do, ref, flops, log, timers)
        if name == "course":
            config = autotuned_bwd_configs()
    first = {(n, m): results[n][f"{m}_ms"] for n, m in timers}
    factor = {"bwd": BWD_FACTOR, "fwd_bwd": 1 + BWD_FACTOR}
    for (name, metric), times in rotate_rounds(timers, first, rounds).items():
        keep_median(results[name], times, factor[metric] * flops, prefix=f"{metric}_")
    if rounds and timers:
        log("    median of rounds, bwd: " + ", ".join(
            f"{n} {results[n]['bwd_tflops']:.0f}" for n in variants if (n, "bwd") in timers
        ))  # fmt: skip
    point = {"d": d, "causal": causal, "n": n, "batch": batch, "heads": heads}
    return {**point, "config": config, "results": results}


def table_bwd(points, variants) -> tuple[str, dict]:
    """The markdown table (fwd+bwd and bwd TFLOP/s per variant) and the summary ratios."""
    head = ["d", "causal", "N", "B x H"]
    head += [f"{v} fwd+bwd" for v in variants] + [f"{v} bwd" for v in variants]
    head += ["bwd course/cuDNN", "bwd course/flash", "fwd+bwd course/flash", "config"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {"bwd_cudnn": [], "bwd_flash": [], "fwd_bwd_cudnn": [], "fwd_bwd_flash": []}
    for p in points:
        r = p["results"]
        for metric in ("bwd", "fwd_bwd"):
            for base in ("cudnn", "flash"):
                key = f"{metric}_tflops"
                ratios[f"{metric}_{base}"].append(r["course"][key] / r[base][key])
        cells = [p["d"], p["causal"], p["n"], f"{p['batch']} x {p['heads']}"]
        cells += [fmt(r[v]["fwd_bwd_tflops"]) for v in variants]
        cells += [fmt(r[v]["bwd_tflops"]) for v in variants]
        cells += [fmt(ratios["bwd_cudnn"][-1], 2), fmt(ratios["bwd_flash"][-1], 2)]
        cells += [fmt(ratios["fwd_bwd_flash"][-1], 2), p.get("config", "")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    summary = {}
    for key, values in ratios.items():
        finite = [x for x in values if x == x]
        summary[f"geo_{key}"] = geomean(values)
        summary[f"min_{key}"] = min(finite) if finite else float("nan")
    return "\n".join(lines), summary


def main_backward(args, command, learner, causals, log) -> int:
    """--backward: the grid, forward + backward, the table, the JSON and the RESULTS section."""
    variants = ["course", *(["learner"] if learner else []), *SDPA_BACKENDS]
    device = torch.cuda.get_device_name()
    clocks_before = nvidia_smi(CLOCKS)
    log(f"{device}; {versions()}\nnvidia-smi before ({CLOCKS}): {clocks_before}")
    points = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        point = bench_point_bwd(d, causal, n, batch, heads, variants, learner, log, args.rounds)
        if point is not None:
            points.append(point)
        torch.cuda.empty_cache()
    clocks_after = nvidia_smi(CLOCKS)
    log(f"nvidia-smi after: {clocks_after}")

    md, summary = table_bwd(points, variants)
    plot(points, variants, args.plot, "bwd_tflops", "backward TFLOP/s (bf16)", "backward")
    record = {"device": device, "versions": versions(), "command": command, "points": points}
    (args.out / "attention_bwd.json").write_text(json.dumps({**record, **summary}, indent=1))
    s = summary
    section = (
        f"\n## Attention forward + backward, bf16, {device}, "
        f"{datetime.date.today().isoformat()}\n\n"
        f"- device: {nvidia_smi('name,driver_version,memory.total')}\n"
        f"- {CLOCKS}: before the run {clocks_before}; just after the timings {clocks_after}\n"
        f"- versions: {versions()}\n"
        f"- command: `{command}`\n"
        f"- fwd+bwd TFLOP/s = 3.5 * F / time of a forward and torch.autograd.grad; bwd "
        f"TFLOP/s = 2.5 * F / time of torch.autograd.grad alone (retain_graph=True), "
        f"each the median of {1 + args.rounds} do_bench medians, the variants in rotating order; "
        f"measured, not subtracted; F = 4*B*H*N^2*d (half when causal), the forward's FLOPs; "
        f"batch*N = {TOKENS}, heads*d = {HIDDEN}; config: the course backward autotuners' picks\n\n"
        f"{md}\n\n"
        f"Backward, course/cuDNN: geometric mean {s['geo_bwd_cudnn']:.3f}, minimum "
        f"{s['min_bwd_cudnn']:.3f}; course/flash: geometric mean {s['geo_bwd_flash']:.3f}, "
        f"minimum {s['min_bwd_flash']:.3f}.\n"
        f"Forward + backward, course/cuDNN: geometric mean {s['geo_fwd_bwd_cudnn']:.3f}; "
        f"course/flash: geometric mean {s['geo_fwd_bwd_flash']:.3f}, minimum "
        f"{s['min_fwd_bwd_flash']:.3f}.\n"
    )
    (args.out / "RESULTS_bwd_section.md").write_text(section)
    if not args.no_append:
        with open(args.results, "a") as f:
            f.write(section)
    print("\n" + md)
    print(
        f"\nbwd: geo course/cuDNN {s['geo_bwd_cudnn']:.3f}, min course/flash "
        f"{s['min_bwd_flash']:.3f}; fwd+bwd: geo course/cuDNN {s['geo_fwd_bwd_cudnn']:.3f}, "
        f"min course/flash {s['min_fwd_bwd_flash']:.3f}"
    )
    print(f"plot: {args.plot}; section: {args.out / 'RESULTS_bwd_section.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learner", help="module:function with flash_attention_fwd's signature")
    parser.add_argument(
        "--learner-backward",
        metavar="MODULE:FUNCTION",
        help="a learner's torch.autograd.Function (notebook 08's FlashAttentionTriton, saved in "
        "a .py file), timed forward + backward beside the course kernel; implies --backward",
    )
    parser.add_argument("--sweep", action="store_true", help="time each config of the kernel")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="time every variant (with --backward: both its timings) this many more times, in "
        "rotating order, and keep the median",
    )
    parser.add_argument(
        "--backward", action="store_true", help="time forward + backward (autograd) instead"
    )
    parser.add_argument(
        "--precompile", type=int, default=0, help="compile the course configs first, in N processes"
    )
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dimensions")
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384], help="lengths")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--plot", type=Path, help="default: out/attention_fwd.png or _bwd.png")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="folder for JSON, CSV, md")
    parser.add_argument("--results", type=Path, default=HERE.parent / "docs" / "journal.md")
    parser.add_argument("--no-append", action="store_true", help="leave the journal alone")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.attention " + shlex.join(sys.argv[1:] if argv is None else argv)

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time (the kernel's tests run in the interpreter instead)")
        return 0

    learner = load_learner(args.learner) if args.learner else None
    if args.learner_backward:
        if learner is not None:
            raise SystemExit("give --learner or --learner-backward, not both")
        spec = args.learner_backward
        learner = learner_autograd(load_learner(spec, "--learner-backward"), spec)
        args.backward = True
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    variants = ["course", *(["learner"] if learner else []), *SDPA_BACKENDS]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot is None:
        args.plot = HERE / "out" / f"attention_{'bwd' if args.backward else 'fwd'}.png"

    def log(line: str) -> None:
        print(line, flush=True)

    if args.precompile:
        precompile(args.d, causals, args.precompile, args.backward, log)
    if args.backward:
        return main_backward(args, command, learner, causals, log)

    device = torch.cuda.get_device_name()
    clocks_before = nvidia_smi(CLOCKS)
    log(f"{device}; {versions()}\nnvidia-smi before ({CLOCKS}): {clocks_before}")
    points, sweep_rows = [], []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        point, rows = bench_point(d, causal, n, batch, heads, learner, args.sweep, log, args.rounds)
        if point is not None:
            points.append(point)
            sweep_rows += rows
        torch.cuda.empty_cache()
    clocks_after = nvidia_smi(CLOCKS)
    log(f"nvidia-smi after: {clocks_after}")
    if sweep_rows:
        report_sweep(points, sweep_rows, args.out, log)

    md, gm_cudnn, min_flash = table(points, variants)
    plot(points, variants, args.plot)
    summary = {"device": device, "versions": versions(), "command": command, "points": points}
    (args.out / "attention_fwd.json").write_text(json.dumps(summary, indent=1))
    section = (
        f"\n## Attention forward, bf16, {device}, {datetime.date.today().isoformat()}\n\n"
        f"- device: {nvidia_smi('name,driver_version,memory.total')}\n"
        f"- {CLOCKS}: before the run {clocks_before}; just after the timings {clocks_after}\n"
        f"- versions: {versions()}\n"
        f"- command: `{command}`\n"
        f"- TFLOP/s = 4*B*H*N^2*d (half when causal) / median of {1 + args.rounds} timings "
        f"(triton.testing.do_bench, each variant in turn, the order rotating); "
        f"batch*N = {TOKENS}, heads*d = {HIDDEN}; config: the course autotuner's pick\n\n"
        f"{md}\n\n"
        f"Geometric mean course/cuDNN: {gm_cudnn:.3f}; minimum course/flash: {min_flash:.3f}.\n"
    )
    if learner is not None:
        gm, low, low_flash = ratios(points, "learner")
        learner_line = (
            f"Learner ({args.learner}): geometric mean learner/cuDNN {gm:.3f}, lowest {low:.3f}; "
            f"minimum learner/flash {low_flash:.3f}.\n"
        )
        section += "\n" + learner_line
    (args.out / "RESULTS_section.md").write_text(section)
    if not args.no_append:
        with open(args.results, "a") as f:
            f.write(section)
    print("\n" + md)
    print(f"\ngeo-mean course/cuDNN {gm_cudnn:.3f}, min course/flash {min_flash:.3f}")
    if learner is not None:
        print(learner_line.strip())
    print(f"plot: {args.plot}; section: {args.out / 'RESULTS_section.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
