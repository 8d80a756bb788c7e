"""The feedback page as a student's browser shows it: the course's template (jupyter/templates/)
gives the text's tables room between their columns (a notebook's introduction lists its
exercises with their difficulty and time), as JupyterLab does."""
from __future__ import annotations

import copy

import nbformat
import pytest
from nbconvert import HTMLExporter
from traitlets.config import Config

import browser
from autograder import authoring
from autograder.grader import feedback

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
SLUG = "03_function_basics"
BOOTSTRAP = feedback.NBGRADER_TEMPLATES.parent / "static" / "node_modules" / "bootstrap" / "dist" / "css"

# For every table: the narrowest gap, in pixels, between the text of two neighbouring cells of a row.
GAPS = """() => [...document.querySelectorAll('.rendered_html table')].map(table => {
  const textBox = cell => { const range = document.createRange(); range.selectNodeContents(cell);
                            return range.getBoundingClientRect(); };
  const gaps = [...table.rows].flatMap(row => [...row.cells].slice(1).map((cell, i) =>
    textBox(cell).left - textBox(row.cells[i]).right));
  return Math.min(...gaps);
})"""


def test_the_introductions_table_of_exercises_has_room_between_its_columns(tmp_path):
    nb = nbformat.read(authoring.ROOT / "course" / SLUG / f"{SLUG}.ipynb", as_version=4)
    for cell in nb.cells:  # as nbgrader's feedback step leaves a graded cell
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader.score = 0
    config = feedback.configure(copy.deepcopy(Config()))
    config.HTMLExporter.extra_template_paths = [str(BOOTSTRAP)]  # as nbgrader's GenerateFeedback sets it
    exporter = HTMLExporter(config=config)
    html, _ = exporter.from_notebook_node(nb, resources={"nbgrader": {"notebook": SLUG, "score": 0, "max_score": 15,
                                                                      "late_penalty": 0}})
    page_path = tmp_path / f"{SLUG}.html"
    page_path.write_text(html)
    with browser.chromium() as chromium:
        page = chromium.new_page(viewport={"width": 900, "height": 900})
        page.goto(page_path.as_uri())
        gaps = page.evaluate(GAPS)
        browser.element_screenshot(page.locator(".rendered_html table").first, "feedback-exercise-table")
        page.close()
    assert gaps and min(gaps) >= 8, gaps  # "difficulty" and "time" no longer touch
