"""Triton that Triton's CPU interpreter refuses: one line that says so, and how to write it.

The kernel checks of notebooks 06, 08 and 09 turn a learner's raised error into a message
(engine.kernels._raised_failure). Some errors are not the learner's mistake: the code compiles and
runs on a GPU, but the interpreter (TRITON_INTERPRET=1, Triton 3.x on a CPU) works on NumPy
values and refuses it. `interpreter_limit(text)` recognizes the known forms in the error's text
and returns the line to show, or None:

    mask has unsupported dtype           a mask that combines a scalar condition with a vector
                                         one: (offs < n) & (start < n)
    Shape element 0 must have type       a shape taken from a tensor inside the kernel
      constexpr[int]                     (H = q.shape[0]) and used to build another: refused
                                         by the GPU's compiler too (Triton 3.6 on the H200),
                                         so its line says so rather than "it runs on a GPU"
    'int' object has no attribute 'to'   .to() on a loop index or a number made from one:
                                         (start // PAGE_SIZE).to(tl.int64)
"""

from __future__ import annotations

__all__ = ["INTERPRETER_LIMITS", "interpreter_limit"]

_PREFIX = "this is valid Triton that Triton's CPU interpreter refuses (it runs on a GPU): "
_BOTH = "Triton's CPU interpreter and its GPU compiler both refuse this: "

# (a piece of the error's text, what cannot be done and how to write it, the line's start)
INTERPRETER_LIMITS = (
    (
        "mask has unsupported dtype",
        "a mask that combines a scalar condition with a vector one, such as (offs < n) & "
        "(start < n). Make the scalar a vector of the tile's shape first: "
        "(offs < n) & (start + offs * 0 < n), or test the scalar with an `if` around the load.",
        _PREFIX,
    ),
    (
        "must have type `constexpr[int]`",
        "a size read from a tensor inside the kernel (H = q.shape[0]) used as a shape. Pass it "
        "as a tl.constexpr argument from the launcher (H: tl.constexpr, H=q.shape[1]) or use the "
        "constexpr it came from (BLOCK_M).",
        _BOTH,
    ),
    (
        "'int' object has no attribute 'to'",
        ".to(...) on a loop index or a number computed from one, such as "
        "(start // PAGE_SIZE).to(tl.int64): in the interpreter it is a Python int. Write "
        "tl.cast(start // PAGE_SIZE, tl.int64), which both accept.",
        _PREFIX,
    ),
)


def interpreter_limit(text: str) -> str | None:
    """The one line for an error whose text (every message of its chain, joined) shows a known
    limit of the interpreter; None for any other error."""
    for piece, advice, start in INTERPRETER_LIMITS:
        if piece in text:
            return start + advice
    return None
