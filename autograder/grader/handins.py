"""`nbgrader zip_collect` for hand_in() zips as an LMS downloads them: the student is the
uploader the LMS names, never the folder inside the zip, and the time is the LMS's upload
time where its download carries one.

nbgrader_config.py names both plugins. `HandInExtractor` reads every download in
downloaded/ASSIGNMENT/archive/ (each student's file, or the LMS's zip of them all, as it
comes). The uploader, and the upload time where there is one, come from the download's
name (`download_names`: Canvas's and Moodle's by default; an LMS's own user ids are mapped
to the course's through `roster`). A download must be a hand_in() zip that holds only
UPLOADER/ASSIGNMENT/: one that holds another student's folder, another assignment, or
anything else is refused in one line that says why, and nothing of it is collected. Of a
student's downloads the later is kept: by the LMS's time where the names carry it, else by
the students' own timestamp.txt. The extractor writes each hand-in, checked, to
extracted/STUDENT/ASSIGNMENT/ with the timestamp.txt it decided on, and records every
download, and what became of it, in reports/ASSIGNMENT/hand-ins.csv: the grader reads it
to say where each hand-in's time came from. `HandInCollector` then gives nbgrader the
files of extracted/ as they are.
"""
from __future__ import annotations

import csv
import functools
import io
import os
import re
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from nbgrader.utils import parse_utc
from traitlets import Dict, List, Unicode

from .discover import FILE_BYTES, FILES_BYTES, NOTEBOOK_BYTES, RECORD_FIELDS, TIMESTAMP, read_record, record_path

# Canvas, "Download Submissions" (canvas-lms lib/content_zipper.rb, get_filename and
# add_upload_submission): "{sortable name, lower case, word characters only}[_LATE]_{Canvas
# user id}_{attachment id}_{file name}"; LATE when Canvas counts the submission late.
CANVAS = r"(?P<name>\w*?)(?P<late>_LATE)?_(?P<lms_id>\d+)_(?P<attachment_id>\d+)_(?P<file>[^/]+)$"
# Moodle, "Download all submissions" (mod/assign/locallib.php, download_submissions):
# "{Full Name}_{participant id}_assignsubmission_file_{file name}", or with "Download
# submissions in folders" (the default since Moodle 3.1) the same prefix as a folder,
# "{Full Name}_{participant id}_assignsubmission_file_/{file name}". The participant id is
# Moodle's per assignment, never the course's student id.
MOODLE = r"(?P<name>[^_/]*)_(?P<lms_id>\d+)_assignsubmission_file_/?(?P<file>[^/]+)$"
MEMBERS = 64  # files in one hand-in zip (hand_in writes two)
WRITTEN = "%Y-%m-%d %H:%M:%S.%f UTC"  # as hand_in writes timestamp.txt


class Refused(Exception):
    """Why a download is not collected (the message is the line the instructor reads)."""


@dataclass
class HandIn:
    """One student's download: who uploaded it, when, and the files it holds."""

    download: str  # its name, as the LMS gave it
    lms: str  # whose naming it has (a key of download_names)
    student: str  # the uploader, as the course names students
    uploaded: datetime | None  # the LMS's upload time (UTC), where the name carries it
    lms_late: bool | None  # the LMS's own word on lateness (Canvas's LATE), where the name has it
    written: datetime | None = None  # its timestamp.txt: the time on the student's machine
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def time(self) -> datetime | None:
        return self.uploaded or self.written

    @property
    def time_from(self) -> str:
        return "lms" if self.uploaded else "student" if self.written else ""

    def row(self, outcome: str) -> dict[str, str]:
        return {"download": self.download, "lms": self.lms, "student": self.student,
                "uploaded": _text(self.uploaded), "written": _text(self.written), "time_from": self.time_from,
                "lms_late": "" if self.lms_late is None else "yes" if self.lms_late else "no", "outcome": outcome}


def _text(when: datetime | None) -> str:
    return when.strftime(WRITTEN) if when else ""


class HandInExtractor(ExtractorPlugin):  # type: ignore[misc]  # (nbgrader is untyped)
    """Extract each LMS download of hand_in() zips to extracted/UPLOADER/ASSIGNMENT/, as the
    module's docstring says."""

    download_names = Dict(
        {"Canvas": CANVAS, "Moodle": MOODLE},
        help="{LMS: regular expression} of the names the LMS gives the files it downloads, matched at "
             "the start of each download's name (a folder inside the LMS's zip included, as 'folder/file'). "
             "Named groups: student_id (the course's student id) or lms_id (the LMS's own user id, mapped "
             "through the roster); optional timestamp (the LMS's upload time: a time without a zone is in "
             "`timezone`) and late (not empty when the LMS marks the submission late).",
    ).tag(config=True)
    roster = List(
        ["downloaded/{assignment_id}/lms-roster.csv", "lms-roster.csv"],
        help="Where the map from an LMS's user ids to the course's student ids is, relative to the course "
             "root ({assignment_id} is the assignment's name): the first that exists is read. A CSV file "
             "with a header row, such as Canvas's gradebook export or Moodle's grading worksheet.",
    ).tag(config=True)
    roster_columns = List(
        [["ID", "SIS User ID"], ["Identifier", "ID number"]],
        help="[LMS id column, student id column] pairs; the first pair the roster has is used, and the "
             "digits of the LMS id column are the id (Moodle writes 'Participant 123456'). Defaults: "
             "Canvas's gradebook export, Moodle's grading worksheet.",
    ).tag(config=True)
    timezone = Unicode("UTC", help="The zone of an LMS's upload time that names none.").tag(config=True)

    def extract(self, archive_path: str, extracted_path: str) -> None:
        app = self.parent
        assignment, root = app.coursedir.assignment_id, app.coursedir.root
        self._patterns = {lms: re.compile(pattern) for lms, pattern in self.download_names.items()}
        self._ids: dict[str, str] | None = None
        self._assignment, self._root = assignment, root
        rows, handins = [], []
        for where, name, data in self._downloads(archive_path):
            try:
                handins.append(self._handin(where, name, data))
            except Refused as refused:
                self.log.warning("%s", refused)
                rows.append({**dict.fromkeys(RECORD_FIELDS, ""), "download": where, "outcome": f"refused: {refused}"})
        kept = []
        for student in sorted({h.student for h in handins}):
            theirs = [h for h in handins if h.student == student]
            chosen, dropped = _latest(theirs)
            kept.append(chosen)
            rows.append(chosen.row("collected"))
            for handin, why in dropped:
                self.log.warning("%s", why)
                rows.append(handin.row(f"not collected: {why}"))
            _write(Path(extracted_path) / student / assignment, chosen)
        _append(record_path(root, assignment), rows)
        by = {source: sum(h.time_from == source for h in kept) for source in ("lms", "student", "")}
        self.log.info(
            "%d hand-ins of %s collected (their times: %d the LMS's upload time, %d written by the student's own "
            "machine, %d none), %d downloads not collected; each is listed in %s", len(kept), assignment,
            by["lms"], by["student"], by[""], len(rows) - len(kept), record_path(root, assignment))

    def _downloads(self, archive_path: str) -> Iterator[tuple[str, str, bytes | Refused]]:
        """(where it is, its name, its bytes or why they cannot be used) of each download: a
        file of archive/ named as an LMS names them, or a file in a zip of them (the LMS's
        whole download)."""
        for folder, folders, files in os.walk(archive_path):
            folders.sort()
            for file in sorted(files):
                path = os.path.join(folder, file)
                name = os.path.relpath(path, archive_path).replace(os.sep, "/")
                if self._lms(name) is None and zipfile.is_zipfile(path):
                    yield from self._members(path, name)
                else:
                    yield name, name, _bounded(functools.partial(open, path, "rb"), os.path.getsize(path), name)

    def _members(self, path: str, name: str) -> Iterator[tuple[str, str, bytes | Refused]]:
        """The downloads in an LMS's zip of them; a zip none of whose files is named as an LMS
        names them is one download (then refused as such)."""
        try:
            bundle = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as error:
            yield name, name, Refused(f"'{name}': not a zip that can be read ({error}): not collected")
            return
        with bundle:
            infos = [i for i in bundle.infolist() if not i.is_dir()]
            if not any(self._lms(i.filename) for i in infos):
                yield name, name, b""
                return
            for info in infos:
                where = f"{name}: {info.filename}"
                yield where, info.filename, _bounded(functools.partial(bundle.open, info), info.file_size, where)

    def _lms(self, name: str) -> tuple[str, re.Match[str]] | None:
        """(LMS, the match) of the first of download_names that matches `name`."""
        for lms, pattern in self._patterns.items():
            found = pattern.match(name)
            if found:
                return lms, found
        return None

    def _handin(self, where: str, name: str, data: bytes | Refused) -> HandIn:
        """The hand-in of the download `name` (found at `where`), checked."""
        if isinstance(data, Refused):
            raise data
        matched = self._lms(name)
        if matched is None:
            raise Refused(f"'{where}': not named as {' or '.join(self.download_names)} names its downloads "
                          "(c.HandInExtractor.download_names): not collected")
        lms, groups = matched[0], matched[1].groupdict()
        student = groups.get("student_id") or self._student(lms, groups.get("lms_id"), where)
        handin = HandIn(where, lms, student, self._uploaded(groups.get("timestamp"), where),
                        bool(groups["late"]) if "late" in groups else None)
        handin.files = _files(where, data, student, self._assignment)
        handin.written = _written(handin.files.get(TIMESTAMP, b""))
        return handin

    def _student(self, lms: str, lms_id: str | None, where: str) -> str:
        if lms_id is None:
            raise Refused(f"'{where}': the expression for {lms} has no student_id or lms_id group: not collected")
        if self._ids is None:
            self._ids = self._read_roster(lms)
        if lms_id not in self._ids:
            raise Refused(f"'{where}': {lms}'s user {lms_id} is not in the roster: not collected")
        return self._ids[lms_id]

    def _read_roster(self, lms: str) -> dict[str, str]:
        """{LMS id: student id} from the first roster file that exists (none: the run stops)."""
        paths = [Path(self._root) / p.format(assignment_id=self._assignment) for p in self.roster]
        path = next((p for p in paths if p.is_file()), None)
        if path is None:
            self._stop(f"{lms} names its downloads by its own user ids: put the map to your students' ids in "
                       f"{' or '.join(str(p) for p in paths)} (Canvas: its gradebook export, columns ID and SIS "
                       "User ID; Moodle: the assignment's grading worksheet, with ID number), or set "
                       "c.HandInExtractor.roster")
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        pair = next((c for c in self.roster_columns if rows and set(c) <= set(rows[0])), None)
        if pair is None:
            self._stop(f"{path} has no pair of the columns {self.roster_columns} (c.HandInExtractor.roster_columns)")
        ids = {}
        for row in rows:
            lms_id = re.search(r"\d+", row[pair[0]] or "")
            if lms_id and (row[pair[1]] or "").strip():
                ids[lms_id.group()] = row[pair[1]].strip()
        return ids

    def _stop(self, message: str) -> NoReturn:
        """End the collection with one line, before anything is collected."""
        self.parent.fail(message)  # (logs the line and exits)
        raise SystemExit(1)

    def _uploaded(self, text: str | None, name: str) -> datetime | None:
        """The LMS's upload time (UTC, naive, as nbgrader keeps times) from the name's timestamp group."""
        if text is None:
            return None
        try:
            return lms_time(text, self.timezone)
        except (ValueError, OverflowError):
            raise Refused(f"'{name}': {text!r} is not a time (the timestamp group of "
                          "c.HandInExtractor.download_names): not collected") from None


def lms_time(text: str, zone: str = "UTC") -> datetime:
    """An LMS's time, in UTC without a zone (as nbgrader keeps times): "2026-03-01-11-30-00"
    and its like (digits, any separators) or ISO 8601 ("2026-03-01T11:30:00Z"); a time that
    names no zone is in `zone`. (nbgrader's own reading, dateutil's, takes the "-30-00" of
    the first for a zone.)"""
    digits = re.fullmatch(r"(\d{4})\D?(\d\d)\D?(\d\d)\D?(\d\d)\D?(\d\d)(?:\D?(\d\d))?", text)
    if digits:
        year, month, day, hour, minute, second = (int(part or 0) for part in digits.groups())
        when = datetime(year, month, day, hour, minute, second)
    else:
        when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        try:
            when = when.replace(tzinfo=ZoneInfo(zone))
        except (ValueError, ZoneInfoNotFoundError):
            raise ValueError(f"unknown time zone {zone!r} (c.HandInExtractor.timezone)") from None
    return when.astimezone(timezone.utc).replace(tzinfo=None)


def _bounded(opener: Callable[[], Any], size: int, where: str) -> bytes | Refused:
    """A download's bytes, read only if it is no larger than a hand-in's files may be."""
    if size > FILES_BYTES:
        return Refused(f"'{where}': larger than {FILES_BYTES >> 20} MiB: not collected")
    try:
        with opener() as source:
            data: bytes = source.read(FILES_BYTES + 1)
    except (OSError, zipfile.BadZipFile) as error:
        return Refused(f"'{where}' cannot be read ({error}): not collected")
    if len(data) > FILES_BYTES:
        return Refused(f"'{where}': larger than {FILES_BYTES >> 20} MiB: not collected")
    return data


def _files(name: str, data: bytes, student: str, assignment: str) -> dict[str, bytes]:
    """{file name: bytes} of a hand-in zip that holds STUDENT/ASSIGNMENT/ and nothing else."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise Refused(f"'{name}' ({student}) is not a hand_in() zip: not collected") from None
    with archive:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        if not infos or len(infos) > MEMBERS:
            raise Refused(f"'{name}' ({student}) holds {len(infos)} files, not a hand-in: not collected")
        files, total = {}, 0
        for info in infos:
            parts = info.filename.split("/")
            if len(parts) != 3 or {"", ".", ".."} & set(parts) or (info.external_attr >> 28) == 0o12:
                raise Refused(f"'{name}' ({student}) holds '{info.filename}', not a file in "
                              f"{student}/{assignment}/ (hand_in() writes only that folder): not collected")
            inner, their_assignment, file = parts
            if inner != student:
                raise Refused(f"'{name}': uploaded by {student}, holds a hand-in of {inner} ({inner}/"
                              f"{their_assignment}/): not collected, and {inner}'s own hand-in is unchanged")
            if their_assignment != assignment:
                raise Refused(f"'{name}' ({student}) is a hand-in of {their_assignment}, not {assignment}: "
                              "not collected")
            limit = NOTEBOOK_BYTES if file.endswith(".ipynb") else FILE_BYTES
            total += info.file_size
            if info.file_size > limit or total > FILES_BYTES:
                raise Refused(f"'{name}' ({student}): '{file}' is larger than a hand-in's files may be: not collected")
            try:
                with archive.open(info) as member:
                    files[file] = member.read(limit + 1)
            except (OSError, zipfile.BadZipFile) as error:
                raise Refused(f"'{name}' ({student}): '{file}' cannot be read ({error}): not collected") from None
            if len(files[file]) > limit:
                raise Refused(f"'{name}' ({student}): '{file}' is larger than it says: not collected")
        return files


def _written(data: bytes) -> datetime | None:
    """The time in a hand-in's timestamp.txt, if it is one nbgrader reads."""
    try:
        text = data[:1024].decode("utf-8").strip()
        return parse_utc(text) if text else None
    except (ValueError, OverflowError):
        return None


def _latest(handins: list[HandIn]) -> tuple[HandIn, list[tuple[HandIn, str]]]:
    """Of one student's hand-ins, the one to keep, and why each other is not kept: the later
    by the LMS's upload time where one has it (a hand-in without it then cannot show that it
    is later), else by the students' own time; one without any time comes last."""
    timed = [h for h in handins if h.uploaded] or handins
    chosen = max(timed, key=lambda h: (h.time is not None, h.time or datetime.min))
    dropped = []
    for handin in handins:
        if handin is chosen:
            continue
        if handin not in timed:
            why = f"the LMS gives no upload time for it, and it does for '{chosen.download}'"
        else:
            whose = "the LMS's upload time" if chosen.uploaded else "the time the student's machine wrote"
            why = (f"'{chosen.download}' is later ({whose}: {_text(chosen.time) or 'none'} against "
                   f"{_text(handin.time) or 'none'})")
        dropped.append((handin, f"{handin.student}: '{handin.download}' not collected: {why}"))
    return chosen, dropped


def _write(folder: Path, handin: HandIn) -> None:
    """The hand-in's files, with the timestamp.txt of the time it was given."""
    folder.mkdir(parents=True)
    for name, data in handin.files.items():
        if name != TIMESTAMP:
            (folder / name).write_bytes(data)
    if handin.time is not None:
        (folder / TIMESTAMP).write_text(_text(handin.time))


def _append(path: Path, rows: list[dict[str, str]]) -> None:
    """Add `rows` to the record (each row once), keeping what earlier runs wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = read_record(path)
    kept += [row for row in rows if row not in kept]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, RECORD_FIELDS)
        writer.writeheader()
        writer.writerows(kept)


class HandInCollector(FileNameCollectorPlugin):  # type: ignore[misc]  # (nbgrader is untyped)
    """The files HandInExtractor wrote to extracted/STUDENT/ASSIGNMENT/, as they are: the
    student is the folder it named for the uploader, timestamp.txt the time it decided on."""

    def collect(self, submitted_file: str) -> dict[str, Any] | None:
        if not isinstance(getattr(self.parent, "extractor_plugin_inst", None), HandInExtractor):
            self.parent.fail("HandInCollector collects what HandInExtractor extracts: set "
                             "c.ZipCollectApp.extractor_plugin = 'autograder.grader.handins.HandInExtractor'")
        folder, file = os.path.split(submitted_file)
        folder, _ = os.path.split(folder)
        return {"student_id": os.path.basename(folder), "file_id": file}
