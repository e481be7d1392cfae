"""course.py: the layered first start (the NumPy track, then torch and Triton), torch's CPU build
from PyTorch's index with a fallback, progress lines, signals that stop the lab, and the Triton
notebooks' setup cell that names the one command to run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import nbformat
import pytest
from fixtures import kernels

from graders.authoring import authoring
from graders.run import pipeline

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def course(monkeypatch):
    spec = importlib.util.spec_from_file_location("course_cli", ROOT / "course.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("COURSE_TORCH", raising=False)
    monkeypatch.delenv("COURSE_TORCH_INDEX", raising=False)
    monkeypatch.setattr(mod.platform, "system", lambda: "Linux")
    monkeypatch.setattr(mod.shutil, "which", lambda name: None)  # no nvidia-smi
    return mod


def _answering(status):
    class Reply:
        def __enter__(self):
            return types.SimpleNamespace(status=status)

        def __exit__(self, *exc):
            return False

    return lambda url, timeout: Reply()


def test_cpu_index_is_used_where_it_answers(course, monkeypatch):
    seen = []
    monkeypatch.setattr(
        course.urllib.request,
        "urlopen",
        lambda url, timeout: seen.append(url) or _answering(200)(url, timeout),
    )
    assert course.torch_spec() == "torch==2.13.0"
    assert course.torch_index() == course.CPU_INDEX
    assert seen == [course.CPU_INDEX + "/torch/"]


def test_no_index_when_it_cannot_be_reached(course, monkeypatch):
    def offline(url, timeout):
        raise OSError("network is unreachable")

    monkeypatch.setattr(course.urllib.request, "urlopen", offline)
    assert course.torch_index() is None


def test_no_cpu_index_with_an_nvidia_driver_or_a_chosen_torch(course, monkeypatch):
    monkeypatch.setattr(course.urllib.request, "urlopen", _answering(200))
    monkeypatch.setattr(course.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert course.torch_spec() == "torch" and course.torch_index() is None
    monkeypatch.setattr(course.shutil, "which", lambda name: None)
    monkeypatch.setenv("COURSE_TORCH", "torch==2.5.1")
    assert course.torch_index() is None


class _Recorded(list):
    """The commands a set-up ran, and which stand-in installers fail (`fails`)."""

    fails: set[str]


@pytest.fixture
def fake_setup(course, monkeypatch, tmp_path):
    """course.py with a stand-in venv builder and pip: the commands it would run are recorded.
    Python writes its own bytecode here (PYTHONDONTWRITEBYTECODE unset) unless a test sets it."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    venv_dir = tmp_path / ".venv"
    monkeypatch.setattr(course, "VENV", venv_dir)
    monkeypatch.setattr(course, "STAMP", venv_dir / ".course-setup")
    monkeypatch.setattr(course, "venv_python", lambda: venv_dir / "bin" / "python")

    class Builder:
        def __init__(self, **kw):
            pass

        def create(self, path):
            (Path(path) / "bin").mkdir(parents=True)
            (Path(path) / "bin" / "python").write_bytes(b"x" * 1000)

    monkeypatch.setattr(course.venv, "EnvBuilder", Builder)
    monkeypatch.delenv("COURSE_INSTALLER", raising=False)
    installed = set()  # what the stand-in pip has installed
    monkeypatch.setattr(course, "has_module", lambda py, name: name in installed)
    monkeypatch.setattr(course, "torch_index", lambda: course.CPU_INDEX)
    commands = _Recorded()
    commands.fails = set()  # "uv" or "uv-install": the stand-in uv, or pip's install of uv, fails

    def fake_stream(cmd, heartbeat_s=course.HEARTBEAT_S):
        cmd = [str(c) for c in cmd]
        commands.append(cmd)
        if "--index-url" in cmd:
            return 1  # the CPU index fails, pip's own works
        if cmd[-1] == "uv":
            if "uv-install" in commands.fails:
                return 1
            installed.add("uv")
        if cmd[1:3] == ["-m", "uv"] and "uv" in commands.fails:
            return 2
        if any(c.startswith("torch") for c in cmd):
            installed.add("torch")
        return 0

    monkeypatch.setattr(course, "stream", fake_stream)
    return commands


def _installs_with(cmd: list[str]) -> str:
    """The installer of a recorded command: uv or pip."""
    assert cmd[1] == "-m" and cmd[2] in ("uv", "pip"), cmd
    return cmd[2]


def test_first_start_falls_back_and_says_each_step(course, fake_setup, capsys):
    commands = fake_setup
    course.ensure_env(course.NEEDS["test"])
    out = capsys.readouterr().out
    assert commands[0][-3:] == ["torch==2.13.0", "--index-url", course.CPU_INDEX]
    assert commands[1][-1] == "torch==2.13.0" and "--index-url" not in commands[1]
    assert commands[2][-2:] == ["--quiet", "uv"]  # pip installs uv into .venv, once
    pip = commands[:3]
    assert {_installs_with(c) for c in pip} == {"pip"}
    assert all("--progress-bar" in c and c[c.index("--progress-bar") + 1] == "on" for c in pip)
    # uv installs the course package into .venv's python (whatever environment is active)
    assert _installs_with(commands[3]) == "uv" and commands[3][3:4] == ["pip"]
    assert commands[3][commands[3].index("--python") + 1] == str(course.venv_python())
    assert commands[3][-2:] == ["-e", ".[course,dev,hub]"]
    # the grader's layer: its sandbox mounts .venv read-only, so nothing writes bytecode there
    assert commands[4][1:4] == ["-m", "compileall", "-qq"], commands[4]
    assert str(course.VENV / "lib") in commands[4]
    assert {str(course.ROOT / p) for p in course.REPO_PACKAGES} <= set(commands[4])
    for line in (
        "1/4 creating",
        "2/4 installing torch==2.13.0 from",
        "failed; trying pip's own",
        "3/4 installing the course package [course,dev,hub]",
        "installing uv, a faster installer, with pip",
        "with uv: .[course,dev,hub]",
        "4/4 compiling .venv's Python files once (the grader's sandbox mounts it read-only",
        "done in",
        "environment ready in",
    ):
        assert line in out, out
    assert course.read_stamp() == (course.setup_hash(), {"course", "dev", "hub"})


def test_lab_installs_the_numpy_track_and_gpu_adds_torch_and_triton(course, fake_setup, capsys):
    commands = fake_setup
    course.ensure_env(course.NEEDS["lab"])
    assert len(commands) == 2 and commands[1][-2:] == ["-e", ".[lab]"], commands
    assert commands[0][-1] == "uv" and _installs_with(commands[1]) == "uv"
    assert not any("torch" in c for c in commands[1])
    assert "1/2 creating" in capsys.readouterr().out
    course.ensure_env(course.NEEDS["lab"])  # installed: nothing more
    assert len(commands) == 2
    course.ensure_env(course.NEEDS["gpu"])  # uv is in .venv: not installed again
    assert commands[-1][-2:] == ["-e", ".[gpu,lab]"] and _installs_with(commands[-1]) == "uv"
    assert [c[-1] for c in commands[2:4]] == [course.CPU_INDEX, "torch==2.13.0"]
    assert len(commands) == 5
    out = capsys.readouterr().out
    assert "1/2 installing torch==2.13.0" in out and "2/2 installing the course package" in out
    n = len(commands)
    course.ensure_env(course.NEEDS["lab"])  # a later `lab` keeps what `gpu` added
    assert len(commands) == n
    course.STAMP.write_text(
        json.dumps({"hash": "an older pyproject.toml", "extras": ["gpu", "lab"]})
    )
    course.ensure_env(course.NEEDS["lab"])  # pyproject changed: every installed layer again
    assert commands[-1][-2:] == ["-e", ".[gpu,lab]"] and len(commands) == n + 1


def test_the_lab_is_compiled_once_where_python_writes_no_bytecode(course, fake_setup, capsys,
                                                                  monkeypatch):  # fmt: skip
    """With PYTHONDONTWRITEBYTECODE set (as on CI) no process would ever write a .pyc: set-up
    compiles .venv once, the student's layer too."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    commands = fake_setup
    course.ensure_env(course.NEEDS["lab"])
    assert commands[1][-2:] == ["-e", ".[lab]"] and "compileall" in commands[2], commands
    assert "3/3 compiling .venv's Python files once (PYTHONDONTWRITEBYTECODE is set" in (
        capsys.readouterr().out
    )
    course.ensure_env(course.NEEDS["lab"])  # installed and compiled: nothing more
    assert len(commands) == 3
    course.STAMP.with_name(".course-compiled").unlink()  # a .venv set up before the step
    course.ensure_env(course.NEEDS["lab"])
    assert len(commands) == 4 and "compileall" in commands[3]  # compiled, nothing reinstalled
    assert "1/1 compiling .venv's Python files once" in capsys.readouterr().out
    course.ensure_env(course.NEEDS["lab"])
    assert len(commands) == 4


@pytest.mark.parametrize("how", ["uv fails", "uv cannot be installed", "COURSE_INSTALLER=pip"])
def test_pip_installs_the_course_package_where_uv_does_not(course, fake_setup, capsys,
                                                          monkeypatch, how):  # fmt: skip
    """uv knows nothing of pip's configuration (an index or a folder of wheels only pip.conf
    names): where it fails, or cannot be installed, or is not wanted, pip installs the package,
    and the step says which."""
    commands = fake_setup
    if how == "uv fails":
        commands.fails.add("uv")
    elif how == "uv cannot be installed":
        commands.fails.add("uv-install")
    else:
        monkeypatch.setenv("COURSE_INSTALLER", "pip")
    course.ensure_env(course.NEEDS["lab"])
    out = capsys.readouterr().out
    assert _installs_with(commands[-1]) == "pip" and commands[-1][-2:] == ["-e", ".[lab]"]
    assert "--progress-bar" in commands[-1] and "with pip: .[lab]" in out
    uv_runs = [c for c in commands if _installs_with(c) == "uv"]
    if how == "uv fails":
        assert len(uv_runs) == 1 and "uv failed (see its message above): trying pip" in out
    elif how == "uv cannot be installed":
        assert not uv_runs and commands[0][-1] == "uv"
        assert "uv could not be installed: pip installs the course package" in out
    else:
        assert not uv_runs and not any(c[-1] == "uv" for c in commands), commands
    assert course.read_stamp()[1] == {"lab"}


def test_compileall_writes_bytecode_even_where_imports_may_not(course, tmp_path):
    """The premise of the step above: compileall writes the .pyc files that imports under
    PYTHONDONTWRITEBYTECODE=1 never write, and a later import under that variable reads them."""
    pkg = tmp_path / "pkg_for_bytecode"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    probe = "import pkg_for_bytecode as p; print(p.__cached__, p.VALUE)"
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True)
    assert not (pkg / "__pycache__").exists()  # the import compiled it and wrote nothing
    subprocess.run(course.compile_command(Path(sys.executable), [pkg]), env=env, check=True)
    (pyc,) = (pkg / "__pycache__").glob("__init__.*.pyc")
    verbose = subprocess.run(
        [sys.executable, "-v", "-c", probe], env=env, check=True, capture_output=True, text=True
    )
    assert f"matches {pkg / '__init__.py'}" in verbose.stderr  # the import read that .pyc
    assert verbose.stdout.split()[-1] == "42"


def test_compileall_leaves_the_installed_packages_test_suites(course, tmp_path):
    """Set-up compiles what the course imports and not the packages' own test suites (a quarter
    of .venv's bytecode): a `tests` or `test` folder under site-packages is skipped, at any
    depth, and nothing else is (a `testing` module, a folder whose name ends in test)."""
    site = tmp_path / "lib" / "site-packages"
    sources = {
        "pkg/__init__.py": True,
        "pkg/testing/__init__.py": True,
        "pkg/latest/__init__.py": True,
        "pkg/tests/test_pkg.py": False,
        "pkg/sub/test/__init__.py": False,
        "tests/conftest.py": False,
    }
    for rel in sources:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("X = 1\n")
    subprocess.run(course.compile_command(Path(sys.executable), [tmp_path / "lib"]), check=True)
    for rel, compiled in sources.items():
        path = site / rel
        pyc = list((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
        assert bool(pyc) is compiled, (rel, pyc)


def test_setup_takes_jsonschemas_iri_checker_out(course, fake_setup, capsys, monkeypatch):
    """jsonschema[format-nongpl] brings rfc3987-syntax (1 s of Lark grammars at every import of
    jsonschema): the install step is followed by its uninstall, before the compile step; a later
    start takes it out again where it came back (a student's own pip install), and does nothing
    where it is not there."""
    commands = fake_setup
    site = course.VENV / "lib" / "python3.11" / "site-packages"
    checker = site / course.IRI_CHECKER[1]
    install = course.stream

    def stream(cmd, heartbeat_s=course.HEARTBEAT_S):
        cmd = [str(c) for c in cmd]
        if cmd[-2:] == ["-e", ".[course,dev,hub]"]:
            checker.mkdir(parents=True)  # as jupyter-events' requirement brings it
        if "uninstall" in cmd:
            checker.rmdir()
        return install(cmd, heartbeat_s)

    monkeypatch.setattr(course, "stream", stream)
    course.ensure_env(course.NEEDS["test"])
    names = [" ".join(c[2:4]) for c in commands]
    i = names.index("pip uninstall")
    assert commands[i][-1] == course.IRI_CHECKER[0] and "--yes" in commands[i]
    assert commands[i - 1][-2:] == ["-e", ".[course,dev,hub]"] and "compileall" in commands[i + 1]
    assert not checker.exists()
    assert f"uninstalling {course.IRI_CHECKER[0]}: jsonschema's IRI checker" in (
        capsys.readouterr().out
    )
    n = len(commands)
    course.ensure_env(course.NEEDS["test"])  # set up, nothing to take out: nothing runs
    assert len(commands) == n
    checker.mkdir()
    course.ensure_env(course.NEEDS["test"])
    assert len(commands) == n + 1 and "uninstall" in commands[-1] and not checker.exists()
    checker.mkdir()  # a .venv this user cannot write: left as it is, every start quiet
    can_write = os.access
    monkeypatch.setattr(
        course.os, "access", lambda path, mode: Path(path) != site and can_write(path, mode)
    )
    capsys.readouterr()
    course.ensure_env(course.NEEDS["test"])
    assert len(commands) == n + 1 and checker.exists() and capsys.readouterr().out == ""


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
    reason="the suite runs outside course.py's .venv",
)
def test_jsonschema_in_the_course_environment_builds_no_iri_grammar():
    """What the step above is for: in the .venv that course.py set up, importing nbformat (so
    jsonschema) loads neither rfc3987_syntax nor Lark."""
    probe = (
        "import sys, nbformat\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lark', 'rfc3987_syntax')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_prepared_environment_is_used_as_it_is(course, monkeypatch, tmp_path):
    monkeypatch.setattr(course, "PREPARED", True)
    monkeypatch.setattr(course, "VENV", tmp_path)
    monkeypatch.setattr(course, "venv_python", lambda: tmp_path / "bin" / "python")
    with pytest.raises(SystemExit, match="COURSE_VENV=.*expected a virtual environment"):
        course.ensure_env(course.NEEDS["lab"])
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    monkeypatch.setattr(course, "stream", lambda *a, **k: pytest.fail("installed into it"))
    assert course.ensure_env(course.NEEDS["test"]) == tmp_path / "bin" / "python"


def test_a_quiet_pip_step_still_prints_a_line(course, capsys):
    """pip says nothing while it unpacks a large wheel: the step prints a line of its own."""
    script = (
        "import time; print('Requirement already satisfied: numpy', flush=True); "
        "print('Collecting torch', flush=True); time.sleep(2.5); print('Installing', flush=True)"
    )
    assert course.stream([sys.executable, "-c", script], heartbeat_s=1.0) == 0
    lines = capsys.readouterr().out.splitlines()
    i, j = lines.index("  Collecting torch"), lines.index("  Installing")
    assert any("still working" in line for line in lines[i:j]), lines
    assert not any(line.startswith("  Requirement already") for line in lines)
    assert "already satisfied: 1 requirement" in lines[-1]


def _requirements(extra: str | None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_student_base_is_the_numpy_track_and_gpu_is_torch_and_triton():
    base, lab = _requirements(None), _requirements("lab")
    assert {"numpy", "scipy", "matplotlib", "ipywidgets"} <= base
    # Validate, the one nbgrader part the student's lab keeps (jupyter/student/), is nbgrader's
    server = json.loads((ROOT / "jupyter" / "student" / "jupyter_server_config.json").read_text())
    off = server["ServerApp"]["jpserver_extensions"]
    assert "nbgrader.server_extensions.validate_assignment" not in off
    assert {name.split(".")[0] for name in off} == {"nbgrader"}
    assert {"jupyterlab", "nbgrader"} <= lab
    assert not (base | lab) & {"torch", "triton"}
    assert _requirements("gpu") == {"torch", "triton"}
    assert lab | _requirements("gpu") <= _requirements("course"), "course: the whole course"
    course_py = (ROOT / "course.py").read_text()
    assert '"lab": ("lab",)' in course_py and '"test": ("course", "dev", "hub")' in course_py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_the_lab_and_its_kernels(course, tmp_path, signum):
    """course.py lab, on this environment (COURSE_VENV), with a kernel running: after SIGTERM,
    SIGINT or SIGHUP no process that it started is left."""
    port, token = _free_port(), "course-test-token"
    env = dict(os.environ, COURSE_VENV=sys.prefix, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "data")  # a fresh lab workspace
    proc = subprocess.Popen(
        [sys.executable, ROOT / "course.py", "lab", f"--ServerApp.port={port}"]
        + [f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            try:
                urllib.request.urlopen(f"{base}/status?token={token}", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        request = urllib.request.Request(f"{base}/kernels?token={token}", data=b"{}")
        kernel = json.loads(urllib.request.urlopen(request, timeout=60).read())["id"]
        while True:  # the kernel process exists once the server lists it as started
            procs = course.descendants(proc.pid)
            if len(procs) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(procs) >= 2, f"jupyter-lab and kernel {kernel} not found: {procs}"
        proc.send_signal(signum)
        assert proc.wait(60) == 128 + signum
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"{signal.Signals(signum).name}: stopping JupyterLab" in out, out
    left = [pid for pid, start in procs if course._proc_start(pid) == start]
    assert not left, f"still running after {signal.Signals(signum).name}: {left}\n{out}"


def _top_level_imports(assignment: str) -> set[str]:
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    found = set()
    for cell in nb.cells[1:]:
        if cell.cell_type == "code":
            found |= set(re.findall(r"^(?:import|from) (torch|triton)\b", cell.source, re.M))
    return found


def test_the_triton_notebooks_are_the_ones_whose_setup_cell_checks_torch():
    gpu = {a for a in pipeline.assignments() if _top_level_imports(a)}
    assert gpu == set(authoring.GPU_NEEDS), "graders/authoring/authoring.py GPU_NEEDS"
    for assignment in pipeline.assignments():
        source = authoring.setup_source(assignment)
        assert source.startswith(authoring.SETUP_SOURCE)
        assert (source != authoring.SETUP_SOURCE) == (assignment in gpu)
        assert _top_level_imports(assignment) <= set(authoring.GPU_NEEDS.get(assignment, ()))


@pytest.mark.notebooks
def test_the_setup_cell_names_the_one_command_where_torch_or_triton_is_missing():
    """Run as Jupyter runs it: torch is here, triton is not (sys.modules[name] = None); then a
    system other than Linux; then Colab (its module google.colab is imported by Colab's kernel)."""
    source = authoring.setup_source("06_triton_forward")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import sys\nsys.modules['triton'] = None  # not installed"),
        nbformat.v4.new_code_cell(source),
        nbformat.v4.new_code_cell("import platform\nplatform.system = lambda: 'Darwin'"),
        nbformat.v4.new_code_cell(source),
        nbformat.v4.new_code_cell(
            "import types\nsys.modules['google.colab'] = types.ModuleType('c')"
        ),
        nbformat.v4.new_code_cell(source),
        nbformat.v4.new_code_cell("del sys.modules['triton']"),
        nbformat.v4.new_code_cell(source),
    ]
    kernels.notebook_client(nb, allow_errors=True, timeout=120).execute()
    lines = []
    for cell in nb.cells[1:7:2]:
        (error,) = [o for o in cell.outputs if o.output_type == "error"]
        assert error.ename == "CourseSetupError", cell.outputs
        (line,) = error.traceback  # one line, no traceback
        lines.append(line)
    linux, mac, colab = lines
    assert linux == (
        f"✗ This notebook needs triton: run `{authoring.GPU_COMMAND}` in the course folder, "
        "then Kernel > Restart Kernel."
    )
    assert "Triton has no wheels here: open this notebook on Colab" in mac
    assert "Runtime > Disconnect and delete runtime" in colab
    assert nb.cells[7].outputs == []  # triton back: the cell says nothing


def test_setup_prepares_a_commands_environment_and_starts_nothing(course, fake_setup,
                                                                  monkeypatch):  # fmt: skip
    """`course.py setup lab` installs what `lab` needs (what .ci/run does for `test` while it
    installs the system's packages); a command it does not know is one line."""
    commands = fake_setup
    monkeypatch.setattr(course, "serve", lambda *a, **k: pytest.fail("started something"))
    assert course.main(["setup", "lab"]) == 0
    assert commands[-1][-2:] == ["-e", ".[lab]"] and course.read_stamp()[1] == {"lab"}
    assert course.main(["setup", "lab"]) == 0 and len(commands) == 2  # set up: nothing more
    with pytest.raises(SystemExit, match="takes one of lab, gpu, instructor, test, hub"):
        course.main(["setup", "labs"])
    assert course.main(["setup"]) == 0  # default: what `test` needs, then compiled
    assert commands[-2][-2:] == ["-e", ".[course,dev,hub,lab]"] and "compileall" in commands[-1]
