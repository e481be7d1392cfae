"""How errors look to a student in a notebook: one line that says what to do, not a traceback.

Two kinds of error end most student runs, and neither needs a traceback:

    a stub not written yet     the `raise NotImplementedError()` that nbgrader puts in every
                               answer; shown as "✗ <function> is not written yet: ..."
    an answer never set        the NameError of a quick check's `answer_...` variable
    a check that fails         CheckFailure, whose message already names the smallest input,
                               both values and the likely mistake; shown as that message only

`install()` (run when course_utils is imported in IPython) registers the first with IPython;
CheckFailure renders itself (`_render_traceback_`). Any other error keeps its full traceback.
A stub that course code finds for the learner (a @triton.jit kernel still raising
NotImplementedError, found before or while it is launched) raises NotWrittenError, which names the
function and renders as the same one line.

A demo cell that runs after an exercise and uses its function (or what an earlier cell computed
with it) wraps its code in `with uses_exercises("exercise 1 (name)", ...):`. Whatever stops it
there, a stub, a wrong answer's error deep inside course code, a NameError of a variable that the
stopped cell above never set, an assert that the learner's numbers fail, shows as ONE line that
names the exercise (ExerciseNotReady), not as a traceback through course code.
"""

from __future__ import annotations

import contextlib
import types


def _in_notebook_cell(code: types.CodeType) -> bool:
    """True for code typed into a notebook cell (IPython compiles cells under these names)."""
    name = code.co_filename
    return name.startswith("<ipython-input-") or "/ipykernel_" in name or name.startswith("<cell")


def _not_written_line(name: str) -> str:
    return (
        f"✗ {name} is not written yet: replace `raise NotImplementedError()` in the cell that "
        f"defines {name} with your code, run that cell, then run this one again."
    )


class NotWrittenError(NotImplementedError):
    """An exercise's function (`name`) still holds nbgrader's stub; shown as one line.

    A NotImplementedError, so that everything which treats the stub as "not done yet" (the
    checks, the grader) still does; its message is the one line IPython shows.
    """

    def __init__(self, name: str):
        super().__init__(_not_written_line(name).removeprefix("✗ "))
        self.name = name

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


class ExerciseNotReady(RuntimeError):
    """A cell that depends on exercises stopped because one of them is not written or not right.

    exercises: how the notebook names them, e.g. ("exercise 2 (count_flash_forward)",).
    cause: the exception that stopped the cell, summarized in the one line.
    """

    def __init__(self, exercises: tuple[str, ...], cause: BaseException):
        names = " and ".join(exercises)
        if isinstance(cause, NotWrittenError):
            why = f"{cause.name} is not written yet"
        elif isinstance(cause, NotImplementedError) and not cause.args:
            why = "a function it uses is not written yet"
        else:
            first = (str(cause).strip().splitlines() or [""])[0]
            why = type(cause).__name__ + (f": {first}" if first else "")
        super().__init__(
            f"this cell uses {names}, which is not finished or not right yet ({why}). Run its "
            f"check cell, fix what it says, then run this cell again."
        )
        self.exercises = exercises
        self.cause = cause

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


@contextlib.contextmanager
def uses_exercises(*exercises: str):
    """Run a cell's code that needs the named exercises; any error becomes one ExerciseNotReady
    line naming them (KeyboardInterrupt and SystemExit pass through)."""
    if not exercises or not all(isinstance(e, str) and e for e in exercises):
        raise ValueError(f"exercises: expected names such as 'exercise 1 (f)', got {exercises!r}")
    try:
        yield
    except ExerciseNotReady:
        raise
    except Exception as exc:
        raise ExerciseNotReady(exercises, exc) from None


def not_written_message(tb: types.TracebackType | None) -> str | None:
    """The one-line message for a bare NotImplementedError raised in a notebook cell, or None."""
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    if frame is None or not _in_notebook_cell(frame.f_code):
        return None
    name = frame.f_code.co_name
    if name == "<module>":
        return (
            "✗ this answer is not written yet: replace `raise NotImplementedError()` in its cell "
            "with your answer (the comment above it names the variable to set), then run it."
        )
    return _not_written_line(name)


def unset_answer_message(value: BaseException) -> str | None:
    """The one-line message for a quick check whose answer variable was never set, or None."""
    name = getattr(value, "name", None)
    if not isinstance(value, NameError) or not name or not name.startswith("answer_"):
        return None
    return (
        f"✗ {name} is not set yet: write your answer in the cell above that sets {name} "
        f"(it still says `raise NotImplementedError()`), run it, then run this one again."
    )


def _handler(shell, etype, value, tb, tb_offset=None):
    """IPython's custom-exception hook: it must show the error itself (as an error output)."""
    if isinstance(value, NameError):
        message = unset_answer_message(value)
    elif hasattr(value, "_render_traceback_"):  # NotWrittenError: it names the function itself
        message = "\n".join(value._render_traceback_())
    else:
        message = not_written_message(tb) if not value.args else None
    if message is None:  # not a stub: the usual traceback
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    else:
        stb = [message]
    shell._showtraceback(etype, value, stb)
    return stb


def install() -> bool:
    """Register the one-line stub message with the running IPython shell; False outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    shell.set_custom_exc((NotImplementedError, NameError), _handler)
    return True
