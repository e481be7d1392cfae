"""Shared test settings: the hypothesis profiles.

"ci" (the default) keeps the property tests fast (the softmax, attention and validation files
run in well under a minute on two cores) while still exploring fresh examples on every run;
a failure prints the blob that replays it (@reproduce_failure). Choose another profile with
HYPOTHESIS_PROFILE=thorough (many more examples, for a change to the algorithms) or
HYPOTHESIS_PROFILE=repro (derandomized: the same examples every run).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest
from hypothesis import settings


def _use_triton_interpreter_without_gpu() -> None:
    """Triton needs TRITON_INTERPRET=1 before its first import on a machine without a CUDA GPU."""
    if "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_use_triton_interpreter_without_gpu()

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=False, print_blob=True)
settings.register_profile("repro", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@contextlib.contextmanager
def _resource_warnings_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """ResourceWarnings stay ignored, as Python ignores them by default, in files that turn
    warnings into errors (filterwarnings("error")): the garbage collector may close another
    file's leftovers (a Jupyter kernel client's zmq sockets) during any test, whichever files
    pytest-xdist gives the same worker, and that is no fault of the test it happens in."""
    with _resource_warnings_ignored():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _resource_warnings_ignored():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _resource_warnings_ignored():
        return (yield)
