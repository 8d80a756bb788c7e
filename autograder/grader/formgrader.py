"""Formgrader's ⚡ Autograde button, graded by the engine: a Jupyter server extension.

Stock formgrader answers the button by running nbgrader's Autograde inside the Jupyter
server: the student's code in a kernel beside the hidden tests, which it can forge. nbgrader
names the classes that do it in its code (the handler makes an NbGraderAPI, which makes an
Autograde converter), so no setting swaps them. This extension answers the button's URL
itself with `autograder grade ASSIGNMENT --student STUDENT --force` in the course root —
sandboxed, every verdict decided in the grader — and the reply formgrader's page reads
(success, log, error). jupyter_server loads extensions in the order of their names and
tornado's first matching route answers, so this one answers before nbgrader's formgrader;
jupyter/instructor/jupyter_server_config.json enables it.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import url_path_join
from nbgrader.server_extensions.formgrader.base import BaseApiHandler, check_notebook_dir, check_xsrf
from tornado import web

# nbgrader's own route for the button (nbgrader/server_extensions/formgrader/apihandlers.py).
AUTOGRADE = r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde"
# The `autograder` command of this interpreter, wherever its scripts were installed (named so in
# its messages and in the course's lock, which says what grades the course).
COMMAND = [sys.executable, "-c", "import sys; sys.argv[0] = 'autograder'; from autograder.cli import app; app()"]


async def autograde(root: Path, assignment: str, student: str) -> dict[str, Any]:
    """Grade one submission as `autograder grade` does, in a process of its own (the server
    keeps serving meanwhile), and answer as nbgrader's API does: success, the log, and an
    error on failure. The ids go after `--`, so neither can be read as an option."""
    shown = f"autograder grade {assignment} --student {student} --force"
    process = await asyncio.create_subprocess_exec(
        *COMMAND, "grade", f"--course={root}", f"--student={student}", "--force", "--", assignment,
        cwd=root, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    log = f"$ {shown}\n{output.decode(errors='replace')}"
    if process.returncode == 0:
        return {"success": True, "log": log}
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    return {"success": False, "log": log,
            "error": errors[-1] if errors else f"`{shown}` stopped with exit status {process.returncode}"}


class EngineAutogradeHandler(BaseApiHandler):  # type: ignore[misc]  # (nbgrader has no types)
    """The button's URL, with stock formgrader's checks (logged in, XSRF, the course root
    inside the server's)."""

    @web.authenticated
    @check_xsrf  # type: ignore[untyped-decorator]
    @check_notebook_dir  # type: ignore[untyped-decorator]
    async def post(self, assignment_id: str, student_id: str) -> None:
        result = await autograde(Path(self.coursedir.root), assignment_id, student_id)
        self.write(json.dumps(result))  # a JSON string, as stock formgrader sends (its page parses it)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: ServerApp) -> None:
    webapp = serverapp.web_app
    route = url_path_join(webapp.settings["base_url"], AUTOGRADE)
    webapp.add_handlers(".*$", [(route, EngineAutogradeHandler)])  # type: ignore[no-untyped-call]
    serverapp.log.info("formgrader's Autograde button grades with `autograder grade` (sandboxed)")
