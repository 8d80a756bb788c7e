"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` package (the Makefile
installs it with the test tools), a fresh cluster in a temporary directory, listening on a
Unix socket in that directory only (no TCP at all), stopped and removed afterwards.

Debian keeps the server's programs out of PATH (/usr/lib/postgresql/VERSION/bin); they are
found there, through `pg_config --bindir`, or on PATH. The server refuses to run as root:
as root it runs as the `postgres` user the package creates (else `nobody`).
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

INSTALL_HINT = "install Debian's PostgreSQL server (`make test-tools`, or `apt-get install postgresql`)"


def binaries() -> Path | None:
    """The folder with initdb and pg_ctl, or None."""
    found = [shutil.which("initdb")]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                    timeout=10).stdout.strip()
                     + "/initdb")
    found += sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]), reverse=True)
    for initdb in found:
        if initdb and os.access(initdb, os.X_OK):
            folder = Path(os.path.realpath(initdb)).parent  # past a symlink on PATH, to the server's own folder
            if all(os.access(folder / name, os.X_OK) for name in ("pg_ctl", "postgres", "createdb")):
                return folder
    return None


@contextlib.contextmanager
def server(database: str = "gradebook") -> Iterator[str]:
    """A running server with an empty `database`; yields its SQLAlchemy URL (psycopg 3,
    through the Unix socket: postgresql+psycopg://postgres@/DATABASE?host=SOCKET_DIR)."""
    bindir = binaries()
    if bindir is None:
        raise RuntimeError(f"no PostgreSQL server programs (initdb, pg_ctl) here: {INSTALL_HINT}")
    base = Path(tempfile.mkdtemp(prefix="autograder-pg-"))
    data, socket_dir = base / "data", base / "socket"
    socket_dir.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse root
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            account = pwd.getpwnam("nobody")
        os.chown(base, account.pw_uid, account.pw_gid)
        os.chown(socket_dir, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", account.pw_name, "--"]
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    log = base / "server.log"

    def run(*command: str) -> None:
        subprocess.run([*as_user, *command], check=True, capture_output=True, text=True, env=env, timeout=120,
                       cwd=base)

    started = False
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        # No TCP listener at all; a small server (a test makes a few connections).
        options = (f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}' -c fsync=off "
                   "-c max_connections=40 -c shared_buffers=16MB")
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
        started = True
        run(str(bindir / "createdb"), "-h", str(socket_dir), "-U", "postgres", database)
        yield f"postgresql+psycopg://postgres@/{database}?host={socket_dir}"
    except subprocess.CalledProcessError as error:
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {error.stderr or error.stdout}{tail}") from None
    finally:
        if started:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop")
        shutil.rmtree(base, ignore_errors=True)
