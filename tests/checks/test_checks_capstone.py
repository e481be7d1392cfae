"""The checks of notebook 11: right answers pass, each named mistake is recognised by its slug."""

from __future__ import annotations

import math

import pytest
import torch
from checkhelp import as_learner, run_quietly, slug_of

from course_utils.checks import capstone as checks
from course_utils.checks.engine.failures import CheckFailure
from course_utils.references import gpt

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


def attention_block_einsum_style(x, w_qkv, w_out, n_heads, attention):
    """A third style: einsum projections per head from a reshaped weight; heads merged by
    permute, contiguous and view; the backend called with a keyword."""
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    d = D // n_heads
    w = w_qkv.reshape(D, 3, n_heads, d)  # columns: q | k | v, each H heads of d
    q, k, v = torch.einsum("bnD,Dthd->tbhnd", x, w).unbind(0)  # each (B, H, N, d)
    out = attn(q, k, v, causal=True)
    return out.permute(0, 2, 1, 3).contiguous().view(B, N, D) @ w_out


def attention_block_per_head(x, w_qkv, w_out, n_heads, attention):
    """A fourth style: one backend call per head, on (B, 1, N, d) slices, heads concatenated."""
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    d = D // n_heads
    qkv = x @ w_qkv
    heads = []
    for h in range(n_heads):
        q, k, v = (qkv[:, None, :, i * D + h * d : i * D + (h + 1) * d] for i in range(3))
        heads.append(attn(q, k, v, True)[:, 0])  # (B, N, d)
    return torch.cat(heads, dim=-1) @ w_out


# blocks that compute attention themselves: right numbers with the course's backends (float64)
def always_naive(x, w_qkv, w_out, n_heads, attention):
    return attention_block(x, w_qkv, w_out, n_heads, "naive")


def sdpa_directly(x, w_qkv, w_out, n_heads, attention):
    B, N, D = x.shape
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, N, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(B, N, D) @ w_out


def softmax_inline(x, w_qkv, w_out, n_heads, attention):
    B, N, D = x.shape
    d = D // n_heads
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (t.reshape(B, N, n_heads, d).permute(0, 2, 1, 3) for t in (q, k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    s = s.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool), 1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ v
    return out.permute(0, 2, 1, 3).reshape(B, N, D) @ w_out


def calls_but_discards(x, w_qkv, w_out, n_heads, attention):
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, N, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))
    attn(q, k, v, True)  # called, and then the naive answer used
    out = gpt.resolve_attention("naive")(q, k, v, True)
    return out.transpose(1, 2).reshape(B, N, D) @ w_out


def folded_heads(x, w_qkv, w_out, n_heads, attention):
    """batch and heads folded into one axis: (B * H, N, d), which only naive attention takes."""
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    d = D // n_heads
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (
        t.view(B, N, n_heads, d).transpose(1, 2).reshape(B * n_heads, N, d) for t in (q, k, v)
    )
    out = attn(q, k, v, True).view(B, n_heads, N, d)
    return out.transpose(1, 2).reshape(B, N, D) @ w_out


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
    styles = (
        attention_block,
        attention_block_einops_style,
        attention_block_einsum_style,
        attention_block_per_head,
    )
    for fn in styles:
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


@pytest.mark.parametrize(
    "fn",
    [always_naive, sdpa_directly, softmax_inline, calls_but_discards],
    ids=lambda f: f.__name__,
)
def test_a_block_that_does_not_use_its_backend_is_named(fn):
    assert "✓" in run_quietly(checks.check_attention_block, attention_block)
    with pytest.raises(CheckFailure) as info:
        run_quietly(checks.check_attention_block, fn)
    assert slug_of(info.value) == "ignores-attention-backend", str(info.value)
    assert "attention = check_backend" in str(info.value)  # its name, not an address


def test_a_backend_called_on_folded_heads_is_named():
    with pytest.raises(CheckFailure) as info:
        run_quietly(checks.check_attention_block, folded_heads)
    assert slug_of(info.value) == "attention-input-shape", str(info.value)
    assert "(B, H, N, d)" in str(info.value) and "check_backend" in str(info.value)


def test_the_check_backend_differs_from_naive_and_from_its_misuse():
    backend = checks.check_backend
    naive = gpt.resolve_attention("naive")
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3))
    ours = backend(q, k, v, True)
    assert not torch.allclose(ours, naive(q, k, v, True))
    assert torch.allclose(ours, naive(3 * q, k, v, True))
    # called any other way: heads folded into (B * H, N, d), causal=False, causal=1
    folded = backend(*(t.reshape(2, 4, 3) for t in (q, k, v)), True).reshape(1, 2, 4, 3)
    for misuse in (folded, backend(q, k, v, False), backend(q, k, v, 1)):
        assert torch.allclose(misuse, naive(-q, k, v, True))
        assert not torch.allclose(misuse, ours) and not torch.allclose(misuse, naive(q, k, v, True))
    assert checks._attend_for(backend) is checks._sharp_attend


def test_no_two_replays_agree_on_the_backend_case():
    """On the case with check_backend, every replay gives its own output (none is right and no
    two tie): the first that matches is the only one that matches."""
    (case,) = [c for c in checks._block_cases() if c.args[-1] is checks.check_backend]
    expected = checks._block_reference(*case.args)
    outs = [(m.slug, m.fn(*case.args)) for m in checks.BLOCK_MISTAKES]
    for i, (slug, out) in enumerate(outs):
        assert not torch.allclose(torch.as_tensor(out), torch.as_tensor(expected)), slug
        for other, theirs in outs[i + 1 :]:
            assert not torch.allclose(torch.as_tensor(out), torch.as_tensor(theirs)), (slug, other)


def test_the_check_backend_travels_by_name_only_when_marked(tmp_path):
    from course_utils.checks.engine import wire as _wire

    _wire.save(tmp_path / "f.npz", ("naive", checks.check_backend))
    assert _wire.load(tmp_path / "f.npz")[1] is checks.check_backend
    for unmarked in (checks._sharp_attend, attention_block, lambda q, k, v, c: q):
        with pytest.raises(_wire.WireError, match="function"):
            _wire.save(tmp_path / "g.npz", unmarked)
    forged = ({"__function__": "course_utils.harness.capstone_backend:_sharp_attend"}, {})
    with pytest.raises(_wire.WireError, match="not marked"):
        _wire.decode(*forged)
    with pytest.raises(_wire.WireError, match="not a course_utils"):
        _wire.decode({"__function__": "os:system"}, {})


def test_a_fixed_backend_and_the_course_block_are_caught():
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
