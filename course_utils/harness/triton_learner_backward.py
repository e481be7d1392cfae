"""Notebook 08: the FlashAttention-2 backward in Triton, three kernels the learner writes.

What the learner writes (the launch signatures are fixed here, so that the checks can launch
each kernel alone):

    bwd_preprocess_kernel(out_ptr, do_ptr, delta_ptr, seqlen_q,
                          HEAD_DIM, BLOCK_D, BLOCK_M)                grid (cdiv(N_q, BLOCK_M), B*H)
    bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                    seqlen_q, seqlen_k, softmax_scale,
                    HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL)     grid (cdiv(N_k, BLOCK_N), B*H)
    bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                  seqlen_q, seqlen_k, softmax_scale,
                  HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL)       grid (cdiv(N_q, BLOCK_M), B*H)

Every tensor is contiguous (B, H, N, d) (lse and delta (B, H, N_q) float32), so head bh = b*H + h
starts bh * N * HEAD_DIM elements in. HEAD_DIM is d, BLOCK_D is d rounded up to a power of two
(at least 16). What this module gives the learner's kernels and code:

    load_tile, store_tile       @triton.jit: a (BLOCK_ROWS, BLOCK_D) tile of one head's rows,
                                zeros outside the matrix; the masked store of such a tile
    learner_backward            launches the three kernels: (dq, dk, dv), as flash_attention_bwd
    run_learner_*               one check launch each, returning tensors (and, in the
                                interpreter, how many tl.dot the launch ran)
    run_learner_function        the check's run of the learner's autograd.Function: what it
                                saved, and per backward the Triton kernels it launched, the
                                first N_q x N_k tensor a torch operation built, what it returned

Simpler than backward.py on purpose: pointer loads, one loop that masks every tile, no autotuning.
An exercise not done yet (`raise NotImplementedError()` in a kernel) raises NotWrittenError (a
NotImplementedError shown as one line that names the kernel) before anything is launched.
"""

from __future__ import annotations

import contextlib
import math

import torch

from course_utils.harness.triton_interpreter import INTERPRETER  # first: before triton

# isort: split
import triton
import triton.language as tl

from course_utils.harness.kernel_inputs import check_attention_inputs
from course_utils.harness.triton_learner import check_learner_function

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) when none is given. The interpreter's time grows with
# the tiles' area; on a GPU 64 x 64 keeps the four resident (BLOCK, d) tiles in registers for
# d <= 128 (not tuned: the course's backward.py autotunes, this launcher does not).
INTERPRETER_BLOCKS = (16, 16, 4, 1)
GPU_BLOCKS = {"small": (64, 64, 4, 2), "large": (32, 32, 4, 1)}  # large: d > 128 or float32
PREPROCESS_BLOCK_M = 32


@triton.jit
def load_tile(
    ptr,  # one head's contiguous (n_rows, HEAD_DIM) matrix
    first_row,  # the tile's first row
    n_rows,  # rows of the matrix
    BLOCK_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The (BLOCK_ROWS, BLOCK_D) tile starting at first_row; zero outside the matrix."""
    rows = first_row + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
    return tl.load(ptr + rows[:, None] * HEAD_DIM + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(
    ptr, tile, first_row, n_rows,
    BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Write the part of the (BLOCK_ROWS, BLOCK_D) tile that lies inside the matrix."""
    rows = first_row + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
    tl.store(ptr + rows[:, None] * HEAD_DIM + cols[None, :], tile, mask=mask)


def default_blocks(
    head_dim: int,
    dtype: torch.dtype,
    capability: tuple[int, int] | None = None,
    pass_: str = "dkdv",
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this head dimension and dtype.

    capability: the GPU's (major, minor); default this machine's GPU. Below sm_80 (a T4) the
    tiles of `config.tile_config` for pass_ ("dkdv" or "dq"): tl.dot runs on FMA there, with
    one stage and 64 KiB of shared memory; from sm_80 on GPU_BLOCKS. In the interpreter
    INTERPRETER_BLOCKS.
    """
    if INTERPRETER and capability is None:
        return INTERPRETER_BLOCKS
    if capability is None:
        capability = torch.cuda.get_device_capability()
    if tuple(capability) < (8, 0):
        from course_utils.triton_attention.config import tile_config

        return tuple(tile_config(capability, head_dim, dtype, pass_))
    return GPU_BLOCKS["large" if head_dim > 128 or dtype.itemsize > 2 else "small"]


def _block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _check_tile(name: str, value) -> None:
    if not (isinstance(value, int) and value >= 16 and value & (value - 1) == 0):
        raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {value}")


def _check_kernels(kernels: dict) -> None:
    for name, fn in kernels.items():
        check_learner_function(fn, name)


def _scale(softmax_scale, d: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, int | float):
        raise TypeError(f"softmax_scale must be a number, got {softmax_scale!r}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    return float(softmax_scale)


def _same_as(name: str, t, like: torch.Tensor, shape=None, dtype=None) -> None:
    shape = tuple(like.shape) if shape is None else tuple(shape)
    dtype = like.dtype if dtype is None else dtype
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != like.device:
        raise ValueError(
            f"{name} must have shape {shape}, dtype {dtype} and device {like.device}, got "
            f"{tuple(t.shape)}, {t.dtype}, {t.device}"
        )


def learner_backward(
    preprocess_kernel,
    dkdv_kernel,
    dq_kernel,
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of out = softmax(s q k^T) v by the learner's three backward kernels.

    Launches D = rowsum(dO * O) (grid (cdiv(N_q, 32), B*H)), then dK and dV (grid
    (cdiv(N_k, BLOCK_N), B*H)), then dQ (grid (cdiv(N_q, BLOCK_M), B*H)). Nothing of size
    N_q x N_k is allocated.

    Args:
        preprocess_kernel, dkdv_kernel, dq_kernel: the learner's @triton.jit kernels, with the
            signatures of the module docstring.
        do: (batch, heads, seqlen_q, d) dLoss/dout, q's dtype.
        q: (batch, heads, seqlen_q, d); k, v: (batch, heads, seqlen_k, d); float16, bfloat16
            or float32, 16 <= d <= 256.
        out: (batch, heads, seqlen_q, d), the forward's output.
        lse: (batch, heads, seqlen_q) float32, the forward's logsumexp (natural log).
        causal: query i sees keys 0..i only (seqlen_q == seqlen_k).
        softmax_scale: s, default 1/sqrt(d).
        block_m, block_n: the tiles (powers of two >= 16); default `default_blocks`.

    Returns:
        dq: (batch, heads, seqlen_q, d), dk, dv: (batch, heads, seqlen_k, d), q's dtype. In the
        interpreter bfloat16 runs in float32 (the interpreter computes bfloat16 wrongly).

    Raises:
        NotWrittenError (a NotImplementedError): a kernel is still the exercise's stub (nothing
            launched); the message names it.
    """
    _check_kernels(
        {"bwd_preprocess_kernel": preprocess_kernel, "bwd_dkdv_kernel": dkdv_kernel,
         "bwd_dq_kernel": dq_kernel}
    )  # fmt: skip
    check_attention_inputs(q, k, v, causal)
    _same_as("do", do, q)
    _same_as("out", out, q)
    _same_as("lse", lse, q, shape=q.shape[:3], dtype=torch.float32)
    scale = _scale(softmax_scale, q.shape[3])
    if q.numel() == 0 or k.shape[2] == 0:  # no query, or no key: out does not depend on q, k, v
        return tuple(torch.zeros_like(t) for t in (q, k, v))
    if INTERPRETER and q.dtype == torch.bfloat16:
        grads = learner_backward(
            preprocess_kernel, dkdv_kernel, dq_kernel, *(t.float() for t in (do, q, k, v, out)),
            lse, causal, scale, block_m=block_m, block_n=block_n,
        )  # fmt: skip
        return tuple(g.to(torch.bfloat16) for g in grads)
    delta = _launch_preprocess(preprocess_kernel, out, do)
    dk, dv = _launch_dkdv(dkdv_kernel, q, k, v, do, lse, delta, causal, scale, block_m, block_n)
    dq = _launch_dq(dq_kernel, q, k, v, do, lse, delta, causal, scale, block_m, block_n)
    return dq, dk, dv


def _tiles(q, block_m, block_n, pass_):
    blocks = default_blocks(q.shape[3], q.dtype, pass_=pass_)
    block_m = blocks[0] if block_m is None else block_m
    block_n = blocks[1] if block_n is None else block_n
    _check_tile("block_m", block_m)
    _check_tile("block_n", block_n)
    return block_m, block_n, {"num_warps": blocks[2], "num_stages": blocks[3]}


def _launch_preprocess(kernel, out, do) -> torch.Tensor:
    """delta (B, H, N_q) float32 from the learner's preprocess kernel."""
    batch, heads, n_q, d = out.shape
    out, do = out.contiguous(), do.contiguous()
    delta = torch.full((batch, heads, n_q), float("nan"), dtype=torch.float32, device=out.device)
    grid = (triton.cdiv(n_q, PREPROCESS_BLOCK_M), batch * heads)
    kernel[grid](
        out, do, delta, n_q, HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M=PREPROCESS_BLOCK_M
    )  # read 2 N_q d, write N_q per head
    return delta


def _launch_dkdv(kernel, q, k, v, do, lse, delta, causal, scale, block_m, block_n):
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    block_m, block_n, options = _tiles(q, block_m, block_n, "dkdv")
    q, k, v, do, lse, delta = (t.contiguous() for t in (q, k, v, do, lse, delta))
    dk, dv = (torch.full_like(t, float("nan")) for t in (k, v))  # an unwritten row shows up
    grid = (triton.cdiv(n_k, block_n), batch * heads)
    kernel[grid](
        q, k, v, do, lse, delta, dk, dv, n_q, n_k, scale,
        HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        **options,
    )  # fmt: skip
    return dk, dv


def _launch_dq(kernel, q, k, v, do, lse, delta, causal, scale, block_m, block_n):
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    block_m, block_n, options = _tiles(q, block_m, block_n, "dq")
    q, k, v, do, lse, delta = (t.contiguous() for t in (q, k, v, do, lse, delta))
    dq = torch.full_like(q, float("nan"))
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    kernel[grid](
        q, k, v, do, lse, delta, dq, n_q, n_k, scale,
        HEAD_DIM=d, BLOCK_D=_block_d(d), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        **options,
    )  # fmt: skip
    return dq


# ---------------------------------------------------------------------------------------------
# One launch per check call: plain tensors back (the grader compares them with its references)
# ---------------------------------------------------------------------------------------------


# Hooks on the interpreter's and torch's internals, called from wherever the learner's code runs:
# the checks' reference watch does not count them
INSTRUMENTS = ("counted", "counted_run", "__torch_dispatch__")


@contextlib.contextmanager
def _dot_counter():
    """Count the tl.dot products the interpreter runs in the block: counts[0], or None on a GPU
    (or a Triton whose interpreter has no builder to count on)."""
    counts = [None]
    builder = None
    if INTERPRETER:
        try:
            from triton.runtime.interpreter import interpreter_builder as builder
        except ImportError:  # pragma: no cover - another Triton layout
            builder = None
    if builder is None or not hasattr(builder, "create_dot"):
        yield counts
        return
    counts[0] = 0
    original = builder.create_dot

    def counted(*args, **kwargs):
        counts[0] += 1
        return original(*args, **kwargs)

    builder.create_dot = counted
    try:
        yield counts
    finally:
        del builder.create_dot  # the class's method again


def _device() -> str:
    return "cpu" if INTERPRETER else "cuda"


def _to_device(*tensors):
    return tuple(t.to(_device()) for t in tensors)


def _sync() -> None:
    if not INTERPRETER:
        torch.cuda.synchronize()


def run_learner_preprocess(kernel, out, do) -> torch.Tensor:
    """One check launch of the learner's preprocess kernel: delta (B, H, N_q) float32."""
    check_learner_function(kernel, "bwd_preprocess_kernel")
    out, do = _to_device(out, do)
    if INTERPRETER and out.dtype == torch.bfloat16:
        out, do = out.float(), do.float()
    delta = _launch_preprocess(kernel, out, do)
    _sync()
    return delta.cpu()


def _prepare(q, k, v, do, lse, delta):
    q, k, v, do, lse, delta = _to_device(q, k, v, do, lse, delta)
    if INTERPRETER and q.dtype == torch.bfloat16:
        q, k, v, do = (t.float() for t in (q, k, v, do))
    return q, k, v, do, lse.float(), delta.float()


def run_learner_dkdv(kernel, q, k, v, do, lse, delta, causal, softmax_scale, block_m, block_n):
    """One check launch of the learner's dK/dV kernel: (dk, dv, tl.dot count or None)."""
    check_learner_function(kernel, "bwd_dkdv_kernel")
    q, k, v, do, lse, delta = _prepare(q, k, v, do, lse, delta)
    with _dot_counter() as dots:
        dk, dv = _launch_dkdv(
            kernel, q, k, v, do, lse, delta, causal, softmax_scale, block_m, block_n
        )
    _sync()
    return dk.cpu(), dv.cpu(), dots[0]


def run_learner_dq(kernel, q, k, v, do, lse, delta, causal, softmax_scale, block_m, block_n):
    """One check launch of the learner's dQ kernel: (dq, tl.dot count or None)."""
    check_learner_function(kernel, "bwd_dq_kernel")
    q, k, v, do, lse, delta = _prepare(q, k, v, do, lse, delta)
    with _dot_counter() as dots:
        dq = _launch_dq(kernel, q, k, v, do, lse, delta, causal, softmax_scale, block_m, block_n)
    _sync()
    return dq.cpu(), dots[0]


def _saved_description(t) -> dict:
    return {"shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "value": t}


def _returned_description(value) -> list:
    """What a backward returned, as plain data: per gradient None, (shape, dtype) of a tensor,
    or the name of another type; a value that is not a tuple is one gradient."""
    items = list(value) if isinstance(value, tuple | list) else [value]
    return [
        None if x is None
        else (tuple(x.shape), str(x.dtype).removeprefix("torch.")) if isinstance(x, torch.Tensor)
        else type(x).__name__
        for x in items
    ]  # fmt: skip


def _return_lines(function) -> list:
    """(line, text) of every `return` in the learner's backward, line counted in its file or
    notebook cell; [] where its source cannot be read."""
    import ast
    import inspect
    import textwrap

    fn = getattr(function, "backward", None)
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Return):
            text = " ".join(lines[node.lineno - 1 : node.end_lineno]).strip()
            found.append((start + node.lineno - 1, " ".join(text.split())))
    return sorted(found)


class _LaunchLog:
    """The Triton kernels launched while the block runs, from any thread (autograd runs a CUDA
    backward on a thread of its own): (name, True for course_utils code) in launch order.

    The launchers of Triton's JITFunction (compiled) and InterpretedFunction (interpreter) are
    wrapped at class level for the duration; what they launch is unchanged."""

    def __init__(self):
        self.launches: list = []
        self._saved: list = []

    def __enter__(self):
        classes = [triton.runtime.jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - another Triton layout
            pass
        log = self.launches

        for cls in classes:
            original = cls.__dict__.get("run")
            if original is None:
                continue

            def counted_run(self, *args, _original=original, **kwargs):
                fn = getattr(self, "fn", None)
                module = getattr(fn, "__module__", "") or ""
                log.append((getattr(fn, "__name__", "?"), module.startswith("course_utils")))
                return _original(self, *args, **kwargs)

            self._saved.append((cls, original))
            cls.run = counted_run
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.run = original
        self._saved.clear()


def _score_watch(n_q: int, n_k: int):
    """A TorchDispatchMode that notes the first tensor any torch operation creates whose last
    two dimensions are (n_q, n_k) or (n_k, n_q): the score or probability matrix rebuilt.
    Dispatch modes follow autograd onto its threads (torch's ThreadLocalState)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes = {(n_q, n_k), (n_k, n_q)}

    class ScoreWatch(TorchDispatchMode):
        seen: list = []

        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # no torch.compile here: no torch._dynamo import
            return False  # (3 s, once per process, in the check's time)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not self.seen:
                for t in out if isinstance(out, tuple | list) else (out,):
                    if (
                        isinstance(t, torch.Tensor)
                        and t.dim() >= 2
                        and tuple(t.shape[-2:]) in shapes
                    ):
                        self.seen.append((str(func), tuple(t.shape)))
                        break
            return out

    watch = ScoreWatch()
    watch.seen = []
    return watch


def _recording(function, record: list):
    """A subclass of the learner's Function whose backward notes what the learner's returns
    (autograd checks it only after). The check's reference watch, a per-thread profile hook,
    is passed on to the thread autograd runs a CUDA backward on."""
    import sys

    watch = sys.getprofile()
    base = function.vjp if function.vjp is not torch.autograd.Function.vjp else function.backward

    def backward(ctx, *grads):
        other_thread = watch is not None and sys.getprofile() is None
        if other_thread:
            sys.setprofile(watch)
        try:
            returned = base(ctx, *grads)
        finally:
            if other_thread:
                sys.setprofile(None)
        record.append(_returned_description(returned))
        return returned

    body = {"backward": staticmethod(backward), "__module__": function.__module__,
            "__qualname__": function.__qualname__, "__doc__": function.__doc__}  # fmt: skip
    if base is not function.backward:
        body["vjp"] = body.pop("backward")
    return type(function.__name__, (function,), body)


def run_learner_function(function, q, k, v, causal, softmax_scale, cotangents) -> dict:
    """Apply the learner's autograd.Function once; report what it saved, what each backward did,
    and its gradients.

    out = function.apply(q, k, v, causal, softmax_scale); then, for each cotangent dO (a tensor
    of out's shape), out.backward(dO), and the gradients (dq, dk, dv) are collected. Returns
    plain data, every tensor on the CPU:

        out, grads          out, and [(dq, dk, dv), ...] one per backward that autograd accepted
        saved               [{"shape", "dtype", "value"}, ...]: grad_fn.saved_tensors
        attributes          {name: {"shape", "dtype", "value"}}: tensors kept on ctx as attributes
        backwards           per backward: {"launches": [(kernel name, is course code), ...],
                            "scores": None or (torch op, shape) of the first N_q x N_k tensor
                            it created, "returned": what backward returned (_returned_description)}
        refused             None, or the error autograd raised on what backward returned (the
                            number of gradients, a shape): one line
        returns             [(line, text)] of the `return` statements of the learner's backward
    """
    apply = getattr(function, "apply", None)
    if not callable(apply) or not isinstance(function, type):
        raise TypeError(
            "FlashAttentionTriton must be a torch.autograd.Function subclass (it has no .apply), "
            f"got {type(function).__name__}"
        )
    returned: list = []
    recording = _recording(function, returned) if issubclass(function, torch.autograd.Function) \
        else function  # fmt: skip
    q, k, v = (t.detach().to(_device()).requires_grad_(True) for t in (q, k, v))
    out = recording.apply(q, k, v, causal, softmax_scale)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"forward must return the tensor out, got {type(out).__name__}")
    if out.grad_fn is None:
        raise TypeError("out has no grad_fn: forward's output is not connected to autograd")
    saved = [_saved_description(t.detach().cpu()) for t in out.grad_fn.saved_tensors]
    attributes = {
        name: _saved_description(value.detach().cpu())
        for name, value in sorted(vars(out.grad_fn).items())
        if isinstance(value, torch.Tensor)
    }
    grads, backwards, refused = [], [], None
    for dout in cotangents:
        for t in (q, k, v):
            t.grad = None
        launches, scores = _LaunchLog(), _score_watch(q.shape[2], k.shape[2])
        done = len(returned)
        try:
            with launches, scores:
                out.backward(dout.to(out.device, out.dtype), retain_graph=True)
        except Exception as exc:
            if len(returned) == done:  # the learner's backward itself raised
                raise
            refused = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        backwards.append(
            {"launches": list(launches.launches), "scores": scores.seen[0] if scores.seen else None,
             "returned": returned[done] if len(returned) > done else None}
        )  # fmt: skip
        if refused is not None:
            break
        missing = [n for n, t in zip("qkv", (q, k, v), strict=True) if t.grad is None]
        if missing:
            refused = f"backward returned no gradient for {', '.join(missing)}"
            break
        grads.append(tuple(t.grad.detach().cpu() for t in (q, k, v)))
    _sync()
    return {
        "out": out.detach().cpu(), "saved": saved, "attributes": attributes, "grads": grads,
        "backwards": backwards, "refused": refused, "returns": _return_lines(function),
    }  # fmt: skip


__all__ = [
    "LOG2E",
    "default_blocks",
    "learner_backward",
    "load_tile",
    "run_learner_dkdv",
    "run_learner_dq",
    "run_learner_function",
    "run_learner_preprocess",
    "store_tile",
]
