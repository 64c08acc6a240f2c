"""taskiq under the peer workloads (see ../common.py); runs in the peers' venv.

Broker: taskiq-redis's ``RedisStreamBroker(url=REDIS_URL)``, the broker of taskiq-redis's own usage
example (Redis streams with a consumer group; messages are acknowledged), at its defaults
(``xread_block`` 2000 ms, ``xread_count`` 100, ``idle_timeout`` 10 min, ``consumer_id="$"``, no
``maxlen``). No result backend (taskiq's ``DummyResultBackend``, which stores nothing).

The worker is ``taskiq.receiver.Receiver`` driven by ``await receiver.listen(finish_event)``, what
``taskiq worker`` runs in each of its worker processes, here as one receiver in a task of the
adapter's own asyncio loop, sharing the broker object with the producer. Settings: the CLI worker's
defaults (``validate_params=True``, ``propagate_exceptions=True``, ``ack_type=WHEN_SAVED``,
``max_prefetch=0``, a default ``ThreadPoolExecutor``) except ``max_async_tasks=--concurrency``.
``broker.startup()`` (which creates the consumer group) is called once, by the producer, before the
first ``kiq``, so the receiver is built with ``run_startup=False`` (as ``taskiq.api.run_receiver_task``
does); ``broker.is_worker_process`` is set as the CLI sets it. The worker is stopped by setting
``finish_event`` (what the CLI's signal handler does): the receiver stops fetching and waits for
running tasks. ``broker.shutdown()`` closes the pool. Only variant: ``default``.

Differences from the other libraries: taskiq has no bulk enqueue API, so ``noop`` and ``sleep``
enqueue with ``task.kiq()`` issued concurrently by ``asyncio.gather`` in chunks of ``CHUNK`` (100)
(each ``kiq`` is one XADD). One receiver runs, where ``taskiq worker`` starts two processes by
default. Logging is not configured, so the per-task INFO lines the ``taskiq worker`` CLI prints are
not emitted. Every run starts by deleting taskiq's keys (the ``taskiq`` stream, which holds the
consumer group, and ``autoclaim:taskiq:*``). The clock of ``drain_per_s`` starts just before the
``Receiver`` is built and stops when ``TRACKER`` has counted every handler run.

Versions: arq 0.28 pins ``redis<6`` and every taskiq-redis after 1.0.9 needs ``redis>=6`` (1.1.x:
6.x, 1.2.x: 7.0 or 8.x), so the shared venv gets taskiq-redis 1.0.9 next to taskiq 0.13. 1.0.9's
package ``__init__`` imports ``taskiq.compat.model_dump``/``model_validate``, which taskiq 0.13
removed; only its result backend and schedule sources call them (this adapter uses neither), so the
adapter defines the two pydantic-2 one-liners of earlier taskiq before importing ``taskiq_redis``.
The broker code itself is untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common

import taskiq.compat
from common import (
    LATENCY_GAP,
    REDIS_URL,
    SLEEP,
    TIMEOUT,
    TRACKER,
    clear_redis,
    gather_in_chunks,
    parse_args,
    perf_counter,
    report,
    wait_until,
)
from taskiq import AsyncTaskiqDecoratedTask
from taskiq.receiver import Receiver

if not hasattr(taskiq.compat, "model_dump"):  # taskiq-redis 1.0.x on taskiq >= 0.13: see the docstring
    taskiq.compat.model_dump = lambda instance: instance.model_dump(mode="json")
    taskiq.compat.model_validate = lambda model_class, message: model_class.model_validate(message)

from taskiq_redis import RedisStreamBroker

#: Concurrent ``kiq`` calls per ``asyncio.gather`` (taskiq has no bulk enqueue).
CHUNK = 100
#: Redis keys (patterns) of this library, deleted at the start of every run.
KEYS = ("taskiq", "autoclaim:taskiq:*")

broker = RedisStreamBroker(url=REDIS_URL)


@broker.task
async def noop() -> None:
    TRACKER.hit()


@broker.task
async def sleepy() -> None:
    await asyncio.sleep(SLEEP)
    TRACKER.hit()


@broker.task
async def stamp(t: float) -> None:
    TRACKER.hit(t)


class RunningWorker:
    """One ``Receiver`` listening in a task, as ``taskiq worker`` runs it in each process."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.executor = ThreadPoolExecutor()
        self.finish = asyncio.Event()
        broker.is_worker_process = True
        receiver = Receiver(
            broker=broker,
            executor=self.executor,
            max_async_tasks=args.concurrency,
            run_startup=False,
        )
        self.task = asyncio.create_task(receiver.listen(self.finish))

    async def stop(self) -> None:
        self.finish.set()
        await self.task
        self.executor.shutdown()


async def fill_then_drain(args: argparse.Namespace, task: AsyncTaskiqDecoratedTask[[], None]) -> tuple[float, float]:
    """Enqueue ``args.jobs`` jobs (gathered in chunks), then time a receiver draining them."""
    TRACKER.expect(args.jobs)
    started = perf_counter()
    await gather_in_chunks(args.jobs, task.kiq, CHUNK)
    enqueue_s = perf_counter() - started
    started = perf_counter()
    worker = RunningWorker(args)
    await wait_until(TRACKER.all_done.is_set)
    drain_s = perf_counter() - started
    await worker.stop()
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("taskiq", ("default",))
    async with asyncio.timeout(TIMEOUT):
        await clear_redis(KEYS)
        await broker.startup()
        try:
            if args.workload != "latency":
                report(args, *await fill_then_drain(args, {"noop": noop, "sleep": sleepy}[args.workload]))
            else:
                TRACKER.expect(args.jobs)
                worker = RunningWorker(args)
                await asyncio.sleep(0.5)  # the idle receiver is blocked in XREADGROUP
                for _ in range(args.jobs):
                    await stamp.kiq(perf_counter())
                    await asyncio.sleep(LATENCY_GAP)
                await wait_until(TRACKER.all_done.is_set)
                await worker.stop()
                report(args)
        finally:
            await broker.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
