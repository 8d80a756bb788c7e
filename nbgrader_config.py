"""nbgrader configuration: run stock `nbgrader` commands from the repository root.

`solutions/` holds the instructor notebooks (nbgrader's *source* step) and `course/`
the student notebooks generated from them (its *release* step). Submissions,
autograded notebooks, feedback and the gradebook stay in nbgrader's default places
under the root (all ignored by git).
"""
import importlib.util
import os
import sys

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "autograd-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
# Every student of the course (a hub's nbgrader config names the student for their own server).
c.CourseDirectory.student_id = "*"

# nbgrader's exchange, where the Assignment List releases, fetches, submits and collects: on a
# JupyterHub the folder every server sees (README, "Running the course on a JupyterHub"; the
# students' servers read the same place from jupyter/hub/student/nbgrader_config.py). Without
# one, a folder of the course's own (ignored by git), so formgrader has an exchange to list:
# `make instructor` makes it (reading this file creates nothing).
SHARED_EXCHANGE = "/srv/nbgrader/exchange"
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE") or SHARED_EXCHANGE
if not os.environ.get("NBGRADER_EXCHANGE") and not os.path.isdir(SHARED_EXCHANGE):
    c.Exchange.root = os.path.join(c.CourseDirectory.root, "exchange")

# A student who deletes a graded cell gets it back (with zero points) instead of
# breaking the grading of the whole notebook.
c.OverwriteCells.add_missing_cells = True

# Checks run gradcheck on several devices; leave room above nbgrader's 30 s default.
c.Execute.timeout = 120

# Stock `nbgrader autograde` runs a student's code in a kernel beside the hidden tests, where
# the submission can forge its score: this course grades with `autograder grade` (sandboxed;
# formgrader's Autograde button runs it too, autograder/grader/formgrader.py). It refuses in
# one line; NBGRADER_STOCK_AUTOGRADE=1 runs it on purpose (the comparisons with stock nbgrader).
if "nbgrader" in sys.argv[0] and sys.argv[1:2] == ["autograde"] and not os.environ.get("NBGRADER_STOCK_AUTOGRADE"):
    sys.exit("error: stock `nbgrader autograde` runs students' code beside the hidden tests, where it can forge its "
             "score: grade with `autograder grade ASSIGNMENT [--student STUDENT] [--force]` (README, \"Grading a "
             "class\"), or set NBGRADER_STOCK_AUTOGRADE=1 to run nbgrader's own on purpose")

# Feedback a student can read, without the hidden tests (nbgrader's default restores them):
# `autograder grade --feedback` sets the same (autograder/grader/feedback.py). Readable names each
# test cell by its exercise and drops outputs that say nothing to a student; the template
# (jupyter/templates/) wraps long lines. Found without importing them: loading this file is quick.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "autograder.grader.feedback.Readable",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.HTMLExporter.template_name = "autograd-feedback"
c.HTMLExporter.extra_template_basedirs = [
    os.path.join(importlib.util.find_spec("nbgrader").submodule_search_locations[0], "server_extensions", "formgrader",
                 "templates"),
    os.path.join(os.path.dirname(importlib.util.find_spec("autograder").submodule_search_locations[0]), "jupyter",
                 "templates"),
]

# `nbgrader zip_collect ASSIGNMENT`: a submission made with `hand_in()` (autograder/student/
# handin.py) is a zip of STUDENT/ASSIGNMENT/ASSIGNMENT.ipynb and its timestamp.txt; put the
# zips (as your LMS downloads them, renamed or not) in downloaded/ASSIGNMENT/archive/. The
# student id is the folder inside the zip, the notebook its file; the time of the hand-in
# comes from its timestamp.txt (HandInCollector), so late work shows as late.
c.ZipCollectApp.collector_plugin = "autograder.grader.discover.HandInCollector"
c.FileNameCollectorPlugin.named_regexp = (
    r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9_.-]*)/\d\d_[a-z0-9_]+/(?P<file_id>[^/]+\.ipynb)$"
)
