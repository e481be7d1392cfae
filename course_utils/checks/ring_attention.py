"""Checks of notebook 10 (ring attention): ring_plan, merge_partials (torch), ring_attention_rank.

ring_plan(rank, step, P, causal) -> (src, send_to, recv_from, pairs) is pure: compared with
course_utils.references.ring_attention.ring_plan on every (rank, step) of rings of 1 to 5 ranks.

merge_partials(o1, lse1, o2, lse2) on torch tensors is notebook 02's merge: compared with the
float64 NumPy merge; notebook 02's buggy merges name the mistakes.

ring_attention_rank runs for real: harness.ring_comm.run_learner_ring starts P gloo processes
(fork) in the learner's kernel, each running the learner's function on its zig-zag shard, and
sends back plain arrays: the outputs in sequence order, the bytes each rank passed to isend, and
the share of each rank's receives that had a local attention call between post and wait. Here
they are compared with full attention on the concatenated sequence, with ring_bytes_sent (the
formula of the notebook), and with 1.0 (every transfer overlapped). A mistake is named when a
sequential replay of the ring with that one bug (run here, no processes) gives the same arrays.
Each rank runs under the rank guard (harness.ring_guard): a course call inside a rank is
calls-reference; data exchanged around comm (a collective, a file, a queue), local attention on
a block the rank does not hold, or a right output that its local_attn results do not give end the
rank with a RingMistake, said here as a named failure (_ring_verdict); so does gloo's abort on a
receive buffer smaller than the block sent (recv-buffer-size).
"""

from __future__ import annotations

import functools

import numpy as np

from course_utils import attention_reference
from course_utils import merge_partials as _np_merge
from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import (
    LOW_PRECISION_MISTAKE,
    NAN_MISTAKE,
    CheckFailure,
    Mistake,
)
from course_utils.checks.engine.quizzes import hinted_answer
from course_utils.checks.merge_partials import MERGE_MISTAKES
from course_utils.harness.ring_comm import CAUSAL, FULL, SKIP, shard_sizes, zigzag_bounds
from course_utils.references.ring_attention import ring_bytes_sent
from course_utils.references.ring_attention import ring_plan as _reference_plan

NEG_INF = -np.inf

# ---------------------------------------------------------------------------------------------
# ring_plan
# ---------------------------------------------------------------------------------------------


def _plan_with(src_rule, pairs_rule, send_rule=lambda r, P: (r + 1) % P):
    def plan(rank, step, P, causal):
        src = src_rule(rank, step, P)
        return (
            src,
            send_rule(rank, P),
            (2 * rank - send_rule(rank, P)) % P,
            pairs_rule(rank, src, causal),
        )

    return plan


def _src_right(rank, step, P):
    return (rank - step) % P


def _pairs(rank, src, causal):
    if not causal:
        return ((FULL, FULL), (FULL, FULL))
    if src == rank:
        return ((CAUSAL, SKIP), (FULL, CAUSAL))
    if src < rank:
        return ((FULL, SKIP), (FULL, SKIP))
    return ((SKIP, SKIP), (FULL, FULL))


def _pairs_skip_upper(rank, src, causal):
    """The contiguous layout's rule kept for zig-zag: a block from a later rank is skipped."""
    if causal and src > rank:
        return ((SKIP, SKIP), (SKIP, SKIP))
    return _pairs(rank, src, causal)


def _pairs_diag_unmasked(full_diag):
    def rule(rank, src, causal):
        if causal and src == rank:
            return ((FULL, FULL), (FULL, FULL)) if full_diag else ((FULL, SKIP), (FULL, FULL))
        return _pairs(rank, src, causal)

    return rule


def _pairs_halves_swapped(rank, src, causal):
    if causal and src != rank:
        return _pairs(rank, rank + 1, causal) if src < rank else _pairs(rank + 1, rank, causal)
    return _pairs(rank, src, causal)


def _pairs_causal_ignored(rank, src, causal):
    return _pairs(rank, src, False)


_F_SRC = (
    "whose block a rank holds and its neighbours: blocks pass to r + 1, so rank r sends to "
    "(r + 1) mod P, receives from (r - 1) mod P, and after s steps holds the block of (r - s) mod P"
)
_F_PAIRS = (
    "the zig-zag pairs: src == r causal diagonal [[2, 0], [1, 2]]; src < r every query on src's "
    "front [[1, 0], [1, 0]]; src > r r's back queries on all of src [[0, 0], [1, 1]]"
)

PLAN_MISTAKES = (
    [
        Mistake(
            "ring-direction",
            "the ring turned the wrong way",
            "Blocks travel to rank + 1 and come from rank - 1, so after s steps rank r holds "
            "the block that started s ranks BEHIND it: src = (r - s) mod P. (r + s) mod P "
            "is where your own block is after s steps, not whose block you hold.",
            fn,
        )
        for fn in (
            _plan_with(lambda r, s, P: (r + s) % P, _pairs),
            _plan_with(lambda r, s, P: (r + s) % P, _pairs, send_rule=lambda r, P: (r - 1) % P),
        )
    ]
    + [
        Mistake(
            "ring-off-by-one",
            "the source rank off by one step",
            "At step 0 a rank works on its OWN block (src = r); the first block from a neighbour "
            "arrives for step 1. src = (r - s) mod P, not (r - s - 1) or (r - s + 1).",
            fn,
        )
        for fn in (
            _plan_with(lambda r, s, P: (r - s - 1) % P, _pairs),
            _plan_with(lambda r, s, P: (r - s + 1) % P, _pairs),
        )
    ]
    + [
        Mistake(
            "send-recv-swapped",
            "send_to and recv_from swapped",
            "Blocks travel towards higher ranks: a rank sends to (r + 1) mod P and receives from "
            "(r - 1) mod P. Sent the other way, after s steps rank r would hold the block of "
            "(r + s) mod P, not the (r - s) mod P your src says.",
            _plan_with(_src_right, _pairs, send_rule=lambda r, P: (r - 1) % P),
        ),
        Mistake(
            "causal-skip-later-block",
            "a block from a later rank skipped whole",
            "With contiguous shards a later rank's block is all in the future; with the zig-zag "
            "layout it is not: rank r's BACK chunk (2P-1-r) comes after both chunks of every rank "
            "src > r, so those pairs are full: [[0, 0], [1, 1]].",
            _plan_with(_src_right, _pairs_skip_upper),
        ),
        Mistake(
            "diagonal-unmasked",
            "the diagonal block computed without the causal mask",
            "When src == r the rank's own keys sit beside its queries: chunk r on chunk r "
            "and chunk 2P-1-r on itself need the causal mask (pairs 2), chunk r on chunk 2P-1-r "
            "is all in the future (0), chunk 2P-1-r on chunk r is full (1): [[2, 0], [1, 2]].",
            _plan_with(_src_right, _pairs_diag_unmasked(False)),
        ),
        Mistake(
            "diagonal-unmasked",
            "the diagonal block computed without the causal mask",
            "When src == r the rank's own keys sit beside its queries: [[2, 0], [1, 2]], "
            "not all 1.",
            _plan_with(_src_right, _pairs_diag_unmasked(True)),
        ),
        Mistake(
            "zigzag-halves-swapped",
            "the front and back chunks confused for an earlier and a later source",
            "src < r: src's front chunk (chunk src) is before both of r's chunks and src's "
            "back chunk after both, so every query sees the front only: [[1, 0], [1, 0]]. "
            "src > r: only r's back chunk comes after src's chunks: [[0, 0], [1, 1]].",
            _plan_with(_src_right, _pairs_halves_swapped),
        ),
        Mistake(
            "causal-ignored",
            "causal=True treated as no mask",
            "With causal=True a query sees only keys at or before it: some pairs are skipped "
            "(0) and the diagonal ones masked (2).",
            _plan_with(_src_right, _pairs_causal_ignored),
        ),
    ]
)


def _plan_reference(rank, step, P, causal):
    src, send_to, recv_from, pairs = _reference_plan(rank, step, P, causal)
    return src, send_to, recv_from, np.array(pairs)


def _plan_cases() -> list[Case]:
    cases = []
    # causal rings show a later step first: a plan that ignores the mask differs there from one
    # that only leaves the diagonal unmasked, so each is named by its own first failure
    # P = 3 without a mask comes early, a later step first: r + 1 and r - 1 differ there (not
    # for P <= 2), so a plan with the neighbours swapped fails on a case about the neighbours,
    # where it differs from a ring turned the other way (whose src is wrong too)
    for P, causal in (
        (1, False),
        (2, False),
        (3, False),
        (2, True),
        (1, True),
        (4, True),
        (5, True),
    ):
        for step in [*range(1, P), 0] if causal or P == 3 else range(P):
            for rank in range(P):
                label = f"P = {P}, rank {rank}, step {step}, causal={causal}"
                focus = _F_PAIRS if causal else _F_SRC
                cases.append(Case(label, (rank, step, P, causal), focus=focus))
    return cases


def check_ring_plan(fn) -> None:
    """Check ring_plan(rank, step, P, causal) -> (src, send_to, recv_from, pairs) on every
    (rank, step) of rings of P = 1 to 5 ranks, causal and not."""
    run_cases(
        "ring_plan",
        fn,
        _plan_reference,
        _plan_cases(),
        outputs=("src", "send_to", "recv_from", "pairs"),
        mistakes=PLAN_MISTAKES,
        rtol=0.0,
        atol=0.0,
        low_precision_below=None,
        summary="every rank and step of rings of 1 to 5 ranks, causal and not",
    )


# ---------------------------------------------------------------------------------------------
# merge_partials on torch tensors
# ---------------------------------------------------------------------------------------------


def _np(x):
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _on_numpy(fn):
    @functools.wraps(fn)
    def wrapped(*args):
        return fn(*(_np(a) for a in args))

    return wrapped


def _merge_reference(o1, lse1, o2, lse2):
    return _np_merge(*(_np(a) for a in (o1, lse1, o2, lse2)))


TORCH_MERGE_MISTAKES = [
    Mistake(m.slug, m.title, m.explanation, _on_numpy(m.fn)) for m in MERGE_MISTAKES
]


def _t(a):
    import torch

    return torch.tensor(np.asarray(a, dtype=np.float64))


def _merge_cases() -> list[Case]:
    rng = np.random.default_rng(7)
    o1, o2 = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 3, 4, 5))
    l1, l2 = rng.normal(size=(2, 3, 4)), 2 * rng.normal(size=(2, 3, 4))
    far1, far2 = l1.copy(), l2.copy()
    far1[0, 0, :2] = [1000.0, -1000.0]
    far2[0, 0, :2] = [0.0, 0.0]
    empty1, empty2 = l1.copy(), l2.copy()
    empty1[1, 2, 0] = NEG_INF
    empty2[1, 2, 1] = NEG_INF
    empty1[0, 1, 3] = empty2[0, 1, 3] = NEG_INF
    o_empty1, o_empty2 = o1.copy(), o2.copy()
    o_empty1[1, 2, 0] = o_empty2[1, 2, 1] = 0.0
    o_empty1[0, 1, 3] = o_empty2[0, 1, 3] = 0.0
    return [
        Case(
            "one row, d = 1: (o, lse) = (2, ln 1) and (5, ln 3) (B = H = 1)",
            (_t([[[[2.0]]]]), _t([[[0.0]]]), _t([[[[5.0]]]]), _t([[[np.log(3.0)]]])),
            focus="the weights e^(lse_A - lse), e^(lse_B - lse) with lse = logaddexp",
        ),
        Case(
            "B = 2, H = 3, 4 rows, d = 5",
            tuple(_t(a) for a in (o1, l1, o2, l2)),
            focus="one weight per row, broadcast over d (w[..., None])",
        ),
        Case(
            "lse 1000 apart in two rows",
            tuple(_t(a) for a in (o1, far1, o2, far2)),
            focus="stay in the log domain: weights e^(lse_i - lse) <= 1",
        ),
        Case(
            "empty sets (lse = -inf, o = 0): one on each side, and a row empty on both",
            tuple(_t(a) for a in (o_empty1, empty1, o_empty2, empty2)),
            focus="an empty set has weight 0; both empty: o = 0, lse = -inf",
        ),
    ]


def check_merge_partials_torch(fn) -> None:
    """Check merge_partials(o1, lse1, o2, lse2) on float64 torch tensors (B, H, n, d), (B, H, n)."""
    run_cases(
        "merge_partials",
        fn,
        _merge_reference,
        _merge_cases(),
        outputs=("o", "lse"),
        mistakes=TORCH_MERGE_MISTAKES,
        summary="torch tensors (B, H, n, d), lse 1000 apart, empty sets on either or both sides",
    )


# ---------------------------------------------------------------------------------------------
# ring_attention_rank: replays of the ring, one process playing every rank in turn
# ---------------------------------------------------------------------------------------------


def _attn(q, k, v, causal, scale):
    """(out, lse) of one call, float64 NumPy, q (B, H, nq, d), k, v (B, H, nk, d)."""
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    if causal:
        if q.shape[2] != k.shape[2]:
            raise ValueError("causal needs Nq == Nk")
        s = np.where(np.tri(q.shape[2], k.shape[2], dtype=bool), s, NEG_INF)
    m = s.max(axis=-1, initial=NEG_INF)
    safe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - safe[..., None])
    l = p.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[..., None] > 0, (p @ v) / np.where(l > 0, l, 1.0)[..., None], 0.0)
        lse = np.where(l > 0, safe + np.log(np.where(l > 0, l, 1.0)), NEG_INF)
    return out, lse


def _right_merge(o1, lse1, o2, lse2):
    return _np_merge(o1, lse1, o2, lse2)


def _replay(
    q,
    k,
    v,
    causal,
    P,
    *,
    plan=None,
    held=lambda r, s, P: (r - s) % P,
    merge=_right_merge,
    sends=None,
    overlapped=1.0,
):
    """The ring played rank by rank with one bug: (out, lse, bytes_sent, overlapped).

    plan: the learner's believed (src, pairs) (default: the right plan); held: whose block is
    really in the buffer at step s; merge: the merge used; sends: steps that send (P - 1).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, H, N, d = q.shape
    scale = 1.0 / np.sqrt(d)
    plan = plan or _reference_plan
    bounds = zigzag_bounds(N, P)
    sizes = shard_sizes(N, P)

    def rows(r):
        (f0, f1), (b0, b1) = bounds[r]
        return np.r_[f0:f1, b0:b1]

    outs, lses = np.zeros((B, H, N, d)), np.full((B, H, N), NEG_INF)
    for r in range(P):
        qr = q[:, :, rows(r)]
        out, lse = np.zeros(qr.shape), np.full(qr.shape[:-1], NEG_INF)
        fq = sizes[r][0]
        q_chunks = (slice(0, fq), slice(fq, qr.shape[2]))
        for s in range(P):
            src, _, _, pairs = plan(r, s, P, causal)
            real = held(r, s, P)
            kr, vr = k[:, :, rows(real)], v[:, :, rows(real)]
            fk = sizes[src][0]
            k_chunks = (slice(0, fk), slice(fk, kr.shape[2]))
            for a in (0, 1):
                for b in (0, 1):
                    if pairs[a][b] == SKIP:
                        continue
                    qa = qr[:, :, q_chunks[a]]
                    o_p, l_p = _attn(
                        qa,
                        kr[:, :, k_chunks[b]],
                        vr[:, :, k_chunks[b]],
                        pairs[a][b] == CAUSAL,
                        scale,
                    )
                    o_new, l_new = merge(out[:, :, q_chunks[a]], lse[:, :, q_chunks[a]], o_p, l_p)
                    out[:, :, q_chunks[a]], lse[:, :, q_chunks[a]] = o_new, l_new
        outs[:, :, rows(r)], lses[:, :, rows(r)] = out, lse
    n_sends = P - 1 if sends is None else sends(P)
    per_token = 2 * B * H * d * 8
    total = [f + b for f, b in sizes]
    sent = np.array(
        [float(per_token * sum(total[(r - s) % P] for s in range(n_sends))) for r in range(P)]
    )
    ov = np.full(P, 1.0 if P == 1 else overlapped)
    return outs, lses, sent, ov


def _ring_reference(q, k, v, causal, P):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, H, N, d = q.shape
    out, lse = np.zeros((B, H, N, d)), np.zeros((B, H, N))
    for b in range(B):
        for h in range(H):
            out[b, h], lse[b, h] = attention_reference(q[b, h], k[b, h], v[b, h], causal)
    return out, lse, ring_bytes_sent(N, P, B, H, d, 8), np.ones(P)


def _replay_mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, lambda q, k, v, c, P: _replay(q, k, v, c, P, **bug))


def _wrong_merge(rule):
    def merge(o1, lse1, o2, lse2):
        return rule(o1, lse1, o2, lse2), np.logaddexp(lse1, lse2)

    return merge


RANK_MISTAKES = [
    _replay_mistake(
        "merge-without-lse",
        "partial outputs merged without their lse weights",
        "Each step's (out, lse) is an average over one block's keys; a block holding more of the "
        "softmax mass must count more. Merge with your merge_partials: weights e^(lse_i - lse).",
        merge=_wrong_merge(rule),
    )
    for rule in (
        lambda o1, l1, o2, l2: (o1 + o2) / 2,
        lambda o1, l1, o2, l2: o1 + o2,
        lambda o1, l1, o2, l2: np.where(np.isneginf(l1)[..., None], o2, (o1 + o2) / 2),
    )
] + [
    _replay_mistake(
        "ring-direction",
        "the block in the buffer is not the one the plan names",
        "You send to rank + 1 and receive from rank - 1, so after s steps you hold the block of "
        "rank (r - s) mod P. Post the receive from recv_from and the send to send_to that "
        "ring_plan gives, and use the plan's src for that block.",
        held=lambda r, s, P: (r + s) % P,
    ),
    _replay_mistake(
        "ring-off-by-one",
        "the buffers swapped one step early or late",
        "At step s compute on the block you HOLD (received during step s - 1), and only after "
        "the wait make the received buffers the current ones.",
        held=lambda r, s, P: (r - s - 1) % P,
    ),
    _replay_mistake(
        "causal-skip-later-block",
        "a block from a later rank skipped whole",
        "With the zig-zag layout rank r's back chunk comes after every chunk of a later rank: "
        "compute pairs [[0, 0], [1, 1]] for src > r.",
        plan=_plan_with(_src_right, _pairs_skip_upper),
    ),
    *[
        _replay_mistake(
            "diagonal-unmasked",
            "the diagonal block computed without the causal mask",
            "The pairs marked 2 need local_attn(..., causal=True): a query must not see the keys "
            "after it in its own chunk.",
            plan=_plan_with(_src_right, _pairs_diag_unmasked(full)),
        )
        for full in (False, True)  # causal=False passed for the 2s; or every pair computed
    ],
    _replay_mistake(
        "not-overlapped",
        "the next transfer waited for before the local attention",
        "Post the isend / irecv of the next block, then compute on the current one, then wait: "
        "the transfer travels while the rank computes. Waiting first (or posting after the "
        "compute) leaves every transfer exposed.",
        overlapped=0.0,
    ),
    _replay_mistake(
        "extra-send",
        "K/V sent at the last step too",
        "After P - 1 steps every rank has seen every block: the last step receives nothing new, "
        "so a rank sends P - 1 times, 2 (P - 1) B H d e N / P bytes for equal shards.",
        sends=lambda P: P,
    ),
    Mistake(NAN_MISTAKE.slug, NAN_MISTAKE.title, NAN_MISTAKE.explanation, lambda *a: None),
    Mistake(
        LOW_PRECISION_MISTAKE.slug,
        LOW_PRECISION_MISTAKE.title,
        LOW_PRECISION_MISTAKE.explanation,
        lambda *a: None,
    ),
]


def _qkv(seed, B, H, N, d):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(B, H, N, d)) for _ in range(3))


def _rank_cases() -> list[Case]:
    spec = [
        (2, 8, False, "P = 2, N = 8 (two chunks of 2 per rank), no mask"),
        (2, 9, True, "P = 2, N = 9 (ragged: chunks 3, 2, 2, 2), causal"),
        (3, 12, True, "P = 3, N = 12 (6 chunks of 2), causal"),
        (4, 13, True, "P = 4, N = 13 (ragged: 8 chunks of 2 or 1), causal"),
        (3, 5, False, "P = 3, N = 5 (fewer positions than chunks: rank 0 holds an empty back "
         "chunk), no mask"),
    ]  # fmt: skip
    cases = []
    for i, (P, N, causal, label) in enumerate(spec):
        q, k, v = _qkv(100 + i, 1, 2, N, 4)
        cases.append(
            Case(
                label + " (B = 1, H = 2, d = 4)",
                (q, k, v, causal, P),
                focus="the ring loop: post the next transfer, attend to the pairs of ring_plan, "
                "merge, wait, swap the buffers",
            )
        )
    return cases


def learner_ring_runner(rank_fn):
    """The runner with the learner's rank function bound, wherever that function lives."""
    if hasattr(rank_fn, "bound_into"):  # a grader's handle: the ranks start in the kernel
        return rank_fn.bound_into("course_utils.harness.ring_comm:run_learner_ring")
    from course_utils.harness.ring_comm import run_learner_ring

    return functools.partial(run_learner_ring, rank_fn)


def check_ring_attention_rank(fn) -> None:
    """Check ring_attention_rank on P = 2, 3 and 4 gloo processes against full attention.

    Compares out and lse (sequence order) with float64 attention on the concatenated sequence,
    the bytes each rank sent with ring_bytes_sent, and the overlap with 1.0 (every receive had a
    local attention call between its post and its wait). Ragged and causal cases included.
    """
    try:
        run_cases(
            "ring_attention_rank",
            learner_ring_runner(fn),
            _ring_reference,
            _rank_cases(),
            outputs=("out", "lse", "bytes_sent", "overlapped"),
            mistakes=RANK_MISTAKES,
            rtol=1e-9,
            atol=1e-9,
            allow=("run_learner_ring",),
            summary="P = 2, 3 and 4 gloo processes, ragged shards, causal zig-zag, bytes sent = "
            "2 B H d e (sum of P - 1 blocks), every transfer overlapped, data only through comm",
        )
    except CheckFailure as failure:
        raise CheckFailure(_ring_verdict("ring_attention_rank", str(failure))) from None


_RAISED = "raised RingMistake: "


def _ring_verdict(name: str, text: str) -> str:
    """A rank guard's verdict (harness.ring_guard) said as a named failure, not as a raise.

    The runner ends a rank that breaks a rule of the ring with RingMistake, whose message names
    the mistake; run_cases reports it as `raised RingMistake: ... on <case>`.
    """
    if _RAISED not in text:
        return text
    body = text.split(_RAISED, 1)[1].rpartition(".\n  input:")[0]
    label = ""
    for case in _rank_cases():
        if body.endswith(" on " + case.label):
            body, label = body[: -len(" on " + case.label)], case.label
            break
    first, _, rest = body.partition("\n")
    where = f" (on {label})" if label else ""
    return f"✗ {name}: {first.rstrip('.')}{where}.\n{rest}"


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def check_quick_ring_bytes(answer) -> None:
    """Bytes one rank sends: P = 8, N = 32768, 16 heads, d = 128, bf16, B = 1 (equal shards)."""
    P, N, H, d, e = 8, 32768, 16, 128, 2
    right = 2 * (P - 1) * H * d * e * N / P
    hinted_answer(
        "bytes sent per rank (P = 8, N = 32768, H = 16, d = 128, bf16)",
        answer,
        right,
        [
            (2 * P * H * d * e * N / P, "that sends P times; the last step sends nothing "
             "[misconception: extra-send]"),
            ((P - 1) * H * d * e * N / P, "K and V both travel: times 2"),
            (2 * (P - 1) * H * d * e * N, "a rank sends its shards of N / P tokens, not N"),
            (2 * (P - 1) * H * d * 4 * N / P, "bf16 is 2 bytes per element, not 4"),
        ],
        "(P - 1) sends of one block: K and V, N / P tokens, H heads, d values of 2 bytes",
    )  # fmt: skip


def check_quick_hide_length(answer) -> None:
    """Smallest shard length n (non-causal) whose block attention hides the block's transfer:
    4 n^2 H d / F >= 2 n H d e / W, F = 797e12 FLOP/s, W = 450e9 B/s, e = 2."""
    F, W, e = 797e12, 450e9, 2
    right = e * F / (2 * W)
    hinted_answer(
        "shard length that hides the transfer (H200, NVLink 450 GB/s one way, bf16)",
        answer,
        right,
        [
            (e * F / (4 * W), "the transfer is K AND V: 2 n H d e bytes"),
            (
                e * F / W,
                "that is the bound for half the FLOPs: the causal zig-zag step's (it "
                "computes half the pairs), or one matmul's. Without a mask a block's attention is "
                "both matmuls, 4 n^2 H d FLOPs: n >= e F / (2 W)",
            ),
            (
                2 * e * F / W,
                "a matmul of (n, d) by (d, n) is 2 n^2 d FLOPs per head, and "
                "attention has two: 4 n^2 H d, not n^2 H d",
            ),
            (F / (2 * W), "bf16 is e = 2 bytes per element"),
        ],
        "set compute 4 n^2 H d / F equal to transfer 2 n H d e / W and solve for n",
        rtol=2e-2,
    )
