"""The class on Kubernetes, checked as far as a machine without a cluster allows: hub/values.yaml
against Zero to JupyterHub's own values schema (hub/z2jh/, the chart's defaults merged under ours
as helm does), its hook compiles, every user has a uid of their own, and hub/Dockerfile builds the
environment course.py builds. Not run here: helm install, the image build, a cluster."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
import yaml

from hub import launch

HUB = Path(launch.__file__).parent
jsonschema = pytest.importorskip("jsonschema")


def _load(name: str) -> dict:
    return yaml.safe_load((HUB / name).read_text())


def helm_merge(base: dict, over: dict) -> dict:
    """Helm's merge of values: maps merge key by key, anything else replaces, null removes."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _errors(values: dict) -> list[str]:
    schema = _load("z2jh/values.schema.yaml")
    merged = helm_merge(_load("z2jh/chart-values.yaml"), values)
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(merged)]


def test_the_values_pass_the_charts_schema():
    assert _errors(_load("values.yaml")) == []


def test_the_schema_check_rejects_a_misspelt_key():
    values = _load("values.yaml")
    values["singleuser"]["storage"]["extraVolume"] = values["singleuser"]["storage"].pop(
        "extraVolumes"
    )
    assert any("extraVolume" in e for e in _errors(values))


def test_the_hook_compiles_and_every_user_has_a_uid_of_their_own():
    values = _load("values.yaml")
    for name, code in values["hub"]["extraConfig"].items():
        ast.parse(code, filename=name)
    auth = values["hub"]["config"]["Authenticator"]
    users = set(auth["allowed_users"]) | set(auth["admin_users"])
    uids = values["custom"]["uids"]
    assert users <= set(uids), users - set(uids)
    assert len(set(uids.values())) == len(uids)
    assert all(uid >= 1001 for uid in uids.values())  # never the image's shared jovyan (1000)
    assert values["custom"]["course"]["instructor"] in auth["admin_users"]


def test_the_cluster_uses_the_same_exchange_course_and_student_lab_as_one_machine():
    values = _load("values.yaml")
    mounts = values["singleuser"]["storage"]["extraVolumeMounts"]
    assert [m["mountPath"] for m in mounts] == [str(launch.EXCHANGE)]
    config = values["singleuser"]["extraFiles"]["nbgrader-config"]["stringData"]
    assert f'course_id = "{launch.COURSE_ID}"' in config
    assert f'Exchange.root = "{launch.EXCHANGE}"' in config
    assert values["custom"]["course"]["id"] == launch.COURSE_ID
    student = values["custom"]["course"]["studentConfigPath"].split(":")
    assert student[:2] == ["/opt/flash-course/hub/student", "/opt/flash-course/jupyter/student"]
    local = (HUB / "jupyterhub_config.py").read_text()
    assert '"hub" / "student"' in local and '"jupyter" / "student"' in local


def test_the_image_builds_the_environment_course_py_builds():
    import course

    text = (HUB / "Dockerfile").read_text()
    m = re.search(r"course\.ensure_env\(course\.NEEDS\['(\w+)'\]\)", text)
    assert m, "hub/Dockerfile must build its environment with course.py's ensure_env"
    assert set(course.NEEDS[m.group(1)]) >= {"course", "hub"}
    assert "bubblewrap" in text  # the grader's sandbox
    image = _load("values.yaml")["singleuser"]["image"]["name"]
    assert image in text
