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


def pytest_configure(config):
    """Each pytest-xdist worker gets its share of the cores for torch's, OpenBLAS's and MKL's
    threads, as each notebook graded at once does (graders/run/threads.py): set here, in the
    controller, before it starts the workers, so that each worker and every process it starts
    (a notebook's kernel, a Jupyter server's, a grading run's) reads it at its first import of
    torch or numpy. Two workers on two cores, each with torch's two threads, spun."""
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    from graders.run.threads import share_environment, thread_share

    share_environment(thread_share(workers))


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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` keeps each `xdist_group` on one worker, as it did before pytest 9.2.

    pytest-xdist marks a grouped test by adding "@<group>" to its node id on the worker, and the
    controller schedules by that suffix. pytest 9.2 keeps the node id in `_id` (a NodeId), so
    xdist's change no longer takes and the groups are silently ignored (pytest-dev/pytest-xdist
    #1386): a module's class fixture (the hub, the exchange class) was then built on one worker
    while the other waited on its lock with nothing to do. Where xdist's suffix is missing, it is
    set here the way pytest 9.2 reads it. The groups are listed in the test files'
    `pytestmark`; each group's tests run on one worker, the other worker goes on meanwhile."""
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest before 9.2: xdist's own suffix works
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
