"""The project's setup files agree with each other, and the package imports without a GPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _norm(requirement: str) -> str:
    """'triton>=3.1; platform_system == "Linux"' -> 'triton>=3.1;platform_system=="linux"'."""
    return re.sub(r"\s+", "", requirement).replace("'", '"').lower()


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {_norm(r) for r in reqs}


def _environment_requirements() -> set[str]:
    """Every `- name...` entry of environment.yml except python and pip themselves."""
    reqs = set()
    for line in (REPO / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+.*)$", line)
        if not m or m.group(1).rstrip(":") in ("pip", "conda-forge"):
            continue
        entry = m.group(1)
        if entry.startswith("python") and not entry.startswith("python-"):
            continue
        reqs.add(_norm(entry))
    return reqs


def test_environment_yml_lists_what_pyproject_lists():
    from_pyproject, from_conda = _pyproject_requirements(), _environment_requirements()
    assert from_pyproject == from_conda, (
        f"only in pyproject.toml: {sorted(from_pyproject - from_conda)}; "
        f"only in environment.yml: {sorted(from_conda - from_pyproject)}"
    )


def test_python_floor_is_310_everywhere():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert "python>=3.10" in (REPO / "environment.yml").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = "python3 course.py test"
    assert command in readme, "README.md must name the test command"
    assert command in ci, ".ci/run must call the README's test command"


def test_package_imports_without_torch_or_triton():
    """A CPU-only student without torch/triton can import every NumPy part of the course."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
        "import course_utils, course_utils.checks, course_utils.widgets\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
