"""The checks of notebook 11: right answers pass, each named mistake is recognised by its slug."""

from __future__ import annotations

import math

import pytest
import torch
from checkhelp import as_learner, run_quietly, slug_of

from course_utils import gpt
from course_utils.checks import capstone as checks
from course_utils.checks._core import CheckFailure

# ---------------------------------------------------------------------------------------------
# attention_block as learners write it
# ---------------------------------------------------------------------------------------------


def attention_block(x, w_qkv, w_out, n_heads, attention):
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, N, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))
    return attn(q, k, v, True).transpose(1, 2).reshape(B, N, D) @ w_out


def attention_block_einops_style(x, w_qkv, w_out, n_heads, attention):
    """Another style: chunk, unflatten and permute; the merge by flatten."""
    attn = gpt.resolve_attention(attention)
    q, k, v = (x @ w_qkv).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3) for t in (q, k, v))
    out = attn(q, k, v, causal=True)
    return torch.matmul(out.permute(0, 2, 1, 3).flatten(2), w_out)


def _block(merge=True, causal=True, prescale=False):
    def block(x, w_qkv, w_out, n_heads, attention):
        attn = gpt.resolve_attention(attention)
        B, N, D = x.shape
        q, k, v = (x @ w_qkv).split(D, dim=-1)
        q, k, v = (t.view(B, N, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))
        if prescale:
            q = q * (D // n_heads) ** -0.5
        out = attn(q, k, v, causal)
        out = out.transpose(1, 2).reshape(B, N, D) if merge else out.reshape(B, N, D)
        return out @ w_out

    return block


def test_right_blocks_pass():
    for fn in (attention_block, attention_block_einops_style):
        assert "✓ attention_block" in run_quietly(checks.check_attention_block, fn)
    assert "✓" in run_quietly(checks.check_attention_block, attention_block, seed=None, trials=3)


@pytest.mark.parametrize(
    "fn, slug",
    [
        (_block(merge=False), "heads-merged-wrong"),
        (_block(causal=False), "causal-not-passed"),
        (_block(prescale=True), "scale-applied-twice"),
    ],
)
def test_learner_style_mistakes_are_named(fn, slug):
    with pytest.raises(CheckFailure) as info:
        run_quietly(checks.check_attention_block, fn)
    assert slug_of(info.value) == slug, str(info.value)


@pytest.mark.parametrize("mistake", checks.BLOCK_MISTAKES, ids=lambda m: m.slug)
def test_every_block_replay_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_attention_block(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_a_fixed_backend_and_the_course_block_are_caught():
    def always_naive(x, w_qkv, w_out, n_heads, attention):
        return attention_block(x, w_qkv, w_out, n_heads, "naive")

    run_quietly(checks.check_attention_block, always_naive)  # naive == sdpa in float64: passes

    def borrows(x, w_qkv, w_out, n_heads, attention):
        return gpt.attention_block(x, w_qkv, w_out, n_heads, attention)

    with pytest.raises(CheckFailure) as info:
        checks.check_attention_block(borrows)
    assert slug_of(info.value) == "calls-reference"

    def wrong_shape(x, w_qkv, w_out, n_heads, attention):
        return attention_block(x, w_qkv, w_out, n_heads, attention)[:, :-1]

    with pytest.raises(CheckFailure, match="shape"):
        checks.check_attention_block(wrong_shape)


def test_a_block_that_raises_is_reported_with_its_input():
    def broken(x, w_qkv, w_out, n_heads, attention):
        raise RuntimeError("shapes do not match")

    with pytest.raises(CheckFailure, match="raised RuntimeError: shapes do not match on one head"):
        checks.check_attention_block(broken)


# ---------------------------------------------------------------------------------------------
# saved_bytes
# ---------------------------------------------------------------------------------------------


def saved_bytes(B, H, N, d, bytes_per_element):
    e = bytes_per_element
    return (3 * N * d + N * N) * B * H * e, 4 * N * d * B * H * e + 4 * B * H * N


def saved_bytes_per_head(B, H, N, d, bytes_per_element):
    heads = B * H
    naive = heads * bytes_per_element * N * (3 * d + N)
    flash = heads * N * (4 * d * bytes_per_element + 4)
    return naive, flash


def test_right_saved_bytes_pass():
    for fn in (saved_bytes, saved_bytes_per_head):
        assert "✓ saved_bytes" in run_quietly(checks.check_saved_bytes, fn)
    assert "✓" in run_quietly(checks.check_saved_bytes, saved_bytes, seed=None, trials=3)


@pytest.mark.parametrize("mistake", checks.SAVED_MISTAKES, ids=lambda m: m.slug)
def test_every_saved_bytes_mistake_is_named(mistake):
    with pytest.raises(CheckFailure) as info:
        checks.check_saved_bytes(as_learner(mistake.fn))
    assert slug_of(info.value) == mistake.slug, str(info.value)


def test_the_reference_is_the_measurement():
    # the check's expected naive bytes come from the hooks, and agree with the formula
    for B, H, N, d, e in [(1, 1, 4, 16, 4), (1, 2, 256, 64, 2), (1, 1, 40, 24, 8)]:
        assert checks._saved_reference(B, H, N, d, e) == gpt.saved_bytes_formula(B, H, N, d, e)


def test_quick_saved_ratio():
    N, d = 8192, 64
    right = (3 * N * d + N * N) * 2 / (4 * N * d * 2 + 4 * N)
    assert "✓" in run_quietly(checks.check_quick_saved_ratio, right)
    with pytest.raises(CheckFailure, match="forgot-lse"):
        checks.check_quick_saved_ratio((3 * N * d + N * N) / (4 * N * d))
    with pytest.raises(CheckFailure, match="other way round"):
        checks.check_quick_saved_ratio(1 / right)
    assert math.isfinite(right)
