"""The checks of notebook 10: three correct ring loops pass, each named mistake is recognised.

The "learners" are written here, in the styles a learner would use. The ring loops run for real on
gloo processes (forked: the functions below need no pickling), a handful of runs per test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from checkhelp import as_learner, run_quietly, slug_of

from course_utils.checks import ring_attention as checks
from course_utils.checks._core import CheckFailure

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


def make_rank(plan=ring_plan, merge=merge_partials, *, wait_first=False, send_last=False):
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
