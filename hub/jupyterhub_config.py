"""JupyterHub's configuration of the course's class on one machine (read by `jupyterhub -f`).

Everything that varies (users, ports, folders) comes from the JSON file named by
$COURSE_HUB_SETTINGS, which hub/launch.py writes; docs/hub.md says how to switch the
authenticator to an institution's (LTI, OAuth).
"""

import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when the file is loaded)
s = json.loads(Path(os.environ["COURSE_HUB_SETTINGS"]).read_text())
state, repo, bindir = Path(s["state"]), Path(s["repo"]), Path(s["python"]).parent

c.JupyterHub.ip, c.JupyterHub.port = s["ip"], s["port"]
c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", s["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s['proxy_api_port']}"
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")

# Who: the roster's students and the instructor, with their system passwords. An institution's
# login instead: c.JupyterHub.authenticator_class = "ltiauthenticator.lti13.authenticator
# .LTI13Authenticator" (jupyterhub-ltiauthenticator) or "oauthenticator.GenericOAuthenticator",
# keeping allowed_users and admin_users (docs/hub.md).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no login session stack in containers
c.Authenticator.allowed_users = {*s["students"], s["instructor"]}
c.Authenticator.admin_users = {s["instructor"]}

# Where: one server per user, run as that user from the course's environment.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(bindir / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = c.Spawner.http_timeout = 120  # a 2-core machine starting many labs
c.Spawner.environment = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin"}
c.JupyterHub.shutdown_on_logout = False

# An admin token for scripts (the tests, benchmarks/hub_class.py): state/admin-token, mode 0600.
c.JupyterHub.services = [
    {"name": "course-admin", "api_token": (state / "admin-token").read_text().strip()}
]
c.JupyterHub.load_roles = [
    {
        "name": "course-admin",
        "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"],
        "services": ["course-admin"],
    }
]


def role_environment(spawner):
    """The student lab for students; every nbgrader part, in the course directory, for the
    instructor. Both read the hub's nbgrader config (the exchange, the course id)."""
    common = str(state / "etc")
    if spawner.user.name == s["instructor"]:
        spawner.notebook_dir = s["course_dir"]
        paths = [s["course_dir"], common]
    else:
        spawner.notebook_dir = "~"
        paths = [str(repo / "hub" / "student"), str(repo / "jupyter" / "student"), common]
    spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)


c.Spawner.pre_spawn_hook = role_environment
