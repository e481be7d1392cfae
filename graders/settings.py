"""The instructor's settings of the course: course.toml at the repository's root, in one place.

    [course]  name, id (nbgrader's course_id), repository (the GitHub URL of the Colab badges and
              of every notebook's setup cell)
    [grader]  the defaults of `python -m graders grade`: timeout, memory_gb, jobs, sandbox, exports

    load() -> Settings          the repository's course.toml (read once, then cached)
    load(path) -> Settings      another file (a fork's, a test's temporary copy)

Read with tomllib (tomli on Python 3.10). graders/nbgrader_config.py reads the same file for the
course id: it is loaded by traitlets, not imported, so it cannot use this module.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (Python 3.10)
    import tomli as tomllib

COURSE_TOML = Path(__file__).resolve().parent.parent / "course.toml"
GITHUB = "https://github.com/"


class SettingsError(ValueError):
    """course.toml is missing, or a setting in it is missing or of the wrong type."""


@dataclass(frozen=True)
class Settings:
    name: str
    course_id: str
    repository: str  # https://github.com/OWNER/NAME, no trailing slash
    timeout: int = 60  # seconds one cell may run while a submission is graded
    memory_gb: float = 6.0  # memory cap per submission
    jobs: int | None = None  # worker processes of the local dask cluster; None: one per core
    sandbox: bool = True  # run the students' code in the bubblewrap sandbox
    exports: tuple[str, ...] = ()  # LMS grade files written on every run (canvas, moodle)

    @property
    def colab_url(self) -> str:
        """Colab's address of the repository: COLAB_URL/blob/main/notebooks/... opens one."""
        return "https://colab.research.google.com/github/" + self.repository[len(GITHUB) :]


def _get(table: dict, section: str, key: str, kind, where: str, default=None):
    """table[key], checked to be a `kind` (bool is not a number here); `default` when absent
    (None: the setting is required)."""
    if key not in table:
        if default is None:
            raise SettingsError(f"{where}: [{section}] has no `{key}`")
        return default
    value = table[key]
    allowed = (int, float) if kind is float else kind  # memory_gb = 6 is a float too
    if not isinstance(value, allowed) or (isinstance(value, bool) and kind is not bool):
        raise SettingsError(f"{where}: [{section}] {key} = {value!r} is not a {kind.__name__}")
    return value


def parse(text: str, where: str = "course.toml") -> Settings:
    """The Settings of a course.toml's text; SettingsError names what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    course, grader = data.get("course", {}), data.get("grader", {})
    repository = _get(course, "course", "repository", str, where).rstrip("/")
    owner_name = repository[len(GITHUB) :].split("/")
    if not repository.startswith(GITHUB) or len(owner_name) != 2 or not all(owner_name):
        raise SettingsError(
            f"{where}: repository = {repository!r} is not https://github.com/OWNER/NAME "
            "(Colab opens notebooks from GitHub only)"
        )
    exports = _get(grader, "grader", "exports", list, where, [])
    if not all(isinstance(e, str) for e in exports):
        raise SettingsError(f"{where}: [grader] exports = {exports!r} is not a list of names")
    d = Settings("", "", "")
    return Settings(
        name=_get(course, "course", "name", str, where),
        course_id=_get(course, "course", "id", str, where),
        repository=repository,
        timeout=_get(grader, "grader", "timeout", int, where, d.timeout),
        memory_gb=float(_get(grader, "grader", "memory_gb", float, where, d.memory_gb)),
        jobs=_get(grader, "grader", "jobs", int, where, 0) or None,
        sandbox=_get(grader, "grader", "sandbox", bool, where, d.sandbox),
        exports=tuple(exports),
    )


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> Settings:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"the course's settings {path} could not be read: {exc}") from None
    return parse(text, str(path))


def load(path: str | Path | None = None) -> Settings:
    """The settings in `path` (default: the repository's course.toml)."""
    return _load(Path(path or COURSE_TOML).resolve())
