"""A class on one machine: JupyterHub, the student lab, Formgrader, a private nbgrader exchange.

Each student gets the course's student lab, the instructor Formgrader, and nbgrader's exchange is
set up so that one student cannot read another's work.

    python3 course.py hub --roster roster.csv --instructor NAME [--create-users] [--port 8000]

Run as root (PAM checks system passwords, and each server runs as its own system user):

    authentication  JupyterHub's PAMAuthenticator: the machine's own users and passwords; an
                    institution swaps in its own in hub/jupyterhub_config.py (docs/hub.md)
    servers         JupyterHub's LocalProcessSpawner: one `jupyterhub-singleuser` per user, run as
                    that user, from the course's environment (.venv)
    students        the student lab of course.py (jupyter/student: Validate kept, instructor tools
                    hidden) with nbgrader's Assignments tab turned back on (hub/student)
    instructor      every nbgrader part (Formgrader), in the course directory ~NAME/<course_id>,
                    which `python -m graders grade --course-dir` fills
    exchange        nbgrader's own, made private (prepare_exchange): its root world-writable as
                    nbgrader requires but sticky, so no one renames or deletes another's course
                    (nbgrader's issue #1225); inbound write-only for students; homes 0700

The state (hub database, cookie secret, an admin token, nbgrader's config for every server) goes in
--state (default /srv/flash-course-hub). `settings()` is everything jupyterhub_config.py reads.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from graders import settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
COURSE_ID = settings.load().course_id  # course.toml's [course] id
EXCHANGE = Path("/srv/nbgrader/exchange")
STATE = Path("/srv/flash-course-hub")

# nbgrader's exchange, made private. Root: nbgrader's every step insists on o+rwx here; the sticky
# bit (as /tmp has) keeps a course folder from being renamed or removed by anyone but its owner.
ROOT_MODE = 0o1777
COURSE_MODE = 0o755  # the instructor's: outbound readable by all, nothing else writable
INBOUND_MODE = 0o2733  # students write a submission, cannot list the folder (nbgrader's own mode)
OUTBOUND_MODE = 0o755
FEEDBACK_MODE = 0o711  # fetched by a hash of the student's own submission, never listed
HOME_MODE = 0o700  # a student's fetched and answered notebooks are theirs alone

NBGRADER_CONFIG = """\
# written by hub/launch.py for every server of the hub
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.png"]
"""

INSTRUCTOR_CONFIG = """\
# the instructor's course directory, written by hub/launch.py (edit freely: it is read, never
# rewritten); the course's own layout is nbgrader's default one (source/, release/)
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
c.Exchange.root = {exchange!r}
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "*.png"]
c.Execute.timeout = 120
"""


class HubError(RuntimeError):
    """The hub cannot be set up as asked; the message says what to do."""


def read_students(roster: Path) -> list[str]:
    """The student ids of a roster CSV (graders.exports.read_roster's format)."""
    from graders.exports import read_roster

    return sorted(read_roster(Path(roster)))


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def create_users(names: list[str]) -> list[str]:
    """`useradd -m` each missing name (no password: set one with passwd, or use another
    authenticator); existing users are never touched. The names created."""
    made = []
    for name in names:
        if not user_exists(name):
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
            made.append(name)
    return made


def as_user(name: str, cmd: list, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """Run `cmd` as system user `name` (its HOME, the course's environment first on PATH)."""
    pw = pwd.getpwnam(name)
    env = {
        "HOME": pw.pw_dir,
        "USER": name,
        "LOGNAME": name,
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
    }
    env.update(kw.pop("env", {}))
    return subprocess.run(
        [str(c) for c in cmd],
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        env=env,
        cwd=str(cwd or pw.pw_dir),
        **kw,
    )


def reachable_by_all(path: Path) -> list[Path]:
    """The folders above `path` that other users cannot enter (each needs o+x)."""
    return [p for p in Path(path).resolve().parents if not os.stat(p).st_mode & stat.S_IXOTH]


def course_paths() -> list[Path]:
    """What every user's server reads: the environment, the Python it was made from (a venv
    whose base Python users cannot reach falls back to another one's standard library), the
    course."""
    return [Path(sys.executable), Path(os.__file__), REPO / "course.py"]


def prepare_exchange(exchange: Path, course_id: str, instructor: str) -> Path:
    """nbgrader's exchange for `course_id`, owned by `instructor`, with the private modes above."""
    pw = pwd.getpwnam(instructor)
    exchange.mkdir(parents=True, exist_ok=True)
    os.chown(exchange, 0, 0)
    os.chmod(exchange, ROOT_MODE)
    course = exchange / course_id
    modes = {
        course: COURSE_MODE,
        course / "inbound": INBOUND_MODE,
        course / "outbound": OUTBOUND_MODE,
        course / "feedback": FEEDBACK_MODE,
    }
    for folder, mode in modes.items():
        folder.mkdir(exist_ok=True)
        os.chown(folder, pw.pw_uid, pw.pw_gid)
        os.chmod(folder, mode)
    return course


def prepare_course(course_dir: Path, instructor: str, course_id: str, exchange: Path) -> Path:
    """The instructor's nbgrader course: every solution under source/, nbgrader's layout and
    config (kept when it exists), owned by the instructor."""
    from graders import pipeline

    pw = pwd.getpwnam(instructor)
    course_dir.mkdir(parents=True, exist_ok=True)
    config = course_dir / "nbgrader_config.py"
    if not config.exists():
        config.write_text(
            INSTRUCTOR_CONFIG.format(
                course_id=course_id, root=str(course_dir), exchange=str(exchange)
            )
        )
    for a in pipeline.assignments():
        dest = course_dir / "source" / a / f"{a}.ipynb"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / "solutions" / a / f"{a}.ipynb", dest)
    for dirpath, _, files in os.walk(course_dir):
        os.chown(dirpath, pw.pw_uid, pw.pw_gid)
        for f in files:
            os.chown(os.path.join(dirpath, f), pw.pw_uid, pw.pw_gid)
    return course_dir


def private_homes(names: list[str]) -> None:
    for name in names:
        os.chmod(pwd.getpwnam(name).pw_dir, HOME_MODE)


def settings(
    students: list[str],
    instructor: str,
    state: Path = STATE,
    exchange: Path = EXCHANGE,
    course_id: str = COURSE_ID,
    ip: str = "127.0.0.1",
    port: int = 8000,
    hub_port: int = 8081,
    proxy_api_port: int = 8001,
) -> dict:
    """What hub/jupyterhub_config.py reads (as JSON, from $COURSE_HUB_SETTINGS)."""
    missing = [u for u in [instructor, *students] if not user_exists(u)]
    if missing:
        raise HubError(
            f"no system user {', '.join(missing)}: create them (useradd -m NAME; passwd NAME) "
            "or pass --create-users"
        )
    home = Path(pwd.getpwnam(instructor).pw_dir)
    return {
        "students": sorted(students),
        "instructor": instructor,
        "state": str(state),
        "exchange": str(exchange),
        "course_id": course_id,
        "course_dir": str(home / course_id),
        "ip": ip,
        "port": port,
        "hub_port": hub_port,
        "proxy_api_port": proxy_api_port,
        "python": sys.executable,
        "repo": str(REPO),
    }


def prepare(s: dict) -> Path:
    """Everything on disk the hub needs; the settings file's path. Idempotent."""
    if os.geteuid() != 0:
        raise HubError(
            "the hub runs as root: PAM checks passwords and each server runs as its user"
        )
    blocked = [p for path in course_paths() for p in reachable_by_all(path)]
    if blocked:
        raise HubError(
            "each user's server runs the course's environment, but other users cannot enter "
            f"{', '.join(sorted({str(p) for p in blocked}))}: `chmod o+x` it, or clone the course "
            "where everyone can read it (for example /opt/flash-course)"
        )
    state, exchange = Path(s["state"]), Path(s["exchange"])
    for sub in ("", "etc", "instructor"):
        (state / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(state / sub, 0o755)
    (state / "etc" / "nbgrader_config.py").write_text(
        NBGRADER_CONFIG.format(course_id=s["course_id"], exchange=str(exchange))
    )
    prepare_exchange(exchange, s["course_id"], s["instructor"])
    prepare_course(Path(s["course_dir"]), s["instructor"], s["course_id"], exchange)
    private_homes([s["instructor"], *s["students"]])
    token = state / "admin-token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
    os.chmod(token, 0o600)
    path = state / "settings.json"
    path.write_text(json.dumps(s, indent=2))
    return path


def command(settings_path: Path) -> tuple[list[str], dict]:
    """The jupyterhub command line and its environment."""
    chp = shutil.which("configurable-http-proxy")
    if chp is None:
        raise HubError(
            "configurable-http-proxy not found: apt-get install nodejs npm && "
            "npm install -g configurable-http-proxy"
        )
    bindir = Path(sys.executable).parent
    env = dict(os.environ, COURSE_HUB_SETTINGS=str(settings_path))
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "jupyterhub", "-f", str(HERE / "jupyterhub_config.py")]
    return cmd, env


def admin_token(s: dict) -> str:
    return (Path(s["state"]) / "admin-token").read_text().strip()


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="course.py hub", description=__doc__.splitlines()[0])
    p.add_argument("--roster", required=True, help="the class list CSV (column student)")
    p.add_argument("--instructor", required=True, help="the instructor's system user")
    p.add_argument("--create-users", action="store_true", help="useradd the missing users")
    p.add_argument("--port", type=int, default=8000, help="the hub's port on loopback (8000)")
    p.add_argument("--ip", default="127.0.0.1", help="where the hub listens (127.0.0.1)")
    p.add_argument("--state", default=str(STATE), help=f"the hub's own files ({STATE})")
    p.add_argument("--exchange", default=str(EXCHANGE), help=f"nbgrader's exchange ({EXCHANGE})")
    p.add_argument("--course-id", default=COURSE_ID, help=f"nbgrader's course id ({COURSE_ID})")
    args = p.parse_args(argv)
    try:
        students = read_students(Path(args.roster))
        if args.create_users:
            for name in create_users([args.instructor, *students]):
                print(f"[hub] created user {name} (no password: passwd {name})", flush=True)
        s = settings(
            students,
            args.instructor,
            state=Path(args.state),
            exchange=Path(args.exchange),
            course_id=args.course_id,
            ip=args.ip,
            port=args.port,
        )
        cmd, env = command(prepare(s))
    except (HubError, ValueError, OSError) as exc:
        print(f"course.py hub: {exc}", file=sys.stderr)
        return 2
    print(
        f"[hub] {len(students)} students, instructor {args.instructor}: "
        f"http://{args.ip}:{args.port}/ (Ctrl-C stops it)",
        flush=True,
    )
    return subprocess.call(cmd, env=env, cwd=s["state"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
