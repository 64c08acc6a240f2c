"""Dramatiq (Redis broker) under the peer workloads (see ../common.py); runs in the peers' venv.

Broker: ``dramatiq.brokers.redis.RedisBroker(url=REDIS_URL)`` with its default middleware
(AgeLimit, TimeLimit, ShutdownNotifications, Callbacks, Pipelines, Retries) and no result
backend; actors are plain ``@dramatiq.actor`` functions at their defaults (queue ``default``,
priority 0, up to 20 retries). The Redis database is flushed (``FLUSHDB``) at the start of
every run.

Worker: what one process of the ``dramatiq`` CLI runs, in this process: the broker's
``process_boot`` signal (starts TimeLimit's watchdog thread), then
``dramatiq.Worker(broker, worker_threads=--concurrency).start()``; every other knob is at its
default: ``worker_timeout`` 1,000 ms (the consumer's idle poll backs off from 5 ms up to that),
prefetch ``2 * worker_threads`` messages. It ends with ``worker.stop()`` and ``broker.close()``.
The CLI's own default is one process per CPU with 8 threads each; this adapter runs one process
with ``--concurrency`` threads instead, because "concurrency" is the number of jobs that may run
at once, which is what every other adapter sets, and the other libraries run their worker in
one process too (one event loop each). Handlers are synchronous and run in the worker's
threads, so ``sleep`` jobs block their thread in ``time.sleep(SLEEP)``.

Enqueue: Dramatiq has no bulk enqueue (``group(...).run()`` is a loop over
``broker.enqueue``, one Lua script call per message), so ``noop`` and ``sleep`` enqueue with
``actor.send()`` in a loop, one Redis round trip per job. ``latency`` sends each job from the
main thread while the worker's threads poll Redis (no push notification: the consumer polls,
backing off while idle), and the job carries its ``perf_counter()`` as its argument. That
backoff shows in ``latency``: after the 0.5 s idle wait the consumer is in a sleep of up to
~640 ms (doubling, jittered, capped at ``worker_timeout``), and every job sent before it wakes
waits for it (up to ~100 of the 500, latencies falling from ~0.5 s to a few ms), so ``p99_ms``
swings from ~10 ms to ~600 ms with where the first send lands in that sleep; once jobs flow, a
miss sleeps only 5-10 ms, which sets ``p50_ms``.

Completion: each handler calls ``TRACKER.hit()`` (``TRACKER.hit(t)`` as the first act of the
``latency`` handler), i.e. when the handler has run, before Dramatiq acks the message; the main
thread waits on the tracker's event.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common

import dramatiq
from common import (
    LATENCY_GAP,
    REDIS_URL,
    SLEEP,
    TIMEOUT,
    TRACKER,
    log,
    parse_args,
    perf_counter,
    report,
)
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor
def noop() -> None:
    TRACKER.hit()


@dramatiq.actor
def sleepy() -> None:
    time.sleep(SLEEP)
    TRACKER.hit()


@dramatiq.actor
def stamp(t: float) -> None:
    TRACKER.hit(t)


def wait_all(deadline: float) -> None:
    """Block until every expected handler has run, or fail at the deadline."""
    if not TRACKER.all_done.wait(max(0.0, deadline - perf_counter())):
        raise TimeoutError(f"dramatiq: {TRACKER.count} of {TRACKER.expected} jobs ran within {TIMEOUT} s")


def start_worker(concurrency: int) -> dramatiq.Worker:
    worker = dramatiq.Worker(broker, worker_threads=concurrency)
    worker.start()
    return worker


def fill_then_drain(args: argparse.Namespace, actor: dramatiq.Actor, deadline: float) -> tuple[float, float]:
    """Enqueue ``args.jobs`` messages with no worker running, then time a worker draining them."""
    TRACKER.expect(args.jobs)
    started = perf_counter()
    for _ in range(args.jobs):
        actor.send()
    enqueue_s = perf_counter() - started
    started = perf_counter()
    worker = start_worker(args.concurrency)
    try:
        wait_all(deadline)
        drain_s = perf_counter() - started
    finally:
        worker.stop(timeout=10_000)
    return enqueue_s, drain_s


def main() -> None:
    args = parse_args("dramatiq", ("default",))
    deadline = perf_counter() + TIMEOUT
    broker.client.flushdb()
    broker.emit_after("process_boot")  # as each process of the dramatiq CLI does before its Worker
    try:
        if args.workload != "latency":
            report(args, *fill_then_drain(args, {"noop": noop, "sleep": sleepy}[args.workload], deadline))
        else:
            TRACKER.expect(args.jobs)
            worker = start_worker(args.concurrency)
            try:
                time.sleep(0.5)  # idle worker: its threads and consumers are up and polling
                for _ in range(args.jobs):
                    stamp.send(perf_counter())
                    time.sleep(LATENCY_GAP)
                wait_all(deadline)
            finally:
                worker.stop(timeout=10_000)
            report(args)
    finally:
        broker.close()
        log(f"dramatiq {args.workload}: {TRACKER.count} jobs ran")


if __name__ == "__main__":
    main()
