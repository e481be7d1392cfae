"""Each notebook graded at once gets its share of the cores for the math libraries' threads
(graders/run/threads.py): the grading process (torch, preloaded by its server, told directly) and
the kernel it starts (THREAD_VARIABLES, which the sandbox passes); a local run shares this
machine's cores among its `--jobs`, a cluster's worker its node's cores among the threads of the
node's workers; a variable the instructor set is left as it is."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from graders.run import cluster, pipeline, threads, worker

VARIABLES = threads.THREAD_VARIABLES


@pytest.fixture
def unset(monkeypatch):
    """THREAD_VARIABLES unset for the test and as they were after it: monkeypatch records a
    variable it deletes only where the variable was set, so each is set first (what the code
    under test sets would otherwise stay for the rest of the run)."""
    for name in VARIABLES:
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)


def _forked_from_a_torch_server(tmp_path, env: dict, share: int) -> dict:
    """In a program of its own (environment `env`): a process forked from the grading server
    with torch preloaded calls share_cores(share), as a grading process does first; what its
    torch and a sandboxed kernel's environment then hold."""
    seen = tmp_path / "seen.json"
    code = (
        "import json, torch\n"
        "from graders.isolation import sandbox\n"
        "from graders.run.threads import share_cores\n"
        f"share_cores({share})\n"
        "kernel = {k: v for k, v in sandbox.kernel_env().items() if k.endswith('_THREADS')}\n"
        f"open({str(seen)!r}, 'w').write(json.dumps([torch.get_num_threads(), kernel]))\n"
    )
    program = (
        "from graders.run import worker\n"
        f"p = worker._forkserver(('torch',)).Process(target=exec, args=({code!r},))\n"
        "p.start(); p.join(); raise SystemExit(p.exitcode)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", program], cwd=pipeline.REPO, env=env, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr[-2000:]
    torch_threads, kernel = json.loads(seen.read_text())
    return {"torch": torch_threads, "kernel": kernel}


def test_a_grading_process_and_its_kernel_take_their_share(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    got = _forked_from_a_torch_server(tmp_path, clean, 1)
    assert got == {"torch": 1, "kernel": dict.fromkeys(VARIABLES, "1")}, got


def test_the_instructors_setting_wins_over_the_share(tmp_path):
    chosen = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    # 1, below the share: a share of 2 taken would show as torch's 2 threads (a value above the
    # cores would not show: torch holds itself to the cores)
    chosen["OMP_NUM_THREADS"] = "1"
    got = _forked_from_a_torch_server(tmp_path, chosen, 2)
    assert got == {"torch": 1, "kernel": {"OMP_NUM_THREADS": "1"}}, got


def test_the_grading_process_takes_its_share_before_it_grades(monkeypatch, unset):
    """worker._main, the grading process's body, gives the job's share before the kernel starts."""
    seen = {}

    def grade_one(job):
        seen.update({name: os.environ.get(name) for name in VARIABLES})
        return {}

    monkeypatch.setattr(worker, "grade_one", grade_one)
    monkeypatch.setattr(worker, "die_with_parent", lambda: None)
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        worker._main({"threads": 1})
    finally:
        if torch is not None:
            torch.set_num_threads(before)
    assert seen == dict.fromkeys(VARIABLES, "1"), seen


def test_no_share_changes_nothing(unset):
    threads.share_cores(None)
    threads.share_cores(0)
    assert not any(name in os.environ for name in VARIABLES)


@pytest.mark.parametrize("cores", [1, 2, 3, 16])
def test_the_share_is_the_cores_over_the_notebooks_at_once_and_never_zero(monkeypatch, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    for at_once in (1, 2, 4, 32):
        assert threads.thread_share(at_once) == max(1, cores // at_once)


def _job(tmp_path, n: int) -> dict:
    """A task as graders/grade.py makes one; its template stamped with its release."""
    (tmp_path / "template").mkdir(exist_ok=True)
    (tmp_path / "template" / ".release").write_text("r1")
    return {
        "student": f"s{n}",
        "assignment": "01_online_softmax",
        "source": str(tmp_path / f"s{n}.ipynb"),
        "sha256": f"{n:064x}",
        "notebook": base64.b64encode(b"{}").decode(),
        "template": str(tmp_path / "template"),
        "release": "r1",
        "assignments": ["01_online_softmax"],
        "wall": 60,
    }


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_each_task_is_graded_with_its_share(tmp_path, monkeypatch, where):
    """On a machine of 16 cores, a local run of 2 jobs: the cores over 2. On a cluster of two
    workers of 2 threads each on this host, 4 notebooks at once: the cores over 4. The grading
    process is replaced by one that answers with the share its job carries."""
    from distributed import LocalCluster

    def answer(job, wall_seconds):
        return {**{k: job[k] for k in ("student", "assignment")}, "status": job["threads"]}

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(worker, "run_worker", answer)
    monkeypatch.setattr(worker, "start_server", lambda preload=(): None)
    jobs = [_job(tmp_path, n) for n in range(3)]
    if where == "local":
        got = list(cluster.run(jobs, workers=2, progress=False))
        expected = 8  # 16 cores over 2
    else:
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=False) as remote:
            got = list(cluster.run(jobs, scheduler=remote.scheduler_address, progress=False))
        expected = 4  # 16 cores over 4
    assert sorted(r["status"] for r, _ in got) == [expected] * 3, got
