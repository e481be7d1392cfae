"""Notebook 09's comparisons: a learner's output against the float64 reference, and a failure's
lines.

    _as_array(x) -> np.ndarray                 a torch tensor or an array, as float64 NumPy
    _error(yours, expected) -> float           relative error in norm (inf for NaN or a shape)
    _failure(name, label, inputs, what, ...)   the failure message: the worst row, the mistake
    _diagnose(which, yours, args, expected, mistakes, tol, match_tol)
                                               the mistake whose replay matches, or None
"""

from __future__ import annotations

import math

import numpy as np

from course_utils.checks.engine.feedback import closest_mistake, mismatch_lines


# ---- comparing -----------------------------------------------------------------------------------
def _as_array(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.double().numpy()
    return np.asarray(x, dtype=np.float64)


def _error(yours: np.ndarray, expected: np.ndarray) -> float:
    """Relative error of the finite part; inf when shapes, -inf places or NaN differ."""
    if yours.shape != expected.shape or np.isnan(yours).any():
        return math.inf
    inf_e = np.isinf(expected)
    if not np.array_equal(np.isinf(yours), inf_e) or (yours[inf_e] != expected[inf_e]).any():
        return math.inf
    y, e = yours[~inf_e], expected[~inf_e]
    if y.size == 0:
        return 0.0
    return float(np.linalg.norm(y - e) / max(np.linalg.norm(e), 1e-30))


_ROWS = {  # the leading axes of each output, named in a failure message
    "out_partial": ("batch", "head", "split"),
    "lse_partial": ("batch", "head", "split"),
    "out": ("batch", "head"),
    "lse": ("batch", "head"),
}


def _failure(name, label, inputs, what, yours, expected, err, tol, mistake, focus) -> str:
    lines = [f"✗ {name} is wrong on {label}.", f"  input:    {inputs}"]
    rows = _ROWS.get(what, ("batch", "head", "split"))
    return "\n".join(
        lines + mismatch_lines(what, yours, expected, err, tol, mistake, focus, rows=rows)
    )


def _diagnose(which, yours, args, expected, mistakes, tol, match_tol):
    replays = (
        (mistake, (theirs,))
        for mistake in mistakes
        for theirs in [mistake.fn(*args)[which]]
        if _error(theirs, expected) >= tol  # right on this case: not what went wrong
    )
    return closest_mistake((yours,), replays, match_tol)
