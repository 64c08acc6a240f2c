"""What every adapter in ``benchmarks/peers/adapters/`` shares (standard library only).

Each adapter runs one workload of one library in its own process and prints one
JSON line. The peers' adapters run in the peers' venv (see ``setup.sh``), the
trioq adapter in trioq's own; ``run.py`` starts them and interleaves them.

Command line of every adapter::

    python adapters/LIB.py WORKLOAD [--variant V] [--jobs N] [--concurrency C]

Workloads (the same for every library; each adapter runs its library's worker
in the adapter's own process, so completion is observed without a round trip):

``noop``
    Enqueue ``--jobs`` (10,000) no-op jobs, with the library's bulk API where it
    has one, timed: ``enqueue_per_s``. Then start a worker at ``--concurrency``
    (100) and time it from its start until every job has run: ``drain_per_s``.
``latency``
    Start an idle worker (concurrency 16), wait until it is polling, then enqueue
    ``--jobs`` (500) jobs 5 ms apart; each carries ``time.perf_counter()`` taken
    just before its enqueue call, and the handler's first act is to record
    ``perf_counter() - that``: ``p50_ms``, ``p99_ms``.
``sleep``
    Enqueue ``--jobs`` (2,000) jobs that each sleep 20 ms, then time a worker at
    ``--concurrency`` (16 or 64) draining them: ``jobs_per_s`` and
    ``efficiency`` = ``jobs_per_s / (concurrency / 0.020)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

perf_counter = time.perf_counter

WORKLOADS = ("noop", "latency", "sleep")
DEFAULT_JOBS = {"noop": 10_000, "latency": 500, "sleep": 2_000}
DEFAULT_CONCURRENCY = {"noop": 100, "latency": 16, "sleep": 16}
#: Seconds each ``sleep`` job sleeps; seconds between ``latency`` enqueues.
SLEEP = 0.020
LATENCY_GAP = 0.005
#: No workload may run longer than this (a stuck peer must not hang the run).
TIMEOUT = float(os.environ.get("PEERS_TIMEOUT", "300"))

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0")
PG_DSN = os.environ.get("PG_DSN", "postgresql://postgres@127.0.0.1:5439/bench")


def parse_args(lib: str, variants: tuple[str, ...]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"{lib} under the trioq peer benchmark workloads")
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--variant", choices=variants, default=variants[0])
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--concurrency", type=int)
    args = parser.parse_args()
    args.lib = lib
    if args.jobs is None:
        args.jobs = DEFAULT_JOBS[args.workload]
    if args.concurrency is None:
        args.concurrency = DEFAULT_CONCURRENCY[args.workload]
    return args


class Tracker:
    """Counts handler runs and keeps latencies; safe from any thread."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self.first_at: float | None = None
        self._lock = threading.Lock()
        self.all_done = threading.Event()
        self.expected = 0

    def expect(self, n: int) -> None:
        with self._lock:
            self.count = 0
            self.expected = n
            self.latencies.clear()
            self.all_done.clear()

    def hit(self, enqueued_at: float | None = None) -> None:
        now = perf_counter()
        with self._lock:
            if enqueued_at is not None:
                self.latencies.append(now - enqueued_at)
            self.count += 1
            if self.count >= self.expected:
                self.all_done.set()


TRACKER = Tracker()


def report(args: argparse.Namespace, enqueue_s: float = 0.0, drain_s: float = 0.0) -> None:
    """Print the one JSON line of this run: the workload's figures from its timings.

    ``noop`` reports both rates, ``sleep`` the drain's efficiency, ``latency``
    the percentiles the Tracker collected (timings unused).
    """
    line: dict[str, Any] = {"lib": args.lib, "variant": args.variant, "workload": args.workload, "jobs": args.jobs}
    if args.workload == "noop":
        line["concurrency"] = args.concurrency
        line.update(enqueue_per_s=round(args.jobs / enqueue_s, 1), drain_per_s=round(args.jobs / drain_s, 1))
    elif args.workload == "sleep":
        rate = args.jobs / drain_s
        line["concurrency"] = args.concurrency
        line.update(jobs_per_s=round(rate, 1), efficiency=round(rate / (args.concurrency / SLEEP), 4))
    else:
        line.update(_latency_figures(TRACKER.latencies))
    if getattr(args, "open_s", None) is not None:
        line["open_s"] = args.open_s  # seconds spent opening the draining queue (an adapter that times it)
    print(json.dumps(line), flush=True)


def _latency_figures(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3), "p99_ms": round(p99 * 1000, 3)}


async def gather_in_chunks(jobs: int, enqueue: Callable[[], Awaitable[Any]], chunk: int = 100) -> None:
    """``jobs`` calls of ``enqueue``, ``chunk`` at a time under ``asyncio.gather`` (no bulk API)."""
    import asyncio

    for first in range(0, jobs, chunk):
        await asyncio.gather(*(enqueue() for _ in range(min(chunk, jobs - first))))


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` every millisecond (asyncio adapters; the Tracker is thread-based)."""
    import asyncio

    while not predicate():  # noqa: ASYNC110 (TRACKER holds a threading.Event)
        await asyncio.sleep(0.001)


async def clear_redis(patterns: tuple[str, ...]) -> None:
    """Delete the keys matching ``patterns`` (not FLUSHDB: adapters may share the Redis database)."""
    import redis.asyncio as aioredis  # only in the peers' venv

    client = aioredis.from_url(REDIS_URL)
    try:
        for pattern in patterns:
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            for first in range(0, len(keys), 1000):
                await client.delete(*keys[first : first + 1000])
    finally:
        await client.aclose()


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)
