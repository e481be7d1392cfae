"""Check of notebook 08's exercise 4: the learner's torch.autograd.Function, FlashAttentionTriton.

    check_attention_function(function)   apply(q, k, v, causal, softmax_scale) -> out, then
                                         out.backward(dO) for each cotangent

What it certifies, case by case, in this order (the first broken rule is the failure):

    what is saved        out.grad_fn.saved_tensors holds exactly q, k, v, out and a float32
                         (batch, heads, N_q) lse; nothing of size N_q x N_k; no tensor kept on
                         ctx as an attribute (saves-probabilities, saves-extra, saves-missing,
                         lse-dtype, lse-shape)
    what is returned     one gradient per input of forward, (dq, dk, dv, None, None): what
                         autograd refuses is named with the learner's `return` line
                         (missing-nones, grads-swapped)
    the learner's kernels  each backward launches the learner's bwd_preprocess_kernel,
                         bwd_dkdv_kernel and bwd_dq_kernel (backward-skips-kernels)
    no P in backward     no torch operation in the backward creates an N_q x N_k tensor
                         (rebuilds-p)
    the gradients        against float64 autograd of naive attention, and float64 central
                         differences along random directions (grads-swapped, scale-not-passed,
                         causal-not-passed)

The Function runs in the learner's process through
course_utils.harness.triton_learner_backward.run_learner_function, which reports plain data:
the saved tensors, the kernels each backward launched (names only), the first N_q x N_k tensor a
torch operation created during the backward, what backward returned, and the gradients. The
judging happens here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from course_utils.checks.engine.display import describe
from course_utils.checks.engine.failures import CheckFailure, Mistake, misconception_slug
from course_utils.checks.engine.feedback import matches_in_norm, worst_row
from course_utils.checks.engine.kernels import _nothing_on_stderr, _rel_err
from course_utils.checks.triton_backward.emulation import (
    emulate_backward,
    forward64,
    reference_grads,
)
from course_utils.checks.triton_backward.kernels import (
    _RUNNERS,
    BwdCase,
    _call,
    _inputs,
    _match_tolerance,
    _on_gpu,
    _tolerance,
)

__all__ = ["FUNCTION_MISTAKES", "LEARNER_KERNELS", "check_attention_function"]

NAME = "FlashAttentionTriton"
# The learner's kernels (notebook 08's exercises 1 to 3): every backward launches each of them
LEARNER_KERNELS = ("bwd_preprocess_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel")
# The notebook's API for the Function: the course's forward, and the launcher of the kernels
ALLOW = ("run_learner_function", "flash_attention_fwd", "learner_backward")
_CALL = (
    "learner_backward(bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel, dout, q, k, v, "
    "out, lse, ctx.causal, ctx.softmax_scale)"
)


def _function_cases() -> list[tuple[BwdCase, int]]:
    """(case, cotangents): the first case runs backward twice on one graph (a backward that
    changes its saved tensors in place, or ignores dO, shows there). learner_backward picks
    the tiles: the cases' own are not used."""
    if _on_gpu():
        dtype = "float16"
        cases = [
            (BwdCase("N_q != N_k", "N_q != N_k", 1, 2, 100, 130, 64, False, dtype=dtype, seed=11),
             2),
            (BwdCase("causal, N = 257, softmax_scale = 0.1", "causal", 2, 2, 257, 257, 64, True,
                     dtype=dtype, seed=12, softmax_scale=0.1), 1),
        ]  # fmt: skip
    else:
        cases = [
            (BwdCase("N_q = 20, N_k = 24", "N_q != N_k", 1, 2, 20, 24, 16, False, seed=11), 2),
            (BwdCase("causal, ragged N = 21, softmax_scale = 0.3", "causal", 1, 1, 21, 21, 16,
                     True, seed=12, softmax_scale=0.3), 1),
            (BwdCase("d = 24, bfloat16 (run in float32 by the interpreter)", "bfloat16", 1, 1,
                     18, 18, 24, False, dtype="bfloat16", seed=13), 1),
        ]  # fmt: skip
    return [(dataclasses.replace(c, kernel="function"), n) for c, n in cases]


def _none(*args):
    return None


def _m(slug: str, title: str, explanation: str) -> Mistake:
    return Mistake(slug, title, explanation, _none)


FUNCTION_MISTAKES = {
    "saves-probabilities": _m(
        "saves-probabilities", "the N_q x N_k matrix P (or S) is saved for the backward",
        "FlashAttention's backward recomputes P tile by tile from q, k and lse; saving P costs "
        "N_q * N_k numbers per head, the memory the algorithm exists to avoid. Save q, k, v, "
        "out and lse only."),
    "saves-extra": _m(
        "saves-extra", "more is saved than q, k, v, out and lse",
        "ctx.save_for_backward(q, k, v, out, lse) and nothing else: the causal flag and the "
        "scale are plain attributes of ctx; D is computed in the backward."),
    "saves-missing": _m(
        "saves-missing", "out or lse is not saved",
        "The backward needs out (for D = rowsum(dO * O)) and lse (to recompute P); both come "
        "from the forward: save them, do not run the forward again."),
    "lse-dtype": _m(
        "lse-dtype", "lse is saved in a dtype other than float32",
        "lse is a per-row logsumexp of size up to hundreds; in float16 or bfloat16 its rounding "
        "error, multiplied inside exp, spoils P. Keep it float32, as the forward returns it: "
        "do not cast it to q's dtype."),
    "lse-shape": _m(
        "lse-shape", "lse is saved with a shape other than (batch, heads, N_q)",
        "The kernels read lse as one float per query row: shape (batch, heads, N_q), "
        "contiguous. Do not unsqueeze it or keep it as (batch * heads, N_q)."),
    "missing-nones": _m(
        "missing-nones", "backward does not return one gradient per input of forward",
        "forward(ctx, q, k, v, causal, softmax_scale) has five inputs, so backward returns five "
        "values: (dq, dk, dv, None, None). causal and softmax_scale are not tensors: their "
        "gradient is None."),
    "grads-swapped": _m(
        "grads-swapped", "backward returns the gradients in the wrong order",
        "backward returns one gradient per input of forward, in order: (dq, dk, dv, None, None) "
        "for forward(ctx, q, k, v, causal, softmax_scale); learner_backward returns (dq, dk, "
        "dv) in that order too."),
    "backward-skips-kernels": _m(
        "backward-skips-kernels", "the backward does not launch your three kernels",
        f"The exercise's backward runs your kernels of exercises 1 to 3: {_CALL}. Gradients "
        "from torch autograd of naive attention (or any other code) are right, but they rebuild "
        "the N_q x N_k matrix P that FlashAttention's backward exists to avoid."),
    "rebuilds-p": _m(
        "rebuilds-p", "the backward builds an N_q x N_k tensor (P, S or dS)",
        "Your kernels recompute P and dS tile by tile, on chip, from q, k and lse: nothing of "
        "size N_q x N_k is ever written to memory. The backward passes the saved tensors to "
        "learner_backward and returns its gradients; it computes no scores itself."),
    "scale-not-passed": _m(
        "scale-not-passed", "the backward uses the default softmax_scale, not the forward's",
        "Keep the forward's softmax_scale on ctx and pass it to the backward kernels; the "
        "default 1/sqrt(d) is right only when the caller gave none."),
    "causal-not-passed": _m(
        "causal-not-passed", "the backward runs without the causal mask the forward used",
        "Keep the forward's causal flag on ctx and pass it to the backward kernels."),
}  # fmt: skip


def _named(slug: str, text: str) -> CheckFailure:
    m = FUNCTION_MISTAKES[slug]
    return CheckFailure(f"{text}\n  likely mistake: {m.title} [misconception: {m.slug}]\n"
                        f"  {m.explanation}")  # fmt: skip


# ---- what is saved ------------------------------------------------------------------------------
def _value64(s: dict) -> np.ndarray:
    v = s["value"]
    return np.asarray(v.double().numpy() if hasattr(v, "double") else v, dtype=np.float64)


def _judge_saved(case, result, q64, k64, v64, out64, lse64) -> None:
    """Exactly q, k, v, out and a (B, H, N_q) float32 lse in grad_fn.saved_tensors, nothing
    kept on ctx as a tensor attribute. lse is the saved tensor of B * H * N_q elements: its
    dtype and shape are judged before its values."""
    saved = list(result["saved"])
    attributes = dict(result["attributes"])
    where = f"on {case.label} ({case.describe()})"
    everything = [("saved", s) for s in saved] + [(f"ctx.{n}", s) for n, s in attributes.items()]
    for origin, s in everything:
        shape = tuple(s["shape"])
        if len(shape) >= 2 and shape[-2:] in ((case.n_q, case.n_k), (case.n_k, case.n_q)):
            raise _named(
                "saves-probabilities",
                f"✗ {NAME}: a tensor of shape {shape} ({origin}) is kept for the backward {where}",
            )
    if attributes:
        listed = ", ".join(f"ctx.{n} {tuple(s['shape'])}" for n, s in attributes.items())
        raise _named(
            "saves-extra", f"✗ {NAME}: tensors are kept as attributes of ctx ({listed}) {where}"
        )
    wanted = {"q": q64, "k": k64, "v": v64, "out": out64}
    found: dict[str, int] = {}
    lse_like: list[int] = []
    extra: list[int] = []
    tol = 3e-2 if case.dtype != "float32" or _on_gpu() else 1e-4
    for i, s in enumerate(saved):
        value = _value64(s)
        hit = next(
            (n for n, ref in wanted.items()
             if n not in found and value.shape == ref.shape and _rel_err(value, ref) < tol),
            None,
        )  # fmt: skip
        if hit is not None:
            found[hit] = i
        elif value.size == lse64.size:
            lse_like.append(i)
        else:
            extra.append(i)
    if len(lse_like) > 1:  # the one nearest the forward's lse is lse, the others are extra
        near = min(lse_like, key=lambda i: _rel_err(_value64(saved[i]).ravel(), lse64.ravel()))
        extra += [i for i in lse_like if i != near]
        lse_like = [near]
    shapes = ", ".join(f"{tuple(s['shape'])} {s['dtype']}" for s in saved) or "nothing"
    head = f"✗ {NAME}: grad_fn.saved_tensors holds {len(saved)} tensors {where}: {shapes}"
    missing = [n for n in ("q", "k", "v", "out") if n not in found]
    if extra:
        raise _named("saves-extra", head + "; expected exactly q, k, v, out and lse")
    if missing or not lse_like:
        gone = missing + ([] if lse_like else ["lse"])
        raise _named("saves-missing", head + f"; not found: {', '.join(gone)}")
    lse = saved[lse_like[0]]
    if lse["dtype"] != "float32":
        raise _named("lse-dtype", head + f"; lse is {lse['dtype']}, expected float32")
    expected_shape = (case.batch, case.heads, case.n_q)
    if tuple(lse["shape"]) != expected_shape:
        raise _named(
            "lse-shape", head + f"; lse has shape {tuple(lse['shape'])}, expected {expected_shape}"
        )
    err = _rel_err(_value64(lse).ravel(), lse64.ravel())
    if err >= tol:
        raise CheckFailure(
            f"{head}\n  the saved lse differs from the forward's logsumexp (relative error "
            f"{err:.1e}): save the lse that ta.flash_attention_fwd returns, unchanged."
        )


# ---- what backward returns, what it launches, what it builds ------------------------------------
def _return_text(result) -> str:
    returns = result.get("returns") or []
    if not returns:
        return ""
    shown = "\n".join(f"  your backward, line {line}: {text}" for line, text in returns[-3:])
    return "\n" + shown


def _returned_shapes(returned) -> str:
    def one(x):
        if x is None:
            return "None"
        if isinstance(x, tuple | list) and len(x) == 2:
            return f"{tuple(x[0])} {x[1]}"
        return str(x)

    return ", ".join(one(x) for x in returned)


def _saved_explains(runner, case, q, k, v, q64, k64, v64, out64, lse64) -> None:
    """After the backward raised: apply the Function once more, forward only, and judge what it
    saved (an lse saved in bfloat16 that the launcher then refuses is `lse-dtype`). Returns
    when the saved tensors are right or cannot be read."""
    try:
        result = _call(NAME, runner, case, q, k, v, case.causal, case.softmax_scale, [],
                       allow=ALLOW)  # fmt: skip
    except CheckFailure:
        return
    if isinstance(result, dict) and {"saved", "attributes"} <= set(result):
        _judge_saved(case, result, q64, k64, v64, out64, lse64)


def _judge_returned(case, result) -> None:
    """Autograd refused what backward returned: name why, with the learner's `return` line."""
    refused = result["refused"]
    if refused is None:
        return
    backwards = result["backwards"]
    returned = backwards[-1]["returned"] if backwards else None
    shape_q = (case.batch, case.heads, case.n_q, case.d)
    shape_k = (case.batch, case.heads, case.n_k, case.d)
    head = (
        f"✗ {NAME}: autograd refused what backward returned on {case.label}.\n  PyTorch: {refused}"
    )
    if returned is None:
        raise CheckFailure(head + _return_text(result))
    text = (
        f"{head}\n  backward returned {len(returned)} value(s): {_returned_shapes(returned)}; "
        f"expected 5: (dq {shape_q}, dk {shape_k}, dv {shape_k}, None, None)" + _return_text(result)
    )
    if len(returned) != 5 or any(x is not None for x in returned[3:5]):
        raise _named("missing-nones", text)
    shapes = [tuple(x[0]) if isinstance(x, tuple | list) else None for x in returned[:3]]
    if sorted(map(str, shapes)) == sorted(map(str, [shape_q, shape_k, shape_k])):
        raise _named("grads-swapped", text)
    raise CheckFailure(text)


def _judge_backwards(case, result) -> None:
    """Each backward launched the learner's three kernels and created no N_q x N_k tensor."""
    for i, run in enumerate(result["backwards"]):
        launched = [name for name, course in run["launches"] if not course]
        course = sorted({name for name, course in run["launches"] if course})
        missing = [k for k in LEARNER_KERNELS if k not in launched]
        scores = run["scores"]
        built = (
            f"\n  it built a tensor of shape {tuple(scores[1])} ({scores[0]}): N_q x N_k"
            if scores else ""
        )  # fmt: skip
        if missing:
            said = ", ".join(sorted(set(launched))) or "none of yours"
            if course:
                said += f"; the course's {', '.join(course)}"
            raise _named(
                "backward-skips-kernels",
                f"✗ {NAME}: backward {i + 1} on {case.label} did not launch "
                f"{', '.join(missing)}.\n  input:    {case.describe()}\n"
                f"  launched: {said}{built}",
            )
        if scores:
            raise _named(
                "rebuilds-p",
                f"✗ {NAME}: backward {i + 1} on {case.label} built a tensor of shape "
                f"{tuple(scores[1])} ({scores[0]}): N_q = {case.n_q} by N_k = {case.n_k}.\n"
                f"  input: {case.describe()}",
            )


# ---- the gradients ------------------------------------------------------------------------------
def _finite_difference_test(case, q64, k64, v64, dos, grads, tol) -> float:
    """Directional derivatives of L = <attention(q, k, v), dO> in float64, central differences,
    against the learner's gradients: the largest relative disagreement."""
    rng = np.random.default_rng(case.seed + 1)
    worst = 0.0
    h = 1e-6
    for do, (dq, dk, dv) in zip(dos, grads, strict=True):
        for _ in range(2):
            dirs = [rng.standard_normal(x.shape) for x in (q64, k64, v64)]
            plus = forward64(*(x + h * e for x, e in zip((q64, k64, v64), dirs, strict=True)),
                             case.causal, case.scale)[0]  # fmt: skip
            minus = forward64(*(x - h * e for x, e in zip((q64, k64, v64), dirs, strict=True)),
                              case.causal, case.scale)[0]  # fmt: skip
            numeric = float(((plus - minus) * do).sum() / (2 * h))
            analytic = float(sum((g * e).sum() for g, e in zip((dq, dk, dv), dirs, strict=True)))
            # <g, e> for a standard normal e has standard deviation ||g||: the natural unit
            size = float(np.sqrt(sum((g * g).sum() for g in (dq, dk, dv))))
            worst = max(worst, abs(analytic - numeric) / max(size, 1e-300))
    return worst


def _runner(function):
    if hasattr(function, "bound_into"):  # the grader's handle: the Function runs in the kernel
        return function.bound_into(f"{_RUNNERS}:run_learner_function")

    def launch(*args):
        from course_utils.harness.triton_learner_backward import run_learner_function

        return run_learner_function(function, *args)

    return launch


_KEYS = {"out", "saved", "attributes", "grads", "backwards", "refused", "returns"}


def check_attention_function(function, seed: int | None = 0) -> None:
    """Check the learner's torch.autograd.Function (apply(q, k, v, causal, softmax_scale) -> out).

    For each case: applies it once, inspects out.grad_fn.saved_tensors (exactly q, k, v, out and
    a (batch, heads, N_q) float32 lse; no tensor kept on ctx as an attribute), runs backward for
    one or two cotangents (each must launch the learner's three kernels and create no N_q x N_k
    tensor), then compares the gradients with float64 autograd of naive attention, and with
    float64 central differences along random directions (a gradcheck done here, in float64).
    """
    import torch

    runner = _runner(function)
    worst_fd = 0.0
    cases = _function_cases()
    with _nothing_on_stderr():
        for case, n_cotangents in cases:
            (q, k, v, _), _, (q64, k64, v64, _, out64, lse64, _) = _inputs(case)
            gen = torch.Generator().manual_seed(case.seed + (seed or 0))
            dos = [torch.randn(q.shape, generator=gen).to(q.dtype) for _ in range(n_cotangents)]
            try:
                result = _call(NAME, runner, case, q, k, v, case.causal, case.softmax_scale, dos,
                               allow=ALLOW)  # fmt: skip
            except CheckFailure as failure:
                if misconception_slug(str(failure)) is None:  # what it saved may say why
                    _saved_explains(runner, case, q, k, v, q64, k64, v64, out64, lse64)
                raise
            if not isinstance(result, dict) or set(result) != _KEYS:
                raise CheckFailure(f"✗ {NAME}: the runner's answer could not be read")
            _judge_saved(case, result, q64, k64, v64, out64, lse64)
            _judge_returned(case, result)
            _judge_backwards(case, result)
            tol = _tolerance(case.dtype) if _on_gpu() else (
                1e-4 if case.dtype == "float32" else 2e-2)  # fmt: skip
            grads = []
            for do, got in zip(dos, result["grads"], strict=True):
                do64 = do.double().numpy()
                yours = tuple(g.double().numpy() for g in got)
                expected = reference_grads(q64, k64, v64, do64, case.causal, case.scale)
                errs = [_rel_err(y, e) for y, e in zip(yours, expected, strict=True)]
                if not all(e < tol for e in errs):
                    raise _function_failure(case, yours, expected, errs, tol, q64, k64, v64,
                                            do64)  # fmt: skip
                grads.append(yours)
            fd = _finite_difference_test(
                case, q64, k64, v64, [d.double().numpy() for d in dos], grads, tol
            )
            if fd > max(10 * tol, 1e-3):
                raise CheckFailure(
                    f"✗ {NAME}: the gradients disagree with float64 finite differences by "
                    f"{fd:.1e} (relative) on {case.label}.\n  input: {case.describe()}"
                )
            worst_fd = max(worst_fd, fd)
    passes = sum(n for _, n in cases)
    dtypes = " and ".join(dict.fromkeys(c.dtype for c, _ in cases))
    where = "on the GPU" if _on_gpu() else "in the interpreter"
    print(
        f"✓ {NAME}: saves exactly q, k, v, out and a float32 (batch, heads, N_q) lse; each of "
        f"{passes} backward passes ({dtypes}, {where}) launches your three kernels, builds no "
        f"N_q x N_k tensor, and matches float64 autograd and float64 finite differences "
        f"(within {worst_fd:.0e})"
    )


def _function_failure(case, yours, expected, errs, tol, q64, k64, v64, do64):
    worst = int(np.argmax([e if math.isfinite(e) else np.inf for e in errs]))
    what = ("dq", "dk", "dv")[worst]
    slug = None
    match_tol = _match_tolerance(case.dtype)
    for order in itertools.permutations(range(3)):
        if order == (0, 1, 2):
            continue
        theirs = tuple(expected[i] for i in order)
        if all(y.shape == t.shape and matches_in_norm(y, t, match_tol)
               for y, t in zip(yours, theirs, strict=True)):  # fmt: skip
            slug = "grads-swapped"
    out64, lse64 = forward64(q64, k64, v64, case.causal, case.scale)
    delta64 = (out64 * do64).sum(axis=-1)
    replays = []
    default = 1.0 / math.sqrt(case.d)
    if case.softmax_scale is not None and abs(case.softmax_scale - default) > 1e-9:
        replays.append(("scale-not-passed", dict(scale=default)))
    if case.causal:
        replays.append(("causal-not-passed", dict(causal=False)))
    for candidate, change in replays:
        if slug is not None:
            break
        args = dict(causal=case.causal, scale=case.scale) | change
        theirs = emulate_backward(q64, k64, v64, do64, lse64, delta64, args["causal"],
                                  args["scale"])  # fmt: skip
        if all(matches_in_norm(y, t, match_tol) for y, t in zip(yours, theirs, strict=True)):
            slug = candidate
    b, h, i = worst_row(yours[worst], expected[worst])
    text = (
        f"✗ {NAME}: the gradient {what} is wrong on {case.label} (relative error "
        f"{errs[worst]:.2e}, tolerance {tol:.0e}).\n  input:    {case.describe()}\n"
        f"  yours:    {what}[{b}, {h}, {i}, :6] = {describe(yours[worst][b, h, i, :6], 5)}\n"
        f"  expected: {what}[{b}, {h}, {i}, :6] = {describe(expected[worst][b, h, i, :6], 5)}"
    )
    if slug is not None:
        return _named(slug, text)
    return CheckFailure(
        text + "\n  No known mistake of the Function matches; if your kernels pass their own "
        "checks, look at what backward passes them (ctx's causal and softmax_scale, dout "
        "made contiguous) and at what it returns: (dq, dk, dv, None, None)."
    )
