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

# `nbgrader zip_collect ASSIGNMENT`: put the LMS's download of hand_in() zips, as it comes (its
# zip of all, or each student's file), in downloaded/ASSIGNMENT/archive/ (README, "Handing in").
# The student is the uploader, from the name the LMS gives each file, never the folder inside
# the zip; a zip that holds another student's folder is refused in one line. The time is the
# LMS's upload time where the name carries one, else the student's own timestamp.txt; each
# download and where its time came from is listed in reports/ASSIGNMENT/hand-ins.csv.
c.ZipCollectApp.extractor_plugin = "autograder.grader.handins.HandInExtractor"
c.ZipCollectApp.collector_plugin = "autograder.grader.handins.HandInCollector"
# The names of the LMS's downloads, {LMS: regular expression}: groups student_id (the course's
# ids) or lms_id (the LMS's own, mapped through the roster), and optionally timestamp (the
# upload time) and late. The defaults (autograder/grader/handins.py, CANVAS and MOODLE):
#   Canvas  "lovelaceada[_LATE]_{Canvas user id}_{attachment id}_{file}"
#   Moodle  "Ada Lovelace_{participant id}_assignsubmission_file_[/]{file}"
# Add your LMS's with c.HandInExtractor.download_names.update({"Mine": r"(?P<student_id>...)_..."}).
# Canvas's and Moodle's ids are their own: the map to your students' ids is the first of
# downloaded/ASSIGNMENT/lms-roster.csv and lms-roster.csv (Canvas's gradebook export: ID -> SIS
# User ID; Moodle's grading worksheet: Identifier -> ID number; c.HandInExtractor.roster,
# c.HandInExtractor.roster_columns). An upload time without a zone is in
# c.HandInExtractor.timezone (UTC).
