"""The class report: score distribution, pass rate per exercise, misconceptions, problems,
and the answers similar enough to review; and, for every submission whatever became of it, a
feedback page and a results file.

report.md is the plain-text summary (what the command prints) with the PNG figures;
report.html is the instructor's page, self-contained (graders/report_html.py), with the checks'
words for each misconception (graders/misconceptions.py).
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from . import report_html, similarity
from .submissions import one_line

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


def _pass_rates(results: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """{(assignment, cell): (full marks, graded)} over the class."""
    rates: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        for gid, c in r["cells"].items():
            entry = rates[(r["assignment"], gid)]
            entry[0] += c["score"] >= c["max_score"]
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(rates.items())}


def _figures(results, assignments, pass_rates, per_exercise) -> dict[str, Figure]:
    """The report's pictures: score distribution, pass rate and misconceptions per exercise.
    per_exercise: {(assignment, cell): {slug: [results]}} (report_html.exercise_misconceptions).
    """
    figs = {}
    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    data = [
        [
            100 * r["score"] / r["max_score"]
            for r in results
            if r["assignment"] == a and r["max_score"]
        ]
        for a in assignments
    ]
    ax.hist(data, bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001], label=assignments)
    ax.set(xlabel="score (% of the assignment's points)", ylabel="submissions")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of submissions
    ax.set_title("Score distribution")
    ax.legend(fontsize=8)
    figs["scores"] = fig

    colours = {a: f"C{i % 10}" for i, a in enumerate(assignments)}
    rows = [((a, gid), 100 * ok / n if n else 0.0) for (a, gid), (ok, n) in pass_rates.items()]
    fig = _bars(
        [gid for (_, gid), _ in rows],
        [v for _, v in rows],
        [colours.get(a, "C0") for (a, _), _ in rows],
        colours,
        xlabel="% of submissions with full marks",
        title="Pass rate per exercise",
        empty="no graded cell",
    )
    fig.axes[0].set_xlim(0, 100)
    figs["pass"] = fig

    bars = [
        (a, f"{slug}\n{gid}", len({r["student"] for r in who}))
        for (a, gid), found in sorted(per_exercise.items())
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


def _bars(labels, values, colours, legend, *, xlabel, title, empty, per_bar=0.32) -> Figure:
    """Horizontal bars, top to bottom in the order given, coloured by assignment (the legend).
    Bars are placed by position, so two assignments' cells of one name stay two bars."""
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


def _save_png(figs: dict[str, Figure], out: Path) -> list[Path]:
    paths = []
    for key, fig in figs.items():
        paths.append(out / _PNG_NAMES[key])
        fig.savefig(paths[-1], format="png", dpi=110)
    return paths


def _svg(fig: Figure) -> bytes:
    """The figure as SVG with its text as text (small, selectable) and no date (reproducible)."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "course-report"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def summary_lines(results, problems, assignments, pass_rates, misconceptions) -> list[str]:
    """The plain-text summary printed at the end of a grading run."""
    lines = [f"Graded {len(results)} notebooks of {len({r['student'] for r in results})} students."]
    for s in report_html.assignment_stats(results, assignments):
        lines.append(
            f"  {s.assignment}: mean {s.mean:.2f} / {s.max_score:g}, median {s.median:g}, "
            f"full marks {s.full_marks}/{s.submissions}"
        )
    lines.append("Pass rate per exercise:")
    for (a, gid), (ok, n) in pass_rates.items():
        lines.append(f"  {a} / {gid}: {ok}/{n} ({100 * ok / n:.0f}%)")
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


def _catalogue():
    """What the checks say about each misconception slug (graders.misconceptions), or None
    when the check modules cannot be read here: the report then shows the slugs alone."""
    from . import misconceptions

    try:
        return misconceptions.catalogue()
    except Exception:  # noqa: BLE001 (the report never fails for want of explanations)
        return None


def finalize(results: list[dict], out: Path) -> None:
    """Every submission, whatever its status, ends with one-line problems, a feedback page and a
    results file (results/<student>/<assignment>.json, rewritten with what was added here)."""
    from .worker import result_path

    for res in results:
        res["problems"] = [one_line(p) for p in res.get("problems", [])]
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
    from .grade import misconception_counts, write_csvs

    finalize(results, out)
    write_csvs(results, out, assignments)
    pass_rates = _pass_rates(results)
    misconceptions = misconception_counts(results)
    per_exercise = report_html.exercise_misconceptions(results)
    figs = _figures(results, assignments, pass_rates, per_exercise)
    pngs = _save_png(figs, out)
    lines = summary_lines(results, problems, assignments, pass_rates, misconceptions)
    pairs = similarity.similar_pairs(results, similarity_threshold)
    write_similarity_csv(pairs, out)
    lines += similarity_lines(pairs, similarity_threshold)
    md = ["# Grading report", "", "```", *lines, "```", ""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    page = report_html.render(
        results,
        problems,
        assignments,
        pass_rates,
        pairs[:REPORT_PAIRS],
        catalogue=_catalogue() if per_exercise else None,
        figures={k: _svg(f) for k, f in figs.items()},
        similarity_note=similarity.available(),
    )
    (out / "report.html").write_text(page, encoding="utf-8")
    print("\n".join(lines))
    print(f"Grades, feedback and the report are in {out}")
    return lines
