"""Autograding throughput: one student's notebooks, and a class, on this machine's cores.

    python -m benchmarks.grading [--students 50] [--jobs N] [--out DIR]

Builds a synthetic class from the bank of graders/bank.py (each student gets, for every notebook,
one of: full solution, untouched release, partial answer, or a named mistake, in turn; every file
written as Jupyter writes it), grades it with `python -m graders grade`, and prints the wall time
for one student and for the class.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from graders import bank, pipeline
from graders.grade import grade


def make_class(folder: Path, students: int) -> None:
    for assignment in pipeline.assignments():
        kinds = bank.core(assignment)  # full, untouched, partial, a named mistake
        for s in range(students):
            entry = kinds[s % len(kinds)]
            one = bank.Entry(f"student{s:03d}", entry.notebook, entry.failing, save=entry.save)
            bank.write([one], folder, assignment)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--unsafe-no-sandbox", action="store_true", help="grade without the bubblewrap sandbox"
    )
    args = ap.parse_args(argv)
    kw = {"sandbox": False} if args.unsafe_no_sandbox else {}
    work = Path(args.out or tempfile.mkdtemp(prefix="grading-bench-"))
    notebooks = len(pipeline.assignments())
    make_class(work / "one", 1)
    t0 = time.perf_counter()
    grade(work / "one" / "submitted", work / "one-graded", jobs=args.jobs, progress=False, **kw)
    one = time.perf_counter() - t0
    make_class(work / "class", args.students)
    t0 = time.perf_counter()
    grade(work / "class" / "submitted", work / "class-graded", jobs=args.jobs, **kw)
    whole = time.perf_counter() - t0
    print(
        f"\n{platform.node()} · {os.cpu_count()} cores · {args.jobs} jobs · {notebooks} notebooks\n"
        f"one student: {one:.1f} s\n"
        f"class of {args.students}: {whole:.1f} s ({whole / args.students:.1f} s per student)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
