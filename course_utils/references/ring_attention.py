"""Ring attention: the sequence sharded over P processes, K/V blocks passed around a ring.

Rank r holds the queries, keys and values of its shard. In P steps every K/V block visits every
rank: at step s rank r holds the block of rank src = (r - s) mod P, sends it on to r + 1 and
receives the next one from r - 1. Each step's attention gives a partial (out, lse) over that
block's keys, merged into the running result with notebook 02's logsumexp merge. The transfer of
the next block is posted BEFORE the attention of the current one, so it travels while the rank
computes (overlap); communication is hidden when a block's attention takes longer than its trip.

Causal masking uses the ZIG-ZAG layout (not the striped one): the sequence is cut into 2P chunks
and rank r holds chunk r (its front) and chunk 2P-1-r (its back) (harness.ring_comm). Of the
2 x 2 chunk pairs (query chunk, key chunk) a step computes, the fully masked ones are skipped:

    src == r   [[causal, skip], [full, causal]]  the diagonal block: causal on the local order
    src <  r   [[full,   skip], [full, skip  ]]  every query sees src's front, no one its back
    src >  r   [[skip,   skip], [full, full  ]]  only r's back queries see src's block

so every rank does the same work at every step after the first: half a block's pairs.

Bytes: each rank sends its K and V blocks on P - 1 times (the last step receives nothing new), so
rank r sends 2 * B * H * d * e * sum_{s=0}^{P-2} n_{(r-s) mod P} bytes, e bytes per element and
n_j rank j's shard length; for equal shards 2 (P - 1) B H d e N / P per rank (ring_bytes_sent).

    ring_plan(rank, step, P, causal)   -> (src, send_to, recv_from, pairs)
    merge_partials_torch(o1, lse1, o2, lse2) -> (o, lse)
    ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attn) -> (out, lse)
    ring_attention(q, k, v, causal, P)  the whole ring on P gloo processes (CPU)
    ring_bytes_sent(N, P, B, H, d, element_size) -> bytes per rank
    ring_schedule(P, causal)            every (step, rank): src and pairs (the figure's data)

Forward only: a backward would send dK, dV along with their blocks (not built here).
"""

from __future__ import annotations

import math

import numpy as np

from course_utils.harness.ring_comm import (
    CAUSAL,
    FULL,
    SKIP,
    launch_ring,
    local_attention,
    shard,
    shard_sizes,
    unshard,
)


def ring_plan(rank: int, step: int, P: int, causal: bool):
    """What rank `rank` does at step `step` of a P-rank ring (zig-zag layout).

    Returns:
        src: whose K/V block the rank holds at this step, (rank - step) mod P.
        send_to: the rank it passes that block on to, (rank + 1) mod P.
        recv_from: the rank the next block comes from, (rank - 1) mod P.
        pairs: 2 x 2 tuple, pairs[a][b] for query chunk a and key chunk b (0 front, 1 back):
            SKIP (0) fully masked, FULL (1) no mask, CAUSAL (2) the causal mask (the diagonal).
    """
    for name, x in (("rank", rank), ("step", step), ("P", P)):
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise TypeError(f"{name} must be an int, got {x!r}")
    if P < 1 or not 0 <= rank < P or not 0 <= step < P:
        raise ValueError(
            f"need 0 <= rank < P and 0 <= step < P, got rank {rank}, step {step}, P {P}"
        )
    src = (rank - step) % P
    if not causal:
        pairs = ((FULL, FULL), (FULL, FULL))
    elif src == rank:
        pairs = ((CAUSAL, SKIP), (FULL, CAUSAL))
    elif src < rank:
        pairs = ((FULL, SKIP), (FULL, SKIP))
    else:
        pairs = ((SKIP, SKIP), (FULL, FULL))
    return int(src), int((rank + 1) % P), int((rank - 1) % P), pairs


def merge_partials_torch(o1, lse1, o2, lse2):
    """The logsumexp merge of notebook 02 on torch tensors, any leading shape.

        lse = log(e^lse1 + e^lse2),  o = e^(lse1 - lse) o1 + e^(lse2 - lse) o2.

    Args:
        o1, o2: (..., n, d).  lse1, lse2: (..., n), -inf for an empty set (weight 0).

    Returns:
        (o, lse) of the shapes of (o1, lse1); both empty gives o = 0, lse = -inf.
    """
    import torch

    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # never -inf - (-inf)
    w1 = torch.exp(lse1 - safe)[..., None]
    w2 = torch.exp(lse2 - safe)[..., None]
    return w1 * o1 + w2 * o2, lse


def ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attn, plan=ring_plan):
    """One rank's ring loop: pass K/V around, attend to each block, merge (out, lse).

    Args:
        q, k, v: this rank's shard, (B, H, n, d) torch tensors (front chunk then back chunk).
        causal: bool.  softmax_scale: s, a float.
        comm: a RingComm (rank, world_size, sizes, exchange).
        local_attn: (q, k, v, causal, softmax_scale) -> (out, lse), e.g. local_attention on CPU
            or course_utils.triton_attention.flash_attention_fwd on a GPU.

    Returns:
        out: (B, H, n, d) in q's dtype; lse: (B, H, n) float32 or float64, natural log.
    """
    import torch

    rank, P = comm.rank, comm.world_size
    fq = comm.sizes[rank][0]  # queries 0..fq-1 are the front chunk
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device)
    q_chunks = (slice(0, fq), slice(fq, q.shape[2]))
    for step in range(P):
        src, send_to, recv_from, pairs = plan(rank, step, P, causal)
        requests = []
        if step < P - 1:  # post the next transfer first: it travels during this step's compute
            nxt = sum(comm.sizes[(rank - step - 1) % P])
            k_next = k.new_empty(k.shape[:2] + (nxt, k.shape[3]))
            v_next = v.new_empty(k_next.shape)
            # send 2 B H n_src d e bytes, as one batch (NCCL needs the sends and receives of a
            # pair of ranks grouped; gloo takes either form)
            requests = comm.exchange([k, v], send_to, [k_next, v_next], recv_from)
        fk = comm.sizes[src][0]
        k_chunks = (slice(0, fk), slice(fk, k.shape[2]))
        for a, b, q_rows, k_rows in _calls(pairs, q_chunks, k_chunks):
            o_p, lse_p = local_attn(
                q[:, :, q_rows].contiguous(),
                k[:, :, k_rows].contiguous(),
                v[:, :, k_rows].contiguous(),
                pairs[a][b] == CAUSAL,
                softmax_scale,
            )
            out[:, :, q_rows], lse[:, :, q_rows] = merge_partials_torch(
                out[:, :, q_rows], lse[:, :, q_rows], o_p.to(acc_dtype), lse_p.to(acc_dtype)
            )
        for r in requests:
            r.wait()
        if requests:
            k, v = k_next, v_next
    return out.to(q.dtype), lse


def _calls(pairs, q_chunks, k_chunks):
    """The local attention calls of one step: pairs fused where they share rows or columns.

    The diagonal [[causal, skip], [full, causal]] is one causal call on the whole shard (the
    shard's local order is its global order); [[full, skip], [full, skip]] one call of every
    query on the front keys; [[skip, skip], [full, full]] one call of the back queries on every
    key. Anything else (a learner's own plan) falls back to one call per computed pair.
    """
    whole_q = slice(q_chunks[0].start, q_chunks[1].stop)
    whole_k = slice(k_chunks[0].start, k_chunks[1].stop)
    if pairs == ((FULL, FULL), (FULL, FULL)):
        return [(0, 0, whole_q, whole_k)]
    if pairs == ((CAUSAL, SKIP), (FULL, CAUSAL)):
        return [(0, 0, whole_q, whole_k)]
    if pairs == ((FULL, SKIP), (FULL, SKIP)):
        return [(0, 0, whole_q, k_chunks[0])]
    if pairs == ((SKIP, SKIP), (FULL, FULL)):
        return [(1, 0, q_chunks[1], whole_k)]
    return [(a, b, q_chunks[a], k_chunks[b]) for a in (0, 1) for b in (0, 1) if pairs[a][b] != SKIP]


def _ring_rank(comm, q, k, v, causal, softmax_scale):
    return ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attention)


def ring_attention(q, k, v, causal: bool = False, P: int = 2, softmax_scale=None):
    """Ring attention of the whole sequence on P gloo processes (CPU, float64).

    Args:
        q, k, v: (B, H, N, d) float arrays or tensors; N need not divide by P.
        causal: bool.  P: ranks.  softmax_scale: default 1/sqrt(d).

    Returns:
        out (B, H, N, d), lse (B, H, N): float64 NumPy, sequence order; bytes_sent (P,): what
        each rank passed to isend.
    """
    import torch

    q, k, v = (torch.as_tensor(np.array(x, dtype=np.float64)) for x in (q, k, v))
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k, v must share one shape (B, H, N, d), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    sizes = shard_sizes(q.shape[2], P)
    per_rank = [shard(x, P) for x in (q, k, v)]
    results = launch_ring(
        _ring_rank_counted, P, *per_rank, [bool(causal)] * P, [scale] * P, sizes=sizes
    )
    out = unshard([r[0] for r in results]).numpy()
    lse = unshard([r[1] for r in results]).numpy()
    return out, lse, np.array([r[2] for r in results], dtype=np.float64)


def _ring_rank_counted(comm, q, k, v, causal, softmax_scale):
    out, lse = _ring_rank(comm, q, k, v, causal, softmax_scale)
    return out, lse, comm.bytes_sent


def ring_bytes_sent(N: int, P: int, B: int, H: int, d: int, element_size: int = 8) -> np.ndarray:
    """Bytes each rank sends in one forward: 2 (K and V) * B H d e * sum of P-1 shard lengths.

    Rank r sends, at steps s = 0..P-2, the block of rank (r - s) mod P; the block it holds at the
    last step is not sent (every rank has seen every block). Equal shards: 2 (P-1) B H d e N / P.

    Returns:
        (P,) float64 array of bytes.
    """
    sizes = [f + b for f, b in shard_sizes(N, P)]
    per_token = 2 * B * H * d * element_size
    return np.array(
        [per_token * sum(sizes[(r - s) % P] for s in range(P - 1)) for r in range(P)],
        dtype=np.float64,
    )


def ring_schedule(P: int, causal: bool) -> list[list[tuple[int, tuple]]]:
    """schedule[step][rank] = (src, pairs): the block a rank holds, the pairs it computes."""
    return [
        [(ring_plan(r, s, P, causal)[0], ring_plan(r, s, P, causal)[3]) for r in range(P)]
        for s in range(P)
    ]
