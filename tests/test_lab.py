"""`make lab` serves a student's own copies with no instructor panels; `make instructor`
serves the course root with formgrader. (The browser tests drive both for real.)"""
from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

import browser
from autograder.authoring import ROOT
from autograder.publish import released

pytestmark = pytest.mark.slow
INSTRUCTOR_PLUGINS = {"@jupyter/nbgrader:menu", "@jupyter/nbgrader:create-assignment"}
NO_EXCHANGE = {"@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:course-list"}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _disabled(base: str) -> set[str]:
    with urllib.request.urlopen(f"{base}/lab?token={browser.TOKEN}", timeout=10) as response:
        page = response.read().decode()
    found = re.search(r'"disabledExtensions":\s*\[([^\]]*)\]', page)
    return set(re.findall(r'"([^"]+)"', found.group(1))) if found else set()


def test_make_lab_serves_the_students_own_copies_without_instructor_panels(tmp_path):
    work = tmp_path / "work"
    mine = work / "03_function_basics" / "03_function_basics.ipynb"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own work")  # a copy made before: never overwritten
    with browser.lab("lab", tmp_path, WORK=str(work)) as base:
        listed = {item["name"] for item in browser.get_json(f"{base}/api/contents?token={browser.TOKEN}")["content"]}
        assert listed == set(released())
        assert mine.read_text() == "my own work"
        assert (work / "07_double_backward" / "07_double_backward.ipynb").read_bytes() == \
            (ROOT / "course" / "07_double_backward" / "07_double_backward.ipynb").read_bytes()
        extensions = browser.get_json(f"{base}/lab/api/extensions?token={browser.TOKEN}")
        assert any(e["name"] == "jupyter-nbgrader" and e["enabled"] for e in extensions)  # Validate stays
        assert INSTRUCTOR_PLUGINS | NO_EXCHANGE <= _disabled(base)
        assert _status(f"{base}/formgrader?token={browser.TOKEN}") == 404


def test_make_instructor_serves_formgrader_on_the_course(tmp_path):
    with browser.lab("instructor", tmp_path) as base:
        assert _status(f"{base}/formgrader?token={browser.TOKEN}") == 200
        disabled = _disabled(base)
        assert not INSTRUCTOR_PLUGINS & disabled and NO_EXCHANGE <= disabled
        listed = {item["name"] for item in browser.get_json(f"{base}/api/contents?token={browser.TOKEN}")["content"]}
        assert {"solutions", "course", "nbgrader_config.py"} <= listed
