"""What every grading process imports, imported once by the server that forks them.

graders.run.worker.run_worker grades each submission in a process of its own, forked from a
multiprocessing forkserver whose preload is this module: nbgrader, nbconvert, nbclient,
jupyter_client and the course's checks are imported once per grading run instead of once per
submission (1.9 s of imports at the worker's top level and 1.6 s more inside grade_one, on two busy
cores; journal, "Grading processes forked from a preloaded server"). It also renders one notebook
of its own, written here, to feedback HTML: what nbconvert sets up lazily on its first export
(Pygments' lexers, the Markdown parser, the HTML sanitizer, compiled regular expressions) is then
set up once, and each graded process's feedback takes about a third less (journal, "Triton's
interpreter without the costs a GPU never pays"); the feedback exporter keeps the Jinja templates
it compiled then, and the forked processes compile none (graders/run/feedback_html.py). A run
with a released notebook that imports torch has the server import torch too
(graders.run.worker.preload_for). No student code and no
submission ever runs in the server, so every forked process starts as clean as a new one. The
server listens in this grader's own temporary folder (a socket the sandboxed kernel cannot reach:
it has a /tmp of its own and no network namespace in common).
"""

from graders.run import pipeline

pipeline.skip_iri_grammar()  # before anything below imports nbformat (see skip_iri_grammar)

import pkgutil  # noqa: E402

import nbformat  # noqa: E402,F401
from nbgrader.apps.api import NbGraderAPI  # noqa: E402,F401
from nbgrader.converters import Autograde, GenerateFeedback  # noqa: E402,F401

import course_utils.checks  # noqa: E402
import course_utils.checks.engine.failures  # noqa: E402,F401
import graders.isolation.remote  # noqa: E402,F401
import graders.isolation.sandbox  # noqa: E402,F401
import graders.isolation.student_build  # noqa: E402,F401
import graders.run.execute  # noqa: E402,F401
import graders.run.worker  # noqa: E402,F401
from graders.run.feedback_html import FeedbackHTMLExporter  # noqa: E402

for _module in pkgutil.iter_modules(course_utils.checks.__path__, "course_utils.checks."):
    __import__(_module.name)  # each notebook's checks: the grader runs its test cells here


def _warm_feedback() -> str:
    """Render a small notebook of the server's own (markdown with math, code, a stream, an ANSI
    traceback, a picture, HTML) with the exporter nbgrader's generate_feedback configures (its
    template, stylesheet and CSS preprocessor); the HTML."""
    import tempfile

    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.coursedir import CourseDirectory

    png = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
        "RU5ErkJggg=="
    )
    v4 = nbformat.v4
    answer = v4.new_code_cell("def f(x):\n    return x + 1", execution_count=1)
    answer.metadata["nbgrader"] = {"grade_id": "f", "solution": True, "grade": False}
    answer.metadata["nbgrader"]["comment"] = "Well **done**."
    test = v4.new_code_cell("import numpy as np\n\nprint(np.exp(f(0.0)))", execution_count=2)
    test.metadata["nbgrader"] = {"grade_id": "f_tests", "solution": False, "grade": True}
    test.metadata["nbgrader"].update(points=2.0, score=1.0)
    test.outputs = [
        v4.new_output("stream", name="stdout", text="2.718281828459045\n"),
        v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
        v4.new_output("display_data", data={"text/html": "<b>✓ passed</b>"}),
        v4.new_output(
            "error",
            ename="CheckFailure",
            evalue="✗ wrong",
            traceback=["\x1b[0;31mCheckFailure\x1b[0m: ✗ wrong"],
        ),
    ]
    text = v4.new_markdown_cell("# Warm-up\n\nThe row sum $\\ell_i = \\sum_j e^{s_{ij}}$.")
    nb = v4.new_notebook(cells=[text, answer, test])
    grades = {"notebook": "warm-up", "score": 1.0, "max_score": 2.0, "late_penalty": 0.0}
    with tempfile.TemporaryDirectory(prefix="fa-warm-up-") as root:
        converter = GenerateFeedback(coursedir=CourseDirectory(root=root))
    exporter = FeedbackHTMLExporter(config=converter.config)  # keeps the compiled templates
    exporter.register_preprocessor(CSSHTMLHeaderPreprocessor, enabled=True)
    html, _ = exporter.from_notebook_node(nb, resources={"nbgrader": grades})
    return html


try:
    _warm_feedback()
except Exception:  # only a head start: each graded process renders its own feedback anyway
    pass
