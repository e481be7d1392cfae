"""The checks of notebook 10: three correct ring loops pass, each named mistake is recognised.

The "learners" are written here, in the styles a learner would use. The ring loops run for real on
gloo processes (forked: the functions below need no pickling), a handful of runs per test. Each
rank runs under the rank guard (harness.ring_guard): the students of issue 40 (a course call
inside a rank, all_gather_object around comm, files, a queue, attention on a block not received,
attention computed outside local_attn) are each named.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from checkhelp import as_learner, run_quietly, slug_of
from fixtures import kernels

from course_utils.checks import ring_attention as checks
from course_utils.checks.engine.failures import CheckFailure

# ---------------------------------------------------------------------------------------------
# ring_plan and merge_partials as learners write them
# ---------------------------------------------------------------------------------------------


def ring_plan(rank, step, P, causal):
    src = (rank - step) % P
    if not causal:
        pairs = [[1, 1], [1, 1]]
    elif src == rank:
        pairs = [[2, 0], [1, 2]]
    elif src < rank:
        pairs = [[1, 0], [1, 0]]
    else:
        pairs = [[0, 0], [1, 1]]
    return src, (rank + 1) % P, (rank - 1) % P, pairs


def ring_plan_numpy(rank, step, P, causal):
    """Another style: a NumPy table of pairs, indexed by the sign of src - rank."""
    src = (rank + P - step) % P
    table = {-1: [[1, 0], [1, 0]], 0: [[2, 0], [1, 2]], 1: [[0, 0], [1, 1]]}
    pairs = np.array(table[int(np.sign(src - rank))]) if causal else np.ones((2, 2), int)
    return src, (rank + 1) % P, (rank + P - 1) % P, pairs


def merge_partials(o1, lse1, o2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(lse1 - safe)[..., None] * o1 + torch.exp(lse2 - safe)[..., None] * o2, lse


def merge_by_max(o1, lse1, o2, lse2):
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    a, b = torch.exp(lse1 - m), torch.exp(lse2 - m)
    total = a + b
    lse = torch.where(total > 0, m + torch.log(total), torch.full_like(m, -math.inf))
    den = torch.where(total > 0, total, torch.ones_like(total))
    return (a / den)[..., None] * o1 + (b / den)[..., None] * o2, lse


# ---------------------------------------------------------------------------------------------
# ring loops: a factory of learner-like loops, with the knobs the mistakes turn
# ---------------------------------------------------------------------------------------------


def make_rank(
    plan=ring_plan,
    merge=merge_partials,
    *,
    wait_first=False,
    send_last=False,
    own_size=False,
    longest=False,
):
    def ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attn):
        rank, P = comm.rank, comm.world_size
        fq = comm.sizes[rank][0]
        q_chunks = (slice(0, fq), slice(fq, q.shape[2]))
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
        for step in range(P):
            src, send_to, recv_from, pairs = plan(rank, step, P, causal)
            reqs = []
            if step < P - 1 or (send_last and P > 1):
                n_next = sum(comm.sizes[(rank - step - 1) % P])
                if own_size:
                    n_next = k.shape[2]
                if longest:
                    n_next = max(f + b for f, b in comm.sizes)
                k_next = k.new_empty(k.shape[0], k.shape[1], n_next, k.shape[3])
                v_next = torch.empty_like(k_next)
                reqs = [
                    comm.isend(k, send_to),
                    comm.isend(v, send_to),
                    comm.irecv(k_next, recv_from),
                    comm.irecv(v_next, recv_from),
                ]
                if wait_first:
                    for r in reqs:
                        r.wait()
            fk = comm.sizes[src][0]
            k_chunks = (slice(0, fk), slice(fk, k.shape[2]))
            for a in (0, 1):
                for b in (0, 1):
                    if pairs[a][b] == 0:
                        continue
                    qa, kb = q_chunks[a], k_chunks[b]
                    o_p, lse_p = local_attn(
                        q[:, :, qa].contiguous(),
                        k[:, :, kb].contiguous(),
                        v[:, :, kb].contiguous(),
                        pairs[a][b] == 2,
                        softmax_scale,
                    )
                    out[:, :, qa], lse[:, :, qa] = merge(out[:, :, qa], lse[:, :, qa], o_p, lse_p)
            for r in reqs:
                r.wait()
            if reqs:
                k, v = k_next, v_next
        return out, lse

    return ring_attention_rank


def rank_kv_stacked(q, k, v, causal, softmax_scale, comm, local_attn):
    """Another style: K and V stacked into one buffer, one isend and one irecv per step, rows of
    each chunk gathered with index lists, the lse kept in a list per chunk."""
    rank, P = comm.rank, comm.world_size
    kv = torch.stack([k, v])
    fq = comm.sizes[rank][0]
    rows = [torch.arange(0, fq), torch.arange(fq, q.shape[2])]
    outs = [torch.zeros(q.shape[0], q.shape[1], len(r), q.shape[3], dtype=q.dtype) for r in rows]
    lses = [torch.full((q.shape[0], q.shape[1], len(r)), -math.inf, dtype=q.dtype) for r in rows]
    for step in range(P):
        src, to, frm, pairs = ring_plan_numpy(rank, step, P, causal)
        pending = None
        if step + 1 < P:
            nxt = torch.empty(2, *k.shape[:2], sum(comm.sizes[(rank - step - 1) % P]), k.shape[3],
                              dtype=k.dtype)  # fmt: skip
            pending = (comm.isend(kv, to), comm.irecv(nxt, frm), nxt)
        fk = comm.sizes[src][0]
        cols = [torch.arange(0, fk), torch.arange(fk, kv.shape[3])]
        for a in range(2):
            for b in range(2):
                if int(pairs[a][b]):
                    o, l = local_attn(
                        q[:, :, rows[a]], kv[0][:, :, cols[b]], kv[1][:, :, cols[b]],
                        int(pairs[a][b]) == 2, softmax_scale,
                    )  # fmt: skip
                    outs[a], lses[a] = merge_by_max(outs[a], lses[a], o, l)
        if pending is not None:
            pending[0].wait()
            pending[1].wait()
            kv = pending[2]
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


# ---------------------------------------------------------------------------------------------
# ring_plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [ring_plan, ring_plan_numpy])
def test_plan_accepts_right_styles(fn):
    assert "✓ ring_plan" in run_quietly(checks.check_ring_plan, fn)


@pytest.mark.parametrize("mistake", checks.PLAN_MISTAKES, ids=lambda m: m.slug)
def test_plan_names_each_mistake(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_plan(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug


def test_plan_stub_raises_not_implemented():
    def stub(rank, step, P, causal):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        checks.check_ring_plan(stub)


# ---------------------------------------------------------------------------------------------
# merge_partials on torch tensors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [merge_partials, merge_by_max])
def test_merge_accepts_right_styles(fn):
    assert "✓ merge_partials" in run_quietly(checks.check_merge_partials_torch, fn)


@pytest.mark.parametrize(
    "wrong, slug",
    [
        (lambda o1, l1, o2, l2: ((o1 + o2) / 2, torch.logaddexp(l1, l2)), "plain-average"),
        (lambda o1, l1, o2, l2: (o1 + o2, torch.logaddexp(l1, l2)), "normalize-then-add"),
    ],
)
def test_merge_names_mistakes(wrong, slug):
    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials_torch(wrong)
    assert slug_of(info.value) == slug


def test_merge_unguarded_is_nan_masked():
    def unguarded(o1, l1, o2, l2):
        lse = torch.logaddexp(l1, l2)
        return torch.exp(l1 - lse)[..., None] * o1 + torch.exp(l2 - lse)[..., None] * o2, lse

    with pytest.raises(CheckFailure) as info:
        checks.check_merge_partials_torch(unguarded)
    assert slug_of(info.value) == "nan-masked"


# ---------------------------------------------------------------------------------------------
# ring_attention_rank: real processes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [make_rank(), make_rank(plan=ring_plan_numpy, merge=merge_by_max), rank_kv_stacked],
    ids=["pairs-loop", "numpy-plan-max-merge", "kv-stacked"],
)
def test_rank_accepts_right_styles(fn):
    out = run_quietly(checks.check_ring_attention_rank, fn)
    assert "✓ ring_attention_rank: 5 cases match" in out


def _avg(o1, l1, o2, l2):
    return (o1 + o2) / 2, torch.logaddexp(l1, l2)


def _plan_backwards(rank, step, P, causal):
    src, _, _, pairs = ring_plan((rank + 2 * step) % P, step, P, causal)  # pairs of the block
    src = (rank - step) % P
    return src, (rank - 1) % P, (rank + 1) % P, ring_plan(rank, step, P, causal)[3]


def _plan_skip_later(rank, step, P, causal):
    src, to, frm, pairs = ring_plan(rank, step, P, causal)
    return src, to, frm, ([[0, 0], [0, 0]] if causal and src > rank else pairs)


def _plan_diag_full(rank, step, P, causal):
    src, to, frm, pairs = ring_plan(rank, step, P, causal)
    return src, to, frm, ([[1, 1], [1, 1]] if src == rank else pairs)


@pytest.mark.parametrize(
    "fn, slug",
    [
        (make_rank(merge=_avg), "merge-without-lse"),
        (make_rank(plan=_plan_backwards), "ring-direction"),
        (make_rank(plan=_plan_skip_later), "causal-skip-later-block"),
        (make_rank(plan=_plan_diag_full), "diagonal-unmasked"),
        (make_rank(wait_first=True), "not-overlapped"),
        (make_rank(send_last=True), "extra-send"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_rank_names_each_mistake(fn, slug):
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(fn)
    assert slug_of(info.value) == slug, str(info.value)


def test_rank_stub_raises_not_implemented():
    def stub(q, k, v, causal, softmax_scale, comm, local_attn):
        raise NotImplementedError("write the ring loop")

    with pytest.raises(NotImplementedError):
        checks.check_ring_attention_rank(stub)


def test_rank_error_is_reported_with_the_rank():
    def broken(q, k, v, causal, softmax_scale, comm, local_attn):
        raise ValueError("boom")

    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(broken)
    assert "raised ValueError" in str(info.value) and "rank 0" in str(info.value)


# ---------------------------------------------------------------------------------------------
# quick checks
# ---------------------------------------------------------------------------------------------


def test_quick_bytes():
    right = 2 * 7 * 16 * 128 * 2 * 32768 / 8
    assert "✓" in run_quietly(checks.check_quick_ring_bytes, right)
    with pytest.raises(CheckFailure, match="extra-send"):
        checks.check_quick_ring_bytes(2 * 8 * 16 * 128 * 2 * 32768 / 8)


def test_quick_hide_length():
    assert "✓" in run_quietly(checks.check_quick_hide_length, 2 * 797e12 / (2 * 450e9))
    with pytest.raises(CheckFailure):
        checks.check_quick_hide_length(100.0)


def test_rank_names_causal_false_on_the_diagonal():
    """The loop that passes causal=False for the pairs marked 2 (the bank's named mistake)."""

    def plan_no_mask_on_twos(rank, step, P, causal):
        src, to, frm, pairs = ring_plan(rank, step, P, causal)
        return src, to, frm, [[1 if p == 2 else p for p in row] for row in pairs]

    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(make_rank(plan=plan_no_mask_on_twos))
    assert slug_of(info.value) == "diagonal-unmasked", str(info.value)


# ---------------------------------------------------------------------------------------------
# more right styles: the plan as a comprehension, the merge through logsumexp, rings that post
# the receives first, batch the step with comm.exchange, or pre-scale q
# ---------------------------------------------------------------------------------------------


def ring_plan_chunks(rank, step, P, causal):
    """Hint 3's style: compare chunk numbers in a comprehension."""
    src = (rank - step) % P
    mine, theirs = (rank, 2 * P - 1 - rank), (src, 2 * P - 1 - src)
    pairs = [[(2 if a == b else int(a > b)) if causal else 1 for b in theirs] for a in mine]
    return src, (rank + 1) % P, (rank - 1) % P, pairs


def merge_logsumexp(o1, lse1, o2, lse2):
    lse = torch.logsumexp(torch.stack([lse1, lse2]), dim=0)
    w = torch.exp(torch.stack([lse1, lse2]) - torch.nan_to_num(lse, neginf=0.0))
    return w[0].unsqueeze(-1) * o1 + w[1].unsqueeze(-1) * o2, lse


def test_plan_accepts_comprehension_style():
    assert "✓ ring_plan" in run_quietly(checks.check_ring_plan, ring_plan_chunks)


def test_merge_accepts_logsumexp_style():
    assert "✓ merge_partials" in run_quietly(checks.check_merge_partials_torch, merge_logsumexp)


def rank_recv_first_double_buffer(q, k, v, causal, softmax_scale, comm, local_attn):
    """Receives posted before sends, two preallocated buffer pairs swapped (double buffering),
    every computed pair called with a pre-scaled q and softmax_scale = 1."""
    rank, P = comm.rank, comm.world_size
    fq = comm.sizes[rank][0]
    n_max = max(f + b for f, b in comm.sizes)
    bufs = [torch.empty(*k.shape[:2], n_max, k.shape[3], dtype=k.dtype) for _ in range(4)]
    qs = q * softmax_scale
    out, lse = torch.zeros_like(q), torch.full(q.shape[:3], -math.inf, dtype=q.dtype)
    cur_k, cur_v = k, v
    for step in range(P):
        src, to, frm, pairs = ring_plan_chunks(rank, step, P, causal)
        reqs = []
        if step != P - 1:
            n = sum(comm.sizes[(rank - step - 1) % P])
            nk = bufs[2 * (step % 2)][:, :, :n]
            nv = bufs[2 * (step % 2) + 1][:, :, :n]
            nk, nv = nk.contiguous(), nv.contiguous()
            reqs = [comm.irecv(nk, frm), comm.irecv(nv, frm)]
            reqs += [comm.isend(cur_k.contiguous(), to), comm.isend(cur_v.contiguous(), to)]
        fk = comm.sizes[src][0]
        for a, rows in enumerate((slice(0, fq), slice(fq, None))):
            for b, cols in enumerate((slice(0, fk), slice(fk, None))):
                if pairs[a][b]:
                    o, l = local_attn(qs[:, :, rows], cur_k[:, :, cols], cur_v[:, :, cols],
                                      causal=pairs[a][b] == 2, softmax_scale=1.0)  # fmt: skip
                    out[:, :, rows], lse[:, :, rows] = merge_logsumexp(
                        out[:, :, rows], lse[:, :, rows], o, l
                    )
        for r in reqs[::-1]:
            r.wait()
        if reqs:
            cur_k, cur_v = nk, nv
    return out, lse


def rank_exchange_comprehension(q, k, v, causal, softmax_scale, comm, local_attn):
    """comm.exchange for the step's four transfers, the step's calls built by a comprehension,
    the partials merged after the step."""
    rank, P = comm.rank, comm.world_size
    split = lambda t, f: (t[:, :, :f], t[:, :, f:])  # noqa: E731
    qa = split(q, comm.sizes[rank][0])
    out = [torch.zeros_like(x) for x in qa]
    lse = [torch.full(x.shape[:3], -math.inf, dtype=x.dtype) for x in qa]
    for step in range(P):
        src, to, frm, pairs = ring_plan(rank, step, P, causal)
        if step < P - 1:
            nxt = frm - step if frm - step >= 0 else frm - step + P  # the block arriving
            shape = (*k.shape[:2], sum(comm.sizes[nxt]), k.shape[3])
            nk, nv = torch.empty(shape, dtype=k.dtype), torch.empty(shape, dtype=v.dtype)
            reqs = comm.exchange([k, v], to, [nk, nv], frm)
        kb, vb = split(k, comm.sizes[src][0]), split(v, comm.sizes[src][0])
        parts = [
            (a, local_attn(qa[a].contiguous(), kb[b].contiguous(), vb[b].contiguous(),
                           pairs[a][b] == 2, softmax_scale))
            for a in range(2) for b in range(2) if pairs[a][b] != 0
        ]  # fmt: skip
        for a, (o, l) in parts:
            out[a], lse[a] = merge_partials(out[a], lse[a], o, l)
        if step < P - 1:
            [r.wait() for r in reqs]
            k, v = nk, nv
    return torch.cat(out, 2), torch.cat(lse, 2)


@pytest.mark.parametrize(
    "fn", [rank_recv_first_double_buffer, rank_exchange_comprehension], ids=lambda f: f.__name__
)
def test_rank_accepts_more_right_styles(fn):
    out = run_quietly(checks.check_ring_attention_rank, fn)
    assert "✓ ring_attention_rank: 5 cases match" in out


# ---------------------------------------------------------------------------------------------
# the course's own code inside a rank: calls-reference, naming the function
# ---------------------------------------------------------------------------------------------


def rank_calls_course_rank(q, k, v, causal, softmax_scale, comm, local_attn):
    import course_utils.references.ring_attention as ring_ref

    return ring_ref.ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attn)


def _course_plan(rank, step, P, causal):
    import course_utils.references.ring_attention as ring_ref

    return ring_ref.ring_plan(rank, step, P, causal)


def _course_merge(o1, lse1, o2, lse2):
    from course_utils.references.ring_attention import merge_partials_torch

    return merge_partials_torch(o1, lse1, o2, lse2)


@pytest.mark.parametrize(
    "fn, called",
    [
        (rank_calls_course_rank, "course_utils.references.ring_attention.ring_attention_rank"),
        (make_rank(plan=_course_plan), "course_utils.references.ring_attention.ring_plan"),
        (
            make_rank(merge=_course_merge),
            "course_utils.references.ring_attention.merge_partials_torch",
        ),
    ],
    ids=["ring_attention_rank", "ring_plan", "merge_partials_torch"],
)
def test_rank_names_a_course_call_inside_a_rank(fn, called):
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(fn)
    assert slug_of(info.value) == "calls-reference", str(info.value)
    assert called in str(info.value) and "rank 0 of 2" in str(info.value)


# ---------------------------------------------------------------------------------------------
# data only through comm: collectives, files, queues; attention only on the received blocks
# ---------------------------------------------------------------------------------------------


def _pass_blocks_for_show(q, k, v, softmax_scale, comm, local_attn):
    """The ring through comm with one local_attn call between post and wait: bytes and overlap
    come out right, the result is thrown away."""
    rank, P = comm.rank, comm.world_size
    for step in range(P - 1):
        n = sum(comm.sizes[(rank - step - 1) % P])
        k2, v2 = torch.empty(*k.shape[:2], n, k.shape[3], dtype=k.dtype), None
        v2 = torch.empty_like(k2)
        reqs = [comm.isend(k, (rank + 1) % P), comm.isend(v, (rank + 1) % P),
                comm.irecv(k2, (rank - 1) % P), comm.irecv(v2, (rank - 1) % P)]  # fmt: skip
        local_attn(q, k, v, False, softmax_scale)
        for r in reqs:
            r.wait()
        k, v = k2, v2


def _full_attention_of_my_rows(qs, ks, vs, causal, softmax_scale, comm):
    """Full attention of the whole sequence from every rank's shard, then this rank's rows."""
    P = comm.world_size
    fronts, backs = [None] * P, [None] * P
    for name, parts in (("q", qs), ("k", ks), ("v", vs)):
        for r, t in enumerate(parts):
            f = comm.sizes[r][0]
            fronts[r], backs[r] = t[:, :, :f], t[:, :, f:]
        whole = torch.cat(fronts + backs[::-1], dim=2)  # chunks 0..P-1, then P..2P-1
        if name == "q":
            Q = whole
        elif name == "k":
            K = whole
        else:
            V = whole
    s = softmax_scale * Q @ K.transpose(-1, -2)
    if causal:
        N = s.shape[-1]
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), -math.inf)
    lse_all = torch.logsumexp(s, -1)
    out_all = torch.softmax(s, -1) @ V
    r = comm.rank
    starts = [0]
    for f, _ in comm.sizes:
        starts.append(starts[-1] + f)
    front = slice(starts[r], starts[r + 1])
    n_front = starts[-1]
    back_start = n_front + sum(b for _, b in comm.sizes[r + 1 :])
    back = slice(back_start, back_start + comm.sizes[r][1])
    pick = lambda t: torch.cat([t[:, :, front], t[:, :, back]], 2)  # noqa: E731
    return pick(out_all), pick(lse_all)


def rank_all_gather_object(q, k, v, causal, softmax_scale, comm, local_attn):
    """The student of issue 40: every shard gathered with dist.all_gather_object, full attention
    computed locally, the blocks passed through comm only for the bytes and the overlap."""
    import torch.distributed as dist

    P = comm.world_size
    qs, ks, vs = [None] * P, [None] * P, [None] * P
    dist.all_gather_object(qs, q)
    dist.all_gather_object(ks, k)
    dist.all_gather_object(vs, v)
    out, lse = _full_attention_of_my_rows(qs, ks, vs, causal, softmax_scale, comm)
    _pass_blocks_for_show(q, k, v, softmax_scale, comm, local_attn)
    return out, lse


def rank_through_files(q, k, v, causal, softmax_scale, comm, local_attn):
    """Every rank saves its shard to a file; after the ring (every rank has written) it reads
    them all back."""
    import os

    folder = os.path.join(os.environ["RING_SHARDS"], f"ring-shards-{os.getppid()}")
    os.makedirs(folder, exist_ok=True)
    torch.save((q, k, v), os.path.join(folder, f"{comm.rank}.pt"))
    _pass_blocks_for_show(q, k, v, softmax_scale, comm, local_attn)
    shards = [torch.load(os.path.join(folder, f"{r}.pt")) for r in range(comm.world_size)]
    qs, ks, vs = zip(*shards, strict=True)
    return _full_attention_of_my_rows(qs, ks, vs, causal, softmax_scale, comm)


def rank_through_a_queue(q, k, v, causal, softmax_scale, comm, local_attn):
    """A multiprocessing queue made before the ranks start (module level): each rank puts its
    shard P - 1 times and takes the others' (the ring runs for show meanwhile)."""
    P = comm.world_size
    for _ in range(P - 1):
        QUEUE.put((comm.rank, k, v))
    _pass_blocks_for_show(q, k, v, softmax_scale, comm, local_attn)
    got = {}
    while len(got) < P - 1:
        r, kr, vr = QUEUE.get(timeout=1)
        if r != comm.rank:
            got[r] = (kr, vr)
    return torch.zeros_like(q), torch.zeros(q.shape[:3], dtype=q.dtype)


QUEUE = None


def _queue():
    import multiprocessing as mp

    global QUEUE
    QUEUE = mp.get_context("fork").Queue()


@pytest.mark.parametrize(
    "fn, called",
    [
        (rank_all_gather_object, "torch.distributed.all_gather_object"),
        (rank_through_files, "torch.serialization.save"),
        (rank_through_a_queue, "multiprocessing.queues.put"),
    ],
    ids=["all_gather_object", "files", "queue"],
)
def test_rank_names_data_exchanged_around_comm(fn, called, tmp_path, monkeypatch):
    monkeypatch.setenv("RING_SHARDS", str(tmp_path))  # rank_through_files's folder, not /tmp
    if fn is rank_through_a_queue:
        _queue()
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(fn)
    text = str(info.value)
    assert slug_of(text) == "bypasses-comm", text
    assert called in text and "rank 0 of 2" in text.splitlines()[0], text  # the lowest rank
    assert "raised" not in text.splitlines()[0]


def _attend_before_wait(q, k, v, causal, softmax_scale, comm, local_attn):
    """Attends to the arriving buffers before their wait (the usual slip of a learner who swaps
    the buffers at the top of the step): the keys read are not the rank's yet."""
    rank, P = comm.rank, comm.world_size
    fq = comm.sizes[rank][0]
    out, lse = torch.zeros_like(q), torch.full(q.shape[:3], -math.inf, dtype=q.dtype)
    cur = (k, v)
    for step in range(P):
        src, to, frm, pairs = ring_plan(rank, step, P, causal)
        reqs = []
        if step < P - 1:
            n = sum(comm.sizes[(rank - step - 1) % P])
            nxt = (torch.zeros(*k.shape[:2], n, k.shape[3], dtype=k.dtype),
                   torch.zeros(*k.shape[:2], n, k.shape[3], dtype=k.dtype))  # fmt: skip
            reqs = [comm.isend(cur[0], to), comm.isend(cur[1], to),
                    comm.irecv(nxt[0], frm), comm.irecv(nxt[1], frm)]  # fmt: skip
            cur = nxt  # too early: the step below reads a block still on its way
        fk = comm.sizes[src][0]
        for a, rows in enumerate((slice(0, fq), slice(fq, None))):
            for b, cols in enumerate((slice(0, fk), slice(fk, None))):
                if pairs[a][b]:
                    o, l = local_attn(q[:, :, rows], cur[0][:, :, cols], cur[1][:, :, cols],
                                      pairs[a][b] == 2, softmax_scale)  # fmt: skip
                    out[:, :, rows], lse[:, :, rows] = merge_partials(
                        out[:, :, rows], lse[:, :, rows], o, l
                    )
        for r in reqs:
            r.wait()
    return out, lse


def rank_own_attention(q, k, v, causal, softmax_scale, comm, local_attn):
    """The blocks pass through comm, but the attention is the learner's own softmax over every
    block received, concatenated; local_attn is called once per step for the overlap."""
    rank, P = comm.rank, comm.world_size
    blocks = {rank: (k, v)}
    cur_k, cur_v = k, v
    for step in range(P - 1):
        src_next = (rank - step - 1) % P
        n = sum(comm.sizes[src_next])
        nk = torch.empty(*k.shape[:2], n, k.shape[3], dtype=k.dtype)
        nv = torch.empty_like(nk)
        reqs = [comm.isend(cur_k, (rank + 1) % P), comm.isend(cur_v, (rank + 1) % P),
                comm.irecv(nk, (rank - 1) % P), comm.irecv(nv, (rank - 1) % P)]  # fmt: skip
        local_attn(q, cur_k, cur_v, False, softmax_scale)
        for r in reqs:
            r.wait()
        blocks[src_next] = (nk, nv)
        cur_k, cur_v = nk, nv
    qs = [q if r == rank else torch.zeros(*q.shape[:2], sum(comm.sizes[r]), q.shape[3],
          dtype=q.dtype) for r in range(P)]  # fmt: skip
    ks = [blocks[r][0] for r in range(P)]
    vs = [blocks[r][1] for r in range(P)]
    return _full_attention_of_my_rows(qs, ks, vs, causal, softmax_scale, comm)


@pytest.mark.parametrize(
    "fn, slug",
    [
        (_attend_before_wait, "unreceived-block"),
        (rank_own_attention, "attention-outside-local-attn"),
    ],
    ids=["attend-before-wait", "own-attention"],
)
def test_rank_attention_only_on_received_blocks(fn, slug):
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(fn)
    assert slug_of(info.value) == slug, str(info.value)


def test_rank_that_switches_the_watch_off_is_named():
    def rank_no_watch(q, k, v, causal, softmax_scale, comm, local_attn):
        import sys

        sys.setprofile(None)
        return make_rank()(q, k, v, causal, softmax_scale, comm, local_attn)

    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(rank_no_watch)
    assert slug_of(info.value) == "disables-check", str(info.value)


# ---------------------------------------------------------------------------------------------
# diagnoses: a receive buffer of the wrong size, the neighbours swapped, the causal bound
# ---------------------------------------------------------------------------------------------


def test_rank_names_a_receive_buffer_of_the_wrong_size():
    """The buffer of the next block allocated like the block held (k.shape): right for equal
    shards, 4 positions for a block of 5 when N = 9 over 2 ranks."""

    rank_own_size_buffer = make_rank(own_size=True)

    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(rank_own_size_buffer)
    text = str(info.value)
    assert slug_of(text) == "recv-buffer-size", text
    first = text.splitlines()[0]
    assert "bytes (4 positions) got a block of" in first and "(5 positions)" in first, first
    assert "EnforceNotMet" not in text


def test_rank_names_a_receive_buffer_longer_than_its_block():
    """The buffer of the next block allocated for the longest shard (max of comm.sizes): gloo
    fills it in part, silently; the rest stays the guard's NaN poison."""

    rank_longest_buffer = make_rank(longest=True)

    with pytest.raises(CheckFailure) as info:
        checks.check_ring_attention_rank(rank_longest_buffer)
    text = str(info.value)
    assert slug_of(text) == "recv-buffer-size", text
    first = text.splitlines()[0]
    assert "bytes (5 positions) got a block of" in first and "(4 positions)" in first, first


def plan_send_recv_swapped(rank, step, P, causal):
    src, to, frm, pairs = ring_plan(rank, step, P, causal)
    return src, frm, to, pairs


def test_plan_names_send_and_receive_swapped():
    with pytest.raises(CheckFailure) as info:
        checks.check_ring_plan(plan_send_recv_swapped)
    text = str(info.value)
    assert slug_of(text) == "send-recv-swapped", text
    assert "zig-zag pairs" not in text


def test_quick_hide_length_names_the_causal_bound():
    with pytest.raises(CheckFailure) as info:
        checks.check_quick_hide_length(2 * 797e12 / 450e9)  # e F / W: section 3's causal bound
    assert "causal" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "check, fn, called",
    [
        (checks.check_ring_plan, _course_plan, "course_utils.references.ring_attention.ring_plan"),
        (
            checks.check_merge_partials_torch,
            _course_merge,
            "course_utils.references.ring_attention.merge_partials_torch",
        ),
    ],
    ids=["ring_plan", "merge_partials"],
)
def test_plan_and_merge_name_a_course_call(check, fn, called):
    with pytest.raises(CheckFailure) as info:
        check(fn)
    assert slug_of(info.value) == "calls-reference" and called in str(info.value)


# ---------------------------------------------------------------------------------------------
# as grading runs it: the stripped package in a real kernel, the test cell here
# ---------------------------------------------------------------------------------------------


def _solution_cells(*ids):
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "solutions/10_ring_attention"
    nb = json.loads((path / "10_ring_attention.ipynb").read_text())
    cells = {c.get("id"): "".join(c["source"]) for c in nb["cells"]}
    return "\n".join(cells[i] for i in ids)


RING_TEST_CELL = """from course_utils.checks.ring_attention import check_ring_attention_rank

check_ring_attention_rank(ring_attention_rank)
"""
COURSE_PLAN_IN_RANK = """
import course_utils.references.ring_attention as ring_ref
def ring_plan(rank, step, P, causal):
    return ring_ref.ring_plan(rank, step, P, causal)
"""
GATHER_IN_RANK = """
import torch.distributed as dist
_own = ring_attention_rank
def ring_attention_rank(q, k, v, causal, softmax_scale, comm, local_attn):
    ks = [None] * comm.world_size
    dist.all_gather_object(ks, k)
    return _own(q, k, v, causal, softmax_scale, comm, local_attn)
"""


@pytest.mark.notebooks
def test_grading_names_course_calls_and_channels_inside_ranks(tmp_path):
    import os

    from graders.isolation import student_build
    from graders.isolation.remote import KernelChannel, run_test_cell

    stripped = tmp_path / "build"
    stripped.mkdir()
    student_build.build(stripped)
    env = {**os.environ, "PYTHONPATH": str(stripped)}
    km, kc = kernels.start_kernel(env=env, cwd=str(tmp_path))

    def execute(code: str) -> None:
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok", reply["content"]

    def verdict() -> str:
        outputs = run_test_cell(RING_TEST_CELL, channel)
        errors = [o for o in outputs if o.output_type == "error"]
        return "fail: " + errors[0].evalue if errors else "pass"

    channel = KernelChannel(
        lambda code: kc.execute_interactive(
            code, timeout=60, output_hook=lambda m: None, store_history=False
        ),
        tmp_path / "io",
    )
    try:
        execute(_solution_cells("cell-002", "ring-plan", "merge-partials", "ring-attention-rank"))
        assert verdict() == "pass"
        execute(COURSE_PLAN_IN_RANK)
        found = verdict()
        assert "calls-reference" in found and "ring_plan" in found, found
        execute(_solution_cells("ring-plan") + GATHER_IN_RANK)
        found = verdict()
        assert "bypasses-comm" in found and "all_gather_object" in found, found
    finally:
        kc.stop_channels()  # its sockets closed here, not by the garbage collector later
        km.shutdown_kernel(now=True)
