"""``trioq serve``: a queue and its HTTP app in one trio nursery, under hypercorn."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from functools import partial
from typing import Any

import trio

from ._builtin import builtin_registry
from ._registry import Registry
from ._runtime import open_queue
from .stores import MemoryStore, WALStore

__all__ = ["load_registry", "serve"]


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


async def serve(args: Any) -> None:
    """Serve until SIGTERM/SIGINT: stop accepting, drain up to the grace, release, exit."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from .http import create_app

    registry = load_registry(args.app)
    store = MemoryStore() if args.memory else WALStore(args.wal, fsync=args.fsync)
    token = args.token or os.environ.get("TRIOQ_TOKEN") or None
    stop = trio.Event()
    async with open_queue(
        registry,
        store=store,
        workers=args.workers,
        heartbeat_timeout=args.heartbeat_timeout,
        max_ready=args.max_ready,
        shutdown_grace=args.shutdown_grace,
    ) as queue:
        app = create_app(queue, token=token)
        config = Config()
        config.bind = [f"{args.host}:{args.port}"]
        config.accesslog = None
        config.graceful_timeout = 1.0
        async with trio.open_nursery() as nursery:
            await nursery.start(_stop_on_signal, stop)
            binds = await nursery.start(partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait))
            recovered = getattr(store, "recovery", None)
            extra = f", recovered {recovered.records} log records" if recovered is not None else ""
            print(f"trioq serving on {binds[0]} ({len(registry)} tasks{extra})", flush=True)
        print("trioq: stopped accepting; draining", flush=True)
