"""Command-line tool of the course's instructors.

python -m graders release [ASSIGNMENT ...]   regenerate notebooks/ from solutions/ (nbgrader)
python -m graders sync-setup                 rewrite each solution's Colab setup cell
"""

from __future__ import annotations

import argparse
import sys

from . import pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="regenerate the student notebooks from the solutions")
    rel.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    sub.add_parser("sync-setup", help="rewrite the first (Colab setup) cell of every solution")
    args = parser.parse_args(argv)
    if args.command == "sync-setup":
        for path in pipeline.sync_setup_cells():
            print(f"updated {path.relative_to(pipeline.REPO)}")
    if args.command == "release":
        for path in pipeline.release(only=args.assignments or None):
            print(f"released {path.relative_to(pipeline.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
