"""How long each graded check cell takes in a real Jupyter kernel, as a learner and a grader see it.

Each instructor notebook in solutions/ runs top to bottom in a fresh IPython kernel (nbclient, as
`tests/notebooks/test_notebooks.py`
runs them). Every graded test cell is split in two before the run: the
visible part (what the student's notebook runs when the learner presses Shift-Enter) and the
hidden tests (what autograding adds), each timed from the kernel's own execute_input and
execute_reply messages: the wall clock a caller sees, the kernel's queue excluded.

    python -m benchmarks.check_cells                       # every notebook
    python -m benchmarks.check_cells 06_triton_forward 09_flash_decoding --json out.json

Prints one table: notebook, cell, visible seconds, hidden seconds, and a mark on any part over
the 5 s a check cell is allowed (issue 40). Exits 1 when a cell raised (a solution that fails its
own check is a bug, not a time).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUDGET_S = 5.0
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def _is_check(cell) -> bool:
    meta = _nbgrader(cell)
    return cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution")


def split_hidden(nb):
    """A copy of nb whose graded test cells are split into their visible part and their hidden
    tests (two cells, marked `timed` = (grade_id, "visible" | "hidden") in their metadata)."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb.cells:
        if not _is_check(cell):
            cells.append(cell)
            continue
        grade_id = _nbgrader(cell).get("grade_id")
        visible, _, rest = cell.source.partition(HIDDEN_BEGIN)
        hidden = rest.partition(HIDDEN_END)[0]
        first = copy.deepcopy(cell)
        first.source = visible
        first.metadata["timed"] = [grade_id, "visible"]
        cells.append(first)
        if hidden.strip():
            second = copy.deepcopy(cell)
            second.id = f"{cell.get('id', grade_id)}-hidden"
            second.source = hidden
            second.metadata["timed"] = [grade_id, "hidden"]
            cells.append(second)
    nb.cells = cells
    return nb


def _seconds(cell) -> float | None:
    times = cell.get("metadata", {}).get("execution", {})
    start, end = times.get("iopub.execute_input"), times.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = dt.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def time_notebook(name: str, timeout: int = 900) -> tuple[list[dict], list[str]]:
    """Run solutions/<name>/<name>.ipynb in a fresh kernel: ([{cell, part, seconds}], errors)."""
    import nbformat
    from nbclient import NotebookClient

    from graders.run.local_kernel import LocalKernelManager

    path = REPO / "solutions" / name / f"{name}.ipynb"
    nb = split_hidden(nbformat.read(path, as_version=4))
    env_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = env_path
    os.environ.setdefault("MPLBACKEND", "Agg")
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True, record_timing=True,
        resources={"metadata": {"path": str(path.parent)}},
        kernel_manager_class=LocalKernelManager,  # no TCP port to lose to another process
    )  # fmt: skip
    client.execute()
    rows, errors = [], []
    for cell in nb.cells:
        timed = cell.get("metadata", {}).get("timed")
        if cell.get("cell_type") == "code":
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    errors.append(
                        f"{name} {cell.get('id')}: {out.get('ename')}: {out.get('evalue')}"
                    )
        if timed:
            rows.append({"cell": timed[0], "part": timed[1], "seconds": _seconds(cell)})
    return rows, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="names under solutions/ (default: all)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    names = args.notebooks or sorted(p.name for p in (REPO / "solutions").iterdir() if p.is_dir())
    print(
        f"# check cells, {dt.date.today()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print("| notebook | cell | visible s | hidden s |\n|---|---|---|---|", flush=True)
    everything, failed = {}, []
    for name in names:
        start = time.perf_counter()
        rows, errors = time_notebook(name)
        failed += errors
        everything[name] = rows
        by_cell: dict[str, dict] = {}
        for row in rows:
            by_cell.setdefault(row["cell"], {})[row["part"]] = row["seconds"]
        for cell, parts in by_cell.items():
            shown = []
            for part in ("visible", "hidden"):
                s = parts.get(part)
                shown.append(
                    "" if s is None else f"{s:.2f}" + (" (over 5 s)" if s > BUDGET_S else "")
                )
            print(f"| {name} | {cell} | {shown[0]} | {shown[1]} |", flush=True)
        print(f"<!-- {name}: whole notebook {time.perf_counter() - start:.0f} s -->", flush=True)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    for line in failed:
        print("error:", line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
