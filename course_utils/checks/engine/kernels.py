"""A learner's Triton kernel run by a check (notebooks 06, 08 and 09): what it raised, in a few
lines, and nothing on stderr.

    _raised_failure(name, case, exc, dot_hint=)  the CheckFailure for a kernel that did not
                                                 compile or run: the innermost error, where;
                                                 a load or store outside a tensor (the
                                                 interpreter's bounds guard); valid Triton the
                                                 interpreter refuses (interpreter_limits)
    _nothing_on_stderr()                         a context: warnings, sys.stderr and file
                                                 descriptor 2 silenced (any stderr costs a
                                                 graded cell its points)
    _rel_err(yours, expected)                    ||yours - expected|| / ||expected||
    DOT_DTYPE, _dtype_hint(exc)                  tl.dot given operands of two dtypes
    HALF_STATE_TITLE, HALF_STATE_EXPLANATION     the words of `half-precision-state`, shared
                                                 by the forward, backward and decode kernels

case: any object with a `label` and a `describe()` (the notebook's own case type).
Nothing here computes an answer.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import tempfile
import warnings

import numpy as np

from course_utils.checks.engine.failures import CheckFailure, Mistake
from course_utils.checks.engine.interpreter_limits import interpreter_limit

DOT_DTYPE = Mistake(
    "dot-dtype-mismatch",
    "tl.dot gets a float32 p and a float16 (or bfloat16) v",
    "tl.dot needs two operands of one dtype. p is float32 (it comes from exp2 of float32 "
    "scores) and v has the input's dtype: cast p first, tl.dot(p.to(v.dtype), v). The "
    "accumulator stays float32.",
    None,
)


HALF_STATE_TITLE = "the running max, sum or accumulator is kept in float16 (the inputs' dtype)"
HALF_STATE_EXPLANATION = (
    "m_i, l_i and acc must be float32 whatever the inputs' dtype: tl.full(..., dtype=tl.float32) "
    "and tl.zeros(..., dtype=tl.float32). In float16 each tile's update rounds them to 11 bits, "
    "and over a long row of keys those roundings add up; only the tiles loaded (q, k, v, and p "
    "for tl.dot) are in the inputs' dtype, and out is cast once, at the store."
)


def _rel_err(yours: np.ndarray, expected: np.ndarray) -> float:
    """||yours - expected|| / ||expected||; inf if yours has a NaN or an infinity."""
    if yours.shape != expected.shape or not np.isfinite(yours).all():
        return math.inf
    return float(np.linalg.norm(yours - expected) / max(np.linalg.norm(expected), 1e-300))


_OUT_OF_BOUNDS = ("store-out-of-bounds:", "load-out-of-bounds:")


def _raised_failure(name, case, exc, dot_hint: str | None = None) -> CheckFailure:
    """The learner's kernel did not compile or run: the innermost error, where it happened.

    dot_hint: the cast that fixes tl.dot's operands of two dtypes in this kernel (default the
    forward's, `tl.dot(p.to(v.dtype), v)`).

    A load or store outside the launch's tensors (course_utils.harness.triton_bounds'
    OutOfBoundsError, or its message when it comes from a notebook's kernel while a submission
    is graded) is the failure itself: its message names the tensor, the program, the elements
    and the mask, and its `[misconception: ...]` tag the mistake (store-unmasked,
    mask-one-dimension, mask-missing) when the mask makes it clear. Valid Triton that the
    interpreter refuses (interpreter_limits) is said to be the interpreter's limit, in one line
    with the way to write it that runs in both.
    """
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:  # outer call site first, root cause last
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__
    stray = [e for e in chain if str(e).startswith(_OUT_OF_BOUNDS)]
    if stray:
        text = "\n    ".join(str(stray[-1]).splitlines())
        return CheckFailure(
            f"✗ {name}: your kernel reached outside a tensor on {case.label}; the interpreter "
            f"stopped it before the access.\n  input: {case.describe()}\n    {text}"
        )
    where = [e for e in chain if type(e).__name__ == "CompilationError"]
    root = chain[-1]
    text = f"{type(root).__name__}: {root}".strip()
    if type(root).__name__ == "InterpreterError" or not str(root).strip():
        text = f"{type(root).__name__}: {root!r}"
    if where and where[-1] is not root:  # the compiler's excerpt of the line that failed
        lines = str(where[-1]).strip().splitlines()
        text = "\n".join(lines[-8:]) + "\n" + text
    lines = text.splitlines()
    short = "\n    ".join(lines[-14:])
    everything = " ".join(str(e) for e in chain)
    hint = ""
    limit = interpreter_limit(everything)
    if limit is not None:  # valid Triton: the interpreter's limit, said first, in one line
        return CheckFailure(
            f"✗ {name}: {limit}\n  on {case.label}; input: {case.describe()}\n    {short}"
        )
    if "same dtype" in everything:
        hint = "\n  hint: tl.dot needs two operands of one dtype; " + (
            dot_hint or "p is float32 and v is the input's dtype: tl.dot(p.to(v.dtype), v)."
        )
    return CheckFailure(
        f"✗ {name}: your kernel raised an error on {case.label}.\n  input: {case.describe()}\n"
        f"    {short}{hint}"
    )


@contextlib.contextmanager
def _nothing_on_stderr():
    """While the block runs, nothing reaches stderr: in a graded cell any stderr costs the cell.

    Silenced: Python warnings (Triton 3.9 warns once, at its first compile, that
    TRITON_DEFAULT_FP_FUSION is unset), NumPy's floating-point warnings (a wrong kernel's NaN),
    sys.stderr, and file descriptor 2, where the compiler's C++ code writes and which a Jupyter
    kernel forwards to the notebook as a stderr stream.
    """
    saved, sink = None, None
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        sink = tempfile.TemporaryFile()
        os.dup2(sink.fileno(), 2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 here: Python-level only
        if saved is not None:
            os.close(saved)
        saved = None
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stderr(io.StringIO()),
            np.errstate(all="ignore"),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
        if sink is not None:
            sink.close()


def _dtype_hint(exc) -> str:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(str(exc))
        exc = exc.__cause__
    if any("same dtype" in text for text in chain):
        return (
            f"\n  likely mistake: {DOT_DTYPE.title} [misconception: {DOT_DTYPE.slug}]\n"
            f"  {DOT_DTYPE.explanation}"
        )
    return ""
