"""`make lab` serves course/ in JupyterLab with nbgrader's extensions enabled."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from autograder.authoring import ROOT, assignments

TOKEN = "course-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_make_lab_serves_the_course_with_nbgrader(tmp_path):
    port = _free_port()
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "run")}
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                extensions = _get(f"{base}/lab/api/extensions?token={TOKEN}")
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start within 60 s")
        nbgrader = [e for e in extensions if e["name"] == "jupyter-nbgrader"]
        assert nbgrader and nbgrader[0]["enabled"] and nbgrader[0]["status"] == "ok"
        listed = {item["name"] for item in _get(f"{base}/api/contents?token={TOKEN}")["content"]}
        assert set(assignments()) <= listed
        # nbgrader's server extension answers (the student's assignment list lives there).
        with urllib.request.urlopen(f"{base}/formgrader?token={TOKEN}", timeout=5) as response:
            assert response.status == 200
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
