"""``trioq jobs list|show|retry|cancel``: find and act on jobs, from a shell.

Where the jobs are (one of):

- ``--url URL`` (``--token`` or ``TRIOQ_TOKEN``): a running ``trioq serve``, through
  :class:`trioq.client.AsyncClient`;
- ``--postgres DSN`` (``--schema``): the queue's database, through a producer-only queue (no
  workers, no migration: a schema that is missing or older is an error naming ``trioq pg
  migrate``);
- ``--wal DIR``: a WAL directory. ``list`` and ``show`` replay it read-only (as ``trioq wal
  inspect``, so a queue may have it open meanwhile: they see its last commit); ``retry`` and
  ``cancel`` open it, which a running queue's lock refuses (act through its ``--url`` then).

``list`` prints a table (``--json``: a JSON list of jobs, as the HTTP API gives them); ``show`` one
job, its errors and tracebacks included; ``retry`` and ``cancel`` act on the ids given, or else on
every job the filters take (``retry_many``/``cancel_many``: the newest ``--limit`` of them); with
neither, they need ``--all`` (an empty list of ids is never "every job"). A
failure is one line on stderr and exit status 1 (2 for bad arguments), never a traceback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TextIO

import trio

from .._model import InvalidJob, Job, JobNotFound, TrioqError

__all__ = ["add_parser", "jobs_command"]

STATES = ("scheduled", "ready", "running", "succeeded", "dead", "cancelled", "deferred", "waiting")


class _Jobs(Protocol):
    """What the commands need of where the jobs are: the Queue's calls (a Queue, a client)."""

    async def list(self, state: Any = ..., task: Any = ..., queue: Any = ..., tenant: Any = ..., limit: int = ...,
                   after_id: Any = ...) -> list[Job]: ...  # fmt: skip
    async def get(self, job_id: str) -> Job: ...
    async def retry(self, job_id: str) -> Job: ...
    async def cancel(self, job_id: str) -> Job: ...
    async def retry_many(self, state: Any = ..., task: Any = ..., queue: Any = ..., tenant: Any = ...,
                         limit: int = ...) -> int: ...  # fmt: skip
    async def cancel_many(self, state: Any = ..., task: Any = ..., queue: Any = ..., tenant: Any = ...,
                          limit: int = ...) -> int: ...  # fmt: skip


def add_parser(commands: Any) -> None:
    """Add ``jobs`` and its four commands to the ``trioq`` command's subparsers."""
    jobs = commands.add_parser("jobs", help="list, show, retry or cancel jobs (of a server, a WAL or PostgreSQL)")
    actions = jobs.add_subparsers(dest="jobs_command", required=True)
    for name, text in (
        ("list", "a page of jobs, newest first, by state, task, queue and tenant"),
        ("show", "one job: payload, result, every kept error with its traceback"),
        ("retry", "run dead or cancelled jobs again (the ids given, else those the filters take)"),
        ("cancel", "cancel unfinished jobs (the ids given, else those the filters take)"),
    ):
        command = actions.add_parser(name, help=text, description=text)
        where = command.add_mutually_exclusive_group(required=True)
        where.add_argument("--url", help="a running trioq serve, e.g. http://127.0.0.1:8000")
        where.add_argument("--wal", metavar="DIR", help="a WAL directory")
        where.add_argument("--postgres", metavar="DSN", help="a PostgreSQL queue's database")
        command.add_argument("--token", help="with --url: the server's bearer token (default: TRIOQ_TOKEN, if set)")
        command.add_argument("--schema", default="trioq", help="with --postgres: the queue's schema (default trioq)")
        command.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "show":
            command.add_argument("id", help="the job's id")
            continue
        if name in ("retry", "cancel"):
            command.add_argument("ids", nargs="*", metavar="ID", help="the jobs to act on (else: the filters')")
            command.add_argument(
                "--all",
                action="store_true",
                help="with no id and no filter: act on every job it can take (the newest --limit)",
            )
        command.add_argument("--state", choices=STATES, help="only jobs in this state (default: any)")
        command.add_argument("--task", help="only jobs of this task")
        command.add_argument("--queue", help="only jobs of this named queue")
        command.add_argument("--tenant", help="only jobs of this tenant")
        if name == "list":
            command.add_argument("--limit", type=int, default=20, help="jobs per page, 1 to 1000 (default 20)")
            command.add_argument("--after", metavar="ID", help="the page after this job (the last one listed)")
        else:
            command.add_argument("--limit", type=int, default=1000, help="act on at most this many (default 1000)")


def jobs_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``trioq jobs ...``, printing on ``out`` (default: ``sys.stdout`` at the call); the exit status (a
    failure raises ``SystemExit`` with a one-line message)."""
    out = sys.stdout if out is None else out
    try:
        if args.jobs_command in ("retry", "cancel"):
            _check_targets(args)
        if args.wal is not None and not os.path.isdir(args.wal):
            raise TrioqError(f"no WAL directory at {args.wal}")
        if args.postgres is not None:
            _check_postgres(args.postgres, args.schema)
        view = _WALView(args.wal) if args.wal is not None and args.jobs_command in ("list", "show") else None
        return trio.run(_run, args, out, view)
    except TrioqError as exc:
        raise SystemExit(f"trioq jobs {args.jobs_command}: {exc}") from None


def _check_targets(args: argparse.Namespace) -> None:
    """That ``retry`` or ``cancel`` names its jobs one way: ids, filters, or ``--all``."""
    filtered = any(value is not None for value in (args.state, args.task, args.queue, args.tenant))
    if args.ids and filtered:
        raise TrioqError("give job ids or filters (--state, --task, --queue, --tenant), not both")
    if args.ids and args.all:
        raise TrioqError("give job ids or --all, not both")
    if not args.ids and not filtered and not args.all:
        # An empty list of ids ("trioq jobs cancel $IDS" with nothing in $IDS) must not mean every job.
        raise TrioqError("give job ids, a filter (--state, --task, --queue, --tenant), or --all for every job")


async def _run(args: argparse.Namespace, out: TextIO, view: _WALView | None) -> int:
    command = _COMMANDS[args.jobs_command]
    if view is not None:
        return await command(view, args, out)
    async with _open(args) as opened:
        return await command(opened, args, out)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"state": args.state, "task": args.task, "queue": args.queue, "tenant": args.tenant, "limit": args.limit}


async def _list(jobs: _Jobs, args: argparse.Namespace, out: TextIO) -> int:
    page = await jobs.list(**_filters(args), after_id=args.after)
    if args.json:
        print(json.dumps([job.to_dict() for job in page], indent=2), file=out)
    else:
        _table(page, out)
        if len(page) == args.limit:
            print(f"more: --after {page[-1].id}", file=out)
    return 0


async def _show(jobs: _Jobs, args: argparse.Namespace, out: TextIO) -> int:
    job = await jobs.get(args.id)
    if args.json:
        print(json.dumps(job.to_dict(), indent=2), file=out)
        return 0
    fields = [
        ("id", job.id), ("task", job.task), ("state", job.state.value), ("queue", job.queue),
        ("tenant", job.tenant), ("attempts", f"{job.attempts} of {job.max_attempts}"), ("epoch", job.epoch),
        ("priority", job.priority), ("key", job.key), ("created", _when(job.created_at)),
        ("run at", _when(job.run_at)), ("finished", _when(job.finished_at)), ("deadline", _when(job.deadline)),
        ("limits", ", ".join(job.limits) or None), ("after", ", ".join(job.after) or None),
        ("payload", json.dumps(job.payload)), ("result", None if job.result is None else json.dumps(job.result)),
        ("error", job.error),
    ]  # fmt: skip
    for name, value in fields:
        if value is not None:
            print(f"{name:>9}: {_plain(str(value))}", file=out)
    for failed in job.errors:
        print(f"\nattempt {failed.attempt} failed {_when(failed.finished_at)}: {_plain(failed.error)}", file=out)
        if failed.traceback:
            print(_plain(failed.traceback.rstrip()), file=out)
    return 0


async def _act(jobs: _Jobs, args: argparse.Namespace, out: TextIO) -> int:
    retrying = args.jobs_command == "retry"
    if not args.ids:
        act_many = jobs.retry_many if retrying else jobs.cancel_many
        count = await act_many(**_filters(args))
        done = "retried" if retrying else "cancelled"
        print(json.dumps({"count": count}) if args.json else f"{done} {count} job(s)", file=out)
        return 0
    act: Callable[[str], Any] = jobs.retry if retrying else jobs.cancel
    # Each id on its own: one that cannot be acted on (unknown, or not dead for a retry) does not hide
    # what was done to the others, nor stop them.
    changed: list[Job] = []
    failed: list[str] = []
    for job_id in args.ids:
        try:
            changed.append(await act(job_id))
        except (InvalidJob, JobNotFound) as exc:
            failed.append(f"{job_id}: {exc}")
    if args.json:
        print(json.dumps([job.to_dict() for job in changed], indent=2), file=out)
    elif changed:
        _table(changed, out)
    if failed:
        done = "retried" if retrying else "cancelled"
        raise TrioqError(f"{len(failed)} of {len(args.ids)} job(s) not {done}: " + "; ".join(failed))
    return 0


_COMMANDS = {"list": _list, "show": _show, "retry": _act, "cancel": _act}


def _check_postgres(dsn: str, schema: str) -> None:
    """That the queue's database answers and its schema is the one this trioq reads, else a
    :class:`~trioq.TrioqError` saying what is wrong in one line (before any queue opens)."""
    import psycopg

    from ..stores.postgres._schema import SCHEMA_VERSION, check_schema_name, current_version

    try:
        schema = check_schema_name(schema)
    except ValueError as exc:
        raise TrioqError(str(exc)) from None
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn, conn.cursor() as cur:
            version = current_version(cur, schema)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrioqError(f"cannot use the database: {first}") from None
    if version != SCHEMA_VERSION:
        raise TrioqError(
            f"schema {schema!r} is at version {version}, this trioq reads version {SCHEMA_VERSION}: wrong"
            f" --schema, or run trioq pg migrate DSN --schema {schema}"
        )


@asynccontextmanager
async def _open(args: argparse.Namespace) -> AsyncIterator[_Jobs]:
    """The jobs of ``--url``, ``--postgres`` or ``--wal``, for as long as the block runs."""
    from .._registry import Registry
    from .._runtime.queue import open_queue
    from ..stores.wal import WALLocked, WALStore

    if args.url is not None:
        from .._client import AsyncClient

        token = args.token if args.token is not None else os.environ.get("TRIOQ_TOKEN")
        try:
            client = AsyncClient(args.url, token)
        except ValueError as exc:
            raise TrioqError(str(exc)) from None
        async with client:
            yield client
        return
    if args.postgres is not None:
        from ..stores.postgres import PostgresStore

        store: Any = PostgresStore(args.postgres, schema=args.schema, migrate=False)
    else:
        store = WALStore(args.wal)
    try:
        async with open_queue(Registry(), store=store, workers=0) as queue:
            yield queue
    except WALLocked:
        raise TrioqError(
            f"{args.wal} is open by a running queue (its lock is held): act through its server instead,"
            " trioq jobs ... --url URL"
        ) from None


class _WALView:
    """A WAL directory's jobs as of its last commit, replayed read-only (``list`` and ``show``)."""

    def __init__(self, directory: str) -> None:
        from ..stores.table.jobs import JobTable
        from ..stores.wal._format import WALCorruption
        from ..stores.wal._recovery import replay

        self.table = JobTable(max_retained=sys.maxsize)
        try:
            replay(directory, self.table, repair=False)
        except WALCorruption as exc:
            raise TrioqError(f"the log is damaged ({exc}): see trioq wal verify") from None

    async def list(self, state: Any = None, task: Any = None, queue: Any = None, tenant: Any = None,
                   limit: int = 20, after_id: Any = None) -> list[Job]:  # fmt: skip
        from .._runtime.listing import MAX_PAGE, job_filter, page_limit

        where = job_filter(state, task, queue, tenant)
        count = page_limit(limit, MAX_PAGE)
        return self.table.list_jobs(where.states, where.task, where.queue, where.tenant, count, after_id)

    async def get(self, job_id: str) -> Job:
        return self.table.get(job_id)

    async def retry(self, job_id: str) -> Job:
        raise AssertionError("a read-only view does not act")

    cancel = retry

    async def retry_many(self, state: Any = None, task: Any = None, queue: Any = None, tenant: Any = None,
                         limit: int = 1000) -> int:  # fmt: skip
        raise AssertionError("a read-only view does not act")

    cancel_many = retry_many


def _when(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")


#: Control characters but newline and tab (C0, DEL, C1): an error text may hold any, and printed as they
#: are they drive the terminal (ESC starts a sequence that recolours, moves, retitles...).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(text: str) -> str:
    """``text`` with its control characters (but newline and tab) shown as ``\\xNN`` escapes."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def _table(jobs: list[Job], out: TextIO) -> None:
    """``jobs`` as a table: rich's on a terminal (colours, widths), the same columns as plain text else.
    The jobs' own text goes in as :class:`rich.text.Text`, never read as rich markup (an error such as
    ``bad path [/tmp]`` is no closing tag), its control characters escaped (:func:`_plain`)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "TASK", "STATE", "QUEUE", "ATTEMPTS", "CREATED", "ERROR"):
        table.add_column(column, overflow="fold" if column == "ERROR" else "ellipsis", no_wrap=column != "ERROR")
    colours = {"dead": "red", "cancelled": "yellow", "succeeded": "green", "running": "cyan"}
    for job in jobs:
        state = job.state.value
        table.add_row(
            Text(_plain(job.id)),
            Text(_plain(job.task)),
            Text(state, style=colours.get(state, "")),
            Text(_plain(job.queue)),
            f"{job.attempts}/{job.max_attempts}",
            _when(job.created_at) or "",
            Text(_plain((job.error or "")[:120])),
        )
    Console(file=out, width=None if out.isatty() else 200).print(table)
    if not jobs:
        print("no jobs", file=out)
