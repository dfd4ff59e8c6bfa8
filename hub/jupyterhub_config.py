"""JupyterHub configuration for the course on one machine (`make hub`, hub/serve.py).

Read by ``jupyterhub -f hub/jupyterhub_config.py``. Every setting that differs between machines
comes from an environment variable that hub/serve.py sets after checking it, so this file holds
the course's choices only:

- PAM logins and LocalProcessSpawner: each person is a Unix user of this machine, and their
  server runs as that user, in their home folder. The hub itself runs as root.
- One instructor (``COURSE_HUB_INSTRUCTOR``, an admin of the hub) whose server opens in the
  course folder (``COURSE_HUB_COURSE``, this repository by default), with nbgrader's formgrader.
- Learners: the members of the Unix group ``COURSE_HUB_GROUP``. Their servers see the learner
  distribution (``make release``) on ``PYTHONPATH``, never the course folder, and nbgrader's
  Assignments tab and Validate button only.
- nbgrader's exchange in ``COURSE_HUB_EXCHANGE`` (a folder every user may write, as nbgrader
  asks), the course id of nbgrader_config.py.
- Idle servers are stopped by jupyterhub-idle-culler, a hub service, after
  ``COURSE_HUB_IDLE_TIMEOUT`` seconds without activity (0: never); what learners saved stays in
  their homes.
- Single-user servers start through hub/spawner.py's CourseSpawner, which closes
  LocalProcessSpawner's port race.
- Everything listens on 127.0.0.1 only.
- With ``COURSE_HUB_NGSHARE_URL`` (`make hub EXCHANGE=ngshare`), nbgrader's exchange is ngshare, a
  hub service, with a roster service that enrols the hub's users (hub/ngshare_service.py).
"""

import os
import sys

env = os.environ
STATE = env["COURSE_HUB_STATE"]
COURSE = env["COURSE_HUB_COURSE"]
INSTRUCTOR = env["COURSE_HUB_INSTRUCTOR"]
VENV_BIN = os.path.dirname(sys.executable)
IDLE_TIMEOUT = int(env.get("COURSE_HUB_IDLE_TIMEOUT", "3600"))
#: How often activity reaches the hub (the proxy's record, and each server's own report): often
#: enough that a server in use is never taken for idle, at most JupyterHub's 5 minutes.
ACTIVITY_INTERVAL = min(300, max(5, IDLE_TIMEOUT // 6)) if IDLE_TIMEOUT else 300

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spawner import CourseSpawner  # noqa: E402 - hub/spawner.py, next to this file

c = get_config()  # noqa: F821 - provided by JupyterHub's config loader

# -- the hub, its proxy, its files: loopback only, state in STATE ---------------------------
c.JupyterHub.bind_url = f"http://127.0.0.1:{env['COURSE_HUB_PORT']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(env["COURSE_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env['COURSE_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [env["COURSE_HUB_PROXY"]]
c.JupyterHub.db_url = "sqlite:///" + os.path.join(STATE, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(STATE, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(STATE, "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.JupyterHub.last_activity_interval = ACTIVITY_INTERVAL

# -- idle servers stopped: jupyterhub-idle-culler as a hub service, with the rights it needs --
if IDLE_TIMEOUT:
    c.JupyterHub.services = [{
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE_TIMEOUT}",
                    f"--cull-every={ACTIVITY_INTERVAL}"],
    }]
    c.JupyterHub.load_roles = [{
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }]

# -- who may log in: Unix passwords (PAM), the instructor and the learners' group ----------
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no login session per server: containers have no logind
c.Authenticator.allowed_users = {INSTRUCTOR}
c.LocalAuthenticator.allowed_groups = {env["COURSE_HUB_GROUP"]}
c.Authenticator.admin_users = {INSTRUCTOR}

# -- each user's server: the course's venv, run as that Unix user -------------------------
c.JupyterHub.spawner_class = CourseSpawner  # LocalProcessSpawner, and the server listens where the hub looks
c.Spawner.cmd = [os.path.join(VENV_BIN, "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.ip = "127.0.0.1"
# A class logging in while others run a lesson: on 2 cores the slowest of 30 waited 126.5 s for its server
# (make bench-class-hub). A server that dies is seen at once (hub/spawner.py), so a longer limit only waits longer for
# a slow one, instead of showing its learner a failed spawn to retry into the same queue.
c.Spawner.http_timeout = 300
c.Spawner.start_timeout = 300
# What a learner's environment may not inherit from root's: only these variables pass.
c.Spawner.env_keep = ["LANG", "LC_ALL", "TZ"]


def _environment(spawner):
    """Per user: the instructor gets the course folder and its nbgrader config; a learner the learner release."""
    base = {
        "PATH": VENV_BIN + os.pathsep + "/usr/local/bin:/usr/bin:/bin",  # nbgrader runs `alembic` by name
        "COURSE_EXCHANGE": env["COURSE_HUB_EXCHANGE"],
        "JUPYTERHUB_ACTIVITY_INTERVAL": str(ACTIVITY_INTERVAL),  # what the idle culler reads
    }
    if spawner.user.name == INSTRUCTOR:
        # VENV: `make collect` and `make grade` in the instructor's terminals use the venv the hub runs.
        return {**base, "COURSE_ROOT": COURSE, "VENV": os.path.dirname(VENV_BIN),
                "JUPYTER_CONFIG_PATH": os.path.join(STATE, "instructor-config"),
                "COURSE_NGSHARE_URL": env.get("COURSE_HUB_NGSHARE_URL", "")}
    return {**base, "PYTHONPATH": os.path.join(STATE, "learner-course"),
            "JUPYTER_CONFIG_PATH": os.path.join(STATE, "learner-config")}


def _pre_spawn(spawner):
    spawner.environment = _environment(spawner)
    if spawner.user.name == INSTRUCTOR:
        spawner.notebook_dir = COURSE  # the formgrader reads nbgrader_config.py from here
    else:
        spawner.notebook_dir = "~"  # fetched lessons land in the learner's home


c.Spawner.pre_spawn_hook = _pre_spawn

# -- nbgrader's exchange over HTTP (make hub EXCHANGE=ngshare): ngshare and its roster as services --
if env.get("COURSE_HUB_NGSHARE_URL"):
    from ngshare_service import hub_services  # noqa: E402 - hub/ngshare_service.py, next to this file

    _services, _roles = hub_services(sys.executable, STATE, INSTRUCTOR, env["COURSE_HUB_COURSE_ID"],
                                     int(env["COURSE_HUB_NGSHARE_PORT"]))
    c.JupyterHub.services.extend(_services)
    c.JupyterHub.load_roles.extend(_roles)
