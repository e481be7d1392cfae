"""Command-line tool of the course's instructors.

python -m graders release [ASSIGNMENT ...]   regenerate notebooks/ from solutions/ (nbgrader)
python -m graders sync-setup                 rewrite each solution's Colab setup cell
"""

from __future__ import annotations

import argparse
import sys

from graders import pipeline


def grade_doc() -> str:
    from graders import grade

    return grade.__doc__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="regenerate the student notebooks from the solutions")
    rel.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    sub.add_parser("sync-setup", help="rewrite the first (Colab setup) cell of every solution")
    g = sub.add_parser(
        "grade",
        help="autograde a folder of submissions: grades.csv, feedback, report",
        description=grade_doc(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("path", help="submitted/<student>/<assignment>/ folders, or a flat folder")
    g.add_argument("--out", help="where grades, feedback and report go (default: PATH/../graded)")
    g.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes of the local dask cluster (default: cores)",
    )
    g.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="grade on an existing dask.distributed cluster (tcp://host:8786) instead of a local "
        "one; every worker needs the course environment and the same release",
    )
    g.add_argument("--timeout", type=int, default=60, help="seconds one cell may run (60)")
    g.add_argument(
        "--assignment",
        help="grade only this assignment (needed for a flat folder "
        "whose file names hold no assignment id)",
    )
    g.add_argument("--regrade", action="store_true", help="grade again what was graded before")
    g.add_argument("--memory-gb", type=float, default=6.0, help="memory cap per submission (6)")
    g.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the students' code without the bubblewrap sandbox, as your user (only where "
        "no sandbox can be made and you trust the submissions or the machine is throwaway)",
    )
    g.add_argument(
        "--course-dir",
        metavar="DIR",
        help="the instructor's nbgrader course directory: record every verdict in its gradebook "
        "and put the autograded notebooks where Formgrader and generate_feedback look",
    )
    g.add_argument(
        "--gradebook",
        metavar="URL",
        help="the nbgrader gradebook's database URL (default: sqlite:///DIR/gradebook.db)",
    )
    g.add_argument(
        "--export",
        action="append",
        metavar="LMS",
        help="also write grades an LMS imports: canvas, moodle (repeat, or comma-separated)",
    )
    g.add_argument(
        "--roster",
        metavar="FILE",
        help="the class list, a CSV with columns student, name, lms_id, sis_id, login, section, "
        "email (only student is required): every student in it gets a row for every assignment "
        "(`missing` where nothing was handed in), and the LMS exports use its ids",
    )
    args = parser.parse_args(argv)
    if args.command == "grade":
        from graders.grade import grade
        from graders.gradebook import GradebookError
        from graders.sandbox import SandboxUnavailable

        try:
            grade(
                args.path,
                args.out,
                jobs=args.jobs,
                timeout=args.timeout,
                assignment=args.assignment,
                regrade=args.regrade,
                memory_gb=args.memory_gb,
                sandbox=not args.unsafe_no_sandbox,
                scheduler=args.scheduler,
                course_dir=args.course_dir,
                gradebook=args.gradebook,
                exports=args.export,
                roster=args.roster,
            )
        except GradebookError as exc:
            parser.exit(2, f"error: {exc}\n")
        except SandboxUnavailable as exc:
            parser.exit(2, f"error: {exc}\n")
        except (ValueError, OSError) as exc:  # OSError: no scheduler at that address
            parser.exit(2, f"error: {exc}\n")
    if args.command == "sync-setup":
        for path in pipeline.sync_setup_cells():
            print(f"updated {path.relative_to(pipeline.REPO)}")
    if args.command == "release":
        for path in pipeline.release(only=args.assignments or None):
            print(f"released {path.relative_to(pipeline.REPO)}")
    return 0


if __name__ == "__main__":
    pipeline.skip_iri_grammar()  # before anything imports nbformat: the first line comes sooner
    sys.exit(main())
