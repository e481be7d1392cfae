"""The checks of notebook 05: right answers pass quietly, every named mistake is recognized.

The "learner" functions here are written in this file (per-chunk NumPy, a merge, the grid
counts), so the checks' run-time guard against calling course_utils does not fire. A decode finds
`split_kv_partials` among its globals, as in the notebook: `with_globals` re-makes a decode with
another learner's partials under that name.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import time
import types

import numpy as np
import pytest
from checkhelp import as_learner, run_quietly, slug_of

import course_utils as cu
from course_utils.checks import split_kv as checks
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.split_kv import exercises as checks_exercises
from course_utils.references.sm_fill import sm_fill_state

NEG_INF = -np.inf


def with_globals(fn, **names):
    """fn with its module's globals plus `names` (a notebook where those names are defined)."""
    namespace = {**fn.__globals__, **names}
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


def failure_of(check, fn) -> CheckFailure:
    with pytest.raises(CheckFailure) as info:
        check(fn)
    return info.value


# ---------------------------------------------------------------------------------------------
# Learners' answers, written here: split_kv_partials in several styles
# ---------------------------------------------------------------------------------------------


def partials_loop(q, K, V, num_splits):
    """The notebook's style: convert, slice each chunk, skip the empty ones."""
    q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
    d, nk, dv = q.shape[0], K.shape[0], V.shape[1]
    c = -(-nk // num_splits)
    out_partial, lse_partial = np.zeros((num_splits, dv)), np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        k_s, v_s = K[s * c : (s + 1) * c], V[s * c : (s + 1) * c]
        if len(k_s) == 0:
            continue
        x = (k_s @ q) / np.sqrt(d)
        m = x.max()
        p = np.exp(x - m)
        out_partial[s], lse_partial[s] = p @ v_s / p.sum(), m + np.log(p.sum())
    return out_partial, lse_partial


def partials_logaddexp(q, K, V, num_splits):
    """Chunk starts from range(), lse with np.logaddexp.reduce, weights e^(x - lse)."""
    nk = len(K)
    c = -(-nk // num_splits)
    outs, lses = [], []
    for start in range(0, num_splits * c, c):
        k_s = K[start : start + c]
        if k_s.shape[0]:
            x = np.einsum("jd,d->j", k_s, q) / math.sqrt(len(q))
            lse = np.logaddexp.reduce(x)
            outs.append(np.exp(x - lse) @ V[start : start + c])
            lses.append(lse)
        else:
            outs.append(np.zeros(V.shape[1]))
            lses.append(-math.inf)
    return np.stack(outs), np.array(lses)


def partials_index_arrays(q, K, V, num_splits):
    """Pre-converted with astype, chunks picked with index arrays (fancy indexing)."""
    K, V = K.astype(np.float64), V.astype(np.float64)
    nk = K.shape[0]
    c = -(-nk // num_splits)
    rows = np.arange(nk)
    out_partial = np.zeros((num_splits, V.shape[1]))
    lse_partial = np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        idx = rows[s * c : (s + 1) * c]
        if idx.size == 0:
            break  # every later chunk is empty too
        x = K[idx] @ q * (1.0 / np.sqrt(q.size))
        m = np.max(x)
        w = np.exp(x - m)
        lse_partial[s] = m + np.log(np.sum(w))
        out_partial[s] = (w / np.sum(w)) @ V[idx]
    return out_partial, lse_partial


def partials_np_split(q, K, V, num_splits):
    """np.split at the multiples of c, then empty chunks appended for the rest."""
    nk, dv = len(K), V.shape[1]
    c = -(-nk // num_splits)
    k_chunks = np.split(K, range(c, nk, c))
    v_chunks = np.split(V, range(c, nk, c))
    out_partial = np.zeros((num_splits, dv))
    lse_partial = np.full(num_splits, NEG_INF)
    for s, (k_s, v_s) in enumerate(zip(k_chunks, v_chunks, strict=True)):
        x = k_s @ q / np.sqrt(len(q))
        m = x.max()
        p = np.exp(x - m)
        l = p.sum()
        out_partial[s] = p @ v_s / l
        lse_partial[s] = m + np.log(l)
    return out_partial, lse_partial


def partials_loops(q, K, V, num_splits):
    """Python loops: per chunk a slice of K and V; a loop over its keys for the scores, another
    for the max, a loop per key for the weights, the sum and the average."""
    nk, dv = len(K), V.shape[1]
    c = -(-nk // num_splits)
    scale = 1 / math.sqrt(len(q))
    out_partial, lse_partial = np.zeros((num_splits, dv)), np.full(num_splits, -math.inf)
    for s in range(num_splits):
        k_s, v_s = K[s * c : (s + 1) * c], V[s * c : (s + 1) * c]
        if len(k_s) == 0:
            continue
        x = [float(k @ q) * scale for k in k_s]
        m = -math.inf
        for x_j in x:
            m = max(m, x_j)
        l, acc = 0.0, np.zeros(dv)
        for j in range(len(k_s)):
            w = math.exp(x[j] - m)
            l += w
            acc = acc + w * v_s[j]
        out_partial[s], lse_partial[s] = acc / l, m + math.log(l)
    return out_partial, lse_partial


split_kv_partials = partials_loop  # the decodes below find it as the notebook's would


# ---------------------------------------------------------------------------------------------
# ... split_kv_decode in several styles (all made of split_kv_partials)
# ---------------------------------------------------------------------------------------------


def merge_partials(o1, lse1, o2, lse2):
    """A learner's own merge of notebook 02, pasted into the notebook."""
    lse = np.logaddexp(lse1, lse2)
    safe = 0.0 if lse == NEG_INF else lse
    return np.exp(lse1 - safe) * o1 + np.exp(lse2 - safe) * o2, lse


def decode_own_merge(q, K, V, num_splits):
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits)
    o, lse = out_partial[0], lse_partial[0]
    for s in range(1, num_splits):
        o, lse = merge_partials(o, lse, out_partial[s], lse_partial[s])
    return o, lse


def decode_course_merge(q, K, V, num_splits):
    """As the notebook's solution: the learner's partials merged with cu.merge_partials."""
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits)
    o, lse = out_partial[0], lse_partial[0]
    for s in range(1, num_splits):
        o, lse = cu.merge_partials(o, lse, out_partial[s], lse_partial[s])
    return o, float(lse)


def decode_one_shot(q, K, V, num_splits):
    """The merge kernel of section 3 in one shot: the max of the lse, k weights, one sum."""
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits=num_splits)
    lse = np.logaddexp.reduce(lse_partial)
    if np.isneginf(lse):
        return np.zeros(out_partial.shape[1]), lse
    return np.exp(lse_partial - lse) @ out_partial, lse


def decode_tree(q, K, V, num_splits):
    """The partials merged in a tree (pairs, then pairs of pairs), with functools.reduce."""
    parts = list(zip(*split_kv_partials(q, K, V, num_splits), strict=True))
    while len(parts) > 1:
        parts = [
            functools.reduce(lambda a, b: merge_partials(*a, *b), parts[i : i + 2])
            for i in range(0, len(parts), 2)
        ]
    return parts[0]


def good_grid(batch, heads, num_splits, num_sms=132):
    blocks = batch * heads * num_splits
    return blocks, min(blocks, num_sms), -(-blocks // num_sms)


def grid_math_ceil(batch, heads, num_splits, num_sms=132):
    blocks = math.prod((batch, heads, num_splits))
    busy = blocks if blocks < num_sms else num_sms
    return blocks, busy, math.ceil(blocks / num_sms)


def grid_numpy(batch, heads, num_splits, num_sms=132):
    blocks = np.int64(batch) * heads * num_splits
    return blocks, np.minimum(blocks, num_sms), int(np.ceil(blocks / num_sms))


def not_done(*args, **kwargs):
    raise NotImplementedError()


PARTIALS_STYLES = [
    partials_loop,
    partials_logaddexp,
    partials_index_arrays,
    partials_np_split,
    partials_loops,
]
DECODE_STYLES = [decode_own_merge, decode_course_merge, decode_one_shot, decode_tree]
GRID_STYLES = [good_grid, grid_math_ceil, grid_numpy]

CHECKS = {
    "split_kv_partials": (checks.check_split_kv_partials, partials_loop),
    "split_kv_decode": (checks.check_split_kv_decode, decode_own_merge),
    "decode_grid": (checks.check_decode_grid, good_grid),
}


# ---------------------------------------------------------------------------------------------
# The right answers pass, with one line, quietly, in every style
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKS)
def test_right_answer_passes_with_one_line(name):
    check, good = CHECKS[name]
    printed = run_quietly(check, good)
    assert printed.startswith(f"✓ {name}:") and printed.count("\n") == 1


@pytest.mark.parametrize("name", CHECKS)
def test_hidden_mode_fresh_inputs_pass(name):
    check, good = CHECKS[name]
    assert "✓" in run_quietly(check, good, seed=None, trials=60)


@pytest.mark.parametrize("fn", PARTIALS_STYLES, ids=lambda f: f.__name__)
def test_partials_styles_pass(fn):
    assert "rule holds" in run_quietly(checks.check_split_kv_partials, fn, seed=None, trials=40)


@pytest.mark.parametrize("fn", DECODE_STYLES, ids=lambda f: f.__name__)
def test_decode_styles_pass(fn):
    assert "rules hold" in run_quietly(checks.check_split_kv_decode, fn, seed=None, trials=40)


@pytest.mark.parametrize("partials", PARTIALS_STYLES[1:], ids=lambda f: f.__name__)
def test_decode_passes_with_every_style_of_partials(partials):
    decode = with_globals(decode_one_shot, split_kv_partials=partials)
    assert "✓" in run_quietly(checks.check_split_kv_decode, decode)


@pytest.mark.parametrize("fn", GRID_STYLES, ids=lambda f: f.__name__)
def test_grid_styles_pass(fn):
    assert "✓" in run_quietly(checks.check_decode_grid, fn, seed=None, trials=60)


def test_checks_are_fast():
    """The visible check cells take well under a second (measured ~0.05 s each on 2 cores)."""
    for check, good in CHECKS.values():
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            check(good)
        assert time.perf_counter() - start < 1.0, check.__name__


@pytest.mark.parametrize("name", CHECKS)
def test_not_implemented_propagates(name):
    check, _ = CHECKS[name]
    with pytest.raises(NotImplementedError):
        check(not_done)


# ---------------------------------------------------------------------------------------------
# The rules: chunk by chunk, and the decode made of the learner's own partials
# ---------------------------------------------------------------------------------------------


def partials_whole_scores(q, K, V, num_splits):
    """Right values, but the scores of the whole cache are computed at once."""
    x = (K @ q) / np.sqrt(len(q))  # every key in one read
    c = -(-len(K) // num_splits)
    out_partial, lse_partial = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        x_s, v_s = x[s * c : (s + 1) * c], V[s * c : (s + 1) * c]
        if len(x_s):
            m = x_s.max()
            p = np.exp(x_s - m)
            out_partial[s], lse_partial[s] = p @ v_s / p.sum(), m + np.log(p.sum())
    return out_partial, lse_partial


def partials_whole_values(q, K, V, num_splits):
    """Per-chunk scores, but each chunk's output from all the values with zero weights."""
    nk = len(K)
    c = -(-nk // num_splits)
    out_partial, lse_partial = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        k_s = K[s * c : (s + 1) * c]
        if len(k_s) == 0:
            continue
        x = k_s @ q / np.sqrt(len(q))
        p = np.zeros(nk)
        p[s * c : s * c + len(k_s)] = np.exp(x - x.max())
        out_partial[s] = p @ V / p.sum()  # V read whole, once per chunk
        lse_partial[s] = x.max() + np.log(p.sum())
    return out_partial, lse_partial


def decode_plain_softmax(q, K, V, num_splits):
    """A softmax over all the keys, without any chunk."""
    x = K @ q / np.sqrt(len(q))
    m = x.max()
    p = np.exp(x - m)
    return p @ V / p.sum(), m + np.log(p.sum())


def decode_one_chunk(q, K, V, num_splits):
    """Its own partials, but one chunk of everything."""
    out_partial, lse_partial = split_kv_partials(q, K, V, 1)
    return out_partial[0], lse_partial[0]


def decode_calls_then_ignores(q, K, V, num_splits):
    """Calls split_kv_partials for show, then answers with a softmax over all the keys."""
    split_kv_partials(q, K, V, num_splits)
    return decode_plain_softmax(q, K, V, num_splits)


def decode_inline_chunks(q, K, V, num_splits):
    """Chunk by chunk, but with its own loop instead of split_kv_partials."""
    c = -(-len(K) // num_splits)
    o, lse = np.zeros(V.shape[1]), NEG_INF
    for s in range(num_splits):
        k_s, v_s = K[s * c : (s + 1) * c], V[s * c : (s + 1) * c]
        if len(k_s):
            x = k_s @ q / np.sqrt(len(q))
            lse_s = np.logaddexp.reduce(x)
            o, lse = merge_partials(o, lse, np.exp(x - lse_s) @ v_s, lse_s)
    return o, lse


@pytest.mark.parametrize(
    "fn, slug",
    [(partials_whole_scores, "reads-whole-cache"), (partials_whole_values, "reads-whole-cache")],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_partials_read_chunk_by_chunk(fn, slug):
    failure = failure_of(checks.check_split_kv_partials, fn)
    assert slug_of(failure) == slug, str(failure)
    assert "gives the right values but breaks a rule" in str(failure)
    assert "spans 50 of its 50 rows" in str(failure) and "13 rows" in str(failure)


@pytest.mark.parametrize(
    "fn, slug, measured",
    [
        (decode_plain_softmax, "decode-not-split", "never calls split_kv_partials"),
        (decode_inline_chunks, "decode-not-split", "never calls split_kv_partials"),
        (decode_one_chunk, "decode-not-split", "num_splits = 1, not the num_splits = 4"),
        (decode_calls_then_ignores, "reads-whole-cache", "spans 50 of its 50 rows"),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_decode_is_made_of_its_own_partials(fn, slug, measured):
    failure = failure_of(checks.check_split_kv_decode, fn)
    assert slug_of(failure) == slug, str(failure)
    assert measured in str(failure)


def test_decode_whose_partials_read_the_whole_cache_is_refused():
    decode = with_globals(decode_own_merge, split_kv_partials=partials_whole_scores)
    assert slug_of(failure_of(checks.check_split_kv_decode, decode)) == "reads-whole-cache"


def test_the_rules_see_the_notebooks_solution_as_following_them():
    """The traced loads of the solution's style: each chunk of K and V read once, in 4 reads."""
    case = checks_exercises._rule_case()
    rule = checks_exercises._chunk_reads_rule(case, "")
    from course_utils.checks.engine.watch import instrumented_call

    report = instrumented_call(
        decode_own_merge, case.args, name="t", trace=(1, 2), spy=("split_kv_partials",)
    )
    assert len(report.calls["split_kv_partials"]) == 1
    for name in ("K", "V"):
        log = report.loads[name]
        assert log.widest(0) == 13 and len(log.loads) == 4 and (log.counts == 1).all()
    assert rule.judge(report, case) is None


# ---------------------------------------------------------------------------------------------
# Inputs are read-only, the course's code may not be borrowed
# ---------------------------------------------------------------------------------------------


def partials_scaling_q_in_place(q, K, V, num_splits):
    q *= 1 / np.sqrt(len(q))  # the bug: changes the caller's query
    return partials_loop(q * np.sqrt(len(q)), K, V, num_splits)


def test_an_input_changed_in_place_is_named():
    failure = failure_of(checks.check_split_kv_partials, partials_scaling_q_in_place)
    # (on the first case d = 1 and the scaling changes no value, so the core cannot tell which
    # argument it was: see the CORE-REQUEST in the report)
    assert slug_of(failure) == "mutates-input", str(failure)


def decode_calling_reference(q, K, V, num_splits):
    out_partial, lse_partial = cu.split_kv_partials(q, K, V, num_splits)
    return decode_own_merge(q, K, V, num_splits)


def decode_borrowing_a_checks_helper(q, K, V, num_splits):
    return checks_exercises._merge_all(*split_kv_partials(q, K, V, num_splits))


def grid_from_the_figure(batch, heads, num_splits, num_sms=132):
    st = sm_fill_state(batch, heads, num_splits, num_sms=num_sms)
    return st.blocks, st.busy_sms, st.waves


@pytest.mark.parametrize(
    "check, fn",
    [
        (checks.check_split_kv_decode, decode_calling_reference),
        (checks.check_split_kv_decode, decode_borrowing_a_checks_helper),
        (checks.check_split_kv_decode, cu.split_kv_decode),
        (checks.check_split_kv_partials, cu.split_kv_partials),
        (checks.check_decode_grid, grid_from_the_figure),
    ],
    ids=["cu.split_kv_partials", "checks_exercises._merge_all", "cu.split_kv_decode",
         "cu.split_kv_partials itself", "sm_fill_state"],
)  # fmt: skip
def test_borrowing_the_courses_code_is_flagged(check, fn):
    assert slug_of(failure_of(check, fn)) == "calls-reference"


def test_grid_from_sm_fill_state_names_it():
    assert "sm_fill_state" in str(failure_of(checks.check_decode_grid, grid_from_the_figure))


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------


def test_cases_cover_the_edges():
    cases = checks_exercises._split_cases(0, 30)
    q, K, V, k = cases[0].args
    out, lse = cu.split_kv_partials(q, K, V, k)
    assert out[:, 0] == pytest.approx([4 / 3, 10 / 3]) and np.exp(lse) == pytest.approx([3, 12])
    nks = [(c.args[1].shape[0], c.args[3]) for c in cases]
    assert any(k > nk for nk, k in nks)  # more chunks than keys
    assert any(k == 1 for _, k in nks)
    assert any(nk == 1 for nk, _ in nks)  # one key
    assert any(nk % k and k <= nk for nk, k in nks)  # ragged last chunk
    # an empty chunk with k <= Nk (Nk = 4, k = 3: chunks of 2, 2, 0)
    assert any(k <= nk and (k - 1) * -(-nk // k) >= nk for nk, k in nks)
    assert any(c.args[0].shape[0] > 1 for c in cases)  # d > 1: the scale matters
    # scores of several hundred, both signs, and chunks whose lse are about 1000 apart
    scores = [c.args[1] @ c.args[0] / np.sqrt(len(c.args[0])) for c in cases]
    assert any(s.max() >= 800 for s in scores) and any(s.max() <= -798 for s in scores)
    gaps = []
    for c in cases:
        lse_s = cu.split_kv_partials(*c.args)[1]
        finite = lse_s[np.isfinite(lse_s)]
        gaps.append(finite.max() - finite.min())
    assert max(gaps) >= 999
    assert all(c.focus for c in cases)
    labels = " ".join(c.label for c in cases + checks_exercises._grid_cases(0, 3))
    assert "lesson" not in labels and "check yourself" not in labels
    grid = checks_exercises._grid_cases(0, 5)
    assert [c.args for c in grid[:3]] == [(1, 32, 1), (4, 16, 1), (4, 16, 8)]


def test_decode_check_compares_with_full_attention():
    rng = np.random.default_rng(3)
    q, K, V = rng.normal(size=4), rng.normal(size=(9, 4)), rng.normal(size=(9, 2))
    o, lse = checks_exercises._decode_reference(q, K, V, 3)
    full_o, full_lse = cu.attention_reference(q[None], K, V)
    assert np.array_equal(o, full_o[0]) and lse == full_lse[0]


def test_the_rule_case_makes_a_whole_read_many_chunks_wide():
    case = checks_exercises._rule_case()
    nk, k = len(case.args[1]), case.args[3]
    assert nk / -(-nk // k) > 3.5  # a read of all the keys is ~4 chunks


# ---------------------------------------------------------------------------------------------
# Every named mistake is recognized
# ---------------------------------------------------------------------------------------------


def _ids(m):
    return m.slug  # pytest numbers repeated slugs; ids must be the same in every worker


@pytest.mark.parametrize("mistake", checks_exercises.PARTIALS_MISTAKES, ids=_ids)
def test_partials_mistakes_are_named(mistake):
    failure = failure_of(checks.check_split_kv_partials, as_learner(mistake.fn.raw))
    assert slug_of(failure) == mistake.slug, str(failure)


@pytest.mark.parametrize("mistake", checks_exercises.DECODE_MISTAKES, ids=_ids)
def test_decode_mistakes_are_named(mistake):
    failure = failure_of(checks.check_split_kv_decode, as_learner(mistake.fn.raw))
    assert slug_of(failure) == mistake.slug, str(failure)


@pytest.mark.parametrize("mistake", checks_exercises.GRID_MISTAKES, ids=_ids)
def test_grid_mistakes_are_named(mistake):
    failure = failure_of(checks.check_decode_grid, as_learner(mistake.fn.raw))
    assert slug_of(failure) == mistake.slug, str(failure)


def test_the_briefs_mistakes_are_all_there():
    partial_slugs = {m.slug for m in checks_exercises.PARTIALS_MISTAKES}
    decode_slugs = {m.slug for m in checks_exercises.DECODE_MISTAKES}
    assert {
        "dropped-tail",
        "nan-masked",
        "missing-softmax-scale",
        "base2-lse",
        "no-max-subtraction",
    } <= partial_slugs
    assert {
        "plain-average",
        "normalize-then-add",
        "nan-masked",
        "empty-chunk-weight",
        "dropped-tail",
        "missing-softmax-scale",
        "base2-lse",
        "weights-overflow",
        "no-max-subtraction",
    } <= decode_slugs


# ---- student-like code for the numeric mistakes of scores of several hundred ---------------


def partials_unsafe(q, K, V, num_splits):
    """No max subtracted: e^800 = inf, e^-800 = 0."""
    c = -(-len(K) // num_splits)
    out, lse = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
    for s in range(num_splits):
        k_s, v_s = K[s * c : (s + 1) * c], V[s * c : (s + 1) * c]
        if len(k_s):
            p = np.exp(k_s @ q / np.sqrt(len(q)))
            out[s], lse[s] = p @ v_s / p.sum(), np.log(p.sum())
    return out, lse


def decode_exp_weights(q, K, V, num_splits):
    """Weights taken as e^lse_s / sum e^lse_s."""
    out_partial, lse_partial = split_kv_partials(q, K, V, num_splits)
    w = np.exp(lse_partial) / np.exp(lse_partial).sum()
    return w @ out_partial, np.log(np.exp(lse_partial).sum())


def ratio_merge_partials(o1, lse1, o2, lse2):
    """A merge written with the ratio r = e^(lse2 - lse1)."""
    if lse2 == NEG_INF:
        return o1, lse1
    if lse1 == NEG_INF:
        return o2, lse2
    r = np.exp(lse2 - lse1)
    return (o1 + r * o2) / (1 + r), lse1 + np.log(1 + r)


def test_unsafe_chunk_softmax_is_named():
    failure = failure_of(checks.check_split_kv_partials, partials_unsafe)
    assert slug_of(failure) == "no-max-subtraction", str(failure)
    assert "-800" in str(failure)


def test_exp_weights_overflow_is_named_and_told_apart_from_an_unsafe_softmax():
    failure = failure_of(checks.check_split_kv_decode, decode_exp_weights)
    assert slug_of(failure) == "weights-overflow", str(failure)
    assert "e^800 = inf" in str(failure)  # the first case where e^lse overflows
    unsafe = with_globals(decode_one_shot, split_kv_partials=partials_unsafe)
    assert slug_of(failure_of(checks.check_split_kv_decode, unsafe)) == "no-max-subtraction"


def test_ratio_merge_overflow_is_named():
    decode = with_globals(decode_own_merge, merge_partials=ratio_merge_partials)
    failure = failure_of(checks.check_split_kv_decode, decode)
    assert slug_of(failure) == "weights-overflow", str(failure)
    assert "999 apart" in str(failure)


def test_nan_from_an_empty_chunk_is_named_in_a_learners_own_code():
    def unguarded(q, K, V, num_splits):
        chunk = -(-len(K) // num_splits)
        out, lse = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
        for s in range(num_splits):
            k_s, v_s = K[s * chunk : (s + 1) * chunk], V[s * chunk : (s + 1) * chunk]
            scores = (k_s @ q) / np.sqrt(len(q))
            m = scores.max(initial=NEG_INF)
            p = np.exp(scores - m)
            out[s], lse[s] = p @ v_s / p.sum(), m + np.log(p.sum())
        return out, lse

    failure = failure_of(checks.check_split_kv_partials, unguarded)
    assert slug_of(failure) == "nan-masked"
    assert "k = 3" in str(failure)  # the first failing case is the smallest with an empty chunk


def test_array_split_chunks_are_named():
    def balanced(q, K, V, num_splits):
        out, lse = np.zeros((num_splits, V.shape[1])), np.full(num_splits, NEG_INF)
        for s, idx in enumerate(np.array_split(np.arange(len(K)), num_splits)):
            if len(idx):
                scores = (K[idx] @ q) / np.sqrt(len(q))
                m = scores.max()
                p = np.exp(scores - m)
                out[s], lse[s] = p @ V[idx] / p.sum(), m + np.log(p.sum())
        return out, lse

    assert slug_of(failure_of(checks.check_split_kv_partials, balanced)) == "chunk-size"
    # any partition of the keys in chunks of at most ceil(Nk / k) merges to full attention
    decode = with_globals(decode_own_merge, split_kv_partials=balanced)
    assert "✓" in run_quietly(checks.check_split_kv_decode, decode)


def test_no_known_mistake_points_at_the_case_focus():
    def off_by_a_bit(q, K, V, num_splits):
        o, lse = decode_own_merge(q, K, V, num_splits)
        return o * 1.01, lse

    message = str(failure_of(checks.check_split_kv_decode, off_by_a_bit))
    assert slug_of(message) is None
    assert "No known mistake matches; this case exercises one chunk's partial" in message


def test_a_learner_that_raises_gets_its_input():
    def broken(q, K, V, num_splits):
        return partials_loop(q, K, V, num_splits) if num_splits < 3 else K[99]

    with pytest.raises(CheckFailure, match="raised IndexError"):
        checks.check_split_kv_partials(broken)


# ---------------------------------------------------------------------------------------------
# Quick checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check, right, wrong, hint_slug",
    [
        (checks.check_quick_blocks_no_split, 64, 512, None),
        (checks.check_quick_blocks_split, 512, 64, "ignores-splits"),
        (checks.check_quick_blocks_split, 4 * 16 * 8, 132, "busy-exceeds-sms"),
        (checks.check_quick_chunk_merge, 5.0, 8 / 3, "plain-average"),
        (checks.check_quick_chunk_merge, 0.25 * 2 + 0.75 * 6, 4.0, "plain-average"),
        (checks.check_quick_chunk_merge, 5.0, 8.0, "normalize-then-add"),
        (checks.check_quick_chunk_merge, 5.0, 10 / 3, "empty-chunk-weight"),
    ],
)
def test_quick_checks(check, right, wrong, hint_slug):
    assert run_quietly(check, right).startswith("✓")
    with pytest.raises(CheckFailure) as info:
        check(wrong)
    assert slug_of(info.value) == hint_slug


def test_quick_checks_refuse_placeholders():
    for check in (checks.check_quick_blocks_no_split, checks.check_quick_chunk_merge):
        with pytest.raises(CheckFailure, match="no answer"):
            check(None)
        with pytest.raises(CheckFailure):
            check("sixty-four")


def test_quick_merge_is_the_lse_merge():
    (o0, l0), (o1, l1), (o2, l2) = checks.QUICK_MERGE_PARTIALS
    o, lse = cu.merge_partials(o0, l0, o1, l1)
    o, lse = cu.merge_partials(o, lse, o2, l2)
    assert float(o) == pytest.approx(5.0) and float(lse) == pytest.approx(math.log(4))


def test_quick_check_right_value_of_the_wrong_type_says_so():
    with pytest.raises(CheckFailure, match="the value is right"):
        checks.check_quick_blocks_no_split(np.array([64]))


def _quick_questions(assignment: str) -> dict[str, str]:
    """For each graded quick check of the notebook, the markdown that asks it (the last markdown
    cell before its answer cell), by the variable the test cell passes."""
    import re
    from pathlib import Path

    import nbformat

    path = Path(__file__).parents[2] / "solutions" / assignment / f"{assignment}.ipynb"
    cells = nbformat.read(path, 4).cells
    asked = {}
    for i, cell in enumerate(cells):
        found = re.search(r"check_quick_\w+\((answer_\w+)\)", cell.source)
        if cell.cell_type != "code" or not found:
            continue
        question = next(c for c in reversed(cells[: i - 1]) if c.cell_type == "markdown")
        asked[found.group(1)] = " ".join(question.source.split())  # one line
    return asked


def test_each_quick_question_names_the_variable_to_set():
    asked = _quick_questions("05_split_kv")
    assert set(asked) == {"answer_blocks_no_split", "answer_blocks_split", "answer_chunk_merge"}
    for variable, question in asked.items():
        assert f"Set `{variable}`" in question or f"set `{variable}`" in question, variable
