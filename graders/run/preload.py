"""What every grading process imports, imported once by the server that forks them.

graders.run.worker.run_worker grades each submission in a process of its own, forked from a
multiprocessing forkserver whose preload is this module: nbgrader, nbconvert, nbclient,
jupyter_client and the course's checks are imported once per grading run instead of once per
submission (1.9 s of imports at the worker's top level and 1.6 s more inside grade_one, on two
busy cores; journal, "Grading processes forked from a preloaded server"). Importing is all it
does: no student code and no submission ever runs in the server, so every forked process starts
as clean as a new one. The server listens in this grader's own temporary folder (a socket the
sandboxed kernel cannot reach: it has a /tmp of its own and no network namespace in common).
"""

from graders.run import pipeline

pipeline.skip_iri_grammar()  # before anything below imports nbformat (see skip_iri_grammar)

import pkgutil  # noqa: E402

import nbformat  # noqa: E402,F401
from nbconvert.exporters import HTMLExporter  # noqa: E402,F401
from nbgrader.apps.api import NbGraderAPI  # noqa: E402,F401
from nbgrader.converters import Autograde, GenerateFeedback  # noqa: E402,F401

import course_utils.checks  # noqa: E402
import course_utils.checks.engine.failures  # noqa: E402,F401
import graders.isolation.remote  # noqa: E402,F401
import graders.isolation.sandbox  # noqa: E402,F401
import graders.isolation.student_build  # noqa: E402,F401
import graders.run.execute  # noqa: E402,F401
import graders.run.worker  # noqa: E402,F401

for _module in pkgutil.iter_modules(course_utils.checks.__path__, "course_utils.checks."):
    __import__(_module.name)  # each notebook's checks: the grader runs its test cells here
