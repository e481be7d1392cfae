"""Triton's interpreter where there is no CUDA GPU, switched on before triton is first imported.

    INTERPRETER       True when Triton's kernels run in the interpreter (no CUDA GPU here)
    COMPILE_ONLY      True in a child process of `triton_attention.cross_compile`: there kernels
                      are only compiled for a named GPU, never launched, so the interpreter
                      stays off even without a GPU
    COMPILE_ONLY_ENV  the environment variable that says so ("COURSE_TRITON_COMPILE_ONLY")

Importing this module does the switch: where there is no CUDA GPU (and not COMPILE_ONLY) it sets
TRITON_INTERPRET=1, then installs the interpreter's bounds guard (`triton_bounds.install`), so that
a stray tl.load or tl.store raises instead of writing anywhere, and `triton_interpreter_speed`, so
that the interpreter skips two costs a GPU build never pays. The variable must be set before triton
is first imported: triton.language defines some of its own functions (tl.max, tl.sum, ...) as
compiled kernels at import, and the interpreter cannot call those. So every module of the course
that imports triton imports this one first: `course_utils.triton_attention` (its __init__, before
any kernel) and the harness's Triton modules (triton_learner, triton_learner_backward,
triton_puzzles, decode_learner), whichever a notebook imports first. Where triton came first it
refuses, with a RuntimeError that says what to do.

A leaf: it imports torch and, in the interpreter, triton, `triton_bounds` and
`triton_interpreter_speed`, nothing else of the course, so that kernels and harness modules alike
may import it without an import circle.
"""

from __future__ import annotations

import os
import sys

import torch

COMPILE_ONLY_ENV = "COURSE_TRITON_COMPILE_ONLY"

INTERPRETER = not torch.cuda.is_available()
"""True when Triton's kernels run in the interpreter (no CUDA GPU on this machine)."""

COMPILE_ONLY = os.environ.get(COMPILE_ONLY_ENV) == "1"
"""Set by `triton_attention.cross_compile` in the child process it compiles in: there the kernels
are only compiled for a named GPU, never launched, so the interpreter stays off even without a
GPU."""

if INTERPRETER and not COMPILE_ONLY and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        # Too late: triton.language defines some of its own functions (tl.max, tl.sum, ...) as
        # compiled kernels at import, and the interpreter cannot call those.
        raise RuntimeError(
            "course_utils.triton_attention: there is no CUDA GPU, so Triton must run in its "
            "interpreter, which has to be switched on before triton is imported; triton was "
            "imported first. Import course_utils.triton_attention before triton, or set "
            "TRITON_INTERPRET=1 in the environment (os.environ or the shell) before anything "
            "imports triton."
        )
    os.environ["TRITON_INTERPRET"] = "1"

if os.environ.get("TRITON_INTERPRET") == "1" and not COMPILE_ONLY:
    from course_utils.harness.triton_bounds import install as _install_bounds_checks
    from course_utils.harness.triton_interpreter_speed import install as _install_speed

    _install_bounds_checks()  # a stray tl.load or tl.store raises instead of writing anywhere
    _install_speed()  # no re-patching per helper call, no overflow checks outside debug mode
