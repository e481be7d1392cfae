"""The course forward at launch configs of your choosing, against cuDNN, in rotating order.

    python -m benchmarks.forward_configs --d 64 --n 1024 --causal yes \\
        --configs 128x64w4s3r168 64x64w4s3 64x32w4s4

A config is BLOCK_Mx BLOCK_N w warps s stages, optionally r and a register cap (`make_config`).
Each is launched by hand (tensor descriptors, as the autotuner's), checked against SDPA; then all
of them, the autotuned family (`family`) and SDPA's cuDNN and flash backends are timed 1 +
--rounds times, the order rotating between rounds; the medians in TFLOP/s are printed last with
each one's ratio to cuDNN. For points where the autotuning families (`forward.CONFIG_FAMILIES`)
may miss a better config. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

import torch

from benchmarks.attention import attention_flops, grid, rel_diff, sdpa_fn, time_ms

CONFIG = re.compile(r"^(\d+)x(\d+)w(\d+)s(\d+)(?:r(\d+))?$")


def parse_config(text: str) -> tuple[int, int, int, int, int | None]:
    """'128x64w4s3r168' -> (128, 64, 4, 3, 168); ValueError naming the expected form."""
    m = CONFIG.match(text)
    if not m:
        raise ValueError(f"config {text!r}: expected BMxBNwWARPSsSTAGES[rREGS], e.g. 128x64w4s3")
    bm, bn, w, s, r = m.groups()
    return int(bm), int(bn), int(w), int(s), (int(r) if r else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64])
    parser.add_argument("--n", type=int, nargs="+", default=[1024])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="yes")
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    configs = [parse_config(c) for c in args.configs]
    if not torch.cuda.is_available():
        print("benchmarks.forward_configs needs a CUDA GPU; there is none here.", file=sys.stderr)
        return 2
    from course_utils.triton_attention.forward import launch_flash_attention_fwd, make_config

    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    lines = []
    for d, causal, n, batch, heads in grid(args.d, args.n, causals):
        gen = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v = (
            torch.randn(batch, heads, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)
        )
        flops = attention_flops(batch, heads, n, d, causal)
        cudnn = sdpa_fn("cudnn", q, k, v, causal)
        ref = cudnn()
        fns = {"cudnn": cudnn, "flash": sdpa_fn("flash", q, k, v, causal)}

        def family(qkv=(q, k, v), causal=causal):  # the autotuner over CONFIG_FAMILIES
            return launch_flash_attention_fwd(*qkv, causal)[0]

        family()
        fns["family"] = family
        for text, c in zip(args.configs, configs, strict=True):
            cfg = make_config(*c)

            def run(cfg=cfg, qkv=(q, k, v), causal=causal):
                return launch_flash_attention_fwd(*qkv, causal, config=cfg)[0]

            try:
                diff = rel_diff(run(), ref)
            except Exception as e:  # past the shared memory, a causal tiling that does not nest
                print(f"d={d} N={n} {text}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            if not diff < 2e-2:
                print(f"d={d} N={n} {text}: WRONG ({diff:.1e}); not timed", flush=True)
                continue
            fns[text] = run
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(1 + args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(time_ms(fns[name]))
        tflops = {name: flops / statistics.median(t) * 1e-9 for name, t in times.items()}
        for name in names:
            lines.append(
                f"d={d} causal={causal} N={n}  {name:<16} {tflops[name]:6.1f} TFLOP/s  "
                f"{tflops[name] / tflops['cudnn']:.3f} of cuDNN"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
