"""A class rehearsed on a real JupyterHub, for tests/hub/test_hub.py and benchmarks/hub_class.py:
system users made for the run (prefixed names, removed at the end, existing users never touched),
hub/launch.py's hub on loopback, the instructor's steps run as the instructor's own user, and the
hub's REST API.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from hub import launch

PASSWORD_BYTES = 12
# the environment's python by its real path: the grader's sandbox hides the repository, so a
# .venv that is a symbolic link inside it (a git worktree's) would not be found there
PYTHON = str(Path(sys.prefix).resolve() / "bin" / "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str | None:
    """Why a hub cannot run here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the hub tests create system users and run the hub as root (CI runs as root)"
    if shutil.which("useradd") is None:
        return "no useradd here"
    if shutil.which("configurable-http-proxy") is None:
        return "no configurable-http-proxy (npm install -g configurable-http-proxy; .ci/run)"
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "jupyterhub is not installed (pyproject's hub extra)"
    return None


class Hub:
    """A running hub with its users; `stop()` ends it and removes what it made."""

    def __init__(self, students: list[str], prefix: str = "fah"):
        tag = secrets.token_hex(2)
        self.prefix = f"{prefix}{tag}"
        self.instructor = f"{self.prefix}-prof"
        self.students = [f"{self.prefix}-{s}" for s in students]
        self.passwords: dict[str, str] = {}
        self.made: list[str] = []
        self.opened: list[tuple[Path, int]] = []
        self.proc = None
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir="/tmp"))
        os.chmod(self.dir, 0o755)

    # --- users -------------------------------------------------------------------------------
    def _make_users(self) -> None:
        for name in [self.instructor, *self.students]:
            if launch.user_exists(name):
                raise RuntimeError(f"user {name} exists already; not touching it")
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
            self.made.append(name)
            self.passwords[name] = secrets.token_urlsafe(PASSWORD_BYTES)
            subprocess.run(
                ["chpasswd"], input=f"{name}:{self.passwords[name]}\n", text=True, check=True
            )

    def _open_path(self) -> None:
        """Let every user enter the folders above the course (o+x), restored by stop()."""
        for p in sorted(
            {p for path in launch.course_paths() for p in launch.reachable_by_all(path)}
        ):
            mode = os.stat(p).st_mode & 0o7777
            self.opened.append((p, mode))
            os.chmod(p, mode | 0o001)

    def start(self) -> Hub:
        self._make_users()
        self._open_path()
        self.port = _free_port()
        self.settings = launch.settings(
            self.students,
            self.instructor,
            state=self.dir / "state",
            exchange=self.dir / "exchange",
            course_id="fa-hub-test",
            port=self.port,
            hub_port=_free_port(),
            proxy_api_port=_free_port(),
        )
        cmd, env = launch.command(launch.prepare(self.settings))
        self.log = open(self.dir / "hub.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=self.settings["state"], stdout=self.log, stderr=self.log
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.token = launch.admin_token(self.settings)
        deadline = time.time() + 90
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                self.api("GET", "/")
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError("the hub did not start:\n" + (self.dir / "hub.log").read_text()[-4000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
        for name in self.made:  # kill what is left of their processes, then remove them
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        time.sleep(0.5)
        for name in self.made:
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)
        for p, mode in self.opened:
            os.chmod(p, mode)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the hub's REST API ------------------------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        req = urllib.request.Request(
            f"{self.base}/hub/api{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token or self.token}"},
        )
        with urllib.request.urlopen(req, timeout=60) as reply:
            text = reply.read().decode()
            return json.loads(text) if text else None

    def user_token(self, name: str) -> str:
        return self.api("POST", f"/users/{name}/tokens", {"note": "course test"})["token"]

    def spawn(self, name: str, timeout: float = 180) -> None:
        """Start `name`'s server through the REST API; wait until it answers."""
        with contextlib.suppress(urllib.error.HTTPError):  # 400: already running
            self.api("POST", f"/users/{name}/server")
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.api("GET", f"/users/{name}").get("servers", {}).get("", {}).get("ready"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{name}'s server did not start:\n" + self.hub_log()[-4000:])

    def hub_log(self) -> str:
        return (self.dir / "hub.log").read_text()

    def server(self, name: str, method: str, path: str, token: str, body=None):
        """A call to `name`'s own Jupyter server (contents, nbgrader's assignment list)."""
        req = urllib.request.Request(
            f"{self.base}/user/{name}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as reply:
            text = reply.read().decode()
            return json.loads(text) if text else None

    # --- the instructor ----------------------------------------------------------------------
    @property
    def course(self) -> Path:
        return Path(self.settings["course_dir"])

    @property
    def exchange_course(self) -> Path:
        return Path(self.settings["exchange"]) / self.settings["course_id"]

    def home(self, name: str) -> Path:
        return Path(pwd.getpwnam(name).pw_dir)

    def as_instructor(self, *args, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = launch.as_user(
            self.instructor,
            list(args),
            cwd=self.course,
            env={"PYTHONPATH": str(launch.REPO)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def nbgrader(self, *args) -> subprocess.CompletedProcess:
        return self.as_instructor(PYTHON, "-m", "nbgrader", *args)

    def release(self, assignment: str) -> None:
        self.nbgrader("generate_assignment", assignment, "--force")
        self.nbgrader("release_assignment", assignment, "--force")

    def roster(self) -> Path:
        path = self.course / "roster.csv"
        path.write_text("student\n" + "".join(f"{s}\n" for s in self.students))
        pw = pwd.getpwnam(self.instructor)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

    def grade(self, *assignments: str, jobs: int = 2, timeout: int = 120) -> Path:
        """collect, `python -m graders grade` (sandbox on), generate and release feedback."""
        for a in assignments:
            self.nbgrader("collect", a, "--update")
        out = self.course / "graded"
        self.as_instructor(
            PYTHON,
            "-m",
            "graders",
            "grade",
            self.course / "submitted",
            "--course-dir",
            self.course,
            "--roster",
            self.roster(),
            "--out",
            out,
            "--jobs",
            jobs,
            "--timeout",
            timeout,
            "--regrade",
            timeout=1200,
        )
        for a in assignments:
            self.nbgrader("generate_feedback", a, "--force")
            self.nbgrader("release_feedback", a)
        return out
