"""Compile-only child processes kept between compiles: torch and Triton imported once, not per call.

A process that runs Triton's interpreter cannot compile (`cross_compile`'s docstring says why), so
it hands each batch of compile jobs to a child Python started without TRITON_INTERPRET. Starting
that child costs more than most compiles: importing torch and Triton's compiler took 1.8 s of CPU
on a 2-core machine (3.9 to 5.9 s of wall clock beside a busy core, 2026-12-06), and the sm_90
builds of the Gluon kernels are a few seconds each. So the child is a server kept for this
process's life:

    run_batches(paths, env, command)
                    each path a batch (a JSON file of jobs) for one server; the servers run them
                    at once and each writes path + ".out"; raises RuntimeError with a batch's
                    own error output if one fails
    serve(work)     the server's loop (command's process): reads a path per line from stdin,
                    forks, runs work(path) in the fork, answers its exit status

The fork runs each batch from the server's state as it was after its imports (torch, Triton and
the course's kernels, none of the batch's own modules), so a batch imports the modules it names
afresh, as a new process would: a learner's module written to disk since the last batch is read
again. The server ends when its stdin closes (this process exits or dies) or at exit
(`shutdown`); one that died between calls is replaced, and the servers of a call interrupted
while they work (a notebook's interrupt) are killed, so no answer reaches a later call. A fork
of this process starts servers of its own and never uses or stops its parent's. Where there is
no fork (Windows), each batch runs in a process of its own.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

ERROR_TAIL = 4000  # characters of a failed batch's error output put in the message


class _Server:
    """One server process: its pipes and its own log (what it wrote outside any batch)."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(
            [*command, "--serve"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def send(self, path: str) -> None:
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()

    def reply(self) -> int | None:
        """The batch's exit status, None if the server ended instead of answering."""
        line = self.proc.stdout.readline()
        return int(line) if line.strip() else None

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-ERROR_TAIL:]

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the server's loop ends
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self.log.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


_servers: list[_Server] = []  # the servers running, all started with _started_for
_started_for: tuple | None = None  # (command, env) of the servers running
_owner = os.getpid()  # the process that started them: a fork of it starts its own
_lock = threading.Lock()
# set by pytest for each test: not a change of the compiler's environment
_VOLATILE = ("PYTEST_CURRENT_TEST",)


def run_batches(paths: list[str], env: dict[str, str], command: list[str]) -> None:
    """Run each batch file in `paths` in a server of `command` (at once, one server a batch).

    Servers are started as needed and kept for the next call; a call with another command or
    environment stops them and starts its own. Raises RuntimeError with the batch's error
    output when a batch fails or its server dies.
    """
    global _started_for, _owner
    if not hasattr(os, "fork"):
        _run_in_new_processes(paths, env, command)
        return
    key = (tuple(command), tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE)))
    with _lock:
        if _owner != os.getpid():  # a fork of the process that started them: not its servers
            _servers.clear()
            _started_for, _owner = None, os.getpid()
        if key != _started_for:
            _stop_all()
            _started_for = key
        for gone in [s for s in _servers if s.proc.poll() is not None]:  # killed since (OOM)
            _servers.remove(gone)
            gone.log.close()
        while len(_servers) < len(paths):
            _servers.append(_Server(command, env))
        used = _servers[: len(paths)]
        try:
            for server, path in zip(used, paths, strict=True):
                server.send(path)
            statuses = [server.reply() for server in used]
        except BaseException:  # interrupted (Ctrl-C in a notebook) while they work: their
            for server in used:  # answers would come to the next call, so they go
                _servers.remove(server)
                server.kill()
                server.log.close()
            raise
        failures = []
        for server, path, status in zip(used, paths, statuses, strict=True):
            if status is None:  # the server died: start a new one next time
                _servers.remove(server)
                failures.append(f"the compile server ended:\n{server.log_tail()}")
                server.close()
            elif status != 0:
                failures.append(_error_output(path))
        if failures:
            raise RuntimeError("the compile process failed:\n" + "\n".join(failures))


def _error_output(path: str) -> str:
    try:
        with open(path + ".err") as f:
            return f.read()[-ERROR_TAIL:]
    except OSError:
        return "(no error output)"


def _run_in_new_processes(paths: list[str], env: dict[str, str], command: list[str]) -> None:
    procs = [
        subprocess.Popen([*command, path], env=env, stderr=subprocess.PIPE, text=True)
        for path in paths
    ]
    errors = [p.communicate()[1] for p in procs]
    for p, err in zip(procs, errors, strict=True):
        if p.returncode:
            raise RuntimeError(f"the compile process failed:\n{err[-ERROR_TAIL:]}")


def _stop_all() -> None:
    for server in _servers:
        server.close()
    _servers.clear()


@atexit.register
def shutdown() -> None:
    """Stop every server (their stdin closes; each ends after the batch it is running)."""
    with _lock:
        if _owner == os.getpid():  # a fork leaves its parent's servers alone
            _stop_all()


def serve(work: Callable[[str], None]) -> None:
    """The server's loop: a path per line on stdin, work(path) in a fork, its status on stdout.

    The fork writes its stdout and stderr to path + ".err", so nothing it prints reaches the
    answers on this process's stdout."""
    answers = sys.stdout
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        pid = os.fork()
        if pid == 0:  # the fork: run the batch, never return into the loop
            code = 1
            try:
                fd = os.open(path + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                work(path)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        answers.write(f"{os.waitstatus_to_exitcode(status)}\n")
        answers.flush()
