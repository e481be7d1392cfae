"""Flash-decoding in Triton: one query token per sequence against a paged KV cache, split-KV.

At decode time each sequence brings one new query per head, and attends to its whole KV cache.
FlashAttention-2's grid (one program per query tile and head) would launch batch * heads programs,
too few to keep a GPU's SMs busy. Split-KV (flash-decoding) also cuts each KV cache into
`num_splits` chunks and gives every chunk its own program, then merges the partial results by
their logsumexp (notebooks 02 and 05):

    lse = log sum_s e^lse_s,        out = sum_s e^(lse_s - lse) out_s.

The cache is paged, as inference engines store it: K and V live in fixed-size pages,
k_cache[page, slot, kv_head, :], and a sequence's token t is in physical page
block_table[b, t // page_size], slot t % page_size. Pages of one sequence need not be contiguous
nor in order. Sequences of one batch have their own lengths, seq_lens[b].

Grouped-query attention: q_heads = group * kv_heads, and query head h reads KV head h // group.
One program handles the whole group of query heads that share a KV head, so each K/V tile is read
from HBM once for the group (group times less traffic than one program per query head), and the
group's queries form the rows of one tl.dot.

Two kernels:

    _decode_partials_kernel   grid (batch * kv_heads, num_splits): the (out, lse) of one chunk of
                              pages for one group of query heads; reads chunk * 2 * d elements of
                              K and V, writes group * (d + 1) floats
    _decode_merge_kernel      grid (batch * q_heads,): the lse merge of the num_splits partials

Chunks are whole pages: split s covers the logical pages [s * P, (s + 1) * P) of every sequence,
P = ceil(max_pages / num_splits), max_pages = block_table.shape[1] (known on the host without
reading seq_lens, so no device sync). A chunk past a sequence's length is empty: out 0, lse -inf,
and it weighs nothing in the merge. seq_len 0 gives out 0 and lse -inf.

    flash_decode(q, k_cache, v_cache, block_table, seq_lens) -> (out, lse)
    choose_num_splits(batch, kv_heads, max_seq_len, ...)     the SM-fill model of notebook 05

The input checks, choose_num_splits and the tunings live in harness.kernel_inputs (notebook 09's
skeleton shares them, and the graded kernel copies the harness whole); imported here.

Tunables (`default_tuning`: DEFAULT_TUNING, FEW_SEQUENCES_TUNING or
FEW_SEQUENCES_LARGE_PAGES_TUNING by the size of the grid and the page size, or keywords of
flash_decode): tile_tokens (the K/V tile: whole pages, or part of one page when
pages are larger; or pages_per_tile, whole pages), num_warps, num_stages, programs_per_sm and
min_tokens_per_split (how num_splits is chosen). `python -m benchmarks.decode --sweep` times them.

No tensor descriptors (tl.make_block_ptr is gone in triton 3.9): pointer loads, gathered through
the block table. In Triton's interpreter bfloat16 runs in float32 (the interpreter computes
bfloat16 wrongly), out cast back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_utils._validate import softmax_scale_or_default
from course_utils.harness.kernel_inputs import (  # noqa: F401 (decode.X is their old address)
    DEFAULT_TUNING,
    FEW_SEQUENCES_LARGE_PAGES_TUNING,
    FEW_SEQUENCES_TUNING,
    LOG2E,
    MAX_SPLITS,
    MIN_ROWS,
    NOMINAL_SMS,
    check_decode_inputs,
    choose_num_splits,
    default_tuning,
    num_sms,
    pages_per_split,
)
from course_utils.harness.triton_interpreter import INTERPRETER

LN2 = 0.6931471805599453  # ln(2): a base-2 logarithm times LN2 is a natural one


@triton.jit
def chunk_partial(
    q,  # (BLOCK_H, BLOCK_D) the group's queries, zero-padded
    table,  # this sequence's row of the block table
    k_base,  # k_cache + kv_head * stride_kh: this KV head's slice of the key cache
    v_base,  # the same in the value cache
    chunk_start,  # first token of the chunk (a page boundary)
    chunk_end,  # one past its last token, at most seq_len: chunk_end <= chunk_start is empty
    stride_kp,
    stride_ks,
    stride_vp,
    stride_vs,
    qk_scale,  # softmax_scale * log2(e)
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # tokens per K/V tile: whole pages, or a part of one page
):
    """(out, lse) of q against the tokens chunk_start .. chunk_end - 1 of one sequence's cache:
    out (BLOCK_H, BLOCK_D) float32, lse (BLOCK_H,) natural log; an empty chunk gives out 0 and
    lse -inf. Reads (chunk_end - chunk_start) * d elements of K and of V."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)  # unnormalized out
    offs_t = tl.arange(0, BLOCK_N)
    for start in range(chunk_start, chunk_end, BLOCK_N):
        offs_n = start + offs_t  # logical token indices of the tile
        n_mask = offs_n < chunk_end  # the chunk's (and the sequence's) last tile is ragged
        if BLOCK_N <= PAGE_SIZE:  # the tile lies in one page: one table entry
            page = tl.load(table + start // PAGE_SIZE).to(tl.int64)
        else:  # the physical page of every token of the tile (BLOCK_N / PAGE_SIZE values)
            page = tl.load(table + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        row_k = page * stride_kp + slot * stride_ks  # (BLOCK_N,): each token's row
        row_v = page * stride_vp + slot * stride_vs
        k = tl.load(k_base + row_k[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + row_v[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        # read BLOCK_N * d of each, once for the whole group
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_H, BLOCK_N), log2 units
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: the tile holds at least one token
        alpha = tl.math.exp2(m_i - m_new)  # 0 at the first tile
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # an empty chunk (no tile ran): l_i = 0 gives out 0 and lse -inf, never 0 / 0
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # ln 2
    return out, lse


@triton.jit
def _decode_partials_kernel(
    q_ptr,  # (batch, q_heads, d) queries, one token per sequence
    k_ptr,  # (num_pages, page_size, kv_heads, d) key cache
    v_ptr,  # (num_pages, page_size, kv_heads, d) value cache
    table_ptr,  # (batch, max_pages) int32: logical page -> physical page
    seq_lens_ptr,  # (batch,) int32 tokens in each sequence's cache
    out_part_ptr,  # (batch, q_heads, num_splits, d) float32, contiguous: each chunk's out
    lse_part_ptr,  # (batch, q_heads, num_splits) float32, contiguous: each chunk's lse
    stride_qb,  # q's strides along batch and head (d is contiguous)
    stride_qh,
    stride_kp,  # k_cache's strides along page, slot and head
    stride_ks,
    stride_kh,
    stride_vp,  # v_cache's strides
    stride_vs,
    stride_vh,
    stride_tb,  # block_table's stride along batch
    kv_heads,  # program_id(0) = b * kv_heads + kv_head
    num_splits,  # program_id(1) = split
    pages_per_split,  # P: split s holds logical pages s * P .. (s + 1) * P - 1
    qk_scale,  # softmax_scale * log2(e)
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_H: tl.constexpr,  # GROUP rounded up to a power of two, at least 16 (tl.dot's rows)
    HEAD_DIM: tl.constexpr,  # d
    BLOCK_D: tl.constexpr,  # d rounded up to a power of two
    PAGE_SIZE: tl.constexpr,  # tokens per page
    BLOCK_N: tl.constexpr,  # tokens per K/V tile: whole pages, or a part of one page
    USE_PDL: tl.constexpr,  # programmatic dependent launch of the merge (Hopper and later)
):
    """(out, lse) of one chunk of one sequence's cache for the GROUP query heads of a KV head."""
    if USE_PDL:
        # the merge kernel may be launched once every program of this grid has started; its
        # programs wait (gdc_wait) for this grid to finish before they read a partial
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // kv_heads
    kv_head = pid % kv_heads

    offs_h = tl.arange(0, BLOCK_H)  # rows: the group's query heads (padded)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h  # query head indices
    q_ptrs = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=h_mask[:, None] & d_mask[None, :], other=0.0)  # read GROUP * d

    seq_len = tl.load(seq_lens_ptr + b)
    chunk_start = split * pages_per_split * PAGE_SIZE
    chunk_end = tl.minimum(chunk_start + pages_per_split * PAGE_SIZE, seq_len)
    out, lse = chunk_partial(
        q, table_ptr + b.to(tl.int64) * stride_tb, k_ptr + kv_head.to(tl.int64) * stride_kh,
        v_ptr + kv_head.to(tl.int64) * stride_vh, chunk_start, chunk_end, stride_kp, stride_ks,
        stride_vp, stride_vs, qk_scale, BLOCK_H, HEAD_DIM, BLOCK_D, PAGE_SIZE, BLOCK_N,
    )  # fmt: skip
    row = (b * (kv_heads * GROUP) + heads).to(tl.int64) * num_splits + split  # (b, h, split)
    tl.store(lse_part_ptr + row, lse, mask=h_mask)
    out_ptrs = out_part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out_ptrs, out, mask=h_mask[:, None] & d_mask[None, :])  # write GROUP * d floats


@triton.jit
def _decode_merge_kernel(
    out_part_ptr,  # (batch * q_heads, num_splits, d) float32, contiguous
    lse_part_ptr,  # (batch * q_heads, num_splits) float32
    out_ptr,  # (batch, q_heads, d) output, q's dtype
    lse_ptr,  # (batch * q_heads,) float32
    stride_ob,  # out's strides along batch and head
    stride_oh,
    q_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two
    USE_PDL: tl.constexpr,  # launched before the partials kernel ended: wait for its writes
):
    """lse = log sum_s e^lse_s, out = sum_s e^(lse_s - lse) out_s for one (sequence, head)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # every partial is written and visible after this
    row = tl.program_id(0).to(tl.int64)  # b * q_heads + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    lse_s = tl.load(lse_part_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every chunk empty: weights exp(-inf) = 0
    w = tl.math.exp2((lse_s - m_safe) * 1.4426950408889634)  # at most 1: no overflow
    total = tl.sum(w, 0)
    o_ptrs = out_part_ptr + (row * num_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :]
    o_s = tl.load(o_ptrs, mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    total_safe = tl.where(total > 0, total, 1.0)
    out = tl.sum(w[:, None] * o_s, 0) / total_safe
    lse = tl.where(total > 0, m_safe + tl.log(total_safe), float("-inf"))
    tl.store(lse_ptr + row, lse)
    b = row // q_heads
    h = row % q_heads
    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


# ---- the host side -----------------------------------------------------------------------------


def pdl_capable(capability: tuple[int, int]) -> bool:
    """Whether a chip of this compute capability has programmatic dependent launch (sm_90 on):
    below it the kernels must be compiled with USE_PDL=False (no griddepcontrol instruction)."""
    return tuple(capability) >= (9, 0)


def pdl_supported(device: torch.device | str | None = None) -> bool:
    """Programmatic dependent launch: on a CUDA GPU of compute capability 9 (Hopper) or later,
    never in the interpreter."""
    if INTERPRETER or not torch.cuda.is_available():
        return False
    return pdl_capable(torch.cuda.get_device_capability(device or "cuda"))


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def tile_size(
    page_size: int, pages_per_tile: int | None, tile_tokens: int | None, default: int
) -> int:
    """Tokens per K/V tile (BLOCK_N): page_size * pages_per_tile, or tile_tokens, or `default`
    tokens when neither is given. Powers of two, so a tile is whole pages or part of one page
    and never straddles a page's end; at least 16 tokens (tl.dot's smallest side)."""
    if pages_per_tile is not None and tile_tokens is not None:
        raise ValueError(
            f"give pages_per_tile or tile_tokens, not both (got {pages_per_tile} and {tile_tokens})"
        )
    if pages_per_tile is not None:
        pages_per_tile = _positive_int(pages_per_tile, "pages_per_tile")
        if pages_per_tile & (pages_per_tile - 1):
            raise ValueError(f"pages_per_tile must be a power of two, got {pages_per_tile}")
        return page_size * pages_per_tile
    name = "tile_tokens" if tile_tokens is not None else "the default tile_tokens"
    tokens = _positive_int(default if tile_tokens is None else tile_tokens, name)
    if tokens < 16 or tokens & (tokens - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {tokens}")
    return tokens


def flash_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int | None = None,
    *,
    pages_per_tile: int | None = None,
    tile_tokens: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    check_values: bool = True,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a paged KV cache: out[b, h] = softmax(tau q[b, h] K_b^T) V_b.

    K_b, V_b: sequence b's first seq_lens[b] tokens of KV head h // (q_heads / kv_heads), found
    through block_table. Split-KV: num_splits chunks per cache, each its own program, merged by
    lse.

    Args:
        q: (batch, q_heads, d) float16, bfloat16 or float32: one query token per sequence.
        k_cache, v_cache: (num_pages, page_size, kv_heads, d), q's dtype and device; page_size a
            power of two >= 16; q_heads a multiple of kv_heads.
        block_table: (batch, max_pages) int32: block_table[b, j] is the physical page of
            sequence b's tokens j * page_size .. (j + 1) * page_size - 1 (entries past the
            sequence's last page are not read).
        seq_lens: (batch,) int32, 0 <= seq_lens[b] <= max_pages * page_size.
        softmax_scale: tau, default 1 / sqrt(d).
        num_splits: chunks per cache; default choose_num_splits(batch, kv_heads,
            max_pages * page_size, page_size) (no device sync: the table's width, not seq_lens).
        pages_per_tile, tile_tokens: the K/V tile, as whole pages (pages_per_tile, a power of two)
            or as tokens (tile_tokens, a power of two >= 16: whole pages, or a part of one page
            when pages are larger); at most one of them (default default_tuning(batch,
            kv_heads, page_size=page_size)'s tile_tokens).
        num_warps, num_stages: the launch (default default_tuning(batch, kv_heads,
            page_size=page_size)).
        check_values: check seq_lens and the used block_table entries (one device sync); a
            benchmark that checked once may turn it off.
        partials: (out_partial, lse_partial) float32 buffers of shapes (batch, q_heads,
            num_splits, d) and (batch, q_heads, num_splits) to reuse (default: new ones).
        pdl: launch the merge kernel with programmatic dependent launch, so its launch overlaps
            the partials kernel's end (default: pdl_supported(q.device), Hopper or later).

    Returns:
        out: (batch, q_heads, d), q's dtype (0 where seq_lens[b] = 0).
        lse: (batch, q_heads) float32, natural log (-inf where seq_lens[b] = 0).
    """
    batch, q_heads, kv_heads, d, _, page_size, max_pages = check_decode_inputs(
        q, k_cache, v_cache, block_table, seq_lens, check_values=check_values
    )
    tau = float(softmax_scale_or_default(softmax_scale, d))
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, max_pages * page_size, page_size)
    num_splits = _positive_int(num_splits, "num_splits")
    if num_splits > MAX_SPLITS:
        raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    tuning = default_tuning(batch, kv_heads, page_size=page_size)
    block_n = tile_size(page_size, pages_per_tile, tile_tokens, tuning["tile_tokens"])
    num_warps = _positive_int(num_warps or tuning["num_warps"], "num_warps")
    num_stages = _positive_int(num_stages or tuning["num_stages"], "num_stages")
    pdl = pdl_supported(q.device) if pdl is None else bool(pdl)
    if pdl and not pdl_supported(q.device):
        raise ValueError(
            "pdl=True needs a CUDA GPU of compute capability 9.0 or later (programmatic "
            "dependent launch); leave pdl=None to use it where it exists"
        )

    out = torch.empty_like(q)
    lse = torch.empty((batch, q_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    if INTERPRETER and q.dtype == torch.bfloat16:  # the interpreter gets bfloat16 wrong
        out32, lse = flash_decode(
            q.float(), k_cache.float(), v_cache.float(), block_table, seq_lens, tau, num_splits,
            tile_tokens=block_n, check_values=False,
        )  # fmt: skip
        return out32.to(q.dtype), lse

    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_table = block_table.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    shape = (batch, q_heads, num_splits)
    if partials is None:
        out_part = torch.empty((*shape, d), dtype=torch.float32, device=q.device)
        lse_part = torch.empty(shape, dtype=torch.float32, device=q.device)
    else:
        out_part, lse_part = partials
        if out_part.shape != (*shape, d) or lse_part.shape != shape:
            raise ValueError(
                f"partials must have shapes {(*shape, d)} and {shape}, got "
                f"{tuple(out_part.shape)} and {tuple(lse_part.shape)}"
            )
    group = q_heads // kv_heads
    _decode_partials_kernel[(batch * kv_heads, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, out_part, lse_part,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        kv_heads, num_splits, pages_per_split(max_pages, num_splits), tau * LOG2E,
        GROUP=group, BLOCK_H=max(MIN_ROWS, triton.next_power_of_2(group)), HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)), PAGE_SIZE=page_size,
        BLOCK_N=block_n, USE_PDL=pdl, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    _decode_merge_kernel[(batch * q_heads,)](
        out_part, lse_part, out, lse, out.stride(0), out.stride(1), q_heads, num_splits,
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)), USE_PDL=pdl, num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out, lse


def decode_kv_bytes(seq_lens, kv_heads: int, d: int, element_size: int) -> int:
    """Bytes of K and V a decode step reads once per KV head: 2 * sum_b seq_lens[b] * kv_heads
    * d * element_size (GQA: the query heads of a group share one read)."""
    total = int(torch.as_tensor(seq_lens).sum()) if not isinstance(seq_lens, int) else seq_lens
    return 2 * total * kv_heads * d * element_size
