"""Tiles for the learner's backward kernels on this GPU: each candidate (BLOCK_M, BLOCK_N, warps,
stages) of the dK/dV pass and of the dQ pass timed on the learner track's solution kernels
(benchmarks/learner_solutions.py), beside the course's whole backward, bf16.

    python -m benchmarks.learner_sweep [--d 64 128] [--n 1024 4096 16384] [--causal yes]

What it informs: learner_backward.GPU_BLOCKS, the tiles the course's launcher gives a learner's
kernels on sm_80 and later. Prints one table per pass (milliseconds, lower is better; the best
per point starred) and the learner track's forward + backward against the course's with the
best tiles.
"""

from __future__ import annotations

import argparse
import functools
import math

import torch

DKDV = [(64, 64, 4, 2), (32, 128, 4, 3), (64, 128, 4, 3), (64, 128, 8, 2), (32, 64, 4, 3)]
DQ = [(64, 64, 4, 2), (128, 32, 4, 3), (128, 64, 8, 2), (128, 64, 4, 3), (64, 32, 4, 3)]


def fwd_bwd(fn, q, k, v, do, causal):
    """Forward and backward of attention fn(q, k, v, causal): the gradients (dq, dk, dv)."""
    return torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)


def main(argv=None) -> int:
    import triton.testing

    from benchmarks import learner_solutions as ls
    from course_utils.harness import triton_learner_backward as lb
    from course_utils.triton_attention import flash_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--causal", choices=["yes", "no", "both"], default="yes")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the sweep times kernels on a GPU")
        return 0
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    mod = ls.load("08_triton_backward")
    original = lb.default_blocks
    chosen = {}

    def patched(head_dim, dtype, capability=None, pass_="dkdv"):
        return chosen.get(pass_) or original(head_dim, dtype, capability, pass_)

    lb.default_blocks = patched

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")

    rows = {"dkdv": [], "dq": [], "total": []}
    for d in args.d:
        for causal in causals:
            for n in args.n:
                batch, heads = 16 * 1024 // n, 2048 // d
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (
                    torch.randn(batch, heads, n, d, device="cuda", generator=gen).bfloat16()
                    for _ in range(4)
                )
                scale = 1 / math.sqrt(d)
                out, lse = ls.attention_fwd(q, k, v, causal)
                delta = lb._launch_preprocess(mod.bwd_preprocess_kernel, out, do)
                label = f"d={d} causal={causal} N={n}"
                for pass_, cands in (("dkdv", DKDV), ("dq", DQ)):
                    times = []
                    for cfg in cands:
                        chosen.clear()
                        chosen[pass_] = cfg
                        launch = lb._launch_dkdv if pass_ == "dkdv" else lb._launch_dq
                        kernel = getattr(mod, f"bwd_{pass_}_kernel")
                        call = functools.partial(
                            launch, kernel, q, k, v, do, lse, delta, causal, scale, None, None
                        )
                        try:
                            times.append(bench(call))
                        except Exception as e:  # a config that does not compile or fit
                            print(f"{label} {pass_} {cfg}: {type(e).__name__}: {e}"[:300])
                            times.append(float("inf"))
                    rows[pass_].append((label, times))
                    print(label, pass_, " ".join(f"{t:.3f}" for t in times), flush=True)
                # whole forward + backward with the best tiles of this point
                best = {
                    p: c[min(range(len(c)), key=rows[p][-1][1].__getitem__)]
                    for p, c in (("dkdv", DKDV), ("dq", DQ))
                }
                chosen.clear()
                chosen.update(best)
                qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))

                learner = functools.partial(fwd_bwd, ls.LearnerTrack.apply, qs, ks, vs, do, causal)
                course = functools.partial(fwd_bwd, flash_attention, qs, ks, vs, do, causal)
                t_l, t_c = bench(learner), bench(course)
                chosen.clear()
                t_default = bench(learner)
                rows["total"].append((label, [t_c, t_default, t_l], best))
                print(f"{label} fwd+bwd course {t_c:.3f} learner default {t_default:.3f} "
                      f"best {t_l:.3f} ms, {best}", flush=True)  # fmt: skip
    lb.default_blocks = original
    for pass_, cands in (("dkdv", DKDV), ("dq", DQ)):
        print(f"\n{pass_} (ms) | " + " | ".join(f"{c[0]}x{c[1]} w{c[2]} s{c[3]}" for c in cands))
        for label, times in rows[pass_]:
            best = min(times)
            print(label + " | " + " | ".join(
                f"{t:.3f}{'*' if t == best else ''}" for t in times))  # fmt: skip
    print(
        "\nfwd+bwd (ms) | course | learner, today's tiles | learner, best tiles | ratio course/best"
    )
    for label, (t_c, t_d, t_l), _ in rows["total"]:
        print(f"{label} | {t_c:.3f} | {t_d:.3f} | {t_l:.3f} | {t_c / t_l:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
