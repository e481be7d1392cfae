"""FlashAttention-2 forward pass in Triton: one program per (query tile, batch * head).

Each program keeps a tile of BLOCK_M queries on chip and streams the keys and values past it in
tiles of BLOCK_N, with the online softmax (m_i, l_i) and an fp32 accumulator `acc` that is divided
by l_i once, at the end (FlashAttention-2, Dao 2023, Algorithm 1). Scores are scaled by
softmax_scale * log2(e) so that the exponentials are exp2, a single instruction on the GPU.

With causal=True the key tiles right of the diagonal are never loaded; the loop runs in two phases,
first the tiles fully left of the diagonal with no mask, then the diagonal block with the mask.
Lengths need not be multiples of the tiles (the ragged last tile is masked), and a head dimension d
that is not a power of two is padded with zeros up to BLOCK_D.

On Hopper GPUs (H100, H200) the tiles move through tensor descriptors made on the host, which use
the chip's copy engine (TMA); elsewhere, and in the interpreter, through plain pointer loads. HBM
traffic per head for N queries and keys: read q once, read k and v once per query tile (N/BLOCK_M
times), write out once: about 2*N*d + 2*N*d*N/BLOCK_M elements, where the naive way also writes
and reads the N x N scores.
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from course_utils._validate import softmax_scale_or_default
from course_utils.harness.kernel_inputs import check_attention_inputs as _check_inputs
from course_utils.harness.triton_interpreter import INTERPRETER
from course_utils.triton_attention.config import FWD_FAMILIES, check_dtype_for, tile_config
from course_utils.triton_attention.config import family as _family

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)


@triton.jit
def _load_tile(
    src,  # pointer to one head's (n_rows, HEAD_DIM) matrix, or a (B*H, N, d) tensor descriptor
    bh,  # b * H + h: the head's index in the descriptor
    row,  # first row of the tile
    n_rows,  # rows of the matrix (seqlen_q or seqlen_k)
    stride_row,  # elements between rows (columns are contiguous)
    BLOCK_ROWS: tl.constexpr,  # rows in the tile
    HEAD_DIM: tl.constexpr,  # columns of the matrix (d)
    BLOCK_D: tl.constexpr,  # columns in the tile: d rounded up to a power of two
    USE_TMA: tl.constexpr,  # src is a tensor descriptor
    CHECK_ROWS: tl.constexpr,  # the tile may run past the last row
):
    """The (BLOCK_ROWS, BLOCK_D) tile at `row`, zero outside the (n_rows, HEAD_DIM) matrix."""
    if USE_TMA:
        # The copy engine moves the tile and fills whatever lies outside the matrix with zeros.
        tile = src.load([bh, row, 0]).reshape(BLOCK_ROWS, BLOCK_D)
    else:
        rows = row + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        ptrs = src + rows[:, None] * stride_row + cols[None, :]
        if CHECK_ROWS or BLOCK_D != HEAD_DIM:
            mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
            tile = tl.load(ptrs, mask=mask, other=0.0)
        else:
            tile = tl.load(ptrs)  # every element is inside: no mask, the widest loads
    return tile


@triton.jit
def _store_tile(
    dst,  # pointer to one head's (n_rows, HEAD_DIM) matrix, or a (B*H, N, d) tensor descriptor
    tile,  # (BLOCK_ROWS, BLOCK_D) values to write
    bh,  # b * H + h
    row,  # first row of the tile
    n_rows,  # rows of the matrix
    stride_row,  # elements between rows (columns are contiguous)
    BLOCK_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Write the part of `tile` that lies inside the (n_rows, HEAD_DIM) matrix."""
    if USE_TMA:
        dst.store([bh, row, 0], tile.reshape(1, BLOCK_ROWS, BLOCK_D))  # drops what lies outside
    else:
        rows = row + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
        tl.store(dst + rows[:, None] * stride_row + cols[None, :], tile, mask=mask)


@triton.jit
def _attn_fwd_inner(
    acc,  # (BLOCK_M, BLOCK_D) fp32: sum_j exp2(s_ij - m_i) v_j, not yet divided by l_i
    l_i,  # (BLOCK_M,) fp32: sum_j exp2(s_ij - m_i)
    m_i,  # (BLOCK_M,) fp32: running row max of the scores, in log2 units
    q,  # (BLOCK_M, BLOCK_D) this program's queries, input dtype
    k_src,  # keys of this head: pointer or tensor descriptor
    v_src,  # values of this head: pointer or tensor descriptor
    bh,  # b * H + h
    lo,  # first key of this phase (a multiple of BLOCK_N)
    hi,  # one past the last key of this phase
    offs_m,  # (BLOCK_M,) query indices of this tile
    seqlen_k,  # keys per head
    stride_kn,  # elements between keys
    stride_vn,  # elements between values
    qk_scale,  # softmax_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,  # mask the scores: the diagonal block, or keys past seqlen_k
    USE_TMA: tl.constexpr,
):
    """Stream key/value tiles lo..hi past the queries q, updating the online softmax state."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_tile(
            k_src, bh, start_n, seqlen_k, stride_kn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA, MASKED
        )  # read BLOCK_N*d
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) raw scores q.k, fp32
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < seqlen_k  # the ragged last tile
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # qk_scale > 0 commutes with max
            p = tl.math.exp2(s * qk_scale - m_new[:, None])  # one FMA and one exp2 per score
        # Rescale what was summed under the old max (alpha = 1 when the max did not move).
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(
            v_src, bh, start_n, seqlen_k, stride_vn, BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA, MASKED
        )  # read BLOCK_N*d
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # acc = acc * alpha + p @ v
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    q_ptr,  # (B, H, seqlen_q, d) queries; every tensor's last dimension is contiguous
    k_ptr,  # (B, H, seqlen_k, d) keys
    v_ptr,  # (B, H, seqlen_k, d) values
    out_ptr,  # (B, H, seqlen_q, d) output, q's dtype
    lse_ptr,  # (B, H, seqlen_q) fp32, contiguous: lse_i = log(sum_j exp(softmax_scale * q_i.k_j))
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
    seqlen_q,  # queries per head (any length: the last query tile is masked)
    seqlen_k,  # keys per head, at least 1 (the wrapper answers seqlen_k == 0 itself)
    qk_scale,  # softmax_scale * log2(e): exp(softmax_scale * s) = exp2(qk_scale * s)
    HEAD_DIM: tl.constexpr,  # d, 16 to 256
    BLOCK_D: tl.constexpr,  # d rounded up to a power of two (tl.arange and tl.dot need one)
    BLOCK_M: tl.constexpr,  # queries per program (Br in the papers)
    BLOCK_N: tl.constexpr,  # keys per loop step (Bc); BLOCK_M % BLOCK_N == 0 when CAUSAL
    CAUSAL: tl.constexpr,  # query i sees keys 0..i only (seqlen_q == seqlen_k)
    USE_TMA: tl.constexpr,  # q_ptr..out_ptr are (B*H, N, d) tensor descriptors (Hopper's TMA)
):
    """out and lse for BLOCK_M queries of one head: program (query tile, b * H + h)."""
    start_m = tl.program_id(0)
    if CAUSAL:
        # The last query tiles see the most keys: launch them first, so short ones fill the tail.
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1)
    if USE_TMA:
        # Descriptors made on the host: the head is an index (bh), not a pointer offset.
        q_src, k_src, v_src, out_dst = q_ptr, k_ptr, v_ptr, out_ptr
    else:
        off_b = (bh // num_heads).to(tl.int64)  # int64: B*H*N*d may pass 2**31
        off_h = (bh % num_heads).to(tl.int64)
        q_src = q_ptr + off_b * stride_qb + off_h * stride_qh  # this head's matrices
        k_src = k_ptr + off_b * stride_kb + off_h * stride_kh
        v_src = v_ptr + off_b * stride_vb + off_h * stride_vh
        out_dst = out_ptr + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    q = _load_tile(
        q_src, bh, start_m * BLOCK_M, seqlen_q, stride_qn, BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA, True
    )  # read BLOCK_M*d, once: q stays on chip

    # Phase 1, no mask: every key tile that all BLOCK_M queries see in full.
    # Phase 2, masked: the diagonal block (causal), or the ragged last tile (seqlen_k % BLOCK_N).
    if CAUSAL:
        full_end = start_m * BLOCK_M
        masked_end = tl.minimum(full_end + BLOCK_M, seqlen_k)  # tiles past the diagonal: skipped
    else:
        full_end = (seqlen_k // BLOCK_N) * BLOCK_N
        masked_end = seqlen_k
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, bh, 0, full_end, offs_m, seqlen_k, stride_kn,
        stride_vn, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False, USE_TMA,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, bh, full_end, masked_end, offs_m, seqlen_k, stride_kn,
        stride_vn, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, USE_TMA,
    )  # fmt: skip

    # Normalize once (FlashAttention-2); lse back from log2 to natural-log units.
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634
    lse_ptr += bh.to(tl.int64) * seqlen_q
    tl.store(lse_ptr + offs_m, lse, mask=offs_m < seqlen_q)  # write BLOCK_M
    _store_tile(
        out_dst, acc.to(q.dtype), bh, start_m * BLOCK_M, seqlen_q, stride_on, BLOCK_M,
        HEAD_DIM, BLOCK_D, USE_TMA,
    )  # write BLOCK_M*d  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------


def make_config(
    block_m: int, block_n: int, num_warps: int, num_stages: int, maxnreg: int | None = None
) -> triton.Config:
    """A launch configuration: tiles, warps, pipeline depth and an optional register cap.

    A cap (maxnreg) lets two or three programs share a multiprocessor, so that one program's
    softmax and loads overlap another's matrix products: it pays most at short N.
    """
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n},
        num_warps=num_warps,
        num_stages=num_stages,
        maxnreg=maxnreg,
        pre_hook=_set_descriptor_blocks,
    )


def _set_descriptor_blocks(nargs: dict) -> None:
    """Give the tensor descriptors the tile shape of the config about to be launched."""
    if nargs["USE_TMA"]:
        block_m, block_n, block_d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_D"]
        nargs["q_ptr"].block_shape = nargs["out_ptr"].block_shape = [1, block_m, block_d]
        nargs["k_ptr"].block_shape = nargs["v_ptr"].block_shape = [1, block_n, block_d]


INTERPRETER_CONFIG = make_config(block_m=64, block_n=32, num_warps=4, num_stages=1)
"""The one configuration used in the interpreter (autotuning needs a GPU)."""

CONFIG_FAMILIES = FWD_FAMILIES
"""The autotuning sets, (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg), by `_family` of
(d, dtype): `config.FWD_FAMILIES`, kept there so that `config.tile_config` reads them without
importing this kernel."""


def gpu_configs() -> list[triton.Config]:
    """Every config of every family; `_prune_configs` keeps the family of the launch."""
    return [make_config(*c) for family in CONFIG_FAMILIES.values() for c in family]


def _prune_configs(configs, named_args, **kwargs):
    """Keep the family's configs that fit the GPU's shared memory and the causal tiling."""
    args = {**named_args, **kwargs}
    q = args["q_ptr"]
    dtype = q.base.dtype if args["USE_TMA"] else q.dtype
    family = set(CONFIG_FAMILIES[_family(args["HEAD_DIM"], dtype)])
    shared_limit = torch.cuda.get_device_properties(q.base.device if args["USE_TMA"] else q.device)
    shared_limit = shared_limit.shared_memory_per_block_optin

    def shared_bytes(c):  # q once, k and v once per pipeline stage
        rows = c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"]
        return rows * args["BLOCK_D"] * dtype.itemsize

    def key(c):
        return (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.maxnreg)

    keep = [
        c
        for c in configs
        if key(c) in family
        and shared_bytes(c) <= shared_limit
        and not (args["CAUSAL"] and c.kwargs["BLOCK_M"] % c.kwargs["BLOCK_N"])
    ]
    return keep or [min(configs, key=shared_bytes)]


@functools.cache
def _autotuned_kernel(dtype: torch.dtype):
    """`_attn_fwd_kernel` wrapped in triton.autotune; built on first use, on a GPU only.

    One autotuner per dtype: its cache key cannot see the dtype behind tensor descriptors.
    """
    return triton.autotune(
        configs=gpu_configs(),
        key=["seqlen_q", "seqlen_k", "HEAD_DIM", "CAUSAL", "USE_TMA"],
        prune_configs_by={"early_config_prune": _prune_configs},
    )(_attn_fwd_kernel)


_CONTEXT_BOUND = threading.local()  # .devices: the device indices bound in this thread


def _bind_cuda_context(device: torch.device) -> None:
    """Make the device's CUDA context current in this thread, once per thread and device.

    Triton encodes a launch's tensor descriptors with the driver API before its launcher makes a
    context current; in a thread that has made no CUDA runtime call yet (autograd's backward
    thread, a user's worker thread) none is, and the driver refuses with "Failed to create tensor
    map descriptor: invalid device context". One runtime call binds the primary context.
    """
    devices = getattr(_CONTEXT_BOUND, "devices", None)
    if devices is None:
        devices = _CONTEXT_BOUND.devices = set()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in devices:
        torch.cuda.synchronize(index)  # a runtime call: binds the primary context to the thread
        devices.add(index)


def _tma_possible(q, k, v, out) -> bool:
    """Host-made descriptors over (B*H, N, d) need (batch, heads) to fold into one dimension and
    16-byte aligned data pointers and strides."""
    for t in (q, k, v, out):  # on every launch: one stride() call a tensor
        s0, s1, s2, _ = t.stride()
        size = t.element_size()
        if (t.shape[0] != 1 and s0 != t.shape[1] * s1) or t.data_ptr() % 16:
            return False
        if (s1 * size) % 16 or (s2 * size) % 16:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Python entry points
# ---------------------------------------------------------------------------------------------


def output_buffers(
    q: torch.Tensor, out: torch.Tensor | None, lse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) to write into: the caller's, checked, or new ones. out: q's shape, dtype and
    device; lse: a contiguous float32 (batch, heads, N_Q) tensor."""
    batch, heads, n_q, _ = q.shape
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError("out must have q's shape, dtype and device")
    if lse.shape != (batch, heads, n_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError("lse must be a contiguous float32 tensor of shape (batch, heads, N_Q)")
    return out, lse


def launch_flash_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    config: triton.Config | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`flash_attention_fwd` with the launch exposed, for tests, benchmarks and experiments.

    Args:
        q, k, v, causal, softmax_scale: as in `flash_attention_fwd`.
        out: (batch, heads, N_Q, d) tensor of q's dtype to write into, or None for a new one.
        lse: (batch, heads, N_Q) contiguous float32 tensor to write into, or None.
        config: a triton.Config (see `make_config`) to launch with; None autotunes over the
            family of CONFIG_FAMILIES that fits on a GPU from sm_80 on, takes
            `config.tile_config` below sm_80 (a T4) and INTERPRETER_CONFIG in the interpreter.
        tma: move tiles with tensor descriptors (True) or pointer loads (False); None picks
            descriptors on Hopper and newer GPUs when the strides allow, pointers elsewhere
            (True below sm_90 is refused: those chips have no TMA).

    Returns:
        (out, lse) as in `flash_attention_fwd`.
    """
    _check_inputs(q, k, v, causal)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    scale = float(softmax_scale_or_default(softmax_scale, d))
    out, lse = output_buffers(q, out, lse)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    if n_k == 0:  # no key to attend to: an empty sum
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    if INTERPRETER and q.dtype == torch.bfloat16:
        # Triton's interpreter computes bfloat16 wrongly, without an error: run in float32.
        out32, _ = launch_flash_attention_fwd(
            q.float(), k.float(), v.float(), causal, scale, lse=lse, config=config, tma=tma
        )
        out.copy_(out32)
        return out, lse

    capability = None if INTERPRETER else torch.cuda.get_device_capability(q.device)
    if capability is not None and capability < (8, 0):
        # Turing (T4) and older: no bfloat16, 64 KiB of shared memory, no tensor cores in Triton.
        check_dtype_for(capability, q.dtype, name="q")
        if config is None:  # the autotuning families are sized for Hopper: fixed tiles here
            config = make_config(*tile_config(capability, d, q.dtype, "fwd"))

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out_buf = out if out.stride(-1) == 1 else torch.empty_like(q)
    if tma and capability is not None and capability < (9, 0):  # the interpreter has descriptors
        sm = f"sm_{capability[0]}{capability[1]}"
        raise ValueError(f"tma=True needs a Hopper GPU (sm_90) or newer, this one is {sm}")
    if tma is None:
        tma = capability is not None and capability >= (9, 0) and _tma_possible(q, k, v, out_buf)
    elif tma and not _tma_possible(q, k, v, out_buf):
        raise ValueError(
            "tma=True needs stride(0) == heads * stride(1) and 16-byte aligned data pointers and "
            "strides for q, k, v and out"
        )
    if tma:
        if not INTERPRETER:
            _bind_cuda_context(q.device)
        # 3-D descriptors over (batch * heads, N, d); _set_descriptor_blocks sets their tiles.
        q_arg, k_arg, v_arg, out_arg = (
            TensorDescriptor(t, [batch * heads, t.shape[2], d], list(t.stride()[1:]), [1, 1, 1])
            for t in (q, k, v, out_buf)
        )
    else:
        q_arg, k_arg, v_arg, out_arg = q, k, v, out_buf

    args = (
        q_arg, k_arg, v_arg, out_arg, lse,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out_buf.stride()[:3],
        heads, n_q, n_k, scale * LOG2E,
    )  # fmt: skip
    constants = {
        "HEAD_DIM": d,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "CAUSAL": causal,
        "USE_TMA": bool(tma),
    }
    if config is None and INTERPRETER:
        config = INTERPRETER_CONFIG
    if config is None:
        grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads)
        _autotuned_kernel(q.dtype)[grid](*args, **constants)
    else:
        block_m, block_n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
        if causal and block_m % block_n:
            raise ValueError(f"causal needs BLOCK_M to be a multiple of BLOCK_N, got {config}")
        meta = {**constants, **config.kwargs}
        descriptors = {"q_ptr": q_arg, "k_ptr": k_arg, "v_ptr": v_arg, "out_ptr": out_arg}
        _set_descriptor_blocks({**descriptors, **meta})
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.maxnreg is not None:
            options["maxnreg"] = config.maxnreg
        grid = (triton.cdiv(n_q, block_m), batch * heads)
        _attn_fwd_kernel[grid](*args, **meta, **options)
    if out_buf is not out:
        out.copy_(out_buf)
    return out, lse


def flash_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with the FlashAttention-2 Triton kernel: out = softmax(s q k^T) v.

    s = softmax_scale, 1/sqrt(d) by default; lse_i = log sum_j exp(s q_i.k_j) (natural log) is
    what the backward pass needs. A query with no key (seqlen_k == 0) gets out = 0 and lse = -inf.
    Forward only: no autograd. On a machine without a CUDA GPU it runs in Triton's interpreter on
    CPU tensors (bfloat16 is computed in float32 there; see the package docstring).

    Args:
        q: (batch, heads, seqlen_q, d) queries, float16, bfloat16 or float32, 16 <= d <= 256.
        k: (batch, heads, seqlen_k, d) keys, q's dtype and device.
        v: (batch, heads, seqlen_k, d) values.
        causal: query i sees keys 0..i only (needs seqlen_q == seqlen_k).
        softmax_scale: s, a positive float; default 1/sqrt(d).

    Returns:
        out: (batch, heads, seqlen_q, d), q's dtype.  lse: (batch, heads, seqlen_q) float32.
    """
    return launch_flash_attention_fwd(q, k, v, causal, softmax_scale)
