"""Checks of notebook 05 (split-KV decoding): split_kv_partials, split_kv_decode, decode_grid.

At decode time one query meets a KV cache of Nk keys. Split-KV (flash-decoding) cuts the cache
into num_splits contiguous chunks of ceil(Nk / num_splits) keys (the last one shorter, trailing
ones empty when there are more chunks than the keys fill), computes a partial (o, lse) per chunk
in its own thread block, and merges the partials with the lse merge:

    lse = log sum_s e^lse_s,    o = sum_s e^(lse_s - lse) o_s.

Each check runs the learner's function on cases ordered from the notebook's worked example to
random inputs, compares with course_utils (split_kv_partials, attention_reference, the SM-fill
model) and, on a mismatch, names the misconception whose buggy implementation reproduces the
output. The cases reach the edges the notebook allows: empty chunks, more chunks than keys, one
key, and scores of several hundred (+-800, chunks whose lse are 1000 apart), where e^lse
overflows and only a merge that stays in the log domain is right.

Two rules hold once every value is right (the notebook states them):

    split_kv_partials   one chunk is one thread block's whole job: K and V are read chunk by
                        chunk (traced inputs: no read spans more than ceil(Nk / k) rows);
    split_kv_decode     the decode is made of the learner's own split_kv_partials, called with
                        the decode's num_splits (a spy), and of the merge: it too reads K and V
                        only chunk by chunk, so a plain softmax over all the keys is refused.
"""

from __future__ import annotations

import math

import numpy as np

from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import Mistake
from course_utils.checks.engine.quizzes import hinted_answer
from course_utils.checks.engine.rules import Rule
from course_utils.checks.split_kv.mistakes import (
    DECODE_MISTAKES,
    PARTIALS_MISTAKES,
    _decode_reference,
    _merge_all,
    _mistakes,
    _partials_reference,
)
from course_utils.harness.hardware import H100_SXM
from course_utils.references.sm_fill import sm_fill_state

NEG_INF = -np.inf
LN = np.log
NUM_SMS = H100_SXM.num_sms  # 132


# ---------------------------------------------------------------------------------------------
# Cases shared by the two split-KV checks
# ---------------------------------------------------------------------------------------------


def _example_qkv():
    """One query whose scores are (ln 2, 0, ln 8, ln 4) (d = 1, tau = 1), values (1, 2, 3, 4)."""
    q = np.array([1.0])
    K = np.log([[2.0], [1.0], [8.0], [4.0]])
    V = np.array([[1.0], [2.0], [3.0], [4.0]])
    return q, K, V


def _scores_qkv(scores):
    """One query (d = 1, tau = 1) whose scores are exactly `scores`, values 1, 2, 3, ..."""
    n = len(scores)
    return (
        np.array([1.0]),
        np.array(scores, dtype=np.float64)[:, None],
        np.arange(1.0, n + 1)[:, None],
    )


def _random_qkv(rng, nk: int, d: int, dv: int, sharpness: float = 1.0):
    q = sharpness * rng.normal(size=d)
    return q, rng.normal(size=(nk, d)), rng.normal(size=(nk, dv))


_EXAMPLE = "the worked example (a) of section 4: scores (ln 2, 0, ln 8, ln 4), values 1..4"
_FOCUS_CHUNKS = "the chunk boundaries: chunk s is keys s * c .. (s + 1) * c - 1, c = ceil(Nk / k)"
_FOCUS_EMPTY = "empty chunks: o_s = 0 and lse_s = -inf for a chunk that holds no key"
_FOCUS_PARTIAL = "one chunk's partial: o_s, its softmax average, and lse_s = m + log(l)"
_FOCUS_SAFE = (
    "a safe softmax per chunk (subtract its max) and a merge in the log domain, for scores of "
    "several hundred where e^x overflows or underflows"
)


def _split_cases(seed, trials: int) -> list[Case]:
    q, K, V = _example_qkv()
    fixed = np.random.default_rng(2023)  # the fixed cases do not depend on seed
    q1, K1, V1 = _random_qkv(fixed, 1, 4, 3)
    q10, K10, V10 = _random_qkv(fixed, 10, 4, 2, sharpness=2.0)
    q37, K37, V37 = _random_qkv(fixed, 37, 8, 5, sharpness=3.0)
    q5, K5, V5 = _random_qkv(fixed, 5, 3, 2, sharpness=2.0)
    cases = [
        Case(f"{_EXAMPLE}, k = 2 chunks of 2", (q, K, V, 2), focus=_FOCUS_PARTIAL),
        Case(f"{_EXAMPLE}, k = 1 (one chunk: the whole cache)", (q, K, V, 1), focus=_FOCUS_PARTIAL),
        Case(
            f"{_EXAMPLE}, k = 3: chunks of ceil(4/3) = 2, 2 and 0 keys (one empty)",
            (q, K, V, 3),
            focus=_FOCUS_EMPTY,
        ),
        Case(
            f"{_EXAMPLE}, k = 6 > 4 keys: four chunks of 1 key, two empty",
            (q, K, V, 6),
            focus=_FOCUS_EMPTY,
        ),
        Case("one key, d = 4, k = 1", (q1, K1, V1, 1), focus=_FOCUS_PARTIAL),
        Case("one key, d = 4, k = 3: one chunk of 1 key, two empty", (q1, K1, V1, 3),
             focus=_FOCUS_EMPTY),
        Case("5 keys, d = 3, k = 2: chunks of 3 and 2 keys (ragged)", (q5, K5, V5, 2),
             focus=_FOCUS_CHUNKS),
        Case("10 keys, d = 4, k = 4: chunks of 3, 3, 3, 1 keys (ragged)", (q10, K10, V10, 4),
             focus=_FOCUS_CHUNKS),
        Case("37 keys, d = 8, k = 5: chunks of 8, 8, 8, 8, 5 keys", (q37, K37, V37, 5),
             focus=_FOCUS_CHUNKS),
        Case("37 keys, d = 8, k = 37: one key per chunk", (q37, K37, V37, 37),
             focus=_FOCUS_CHUNKS),
        # scores of several hundred. The first one is where an unsafe chunk softmax fails
        # (e^-800 = 0, so 0 / 0) while a merge with e^lse weights is still right: the two are
        # told apart (on the later ones both give NaN).
        Case(
            "scores (3, 1, -800, -805), values 1..4, k = 2: in the second chunk every e^x is 0",
            (*_scores_qkv([3.0, 1.0, -800.0, -805.0]), 2),
            focus=_FOCUS_SAFE,
        ),
        Case(
            "scores (800, 795, 803, 790, 806), values 1..5, k = 2 chunks of 3 and 2: e^800 = inf",
            (*_scores_qkv([800.0, 795.0, 803.0, 790.0, 806.0]), 2),
            focus=_FOCUS_SAFE,
        ),
        Case(
            "scores (0, 1, 1000, 999), values 1..4, k = 2: the two chunks' lse are 999 apart",
            (*_scores_qkv([0.0, 1.0, 1000.0, 999.0]), 2),
            focus=_FOCUS_SAFE,
        ),
        Case(
            "scores (-800, -805, -798, -810), values 1..4, k = 3 (chunks of 2, 2, 0): "
            "every e^lse_s is 0",
            (*_scores_qkv([-800.0, -805.0, -798.0, -810.0]), 3),
            focus=_FOCUS_SAFE,
        ),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        nk = int(rng.integers(1, 65))
        k = int(rng.choice([rng.integers(1, 9), rng.integers(1, nk + 1), rng.integers(nk, nk + 6)]))
        d, dv = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        sharpness = float(rng.choice([1.0, 3.0, 10.0, 400.0]))  # flat, sharp, several hundred
        chunk = -(-nk // k)
        label = (
            f"random case {t + 1}: {nk} keys, d = {d}, dv = {dv}, k = {k} "
            f"(chunks of {chunk}, {sum(1 for s in range(k) if s * chunk >= nk)} empty)"
        )
        focus = _FOCUS_SAFE if sharpness > 100 else _FOCUS_CHUNKS
        cases.append(Case(label, (*_random_qkv(rng, nk, d, dv, sharpness), k), focus=focus))
    return cases


# ---------------------------------------------------------------------------------------------
# The rules: chunk by chunk, and the decode made of the learner's own partials
# ---------------------------------------------------------------------------------------------

_WHOLE_CACHE = Mistake(
    "reads-whole-cache",
    "the keys or values read all at once, not chunk by chunk",
    "Each chunk is one thread block's whole job: block s reads only its own keys and values, "
    "K[s * c : (s + 1) * c] and V[s * c : (s + 1) * c], and computes its partial from them. "
    "Computing the scores of the whole cache at once (K @ q, or a softmax over all the keys) is "
    "what split-KV avoids: slice the chunk first, then compute with the slice.",
    fn=lambda *a, **k: None,
)
_NOT_SPLIT = Mistake(
    "decode-not-split",
    "the decode does not compute its partials with your split_kv_partials",
    "split_kv_decode is the two kernels of section 3: first call your own "
    "split_kv_partials(q, K, V, num_splits), with the num_splits the decode is given, then merge "
    "the num_splits partials it returns (merge_partials chunk after chunk, or the weights "
    "e^(lse_s - lse) all at once). A softmax over all the keys, or one chunk of everything, "
    "gives the right numbers without the algorithm.",
    fn=lambda *a, **k: None,
)


def _rule_case() -> Case:
    """50 keys in k = 4 chunks of 13, 13, 13 and 11: a read of the whole cache is 50 rows."""
    rng = np.random.default_rng(5)
    return Case(
        "50 keys, d = 8, dv = 4, k = 4: chunks of 13, 13, 13 and 11 keys",
        (*_random_qkv(rng, 50, 8, 4, sharpness=2.0), 4),
    )


def _chunk_reads_rule(case: Case, what: str) -> Rule:
    """No read of K (argument 1) or V (argument 2) spans more than one chunk of rows."""
    nk, k = len(case.args[1]), case.args[3]
    chunk = -(-nk // k)

    def judge(report, case):
        for arg in (1, 2):
            name = report.traced[arg]
            widest = report.loads[name].widest(0)
            if widest > chunk:
                return _WHOLE_CACHE, (
                    f"one read of `{name}` spans {widest} of its {nk} rows; a chunk is "
                    f"ceil({nk} / {k}) = {chunk} rows"
                )
        return None

    return Rule(case, judge, what, trace=(1, 2))


def _num_splits_of(call) -> object:
    args, kwargs = call
    if len(args) >= 4:
        return args[3]
    return kwargs.get("num_splits")


def _own_partials_rule(case: Case) -> Rule:
    """split_kv_decode calls the learner's split_kv_partials with the case's num_splits."""
    k = case.args[3]

    def judge(report, case):
        calls = report.calls.get("split_kv_partials", [])
        if any(_num_splits_of(c) == k for c in calls):
            return None
        if not calls:
            return _NOT_SPLIT, "your split_kv_decode never calls split_kv_partials"
        used = ", ".join(sorted({str(_num_splits_of(c)) for c in calls}))
        return _NOT_SPLIT, (
            f"your split_kv_decode calls split_kv_partials with num_splits = {used}, not the "
            f"num_splits = {k} it is given"
        )

    return Rule(
        case,
        judge,
        "compute the partials with your split_kv_partials, then merge them",
        spy=("split_kv_partials",),
    )


def check_split_kv_partials(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check split_kv_partials(q, K, V, num_splits) -> (out_partial, lse_partial).

    q (d,), K (Nk, d), V (Nk, dv); out_partial (num_splits, dv), lse_partial (num_splits,),
    compared with course_utils.split_kv_partials. Cases: the worked example of section 4 with
    k = 2, 1, 3, 6 (empty chunks), one key, ragged chunks, one key per chunk, scores of several
    hundred, then `trials` random cases (seed=None: fresh ones). Rule: K and V are read chunk by
    chunk (no read spans more than ceil(Nk / k) rows).
    """
    run_cases(
        "split_kv_partials",
        fn,
        _partials_reference,
        _split_cases(seed, trials),
        outputs=("out_partial", "lse_partial"),
        mistakes=PARTIALS_MISTAKES,
        summary="ragged last chunks, empty chunks, k from 1 to more than Nk, scores of +-800; "
        "K and V read chunk by chunk",
        rules=[_chunk_reads_rule(_rule_case(), "one chunk is one thread block's whole job")],
    )


def check_split_kv_decode(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check split_kv_decode(q, K, V, num_splits) -> (o, lse) against full attention.

    o (dv,) and lse () must equal cu.attention_reference over all the keys, for every number of
    chunks, also for scores of several hundred (chunks whose lse are 1000 apart). Rules: the
    decode calls the learner's own split_kv_partials with its num_splits, and reads K and V only
    chunk by chunk. The learner may call merge_partials (their own, or cu.merge_partials).
    """
    case = _rule_case()
    run_cases(
        "split_kv_decode",
        fn,
        _decode_reference,
        _split_cases(seed, trials),
        outputs=("o", "lse"),
        mistakes=DECODE_MISTAKES,
        summary="k = 1, k > Nk, ragged and empty chunks, scores of +-800, against full "
        "attention; made of your split_kv_partials",
        allow=("merge_partials",),
        rules=[
            _own_partials_rule(case),
            _chunk_reads_rule(case, "the decode reads the KV cache chunk by chunk"),
        ],
    )


# ---------------------------------------------------------------------------------------------
# check_decode_grid
# ---------------------------------------------------------------------------------------------


def _grid_reference(batch, heads, num_splits, num_sms=NUM_SMS):
    st = sm_fill_state(batch, heads, num_splits, num_sms=num_sms)
    return st.blocks, st.busy_sms, st.waves


def _grid_with(blocks_rule="right", busy_rule="right", waves_rule="right"):
    def decode_grid(batch, heads, num_splits, num_sms=NUM_SMS):
        blocks = {
            "right": batch * heads * num_splits,
            "no-splits": batch * heads,
            "no-batch": heads * num_splits,
        }[blocks_rule]
        busy = {"right": min(blocks, num_sms), "blocks": blocks, "all": num_sms}[busy_rule]
        waves = {
            "right": math.ceil(blocks / num_sms),
            "floor": blocks // num_sms,
            "fraction": blocks / num_sms,
        }[waves_rule]
        return blocks, busy, waves

    return decode_grid


GRID_MISTAKES: list[Mistake] = _mistakes(
    [
        (
            (
                "ignores-splits",
                "blocks = batch x heads: the chunks of the KV cache are not counted",
                "With split-KV every (sequence, head, chunk) gets its own thread block: "
                "blocks = batch * heads * num_splits.",
            ),
            [_grid_with(blocks_rule="no-splits")],
        ),
        (
            (
                "ignores-batch",
                "blocks = heads x num_splits: the batch is not counted",
                "Each sequence of the batch has its own KV cache and its own query: "
                "blocks = batch * heads * num_splits.",
            ),
            [_grid_with(blocks_rule="no-batch")],
        ),
        (
            (
                "busy-exceeds-sms",
                "more busy SMs than the GPU has",
                "An SM runs one of these thread blocks at a time (in this model), so at most "
                "num_sms are busy: busy_sms = min(blocks, num_sms). The other blocks wait for a "
                "later wave.",
            ),
            [_grid_with(busy_rule="blocks")],
        ),
        (
            (
                "all-sms-busy",
                "every SM counted as busy, whatever the number of blocks",
                "With fewer blocks than SMs the rest of the SMs have nothing to do: "
                "busy_sms = min(blocks, num_sms).",
            ),
            [_grid_with(busy_rule="all")],
        ),
        (
            (
                "waves-floor",
                "waves rounded down",
                "A partly filled last wave is still a wave: waves = ceil(blocks / num_sms), "
                "-(-blocks // num_sms) in integers. 64 blocks on 132 SMs is 1 wave, not 0.",
            ),
            [_grid_with(waves_rule="floor")],
        ),
        (
            (
                "fractional-waves",
                "waves not rounded up to a whole number",
                "Blocks run in whole waves: waves = ceil(blocks / num_sms), an integer "
                "(512 blocks on 132 SMs: 3.88, so 4 waves).",
            ),
            [_grid_with(waves_rule="fraction")],
        ),
    ],
    _grid_reference,
)


def _grid_cases(seed, trials: int) -> list[Case]:
    blocks = "blocks: one thread block per (sequence, head, chunk)"
    busy = "busy_sms: the SMs with a block in the first wave, at most num_sms"
    waves = "waves: ceil(blocks / num_sms), a partly filled last wave included"
    cases = [
        Case("section 2's decode step: batch 1, 32 heads, no split (k = 1)", (1, 32, 1),
             focus=busy),
        Case("quick check 1: batch 4, 16 heads, no split", (4, 16, 1), focus=blocks),
        Case("quick check 2: batch 4, 16 heads, 8 chunks", (4, 16, 8), focus=waves),
        Case("batch 1, 32 heads, 4 chunks: 128 blocks, 4 SMs idle", (1, 32, 4), focus=busy),
        Case("batch 1, 32 heads, 5 chunks: 160 blocks, a second wave of 28", (1, 32, 5),
             focus=waves),
        Case("batch 1, 12 heads, 11 chunks: exactly 132 blocks", (1, 12, 11), focus=waves),
        Case("batch 64, 32 heads, no split: a large batch", (64, 32, 1), focus=blocks),
        Case("an A100 (108 SMs): batch 2, 16 heads, 4 chunks", (2, 16, 4), {"num_sms": 108},
             focus=busy),
        Case("a GPU with 10 SMs: batch 3, 1 head, 3 chunks", (3, 1, 3), {"num_sms": 10},
             focus=waves),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    for t in range(trials):
        batch = int(rng.choice([1, 2, 4, 8, 16, 64, int(rng.integers(1, 100))]))
        heads = int(rng.choice([1, 8, 16, 32, 40, 64, int(rng.integers(1, 100))]))
        k = int(rng.choice([1, 2, 4, 8, 16, int(rng.integers(1, 65))]))
        sms = int(rng.choice([132, 132, 108, 80, int(rng.integers(1, 200))]))
        cases.append(
            Case(
                f"random case {t + 1}: batch {batch}, {heads} heads, {k} chunks, {sms} SMs",
                (batch, heads, k),
                {"num_sms": sms},
                focus=f"{blocks}; {busy}; {waves}",
            )
        )
    return cases


def check_decode_grid(fn, seed: int | None = 0, trials: int = 20) -> None:
    """Check decode_grid(batch, heads, num_splits, num_sms=132) -> (blocks, busy_sms, waves).

    blocks = batch * heads * num_splits thread blocks, busy_sms = min(blocks, num_sms) SMs busy
    in the first wave, waves = ceil(blocks / num_sms).
    """
    run_cases(
        "decode_grid",
        fn,
        _grid_reference,
        _grid_cases(seed, trials),
        outputs=("blocks", "busy_sms", "waves"),
        mistakes=GRID_MISTAKES,
        summary="the notebook's cases, a full wave, a large batch, other SM counts",
        low_precision_below=None,
    )


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


def check_quick_blocks_no_split(answer) -> None:
    """Quick check 1: thread blocks at decode for batch 4, 16 heads, without split-KV."""
    expected = 4 * 16
    hinted_answer(
        "thread blocks without split",
        answer,
        expected,
        [
            (expected * 8, "that is with 8 chunks; without split-KV there is one chunk per "
             "sequence and head"),
            (NUM_SMS, "that is the number of SMs, not the number of blocks the grid launches"),
            (expected / NUM_SMS, "that is the fraction of SMs that work; the question asks for "
             "blocks"),
        ],
        "one thread block per (sequence, head): the query tiles are a single query each",
        rtol=0.0,
    )  # fmt: skip


def check_quick_blocks_split(answer) -> None:
    """Quick check 2: thread blocks at decode for batch 4, 16 heads, 8 chunks."""
    expected = 4 * 16 * 8
    hinted_answer(
        "thread blocks with 8 chunks",
        answer,
        expected,
        [
            (4 * 16, "that is without split-KV; count the 8 chunks too "
             "[misconception: ignores-splits]"),
            (NUM_SMS, "at most 132 run at the same time, but the grid launches more blocks "
             "[misconception: busy-exceeds-sms]"),
            (math.ceil(expected / NUM_SMS), "that is the number of waves; the question asks for "
             "blocks"),
        ],
        "each (sequence, head, chunk) triple gets its own thread block",
        rtol=0.0,
    )  # fmt: skip


QUICK_MERGE_PARTIALS = ((2.0, LN(1.0)), (6.0, LN(3.0)), (0.0, NEG_INF))
"""The quick check's three chunks (o_s, lse_s): Nk = 4 keys, k = 3 chunks of 2, 2, 0 keys."""


def check_quick_chunk_merge(answer) -> None:
    """Quick check 3: merge (2, ln 1), (6, ln 3) and an empty chunk (0, -inf): the merged o."""
    o_s = np.array([p[0] for p in QUICK_MERGE_PARTIALS])
    lse_s = np.array([p[1] for p in QUICK_MERGE_PARTIALS])
    expected, _ = _merge_all(o_s[:, None], lse_s)
    expected = float(expected[0])  # 1/4 * 2 + 3/4 * 6 = 5
    mass = np.exp(lse_s)
    # the plain average of the two non-empty chunks and an empty chunk of mass e^0 = 1 both give
    # (2 + 6) / 2 = (1 * 2 + 3 * 6) / 5 = 4: one value, one hint that names both
    assert np.isclose(o_s[:2].mean(), (mass[:2] @ o_s[:2]) / (mass[:2].sum() + 1.0))
    hinted_answer(
        "merged o",
        answer,
        expected,
        [
            (o_s.mean(), "that is the plain average of the three chunks "
             "[misconception: plain-average]"),
            (o_s[:2].mean(), "that is the plain average of the two non-empty chunks (and also "
             "what an empty chunk of mass e^0 = 1 gives); weight each chunk by its share of the "
             "mass, the empty one by 0 [misconception: plain-average]"),
            (o_s.sum(), "that adds the chunks' averages [misconception: normalize-then-add]"),
            (expected * (1 - 1 / 3), "the empty chunk got a share 1/3 of the weight; its weight "
             "is e^-inf = 0 [misconception: empty-chunk-weight]"),
            (mass @ o_s, "divide by the total mass e^lse_0 + e^lse_1 + e^lse_2 = 4"),
        ],
        "each chunk's weight is its mass e^lse_s over the total mass; the empty chunk has 0",
    )  # fmt: skip
