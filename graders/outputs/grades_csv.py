"""The grades as CSV files: grades.csv, one row per student, and grades_by_cell.csv, one row per
graded cell.

    write_csvs(results, out, assignments)

grades.csv: student, name (as found), one score per assignment, total, max_total, status (the
statuses of the student's rows, `;`-joined) and problems (`<assignment>: <problem>`, ` | `-joined).
grades_by_cell.csv: student, assignment, cell (grade id), score, max_score, misconception, error.
"""

from __future__ import annotations

import csv
from pathlib import Path


def write_csvs(results: list[dict], out: Path, assignments: list[str]) -> None:
    """grades.csv (one row per student: id, name as found, scores) and grades_by_cell.csv (one
    row per graded cell)."""
    students = sorted({r["student"] for r in results})
    by_key = {(r["student"], r["assignment"]): r for r in results}
    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "name", *assignments, "total", "max_total", "status", "problems"])
        for s in students:
            rows = [by_key.get((s, a)) for a in assignments]
            name = next((r["name"] for r in rows if r and r.get("name")), s)
            scores = [r["score"] if r else "" for r in rows]
            total = sum(r["score"] for r in rows if r)
            max_total = sum(r["max_score"] for r in rows if r)
            status = ";".join(sorted({r["status"] for r in rows if r}))
            probs = " | ".join(f"{r['assignment']}: {p}" for r in rows if r for p in r["problems"])
            w.writerow([s, name, *scores, total, max_total, status, probs])
    with open(out / "grades_by_cell.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["student", "assignment", "cell", "score", "max_score", "misconception", "error"]
        )
        for r in results:
            for gid, c in r["cells"].items():
                w.writerow(
                    [
                        r["student"],
                        r["assignment"],
                        gid,
                        c["score"],
                        c["max_score"],
                        c.get("misconception") or "",
                        c.get("error") or "",
                    ]
                )
