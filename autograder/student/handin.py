"""Hand in a notebook from Colab or from any Jupyter: one call writes a submission file.

    from autograder.student.handin import hand_in
    hand_in("alice")

writes `alice__03_function_basics.zip` beside the notebook (in Colab: in the runtime, and
downloads it). The zip holds the notebook where nbgrader expects it:

    alice/03_function_basics/03_function_basics.ipynb
    alice/03_function_basics/timestamp.txt

so an instructor either unzips it into `submitted/` (`unzip -o alice__03_function_basics.zip
-d submitted`) or puts the LMS's download of every student's zip in
`downloaded/03_function_basics/archive/` and runs `nbgrader zip_collect 03_function_basics`
(the course's zip_collect takes the student from the LMS's name for the upload, and refuses
a zip whose folder names anyone else). Nothing is graded here.

What is handed in is the notebook as the student sees it: in JupyterLab and Notebook 7 the
page is asked to save it first (its Save button, clicked by a script the call displays), and
the saved file must show the cells this kernel ran, else the call refuses and says to save;
in Colab the notebook is read from the page itself. Every error is one line, no traceback.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # what nbgrader's folders and zip_collect accept
ASSIGNMENT = re.compile(r"(\d\d_[a-z0-9_]+?)(?: \(\d+\))?\.ipynb$")  # also "Copy of 03_x.ipynb", "03_x (1).ipynb"
STUB = "raise NotImplementedError"  # what an answer cell holds until it is answered


class HandInError(Exception):
    """Why nothing was handed in (the message says what to do)."""

    def _render_traceback_(self) -> list[str]:
        """What IPython (Jupyter, Colab) shows for it: the one line, no traceback."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


SAVE_WAIT = 5.0  # seconds the notebook's page has to save it


def hand_in(student: str, assignment: str | None = None, *, notebook: str | os.PathLike[str] | None = None,
            to: str | os.PathLike[str] | None = None, download: bool = True) -> Path | None:
    """Save this notebook and write `STUDENT__ASSIGNMENT.zip`, its submission; return its path.

    `student`: your student id, as your instructor gave it (letters, digits, `_ . -`).
    `assignment`: e.g. "03_function_basics"; found from the notebook's name when omitted.
    `notebook`: the .ipynb to hand in, as it is on disk; by default the notebook this kernel
    runs, as you see it: in JupyterLab and Notebook 7 it is saved first (and refused, saying
    so, if the saved file lacks the cells this kernel ran), in Colab it is read from the page.
    `to`: the folder to write to (default: beside the notebook, or the current folder).
    In Colab the file is also downloaded unless `download=False`; on a JupyterHub the
student is told to submit in the Assignment List instead. While the notebook is
    being graded (nbgrader sets NBGRADER_EXECUTION) it does nothing and returns None.
    """
    if os.environ.get("NBGRADER_EXECUTION"):
        return None
    if student == "":
        print('Nothing handed in yet: write your student id between the quotes, e.g. hand_in("alice_92"), '
              "and run this cell again.")
        return None
    if not isinstance(student, str) or not STUDENT_ID.match(student):
        raise HandInError(f"{student!r} is not a student id: use letters, digits, '_', '.' or '-' (e.g. 'alice_92').")
    nb, name, folder = _this_notebook(notebook)
    assignment = assignment or _assignment_of(name)
    if assignment is None:
        raise HandInError(f"cannot tell which assignment {name or 'this notebook'!r} is: call "
                          f"hand_in({student!r}, assignment=\"03_function_basics\") with its name.")
    _check_course_notebook(nb)
    when = datetime.now(timezone.utc)
    out = Path(to) if to is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{student}__{assignment}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        inside = f"{student}/{assignment}"
        archive.writestr(f"{inside}/{assignment}.ipynb", json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        archive.writestr(f"{inside}/timestamp.txt", when.strftime("%Y-%m-%d %H:%M:%S.%f %Z"))
    unanswered = _unanswered(nb)
    if _on_a_hub():
        print(f"Saved {assignment} for {student} ({when:%Y-%m-%d %H:%M} UTC): now submit it in the Assignment List "
              "(Nbgrader → Assignment List → Submit), where your instructor collects it.")
    else:
        print(f"Handed in {assignment} for {student}: {path} ({when:%Y-%m-%d %H:%M} UTC).")
    if unanswered:
        print(f"Note: {len(unanswered)} answer cell(s) still raise NotImplementedError: {', '.join(unanswered)}.")
    if _in_colab() and download:
        from google.colab import files  # type: ignore[import-not-found]

        files.download(str(path))
        print("Your browser downloads it now: upload that file where your instructor asks.")
    elif _on_a_hub():
        print(f"It is also written as {path}, for a course that collects files instead: it is not handed in "
              "until you submit.")
    else:
        print("Upload that file where your instructor asks.")
    return path


def _in_colab() -> bool:
    return "google.colab" in sys.modules


def _on_a_hub() -> bool:
    """A JupyterHub's server (the hub sets JUPYTERHUB_USER): students submit in its Assignment List."""
    return bool(os.environ.get("JUPYTERHUB_USER"))


def _this_notebook(notebook: str | os.PathLike[str] | None) -> tuple[dict[str, Any], str | None, Path]:
    """(notebook JSON, its file name if known, the folder to write to)."""
    path: Path | None
    if notebook is not None:
        path = Path(notebook)
        return _read(path), path.name, path.resolve().parent
    if _in_colab():
        from google.colab import _message

        nb = _message.blocking_request("get_ipynb", timeout_sec=60)["ipynb"]  # the page's notebook, as shown
        _refuse_if_stale(nb, "the notebook Colab sent", "wait until Colab shows every cell's output, then run "
                                                           "hand_in again")
        name = nb.get("metadata", {}).get("colab", {}).get("name")  # Colab keeps the file name there
        return nb, name, Path.cwd()
    path = _kernel_notebook()
    if path is None:
        raise HandInError("cannot find this notebook's file: save it, then call "
                          "hand_in(..., notebook=\"path/to/notebook.ipynb\").")
    return _saved(path), path.name, path.parent


def _kernel_notebook() -> Path | None:
    """The file this Jupyter kernel's notebook was opened from (ipykernel's `__session__`,
    set from the server's JPY_SESSION_NAME: a full path, or one relative to the server's root)."""
    names = []
    shell = _shell()
    if shell is not None:
        names.append(shell.user_ns.get("__session__"))
    names.append(os.environ.get("JPY_SESSION_NAME"))
    for name in filter(None, names):
        path = Path(name)
        for candidate in (path, Path.cwd() / path.name):  # the kernel runs in the notebook's folder
            if candidate.suffix == ".ipynb" and candidate.is_file():
                return candidate.resolve()
    return None


def _shell() -> Any:
    """The IPython shell this runs in, or None."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


# Run by JupyterLab's (and Notebook 7's) JavaScript renderer, with `element` the output's node:
# click the Save button of the notebook this output belongs to, as the student would. Only
# within a minute of the call, never again when a saved notebook is opened later.
SAVE_SCRIPT = """
if (Date.now() < {until}) {{
  const panel = (typeof element !== "undefined" && element.closest(".jp-NotebookPanel")) || document;
  const button = panel.querySelector('[data-command="docmanager:save"]') ||
                 document.querySelector('[data-command="docmanager:save"]');
  if (button) button.click();
}}
"""


def _saved(path: Path) -> dict[str, Any]:
    """The notebook as its page shows it: the page is asked to save it, and the file is read
    once it holds the cells this kernel ran (else HandInError says to save)."""
    before = path.stat().st_mtime_ns
    shown = _ask_page_to_save()
    deadline = time.monotonic() + SAVE_WAIT
    try:
        while time.monotonic() < deadline:
            if path.stat().st_mtime_ns != before:
                nb = _read_written(path)
                if nb is not None and not _unsaved_runs(nb):
                    return nb
            time.sleep(0.05)
    finally:
        if shown is not None:
            shown.update({"text/plain": ""}, raw=True)  # the script is not kept in the notebook
    nb = _read(path)
    if path.stat().st_mtime_ns == before:  # not saved now (a page that runs no script): good if the student did
        _refuse_if_stale(nb, path.name, "save the notebook (Ctrl+S, or File → Save Notebook) and run hand_in again")
    return nb  # saved now, though its last run is gone (a cell run, then deleted)


def _read_written(path: Path) -> dict[str, Any] | None:
    """The notebook, or None while the server is still writing it (it writes in place)."""
    try:
        nb: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return nb
    except (OSError, ValueError):
        return None


def _ask_page_to_save() -> Any:
    """Send the page the script that saves it; its display handle (None outside IPython)."""
    if _shell() is None:
        return None
    from IPython.display import Javascript, display

    return display(Javascript(SAVE_SCRIPT.format(until=int((time.time() + 60) * 1000))), display_id=True)


def _unsaved_runs(nb: dict[str, Any]) -> list[int]:
    """Execution counts of cells this kernel ran before this one (hand-in calls aside) that
    `nb` does not show: the last run must be there, with its count."""
    shell = _shell()
    if shell is None:
        return []
    history = shell.history_manager.input_hist_raw  # [0] is empty; the last is the running cell
    runs = [k for k in range(1, len(history) - 1) if history[k].strip() and "hand_in(" not in history[k]]
    if not runs:
        return []
    shown = {cell.get("execution_count") for cell in _cells(nb) if cell.get("cell_type") == "code"}
    return [] if runs[-1] in shown else [runs[-1]]


def _refuse_if_stale(nb: dict[str, Any], what: str, remedy: str) -> None:
    missing = _unsaved_runs(nb)
    if missing:
        raise HandInError(f"{what} does not hold your latest cells (In [{missing[0]}] is not in it): {remedy}.")


def _read(path: Path) -> dict[str, Any]:
    try:
        nb: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return nb
    except (OSError, ValueError) as error:
        raise HandInError(f"cannot read {path}: {error}") from None


def _assignment_of(name: str | None) -> str | None:
    found = ASSIGNMENT.search(name or "")
    return found.group(1) if found else None


def _cells(nb: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in nb.get("cells", []) if isinstance(c, dict)]


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _check_course_notebook(nb: dict[str, Any]) -> None:
    graded = [c for c in _cells(nb) if c.get("metadata", {}).get("nbgrader")]
    if not graded:
        raise HandInError("this notebook has none of the course's cells (their nbgrader metadata is gone): hand in "
                          "the notebook you opened from the course, with your answers in its answer cells.")


def _unanswered(nb: dict[str, Any]) -> list[str]:
    return [c["metadata"]["nbgrader"].get("grade_id", "?") for c in _cells(nb)
            if c.get("metadata", {}).get("nbgrader", {}).get("solution") and STUB in _source(c)]

