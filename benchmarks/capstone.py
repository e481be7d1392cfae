"""The capstone's measurements on a GPU: a GPT's training throughput and attention's peak memory,
for naive attention, SDPA (its default choice and each backend), the course's Triton kernels and
the learner track's solution kernels (benchmarks/learner_solutions.py), in one run.

    python -m benchmarks.capstone [--contexts 1024 2048 4096 8192 16384] [--steps 10]
                                  [--out DIR] [--no-append]

Throughput: notebook 11's model (references.gpt: 4 layers, 16 heads of d = 64, d_model 1024,
bf16 weights), batch x context = 16k tokens per step, forward + backward + AdamW step, the mean
of --steps timed steps after 3 untimed ones (gpt.tokens_per_second). Peak memory: one causal
attention call, forward + backward, batch 1, 16 heads, d = 64, bf16 (gpt.peak_memory), the bytes
beyond its inputs. A backend that runs out of memory shows "OOM". Every backend is first
checked against SDPA on one small causal case (forward and gradients), so a wrong kernel is never
timed. The markdown table is printed last and, unless --no-append, appended to docs/journal.md.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
TOKENS = 16 * 1024  # batch * context per training step
CHECK_TOL = 2e-2  # relative difference to SDPA (float32 math) in bf16


def sdpa_backend(name: str):
    """attention(q, k, v, causal) -> out through one SDPA backend ("flash", "cudnn", ...)."""
    from benchmarks.attention import sdpa_fn

    def attention(q, k, v, causal):
        return sdpa_fn(name, q, k, v, bool(causal))()

    attention.__name__ = f"sdpa-{name}"
    return attention


def backends() -> dict:
    """name -> attention(q, k, v, causal) for every column of the tables."""
    from benchmarks import learner_solutions
    from course_utils.references import gpt

    return {
        "naive": gpt.resolve_attention("naive"),
        "sdpa": gpt.resolve_attention("sdpa"),
        "sdpa-flash": sdpa_backend("flash"),
        "sdpa-cudnn": sdpa_backend("cudnn"),
        "course": gpt.resolve_attention("course"),
        "learner": gpt.resolve_attention(learner_solutions.LearnerTrack),
    }


def check(name: str, attention) -> str:
    """'' if attention matches float32 SDPA on a causal (2, 4, 1000, 64) bf16 case (out and the
    three gradients), else what differs."""
    from benchmarks.attention import rel_diff as rel
    from course_utils.references import gpt

    q, k, v = gpt.attention_inputs(2, 4, 1000, 64, torch.bfloat16, "cuda", seed=1)
    dout = torch.randn_like(q)
    out = attention(q, k, v, True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), dout.float())
    bad = [
        f"{what} {err:.1e}"
        for what, err in zip(
            ("out", "dq", "dk", "dv"),
            [rel(out, ref)] + [rel(g, r) for g, r in zip(grads, ref_grads, strict=True)],
            strict=True,
        )
        if not err < CHECK_TOL
    ]
    return f"{name}: differs from SDPA ({', '.join(bad)})" if bad else ""


def throughput(attention, contexts, steps: int, log) -> list[float | None]:
    """Training tokens/s at each context (None: out of memory)."""
    from course_utils.references import gpt

    vocab = gpt.CharTokenizer(gpt.make_corpus()).vocab_size  # notebook 11's text
    config = gpt.GPTConfig(
        vocab_size=vocab, n_layers=4, n_heads=16, d_model=1024, context=max(contexts)
    )
    row = []
    for ctx in contexts:
        try:
            model = gpt.GPT(config, attention=attention).to("cuda", torch.bfloat16)
            row.append(gpt.tokens_per_second(model, TOKENS // ctx, ctx, steps=steps))
        except torch.cuda.OutOfMemoryError:
            row.append(None)
        model = None
        torch.cuda.empty_cache()
        log(f"  context {ctx}: {'OOM' if row[-1] is None else f'{row[-1]:,.0f} tokens/s'}")
    return row


def peaks(attention, lengths, log) -> list[int | None]:
    from course_utils.references import gpt

    row = []
    for n in lengths:
        try:
            row.append(gpt.peak_memory(attention, 1, 16, n, 64))
        except torch.cuda.OutOfMemoryError:
            row.append(None)
        torch.cuda.empty_cache()
        log(f"  N {n}: {'OOM' if row[-1] is None else f'{row[-1] / 2**20:,.0f} MiB'}")
    return row


def slope(xs, ys) -> float | None:
    """The log-log slope of ys against xs (2 for O(N^2), 1 for O(N)), OOM points left out."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y]
    if len(pts) < 2:
        return None
    return float(np.polyfit(np.log([x for x, _ in pts]), np.log([y for _, y in pts]), 1)[0])


def markdown(contexts, tps: dict, lengths, mem: dict, failed: list[str], command: str) -> str:
    from benchmarks.attention import CLOCKS, nvidia_smi, versions

    names = list(tps)
    lines = [
        f"## Capstone: GPT training throughput and attention memory, "
        f"{torch.cuda.get_device_name()}, {datetime.date.today()}",
        "",
        f"- device: {nvidia_smi('name,driver_version')}; clocks at the end: {nvidia_smi(CLOCKS)}",
        f"- versions: {versions()}",
        f"- command: `{command}`",
        "- model: references.gpt, 4 layers, 16 heads of d = 64, d_model 1024, bf16 weights, "
        f"AdamW; batch x context = {TOKENS:,} tokens per step",
        "- learner: the learner track's solutions (notebook 06's forward, notebook 08's three "
        "backward kernels), benchmarks/learner_solutions.py",
        "",
        "Training tokens per second (higher is better):",
        "",
        "| context | " + " | ".join(names) + " | learner/course | course/sdpa |",
        "|---" * (len(names) + 3) + "|",
    ]

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    for i, ctx in enumerate(contexts):
        cells = [f"{tps[n][i]:,.0f}" if tps[n][i] else "OOM" for n in names]
        learner = tps["learner"][i] if "learner" in tps else None
        course, sdpa = tps["course"][i], tps["sdpa"][i]
        lines.append(
            f"| {ctx} | {' | '.join(cells)} | {ratio(learner, course)} | {ratio(course, sdpa)} |"
        )
    lines += [
        "",
        "Peak GPU memory of one causal attention call, forward + backward, beyond its inputs "
        "(MiB; B = 1, 16 heads, d = 64, bf16), and the log-log slope against N:",
        "",
        "| N | " + " | ".join(mem) + " |",
        "|---" * (len(mem) + 1) + "|",
    ]
    for i, n in enumerate(lengths):
        cells = [f"{mem[m][i] / 2**20:,.0f}" if mem[m][i] else "OOM" for m in mem]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    slopes = [slope(lengths, mem[m]) for m in mem]
    lines.append("| slope | " + " | ".join(f"{s:.2f}" if s else "-" for s in slopes) + " |")
    if failed:
        lines += ["", "Not timed (failed the check against SDPA): " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per point")
    ap.add_argument("--out", default=None, help="folder for capstone.md and the log")
    ap.add_argument("--no-append", action="store_true", help="do not append to docs/journal.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the capstone's throughput and peak memory are GPU measurements")
        return 0
    for name, values in (("--contexts", args.contexts), ("--lengths", args.lengths)):
        bad = [c for c in values if c < 64 or c > TOKENS or TOKENS % c]
        if bad:
            raise SystemExit(f"{name}: each must divide {TOKENS} and be at least 64, got {bad}")
    if args.steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {args.steps}")
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    command = "python -m benchmarks.capstone " + shlex.join(sys.argv[1:] if argv is None else argv)
    tps, mem, failed = {}, {}, []
    for name, attention in backends().items():
        log(f"== {name}")
        problem = check(name, attention)
        if problem:
            log(problem)
            failed.append(problem)
            continue
        tps[name] = throughput(attention, args.contexts, args.steps, log)
        mem[name] = peaks(attention, args.lengths, log)
    for name in ("course", "sdpa"):
        tps.setdefault(name, [None] * len(args.contexts))
    text = markdown(args.contexts, tps, args.lengths, mem, failed, command)
    print("\n" + text)
    if out:
        (out / "capstone.md").write_text(text)
    if not args.no_append:
        with open(HERE.parent / "docs" / "journal.md", "a") as f:
            f.write("\n" + text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
