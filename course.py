#!/usr/bin/env python3
"""The course's commands. Each sets up a local virtual environment (.venv) the first time.

    python3 course.py lab          # the student's JupyterLab on notebooks/ (prints the URL)
    python3 course.py gpu          # add torch and Triton, for the Triton notebooks 06, 08-11
    python3 course.py lab --gpu    # both: add torch and Triton, then start the lab
    python3 course.py instructor   # JupyterLab on the repository, with nbgrader's tools
    python3 course.py test         # lint, format check and every test, notebooks included
    python3 course.py hub --roster roster.csv --instructor NAME
                                   # a class on this machine: JupyterHub, nbgrader's exchange
                                   # (as root; docs/hub.md)
    python3 course.py setup [lab|gpu|instructor|test|hub]
                                   # set up .venv for that command (default: test), start nothing

The environment comes in layers (pyproject.toml's extras): `lab` installs the NumPy track only
(notebooks 01-05 and 07: NumPy, SciPy, Matplotlib, ipywidgets, JupyterLab, nbgrader's Validate);
`gpu` adds torch and Triton when the student first needs them; `instructor` and `test` install
the whole course. Setup is idempotent: a layer is installed once, and everything installed is
reinstalled when pyproject.toml changes. The course package's layers are installed with uv
(itself installed into .venv by pip, once; COURSE_INSTALLER=pip for pip alone, and pip takes over
where uv fails); torch with pip. Each step says what it installs, prints the installer's own lines
as they come (and a line at least every 10 s while it is quiet), then its time and the size of
.venv. Where Python writes no bytecode of its own (PYTHONDONTWRITEBYTECODE set, as on CI) and for
the grader's layers (its sandbox mounts .venv read-only), set-up ends by compiling .venv once
(all but the installed packages' own test suites). Set-up also uninstalls jsonschema's optional
IRI checker (rfc3987-syntax, brought by jupyter-events), which costs every Jupyter server and
nbgrader command about 1 s at its start and which no Jupyter schema uses (`drop_iri_checker`).

Torch: on a Linux machine without an NVIDIA driver, torch==2.13.0 is installed first from
PyTorch's CPU wheel index (about 0.7 GB installed instead of several GB of CUDA libraries); where
that index cannot be reached, the plain requirement is used (on the course machines it finds the
CPU build on disk). Set COURSE_TORCH (for example COURSE_TORCH="torch==2.5.1") to choose another
torch; COURSE_TORCH_INDEX to use another index. Set COURSE_VENV to a prepared virtual environment
to use it as it is (course.py then installs nothing).

Stopping: Ctrl-C, SIGTERM or SIGHUP to course.py stops its JupyterLab and the lab's kernels, then
course.py exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("COURSE_VENV") or ROOT / ".venv").absolute()
PREPARED = bool(os.environ.get("COURSE_VENV"))  # a prepared environment: install nothing
STAMP = VENV / ".course-setup"
HEARTBEAT_S = 10.0  # the longest a pip step stays quiet
STOP_GRACE_S = 15.0  # how long JupyterLab gets to shut its kernels down before it is killed

# What each command needs (pyproject.toml's extras), and what each extra brings, for the step line.
NEEDS = {
    "lab": ("lab",),
    "gpu": ("lab", "gpu"),
    "instructor": ("course", "dev"),
    "test": ("course", "dev", "hub"),
    "hub": ("course", "hub"),
}
BRINGS = {
    "lab": "the NumPy track: NumPy, SciPy, Matplotlib, ipywidgets, JupyterLab, nbgrader's Validate"
    " (about 0.5 GB installed)",
    "gpu": "Triton (about 1 GB installed; Linux only)",
    "course": "the instructor's tools: Triton, copydetect, dask, jupytext (about 1.1 GB installed)",
    "dev": "the test tools: pytest, ruff, Playwright (about 0.2 GB installed)",
    "hub": "JupyterHub, for a class on one machine (about 0.1 GB installed)",
}
TORCH_EXTRAS = {"gpu", "course"}
REPO_PACKAGES = ("course_utils", "graders", "benchmarks")  # imported by kernels and graders


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


def stream(cmd: list, heartbeat_s: float = HEARTBEAT_S) -> int:
    """Run `cmd`, printing its output line by line as it comes, and a line of our own whenever
    it has been quiet for `heartbeat_s` (pip says nothing while it unpacks a large wheel).
    pip's "Requirement already satisfied" lines are counted, not printed."""
    say(" ".join(str(c) for c in cmd))
    start = last = time.monotonic()
    lock, done = threading.Lock(), threading.Event()

    def beat() -> None:
        nonlocal last
        while not done.wait(0.5):
            with lock:
                if time.monotonic() - last < heartbeat_s:
                    continue
                say(
                    f"  ... still working: {time.monotonic() - start:.0f} s so far, "
                    f"{folder_mb(VENV):,.0f} MB in .venv"
                )
                last = time.monotonic()

    proc = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
    )
    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    satisfied = 0
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if not line:
                continue
            if line.startswith("Requirement already satisfied"):
                satisfied += 1
                continue
            with lock:
                print("  " + line, flush=True)
                last = time.monotonic()
        return proc.wait()
    finally:
        done.set()
        ticker.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if satisfied:
            say(f"  already satisfied: {satisfied} requirement" + ("s" if satisfied > 1 else ""))


def step(what: str, cmd: list) -> int:
    """Run one set-up step, saying what it is before and how long it took after."""
    say(what)
    start = time.perf_counter()
    code = stream(cmd)
    say(f"  done in {time.perf_counter() - start:.0f} s ({folder_mb(VENV):,.0f} MB in .venv)")
    return code


def setup_hash() -> str:
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    h.update(torch_spec().encode())
    h.update(sys.version.encode())
    return h.hexdigest()


def read_stamp() -> tuple[str, set[str]]:
    """(the setup hash, the extras installed) of .venv; ("", set()) when there is none."""
    try:
        stamp = json.loads(STAMP.read_text())
        return str(stamp["hash"]), set(stamp["extras"])
    except (OSError, ValueError, KeyError, TypeError):
        return "", set()


def write_stamp(extras: set[str]) -> None:
    STAMP.write_text(json.dumps({"hash": setup_hash(), "extras": sorted(extras)}))


def has_module(py: Path, name: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.call([py, "-c", probe], stderr=subprocess.DEVNULL) == 0


def install_torch(py: Path, pip: list, n: int, total: int) -> None:
    spec, index = torch_spec(), torch_index()
    where = f"from {index}" if index else "from pip's index"
    cpu = index or spec == "torch==2.13.0"
    code = step(
        f"{n}/{total} installing {spec} {where}"
        + (" (CPU build: about 0.7 GB installed)" if cpu else ""),
        [*pip, spec] + (["--index-url", index] if index else []),
    )
    if code != 0 and index:
        say(f"  {index} failed; trying pip's own index")
        code = step(f"{n}/{total} installing {spec}", [*pip, spec])
    if code != 0:
        sys.exit(f"installing {spec} failed; set COURSE_TORCH to a torch you can install")


def bytecode_reason(extras: set[str]) -> str | None:
    """Why set-up compiles every Python file of .venv once (`python -m compileall`), or None.

    pip installs with --no-compile: where Python writes the bytecode of what it imports (the
    student's lab), that is cheaper. Where it cannot, each process compiles every module it
    imports from source, every time: with PYTHONDONTWRITEBYTECODE set (as on the CI machines),
    and in the grader's sandbox, which mounts .venv read-only. There a kernel's start spent two
    thirds of its import time compiling, and grading one notebook took 21 s instead of 14 (docs/
    journal.md, "Bytecode compiled once"). So: with that variable set, or for the grader's
    layers (`course`)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "PYTHONDONTWRITEBYTECODE is set"
    if "course" in extras:
        return "the grader's sandbox mounts it read-only"
    return None


# The installed packages' own test suites (a `tests` or `test` folder under site-packages): no
# process of the course imports them, and they are a quarter of .venv's bytecode (68 of 287 MB
# with the test layer, 2026-12-07), so set-up does not compile them
PACKAGE_TESTS = r"site-packages[\\/](?:.+[\\/])?tests?[\\/]"


def compile_command(py: Path, paths: list[Path]) -> list:
    """compileall over paths, on every core, quietly (it skips what is up to date), but for the
    installed packages' own test suites (PACKAGE_TESTS)."""
    return [py, "-m", "compileall", "-qq", "-j", "0", "-x", PACKAGE_TESTS, *map(str, paths)]


def compile_venv(py: Path, why: str, n: int, total: int) -> None:
    """The compile step of set-up; its mark beside the stamp says it ran for what is installed.
    A file that does not compile (a package's test data) compiles, or fails, on import."""
    lib = VENV / ("Lib" if os.name == "nt" else "lib")
    step(
        f"{n}/{total} compiling .venv's Python files once ({why}: otherwise every process, each "
        "student's kernel included, compiles every module it imports)",
        compile_command(py, [lib, *(ROOT / p for p in REPO_PACKAGES)]),
    )
    STAMP.with_name(".course-compiled").write_text(setup_hash())


# jsonschema's optional checker of the "iri" format: rfc3987-syntax builds 38 Lark parsers when it
# is imported, about 1 s of CPU in every process that imports jsonschema (nbformat, every Jupyter
# server, every nbgrader command). No schema of Jupyter, nbformat or nbgrader uses that format, and
# jsonschema checks it only where the package is installed. jsonschema[format-nongpl], which
# jupyter-events asks for, brings it in; set-up takes it out again.
IRI_CHECKER = ("rfc3987-syntax", "rfc3987_syntax")  # (distribution, import name)


def drop_iri_checker(py: Path) -> None:
    """Uninstall jsonschema's IRI checker from .venv where it is there (IRI_CHECKER). Measured on
    a 2-core machine (2026-12-07), with it and without: JupyterLab answered 2.4-2.7 s and
    1.3-1.4 s after its start, `nbgrader --version` took 2.4 and 1.15 s. Only speed is at stake:
    where .venv cannot be written (another user's), it is left as it is, and said nothing of."""
    sites = VENV.glob("Lib/site-packages" if os.name == "nt" else "lib/python*/site-packages")
    found = [site for site in sites if (site / IRI_CHECKER[1]).is_dir()]
    if not found or not all(os.access(site, os.W_OK) for site in found):
        return
    step(
        f"  uninstalling {IRI_CHECKER[0]}: jsonschema's IRI checker, 1 s of every Jupyter "
        "server's and nbgrader command's start, and no Jupyter schema uses it",
        [py, "-m", "pip", "uninstall", "--yes", "--quiet", IRI_CHECKER[0]],
    )


def installer(py: Path, pip: list) -> list | None:
    """uv's pip interface for .venv (`python -m uv pip install --python PY`), installed into .venv
    by pip the first time (a few seconds); None where uv cannot be had or COURSE_INSTALLER=pip.

    uv installs the course package's layers about five times as fast as pip: the test layer took
    it 11 s against pip's 79 s on a 2-core machine with empty caches (docs/journal.md, "uv for
    the course package"). torch stays with pip (install_torch), which finds the CPU build on a
    machine's disk and honours pip's configuration; uv keeps the installed torch, which meets
    the package's requirement (`torch>=2.4`)."""
    if os.environ.get("COURSE_INSTALLER", "uv") == "pip":
        return None
    if not has_module(py, "uv"):
        say("  installing uv, a faster installer, with pip (COURSE_INSTALLER=pip: pip alone)")
        if stream([*pip, "--quiet", "uv"]) != 0 or not has_module(py, "uv"):
            say("  uv could not be installed: pip installs the course package")
            return None
    return [py, "-m", "uv", "pip", "install", "--python", py]


def install_package(py: Path, pip: list, extras: set[str], count: str) -> None:
    """The course package with `extras` (editable): with uv where it can be had, else with pip;
    pip again where uv fails (an index only pip's configuration names, say)."""
    spec = f".[{','.join(sorted(extras))}]"
    brings = "; ".join(BRINGS[e] for e in BRINGS if e in extras)
    what = f"{count} installing the course package [{','.join(sorted(extras))}]: {brings}"
    say(what)
    uv = installer(py, pip)
    if uv is not None:
        if step(f"  with uv: {spec}", [*uv, "-e", spec]) == 0:
            return
        say("  uv failed (see its message above): trying pip")
    if step(f"  with pip: {spec}", [*pip, "-e", spec]) != 0:
        sys.exit("installing the course package failed (see pip's message above)")


def ensure_env(needs: tuple[str, ...] = NEEDS["test"]) -> Path:
    """The environment's python, with the extras `needs` installed (and those installed before)."""
    if sys.version_info < (3, 10):  # noqa: UP036 (this file may be run by an older python)
        sys.exit("The course needs Python 3.10 or newer; this is " + sys.version.split()[0])
    py = venv_python()
    if PREPARED:
        if not py.exists():
            sys.exit(f"COURSE_VENV={VENV}: expected a virtual environment there (no {py})")
        return py
    old_hash, installed = read_stamp()
    if py.exists() and old_hash == setup_hash() and set(needs) <= installed:
        why = bytecode_reason(installed)
        drop_iri_checker(py)  # a .venv set up before set-up took it out
        if why and not STAMP.with_name(".course-compiled").exists():  # set up before the step
            compile_venv(py, why, 1, 1)
        return py
    extras = set(needs) | installed
    start = time.perf_counter()
    fresh = not py.exists()
    torch = bool(extras & TORCH_EXTRAS) and (fresh or not has_module(py, "torch"))
    why = bytecode_reason(extras)
    total = int(fresh) + int(torch) + 1 + int(why is not None)
    say(
        f"setting up the course environment in {VENV}: {', '.join(sorted(extras))} "
        "(later starts are instant)"
    )
    n = 0
    if fresh:
        n += 1
        say(f"{n}/{total} creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    # --no-compile: Python compiles a module when it is first imported, not every module of every
    # package at install time (a third of the lab's install time on a 2-core machine).
    pip = [py, "-m", "pip", "install", "--progress-bar", "on", "--disable-pip-version-check"]
    pip.append("--no-compile")
    if torch:
        n += 1
        install_torch(py, pip, n, total)
    n += 1
    install_package(py, pip, extras, f"{n}/{total}")
    drop_iri_checker(py)
    if why is not None:
        compile_venv(py, why, n + 1, total)
    write_stamp(extras)
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


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _proc_start(pid: int) -> str | None:
    """The start time of a Linux process (to tell it from a later one with the same pid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process below `pid`, read from /proc (empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        start = _proc_start(child)
        if start is not None:
            found.append((child, start))
        todo += children.get(child, [])
    return found


def _end(procs: list[tuple[int, str]], sig: int) -> list[tuple[int, str]]:
    """Send `sig` to each process still alive as the same process; those still alive."""
    alive = []
    for pid, start in procs:
        if _proc_start(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                alive.append((pid, start))
    return alive


def stop_server(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop JupyterLab (its own process group) and the kernels it started.

    SIGTERM makes jupyter-lab shut its kernels down and exit; jupyter_client starts each kernel
    in a session of its own, so any kernel left after the server is gone is ended here too.
    """
    below = descendants(proc.pid)
    if os.name == "nt":
        proc.terminate()
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        say("JupyterLab did not stop; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = _end(below, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [(pid, start) for pid, start in left if _proc_start(pid) == start]
    _end(left, signal.SIGKILL)


def serve(cmd: list, env: dict) -> int:
    """Run JupyterLab until it exits or course.py gets SIGINT, SIGTERM or SIGHUP; then stop it."""
    say(" ".join(str(c) for c in cmd))
    stops = [signal.SIGINT, signal.SIGTERM] + [getattr(signal, "SIGHUP", signal.SIGTERM)]

    def on_signal(signum, frame):
        raise _Stop(signum)

    previous = {s: signal.signal(s, on_signal) for s in stops}
    proc = None
    try:
        kw = {"start_new_session": True} if os.name != "nt" else {}
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, **kw
        )
        return proc.wait()
    except _Stop as stop:
        for s in stops:
            signal.signal(s, signal.SIG_IGN)  # stopping: a second Ctrl-C does not cut it short
        say(f"{signal.Signals(stop.signum).name}: stopping JupyterLab and its kernels")
        if proc is not None:
            stop_server(proc)
        return 128 + stop.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def cmd_lab(args: list[str]) -> int:
    gpu = "--gpu" in args
    if gpu:
        note_macos()
    py = ensure_env(NEEDS["gpu"] if gpu else NEEDS["lab"])
    cmd, env = lab_command(py, ROOT / "notebooks", student=True)
    return serve([*cmd, *(a for a in args if a != "--gpu")], env)


def note_macos() -> None:
    if platform.system() != "Linux":
        say(
            "Triton has Linux wheels only: here torch is installed without it; open the Triton "
            "notebooks 06, 08-11 on Colab (README.md, The notebooks: the Colab badges)"
        )


def cmd_gpu(args: list[str]) -> int:
    if args:
        sys.exit(f"course.py gpu: takes no arguments, got {' '.join(args)}")
    note_macos()
    ensure_env(NEEDS["gpu"])
    say(
        "torch and Triton are installed: in JupyterLab, restart the notebook's kernel "
        "(Kernel > Restart Kernel), then run its first cell again"
    )
    return 0


def cmd_instructor(args: list[str]) -> int:
    py = ensure_env(NEEDS["instructor"])
    cmd, env = lab_command(py, ROOT, student=False)
    return serve([*cmd, *args], env)


def cmd_test(args: list[str]) -> int:
    py = ensure_env(NEEDS["test"])
    # the repository's own packages, as they are now (set-up compiled them as they were then)
    subprocess.call(compile_command(py, [ROOT / p for p in REPO_PACKAGES]))
    for check in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        if run([py, "-m", *check]) != 0:
            say("lint failed: run `.venv/bin/ruff format .` and `.venv/bin/ruff check --fix .`")
            return 1
    jobs = os.environ.get("COURSE_TEST_JOBS", str(min(4, os.cpu_count() or 1)))
    return run([py, "-m", "pytest", "-n", jobs, "--dist", "loadgroup", *args])


def cmd_setup(args: list[str]) -> int:
    """Set up .venv for a command (default: test) and start nothing: for an image, a machine
    prepared ahead of a class, or CI installing its system packages meanwhile (.ci/run)."""
    if len(args) > 1 or (args and args[0] not in NEEDS):
        sys.exit(f"course.py setup: takes one of {', '.join(NEEDS)} (default: test)")
    needs = NEEDS[args[0] if args else "test"]
    if "gpu" in needs:
        note_macos()
    ensure_env(needs)
    return 0


def cmd_hub(args: list[str]) -> int:
    py = ensure_env(NEEDS["hub"])
    return serve([py, "-m", "hub.launch", *args], dict(os.environ))


COMMANDS = {
    "lab": cmd_lab,
    "gpu": cmd_gpu,
    "instructor": cmd_instructor,
    "test": cmd_test,
    "hub": cmd_hub,
    "setup": cmd_setup,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
