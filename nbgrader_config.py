"""nbgrader configuration: run stock `nbgrader` commands from the repository root.

`solutions/` holds the instructor notebooks (nbgrader's *source* step) and `course/`
the student notebooks generated from them (its *release* step). Submissions,
autograded notebooks, feedback and the gradebook stay in nbgrader's default places
under the root (all ignored by git).
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "autograd-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"

# A student who deletes a graded cell gets it back (with zero points) instead of
# breaking the grading of the whole notebook.
c.OverwriteCells.add_missing_cells = True

# Checks run gradcheck on several devices; leave room above nbgrader's 30 s default.
c.Execute.timeout = 120

# Feedback must not reveal hidden tests (nbgrader's default restores them).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# `nbgrader zip_collect ASSIGNMENT`: a submission made with `hand_in()` (autograder/student/
# handin.py) is a zip of STUDENT/ASSIGNMENT/ASSIGNMENT.ipynb; put the zips (as your LMS
# downloads them, renamed or not) in downloaded/ASSIGNMENT/archive/. The student id is the
# folder inside the zip, the notebook its file.
c.FileNameCollectorPlugin.named_regexp = (
    r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9_.-]*)/\d\d_[a-z0-9_]+/(?P<file_id>[^/]+\.ipynb)$"
)
