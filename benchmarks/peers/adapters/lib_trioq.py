"""trioq under the peer workloads (see ../common.py); runs in trioq's own environment.

Variants: ``memory`` (MemoryStore), ``wal-never`` and ``wal-always`` (WALStore with
that fsync mode, in a fresh temporary directory). The queue is embedded: producer
and workers share the process, as an application embedding trioq runs it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the trioq of this working tree

import trio
from common import (
    LATENCY_GAP,
    SLEEP,
    TIMEOUT,
    TRACKER,
    parse_args,
    perf_counter,
    report,
)

import trioq

registry = trioq.Registry()


@registry.task
async def noop(ctx: trioq.JobContext) -> None:
    pass


@registry.task
async def sleepy(ctx: trioq.JobContext) -> None:
    await trio.sleep(SLEEP)


@registry.task
async def stamp(ctx: trioq.JobContext, t: float) -> None:
    TRACKER.hit(t)


def make_store(variant: str, directory: str) -> trioq.Store:
    if variant == "memory":
        return trioq.MemoryStore()
    return trioq.WALStore(directory, fsync=variant.removeprefix("wal-"))


async def fill_then_drain(args, task: str, directory: str) -> tuple[float, float]:
    """Enqueue with a producer-only queue, then time a queue with workers draining them."""
    store = make_store(args.variant, directory)
    async with trioq.open_queue(registry, store=store, workers=0, precise_timers=True) as queue:
        started = perf_counter()
        await queue.enqueue_many([trioq.JobSpec(task)] * args.jobs)
        enqueue_s = perf_counter() - started
    if args.variant != "memory":
        store = make_store(args.variant, directory)  # a WAL reopens from its directory
    async with trioq.open_queue(registry, store=store, workers=args.concurrency, precise_timers=True) as queue:
        started = perf_counter()
        await queue.join()
        drain_s = perf_counter() - started
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("trioq", ("memory", "wal-never", "wal-always"))
    with tempfile.TemporaryDirectory(prefix="trioq-peers-") as directory, trio.fail_after(TIMEOUT):
        if args.workload != "latency":
            report(args, *await fill_then_drain(args, {"noop": "noop", "sleep": "sleepy"}[args.workload], directory))
        else:
            store = make_store(args.variant, directory)
            TRACKER.expect(args.jobs)
            async with trioq.open_queue(registry, store=store, workers=args.concurrency, precise_timers=True) as queue:
                await trio.sleep(0.2)  # idle workers
                for _ in range(args.jobs):
                    await queue.enqueue("stamp", {"t": perf_counter()})
                    await trio.sleep(LATENCY_GAP)
                await queue.join()
            report(args)


if __name__ == "__main__":
    trio.run(main)
