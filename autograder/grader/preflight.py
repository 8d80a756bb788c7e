"""Before any worker starts: the options, the course and its gradebook are checked, and the
course is taken for this run — one grader per course at a time.

Each problem is one line that says what to do, and nothing has been written when it is
found. The checks read only the course's configuration and folders (nbgrader itself loads
later, while the workers warm up), so they take well under a second. Exit codes of
`autograder grade`: 0 graded (flagged submissions included), 2 a wrong invocation or a
course that is not ready, 3 the course is being graded by another run, 4 grading stopped
or could not save everything (an operational failure: what was saved stays saved, and
running again finishes the rest).
"""
from __future__ import annotations

import fcntl
import getpass
import hashlib
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from .records import Options

USAGE, BUSY, FAILED = 2, 3, 4  # exit codes (0: graded)
STATE = ".autograder"  # the engine's own folder in the course root: the lock, the staging area
SHOWN = 12  # names listed in a message, at most


class GradingError(Exception):
    """Grading cannot start or go on; the message says what to do, `code` is the exit code."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


def load_config(options: Options) -> Config:
    """The course's nbgrader_config.py, as `nbgrader` run from the course root would read it."""
    config = Config()
    if (options.root / "nbgrader_config.py").exists():
        config = PyFileConfigLoader("nbgrader_config.py", path=str(options.root)).load_config()
    config.CourseDirectory.root = str(options.root)
    if options.db_url:
        config.CourseDirectory.db_url = options.db_url
    return config


def folder(config: Config, name: str, default: str) -> Path:
    """One of the course's folders (`name`: a CourseDirectory setting, e.g. submitted_directory)."""
    found: Path = Path(config.CourseDirectory.root) / config.CourseDirectory.get(name, default)
    return found


def _names(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".ipynb")) \
        if folder.is_dir() else []


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "") if names else "none"


def check(options: Options, scheduler: str | None = None) -> Config:
    """The course's configuration, once the options, the course and its gradebook make sense
    (and, with `scheduler`, Dask's client is installed: the scheduler is reached later)."""
    for name, value, least in (("--timeout", options.limits.timeout, 0), ("--memory", options.limits.memory, 0),
                               ("--jobs", options.jobs, 0)):
        if not value > least:
            raise GradingError(f"{name} must be positive (got {value:g})")
    root = options.root
    if not root.is_dir():
        raise GradingError(f"the course folder {root} does not exist")
    config = load_config(options)
    submitted = folder(config, "submitted_directory", "submitted")
    if not (root / "nbgrader_config.py").exists() and not submitted.is_dir():
        raise GradingError(f"{root} is not an nbgrader course root: it has neither nbgrader_config.py nor "
                           "submitted/ (run this in the course root, or pass --course)")
    if not submitted.is_dir():
        raise GradingError(f"there are no submissions yet: collect them into {submitted}/STUDENT/ASSIGNMENT "
                           "(`nbgrader collect`, or `nbgrader zip_collect` for an LMS download)")
    students = sorted(e.name for e in os.scandir(submitted))
    known = sorted(set(_names(folder(config, "source_directory", "source")))
                   | set(_names(folder(config, "release_directory", "release"))))
    for assignment in options.assignments:
        if assignment not in known:
            raise GradingError(f"there is no assignment '{assignment}' in this course; it has: {_listed(known)}")
    for student in options.students:
        if student not in students:
            raise GradingError(f"no submissions from '{student}' in {submitted}; students who handed in: "
                               f"{_listed(students)}")
    _check_gradebook(config)
    if scheduler is not None:
        if not scheduler.strip():
            raise GradingError("--scheduler needs the address of a Dask scheduler, e.g. tcp://HOST:8786")
        if importlib.util.find_spec("distributed") is None:
            raise GradingError("--scheduler needs Dask's `distributed`, which is not installed here: install the "
                               "grader's environment (`make`, or `pip install -c constraints.txt -e '.[lab,grading]'`)")
    return config


def _check_gradebook(config: Config) -> None:
    url = config.CourseDirectory.get("db_url") or f"sqlite:///{Path(config.CourseDirectory.root) / 'gradebook.db'}"
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except (ArgumentError, ValueError) as error:
        raise GradingError(f"--db {url!r} is not a database URL SQLAlchemy understands ({error})") from None
    except ImportError as error:
        raise GradingError(f"no SQLAlchemy dialect for {parsed.drivername!r} ({error})") from None
    try:
        dialect.import_dbapi()
    except ImportError as error:
        if parsed.get_backend_name() == "postgresql" and error.name == "psycopg2":
            raise GradingError(f"{parsed.drivername}:// means the psycopg2 driver, which is not installed: write "
                               f"postgresql+psycopg://... to use psycopg 3, which the grader installs (in "
                               f"nbgrader_config.py too, for formgrader and `nbgrader export`)") from None
        raise GradingError(f"the database driver '{error.name}' that {parsed.drivername}:// needs is not installed "
                           f"here: install it in the grader's environment (`pip install {error.name}`)") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        raise GradingError(f"there is no gradebook yet ({parsed.database}): release the assignments first "
                           "(`autograder release`, or `nbgrader generate_assignment ASSIGNMENT`)")


class DatabaseLock:
    """One grader per course in a gradebook on a database server, which graders in other
    course folders (other machines) may share: a PostgreSQL advisory lock named after the
    course id, held by one connection for the whole run. The server lets go when that
    connection ends, however the run ends. (SQLite's gradebook lives in the course folder,
    which `Lock` takes.)"""

    NAME = "autograder grade"  # the holder's application_name starts with it (pg_stat_activity)

    @classmethod
    def take(cls, config: Config) -> "DatabaseLock | None":
        url = config.CourseDirectory.get("db_url") or ""
        return cls(url, config.CourseDirectory.get("course_id") or "") if url.startswith("postgresql") else None

    def __init__(self, url: str, course_id: str) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.pool import NullPool

        key = int.from_bytes(hashlib.sha256(f"autograder grade\0{course_id}".encode()).digest()[:8], "big", signed=True)
        me = f"{self.NAME} {getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"[:63]
        self.engine = create_engine(url, poolclass=NullPool, connect_args={"application_name": me})
        try:
            self.connection = self.engine.connect()
            self.connection.execution_options(isolation_level="AUTOCOMMIT")
            taken = self.connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar()
            holder = None if taken else self.connection.execute(text(
                "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                "AND l.classid::bigint = (:key >> 32) & 4294967295 AND l.objid::bigint = :key & 4294967295"),
                {"key": key}).first()
        except SQLAlchemyError as error:
            self.engine.dispose()
            first = str(error).strip().splitlines()[0][:200]
            raise GradingError(f"the gradebook's database could not be reached ({first}): start the server or "
                               "correct --db / CourseDirectory.db_url", FAILED) from None
        if not taken:
            self.release()
            since = f", since {holder.backend_start:%Y-%m-%d %H:%M:%S}" if holder and holder.backend_start else ""
            who = f"`{holder.application_name}`{since}" if holder else "by another `autograder grade`"
            raise GradingError(f"this course is being graded already in its gradebook's database ({who}); wait for "
                               "that run to end, or stop it (what it saved stays saved) and run again", BUSY)

    def release(self) -> None:
        self.connection.close()  # ends the session: the server lets go of the lock
        self.engine.dispose()


class Lock:
    """The course, taken by this run; the kernel lets go when the process ends, however it ends."""

    def __init__(self, root: Path) -> None:
        folder = root / STATE
        try:
            folder.mkdir(exist_ok=True)
            self.fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise GradingError(f"cannot write in the course folder {root} ({error.strerror}): grading needs to write "
                               "the gradebook and autograded/ there; run it where you may write", FAILED) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self.fd)
            raise GradingError(
                f"this course is being graded already ({holder}); wait for that run to end, or stop it "
                "(what it saved stays saved) and run again", BUSY) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "user": getpass.getuser(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv),
        }).encode())

    def _holder(self) -> str:
        try:
            found = json.loads(os.pread(self.fd, 4096, 0) or b"{}")
            return (f"`{found['command']}`, pid {found['pid']} on {found['host']}, by {found['user']}, "
                    f"since {found['since']}")
        except (OSError, ValueError, KeyError, TypeError):
            return "by another `autograder grade`"

    def release(self) -> None:
        os.close(self.fd)
