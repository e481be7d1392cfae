"""What makes `python -m graders grade` quick, checked for behaviour (no timings here: those are in
benchmarks/grading.py --versus-nbgrader): a run with nothing new grades nothing, starts no
template build nor cluster, leaves the report as it was and says "0 graded, N unchanged"; the
grading template is cached by its key and rebuilt when the release differs; the first line of
output is the summary of the run."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from graders import grade
from graders.run import cluster, pipeline, template

ASSIGNMENT = "01_online_softmax"  # the fastest notebook

pytestmark = pytest.mark.skipif(
    ASSIGNMENT not in pipeline.assignments(), reason="notebook 01 missing"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A template cache of this test's own (template.template_cache follows XDG_CACHE_HOME)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "fa-course-grader"


def _counting_builds(monkeypatch) -> list[str]:
    """Record each real build of a template (graders.run.template.build_template) by its release."""
    builds: list[str] = []
    real = template.build_template

    def counted(work, only, release=""):
        builds.append(release)
        return real(work, only, release)

    monkeypatch.setattr(template, "build_template", counted)
    return builds


def _sandbox() -> bool:
    from graders.isolation import sandbox

    return sandbox.probe() is None


@pytest.mark.notebooks
def test_a_run_with_nothing_new_grades_nothing_and_says_so(tmp_path, cache, capsys, monkeypatch):
    release = nbformat.read(pipeline.REPO / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
    students = ["ada", "grace"]
    for student in students:  # the release, untouched, saved as Jupyter saves it
        folder = tmp_path / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(release, str(folder / f"{ASSIGNMENT}.ipynb"))
    builds = _counting_builds(monkeypatch)
    out = tmp_path / "graded"
    sandbox = _sandbox()

    first = grade.grade(tmp_path / "submitted", out, jobs=1, sandbox=sandbox)
    said = capsys.readouterr().out.splitlines()
    n = len(students)
    assert said[0] == f"grading {n} notebooks of {n} students (0 unchanged) on 1 workers"
    assert said[-1].startswith(f"{n} graded, 0 unchanged")
    assert [r["student"] for r in first.results] == students
    assert all(r["status"] == "untouched" for r in first.results), first.results
    assert len(builds) == 1
    report = {p.name: p.stat().st_mtime_ns for p in (out / "report.md", out / "grades.csv")}

    def no_template(*args, **kwargs):
        raise AssertionError("a run with nothing to grade built or fetched a template")

    def no_cluster(tasks, **kwargs):
        if tasks:
            raise AssertionError(f"a run with nothing new sent {len(tasks)} tasks")
        return iter(())

    monkeypatch.setattr(grade, "cached_template", no_template)
    monkeypatch.setattr(cluster, "run", no_cluster)
    again = grade.grade(tmp_path / "submitted", out, jobs=1, sandbox=sandbox)
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"grading 0 notebooks of {n} students ({n} unchanged) on 1 workers"
    assert said[-1].startswith(f"0 graded, {n} unchanged")
    assert again.results == first.results
    # the grades and the report were written from these very results: not written again
    assert {p: (out / p).stat().st_mtime_ns for p in report} == report

    (out / "report.md").unlink()  # gone: written again, though nothing was graded
    grade.grade(tmp_path / "submitted", out, jobs=1, sandbox=sandbox)
    assert (out / "report.md").is_file()
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"0 graded, {n} unchanged")


def test_the_template_is_reused_for_the_same_release_and_rebuilt_for_another(cache, monkeypatch):
    builds = _counting_builds(monkeypatch)
    release = template.release_hash()

    first, max_score, code_cells = template.cached_template([ASSIGNMENT], release)
    assert first.parent == cache
    assert (first / ".release").read_text() == release
    assert max_score[ASSIGNMENT] > 0 and code_cells[ASSIGNMENT] > 0
    assert not [p for p in cache.iterdir() if p.name.startswith(".building-")]

    same = template.cached_template([ASSIGNMENT], release)
    assert same == (first, max_score, code_cells)
    assert builds == [release]

    other = "0" * 64  # another release: another key, a template built for it
    second, _, _ = template.cached_template([ASSIGNMENT], other)
    assert second != first and (second / ".release").read_text() == other
    assert builds == [release, other]
    assert first.is_dir()  # the newest few are kept


def test_a_half_built_template_is_never_used(cache, monkeypatch):
    builds = _counting_builds(monkeypatch)
    release = template.release_hash()
    dest = cache / template.template_key(release, [ASSIGNMENT])
    (dest / "notebooks").mkdir(parents=True)  # as a build stopped half-way would leave it
    (dest / ".release").write_text(release)

    built, _, _ = template.cached_template([ASSIGNMENT], release)
    assert built == dest and builds == [release]
    assert json.loads((dest / ".meta.json").read_text())["max_score"][ASSIGNMENT] > 0
    assert (dest / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").is_file()


def test_the_template_key_follows_the_release_and_the_assignments():
    release = template.release_hash()
    key = template.template_key(release, [ASSIGNMENT])
    assert key == template.template_key(release, [ASSIGNMENT])
    assert key != template.template_key("0" * 64, [ASSIGNMENT])
    assert key != template.template_key(release, [ASSIGNMENT, "03_tiled_forward"])


@pytest.mark.parametrize("program", ["graders.run.worker", "graders.run.preload", "graders"])
def test_the_graders_processes_do_not_build_the_iri_grammar(program):
    """Each submission is graded in a process of its own (graders.run.worker): jsonschema's
    optional IRI checker (rfc3987_syntax, 38 Lark parsers built at import, about 1 s) must not be
    imported on the way to nbformat. Measured by the interpreter's own import log."""
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", program, "--no-such-option"],
        cwd=pipeline.REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    imported = {line.rsplit("|", 1)[-1].strip() for line in got.stderr.splitlines() if "|" in line}
    assert "nbformat" in imported, got.stderr[-2000:]  # the program got as far as nbformat
    assert "lark" not in imported and "rfc3987_syntax.syntax_helpers" not in imported


def test_the_preloaded_server_renders_its_own_feedback_notebook():
    """The server renders one notebook of its own to feedback HTML (graders/run/preload.py) so
    that each forked process's feedback starts warm. It is only a head start, so the server
    goes on where it fails: this test is what says it still works (nbgrader's template, its
    stylesheet and its grades all found)."""
    import graders.run.preload as preload

    html = preload._warm_feedback()
    assert "warm-up" in html and "Score: 1.0 / 2.0" in html and "bootstrap" in html.lower()


def test_the_server_preloads_torch_for_a_run_with_a_torch_notebook_and_only_then():
    """A run with a released notebook that imports torch has its grading processes' server
    import torch once (their checks import it: 1.6 s a process otherwise); a run of numpy
    notebooks alone does not pay for it. The released notebooks as nbgrader wrote them."""
    from graders.run.worker import preload_for

    numpy_notebooks = [a for a in pipeline.assignments() if a < "06"]
    torch_notebooks = [a for a in pipeline.assignments() if a >= "06"]
    assert numpy_notebooks and torch_notebooks
    repo = pipeline.REPO  # its notebooks/ holds the releases, laid out as in a template
    assert preload_for(repo, numpy_notebooks) == []
    for a in torch_notebooks:
        assert preload_for(repo, [ASSIGNMENT, a]) == ["torch"], a
    assert preload_for(repo / "no-such-template", torch_notebooks) == []


@pytest.mark.parametrize("second", ["02_merge_partials", "06_triton_forward"])
def test_every_task_of_a_run_carries_the_runs_preload(tmp_path, monkeypatch, second):
    """grade() computes the preload once for the whole run and gives it to every task: whichever
    task starts the server (the first of any worker), a run with notebook 06 in it preloads torch.
    The class is two released notebooks as nbgrader wrote them; the template, the release itself."""
    if second not in pipeline.assignments():
        pytest.skip(f"{second} missing")
    for a in (ASSIGNMENT, second):
        folder = tmp_path / "submitted" / "ada" / a
        folder.mkdir(parents=True)
        release = pipeline.REPO / "notebooks" / a / f"{a}.ipynb"
        (folder / f"{a}.ipynb").write_bytes(release.read_bytes())
    seen = []

    def no_grading(tasks, **kwargs):
        seen.extend(tasks)
        return iter(())

    def the_release(wanted, release, say=None):
        return pipeline.REPO, {a: 1.0 for a in wanted}, {a: 1 for a in wanted}

    monkeypatch.setattr(grade, "cached_template", the_release)
    monkeypatch.setattr(cluster, "run", no_grading)
    graded = tmp_path / "graded"
    grade.grade(tmp_path / "submitted", graded, jobs=1, progress=False, sandbox=_sandbox())
    want = ["torch"] if second >= "06" else []
    assert len(seen) == 2 and all(t["preload"] == want for t in seen), seen


@pytest.mark.parametrize("extra", [(), ("torch",)])
def test_a_forked_grading_process_starts_with_what_its_server_preloaded(tmp_path, extra):
    """The first Process of a program starts the server with that list; the process forked from
    it finds those modules imported without importing them itself."""
    import subprocess
    import sys

    seen = tmp_path / "seen.txt"
    code = f"import sys; open({str(seen)!r}, 'w').write(str('torch' in sys.modules))"
    program = (
        "from graders.run import worker\n"
        f"p = worker._forkserver({extra!r}).Process(target=exec, args=({code!r},))\n"
        "p.start(); p.join(); raise SystemExit(p.exitcode)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", program], cwd=pipeline.REPO, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr[-2000:]
    assert seen.read_text() == str(bool(extra))


def test_a_local_run_starts_the_grading_server_before_its_cluster(tmp_path):
    """cluster.run starts the grading processes' server (with the run's preload) before it
    imports dask and starts the local cluster, so the server's imports overlap them. Checked in
    a program of its own: the server is a child of that program, found by its command line,
    when the cluster is about to start (it failed before: the first job started the server)."""
    import subprocess
    import sys

    program = (
        "import json\n"
        "import psutil\n"
        "from graders.run import cluster\n"
        "def servers():\n"
        "    kids = psutil.Process().children()\n"
        "    return [p for p in kids if 'multiprocessing.forkserver' in ' '.join(p.cmdline())]\n"
        "def at_cluster_start(workers):\n"
        "    found = servers()\n"
        "    print(json.dumps([' '.join(p.cmdline()) for p in found]))\n"
        "    for p in found:  # no need to wait for its imports\n"
        "        p.kill()\n"
        "    raise SystemExit(0)\n"
        "cluster._local_cluster = at_cluster_start\n"
        "if servers():\n"
        "    raise SystemExit('a server before the run')\n"
        "list(cluster.run([{'preload': ['torch']}], workers=1, progress=False))\n"
        "raise SystemExit('the cluster was never started')\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", program], cwd=pipeline.REPO, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    found = json.loads(got.stdout.strip().splitlines()[-1])
    assert len(found) == 1 and "'graders.run.preload', 'torch'" in found[0], found


def _broken_job(tmp_path) -> dict:
    """A job whose grading process fails at once: its template does not exist."""
    nb = tmp_path / "in" / f"{ASSIGNMENT}.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_text("{}")
    return {
        "student": "s1",
        "assignment": ASSIGNMENT,
        "path": str(nb),
        "template": str(tmp_path / "no-template"),
        "out": str(tmp_path / "out"),
        "timeout": 30,
        "max_score": 16.0,
        "sandbox": False,
    }


def _failure_line(result: dict) -> str:
    assert result["status"] == "grader-error" and result["score"] == 0, result
    (line,) = result["problems"]
    return line


def test_a_grading_process_that_fails_is_quoted_from_its_own_output(tmp_path):
    """The grading process is forked from the preloaded server (graders/run/preload.py): what it
    printed before it failed reaches the result, as the subprocess's stderr did."""
    from graders.run.worker import run_worker

    for attempt in range(2):  # the second one forked from the server the first one started
        line = _failure_line(run_worker(_broken_job(tmp_path / str(attempt)), 120))
        assert line.startswith("the grader itself failed:"), line
        assert "FileNotFoundError" in line and "no-template" in line, line


def _fake_processes(monkeypatch, outcomes: list[str]) -> list[str]:
    """run_worker's grading processes replaced by `outcomes`, one per process it starts:
    "crash" prints a traceback and exits 1, "hang" is stopped at the wall clock, "ok" writes
    a result. Returns the list the calls are appended to."""
    from graders.run import worker

    calls = []

    def fake(job, log, wall_seconds):
        what = outcomes[len(calls)]
        calls.append(what)
        if what == "hang":
            return None
        if what == "crash":
            Path(log).write_text("Traceback (most recent call last):\nOSError: [Errno 5] boom\n")
            return 1
        path = worker.result_path(Path(job["out"]), job["student"], job["assignment"])
        path.parent.mkdir(parents=True, exist_ok=True)
        res = {"student": job["student"], "assignment": job["assignment"], "status": "graded"}
        path.write_text(json.dumps({**res, "score": 16.0, "problems": ["its own note"]}))
        return 0

    monkeypatch.setattr(worker, "_run_graded_process", fake)
    return calls


def test_a_grading_process_that_crashes_once_is_run_again(tmp_path, monkeypatch):
    """A crash of the grading process is the tooling's, not the student's (CI, 2026-12-07: one
    honest notebook of a class came back a grader-error): the notebook is graded again and keeps
    its score; the result names the first failure."""
    from graders.run.worker import run_worker

    calls = _fake_processes(monkeypatch, ["crash", "ok"])
    res = run_worker(_broken_job(tmp_path), 120)
    assert calls == ["crash", "ok"]
    assert res["status"] == "graded" and res["score"] == 16.0, res
    assert res["problems"] == [
        "graded a second time: the grader's first try failed (OSError: [Errno 5] boom)",
        "its own note",
    ]


def test_a_second_crash_or_a_stopped_process_is_a_grader_error(tmp_path, monkeypatch):
    from graders.run.worker import run_worker

    calls = _fake_processes(monkeypatch, ["crash", "crash"])
    line = _failure_line(run_worker(_broken_job(tmp_path / "a"), 120))
    assert calls == ["crash", "crash"] and line.endswith("OSError: [Errno 5] boom"), line
    calls = _fake_processes(monkeypatch, ["hang", "ok"])  # a stuck grader would stick again
    res = run_worker(_broken_job(tmp_path / "b"), 120)
    assert calls == ["hang"] and "timed_out" not in res, res
    assert _failure_line(res) == "grading took longer than 120 s and was stopped"


def _from_a_daemon(job: dict, queue) -> None:
    from graders.run.worker import run_worker

    queue.put(run_worker(job, 120))


def test_a_daemonic_dask_worker_grades_in_a_program_of_its_own(tmp_path):
    """A dask worker under a nanny is a daemon process, which multiprocessing forbids to have
    children: there the grading process is `python -m graders.run.worker JOB`."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    daemon = ctx.Process(target=_from_a_daemon, args=(_broken_job(tmp_path), queue), daemon=True)
    daemon.start()
    result = queue.get(timeout=120)
    daemon.join(30)
    line = _failure_line(result)
    assert line.startswith("the grader itself failed:"), line
    assert "FileNotFoundError" in line and "no-template" in line, line


def test_a_new_gradebook_is_stamped_without_running_the_alembic_program(tmp_path, monkeypatch):
    """nbgrader stamps a new gradebook with the head of its migrations by running `alembic heads`
    (2.5 s of CPU each time); under the course's configuration the same revision is read in this
    process. The revision is compared with what the program itself prints."""
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    import nbgrader.api as nb_api

    pipeline.load_config(tmp_path)  # what every use of nbgrader by the grader goes through
    alembic = Path(sys.executable).parent / "alembic"
    with nb_api._temp_alembic_ini("sqlite:////tmp/gradebook.db") as ini:
        printed = subprocess.check_output([str(alembic), "-c", ini, "heads"], text=True)
    want = printed.split("\n")[0].split(" ")[0]

    def no_program(*args, **kwargs):
        raise AssertionError(f"nbgrader ran a program for the stamp: {args}")

    monkeypatch.setattr(nb_api.sp, "check_output", no_program)
    db = tmp_path / "gradebook.db"
    with nb_api.Gradebook(f"sqlite:///{db}"):
        pass
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(want,)]
