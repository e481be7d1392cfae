"""Notebook 05's known mistakes: buggy chunk partials and merges, and the named Mistakes.

The buggy functions are written here: they must not call course_utils' references, or a test
that runs them as a learner's answer would see calls-reference.

    partials(q, K, V, num_splits) -> (out_partial, lse_partial)   q (d,), K (N_k, d), V (N_k, dv);
                                                                  out_partial (S, dv), lse (S,)
    decode(q, K, V, num_splits) -> (o, lse)                       o (dv,), lse ()
    PARTIALS_MISTAKES, DECODE_MISTAKES     the named Mistakes of the two checks
"""

from __future__ import annotations

import numpy as np

from course_utils import attention_reference
from course_utils import split_kv_partials as _reference_partials
from course_utils.checks.engine.failures import NAN_MISTAKE, Mistake

NEG_INF = -np.inf


# ---------------------------------------------------------------------------------------------
# Buggy building blocks (written here: the buggy functions must not call course_utils'
# references, or a test that runs them as a learner's answer would see calls-reference)
# ---------------------------------------------------------------------------------------------


def _chunk_stats(
    q, k_s, v_s, *, scale=True, lse_rule="right", empty="zero", normalize=True, shift=True
):
    """(o, lse) of one query (d,) over one chunk of keys (c, d) and values (c, dv).

    lse_rule: "right" (m + ln l), "log2" (m + log2 l), "max" (m alone).
    empty: how a chunk without keys is returned: "zero" (o = 0, lse = -inf, right),
        "nan" (o = 0/0, the unguarded division), "lse0" (o = 0, lse = 0: mass 1).
    normalize: False returns the unnormalized acc = sum_j e^(s_j - m) v_j instead of acc / l.
    shift: False skips the max subtraction: p = e^s, which overflows for scores above 709.
    """
    dv = v_s.shape[1]
    if len(k_s) == 0:
        if empty == "nan":
            return np.full(dv, np.nan), NEG_INF
        return np.zeros(dv), (0.0 if empty == "lse0" else NEG_INF)
    tau = 1 / np.sqrt(q.shape[0]) if scale else 1.0
    s = tau * (k_s @ q)  # (c,)
    m = s.max() if shift else 0.0
    p = np.exp(s - m)
    l = p.sum()
    acc = p @ v_s  # (dv,)
    lse = {"right": m + np.log(l), "log2": m + np.log2(l), "max": m}[lse_rule]
    return (acc / l if normalize else acc), float(lse)


def _chunk_bounds(nk: int, num_splits: int, rule: str = "ceil") -> list[tuple[int, int]]:
    """[start, stop) of each chunk.

    "ceil": ceil(nk / k) keys each, the last shorter (right). "floor": nk // k keys each, the
    ragged tail dropped. "floor-rest": nk // k keys each, the last chunk takes the rest.
    "balanced": np.array_split's sizes (the first nk % k chunks one key longer).
    """
    if rule == "ceil":
        size = -(-nk // num_splits)
        return [(min(s * size, nk), min((s + 1) * size, nk)) for s in range(num_splits)]
    if rule == "floor":
        size = nk // num_splits
        return [(s * size, (s + 1) * size) for s in range(num_splits)]
    if rule == "floor-rest":
        size = nk // num_splits
        bounds = [(s * size, (s + 1) * size) for s in range(num_splits)]
        bounds[-1] = (bounds[-1][0], nk)
        return bounds
    if rule == "balanced":
        edges = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(nk), num_splits)])
        return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    raise ValueError(rule)


def _buggy_partials(rule="ceil", **stats):
    """A buggy split_kv_partials(q, K, V, num_splits) with the given chunking and chunk stats."""

    def split_kv_partials(q, K, V, num_splits):
        q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
        out = np.zeros((num_splits, V.shape[1]))
        lse = np.full(num_splits, NEG_INF)
        for s, (a, b) in enumerate(_chunk_bounds(len(K), num_splits, rule)):
            out[s], lse[s] = _chunk_stats(q, K[a:b], V[a:b], **stats)
        return out, lse

    return split_kv_partials


def _merge_all(out_partial, lse_partial):
    """The right merge of k partials at once: weights e^(lse_s - lse), guarded for -inf."""
    lse = np.logaddexp.reduce(lse_partial)
    if lse == NEG_INF:
        return np.zeros(out_partial.shape[1]), float(lse)
    w = np.exp(lse_partial - lse)  # (k,), 0 for an empty chunk
    return w @ out_partial, float(lse)


def _merge_all_base2(out_partial, lse_partial):
    """Weights 2^(lse_s - lse) with lse = log2 sum 2^lse_s: the base-2 merge."""
    lse = np.logaddexp2.reduce(lse_partial)
    if lse == NEG_INF:
        return np.zeros(out_partial.shape[1]), float(lse)
    return np.exp2(lse_partial - lse) @ out_partial, float(lse)


def _buggy_decode(partials=None, merge=_merge_all):
    """A buggy split_kv_decode: partials (a split_kv_partials) combined by merge(o_s, lse_s)."""
    partials = partials or _buggy_partials()

    def split_kv_decode(q, K, V, num_splits):
        return merge(*partials(q, K, V, num_splits))

    return split_kv_decode


def _plain_mean(out_partial, lse_partial):
    return out_partial.mean(axis=0), float(np.logaddexp.reduce(lse_partial))


def _plain_mean_nonempty(out_partial, lse_partial):
    keep = np.isfinite(lse_partial)
    return out_partial[keep].mean(axis=0), float(np.logaddexp.reduce(lse_partial))


def _pairwise_average(out_partial, lse_partial):
    """o = (o + o_s) / 2 chunk after chunk, starting from the first chunk."""
    o = out_partial[0]
    for o_s in out_partial[1:]:
        o = (o + o_s) / 2
    return o, float(np.logaddexp.reduce(lse_partial))


def _sum_of_outputs(out_partial, lse_partial):
    return out_partial.sum(axis=0), float(np.logaddexp.reduce(lse_partial))


def _empty_weight_one_over_k(out_partial, lse_partial):
    """Non-empty chunks weighted by their share, each empty chunk by 1/k, then renormalized."""
    k = len(lse_partial)
    lse = np.logaddexp.reduce(lse_partial)
    if lse == NEG_INF:
        return np.zeros(out_partial.shape[1]), float(lse)
    w = np.where(np.isneginf(lse_partial), 1.0 / k, np.exp(lse_partial - lse))
    return (w @ out_partial) / w.sum(), float(lse)


def _lse_max(out_partial, lse_partial):
    o, _ = _merge_all(out_partial, lse_partial)
    return o, float(lse_partial.max())


def _skip_last(out_partial, lse_partial):
    if len(lse_partial) == 1:
        return np.zeros(out_partial.shape[1]), NEG_INF
    return _merge_all(out_partial[:-1], lse_partial[:-1])


def _skip_first(out_partial, lse_partial):
    if len(lse_partial) == 1:
        return np.zeros(out_partial.shape[1]), NEG_INF
    return _merge_all(out_partial[1:], lse_partial[1:])


def _exp_weights(out_partial, lse_partial):
    """Weights e^lse_s / sum e^lse_s, computed as written: inf / inf for an lse above 709."""
    mass = np.exp(lse_partial)
    total = mass.sum()
    return (mass / total) @ out_partial, float(np.log(total))


def _ratio_merge(out_partial, lse_partial):
    """Chunk after chunk with the ratio r = e^(lse_s - lse): o = (o + r o_s) / (1 + r).

    Right on paper; e^(lse_s - lse) is inf when a later chunk's lse is 710 or more above what
    was merged so far, and (o + inf) / inf is NaN.
    """
    o, lse = out_partial[0], lse_partial[0]
    for o_s, lse_s in zip(out_partial[1:], lse_partial[1:], strict=True):
        if lse_s == NEG_INF:
            continue
        if lse == NEG_INF:
            o, lse = o_s, lse_s
            continue
        r = np.exp(lse_s - lse)
        o, lse = (o + r * o_s) / (1 + r), lse + np.log1p(r)
    return o, float(lse)


def _only_if_wrong(fn, reference):
    """fn, refusing (by raising) the inputs where it agrees with the reference.

    A mistake that is right on an input (no ragged tail, no empty chunk, d = 1) must not be
    named there: a learner whose result is merely close to the reference would match it.
    """

    def buggy(*args, **kwargs):
        theirs, expected = fn(*args, **kwargs), reference(*args, **kwargs)
        if not isinstance(theirs, tuple):
            theirs, expected = (theirs,), (expected,)
        if all(
            np.shape(t) == np.shape(e) and np.allclose(t, e, rtol=1e-12, atol=1e-12)
            for t, e in zip(theirs, expected, strict=True)
        ):
            raise ValueError("this mistake gives the right answer on this input")
        return theirs if len(theirs) > 1 else theirs[0]

    buggy.raw = fn  # the buggy implementation itself (the tests run it as a learner's answer)
    return buggy


# ---------------------------------------------------------------------------------------------
# The named mistakes
# ---------------------------------------------------------------------------------------------

_DROPPED_TAIL = (
    "dropped-tail",
    "chunks of floor(Nk / k) keys: the ragged tail of the KV cache is never read",
    "With Nk = 10 keys and k = 4 chunks, floor gives 2 keys per chunk and keys 8 and 9 belong to "
    "no chunk. Use chunk = ceil(Nk / k) = -(-Nk // k) keys: the last chunk is shorter and "
    "K[s * chunk : (s + 1) * chunk] simply stops at the end of the cache.",
)
_NAN = (
    NAN_MISTAKE.slug,
    "NaN from an empty chunk (0 / 0, or exp(-inf - (-inf)))",
    "With more chunks than the keys fill (k > Nk, or Nk = 4, k = 3: chunks of 2, 2 and 0 keys) a "
    "chunk has no keys. Its partial is o = 0 and lse = -inf: weight 0 in the merge. Test "
    "len(k_s) == 0 first; never divide by an l of 0 or compute max() of an empty array.",
)
_EMPTY_WEIGHT = (
    "empty-chunk-weight",
    "an empty chunk counted with a weight that is not 0",
    "A chunk without keys holds none of the softmax mass: its lse is log(0) = -inf, so its "
    "weight e^(lse_s - lse) is 0. Returning lse = 0 (mass 1) for it, or giving it a share 1/k, "
    "shrinks the other chunks' weights.",
)
_SCALE = (
    "missing-softmax-scale",
    "scores not scaled by 1/sqrt(d)",
    "Attention scores are tau q.k with tau = 1/sqrt(d), as in cu.attention_reference. Compute "
    "s = (k_s @ q) / np.sqrt(d) in every chunk.",
)
_BASE2 = (
    "base2-lse",
    "a chunk's lse in base 2 (m + log2 l), or a base-2 merge",
    "lse is a natural log: lse_s = m + np.log(l), and the merge uses np.exp and np.logaddexp. "
    "np.log2 / np.exp2 belong to kernels that keep every score in base 2 (scaled by log2 e); "
    "mixing the bases gives each chunk the wrong share of the mass.",
)
_M_NOT_LSE = (
    "m-not-lse",
    "the chunk's max score used as its lse",
    "A chunk's lse is m + log(l) = log sum_j e^s_j, not its max m: the max forgets how many keys "
    "share the mass. Return lse_s = m + np.log(l).",
)
_UNNORMALIZED = (
    "unnormalized-partial",
    "the chunk's output not divided by its l",
    "out_partial[s] is the softmax average over the chunk: acc / l with acc = sum_j e^(s_j - m) "
    "v_j and l = sum_j e^(s_j - m). The merge needs normalized partials; the weights e^(lse_s - "
    "lse) carry each chunk's mass.",
)
_CHUNK_SIZE = (
    "chunk-size",
    "chunks of another size than ceil(Nk / k) (np.array_split, or the last chunk taking the rest)",
    "Each chunk holds ceil(Nk / k) keys, fewer only where the cache runs out (the last chunks "
    "may be short or empty), as a flash-decoding kernel gives each thread block the same number "
    "of keys: Nk = 10 and k = 4 give chunks of 3, 3, 3, 1 keys (np.array_split: 3, 3, 2, 2). "
    "Chunk s is K[s * chunk : (s + 1) * chunk] with chunk = -(-Nk // k).",
)
_PLAIN = (
    "plain-average",
    "plain average of the chunks' outputs",
    "Each chunk's o is an average over its own keys; a chunk with more softmax mass (a larger "
    "lse) must count more, and an empty chunk not at all. Merge with weights e^(lse_s - lse), "
    "e.g. with merge_partials, one chunk after the other.",
)
_ADD = (
    "normalize-then-add",
    "adding the normalized outputs of the chunks",
    "Each chunk's o is already normalized over its own chunk, so their sum counts the values once "
    "per chunk. Weight each by its share of the mass, e^(lse_s - lse); the weights add up to 1.",
)
_LSE_MAX = (
    "lse-max",
    "merged lse = max of the chunks' lse",
    "The merged lse is log sum_s e^lse_s: the largest lse alone forgets the other chunks' mass. "
    "merge_partials (np.logaddexp) computes it stably.",
)
_SKIPS = (
    "skips-a-chunk",
    "the first or the last chunk never enters the merge",
    "Every chunk must be merged. Start from the first partial (or from the empty result o = 0, "
    "lse = -inf, the merge's identity) and merge each remaining chunk in turn: "
    "for s in range(1, num_splits).",
)
_NO_SHIFT = (
    "no-max-subtraction",
    "the chunk's softmax without subtracting its max: e^x overflows or underflows",
    "e^x is inf once x > 709 (in float64) and 0 below -745, so with scores of several hundred "
    "p = np.exp(x) gives inf / inf or 0 / 0 = NaN. Subtract the chunk's max first: "
    "m = x.max(), p = np.exp(x - m) (every p in (0, 1]), lse_s = m + np.log(p.sum()).",
)
_OVERFLOW = (
    "weights-overflow",
    "the merge's weights computed from e^lse_s (or a ratio e^(lse_s - lse)) that overflows",
    "e^lse_s / sum_t e^lse_t is right on paper, but e^lse is inf for an lse above 709 and 0 "
    "below -745 (scores of several hundred), and inf / inf or 0 / 0 is NaN; so is a ratio "
    "r = e^(lse_s - lse) when one chunk's lse is 1000 above the others'. Stay in the log domain: "
    "lse = np.logaddexp.reduce(lse_partial), weights np.exp(lse_partial - lse), each at most 1 "
    "(or merge_partials, which does the same for two partials).",
)


def _mistakes(specs, reference) -> list[Mistake]:
    return [
        Mistake(slug, title, explanation, _only_if_wrong(fn, reference))
        for (slug, title, explanation), fns in specs
        for fn in fns
    ]


def _partials_reference(q, K, V, num_splits):
    return _reference_partials(q, K, V, num_splits)


def _decode_reference(q, K, V, num_splits):
    """Full attention of the one query over the whole cache: o (dv,), lse ()."""
    O, lse = attention_reference(np.asarray(q, dtype=np.float64)[None, :], K, V)
    return O[0], lse[0]


PARTIALS_MISTAKES: list[Mistake] = _mistakes(
    [
        (_DROPPED_TAIL, [_buggy_partials("floor")]),
        (_CHUNK_SIZE, [_buggy_partials("balanced"), _buggy_partials("floor-rest")]),
        (_NAN, [_buggy_partials(empty="nan")]),
        (_EMPTY_WEIGHT, [_buggy_partials(empty="lse0")]),
        (_SCALE, [_buggy_partials(scale=False)]),
        (_BASE2, [_buggy_partials(lse_rule="log2")]),
        (_M_NOT_LSE, [_buggy_partials(lse_rule="max")]),
        (_UNNORMALIZED, [_buggy_partials(normalize=False)]),
        (_NO_SHIFT, [_buggy_partials(shift=False)]),
    ],
    _partials_reference,
)

DECODE_MISTAKES: list[Mistake] = _mistakes(
    [
        (
            _PLAIN,
            [
                _buggy_decode(merge=_plain_mean),
                _buggy_decode(merge=_plain_mean_nonempty),
                _buggy_decode(merge=_pairwise_average),
            ],
        ),
        (_ADD, [_buggy_decode(merge=_sum_of_outputs)]),
        (
            _EMPTY_WEIGHT,
            [
                _buggy_decode(_buggy_partials(empty="lse0")),
                _buggy_decode(merge=_empty_weight_one_over_k),
            ],
        ),
        (_DROPPED_TAIL, [_buggy_decode(_buggy_partials("floor"))]),
        (_SCALE, [_buggy_decode(_buggy_partials(scale=False))]),
        (
            _BASE2,
            [
                _buggy_decode(_buggy_partials(lse_rule="log2")),
                _buggy_decode(merge=_merge_all_base2),
                _buggy_decode(_buggy_partials(lse_rule="log2"), _merge_all_base2),
            ],
        ),
        (_M_NOT_LSE, [_buggy_decode(_buggy_partials(lse_rule="max"))]),
        (_UNNORMALIZED, [_buggy_decode(_buggy_partials(normalize=False))]),
        (_LSE_MAX, [_buggy_decode(merge=_lse_max)]),
        (_SKIPS, [_buggy_decode(merge=_skip_last), _buggy_decode(merge=_skip_first)]),
        (_NAN, [_buggy_decode(_buggy_partials(empty="nan"))]),
        # before no-max-subtraction: where both give NaN, the merge is the likelier culprit;
        # a case comes first on which only the unsafe chunk softmax fails (see _split_cases)
        (_OVERFLOW, [_buggy_decode(merge=_exp_weights), _buggy_decode(merge=_ratio_merge)]),
        (_NO_SHIFT, [_buggy_decode(_buggy_partials(shift=False))]),
    ],
    _decode_reference,
)
