"""The inputs of the course's Triton kernels, checked, and the decode kernel's launch shape.

A learner's skeleton (notebook 06's forward, 08's backward, 09's split-KV decode) takes the same
tensors as the course kernel and refuses the same inputs with the same errors, and notebook 09's
skeleton picks num_splits as the course kernel does. None of this computes an answer, so it lives
here, copied whole into the graded kernel; triton_attention's forward and decode import it.

    check_attention_inputs(q, k, v, causal)     q (batch, heads, N_q, d), k and v (batch, heads,
                                                N_k, d): the forward's and backward's inputs
    check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens)
                                                -> (batch, q_heads, kv_heads, d, num_pages,
                                                    page_size, max_pages)
    choose_num_splits(batch, kv_heads, max_seq_len, page_size, sms)   notebook 05's SM-fill model
    default_tuning(batch, kv_heads, sms, page_size)   the decode kernel's launch settings
    pages_per_split(max_pages, num_splits)      P = ceil(max_pages / num_splits)
    num_sms(device)                             the GPU's SM count (NOMINAL_SMS without one)

Without a CUDA GPU the kernels run in Triton's interpreter on CPU tensors
(harness.triton_interpreter.INTERPRETER), and these checks ask for CPU tensors then.
"""

from __future__ import annotations

import torch

from course_utils.harness.constants import LOG2E
from course_utils.harness.triton_interpreter import INTERPRETER

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256  # the forward's range; decode takes 1 <= d <= MAX_HEAD_DIM
MAX_SPLITS = 256  # the merge kernel holds all of a head's partials in one tile
NOMINAL_SMS = 132  # an H100's SM count: the model's GPU when there is none (the interpreter)
MIN_ROWS = 16  # tl.dot needs at least 16 rows: a group of query heads is padded up to this

# Three regimes, timed on the H200 with CUDA graph replays (2026-12-02 and 03,
# docs/journal.md: decode runs 3 to 8, the sweeps, and the large-page runs).
DEFAULT_TUNING = {  # batch * kv_heads >= SMs: the grid fills the GPU with little or no split
    "tile_tokens": 64,  # BLOCK_N unless pages_per_tile or tile_tokens is given
    "num_warps": 4,
    "num_stages": 2,
    # num_splits: as many as keep every SM at no more than this many programs (one wave: the
    # kernel fits 4 to 5 programs on an SM), and no chunk shorter than min_tokens_per_split
    "programs_per_sm": 4,
    "min_tokens_per_split": 256,
}
# batch * kv_heads < SMs: the splits make the grid, and each program streams a chunk of its own, so
# smaller tiles pipelined deeper keep more bytes in flight per program. The software pipeline
# spends one stage on the block-table load that K and V's addresses wait for: 3 stages keep one
# K/V tile in flight ahead of the one being used, 5 keep two (sm_90, 32-token tiles: 21.6 KB of
# shared memory at 3 and 4 stages, 38 KB at 5 and 6).
FEW_SEQUENCES_TUNING = {
    "tile_tokens": 32,
    "num_warps": 4,
    "num_stages": 5,
    "programs_per_sm": 4,
    "min_tokens_per_split": 256,
}


# batch * kv_heads < SMs, pages of 64 tokens or more: a 64-token tile lies inside one page, so
# each tile needs one table entry (a scalar load: 80 registers, against 116 when a 64-token tile
# spans four 16-token pages), and 3 stages hold a tile in flight (39 KB, 5 programs per SM).
# Measured on the H200 at batch 1, 32 KV heads (docs/journal.md, "Decode: 64-token tiles inside
# large pages"): 1.00-1.01 of cuDNN at 8k in four cache layouts where FEW_SEQUENCES_TUNING read
# 0.98-1.00.
FEW_SEQUENCES_LARGE_PAGES_TUNING = {
    "tile_tokens": 64,
    "num_warps": 4,
    "num_stages": 3,
    "programs_per_sm": 4,
    "min_tokens_per_split": 256,
}


def default_tuning(
    batch: int, kv_heads: int, sms: int | None = None, page_size: int | None = None
) -> dict:
    """The launch settings for a grid of batch * kv_heads caches on a GPU of `sms` SMs (default
    num_sms()): DEFAULT_TUNING when they fill the SMs; else FEW_SEQUENCES_LARGE_PAGES_TUNING for
    pages of at least its tile (page_size tokens), FEW_SEQUENCES_TUNING for smaller pages or an
    unknown page size."""
    sms = num_sms() if sms is None else sms
    if batch * kv_heads >= sms:
        return dict(DEFAULT_TUNING)
    if page_size is not None and page_size >= FEW_SEQUENCES_LARGE_PAGES_TUNING["tile_tokens"]:
        return dict(FEW_SEQUENCES_LARGE_PAGES_TUNING)
    return dict(FEW_SEQUENCES_TUNING)


__all__ = [
    "DEFAULT_TUNING",
    "FEW_SEQUENCES_LARGE_PAGES_TUNING",
    "FEW_SEQUENCES_TUNING",
    "LOG2E",
    "MAX_HEAD_DIM",
    "MAX_SPLITS",
    "MIN_HEAD_DIM",
    "MIN_ROWS",
    "NOMINAL_SMS",
    "SUPPORTED_DTYPES",
    "check_attention_inputs",
    "check_decode_inputs",
    "choose_num_splits",
    "default_tuning",
    "num_sms",
    "pages_per_split",
]


def check_attention_inputs(q, k, v, causal) -> None:
    """Refuse what the forward kernel does not handle, with an error that names the argument.

    q: (batch, heads, N_q, d), k and v: (batch, heads, N_k, d), one dtype (float16, bfloat16 or
    float32), one device, 16 <= d <= 256; causal (query i sees keys 0..i) needs N_q == N_k.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, heads, N, d), got shape {tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
            f"v on {v.device}"
        )
    if k.shape != v.shape:
        raise ValueError(
            "k and v must have the same shape (batch, heads, N_K, d), "
            f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            "q and k must share batch, heads and d (only N may differ): "
            f"q has shape {tuple(q.shape)}, k has {tuple(k.shape)}"
        )
    d = q.shape[3]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dimension d = q.shape[3] must be in {MIN_HEAD_DIM}..{MAX_HEAD_DIM}, got {d}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            "causal=True needs as many queries as keys (query i sees keys 0..i): "
            f"q has N = {q.shape[2]}, k has N = {k.shape[2]}"
        )
    if INTERPRETER:
        if q.device.type != "cpu":
            raise ValueError(f"no CUDA GPU: the interpreter needs CPU tensors, got q on {q.device}")
    elif q.device.type != "cuda":
        raise ValueError(f"q, k and v must be CUDA tensors on a machine with a GPU, got {q.device}")


def num_sms(device: torch.device | str | None = None) -> int:
    """The SM count of the CUDA device, or NOMINAL_SMS (132, an H100) without one."""
    if INTERPRETER or not torch.cuda.is_available():
        return NOMINAL_SMS
    return torch.cuda.get_device_properties(device or "cuda").multi_processor_count


def choose_num_splits(
    batch: int,
    kv_heads: int,
    max_seq_len: int,
    page_size: int = 16,
    sms: int | None = None,
    *,
    programs_per_sm: float | None = None,
    min_tokens_per_split: int | None = None,
) -> int:
    """num_splits from notebook 05's SM-fill model, used for real.

    Without splitting the grid has batch * kv_heads programs; decode is memory-bound, and an SM
    with no program pulls no bytes. So split each cache into as many chunks as keep the grid
    within programs_per_sm programs on every SM (several per SM keep loads in flight while
    others wait; all of them run at once, in one wave),

        num_splits = floor(programs_per_sm * sms / (batch * kv_heads)),   at least 1,

    but no further than chunks of min_tokens_per_split tokens (whole pages): a short chunk's
    program spends more on its start and its partial's write and merge than it streams.

    Rounded down, not up: one program more than programs_per_sm * sms puts a fifth program on
    some SMs, and the step waits for the slowest SM. Measured on an H200 (132 SMs, batch 1, 32
    KV heads): 16 splits (512 programs) read 0.91 of the copy bandwidth at 64k tokens, 17
    splits (544) 0.89 and 33 splits (1,056) 0.85.

    Args:
        batch, kv_heads: the grid without splitting is batch * kv_heads programs.
        max_seq_len: the longest sequence (tokens) the chunks must cover.
        page_size: tokens per page (chunks are whole pages).
        sms: SMs of the GPU; default num_sms() (132 on a machine without one).
        programs_per_sm, min_tokens_per_split: default default_tuning(batch, kv_heads, sms,
            page_size)'s.

    Returns:
        num_splits, between 1 and MAX_SPLITS.
    """
    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("page_size", page_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 0:
        raise ValueError(f"max_seq_len must be an int >= 0, got {max_seq_len!r}")
    sms = num_sms() if sms is None else sms
    tuning = default_tuning(batch, kv_heads, sms, page_size)
    per_sm = tuning["programs_per_sm"] if programs_per_sm is None else programs_per_sm
    min_tokens = (
        tuning["min_tokens_per_split"] if min_tokens_per_split is None else min_tokens_per_split
    )
    wanted = int(per_sm * sms) // (batch * kv_heads)
    pages = -(-max_seq_len // page_size)
    min_pages = max(1, -(-min_tokens // page_size))
    most = max(1, pages // min_pages)  # chunks of at least min_pages pages
    return int(max(1, min(wanted, most, MAX_SPLITS)))


def _int_tensor(t, name: str, ndim: int, shape_text: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape {shape_text}, got {type(t).__name__}"
        )
    if t.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")


def check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens, *, check_values: bool = True):
    """Raise a clear error, naming the argument, for any input flash_decode cannot take.

    Shapes: q (batch, q_heads, d); k_cache and v_cache (num_pages, page_size, kv_heads, d), one
    shape; block_table (batch, max_pages) int32; seq_lens (batch,) int32. q_heads a multiple of
    kv_heads, page_size a power of two >= 16, d <= 256; one dtype (float16, bfloat16 or float32)
    and one device for q and the caches. With check_values (a device sync): 0 <= seq_lens[b] <=
    max_pages * page_size and the pages a sequence uses are in 0 .. num_pages - 1.

    Returns:
        (batch, q_heads, kv_heads, d, num_pages, page_size, max_pages).
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if q.ndim != 3:
        raise ValueError(
            f"q must have shape (batch, q_heads, d), one query token per sequence; got "
            f"{tuple(q.shape)}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.ndim != 4:
            raise ValueError(
                f"{name} must have shape (num_pages, page_size, kv_heads, d), got {tuple(t.shape)}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
            f"{tuple(v_cache.shape)}"
        )
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}"
        )
    batch, q_heads, d = q.shape
    num_pages, page_size, kv_heads, d_k = k_cache.shape
    if d_k != d:
        raise ValueError(f"k_cache's head dimension is {d_k}, q's is {d}: they must be equal")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"the head dimension d = q.shape[2] must be in 1..{MAX_HEAD_DIM}, got {d}")
    if page_size < 16 or page_size & (page_size - 1):
        raise ValueError(
            f"page_size = k_cache.shape[1] must be a power of two >= 16 (a tile of tokens), "
            f"got {page_size}"
        )
    if kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(
            f"q_heads = q.shape[1] = {q_heads} must be a multiple of kv_heads = "
            f"k_cache.shape[2] = {kv_heads} (grouped-query attention)"
        )
    _int_tensor(block_table, "block_table", 2, "(batch, max_pages)")
    _int_tensor(seq_lens, "seq_lens", 1, "(batch,)")
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"block_table {tuple(block_table.shape)} and seq_lens {tuple(seq_lens.shape)} must "
            f"have one row per sequence: batch = q.shape[0] = {batch}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: use one device")
    if seq_lens.device != q.device:
        raise ValueError(f"seq_lens is on {seq_lens.device}, q on {q.device}: use one device")
    if INTERPRETER and q.device.type != "cpu":
        raise ValueError(f"without a CUDA GPU the kernels run on CPU tensors; q is on {q.device}")
    if not INTERPRETER and q.device.type != "cuda":
        raise ValueError(f"q must be a CUDA tensor on a machine with a GPU, got {q.device}")
    max_pages = block_table.shape[1]
    if check_values and batch:
        lens = seq_lens.detach().to("cpu", torch.int64)
        capacity = max_pages * page_size
        bad = ((lens < 0) | (lens > capacity)).nonzero()
        if len(bad):
            b = int(bad[0, 0])
            raise ValueError(
                f"seq_lens[{b}] = {int(lens[b])} must be in 0..{capacity} (max_pages = "
                f"block_table.shape[1] = {max_pages} pages of {page_size} tokens)"
            )
        used = torch.arange(max_pages)[None, :] < (-(-lens // page_size))[:, None]
        table = block_table.detach().to("cpu", torch.int64)
        out_of_range = used & ((table < 0) | (table >= num_pages))
        if out_of_range.any():
            b, j = (int(x) for x in out_of_range.nonzero()[0])
            raise ValueError(
                f"block_table[{b}, {j}] = {int(table[b, j])} is not a page of the cache: the "
                f"pages sequence {b} uses must be in 0..{num_pages - 1} (num_pages = "
                "k_cache.shape[0])"
            )
    return batch, q_heads, kv_heads, d, num_pages, page_size, max_pages


def pages_per_split(max_pages: int, num_splits: int) -> int:
    """P = ceil(max_pages / num_splits): split s holds logical pages s * P .. (s + 1) * P - 1."""
    return max(1, -(-max_pages // num_splits))
