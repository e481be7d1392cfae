"""hub/launch.py without a hub: what it refuses and says, the exchange's modes, the student lab's
config. The hub itself, with real users and a browser, is tests/hub/test_hub.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hub import launch


def test_missing_users_are_named_with_what_to_do(tmp_path, capsys):
    roster = tmp_path / "roster.csv"
    roster.write_text("student\nzz-no-such-student\n")
    code = launch.main(["--roster", str(roster), "--instructor", "zz-no-such-prof"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no system user zz-no-such-prof, zz-no-such-student" in err
    assert "--create-users" in err and "Traceback" not in err


def test_a_missing_roster_is_one_line(tmp_path, capsys):
    code = launch.main(["--roster", str(tmp_path / "none.csv"), "--instructor", "root"])
    assert code == 2
    assert (
        capsys.readouterr().err.strip()
        == f"course.py hub: --roster: no such file {tmp_path}/none.csv"
    )


def test_the_exchange_modes_keep_submissions_private():
    assert launch.ROOT_MODE & stat.S_ISVTX  # no one renames another's course folder (#1225)
    assert launch.ROOT_MODE & 0o777 == 0o777  # what nbgrader's every step checks
    assert not launch.INBOUND_MODE & (stat.S_IROTH | stat.S_IRGRP)  # students cannot list
    assert launch.INBOUND_MODE & stat.S_IWOTH  # but can hand in
    assert not launch.FEEDBACK_MODE & (stat.S_IROTH | stat.S_IRGRP)
    assert launch.HOME_MODE & 0o077 == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_prepare_exchange_sets_the_modes(tmp_path):
    course = launch.prepare_exchange(tmp_path / "exchange", "c1", "root")
    assert stat.S_IMODE(os.stat(tmp_path / "exchange").st_mode) == launch.ROOT_MODE
    assert stat.S_IMODE(os.stat(course / "inbound").st_mode) == launch.INBOUND_MODE
    assert stat.S_IMODE(os.stat(course / "feedback").st_mode) == launch.FEEDBACK_MODE


def test_students_get_the_assignments_tab_and_nothing_else_of_the_instructors():
    hub_student = launch.HERE / "student"
    server = json.loads((hub_student / "jupyter_server_config.json").read_text())
    on = server["ServerApp"]["jpserver_extensions"]
    assert on == {
        "nbgrader.server_extensions.formgrader": False,
        "nbgrader.server_extensions.assignment_list": True,
        "nbgrader.server_extensions.course_list": False,
    }
    page = json.loads((hub_student / "labconfig" / "page_config.json").read_text())
    base = json.loads(
        (launch.REPO / "jupyter" / "student" / "labconfig" / "page_config.json").read_text()
    )
    merged = {**base["disabledExtensions"], **page["disabledExtensions"]}
    assert merged["@jupyter/nbgrader:formgrader"] and merged["@jupyter/nbgrader:create-assignment"]
    assert not merged["@jupyter/nbgrader:assignment-list"]


def test_reachable_by_all_names_a_closed_folder(tmp_path):
    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    closed.chmod(0o700)
    try:
        assert closed in launch.reachable_by_all(closed / "inner" / "file")
    finally:
        closed.chmod(0o755)
    assert closed not in launch.reachable_by_all(Path(closed / "inner" / "file"))
