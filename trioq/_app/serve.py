"""``trioq serve``: a queue and its HTTP app in one trio nursery, under hypercorn."""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .._model import error_text
from .._registry import Registry
from .._runtime.exits import leaves
from .._runtime.queue import open_queue
from ..stores import MemoryStore, Store, WALStore
from .builtin import builtin_registry
from .console import bind_error

if TYPE_CHECKING:
    from hypercorn.config import Config

__all__ = ["load_registry", "open_store", "pool_lines", "serve", "store_line"]

#: What the startup banner says about authentication (a line of its own).
AUTH_ON = "auth: bearer token"
AUTH_OFF = "auth: OFF (no --token or TRIOQ_TOKEN)"


def load_registry(spec: str | None, *, demo_tasks: bool = False) -> Registry:
    """The registry named ``module:attribute`` (imported from the current directory), as it is;
    without ``spec``, the demo tasks ``sim`` and ``cpu`` alone.

    ``demo_tasks`` adds the demo tasks to the user's registry (in a copy: the
    user's is left as it was), for ``trioq loadgen`` against the user's app.
    A ``spec`` that does not name a registry raises ``SystemExit`` saying so.
    """
    if spec is None:
        return builtin_registry()
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"--app must look like module:registry, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        user = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--app {spec}: {exc}") from None
    if not isinstance(user, Registry):
        raise SystemExit(f"--app {spec} is a {type(user).__name__}, not a trioq.Registry")
    if not demo_tasks:
        return user
    combined = Registry()  # the user's registry is left as it was
    combined.include(user)
    try:
        combined.include(builtin_registry())
    except ValueError as exc:
        raise SystemExit(f"--app {spec} --demo-tasks: {exc} (the demo tasks are sim and cpu)") from None
    return combined


async def _stop_on_signal(stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()
            return


@contextlib.contextmanager
def _connections_contained() -> Iterator[None]:
    """While inside, an error in one connection of hypercorn's trio server ends that connection only.

    hypercorn 0.18 runs each connection's handler in the server's own nursery,
    so any exception a connection raises ends the whole server. One does: its
    ``TCPServer._close`` sends EOF without the send lock, and a reply h11 sends
    meanwhile (a request that said it would close, followed by more bytes)
    raises ``trio.BusyResourceError`` out of ``protocol_send``: one request
    from anyone, token or not, stopped ``trioq serve``. hypercorn offers no
    hook for the connection class, so ``trioq serve`` swaps in a subclass
    whose ``run`` logs such an error (logger ``trioq.http``, at most one line
    a second; the traceback at DEBUG) and lets the connection go, for as long
    as any ``serve`` in the process runs (the swap is process-wide: another
    hypercorn server in the process gets it too). The socket is closed by the
    connection's own ``finally``. If hypercorn moves the class, nothing is
    swapped and ``tests/test_serve.py`` says so.
    """
    from hypercorn.trio import run as hypercorn_run

    global _contained
    if _contained == 0:
        if getattr(hypercorn_run, "TCPServer", None) is not _TCPServer:  # moved (or swapped by someone): leave it
            yield
            return
        setattr(hypercorn_run, "TCPServer", _ContainedTCPServer)  # noqa: B010 - not part of its typed interface
    _contained += 1
    try:
        yield
    finally:
        _contained -= 1
        if _contained == 0:
            setattr(hypercorn_run, "TCPServer", _TCPServer)  # noqa: B010


#: How many serve() calls are inside _connections_contained.
_contained = 0


class _ContainedLog:
    """At most one line a second about failed connections (a client can cause them at will)."""

    def __init__(self) -> None:
        self.last = -math.inf
        self.quiet = 0

    def failed(self, exc: BaseException) -> None:
        log = logging.getLogger("trioq.http")
        log.debug("a failed connection's traceback", exc_info=exc)
        now = time.monotonic()
        if now - self.last < 1.0:
            self.quiet += 1
            return
        leaf = next(iter(leaves(exc)), exc)
        more = f" ({self.quiet} more since the last such line)" if self.quiet else ""
        log.warning("a connection failed inside hypercorn and was closed: %s%s", error_text(leaf)[:300], more)
        self.last, self.quiet = now, 0


_contained_log = _ContainedLog()

try:
    from hypercorn.trio.tcp_server import TCPServer as _TCPServer
except ImportError:  # pragma: no cover - hypercorn comes with the http extra, which serve needs
    _TCPServer = None  # type: ignore[assignment, misc]
else:

    class _ContainedTCPServer(_TCPServer):
        """hypercorn's connection, whose errors end it alone (see :func:`_connections_contained`)."""

        async def run(self) -> None:
            try:
                await super().run()
            except BaseException as exc:
                cancelled, rest = exc.split(trio.Cancelled) if isinstance(exc, BaseExceptionGroup) else (None, exc)
                if rest is None or isinstance(rest, trio.Cancelled | KeyboardInterrupt | SystemExit):
                    raise
                _contained_log.failed(rest)
                if cancelled is not None:
                    raise cancelled from None


def hypercorn_config(bind: str) -> Config:
    """The hypercorn settings of ``trioq serve``, bound to ``bind`` (``host:port``).

    hypercorn's own log lines go to the logger ``hypercorn.error`` with no
    handler of hypercorn's: they reach whatever the process's logging does
    (``trioq serve``: stderr, as its ``--log-level`` and ``--log-json`` say).
    """
    from hypercorn.config import Config

    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0
    return config


def open_store(args: Any) -> Store:
    """The store ``trioq serve``'s (or ``trioq worker``'s) command line names."""
    if getattr(args, "postgres", None) is not None:
        from ..stores.postgres import PostgresStore

        return PostgresStore(args.postgres, schema=args.schema, lease=args.lease)
    if args.memory:
        return MemoryStore()
    return WALStore(args.wal, fsync=args.fsync)


def _shown_dsn(dsn: str) -> str:
    """``dsn`` without its password (conninfo or URL form), to be printed."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
    except Exception:  # unparsable (psycopg would say so at connect): show nothing of it
        return "(the DSN given)"
    params.pop("password", None)
    return make_conninfo(**params)  # type: ignore[arg-type]


def store_line(store: Store, args: Any) -> str:
    """What the startup banner says about ``store`` (opened: a WAL's replay is known)."""
    if isinstance(store, MemoryStore):
        return "memory (jobs are lost when the process exits)"
    if isinstance(store, WALStore):
        recovered = getattr(store, "recovery", None)
        replayed = f"; replayed {recovered.records} log records" if recovered is not None else ""
        return f"WAL {os.path.abspath(args.wal)} (fsync {args.fsync}{replayed})"
    if getattr(args, "postgres", None) is not None:
        return f"PostgreSQL {_shown_dsn(args.postgres)} (schema {args.schema}, lease {args.lease:g}s)"
    return type(store).__name__


def _names(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def pool_lines(workers: int | dict[str, int], registry: Registry) -> list[str]:
    """The banner's ``workers:`` and ``queues:`` lines: the pools, and each named queue with its tasks."""
    by_queue: dict[str, list[str]] = {}
    for name in sorted(registry):
        by_queue.setdefault(registry[name].queue, []).append(name)
    if isinstance(workers, dict):
        pools = f"{', '.join(f'{name}={size}' for name, size in workers.items())} (a pool per queue)"
        claimed: set[str] | None = set(workers)
    elif workers == 0:
        pools, claimed = "0 (producer only: no job runs in this process)", set()
    else:
        pools, claimed = f"{workers} in one pool for every queue", None
    queues = []
    for queue in sorted(by_queue.keys() | (claimed or set())):
        tasks = by_queue.get(queue, [])
        said = f"{len(tasks)} task{'' if len(tasks) == 1 else 's'}" + (f": {_names(tasks)}" if tasks else "")
        if claimed is not None and queue not in claimed:
            said += "; not run here"
        queues.append(f"{queue} ({said})")
    return [f"workers: {pools}", f"queues: {'; '.join(queues) or 'none (the registry has no task)'}"]


async def serve(args: Any) -> None:
    """Serve until SIGTERM/SIGINT: stop accepting, drain up to the grace, release, exit.

    ``args`` is ``trioq serve``'s parsed command line, with ``args.token``
    already resolved by :func:`trioq._app.cli.main` (``--token``, else
    ``TRIOQ_TOKEN``; ``None`` serves without authentication). The environment
    is not read here. Once listening, it prints the startup banner on stdout
    (a block that stays this shape; scripts may read it)::

        trioq serving on http://127.0.0.1:8000
          auth: bearer token                    (or: auth: OFF (no --token or TRIOQ_TOKEN))
          store: WAL /srv/trioq-data (fsync always; replayed 12 log records)
          workers: 16 in one pool for every queue
          queues: default (2 tasks: cpu, sim)

    A port in use (or any address it cannot listen on) raises
    :class:`~trioq._app.console.CommandError` saying so.
    """
    from hypercorn.trio import serve as hypercorn_serve

    from .http import create_app

    token: str | None = args.token
    registry = load_registry(args.app, demo_tasks=args.demo_tasks)
    store = open_store(args)
    stop = trio.Event()
    async with open_queue(
        registry,
        store=store,
        workers=args.workers,
        heartbeat_timeout=args.heartbeat_timeout,
        max_ready=args.max_ready,
        overflow=args.overflow,
        shutdown_grace=args.shutdown_grace,
        retention=args.retention,
        max_retained=args.max_retained,
        precise_timers=True,  # a service owns its trio run: deadlines wake on time
    ) as queue:
        app = create_app(queue, token=token)
        config = hypercorn_config(f"{args.host}:{args.port}")
        with _connections_contained():
            async with trio.open_nursery() as nursery:
                await nursery.start(_stop_on_signal, stop)
                try:
                    binds = await nursery.start(partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait))
                except BaseException as exc:
                    failed = _os_error(exc)
                    if failed is None:
                        raise
                    raise bind_error(failed, args.host, args.port) from None
                lines = [
                    f"trioq serving on {', '.join(binds)}",
                    AUTH_OFF if token is None else AUTH_ON,
                    f"store: {store_line(store, args)}",
                    *pool_lines(args.workers, registry),
                ]
                print("\n  ".join(lines), flush=True)
        print("trioq: stopped accepting; draining", flush=True)


def _os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` that alone (``Cancelled`` aside) makes up ``exc``, or ``None``."""
    found = leaves(exc)
    return found[0] if len(found) == 1 and isinstance(found[0], OSError) else None
