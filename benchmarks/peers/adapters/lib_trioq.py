"""trioq under the peer workloads (see ../common.py); runs in trioq's own environment.

Variants: ``memory`` (MemoryStore), ``wal-never`` and ``wal-always`` (WALStore with
that fsync mode, in a fresh temporary directory), and ``postgres`` (PostgresStore at its
defaults on ``PG_DSN``, the server Procrastinate uses, in a fresh schema
``peers_<pid>_<n>`` that is dropped after the run, also on an error). The queue is
embedded: producer and workers share the process, as an application embedding trioq
runs it (for ``postgres`` too: one node, so the producer's enqueue wakes the
workers in-process, and NOTIFY only tells other nodes).

Timing: the drain (``noop``, ``sleep``) runs from just after ``open_queue`` is
entered until ``join()`` returns, except for ``postgres``, where it runs from just
before ``open_queue`` (the pool's connect, the schema check and the leader's row
included; ``open_s`` gives that part), because Procrastinate's drain includes its
worker's start too. ``join()`` returns once every job's outcome is recorded.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the trioq of this working tree

import trio
from common import (
    LATENCY_GAP,
    PG_DSN,
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


VARIANTS = ("memory", "wal-never", "wal-always", "postgres")
_schemas = itertools.count(1)


@contextmanager
def place(variant: str):
    """Where the variant's store lives: a temporary directory, or a fresh PostgreSQL schema dropped after."""
    if variant != "postgres":
        with tempfile.TemporaryDirectory(prefix="trioq-peers-") as directory:
            yield directory
        return
    import psycopg

    schema = f"peers_{os.getpid()}_{next(_schemas)}"
    try:
        yield schema  # PostgresStore creates it when the first queue opens
    finally:
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def make_store(variant: str, where: str) -> trioq.Store:
    if variant == "memory":
        return trioq.MemoryStore()
    if variant == "postgres":
        return trioq.PostgresStore(PG_DSN, schema=where)
    return trioq.WALStore(where, fsync=variant.removeprefix("wal-"))


async def fill_then_drain(args, task: str, where: str) -> tuple[float, float]:
    """Enqueue with a producer-only queue, then time a queue with workers draining them."""
    store = make_store(args.variant, where)
    async with trioq.open_queue(registry, store=store, workers=0, precise_timers=True) as queue:
        started = perf_counter()
        await queue.enqueue_many([trioq.JobSpec(task)] * args.jobs)
        enqueue_s = perf_counter() - started
    if args.variant != "memory":
        store = make_store(args.variant, where)  # a WAL reopens from its directory; a node joins the schema
    before_open = perf_counter()
    async with trioq.open_queue(registry, store=store, workers=args.concurrency, precise_timers=True) as queue:
        started = perf_counter()
        args.open_s = round(started - before_open, 4)
        if args.variant == "postgres":
            started = before_open
        await queue.join()
        drain_s = perf_counter() - started
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("trioq", VARIANTS)
    with place(args.variant) as where, trio.fail_after(TIMEOUT):
        if args.workload != "latency":
            report(args, *await fill_then_drain(args, {"noop": "noop", "sleep": "sleepy"}[args.workload], where))
        else:
            store = make_store(args.variant, where)
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
