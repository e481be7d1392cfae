"""Triton's interpreter with the course's speed-ups and as Triton ships it, side by side.

    python -m benchmarks.interpreter [--rounds 3] [--steps 10] [--decodes 20]

Where there is no GPU, every kernel of the course runs in Triton's interpreter
(course_utils.harness.triton_interpreter), with two costs a GPU build never pays switched off
(harness.triton_interpreter_speed: no re-patching of triton.language at each call of a
@triton.jit helper, no integer overflow checks whose result is thrown away). This times what a
learner waits for on a CPU, each workload in a fresh Python process, both variants alternating
for --rounds rounds (the first variant of each round changes):

    training   --steps steps of the capstone's tiny GPT (notebook 11 on a CPU: 2 layers, 2 heads,
               d_model 32, context 32, batch 4) with the course's forward and backward kernels
    decode     --decodes calls of the course's flash_decode (notebook 09): 4 sequences of
               1k tokens in 16-token pages, 8 query heads over 2 KV heads, d = 64

Each process checks its answer (the training's losses against SDPA's, the decode against
naive attention) before its time counts. Prints seconds per workload, each round and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

VARIANTS = ("as shipped", "with speed-ups")
WORKLOADS = ("training", "decode")

_CHILD = r"""
import json, sys, time
import torch
import course_utils.triton_attention as ta
from course_utils.harness import triton_interpreter_speed as speed
variant, workload, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if variant == "as shipped" and not speed.uninstall():
    raise SystemExit("the speed-ups were not installed: nothing to compare")
if workload == "training":
    from course_utils.references import gpt
    text = gpt.make_corpus()
    tok = gpt.CharTokenizer(text)
    data = tok.encode(text)
    config = gpt.GPTConfig(vocab_size=tok.vocab_size, n_layers=2, n_heads=2, d_model=32, context=32)
    def train(attention):
        model = gpt.GPT(config, attention=attention, seed=0)
        return gpt.train(model, data, count, batch_size=4, seed=0, autocast=None)
    want = train("sdpa")
    start = time.perf_counter()
    got = train("course")
    seconds = time.perf_counter() - start
    if max(abs(a - b) for a, b in zip(got, want)) > 1e-3:
        raise SystemExit(f"the kernel's losses {got[-3:]} are not SDPA's {want[-3:]}")
else:
    g = torch.Generator().manual_seed(0)
    batch, q_heads, kv_heads, d, tokens, page = 4, 8, 2, 64, 1024, 16
    q = torch.randn(batch, q_heads, d, generator=g)
    k = torch.randn(batch, tokens, kv_heads, d, generator=g)
    v = torch.randn(batch, tokens, kv_heads, d, generator=g)
    pages = tokens // page
    k_cache = k.reshape(batch * pages, page, kv_heads, d)
    v_cache = v.reshape(batch * pages, page, kv_heads, d)
    table = torch.arange(batch * pages, dtype=torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), tokens, dtype=torch.int32)
    kr = k.repeat_interleave(q_heads // kv_heads, dim=2).permute(0, 2, 1, 3)
    vr = v.repeat_interleave(q_heads // kv_heads, dim=2).permute(0, 2, 1, 3)
    scores = torch.einsum("bhd,bhnd->bhn", q, kr) / d**0.5
    want = torch.einsum("bhn,bhnd->bhd", torch.softmax(scores, dim=-1), vr)
    ta.flash_decode(q, k_cache, v_cache, table, lens)
    start = time.perf_counter()
    for _ in range(count):
        got, _ = ta.flash_decode(q, k_cache, v_cache, table, lens)
    seconds = time.perf_counter() - start
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
print(json.dumps({"seconds": seconds}))
"""


def run_one(variant: str, workload: str, count: int) -> float:
    """Seconds of one workload in a fresh process, the interpreter as `variant` says."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, workload, str(count)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{workload} ({variant}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def measure(rounds: int, counts: dict[str, int], say=print) -> dict:
    """{workload: {variant: [seconds, one per round]}}."""
    times = {w: {v: [] for v in VARIANTS} for w in counts}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for workload, count in counts.items():
            for variant in order:
                times[workload][variant].append(run_one(variant, workload, count))
            row = ", ".join(f"{v} {times[workload][v][-1]:.2f} s" for v in order)
            say(f"round {r + 1}: {workload}: {row}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--decodes", type=int, default=20, help="decode calls (default 20)")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "decodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    from course_utils.harness import triton_interpreter

    if not triton_interpreter.INTERPRETER:
        parser.error("a CUDA GPU is here: the kernels do not run in the interpreter")
    times = measure(args.rounds, {"training": args.steps, "decode": args.decodes})
    print(f"medians of {args.rounds} rounds:")
    for workload, by in times.items():
        plain, fast = (statistics.median(by[v]) for v in VARIANTS)
        print(f"  {workload}: as shipped {plain:.2f} s, with speed-ups {fast:.2f} s "
              f"({fast / plain:.2f} of the time)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
