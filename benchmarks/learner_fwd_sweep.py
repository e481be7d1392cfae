"""Launch configurations for notebook 06's forward kernel on this GPU: the learner track's
solution (benchmarks/learner_solutions.py) at every config of the course forward's autotuning
family, with and without its register cap, beside the course's autotuned forward and SDPA's
backends, bf16, the grid of benchmarks.attention.

    python -m benchmarks.learner_fwd_sweep [--d 64 128] [--n 1024 4096 16384] \\
        [--baseline-root OLD_CHECKOUT]

What it informs: `config.tile_config`, the config the solution launcher asks for on a GPU.
`--baseline-root` also times the solution of another checkout (its own launcher, as it is) in the
same run, to measure a change of the solution. Prints one line per variant and point, then a
table of TFLOP/s with each variant's ratio to the course kernel (geometric mean, minimum).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.attention import (
    SDPA_BACKENDS,
    attention_flops,
    geomean,
    grid,
    measure,
    nvidia_smi,
    sdpa_fn,
    sdpa_reference,
    versions,
)


def family_configs(d: int):
    """(label, TileConfig) for each config of the course forward's family at this d, as the
    autotuner has it and, where it has a register cap, without the cap."""
    from course_utils.triton_attention.config import TileConfig
    from course_utils.triton_attention.forward import CONFIG_FAMILIES, _family

    seen = set()
    for bm, bn, w, s, regs in CONFIG_FAMILIES[_family(d, torch.bfloat16)]:
        label = f"{bm}x{bn}-w{w}-s{s}"
        for cap in (regs, None) if regs else (None,):
            name = label + (f"-r{cap}" if cap else "")
            if name not in seen:  # the family may hold a config both capped and not
                seen.add(name)
                yield name, TileConfig(bm, bn, w, s, cap)


def time_point(d, causal, n, batch, heads, mod, base, picked) -> dict:
    """TFLOP/s of every variant at one point, each checked against SDPA first."""
    from course_utils.triton_attention import flash_attention_fwd

    gen = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * int(causal) + n)
    q, k, v = (
        torch.randn(batch, heads, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )  # (B, H, N, d) each
    flops = attention_flops(batch, heads, n, d, causal)
    ref = sdpa_reference(q, k, v, causal)
    if ref is None:
        raise SystemExit(f"no SDPA backend runs at d={d} causal={causal} N={n}: no reference")
    variants = {"course": lambda: flash_attention_fwd(q, k, v, causal)}
    variants |= {name: sdpa_fn(name, q, k, v, causal) for name in SDPA_BACKENDS}
    if base is not None:
        variants["baseline"] = lambda: base.attention_fwd(q, k, v, causal)
    variants["solution"] = lambda: mod.attention_fwd(q, k, v, causal)
    point = {}
    for name, fn in variants.items():
        point[name] = measure(name, fn, ref, flops, print)["tflops"]
    for name, config in family_configs(d):
        picked["config"] = config  # the solution launcher's tile_config answers this
        point[name] = measure(name, variants["solution"], ref, flops, print)["tflops"]
    picked.clear()
    return point


def tables(rows: list[tuple[str, dict]], head_dims) -> str:
    """One markdown table of TFLOP/s per head dimension (its family, so its columns, differ),
    each followed by every variant's ratio to the course kernel: geometric mean (minimum).
    rows: (label "d=64 causal=False N=1024", {variant: TFLOP/s}) per point."""
    lines = ["TFLOP/s, bf16; ratio = variant / course, geometric mean (minimum) over the points"]
    for d in head_dims:
        mine = [(label, p) for label, p in rows if label.startswith(f"d={d} ")]
        if not mine:
            continue
        names = list(mine[0][1])
        lines += ["", "| point | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [
            f"| {label} | " + " | ".join(f"{p[x]:.0f}" for x in names) + " |" for label, p in mine
        ]
        ratios = {x: [p[x] / p["course"] for _, p in mine] for x in names if x != "course"}
        lines += [
            "",
            f"d={d}: "
            + ", ".join(f"{x} {geomean(r):.2f} ({min(r):.2f})" for x, r in ratios.items()),
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks import learner_solutions as ls
    from course_utils.triton_attention.config import tile_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    ap.add_argument("--baseline-root", type=Path, help="another checkout whose solution to time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the sweep times kernels on a GPU")
        return 0
    print(nvidia_smi("name,driver_version,clocks.sm,clocks.max.sm"), "|", versions(), flush=True)
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    mod = ls.load("06_triton_forward")
    base = ls.load("06_triton_forward", args.baseline_root) if args.baseline_root else None
    picked = {}  # the config the patched tile_config hands the solution launcher

    def patched_tile_config(capability, d, dtype, pass_="fwd"):
        return picked.get("config") or tile_config(capability, d, dtype, pass_)

    mod.tile_config = patched_tile_config
    rows = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        label = f"d={d} causal={causal} N={n}"
        print(f"{label} B={batch} H={heads}", flush=True)
        rows.append((label, time_point(d, causal, n, batch, heads, mod, base, picked)))

    print(tables(rows, args.d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
