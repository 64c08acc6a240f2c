"""A throwaway PostgreSQL cluster for one test session.

:func:`start_cluster` runs ``initdb`` into a fresh temporary directory (in
``/dev/shm`` when asked and there is room) and starts a server on 127.0.0.1 and
a free port, or, when ``TRIOQ_PG_DSN`` is set, wraps that server instead. It
returns ``None`` when neither is available, so the caller decides whether that
is a skip or a failure.

A started cluster is stopped, and its directory removed, by :meth:`Cluster.stop`,
which the session fixture calls; an ``atexit`` hook calls it too (an interrupted
session), and a small watchdog process stops the server if this process dies
without running either (SIGKILL, SIGTERM).

As root (``initdb`` and ``pg_ctl`` refuse to run as root) the binaries run as
the ``postgres`` user through ``runuser``, over a data directory it owns.

psycopg is imported only when needed, so importing this module (conftest.py
does) works without it.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, NoReturn

DSN_ENV = "TRIOQ_PG_DSN"

# A test cluster: no flushing to disk (its data is thrown away, and only the server
# process is ever crashed, never the machine), room for many connections. Not
# synchronous_commit=off: a commit must reach the kernel before it is acknowledged,
# or restart("immediate") (a server crash) loses acknowledged transactions.
SERVER_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "128MB",
}

START_TIMEOUT = 30  # seconds pg_ctl waits for the server to come up (or go down)
INITDB_TIMEOUT = 120
START_ATTEMPTS = 3  # a free port can be taken between finding it and binding it
LOG_TAIL_LINES = 40
# in_memory=True: the data directory goes under this directory (tmpfs on Linux) when it and
# the machine's available memory both have this much room (the PostgreSQL-heavy third of a
# session, its conformance cases and listing tests, left 350 MB of data here).
# A session creates a database per test and a schema per conformance case, tens of
# thousands of small files; on tmpfs creating and removing them costs no disk I/O.
MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_MIN_FREE = 4 << 30

# Runs in its own session (Ctrl-C does not reach it). It blocks on a pipe from
# the test process; end of file means that process is gone, so stop the server
# and remove its directory. Cluster.stop() kills it first when shutting down normally.
_WATCHDOG = """\
import json, shutil, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()
try:
    subprocess.run(json.loads(sys.argv[1]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60, check=False)
finally:
    shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


def find_bindir() -> Path | None:
    """The newest Debian-style ``/usr/lib/postgresql/N/bin``, else the one holding ``pg_ctl`` on PATH."""

    def version(bindir: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))

    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").is_file()]
    if candidates:
        return max(candidates, key=version)
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no server log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _traversable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _available_memory() -> int:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _memory_dir_usable() -> bool:
    """Whether :data:`MEMORY_DIR` exists, is writable and reachable by the postgres user, and it
    and the available memory both have :data:`MEMORY_DIR_MIN_FREE` free (a tmpfs larger than a
    container's memory limit would otherwise pass)."""
    try:
        room = os.statvfs(MEMORY_DIR)
    except OSError:
        return False
    return (
        os.access(MEMORY_DIR, os.W_OK | os.X_OK)
        and _traversable_by_others(MEMORY_DIR)
        and room.f_bavail * room.f_frsize >= MEMORY_DIR_MIN_FREE
        and _available_memory() >= MEMORY_DIR_MIN_FREE
    )


class ExternalCluster:
    """A server named by ``TRIOQ_PG_DSN``: not ours to stop or restart."""

    can_restart = False

    def __init__(self, dsn: str) -> None:
        from psycopg.conninfo import conninfo_to_dict

        self.dsn = dsn
        port = conninfo_to_dict(dsn).get("port")
        self.port: int | None = int(port) if port else None
        self.datadir: Path | None = None
        self.bindir: Path | None = None

    def stop(self) -> None:
        """Nothing to do: the server outlives the session."""

    def restart(self, mode: str = "fast") -> None:
        raise RuntimeError(f"cannot restart an external PostgreSQL server ({DSN_ENV} is set)")

    def create_database(self, name: str) -> str:
        from psycopg.conninfo import make_conninfo

        _create_database(self.dsn, name)
        return make_conninfo(self.dsn, dbname=name)


class Cluster:
    """A PostgreSQL server this process started, over its own temporary data directory."""

    can_restart = True

    def __init__(self, bindir: Path, *, in_memory: bool = False) -> None:
        self.bindir = bindir
        self._as_root = os.geteuid() == 0
        parent: str | None = None
        if in_memory and _memory_dir_usable():
            parent = str(MEMORY_DIR)
        elif self._as_root and not _traversable_by_others(Path(tempfile.gettempdir())):
            parent = "/tmp"  # the postgres user must be able to reach the data directory
        self._tmpdir = Path(tempfile.mkdtemp(prefix="trioq-pg-", dir=parent))
        self._tmpdir.chmod(0o755)
        self.datadir = self._tmpdir / "data"
        self.logfile = self.datadir / "server.log"
        self.port = free_port()
        self._running = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._closed = False
        self.startup_seconds: float | None = None  # initdb + start, set by start_cluster()

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    # -- running the binaries ---------------------------------------------------

    def _command(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        if self._as_root:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def _run(self, program: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        # cwd: the postgres user must be able to stand in the working directory.
        return subprocess.run(
            self._command(program, *args),
            cwd=self._tmpdir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _server_options(self) -> str:
        settings = {"listen_addresses": "127.0.0.1", "port": str(self.port), **SERVER_SETTINGS}
        options = " ".join(f"-c {key}={value}" for key, value in settings.items())
        return f"{options} -k {self.datadir}"

    def _pg_ctl(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run(
            "pg_ctl", action, "-D", str(self.datadir), "-w", "-t", str(START_TIMEOUT), *args, timeout=START_TIMEOUT + 30
        )

    def _fail(self, what: str, proc: subprocess.CompletedProcess[str] | None = None) -> RuntimeError:
        output = f"\n{proc.stdout}{proc.stderr}".rstrip() if proc is not None else ""
        return RuntimeError(
            f"{what} (port {self.port}, data directory {self.datadir}){output}\n"
            f"--- tail of {self.logfile} ---\n{_tail(self.logfile)}"
        )

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """initdb, then start the server; raise RuntimeError (with the server log) if either fails."""
        atexit.register(self.stop)
        self.datadir.mkdir(mode=0o700)
        if self._as_root:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, and there is no 'postgres' user to run PostgreSQL as") from None
            os.chown(self.datadir, user.pw_uid, user.pw_gid)
        try:
            proc = self._run(
                "initdb",
                "-D",
                str(self.datadir),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                timeout=INITDB_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise self._fail(f"initdb did not finish in {INITDB_TIMEOUT} s") from None
        if proc.returncode != 0:
            raise self._fail(f"initdb failed with exit status {proc.returncode}", proc)
        self._start_watchdog()
        for attempt in range(START_ATTEMPTS):
            try:
                proc = self._pg_ctl("start", "-l", str(self.logfile), "-o", self._server_options())
            except subprocess.TimeoutExpired:
                self._running = True  # it may be up: let stop() try
                raise self._fail(f"pg_ctl start did not return in {START_TIMEOUT + 30} s") from None
            if proc.returncode == 0:
                self._running = True
                return
            if attempt + 1 < START_ATTEMPTS and "could not bind" in _tail(self.logfile):
                self.port = free_port()
                continue
            self._running = True  # pg_ctl may have given up on a server still starting
            raise self._fail(f"pg_ctl start failed with exit status {proc.returncode}", proc)

    def _start_watchdog(self) -> None:
        stop = self._command("pg_ctl", "stop", "-D", str(self.datadir), "-m", "immediate", "-w")
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, json.dumps(stop), str(self._tmpdir)],
            cwd=self._tmpdir,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``mode``: smart, fast or immediate) on the same port, with the same options."""
        if self._closed:
            raise RuntimeError("the cluster has been stopped")
        try:
            proc = self._pg_ctl("restart", "-m", mode, "-l", str(self.logfile), "-o", self._server_options())
        except subprocess.TimeoutExpired:
            raise self._fail(f"pg_ctl restart -m {mode} did not return in {START_TIMEOUT + 30} s") from None
        if proc.returncode != 0:
            raise self._fail(f"pg_ctl restart -m {mode} failed with exit status {proc.returncode}", proc)

    def stop(self) -> None:
        """Stop the server and remove its directory. Safe to call again. ``immediate``: its data is
        thrown away, so the shutdown checkpoint a ``fast`` stop writes (tens of seconds on a loaded
        machine after a whole test session) buys nothing."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.stop)
        try:
            if self._running:
                for mode in ("immediate", "fast"):
                    try:
                        if self._pg_ctl("stop", "-m", mode).returncode == 0:
                            break
                    except subprocess.TimeoutExpired:
                        pass
                self._running = False
        finally:
            if self._watchdog is not None:
                self._watchdog.kill()
                self._watchdog.wait()
                stdin: IO[bytes] | None = self._watchdog.stdin
                if stdin is not None:
                    stdin.close()
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def create_database(self, name: str) -> str:
        _create_database(self.dsn, name)
        return self.dsn_for(name)


def _create_database(dsn: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        # PostgreSQL 15+: a file copy of the small template is about twice as fast as the default
        # (WAL_LOG, which logs every block of it): 18 against 35 ms per test database here.
        strategy = " STRATEGY = FILE_COPY" if conn.info.server_version >= 150000 else ""
        conn.execute(sql.SQL("CREATE DATABASE {}" + strategy).format(sql.Identifier(name)))


def no_postgres(why: str) -> NoReturn:
    """A test that needs PostgreSQL and cannot have it: a failure under ``CI`` (a missing service must
    never pass unseen there), a skip elsewhere."""
    import pytest  # only the tests call this; the benchmarks import this module without pytest

    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required under CI: {why}")
    pytest.skip(why)


def start_cluster(*, in_memory: bool = False) -> Cluster | ExternalCluster | None:
    """The session's server: ``TRIOQ_PG_DSN``'s, else a new local cluster, else None (no binaries).

    ``in_memory``: put a new cluster's data directory on tmpfs (:data:`MEMORY_DIR`) when it is
    there with room, else in the usual temporary directory. The test session asks for it; the
    benchmarks do not, so their figures stay measured on disk as before."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        return ExternalCluster(dsn)
    bindir = find_bindir()
    if bindir is None:
        return None
    cluster = Cluster(bindir, in_memory=in_memory)
    started = time.monotonic()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    cluster.startup_seconds = time.monotonic() - started
    return cluster
