"""Submissions mutated at random in structure and metadata (hypothesis strategies), for
the generative test that no notebook can stop a class's grading (test_fuzz.py).

A mutant starts from a notebook as a student hands it in (JSON, as a dict) and applies a
few edits of the kinds a careless, confused or hostile student (or a broken tool) makes:
nbgrader metadata of any type or with fields of any type, missing, duplicated and unknown
fields and ids, cells deleted, copied, moved and retyped, outputs of any shape, large
sources, a notebook's own metadata and version changed; some are not JSON at all. Cells the
instructor made are copied many times over (as markdown too) and their metadata is carried by
other cells (markdown, answers): a student's copy-paste.
"""
from __future__ import annotations

import copy
import json

from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)
FIELDS = ["grade", "solution", "locked", "task", "grade_id", "points", "schema_version", "checksum", "cell_type"]
OUTPUTS = st.one_of(
    st.fixed_dictionaries({"output_type": st.just("stream"), "name": st.sampled_from(["stdout", "stderr"]),
                           "text": st.text(max_size=50)}),
    st.fixed_dictionaries({"output_type": st.just("error"), "ename": st.text(max_size=10),
                           "evalue": st.text(max_size=20), "traceback": st.lists(st.text(max_size=20), max_size=3)}),
    st.fixed_dictionaries({"output_type": st.just("display_data"), "data": st.dictionaries(
        st.sampled_from(["text/plain", "text/html", "image/png", "application/json"]), st.text(max_size=30),
        max_size=2), "metadata": st.dictionaries(st.text(max_size=5), JSON, max_size=2)}),
    JSON,  # not an output at all
)


def _nbgrader(cell: dict) -> object:
    meta = cell.get("metadata")
    return meta.get("nbgrader") if isinstance(meta, dict) else None


def _grade_ids(nb: dict) -> list[str]:
    return [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
            if isinstance(_nbgrader(c), dict) and "grade_id" in c["metadata"]["nbgrader"]]


@st.composite
def _edit(draw, nb: dict) -> None:
    """One edit, in place."""
    cells = nb["cells"]
    if not cells:
        cells.append({"cell_type": "code", "id": "new", "metadata": {}, "source": "", "outputs": [],
                      "execution_count": None})
    i = draw(st.integers(0, len(cells) - 1))
    cell = cells[i]
    if not isinstance(cell.get("metadata"), dict):
        cell["metadata"] = {}
    meta = cell["metadata"]
    kind = draw(st.sampled_from([
        "nbgrader any", "field any", "field drop", "field unknown", "grade_id copied", "grade_id unknown",
        "points odd", "retype", "delete", "copy", "move", "source large", "source list", "outputs", "id",
        "cell metadata any", "notebook metadata", "nbformat minor", "copies", "metadata of another",
    ]))
    nbgrader = _nbgrader(cell)
    if kind == "nbgrader any":
        meta["nbgrader"] = draw(JSON)
    elif kind == "field any" and isinstance(nbgrader, dict):
        nbgrader[draw(st.sampled_from(FIELDS))] = draw(JSON)
    elif kind == "field drop" and isinstance(nbgrader, dict) and nbgrader:
        del nbgrader[draw(st.sampled_from(sorted(nbgrader)))]
    elif kind == "field unknown" and isinstance(nbgrader, dict):
        nbgrader[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    elif kind == "grade_id copied" and isinstance(nbgrader, dict) and _grade_ids(nb):
        nbgrader["grade_id"] = draw(st.sampled_from(_grade_ids(nb)))
    elif kind == "grade_id unknown" and isinstance(nbgrader, dict):
        nbgrader["grade_id"] = draw(st.text(max_size=12))
    elif kind == "points odd" and isinstance(nbgrader, dict):
        nbgrader["points"] = draw(st.sampled_from([-1, 0, 1e300, float("nan"), float("inf"), "2", True, None, 10**30]))
    elif kind == "retype":
        cell["cell_type"] = draw(st.sampled_from(["code", "markdown", "raw", "unknown"]))
        if draw(st.booleans()):  # keep the fields nbformat wants for the new type, or not
            if cell["cell_type"] == "code":
                cell.setdefault("outputs", []), cell.setdefault("execution_count", None)
            else:
                cell.pop("outputs", None), cell.pop("execution_count", None)
    elif kind == "delete":
        del cells[i]
    elif kind == "copy":
        twin = copy.deepcopy(cell)
        if draw(st.booleans()):
            twin["id"] = f"copy-{i}"
        cells.insert(draw(st.integers(0, len(cells))), twin)
    elif kind == "copies":  # of a cell the instructor made, where there is one: before and after it, any type
        made = [k for k, c in enumerate(cells) if isinstance(_nbgrader(c), dict)] or [i]
        original = cells[draw(st.sampled_from(made))]
        for k in range(draw(st.integers(2, 12))):
            twin = copy.deepcopy(original)
            if draw(st.booleans()):
                twin["id"] = f"copies-{k}"
            if draw(st.booleans()):
                twin["cell_type"] = "markdown"
                twin.pop("outputs", None), twin.pop("execution_count", None)
            if draw(st.booleans()):
                twin["source"] = draw(st.sampled_from(["", "x = 1\n", "# an answer\n"]))
            cells.insert(draw(st.integers(0, len(cells))), twin)
    elif kind == "metadata of another":  # a cell (markdown, an answer) carries another's nbgrader metadata
        carriers = [c for c in cells if isinstance(_nbgrader(c), dict)]
        if carriers:
            meta["nbgrader"] = copy.deepcopy(_nbgrader(draw(st.sampled_from(carriers))))
    elif kind == "move":
        cells.insert(draw(st.integers(0, len(cells) - 1)), cells.pop(i))
    elif kind == "source large":
        cell["source"] = draw(st.sampled_from(["#", "x = 1\n", "(", "\x00"])) * draw(st.sampled_from([1, 10**5, 10**6]))
    elif kind == "source list":
        cell["source"] = draw(st.lists(st.text(max_size=20), max_size=5))
    elif kind == "outputs":
        cell["outputs"] = draw(st.lists(OUTPUTS, max_size=3))
    elif kind == "id":
        cell["id"] = draw(st.one_of(st.sampled_from([c.get("id", "x") for c in cells]), st.text(max_size=70), JSON))
    elif kind == "cell metadata any":
        cell["metadata"] = draw(JSON)
    elif kind == "notebook metadata":
        nb["metadata"] = draw(st.one_of(JSON, st.fixed_dictionaries({"kernelspec": JSON})))
    elif kind == "nbformat minor":
        nb["nbformat_minor"] = draw(st.sampled_from([0, 1, 4, 5, 99, -1]))


@st.composite
def mutants(draw, base: dict) -> str:
    """A notebook file's text: `base` (a notebook as JSON) with 1 to 6 random edits, or,
    rarely, text that is no notebook at all."""
    nb = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 6))):
        draw(_edit(nb))
    text = json.dumps(nb)
    ending = draw(st.sampled_from(["whole"] * 18 + ["cut", "not utf-8"]))
    if ending == "cut":
        return text[: draw(st.integers(0, len(text) - 1))]
    if ending == "not utf-8":
        return text.replace('"cells"', '"\udcff"', 1)
    return text


def as_bytes(text: str) -> bytes:
    """The file's bytes (lone surrogates become the invalid UTF-8 they stand for)."""
    return text.encode("utf-8", "surrogateescape")

