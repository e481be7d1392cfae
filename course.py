#!/usr/bin/env python3
"""The course's commands. Each sets up a local virtual environment (.venv) the first time.

    python3 course.py lab          # the student's JupyterLab on notebooks/ (prints the URL)
    python3 course.py instructor   # JupyterLab on the repository, with nbgrader's tools
    python3 course.py test         # lint, format check and every test, notebooks included

Setup is idempotent: the environment is rebuilt only when pyproject.toml changes, and it says
what it installs as it goes. Torch: on a Linux machine without an NVIDIA driver, torch==2.13.0 is
installed first from PyTorch's CPU wheel index (about 0.9 GB installed instead of several GB
of CUDA libraries); where that index cannot be reached, the plain requirement is used (on the course
machines it finds the CPU build on disk). Set COURSE_TORCH (for example
COURSE_TORCH="torch==2.5.1") to choose another torch; COURSE_TORCH_INDEX to use another index.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".course-setup"


def venv_python() -> Path:
    sub = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return VENV / sub


def say(msg: str) -> None:
    print(f"[course] {msg}", flush=True)


def run(cmd: list[str], **kw) -> int:
    say(" ".join(str(c) for c in cmd))
    return subprocess.call([str(c) for c in cmd], cwd=ROOT, **kw)


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_spec() -> str:
    if os.environ.get("COURSE_TORCH"):
        return os.environ["COURSE_TORCH"]
    if platform.system() == "Linux" and shutil.which("nvidia-smi") is None:
        return "torch==2.13.0"
    return "torch"


def torch_index() -> str | None:
    """PyTorch's CPU wheel index where it applies and answers; None: pip's own index."""
    if os.environ.get("COURSE_TORCH_INDEX"):
        return os.environ["COURSE_TORCH_INDEX"]
    if os.environ.get("COURSE_TORCH") or not torch_spec().startswith("torch=="):
        return None
    if platform.system() != "Linux" or shutil.which("nvidia-smi") is not None:
        return None
    try:
        with urllib.request.urlopen(CPU_INDEX + "/torch/", timeout=5) as reply:
            return CPU_INDEX if reply.status == 200 else None
    except OSError:
        return None


def folder_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total / 1e6


def step(what: str, cmd: list) -> int:
    """Run one set-up step, saying what it is before and how long it took after."""
    say(what)
    start = time.perf_counter()
    code = run(cmd)
    say(f"  done in {time.perf_counter() - start:.0f} s ({folder_mb(VENV):,.0f} MB in .venv)")
    return code


def setup_hash() -> str:
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    h.update(torch_spec().encode())
    h.update(sys.version.encode())
    return h.hexdigest()


def ensure_env() -> Path:
    if sys.version_info < (3, 10):  # noqa: UP036 (this file may be run by an older python)
        sys.exit("The course needs Python 3.10 or newer; this is " + sys.version.split()[0])
    py = venv_python()
    want = setup_hash()
    if py.exists() and STAMP.exists() and STAMP.read_text() == want:
        return py
    start = time.perf_counter()
    say("first start: setting up the course environment (a few minutes; later starts are instant)")
    if not py.exists():
        say(f"1/3 creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [py, "-m", "pip", "install", "--quiet", "--progress-bar", "off"]
    probe = subprocess.call([py, "-c", "import torch"], stderr=subprocess.DEVNULL)
    if probe != 0:
        spec, index = torch_spec(), torch_index()
        where = f"from {index}" if index else "from pip's index"
        code = step(
            f"2/3 installing {spec} {where}"
            + (" (CPU build: about 0.9 GB installed)" if index or spec == "torch==2.13.0" else ""),
            [*pip, spec] + (["--index-url", index] if index else []),
        )
        if code != 0 and index:
            say(f"  {index} failed; trying pip's own index")
            code = step(f"2/3 installing {spec}", [*pip, spec])
        if code != 0:
            sys.exit(f"installing {spec} failed; set COURSE_TORCH to a torch you can install")
    code = step(
        "3/3 installing the course package and its tools (NumPy, SciPy, JupyterLab, nbgrader, "
        "Triton, pytest; about 1.8 GB installed, 1 GB of it Triton)",
        [*pip, "-e", ".[course,dev]"],
    )
    if code != 0:
        sys.exit("installing the course package failed (see pip's message above)")
    STAMP.write_text(want)
    say(f"environment ready in {time.perf_counter() - start:.0f} s, {folder_mb(VENV):,.0f} MB")
    return py


def lab_command(py: Path, root: Path, student: bool) -> tuple[list, dict]:
    """The JupyterLab command line and environment of the student's or the instructor's lab.

    Both: widget state saved with the notebook (a saved figure reopens as its last picture) and
    no news or update checks (jupyter/settings/overrides.json). The student's lab also hides the
    instructor's nbgrader tools and their server parts (jupyter/student/), keeping Validate.
    """
    opts = [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.app_settings_dir={ROOT / 'jupyter' / 'settings'}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and Colab-like machines
        opts.append("--allow-root")
    env = dict(os.environ)
    if student:
        paths = [str(ROOT / "jupyter" / "student"), env.get("JUPYTER_CONFIG_PATH", "")]
        env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in paths if p)
    return [py, "-m", "jupyter", "lab", *opts], env


def cmd_lab(args: list[str]) -> int:
    py = ensure_env()
    cmd, env = lab_command(py, ROOT / "notebooks", student=True)
    return run([*cmd, *args], env=env)


def cmd_instructor(args: list[str]) -> int:
    py = ensure_env()
    cmd, env = lab_command(py, ROOT, student=False)
    return run([*cmd, *args], env=env)


def cmd_test(args: list[str]) -> int:
    py = ensure_env()
    for check in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        if run([py, "-m", *check]) != 0:
            say("lint failed: run `.venv/bin/ruff format .` and `.venv/bin/ruff check --fix .`")
            return 1
    jobs = os.environ.get("COURSE_TEST_JOBS", str(min(4, os.cpu_count() or 1)))
    return run([py, "-m", "pytest", "-n", jobs, "--dist", "loadgroup", *args])


COMMANDS = {"lab": cmd_lab, "instructor": cmd_instructor, "test": cmd_test}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
