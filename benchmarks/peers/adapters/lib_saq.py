"""SAQ under the peer workloads (see ../common.py); runs in the peers' venv.

The worker is ``saq.Worker`` on a ``saq.Queue.from_url(REDIS_URL)`` (a ``RedisQueue``), run as the
``saq`` CLI runs it: ``await queue.connect()`` then ``await worker.start()``, here in a task of the
adapter's own asyncio loop. It is stopped by setting ``worker.event`` (what its SIGINT/SIGTERM
handlers do), after which ``start()`` runs ``Worker.stop()``; then ``queue.disconnect()``. Producer
and worker share the one ``Queue`` object. Settings: SAQ's defaults (``dequeue_timeout=0``, so each
of the ``concurrency`` process loops blocks in ``BLMOVE`` on a connection of its own; timers
schedule 1 s, worker_info 10 s, sweep 60 s, abort 1 s; ``shutdown_grace_period_s`` none;
``RedisQueue(max_concurrent_ops=20)``; JSON serialization; job ``timeout`` 10 s, ``retries`` 1,
``ttl`` 600 s) except ``concurrency=--concurrency``. Only variant: ``default``. With no grace period,
``stop()`` cancels the process loops still blocked in ``BLMOVE`` and logs "Some tasks did not finish
within the shutdown grace period" on stderr at every run: expected, all jobs are done by then.

Differences from the other libraries: SAQ 0.26 has no bulk enqueue API (no ``enqueue_many``;
``Queue.map`` gathers ``enqueue`` calls and then waits for the results), so ``noop`` and ``sleep``
enqueue with ``Queue.enqueue`` issued concurrently by ``asyncio.gather`` in chunks of ``CHUNK``
(100), of which the queue itself lets at most 20 reach Redis at once. Logging is not configured, so
the per-job INFO lines the ``saq`` CLI prints at ``-v`` are not emitted. Every run starts by deleting
SAQ's keys (``saq:*``). The clock of ``drain_per_s`` starts just before the ``Worker`` is built and
stops when ``TRACKER`` has counted every handler run; the worker is then left to record its last
results (``queue.complete``) before it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common

from common import (
    LATENCY_GAP,
    REDIS_URL,
    SLEEP,
    TIMEOUT,
    TRACKER,
    clear_redis,
    gather_in_chunks,
    log,
    parse_args,
    perf_counter,
    report,
    wait_until,
)
from saq import Queue, Worker

#: Concurrent ``Queue.enqueue`` calls per ``asyncio.gather`` (SAQ has no bulk enqueue).
CHUNK = 100
#: Redis keys (patterns) of this library, deleted at the start of every run.
KEYS = ("saq:*",)
#: The function each drain workload enqueues.
TASKS = {"noop": "noop", "sleep": "sleepy"}


async def noop(ctx: dict[str, Any]) -> None:
    TRACKER.hit()


async def sleepy(ctx: dict[str, Any]) -> None:
    await asyncio.sleep(SLEEP)
    TRACKER.hit()


async def stamp(ctx: dict[str, Any], *, t: float) -> None:
    TRACKER.hit(t)


def start_worker(args: argparse.Namespace, queue: Queue) -> tuple[Worker, asyncio.Task[None]]:
    worker = Worker(queue, functions=[noop, sleepy, stamp], concurrency=args.concurrency)
    return worker, asyncio.create_task(worker.start())


async def stop_worker(worker: Worker, run: asyncio.Task[None], queue: Queue, jobs: int) -> None:
    """Let the worker record every result, then stop it as its signal handlers do."""
    await wait_until(lambda: queue.complete + queue.failed >= jobs)
    if queue.failed or queue.retried:
        log(f"saq: {queue.failed} jobs failed, {queue.retried} retried")
    worker.event.set()
    await run


async def fill_then_drain(args: argparse.Namespace, queue: Queue, function: str) -> tuple[float, float]:
    """Enqueue ``args.jobs`` jobs (gathered in chunks), then time a worker draining them."""
    TRACKER.expect(args.jobs)
    started = perf_counter()
    await gather_in_chunks(args.jobs, lambda: queue.enqueue(function), CHUNK)
    enqueue_s = perf_counter() - started
    started = perf_counter()
    worker, run = start_worker(args, queue)
    await wait_until(TRACKER.all_done.is_set)
    drain_s = perf_counter() - started
    await stop_worker(worker, run, queue, args.jobs)
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("saq", ("default",))
    async with asyncio.timeout(TIMEOUT):
        await clear_redis(KEYS)
        queue = Queue.from_url(REDIS_URL)
        await queue.connect()
        try:
            if args.workload != "latency":
                report(args, *await fill_then_drain(args, queue, TASKS[args.workload]))
            else:
                TRACKER.expect(args.jobs)
                worker, run = start_worker(args, queue)
                await asyncio.sleep(0.5)  # the idle worker is blocked in BLMOVE
                for _ in range(args.jobs):
                    await queue.enqueue("stamp", t=perf_counter())
                    await asyncio.sleep(LATENCY_GAP)
                await wait_until(TRACKER.all_done.is_set)
                await stop_worker(worker, run, queue, args.jobs)
                report(args)
        finally:
            await queue.disconnect()


if __name__ == "__main__":
    asyncio.run(main())
