"""course.py's first start: torch's CPU build from PyTorch's index, a fallback, progress lines."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


def test_first_start_falls_back_and_says_each_step(course, monkeypatch, tmp_path, capsys):
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
    monkeypatch.setattr(course.subprocess, "call", lambda *a, **k: 1)  # no torch yet
    monkeypatch.setattr(course, "torch_index", lambda: course.CPU_INDEX)
    commands = []

    def fake_run(cmd, **kw):
        commands.append([str(c) for c in cmd])
        return 1 if "--index-url" in cmd else 0  # the CPU index fails, pip's own works

    monkeypatch.setattr(course, "run", fake_run)
    course.ensure_env()
    out = capsys.readouterr().out
    assert [c for c in commands if "torch==2.13.0" in c][0][-2:] == [
        "--index-url",
        course.CPU_INDEX,
    ]
    assert commands[1][-1] == "torch==2.13.0" and "--index-url" not in commands[1]
    assert commands[2][-2:] == ["-e", ".[course,dev]"]
    for line in (
        "1/3 creating",
        "2/3 installing torch==2.13.0 from",
        "failed; trying pip's own",
        "3/3 installing the course package",
        "done in",
        "environment ready in",
    ):
        assert line in out, out
    assert course.STAMP.read_text() == course.setup_hash()
