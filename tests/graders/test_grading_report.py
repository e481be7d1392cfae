"""The class report (report.html), the instructor's view of a graded class.

Plain tests on results made here (fast): the page's content, the misconception words taken from
the checks, problems grouped by cause, and escaping (a student named `<script>` injects nothing).
Then a small real class graded with `python -m graders grade` (4 students, two short notebooks,
a non-ASCII name, a name that is markup, an invalid notebook, a patched numpy, similar answers),
its report read as text and opened in Chromium at a laptop and a phone viewport: no console
error, no horizontal page scroll on the phone, a header click sorts the table, every link
resolves to a file, the summary numbers are those of grades.csv. Screenshots go to the folder the
test prints (under pytest's tmp_path).
"""

from __future__ import annotations

import base64
import copy
import csv
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from fixtures import bank, once

from graders.outputs import misconceptions, report_html
from graders.outputs.report import write_outputs
from graders.run import pipeline

A1, A2 = "01_online_softmax", "02_merge_partials"
EVIL = "<script>alert('x')</script>"

pytestmark = pytest.mark.xdist_group("report")  # its graded classes: one worker builds them


class Page(HTMLParser):
    """The tags, attributes and text of a page, as a browser's parser would see them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all_text(self) -> str:
        return " ".join(self.text)


def _result(student, assignment, score, max_score, cells, status="graded", problems=(), **kw):
    return {
        "student": student,
        "assignment": assignment,
        "source": f"/nowhere/{student}/{assignment}.ipynb",
        "sha256": "0",
        "status": status,
        "score": score,
        "max_score": max_score,
        "cells": cells,
        "problems": list(problems),
        "seconds": 1.0,
        **kw,
    }


def _cell(score, max_score, misconception=None, error=""):
    return {"score": score, "max_score": max_score, "misconception": misconception, "error": error}


@pytest.fixture(scope="module")
def made_up(tmp_path_factory):
    """A class of results written straight to write_outputs (no grading): every case the page
    must show, and student-controlled strings that are markup."""
    out = tmp_path_factory.mktemp("made-up")
    results = [
        _result("ok", A1, 4, 4, {"t1": _cell(2, 2), "t2": _cell(2, 2)}),
        _result(
            "José",
            A1,
            2,
            4,
            {"t1": _cell(0, 2, "no-rescale", "CheckFailure: ✗ l is wrong"), "t2": _cell(2, 2)},
            problems=["cell t2: the kernel died here; later cells scored 0"],
            name="José",
        ),
        _result(
            "evil-1a2b3c4d",
            A1,
            0,
            4,
            {},
            status="invalid-notebook",
            problems=[
                "not a notebook Jupyter can open: the file is not JSON (Expecting value: line 1 "
                "column 1 (char 0))"
            ],
            name=EVIL,
        ),
        _result(
            "evil-1a2b3c4d",
            A2,
            3,
            3,
            {"m1": _cell(3, 3)},
            status="needs-review",
            problems=[
                "possible tampering (patches course or library code), to review: cell #3: "
                "np.allclose = lambda *a: '<img src=x onerror=alert(1)>'"
            ],
            name=EVIL,
        ),
        _result(
            "Zoë",
            A2,
            0,
            3,
            {"m1": _cell(0, 3, "made-up-slug", "ValueError: <b>bold</b> & more")},
            problems=[
                "cell m1: ran past the time limit and ignored the interrupt; the kernel was "
                "stopped, later cells scored 0"
            ],
        ),
    ]
    lines = write_outputs(results, ["a class-level problem <i>x</i>"], out, [A1, A2], {})
    return out, results, lines


def test_the_page_holds_summary_scores_exercises_problems_and_review(made_up):
    out, results, lines = made_up
    page = (out / "report.html").read_text(encoding="utf-8")
    doc = Page(page)
    text = doc.all_text()
    # self-contained: no resource from anywhere else
    for tag, attrs in doc.tags:
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http:", "https:", "//")), (tag, attrs)
        if tag == "link":
            raise AssertionError(f"an external stylesheet or resource: {attrs}")
    # summary: 4 students, 5 submissions, 01: mean 2, median 2, 1 full marks; 02: 1.5, 1.5, 1
    assert 'id="n-students"><b>4</b>' in page and 'id="n-submissions"><b>5</b>' in page
    assert 'data-assignment="01_online_softmax"' in page
    row1 = page.split('<tr data-assignment="01_online_softmax">')[1].split("</tr>")[0]
    assert 'data-k="mean">2.00<' in row1 and 'data-k="median">2<' in row1
    assert 'data-k="full">1<' in row1 and 'data-k="submissions">3<' in row1
    row2 = page.split('<tr data-assignment="02_merge_partials">')[1].split("</tr>")[0]
    assert 'data-k="mean">1.50<' in row2 and 'data-k="full">1<' in row2
    # scores: a link per submission to its feedback page, badges, totals, a dash where none
    for r in results:
        assert f'href="{report_html.href(r["feedback"])}"' in page, r["feedback"]
    assert page.count('class="badge b-invalid-notebook"') >= 1
    assert page.count('class="badge b-needs-review"') >= 1
    assert 'class="badge b-timeout"' in page  # the cell that ran past the time limit
    zoe = page.split('<tr data-student="Zoë">')[1].split("</tr>")[0]
    assert 'class="score none"' in zoe and "0 / 3" in zoe  # no 01 submission; total 0 of 3
    evil = page.split('<tr data-student="evil-1a2b3c4d">')[1].split("</tr>")[0]
    assert 'class="num total" data-sort="3.000000">3 / 7 ' in evil  # 0 of 4, 3 of 3
    assert f'<span class="pct">{100 * 3 / 7:.0f}%</span>' in evil
    # a total is out of the whole course's points, whatever the student sent
    assert 'class="num total" data-sort="0.000000">0 / 7 ' in zoe
    # exercises: the pass rate, the checks' words for a known slug, the slug alone otherwise
    known = misconceptions.catalogue().find("no-rescale", A1)
    assert known is not None and known.title in text and known.explanation in text
    assert "made-up-slug" in text and "no explanation in the checks" in text
    assert "1/2 full marks (50%)" in text  # 01 / t1: ok passed, José did not
    # problems grouped by cause, one line each, with the students
    assert "the kernel died here; later cells scored 0" in text
    assert "not a notebook Jupyter can open: the file is not JSON" in text
    assert "a class-level problem <i>x</i>" in text
    # needs review: the flagged line (as text) and a link to that feedback page
    assert "np.allclose = lambda *a: '<img src=x onerror=alert(1)>'" in text
    # the figures are inline, the same PNG bytes as the files report.md shows
    pngs = [a["src"] for t, a in doc.tags if t == "img"]
    assert len(pngs) == 3 and all(s.startswith("data:image/png;base64,") for s in pngs)
    files = {base64.b64encode(p.read_bytes()).decode() for p in out.glob("*.png")}
    assert {s.split(",", 1)[1] for s in pngs} == files
    # report.md and the printed summary stay
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Pass rate per exercise" in md and lines[0] == "Graded 5 notebooks of 4 students."


def test_student_strings_are_escaped(made_up):
    out, _, _ = made_up
    page = (out / "report.html").read_text(encoding="utf-8")
    doc = Page(page)
    scripts = [a for t, a in doc.tags if t == "script"]
    assert len(scripts) == 1  # the page's own sorting code, nothing a student wrote
    for raw in (EVIL, "<b>bold</b>", "<i>x</i>", "<img src=x onerror=alert(1)>"):
        assert raw not in page  # never as markup
    assert all(a["src"].startswith("data:image/png") for t, a in doc.tags if t == "img")
    handlers = [(t, k) for t, a in doc.tags for k in a if k.startswith("on")]
    assert handlers == []
    text = doc.all_text()
    assert EVIL in text  # shown, as text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page


def test_causes_group_what_students_share():
    cause = report_html.cause_of
    assert cause("cell t2: the kernel died here; later cells scored 0") == (
        "the kernel died here; later cells scored 0",
        "cell t2",
    )
    assert cause(
        "not a notebook Jupyter can open: the file is not JSON (Expecting value: line 1 "
        "column 1 (char 0))"
    ) == (
        "not a notebook Jupyter can open: the file is not JSON",
        "Expecting value: line 1 column 1 (char 0)",
    )
    assert cause("older upload, not graded: a.ipynb (graded the newest upload, b.ipynb)")[0] == (
        "older upload, not graded"
    )
    results = [
        _result(s, A1, 0, 1, {}, problems=[f"cell t{i}: very long output, cut in the feedback"])
        for i, s in enumerate(("a", "b"))
    ]
    (group,) = report_html.problem_groups(results)
    assert group.cause == "very long output, cut in the feedback"
    assert [(r["student"], d) for r, d in group.who] == [("a", "cell t0"), ("b", "cell t1")]


def test_every_named_mistake_of_the_bank_has_the_checks_words():
    """The slugs the bank's mistakes make the checks name are all explained, each by the check
    module of its own notebook."""
    cat = misconceptions.catalogue()
    for assignment, mistakes in bank.NAMED_MISTAKES.items():
        for _, slug, *_ in mistakes:
            known = cat.find(slug, assignment)
            assert known is not None, (assignment, slug)
            assert known.title and known.explanation, (assignment, slug)
            assert known.module in misconceptions.modules_of(assignment), (assignment, known)
    assert cat.find("no-such-slug") is None


# Slugs notebook 06's checks name whose words also live in another notebook's checks (03's
# tile-reloaded, the puzzles' mask-missing) or in a part of notebook 06's checks its cells do not
# import (triton_forward/loads.py): the package triton_forward is read whole
SLUGS_06 = ("tile-reloaded", "mask-missing", "stride-of-other-tensor", "attention-outside-kernel",
            "launcher-skips-kernel", "scale-folded-twice", "exp2-without-log2e",
            "bf16-in-interpreter")  # fmt: skip
CHECKS_06 = ("triton_forward",)


@pytest.mark.parametrize("slug", SLUGS_06)
def test_notebook_06_slugs_have_06s_words(slug):
    """A slug of notebook 06 is explained in the words of 06's own checks (the package
    triton_forward, its loads.py included), never another notebook's."""
    cat = misconceptions.catalogue()
    known = cat.find(slug, "06_triton_forward")
    assert known is not None and known.title and known.explanation, slug
    mine = misconceptions.modules_of("06_triton_forward")
    assert known.module in mine, (slug, known.module, mine)
    assert known.module in CHECKS_06, known
    if slug == "tile-reloaded":  # notebook 03 has words of its own: each keeps its own
        words_03 = cat.find(slug, "03_tiled_forward")
        assert words_03.module == "tiled_forward" and words_03.title != known.title
        assert "K or V" in known.title


# ---------------------------------------------------------------------------------------------
# A small real class, graded by the command line
# ---------------------------------------------------------------------------------------------

# The students (folder names as an LMS or JupyterHub gives them), and what each submits
MARKUP = "<img src=x onerror=alert(1)>"  # a name that is markup, and a file system's valid name
# (six notebooks, five of them graded: a short run; José and 张伟 skipped one notebook each)
CLASS = {
    "full": {A1: "full", A2: "full"},
    "José": {A1: "mistake"},
    "张伟": {A2: "mistake"},
    MARKUP: {A1: "not-json", A2: "patched"},
}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _entries() -> list[bank.Entry]:
    entries = []
    for assignment in (A1, A2):
        kinds = {e.name.split(":")[0]: e for e in bank.core(assignment)}
        solved = kinds["full"].notebook
        first = next(e for e in bank.exercises(assignment) if e.function)
        patched = copy.deepcopy(solved)
        bank._set_answer(
            patched,
            first.answer,
            f"def {first.function}(*args, **kwargs):\n    raise ValueError('not done yet')\n\n\n"
            "import numpy as np\n\nnp.allclose = lambda *a, **k: True\n",
        )
        kinds["patched"] = bank.Entry("patched", patched, set(first.tests), "needs-review")
        kinds["not-json"] = bank.Entry("not-json", b"{ not a notebook", set(), "invalid-notebook")
        for student, plan in CLASS.items():
            if assignment not in plan:
                continue
            entry = copy.copy(kinds[plan[assignment]])
            entry.assignment, entry.student = assignment, student
            entries.append(entry)
    return entries


@pytest.fixture(scope="module")
def real_class(tmp_path_factory):
    """The class graded once per test run with `python -m graders grade` (no sandbox: it is not
    what is tested here); under pytest-xdist the first worker that needs it grades it and the
    others read it (fixtures.once)."""

    def build(folder: Path) -> None:
        bank.write(_entries(), folder)
        cmd = [sys.executable, "-m", "graders", "grade", str(folder / "submitted")]
        cmd += ["--out", str(folder / "graded"), "--jobs", str(once.grading_jobs())]
        cmd += ["--timeout", str(bank.cell_timeout(False)), "--unsafe-no-sandbox"]
        (folder / "tmp").mkdir()  # the grader's temporary folders, looked at below
        env = {**os.environ, "TMPDIR": str(folder / "tmp")}
        proc = subprocess.run(
            cmd, cwd=pipeline.REPO, env=env, capture_output=True, text=True, timeout=1200
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    out = once.built_once(tmp_path_factory, "report-class", build) / "graded"
    results = [
        json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("results/*/*.json"))
    ]
    return out, results


def test_grading_without_a_sandbox_leaves_no_temporary_folder(real_class):
    """The verdicts' exchange folder of each unsandboxed kernel is removed with its notebook (each
    graded notebook used to leave one behind in /tmp)."""
    out, results = real_class
    assert results
    left = sorted(p.name for p in (out.parent / "tmp").iterdir() if p.name.startswith("fa-"))
    assert left == []


def _grades_csv(out: Path) -> list[dict]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _expected_summary(out: Path, results: list[dict]) -> dict[str, dict[str, str]]:
    """Per assignment, the summary row as grades.csv (and the assignment's points) give it."""
    rows = _grades_csv(out)
    points = {r["assignment"]: float(r["max_score"]) for r in results}
    expected = {}
    for a in (A1, A2):
        scores = [float(r[a]) for r in rows if r[a] != ""]
        handed_in = {r["student"] for r in results if r["assignment"] == a}
        missing = sum(row["student"] not in handed_in for row in rows)  # no results file
        expected[a] = {
            "submissions": str(len(scores) - missing),
            "missing": str(missing),
            "mean": f"{statistics.mean(scores):.2f}",
            "mean-pct": f"{100 * statistics.mean(scores) / points[a]:.0f}%",
            "median": f"{statistics.median(scores):g}",
            "full": str(sum(s >= points[a] for s in scores)),
            "max": f"{points[a]:g}",
        }
    return expected


def test_the_real_class_report_shows_what_the_grader_found(real_class):
    out, results = real_class
    assert len(results) == 6
    by = {(r.get("name") or r["student"], r["assignment"]): r for r in results}
    assert by[(MARKUP, A1)]["status"] == "invalid-notebook"
    assert by[(MARKUP, A2)]["status"] == "needs-review"
    assert by[("José", A1)]["score"] < by[("full", A1)]["score"]
    page = (out / "report.html").read_text(encoding="utf-8")
    doc = Page(page)
    text = doc.all_text()
    assert [t for t, _ in doc.tags].count("script") == 1 and MARKUP not in page
    assert MARKUP in text and "José" in text and "张伟" in text
    zhang = page.split('<tr data-student="张伟">')[1].split("</tr>")[0]
    assert zhang.count('class="score missing"') == 1  # no 01 submitted: missing, no link
    assert "<a " not in zhang.split('class="score missing"')[1].split("</td>")[0]
    for a, want in _expected_summary(out, results).items():
        row = page.split(f'<tr data-assignment="{a}">')[1].split("</tr>")[0]
        for k, v in want.items():
            assert f'data-k="{k}">{v}<' in row, (a, k, v, row)
    # the misconceptions the bank's mistakes make the checks name, with the checks' words
    cat = misconceptions.catalogue()
    for slug, a in (("no-rescale", A1), ("plain-average", A2)):
        assert f'data-slug="{slug}"' in page
        assert cat.find(slug, a).title in text
    # every link to a feedback page names a file the grader wrote
    links = [a["href"] for t, a in doc.tags if t == "a" and not a["href"].startswith("#")]
    assert len(links) >= len(results)
    for link in links:
        assert (out / unquote(link)).is_file(), link
    assert "full ~ reference: solutions" in (out / "report.md").read_text(encoding="utf-8")


# ---- in a real browser ------------------------------------------------------------------------

_ORDER = "() => Array.from(document.querySelectorAll('#scores-table tbody tr'))" + (
    ".map(r => r.dataset.student)"
)
_SUMMARY = """() => Object.fromEntries(Array.from(
    document.querySelectorAll('#assignments tbody tr')).map(r => [r.dataset.assignment,
    Object.fromEntries(Array.from(r.querySelectorAll('td[data-k]'))
        .map(td => [td.dataset.k, td.textContent.trim()]))]))"""
_OVERFLOW = """() => ({page: document.documentElement.scrollWidth, view: window.innerWidth,
    table: document.querySelector('#scores-table').scrollWidth,
    box: document.querySelector('#scores-table').parentElement.clientWidth})"""


def _look(browser, out: Path, results: list[dict], label: str, size, shots: Path) -> None:
    """Open the report at one viewport and check it, as the test below says."""
    totals = {r["student"]: float(r["total"]) for r in _grades_csv(out)}
    phone = label == "phone"
    context = browser.new_context(
        viewport={"width": size[0], "height": size[1]},
        device_scale_factor=2 if phone else 1,
        is_mobile=phone,
        has_touch=phone,
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "report.html").as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=shots / f"{label}.png", full_page=True)
    page.screenshot(path=shots / f"{label}-top.png")
    assert errors == [], errors
    width = page.evaluate(_OVERFLOW)
    assert width["page"] <= width["view"], width  # no horizontal page scroll
    assert width["box"] <= width["view"], width  # the wide table scrolls in its own box
    # the summary is grades.csv's
    assert page.evaluate(_SUMMARY) == _expected_summary(out, results)
    # a header click sorts the rows: by total, up, then down; then by name
    before = page.evaluate(_ORDER)
    assert sorted(before) == sorted(totals)
    page.click("#scores-table thead th:last-child button")
    up = page.evaluate(_ORDER)
    assert [totals[s] for s in up] == sorted(totals.values()), up
    page.click("#scores-table thead th:last-child button")
    down = page.evaluate(_ORDER)
    assert [totals[s] for s in down] == sorted(totals.values(), reverse=True), down
    page.click("#scores-table thead th:first-child button")
    names = page.evaluate(
        "() => Array.from(document.querySelectorAll('#scores-table tbody th .who'))"
        ".map(e => e.textContent)"
    )
    assert names == sorted(names, key=str.casefold), names
    page.screenshot(path=shots / f"{label}-sorted.png")
    # a score's link opens that student's feedback page, a file the grader wrote
    link = page.locator("#scores-table td.score a").first
    target = urlparse(link.evaluate("a => a.href"))
    assert Path(unquote(target.path)).is_file(), target
    link.click()
    page.wait_for_load_state("load")
    assert urlparse(page.url).path == target.path
    assert errors == [], errors
    context.close()


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None or importlib.util.find_spec("playwright") is None,
    reason="no Chromium or playwright here",
)
def test_the_report_in_a_browser_at_laptop_and_phone_sizes(real_class, tmp_path):
    """No console error, no horizontal page scroll, the summary of grades.csv, sorting by a
    header click, a score's link to its feedback page; at 1280 x 800 and 390 x 844."""
    from playwright.sync_api import sync_playwright

    out, results = real_class
    shots = tmp_path / "report-screenshots"
    shots.mkdir()
    print(f"screenshots of the report: {shots}")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            _look(browser, out, results, "laptop", (1280, 800), shots)
            _look(browser, out, results, "phone", (390, 844), shots)
            # without JavaScript: the same table, plain (no sort buttons)
            context = browser.new_context(java_script_enabled=False)
            page = context.new_page()
            page.goto((out / "report.html").as_uri())
            assert page.locator("button.sort").count() == 0
            rows = page.locator("#scores-table tbody tr")
            assert rows.count() == len(_grades_csv(out))
            assert rows.first.locator("td.score a").count() >= 1
            context.close()
        finally:
            browser.close()


def test_concept_questions_beliefs_have_their_words():
    """Each wrong option of a concept question is a misconception the catalogue explains with
    that option's own text, for the notebook that asks it."""
    from course_utils.checks.concepts import NOTEBOOK, QUESTIONS

    cat = misconceptions.catalogue()
    for name, question in QUESTIONS.items():
        for option in question.options:
            if option.slug:
                known = cat.find(option.slug, NOTEBOOK[name])
                assert known is not None and known.title, (name, option.slug)
                assert option.slug in cat


def test_figures_of_a_class_without_misconceptions_or_cells():
    """A class where no check named a misconception (or no cell was graded) still gets its
    figures: the empty charts say so instead of failing on their tick settings."""
    from graders.outputs import report

    results = [{"student": "a", "assignment": "01", "score": 1.0, "max_score": 2.0}]
    for pass_rates, per_exercise in (({("01", "c"): (1, 2)}, {}), ({}, {})):
        figs = report._figures(results, ["01"], pass_rates, per_exercise)
        assert set(figs) == {"scores", "pass", "miscs"}
        assert all(report._png(f).startswith(b"\x89PNG\r\n\x1a\n") for f in figs.values())


# ---------------------------------------------------------------------------------------------
# At a glance: the notebook's order and words, badges, percentages, date, commit, item analysis
# ---------------------------------------------------------------------------------------------


def _release_cells(assignment: str):
    """(grade_id, points, index) of the release's graded test cells, read with nbformat."""
    import nbformat

    from graders.run.pipeline import REPO

    nb = nbformat.read(REPO / "notebooks" / assignment / f"{assignment}.ipynb", 4)
    return [
        (c.metadata.nbgrader["grade_id"], float(c.metadata.nbgrader.get("points", 0)), i)
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata.nbgrader.get("solution")
    ], nb


@pytest.mark.parametrize("assignment", pipeline.assignments())
def test_the_outline_is_the_release_notebooks(assignment):
    """Ids and points in the notebook's order; each title is words of a markdown cell between
    the graded cell before and this one (or the exercise's name); no two titles alike."""
    from graders.outputs.exercises import exercise_outline

    cells, nb = _release_cells(assignment)
    outline = exercise_outline(assignment)
    assert [(e.grade_id, e.points) for e in outline] == [(g, p) for g, p, _ in cells]
    assert exercise_outline(assignment) is outline  # cached
    starts = [-1] + [i for _, _, i in cells[:-1]]
    for ex, (_, _, at), before in zip(outline, cells, starts, strict=True):
        words = " ".join(c.source for c in nb.cells[before + 1 : at] if c.cell_type == "markdown")
        name = ex.grade_id.removesuffix("_tests").replace("_", " ")
        if words.strip():
            assert ex.title in words.replace("`", ""), ex
        else:  # no words of its own: the heading before, and its name
            earlier = " ".join(c.source for c in nb.cells[:at] if c.cell_type == "markdown")
            heading = ex.title.removesuffix(f" ({name})")
            assert ex.title.endswith(f" ({name})") and heading in earlier.replace("`", ""), ex
    assert len({e.title for e in outline}) == len(outline)
    assert not any(e.title.endswith("points)") for e in outline)
    # every graded cell of this course sits under a numbered label of its own (or shares the one
    # before): never a step of the exercise's text ("The rules", "Ragged tiles") nor a section
    labels = ("Exercise ", "Puzzle ", "Quick check ", "Concept check ")
    assert all(e.title.startswith(labels) for e in outline), [e.title for e in outline]


def _outline_of(tmp_path, *cells) -> list[str]:
    """The titles exercise_outline gives a release made of `cells`: markdown text, or "TEST" for
    a graded test cell (one point)."""
    import nbformat

    from graders.outputs.exercises import exercise_outline

    nb = nbformat.v4.new_notebook()
    for i, cell in enumerate(cells):
        if cell == "TEST":
            meta = {"grade": True, "solution": False, "grade_id": f"cell_{i}_tests", "points": 1}
            nb.cells.append(nbformat.v4.new_code_cell("pass", metadata={"nbgrader": meta}))
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(cell))
    path = tmp_path / "notebooks" / "a" / "a.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return [e.title for e in exercise_outline("a", tmp_path)]


def test_an_exercises_title_is_its_own_heading_not_a_step_of_its_text(tmp_path):
    """The title of a graded cell among the markdown since the graded cell before: a numbered
    label wins (after a section's number or not, as heading or bold lead), then a heading, then
    a bold lead; a bold lead inside the exercise's text never names it."""
    titles = _outline_of(
        tmp_path,
        "## 6. Exercises\n\n### Exercise 2: the forward (5 points)\n\nWrite it.\n\n"
        "**Build it in stages.** First ...\n\n**The rules.** Once every value ...",
        "TEST",
        "## 7. Quick checks\n\nShort ones.\n\n**Quick check 1.** How many bytes?",
        "TEST",
        "## 8. Exercise 3: the loop, counted\n\n**How it is checked.** By calls.",
        "TEST",
        "### Part B (2 points)\n\n**Hint.** Look at the mask.",
        "TEST",
        "Some text.\n\n**Bonus question.** Why?",
        "TEST",
        "TEST",
    )
    assert titles == [
        "Exercise 2: the forward",
        "Quick check 1",
        "Exercise 3: the loop, counted",
        "Part B",
        "Bonus question",
        "Bonus question (cell 10)",
    ]


# each student's share of each A1 cell's points (rows: students, in the order of the outline)
SHARES = {
    "s1": [1, 1, 1, 1, 1, 1, 1, 1, 0],
    "s2": [0.5, 1, 0, 1, 1, 0, 1, 1, 0],
    "s3": [0.25, 0, 1, 0, 1, 0, 1, 0, 0],
    "s4": [0, 0.4, 0, 0, 1, 1, 0, 1, 0],
}


def _glance_class() -> list[dict]:
    """A1 with the release's cells: four students who tried, one whose notebook came back as
    released (untouched), one who sent nothing (missing); A2 for everyone but s4."""
    from graders.outputs.exercises import exercise_outline

    outline = exercise_outline(A1)
    assert len(outline) == len(SHARES["s1"])
    top = sum(e.points for e in outline)
    results = []
    for s, shares in SHARES.items():
        pairs = zip(outline, shares, strict=True)
        cells = {e.grade_id: _cell(f * e.points, e.points) for e, f in pairs}
        if s == "s2":
            cells[outline[0].grade_id]["misconception"] = "no-rescale"
        score = sum(c["score"] for c in cells.values())
        problems = ["cell In [7]: very long output, cut in the feedback"] if s == "s3" else []
        results.append(_result(s, A1, score, top, cells, problems=problems))
    zero = {e.grade_id: _cell(0, e.points) for e in outline}
    results.append(_result("u", A1, 0, top, zero, status="untouched"))
    results.append(_result("m", A1, 0, top, {}, status="missing", problems=["no submission"]))
    for i, s in enumerate(["s1", "s2", "s3", "u", "m"]):
        results.append(_result(s, A2, i % 3, 2, {"m1": _cell(i % 3, 2)}))
    return results


@pytest.fixture(scope="module")
def glance(tmp_path_factory):
    out = tmp_path_factory.mktemp("glance")
    results = _glance_class()
    lines = write_outputs(results, [], out, [A1, A2], {A1: results[0]["max_score"], A2: 2})
    page = (out / "report.html").read_text(encoding="utf-8")
    return out, results, lines, page


def _between(page: str, start: str, end: str) -> str:
    return page.split(start, 1)[1].split(end, 1)[0]


def test_exercises_in_the_notebooks_order_with_titles_and_points(glance):
    from graders.outputs.exercises import exercise_outline

    _, _, lines, page = glance
    section = _between(page, '<section id="exercises">', "</section>")
    order = [a["data-cell"] for t, a in Page(section).tags if "data-cell" in a]
    cells, _ = _release_cells(A1)
    assert order[: len(cells)] == [g for g, _, _ in cells]
    a2 = [g for g, _, _ in _release_cells(A2)[0]]
    assert order[len(cells) :] == [*a2, "m1"]  # A2's release, then a cell it does not have
    for ex in exercise_outline(A1):
        block = _between(section, f'data-cell="{ex.grade_id}">', '<div class="exercise"')
        text = Page(block).all_text()
        assert ex.title in text and f"{ex.points:g} pt" in text, (ex, text)
    # the printed summary names them in that order too
    printed = [ln for ln in lines if ln.startswith(f"  {A1} / ") and "difficulty" not in ln]
    assert [ln.split("(")[-2].split(")")[0] for ln in printed] == [g for g, _, _ in cells]


def test_untouched_and_missing_have_their_badges_counts_and_totals(glance):
    _, results, lines, page = glance
    doc = Page(page)
    assert 'id="n-missing"><b>1</b>' in page and 'id="n-untouched"><b>1</b>' in page
    status = _between(page, '<p class="statuses">', "</p>")
    assert 'data-status="missing"><span class="badge b-missing">missing</span> 1<' in status
    assert 'data-status="untouched"><span class="badge b-untouched">untouched</span> 1<' in status
    assert 'data-status="problems"><span class="badge b-problems">problems</span> 1<' in status
    graded = sum(r["status"] == "graded" for r in results)
    assert f'data-status="graded"><span class="badge b-graded">graded</span> {graded}<' in status
    missing = _between(page, '<tr data-student="m">', "</tr>")
    assert 'class="score missing"' in missing and "b-missing" in missing
    untouched = _between(page, '<tr data-student="u">', "</tr>")
    assert 'class="score untouched"' in untouched and "b-untouched" in untouched
    course = results[0]["max_score"] + 2
    for sid in ("m", "u", "s4"):  # totals out of the whole course: missing work counts 0
        row = _between(page, f'<tr data-student="{sid}">', "</tr>")
        total = sum(r["score"] for r in results if r["student"] == sid)
        assert f'>{total:g} / {course:g} <span class="pct">{100 * total / course:.0f}%<' in row
    row = _between(page, f'<tr data-assignment="{A1}">', "</tr>")
    assert 'data-k="missing">1<' in row and 'data-k="submissions">5<' in row
    sent = sum(r["status"] != "missing" for r in results)
    assert lines[0] == f"Graded {sent} notebooks of 6 students."
    assert "missing" in Page(_between(page, '<ul class="legend">', "</ul>")).all_text()
    assert any(t == "td" and a.get("data-status") == "missing" for t, a in doc.tags)


def test_percentages_date_and_commit(glance):
    import datetime

    from graders.outputs.report import course_commit
    from graders.run.pipeline import REPO

    out, results, _, page = glance
    for r in results:
        if r["status"] == "missing" or r["assignment"] != A1:
            continue
        cell = _between(page, f'<tr data-student="{r["student"]}">', "</td>")
        pct = 100 * r["score"] / r["max_score"]
        assert f'<span class="pct">{pct:.0f}%</span>' in cell, (r["student"], cell)
    row = _between(page, f'<tr data-assignment="{A1}">', "</tr>")
    a1 = [r["score"] for r in results if r["assignment"] == A1]
    pct = 100 * statistics.mean(a1) / results[0]["max_score"]
    assert f'data-k="mean-pct">{pct:.0f}%<' in row
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    assert f'<code id="commit">{commit}</code>' in page
    assert f"course commit {commit}" in (out / "report.md").read_text(encoding="utf-8")
    written = _between(page, '<time id="written">', "</time>")
    assert written.startswith(datetime.date.today().isoformat()), written
    assert course_commit(out) == "unknown"  # not a git checkout


def _table_values(page: str) -> dict[tuple[str, str], dict[str, str]]:
    """{(assignment, cell): {"difficulty"/"discrimination": (data-sort, shown)}} of the item
    analysis table."""
    section = _between(page, '<section id="items">', "</section>")
    values = {}
    for row in section.split("<tr data-assignment=")[1:]:
        doc = Page("<tr data-assignment=" + row.split("</tr>")[0])
        attrs = doc.tags[0][1]
        got = {}
        for chunk in row.split('data-k="')[1:]:
            key = chunk.split('"')[0]
            sort = chunk.split('data-sort="')[1].split('"')[0]
            shown = chunk.split(">", 1)[1].split("<")[0]
            got[key] = (sort, shown)
        values[(attrs["data-assignment"], attrs["data-cell"])] = got
    return values


def test_item_analysis_difficulty_and_discrimination(glance):
    """Computed here independently with numpy: over the students who submitted the notebook,
    difficulty = the mean share of the cell's points, discrimination = corrcoef(cell score,
    course total less that cell); n/a when a side does not vary."""
    import numpy as np

    from graders.outputs.exercises import exercise_outline

    _, results, _, page = glance
    values = _table_values(page)
    sent = [r for r in results if r["assignment"] == A1 and r["status"] != "missing"]
    totals = {
        s: sum(r["score"] for r in results if r["student"] == s)
        for s in {r["student"] for r in results}
    }
    checked_na = checked_r = 0
    for ex in exercise_outline(A1):
        x = np.array([r["cells"][ex.grade_id]["score"] for r in sent])
        rest = np.array([totals[r["student"]] for r in sent]) - x
        sort, shown = values[(A1, ex.grade_id)]["difficulty"]
        assert float(sort) == pytest.approx(np.mean(x / ex.points)), ex
        assert shown == f"{100 * np.mean(x / ex.points):.0f}%"
        sort, shown = values[(A1, ex.grade_id)]["discrimination"]
        if x.std() == 0 or rest.std() == 0:
            assert (sort, shown) == ("", "n/a"), ex
            checked_na += 1
        else:
            r = np.corrcoef(x, rest)[0, 1]
            assert float(sort) == pytest.approx(r), ex
            assert shown == f"{r:+.2f}"
            checked_r += 1
    assert checked_na >= 1 and checked_r >= 3  # both cases were met
    kinds = Page(_between(page, '<section id="items">', "</section>")).all_text()
    assert "concept question" in kinds and "quick check" in kinds and "exercise" in kinds


def test_item_analysis_is_undefined_with_fewer_than_three_students():
    from graders.outputs.exercises import exercise_outline
    from graders.outputs.report import item_analysis

    outline = exercise_outline(A1)
    top = sum(e.points for e in outline)
    results = [
        _result(s, A1, 0, top, {e.grade_id: _cell(f * e.points, e.points) for e in outline})
        for s, f in (("a", 0.0), ("b", 1.0))
    ]
    items = item_analysis(results, [A1])
    assert [i.exercise.grade_id for i in items] == [e.grade_id for e in outline]
    assert all(i.discrimination is None and i.difficulty == 0.5 for i in items)


def test_most_named_misconceptions_have_the_checks_words(glance):
    _, _, _, page = glance
    section = _between(page, '<section id="misconceptions">', "</section>")
    known = misconceptions.catalogue().find("no-rescale", A1)
    text = Page(section).all_text()
    assert 'data-slug="no-rescale" data-students="1"' in section
    assert known.title in text and known.explanation in text


# ---- cells as the feedback page numbers them; long output in every cell -----------------------


def test_long_output_is_reported_in_graded_and_other_cells_by_their_feedback_names(tmp_path):
    """A real kernel runs an ungraded cell that prints 70,000 characters and a graded test cell
    (checked in the grader, graders/isolation/remote.py) whose call prints 900,000: both are
    reported, each by the name the feedback page shows (its In [n] prompt, its grade cell id)."""
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    from graders.intake.submissions import truncate_outputs
    from graders.outputs.report import feedback_labels
    from graders.run.execute import SurvivingExecute
    from graders.run.pipeline import REPO

    def meta(**kw):
        return {"nbgrader": {"schema_version": 3, "locked": False, "solution": False, **kw}}

    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [
        new_markdown_cell("# Long outputs"),
        new_code_cell("print('x' * 70_000)"),
        new_code_cell(
            "def noisy():\n    print('y' * 900_000)\n    return 1",
            metadata=meta(solution=True, grade=False, grade_id="noisy"),
        ),
        new_code_cell(
            "assert noisy() == 1",
            metadata=meta(grade=True, grade_id="noisy_tests", points=1, locked=True),
        ),
    ]
    nb, _ = SurvivingExecute(timeout=60).preprocess(nb, {"metadata": {"path": str(REPO)}})
    printed = nb.cells[3].outputs[0]["text"]
    assert "900,001 characters printed in all" in printed and len(printed) < 64_000
    count = nb.cells[1].execution_count
    assert truncate_outputs(nb) == sorted([f"In [{count}]", "noisy_tests"])
    assert feedback_labels(nb)[1] == f"In [{count}]"
    page = Page(HTMLExporter(template_name="classic").from_notebook_node(nb)[0]).all_text()
    assert f"In\xa0[{count}]:" in page  # the prompt, as nbconvert writes it
    shown = " ".join(page.split()).split(f"In [{count}]:", 1)[1]
    assert "".join(shown.split()).startswith("print('x'*70_000)"), shown[:80]


def test_problems_name_cells_as_the_feedback_page_does(real_class):
    """A "cell #i" (the notebook's index) becomes the prompt the student's feedback page shows
    above that cell."""
    from graders.outputs.report import relabel_cells

    out, results = real_class
    res = next(r for r in results if r.get("autograded") and r.get("feedback"))
    nb = json.loads((out / res["autograded"]).read_text(encoding="utf-8"))
    idx, cell = next(
        (i, c)
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code"
        and c.get("execution_count")
        and not c["metadata"].get("nbgrader", {}).get("grade")
        and "".join(c["source"]).strip()
    )
    (said,) = relabel_cells([f"cell #{idx}: something"], out / res["autograded"])
    assert said == f"cell In [{cell['execution_count']}]: something"
    raw = Page((out / res["feedback"]).read_text(encoding="utf-8")).all_text()
    assert f"In\xa0[{cell['execution_count']}]:" in raw  # the prompt above the cell
    text = " ".join(raw.split())
    first = " ".join("".join(cell["source"]).strip().splitlines()[0].split())
    prompt = f"In [{cell['execution_count']}]:"
    after = "".join(text.split(prompt, 1)[1].split())  # the highlighted code, spaces aside
    assert after.startswith("".join(first.split())), after[:200]
    for r in results:  # no problem is left naming a cell by its index
        assert not any("cell #" in p for p in r["problems"]), r["problems"]


def test_the_dashboard_link_opens():
    """The local cluster's dashboard listens on 127.0.0.1: the printed link names that host,
    and the page answers."""
    pytest.importorskip("bokeh")
    from urllib.request import urlopen

    from distributed import Client

    from graders.run import cluster

    local = cluster._local_cluster(1)
    client = Client(local)
    try:
        link = cluster.dashboard_link(client, local)
        assert urlparse(link).hostname == "127.0.0.1", link
        with urlopen(link, timeout=30) as page:
            assert page.status == 200
        remote = cluster.dashboard_link(client)  # a scheduler given by address: dask's link
        assert remote == client.dashboard_link
    finally:
        client.close()
        local.close()
