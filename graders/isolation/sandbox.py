"""A bubblewrap sandbox for the students' code: each notebook's kernel runs isolated.

Only the kernel runs inside; nbgrader (which writes the gradebook) and the worker stay outside.
`SandboxKernelManager` is a jupyter_client kernel manager that starts the kernel as

    bwrap --unshare-user --unshare-ipc --unshare-pid --unshare-net --unshare-uts
          --unshare-cgroup-try --disable-userns --die-with-parent --new-session --cap-drop ALL
          --hostname sandbox
          --ro-bind /usr, --symlink or --ro-bind /bin /sbin /lib*, --ro-bind-try a short list
              of /etc (ld.so.cache, passwd, fonts, ssl/certs, ...; no shadow, ssh, ssl/private)
          --proc /proc --dev /dev --size N --tmpfs /dev/shm, /tmp, /home/student
          --ro-bind the Python prefixes (sys.base_prefix, sys.prefix) and <repo>/course_utils
              at their real paths (the repository root and solutions/ are not there)
          --bind <scratch>/conn <scratch>/conn   (connection file and unix sockets)
          --ro-bind <scratch>/seed /run/seed     (a copy of the notebook's folder, no notebooks,
                                                  and of the grader's matplotlib font list)
          --remount-ro /   --clearenv --setenv HOME /home/student ...   --chdir /home/student
    -- python -I -S -c LAUNCHER <memory cap> /run/seed /home/student/<folder> <kernel argv>

so inside, the kernel sees no network (a new network namespace: not even the host's loopback),
nothing of the repository but course_utils/ (no solutions/), no other submission, no results,
gradebook, grading template or output folder, no environment variable of the grader but a
short allow-list, and it can write only to size-capped tmpfs that vanish with it. The kernel
talks to nbgrader over unix sockets (jupyter_client's "ipc" transport) in a folder bound into
the sandbox at its own path; it is interrupted by message (a signal to bwrap would not reach
it). Every process it starts lives in the sandbox's PID namespace: when the kernel ends, or the
grader that started it dies (--die-with-parent), the host's kernel kills them all, not a
best-effort kill. The launcher caps the address space (RLIMIT_AS) and the number of processes
(RLIMIT_NPROC: every user but root is held to it), copies the notebook's own folder into the
home, and execs the kernel. Where control groups can be made (root, or a delegated subtree), the
whole sandbox also runs in a group of its own (graders/isolation/cgroups.py) that caps its processes
all together, root's included, and its memory with its tmpfs files; the group is removed with the
kernel.

`probe()` runs a trivial sandbox once to find out whether one can be made here; `require()`
raises SandboxUnavailable with what to install when not.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Integer, List, Unicode

from graders.authoring.course import REPO
from graders.isolation import cgroups
from graders.isolation import scratch as host_scratch

HOME = "/home/student"
SEED = "/run/seed"  # the copy of the notebook's folder, read-only; copied into HOME at start

# Namespaces and process rules of every sandbox (the probe uses the same ones).
NAMESPACE_FLAGS = [
    "--unshare-user",
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--hostname",
    "sandbox",
]

# The few files of /etc a Python kernel needs; everything else there (shadow, ssh, ssl/private,
# sudoers, ...) stays out of sight.
ETC_ALLOWED = [
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "gai.conf",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "debian_version",
    "alternatives",
    "fonts",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "protocols",
    "services",
    "matplotlibrc",
    "python3*",
]

# Environment variables that pass from the grader to the kernel (nothing else does: no tokens,
# no PYTHONPATH, no JPY_PARENT_PID, whose host PID means nothing in the sandbox).
ENV_PASSED = [
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TRITON_INTERPRET",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "PYTHONHASHSEED",
    "MPLBACKEND",
    "PYDEVD_DISABLE_FILE_VALIDATION",
    "JPY_SESSION_NAME",
]

# Runs first inside the sandbox (python -I -S: stdlib only, fast): memory cap, home, exec.
# RLIMIT_NPROC counts the tasks of one user in this user namespace: every user but root is held
# to it (root is exempt; graders.isolation.cgroups caps root's sandboxes instead).
LAUNCHER = """\
import os, resource, shutil, sys
cap, nproc, src, dst = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
for limit, value in ((resource.RLIMIT_AS, cap), (resource.RLIMIT_NPROC, nproc)):
    hard = resource.getrlimit(limit)[1]
    if value > 0:
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if os.path.isdir(src + "/home"):
    shutil.copytree(src + "/home", os.environ["HOME"], dirs_exist_ok=True)
if os.path.isdir(src + "/work"):
    shutil.copytree(src + "/work", dst, dirs_exist_ok=True)
os.makedirs(dst, exist_ok=True)
os.chdir(dst)
os.execv(sys.argv[5], sys.argv[5:])
"""


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine (bwrap missing, or user namespaces refused)."""


def unavailable_message(reason: str) -> str:
    return (
        "Cannot grade: the grader runs each student's notebook in a bubblewrap sandbox (no "
        "network, no view of solutions/ or of other students' work), and no sandbox can be made "
        f"on this machine ({reason}). Install bubblewrap (Debian/Ubuntu: `sudo apt-get install "
        "bubblewrap`; Fedora: `sudo dnf install bubblewrap`) and make sure unprivileged user "
        "namespaces are enabled (`sudo sysctl -w kernel.unprivileged_userns_clone=1`; on Ubuntu "
        "24.04+ also `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or run as "
        "root; in Docker, start the container with `--security-opt seccomp=unconfined "
        "--security-opt apparmor=unconfined` or `--privileged`). To grade anyway, with the "
        "students' code running as your user with your files and network, pass "
        "--unsafe-no-sandbox."
    )


UNSAFE_WARNING = (
    "warning: grading WITHOUT a sandbox (--unsafe-no-sandbox): the students' code runs as your "
    "user, with your files (solutions/ included), your network and no limit beyond the memory "
    "cap and the time limits."
)


def warn_unsafe() -> None:
    """Say once, on stderr, that this run grades without a sandbox."""
    print(UNSAFE_WARNING, file=sys.stderr, flush=True)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _system_binds() -> list[str]:
    """Read-only /usr, /bin, /sbin, /lib* (as the host has them: folders or symlinks), /etc."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for pattern in ETC_ALLOWED:
        for path in sorted(glob.glob(f"/etc/{pattern}")):
            args += ["--ro-bind-try", path, path]
    return args


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when a sandbox can be made here, else why not (bwrap's own words). Runs bwrap once."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "the `bwrap` program of bubblewrap is not installed"
    cmd = [bwrap, *NAMESPACE_FLAGS, *_system_binds(), "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"running bwrap failed: {exc}"
    if proc.returncode != 0:
        said = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
        return f"bwrap refused to start a sandbox: {said}"
    return None


def require() -> None:
    """Raise SandboxUnavailable, with what to install, when no sandbox can be made here."""
    reason = probe()
    if reason is not None:
        raise SandboxUnavailable(unavailable_message(reason))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def python_paths() -> list[Path]:
    """What the kernel's Python needs, read-only: its prefixes, course_utils, .pth folders.

    Never the repository root: course_utils/ is bound alone at its real path, which is all the
    editable install (its finder maps the package to that folder) needs.
    """
    paths = {Path(p).resolve() for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    paths.add(Path(sys.base_exec_prefix).resolve())
    paths.add(Path(sys.executable).resolve().parent.parent)
    spec = importlib.util.find_spec("course_utils")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            paths.add(Path(loc).resolve())
    for sp in site.getsitepackages():
        for pth in Path(sp).glob("*.pth"):
            try:
                lines = pth.read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                p = (Path(sp) / line).resolve()
                if p.is_dir() and not _inside(REPO, p):  # a .pth naming the repo root: skipped
                    paths.add(p)
    return sorted(p for p in paths if p.exists() and str(p) != "/")


def _course_utils_dir() -> Path:
    spec = importlib.util.find_spec("course_utils")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _installed_course_utils() -> Path | None:
    """Where the environment's editable install of course_utils points (its finder imports the
    package from there in the kernel), when that is not the checkout this grader runs from: a
    second checkout (a git worktree) sharing the first one's environment. The stripped package
    is bound there too, or the kernel would find no course_utils at all."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        said = json.loads(distribution("course_utils").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        return None
    url = said.get("url", "")
    if not said.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        return None
    path = (Path(url.removeprefix("file://")) / "course_utils").resolve()
    return path if path.is_dir() and path != _course_utils_dir() else None


def _mounts(ro: list[Path], rw: list[Path], hidden: list[Path]) -> list[str]:
    """Bind arguments, shallow paths first; a hidden path under a bound one is covered by an
    empty tmpfs (and what must stay visible inside it is bound again after)."""
    ops: list[tuple[int, int, list[str]]] = []
    for p in ro:
        ops.append((len(p.parts), 0, ["--ro-bind", str(p), str(p)]))
    for p in rw:
        ops.append((len(p.parts), 0, ["--bind", str(p), str(p)]))
    visible = [*ro, *rw, Path("/usr"), Path("/etc")]
    for h in hidden:
        if any(_inside(h, v) for v in visible):
            ops.append((len(h.parts), -1, ["--size", str(2**20), "--tmpfs", str(h)]))
    ops.sort(key=lambda op: (op[0], op[1]))
    return [arg for _, _, args in ops for arg in args]


def bwrap_argv(
    *,
    conn: Path,
    seed: Path,
    workdir: str,
    env: dict[str, str],
    tmpfs_bytes: int,
    memory_bytes: int,
    kernel_cmd: list[str],
    pids_max: int = 0,
    hidden: list[Path] = (),
    package: Path | None = None,
) -> list[str]:
    """The full command line: bwrap, its mounts and environment, the launcher, the kernel.

    package: a course_utils folder (graders.isolation.student_build: every answer a stub) bound
    where the real one is, so the kernel imports it in its place.
    """
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(unavailable_message("the `bwrap` program is not installed"))
    size = ["--size", str(int(tmpfs_bytes))]
    args = [bwrap, *NAMESPACE_FLAGS, *_system_binds()]
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm"]
    args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", HOME]
    hidden = [Path(h).resolve() for h in (REPO, *hidden)]
    ro = python_paths()
    if package is not None:
        real = _course_utils_dir()
        ro = [p for p in ro if p != real]
        args += _mounts(ro, [conn], hidden)
        args += ["--ro-bind", str(Path(package).resolve()), str(real)]
        other = _installed_course_utils()
        if other is not None:
            args += ["--ro-bind", str(Path(package).resolve()), str(other)]
    else:
        args += _mounts(ro, [conn], hidden)
    args += ["--ro-bind", str(seed), SEED]
    args += ["--remount-ro", "/"]  # bwrap's own root tmpfs: mount points only, nothing to fill
    args += ["--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", HOME, "--"]
    python = sys.executable
    return [
        *args,
        python,
        "-I",
        "-S",
        "-c",
        LAUNCHER,
        str(memory_bytes),
        str(pids_max),
        SEED,
        workdir,
        *kernel_cmd,
    ]


def kernel_env(passed: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel's whole environment inside the sandbox."""
    passed = dict(os.environ if passed is None else passed)
    env = {k: passed[k] for k in ENV_PASSED if k in passed}
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=HOME,
        USER="student",
        LOGNAME="student",
        TMPDIR="/tmp",
        PATH=os.pathsep.join(
            [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
        ),
        MPLCONFIGDIR=f"{HOME}/.config/matplotlib",
        XDG_CACHE_HOME=f"{HOME}/.cache",
        XDG_CONFIG_HOME=f"{HOME}/.config",
        IPYTHONDIR=f"{HOME}/.ipython",
        JUPYTER_CONFIG_DIR=f"{HOME}/.jupyter",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        JPY_PARENT_PID="1",  # the sandbox's init: ipykernel then neither polls it nor nags
    )
    return env


def _copy_seed(
    src: Path | None, dest: Path, max_bytes: int = 100 * 2**20, max_files: int = 1000
) -> None:
    """The files of the notebook's own folder that the kernel may need (data files a student
    submitted with it): no notebooks, no symlinks, at most `max_files` files and `max_bytes`."""
    dest.mkdir(parents=True, exist_ok=True)
    if src is None or not src.is_dir():
        return
    total = files = 0
    for folder, dirs, names in os.walk(src):  # does not follow symlinks
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(names):
            path = here / name
            if path.suffix == ".ipynb" or path.is_symlink() or not path.is_file():
                continue
            total += path.stat().st_size
            files += 1
            if total > max_bytes or files > max_files:
                return
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _copy_font_cache(dest: Path) -> None:
    """The grader's matplotlib font list, so that each kernel need not build its own (~0.4 s)."""
    if os.environ.get("MPLCONFIGDIR"):
        cache = Path(os.environ["MPLCONFIGDIR"])
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"
    for path in sorted(cache.glob("fontlist-v*.json"))[-2:]:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / path.name)


SCRATCH_PREFIX = "fa-sandbox-"  # host_scratch: removed with its grader, or after it
# The kernel's sockets are <scratch>/conn/kernel-<n>: the scratch's parent leaves room for this.
SCRATCH_TAIL = len(f"/{SCRATCH_PREFIX}{2**22}-abcdefgh/conn/kernel-99")


def scratch_parent(configured: str = "") -> Path:
    """Where a kernel's host-side scratch goes: `configured` (scratch_dir) if given, else the temp
    folder ($TMPDIR), or a shorter one where that leaves no room for the kernel's sockets (a
    cluster job's TMPDIR can be long; host_scratch.socket_parent). A configured folder that is
    too long is refused with its length, not swapped."""
    if not configured:
        return host_scratch.socket_parent(SCRATCH_TAIL)
    path = Path(configured).resolve()
    if not host_scratch.leaves_room(path, SCRATCH_TAIL):
        raise ValueError(
            f"SandboxKernelManager.scratch_dir {str(path)!r} is {len(os.fsencode(str(path)))} "
            f"bytes long; the kernel's sockets inside it need a folder of at most "
            f"{host_scratch.SOCKET_PATH_MAX - SCRATCH_TAIL}"
        )
    return path


class SandboxKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernel runs in a bubblewrap sandbox (see the module doc)."""

    memory_gb = Float(6.0, help="address-space cap of the kernel, GiB (0: none)").tag(config=True)
    tmpfs_mb = Integer(1024, help="size of each tmpfs (/tmp, home, /dev/shm), MiB").tag(config=True)
    pids_max = Integer(
        1024, help="processes and threads the kernel may run at once, all together (0: no cap)"
    ).tag(config=True)
    hidden = List(Unicode(), help="host folders that must stay out of sight").tag(config=True)
    scratch_dir = Unicode(
        "",
        help="where the host-side scratch goes (default: $TMPDIR, or /tmp where that path leaves "
        "no room for the kernel's sockets)",
    ).tag(config=True)
    package_dir = Unicode(
        "",
        help="a stripped course_utils (graders.isolation.student_build) to bind in the real "
        "one's place",
    ).tag(config=True)

    _scratch: Path | None = None
    _seed_src: Path | None = None
    _group: cgroups.KernelGroup | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self.cache_ports = False

    @property
    def scratch(self) -> Path | None:
        """The host folder of this kernel: conn/ (connection file, sockets) and seed/."""
        return self._scratch

    def _make_scratch(self) -> Path:
        if self._scratch is None or not self._scratch.is_dir():
            parent = scratch_parent(self.scratch_dir)
            self._scratch = host_scratch.make_dir(SCRATCH_PREFIX, parent).resolve()
            (self._scratch / "conn").mkdir()
            _copy_seed(self._seed_src, self._scratch / "seed" / "work")
            _copy_font_cache(self._scratch / "seed" / "home" / ".config" / "matplotlib")
        return self._scratch

    async def _async_pre_start_kernel(self, **kw):
        require()
        cwd = kw.pop("cwd", None)
        if cwd is not None:
            self._seed_src = Path(cwd)
        scratch = self._make_scratch()
        conn = scratch / "conn"
        self.kernel_spec.interrupt_mode = "message"  # a signal to bwrap would not reach it
        self.connection_file = str(conn / "kernel.json")
        self.ip = str(conn / "kernel")
        self.transport = "ipc"
        kernel_cmd, kw = await super()._async_pre_start_kernel(**kw)
        kw["cwd"] = str(scratch)
        kw["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        # what the student's code writes to the raw file descriptors (ipykernel forwards it as
        # stream messages anyway) must not pile up in the grader's pipes
        kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        return kernel_cmd, kw

    pre_start_kernel = _async_pre_start_kernel

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        kernel_cmd = super().format_kernel_cmd(extra_arguments)
        scratch = self._make_scratch()
        folder = self._seed_src.name if self._seed_src is not None else "work"
        launch_env = (self._launch_args or {}).get("env")
        memory_bytes = int(self.memory_gb * 2**30)
        self._remove_group()
        if self.pids_max:
            # the whole sandbox's processes and memory (tmpfs included), where groups can be
            # made; RLIMIT_NPROC in the launcher caps the processes of a grader that is not root
            self._group = cgroups.KernelGroup.create(self.pids_max, memory_bytes)
        argv = bwrap_argv(
            conn=scratch / "conn",
            seed=scratch / "seed",
            workdir=f"{HOME}/{folder}",
            env=kernel_env(launch_env),
            tmpfs_bytes=self.tmpfs_mb * 2**20,
            memory_bytes=memory_bytes,
            kernel_cmd=kernel_cmd,
            pids_max=self.pids_max,
            hidden=[Path(h) for h in self.hidden],
            package=Path(self.package_dir) if self.package_dir else None,
        )
        return self._group.join_argv(argv) if self._group is not None else argv

    @property
    def group(self) -> cgroups.KernelGroup | None:
        """The kernel's control group (graders.isolation.cgroups), or None where none can be
        made."""
        return self._group

    def _remove_group(self) -> None:
        if self._group is not None:
            self._group.remove()
            self._group = None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self._remove_group()
        if not restart and self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    cleanup_resources = _async_cleanup_resources
