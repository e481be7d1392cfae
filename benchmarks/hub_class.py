"""A class of simulated students on the course's JupyterHub: time per student and the hub's memory.

    sudo .venv/bin/python -m benchmarks.hub_class [--students 20] [--jobs 2]

hub/rehearsal.py makes the users and starts hub/launch.py's hub; the instructor releases 01; each
student, scripted through the hub's REST API and their server's nbgrader API (no browser): server
started, 01 fetched, answered (every other student fully, the rest half), submitted; then the
instructor collects, grades (`python -m graders grade`, sandbox on) and releases feedback; every
student fetches it. Prints a Markdown section for docs/journal.md. Needs root.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone

A = "01_online_softmax"


def _rss_mb(pid: int) -> float:
    """Resident memory of `pid` and everything below it, in MB (Linux /proc)."""
    from course import descendants

    total = 0
    for p in [pid, *(child for child, _ in descendants(pid))]:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _hub_rss_mb(hub) -> tuple[float, float]:
    """(the hub and its proxy, all the users' servers) resident MB."""
    from course import descendants

    below = {child for child, _ in descendants(hub.proc.pid)}
    servers = 0.0
    hub_only = 0.0
    for p in [hub.proc.pid, *below]:
        try:
            cmd = open(f"/proc/{p}/cmdline").read()
            rss = next(
                int(line.split()[1])
                for line in open(f"/proc/{p}/status")
                if line.startswith("VmRSS:")
            )
        except (OSError, StopIteration):
            continue
        if "singleuser" in cmd or "ipykernel" in cmd:
            servers += rss / 1024
        else:
            hub_only += rss / 1024
    return hub_only, servers


def run(n: int, jobs: int) -> dict:
    from graders import bank, pipeline
    from hub import rehearsal

    why = rehearsal.missing()
    if why:
        sys.exit(f"benchmarks.hub_class: {why}")
    hub = rehearsal.Hub([f"s{i:02d}" for i in range(n)]).start()
    course = hub.settings["course_id"]
    got: dict = {"students": n, "per_student_s": []}
    try:
        hub_idle, _ = _hub_rss_mb(hub)
        t = time.perf_counter()
        hub.release(A)
        got["release_s"] = time.perf_counter() - t
        solved = json.loads(json.dumps(pipeline.solved_notebook(A)))
        half = json.loads(json.dumps(bank.partial(A)[0]))
        t_class = time.perf_counter()
        tokens = {}
        for i, name in enumerate(hub.students):
            t = time.perf_counter()
            hub.spawn(name)
            tokens[name] = token = hub.user_token(name)
            q = f"?course_id={course}&assignment_id={A}"
            hub.server(name, "POST", f"/assignments/fetch{q}", token)
            nb = solved if i % 2 == 0 else half
            hub.server(
                name,
                "PUT",
                f"/api/contents/{A}/{A}.ipynb",
                token,
                {"type": "notebook", "format": "json", "content": nb},
            )
            out = hub.server(name, "POST", f"/assignments/submit{q}", token)
            assert out["success"] and "submitted" in {a["status"] for a in out["value"]}, out
            got["per_student_s"].append(time.perf_counter() - t)
        got["fetch_submit_s"] = time.perf_counter() - t_class
        got["hub_mb"], got["servers_mb"] = _hub_rss_mb(hub)
        got["hub_idle_mb"] = hub_idle
        t = time.perf_counter()
        out = hub.grade(A, jobs=jobs)
        got["grade_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for name in hub.students:
            q = f"?course_id={course}&assignment_id={A}"
            hub.server(name, "POST", f"/assignments/fetch_feedback{q}", tokens[name])
        got["feedback_s"] = time.perf_counter() - t
        scores = {}
        for name in hub.students:
            res = json.loads((out / "results" / name / f"{A}.json").read_text())
            scores[name] = res["score"]
        total = sum(bank.points(A).values())
        want_half = total - sum(bank.points(A)[t] for t in bank.partial(A)[1])
        want = {s: (total if i % 2 == 0 else want_half) for i, s in enumerate(hub.students)}
        assert scores == want, (scores, want)
        got["scores_ok"] = True
    finally:
        hub.stop()
    return got


def section(got: dict, argv: list[str]) -> str:
    import jupyterhub
    import nbgrader

    per = got["per_student_s"]
    n = got["students"]
    median, slowest, per_grade = sorted(per)[len(per) // 2], max(per), got["grade_s"] / n
    whole = got["fetch_submit_s"] + got["grade_s"] + got["feedback_s"]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return f"""## A class of {n} simulated students on JupyterHub, {when}

`sudo .venv/bin/python -m benchmarks.hub_class {" ".join(argv)}` on a {platform.machine()} machine
with 2 cores (shared), Python {platform.python_version()}, JupyterHub {jupyterhub.__version__},
nbgrader {nbgrader.__version__}. Each student is scripted through the hub's REST API and their
own server's nbgrader API (server started, `{A}` fetched, answered, submitted), one after another;
then the instructor collects, grades with `python -m graders grade` (sandbox on, 2 workers) and
releases feedback, which every student fetches. Every score checked (half the class full marks,
half the partial answer's score).

| step | time |
|---|---|
| instructor releases {A} | {got["release_s"]:.0f} s |
| per student: start, fetch, answer, submit | median {median:.1f} s, slowest {slowest:.1f} s |
| whole class fetches and submits | {got["fetch_submit_s"]:.0f} s |
| collect, grade, release feedback | {got["grade_s"]:.0f} s ({per_grade:.1f} s a student) |
| every student fetches feedback | {got["feedback_s"]:.1f} s |
| per student, end to end (submit to feedback) | {whole / n:.1f} s |

| memory (resident) | MB |
|---|---|
| hub and proxy, before the class | {got["hub_idle_mb"]:.0f} |
| hub and proxy, {n} servers running | {got["hub_mb"]:.0f} |
| the {n} students' servers together | {got["servers_mb"]:.0f} ({got["servers_mb"] / n:.0f} each) |
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.hub_class", description=__doc__)
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    print(section(run(args.students, args.jobs), argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
