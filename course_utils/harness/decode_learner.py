"""Notebook 09's exercise: a flash-decoding kernel whose chunk loop the learner writes.

`learner_decode_partials_kernel` does the bookkeeping of a split-KV decode program: it finds its
sequence b, KV head and split from the program ids, loads the group of query heads that share the
KV head (padded to 16 rows for tl.dot), computes its chunk of tokens [chunk_start, chunk_end)
(whole pages; empty when the split lies past the sequence's length), offsets the cache pointers
to its KV head and the block table to its sequence's row, and stores the chunk's (out, lse). The
work in between is the learner's

    @triton.jit
    def attend_chunk(q, k_ptr, v_ptr, table_ptr, chunk_start, chunk_end, qk_scale,
                     stride_page, stride_tok, offs_d, HEAD_DIM, PAGE_SIZE):
        ...  # loop over the chunk's pages: block-table lookup, masked loads, online softmax in
        ...  # exp2 form; then out = acc / l_i and lse in natural log (0 and -inf when empty)
        return out, lse

passed to the kernel as a tl.constexpr, so each learner function compiles its own kernel. The
merge of the partials is the learner's `merge_splits(out_partial, lse_partial) -> (out, lse)`,
a torch function.

    learner_decode_partials(attend_chunk, q, k_cache, v_cache, block_table, seq_lens, ...)
    learner_flash_decode(attend_chunk, merge_splits, q, k_cache, ...)   partials, then the merge
    run_learner_partials(...)                                            what the checks launch

An error raised inside the learner's attend_chunk while the kernel runs reaches the notebook as
AttendChunkError, one line that names the failing line of attend_chunk, the error and, for the
mistakes we know (a loop variable used as a tensor, which it is not in the interpreter), the fix;
the interpreter's own traceback, some sixty lines through Triton's frames, is what it replaces.
The original error stays its __cause__, so the checks (checks.engine.kernels._raised_failure)
still report the root cause with their input.

The skeleton is simpler than course_utils/triton_attention/decode.py: one page per K/V tile
(that kernel gathers several pages into one tile), K and V with one set of strides (contiguous
caches), no tuning.
"""

from __future__ import annotations

import re
import traceback

import torch

from course_utils.harness.triton_interpreter import INTERPRETER  # first: before triton

# isort: split
import triton
import triton.language as tl

from course_utils.harness.kernel_inputs import (
    LOG2E,
    MAX_SPLITS,
    MIN_ROWS,
    check_decode_inputs,
    choose_num_splits,
    pages_per_split,
)
from course_utils.harness.triton_bounds import OutOfBoundsError
from course_utils.harness.triton_learner import check_learner_function

_PLAIN_NUMBER = re.compile(
    r"'(int|float|bool)' object (has no attribute '(\w+)'|is not subscriptable)"
)


class AttendChunkError(RuntimeError):
    """The learner's attend_chunk raised while the kernel ran; shown in a notebook as one line."""

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain (the interpreter wraps the learner's error twice)."""
    seen = set()
    while id(exc) not in seen and (exc.__cause__ or exc.__context__) is not None:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exc


def attend_chunk_error(attend_chunk, exc: BaseException) -> AttendChunkError | None:
    """One line for an error raised inside attend_chunk, or None when it was raised elsewhere.

    The line names the statement of attend_chunk that failed (from the root cause's traceback),
    the error, and the fix when the error is a plain Python number used as a tensor: in Triton's
    interpreter the loop variable of `range` is an int (a tensor when compiled for a GPU), so
    `start.to(...)`, `start.dtype` or `start[None]` fail there.
    """
    python_fn = getattr(attend_chunk, "fn", None)
    code = getattr(python_fn, "__code__", None)
    root = _root_cause(exc)
    if code is None or root.__traceback__ is None:
        return None
    frames = [
        f
        for f in traceback.extract_tb(root.__traceback__)
        if f.name == code.co_name and f.filename == code.co_filename
    ]
    if not frames:  # not raised in the learner's function: the usual traceback
        return None
    statement = (frames[-1].line or "").strip()
    where = f"`{statement}`" if statement else f"line {frames[-1].lineno}"
    message = f"{code.co_name} raised {type(root).__name__}: {root} at {where}."
    plain = _PLAIN_NUMBER.search(str(root))
    if plain:
        message += (
            f" A plain Python {plain.group(1)} is used as a tensor: in Triton's interpreter the "
            "loop variable of `range(...)` is an int (a tensor only when compiled for a GPU), "
            "so it has no `.to`, `.dtype` or `[...]`. Cast with `tl.cast(start, tl.int64)`, or "
            "cast what you load: `tl.load(table_ptr + start // PAGE_SIZE).to(tl.int64)`."
        )
    return AttendChunkError(message)


@triton.jit
def learner_decode_partials_kernel(
    q_ptr,  # (batch, q_heads, d) queries, contiguous
    k_ptr,  # (num_pages, page_size, kv_heads, d) key cache, contiguous
    v_ptr,  # (num_pages, page_size, kv_heads, d) value cache, k's strides
    table_ptr,  # (batch, max_pages) int32, contiguous
    seq_lens_ptr,  # (batch,) int32
    out_part_ptr,  # (batch, q_heads, num_splits, d) float32, contiguous
    lse_part_ptr,  # (batch, q_heads, num_splits) float32, contiguous
    kv_heads,
    max_pages,  # block_table's width
    num_splits,
    pages_per_split,  # split s holds logical pages s * pages_per_split .. (s + 1) * ... - 1
    qk_scale,  # softmax_scale * log2(e)
    ATTEND: tl.constexpr,  # the learner's attend_chunk
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16
    HEAD_DIM: tl.constexpr,  # d
    BLOCK_D: tl.constexpr,  # d rounded up to a power of two
    PAGE_SIZE: tl.constexpr,  # tokens per page
):
    """One chunk of one sequence's cache for the GROUP query heads of one KV head."""
    pid = tl.program_id(0)  # b * kv_heads + kv_head
    split = tl.program_id(1)
    b = pid // kv_heads
    kv_head = pid % kv_heads
    q_heads = kv_heads * GROUP
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q_ptrs = q_ptr + (b * q_heads + heads)[:, None].to(tl.int64) * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptrs, mask=h_mask[:, None] & d_mask[None, :], other=0.0)  # padded rows are 0

    seq_len = tl.load(seq_lens_ptr + b)
    chunk_start = split * pages_per_split * PAGE_SIZE
    chunk_end = tl.maximum(
        tl.minimum(chunk_start + pages_per_split * PAGE_SIZE, seq_len), chunk_start
    )
    stride_tok = kv_heads * HEAD_DIM  # contiguous (num_pages, page_size, kv_heads, d)
    stride_page = PAGE_SIZE * stride_tok
    k_head = k_ptr + kv_head.to(tl.int64) * HEAD_DIM  # this KV head's column of the cache
    v_head = v_ptr + kv_head.to(tl.int64) * HEAD_DIM
    table = table_ptr + b.to(tl.int64) * max_pages  # this sequence's row of the block table

    out, lse = ATTEND(
        q, k_head, v_head, table, chunk_start, chunk_end, qk_scale, stride_page, stride_tok,
        offs_d, HEAD_DIM, PAGE_SIZE,
    )  # fmt: skip

    row = (b * q_heads + heads).to(tl.int64) * num_splits + split  # (b, head, split)
    tl.store(lse_part_ptr + row, lse, mask=h_mask)
    out_ptrs = out_part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out_ptrs, out, mask=h_mask[:, None] & d_mask[None, :])


def learner_decode_partials(
    attend_chunk,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int | None = None,
    *,
    out_partial: torch.Tensor | None = None,
    lse_partial: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's (out, lse) with the learner's attend_chunk in the skeleton's kernel.

    Grid: (batch * kv_heads, num_splits). Args as course_utils.triton_attention.flash_decode.

    Returns:
        out_partial: (batch, q_heads, num_splits, d) float32, each chunk's normalized out (0 for
            an empty chunk).  lse_partial: (batch, q_heads, num_splits) float32, natural log
            (-inf for an empty chunk). In the interpreter bfloat16 runs in float32.

    Raises:
        NotWrittenError (a NotImplementedError): attend_chunk is still the exercise's stub
            (nothing launched).
        AttendChunkError: attend_chunk raised while the kernel ran (one line; the error itself
            is its __cause__).
    """
    check_learner_function(attend_chunk, "attend_chunk")
    batch, q_heads, kv_heads, d, _, page_size, max_pages = check_decode_inputs(
        q, k_cache, v_cache, block_table, seq_lens
    )
    if softmax_scale is None:
        softmax_scale = d**-0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, int | float):
        raise TypeError(f"softmax_scale must be a number, got {softmax_scale!r}")
    if not softmax_scale > 0 or softmax_scale == float("inf"):
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, max_pages * page_size, page_size)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    if num_splits > MAX_SPLITS:
        raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    shape = (batch, q_heads, num_splits)
    if out_partial is None:
        out_partial = torch.empty((*shape, d), dtype=torch.float32, device=q.device)
    if lse_partial is None:
        lse_partial = torch.empty(shape, dtype=torch.float32, device=q.device)
    if out_partial.shape != (*shape, d) or lse_partial.shape != shape:
        raise ValueError(f"out_partial and lse_partial must have shapes {(*shape, d)}, {shape}")
    if batch == 0:
        return out_partial, lse_partial
    if INTERPRETER and q.dtype == torch.bfloat16:  # the interpreter computes bfloat16 wrongly
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    q, k_cache, v_cache = (t.contiguous() for t in (q, k_cache, v_cache))
    out_buf = out_partial if out_partial.is_contiguous() else torch.empty_like(out_partial)
    lse_buf = lse_partial if lse_partial.is_contiguous() else torch.empty_like(lse_partial)
    group = q_heads // kv_heads
    try:
        learner_decode_partials_kernel[(batch * kv_heads, num_splits)](
            q, k_cache, v_cache, block_table.to(torch.int32).contiguous(),
            seq_lens.to(torch.int32).contiguous(), out_buf, lse_buf,
            kv_heads, max_pages, num_splits, pages_per_split(max_pages, num_splits),
            float(softmax_scale) * LOG2E,
            ATTEND=attend_chunk, GROUP=group,
            BLOCK_H=max(MIN_ROWS, triton.next_power_of_2(group)),
            HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), PAGE_SIZE=page_size,
        )  # fmt: skip
    except (NotImplementedError, OutOfBoundsError):  # each already shows as its own message
        raise
    except Exception as err:
        one_line = attend_chunk_error(attend_chunk, err)
        if one_line is None:
            raise
        raise one_line from err
    if out_buf is not out_partial:
        out_partial.copy_(out_buf)
    if lse_buf is not lse_partial:
        lse_partial.copy_(lse_buf)
    return out_partial, lse_partial


def learner_flash_decode(
    attend_chunk,
    merge_splits,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-decoding made of the learner's two parts: the partials kernel, then the merge.

    Returns:
        out: (batch, q_heads, d) in q's dtype.  lse: (batch, q_heads) float32.
    """
    out_partial, lse_partial = learner_decode_partials(
        attend_chunk, q, k_cache, v_cache, block_table, seq_lens, softmax_scale, num_splits
    )
    out, lse = merge_splits(out_partial, lse_partial)
    return out.to(q.dtype), lse


def run_learner_partials(
    attend_chunk, q, k_cache, v_cache, block_table, seq_lens, softmax_scale, num_splits
) -> tuple[torch.Tensor, torch.Tensor]:
    """One check launch: learner_decode_partials into NaN-filled buffers, returned on the CPU.

    The checks call it through call_learner, so it runs where attend_chunk lives (the notebook's
    kernel when a submission is graded); the tensors arrive on the CPU and go to the GPU here
    when there is one.
    """
    device = "cpu" if INTERPRETER else "cuda"
    q, k_cache, v_cache, block_table, seq_lens = (
        t.to(device) for t in (q, k_cache, v_cache, block_table, seq_lens)
    )
    batch, q_heads, d = q.shape
    shape = (batch, q_heads, num_splits)
    out_partial = torch.full((*shape, d), float("nan"), dtype=torch.float32, device=device)
    lse_partial = torch.full(shape, float("nan"), dtype=torch.float32, device=device)
    learner_decode_partials(
        attend_chunk, q, k_cache, v_cache, block_table, seq_lens, softmax_scale, num_splits,
        out_partial=out_partial, lse_partial=lse_partial,
    )  # fmt: skip
    return out_partial.cpu(), lse_partial.cpu()
