"""Notebook 06's launchers for the learner's own kernels: four puzzles and the whole forward.

The learner writes every @triton.jit kernel of notebook 06 (and, for the last exercise, its
launcher too). The checks do not launch them directly: they call these runners, which take the
learner's kernel and plain tensors, lay the tensors out in memory the way the case asks (a row
stride wider than the row, room after the last row so that a tile that runs past the end stays
inside the allocation), launch, and return plain tensors. While a notebook is graded they run in
the notebook's kernel, where the learner's functions live, and only tensors travel back.

    run_scale_tile(kernel, x, pad, alpha, block_r, block_c)       puzzle 1: y = alpha * x, 2-D
    run_softmax_rows(kernel, x, pad)                               puzzle 2: a softmax per row
    run_matmul(kernel, a, b, pad, block_m, block_n, block_k)       puzzle 3: c = a @ b, fp32 acc
    run_row_block(kernel, q, k, v, pad, qk_scale, block_n)         puzzle 4: one query tile
    run_attention_fwd(attention_fwd, q, k, v, causal, softmax_scale, layout)   the whole forward
    check_attention_inputs(q, k, v, causal)                        the launcher's input checks

Each puzzle's runner places its input in a larger buffer: the cells a masked kernel never
touches hold `pad` (a number the check chooses), and the output buffer starts as NaN everywhere.
The runner returns the whole output buffer, so the check sees what the kernel wrote outside the
matrix as well as inside it, and, beside it, what the kernel loaded: load_log.recording's summary
of the input views (per program, each element's loads, and the lanes read outside the view; on a
GPU {"recorded": False}). Memory traffic of each puzzle is in the notebook, beside its stub.
"""

from __future__ import annotations

import contextlib

import torch

import course_utils.harness.triton_interpreter  # noqa: F401  (first: before triton)

# isort: split
import triton

from course_utils.harness.kernel_inputs import check_attention_inputs
from course_utils.harness.triton_learner import check_learner_function
from course_utils.harness.triton_load_log import recording

__all__ = [
    "check_attention_inputs",
    "run_attention_fwd",
    "run_matmul",
    "run_row_block",
    "run_scale_tile",
    "run_softmax_rows",
]


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize()


def _in_buffer(x: torch.Tensor, rows: int, cols: int, pad: float) -> torch.Tensor:
    """x (n, m) copied into the top-left corner of a (n + rows, m + cols) buffer of `pad`."""
    n, m = x.shape
    buf = torch.full((n + rows, m + cols), pad, dtype=x.dtype, device=x.device)
    buf[:n, :m] = x
    return buf


def run_scale_tile(kernel, x, pad: float, alpha: float, block_r: int, block_c: int, y_extra=0):
    """Puzzle 1: launch kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, alpha,
    BLOCK_R, BLOCK_C) on the grid (cdiv(n_rows, BLOCK_R), cdiv(n_cols, BLOCK_C)).

    x: (n_rows, n_cols) float32, placed in a buffer with `block_r` more rows and `block_c + 3`
    more columns of `pad` (so rows are n_cols + block_c + 3 elements apart); y's buffer has
    y_extra more columns than x's (stride_y = stride_x + y_extra).
    Returns the whole (n_rows + block_r, n_cols + block_c + 3 + y_extra) output buffer, NaN
    where the kernel wrote nothing, and the summary of x's loads.
    """
    check_learner_function(kernel, "scale_tile_kernel")
    n_rows, n_cols = x.shape
    x_buf = _in_buffer(x, block_r, block_c + 3, pad)
    y_buf = torch.full((n_rows + block_r, n_cols + block_c + 3 + y_extra), float("nan"),
                       device=x.device)  # fmt: skip
    xs, ys = x_buf[:n_rows, :n_cols], y_buf[:n_rows, :n_cols]
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c))
    with recording({"x": xs}) as loads:
        kernel[grid](
            xs, ys, n_rows, n_cols, xs.stride(0), ys.stride(0), float(alpha),
            BLOCK_R=block_r, BLOCK_C=block_c,
        )  # fmt: skip
    _sync(y_buf)
    return y_buf, loads.summary()


def run_softmax_rows(kernel, x, pad: float, y_extra: int = 0):
    """Puzzle 2: launch kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK) on the grid
    (n_rows,), BLOCK = next_power_of_2(n_cols).

    x: (n_rows, n_cols) float32, placed in a buffer with one more row and BLOCK more columns of
    `pad`; y's buffer has y_extra more columns than x's, so stride_y = stride_x + y_extra.
    Returns the whole (n_rows + 1, n_cols + BLOCK + y_extra) output buffer, NaN where the
    kernel wrote nothing, and the summary of x's loads.
    """
    check_learner_function(kernel, "softmax_rows_kernel")
    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    x_buf = _in_buffer(x, 1, block, pad)
    y_buf = torch.full((n_rows + 1, n_cols + block + y_extra), float("nan"), device=x.device)
    xs, ys = x_buf[:n_rows, :n_cols], y_buf[:n_rows, :n_cols]
    with recording({"x": xs}) as loads:
        kernel[(n_rows,)](xs, ys, n_cols, xs.stride(0), ys.stride(0), BLOCK=block)
    _sync(y_buf)
    return y_buf, loads.summary()


def run_matmul(kernel, a, b, pad: float, block_m: int, block_n: int, block_k: int):
    """Puzzle 3: launch kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
    BLOCK_M, BLOCK_N, BLOCK_K) on the grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)).

    a: (M, K) and b: (K, N), float16, each in a buffer with a tile's worth of `pad` below and to
    the right; c: (M, N) float32. Returns the whole c buffer (M + block_m, N + block_n),
    NaN where the kernel wrote nothing, and the summary of a's and b's loads.
    """
    check_learner_function(kernel, "matmul_kernel")
    (M, K), (_, N) = a.shape, b.shape
    a_buf = _in_buffer(a, block_m, block_k, pad)
    b_buf = _in_buffer(b, block_k, block_n, pad)
    c_buf = torch.full((M + block_m, N + block_n), float("nan"), device=a.device)
    a_s, b_s, c_s = a_buf[:M, :K], b_buf[:K, :N], c_buf[:M, :N]
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    with recording({"a": a_s, "b": b_s}) as loads:
        kernel[grid](
            a_s, b_s, c_s, M, N, K, a_s.stride(0), b_s.stride(0), c_s.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    _sync(c_buf)
    return c_buf, loads.summary()


def run_row_block(kernel, q, k, v, pad: float, qk_scale: float, block_n: int):
    """Puzzle 4: launch kernel(q_ptr, k_ptr, v_ptr, out_ptr, seqlen_k, stride_q, stride_k,
    stride_v, stride_o, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM) on the grid (1,).

    q: (BLOCK_M, HEAD_DIM), k and v: (seqlen_k, HEAD_DIM), float16 or float32 (both powers of
    two, so only the keys are ragged); k and v sit in buffers with block_n more rows of `pad`.
    Returns out (BLOCK_M, HEAD_DIM) float32, NaN where the kernel wrote nothing, and the
    summary of q's, k's and v's loads.
    """
    check_learner_function(kernel, "row_block_attention_kernel")
    block_m, head_dim = q.shape
    seqlen_k = k.shape[0]
    k_buf, v_buf = (_in_buffer(t, block_n, 0, pad) for t in (k, v))
    out = torch.full((block_m, head_dim), float("nan"), device=q.device)
    q = q.contiguous()
    watched = {"q": q, "k": k_buf[:seqlen_k], "v": v_buf[:seqlen_k]}
    with recording(watched) as loads:
        kernel[(1,)](
            q, k_buf, v_buf, out, seqlen_k, q.stride(0), k_buf.stride(0), v_buf.stride(0),
            out.stride(0), float(qk_scale), BLOCK_M=block_m, BLOCK_N=block_n,
            HEAD_DIM=head_dim,
        )  # fmt: skip
    _sync(out)
    return out, loads.summary()


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t (B, H, N, d) in fresh memory with a guard band of NaN after the end: "contiguous" with
    256 rows of NaN after the last one, or "bnhd", a (B, N + 256, H, d) buffer seen as (B, H, N, d)
    (rows H * d elements apart, as when q comes from a (B, N, H*d) projection), whose 256 rows
    past N are NaN for every head. A tile that runs past the last row stays inside the
    allocation, and a load that is not masked there brings NaN into the result (a GPU returns
    whatever memory holds past the end, silently; the guard makes it show)."""
    B, H, N, d = t.shape
    if layout == "contiguous":
        flat = torch.full((t.numel() + 256 * d,), float("nan"), dtype=t.dtype, device=t.device)
        flat[: t.numel()] = t.reshape(-1)
        return flat[: t.numel()].view(B, H, N, d)
    if layout == "bnhd":
        buf = torch.full((B, N + 256, H, d), float("nan"), dtype=t.dtype, device=t.device)
        buf[:, :N] = t.transpose(1, 2)
        return buf[:, :N].transpose(1, 2)
    raise ValueError(f"layout must be 'contiguous' or 'bnhd', got {layout!r}")


def run_attention_fwd(
    attention_fwd, q, k, v, causal: bool, softmax_scale: float, layout: str, record: bool = True
):
    """The whole forward: the learner's attention_fwd(q, k, v, causal=..., softmax_scale=...)
    on q, k, v laid out as `layout` says (see _laid_out); returns its (out, lse) and the
    summary of q's, k's and v's loads, with the launches of the learner's attention_fwd_kernel
    (the function of that name beside attention_fwd; without one, any kernel the learner wrote)
    counted.

    record=False: the launches only, no load of q, k, v recorded (faster).

    Raises TypeError when attention_fwd does not return a pair of tensors.
    """
    q, k, v = (_laid_out(t, layout) for t in (q, k, v))
    kernel = getattr(attention_fwd, "__globals__", {}).get("attention_fwd_kernel")
    watched = {"q": q, "k": k, "v": v} if record else {}
    with recording(watched) as loads, _counting(kernel) as launches:
        result = attention_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale)
    if not (
        isinstance(result, tuple | list)
        and len(result) == 2
        and all(isinstance(t, torch.Tensor) for t in result)
    ):
        raise TypeError(
            "attention_fwd must return the pair (out, lse) of torch tensors, got "
            f"{type(result).__name__}"
        )
    out, lse = result
    _sync(out)
    summary = loads.summary()
    if launches is not None:  # counted on a GPU too
        summary["of_kernel"], summary["counted"] = launches[0], True
        summary["tiles"] = launches[1] if len(launches) > 1 else None
    return out, lse, summary


# The wrappers below run under the learner's launcher: instrumentation, not a course function
# the learner calls (see checks.engine.watch._frame_kind)
INSTRUMENTS = ("counted_run", "_tiles_of")


def _tiles_of(kernel, args, kwargs) -> list[int] | None:
    """[BLOCK_M, BLOCK_N] of one launch of the learner's kernel (by the notebook's parameter
    names, given by keyword or by position), or None when it has no such pair of ints."""
    given = dict(zip(getattr(kernel, "arg_names", ()), args, strict=False)) | kwargs
    bm, bn = given.get("BLOCK_M"), given.get("BLOCK_N")  # no comprehension: a frame of its own
    if type(bm) is int and type(bn) is int and bm > 0 and bn > 0:
        return [bm, bn]
    return None


@contextlib.contextmanager
def _counting(kernel):
    """Count the launches of the learner's @triton.jit kernel (kernel[grid](...) calls its
    run) while the block runs, compiled or interpreted; yields [count] (then [count, tiles of
    the first launch] once it launched), or None when kernel is not a Triton kernel."""
    run = getattr(kernel, "run", None)
    if not callable(run) or not hasattr(kernel, "__dict__"):
        yield None
        return
    count = [0]

    def counted_run(*args, **kwargs):
        count[0] += 1
        if len(count) == 1:  # the first launch's tiles, for the diagnosis's replays
            count.append(_tiles_of(kernel, args, kwargs))
        return run(*args, **kwargs)

    kernel.run = counted_run
    try:
        yield count
    finally:
        del kernel.run
