"""Graded concept questions: every option of every question, and their place in the notebooks."""

from __future__ import annotations

import importlib
import re

import nbformat
import numpy as np
import pytest
from checkhelp import run_quietly, slug_of

from course_utils.checks import CheckFailure
from course_utils.checks.concepts import NOTEBOOK, QUESTIONS, check_concept
from course_utils.checks.engine import quizzes
from course_utils.checks.engine.quizzes import Option, Question, check_choice
from course_utils.checks.engine.wire import decode, encode
from graders.run import pipeline

NAMES = sorted(QUESTIONS)


def _solution(assignment: str):
    return nbformat.read(pipeline.REPO / "solutions" / assignment / f"{assignment}.ipynb", 4)


@pytest.mark.parametrize("name", NAMES)
def test_right_answer_passes_and_says_why(name):
    q = QUESTIONS[name]
    answer = ("true" in q.right) if q.true_false else "".join(sorted(q.right))
    out = run_quietly(check_concept, name, answer)
    assert out.startswith(f"✓ {q.label}:"), out
    if q.pick > 1:  # any order, any container of letters
        run_quietly(check_concept, name, "".join(sorted(q.right, reverse=True)).upper())
        run_quietly(check_concept, name, set(q.right))
        run_quietly(check_concept, name, list(q.right))


@pytest.mark.parametrize("name", NAMES)
def test_every_wrong_option_names_its_misconception(name):
    q = QUESTIONS[name]
    for wrong in (o for o in q.options if o.slug is not None):
        if q.true_false:
            answer = wrong.key == "true"
        elif q.pick == 1:
            answer = wrong.key
        else:  # one wrong option with the other right ones
            answer = wrong.key + "".join(sorted(q.right))[: q.pick - 1]
        with pytest.raises(CheckFailure) as err:
            check_concept(name, answer)
        assert slug_of(err.value) == wrong.slug, str(err.value)
        assert wrong.why in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_answers_that_are_not_a_choice_are_told_so(name):
    q = QUESTIONS[name]
    for answer, words in [(None, "no answer yet"), (..., "no answer yet"), (3.5, "")]:
        with pytest.raises(CheckFailure) as err:
            check_concept(name, answer)
        assert words in str(err.value)
        assert slug_of(err.value) is None
    if not q.true_false:
        with pytest.raises(CheckFailure, match="not one of the options"):
            check_concept(name, "z")
        with pytest.raises(CheckFailure, match=f"choose exactly {q.pick}"):
            check_concept(name, "".join(o.key for o in q.options))
    else:
        with pytest.raises(CheckFailure, match="not True or False"):
            check_concept(name, "maybe")


def test_a_two_choice_question_wants_both_reasons():
    q = QUESTIONS["ratio-two"]
    one = sorted(q.right)[0]
    with pytest.raises(CheckFailure, match="choose exactly 2"):
        check_concept("ratio-two", one)


def test_true_false_takes_words_too():
    run_quietly(check_concept, "exact", "false")
    run_quietly(check_concept, "exact", " False ")
    with pytest.raises(CheckFailure) as err:
        check_concept("exact", "yes")
    assert slug_of(err.value) == "approximates-attention"


def test_unknown_question_is_a_clear_error():
    with pytest.raises(CheckFailure, match="no concept question 'nope'"):
        check_concept("nope", "a")


def test_question_definitions_are_validated():
    right = Option("a", "right")
    with pytest.raises(ValueError, match="right options"):
        Question("q", "p", (right, Option("b", "also right")), "v")
    with pytest.raises(ValueError, match="explanation"):
        Question("q", "p", (right, Option("b", "wrong", "slug")), "v")
    with pytest.raises(ValueError, match="repeat"):
        Question("q", "p", (right, Option("a", "wrong", "s", "why")), "v")
    q = Question("q", "p", (right, Option("b", "wrong", "s", "why")), "v")
    with pytest.raises(CheckFailure, match="misconception: s"):
        check_choice(q, "b")


def test_the_letters_of_a_set_travel_to_the_grader():
    tree, arrays = encode({"a", "c"})
    assert decode(tree, arrays) == frozenset({"a", "c"})
    run_quietly(check_concept, "ratio-two", decode(*encode(set(QUESTIONS["ratio-two"].right))))


@pytest.mark.parametrize("name", NAMES)
def test_each_question_is_asked_and_graded_in_its_notebook(name):
    q, assignment = QUESTIONS[name], NOTEBOOK[name]
    nb = _solution(assignment)
    shown = [c for c in nb.cells if c.cell_type == "markdown" and q.markdown() in c.source]
    assert shown, f"{assignment} does not show the question {name!r} (QUESTIONS[...].markdown())"
    answer = [
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
        and re.search(rf"^{q.variable}\s*=", c.source, re.M)
    ]
    assert len(answer) == 1, f"{assignment}: one answer cell must set {q.variable}"
    graded = [
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
        and f'check_concept("{name}", {q.variable})' in c.source
    ]
    assert len(graded) == 1 and graded[0].metadata["nbgrader"]["points"] >= 1
    order = [nb.cells.index(c) for c in (shown[0], answer[0], graded[0])]
    assert order == sorted(order), "question, answer cell and test cell must come in that order"


@pytest.mark.parametrize("assignment", pipeline.assignments())
def test_every_concept_test_cell_names_a_known_question(assignment):
    for cell in _solution(assignment).cells:
        for name in re.findall(r'check_concept\("([^"]+)"', cell.source):
            assert name in QUESTIONS and NOTEBOOK[name] == assignment, (assignment, name)


def test_a_staged_check_names_the_first_failing_stage():
    import numpy as np
    from checkhelp import as_learner

    from course_utils.checks.engine.cases import Case, run_cases

    def reference(x):
        return np.cumsum(x)

    @as_learner
    def plain_only(x):  # right on short inputs, wrong from the second stage on
        return np.cumsum(x) if len(x) < 4 else np.zeros(len(x))

    cases = [
        Case("three numbers", (np.arange(3.0),), stage="plain"),
        Case("five numbers", (np.arange(5.0),), stage="ragged"),
        Case("seven numbers", (np.arange(7.0),), stage="causal"),
    ]
    with pytest.raises(CheckFailure) as err:
        run_cases("cumsum", plain_only, reference, cases, outputs=("y",))
    text = str(err.value)
    assert text.startswith("✗ cumsum: stage 2 of 3 (ragged) fails; stage 1 (plain) passes.")
    assert "Still to check after it: causal." in text and "five numbers" in text
    with pytest.raises(ValueError, match="not contiguous"):
        run_cases("cumsum", plain_only, reference, [cases[0], cases[1], cases[0]], outputs=("y",))


# ---- issue 39: plain-text feedback, stated tolerances, the README -------------------------------
_LATEX = re.compile(r"\$|\\[A-Za-z]+")  # math delimiters and LaTeX commands


@pytest.mark.parametrize("name", NAMES)
def test_feedback_of_every_wrong_option_is_plain_text(name):
    """Options are markdown with LaTeX; what the learner reads in feedback has none of it."""
    question = QUESTIONS[name]
    for option in question.options:
        if option.slug is None:
            continue
        answer = option.key if question.pick == 1 else option.key + min(question.right)
        if question.true_false:
            answer = option.key == "true"
        with pytest.raises(CheckFailure) as info:
            check_concept(name, answer)
        assert not _LATEX.search(str(info.value)), str(info.value)


def test_latex_becomes_unicode_in_feedback():
    """The two cases of the issue: $N \\times N$ -> N×N, $\\Theta(N^2 d)$ -> Θ(N²d)."""
    with pytest.raises(CheckFailure) as info:
        check_concept("memory-bound", "c")
    assert "Θ(N²d)" in str(info.value)
    with pytest.raises(CheckFailure) as info:
        check_concept("forward-flops", "b")
    assert "N×N" in str(info.value)


QUICK_NOTEBOOKS = [
    "01_online_softmax",
    "02_merge_partials",
    "03_tiled_forward",
    "04_hbm_traffic",
    "05_split_kv",
    "07_backward",
]


def _quick_checks(assignment):
    """(check function, the question's markdown) for every numeric quick check of a notebook."""
    nb = _solution(assignment)
    question = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            question = cell.source
        for module, fn in re.findall(
            r"from (course_utils\.checks\.\w+) import (check_quick_\w+)", cell.source
        ):
            yield getattr(importlib.import_module(module), fn), question


@pytest.mark.parametrize("assignment", QUICK_NOTEBOOKS)
def test_every_numeric_quick_check_states_the_tolerance_it_uses(assignment, monkeypatch):
    """The tolerance beside the question is the one its check applies (read from the call)."""
    used = {}

    def record(label, yours, expected, *, rtol=1e-3, **kwargs):
        used["rtol"] = rtol

    monkeypatch.setattr(quizzes, "check_answer", record)
    checks = list(_quick_checks(assignment))
    assert checks
    for check, question in checks:
        used.clear()
        check(0.0)
        phrase = quizzes.tolerance_phrase(used["rtol"])
        assert f"tolerance: {phrase}" in question, (check.__name__, phrase, question)


def test_an_answer_within_ten_tolerances_is_asked_for_digits_not_hinted():
    """Issue 39: 19.19 against 19.1868 (rtol 1e-4) got a hint that sent the learner re-deriving."""
    from course_utils.checks.online_softmax import check_quick_second_example

    with pytest.raises(CheckFailure) as info:
        check_quick_second_example(19.19)
    text = str(info.value)
    assert "close" in text and "give 5 significant digits" in text and "hint" not in text
    assert round(19.1868, 5 - 2) == 19.187  # 5 significant digits of the answer ...
    assert "✓" in run_quietly(check_quick_second_example, 19.187)  # ... pass
    with pytest.raises(CheckFailure) as info:
        check_quick_second_example(25.0)  # far off: the hint, not the digits
    assert "hint" in str(info.value) and "significant" not in str(info.value)


def test_significant_digits_always_meet_the_tolerance():
    for rtol in (1e-4, 5e-3, 1e-3, 1e-2, 2e-2):
        n = quizzes.significant_digits(rtol)
        for value in (1.04999, 1.94999, 9.999, 19.1868, 0.135335):
            rounded = float(f"{value:.{n}g}")
            assert abs(rounded - value) <= rtol * abs(value)


def test_a_known_wrong_value_near_the_right_one_keeps_its_hint():
    """The digits request never hides a known mistake's hint (hinted_answer's windows)."""
    with pytest.raises(CheckFailure) as info:
        quizzes.hinted_answer("x", 1.011, 1.0, [(1.012, "the known mistake")], "default", rtol=1e-2)
    assert "the known mistake" in str(info.value) and "significant" not in str(info.value)


def test_averaging_the_two_blocks_gets_a_hint_that_names_averaging():
    from course_utils.checks.online_softmax import FURTHER_V, FURTHER_X, check_quick_second_example

    outs = []
    for b in (slice(0, 2), slice(2, 4)):
        w = np.exp(FURTHER_X[b] - FURTHER_X[b].max())
        outs.append(float(w @ FURTHER_V[b] / w.sum()))
    with pytest.raises(CheckFailure) as info:
        check_quick_second_example((outs[0] + outs[1]) / 2)
    assert "average of the two blocks' outputs" in str(info.value)


def test_readme_names_the_notebooks_that_have_concept_checks():
    readme = (pipeline.REPO / "README.md").read_text()
    section = readme.split("## The notebooks", 1)[1].split("\n## ", 1)[0]
    sentence = " ".join(section.split("\n\n")[1].split())
    numbers = sorted({nb[:2] for nb in NOTEBOOK.values()})
    listed = ", ".join(numbers[:-1]) + " and " + numbers[-1]
    assert f"in notebooks {listed}, graded concept checks" in sentence, sentence
