"""What the ``trioq`` command shows a person: its logging on stderr, and failures as one line.

A command that fails for a reason the user can act on (a port in use, a WAL
directory another process holds, a missing extra, a server that refuses the
token) prints ``trioq <command>: <what happened and what to do>`` on stderr
and exits with status 1; bad arguments exit with 2 (argparse's usage errors).
Anything else is a bug in trioq and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from .._model import TrioqError
from .._runtime.exits import leaves

__all__ = ["LEVELS", "CommandError", "JSONFormatter", "bind_error", "logging_to_stderr", "one_line"]

#: The text log line: ``2026-01-02 03:04:05,678 WARNING trioq: job ... failed ...``.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: ``--log-level`` choices, quietest last.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: The extra that brings each module a command may miss (its top-level name).
_EXTRAS = {
    "quart": "http",
    "quart_trio": "http",
    "hypercorn": "http",
    "prometheus_client": "http",
    "werkzeug": "http",
    "httpx": "http",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
}

#: The attributes every ``LogRecord`` has: the rest were passed as ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class CommandError(Exception):
    """A failure the user can act on: its message is the whole report (one line, saying what to do)."""


def one_line(exc: BaseException) -> str | None:
    """The line that reports ``exc``, which ended a command, or ``None`` if it is a bug (keep the traceback).

    ``exc`` may be an ``ExceptionGroup`` from a nursery: one known error
    inside it (``trio.Cancelled`` aside) is reported as if raised alone.
    """
    found = leaves(exc)
    if len(found) != 1:
        return None
    (leaf,) = found
    if isinstance(leaf, CommandError | TrioqError):
        return " ".join(str(leaf).split())
    if isinstance(leaf, ModuleNotFoundError) and leaf.name is not None:
        module = leaf.name.partition(".")[0]
        extra = _EXTRAS.get(module)
        if extra is not None:
            return f"this command needs the {extra} extra (module {module} is missing): pip install 'trioq[{extra}]'"
    if _from(leaf, "psycopg", "Error"):  # psycopg.OperationalError and kin
        return f"PostgreSQL: {' '.join(str(leaf).split())} (check the DSN, and that the database is up)"
    if _from(leaf, "httpx", "TransportError"):  # a server that went away in the middle of a command
        reason = " ".join(str(leaf).split()) or type(leaf).__name__
        return f"lost the connection to the server ({reason})"
    return None


def _from(exc: BaseException, package: str, base: str) -> bool:
    """Whether ``exc`` is an instance of ``package``'s class ``base`` (looked up without importing it)."""
    return any(cls.__name__ == base and cls.__module__.partition(".")[0] == package for cls in type(exc).__mro__)


def bind_error(exc: OSError, host: str, port: int) -> CommandError:
    """The report of a failure to listen on ``host:port``."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return CommandError(f"{where} is in use (another trioq serve?): stop that process or give another --port")
    if exc.errno == errno.EACCES:
        return CommandError(f"not allowed to listen on {where}: give a --port above 1023")
    reason = exc.strerror or str(exc)
    return CommandError(f"cannot listen on {where}: {reason}; check --host and --port")


class JSONFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, then
    every field passed as ``extra`` (``job_id``, ``task``, ``attempt``... see docs/logging.md) and
    ``traceback`` when the record carries one. Values JSON cannot hold are given as text."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                line.setdefault(name, value)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["traceback"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str, ensure_ascii=False)


@contextlib.contextmanager
def logging_to_stderr(level: str, *, as_json: bool, stream: TextIO | None = None) -> Iterator[logging.Handler]:
    """While inside, the process's logging (trioq's, hypercorn's, the app's own) goes to ``stream``
    (default: stderr) at ``level`` and above, as text or as JSON lines; yields the handler it adds to
    the root logger. Leaving puts the root logger's level back and takes the handler away.

    hypercorn's ``INFO`` lines ("Running on ...") repeat the startup banner and are left out
    above ``DEBUG``.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JSONFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    root, hypercorn = logging.getLogger(), logging.getLogger("hypercorn.error")
    levels = root.level, hypercorn.level
    root.addHandler(handler)
    root.setLevel(level)
    hypercorn.setLevel(level if level == "DEBUG" else "WARNING")
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        hypercorn.setLevel(levels[1])
