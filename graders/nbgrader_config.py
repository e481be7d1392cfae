# nbgrader configuration of the course. `python -m graders ...` loads this file; an instructor who
# runs nbgrader by hand can pass it with `--config graders/nbgrader_config.py` from the repo root.
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

c = get_config()  # noqa: F821 (provided by traitlets when the file is loaded)

# The course id is course.toml's (graders/settings.py reads the same file; traitlets runs this
# file without importing it, and sets __file__).
_course_toml = Path(__file__).resolve().parent.parent / "course.toml"
c.CourseDirectory.course_id = tomllib.loads(_course_toml.read_text(encoding="utf-8"))["course"][
    "id"
]
# The instructor notebooks are the nbgrader source; the student notebooks are the release.
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# Only notebooks are released; figures are drawn by course_utils at run time.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.png"]
# Student code must not hang the grader: a cell that runs longer than this fails.
c.Execute.timeout = 120
c.ClearSolutions.code_stub = {
    "python": "# YOUR CODE HERE\nraise NotImplementedError()",
}
