"""Verdicts computed in the grader's own process, never in the student's kernel.

A graded test cell of the release (restored by nbgrader, so its source is the instructor's) is not
sent to the student's kernel. It runs here, in the grader, with the real course_utils: the checks'
cases, references, budgets and diagnoses are the same code the student ran in the notebook. Each
name the cell uses that it does not import is looked up in the student's kernel:

    a function  -> a RemoteFunction; each call sends the arguments to the kernel, where
                   course_utils.checks.engine.remote runs instrumented_call and sends back
                   plain data
    a value     -> the value itself (numbers, strings, arrays, tuples: the wire format)

So no patch of numpy, builtins, IPython, the checks or the import system inside the kernel can turn
a wrong answer into points: the values are compared here, against references computed here.

The calls of one test cell share one execute request: the kernel runs the agent's serve loop and
the requests come and go on two named pipes (KernelChannel.serve); the cell's time limit covers
them all, as it would in the notebook.

    outputs = run_test_cell(source, channel)     nbformat outputs for the cell (stream, error)
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import io
import itertools
import os
import select
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nbformat import NotebookNode

from course_utils.checks.engine import wire as _wire
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.tracing import LoadLog
from course_utils.checks.engine.watch import CallReport, _LearnerRaised

T = TypeVar("T")


class RemoteError(RuntimeError):
    """The student's kernel did not answer a request (it died, hung, or broke the agent).

    original: the executor's own exception (a dead kernel, a timeout), when there is one.
    """

    def __init__(self, message: str, original: BaseException | None = None):
        super().__init__(message)
        self.original = original


class KernelChannel:
    """Requests to the agent in the student's kernel: the payloads are files in a shared folder.

    execute(code): runs code in the student's kernel and returns when it is done (raising on a
    dead or hung kernel); io_host: the folder as the grader sees it; io_kernel: the same folder as
    the kernel sees it (inside a sandbox the two paths may differ).

    serve(work) runs work() (a test cell's checks) in a thread while one execute request runs the
    agent's serve loop; each request of work then costs a line on a named pipe each way, not an
    execute request of its own (about 10 ms each: a check of 250 cases paid 2.5 s in round trips).
    Outside serve(), or where there are no named pipes, each request is one execute request.
    """

    def __init__(self, execute: Callable[[str], None], io_host: Path, io_kernel: str | None = None):
        self.execute = execute
        self.io_host = Path(io_host)
        self.io_host.mkdir(parents=True, exist_ok=True)
        self.io_kernel = str(io_kernel or io_host)
        self._count = itertools.count()
        self._serves = itertools.count()
        self._pipes: _Pipes | None = None

    def request(self, verb: str, payload: dict | None = None) -> dict:
        n = next(self._count)
        req, resp = f"req-{n}", f"resp-{n}"
        host_req, host_resp = self.io_host / req, self.io_host / resp
        host_resp.unlink(missing_ok=True)
        _wire.save(host_req, payload or {})
        k_req, k_resp = f"{self.io_kernel}/{req}", f"{self.io_kernel}/{resp}"
        try:
            if self._pipes is not None:
                self._pipes.ask(verb, n)
            else:
                self._run_agent(_agent_call(verb, payload or {}, k_req, k_resp))
            if not host_resp.exists():
                raise RemoteError("the kernel did not answer the grader (no response)")
            try:
                data = _wire.load(host_resp)
            except Exception as exc:  # a file the grader cannot read: not a verdict
                raise RemoteError(f"the kernel's answer could not be read ({exc})") from None
            if not isinstance(data, dict):
                raise RemoteError("the kernel's answer is not a response")
            return data
        finally:
            host_req.unlink(missing_ok=True)
            host_resp.unlink(missing_ok=True)

    def serve(self, work: Callable[[], T]) -> T:
        """work(), its requests answered by one serve loop in the kernel (see the class doc).

        The kernel's time limit, and what follows a dead or stuck kernel, are the executor's, as
        for any request: here they apply to the serve loop, so to all of work's calls together,
        as to a test cell run in the notebook. An error of the kernel wins over work's own.
        """
        if self._pipes is not None or not hasattr(os, "mkfifo"):
            return work()
        k = next(self._serves)
        names = (f"ask-{k}", f"tell-{k}")
        for name in names:
            (self.io_host / name).unlink(missing_ok=True)
            os.mkfifo(self.io_host / name, 0o600)
        pipes = _Pipes(self.io_host / names[0], self.io_host / names[1])
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = work()
            except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
                box["error"] = exc
            finally:
                pipes.stop()

        self._pipes = pipes
        thread = threading.Thread(target=run, name="grader-check", daemon=True)
        kernel_error: BaseException | None = None
        try:
            thread.start()
            k_ask, k_tell = (f"{self.io_kernel}/{name}" for name in names)
            self._run_agent(f"_course_remote.serve({k_ask!r}, {k_tell!r}, {self.io_kernel!r})")
        except BaseException as exc:  # noqa: BLE001 (raised below, once work has stopped)
            kernel_error = exc
        finally:
            pipes.hang_up()  # a request still waiting raises RemoteError
            thread.join()
            self._pipes = None
            pipes.close()
            for name in names:
                (self.io_host / name).unlink(missing_ok=True)
        if kernel_error is not None:
            raise kernel_error
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _run_agent(self, line: str) -> None:
        try:
            self.execute(
                "import course_utils.checks.engine.remote as _course_remote\n"
                f"{line}\n"
                "del _course_remote\n"
            )
        except RemoteError:
            raise
        except Exception as exc:  # the kernel died or hung: the executor decides what follows
            raise RemoteError(f"the kernel stopped answering ({type(exc).__name__})", exc) from exc


def _agent_call(verb: str, payload: dict, k_req: str, k_resp: str) -> str:
    if verb == "describe":
        return f"_course_remote.describe({payload['name']!r}, {k_resp!r})"
    return f"_course_remote.call({k_req!r}, {k_resp!r})"


class _Pipes:
    """The grader's ends of a serve loop's two named pipes: "VERB N" lines go to the kernel on
    `ask`, and "N" comes back on `tell` once resp-N is written. Both are opened read-write, so no
    open waits for the other side."""

    def __init__(self, ask: Path, tell: Path):
        self._ask = os.open(ask, os.O_RDWR)
        self._tell = os.open(tell, os.O_RDWR | os.O_NONBLOCK)
        self._gone = threading.Event()

    def ask(self, verb: str, n: int) -> None:
        if self._gone.is_set():
            raise RemoteError("the kernel stopped answering the grader")
        os.write(self._ask, f"{verb} {n}\n".encode())
        got = b""
        while not got.endswith(b"\n"):
            ready, _, _ = select.select([self._tell], [], [], 0.05)
            if self._gone.is_set() and not ready:
                raise RemoteError("the kernel stopped answering the grader")
            if ready:
                with contextlib.suppress(BlockingIOError):
                    got += os.read(self._tell, 64)
            if len(got) > 32:
                break
        if got.strip() != str(n).encode():
            raise RemoteError(f"the kernel's answer could not be read (it said {got[:32]!r})")

    def stop(self) -> None:
        """Tell the serve loop to return (work is done, or failed)."""
        with contextlib.suppress(OSError):
            os.write(self._ask, b"stop\n")

    def hang_up(self) -> None:
        """The serve request is over: a request still waiting gives up."""
        self._gone.set()

    def close(self) -> None:
        for fd in (self._ask, self._tell):
            with contextlib.suppress(OSError):
                os.close(fd)


def _remote_exception(message: str, type_name: str | None = None) -> Exception:
    kind, _, text = message.partition(": ")
    name = type_name or (kind if kind.isidentifier() else "Exception")
    return type(name, (Exception,), {})(text if text else message)


class RemoteFunction:
    """A grader's handle on a function in the student's kernel (see instrumented_call)."""

    def __init__(self, channel: KernelChannel, target: dict, params=None, label: str = ""):
        self._channel = channel
        self._target = target
        self.__name__ = label or target.get("global") or target.get("path", "function")
        self.__qualname__ = self.__name__
        self.__module__ = "__main__"
        self._recent: dict[str, CallReport] = {}
        if params is not None:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            self.__signature__ = inspect.Signature(
                [inspect.Parameter(p, kind) for p in params if p.isidentifier()]
            )

    def __repr__(self) -> str:
        return f"<function {self.__name__} in the student's kernel>"

    def __course_call__(self, args, kwargs, *, name, allow, trace, memory, spy) -> CallReport:
        payload = {
            "target": self._target,
            "args": list(args),
            "kwargs": dict(kwargs),
            "options": {
                "name": name,
                "allow": list(allow),
                "trace": list(trace),
                "memory": bool(memory),
                "spy": list(spy),
            },
        }
        key = _fingerprint(payload)
        if key in self._recent:  # the same call again (a check comparing outputs in rounds)
            return self._recent[key]
        report = self._call(payload)
        self._recent[key] = report
        while len(self._recent) > 8:
            self._recent.pop(next(iter(self._recent)))
        return report

    def _call(self, payload: dict) -> CallReport:
        resp = self._channel.request("call", payload)
        if "report" in resp:
            rep = resp["report"]
            traced = {(int(k) if k.isdigit() else k): v for k, v in rep.get("traced", {}).items()}
            return CallReport(
                result=rep.get("result"),
                peak=rep.get("peak"),
                loads={k: LoadLog.from_dict(v) for k, v in rep.get("loads", {}).items()},
                calls={k: [tuple(c) for c in v] for k, v in rep.get("calls", {}).items()},
                traced=traced,
            )
        kind, message = resp.get("raised"), str(resp.get("message", ""))
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        if kind == "CheckFailure":
            raise CheckFailure(message)
        if kind == "LearnerRaised":
            raise _LearnerRaised(_remote_exception(message, resp.get("type")))
        raise RemoteError(f"the kernel answered with {kind!r}")

    def __call__(self, *args, **kwargs):
        opts = dict(name=self.__name__, allow=(), trace=(), memory=False, spy=())
        return self.__course_call__(args, kwargs, **opts).result

    def picked(self, k: int, names: tuple[str, ...], label: str) -> _Picked:
        """The same function with only output k returned (see engine.watch.pick_output): the call is
        made once per input, whichever output the check compares."""
        return _Picked(self, k, tuple(names), label)

    def bound_into(self, path: str, *others: RemoteFunction) -> RemoteFunction:
        """course function `path` ("module:function") with this and others as first arguments."""
        names = [self._target["global"], *(o._target["global"] for o in others)]
        return RemoteFunction(self._channel, {"path": path, "bound": names}, label=self.__name__)


class _Picked:
    """Output k of a RemoteFunction's result, checked to be one of len(names) values."""

    def __init__(self, base: RemoteFunction, k: int, names: tuple[str, ...], label: str):
        self._base, self._k, self._names, self._label = base, k, names, label
        self.__name__ = self.__qualname__ = base.__name__
        self.__module__ = "__main__"
        if hasattr(base, "__signature__"):
            self.__signature__ = base.__signature__

    def __course_call__(self, args, kwargs, **options) -> CallReport:
        report = self._base.__course_call__(args, kwargs, **options)
        out = report.result
        if not isinstance(out, tuple | list) or len(out) != len(self._names):
            kind = type(out).__name__ + (
                f" of length {len(out)}" if hasattr(out, "__len__") else ""
            )
            what = {2: "the pair", 3: "the triple"}.get(len(self._names), "several values")
            raise _LearnerRaised(
                TypeError(
                    f"{self._label} must return {what} ({', '.join(self._names)}), got {kind}"
                )
            )
        return CallReport(
            result=out[self._k],
            peak=report.peak,
            loads=report.loads,
            calls=report.calls,
            traced=report.traced,
        )

    def __call__(self, *args, **kwargs):
        opts = dict(name=self.__name__, allow=(), trace=(), memory=False, spy=())
        return self.__course_call__(args, kwargs, **opts).result


def _fingerprint(payload: dict) -> str:
    import hashlib
    import json

    tree, arrays = _wire.encode(payload)
    h = hashlib.sha256(json.dumps(tree, sort_keys=True).encode())
    for key in sorted(arrays):
        arr = arrays[key]
        h.update(f"{key}{arr.dtype}{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class _Opaque:
    """A student value that cannot travel to the grader (the check says so when it is used)."""

    def __init__(self, name: str, type_name: str):
        self.name, self.type_name = name, type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.name} (a value the grader cannot read)>"


class RemoteNamespace(dict):
    """The test cell's variables: its own assignments, and the student's globals by name."""

    def __init__(self, channel: KernelChannel):
        super().__init__()
        self._channel = channel

    def __missing__(self, name: str):
        if hasattr(builtins, name):
            raise KeyError(name)
        info = self._channel.request("describe", {"name": name})
        kind = info.get("kind")
        if kind == "callable":
            value = RemoteFunction(self._channel, {"global": name}, info.get("params"), name)
        elif kind == "value":
            value = info.get("value")
        elif kind == "opaque":
            value = _Opaque(name, str(info.get("type")))
        else:
            raise KeyError(name)
        self[name] = value
        return value


def _stream(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text)


def _error(exc: BaseException) -> NotebookNode:
    ename = type(exc).__name__
    evalue = str(exc)
    return NotebookNode(
        output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]
    )


def run_test_cell(source: str, channel: KernelChannel) -> list[NotebookNode]:
    """Run a graded test cell here, its student names looked up in the kernel; its outputs.

    The cell's requests go through one serve loop of the kernel (KernelChannel.serve). Errors of
    the kernel itself (died, timed out) propagate, for the executor to handle.
    """
    return channel.serve(lambda: _run_test_cell(source, channel))


def _run_test_cell(source: str, channel: KernelChannel) -> list[NotebookNode]:
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = RemoteNamespace(channel)
    scope = {"__name__": "__grader__", "__builtins__": builtins}
    printed = io.StringIO()
    value, failure = None, None
    with (
        contextlib.redirect_stdout(printed),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        try:
            exec(compile(ast.Module(tree.body, []), "<test cell>", "exec"), scope, namespace)
            if last is not None:
                code = compile(ast.Expression(last.value), "<test cell>", "eval")
                value = eval(code, scope, namespace)
        except RemoteError:
            raise
        except NameError as exc:
            failure = NameError(f"{exc} (run the cell that defines it before this test)")
        except Exception as exc:
            failure = exc
    outputs = []
    if printed.getvalue():
        outputs.append(_stream(printed.getvalue()))
    if failure is not None:
        outputs.append(_error(failure))
    elif value is not None:
        outputs.append(
            NotebookNode(
                output_type="execute_result",
                execution_count=None,
                metadata={},
                data={"text/plain": repr(value)},
            )
        )
    return outputs


def run_in_grader(executor, cell, index: int, io_dir: Path) -> list[NotebookNode]:
    """The outputs of a graded test cell, computed here (see the module doc).

    executor: the nbclient/nbgrader executor whose kernel holds the student's code; each request
    to the agent runs as a hidden cell of that kernel (the executor's own time limit and dead-
    kernel handling apply). io_dir: a folder that the kernel sees at the same path.
    """
    count = itertools.count()
    printed: list[str] = []  # what the student's code printed while the grader called it

    def execute(code: str) -> None:
        hidden = NotebookNode(
            cell_type="code",
            id=f"grader-request-{index}-{next(count)}",
            source=code,
            metadata={},
            outputs=[],
            execution_count=None,
        )
        cells = executor.nb.cells
        original = cells[index]
        try:  # nbclient files the executed cell under its index: put the test cell back
            executor.execute_cell(hidden, index, store_history=False)
        finally:
            cells[index] = original
        for out in hidden.outputs:
            if out.get("output_type") == "stream":
                mark = "[stderr] " if out.get("name") == "stderr" else ""
                printed.extend(mark + line for line in out.get("text", "").splitlines(True))
        errors = [o for o in hidden.outputs if o.get("output_type") == "error"]
        if errors:
            raise RemoteError(
                f"the notebook's kernel could not answer the grader ({errors[0].get('ename')}: "
                f"{errors[0].get('evalue')}); did the notebook replace course_utils?"
            )

    outputs = run_test_cell(cell.source, KernelChannel(execute, io_dir))
    if printed:  # shown in the feedback, never on stderr (which would cost the cell's points)
        text = "".join(printed)
        if len(text) > 4000:
            text = text[:4000] + f"\n... [{len(text):,} characters printed in all]\n"
        outputs.insert(0, _stream("your code printed while it was checked:\n" + text))
    return outputs
