"""Notebook 11's backend of the check's own, handed to the learner's attention block.

    check_backend(q, k, v, causal) -> (B, H, N, d)   causal attention of the scores times 3
                                                     when called as the course's kernel is
                                                     (q, k, v of shape (B, H, N, d), causal=True);
                                                     the negated scores when called any other way

Its output differs from every other backend's, so a block that calls what it is given is told
apart from one that computes attention its own way. It travels to a graded kernel by name
(checks.engine.wire.travels): the kernel runs this very function. checks.capstone replays it.
"""

from __future__ import annotations

import math

from course_utils.checks.engine.wire import travels

__all__ = ["BACKEND_SHARPNESS", "check_backend"]


def _torch():
    import torch

    return torch


def _attend(q, k, v, causal):
    """float64 causal attention of (B, H, N, d) tensors, scale 1/sqrt(d), in the check's own
    torch ops (the replays must not depend on the backend the learner is given)."""
    torch = _torch()
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, dim=-1) @ v


# the check's backend multiplies the scores by 3: a softmax of its own (not 2: with d = 4, a q
# divided by sqrt(d) before it would give naive attention back)
BACKEND_SHARPNESS = 3.0


def _sharp_attend(q, k, v, causal):
    """What the check's backend returns: causal attention of scores 3 q k^T / sqrt(d)."""
    return _attend(q * BACKEND_SHARPNESS, k, v, causal)


def _misused(q, k, v):
    """What check_backend returns when it is not called on (B, H, N, d) tensors with
    causal=True: causal attention of the negated scores, far from every other replay."""
    return _attend(-q, k, v, True)


@travels
def check_backend(q, k, v, causal):
    """The check's own backend, attention(q, k, v, causal) -> out of shape (B, H, N, d).

    Called as the course's kernel requires (q, k, v of shape (B, H, N, d), causal=True) it
    returns causal attention of the scores times 3 (_sharp_attend): not attention's, so a block
    that uses it returns something no block computing attention another way (always naive,
    SDPA called directly, softmax written inline) returns. Called any other way (heads folded
    into (B * H, N, d), causal=False) it returns the scores times -1 (_misused). Every judgement
    comes from the values the block returns, so the learner's block may run in another process
    (the graded kernel): the function travels by name (engine.wire.travels); checks.capstone
    allows it (ALLOWED).
    """
    if all(getattr(t, "ndim", None) == 4 for t in (q, k, v)) and causal is True:
        return _sharp_attend(q, k, v, causal)
    return _misused(q, k, v)
