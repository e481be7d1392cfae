"""Notebook 06's exercise: a FlashAttention-2 forward kernel whose inner loop the learner writes.

The kernel here, `learner_attention_kernel`, does everything but the arithmetic of attention: it
picks its query tile and head from the program ids, loads q once, streams k and v tile by tile
(zeros past the last key), and writes out and lse. For each K/V tile it calls the learner's

    @triton.jit
    def online_softmax_step(acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale, CAUSAL):
        ...  # scores, mask, new max, exp2, rescale  ->  (acc, m_i, l_i)

and after the last tile the learner's

    @triton.jit
    def finalize_rows(acc, m_i, l_i):
        ...  # divide once, lse in natural log       ->  (out, lse)

Both are passed to the kernel as tl.constexpr arguments, so each pair of functions compiles its
own kernel. Masking is the learner's: the step gets the query and key indices of its tile and sets
the scores of keys past seqlen_k (and, when CAUSAL, of keys after the query) to -inf. The skeleton
only skips the K/V tiles that lie entirely after the diagonal.

Simpler than `forward.py`, on purpose: pointer loads only (no tensor descriptors), one loop that
masks every tile (no unmasked phase), no autotuning, query tiles launched in order.

An exercise cell that is not done yet holds `raise NotImplementedError()` inside a @triton.jit
function, which a GPU compiler may refuse with an unrelated error: `learner_attention` reads the
source of both functions first and raises NotWrittenError (a NotImplementedError shown as one line
that names the function) before anything is launched.
"""

from __future__ import annotations

import dis
import inspect
import math
import re
import weakref
from collections.abc import Callable

import torch

from course_utils.harness.triton_interpreter import INTERPRETER  # first: before triton

# isort: split
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

from course_utils.harness.kernel_inputs import check_attention_inputs
from course_utils.student_errors import NotWrittenError
from course_utils.triton_attention.forward import output_buffers

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) used when none is given.
# small tiles, so that small inputs span several tiles and ragged edges; not for speed: in the
# interpreter larger tiles run faster (measured in notebook 06, exercise 5)
INTERPRETER_BLOCKS = (32, 16, 4, 1)
GPU_BLOCKS = {  # pointer loads, one masked loop; BLOCK_M = 64 where 128 would not fit
    "d<=64": (128, 64, 4, 3),
    "d<=128": (128, 64, 8, 2),
    "large": (64, 32, 4, 2),
}


@triton.jit
def learner_attention_kernel(
    q_ptr,  # (B, H, seqlen_q, d) queries; the last dimension of every tensor is contiguous
    k_ptr,  # (B, H, seqlen_k, d) keys
    v_ptr,  # (B, H, seqlen_k, d) values
    out_ptr,  # (B, H, seqlen_q, d) output, q's dtype
    lse_ptr,  # (B, H, seqlen_q) float32, contiguous
    stride_qb,  # q's strides, in elements, along batch, head and sequence
    stride_qh,
    stride_qn,
    stride_kb,  # k's strides
    stride_kh,
    stride_kn,
    stride_vb,  # v's strides
    stride_vh,
    stride_vn,
    stride_ob,  # out's strides
    stride_oh,
    stride_on,
    num_heads,  # H: program_id(1) = b * H + h
    seqlen_q,  # queries per head
    seqlen_k,  # keys per head, at least 1
    qk_scale,  # softmax_scale * log2(e)
    STEP: tl.constexpr,  # the learner's online_softmax_step
    FINALIZE: tl.constexpr,  # the learner's finalize_rows
    HEAD_DIM: tl.constexpr,  # d
    BLOCK_D: tl.constexpr,  # d rounded up to a power of two (tl.arange needs one)
    BLOCK_M: tl.constexpr,  # queries per program (Br)
    BLOCK_N: tl.constexpr,  # keys per loop step (Bc)
    CAUSAL: tl.constexpr,  # query i sees keys 0..i only (seqlen_q == seqlen_k)
):
    """out and lse of BLOCK_M queries of one head: program (query tile, b * H + h)."""
    pid_m = tl.program_id(0)  # which query tile
    bh = tl.program_id(1)  # which (batch, head)
    off_b = (bh // num_heads).to(tl.int64)  # int64: B*H*N*d may pass 2**31
    off_h = (bh % num_heads).to(tl.int64)
    q_ptr += off_b * stride_qb + off_h * stride_qh  # this head's (seqlen_q, d) matrix
    k_ptr += off_b * stride_kb + off_h * stride_kh
    v_ptr += off_b * stride_vb + off_h * stride_vh
    out_ptr += off_b * stride_ob + off_h * stride_oh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,) columns
    q_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_qn + offs_d[None, :], mask=q_mask, other=0.0)
    # read BLOCK_M*d, once: q stays on chip for the whole loop

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # sum of exp2(s - m_i) v, unnormalized

    hi = seqlen_k
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seqlen_k)  # K/V tiles after the diagonal: skipped
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
        kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptr + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        # read 2*BLOCK_N*d; keys past seqlen_k are rows of zeros: their scores must be masked
        acc, m_i, l_i = STEP(acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale, CAUSAL)

    out, lse = FINALIZE(acc, m_i, l_i)
    tl.store(lse_ptr + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)
    out_ptrs = out_ptr + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)  # write BLOCK_M*d


_STUB = re.compile(r"^\s*raise\s+NotImplementedError\b", re.MULTILINE)


_ACCEPTED: weakref.WeakSet = weakref.WeakSet()  # kernels check_learner_function has passed


def check_learner_function(fn, name: str) -> None:
    """Refuse what cannot be launched: not a @triton.jit function, or one not written yet.

    Raises:
        TypeError: fn is not a @triton.jit function.
        NotWrittenError (a NotImplementedError): fn's body still raises NotImplementedError (the
            exercise's stub); its message names the function.
    """
    try:
        if fn in _ACCEPTED:  # launchers check on every call: once per kernel object is enough
            return
    except TypeError:  # not hashable or not weakly referable: checked below, every time
        pass
    python_fn = getattr(fn, "fn", None)
    if not isinstance(fn, KernelInterface) or not callable(python_fn):
        raise TypeError(
            f"{name} must be a @triton.jit function, got {type(fn).__name__}: put @triton.jit on "
            "the line above its def"
        )
    try:
        source = inspect.getsource(python_fn)
    except (OSError, TypeError):
        source = getattr(fn, "src", "")
    if _STUB.search(source):
        raise NotWrittenError(name)
    plain = plain_globals(python_fn)
    if plain:
        g, value = plain[0]
        raise TypeError(
            f"{name} reads the global {g} = {value!r}. The interpreter allows that, but a "
            "@triton.jit function compiled for a GPU can read only globals made with "
            f"tl.constexpr: write `{g} = tl.constexpr({value!r})`, or pass {g} as an argument"
        )
    try:
        _ACCEPTED.add(fn)
    except TypeError:
        pass


_PLAIN = (int, float, complex, str, bytes, tuple, list, dict, set)


def plain_globals(python_fn) -> list[tuple[str, object]]:
    """The globals a kernel's body reads that are plain Python values (not tl.constexpr, not a
    module, not a @triton.jit function): each one is a compile error on a GPU (Triton 3.x), though
    the interpreter runs the kernel without a word. Nested code objects are searched too."""
    names, stack = [], [python_fn.__code__]
    while stack:
        code = stack.pop()
        # only names read as globals: co_names also holds attributes (tl.where is "where")
        names += [
            i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
        ]
        stack += [c for c in code.co_consts if inspect.iscode(c)]
    found, scope = [], getattr(python_fn, "__globals__", {})
    for n in dict.fromkeys(names):
        value = scope.get(n, None)
        if n in scope and (isinstance(value, _PLAIN) or type(value).__module__ == "numpy"):
            found.append((n, value))
    return found


def default_blocks(
    head_dim: int, dtype: torch.dtype, capability: tuple[int, int] | None = None
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this head dimension and dtype.

    capability: the GPU's (major, minor); default this machine's GPU. Below sm_80 (a T4) the
    tiles are `config.tile_config`'s (tl.dot runs on FMA there, one stage, 64 KiB of shared
    memory); from sm_80 on GPU_BLOCKS. In the interpreter INTERPRETER_BLOCKS.
    """
    if INTERPRETER and capability is None:
        return INTERPRETER_BLOCKS
    if capability is None:
        capability = torch.cuda.get_device_capability()
    if tuple(capability) < (8, 0):
        from course_utils.triton_attention.config import tile_config

        return tuple(tile_config(capability, head_dim, dtype, "fwd"))
    if head_dim > 128 or dtype.itemsize > 2:
        return GPU_BLOCKS["large"]
    return GPU_BLOCKS["d<=64" if head_dim <= 64 else "d<=128"]


def learner_attention(
    step,
    finalize,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with the learner's step and finalize in `learner_attention_kernel`.

    Grid: (ceil(seqlen_q / BLOCK_M), batch * heads), one program per query tile and head.

    Args:
        step: the learner's @triton.jit online_softmax_step
            (acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale, CAUSAL) -> (acc, m_i, l_i).
        finalize: the learner's @triton.jit finalize_rows (acc, m_i, l_i) -> (out, lse).
        q: (batch, heads, seqlen_q, d), float16, bfloat16 or float32, 16 <= d <= 256.
        k, v: (batch, heads, seqlen_k, d), q's dtype and device.
        causal: query i sees keys 0..i only (needs seqlen_q == seqlen_k).
        softmax_scale: default 1/sqrt(d); the kernel gets qk_scale = softmax_scale * log2(e).
        out: (batch, heads, seqlen_q, d) tensor of q's dtype to write into (default: a new one).
        lse: (batch, heads, seqlen_q) contiguous float32 tensor to write into (default: new).
        block_m, block_n, num_warps, num_stages: the launch; default `default_blocks`.

    Returns:
        out: (batch, heads, seqlen_q, d), q's dtype.  lse: (batch, heads, seqlen_q) float32,
        natural log. In the interpreter, bfloat16 inputs run in float32 (the interpreter computes
        bfloat16 wrongly) and out is cast back.

    Raises:
        NotImplementedError: step or finalize is still the exercise's stub (nothing launched).
    """
    check_learner_function(step, "online_softmax_step")
    check_learner_function(finalize, "finalize_rows")
    check_attention_inputs(q, k, v, causal)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, int | float):
        raise TypeError(f"softmax_scale must be a number, got {softmax_scale!r}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    out, lse = output_buffers(q, out, lse)
    if out.numel() == 0 or n_k == 0:  # nothing to launch: no query, or an empty sum
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    blocks = default_blocks(d, q.dtype)
    block_m = blocks[0] if block_m is None else block_m
    block_n = blocks[1] if block_n is None else block_n
    num_warps = blocks[2] if num_warps is None else num_warps
    num_stages = blocks[3] if num_stages is None else num_stages
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not (isinstance(value, int) and value >= 16 and value & (value - 1) == 0):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {value}")

    if INTERPRETER and q.dtype == torch.bfloat16:
        out32, _ = learner_attention(
            step, finalize, q.float(), k.float(), v.float(), causal, softmax_scale, lse=lse,
            block_m=block_m, block_n=block_n,
        )  # fmt: skip
        out.copy_(out32)
        return out, lse

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out_buf = out if out.stride(-1) == 1 else torch.empty_like(q)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    learner_attention_kernel[grid](
        q, k, v, out_buf, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out_buf.stride(0), out_buf.stride(1), out_buf.stride(2),
        heads, n_q, n_k, softmax_scale * LOG2E,
        STEP=step, FINALIZE=finalize, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if out_buf is not out:
        out.copy_(out_buf)
    return out, lse


def run_learner_attention(
    step, finalize, q, k, v, causal: bool, softmax_scale: float, block_m: int, block_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One check launch: `learner_attention` into NaN-filled out and lse; returns (out, lse).

    The checks call it through call_learner, so it runs where the learner's step and finalize
    live (the notebook's kernel, when a submission is graded) and only tensors travel back.
    """
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    learner_attention(
        step, finalize, q, k, v, causal, softmax_scale, out=out, lse=lse,
        block_m=block_m, block_n=block_n,
    )  # fmt: skip
    if q.is_cuda:
        torch.cuda.synchronize()
    return out, lse


def make_learner_attention(step, finalize, **launch) -> Callable:
    """`learner_attention` with step and finalize bound: flash_attention_fwd's signature,
    (q, k, v, causal=False, softmax_scale=None) -> (out, lse), e.g. for
    `python -m benchmarks.attention --learner module:function`."""
    check_learner_function(step, "online_softmax_step")
    check_learner_function(finalize, "finalize_rows")

    def attention(q, k, v, causal=False, softmax_scale=None):
        return learner_attention(step, finalize, q, k, v, causal, softmax_scale, **launch)

    attention.__doc__ = "Attention forward with the learner's kernel: (out, lse)."
    return attention


__all__ = [
    "LOG2E",
    "check_learner_function",
    "default_blocks",
    "learner_attention",
    "learner_attention_kernel",
    "make_learner_attention",
]
