"""The class report: score distribution, pass rate per exercise, misconceptions, problems,
and the answers similar enough to review; and, for every submission whatever became of it, a
feedback page and a results file.

report.md is the plain-text summary (what the command prints) with the PNG figures;
report.html is the instructor's page, self-contained (graders/outputs/report_html.py), with the
checks' words for each misconception (graders/outputs/misconceptions.py). The exercises' names
and order come from graders/outputs/exercises.py, grades.csv and grades_by_cell.csv from
graders/outputs/grades_csv.py; write_outputs writes them all.
"""

from __future__ import annotations

import csv
import datetime
import html
import json
import re
import statistics
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from graders.intake.submissions import one_line
from graders.outputs import report_html, similarity
from graders.outputs.exercises import Exercise, cell_order, exercise_outline
from graders.outputs.grades_csv import write_csvs
from graders.run import pipeline

if TYPE_CHECKING:  # matplotlib is imported when the figures are made (it is most of the cost)
    from matplotlib.figure import Figure

REPORT_PAIRS = 40  # similar pairs listed in report.md / report.html; all are in similarity.csv

# What a feedback page says when nbgrader made none, by status
_WHAT_HAPPENED = {
    "invalid-notebook": (
        "Your file could not be read as a Jupyter notebook, so nothing in it was graded. Open "
        "it in Jupyter (or download it again from where you worked), save it, and submit it again."
    ),
    "autograde-failed": (
        "The grader could not run your notebook. This is a problem of the grading, not a score "
        "of your work: your instructor sees the same message and will look into it."
    ),
    "grader-error": (
        "Grading stopped before it finished. This is a problem of the grading, not a score of "
        "your work: your instructor sees the same message and will look into it."
    ),
    "timeout": (
        "Grading your notebook took longer than the time allowed and was stopped. Your "
        "instructor sees the same message."
    ),
}


def course_commit(root: Path = pipeline.REPO) -> str:
    """The course's commit (`git rev-parse --short HEAD`), or "unknown" outside a git checkout."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def course_points(results: list[dict], assignments: list[str], max_score=None) -> dict:
    """{assignment: its points}: the grader's (max_score), else the release's, else the most
    any result was graded out of. A student's total is out of their sum, whatever they sent."""
    max_score = max_score or {}
    points = {}
    for a in assignments:
        given = float(max_score.get(a) or 0)
        release = sum(ex.points for ex in exercise_outline(a))
        graded = max((float(r["max_score"]) for r in results if r["assignment"] == a), default=0)
        points[a] = given or graded or release
    return points


# ---- item analysis ------------------------------------------------------------------------------


@dataclass
class Item:
    assignment: str
    exercise: Exercise
    kind: str  # "exercise", "quick check" or "concept question"
    students: int  # the students who submitted the notebook (missing ones are not counted)
    full_marks: int
    difficulty: float | None  # the mean fraction of the item's points
    discrimination: float | None  # corrected item-total correlation; None: undefined


def _kind(ex: Exercise) -> str:
    words = f"{ex.title} {ex.grade_id}".lower()
    if "concept" in words:
        return "concept question"
    return "quick check" if "quick" in words else "exercise"


def item_analysis(results: list[dict], assignments: list[str]) -> list[Item]:
    """Per graded cell, in the notebooks' order: difficulty, the mean fraction of its points
    over the students who submitted the notebook (a cell that did not run scores 0), and
    discrimination, the correlation of that score with the rest of the student's course total
    (their total less this cell: the corrected item-total correlation). Discrimination is None
    with fewer than 3 students or when either side does not vary. A cell graded for no one
    is left out."""
    totals: dict[str, float] = defaultdict(float)
    for r in results:
        totals[r["student"]] += float(r["score"])
    items = []
    for a, ex in cell_order(results, assignments):
        rows = [r for r in results if r["assignment"] == a and r.get("status") != "missing"]
        if not any(ex.grade_id in r.get("cells", {}) for r in rows):
            continue  # graded for no one (no notebook ran): nothing to analyse
        scores = [float(r.get("cells", {}).get(ex.grade_id, {}).get("score") or 0) for r in rows]
        rest = [totals[r["student"]] - s for r, s in zip(rows, scores, strict=True)]
        top = ex.points or max(
            (
                float(r["cells"][ex.grade_id]["max_score"])
                for r in rows
                if ex.grade_id in r["cells"]
            ),
            default=0.0,
        )
        difficulty = statistics.mean(s / top for s in scores) if rows and top else None
        discrimination = None
        if len(rows) >= 3 and len(set(scores)) > 1 and len(set(rest)) > 1:
            discrimination = statistics.correlation(scores, rest)
        full = sum(bool(top) and s >= top for s in scores)
        items.append(Item(a, ex, _kind(ex), len(rows), full, difficulty, discrimination))
    return items


# ---- cells as the feedback page numbers them ---------------------------------------------------

_CELL_INDEX = re.compile(r"\bcell #(\d+)\b")


def feedback_labels(nb) -> dict[int, str]:
    """{cell index: the name the feedback page gives that code cell}: a graded cell's grade_id
    (its heading says "Grade cell: <id>"), else its prompt "In [n]" (nbconvert prints the
    execution count), else, for a cell that never ran ("In [ ]"), its place among code cells."""
    labels, place = {}, 0
    for idx, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        place += 1
        meta = cell.get("metadata", {}).get("nbgrader", {})
        count = cell.get("execution_count")
        if meta.get("grade") and meta.get("grade_id"):
            labels[idx] = meta["grade_id"]
        else:
            labels[idx] = f"In [{count}]" if count else f"In [ ] (code cell {place})"
    return labels


def relabel_cells(problems: list[str], autograded: Path | None) -> list[str]:
    """Problems that name a cell by its index ("cell #53") name it as its feedback page does
    ("cell In [22]"), read from the autograded notebook; unchanged without one."""
    if not autograded or not any(_CELL_INDEX.search(p) for p in problems):
        return problems
    try:
        labels = feedback_labels(json.loads(Path(autograded).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return problems

    def swap(m: re.Match) -> str:
        return f"cell {labels.get(int(m.group(1)), '#' + m.group(1))}"

    return [_CELL_INDEX.sub(swap, p) for p in problems]


def _pass_rates(results: list[dict], assignments: list[str] | None = None):
    """{(assignment, cell): (full marks, graded)} over the class, in the notebooks' order."""
    if assignments is None:
        assignments = list(dict.fromkeys(r["assignment"] for r in results))
    rates = {}
    for a, ex in cell_order(results, assignments):
        got = [
            c
            for c in (r.get("cells", {}).get(ex.grade_id) for r in results if r["assignment"] == a)
            if c
        ]
        if got:
            rates[(a, ex.grade_id)] = (sum(c["score"] >= c["max_score"] for c in got), len(got))
    return rates


def _figures(results, assignments, pass_rates, per_exercise, titles=None) -> dict[str, Figure]:
    """The report's pictures: score distribution, pass rate and misconceptions per exercise,
    each made once (PNG files for report.md, the same bytes inline in report.html).
    per_exercise: {(assignment, cell): {slug: [results]}} (report_html.exercise_misconceptions);
    titles: {(assignment, cell): title} for the bars (default: the cell's id)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    titles = titles or {}
    figs = {}
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    sent = [r for r in results if r.get("status") != "missing" and r["max_score"]]
    data = [
        [100 * r["score"] / r["max_score"] for r in sent if r["assignment"] == a]
        for a in assignments
    ]
    ax.hist(data, bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001], label=assignments)
    ax.set(xlabel="score (% of the assignment's points)", ylabel="submissions", xlim=(0, 100))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of submissions
    missing = sum(r.get("status") == "missing" for r in results)
    ax.set_title("Score distribution" + (f" ({missing} missing, not shown)" if missing else ""))
    if len(assignments) > 1:  # above the plot, never over a bar
        fig.legend(fontsize=8, loc="outside upper center", ncols=min(4, len(assignments)))
    figs["scores"] = fig

    colours = {a: f"C{i % 10}" for i, a in enumerate(assignments)}
    rows = [((a, gid), 100 * ok / n if n else 0.0) for (a, gid), (ok, n) in pass_rates.items()]
    fig = _bars(
        [_short(titles.get(key, key[1])) for key, _ in rows],
        [v for _, v in rows],
        [colours.get(a, "C0") for (a, _), _ in rows],
        colours,
        xlabel="% of submissions with full marks",
        title="Pass rate per exercise",
        empty="no graded cell",
    )
    fig.axes[0].set_xlim(0, 100)
    figs["pass"] = fig

    order = {key: i for i, key in enumerate(pass_rates)}
    bars = [
        (a, f"{slug}\n{_short(titles.get((a, gid), gid))}", len({r["student"] for r in who}))
        for (a, gid), found in sorted(per_exercise.items(), key=lambda kv: order.get(kv[0], 1e9))
        for slug, who in sorted(found.items(), key=lambda kv: -len(kv[1]))
    ]
    fig = _bars(
        [label for _, label, _ in bars],
        [count for _, _, count in bars],
        [colours.get(a, "C0") for a, _, _ in bars],
        colours,
        xlabel="students",
        title="Misconceptions per exercise",
        empty="no named misconception was seen",
        per_bar=0.6,
    )
    if bars:  # counts of students (an empty chart has no ticks at all)
        fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    figs["miscs"] = fig
    return figs


def _short(text: str, limit: int = 38) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bars(labels, values, colours, legend, *, xlabel, title, empty, per_bar=0.32) -> Figure:
    """Horizontal bars, top to bottom in the order given, coloured by assignment (the legend).
    Bars are placed by position, so two assignments' cells of one name stay two bars."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(6.5, per_bar * max(3, len(labels)) + 1.2), layout="constrained")
    ax = fig.subplots()
    if not labels:
        ax.text(0.5, 0.5, empty, ha="center", va="center")
        ax.set(xticks=[], yticks=[], title=title)
        return fig
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color=colours)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set(xlabel=xlabel, title=title, ylim=(-0.6, len(labels) - 0.4))
    used = [a for a in legend if legend[a] in set(colours)]
    if len(used) > 1:
        handles = [Patch(color=legend[a], label=a) for a in used]
        fig.legend(handles=handles, fontsize=8, loc="outside upper center", ncols=len(used))
    return fig


_PNG_NAMES = {
    "scores": "score_distribution.png",
    "pass": "exercise_pass_rates.png",
    "miscs": "misconceptions.png",
}


def _png(fig: Figure) -> bytes:
    """The figure as PNG, without a date or software stamp (the same figure, the same bytes)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": None})
    return buf.getvalue()


def _save_png(figs: dict[str, bytes], out: Path) -> list[Path]:
    paths = []
    for key, png in figs.items():
        paths.append(out / _PNG_NAMES[key])
        paths[-1].write_bytes(png)
    return paths


def summary_lines(
    results, problems, assignments, pass_rates, misconceptions, titles=None, items=None
) -> list[str]:
    """The plain-text summary printed at the end of a grading run."""
    titles = titles or {}
    sent = [r for r in results if r.get("status") != "missing"]
    students = len({r["student"] for r in results})
    lines = [f"Graded {len(sent)} notebooks of {students} students."]
    counts = report_html.status_counts(results)
    if set(counts) - {"graded"}:
        lines.append("  by status: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for s in report_html.assignment_stats(results, assignments):
        pct = 100 * s.mean / s.max_score if s.max_score else 0.0
        lines.append(
            f"  {s.assignment}: mean {s.mean:.2f} / {s.max_score:g} ({pct:.0f}%), "
            f"median {s.median:g}, full marks {s.full_marks}/{s.submissions}"
            + (f", missing {s.missing}" if s.missing else "")
        )
    lines.append("Pass rate per exercise:")
    for (a, gid), (ok, n) in pass_rates.items():
        title = titles.get((a, gid))
        name = f"{title} ({gid})" if title and title != gid else gid
        lines.append(f"  {a} / {name}: {ok}/{n} ({100 * ok / n:.0f}%)")
    if items:
        lines.append(
            "Item analysis (difficulty: mean share of the points; discrimination: "
            "correlation with the rest of the total):"
        )
        for it in items:
            lines.append(
                f"  {it.assignment} / {it.exercise.grade_id}: difficulty "
                f"{report_html.fmt_share(it.difficulty)}, discrimination "
                f"{report_html.fmt_corr(it.discrimination)} ({it.students} students)"
            )
    if misconceptions:
        lines.append("Misconceptions seen (failed test cells):")
        lines += [f"  {name}: {count}" for name, count in misconceptions.most_common()]
    flagged = [(r["student"], r["assignment"], p) for r in results for p in r["problems"]]
    if flagged or problems:
        lines.append("Problems (by student and cell):")
        lines += [f"  {s}/{a}: {p}" for s, a, p in flagged]
        lines += [f"  {p}" for p in problems]
    return lines


def fallback_feedback(result: dict) -> str:
    """The feedback page of a submission nbgrader made none for: what happened, in words."""
    status = result.get("status", "")
    said = _WHAT_HAPPENED.get(
        status,
        "nbgrader could not make the feedback page of this notebook; the score of each graded "
        "cell is below.",
    )
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in result.get("problems", []))
    cells = "".join(
        f"<tr><td>{html.escape(gid)}</td><td>{c['score']:g} / {c['max_score']:g}</td>"
        f"<td>{html.escape(c.get('error') or '')}</td></tr>"
        for gid, c in result.get("cells", {}).items()
    )
    title = f"{result['assignment']}: feedback for {result['student']}"
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:50em;margin:auto}"
        "td,th{border:1px solid #ccc;padding:2px 6px}table{border-collapse:collapse}</style>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p><b>Score: {result.get('score', 0):g} / {result.get('max_score', 0):g}</b> "
        f"(status: {html.escape(status)})</p><p>{html.escape(said)}</p>"
        + (f"<h2>What happened</h2><ul>{problems}</ul>" if problems else "")
        + (
            "<h2>Graded cells</h2><table><tr><th>cell</th><th>score</th><th>error</th></tr>"
            f"{cells}</table>"
            if cells
            else ""
        )
    )


def _catalogue(per_exercise: dict):
    """What the checks say about each misconception slug seen (graders.outputs.misconceptions): read
    from the assignments' own check modules when they explain every slug seen, else from all.
    None when the check modules cannot be read here: the report then shows the slugs alone."""
    from graders.outputs import misconceptions

    try:
        mine = {m for a, _ in per_exercise for m in misconceptions.modules_of(a)}
        part = misconceptions.catalogue(modules=tuple(sorted(mine | {"engine"})))
        if all(slug in part for found in per_exercise.values() for slug in found):
            return part
        return misconceptions.catalogue()
    except Exception:  # noqa: BLE001 (the report never fails for want of explanations)
        return None


def finalize(results: list[dict], out: Path) -> None:
    """Every submission, whatever its status, ends with one-line problems, a feedback page and a
    results file (results/<student>/<assignment>.json, rewritten with what was added here); a
    `missing` row (nothing handed in) gets neither."""
    from graders.run.worker import result_path

    for res in results:
        if res["status"] == "missing":  # nothing handed in: no page, no result to reuse
            continue
        autograded = out / res["autograded"] if res.get("autograded") else None
        problems = [one_line(p) for p in res.get("problems", [])]
        res["problems"] = relabel_cells(problems, autograded)
        page = out / res["feedback"] if res.get("feedback") else None
        if page is None or not page.is_file():
            page = out / "feedback" / res["student"] / f"{res['assignment']}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(fallback_feedback(res), encoding="utf-8")
            res["feedback"] = str(page.relative_to(out))
        path = result_path(out, res["student"], res["assignment"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, ensure_ascii=False), encoding="utf-8")


def similarity_lines(pairs: list[similarity.Pair], threshold: float) -> list[str]:
    """The report's section on similar answers."""
    why = similarity.available()
    lines = [
        f"Similar answers, to review (answer cells only; {threshold:.0%} or more of an answer's "
        "tokens found in the other, after the release's stubs are removed):"
    ]
    if why:
        return lines + [f"  {why}"]
    if not pairs:
        return lines + ["  none"]
    for p in pairs[:REPORT_PAIRS]:
        other = f" ({p.other_share:.0%} of theirs)" if p.other_share is not None else ""
        lines.append(f"  {p.assignment}: {p.student} ~ {p.other}: {p.share:.0%}{other}")
    if len(pairs) > REPORT_PAIRS:
        lines.append(f"  ... and {len(pairs) - REPORT_PAIRS} more in similarity.csv")
    lines.append(
        "  (a pair is a question, not a verdict: short exercises leave little room to differ)"
    )
    return lines


def write_similarity_csv(pairs: list[similarity.Pair], out: Path) -> None:
    with open(out / "similarity.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["assignment", "student", "other", "share", "other_share"])
        for p in pairs:
            other = "" if p.other_share is None else f"{p.other_share:.3f}"
            w.writerow([p.assignment, p.student, p.other, f"{p.share:.3f}", other])


def misconception_counts(results: list[dict]) -> Counter:
    """How many graded cells named each misconception."""
    return Counter(
        c["misconception"] for r in results for c in r["cells"].values() if c.get("misconception")
    )


def write_outputs(
    results,
    problems,
    out: Path,
    assignments,
    max_score,
    similarity_threshold: float = similarity.THRESHOLD,
) -> list[str]:
    """Write the feedback and results of every submission, the CSVs, plots and report files;
    print and return the summary."""
    finalize(results, out)
    write_csvs(results, out, assignments)
    pass_rates = _pass_rates(results, assignments)
    titles = {(a, ex.grade_id): ex.title for a, ex in cell_order(results, assignments)}
    items = item_analysis(results, assignments)
    misconceptions = misconception_counts(results)
    per_exercise = report_html.exercise_misconceptions(results)
    figs = {
        k: _png(f)
        for k, f in _figures(results, assignments, pass_rates, per_exercise, titles).items()
    }
    pngs = _save_png(figs, out)
    lines = summary_lines(results, problems, assignments, pass_rates, misconceptions, titles, items)
    pairs = similarity.similar_pairs(
        [r for r in results if r.get("status") != "missing"], similarity_threshold
    )
    write_similarity_csv(pairs, out)
    lines += similarity_lines(pairs, similarity_threshold)
    written = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()
    commit = course_commit()
    head = f"Written {written}, course commit {commit}."
    md = ["# Grading report", "", head, "", "```", *lines, "```", ""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    page = report_html.render(
        results,
        problems,
        assignments,
        pass_rates,
        pairs[:REPORT_PAIRS],
        catalogue=_catalogue(per_exercise) if per_exercise else None,
        figures=figs,
        similarity_note=similarity.available(),
        outline=[(a, ex) for a, ex in cell_order(results, assignments)],
        items=items,
        points=course_points(results, assignments, max_score),
        written=written,
        commit=commit,
    )
    (out / "report.html").write_text(page, encoding="utf-8")
    print(head)
    print("\n".join(lines))
    print(f"Grades, feedback and the report are in {out}")
    return lines
