"""The class report as one self-contained HTML page (report.html): the instructor's view.

    summary      students, submissions, and per assignment the mean, median and full marks,
                 with the score distribution
    scores       students x assignments, each score a link to that feedback page, its status
                 as a badge, the row total; sortable by any column (a few lines of inline JS;
                 without JS it is a plain table)
    exercises    per graded cell: the pass rate, and the misconceptions met there with the
                 checks' title and explanation and the students who showed them
    problems     grouped by cause, one line each, with the students affected
    review       the static scan's flags and the similar pairs, linked to the feedback pages

Nothing is loaded from elsewhere: CSS and JS are inline, the figures are SVG in data URIs. Every
string a student controls (names, file names, error text, code lines) is escaped here; the one
way text enters the page is `_e`.
"""

from __future__ import annotations

import base64
import html
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import quote

# A badge per status, and "problems" for a graded notebook the grader noted something about
STATUS_TEXT = {
    "graded": "graded",
    "missing": "missing",
    "untouched": "untouched",
    "problems": "problems",
    "needs-review": "needs review",
    "invalid-notebook": "invalid notebook",
    "autograde-failed": "autograde failed",
    "grader-error": "grader error",
    "timeout": "timeout",
}
# What each badge means (the legend under the scores)
STATUS_MEANS = {
    "graded": "graded",
    "missing": "nothing submitted: 0 points, counted in the total",
    "untouched": "the released notebook came back unchanged (graded as it is)",
    "problems": "graded, with a problem noted (see Problems)",
    "needs-review": "graded, but the static scan flagged code to look at",
    "invalid-notebook": "the file is not a notebook; nothing graded",
    "autograde-failed": "nbgrader could not run it",
    "grader-error": "grading stopped (the grader's problem, not the student's)",
    "timeout": "a cell ran past the time limit",
}


def _e(text) -> str:
    """Text (any object) escaped for HTML content and quoted attributes."""
    return html.escape(str(text), quote=True)


def href(path: str) -> str:
    """A relative link to an output file, percent-encoded (names of any script, spaces, #, ?)."""
    return _e(quote(str(path).replace("\\", "/"), safe="/"))


@dataclass
class AssignmentStats:
    assignment: str
    submissions: int  # notebooks submitted (missing ones are not)
    max_score: float
    mean: float  # over every student with a row, a missing notebook counting 0
    median: float
    full_marks: int
    missing: int = 0


def assignment_stats(results: list[dict], assignments: list[str]) -> list[AssignmentStats]:
    """Per assignment: submissions, the mean and median score (a missing notebook counts 0, as
    in grades.csv), how many full marks, how many missing."""
    stats = []
    for a in assignments:
        rows = [r for r in results if r["assignment"] == a]
        if not rows:
            continue
        scores = [float(r["score"]) for r in rows]
        top = max(float(r["max_score"]) for r in rows)
        missing = sum(r.get("status") == "missing" for r in rows)
        stats.append(
            AssignmentStats(
                a,
                len(rows) - missing,
                top,
                statistics.mean(scores),
                statistics.median(scores),
                sum(top > 0 and s >= top for s in scores),
                missing,
            )
        )
    return stats


def badges(res: dict) -> list[str]:
    """The badges a score shows: its status, "problems" when a graded (or untouched) notebook
    has problems noted, and "timeout" when a cell ran past the time limit or grading stopped."""
    status = res.get("status", "graded")
    out = [status]
    problems = res.get("problems", [])
    if status in ("graded", "untouched") and problems:
        out.append("problems")
    timed_out = any(
        (c.get("error") or "").startswith("CellTimeoutError") for c in res.get("cells", {}).values()
    ) or any("time limit" in p or "took longer than" in p for p in problems)
    if timed_out and "timeout" not in out:
        out.append("timeout")
    return out


def status_counts(results: list[dict]) -> dict[str, int]:
    """How many notebooks show each badge, in the order of STATUS_TEXT."""
    seen: dict[str, int] = defaultdict(int)
    for r in results:
        for b in badges(r):
            seen[b] += 1
    order = list(STATUS_TEXT)
    return dict(
        sorted(seen.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0]))
    )


def fmt_share(x: float | None) -> str:
    """A fraction as a percentage, "n/a" when undefined."""
    return "n/a" if x is None else f"{100 * x:.0f}%"


def fmt_corr(x: float | None) -> str:
    """A correlation with two decimals, "n/a" when undefined."""
    return "n/a" if x is None else f"{x:+.2f}"


def _pct(score: float, top: float) -> str:
    return f"{100 * score / top:.0f}%" if top else "n/a"


def _badge(status: str) -> str:
    cls = re.sub(r"[^a-z-]", "", status.lower()) or "other"
    return f'<span class="badge b-{cls}">{_e(STATUS_TEXT.get(status, status))}</span>'


# ---- problems grouped by cause ----------------------------------------------------------------

_CELL = re.compile(r"^cell ([^:]{1,80}): (.+)$")


def _trailing_parenthesis(text: str) -> int | None:
    """Where the parenthesis that closes `text` opens (nested ones included), or None."""
    if not text.endswith(")"):
        return None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None


def cause_of(problem: str) -> tuple[str, str]:
    """(cause, detail) of a one-line problem: what several students can share, and what is
    theirs alone (the cell, a file name, the line flagged)."""
    from graders.intake.submissions import OLDER_UPLOAD

    if problem.startswith(OLDER_UPLOAD):
        return OLDER_UPLOAD.rstrip(":"), problem[len(OLDER_UPLOAD) :].strip()
    head, sep, rest = problem.partition(", to review: ")
    if sep:
        return head, rest
    detail = ""
    m = _CELL.match(problem)
    if m:
        detail, problem = f"cell {m.group(1)}", m.group(2)
    cut = _trailing_parenthesis(problem)
    if cut:  # "the file is not JSON (Expecting ',' delimiter: line 3 column 1 (char 9))"
        detail = ", ".join(x for x in (detail, problem[cut + 1 : -1]) if x)
        problem = problem[:cut].rstrip()
    return problem, detail


@dataclass
class ProblemGroup:
    cause: str
    who: list[tuple[dict, str]] = field(default_factory=list)  # (result, detail)


def problem_groups(results: list[dict]) -> list[ProblemGroup]:
    """The submissions' problems grouped by cause, the most common cause first."""
    groups: dict[str, ProblemGroup] = {}
    for r in results:
        for p in r.get("problems", []):
            cause, detail = cause_of(p)
            groups.setdefault(cause, ProblemGroup(cause)).who.append((r, detail))
    return sorted(groups.values(), key=lambda g: (-len(g.who), g.cause))


# ---- misconceptions per exercise -------------------------------------------------------------


def exercise_misconceptions(results: list[dict]) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """{(assignment, cell): {slug: [results of the students whose cell named it]}}."""
    found: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for gid, c in r.get("cells", {}).items():
            if c.get("misconception"):
                found[(r["assignment"], gid)][c["misconception"]].append(r)
    return {k: dict(v) for k, v in found.items()}


# ---- the page ---------------------------------------------------------------------------------


def _name(res_or_student: dict | str, names: dict[str, str]) -> str:
    sid = res_or_student if isinstance(res_or_student, str) else res_or_student["student"]
    return names.get(sid, sid)


def _student_link(res: dict, names: dict[str, str], label: str | None = None) -> str:
    text = _e(label if label is not None else _name(res, names))
    if res.get("feedback"):
        return f'<a href="{href(res["feedback"])}">{text}</a>'
    return text


def _figure(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    data = base64.b64encode(png).decode()
    return f'<figure><img alt="{_e(alt)}" src="data:image/png;base64,{data}"></figure>'


def _fmt(x: float) -> str:
    return f"{x:g}"


def _summary(results, stats: list[AssignmentStats], names, figures, points) -> str:
    counts = status_counts(results)
    course = sum(points.values())
    cards = [
        ("students", len(names)),
        ("submissions", sum(r.get("status") != "missing" for r in results)),
        ("missing", counts.get("missing", 0)),
        ("untouched", counts.get("untouched", 0)),
        ("assignments", len(stats)),
        ("course points", _fmt(course)),
    ]
    card_html = "".join(
        f'<div class="card" id="n-{_e(k.replace(" ", "-"))}"><b>{v}</b><span>{_e(k)}</span></div>'
        for k, v in cards
    )
    rows = "".join(
        f'<tr data-assignment="{_e(s.assignment)}"><th scope="row">{_e(s.assignment)}</th>'
        f'<td class="num" data-k="submissions">{s.submissions}</td>'
        f'<td class="num" data-k="missing">{s.missing}</td>'
        f'<td class="num" data-k="mean">{s.mean:.2f}</td>'
        f'<td class="num" data-k="mean-pct">{_pct(s.mean, s.max_score)}</td>'
        f'<td class="num" data-k="median">{_fmt(s.median)}</td>'
        f'<td class="num" data-k="full">{s.full_marks}</td>'
        f'<td class="num" data-k="max">{_fmt(s.max_score)}</td></tr>'
        for s in stats
    )
    status_line = ", ".join(
        f'<span class="nowrap" data-status="{_e(k)}">{_badge(k)} {v}</span>'
        for k, v in counts.items()
    )
    return (
        '<section id="summary"><h2>Summary</h2>'
        f'<div class="cards">{card_html}</div>'
        f'<p class="statuses">Notebooks by badge: {status_line}</p>'
        '<div class="scroll"><table id="assignments"><thead><tr><th scope="col">assignment</th>'
        '<th scope="col" class="num">submitted</th><th scope="col" class="num">missing</th>'
        '<th scope="col" class="num">mean</th><th scope="col" class="num">mean %</th>'
        '<th scope="col" class="num">median</th><th scope="col" class="num">full marks</th>'
        f'<th scope="col" class="num">points</th></tr></thead><tbody>{rows}</tbody></table></div>'
        '<p class="hint">Mean and median count a missing notebook as 0, as grades.csv does.</p>'
        f"{_figure(figures.get('scores'), 'Score distribution per assignment')}"
        "</section>"
    )


def _score_cell(res: dict | None, top_if_none: float = 0.0) -> str:
    if res is None:
        return '<td class="score none" data-sort="">&ndash;</td>'
    score, top = float(res["score"]), float(res["max_score"])
    share = score / top if top else 0.0
    status = res.get("status", "graded")
    if status in ("missing", "untouched"):
        level = status
    else:
        level = "full" if top and score >= top else ("zero" if score <= 0 else "part")
    text = f"{_fmt(score)} / {_fmt(top)}"
    link = f'<a href="{href(res["feedback"])}">{text}</a>' if res.get("feedback") else text
    marks = "".join(_badge(b) for b in badges(res) if b != "graded")
    return (
        f'<td class="score {level}" data-sort="{share:.6f}" '
        f'data-status="{_e(status)}">{link} <span class="pct">{_pct(score, top)}</span>'
        f"{marks}</td>"
    )


def _scores(results, assignments, names, points) -> str:
    by_key = {(r["student"], r["assignment"]): r for r in results}
    head = "".join(
        f'<th scope="col" class="num">{_e(a)}<small class="pts">{_fmt(points.get(a, 0))} pts'
        "</small></th>"
        for a in assignments
    )
    top = sum(points.get(a, 0.0) for a in assignments)  # the whole course, whatever was sent
    rows = []
    for sid in sorted(names, key=lambda s: (names[s].casefold(), s)):
        mine = [by_key.get((sid, a)) for a in assignments]
        total = sum(float(r["score"]) for r in mine if r)
        shown = names[sid]
        also = f'<small class="id">{_e(sid)}</small>' if shown != sid else ""
        rows.append(
            f'<tr data-student="{_e(sid)}"><th scope="row" data-sort="{_e(shown.casefold())}">'
            f'<span class="who" title="{_e(shown)}">{_e(shown)}</span>{also}</th>'
            + "".join(_score_cell(r) for r in mine)
            + f'<td class="num total" data-sort="{total:.6f}">{_fmt(total)} / {_fmt(top)} '
            f'<span class="pct">{_pct(total, top)}</span></td></tr>'
        )
    legend = "".join(
        f"<li>{_badge(s)} {_e(w)}</li>" for s, w in STATUS_MEANS.items() if s != "graded"
    )
    return (
        '<section id="scores"><h2>Scores</h2>'
        '<p class="hint">Click a column header to sort. Each score opens that feedback page. '
        "The total is out of the whole course's points: a missing notebook counts 0.</p>"
        '<div class="scroll"><table id="scores-table" class="sortable"><thead><tr>'
        f'<th scope="col">student</th>{head}<th scope="col" class="num">total</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        '<ul class="legend"><li><span class="swatch full"></span> full marks</li>'
        '<li><span class="swatch part"></span> part</li>'
        '<li><span class="swatch zero"></span> 0</li>'
        '<li><span class="swatch untouched"></span> untouched</li>'
        f'<li><span class="swatch missing"></span> missing</li>{legend}</ul>'
        "</section>"
    )


def _misconception_items(found: dict[str, list[dict]], a: str, catalogue, names) -> str:
    items = []
    for slug, who in sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        known = catalogue.find(slug, a) if catalogue is not None else None
        students = ", ".join(_student_link(r, names) for r in who)
        count = len({r["student"] for r in who})
        title = (
            f"<b>{_e(known.title)}</b> <code>{_e(slug)}</code>"
            if known
            else f"<code>{_e(slug)}</code> <i>(no explanation in the checks)</i>"
        )
        explain = f"<p>{_e(known.explanation)}</p>" if known and known.explanation else ""
        items.append(
            f'<li class="misc" data-slug="{_e(slug)}" data-students="{count}">'
            f"<details><summary>{title} &middot; {count} student{'s' * (count != 1)}"
            f"</summary>{explain}<p>Students: {students}</p></details></li>"
        )
    return f'<ul class="miscs">{"".join(items)}</ul>' if items else ""


def _exercises(results, pass_rates, catalogue, names, figures, outline, items) -> str:
    seen = exercise_misconceptions(results)
    by_item = {(it.assignment, it.exercise.grade_id): it for it in items}
    blocks, current = [], None
    for a, ex in outline:
        ok, n = pass_rates.get((a, ex.grade_id), (0, 0))
        pct = 100 * ok / n if n else 0.0
        it = by_item.get((a, ex.grade_id))
        if a != current:
            current = a
            blocks.append(f'<h3 class="ex-assignment">{_e(a)}</h3>')
        stats = (
            f'<span class="rate">{ok}/{n} full marks ({pct:.0f}%)</span>'
            if n
            else '<span class="rate">not graded</span>'
        )
        extra = (
            f'<span class="item">mean {fmt_share(it.difficulty)} &middot; '
            f"discrimination {fmt_corr(it.discrimination)}</span>"
            if it
            else ""
        )
        blocks.append(
            f'<div class="exercise" data-assignment="{_e(a)}" data-cell="{_e(ex.grade_id)}">'
            f'<div class="ex-head"><span class="ex-title"><b>{_e(ex.title)}</b> '
            f'<span class="pts">{_fmt(ex.points)} pt{"s" * (ex.points != 1)}</span>'
            f'<small>Grade cell: <code class="ex-name">{_e(ex.grade_id)}</code></small></span>'
            f'<span class="bar" title="{pct:.0f}%"><span style="width:{pct:.1f}%"></span>'
            f"</span>{stats}{extra}</div>"
            f"{_misconception_items(seen.get((a, ex.grade_id), {}), a, catalogue, names)}</div>"
        )
    return (
        '<section id="exercises"><h2>Exercises</h2>'
        '<p class="hint">In the notebook\'s order, with the titles and points of the release. '
        "Pass rate: the share of the graded submissions with the cell's full marks (a file "
        "that is not a notebook has no cells to count). A misconception is named when a "
        "check's replay of that mistake gives the student's output; open one for the checks' "
        "explanation and the students.</p>"
        '<div class="figs">'
        f"{_figure(figures.get('pass'), 'Pass rate per exercise')}"
        f"{_figure(figures.get('miscs'), 'Misconceptions per exercise')}</div>"
        f"{''.join(blocks)}</section>"
    )


def _key(x: float | None) -> str:
    """A number to sort by; empty (sorted last) when undefined."""
    return "" if x is None else f"{x:.6f}"


def _items(items) -> str:
    rows = "".join(
        f'<tr data-assignment="{_e(it.assignment)}" data-cell="{_e(it.exercise.grade_id)}">'
        f"<td>{_e(it.assignment)}</td>"
        f'<td data-sort="{i}"><b>{_e(it.exercise.title)}</b> '
        f"<code>{_e(it.exercise.grade_id)}</code></td><td>{_e(it.kind)}</td>"
        f'<td class="num">{_fmt(it.exercise.points)}</td><td class="num">{it.students}</td>'
        f'<td class="num" data-k="difficulty" data-sort="{_key(it.difficulty)}">'
        f"{fmt_share(it.difficulty)}</td>"
        f'<td class="num" data-k="discrimination" data-sort="{_key(it.discrimination)}">'
        f"{fmt_corr(it.discrimination)}</td></tr>"
        for i, it in enumerate(items)
    )
    return (
        '<section id="items"><h2>Item analysis</h2>'
        '<p class="hint">Per graded cell (exercises, quick checks and concept questions), over '
        "the students who submitted the notebook. <b>Mean</b> (difficulty): the mean share of "
        "the cell's points; low is hard. <b>Discrimination</b>: the correlation of the cell's "
        "score with the rest of the student's course total (the corrected item-total "
        "correlation); near 0 or negative: the cell does not separate the students who do well "
        "from the others. n/a with fewer than 3 students or when no one's score differs.</p>"
        '<div class="scroll"><table id="items-table" class="sortable"><thead><tr>'
        '<th scope="col">assignment</th><th scope="col">cell</th><th scope="col">kind</th>'
        '<th scope="col" class="num">points</th><th scope="col" class="num">students</th>'
        '<th scope="col" class="num">mean</th><th scope="col" class="num">discrimination</th>'
        f"</tr></thead><tbody>{rows}</tbody></table></div></section>"
    )


def _top_misconceptions(results, catalogue, names, titles, limit: int = 10) -> str:
    """The misconceptions named for the most students, with the checks' words and where."""
    by_slug: dict[str, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    for (a, gid), found in exercise_misconceptions(results).items():
        for slug, who in found.items():
            by_slug[slug][(a, gid)] |= {r["student"] for r in who}
    ranked = sorted(by_slug.items(), key=lambda kv: (-len(set().union(*kv[1].values())), kv[0]))[
        :limit
    ]
    lines = []
    for slug, where in ranked:
        a = next(iter(where))[0]
        known = catalogue.find(slug, a) if catalogue is not None else None
        count = len(set().union(*where.values()))
        places = ", ".join(f"{_e(titles.get(k, k[1]))} ({_e(k[0])})" for k in where)
        words = (
            f"<b>{_e(known.title)}</b> <code>{_e(slug)}</code>"
            + (f'<p class="why">{_e(known.explanation)}</p>' if known.explanation else "")
            if known
            else f"<code>{_e(slug)}</code> <i>(no explanation in the checks)</i>"
        )
        lines.append(
            f'<li data-slug="{_e(slug)}" data-students="{count}">{words}'
            f'<p class="detail">{count} student{"s" * (count != 1)}, in {places}</p></li>'
        )
    body = f'<ol class="top-miscs">{"".join(lines)}</ol>' if lines else "<p>None named.</p>"
    return f'<section id="misconceptions"><h2>Misconceptions most often named</h2>{body}</section>'


def _problems(results, problems, names) -> str:
    groups = problem_groups(results)
    lines = []
    for g in groups:
        who = ", ".join(
            _student_link(r, names, f"{_name(r, names)} ({r['assignment']})")
            + (f' <span class="detail">{_e(d)}</span>' if d else "")
            for r, d in g.who
        )
        lines.append(
            f'<li data-count="{len(g.who)}"><b class="cause">{_e(g.cause)}</b> '
            f"&middot; {len(g.who)}: {who}</li>"
        )
    lines += [f'<li class="class-level"><b class="cause">{_e(p)}</b></li>' for p in problems]
    body = f'<ul class="problems">{"".join(lines)}</ul>' if lines else "<p>None.</p>"
    return f'<section id="problems"><h2>Problems, by cause</h2>{body}</section>'


def _review(results, pairs, names, similarity_note: str | None) -> str:
    by_key = {(r["student"], r["assignment"]): r for r in results}
    flagged = []
    for r in results:
        if r["status"] != "needs-review":
            continue
        what = [d or c for c, d in map(cause_of, r.get("problems", [])) if "tampering" in c]
        lines = "".join(f"<li><code>{_e(w)}</code></li>" for w in what)
        flagged.append(
            f"<li>{_student_link(r, names)} ({_e(r['assignment'])})"
            f"{f'<ul>{lines}</ul>' if lines else ''}</li>"
        )
    flags = (
        f'<ul class="flags">{"".join(flagged)}</ul>' if flagged else "<p>No code was flagged.</p>"
    )
    rows = []
    for p in pairs:
        mine = by_key.get((p.student, p.assignment))
        theirs = by_key.get((p.other, p.assignment))
        left = _student_link(mine, names) if mine else _e(_name(p.student, names))
        right = _student_link(theirs, names) if theirs else _e(_name(p.other, names))
        other_share = f"{p.other_share:.0%}" if p.other_share is not None else "&ndash;"
        rows.append(
            f"<tr><td>{_e(p.assignment)}</td><td>{left}</td><td>{right}</td>"
            f'<td class="num">{p.share:.0%}</td><td class="num">{other_share}</td></tr>'
        )
    if similarity_note:
        similar = f"<p>{_e(similarity_note)}</p>"
    elif rows:
        similar = (
            '<div class="scroll"><table id="pairs"><thead><tr><th>assignment</th>'
            "<th>student</th><th>similar to</th><th>of the student's answer</th>"
            f"<th>of the other's</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            '<p class="hint">The shares: how much of one answer\'s code (as tokens) is found in '
            "the other. A pair is a question, not a verdict: short exercises leave little room "
            "to differ. Every pair is in similarity.csv.</p>"
        )
    else:
        similar = "<p>No similar answers.</p>"
    return (
        '<section id="review"><h2>Needs review</h2>'
        "<h3>Code that patches the course or libraries (static scan)</h3>"
        '<p class="hint">The scores stand: they are the grader\'s own, computed outside the '
        f"student's kernel.</p>{flags}"
        f"<h3>Similar answers</h3>{similar}</section>"
    )


def render(
    results: list[dict],
    problems: list[str],
    assignments: list[str],
    pass_rates: dict[tuple[str, str], tuple[int, int]],
    pairs: list,
    catalogue=None,
    figures: dict[str, bytes] | None = None,
    similarity_note: str | None = None,
    title: str = "Grading report",
    *,
    outline: list | None = None,
    items: list | None = None,
    points: dict[str, float] | None = None,
    written: str = "",
    commit: str = "unknown",
) -> str:
    """The report page. results: the finalized results (graders.outputs.report.finalize);
    pass_rates: {(assignment, cell): (full marks, graded)}; pairs: graders.outputs.similarity.Pair
    list; catalogue: graders.outputs.misconceptions.Catalogue (None: slugs only); figures: PNG bytes
    by name ("scores", "pass", "miscs"); outline: [(assignment, graders.outputs.report.Exercise)] in
    the notebooks' order (default: the cells of pass_rates); items:
    graders.outputs.report.item_analysis; points: each assignment's points (default: the most any
    result was graded out of); written, commit: the date and the course's commit, shown under the
    title."""
    from graders.outputs.exercises import Exercise

    figures = figures or {}
    names: dict[str, str] = {}
    for r in results:
        names.setdefault(r["student"], r.get("name") or r["student"])
        if r.get("name"):
            names[r["student"]] = r["name"]
    stats = assignment_stats(results, assignments)
    if points is None:
        points = {s.assignment: s.max_score for s in stats}
    if outline is None:
        outline = [(a, Exercise(gid, gid, 0.0)) for a, gid in pass_rates]
    titles = {(a, ex.grade_id): ex.title for a, ex in outline}
    items = items or []
    shown = [a for a in assignments if a in points or any(s.assignment == a for s in stats)]
    nav = "".join(
        f'<a href="#{k}">{w}</a>'
        for k, w in (
            ("summary", "Summary"),
            ("scores", "Scores"),
            ("exercises", "Exercises"),
            ("items", "Item analysis"),
            ("misconceptions", "Misconceptions"),
            ("problems", "Problems"),
            ("review", "Review"),
        )
    )
    stamp = (
        f'<p class="stamp">Written <time id="written">{_e(written)}</time> &middot; course '
        f'commit <code id="commit">{_e(commit)}</code></p>'
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{_e(title)}</h1>{stamp}<nav>{nav}</nav></header><main>"
        + _summary(results, stats, names, figures, {a: points.get(a, 0.0) for a in shown})
        + _scores(results, shown, names, points)
        + _exercises(results, pass_rates, catalogue, names, figures, outline, items)
        + _items(items)
        + _top_misconceptions(results, catalogue, names, titles)
        + _problems(results, problems, names)
        + _review(results, pairs, names, similarity_note)
        + f"</main><script>{JS}</script></body></html>\n"
    )


CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;--accent:#0b5cad;
--full:#d8f3dc;--part:#fff1c2;--zero:#ffd9d6;--untouched:#e8eaee;--missing:#f3e8ff}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;color:var(--fg);background:#fff;
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif}
header{background:var(--soft);border-bottom:1px solid var(--line);
padding:.6rem max(1rem,calc((100% - 70rem) / 2))}
header h1{margin:0 0 .2rem;font-size:1.35rem}
nav{display:flex;flex-wrap:wrap;gap:.2rem 1rem}
nav a{color:var(--accent);text-decoration:none}
main{max-width:72rem;margin:0 auto;padding:0 1rem 3rem}
section{margin-top:1.6rem}
h2{font-size:1.2rem;border-bottom:1px solid var(--line);padding-bottom:.2rem}
h3{font-size:1rem;margin:1.2rem 0 .3rem}
p,li,td,th,summary{overflow-wrap:anywhere}
a{color:var(--accent)}
code{font:.88em/1.3 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--soft);
padding:0 .2em;border-radius:3px}
.hint{color:var(--muted);font-size:.9rem}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(6rem,1fr));gap:.6rem}
.card{border:1px solid var(--line);border-radius:8px;padding:.5rem .8rem;background:var(--soft)}
.card b{display:block;font-size:1.6rem;line-height:1.2}
.card span{color:var(--muted)}
.scroll{overflow-x:auto;max-width:100%;border:1px solid var(--line);border-radius:8px;
margin:.6rem 0;-webkit-overflow-scrolling:touch}
table{border-collapse:separate;border-spacing:0;width:100%}
th,td{padding:.4rem .6rem;border-bottom:1px solid var(--line);text-align:left;
vertical-align:top;white-space:nowrap;overflow-wrap:normal}
thead th{background:var(--soft);position:sticky;top:0}
tbody tr:last-child>*{border-bottom:0}
.num{text-align:right;font-variant-numeric:tabular-nums}
#scores-table tbody th,#assignments tbody th{position:sticky;left:0;background:#fff;z-index:1;
font-weight:600}
#scores-table thead th:first-child,#assignments thead th:first-child{position:sticky;left:0;
z-index:2}
#scores-table td.score{text-align:right;font-variant-numeric:tabular-nums}
td.full{background:var(--full)}td.part{background:var(--part)}td.zero{background:var(--zero)}
td.none{color:var(--muted);text-align:center}
td.untouched{background:var(--untouched)}td.missing{background:var(--missing)}
.pct{color:var(--muted);font-size:.85em}
small.pts{display:block;font-weight:400;color:var(--muted)}
.stamp{margin:0 0 .2rem;color:var(--muted);font-size:.9rem}
.who{display:block;max-width:14rem;overflow:hidden;text-overflow:ellipsis}
small.id{display:block;color:var(--muted);font-weight:400;max-width:14rem;overflow:hidden;
text-overflow:ellipsis}
.badge{display:inline-block;margin-left:.35rem;padding:0 .4rem;border-radius:999px;
font-size:.75rem;line-height:1.5;border:1px solid;white-space:nowrap;vertical-align:1px}
.b-needs-review{color:#7a4d00;border-color:#d4a72c;background:#fff8c5}
.b-invalid-notebook{color:#82071e;border-color:#ff8182;background:#ffebe9}
.b-autograde-failed,.b-grader-error{color:#fff;border-color:#a40e26;background:#cf222e}
.b-timeout{color:#3e1f79;border-color:#a475f9;background:#fbefff}
.b-other{color:var(--muted);border-color:var(--line)}
.b-graded{color:#116329;border-color:#4ac26b;background:#dafbe1}
.b-missing{color:#6e40c9;border-color:#c297ff;background:#fbefff}
.b-untouched{color:#424a53;border-color:#afb8c1;background:#eaeef2}
.b-problems{color:#953800;border-color:#fb8f44;background:#fff1e5}
button.sort{all:unset;cursor:pointer;display:inline-flex;gap:.3rem;align-items:center}
button.sort:focus-visible{outline:2px solid var(--accent);outline-offset:2px}
button.sort::after{content:"\\2195";color:var(--muted);font-size:.8em}
th[aria-sort=ascending] button.sort::after{content:"\\25B2";color:var(--fg)}
th[aria-sort=descending] button.sort::after{content:"\\25BC";color:var(--fg)}
.legend{display:flex;flex-wrap:wrap;gap:.3rem 1.2rem;padding:0;list-style:none;
font-size:.85rem;color:var(--muted)}
.swatch{display:inline-block;width:.9rem;height:.9rem;border:1px solid var(--line);
vertical-align:-2px}
.swatch.full{background:var(--full)}.swatch.part{background:var(--part)}
.swatch.zero{background:var(--zero)}.swatch.untouched{background:var(--untouched)}
.swatch.missing{background:var(--missing)}
.legend .badge{margin-left:0}
figure{margin:1rem 0;text-align:center}
figure img{max-width:100%;height:auto}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,26rem),1fr));gap:0 1rem;
align-items:start}
.ex-assignment{margin-top:1.4rem}
.exercise{border-bottom:1px solid var(--line);padding:.3rem 0}
.ex-head{display:grid;grid-template-columns:minmax(0,1fr) 7rem 10rem 14rem;gap:.3rem .8rem;
align-items:center}
.ex-name{overflow-wrap:anywhere;justify-self:start}
.ex-title small{display:block;color:var(--muted)}.ex-title .pts{color:var(--muted);font-size:.85rem}
.item{font-variant-numeric:tabular-nums;color:var(--muted);font-size:.9rem}
#items-table td:nth-child(2){white-space:normal;min-width:14rem}
#items-table td:nth-child(2) code{display:block;width:fit-content}
.top-miscs li{margin:.4rem 0}.top-miscs .why,.top-miscs .detail{margin:.1rem 0}
.rate{font-variant-numeric:tabular-nums;color:var(--muted);font-size:.9rem}
.bar{display:block;height:.7rem;background:var(--zero);border-radius:4px;overflow:hidden}
.bar span{display:block;height:100%;background:#2da44e}
.miscs{list-style:none;padding-left:.2rem;margin:.3rem 0 .2rem}
.miscs p{margin:.3rem 0}
.nowrap,.miscs code{white-space:nowrap}
#assignments thead th{white-space:normal}
.miscs summary{cursor:pointer}
.detail{color:var(--muted);font-size:.88rem}
.problems li,.flags li{margin:.35rem 0}
@media (max-width:640px){body{font-size:14px}main{padding:0 .6rem 2rem}header{padding:.5rem .6rem}
th,td{padding:.35rem .45rem}.who,small.id{max-width:9rem}
.card{padding:.4rem .6rem}.card b{font-size:1.3rem}
.ex-head{grid-template-columns:minmax(0,1fr) auto}.ex-name{grid-column:1/-1}}
"""

# Sorting by a column header: a few lines, so the page still reads as a plain table without JS.
JS = """
(function(){
function key(cell){
  var v=cell?cell.getAttribute('data-sort'):null;
  if(v===null)v=cell?cell.textContent.trim():'';
  if(v==='')return null;
  var n=Number(v);return isNaN(n)?v.toLowerCase():n;
}
function compare(a,b){
  if(a===null||b===null)return a===b?0:(a===null?1:-1);
  if(typeof a===typeof b)return typeof a==='number'?a-b:a.localeCompare(b);
  return typeof a==='number'?-1:1;
}
Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(table){
  var heads=table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads,function(th,col){
    var button=document.createElement('button');
    button.type='button';button.className='sort';
    button.title='Sort by this column';
    while(th.firstChild)button.appendChild(th.firstChild);
    th.appendChild(button);
    button.addEventListener('click',function(){
      var up=th.getAttribute('aria-sort')!=='ascending';
      Array.prototype.forEach.call(heads,function(h){h.removeAttribute('aria-sort');});
      th.setAttribute('aria-sort',up?'ascending':'descending');
      var body=table.tBodies[0];
      var rows=Array.prototype.slice.call(body.rows).map(function(r,i){
        return {row:r,key:key(r.cells[col]),i:i};});
      rows.sort(function(a,b){
        if(a.key===null||b.key===null)return compare(a.key,b.key)||a.i-b.i;
        return (up?compare(a.key,b.key):compare(b.key,a.key))||a.i-b.i;});
      rows.forEach(function(r){body.appendChild(r.row);});
    });
  });
});
})();
"""
