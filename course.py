#!/usr/bin/env python3
"""The course's two commands. Each sets up a local virtual environment (.venv) the first time.

    python3 course.py lab    # open JupyterLab on notebooks/ (prints the URL; works headless)
    python3 course.py test   # lint, format check and every test, notebooks included

Setup is idempotent: the environment is rebuilt only when pyproject.toml changes.
Torch: on a Linux machine without an NVIDIA driver, torch==2.13.0 (the CPU build on the course
machines) is installed before anything else, so nothing pulls a multi-GB CUDA build. Set
COURSE_TORCH (for example COURSE_TORCH="torch==2.5.1") to choose another torch.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
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


def torch_spec() -> str:
    if os.environ.get("COURSE_TORCH"):
        return os.environ["COURSE_TORCH"]
    if platform.system() == "Linux" and shutil.which("nvidia-smi") is None:
        return "torch==2.13.0"
    return "torch"


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
    if not py.exists():
        say(f"creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [py, "-m", "pip", "install", "--quiet"]
    probe = subprocess.call([py, "-c", "import torch"], stderr=subprocess.DEVNULL)
    if probe != 0 and run([*pip, torch_spec()]) != 0:
        sys.exit(f"installing {torch_spec()} failed; set COURSE_TORCH to a torch you can install")
    if run([*pip, "-e", ".[course,dev]"]) != 0:
        sys.exit("installing the course package failed (see pip's message above)")
    STAMP.write_text(want)
    say("environment ready")
    return py


def cmd_lab(args: list[str]) -> int:
    py = ensure_env()
    notebooks = ROOT / "notebooks"
    opts = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={notebooks}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and Colab-like machines
        opts.append("--allow-root")
    return run([py, "-m", "jupyter", "lab", *opts, *args])


def cmd_test(args: list[str]) -> int:
    py = ensure_env()
    for check in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        if run([py, "-m", *check]) != 0:
            say("lint failed: run `.venv/bin/ruff format .` and `.venv/bin/ruff check --fix .`")
            return 1
    jobs = os.environ.get("COURSE_TEST_JOBS", str(min(4, os.cpu_count() or 1)))
    return run([py, "-m", "pytest", "-n", jobs, "--dist", "loadgroup", *args])


COMMANDS = {"lab": cmd_lab, "test": cmd_test}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
