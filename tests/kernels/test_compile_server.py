"""The compile servers of cross_compile (course_utils/triton_attention/compile_server.py): started
once, each batch in a fork that imports its modules afresh, a failure named, a dead server
replaced.

The servers here run a small work function instead of Triton's compiler (the sm_90 and sm_75
builds in test_triton_backward_ws.py, test_triton_forward_ws.py and test_triton_targets*.py go
through the real one): each batch file names a module and where to write what the fork saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from course_utils.triton_attention import compile_server

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the servers fork")

LOAD = f"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("compile_server", {compile_server.__file__!r})
compile_server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compile_server)  # the module alone: no torch for a test server
"""
WORK = """

def work(path):
    job = json.load(open(path))
    sys.path.insert(0, job["root"])
    if job.get("fail"):
        raise ValueError("this batch fails: " + job["fail"])
    if job.get("kill_server"):
        os.kill(os.getppid(), 9)
    if job.get("sleep"):
        import time
        time.sleep(job["sleep"])
    value = importlib.import_module(job["module"]).VALUE
    seen = {"server": os.getppid(), "fork": os.getpid(), "value": value,
            "env": os.environ.get("COMPILE_SERVER_TEST")}
    print("printed by the batch: not an answer")  # stdout goes to path + ".err"
    json.dump(seen, open(path + ".out", "w"))

compile_server.serve(work)
"""


@pytest.fixture
def command():
    yield [sys.executable, "-c", LOAD + WORK]
    compile_server.shutdown()


def _batch(folder: Path, name: str, **job) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"root": str(folder), "module": "answers", **job}))
    return str(path)


def _seen(path: str) -> dict:
    return json.loads(Path(path + ".out").read_text())


def _env(**extra) -> dict:
    return {**os.environ, **extra}


def test_batches_share_a_server_and_import_their_modules_afresh(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 1\n")
    first = _batch(tmp_path, "first")
    compile_server.run_batches([first], _env(), command)
    (tmp_path / "answers.py").write_text("VALUE = 2  # the learner's next version\n")
    second = _batch(tmp_path, "second")
    compile_server.run_batches([second], _env(), command)
    a, b = _seen(first), _seen(second)
    assert a["server"] == b["server"]  # one server for both calls
    assert a["fork"] != b["fork"] != b["server"]  # each batch in a fork of its own
    assert (a["value"], b["value"]) == (1, 2)  # the module read again, not the server's copy


def test_batches_of_one_call_run_in_as_many_servers(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 3\n")
    paths = [_batch(tmp_path, f"b{i}") for i in range(2)]
    compile_server.run_batches(paths, _env(), command)
    servers = {_seen(p)["server"] for p in paths}
    assert len(servers) == 2 and all(_seen(p)["value"] == 3 for p in paths)


def test_a_failing_batch_raises_with_its_own_traceback_and_the_server_goes_on(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 4\n")
    with pytest.raises(RuntimeError, match="this batch fails: on purpose") as info:
        compile_server.run_batches([_batch(tmp_path, "bad", fail="on purpose")], _env(), command)
    assert "ValueError" in str(info.value)
    good = _batch(tmp_path, "good")
    compile_server.run_batches([good], _env(), command)
    assert _seen(good)["value"] == 4


def test_a_dead_server_is_named_and_replaced(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 5\n")
    first = _batch(tmp_path, "first")
    compile_server.run_batches([first], _env(), command)
    with pytest.raises(RuntimeError, match="the compile server ended"):
        compile_server.run_batches([_batch(tmp_path, "kill", kill_server=True)], _env(), command)
    again = _batch(tmp_path, "again")
    compile_server.run_batches([again], _env(), command)
    assert _seen(again)["value"] == 5 and _seen(again)["server"] != _seen(first)["server"]


def test_another_environment_gets_its_own_server(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 6\n")
    first, second = _batch(tmp_path, "first"), _batch(tmp_path, "second")
    compile_server.run_batches([first], _env(COMPILE_SERVER_TEST="a"), command)
    compile_server.run_batches([second], _env(COMPILE_SERVER_TEST="b"), command)
    assert (_seen(first)["env"], _seen(second)["env"]) == ("a", "b")
    assert _seen(first)["server"] != _seen(second)["server"]
    third = _batch(tmp_path, "third")  # pytest's own variable is no change of environment
    compile_server.run_batches([third], _env(COMPILE_SERVER_TEST="b", PYTEST_CURRENT_TEST="x"),
                               command)  # fmt: skip
    assert _seen(third)["server"] == _seen(second)["server"]


def test_servers_end_when_shut_down(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 7\n")
    path = _batch(tmp_path, "one")
    compile_server.run_batches([path], _env(), command)
    server = _seen(path)["server"]
    compile_server.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)


def test_a_fork_starts_servers_of_its_own_and_leaves_its_parents_alone(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 8\n")
    first = _batch(tmp_path, "first")
    compile_server.run_batches([first], _env(), command)
    child_batch = _batch(tmp_path, "child")
    pid = os.fork()
    if pid == 0:  # the fork: its own server, then exits as a fork does (no atexit)
        code = 1
        try:
            compile_server.run_batches([child_batch], _env(), command)
            compile_server.shutdown()  # stops the fork's server, never the parent's
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _seen(child_batch)["server"] != _seen(first)["server"]
    again = _batch(tmp_path, "again")  # the parent's server still answers
    compile_server.run_batches([again], _env(), command)
    assert _seen(again)["server"] == _seen(first)["server"]


def test_a_server_killed_between_calls_is_replaced(tmp_path, command):
    (tmp_path / "answers.py").write_text("VALUE = 9\n")
    first = _batch(tmp_path, "first")
    compile_server.run_batches([first], _env(), command)
    os.kill(_seen(first)["server"], signal.SIGKILL)  # the out-of-memory killer, say
    time.sleep(0.5)
    again = _batch(tmp_path, "again")
    compile_server.run_batches([again], _env(), command)  # no broken pipe: a new server
    assert _seen(again)["value"] == 9 and _seen(again)["server"] != _seen(first)["server"]


def test_an_interrupted_call_leaves_no_answer_for_the_next(tmp_path, command):
    """A notebook's interrupt arrives while the server works: the next call gets its own
    batch's result, not the interrupted one's."""
    (tmp_path / "answers.py").write_text("VALUE = 10\n")
    slow = _batch(tmp_path, "slow", sleep=3)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            compile_server.run_batches([slow], _env(), command)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    (tmp_path / "answers.py").write_text("VALUE = 11\n")
    fast = _batch(tmp_path, "fast")
    compile_server.run_batches([fast], _env(), command)
    assert _seen(fast)["value"] == 11
