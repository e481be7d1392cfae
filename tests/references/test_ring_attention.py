"""The reference ring (references.ring_attention) and its plumbing (harness.ring_comm).

Every ring here is real: P gloo processes forked from the test, joined through a FileStore.
A few runs per test, small shapes: each start costs about 0.1 s per rank on two shared cores.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from course_utils import attention_reference
from course_utils.harness.ring_comm import (
    RingError,
    launch_ring,
    local_attention,
    run_learner_ring,
    shard,
    shard_sizes,
    unshard,
    zigzag_bounds,
)
from course_utils.references.ring_attention import (
    CAUSAL,
    FULL,
    SKIP,
    merge_partials_torch,
    ring_attention,
    ring_bytes_sent,
    ring_plan,
    ring_schedule,
)


def _full(q, k, v, causal):
    B, H, N, d = q.shape
    out, lse = np.zeros((B, H, N, d)), np.zeros((B, H, N))
    for b in range(B):
        for h in range(H):
            out[b, h], lse[b, h] = attention_reference(q[b, h], k[b, h], v[b, h], causal)
    return out, lse


@pytest.mark.parametrize(
    "P, N, causal",
    [(1, 5, True), (2, 9, False), (2, 9, True), (3, 10, True), (4, 13, True), (4, 6, False)],
)
def test_ring_equals_full_attention(P, N, causal):
    rng = np.random.default_rng(P * 100 + N)
    q, k, v = (rng.normal(size=(2, 2, N, 8)) for _ in range(3))
    out, lse, sent = ring_attention(q, k, v, causal, P)
    ref_out, ref_lse = _full(q, k, v, causal)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(sent, ring_bytes_sent(N, P, 2, 2, 8, 8))


def test_bytes_formula_equal_shards():
    P, N, B, H, d, e = 4, 64, 1, 2, 8, 2
    expected = 2 * (P - 1) * B * H * d * e * N / P
    np.testing.assert_array_equal(ring_bytes_sent(N, P, B, H, d, e), np.full(P, expected))
    assert ring_bytes_sent(N, 1, B, H, d, e).tolist() == [0.0]


@pytest.mark.parametrize("N, P", [(0, 1), (1, 2), (7, 3), (13, 4), (32, 4), (5, 8)])
def test_zigzag_layout_covers_the_sequence(N, P):
    bounds = zigzag_bounds(N, P)
    chunks = sorted(c for pair in bounds for c in pair)
    assert chunks[0][0] == 0 and chunks[-1][1] == N
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
    sizes = [f + b for f, b in shard_sizes(N, P)]
    assert max(sizes) - min(sizes) <= 2
    x = torch.arange(N, dtype=torch.float64).reshape(1, 1, N, 1)
    assert torch.equal(unshard(shard(x, P)), x)
    xn = np.arange(N, dtype=float).reshape(1, 1, N)
    np.testing.assert_array_equal(unshard(shard(xn, P)), xn)


def test_causal_work_is_balanced():
    """Zig-zag: after the diagonal step every rank computes the same number of (q, k) pairs."""
    P, N = 4, 64
    sizes = shard_sizes(N, P)
    for step in range(1, P):
        work = []
        for r in range(P):
            src, _, _, pairs = ring_plan(r, step, P, True)
            qs, ks = sizes[r], sizes[src]
            work.append(sum(qs[a] * ks[b] for a in (0, 1) for b in (0, 1) if pairs[a][b]))
        assert len(set(work)) == 1, work


def test_plan_and_schedule():
    assert ring_plan(2, 0, 4, True) == (2, 3, 1, ((CAUSAL, SKIP), (FULL, CAUSAL)))
    assert ring_plan(2, 1, 4, True) == (1, 3, 1, ((FULL, SKIP), (FULL, SKIP)))
    assert ring_plan(0, 1, 4, True) == (3, 1, 3, ((SKIP, SKIP), (FULL, FULL)))
    schedule = ring_schedule(3, False)
    assert [[s for s, _ in row] for row in schedule] == [[0, 1, 2], [2, 0, 1], [1, 2, 0]]
    with pytest.raises(ValueError, match="rank"):
        ring_plan(4, 0, 4, True)
    with pytest.raises(TypeError, match="P must be an int"):
        ring_plan(0, 0, 2.0, True)


def test_merge_torch_empty_sets():
    o = torch.ones(1, 1, 2, 3, dtype=torch.float64)
    lse = torch.tensor([[[-np.inf, 0.5]]], dtype=torch.float64)
    out, l = merge_partials_torch(o, lse, torch.zeros_like(o), torch.full_like(lse, -np.inf))
    assert torch.isneginf(l[0, 0, 0]) and torch.equal(out[0, 0, 0], torch.zeros(3).double())
    assert l[0, 0, 1] == 0.5 and not torch.isnan(out).any()


def test_local_attention_no_keys():
    q = torch.ones(1, 1, 2, 4, dtype=torch.float64)
    k = torch.ones(1, 1, 0, 4, dtype=torch.float64)
    out, lse = local_attention(q, k, k)
    assert torch.equal(out, torch.zeros(1, 1, 2, 4).double()) and torch.isneginf(lse).all()
    with pytest.raises(ValueError, match="causal needs Nq == Nk"):
        local_attention(q, q[:, :, :1], q[:, :, :1], causal=True)


def _pid_and_raise(comm, flag):
    if flag:
        raise KeyError("rank one fails")
    return os.getpid()


def _ranks_pids(comm, _):
    return os.getpid(), comm.rank, comm.world_size


def test_launch_ring_ends_its_processes():
    results = launch_ring(_ranks_pids, 3, [None] * 3)
    assert [r[1:] for r in results] == [(0, 3), (1, 3), (2, 3)]
    for pid, _, _ in results:  # every rank was joined: its pid is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_ring_names_the_failing_rank():
    with pytest.raises(KeyError, match="rank 1 of 2"):
        launch_ring(_pid_and_raise, 2, [False, True])


def _wait_for_a_failed_peer(comm, _):
    if comm.rank == 1:
        raise KeyError("rank one fails first")
    t = torch.empty(1)
    comm.irecv(t, 1).wait()  # fails when rank 1's sockets close: an echo of rank 1's failure
    return comm.rank


def test_launch_ring_names_the_cause_not_its_echo():
    # Rank 0 fails too (its peer is gone), and it is rank 0: the report still names rank 1.
    with pytest.raises(KeyError, match="rank 1 of 2.*rank one fails first"):
        launch_ring(_wait_for_a_failed_peer, 2, [None, None], timeout_s=20.0)


def _hang(comm, _):
    if comm.rank == 0:  # rank 1 never sends: rank 0 waits until the deadline
        t = torch.empty(1)
        comm.irecv(t, 1).wait()
    return comm.rank


def test_launch_ring_deadline_kills_a_hung_rank():
    with pytest.raises((RingError, RuntimeError)):
        launch_ring(_hang, 2, [None, None], timeout_s=2.0)


def test_launch_ring_bad_arguments():
    with pytest.raises(ValueError, match="P must be an int"):
        launch_ring(_ranks_pids, 0)
    with pytest.raises(ValueError, match="args_per_rank"):
        launch_ring(_ranks_pids, 2, [1])
    with pytest.raises(ValueError, match="backend"):
        launch_ring(_ranks_pids, 2, [1, 2], backend="mpi")


def _count(comm, _):
    t = torch.zeros(5, dtype=torch.float32)
    peer = 1 - comm.rank
    reqs = [comm.isend(t, peer), comm.irecv(torch.empty(5), peer)]
    comm.watched(lambda: None)()
    for r in reqs:
        r.wait()
    with pytest.raises(ValueError, match="peer rank"):
        comm.isend(t, comm.rank)
    return comm.bytes_sent, comm.overlap()


def test_comm_counts_bytes_and_overlap():
    assert launch_ring(_count, 2, [None, None]) == [(20, 1.0), (20, 1.0)]


# ---------------------------------------------------------------------------------------------
# the rank guard (course_utils.harness.ring_guard) inside run_learner_ring
# ---------------------------------------------------------------------------------------------


def _learner_ring(before):
    """The course's ring loop as a learner's function, after `before(comm)` has run."""

    def rank_fn(q, k, v, causal, softmax_scale, comm, local_attn):
        before(comm)
        return _loop(q, k, v, causal, softmax_scale, comm, local_attn)

    return rank_fn


def _loop(q, k, v, causal, softmax_scale, comm, local_attn):
    rank, P = comm.rank, comm.world_size
    out, lse = torch.zeros_like(q), torch.full(q.shape[:3], -np.inf, dtype=q.dtype)
    for step in range(P):
        reqs = []
        if step < P - 1:
            n = sum(comm.sizes[(rank - step - 1) % P])
            nk = torch.empty(*k.shape[:2], n, k.shape[3], dtype=k.dtype)
            nv = torch.empty_like(nk)
            reqs = comm.exchange([k, v], (rank + 1) % P, [nk, nv], (rank - 1) % P)
        o, l = local_attn(q, k, v, False, softmax_scale)
        m = torch.logaddexp(lse, l)
        safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        out = torch.exp(lse - safe)[..., None] * out + torch.exp(l - safe)[..., None] * o
        lse = m
        for r in reqs:
            r.wait()
        if reqs:
            k, v = nk, nv
    return out, lse


def _qkv(N=8):
    rng = np.random.default_rng(N)
    return tuple(rng.normal(size=(1, 2, N, 4)) for _ in range(3))


def _prints(comm):
    import sys

    print("rank", comm.rank, "starts", flush=True)  # to the rank's own stdout
    sys.stdout.flush()


@pytest.mark.parametrize("before", [lambda comm: None, _prints], ids=["plain", "prints"])
def test_guarded_ring_runs_a_right_loop(before):
    q, k, v = _qkv()
    out, lse, sent, overlapped = run_learner_ring(_learner_ring(before), q, k, v, False, 2)
    ref_out, ref_lse = _full(q, k, v, False)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    assert overlapped.tolist() == [1.0, 1.0]


def _opens_a_file(comm):
    with open(os.devnull, "w") as fh:
        fh.write("x")


def _walks_the_stack(comm):
    import sys

    sys._getframe(1)


def _gathers(comm):
    import torch.distributed as dist

    dist.barrier()


@pytest.mark.parametrize(
    "before, called",
    [(_opens_a_file, "io.open"), (_walks_the_stack, "sys._getframe"), (_gathers, "barrier")],
    ids=["open", "getframe", "dist-barrier"],
)
def test_guard_names_a_channel_around_comm(before, called):
    from course_utils.harness.ring_guard import RingMistake

    q, k, v = _qkv()
    with pytest.raises(RingMistake, match="bypasses-comm") as info:
        run_learner_ring(_learner_ring(before), q, k, v, False, 2)
    assert called in str(info.value).splitlines()[0] and "rank 0 of 2" in str(info.value)


def test_guard_watches_threads_a_rank_starts():
    from course_utils.checks.engine.failures import ReferenceUnavailable

    def plan_in_a_thread(comm):
        import threading

        import course_utils.references.ring_attention as ring_ref

        t = threading.Thread(target=lambda: ring_ref.ring_plan(comm.rank, 0, 2, False))
        t.start()
        t.join()

    q, k, v = _qkv()
    with pytest.raises(ReferenceUnavailable, match="ring_plan.*rank 0 of 2"):
        run_learner_ring(_learner_ring(plan_in_a_thread), q, k, v, False, 2)


def test_gloo_size_mismatch_is_read_from_a_rank_stderr(tmp_path):
    from course_utils.harness.ring_comm import _buffer_mismatch

    paths = [str(tmp_path / f"rank{r}.pkl") for r in range(2)]
    (tmp_path / "rank1.pkl.stderr").write_text(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce "
        "fail at pair.cc:456] op.preamble.length <= op.nbytes. 320 vs 256. Received data size "
        "doesn't match expected size."
    )
    found = _buffer_mismatch(paths)
    assert (found.rank, found.arrived, found.buffer) == (1, 320, 256)
    (tmp_path / "rank1.pkl.stderr").write_text("Connection reset by peer")
    assert _buffer_mismatch(paths) is None
