"""Autograding throughput: one student's notebooks, and a class, on this machine's cores.

    python -m benchmarks.grading [--students 50] [--jobs N] [--out DIR] [--unsafe-no-sandbox]
    python -m benchmarks.grading --compare 5    # one student, sandbox and not, alternating
    python -m benchmarks.grading --students 50 --compare-class 10   # the class, both ways
    python -m benchmarks.grading --compare 3 --against ../old        # this grader against another
    python -m benchmarks.grading --compare 2 --against ../old --students 5   # ... on a class
    python -m benchmarks.grading --notebooks 01-07 ...   # any of the above, on some notebooks only
    python -m benchmarks.grading --versus-nbgrader 2 --students 4 --notebooks 1,3,5
                          # plain `nbgrader autograde` and `python -m graders grade`, side by side
    python -m benchmarks.grading --compare-threads 2 --notebooks 06-11
                          # each notebook's share of the cores for its threads, and all of them

Builds a synthetic class from the bank of tests/fixtures/bank.py (each student gets, for every
notebook, one of: full solution, untouched release, partial answer, or a named mistake, in turn;
every file written as Jupyter writes it), grades it with `python -m graders grade`, and prints the
wall time for one student and for the class. --compare K grades one student's notebooks 2K times,
with and without the sandbox in alternating order, so that both see the same machine; it prints
each time, the medians and the sandbox's cost. Every class run ends with the scaling model
(model_lines): seconds per notebook in its grading process, how busy the worker slots were, and
the client's own CPU per notebook. --versus-nbgrader K grades the same class K times each with
plain `nbgrader autograde` (a course directory with nbgrader's own config file) and with
`python -m graders grade` (the sandbox on), alternating, both as programs a caller starts, then
times the grader's run with nothing new (versus_nbgrader).

The bank is a test fixture: it is imported through benchmarks/_fixtures.py, which puts tests/ at
the end of sys.path and imports `fixtures.bank` as the tests do (one module, not a copy by path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._fixtures import bank
from graders.grade import grade
from graders.run import pipeline


def select(spec: str | None) -> list[str]:
    """The assignments named by --notebooks: None for all, else numbers and ranges, "01-07" or
    "1,3,5-6", matched on each assignment's leading number."""
    every = pipeline.assignments()
    if not spec:
        return every
    wanted: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise SystemExit(
                f"--notebooks: {part!r} is not a number or a range like 01-07"
            ) from None
        wanted.update(range(first, last + 1))
    chosen = [a for a in every if int(a.split("_")[0]) in wanted]
    if not chosen:
        raise SystemExit(f"--notebooks {spec}: no assignment matches (there are {every})")
    return chosen


def _refuse_failed(graded: Path, which: str) -> None:
    """Stop when a timed run did not grade (the bank's classes have no broken file): a time of
    notebooks whose kernel never started is not a grading time (a missing sandbox, or a checkout
    whose .venv the sandbox cannot see, fails that way). Every run this module times is checked."""
    for path in sorted((graded / "results").glob("*/*.json")):
        res = json.loads(path.read_text(encoding="utf-8"))
        if res["status"] in ("autograde-failed", "invalid-notebook"):
            why = (res.get("problems") or [res["status"]])[0]
            raise SystemExit(f"{which}: {path.parent.name} was not graded: {why}")


def make_class(folder: Path, students: int, assignments: list[str] | None = None) -> None:
    for assignment in assignments or pipeline.assignments():
        kinds = bank.core(assignment)  # full, untouched, partial, a named mistake
        for s in range(students):
            entry = kinds[s % len(kinds)]
            one = bank.Entry(f"student{s:03d}", entry.notebook, entry.failing, save=entry.save)
            bank.write([one], folder, assignment)


def compare(pairs: int, jobs: int, out: str | None, assignments: list[str]) -> int:
    """One student's notebooks graded with and without the sandbox, in alternating order."""
    work = Path(out or tempfile.mkdtemp(prefix="grading-compare-"))
    make_class(work / "one", 1, assignments)
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(pairs):
        for sandbox in (True, False) if k % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            dest = work / f"graded-{k}-{'sandbox' if sandbox else 'plain'}"
            grade(work / "one" / "submitted", dest, jobs=jobs, progress=False, sandbox=sandbox)
            times[sandbox].append(time.perf_counter() - t0)
            _refuse_failed(dest, "with the sandbox" if sandbox else "without the sandbox")
            print(
                f"pair {k + 1}: {'sandbox   ' if sandbox else 'no sandbox'} "
                f"{times[sandbox][-1]:.1f} s",
                flush=True,
            )
    with_sb, without = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {jobs} jobs · one student, "
        f"{len(assignments)} notebooks, {pairs} pairs\n"
        f"median with the sandbox {with_sb:.1f} s, without {without:.1f} s: "
        f"the sandbox costs {100 * (with_sb / without - 1):+.1f} %"
    )
    return 0


def compare_class(
    students: int, blocks: int, jobs: int, out: str | None, assignments: list[str]
) -> int:
    """A class graded whole, with and without the sandbox: the students in `blocks` groups, each
    group graded both ways back to back, the order alternating from one group to the next, so
    that both ways see the same machine over the same stretch of time. The class's time each way
    is the sum over its groups."""
    work = Path(out or tempfile.mkdtemp(prefix="grading-compare-class-"))
    make_class(work / "class", students, assignments)
    submitted = work / "class" / "submitted"
    names = sorted(p.name for p in submitted.iterdir())
    size = -(-len(names) // blocks)
    totals = {True: 0.0, False: 0.0}
    runs: dict[bool, list] = {True: [], False: []}
    for b in range(blocks):
        group = names[b * size : (b + 1) * size]
        if not group:
            break
        part = work / f"block-{b}" / "submitted"
        for name in group:
            shutil.copytree(submitted / name, part / name)
        for sandbox in (True, False) if b % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            dest = work / f"block-{b}" / ("graded-sandbox" if sandbox else "graded-plain")
            outcome = grade(part, dest, jobs=jobs, progress=False, sandbox=sandbox)
            took = time.perf_counter() - t0
            _refuse_failed(dest, "with the sandbox" if sandbox else "without the sandbox")
            totals[sandbox] += took
            runs[sandbox].append((dest, took, outcome.client_cpu))
            print(
                f"block {b + 1}/{blocks} ({len(group)} students): "
                f"{'sandbox   ' if sandbox else 'no sandbox'} {took:.1f} s",
                flush=True,
            )
    with_sb, without = totals[True], totals[False]
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {jobs} jobs · class of {len(names)}, "
        f"{len(assignments)} notebooks each, {blocks} alternating blocks\n"
        f"with the sandbox {with_sb:.0f} s ({with_sb / len(names):.1f} s per student), "
        f"without {without:.0f} s ({without / len(names):.1f} s per student): "
        f"the sandbox costs {100 * (with_sb / without - 1):+.1f} %"
    )
    print("\n".join(model_lines(runs[True], jobs)))
    return 0


GRADE_ONCE = """
import json, sys, time
from graders.grade import grade
if __name__ == "__main__":
    t0 = time.perf_counter()
    got = grade(sys.argv[1], sys.argv[2], jobs=int(sys.argv[3]), progress=False)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall": wall, "client_cpu": getattr(got, "client_cpu", None),
                      "seconds": getattr(got, "seconds", None)}))
"""


def task_seconds(graded: Path) -> list[float]:
    """Each graded notebook's seconds in its grading process (results/*/*.json, "seconds")."""
    import json

    return [
        float(json.loads(p.read_text()).get("seconds") or 0.0)
        for p in sorted(Path(graded).glob("results/*/*.json"))
    ]


def model_lines(runs: list[tuple[Path, float, float | None]], jobs: int) -> list[str]:
    """The scaling model from graded runs [(graded folder, wall s, client CPU s or None)].

    Per notebook: s = seconds in its grading process on a worker (nbgrader, the kernel, the
    checks); the W = jobs slots were busy sum(s) / (wall * W) of the time; the client's own CPU
    (scheduler, client, bookkeeping) per notebook. A cluster of W worker slots then grades N
    notebooks in about N * mean(s) / (W * busy) + the report, as long as the client keeps up:
    it can feed about 1 / (client CPU per notebook) notebooks a second."""
    secs = [s for graded, _, _ in runs for s in task_seconds(graded)]
    wall = sum(w for _, w, _ in runs)
    cpu = [c for _, _, c in runs if c is not None]
    if not secs or not wall:
        return ["model: no graded notebook found"]
    mean = statistics.mean(secs)
    busy = sum(secs) / (wall * jobs)
    lines = [
        f"model: {len(secs)} notebooks, {mean:.2f} s each in its grading process (median "
        f"{statistics.median(secs):.2f}, max {max(secs):.1f}): {1 / mean:.3f} notebooks per "
        f"worker-second",
        f"model: the {jobs} slots were busy {100 * busy:.0f} % of the {wall:.0f} s wall "
        f"(the rest: each run's template, report, and the tail where one slot waits)",
    ]
    if cpu:
        per = sum(cpu) / len(secs)
        lines.append(
            f"model: the client's own CPU {per:.3f} s per notebook: it keeps up with about "
            f"{1 / per:.0f} notebooks a second, {mean / per:.0f} busy worker slots"
        )
    return lines


def compare_with(
    other: Path, pairs: int, jobs: int, out: str | None, assignments: list[str], students: int = 1
) -> int:
    """A class of `students` (default one student) graded by this checkout and by `other`
    (another checkout of the course with its own .venv, e.g. an older commit), in alternating
    order: what a change to the grader costs. Only the notebooks whose release is the same file
    in both are graded. One student shows the fixed costs of a run (the template, starting the
    workers, the report); a class shows the throughput."""
    other = Path(other).resolve()
    python = other / ".venv" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"--against: {python} not found (run `python3 course.py test --co` there)")
    same = [
        a
        for a in assignments
        if (other / "notebooks" / a / f"{a}.ipynb").is_file()
        and (other / "notebooks" / a / f"{a}.ipynb").read_bytes()
        == (pipeline.REPO / "notebooks" / a / f"{a}.ipynb").read_bytes()
    ]
    work = Path(out or tempfile.mkdtemp(prefix="grading-against-"))
    make_class(work, students, same)
    times: dict[str, list[float]] = {"this": [], "other": []}
    runs: dict[str, list] = {"this": [], "other": []}
    for k in range(pairs):
        for which in ("this", "other") if k % 2 == 0 else ("other", "this"):
            repo = pipeline.REPO if which == "this" else other
            py = sys.executable if which == "this" else str(python)
            dest = work / f"graded-{k}-{which}"
            got = subprocess.run(
                [py, "-c", GRADE_ONCE, str(work / "submitted"), str(dest), str(jobs)],
                cwd=repo, capture_output=True, text=True, check=True,
            )  # fmt: skip
            said = json.loads(got.stdout.strip().splitlines()[-1])
            _refuse_failed(dest, f"the {which} checkout")
            times[which].append(said["wall"])
            runs[which].append((dest, said["wall"], said["client_cpu"]))
            print(f"pair {k + 1}: {which:5s} {times[which][-1]:.1f} s", flush=True)
    this, theirs = statistics.median(times["this"]), statistics.median(times["other"])
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {jobs} jobs · "
        f"{'one student' if students == 1 else f'a class of {students}'}, "
        f"{len(same)} notebooks ({', '.join(same)}), {pairs} pairs\n"
        f"median: this checkout {this:.1f} s, {other.name} {theirs:.1f} s: "
        f"{100 * (this / theirs - 1):+.1f} %; sums {sum(times['this']):.1f} s and "
        f"{sum(times['other']):.1f} s: {100 * (sum(times['this']) / sum(times['other']) - 1):+.1f}"
        " %"
    )
    print("\n".join(model_lines(runs["this"], jobs)))
    return 0


def _plain_course(root: Path, assignments: list[str], submitted: Path) -> Path:
    """A course directory as an instructor sets one up for plain nbgrader: an nbgrader_config.py
    beside solutions/ and notebooks/ that loads the course's (which reads course.toml from where
    it lies, so it is loaded in place, not copied), the assignments in the gradebook (`nbgrader
    generate_assignment`, untimed), and the class under submitted/."""
    root.mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(f"load_subconfig({str(pipeline.CONFIG_FILE)!r})\n")
    for a in assignments:
        shutil.copytree(pipeline.REPO / "solutions" / a, root / "solutions" / a)
    shutil.copytree(submitted, root / "submitted")
    for a in assignments:
        _nbgrader(root, "generate_assignment", a, "--force")
    return root


def _nbgrader(root: Path, *args: str) -> float:
    """Run `nbgrader ARGS` in the course directory `root`; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(pipeline.REPO)}  # the kernels import course_utils
    # nbgrader creates its gradebook with the `alembic` program of its environment
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    nbgrader = [sys.executable, "-m", "nbgrader", *args]
    t0 = time.perf_counter()
    subprocess.run(nbgrader, cwd=root, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def _graders(submitted: Path, out: Path, jobs: int, env: dict | None = None) -> tuple[float, str]:
    """Run `python -m graders grade` (sandbox on) as a caller does; wall seconds and its output."""
    cmd = [sys.executable, "-m", "graders", "grade", str(submitted), "--out", str(out)]
    t0 = time.perf_counter()
    got = subprocess.run(
        [*cmd, "--jobs", str(jobs)],
        cwd=pipeline.REPO, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return time.perf_counter() - t0, got.stdout


def _in_turn(pairs: int, a: str, b: str):
    """(pair, which) for `pairs` pairs of runs of `a` and `b`, the first of each pair in turn (a b,
    b a, a b, ...), so that neither always runs on a machine the other just warmed."""
    for k in range(pairs):
        for which in (a, b) if k % 2 == 0 else (b, a):
            yield k, which


def _machine_busy() -> float | None:
    """Seconds of CPU the whole machine has spent busy since boot (/proc/stat), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def compare_threads(
    pairs: int, students: int, jobs: int, out: str | None, assignments: list[str]
) -> int:
    """The same class graded by `python -m graders grade` with each notebook's share of the cores
    for the math libraries' threads (graders/run/threads.py, "share") and with every notebook at
    all of them ("cores": THREAD_VARIABLES set to the core count, which the grader leaves as they
    are, as before the share), `pairs` times each in alternating order: wall clock and the whole
    machine's CPU (/proc/stat) over each run."""
    from graders.run.threads import THREAD_VARIABLES, thread_share

    work = Path(out or tempfile.mkdtemp(prefix="grading-threads-"))
    make_class(work / "class", students, assignments)
    submitted = work / "class" / "submitted"
    plain = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    every = {**plain, **dict.fromkeys(THREAD_VARIABLES, str(thread_share(1)))}
    runs: dict[str, list[tuple[float, float | None]]] = {"share": [], "cores": []}
    grades = set()
    for k, which in _in_turn(pairs, "share", "cores"):
        dest = work / f"graded-{k}-{which}"
        busy = _machine_busy()
        took, _ = _graders(submitted, dest, jobs, plain if which == "share" else every)
        cpu = None if busy is None else _machine_busy() - busy
        _refuse_failed(dest, f"python -m graders grade ({which})")
        grades.add((dest / "grades.csv").read_text(encoding="utf-8"))
        runs[which].append((took, cpu))
        print(
            f"pair {k + 1}: {which}  {took:.1f} s"
            + (f", the machine busy {cpu:.1f} core-s" if cpu is not None else ""),
            flush=True,
        )
    if len(grades) != 1:
        raise SystemExit("the two ways gave different grades.csv files")
    wall = {w: statistics.median(t for t, _ in r) for w, r in runs.items()}
    print(
        f"\n{platform.node()} · {thread_share(1)} cores · {jobs} jobs · {students} students x "
        f"{len(assignments)} notebooks, {pairs} pairs, the same grades every run\n"
        f"median: share {wall['share']:.1f} s, cores {wall['cores']:.1f} s: "
        f"{100 * (wall['share'] / wall['cores'] - 1):+.1f} %"
    )
    return 0


def versus_nbgrader(
    pairs: int, students: int, jobs: int, out: str | None, assignments: list[str]
) -> int:
    """The same class graded by plain `nbgrader autograde` (one command per assignment, as its
    documentation says) and by `python -m graders grade` with the sandbox and the grader-side
    verdicts on, `pairs` times each in alternating order, each into a fresh course or output
    folder; then the grader once more on its last output, with nothing new. Wall clock as a
    caller sees it, programs started and all."""
    work = Path(out or tempfile.mkdtemp(prefix="grading-versus-"))
    make_class(work / "class", students, assignments)
    submitted = work / "class" / "submitted"
    n = sum(1 for _ in submitted.glob("*/*/*.ipynb"))
    times: dict[str, list[float]] = {"nbgrader": [], "graders": []}
    last = None
    for k, which in _in_turn(pairs, "nbgrader", "graders"):
        if which == "nbgrader":
            course = _plain_course(work / f"plain-{k}", assignments, submitted)
            took = sum(_nbgrader(course, "autograde", a, "--force") for a in assignments)
            graded = len(list(Path(course, "autograded").glob("*/*/*.ipynb")))
            if graded != n:
                raise SystemExit(f"nbgrader autograded {graded} of {n} notebooks")
        else:
            last = work / f"graded-{k}"
            took, said = _graders(submitted, last, jobs)
            _refuse_failed(last, "python -m graders grade")
            print(f"  {said.strip().splitlines()[-1]}", flush=True)
        times[which].append(took)
        print(f"pair {k + 1}: {which:8s} {took:.1f} s ({took / n:.2f} s a notebook)", flush=True)
    again, said = _graders(submitted, last, jobs)
    plain, ours = statistics.median(times["nbgrader"]), statistics.median(times["graders"])
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {jobs} jobs · {students} students x "
        f"{len(assignments)} notebooks ({', '.join(assignments)}) = {n}, {pairs} pairs\n"
        f"per notebook (median run / {n}): nbgrader autograde {plain / n:.2f} s, "
        f"python -m graders grade {ours / n:.2f} s: ratio {ours / plain:.2f}\n"
        f"nothing new: {again:.2f} s ({said.strip().splitlines()[-1]})"
    )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--students", type=int, default=None, help="class size (default 50; 1 with --against)"
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--unsafe-no-sandbox", action="store_true", help="grade without the bubblewrap sandbox"
    )
    ap.add_argument("--compare", type=int, default=0, metavar="K", help="K alternating pairs")
    ap.add_argument(
        "--compare-class",
        type=int,
        default=0,
        metavar="B",
        help="the class of --students graded with and without the sandbox, in B alternating blocks",
    )
    ap.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="with --compare K: grade with this checkout and CHECKOUT (its own .venv) in turn",
    )
    ap.add_argument(
        "--notebooks",
        metavar="LIST",
        help='only these assignments, by number: "01-07" (the first seven), "1,3,5-6"',
    )
    ap.add_argument(
        "--versus-nbgrader",
        type=int,
        default=0,
        metavar="K",
        help="the class of --students graded K times each by plain nbgrader autograde and by "
        "python -m graders grade, alternating, then once more with nothing new",
    )
    ap.add_argument(
        "--compare-threads",
        type=int,
        default=0,
        metavar="K",
        help="the class of --students (default 2) graded K times each with each notebook's share "
        "of the cores for torch's and OpenBLAS's threads and with all of them, alternating",
    )
    args = ap.parse_args(argv)
    chosen = select(args.notebooks)
    if args.compare_threads:
        return compare_threads(
            args.compare_threads, args.students or 2, args.jobs, args.out, chosen
        )
    if args.versus_nbgrader:
        return versus_nbgrader(
            args.versus_nbgrader, args.students or 4, args.jobs, args.out, chosen
        )
    if args.against:
        return compare_with(
            Path(args.against), args.compare or 3, args.jobs, args.out, chosen, args.students or 1
        )
    if args.students is None:
        args.students = 50
    if args.compare_class:
        return compare_class(args.students, args.compare_class, args.jobs, args.out, chosen)
    if args.compare:
        return compare(args.compare, args.jobs, args.out, chosen)
    kw = {"sandbox": False} if args.unsafe_no_sandbox else {}
    work = Path(args.out or tempfile.mkdtemp(prefix="grading-bench-"))
    notebooks = len(chosen)
    make_class(work / "one", 1, chosen)
    t0 = time.perf_counter()
    grade(work / "one" / "submitted", work / "one-graded", jobs=args.jobs, progress=False, **kw)
    one = time.perf_counter() - t0
    _refuse_failed(work / "one-graded", "one student")
    make_class(work / "class", args.students, chosen)
    t0 = time.perf_counter()
    outcome = grade(work / "class" / "submitted", work / "class-graded", jobs=args.jobs, **kw)
    whole = time.perf_counter() - t0
    _refuse_failed(work / "class-graded", "the class")
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {args.jobs} jobs · {notebooks} notebooks\n"
        f"one student: {one:.1f} s\n"
        f"class of {args.students}: {whole:.1f} s ({whole / args.students:.1f} s per student); "
        f"phases: {', '.join(f'{k} {v:.1f} s' for k, v in outcome.seconds.items())}"
    )
    print("\n".join(model_lines([(work / "class-graded", whole, outcome.client_cpu)], args.jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
