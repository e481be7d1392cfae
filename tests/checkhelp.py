"""Helpers shared by the tests of the learner-facing checks (tests/checks/test_checks_*.py)."""

from __future__ import annotations

import contextlib
import io
import warnings

from course_utils.checks import CheckFailure
from course_utils.checks.engine.failures import misconception_slug


def as_learner(fn):
    """A buggy implementation of a checks module, wrapped so it looks like a learner's own."""

    def learner(*args, **kwargs):
        return fn(*args, **kwargs)

    # the replays live in course_utils, whose every function the reference watch counts
    learner.__course_test_double__ = True
    return learner


def run_quietly(check, *args, **kwargs) -> str:
    """Run a check; return its stdout; fail on stderr output or on any warning."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        check(*args, **kwargs)
    assert err.getvalue() == ""
    return out.getvalue()


def slug_of(failure: CheckFailure) -> str | None:
    """The misconception a failure message names, or None."""
    return misconception_slug(str(failure))


# Debian's Chromium as root on a closed network: without the background-networking flags its
# connections are refused many at a time (tests/browser/test_browser.py, tests/hub/test_hub.py)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
