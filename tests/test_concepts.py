"""Graded concept questions: every option of every question, and their place in the notebooks."""

from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.checks import CheckFailure
from course_utils.checks._core import Option, Question, check_choice
from course_utils.checks._wire import decode, encode
from course_utils.checks.concepts import NOTEBOOK, QUESTIONS, check_concept
from graders import pipeline
from tests.checkhelp import run_quietly, slug_of

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

    from course_utils.checks._core import Case, run_cases
    from tests.checkhelp import as_learner

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
