"""What a check raises and names: CheckFailure, a Mistake (a misconception with a buggy
implementation that shows it), and the mistakes every check can name.

    CheckFailure                     a wrong result; its message is the feedback
    ReferenceUnavailable             a course reference switched off while a submission is graded
    Mistake(slug, title, explanation, fn)
    misconception_slug(text)         the slug of a message's `[misconception: slug]` tag
    MUTATES_INPUT, FOREIGN_ARRAYS, DISABLES_CHECK, NAN_MISTAKE, LOW_PRECISION_MISTAKE,
    CALLS_REFERENCE                  the mistakes of any exercise (fn returns nothing)

The tag ``[misconception: <slug>]`` in a failure message lets the graders count misconceptions
in a class.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class CheckFailure(AssertionError):
    """A check found a wrong result; the message explains what and why.

    In a notebook it shows as its message alone: the frames inside the checks would only hide
    what the message says (IPython calls _render_traceback_ instead of printing a traceback).
    """

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines() or [type(self).__name__]


class ReferenceUnavailable(RuntimeError):
    """Raised by a course reference that is switched off (while a submission is graded)."""


_SLUG = re.compile(r"\[misconception: ([A-Za-z0-9_-]+)\]")


def misconception_slug(text: str) -> str | None:
    """The slug of the first `[misconception: slug]` tag in a failure message, or None."""
    found = _SLUG.search(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Mistake:
    """A known misconception and a buggy implementation that shows it.

    fn has the exercise's signature; when the learner's output matches fn's output on the failing
    case, the failure message names the mistake and explains the fix.
    """

    slug: str  # short id, e.g. "plain-average"
    title: str  # one line, e.g. "plain average in the merge"
    explanation: str  # why it is wrong and what to do instead
    fn: Callable = field(repr=False, compare=False)


MUTATES_INPUT = Mistake(
    slug="mutates-input",
    title="the function changes an input array in place",
    explanation=(
        "Your function writes into an array it was given (x -= shift, o1 *= w, Q *= tau, "
        "dP -= D). The caller still needs that array: the check hands you read-only copies to "
        "catch this. Compute into a new array (x = x - shift) or copy first (x = x.copy())."
    ),
    fn=lambda *a, **k: None,
)

FOREIGN_ARRAYS = Mistake(
    slug="array-library-in-numpy-exercise",
    title="a NumPy exercise computed with another array library",
    explanation=(
        "The exercise's memory budget counts what NumPy allocates (tracemalloc); torch, JAX, "
        "CuPy, TensorFlow, Numba and MLX allocate outside its sight, so it cannot tell a tiled "
        "computation from one that builds the forbidden array. Write it with NumPy arrays: the "
        "point is the algorithm, which a fused library call would hide."
    ),
    fn=lambda *a, **k: None,
)


def _array_library_message(name: str, libraries: Sequence[str]) -> str:
    """The failure of a memory-budgeted call that used torch, JAX, ... (_array_libraries)."""
    return (
        f"✗ {name} computes with {' and '.join(libraries)} in a NumPy exercise, where the memory "
        f"budget sees only NumPy's arrays.\n"
        f"  likely mistake: {FOREIGN_ARRAYS.title} [misconception: {FOREIGN_ARRAYS.slug}]\n"
        f"  {FOREIGN_ARRAYS.explanation}"
    )


DISABLES_CHECK = Mistake(
    slug="disables-check",
    title="the function switches off the check's instrumentation",
    explanation=(
        "The check watches which functions your code calls; setting sys.setprofile (or settrace) "
        "inside the exercise turns that off. Leave the interpreter's hooks alone."
    ),
    fn=lambda *a, **k: None,
)

NAN_MISTAKE = Mistake(
    slug="nan-masked",
    title="NaN from a fully masked row or an empty set",
    explanation=(
        "exp(-inf - (-inf)) is NaN. When the running max (or an lse) is still -inf, the rescale "
        "factor must be 0 and the row must stay empty: subtract a finite stand-in "
        "(np.where(m == -inf, 0, m)) instead of -inf. An empty set has weight 0, o = 0, lse = -inf."
    ),
    fn=lambda *a, **k: None,
)


LOW_PRECISION_MISTAKE = Mistake(
    slug="low-precision",
    title="running statistics kept in low precision",
    explanation=(
        "Your result is close but not exact, as when m, l, acc or lse are kept in float16, "
        "bfloat16 or float32. Keep the running statistics in float64 here (float32 on a GPU, "
        "never bf16): they sum many terms, and bf16 has only about 3 significant digits."
    ),
    fn=lambda *a, **k: None,
)

CALLS_REFERENCE = Mistake(
    slug="calls-reference",
    title="the answer calls the course's own code",
    explanation=(
        "The exercise is to write the algorithm yourself; calling a course_utils function "
        "(a reference, a figure's or a check's helper) scores 0. Use them only to compare, as the "
        "notebook does."
    ),
    fn=lambda *a, **k: None,
)


def calls_reference(fn: Callable) -> bool:
    """True when fn is (or wraps without change) a function of the course_utils package."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", "") or ""
    return module == "course_utils" or module.startswith("course_utils.")
