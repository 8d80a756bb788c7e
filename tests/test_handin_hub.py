"""On a JupyterHub the class submits in nbgrader's Assignment List: the hand-in cell says so,
instead of telling the student to upload a file."""
from __future__ import annotations

import shutil

from autograder import authoring
from autograder.student import handin

SLUG = "03_function_basics"


def test_on_a_hub_the_hand_in_cell_says_to_submit_in_the_assignment_list(tmp_path, monkeypatch, capsys):
    path = tmp_path / f"{SLUG}.ipynb"
    shutil.copy(authoring.ROOT / "course" / SLUG / f"{SLUG}.ipynb", path)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")  # as a hub sets it for every student's server
    handin.hand_in("alice", notebook=path)
    said = capsys.readouterr().out
    assert "submit it in the Assignment List" in said and "not handed in until you submit" in said, said
    assert "Upload" not in said and "Handed in" not in said, said
    monkeypatch.delenv("JUPYTERHUB_USER")
    handin.hand_in("alice", notebook=path)  # elsewhere: the file is what the student hands in
    said = capsys.readouterr().out
    assert f"Handed in {SLUG} for alice" in said and "Upload that file where your instructor asks" in said, said
