"""The students' sandbox, attacked from the inside with real kernels and a real grading run.

Every check runs code in a kernel started by graders.isolation.sandbox.SandboxKernelManager
(directly, or through graders.grade.grade and nbgrader autograde) and asserts that the way out is
closed: solutions/, other submissions, the grading folders, the network, processes outliving the
notebook, scratch files outliving it, memory. The same probes run once without the sandbox
and do get out, so they are real probes. Also: the refusal when no sandbox can be made, the
--unsafe-no-sandbox path, and two honest-student cases of graders.run.execute (a cell that ignores
SIGINT, a graded cell whose code logs to stderr).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
from fixtures import bank

from graders.grade import grade
from graders.isolation import cgroups
from graders.isolation import sandbox as sb
from graders.isolation import scratch as host_scratch
from graders.run import pipeline

ASSIGNMENT = "01_online_softmax"  # the fastest notebook
SOLUTION = pipeline.REPO / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
TIMEOUT = 10  # seconds per cell in the grading runs

needs_sandbox = pytest.mark.skipif(sb.probe() is not None, reason=f"no sandbox: {sb.probe()}")
pytestmark = [pytest.mark.xdist_group("sandbox")]


# ---------------------------------------------------------------- helpers


def _token() -> str:
    """A sleep duration nothing else on the machine uses: finds the processes we started."""
    return f"{random.randint(300, 399)}.{random.randint(10**8, 10**9 - 1)}"


def _procs_with(token: str) -> list[int]:
    """PIDs (as the host sees them) of live processes whose command line holds `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry))
    return found


def _wait_until(cond, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _spawn_code(token: str) -> str:
    """Kernel code that leaves processes behind: a new session, and a double fork + setsid."""
    return textwrap.dedent(
        f"""
        import os, subprocess
        subprocess.Popen(["sleep", "{token}"], start_new_session=True)
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sh", ["sh", "-c", "sleep {token}; sleep {token}"])
            os._exit(0)
        os.waitpid(pid, 0)
        print("spawned")
        """
    )


class Kernel:
    """A sandboxed kernel driven synchronously (jupyter_core's run_sync keeps one event loop)."""

    def __init__(self, cwd: Path | None = None, **settings):
        from jupyter_core.utils import run_sync

        self._run_sync = run_sync
        self.km = sb.SandboxKernelManager(kernel_name="python3", **settings)
        kw = {"cwd": str(cwd)} if cwd is not None else {}
        run_sync(self.km.start_kernel)(**kw)
        self.scratch = self.km.scratch
        self.kc = self.km.client()
        self.kc.start_channels()
        run_sync(self.kc.wait_for_ready)(timeout=60)

    def run(self, code: str, timeout: float = 60) -> dict:
        """stdout, stderr and the error (ename: evalue) of running `code`; RuntimeError as soon as
        the kernel dies (execute_interactive would wait out the whole timeout for its reply)."""
        import queue

        got = {"stdout": "", "stderr": "", "error": None}
        msg_id = self.kc.execute(code)
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self._run_sync(self.kc.get_iopub_msg)(timeout=0.25)
            except queue.Empty:
                if not self._run_sync(self.km.is_alive)():
                    raise RuntimeError("the kernel died") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer in {timeout} s") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            content = msg["content"]
            if msg["msg_type"] == "stream":
                got[content["name"]] += content["text"]
            elif msg["msg_type"] == "error":
                got["error"] = f"{content['ename']}: {content['evalue']}"
            elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
                return got

    def ok(self, code: str) -> str:
        got = self.run(code)
        assert got["error"] is None, got
        return got["stdout"]

    def fails(self, code: str, *errors: str) -> str:
        """Run `code`; it must raise one of `errors` (exception names)."""
        got = self.run(code)
        assert got["error"] is not None, f"this worked inside the sandbox: {code!r} -> {got}"
        assert got["error"].split(":")[0] in errors, got
        return got["error"]

    def stop(self) -> None:
        self.kc.stop_channels()
        self._run_sync(self.km.shutdown_kernel)()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A class on disk as the grader lays it out: two students, an output folder, a gradebook."""
    root = tmp_path_factory.mktemp("world")
    alice = root / "submitted" / "alice" / ASSIGNMENT
    bob = root / "submitted" / "bob" / ASSIGNMENT
    for folder, who in ((alice, "alice"), (bob, "bob")):
        folder.mkdir(parents=True)
        (folder / f"{ASSIGNMENT}.ipynb").write_text(json.dumps({"student": who}))
    (alice / "data.txt").write_text("alice's own data file\n")
    out = root / "graded"
    for sub in ("results/bob", ".work/template/solutions", ".work/bob__x"):
        (out / sub).mkdir(parents=True)
    (out / ".work" / "bob__x" / "gradebook.db").write_bytes(b"SQLite format 3\0")
    return {"root": root, "alice": alice, "bob": bob, "out": out}


@pytest.fixture(scope="module")
def kernel(world):
    if sb.probe() is not None:
        pytest.skip(f"no sandbox: {sb.probe()}")
    os.environ["SANDBOX_TEST_SECRET"] = "hunter2"
    try:
        k = Kernel(cwd=world["alice"], memory_gb=3, hidden=[str(world["out"])])
    finally:
        del os.environ["SANDBOX_TEST_SECRET"]
    yield k
    k.stop()


# ---------------------------------------------------------------- the kernel, directly


@needs_sandbox
def test_solutions_and_the_repository_are_out_of_sight(kernel):
    kernel.fails(f"open({str(SOLUTION)!r}).read()", "FileNotFoundError")
    kernel.fails(
        f"import os; os.listdir({str(pipeline.REPO / 'solutions')!r})", "FileNotFoundError"
    )
    shown = kernel.ok(f"import os; print(sorted(os.listdir({str(pipeline.REPO)!r})))")
    assert "solutions" not in shown and "graders" not in shown and "tests" not in shown, shown
    # what is there works: the course package imports, from its real path
    where = kernel.ok("import course_utils; print(course_utils.__file__)")
    assert where.strip() == str(pipeline.REPO / "course_utils" / "__init__.py")


@needs_sandbox
def test_other_submissions_are_out_of_sight(kernel, world):
    bob = world["bob"]
    kernel.fails(f"import os; os.listdir({str(bob)!r})", "FileNotFoundError")
    kernel.fails(f"open({str(bob / f'{ASSIGNMENT}.ipynb')!r}).read()", "FileNotFoundError")
    kernel.fails(
        f"import os; os.listdir({str(world['root'] / 'submitted')!r})", "FileNotFoundError"
    )
    # its own folder is a private copy, without notebooks: only the student's other files
    here = kernel.ok("import os; print(os.getcwd(), sorted(os.listdir('.')))")
    assert here.strip() == f"{sb.HOME}/{ASSIGNMENT} ['data.txt']", here
    kernel.fails(f"open({str(world['alice'] / 'data.txt')!r}, 'a')", "FileNotFoundError")


@needs_sandbox
@pytest.mark.parametrize(
    "target",
    [
        "out/results/bob/x.json",
        "out/.work/template/solutions/x.ipynb",
        "out/.work/bob__x/gradebook.db",
        "out/grades.csv",
        "repo/course_utils/x.py",
        "repo/course_utils/__init__.py",
        "repo/solutions/x.ipynb",
        "repo/.venv/x.pth",
        "prefix/lib/x.py",
        "/usr/x",
        "/etc/passwd",
    ],
)
def test_nothing_outside_the_scratch_can_be_written(kernel, world, target):
    """Each folder here exists on the host; inside it is missing or read-only."""
    base = {"out": world["out"], "repo": pipeline.REPO, "prefix": Path(sys.base_prefix)}
    head, _, rest = target.partition("/")
    path = base[head] / rest if head in base else Path(target)
    before = path.read_bytes() if path.exists() else None
    assert path.parent.is_dir()
    kernel.fails(
        f"open({str(path)!r}, 'a').write('x')", "FileNotFoundError", "OSError", "PermissionError"
    )
    assert (path.read_bytes() if path.exists() else None) == before


@needs_sandbox
def test_the_scratch_is_writable_and_private(kernel):
    out = kernel.ok(
        "import os, tempfile\n"
        "for d in (os.path.expanduser('~'), '.', tempfile.gettempdir(), '/dev/shm'):\n"
        "    open(os.path.join(d, 'scratch.txt'), 'w').write('x')\n"
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]); plt.savefig('fig.png'); print(matplotlib.get_configdir())"
    )
    assert out.strip().startswith(sb.HOME), out


@needs_sandbox
def test_no_network_not_even_the_hosts_loopback(kernel):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        kernel.fails(
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)",
            "ConnectionRefusedError",
            "TimeoutError",
            "OSError",
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody came through
    finally:
        listener.close()
    kernel.fails("import socket; socket.getaddrinfo('pypi.org', 443)", "gaierror")
    devices = kernel.ok(
        "print(sorted(l.split(':')[0].strip() for l in list(open('/proc/net/dev'))[2:]))"
    )
    assert devices.strip() == "['lo']", devices


@needs_sandbox
def test_no_host_secrets_privileges_or_environment(kernel):
    kernel.fails("open('/etc/shadow').read()", "FileNotFoundError")
    kernel.fails("import os; os.listdir('/root/.ssh')", "FileNotFoundError")
    caps = kernel.ok(
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])"
    )
    assert int(caps, 16) == 0
    env = kernel.ok("import os, json; print(json.dumps(dict(os.environ)))")
    assert "SANDBOX_TEST_SECRET" not in env  # set in this process before the kernel started
    assert "PYTHONPATH" not in json.loads(env)
    # no way to build a fresh namespace to undo the read-only mounts
    got = kernel.ok(
        "import subprocess; print(subprocess.run(['unshare', '-r', 'true']).returncode)"
    )
    assert got.strip() != "0"


@needs_sandbox
def test_memory_cap_holds_inside(kernel):
    kernel.fails("hog = bytearray(10 * 2**30)", "MemoryError")
    assert kernel.ok("print(len(bytearray(2**20)))").strip() == str(2**20)  # and it lives on


@needs_sandbox
def test_processes_and_scratch_end_with_the_notebook(tmp_path):
    token = _token()
    k = Kernel(cwd=tmp_path)
    try:
        assert k.ok(_spawn_code(token)).strip() == "spawned"
        k.ok("open('/tmp/left.txt', 'w').write('x'); open('mine.txt', 'w').write('x')")
        # they run (the second after its exec), outside the kernel's own session
        assert _wait_until(lambda: len(_procs_with(token)) >= 2, 10), _procs_with(token)
        scratch = k.scratch
        assert scratch is not None and scratch.is_dir()
    finally:
        k.stop()
    assert _wait_until(lambda: not _procs_with(token), 10), _procs_with(token)
    assert not scratch.exists()
    again = Kernel(cwd=tmp_path)
    try:
        gone = again.ok("import os; print(os.path.exists('/tmp/left.txt'), os.listdir('.'))")
        assert gone.strip() == "False []", gone
    finally:
        again.stop()


def _long_folder(tmp_path: Path) -> Path:
    """A folder whose path leaves no room for the kernel's sockets (a cluster job's TMPDIR)."""
    folder = tmp_path / ("job-" + "7" * 60) / "tmp"
    folder.mkdir(parents=True)
    assert len(str(folder)) > host_scratch.SOCKET_PATH_MAX - sb.SCRATCH_TAIL
    return folder


@needs_sandbox
def test_a_temp_folder_too_long_for_the_sockets_still_runs_the_kernel(tmp_path, monkeypatch):
    """The kernel talks over Unix sockets in its scratch (107 bytes of path at most): with a long
    TMPDIR the scratch goes to a short temp folder and the kernel runs."""
    monkeypatch.setattr(tempfile, "tempdir", str(_long_folder(tmp_path)))
    k = Kernel(cwd=tmp_path)
    try:
        assert k.ok("print(6 * 7)").strip() == "42"
        assert len(str(k.scratch / "conn" / "kernel-99")) <= host_scratch.SOCKET_PATH_MAX
    finally:
        k.stop()


def test_a_scratch_dir_too_long_for_the_sockets_is_refused_by_name(tmp_path):
    folder = _long_folder(tmp_path)
    with pytest.raises(ValueError, match=r"scratch_dir .* bytes long; .* at most \d+"):
        sb.scratch_parent(str(folder))
    assert sb.scratch_parent(str(tmp_path.parent)) == tmp_path.parent.resolve()  # short: kept


FORK_BOMB = """
import os, time
n, err = 0, None
try:
    for _ in range(5000):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as exc:
    err = exc.errno
for _ in range(n):
    os.wait()
print(n, err)
"""

needs_groups = pytest.mark.skipif(
    cgroups.probe() is not None, reason=f"no control groups: {cgroups.probe()}"
)


@needs_sandbox
def test_a_fork_bomb_stops_at_the_process_cap():
    """RLIMIT_NPROC (a grader that is not root) or the pids group (root) holds it: fork fails
    with EAGAIN near the cap, the host keeps its PIDs, and the kernel still answers."""
    k = Kernel(pids_max=64)
    try:
        forked, errno = k.ok(FORK_BOMB).split()
        assert errno == "11" and 30 <= int(forked) < 64, (forked, errno)  # EAGAIN
        assert k.ok("print(6 * 7)").strip() == "42"
        group = k.km.group
        folders = list(group.folders) if group is not None else []
        if group is not None:
            assert len(group.pids()) <= 64
    finally:
        k.stop()
    assert not any(f.exists() for f in folders)  # every process ended, the group is gone


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_the_launcher_caps_the_processes_of_a_grader_that_is_not_root():
    """Root ignores RLIMIT_NPROC (the group caps it); any other user is held to it. The
    launcher's own limit, run as `nobody` the way a grader that is not root runs it."""
    top = Path(tempfile.mkdtemp(prefix="nproc-"))  # pytest's tmp_path is root's alone
    try:
        top.chmod(0o755)
        (top / "home").mkdir()
        (top / "home").chmod(0o777)
        (top / "bomb.py").write_text(FORK_BOMB)
        (top / "bomb.py").chmod(0o644)
        got = _run_as_nobody(top / "home" / "w", top / "bomb.py")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert got.returncode == 0, got.stderr
    forked, errno = got.stdout.split()
    assert errno == "11" and int(forked) < 24, got.stdout


def _run_as_nobody(workdir: Path, script: Path) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-I", "-S", "-c", sb.LAUNCHER, "0", "24", "/nonexistent"]
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *launcher]
    return subprocess.run(
        [*cmd, str(workdir), sys.executable, "-I", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_sandbox
@needs_groups
def test_the_group_holds_every_process_and_is_removed(tmp_path):
    token = _token()
    k = Kernel(cwd=tmp_path)
    try:
        assert k.ok(_spawn_code(token)).strip() == "spawned"
        assert _wait_until(lambda: len(_procs_with(token)) >= 2, 10), _procs_with(token)
        group = k.km.group
        folders = list(group.folders)
        assert set(_procs_with(token)) <= group.pids()  # even the setsid grandchildren
        # nothing inside can see the group or leave it: no /sys, its own cgroup namespace
        assert k.ok("import os; print(os.path.exists('/sys/fs/cgroup'))").strip() == "False"
        k.fails(
            f"open({str(folders[0] / 'cgroup.procs')!r}, 'w').write('1')",
            "FileNotFoundError",
            "PermissionError",
            "OSError",
        )
    finally:
        k.stop()
    assert all(not f.exists() for f in folders)
    assert not _procs_with(token)


@needs_sandbox
@needs_groups
def test_files_in_tmpfs_count_against_the_memory_cap(tmp_path):
    """A tmpfs file is memory outside any address space: the group's memory cap covers it. The
    kernel that fills /tmp past the cap is stopped (the group's OOM killer), the host is not;
    without the group (pids_max=0) the same cell writes it all, so the probe is real."""
    fill = (
        "block = b'x' * 2**24\n"
        "with open('/tmp/fill', 'wb') as f:\n"
        "    for i in range(96):\n"
        "        f.write(block)\n"
        "print('wrote 1.5 GiB')"
    )
    said = {}
    for pids_max in (0, 1024):
        k = Kernel(cwd=tmp_path, memory_gb=1.0, tmpfs_mb=2048, pids_max=pids_max)
        try:
            said[pids_max] = k.run(fill, timeout=20)["stdout"]
        except Exception as exc:  # the kernel died
            said[pids_max] = f"kernel died: {type(exc).__name__}"
        finally:
            k.stop()
    assert said[0].strip() == "wrote 1.5 GiB", said
    assert "wrote" not in said[1024], said


@needs_sandbox
def test_a_hidden_folder_inside_a_visible_one_stays_hidden():
    """A grading folder under a bound one (an odd setup: the output under the Python prefix) is
    covered by an empty tmpfs, what else is bound keeps working."""
    import _pytest  # a folder the kernel does not need

    candidates = [Path(sys.base_prefix) / "include", Path(_pytest.__file__).parent]
    inner = next(p.resolve() for p in candidates if p.is_dir())
    assert os.listdir(inner)
    k = Kernel(hidden=[str(inner)])
    try:
        assert k.ok(f"import os; print(os.listdir({str(inner)!r}))").strip() == "[]"
        assert k.ok("import numpy, course_utils; print('ok')").strip() == "ok"
    finally:
        k.stop()


@needs_sandbox
def test_a_dead_grader_takes_the_whole_sandbox_with_it(tmp_path):
    """The worker's wall clock kills the worker: nothing it started may survive it."""
    token = _token()
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        from test_sandbox import Kernel, _spawn_code
        k = Kernel()
        print(k.scratch, flush=True)
        print(k.ok(_spawn_code({token!r})), flush=True)
        time.sleep(600)
        """
    )
    # a temp folder of its own: a sandbox made meanwhile by the suite's other worker sweeps the
    # shared one, and once removed this scratch before the test looked (CI-like run, 2026-12-07)
    # (in /tmp, not tmp_path: the sandbox's sockets need a short folder)
    private = Path(tempfile.mkdtemp(prefix="fa-t-", dir="/tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=pipeline.REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(private)},
    )
    try:
        scratch = Path(proc.stdout.readline().strip())
        assert proc.stdout.readline().strip() == "spawned"
        assert _wait_until(lambda: len(_procs_with(token)) >= 2, 10)
        proc.kill()
        proc.wait()
        assert _wait_until(lambda: not _procs_with(token), 10), _procs_with(token)
        # a killed grader cannot clean up: the next sandbox removes what it left on the host
        assert scratch.parent == private and scratch.is_dir()
        assert scratch in host_scratch.sweep(sb.SCRATCH_PREFIX, scratch.parent)
        assert not scratch.exists()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(private, ignore_errors=True)


# ---------------------------------------------------------------- refusing without a sandbox


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """PATH without bwrap (and a fresh probe)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    sb.probe.cache_clear()
    yield tmp_path
    sb.probe.cache_clear()


def test_probe_reports_a_missing_bwrap(no_bwrap):
    reason = sb.probe()
    assert reason is not None and "not installed" in reason
    with pytest.raises(sb.SandboxUnavailable) as exc:
        sb.require()
    msg = str(exc.value)
    assert "apt-get install bubblewrap" in msg and "--unsafe-no-sandbox" in msg
    assert "user namespaces" in msg and "\n" not in msg  # one paragraph


def test_probe_reports_refused_user_namespaces(no_bwrap):
    fake = no_bwrap / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace, likely because the "
        "kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    reason = sb.probe()
    assert reason is not None and "non-privileged user namespaces" in reason


def test_grade_refuses_without_a_sandbox(no_bwrap, tmp_path, capsys):
    from graders.__main__ import main

    folder = tmp_path / "class"
    (folder / "submitted" / "s" / ASSIGNMENT).mkdir(parents=True)
    with pytest.raises(sb.SandboxUnavailable):
        grade(folder / "submitted", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before doing anything
    with pytest.raises(SystemExit) as exc:
        main(["grade", str(folder / "submitted"), "--out", str(tmp_path / "out2")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "apt-get install bubblewrap" in err and "--unsafe-no-sandbox" in err
    assert not (tmp_path / "out2").exists()


# ---------------------------------------------------------------- through nbgrader autograde


def _answer(nb, grade_id: str, source: str):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source
            return nb
    raise KeyError(grade_id)


def _source(nb, grade_id: str) -> str:
    return next(
        c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
    )


def _points_from(answer: str) -> float:
    """Points of the graded cells at or after the answer cell `answer` (those it costs)."""
    nb = nbformat.read(SOLUTION, 4)
    metas = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    start = next(i for i, m in enumerate(metas) if m.get("grade_id") == answer)
    return sum(float(m["points"]) for m in metas[start:] if m.get("grade"))


PROBES = [
    "read-solutions",
    "list-submissions",
    "read-other-student",
    "write-out",
    "write-results",
    "write-template",
    "write-gradebook",
    "tcp-loopback",
    "memory-10GB",
]


def _prepare_out(out: Path) -> Path:
    """An output folder as a second grading run finds it: another student's results in it."""
    (out / "results" / "bob").mkdir(parents=True)
    (out / "results" / "bob" / f"{ASSIGNMENT}.json").write_text("{}")
    return out


def _escape_code(world: dict, out: Path, port: int, token: str) -> str:
    """Answer-cell code that tries every way out (grading into `out`), then raises if any worked."""
    paths = {
        "SOLUTION": SOLUTION,
        "SUBMITTED": world["root"] / "submitted",
        "OTHER": world["bob"] / f"{ASSIGNMENT}.ipynb",
        "OUT": out / "pwned.txt",
        "RESULTS": out / "results" / "bob" / f"{ASSIGNMENT}.json",
        "TEMPLATE": out / ".work" / "template" / "pwned",
        "GRADEBOOK": out / ".work" / f"escape__{ASSIGNMENT}" / "gradebook.db",
    }
    consts = "".join(f"{name} = {str(path)!r}\n" for name, path in paths.items())
    return consts + textwrap.dedent(
        f"""
        import os, socket, subprocess
        escaped = []

        def probe(name, attempt):
            try:
                attempt()
            except Exception as exc:
                print(f"DENIED {{name}}: {{type(exc).__name__}}")
            else:
                escaped.append(name)
                print(f"ESCAPED {{name}}")

        def write(path):  # its folder exists on the host while this notebook is graded
            with open(path, "a") as fh:
                fh.write("x")

        probe("read-solutions", lambda: open(SOLUTION).read())
        probe("list-submissions", lambda: os.listdir(SUBMITTED))
        probe("read-other-student", lambda: open(OTHER).read())
        probe("write-out", lambda: write(OUT))
        probe("write-results", lambda: write(RESULTS))
        probe("write-template", lambda: write(TEMPLATE))
        probe("write-gradebook", lambda: write(GRADEBOOK))
        probe("tcp-loopback", lambda: socket.create_connection(("127.0.0.1", {port}), 3).close())
        probe("memory-10GB", lambda: bytearray(10 * 2**30))
        subprocess.Popen(
            ["sleep", "{token}"], start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        open(os.path.expanduser("~/scratch-{token}.txt"), "w").write("x")
        if escaped:
            raise RuntimeError(f"escaped: {{escaped}}")
        """
    )


def _class(world: dict, out: Path, port: int, token: str) -> tuple[Path, dict[str, float]]:
    """Submissions graded by the real pipeline, and the score each must get."""
    solved = pipeline.solved_notebook(ASSIGNMENT)
    exs = [e for e in bank.exercises(ASSIGNMENT) if e.function]
    first, second = exs[0], exs[1]
    total = sum(bank.points(ASSIGNMENT).values())
    subs, want = {}, {}

    escape = copy.deepcopy(solved)
    code = _escape_code(world, out, port, token)
    _answer(escape, first.answer, code + _source(solved, first.answer))
    subs["escape"], want["escape"] = escape, total

    # (a) a cell that ignores SIGINT: the interrupt at the time limit cannot stop it
    stuck = copy.deepcopy(solved)
    _answer(
        stuck,
        second.answer,
        "import signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n",
    )
    subs["ignores-sigint"], want["ignores-sigint"] = stuck, total - _points_from(second.answer)

    # (b) the student's function logs on stderr each time the test cells call it
    noisy = copy.deepcopy(solved)
    chatter = (
        "    import logging, sys, warnings\n"
        "    logging.getLogger('student').warning('called with block=%s', block)\n"
        "    warnings.warn('a note from the student code', stacklevel=2)\n"
        "    print('debug: on stderr', file=sys.stderr)\n"
    )
    for ex in (first, second):
        src = _source(solved, ex.answer)
        head, body = re.split(r"(?<=\):\n)", src, maxsplit=1)  # after the def line
        _answer(
            noisy, ex.answer, "import logging\n\nlogging.basicConfig()\n\n" + head + chatter + body
        )
    subs["logs-to-stderr"], want["logs-to-stderr"] = noisy, total

    folder = world["root"] / "class"
    for student, nb in subs.items():
        pipeline.submit(folder / "submitted", student, ASSIGNMENT, nb)
    return folder, want


@pytest.fixture(scope="module")
def graded(world):
    if sb.probe() is not None:
        pytest.skip(f"no sandbox: {sb.probe()}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    token = _token()
    out = _prepare_out(world["root"] / "graded-run")
    folder, want = _class(world, out, listener.getsockname()[1], token)
    start = time.monotonic()
    outcome = grade(
        folder / "submitted", out, jobs=2, timeout=TIMEOUT, progress=False, sandbox=True
    )
    seconds = time.monotonic() - start
    try:
        listener.accept()
        came_in = True
    except BlockingIOError:
        came_in = False
    finally:
        listener.close()
    leftovers = _procs_with(token)
    results = {r["student"]: r for r in outcome.results}
    return {
        "results": results,
        "want": want,
        "out": outcome.out,
        "came_in": came_in,
        "leftovers": leftovers,
        "token": token,
        "seconds": seconds,
    }


def _feedback(graded, student) -> str:
    res = graded["results"][student]
    return (graded["out"] / res["feedback"]).read_text()


@needs_sandbox
def test_graded_notebook_cannot_get_out(graded):
    res = graded["results"]["escape"]
    html = _feedback(graded, "escape")
    for name in PROBES:
        assert f"DENIED {name}" in html, name
        assert f"ESCAPED {name}" not in html, name
    assert res["status"] == "graded" and res["score"] == graded["want"]["escape"], res
    assert not graded["came_in"], "a kernel reached the host's loopback"
    out = graded["out"]
    for path in ("pwned.txt", ".work/template/pwned"):
        assert not (out / path).exists(), path
    assert (out / "results" / "bob" / f"{ASSIGNMENT}.json").read_text() == "{}"
    assert not graded["leftovers"], "a process outlived its notebook"
    token = graded["token"]
    assert not list(Path("/tmp").glob(f"fa-sandbox-*/**/scratch-{token}.txt"))


@needs_sandbox
def test_cell_ignoring_sigint_costs_only_what_comes_after(graded):
    res = graded["results"]["ignores-sigint"]
    assert res["status"] == "graded", res
    assert res["score"] == pytest.approx(graded["want"]["ignores-sigint"]), res
    assert res["score"] > 0  # the exercise before it kept its points
    assert any("ignored the interrupt" in p for p in res["problems"]), res["problems"]
    assert f"took longer than {TIMEOUT} s" in _feedback(graded, "ignores-sigint")


@needs_sandbox
def test_student_code_logging_to_stderr_costs_nothing(graded):
    res = graded["results"]["logs-to-stderr"]
    assert res["status"] == "graded", res
    assert res["score"] == pytest.approx(graded["want"]["logs-to-stderr"]), res
    html = _feedback(graded, "logs-to-stderr")
    assert "[stderr] " in html and "called with block" in html  # still shown to the student


def test_unsafe_no_sandbox_warns_once_and_runs_as_before(world, tmp_path, capsys):
    """The same escape probes, without the sandbox, do get out: they are real probes."""
    from graders.__main__ import main

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    token = _token()
    port = listener.getsockname()[1]
    decoy = _prepare_out(tmp_path / "decoy")  # as the sandboxed run's folders are while grading
    (decoy / ".work" / "template").mkdir(parents=True)
    (decoy / ".work" / f"escape__{ASSIGNMENT}").mkdir()
    (decoy / ".work" / f"escape__{ASSIGNMENT}" / "gradebook.db").write_bytes(b"")
    solved = pipeline.solved_notebook(ASSIGNMENT)
    first = next(e for e in bank.exercises(ASSIGNMENT) if e.function)
    escape = _answer(
        copy.deepcopy(solved),
        first.answer,
        _escape_code(world, decoy, port, token) + _source(solved, first.answer),
    )
    folder = tmp_path / "class"
    pipeline.submit(folder / "submitted", "unsafe", ASSIGNMENT, escape)
    out = tmp_path / "graded"
    try:
        code = main(
            [
                "grade",
                str(folder / "submitted"),
                "--out",
                str(out),
                "--jobs",
                "1",
                "--timeout",
                str(TIMEOUT),
                "--unsafe-no-sandbox",
            ]
        )
    finally:
        listener.close()
        for pid in _procs_with(token):  # what the unsandboxed notebook left running
            os.kill(pid, signal.SIGKILL)
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("grading WITHOUT a sandbox") == 1
    res = json.loads((out / "results" / "unsafe" / f"{ASSIGNMENT}.json").read_text())
    html = (out / res["feedback"]).read_text()
    for name in ("read-solutions", "list-submissions", "write-results", "write-gradebook"):
        assert f"ESCAPED {name}" in html, name
    assert "ESCAPED tcp-loopback" in html
    assert res["status"] == "graded", res["problems"]
    assert res["score"] < sum(bank.points(ASSIGNMENT).values())  # the probe raised
