"""Serve a durable queue over HTTP: hypercorn and the queue in one trio program.

    python examples/http_app.py [PORT] [DATA_DIR]      # defaults: 8000 ./trioq-data

    curl -s localhost:8000/jobs -d '{"task": "greet", "payload": {"name": "Ada"}}'
    curl -s localhost:8000/jobs/<id>
    curl -s localhost:8000/stats

Set TRIOQ_TOKEN to require ``Authorization: Bearer <token>`` (all but /healthz, /readyz).
SIGTERM or Ctrl-C shuts down gracefully: the server stops taking requests, then
the queue gives running jobs their grace period and puts the rest back to ``ready``.
"""

from __future__ import annotations

import os
import signal
import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import trioq
from trioq.http import create_app

registry = trioq.Registry()


@registry.task
async def greet(ctx: trioq.JobContext, name: str) -> str:
    await trio.sleep(0.1)  # real work goes here
    return f"hello, {name}"


async def stop_on_signal(stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Set ``stop`` at the first SIGTERM or SIGINT (a second Ctrl-C then interrupts at once)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()
            return


async def main(port: int, data: str) -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    stop = trio.Event()
    store = trioq.WALStore(data, fsync="always")
    async with trioq.open_queue(registry, store=store, workers=4) as queue, trio.open_nursery() as nursery:
        await nursery.start(stop_on_signal, stop)
        app = create_app(queue, token=os.environ.get("TRIOQ_TOKEN"))
        print(f"serving on http://127.0.0.1:{port} (jobs in {data})", flush=True)
        await serve(app, config, shutdown_trigger=stop.wait)  # returns once stop is set
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    data = sys.argv[2] if len(sys.argv) > 2 else "./trioq-data"
    trio.run(main, port, data)
