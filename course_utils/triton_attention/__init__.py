"""Triton GPU kernels of the course; without a CUDA GPU they run in Triton's interpreter.

    forward     flash_attention_fwd: the FlashAttention-2 forward kernel (notebook 06)
    backward    flash_attention_bwd: the backward kernels, P recomputed from lse (dK/dV, then dQ)
    autograd    flash_attention: forward and backward as one differentiable torch function
    decode      flash_decode: split-KV decoding over a paged KV cache, GQA (notebook 09)
    targets     compile for a GPU that is not there (sm_75, sm_80, sm_90); pick_dtype, tile_config

Importing this subpackage on a machine without a CUDA GPU turns on Triton's interpreter
(TRITON_INTERPRET=1), which runs every kernel in NumPy on CPU tensors: slow, but the same code and
the same answers. `course_utils` never imports this subpackage itself, so the NumPy parts of the
course work without torch or triton.

Interpreter caveats: the variable must be set before triton is first imported, so import this
subpackage first (it refuses, with a RuntimeError that says so, when triton came first). The
interpreter computes bfloat16 wrongly without a warning, so `flash_attention_fwd` upcasts
bfloat16 inputs to float32 there and casts the output back. In the interpreter a pointer is an
address in this process, so a store without its mask would write anywhere: `bounds` checks every
load and store of every launch against the launch's tensors first, and raises OutOfBoundsError
(which names the tensor, the program and the mask that was missing) instead.
"""

from __future__ import annotations

import os
import sys

import torch

INTERPRETER = not torch.cuda.is_available()
"""True when Triton's kernels run in the interpreter (no CUDA GPU on this machine)."""

COMPILE_ONLY = os.environ.get("COURSE_TRITON_COMPILE_ONLY") == "1"
"""Set by `targets.compile_for` in the child process it compiles in: there the kernels are only
compiled for a named GPU, never launched, so the interpreter stays off even without a GPU."""

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

from course_utils.triton_attention.autograd import FlashAttentionFunction, flash_attention  # noqa: E402
from course_utils.triton_attention.backward import flash_attention_bwd  # noqa: E402
from course_utils.triton_attention.decode import choose_num_splits, flash_decode  # noqa: E402
from course_utils.triton_attention.forward import flash_attention_fwd, launch_flash_attention_fwd  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1" and not COMPILE_ONLY:
    from course_utils.harness.triton_bounds import install as _install_bounds_checks

    _install_bounds_checks()  # a stray tl.load or tl.store raises instead of writing anywhere

__all__ = [
    "INTERPRETER",
    "FlashAttentionFunction",
    "choose_num_splits",
    "flash_attention",
    "flash_attention_bwd",
    "flash_attention_fwd",
    "flash_decode",
    "launch_flash_attention_fwd",
]
