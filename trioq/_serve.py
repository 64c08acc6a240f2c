"""``trioq serve``: a queue and its HTTP app in one trio nursery, under hypercorn."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ._builtin import builtin_registry
from ._registry import Registry
from ._runtime import open_queue
from .stores import MemoryStore, WALStore

if TYPE_CHECKING:
    from hypercorn.config import Config

__all__ = ["load_registry", "serve"]

#: What the startup line says about authentication.
AUTH_ON = "auth: bearer token"
AUTH_OFF = "auth: OFF (no --token or TRIOQ_TOKEN)"


def load_registry(spec: str | None) -> Registry:
    """The built-in tasks, plus the registry named ``module:attribute`` if given."""
    registry = builtin_registry()
    if spec is None:
        return registry
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
    combined = Registry()  # the user's registry is left as it was
    combined.include(user)
    try:
        combined.include(registry)
    except ValueError as exc:
        raise SystemExit(f"--app {spec}: {exc} (the built-in tasks are sim and cpu)") from None
    return combined


async def _stop_on_signal(stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()
            return


def hypercorn_config(bind: str) -> Config:
    """The hypercorn settings of ``trioq serve``, bound to ``bind`` (``host:port``)."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = 1.0
    return config


async def serve(args: Any) -> None:
    """Serve until SIGTERM/SIGINT: stop accepting, drain up to the grace, release, exit.

    ``args`` is ``trioq serve``'s parsed command line, with ``args.token``
    already resolved by :func:`trioq.cli.main` (``--token``, else
    ``TRIOQ_TOKEN``; ``None`` serves without authentication). The environment
    is not read here. The startup line says whether authentication is on.
    """
    from hypercorn.trio import serve as hypercorn_serve

    from .http import create_app

    token: str | None = args.token
    registry = load_registry(args.app)
    store = MemoryStore() if args.memory else WALStore(args.wal, fsync=args.fsync)
    stop = trio.Event()
    async with open_queue(
        registry,
        store=store,
        workers=args.workers,
        heartbeat_timeout=args.heartbeat_timeout,
        max_ready=args.max_ready,
        shutdown_grace=args.shutdown_grace,
        precise_timers=True,  # a service owns its trio run: deadlines wake on time
    ) as queue:
        app = create_app(queue, token=token)
        config = hypercorn_config(f"{args.host}:{args.port}")
        async with trio.open_nursery() as nursery:
            await nursery.start(_stop_on_signal, stop)
            binds = await nursery.start(partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait))
            recovered = getattr(store, "recovery", None)
            extra = f", recovered {recovered.records} log records" if recovered is not None else ""
            auth = AUTH_OFF if token is None else AUTH_ON
            print(f"trioq serving on {binds[0]} ({len(registry)} tasks{extra}); {auth}", flush=True)
        print("trioq: stopped accepting; draining", flush=True)
