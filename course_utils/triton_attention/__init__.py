"""Triton GPU kernels of the course, behind one interface; without a CUDA GPU they run in Triton's
interpreter.

The interface (this package's names):

    flash_attention       forward and backward as one differentiable torch function (autograd)
    flash_attention_fwd   the FlashAttention-2 forward kernel, (out, lse) (notebook 06)
    flash_attention_bwd   the backward kernels, P recomputed from lse (dK/dV, then dQ)
    flash_decode          split-KV decoding over a paged KV cache, GQA (notebook 09)
    pick_dtype, tile_config
                          the dtype and the tiles a chip takes (config; sm_75 to sm_90)

Modules, imports going one way (interface -> autograd -> teaching kernels -> config):

    autograd      flash_attention, FlashAttentionFunction, and `pick_kernel`: the one place that
                  says which kernels run each pass (below)
    forward       the teaching forward kernel and its launcher
    backward      the teaching backward kernels (preprocess D, dK/dV, dQ)
    decode        flash_decode and its split choice
    config        chips, pick_dtype, check_dtype_for, tile_config, the autotuning sets
    hopper/       the Hopper (sm_90) kernels in Gluon: forward_ws, backward_ws (+ its device code
                  backward_ws_kernel); they import the teaching kernels' helpers, never the reverse
    cross_compile compile tooling, apart from the kernels: compile a kernel for a GPU that is not
                  there (sm_75, sm_80, sm_90) in compile-only child processes

Which kernels `flash_attention` runs: `flash_attention(q, k, v, causal, softmax_scale,
kernels="auto")`. With kernels="auto" (the default) each pass runs the Hopper kernel where it was
measured the faster on the H200 (`hopper.forward_ws.preferred`, `hopper.backward_ws.preferred`:
a Hopper GPU and a shape it takes), the teaching kernel everywhere else, the interpreter
included; kernels="teaching" always runs the teaching kernels; kernels="hopper" runs the Hopper
kernel wherever it takes the inputs. `autograd.pick_kernel(pass_, q, k, v, causal, kernels)` says
which one a call runs. `flash_attention_fwd` and `flash_attention_bwd` are always the teaching
kernels.

Importing this subpackage on a machine without a CUDA GPU turns on Triton's interpreter
(TRITON_INTERPRET=1, by `course_utils.harness.triton_interpreter`, imported first), which runs
every kernel in NumPy on CPU tensors: slow, but the same code and the same answers. `course_utils`
never imports this subpackage itself, so the NumPy parts of the course work without torch or
triton.

Interpreter caveats: the variable must be set before triton is first imported, so import this
subpackage (or a harness module that uses Triton) first; it refuses, with a RuntimeError that
says so, when triton came first. The interpreter computes bfloat16 wrongly without a warning, so
`flash_attention_fwd` upcasts bfloat16 inputs to float32 there and casts the output back. In the
interpreter a pointer is an address in this process, so a store without its mask would write
anywhere: `harness.triton_bounds` checks every load and store of every launch against the
launch's tensors first, and raises OutOfBoundsError (which names the tensor, the program and the
mask that was missing) instead; `triton_interpreter` installs it with the switch.
"""

from __future__ import annotations

# First, before anything imports triton: the interpreter where there is no GPU, and its guard.
from course_utils.harness.triton_interpreter import COMPILE_ONLY, INTERPRETER

# isort: split
from course_utils.triton_attention.autograd import (
    FlashAttentionFunction,
    flash_attention,
    pick_kernel,
)
from course_utils.triton_attention.backward import flash_attention_bwd
from course_utils.triton_attention.config import pick_dtype, tile_config
from course_utils.triton_attention.decode import choose_num_splits, flash_decode
from course_utils.triton_attention.forward import flash_attention_fwd, launch_flash_attention_fwd

__all__ = [
    "COMPILE_ONLY",
    "INTERPRETER",
    "FlashAttentionFunction",
    "choose_num_splits",
    "flash_attention",
    "flash_attention_bwd",
    "flash_attention_fwd",
    "flash_decode",
    "launch_flash_attention_fwd",
    "pick_dtype",
    "pick_kernel",
    "tile_config",
]
