"""The math libraries' threads shared among the notebooks graded at once on one machine.

torch's OpenMP pool, numpy's OpenBLAS and MKL start a thread per core in every process that uses
them, and a thread that waits for the others spins a while before it sleeps. Grade several
notebooks at once with each kernel (and each grading process, which runs the test cells' checks)
wanting every core, and the machine runs several times more threads than cores, spinning while the
thread they wait for has no core. Measured on a 2-core machine beside one busy process
(2026-12-07, nbclient, twice each): notebook 11's solution took 45.0 and 45.8 s, its kernel 43.0
and 45.6 s of CPU, with torch's two threads; 14.0 and 16.0 s, 13.4 and 15.3 s of CPU, with one.

    thread_share(at_once)   this machine's cores over the notebooks graded on it at once (>= 1)
    share_cores(threads)    in a grading process: hold it and the kernel it starts to `threads`

The grading command gives each job its share (graders/run/cluster.py: the cores over `--jobs` on a
local cluster, a node's cores over the threads of its workers on a cluster); the test suite gives
each pytest-xdist worker its share the same way (tests/conftest.py). Where one of the variables is
set already (by the instructor, the caller), nothing is changed. A grading process's numpy keeps
the OpenBLAS pool of the server it was forked from (loaded before the variables were set); its
torch is told directly.
"""

from __future__ import annotations

import os
import sys

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_share(at_once: int) -> int:
    """The cores this process may run on, shared among `at_once` processes that use them (>= 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, at_once))


def share_environment(threads: int) -> bool:
    """Set THREAD_VARIABLES to `threads` in os.environ, so that a process started from here sizes
    its pools to them; False, and nothing set, where one of them is set already (the caller
    chose: OpenBLAS and MKL also read OMP_NUM_THREADS where their own is not set)."""
    if any(name in os.environ for name in THREAD_VARIABLES):
        return False
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    return True


def share_cores(threads: int | None) -> None:
    """Hold this grading process and the kernel it starts to `threads` threads of the math
    libraries (job["threads"]; nothing when None or 0, or where the instructor set one of
    THREAD_VARIABLES). The kernel, a new process, reads THREAD_VARIABLES (the sandbox passes them:
    graders.isolation.sandbox.ENV_PASSED); torch, imported by the grading server before this
    process was forked from it, is told directly."""
    if not threads or not share_environment(threads):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
