"""A real JupyterHub for the class test: JupyterHub from PyPI, its configurable-http-proxy
from npm (`make hub-tools`), users who log in with a password (JupyterHub's
DummyAuthenticator) and servers started as local processes (SimpleLocalProcessSpawner:
no Unix users needed, so it runs as root in CI), each student's server configured with
the course's hub configuration (jupyter/hub/student) and an nbgrader exchange in a
temporary folder.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.authoring import ROOT
from browser import free_port

PROXY = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
STUDENT_CONFIG = ROOT / "jupyter" / "hub" / "student"
PASSWORD = "course-test-password"
TOKEN = "course-test-api-token"

CONFIG = """\
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = {hub_url!r}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.pid_file = {pids!r} + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + {state!r} + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = {state!r} + "/cookie_secret"
c.JupyterHub.pid_file = {pids!r} + "/hub.pid"
c.JupyterHub.services = [{{"name": "class-test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "class-test", "scopes": ["servers"], "services": ["class-test"]}}]
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = set({users!r})
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {homes!r} + "/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {environment!r}
"""


@contextlib.contextmanager
def hub(tmp: Path, users: list[str], exchange: Path, settings: Path) -> Iterator[str]:
    """A JupyterHub on a free port for `users`; yields its URL. Each user's server reads the
    course's hub configuration, with nbgrader's exchange in `exchange` and JupyterLab's user
    settings in `settings`."""
    if not PROXY.exists():
        pytest.fail(f"{PROXY} is missing: run `make hub-tools` (configurable-http-proxy from npm)")
    state = tmp / "hub"
    state.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    environment = {
        "JUPYTER_CONFIG_PATH": str(STUDENT_CONFIG),
        "NBGRADER_EXCHANGE": str(exchange),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    (state / "jupyterhub_config.py").write_text(CONFIG.format(
        hub_url=url + "/", hub_port=free_port(), proxy_api_port=free_port(), proxy=str(PROXY), pids=str(state),
        state=str(state), password=PASSWORD, token=TOKEN, users=sorted(users), homes=str(tmp / "home"),
        singleuser=str(Path(sys.executable).with_name("jupyterhub-singleuser")), environment=environment,
    ))
    log = open(state / "hub.log", "w")
    process = subprocess.Popen([str(Path(sys.executable).with_name("jupyterhub")), "-f", "jupyterhub_config.py"],
                               cwd=state, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/hub/api", timeout=5) as response:
                    json.loads(response.read())
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterHub did not start: {(state / 'hub.log').read_text()[-3000:]}")
                time.sleep(0.3)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the hub stops its proxy and the users' servers
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def start_servers(url: str, users: list[str]) -> None:
    """Start the users' servers at once (as the hub does when a class logs in) and return when
    every one is up, as the hub's progress events say (what its spawn page shows)."""
    auth = {"Authorization": f"token {TOKEN}"}
    for user in users:
        request = urllib.request.Request(f"{url}/hub/api/users/{user}/server", method="POST", headers=auth)
        with urllib.request.urlopen(request, timeout=30):
            pass
    for user in users:
        request = urllib.request.Request(f"{url}/hub/api/users/{user}/server/progress", headers=auth)
        with urllib.request.urlopen(request, timeout=120) as events:
            for line in events:
                event = json.loads(line[len(b"data:"):]) if line.startswith(b"data:") else {}
                if event.get("failed"):
                    pytest.fail(f"{user}'s server did not start: {event.get('message')}")
                if event.get("ready"):
                    break
            else:
                pytest.fail(f"{user}'s server did not start: the hub's progress events ended")


def log_in(page, url: str, user: str, path: str = "") -> None:
    """Log in on the hub's page as a person does; their server starts (unless it runs) and
    JupyterLab opens (or `path` of it)."""
    page.goto(f"{url}/hub/login?next=" + urllib.parse.quote(path or f"/user/{user}/lab"))
    page.fill("input#username_input", user)
    page.fill("input#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(f"{url}/user/{user}/**", timeout=120_000)
    page.wait_for_selector("li.lm-MenuBar-item, .lm-TabBar-tab", timeout=120_000)
