"""Find the submissions to grade in nbgrader's submitted/ tree, as untrusted files.

Every folder under submitted/ is a student's (names starting with a dot included: none is
skipped without a word), and every folder in it an assignment. What the folders hold is
listed without following anything (:mod:`.untrusted`): a notebook or file that is a
symbolic link, a FIFO, a device or a directory is refused with the reason, and a student
or assignment folder that is a link makes the whole submission ungradable (it is recorded
as such, with zero points and a flag). Where each submission's time came from (the LMS's
upload time, or the student's own timestamp.txt) is read from zip_collect's record.
"""
from __future__ import annotations

import csv
import fnmatch
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import find_all_files, parse_utc

from . import untrusted

NOTEBOOK_BYTES = 50 << 20  # a submitted notebook larger than this is not read
FILE_BYTES = 64 << 20  # any other file
FILES_BYTES = 256 << 20  # all of a submission's other files together
TIMESTAMP = "timestamp.txt"
RECORD = "hand-ins.csv"  # in reports/ASSIGNMENT/: every download and what became of it
RECORD_FIELDS = ["download", "lms", "student", "uploaded", "written", "time_from", "lms_late", "outcome"]


@dataclass
class Submission:
    """One student's submission of one assignment: nbgrader's submitted/STUDENT/ASSIGNMENT."""

    student: str
    assignment: str
    root: str  # the submitted/ folder: paths are read from it, component by component
    source: Path  # the assignment's source folder (the instructor's files, trusted)
    timestamp: datetime | None = None
    time_from: str = ""  # where the time came from: "lms", "student" (its timestamp.txt) or "" (handins.TimeSource)
    lms_late: str = ""  # the LMS's own word on lateness, where its download said ("yes", "no")
    seconds_late: float = 0.0  # how late nbgrader counts it (due date and extension), once saved (writer)
    late_penalty: float = 0.0  # the points nbgrader's late penalty took, once saved
    notebooks: list[str] = field(default_factory=list)  # names of the notebooks handed in
    extra: list[str] = field(default_factory=list)  # the student's other files, relative paths
    refused: list[tuple[str, str]] = field(default_factory=list)  # (entry, why it was not used)
    unusable: str | None = None  # why nothing of it can be graded
    contents: dict[str, bytes] = field(default_factory=dict)  # its other files, once read (see files)

    @property
    def key(self) -> str:
        return f"{self.assignment}/{self.student}"

    @property
    def folder(self) -> Path:
        return Path(self.root) / self.student / self.assignment

    def read(self, relative: str, limit: int = NOTEBOOK_BYTES) -> bytes:
        """A file of the submission (raises untrusted.UnreadableFile)."""
        return untrusted.read(self.root, f"{self.student}/{self.assignment}/{relative}", limit)

    def files(self, ignore: list[str]) -> dict[str, bytes]:
        """The files that go beside its notebooks, as nbgrader copies them: the student's,
        then the instructor's (which win). A student's file that cannot be used is added to
        `refused`."""
        found: dict[str, bytes] = {}
        total = 0
        for relative in self.extra:
            try:
                data = self.read(relative, FILE_BYTES)
            except untrusted.UnreadableFile as refused:
                self.refused.append((relative, str(refused)))
                continue
            total += len(data)
            if total > FILES_BYTES:
                self.refused.append((relative,
                                     f"'{relative}' and the files after it: more than {FILES_BYTES >> 20} MiB in all"))
                break
            found[relative] = data
        if self.source.is_dir():
            for path in find_all_files(str(self.source), ignore + ["*.ipynb"]):
                found[os.path.relpath(path, self.source)] = Path(path).read_bytes()
        return found


def students(coursedir: CourseDirectory) -> list[str]:
    """Every folder name in submitted/, hidden ones too."""
    root = Path(coursedir.format_path(coursedir.submitted_directory, ".", ".")).resolve()
    if not root.is_dir():
        return []
    return sorted(entry.name for entry in os.scandir(root) if not entry.name.startswith(".ipynb_checkpoints"))


def find(coursedir: CourseDirectory, assignments: list[str], only: list[str]) -> list[Submission]:
    """Submissions of the given assignments and students (empty lists: all), sorted, each
    with where its time came from (zip_collect's record, reports/ASSIGNMENT/hand-ins.csv)."""
    root = str(Path(coursedir.format_path(coursedir.submitted_directory, ".", ".")).resolve())
    found = []
    for student in only or students(coursedir):
        reason: str | None
        try:
            with untrusted.folder(root, (student,)) as fd:
                handed_in = sorted(e.name for e in os.scandir(fd) if (not assignments or e.name in assignments)
                                   and (e.is_dir(follow_symlinks=False) or e.is_symlink()))
        except untrusted.UnreadableFile as refused:
            handed_in = assignments or []
            reason = f"the student's folder {refused}"
        except FileNotFoundError:
            continue
        else:
            reason = None
        for assignment in handed_in:
            found.append(_submission(coursedir, root, student, assignment, reason))
    sources = {a: time_sources(coursedir.root, a) for a in {s.assignment for s in found}}
    for submission in found:
        source = time_source(sources[submission.assignment], submission.student, submission.timestamp)
        submission.time_from, submission.lms_late = source.time_from, source.lms_late
    return sorted(found, key=lambda s: (s.assignment, s.student))


def _submission(coursedir: CourseDirectory, root: str, student: str, assignment: str, reason: str | None) -> Submission:
    source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
    submission = Submission(student, assignment, root, source, unusable=reason)
    if reason is not None:
        return submission
    try:
        files, refused = untrusted.listing(root, (student, assignment))
    except untrusted.UnreadableFile as error:
        submission.unusable = f"the assignment's folder {error}"
        return submission
    pattern = f"{coursedir.notebook_id}.ipynb"
    for relative in files:
        if any(fnmatch.fnmatch(part, glob) for part in relative.split("/") for glob in coursedir.ignore):
            continue
        if "/" not in relative and fnmatch.fnmatch(relative, pattern):
            submission.notebooks.append(relative)
        elif not relative.endswith(".ipynb"):  # timestamp.txt too: kept beside the autograded notebooks
            submission.extra.append(relative)
    submission.refused += [(entry, f"'{entry}' is {kind}") for entry, kind in refused]
    if TIMESTAMP in files:
        submission.timestamp = _timestamp(submission)
    return submission


def _timestamp(submission: Submission) -> datetime | None:
    """nbgrader's timestamp.txt (ignored, with a note, when it is not a readable time)."""
    try:
        text = submission.read(TIMESTAMP, 1024).decode("utf-8", "replace").strip()
        return parse_utc(text) if text else None
    except (untrusted.UnreadableFile, ValueError):
        submission.refused.append((TIMESTAMP, f"'{TIMESTAMP}' is not a time nbgrader can read"))
        return None


def is_done(coursedir: CourseDirectory, submission: Submission) -> bool:
    """Graded before, and not resubmitted since: nbgrader's own rule (autograded/ exists)."""
    dest = coursedir.format_path(coursedir.autograded_directory, submission.student, submission.assignment)
    if not os.path.isdir(dest):
        return False
    graded_at = coursedir.get_existing_timestamp(dest)
    return not (submission.timestamp and graded_at and submission.timestamp > graded_at)


def record_path(root: str | os.PathLike[str], assignment: str) -> Path:
    """zip_collect's record of an assignment's downloads (handins.HandInExtractor writes it)."""
    return Path(root) / "reports" / assignment / RECORD


def read_record(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [{k: row.get(k) or "" for k in RECORD_FIELDS} for row in csv.DictReader(f)]
    except OSError:
        return []


@dataclass(frozen=True)
class TimeSource:
    """Where a hand-in's time came from, as the instructor reads it."""

    time_from: str  # "lms" (the LMS's upload time), "student" (the hand-in's own timestamp.txt) or "" (no time)
    lms_late: str = ""  # "yes" or "no": the LMS's word on lateness, where its download said (Canvas); else ""


def time_sources(root: str | os.PathLike[str], assignment: str) -> dict[tuple[str, datetime], TimeSource]:
    """{(student, time): where it came from} of the hand-ins zip_collect collected."""
    found = {}
    for row in read_record(record_path(root, assignment)):
        if row["outcome"] == "collected" and row["time_from"]:
            try:
                when = parse_utc(row["uploaded"] if row["time_from"] == "lms" else row["written"])
            except (ValueError, OverflowError):
                continue
            found[(row["student"], when)] = TimeSource(row["time_from"], row["lms_late"])
    return found


def time_source(sources: dict[tuple[str, datetime], TimeSource], student: str, when: datetime | None) -> TimeSource:
    """Where a submission's time came from: as zip_collect recorded it, or, for a time it did
    not collect (a hand-in unzipped into submitted/, nbgrader's exchange), the submission's
    own timestamp.txt."""
    if when is None:
        return TimeSource("")
    return sources.get((student, when), TimeSource("student"))
