"""Notebook 08's float64 references and the replays of its known mistakes.

    forward64(q, k, v, causal, scale) -> (out, lse)         float64, (B, H, N, d) and (B, H, N)
    reference_grads(q, k, v, do, causal, scale) -> (dq, dk, dv)
    emulate_backward(q, k, v, do, causal, scale, block_m, block_n, **bug) -> (dq, dk, dv)
                                    the kernels' tile loops in float64, one bug at a time
    DKDV_MISTAKES, DQ_MISTAKES      the mistakes of the two gradient kernels, each with its replay
    PREPROCESS_MISTAKES             those of the preprocess kernel, D = rowsum(dO * O)
    NO_CAUSAL_SKIP                  the causal tiles above the diagonal visited (a load rule)

A mistake is named only when its replay gives the learner's output on the failing case.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from course_utils.checks.engine.failures import Mistake

__all__ = ["DKDV_MISTAKES", "DQ_MISTAKES", "PREPROCESS_MISTAKES", "emulate_backward"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ---- float64 references and replays of known mistakes ------------------------------------------
def _visible(n_q: int, n_k: int, causal: bool, mask: str = "c<=r") -> np.ndarray:
    rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    if not causal or mask == "none":
        return np.ones((n_q, n_k), dtype=bool)
    return {"c<=r": cols <= rows, "c<r": cols < rows, "c<=r+1": cols <= rows + 1}[mask]


def forward64(q, k, v, causal, scale):
    """float64 out (B, H, N_q, d) and lse (B, H, N_q) of attention (the scores materialized)."""
    s = scale * (q @ k.swapaxes(-1, -2))
    s = np.where(_visible(q.shape[2], k.shape[2], causal), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[..., 0]


def emulate_backward(
    q, k, v, do, lse, delta, causal, scale, block_m=16, block_n=16, *,
    p_form: str = "right", forgot_d: bool = False, ds_sign: int = 1, grad_scale: str = "once",
    mask: str = "c<=r", heads: str = "all", kernel: str | None = None, state: str = "float32",
):  # fmt: skip
    """(dq, dk, dv) in float64 as the kernels compute them from lse and D, with one bug or none.

    p_form: "right" P = exp(s S - lse); "no-lse" P = exp(s S); "lse-base2" P = exp2(s log2(e) S
    - lse) (lse not converted to base 2); "exp-vs-exp2" P = exp(s log2(e) S - log2(e) lse).
    forgot_d: dS = P * dP.  ds_sign=-1: dS = P * (D - dP).  grad_scale: "once" (dQ = s dS K,
    dK = s dS^T Q), "none" or "twice".  mask: the causal mask "c<=r", "c<r", "c<=r+1" or "none".
    heads: "all", or "first" (every program reads and writes head (0, 0): the rest stays NaN).
    kernel: "dkdv" or "dq": with causal, only the tile pairs that kernel visits when it skips the
    tiles above the diagonal (block_m, block_n: its tiles) can contribute, whatever the mask.
    state: "float16" (dK and dV summed over query tiles of block_m, dQ over key tiles of block_n,
    in float16: rounded after every tile, the scale applied once at the end; P and dS rounded to
    the inputs' float16 as tl.dot gets them), "float16-dk" or "float16-dv" (that one alone).
    """
    s = q @ k.swapaxes(-1, -2)
    visible = _visible(q.shape[2], k.shape[2], causal, mask)
    if causal and kernel is not None:
        rows = (np.arange(q.shape[2]) // block_m * block_m)[:, None]  # each query's tile start
        cols = (np.arange(k.shape[2]) // block_n * block_n)[None, :]  # each key's tile start
        if kernel == "dkdv":  # the loop starts at the query tile holding the key tile's start
            visible = visible & (rows >= cols // block_m * block_m)
        else:  # the loop stops at the query tile's end
            visible = visible & (cols < rows + block_m)
    with np.errstate(all="ignore"):
        lse_ = lse[..., None]
        p = {
            "right": lambda: np.exp(scale * s - lse_),
            "no-lse": lambda: np.exp(scale * s),
            "lse-base2": lambda: np.exp2(scale * LOG2E * s - lse_),
            "exp-vs-exp2": lambda: np.exp(LOG2E * (scale * s - lse_)),
        }[p_form]()
        p = np.where(visible, p, 0.0)
        dv = p.swapaxes(-1, -2) @ do
        dp = do @ v.swapaxes(-1, -2)
        ds = p * dp if forgot_d else ds_sign * p * (dp - delta[..., None])
        factor = {"once": scale, "none": 1.0, "twice": scale * scale}[grad_scale]
        dq = factor * (ds @ k)
        dk = factor * (ds.swapaxes(-1, -2) @ q)
        if state != "float32":
            half = _half_sums(p, ds, q, k, do, block_m, block_n, factor)
            dq = half[0] if state == "float16" else dq
            dk = half[1] if state in ("float16", "float16-dk") else dk
            dv = half[2] if state in ("float16", "float16-dv") else dv
    grads = (dq, dk, dv)
    if heads == "first":
        grads = tuple(_first_head_only(g) for g in grads)
    return grads


def _half_sums(p, ds, q, k, do, block_m, block_n, factor):
    """dQ, dK and dV with float16 accumulators: each tile's product (exact in float32 here)
    added, then the sum rounded to float16."""

    def half(x):
        return x.astype(np.float16).astype(np.float64)

    p, ds = half(p), half(ds)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(k.shape)
    for i in range(0, q.shape[2], block_m):
        rows = slice(i, i + block_m)
        dv = half(dv + p[..., rows, :].swapaxes(-1, -2) @ do[..., rows, :])
        dk = half(dk + ds[..., rows, :].swapaxes(-1, -2) @ q[..., rows, :])
    for j in range(0, k.shape[2], block_n):
        cols = slice(j, j + block_n)
        dq = half(dq + ds[..., cols] @ k[..., cols, :])
    return factor * dq, factor * dk, dv


def _first_head_only(x: np.ndarray) -> np.ndarray:
    y = np.full_like(x, np.nan)
    y[0, 0] = x[0, 0]
    return y


def reference_grads(q, k, v, do, causal, scale):
    """float64 (dq, dk, dv) of naive attention by torch autograd (the check's oracle)."""
    import torch

    x = [torch.from_numpy(np.array(t, dtype=np.float64)).requires_grad_(True) for t in (q, k, v)]
    s = scale * x[0] @ x[1].transpose(-1, -2)
    if causal:
        keep = torch.from_numpy(_visible(q.shape[2], k.shape[2], True))
        s = s.masked_fill(~keep, float("-inf"))
    out = torch.softmax(s, dim=-1) @ x[2]
    out.backward(torch.from_numpy(np.array(do, dtype=np.float64)))
    return tuple(t.grad.numpy() for t in x)


def _mistake(slug, title, explanation, **bug):
    return Mistake(slug, title, explanation, functools.partial(emulate_backward, **bug))


_P = (
    "P is recomputed from the forward's lse, never from a new max and sum: "
    "P = exp(softmax_scale * S - lse) = exp2(S * softmax_scale * log2(e) - lse * log2(e)). "
)
_CAUSAL = (
    "Query i sees key j exactly when j <= i: in the dK/dV kernel's transposed tile, "
    "offs_n[:, None] <= offs_m[None, :]; in the dQ kernel, offs_n[None, :] <= offs_m[:, None]. "
)
_SHARED = [
    _mistake(
        "head-offset-missing", "every program works on head (0, 0): the bh offset is missing",
        "Program (pid, bh) owns head bh = b * H + h; its rows start bh * N * HEAD_DIM elements "
        "into q, k, v, dO, dq, dk, dv and bh * N into lse and D. Without the offset every "
        "program reads and writes head 0, and the other heads are never written.",
        heads="first",
    ),
    _mistake("lse-not-subtracted", "P = exp(S * scale) without subtracting lse",
             _P + "Without lse the rows do not sum to 1: P is the forward's p times exp(lse).",
             p_form="no-lse"),
    _mistake("lse-units", "lse subtracted in natural-log units from a base-2 exponent",
             _P + "With exp2, both terms must be in base 2: lse * log2(e), not lse.",
             p_form="lse-base2"),
    _mistake("exp-vs-exp2", "tl.exp on base-2 scores (qk_scale = scale * log2(e) with tl.exp)",
             _P + "qk_scale holds log2(e): it goes with tl.math.exp2, or use tl.exp with "
             "softmax_scale alone.", p_form="exp-vs-exp2"),
    _mistake("forgot-D", "dS = P * dP: D is not subtracted",
             "The softmax backward is dS = P * (dP - D) with D_i = rowsum(dO_i * O_i): the "
             "rows of P sum to 1, so a change of one score takes weight from every other.",
             forgot_d=True),
    _mistake("ds-sign", "dS = P * (D - dP): the sign of dS is flipped",
             "dS = P * (dP - D): dP first. With the sign flipped every gradient through S points "
             "the wrong way.", ds_sign=-1),
    _mistake("causal-off-by-one", "the causal mask hides the diagonal (key j < query i)",
             _CAUSAL + "A query sees its own key.", mask="c<r"),
    _mistake("causal-off-by-one", "the causal mask lets a query see the next key",
             _CAUSAL, mask="c<=r+1"),
    _mistake("causal-mask-missing", "CAUSAL is ignored: no mask inside the diagonal tile",
             _CAUSAL + "Skipping the tiles that lie wholly above the diagonal is not enough: the "
             "tile that crosses it must be masked too.", mask="none"),
]  # fmt: skip

_DK_SCALE = _mistake(
    "dk-not-scaled", "dK is not multiplied by softmax_scale",
    "S = softmax_scale * Q K^T, so dK = softmax_scale * dS^T Q (and dQ = softmax_scale * dS K): "
    "multiply the accumulator once, after the loop.", grad_scale="none",
)  # fmt: skip
_DK_TWICE = _mistake(
    "scale-twice", "softmax_scale applied twice (to dS and again after the loop)",
    "softmax_scale enters the gradient once: dK = softmax_scale * dS^T Q.", grad_scale="twice",
)  # fmt: skip
_DQ_SCALE = _mistake(
    "dq-not-scaled", "dQ is not multiplied by softmax_scale",
    "S = softmax_scale * Q K^T, so dQ = softmax_scale * dS K: multiply the accumulator once, "
    "after the loop.", grad_scale="none",
)  # fmt: skip


def _for_kernel(mistakes, kernel):
    return [
        dataclasses.replace(m, fn=functools.partial(m.fn.func, **m.fn.keywords, kernel=kernel))
        for m in mistakes
    ]


_HALF_STATE = Mistake(
    "half-precision-state",
    "the accumulators dK, dV or dQ are kept in float16 (the inputs' dtype)",
    "dk, dv and dq must be tl.zeros(..., dtype=tl.float32) whatever the inputs' dtype: each "
    "is a sum over every tile of the other side (query tiles for dK and dV, key tiles for dQ), "
    "and in float16 every addition rounds it to 11 bits. Only the operands of tl.dot (P, dS) "
    "are cast to the inputs' dtype, and the result once, at the store.",
    functools.partial(emulate_backward, state="float16"),
)
_HALF_STATES = [
    _HALF_STATE,
    *(
        dataclasses.replace(_HALF_STATE, fn=functools.partial(emulate_backward, state=state))
        for state in ("float16-dk", "float16-dv")
    ),
]
DKDV_MISTAKES = _for_kernel([*_SHARED, _DK_SCALE, _DK_TWICE, *_HALF_STATES], "dkdv")
DQ_MISTAKES = _for_kernel([*_SHARED, _DQ_SCALE, dataclasses.replace(_DK_TWICE, explanation=(
    "softmax_scale enters the gradient once: dQ = softmax_scale * dS K.")), _HALF_STATE],
    "dq")  # fmt: skip

NO_CAUSAL_SKIP = Mistake(
    "no-causal-skip",
    "causal: the tiles above the diagonal are computed and masked instead of skipped",
    "With causal=True about half of the (query tile, key tile) pairs see no key at all. Start "
    "(dK/dV kernel) or stop (dQ kernel) the loop at the diagonal tile, so that those pairs are "
    "never loaded or multiplied: about half the work of the non-causal kernel.",
    fn=lambda *a, **k: None,
)


def _delta_variant(out, do, *, bug: str | None = None):
    d = (out * do).sum(axis=-1)
    if bug == "heads":
        d = _first_head_only(d[..., None])[..., 0]
    if bug == "heads-copy":  # the loads miss the head's offset, the store has it
        d = np.broadcast_to(d[:1, :1], d.shape).copy()
    if bug == "half":  # products and sum in float16
        d = (out.astype(np.float16) * do.astype(np.float16)).sum(axis=-1, dtype=np.float16)
        d = d.astype(np.float64)
    return (d,)


PREPROCESS_MISTAKES = [
    Mistake(
        "head-offset-missing", "every program works on head (0, 0): the bh offset is missing",
        "Program (pid, bh) reads the rows of head bh = b * H + h, bh * N * HEAD_DIM elements "
        "into out and dO, and writes D at bh * N + row.",
        functools.partial(_delta_variant, bug="heads"),
    ),
    Mistake(
        "head-offset-missing", "every program reads head (0, 0): the bh offset is missing",
        "Program (pid, bh) reads the rows of head bh = b * H + h, bh * N * HEAD_DIM elements "
        "into out and dO; without the offset every head gets head 0's D.",
        functools.partial(_delta_variant, bug="heads-copy"),
    ),
    Mistake(
        "d-in-half-precision", "D summed in the inputs' half precision",
        "D_i sums d products; in float16 it keeps about 3 digits. Convert to float32 before the "
        "product: tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1).",
        functools.partial(_delta_variant, bug="half"),
    ),
]  # fmt: skip
