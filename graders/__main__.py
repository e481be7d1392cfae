"""Command-line tool of the course's instructors.

python -m graders build [ASSIGNMENT ...]     write solutions/*.ipynb from the text in source/*.md
python -m graders release [ASSIGNMENT ...]   build, then regenerate notebooks/ (nbgrader) and point
                                             README's Colab badges at course.toml's repository
python -m graders import-notebook PATH ...   write source/NN_topic.md from an instructor notebook
python -m graders sync-setup                 build: every setup cell and badge from course.toml
python -m graders grade PATH                 autograde submissions (defaults: course.toml [grader])
"""

from __future__ import annotations

import argparse
import sys

from graders import pipeline, settings


def grade_doc() -> str:
    from graders import grade

    return grade.__doc__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bld = sub.add_parser("build", help="write solutions/*.ipynb from source/*.md")
    bld.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    rel = sub.add_parser("release", help="build, then regenerate the student notebooks")
    rel.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    imp = sub.add_parser(
        "import-notebook",
        help="write source/NN_topic.md from solutions/NN_topic/NN_topic.ipynb (the text form)",
    )
    imp.add_argument("paths", nargs="+", help="instructor notebooks (.ipynb)")
    sub.add_parser("sync-setup", help="build: the Colab setup cells and badges from course.toml")
    defaults = settings.load()
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
        default=defaults.jobs,
        help="worker processes of the local dask cluster (default: course.toml's jobs; 0 or "
        "unset there: one per core)",
    )
    g.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="grade on an existing dask.distributed cluster (tcp://host:8786) instead of a local "
        "one; every worker needs the course environment and the same release",
    )
    g.add_argument(
        "--timeout",
        type=int,
        default=defaults.timeout,
        help=f"seconds one cell may run (course.toml: {defaults.timeout})",
    )
    g.add_argument(
        "--assignment",
        help="grade only this assignment (needed for a flat folder "
        "whose file names hold no assignment id)",
    )
    g.add_argument("--regrade", action="store_true", help="grade again what was graded before")
    g.add_argument(
        "--memory-gb",
        type=float,
        default=defaults.memory_gb,
        help=f"memory cap per submission (course.toml: {defaults.memory_gb:g})",
    )
    g.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the students' code without the bubblewrap sandbox, as your user (only where "
        "no sandbox can be made and you trust the submissions or the machine is throwaway; "
        "course.toml's `sandbox = false` does so on every run)",
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
        help="also write grades an LMS imports: canvas, moodle (repeat, or comma-separated; "
        "course.toml's exports are always written)",
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
                sandbox=defaults.sandbox and not args.unsafe_no_sandbox,
                scheduler=args.scheduler,
                course_dir=args.course_dir,
                gradebook=args.gradebook,
                exports=[*defaults.exports, *(args.export or [])] or None,
                roster=args.roster,
            )
        except GradebookError as exc:
            parser.exit(2, f"error: {exc}\n")
        except SandboxUnavailable as exc:
            parser.exit(2, f"error: {exc}\n")
        except (ValueError, OSError) as exc:  # OSError: no scheduler at that address
            parser.exit(2, f"error: {exc}\n")
        return 0
    from graders import authoring, notebook_text  # nbformat: after skip_iri_grammar

    if args.command == "import-notebook":
        for path in args.paths:
            try:
                out = notebook_text.import_notebook(path, pipeline.REPO / notebook_text.SOURCE)
            except (notebook_text.NotebookTextError, OSError) as exc:
                parser.exit(2, f"error: {exc}\n")
            print(f"wrote {out.relative_to(pipeline.REPO)}")
    if args.command in ("build", "release", "sync-setup"):
        only = getattr(args, "assignments", None) or None
        root = pipeline.REPO
        try:
            if args.command == "release":
                built, badges, released = notebook_text.release(root, only)
            else:
                built = notebook_text.build(root, only)
                badges = authoring.sync_badge_files(root)
                released = []
        except ValueError as exc:  # NotebookTextError too: names the file and the cell
            parser.exit(2, f"error: {exc}\n")
        for path in [*built, *badges]:
            print(f"updated {path.relative_to(root)}")
        if not built and not badges:
            print("solutions/ and the Colab badges are up to date with source/ and course.toml")
        for path in released:
            print(f"released {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    pipeline.skip_iri_grammar()  # before anything imports nbformat: the first line comes sooner
    sys.exit(main())
