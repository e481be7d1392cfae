"""What one call of a student's function costs the grader: a request each, or the serve loop.

    python -m benchmarks.verdict_channel [--calls 300] [--rounds 3] [--size 64]

A graded test cell runs in the grader; each time its check calls the student's function, the
arguments go to the student's kernel and the result comes back (graders/isolation/remote.py). This
starts one IPython kernel (nbclient, as the grader drives it; no sandbox), defines a function
there, and calls it --calls times through a KernelChannel in two ways, alternating for --rounds
rounds: one execute request per call (the channel outside `serve`, what every call cost before
the serve loop) and all the calls inside one `serve` (what a test cell does now). Each call sends
a (4, size) float64 array and gets its exp back, checked. Prints milliseconds per call, each
round and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = ("one request a call", "served")


def measure(calls: int, rounds: int, size: int, say=print) -> dict[str, list[float]]:
    """{mode: [ms per call, one per round]}."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    from graders.isolation.remote import KernelChannel, RemoteFunction
    from graders.run.local_kernel import LocalKernelManager

    nb = new_notebook(cells=[new_code_cell("import numpy as np\ndef f(x):\n    return np.exp(x)")])
    client = NotebookClient(
        nb, kernel_name="python3", timeout=120, kernel_manager_class=LocalKernelManager
    )
    times: dict[str, list[float]] = {m: [] for m in MODES}
    with client.setup_kernel(), tempfile.TemporaryDirectory(prefix="verdict-channel-") as io:
        client.execute_cell(nb.cells[0], 0)

        def execute(code: str) -> None:
            cell = new_code_cell(code)
            client.execute_cell(cell, 0, store_history=False)
            errors = [o for o in cell.outputs if o.output_type == "error"]
            if errors:
                raise RuntimeError(f"the kernel answered {errors[0].ename}: {errors[0].evalue}")

        channel = KernelChannel(execute, Path(io))
        f = RemoteFunction(channel, {"global": "f"}, ["x"], "f")
        x = np.random.default_rng(0).random((4, size))

        def work() -> float:
            start = time.perf_counter()
            for i in range(calls):
                y = f(x + i)  # a new input each time: the channel does not answer from memory
                if not np.allclose(y, np.exp(x + i)):
                    raise SystemExit("the kernel's answer is wrong: nothing was timed")
            return (time.perf_counter() - start) * 1000 / calls

        work()  # warm: the kernel imports the agent and the wire format once
        for r in range(rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                ms = work() if mode == MODES[0] else channel.serve(work)
                times[mode].append(ms)
                say(f"round {r + 1}: {mode}: {ms:.2f} ms a call")
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per round and mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=64, help="columns of the (4, size) argument")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.rounds < 1 or args.size < 1:
        ap.error("--calls, --rounds and --size must be at least 1")
    times = measure(args.calls, args.rounds, args.size)
    for mode in MODES:
        print(f"median, {mode}: {statistics.median(times[mode]):.2f} ms a call")


if __name__ == "__main__":
    main()
