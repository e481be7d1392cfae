"""Checks of notebook 11 (the capstone: your kernel in a small GPT).

    check_attention_block(fn)        fn(x, w_qkv, w_out, n_heads, attention) -> (B, N, d_model):
                                     split into heads, causal attention by `attention`, heads
                                     merged back, w_out; against references.gpt.attention_block
                                     in float64 (attention "naive", "sdpa" and check_backend,
                                     the check's own, whose output differs: the block must
                                     call what it is given, on (B, H, N, d), causal=True)
    check_saved_bytes(fn)            fn(B, H, N, d, bytes_per_element) -> (naive, flash): the
                                     bytes autograd keeps for the backward pass; naive measured
                                     here with saved_tensors_hooks on real tensors, flash by the
                                     formula 4 N d B H e + 4 B H N (the tests measure it on the
                                     course kernel)
    check_quick_saved_ratio(answer)  naive / flash saved bytes at N = 8192, d = 64, bf16

The learner's function is called with torch tensors (float64, so that a wrong merge of the heads
is far outside rounding) and a backend: a NAME, or check_backend, the check's own function
(harness.capstone_backend; sent to a graded kernel by name, engine.wire.travels). The learner's
code turns it into a function with references.gpt.resolve_attention, which the check allows
(with the backends it returns). Every verdict comes from the values the block returns: a mistake
is named when its replay, run here, gives the learner's output on the failing case.
"""

from __future__ import annotations

import math

import numpy as np

from course_utils.checks.engine.cases import Case, run_cases
from course_utils.checks.engine.failures import Mistake
from course_utils.checks.engine.quizzes import hinted_answer
from course_utils.harness.capstone_backend import (
    _attend,
    _sharp_attend,
    _torch,
    check_backend,
)

__all__ = [
    "BLOCK_MISTAKES",
    "SAVED_MISTAKES",
    "check_attention_block",
    "check_quick_saved_ratio",
    "check_saved_bytes",
]

# what the learner's attention_block may call in course_utils: the backend lookup and backends,
# and the check's own backend (check_backend)
ALLOWED = (
    "resolve_attention",
    "naive_attention",
    "sdpa_attention",
    "course_attention",
    "check_backend",
)

# ---------------------------------------------------------------------------------------------
# attention_block
# ---------------------------------------------------------------------------------------------


def _attend_for(attention):
    """The check's own computation of what the backend `attention` returns when called as the
    course's kernel requires (a name: attention itself, the backends agree in float64;
    check_backend: the sharper softmax)."""
    return _sharp_attend if attention is check_backend else _attend


def _block_replay(
    *,
    split_transposed=True,
    merge_transposed=True,
    causal=True,
    prescale=False,
    interleaved=False,
    project=True,
    own_attention=False,
    fold_heads=False,
):
    """attention_block with one bug; the same signature, float64 torch.

    fold_heads: the backend itself called on (B * H, N, d) tensors (the naive backends take
    them; check_backend answers with its misuse value)."""

    def block(x, w_qkv, w_out, n_heads, attention):
        attend = _attend if own_attention else _attend_for(attention)
        if fold_heads:
            attend = _folded(check_backend if attention is check_backend else _attend)
        B, N, D = x.shape
        H, d = n_heads, D // n_heads
        qkv = x @ w_qkv
        if interleaved:  # (B, N, H, 3d): q, k, v of each head side by side
            q, k, v = qkv.view(B, N, H, 3 * d).split(d, dim=-1)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        else:
            q, k, v = qkv.split(D, dim=-1)
            if split_transposed:
                q, k, v = (t.view(B, N, H, d).transpose(1, 2) for t in (q, k, v))
            else:  # a plain view to (B, H, N, d) mixes positions and heads
                q, k, v = (t.reshape(B, H, N, d) for t in (q, k, v))
        if prescale:
            q = q / math.sqrt(d)
        out = attend(q, k, v, causal)
        out = out.transpose(1, 2).reshape(B, N, D) if merge_transposed else out.reshape(B, N, D)
        return (out @ w_out if project else out).numpy()  # NumPy: what the feedback prints

    return block


def _folded(attend):
    """attend called on (B * H, N, d) tensors, its output unfolded back to (B, H, N, d)."""

    def folded(q, k, v, causal):
        B, H, N, d = q.shape
        out = attend(*(t.reshape(B * H, N, d) for t in (q, k, v)), causal)
        return out.reshape(B, H, N, d)

    return folded


def _block_reference(x, w_qkv, w_out, n_heads, attention):
    return _block_replay()(x, w_qkv, w_out, n_heads, attention)


IGNORES_BACKEND = Mistake(
    "ignores-attention-backend",
    "the block computes attention itself instead of calling the `attention` it is given",
    "The point of the block is that any backend drops in: naive, SDPA, the course's kernel, "
    "yours. A block that always uses one backend (or SDPA or softmax written inline) trains "
    "the capstone without your kernel. Turn the argument into a function, "
    "attn = gpt.resolve_attention(attention), and return what attn(q, k, v, True) gives. "
    "This case passed a backend of the check's own whose softmax is sharper (scores x 3): "
    "a block that uses it returns a different answer than naive attention.",
    _block_replay(own_attention=True),
)


BLOCK_MISTAKES = [
    Mistake(
        "heads-merged-wrong",
        "the heads merged back without moving the head axis",
        "attention returns (B, H, N, d); out.reshape(B, N, d_model) reads it in that order and "
        "puts rows of different positions side by side. Move the head axis next to d first: "
        "out.transpose(1, 2).reshape(B, N, d_model) (each position gets its H heads' d values).",
        _block_replay(merge_transposed=False),
    ),
    Mistake(
        "heads-split-wrong",
        "q, k, v cut into heads with a plain reshape to (B, H, N, d)",
        "The columns h*d .. (h+1)*d of a position belong to head h: view (B, N, D) as "
        "(B, N, H, d), then transpose(1, 2) to (B, H, N, d). reshape(B, H, N, d) on (B, N, D) "
        "deals the numbers of several positions to one head.",
        _block_replay(split_transposed=False),
    ),
    Mistake(
        "heads-split-wrong",
        "q, k, v cut into heads with a plain reshape, and merged back the same way",
        "Undoing a wrong split with the matching wrong merge does not make it right: each head "
        "still attends over numbers of several positions. view(B, N, H, d).transpose(1, 2) to "
        "split, transpose(1, 2).reshape(B, N, D) to merge.",
        _block_replay(split_transposed=False, merge_transposed=False),
    ),
    Mistake(
        "causal-not-passed",
        "attention called without the causal mask",
        "A language model predicts token i + 1 from tokens 0..i only: call attention(q, k, v, "
        "True). Without the mask every position sees the future, the training loss drops to "
        "near zero and the model cannot generate.",
        _block_replay(causal=False),
    ),
    Mistake(
        "scale-applied-twice",
        "q scaled by 1/sqrt(d) before an attention that scales it again",
        "Every backend applies softmax_scale = 1/sqrt(d) itself; dividing q first makes the "
        "scores 1/d instead of 1/sqrt(d), a softmax that is too flat.",
        _block_replay(prescale=True),
    ),
    Mistake(
        "qkv-interleaved",
        "q, k, v read as interleaved per head",
        "x @ w_qkv holds q in its first d_model columns, then k, then v: split it into three "
        "(B, N, d_model) blocks first (.split(d_model, dim=-1)), then cut each into heads.",
        _block_replay(interleaved=True),
    ),
    Mistake(
        "no-out-projection",
        "the output projection w_out left out",
        "The heads, put back side by side, still go through w_out: return out @ w_out.",
        _block_replay(project=False),
    ),
    IGNORES_BACKEND,
    Mistake(
        "attention-input-shape",
        "attention called on q, k, v that are not (B, H, N, d), or without causal=True",
        "The backends take q, k, v of shape (B, H, N, d) and causal=True (your Triton kernel "
        "launches one program per (batch, head) from those axes): view (B, N, d_model) as "
        "(B, N, H, d) and transpose(1, 2), and call attention(q, k, v, True). Folding batch "
        "and heads into one axis, (B * H, N, d), works with naive attention only; check_backend "
        "answers such a call with a value of its own (scores x -1) instead of attention.",
        _block_replay(fold_heads=True),
    ),
]


def _block_case(seed, B, N, D, H, attention, label, focus):
    torch = _torch()
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    x = randn(B, N, D)
    # weights large enough that the softmax is far from uniform: a wrong scale shows
    w_qkv, w_out = randn(D, 3 * D, scale=2.0 / math.sqrt(D)), randn(D, D, scale=1 / math.sqrt(D))
    shape = f"B = {B}, N = {N}, d_model = {D}, H = {H} (d = {D // H})"
    args = (x, w_qkv, w_out, H, attention)
    shown = (
        "check_backend (the check's own: scores x 3)" if callable(attention) else repr(attention)
    )
    return Case(f"{label}: {shape}, attention={shown}", args, focus=focus)


def _block_cases(seed: int | None = 0, trials: int = 0) -> list[Case]:
    cases = [
        _block_case(1, 1, 3, 4, 1, "naive", "one head",
                    "attention(q, k, v, True) on q, k, v of (x @ w_qkv), then w_out"),
        _block_case(2, 1, 4, 8, 2, "naive", "two heads",
                    "heads: columns h*d..(h+1)*d of each position, (B, N, H, d) -> (B, H, N, d)"),
        _block_case(3, 2, 5, 12, 3, "naive", "a batch of two, three heads",
                    "the batch axis kept apart; heads merged back in order"),
        _block_case(4, 2, 6, 8, 2, "sdpa", "the sdpa backend",
                    "the `attention` argument used (resolve_attention), not a fixed backend"),
        _block_case(5, 2, 5, 8, 2, check_backend, "a backend of the check's own",
                    "attn = gpt.resolve_attention(attention); its result is the heads' output"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)  # seed None: fresh inputs at every call (hidden tests)
    for t in range(trials):
        H = int(rng.integers(2, 5))
        cases.append(
            _block_case(
                int(rng.integers(1 << 30)),
                int(rng.integers(1, 4)),
                int(rng.integers(3, 12)),
                H * int(rng.integers(2, 6)),
                H,
                "naive",
                f"random inputs {t + 1} of {trials}",
                "the whole block on inputs you have not seen",
            )
        )
    return cases


def check_attention_block(fn, seed: int | None = 0, trials: int = 0) -> None:
    """Check attention_block(x, w_qkv, w_out, n_heads, attention) on float64 torch tensors
    against the course's block (naive and sdpa backends, one to three heads, batches), and that
    the block calls the backend it is given: one case passes the check's own (check_backend,
    scores x 3 when called on (B, H, N, d) tensors with causal=True, scores x -1 otherwise),
    whose output the block must return.

    trials: random cases added after the fixed ones (sizes and inputs from seed; None: fresh
    ones at every call, the hidden tests)."""
    run_cases(
        "attention_block",
        fn,
        _block_reference,
        _block_cases(seed, trials),
        outputs=("out",),
        mistakes=BLOCK_MISTAKES,
        rtol=1e-9,
        atol=1e-9,
        allow=ALLOWED,
        summary="float64, one to three heads, a batch, the naive and sdpa backends and one of "
        "the check's own (it must be the one called)",
    )


# ---------------------------------------------------------------------------------------------
# saved bytes
# ---------------------------------------------------------------------------------------------

_DTYPES = {2: "bfloat16", 4: "float32", 8: "float64"}


def _measured_naive(B, H, N, d, e) -> int:
    """Bytes autograd keeps for naive attention, measured with saved_tensors_hooks."""
    torch = _torch()
    from course_utils.references.gpt import measured_saved_bytes

    return measured_saved_bytes("naive", B, H, N, d, getattr(torch, _DTYPES[e]))


def _saved_reference(B, H, N, d, e):
    # naive: measured on real tensors; flash: the course kernel's formula (q, k, v, out, lse),
    # which tests/references/test_gpt.py measures on the kernel itself with the same hooks
    return _measured_naive(B, H, N, d, e), 4 * N * d * B * H * e + 4 * B * H * N


def _saved_with(naive, flash):
    def predict(B, H, N, d, e):
        return naive(B, H, N, d, e), flash(B, H, N, d, e)

    return predict


def _naive_ok(B, H, N, d, e):
    return (3 * N * d + N * N) * B * H * e


def _flash_ok(B, H, N, d, e):
    return 4 * N * d * B * H * e + 4 * B * H * N


SAVED_MISTAKES = [
    Mistake(
        "naive-forgot-p",
        "naive attention's N x N matrix P not counted",
        "The backward of out = P v needs P (dV = P^T dO, and dP -> dS needs P): autograd keeps "
        "the (B, H, N, N) matrix, N^2 B H e bytes, besides q, k and v.",
        _saved_with(lambda B, H, N, d, e: 3 * N * d * B * H * e, _flash_ok),
    ),
    Mistake(
        "scores-and-p",
        "both the scores S and P counted for naive attention",
        "softmax's backward needs only its output P (dS = P * (dP - rowsum(dP * P))), and the "
        "scaled scores feed nothing else that saves them: one N x N matrix, not two.",
        _saved_with(lambda B, H, N, d, e: (3 * N * d + 2 * N * N) * B * H * e, _flash_ok),
    ),
    Mistake(
        "forgot-lse",
        "the logsumexp lse not counted for flash attention",
        "The flash backward recomputes P = exp(S - lse) tile by tile: it keeps lse, one float32 "
        "per row, 4 B H N bytes, besides q, k, v and out.",
        _saved_with(_naive_ok, lambda B, H, N, d, e: 4 * N * d * B * H * e),
    ),
    Mistake(
        "lse-dtype",
        "lse counted in the inputs' dtype",
        "The kernels keep lse in float32 whatever the inputs' dtype (a bf16 lse would lose the "
        "precision the recomputed exp(S - lse) needs): 4 bytes per row.",
        _saved_with(_naive_ok, lambda B, H, N, d, e: 4 * N * d * B * H * e + B * H * N * e),
    ),
    Mistake(
        "forgot-out",
        "out not counted for flash attention",
        "The backward's D = rowsum(dO * O) needs the output O: flash keeps q, k, v AND out, "
        "4 N d B H e bytes, plus lse.",
        _saved_with(_naive_ok, lambda B, H, N, d, e: 3 * N * d * B * H * e + 4 * B * H * N),
    ),
    Mistake(
        "one-head-only",
        "the bytes of one head only",
        "Every (batch, head) pair has its own q, k, v, P (or out and lse): multiply by B H.",
        _saved_with(
            lambda B, H, N, d, e: (3 * N * d + N * N) * e,
            lambda B, H, N, d, e: 4 * N * d * e + 4 * N,
        ),
    ),
]


def _saved_cases(seed: int | None = 0, trials: int = 0) -> list[Case]:
    spec = [
        (1, 1, 4, 16, 4, "one head, N = 4, d = 16, float32"),
        (1, 1, 64, 16, 2, "one head, N = 64, d = 16, bfloat16"),
        (2, 3, 100, 32, 4, "B = 2, H = 3, N = 100, d = 32, float32"),
        (1, 2, 256, 64, 2, "B = 1, H = 2, N = 256, d = 64, bfloat16"),
        (1, 1, 40, 24, 8, "one head, N = 40, d = 24, float64"),
    ]
    rng = np.random.default_rng(seed)  # seed None: fresh sizes at every call (hidden tests)
    for t in range(trials):
        e = int(rng.choice([2, 4, 8]))
        spec.append(
            (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(8, 200)),
             int(rng.choice([16, 32, 64])), e, f"random sizes {t + 1} of {trials}")
        )  # fmt: skip
    focus = (
        "naive keeps q, k, v and P: (3 N d + N^2) B H e; flash keeps q, k, v, out and a float32 "
        "lse: 4 N d B H e + 4 B H N"
    )
    return [Case(s[5], s[:5], focus=focus) for s in spec]


def check_saved_bytes(fn, seed: int | None = 0, trials: int = 0) -> None:
    """Check saved_bytes(B, H, N, d, bytes_per_element) -> (naive, flash) against the bytes
    saved_tensors_hooks count for naive attention and the flash kernels' formula.

    trials: random sizes added after the fixed cases (from seed; None: fresh at every call)."""
    run_cases(
        "saved_bytes",
        fn,
        _saved_reference,
        _saved_cases(seed, trials),
        outputs=("naive", "flash"),
        mistakes=SAVED_MISTAKES,
        rtol=0.0,
        atol=0.5,
        low_precision_below=None,
        summary="naive measured with saved_tensors_hooks (float32, bfloat16, float64), "
        "batches and heads",
    )


def check_quick_saved_ratio(answer) -> None:
    """naive / flash saved bytes for one head, N = 8192, d = 64, bf16."""
    N, d, e = 8192, 64, 2
    naive, flash = (3 * N * d + N * N) * e, 4 * N * d * e + 4 * N
    hinted_answer(
        "naive / flash saved bytes (N = 8192, d = 64, bf16)",
        answer,
        naive / flash,
        [
            (N * N * e / flash, "naive also keeps q, k and v: (3 N d + N^2) e"),
            ((3 * N * d + N * N) * e / (4 * N * d * e), "flash also keeps lse: 4 N bytes "
             "[misconception: forgot-lse]"),
            ((3 * N * d + 2 * N * N) * e / flash, "softmax's backward needs P only, not the "
             "scores too [misconception: scores-and-p]"),
            (flash / naive, "that is flash / naive: the ratio the other way round"),
        ],
        "naive keeps (3 N d + N^2) e bytes per head, flash 4 N d e + 4 N",
    )  # fmt: skip
