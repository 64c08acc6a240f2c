"""The ``trioq`` command: ``serve``, ``worker``, ``loadgen``, ``demo``, ``jobs list|show|retry|cancel``,
``wal verify|inspect``, ``pg migrate`` and ``cron list``."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import trio

from .. import __version__
from .._runtime.exits import leaves
from .console import LEVELS, logging_to_stderr, one_line

__all__ = ["main"]


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, each option's default appended as ``(default: X)`` unless its help says it.

    Options whose default is ``None`` or ``False`` (a flag) say in their own words what happens
    without them; nothing is appended for those.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if not action.option_strings or action.required:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help shows defaults, whose errors are one line (not the usage, which
    runs to ten for ``serve``), and which answers a missing command with its whole help (``trioq``,
    ``trioq wal``...): usage, the commands with a line each, exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("metavar", "COMMAND")  # not the dest ("wal_command") in usage and errors
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        """One line on stderr, exit status 2; a missing command gets the whole help first."""
        if message.endswith("required: COMMAND"):
            self.print_help(sys.stderr)
            self.exit(2, f"\n{self.prog}: error: give a command\n")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(
    kind: Callable[[str], float], *, minimum: float = 0.0, above: bool = False, maximum: float | None = None
) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` (``int`` or ``float``) from ``minimum`` (``> minimum`` with
    ``above``) to ``maximum``, refused with a message that says what to give."""
    whole = kind is int
    what = "a whole number" if whole else "a number"
    bound = f"> {minimum:g}" if above else f">= {minimum:g}"
    if maximum is not None:
        bound = f"from {minimum:g} to {maximum:g}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"give {what} {bound}, got {text!r}") from None
        if (
            math.isnan(value)
            or value < minimum
            or (above and value == minimum)
            or (maximum is not None and value > maximum)
        ):
            raise argparse.ArgumentTypeError(f"give {what} {bound}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, minimum=1)
_port = _number(int, maximum=65535)
_seconds = _number(float)
_positive_seconds = _number(float, above=True)
_probability = _number(float, maximum=1.0)


def _workers(text: str) -> int | dict[str, int]:
    """``--workers``: ``N`` (one pool serving every queue), or ``NAME=N,NAME=N`` (a pool per named
    queue, the node claiming only those)."""
    if "=" not in text:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"give N or NAME=N,NAME=N, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
        return value
    split: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep or not name or name in split:
            raise argparse.ArgumentTypeError(f"give NAME=N,NAME=N with each queue once, got {text!r}")
        try:
            split[name] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={size}: the pool size must be an integer") from None
        if split[name] < 1:
            raise argparse.ArgumentTypeError(f"{name}={size}: a named queue's pool needs >= 1 worker")
    return split


def _url(text: str) -> str:
    """``--url``: an ``http://`` or ``https://`` URL with a host."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise argparse.ArgumentTypeError(f"give the server's URL with http:// or https://, e.g. http://{text}")
    return text


_APP = "your trioq.Registry as module:attribute, imported from the current directory"
_HEARTBEAT = (
    "the heartbeat timeout of tasks that set no heartbeat_timeout of their own: an attempt of such a task"
    " that goes S seconds without ctx.heartbeat() counts as hung and runs again at once, even within its"
    " task's timeout= (default: none; only each task's own timeout and heartbeat_timeout end its attempts)"
)


def _node_options(command: argparse.ArgumentParser) -> None:
    """The options ``serve`` and ``worker`` share: the registry, the pools, the attempts, the logs."""
    command.add_argument("--demo-tasks", action="store_true", help="with --app: add the demo tasks sim and cpu to it")
    command.add_argument(
        "--workers",
        type=_workers,
        default=16,
        metavar="N|NAME=N,...",
        help="N workers in one pool for every queue, or NAME=N,NAME=N for a pool per named queue (only those"
        " queues are claimed)",
    )
    command.add_argument("--heartbeat-timeout", type=_positive_seconds, default=None, metavar="S", help=_HEARTBEAT)
    command.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="on SIGTERM/SIGINT, seconds running attempts get to finish before they are cut off and put back",
    )
    command.add_argument(
        "--retention",
        type=_seconds,
        default=3600.0,
        metavar="S",
        help="seconds finished jobs are kept (to be looked up, and to hold their idempotency keys), then evicted",
    )
    command.add_argument(
        "--max-retained",
        type=_positive_int,
        default=100_000,
        metavar="N",
        help="at most N finished jobs are kept; past that the oldest are evicted first",
    )
    command.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        default="INFO",
        help="log records at this level and above go to stderr (DEBUG adds each attempt's start and success)",
    )
    command.add_argument(
        "--log-json", action="store_true", help="log JSON lines (with each record's job_id, task, attempt...)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trioq",
        description="A job runtime for trio applications. `trioq COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"trioq {__version__}", help="print the version")
    commands = parser.add_subparsers(dest="command", required=True)

    text = "serve a queue over HTTP (the queue and hypercorn in one process)"
    serve = commands.add_parser("serve", help=text, description=text)
    serve.add_argument(
        "--app", metavar="MOD:REGISTRY", help=f"{_APP} (default: none; serve the demo tasks sim and cpu alone)"
    )
    where = serve.add_argument_group("where jobs are kept (one of)")
    where.add_argument("--wal", default="./trioq-data", metavar="DIR", help="a write-ahead-log directory")
    where.add_argument("--memory", action="store_true", help="keep jobs in memory (lost when the process exits)")
    where.add_argument(
        "--postgres", metavar="DSN", help="a PostgreSQL database, whose queue `trioq worker`s share (default: none)"
    )
    serve.add_argument(
        "--fsync",
        choices=("always", "interval", "never"),
        default="always",
        help="with --wal: when a change reaches the disk (always: before it is acknowledged)",
    )
    serve.add_argument("--schema", default="trioq", help="with --postgres: the queue's schema")
    serve.add_argument(
        "--lease",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="with --postgres: seconds before a silent node is taken for dead and its jobs run elsewhere",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=_port, default=8000, help="the TCP port to listen on (0: any free one)")
    serve.add_argument(
        "--token",
        help="bearer token required by every route but health and /openapi.json (default: env TRIOQ_TOKEN;"
        " printable ASCII, no spaces; with neither set, no authentication)",
    )
    serve.add_argument(
        "--max-ready",
        type=_positive_int,
        default=None,
        metavar="N",
        help="at most N jobs ready or scheduled at once (default: no bound)",
    )
    serve.add_argument(
        "--overflow",
        choices=("refuse", "defer"),
        default="refuse",
        help="past --max-ready: refuse the enqueue (HTTP 503) or keep the job deferred until there is room",
    )
    _node_options(serve)
    serve.set_defaults(usage_error=serve.error)

    text = "run tasks from a PostgreSQL queue (a node without HTTP)"
    work = commands.add_parser("worker", help=text, description=text)
    work.add_argument("--postgres", required=True, metavar="DSN", help="the queue's PostgreSQL database")
    work.add_argument(
        "--app", metavar="MOD:REGISTRY", help=f"{_APP} (default: none; run the demo tasks sim and cpu alone)"
    )
    work.add_argument("--schema", default="trioq", help="the queue's PostgreSQL schema")
    work.add_argument(
        "--lease",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="seconds before a silent node is taken for dead and its jobs run elsewhere",
    )
    _node_options(work)
    work.set_defaults(usage_error=work.error)

    text = "drive a running trioq serve with simulated jobs (the demo task sim); print one JSON line"
    load = commands.add_parser("loadgen", help=text, description=text)
    load.add_argument("--url", required=True, type=_url, help="the server, e.g. http://127.0.0.1:8000")
    load.add_argument("--jobs", type=_positive_int, default=1000, metavar="N", help="how many jobs to submit")
    load.add_argument("--clients", type=_positive_int, default=8, metavar="N", help="concurrent HTTP clients")
    load.add_argument("--batch", type=_positive_int, default=1, metavar="N", help="jobs per request (POST /jobs/batch)")
    load.add_argument("--work-ms", type=_seconds, default=20.0, metavar="MS", help="milliseconds each job sleeps")
    load.add_argument("--fail-prob", type=_probability, default=0.0, metavar="P", help="chance an attempt fails")
    load.add_argument("--hang-prob", type=_probability, default=0.0, metavar="P", help="chance an attempt hangs")
    load.add_argument("--token", help="the server's bearer token (default: env TRIOQ_TOKEN; with neither, none)")
    load.add_argument(
        "--timeout", type=_positive_seconds, default=300.0, metavar="S", help="seconds to wait for the queue to drain"
    )
    load.set_defaults(usage_error=load.error)

    text = "serve, load with failures and hangs, kill -9, restart, check that nothing was lost"
    demo = commands.add_parser("demo", help=text, description=text)
    demo.add_argument("--jobs", type=_positive_int, default=2000, metavar="N", help="how many jobs to submit")

    text = "look at a WAL directory without opening a queue"
    wal = commands.add_parser("wal", help=text, description=text).add_subparsers(dest="wal_command", required=True)
    wal_dir = "the WAL directory (trioq serve's --wal)"
    text = "check every segment; exit 0 if the log replays cleanly"
    wal.add_parser("verify", help=text, description=text).add_argument("directory", help=wal_dir)
    text = "job counts per state, segments and sizes, last checkpoint"
    wal.add_parser("inspect", help=text, description=text).add_argument("directory", help=wal_dir)

    text = "PostgreSQL: schema upkeep"
    pg = commands.add_parser("pg", help=text, description=text).add_subparsers(dest="pg_command", required=True)
    text = "create or migrate the queue's schema (open_queue does it too)"
    migrate = pg.add_parser("migrate", help=text, description=text)
    migrate.add_argument("dsn", metavar="DSN", help="the PostgreSQL database, e.g. postgresql://user@host/db")
    migrate.add_argument("--schema", default="trioq", help="the queue's schema")
    migrate.add_argument(
        "--fairness",
        action="store_true",
        help="also build the index fair claims read (otherwise the first node opened with fairness does)",
    )
    text = "cron schedules"
    cron = commands.add_parser("cron", help=text, description=text).add_subparsers(dest="cron_command", required=True)
    text = "each cron schedule of a registry with its next run (and last tick)"
    listing = cron.add_parser("list", help=text, description=text)
    listing.add_argument("--app", required=True, metavar="MOD:REGISTRY", help="the trioq.Registry declaring them")
    marks = listing.add_mutually_exclusive_group()
    marks.add_argument("--postgres", metavar="DSN", help="read the last ticks from this PostgreSQL queue")
    marks.add_argument("--wal", metavar="DIR", help="read the last ticks from this WAL directory (read-only)")
    listing.add_argument("--schema", default="trioq", help="with --postgres: the queue's schema")
    listing.add_argument("--json", action="store_true", help="print a JSON list, as stats()['cron'] shows them")
    from .jobscli import add_parser as add_jobs

    add_jobs(commands)
    return parser


def _serve_token(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> str | None:
    """The bearer token of ``trioq serve``: ``--token``, else ``TRIOQ_TOKEN``, else ``None`` (no auth).

    A token that is given but empty, blank or not printable ASCII (see
    ``trioq.http._token_problem``) is an ``error`` (exit status 2, as for
    any bad argument), never "no authentication": ``--token "$TOKEN"`` with
    TOKEN unset, or ``TRIOQ_TOKEN=""``, must not serve an open API.
    """
    given: str | None = args.token
    if given is not None:
        source, token = "--token", given
    elif (from_env := os.environ.get("TRIOQ_TOKEN")) is not None:
        source, token = "TRIOQ_TOKEN", from_env
    else:
        return None
    from .http import _token_problem

    problem = _token_problem(token)
    if problem is not None:
        error(
            f"{source} {problem}. Give a real token (secrets.token_urlsafe() makes one) or, to serve"
            " without authentication, omit --token and unset TRIOQ_TOKEN"
        )
    return token


def _client_token(given: str | None, error: Callable[[str], NoReturn]) -> str | None:
    """The bearer token a client command sends: ``--token``, else ``TRIOQ_TOKEN``, else ``None``.

    An empty or blank one is an ``error`` (exit status 2), as for ``trioq serve``: it would be
    refused by the server, and sending none instead would hide the mistake.
    """
    source, token = ("--token", given) if given is not None else ("TRIOQ_TOKEN", os.environ.get("TRIOQ_TOKEN"))
    if token is None:
        return None
    if not token.strip():
        error(f"{source} is {'empty' if not token else 'only whitespace'}: give the token trioq serve was started with")
    return token


def main(argv: list[str] | None = None) -> int:
    """Run ``trioq`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad arguments, a bad token for ``serve`` included, exit with status 2 (a
    missing command prints the help first: bare ``trioq`` too). A failure the
    user can act on (see :func:`trioq._app.console.one_line`) raises
    ``SystemExit`` with one line, ``trioq COMMAND: what happened and what to
    do``: exit status 1, no traceback. Ctrl-C in a command that does not
    handle it (``loadgen``, ``demo``...) says "interrupted": exit status 130.
    """
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except BaseException as exc:
        found = leaves(exc)
        if len(found) == 1 and isinstance(found[0], KeyboardInterrupt):  # Ctrl-C (serve and worker drain instead)
            print(f"trioq {args.command}: interrupted", file=sys.stderr)
            return 130
        line = one_line(exc)
        if line is None:
            raise
        raise SystemExit(f"trioq {args.command}: {line}") from None


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        if args.postgres is not None and args.memory:
            args.usage_error("--postgres and --memory name two stores; give one")
        if args.overflow == "defer" and args.max_ready is None:
            args.usage_error("--overflow defer needs --max-ready N: the bound past which jobs are deferred")
        if args.demo_tasks and args.app is None:
            args.usage_error("--demo-tasks adds the demo tasks to --app's registry: give --app too")
        from . import http  # noqa: F401 - serve needs it: a missing extra fails here, before anything opens

        args.token = _serve_token(args, args.usage_error)
        from .serve import serve

        with logging_to_stderr(args.log_level, as_json=args.log_json):
            trio.run(serve, args)
        return 0
    if args.command == "loadgen":
        args.token = _client_token(args.token, args.usage_error)
        from .loadgen import main as loadgen_main

        return loadgen_main(args)
    if args.command == "worker":
        if args.demo_tasks and args.app is None:
            args.usage_error("--demo-tasks adds the demo tasks to --app's registry: give --app too")
        from .worker import worker

        with logging_to_stderr(args.log_level, as_json=args.log_json):
            trio.run(worker, args)
        return 0
    if args.command == "pg":
        from .pgcli import migrate_command

        return migrate_command(args.dsn, args.schema, fairness=args.fairness)
    if args.command == "cron":
        from .croncli import list_command

        return list_command(args.app, wal=args.wal, postgres=args.postgres, schema=args.schema, as_json=args.json)
    if args.command == "jobs":
        from .jobscli import jobs_command

        return jobs_command(args)
    if args.command == "demo":
        from .demo import demo

        return demo(args.jobs)
    from .walcli import inspect_command, verify_command

    command = verify_command if args.wal_command == "verify" else inspect_command
    return command(args.directory)


if __name__ == "__main__":
    sys.exit(main())
