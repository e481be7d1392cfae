"""Ring attention on GPUs: NCCL, one process per GPU, the course's Triton kernel as local step.

    export NCCL_NVLS_ENABLE=0                       # NVLink multicast off
    python -m benchmarks.ring                       # one process per visible GPU (mp.spawn)
    python -m benchmarks.ring --nprocs 4 --seqlens 32768 65536 131072
    torchrun --nproc-per-node 8 -m benchmarks.ring  # or under torchrun
    python -m benchmarks.ring --cpu-gloo            # the same code on CPU processes (smoke test)

For each sequence length N (bf16, batch 1, 16 heads, d = 128, causal unless --no-causal) every
rank holds its zig-zag shard of N/P tokens and runs references.ring_attention.ring_attention_rank
with course_utils.triton_attention.flash_attention_fwd as local attention. Measured (median of
--iters runs after a warm-up, each run timed between two barriers, the slowest rank's time):

    ring         the whole forward of one layer: P steps, transfers overlapped with compute
    compute      the same loop with the transfers replaced by an on-device copy (no network)
    comm         the P - 1 exchanges of K/V alone, no compute
    hidden       the share of the exchange hidden behind compute: (compute + comm - ring) / comm
    TFLOP/s/GPU  the layer's FLOPs (4 B H N^2 d, half when causal) / P / ring time
    1-GPU        the Triton kernel alone on one GPU at the per-GPU length N/P (same mask)
    error        max |out_ring - out_full| / max |out_full| against the kernel on the whole
                 sequence on one GPU (bf16 outputs; where the whole sequence fits)

With a single GPU, P processes cannot share it under NCCL (it refuses two ranks on one device), so
the run is one rank (P = 1: the local step and the merge, no transfer) and says so. --cpu-gloo
runs the same loop on CPU processes with float32 torch attention, small N, to check the script.
The table is printed last.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from course_utils.harness.ring_comm import RingComm, local_attention, shard, shard_sizes, unshard
from course_utils.references.ring_attention import ring_attention_rank

HEADS, D = 16, 128


class _Done:
    def wait(self) -> None:
        pass


class CopyComm(RingComm):
    """A RingComm whose exchange copies the sent tensors into the receive buffers on the device:
    the compute-only baseline (the loop, the merges and the allocations, without the network)."""

    def exchange(self, send, dst, recv, src):
        for s, r in zip(send, recv, strict=True):
            if s.shape == r.shape:
                r.copy_(s)
        return [_Done()]


def _flops(n: int, causal: bool) -> float:
    f = 4.0 * HEADS * n * n * D
    return f / 2 if causal else f


def _timed(fn, iters: int, device) -> float:
    """Median seconds of fn over iters runs, each between barriers (slowest rank's view)."""
    times = []
    for _ in range(iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return statistics.median(times)


def _local(device):
    if device.type == "cuda":
        from course_utils.triton_attention import flash_attention_fwd

        return flash_attention_fwd
    return local_attention


def _one_length(rank, P, N, causal, iters, device, dtype):
    """Every measurement of one sequence length; returns the row (on every rank)."""
    gen = torch.Generator(device="cpu").manual_seed(1234 + N)
    full = [torch.randn(1, HEADS, N, D, generator=gen, dtype=torch.float32) for _ in range(3)]
    q, k, v = (shard(x, P)[rank].to(device=device, dtype=dtype).contiguous() for x in full)
    sizes = shard_sizes(N, P)
    scale = 1.0 / math.sqrt(D)
    attn = _local(device)

    def ring():
        return ring_attention_rank(q, k, v, causal, scale, RingComm(rank, P, sizes), attn)

    def compute():
        return ring_attention_rank(q, k, v, causal, scale, CopyComm(rank, P, sizes), attn)

    def comm_only():
        comm, kk, vv = RingComm(rank, P, sizes), k, v
        for step in range(P - 1):
            n_next = sum(sizes[(rank - step - 1) % P])
            k_next = kk.new_empty(kk.shape[:2] + (n_next, D))
            v_next = torch.empty_like(k_next)
            for r in comm.exchange([kk, vv], (rank + 1) % P, [k_next, v_next], (rank - 1) % P):
                r.wait()
            kk, vv = k_next, v_next

    out, _ = ring()  # warm-up: autotuning, NCCL communicators
    compute()
    comm_only()
    t_ring = _timed(ring, iters, device)
    t_compute = _timed(compute, iters, device)
    t_comm = _timed(comm_only, iters, device) if P > 1 else 0.0
    n_local = sum(sizes[rank])
    q1, k1, v1 = (x[:, :, :n_local].contiguous() for x in (q, k, v))
    t_single = _timed(lambda: attn(q1, k1, v1, causal, scale), iters, device)
    # exactness: gather the outputs to rank 0 and compare with the kernel on the whole sequence
    outs = [
        torch.empty(1, HEADS, sum(sizes[r]), D, dtype=out.dtype, device=device) for r in range(P)
    ]
    dist.all_gather(outs, out.contiguous()) if _even(sizes) else _gather_ragged(outs, out, rank, P)
    err = float("nan")
    if rank == 0:
        try:
            ring_out = unshard([o.float() for o in outs])
            qf, kf, vf = (x.to(device=device, dtype=dtype) for x in full)
            ref, _ = attn(qf, kf, vf, causal, scale)
            ref = ref.float()
            err = float((ring_out - ref).abs().max() / ref.abs().max())
        except torch.cuda.OutOfMemoryError:  # the whole sequence does not fit on one GPU
            err = float("nan")
    hidden = (t_compute + t_comm - t_ring) / t_comm if t_comm > 0 else float("nan")
    return {
        "N": N,
        "P": P,
        "causal": causal,
        "ring_ms": 1e3 * t_ring,
        "compute_ms": 1e3 * t_compute,
        "comm_ms": 1e3 * t_comm,
        "hidden": max(0.0, min(1.0, hidden)) if t_comm > 0 else float("nan"),
        "tflops_gpu": _flops(N, causal) / P / t_ring / 1e12,
        "single_tflops": _flops(n_local, causal) / t_single / 1e12,
        "n_local": n_local,
        "error": err,
    }


def _even(sizes) -> bool:
    return len({f + b for f, b in sizes}) == 1


def _gather_ragged(outs, out, rank, P):
    """all_gather needs equal sizes: send each shard to rank 0 instead."""
    if rank == 0:
        outs[0].copy_(out)
        for r in range(1, P):
            dist.recv(outs[r], r)
    else:
        dist.send(out.contiguous(), 0)


def worker(rank: int, P: int, args, store_path: str | None) -> None:
    backend = "gloo" if args.cpu_gloo else "nccl"
    if args.cpu_gloo:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        device, dtype = torch.device("cpu"), torch.float32
        torch.set_num_threads(1)
    else:
        device, dtype = torch.device("cuda", rank % torch.cuda.device_count()), torch.bfloat16
        torch.cuda.set_device(device)
    if store_path is None:  # torchrun: MASTER_ADDR / MASTER_PORT in the environment
        dist.init_process_group(backend, timeout=timedelta(seconds=600))
    else:
        store = dist.FileStore(store_path, P)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=P, timeout=timedelta(seconds=600)
        )
    rows = []
    for N in args.seqlens:
        try:
            rows.append(_one_length(rank, P, N, not args.no_causal, args.iters, device, dtype))
        except torch.cuda.OutOfMemoryError:
            if rank == 0:
                print(f"N = {N}: out of memory, stopping here", flush=True)
            break
        if rank == 0:
            r = rows[-1]
            print(f"done N = {N}: ring {r['ring_ms']:.3f} ms", flush=True)
    if rank == 0:
        _table(rows, P, backend, device)
    dist.destroy_process_group()


def _table(rows, P, backend, device) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print()
    print(f"Ring attention forward, {P} rank(s), {backend}, {name}, B = 1, H = {HEADS}, d = {D}")
    print(
        f"{'N':>8} {'N/P':>7} {'mask':>6} {'ring ms':>9} {'compute':>9} {'comm':>8} "
        f"{'hidden':>7} {'TFLOP/s/GPU':>12} {'1-GPU TFLOP/s':>14} {'rel error':>10}"
    )
    for r in rows:
        hidden = "-" if math.isnan(r["hidden"]) else f"{100 * r['hidden']:.0f}%"
        print(
            f"{r['N']:>8} {r['n_local']:>7} {'causal' if r['causal'] else 'none':>6} "
            f"{r['ring_ms']:>9.3f} {r['compute_ms']:>9.3f} {r['comm_ms']:>8.3f} {hidden:>7} "
            f"{r['tflops_gpu']:>12.1f} {r['single_tflops']:>14.1f} {r['error']:>10.2e}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=None, help="ranks (default: GPUs)")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072, 262144])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--cpu-gloo", action="store_true", help="CPU processes, float32, gloo")
    args = parser.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return 0
    if args.cpu_gloo:
        P = args.nprocs or 2
        if args.seqlens == parser.get_default("seqlens"):
            args.seqlens = [256, 515]
    else:
        if not torch.cuda.is_available():
            print("no CUDA GPU here: run with --cpu-gloo for a CPU smoke test")
            return 0
        gpus = torch.cuda.device_count()
        P = args.nprocs or gpus
        if P > gpus:
            print(
                f"{P} ranks need {P} GPUs, {gpus} visible: NCCL refuses two ranks on one GPU. "
                f"Running {gpus} rank(s) instead" + (" (P = 1: no transfer)" if gpus == 1 else "")
            )
            P = gpus
        elif P == 1:
            print("one GPU: a ring of one rank (the local step and the merge, no transfer)")
    with tempfile.TemporaryDirectory(prefix="ring-bench-") as tmp:
        torch.multiprocessing.spawn(
            worker, args=(P, args, os.path.join(tmp, "store")), nprocs=P, join=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
