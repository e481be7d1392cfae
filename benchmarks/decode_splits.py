"""How many splits, how deep a pipeline: flash_decode around its defaults, measured.

The partials kernel's grid is batch * kv_heads * num_splits programs. An SM holds as many programs
at once as its registers and shared memory allow (the kernel's occupancy, read here from the
compiled kernel), and the step lasts as long as its busiest SM: a grid of 4 * SMs + 16 programs
puts a fifth program on 16 SMs. This script times, at a few (batch, kv_heads, N) points,
choose_num_splits's count and one more, at several tile sizes and pipeline depths, with
programmatic dependent launch of the merge (pdl) and the default also without, each as a CUDA
graph replay beside cuDNN's SDPA and a device copy timed in the same run; for each compiled
variant its registers, shared memory and programs per SM. The table is printed last, the
default marked with *.

    python -m benchmarks.decode_splits [--points 1,32,8192 ...] [--tiles 16 32] [--stages 3 5]
        [--rounds 3]

--rounds times every variant and cuDNN that many times, in a rotating order, and reports the
medians (a single timing in a fixed order cannot rank variants a percent apart). --page and
--layout store the cache in other page sizes or head-major, --order with its pages in order
(`page_cache`), one cache a process.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from benchmarks.decode import D, copy_bandwidth, graphed, paged_inputs, sdpa_runner, time_ms

POINTS = ["1,32,8192", "1,32,65536", "8,8,8192", "8,8,65536", "8,32,8192", "8,32,65536"]


def programs_per_sm(
    regs: int,
    shared: int,
    warps: int,
    *,
    regs_per_sm: int = 65536,
    shared_per_sm: int = 233472,
    threads_per_sm: int = 2048,
    blocks_per_sm: int = 32,
) -> int:
    """How many programs of a kernel an SM holds at once (defaults: an H100 or H200, sm_90).

    Each limit in turn: registers (allocated per warp in units of 256), shared memory (the
    kernel's plus 1 KB the driver reserves per block), threads and blocks per SM.
    """
    threads = 32 * warps
    regs_per_warp = -(-max(1, regs) * 32 // 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * warps)
    by_shared = shared_per_sm // (shared + 1024)
    return int(min(by_regs, by_shared, threads_per_sm // threads, blocks_per_sm))


def occupancy(kernel, warps: int) -> dict:
    """Registers, shared memory and programs per SM of a compiled Triton kernel on this GPU."""
    props = torch.cuda.get_device_properties(0)
    regs = int(getattr(kernel, "n_regs", 0) or 0)
    shared = int(getattr(kernel.metadata, "shared", 0) or 0)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    return {
        "regs": regs,
        "shared": shared,
        "per_sm": programs_per_sm(regs, shared, warps, shared_per_sm=smem_sm),
    }


def compiled_partials():
    """Every compiled variant of the partials kernel so far (Triton's per-device cache)."""
    from course_utils.triton_attention import decode

    kernels = []
    for cache in decode._decode_partials_kernel.device_caches.values():
        kernels.extend(cache[0].values())
    return kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=POINTS, metavar="B,KVH,N")
    parser.add_argument("--stages", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument(
        "--tiles", type=int, nargs="+", default=[16, 32, 64], help="tokens per K/V tile"
    )
    parser.add_argument("--warps", type=int, nargs="+", default=[4])
    parser.add_argument(
        "--splits", type=int, nargs="+", help="default: choose_num_splits's count and one more"
    )
    parser.add_argument("--rounds", type=int, default=1, help="timings per variant (median)")
    parser.add_argument("--page", type=int, default=16, help="tokens per page")
    parser.add_argument("--layout", default="nhd", choices=["nhd", "hnd"], help="see page_cache")
    parser.add_argument(
        "--order", default="shuffled", choices=["shuffled", "ordered"], help="see page_cache"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.decode_splits needs a CUDA GPU; there is none here.", file=sys.stderr)
        return 2
    from course_utils.triton_attention import flash_decode
    from course_utils.triton_attention.decode import choose_num_splits, default_tuning, num_sms

    gen = torch.Generator(device="cuda").manual_seed(0)
    copy_gbs = copy_bandwidth()
    sms = num_sms()
    rows = []
    for point in args.points:
        batch, kv_heads, n = (int(x) for x in point.split(","))
        # one cache per process: two caches' graphs in one process met an illegal address
        # (docs/journal.md, "Decode: the grid balanced over the SMs"), one never did
        page, layout = args.page, args.layout
        q, kc, vc, tbl, lens, k, v = paged_inputs(
            batch, kv_heads, n, page, gen, layout, order=args.order
        )
        cudnn, _ = sdpa_runner("cudnn", q, k, v, expand=True)
        ref = flash_decode(q, kc, vc, tbl, lens, pdl=False)[0].float()
        tuning = default_tuning(batch, kv_heads, page_size=page)
        grid = batch * kv_heads
        steps = []
        auto = choose_num_splits(batch, kv_heads, n, page)
        default = (auto, tuning["tile_tokens"], tuning["num_stages"], tuning["num_warps"])
        variants = [(*default, False)]  # the default without pdl
        for s, tile, stages, warps in itertools.product(
            args.splits or sorted({auto, auto + 1}), args.tiles, args.stages, args.warps
        ):
            variants.append((s, tile, stages, warps, True))
        for s, tile, stages, warps, pdl in variants:
            before = {id(x) for x in compiled_partials()}
            kw = dict(num_splits=s, tile_tokens=tile, num_stages=stages, num_warps=warps, pdl=pdl)
            try:
                out = flash_decode(q, kc, vc, tbl, lens, **kw)[0].float()
            except Exception as exc:  # a config past the shared memory
                print(f"{point} {kw}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                continue
            err = float((out - ref).norm() / ref.norm())
            if not err < 1e-2:
                raise SystemExit(f"wrong at {point} page {page} {layout} {kw}: error {err}")
            new = [x for x in compiled_partials() if id(x) not in before]
            occ = occupancy(new[0], warps) if new else None

            def step(kw=kw, args=(q, kc, vc, tbl, lens)):
                return flash_decode(*args, check_values=False, **kw)

            is_default = (s, tile, stages, warps) == default
            key = (s, tile, stages, warps, pdl, page, layout, is_default)
            steps.append((key, graphed(step), occ))
        runs = [graphed(cudnn)] + [graph for _, graph, _ in steps]  # cuDNN timed with them
        times = {i: [] for i in range(len(runs))}
        for r in range(max(1, args.rounds)):  # rotating order: no variant always runs first
            for i in [(r + j) % len(runs) for j in range(len(runs))]:
                times[i].append(time_ms(runs[i]))
        cudnn_ms = sorted(times[0])[len(times[0]) // 2]
        cudnn_gbs = 2 * batch * kv_heads * n * D * 2 / cudnn_ms / 1e6
        for i, ((s, tile, stages, warps, pdl, page, layout, is_default), _, occ) in enumerate(
            steps
        ):
            ms = sorted(times[i + 1])[len(times[i + 1]) // 2]
            gbs = 2 * batch * kv_heads * n * D * 2 / ms / 1e6
            rows.append(
                (batch, kv_heads, n, s, tile, stages, warps, pdl, page, layout, grid * s, gbs,
                 cudnn_gbs, occ, is_default)
            )  # fmt: skip
            print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    print(f"device copy {copy_gbs:.0f} GB/s; {sms} SMs; pages {args.order}; * = the default")
    print(
        "batch kv_heads      N splits tile stages warps pdl page layout programs   GB/s  /copy"
        " /cudnn  occupancy"
    )
    for b, h, n, s, tile, st, warps, pdl, page, layout, progs, gbs, cud, occ, is_default in rows:
        o = f"{occ['regs']} regs, {occ['shared']} B smem, {occ['per_sm']}/SM" if occ else ""
        print(
            f"{b:5d} {h:8d} {n:6d} {s:6d} {tile:4d} {st:6d} {warps:5d} "
            f"{'yes' if pdl else ' no':>3} {page:4d} {layout:>6} "
            f"{progs:8d} {gbs:6.0f} {gbs / copy_gbs:6.2f} {gbs / cud:6.2f}"
            f"{'*' if is_default else ' '} {o}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
