"""``trioq worker``: a node without HTTP, running a user's tasks against a shared PostgreSQL queue.

Run one ``trioq serve --postgres DSN`` for the API and as many ``trioq worker
--postgres DSN --app MOD:REGISTRY`` processes as the work needs; every one is
a node of the same queue. SIGTERM or SIGINT stops claiming, gives running
attempts ``--shutdown-grace`` seconds, releases what is left, and exits 0.
"""

from __future__ import annotations

from typing import Any

import trio

from .._runtime.queue import open_queue
from .serve import _stop_on_signal, load_registry, open_store, pool_lines, store_line

__all__ = ["worker"]


async def worker(args: Any) -> None:
    """Run one worker node until SIGTERM/SIGINT (``args``: ``trioq worker``'s parsed command line).

    Once its queue is open, it prints a banner on stdout: ``trioq worker NODE: ...``, then the
    store, the pools and the queues, a line each (as ``trioq serve`` does).
    """
    registry = load_registry(args.app, demo_tasks=args.demo_tasks)
    store = open_store(args)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_stop_on_signal, stop)
        async with open_queue(
            registry,
            store=store,
            workers=args.workers,
            heartbeat_timeout=args.heartbeat_timeout,
            shutdown_grace=args.shutdown_grace,
            retention=args.retention,
            max_retained=args.max_retained,
            precise_timers=True,  # a service owns its trio run: deadlines wake on time
        ) as queue:
            lines = [f"trioq worker {queue.node}: running", f"store: {store_line(store, args)}"]
            print("\n  ".join([*lines, *pool_lines(args.workers, registry)]), flush=True)
            await stop.wait()
            print("trioq worker: stopping; draining", flush=True)
    print("trioq worker: stopped", flush=True)
