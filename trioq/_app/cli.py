"""The ``trioq`` command: ``serve``, ``worker``, ``loadgen``, ``demo``, ``jobs list|show|retry|cancel``,
``wal verify|inspect``, ``pg migrate`` and ``cron list``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import trio

__all__ = ["main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trioq", description="A job runtime for trio applications.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve a queue over HTTP (queue and hypercorn in one nursery)")
    serve.add_argument("--app", metavar="MOD:REGISTRY", help="your trioq.Registry (built-in tasks are added)")
    serve.add_argument("--wal", default="./trioq-data", metavar="DIR", help="WAL directory (default ./trioq-data)")
    serve.add_argument("--memory", action="store_true", help="keep jobs in memory instead of a WAL")
    serve.add_argument(
        "--postgres", metavar="DSN", help="share a queue on this PostgreSQL database with `trioq worker`s"
    )
    serve.add_argument("--schema", default="trioq", help="the PostgreSQL schema of the queue (default trioq)")
    serve.add_argument("--lease", type=float, default=30.0, metavar="S", help="with --postgres: see trioq worker")
    serve.add_argument(
        "--workers", type=_workers, default=16, help="N, or NAME=N,NAME=N for a pool per named queue (default 16)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--token",
        help="bearer token required by every route but health and /openapi.json (default: env TRIOQ_TOKEN;"
        " printable ASCII, no spaces; with neither set, no authentication)",
    )
    serve.add_argument("--max-ready", type=_positive_int, default=None)
    serve.add_argument(
        "--overflow",
        choices=("refuse", "defer"),
        default="refuse",
        help="past --max-ready: refuse the enqueue (503, the default) or keep the job deferred",
    )
    serve.add_argument("--heartbeat-timeout", type=float, default=None, metavar="S")
    serve.add_argument("--shutdown-grace", type=float, default=10.0, metavar="S")
    serve.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    serve.set_defaults(usage_error=serve.error)

    work = commands.add_parser("worker", help="run tasks from a PostgreSQL queue (a node without HTTP)")
    work.add_argument("--postgres", required=True, metavar="DSN")
    work.add_argument("--app", metavar="MOD:REGISTRY", help="your trioq.Registry (built-in tasks are added)")
    work.add_argument("--schema", default="trioq", help="the PostgreSQL schema of the queue (default trioq)")
    work.add_argument(
        "--workers", type=_workers, default=16, help="N, or NAME=N,NAME=N for a pool per named queue (default 16)"
    )
    work.add_argument("--lease", type=float, default=30.0, metavar="S", help="seconds before a silent node is dead")
    work.add_argument("--heartbeat-timeout", type=float, default=None, metavar="S")
    work.add_argument("--shutdown-grace", type=float, default=10.0, metavar="S")

    load = commands.add_parser("loadgen", help="drive a running server with simulated jobs; print one JSON line")
    load.add_argument("--url", required=True)
    load.add_argument("--jobs", type=_positive_int, default=1000)
    load.add_argument("--clients", type=_positive_int, default=8)
    load.add_argument("--batch", type=_positive_int, default=1)
    load.add_argument("--work-ms", type=float, default=20.0)
    load.add_argument("--fail-prob", type=float, default=0.0)
    load.add_argument("--hang-prob", type=float, default=0.0)
    load.add_argument("--token", default=None)
    load.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the queue to drain")

    demo = commands.add_parser("demo", help="serve, load with failures and hangs, kill -9, restart, check")
    demo.add_argument("--jobs", type=_positive_int, default=2000)

    wal = commands.add_parser("wal", help="look at a WAL directory").add_subparsers(dest="wal_command", required=True)
    verify = wal.add_parser("verify", help="check every segment; exit 0 if the log replays cleanly")
    verify.add_argument("directory")
    inspect = wal.add_parser("inspect", help="job counts per state, segments and sizes, last checkpoint")
    inspect.add_argument("directory")

    pg = commands.add_parser("pg", help="PostgreSQL: schema upkeep").add_subparsers(dest="pg_command", required=True)
    migrate = pg.add_parser("migrate", help="create or migrate the queue's schema (open_queue does it too)")
    migrate.add_argument("dsn", metavar="DSN")
    migrate.add_argument("--schema", default="trioq")
    migrate.add_argument(
        "--fairness",
        action="store_true",
        help="also build the index fair claims read (otherwise the first node opened with fairness does)",
    )
    cron = commands.add_parser("cron", help="cron schedules").add_subparsers(dest="cron_command", required=True)
    listing = cron.add_parser("list", help="each cron schedule of a registry with its next run (and last tick)")
    listing.add_argument("--app", required=True, metavar="MOD:REGISTRY", help="the trioq.Registry declaring them")
    where = listing.add_mutually_exclusive_group()
    where.add_argument("--postgres", metavar="DSN", help="read the last ticks from this PostgreSQL queue")
    where.add_argument("--wal", metavar="DIR", help="read the last ticks from this WAL directory (read-only)")
    listing.add_argument("--schema", default="trioq", help="with --postgres: the queue's schema (default trioq)")
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


def main(argv: list[str] | None = None) -> int:
    """Run ``trioq`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad arguments, a bad token for ``serve`` included, exit with status 2.
    """
    args = _parser().parse_args(argv)
    if args.command == "serve":
        if args.postgres is not None and args.memory:
            args.usage_error("--postgres and --memory name two stores; give one")
        if args.overflow == "defer" and args.max_ready is None:
            args.usage_error("--overflow defer needs --max-ready N: the bound past which jobs are deferred")
        args.token = _serve_token(args, args.usage_error)
        from .serve import serve

        trio.run(serve, args)
        return 0
    if args.command == "loadgen":
        from .loadgen import main as loadgen_main

        return loadgen_main(args)
    if args.command == "worker":
        from .worker import worker

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
