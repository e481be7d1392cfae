"""graders/run/feedback_html.py: nbgrader's feedback page as nbconvert's HTMLExporter writes it,
without the exporter's second parse of the page."""

from __future__ import annotations

import copy

import nbformat
import pytest
from bs4 import BeautifulSoup
from fixtures import bank
from nbconvert.exporters import HTMLExporter
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory

from graders.run import pipeline
from graders.run.feedback_html import DEFAULT_ALT, FeedbackHTMLExporter, add_missing_alt

ALT = f'alt="{DEFAULT_ALT}"'


@pytest.mark.parametrize(
    ("tag", "gets_alt"),
    [
        ('<img src="a.png">', True),
        ("<IMG SRC=a.png />", True),
        ('<img\nsrc="data:image/png;base64,AAAA"\n>', True),
        ('<img src="a.png" alt="a plot">', False),
        ('<img alt="" src="a.png">', False),
        ("<img src=a.png alt>", False),
        ("<img src=a.png ALT=x/>", False),
        ('<img data-alt="x" src="a.png">', True),  # another attribute
        ('<img src="data:image/png;base64,Q+alt=">', True),  # "alt=" inside a value
        ("<img title='x > alt=y' src=a.png>", True),  # ">" and "alt=" inside a quoted value
    ],
)
def test_an_img_without_alt_gets_the_default_one(tag, gets_alt):
    out = add_missing_alt(f"<p>{tag}</p>")
    assert (ALT in out) is gets_alt, out
    # whatever it added, BeautifulSoup reads the tag as nbconvert's pass would leave it
    want = BeautifulSoup(f"<p>{tag}</p>", "html.parser")
    for img in want.select("img:not([alt])"):
        img.attrs["alt"] = DEFAULT_ALT
    assert str(BeautifulSoup(out, "html.parser")) == str(want)


def test_text_that_only_looks_like_an_img_is_left_alone():
    text = (
        "<pre>&lt;img src=x&gt;</pre><p>an imgur link, <imgx src=a></p>"
        "<script>el.innerHTML = '<img src=x>';</script><!-- <img src=y> -->"
        "<style>/* <img src=z> */</style>"
    )
    assert add_missing_alt(text) == text
    want = BeautifulSoup(text, "html.parser")
    assert not want.select("img")  # nbconvert's pass finds no tag there either


def _feedback_config(tmp_path):
    """The config nbgrader's generate_feedback runs with in the grader (pipeline.load_config)."""
    cfg = pipeline.load_config(tmp_path)
    return GenerateFeedback(coursedir=CourseDirectory(config=cfg), config=cfg)


def _graded_notebook():
    """Notebook 01's solution as the grader's feedback step gets it: outputs (a figure, an
    attachment), each graded cell with its score and a comment, and markdown with raw <img>s."""
    nb = bank.with_outputs(pipeline.solved_notebook("01_online_softmax"))
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta and meta.get("grade"):
            meta["score"] = meta.get("points", 0) / 2
        if meta:
            meta["comment"] = "see <img src='comment.png'>"
    nb.cells.append(
        nbformat.v4.new_markdown_cell('<img src="a.png"> and <img src="b.png" alt="b">')
    )
    resources = {"nbgrader": {"notebook": "01", "score": 8, "max_score": 16, "late_penalty": 0}}
    return nb, resources


def test_the_grader_writes_feedback_with_this_exporter(tmp_path):
    assert _feedback_config(tmp_path).exporter_class is FeedbackHTMLExporter


def test_the_feedback_page_is_nbconvert_s_page(tmp_path):
    """Rendered with the feedback template, the page is the one HTMLExporter writes, once both
    are read by BeautifulSoup (HTMLExporter's own output is BeautifulSoup's serialization)."""
    config = _feedback_config(tmp_path).config
    nb, resources = _graded_notebook()
    theirs, _ = HTMLExporter(config=config).from_notebook_node(
        copy.deepcopy(nb), copy.deepcopy(resources)
    )
    ours, _ = FeedbackHTMLExporter(config=config).from_notebook_node(
        copy.deepcopy(nb), copy.deepcopy(resources)
    )
    assert "Test cell" in ours  # nbgrader's feedback template, not nbconvert's default
    assert ours.count(DEFAULT_ALT) == theirs.count(DEFAULT_ALT) > 3
    assert str(BeautifulSoup(ours, "html.parser")) == theirs


def test_a_jupyterlab_style_template_gets_nbconvert_s_own_pass(tmp_path):
    """A template whose page has JupyterLab's cells (tabindex on inputs and outputs) is
    handled by nbconvert's pass, so the page is HTMLExporter's to the byte."""
    nb, resources = _graded_notebook()
    config = copy.deepcopy(_feedback_config(tmp_path).config)
    config.HTMLExporter.template_name = "lab"
    theirs, _ = HTMLExporter(config=config).from_notebook_node(
        copy.deepcopy(nb), copy.deepcopy(resources)
    )
    ours, _ = FeedbackHTMLExporter(config=config).from_notebook_node(
        copy.deepcopy(nb), copy.deepcopy(resources)
    )
    assert 'tabindex="0"' in ours
    assert ours == theirs
