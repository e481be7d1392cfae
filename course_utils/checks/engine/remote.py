"""The learner's side of a graded check: run what the grader asks, send back plain data.

While a submission is graded, its test cells are not run in the learner's kernel. The grader runs
them in a process of its own, with the checks' cases, references and comparisons; each time a check
needs the learner's function it asks this module, in the learner's kernel, to call it:

    describe(name, response)           what the learner's global `name` is: a function, a value
    call(request, response)            instrumented_call of a learner function on the request's
                                       arguments; the CallReport (or the exception) goes back
    serve(ask, tell, folder)           answer requests named on the pipe `ask` ("call N",
                                       "describe N": req-N in folder) until "stop", saying
                                       "N" on `tell` when resp-N is written

Requests and responses are files in the wire format (_wire). Nothing here decides a verdict: the
grader compares the returned values with its own references.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from course_utils.checks.engine import wire as _wire
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.watch import _LearnerRaised, instrumented_call, pick_output


def _namespace() -> dict:
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.user_ns
    except ImportError:  # pragma: no cover - the kernel always has IPython
        pass
    import __main__

    return vars(__main__)


def describe(name: str, response: str) -> None:
    """Write what the learner's global `name` is: missing, a function (with its parameter names),
    or a value (numbers, strings, arrays, tuples of those)."""
    ns = _namespace()
    if name not in ns:
        out = {"kind": "missing"}
    elif callable(ns[name]):
        try:
            params = [p.name for p in inspect.signature(ns[name]).parameters.values()]
        except (TypeError, ValueError):
            params = None
        out = {"kind": "callable", "params": params, "type": type(ns[name]).__name__}
    else:
        try:
            _wire.encode(ns[name])
            out = {"kind": "value", "value": ns[name]}
        except _wire.WireError as exc:
            out = {"kind": "opaque", "type": type(ns[name]).__name__, "why": str(exc)}
    _wire.save(Path(response), out)


def _resolve(target: dict):
    ns = _namespace()
    if "global" in target:
        fn = ns.get(target["global"])
        if fn is None:
            raise NameError(f"name {target['global']!r} is not defined")
    else:  # a course function the learner's objects are plugged into (e.g. a kernel skeleton)
        module, _, attr = target["path"].partition(":")
        fn = getattr(importlib.import_module(module), attr)
        bound = [ns[b] for b in target.get("bound", ())]
        if bound:
            base = fn

            def fn(*args, **kwargs):
                return base(*bound, *args, **kwargs)

            fn.__signature__ = _drop_first(inspect.signature(base), len(bound))
    if target.get("pick") is not None:
        k, names, label = target["pick"]
        fn = pick_output(fn, k, tuple(names), label)
    return fn


def _drop_first(sig: inspect.Signature, n: int) -> inspect.Signature:
    return sig.replace(parameters=list(sig.parameters.values())[n:])


def call(request: str, response: str) -> None:
    """Run the request's instrumented call; write {"report": ...} or {"raised": kind, message}."""
    req = _wire.load(Path(request))
    try:
        fn = _resolve(req["target"])
        opts = req["options"]
        report = instrumented_call(
            fn,
            tuple(req["args"]),
            req["kwargs"],
            name=opts["name"],
            allow=tuple(opts["allow"]),
            trace=tuple(opts["trace"]),
            memory=bool(opts["memory"]),
            spy=tuple(opts["spy"]),
        )
        out = {
            "report": {
                "result": report.result,
                "peak": report.peak,
                "loads": {k: log.to_dict() for k, log in report.loads.items()},
                "calls": {k: [list(c) for c in v] for k, v in report.calls.items()},
                "traced": {str(k): v for k, v in report.traced.items()},
            }
        }
    except NotImplementedError as exc:
        out = {"raised": "NotImplementedError", "message": str(exc)}
    except CheckFailure as exc:
        out = {"raised": "CheckFailure", "message": str(exc)}
    except _LearnerRaised as exc:
        out = {"raised": "LearnerRaised", "message": str(exc), "type": type(exc.exc).__name__}
    except Exception as exc:  # the learner's object could not be called at all
        out = {"raised": "LearnerRaised", "message": f"{type(exc).__name__}: {exc}"}
    try:
        _wire.save(Path(response), out)
    except _wire.WireError as exc:
        message = f"TypeError: the function returned a value the check cannot read ({exc})"
        _wire.save(Path(response), {"raised": "LearnerRaised", "message": message})


def serve(ask: str, tell: str, folder: str) -> None:
    """Answer the grader's requests until it says "stop" (one execute request for a whole test
    cell: graders.isolation.remote.KernelChannel.serve). A request is a line "VERB N" on the named
    pipe `ask`; the answer is resp-N in folder, then the line "N" on `tell`."""
    base = Path(folder)
    with open(ask, "rb", buffering=0) as requests, open(tell, "wb", buffering=0) as answers:
        while True:
            line = requests.readline().decode("ascii", "replace").split()
            if not line or line[0] == "stop":
                return
            verb, n = line[0], line[-1]
            req, resp = base / f"req-{n}", base / f"resp-{n}"
            if verb == "describe":
                describe(str(_wire.load(req).get("name", "")), str(resp))
            else:
                call(str(req), str(resp))
            answers.write(f"{n}\n".encode())
