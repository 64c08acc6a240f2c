"""arq under the peer workloads (see ../common.py); runs in the peers' venv.

The worker is ``arq.worker.Worker`` (the class ``arq WorkerSettings`` builds and runs), started with
``await worker.async_run()`` in a task of the adapter's own asyncio loop and stopped with
``await worker.close()`` once it has recorded every result and one more ``poll_delay`` has passed
(``close()`` cancels the poll loop, as arq's signal handler does; the extra period keeps that
cancellation out of a WATCH transaction on job ids read just before they finished). It opens its
own pool from ``RedisSettings.from_dsn(REDIS_URL)``, as the CLI worker does; the producer enqueues
through a separate ``arq.create_pool`` pool. Settings: arq's defaults (``job_timeout`` 300 s,
``keep_result`` 3600 s, ``max_tries`` 5, ``queue_read_limit`` ``max(5 * max_jobs, 100)``, pickle
serialization, ``allow_abort_jobs`` off) except ``max_jobs=--concurrency`` and
``handle_signals=False`` (arq's setting for running inside another program's loop: arq installs no
SIGINT/SIGTERM handlers, and ``close()`` stops the poll loop).

Variants: ``default`` keeps ``poll_delay=0.5`` s. arq never blocks on Redis: it polls its sorted set
of queued job ids, so an idle worker sees a new job only at its next poll, and a poll stops starting
jobs once ``max_jobs`` are running and then sleeps out the rest of ``poll_delay`` (with 20 ms jobs at
``max_jobs`` 16 that is about 16 jobs per 0.5 s). ``tuned`` sets ``poll_delay=0.005`` s and nothing else.

Differences from the other libraries: arq has no bulk enqueue API, so ``noop`` and ``sleep`` enqueue
with ``ArqRedis.enqueue_job`` issued concurrently by ``asyncio.gather`` in chunks of ``CHUNK`` (100)
(each call is a WATCH/MULTI/EXEC transaction holding a connection of its own). Logging is not
configured, so the per-job INFO lines the ``arq`` CLI prints are not emitted. Every run starts by
deleting arq's keys (``arq:*``). The clock of ``drain_per_s`` starts just before the ``Worker`` is
built (so it includes the worker opening its pool) and stops when ``TRACKER`` has counted every
handler run; the worker is then left to record its last results before ``close()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Worker
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

#: Concurrent ``enqueue_job`` calls per ``asyncio.gather`` (arq has no bulk enqueue).
CHUNK = 100
#: Redis keys (patterns) of this library, deleted at the start of every run.
KEYS = ("arq:*",)
#: Worker keyword arguments of each variant, on top of arq's defaults.
VARIANTS: dict[str, dict[str, Any]] = {"default": {}, "tuned": {"poll_delay": 0.005}}
SETTINGS = RedisSettings.from_dsn(REDIS_URL)
#: The function each drain workload enqueues.
TASKS = {"noop": "noop", "sleep": "sleepy"}


async def noop(ctx: dict[str, Any]) -> None:
    TRACKER.hit()


async def sleepy(ctx: dict[str, Any]) -> None:
    await asyncio.sleep(SLEEP)
    TRACKER.hit()


async def stamp(ctx: dict[str, Any], t: float) -> None:
    TRACKER.hit(t)


def start_worker(args: argparse.Namespace) -> tuple[Worker, asyncio.Task[None]]:
    worker = Worker(
        functions=[noop, sleepy, stamp],
        redis_settings=SETTINGS,
        max_jobs=args.concurrency,
        handle_signals=False,
        **VARIANTS[args.variant],
    )
    return worker, asyncio.create_task(worker.async_run())


async def stop_worker(worker: Worker, run: asyncio.Task[None], jobs: int) -> None:
    """Let the worker record every result, then close it as arq's own shutdown does."""
    await wait_until(
        lambda: worker.jobs_complete + worker.jobs_failed >= jobs and all(t.done() for t in worker.tasks.values())
    )
    if worker.jobs_failed or worker.jobs_retried:
        log(f"arq: {worker.jobs_failed} jobs failed, {worker.jobs_retried} retried")
    # close() cancels the poll loop, as arq's signal handler does; one more poll period lets a
    # poll that read the last job ids before they finished end its WATCH transactions first.
    await asyncio.sleep(worker.poll_delay_s)
    await worker.close()
    with contextlib.suppress(asyncio.CancelledError):
        await run


async def fill_then_drain(args: argparse.Namespace, pool: ArqRedis, function: str) -> tuple[float, float]:
    """Enqueue ``args.jobs`` jobs (gathered in chunks), then time a worker draining them."""
    TRACKER.expect(args.jobs)
    started = perf_counter()
    await gather_in_chunks(args.jobs, lambda: pool.enqueue_job(function), CHUNK)
    enqueue_s = perf_counter() - started
    started = perf_counter()
    worker, run = start_worker(args)
    await wait_until(TRACKER.all_done.is_set)
    drain_s = perf_counter() - started
    await stop_worker(worker, run, args.jobs)
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("arq", tuple(VARIANTS))
    async with asyncio.timeout(TIMEOUT):
        await clear_redis(KEYS)
        pool = await create_pool(SETTINGS)
        try:
            if args.workload != "latency":
                report(args, *await fill_then_drain(args, pool, TASKS[args.workload]))
            else:
                TRACKER.expect(args.jobs)
                worker, run = start_worker(args)
                await asyncio.sleep(0.5)  # the idle worker is polling
                for _ in range(args.jobs):
                    await pool.enqueue_job("stamp", perf_counter())
                    await asyncio.sleep(LATENCY_GAP)
                await wait_until(TRACKER.all_done.is_set)
                await stop_worker(worker, run, args.jobs)
                report(args)
        finally:
            await pool.aclose()


if __name__ == "__main__":
    asyncio.run(main())
