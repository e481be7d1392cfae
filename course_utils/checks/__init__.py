"""Learner-facing checks: one pass line, or a failure that names the mistake.

The machinery is in _core; each notebook's checks live in a module named after its topic.
"""

from course_utils.checks._core import Case, CheckFailure, Mistake, check_answer, run_cases

__all__ = ["Case", "CheckFailure", "Mistake", "check_answer", "run_cases"]
