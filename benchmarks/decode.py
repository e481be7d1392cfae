"""Decode attention on a GPU: the course's flash_decode against SDPA's backends, in GB/s of KV read.

One query token per sequence, batch 1 and 8, 32 query heads with 32 or 8 KV heads (MHA and GQA
32/8), d = 128, bfloat16, KV lengths from 1k to 128k tokens. The course's kernel reads a paged
cache (pages of --page-size tokens in shuffled physical order, one block table per sequence);
SDPA's flash, cuDNN and efficient backends read contiguous K and V (batch, kv_heads, N, d) with
the query as a length-1 sequence, and enable_gqa=True for GQA where this torch has it (otherwise
K and V are expanded to 32 heads before timing, and the table says so). A backend that refuses a
shape is reported as such.

Every kernel is checked against SDPA's math backend in float32 on the same data before it is
timed (relative error below 2e-2); times are the median of triton.testing.do_bench (warm-up 25
ms, 100 ms of repetitions). GB/s = bytes of K and V the step must read (2 * batch * kv_heads * N
* d * 2 bytes; the query and the output are negligible) / time. The yardstick is a large
device-to-device copy timed in the same run (bytes read + written / time), and the issue's
targets are printed beside the table: at least 0.9 of the copy at 64k, at least cuDNN at 8k.

    python -m benchmarks.decode                   the grid, the table last
    python -m benchmarks.decode --record          ... and a section appended to docs/journal.md
    python -m benchmarks.decode --sweep           tile, warps, stages, splits at a few points
    python -m benchmarks.decode --graphs          every kernel timed as a CUDA graph replay
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
D, Q_HEADS = 128, 32


def time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graphed(fn):
    """fn captured in a CUDA graph; the returned replay launches the same kernels with no Python,
    no argument handling and no per-launch host work (what an inference engine does for its
    decode step). Warmed up on a side stream first, as torch.cuda.graph requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy: bytes read + written per second."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    return 2 * 2**30 / ms / 1e6


def page_cache(k, v, page_size, gen, layout="nhd", order="shuffled"):
    """K and V (batch, kv_heads, n, d) cut into pages of page_size tokens: (k_cache, v_cache,
    block_table). order "shuffled": the pages placed in a random order, as an engine's cache
    holds them after many sequences came and went; "ordered": page j of sequence b at physical
    page b * pages + j, as a fresh allocator lays them out. layout "nhd": each page stored
    (page_size, kv_heads, d), token-major, as vLLM's FlashAttention backend keeps it; "hnd":
    stored (kv_heads, page_size, d), head-major as FlashInfer's HND, and returned as its
    (num_pages, page_size, kv_heads, d) view (one head's page is page_size * d contiguous
    elements)."""
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"layout must be 'nhd' or 'hnd', got {layout!r}")
    if order not in ("shuffled", "ordered"):
        raise ValueError(f"order must be 'shuffled' or 'ordered', got {order!r}")
    batch, kv_heads, n, d = k.shape
    pages = n // page_size
    if order == "shuffled":
        perm = torch.randperm(batch * pages, device=k.device, generator=gen)
    else:
        perm = torch.arange(batch * pages, device=k.device)
    table = perm.view(batch, pages).to(torch.int32)
    caches = []
    for x in (k, v):
        # page j of sequence b holds tokens j*page_size .. (j+1)*page_size - 1
        paged = x.view(batch, kv_heads, pages, page_size, d)
        if layout == "nhd":
            cache = x.new_empty(batch * pages, page_size, kv_heads, d)
            cache[table.long().flatten()] = paged.permute(0, 2, 3, 1, 4).reshape(
                -1, page_size, kv_heads, d
            )
        else:
            stored = x.new_empty(batch * pages, kv_heads, page_size, d)
            stored[table.long().flatten()] = paged.permute(0, 2, 1, 3, 4).reshape(
                -1, kv_heads, page_size, d
            )
            cache = stored.permute(0, 2, 1, 3)
        caches.append(cache)
    return caches[0], caches[1], table


def paged_inputs(
    batch, kv_heads, n, page_size, gen, layout="nhd", q_heads=Q_HEADS, order="shuffled"
):
    """q (batch, q_heads, d); a paged cache (its pages shuffled unless order="ordered"); the
    block table; seq_lens; and the same K, V as contiguous (batch, kv_heads, n, d) tensors for
    SDPA. layout, order: see page_cache."""
    q = torch.randn(batch, q_heads, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, kv_heads, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, kv_heads, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache, table = page_cache(k, v, page_size, gen, layout, order)
    lens = torch.full((batch,), n, device="cuda", dtype=torch.int32)
    return q, k_cache, v_cache, table, lens, k, v


def has_enable_gqa() -> bool:
    import inspect

    import torch.nn.functional as F

    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):
        return False


def sdpa_runner(backend: str | None, q, k, v, expand: bool = False):
    """SDPA with one backend (None: math), query (batch, 32, 1, d); returns (fn, note).

    GQA: enable_gqa=True where torch has it and expand is False; otherwise K and V are repeated
    to the 32 query heads first (outside the timed function), which the note says."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q4 = q[:, :, None, :]
    note = ""
    kwargs = {}
    if k.shape[1] != q.shape[1]:
        if has_enable_gqa() and not expand:
            kwargs["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            note = "K/V expanded"
    chosen = getattr(SDPBackend, BACKENDS[backend]) if backend else SDPBackend.MATH

    def run():
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q4, k, v, **kwargs)[:, :, 0]

    return run, note


def rel_err(x, ref) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def bench_point(batch, kv_heads, n, page_size, copy_gbs, tuning, gen, graphs=False) -> dict:
    from course_utils.triton_attention import flash_decode

    q, k_cache, v_cache, table, lens, k, v = paged_inputs(batch, kv_heads, n, page_size, gen)
    ref_fn, _ = sdpa_runner(None, q.float(), k.float(), v.float())
    ref = ref_fn()
    kv_bytes = 2 * batch * kv_heads * n * D * 2
    row = {"batch": batch, "kv_heads": kv_heads, "n": n, "notes": []}
    flash_decode(q, k_cache, v_cache, table, lens, **tuning)  # checks the inputs once, compiles
    splits = tuning.get("num_splits")

    def course():
        return flash_decode(q, k_cache, v_cache, table, lens, check_values=False, **tuning)[0]

    fns = {"course": (course, "")}
    for name in BACKENDS:
        fns[name] = sdpa_runner(name, q, k, v)
    for name, (fn, note) in fns.items():
        try:
            err = rel_err(fn(), ref)
        except RuntimeError as exc:  # the backend refuses this shape (or enable_gqa)
            if name == "course" or kv_heads == Q_HEADS or note:
                row[name] = None
                row["notes"].append(f"{name}: {str(exc).splitlines()[0][:60]}")
                continue
            fn, note = sdpa_runner(name, q, k, v, expand=True)
            try:
                err = rel_err(fn(), ref)
            except RuntimeError as exc2:
                row[name] = None
                row["notes"].append(f"{name}: {str(exc2).splitlines()[0][:60]}")
                continue
        if not err < 2e-2:
            raise SystemExit(f"{name} is wrong at batch {batch}, kv_heads {kv_heads}, N {n}: {err}")
        ms = time_ms(graphed(fn) if graphs else fn)
        row[name] = kv_bytes / ms / 1e6  # GB/s
        if note:
            row["notes"].append(f"{name}: {note}")
    row["course_frac_copy"] = row["course"] / copy_gbs
    if splits is None:
        from course_utils.triton_attention.decode import choose_num_splits

        splits = choose_num_splits(batch, kv_heads, n, page_size)
    row["num_splits"] = splits
    return row


def fmt(x) -> str:
    return "   -" if x is None else f"{x:7.0f}"


def table(rows, copy_gbs) -> str:
    lines = [
        f"GB/s of K and V read (bf16, d = {D}, {Q_HEADS} query heads); device copy "
        f"{copy_gbs:.0f} GB/s",
        "batch  kv_heads       N  splits   course  flash  cudnn  effic.  course/copy  "
        "course/cudnn  notes",
    ]
    for r in rows:
        vs_cudnn = r["course"] / r["cudnn"] if r.get("cudnn") else float("nan")
        lines.append(
            f"{r['batch']:5d} {r['kv_heads']:9d} {r['n']:7d} {r['num_splits']:7d} "
            f"{fmt(r['course'])} {fmt(r['flash'])} {fmt(r['cudnn'])} {fmt(r['efficient'])} "
            f"{r['course_frac_copy']:12.2f} {vs_cudnn:13.2f}  {'; '.join(r['notes'])}"
        )
    at64 = [r["course_frac_copy"] for r in rows if r["n"] == 65536]
    at8 = [r["course"] / r["cudnn"] for r in rows if r["n"] == 8192 and r.get("cudnn")]
    if at64:
        lines.append(f"target: course/copy >= 0.9 at 64k: min {min(at64):.2f}")
    if at8:
        lines.append(f"target: course >= cudnn at 8k: min course/cudnn {min(at8):.2f}")
    return "\n".join(lines)


SWEEP_POINTS = [(1, 8, 8192), (1, 8, 65536), (8, 8, 8192), (8, 32, 65536)]


def sweep(page_sizes, copy_gbs, gen, graphs=False, points=None, stages_options=(2, 3)) -> str:
    """Time each (page_size, pages_per_tile, num_warps, num_stages, num_splits) at the points
    (batch, kv_heads, N), default SWEEP_POINTS; splits: the chosen number, half, twice, 4x."""
    lines = ["page  tile_pages  warps  stages  splits  batch kv_heads      N   GB/s  frac_copy"]
    points = points or SWEEP_POINTS
    best = {}
    for batch, kv_heads, n in points:
        for page in page_sizes:
            q, kc, vc, tbl, lens, _, _ = paged_inputs(batch, kv_heads, n, page, gen)
            from course_utils.triton_attention import flash_decode
            from course_utils.triton_attention.decode import choose_num_splits

            auto = choose_num_splits(batch, kv_heads, n, page)
            split_options = sorted(
                {max(1, auto // 2), auto, min(256, auto * 2), min(256, auto * 4)}
            )
            tiles = [p for p in (1, 2, 4, 8) if 32 <= p * page <= 128]
            for ppt, warps, stages, splits in itertools.product(
                tiles, (4, 8), stages_options, split_options
            ):
                kw = dict(pages_per_tile=ppt, num_warps=warps, num_stages=stages)
                try:
                    flash_decode(q, kc, vc, tbl, lens, num_splits=splits, **kw)

                    def step(args=(q, kc, vc, tbl, lens), kw=kw, splits=splits):
                        return flash_decode(*args, num_splits=splits, check_values=False, **kw)

                    ms = time_ms(graphed(step) if graphs else step)
                except Exception as exc:  # a config that does not compile (shared memory)
                    lines.append(f"{page:4d} {ppt:11d} {warps:6d} {stages:7d} {splits:7d}  "
                                 f"failed: {type(exc).__name__}")  # fmt: skip
                    continue
                gbs = 2 * batch * kv_heads * n * D * 2 / ms / 1e6
                lines.append(
                    f"{page:4d} {ppt:11d} {warps:6d} {stages:7d} {splits:7d} {batch:6d} "
                    f"{kv_heads:8d} {n:6d} {gbs:6.0f} {gbs / copy_gbs:10.2f}"
                )
                print(lines[-1], flush=True)  # a run cut short keeps what it timed
                key = (batch, kv_heads, n)
                if gbs > best.get(key, (0,))[0]:
                    best[key] = (gbs, page, ppt, warps, stages, splits)
            torch.cuda.empty_cache()
    lines.append("best per point: GB/s, page, pages_per_tile, warps, stages, splits")
    for key, val in best.items():
        lines.append(f"  {key}: {val[0]:.0f} GB/s ({val[0] / copy_gbs:.2f} of copy), {val[1:]}")
    return "\n".join(lines)


def versions() -> str:
    import platform

    import triton

    return (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"cuDNN {torch.backends.cudnn.version()}, python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--kv-heads", type=int, nargs="+", default=[32, 8])
    parser.add_argument("--n", type=int, nargs="+", default=LENGTHS, help="KV lengths (tokens)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--pages-per-tile", type=int, help="default: the kernel's")
    parser.add_argument("--num-warps", type=int)
    parser.add_argument("--num-stages", type=int)
    parser.add_argument("--num-splits", type=int, help="default: choose_num_splits")
    parser.add_argument("--sweep", action="store_true", help="time the tunables, then stop")
    parser.add_argument("--sweep-pages", type=int, nargs="+", default=[16])
    parser.add_argument(
        "--sweep-points",
        nargs="+",
        metavar="B,KVH,N",
        help="sweep at these (batch, kv_heads, N) points (default: four of the grid)",
    )
    parser.add_argument("--sweep-stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--record", action="store_true", help="append a section to docs/journal.md")
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="time every kernel (the course's and SDPA's) as a CUDA graph replay: no host cost",
    )
    parser.add_argument("--results", type=Path, default=HERE.parent / "docs" / "journal.md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.decode needs a CUDA GPU; there is none here.", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy_gbs = copy_bandwidth()
    print(versions())
    if args.sweep:
        points = [tuple(int(x) for x in p.split(",")) for p in args.sweep_points or []]
        print(sweep(args.sweep_pages, copy_gbs, gen, args.graphs, points, args.sweep_stages))
        return 0
    tuning = {
        k: v
        for k, v in (
            ("pages_per_tile", args.pages_per_tile),
            ("num_warps", args.num_warps),
            ("num_stages", args.num_stages),
            ("num_splits", args.num_splits),
        )
        if v is not None
    }
    rows = []
    for batch, kv_heads, n in itertools.product(args.batch, args.kv_heads, args.n):
        need = 2 * 2 * batch * kv_heads * n * D * 2 + 4 * batch * kv_heads * n * D * 4
        if need > 0.8 * torch.cuda.mem_get_info()[0]:  # the float32 reference copies too
            print(f"skipped batch {batch}, kv_heads {kv_heads}, N {n}: {need / 2**30:.0f} GiB")
            continue
        row = bench_point(batch, kv_heads, n, args.page_size, copy_gbs, tuning, gen, args.graphs)
        rows.append(row)
        torch.cuda.empty_cache()
        print(
            f"batch {batch} kv_heads {kv_heads} N {n}: course {row['course']:.0f} GB/s", flush=True
        )
    text = table(rows, copy_gbs)
    if args.record:
        today = datetime.date.today().isoformat()
        cmd = "python -m benchmarks.decode " + " ".join(argv if argv is not None else sys.argv[1:])
        section = (
            f"\n## Decode (flash_decode vs SDPA), {today}\n\n{versions()}; `{cmd.strip()}`; "
            f"page_size {args.page_size}, tuning {tuning or 'default'}; "
            f"{'CUDA graph replays (no host cost) for every kernel' if args.graphs else 'eager'}"
            "; GQA in SDPA: "
            f"{'enable_gqa=True' if has_enable_gqa() else 'K/V expanded'}.\n\n```\n{text}\n```\n"
        )
        with args.results.open("a") as f:
            f.write(section)
        print(f"appended a section to {args.results}")
    print(text)
    return 0 if all(math.isfinite(r["course"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
