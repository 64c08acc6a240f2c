"""Procrastinate (PostgreSQL) under the peer workloads (see ../common.py); runs in the peers' venv.

App: ``procrastinate.App(connector=PsycopgConnector(conninfo=PG_DSN))``, opened with
``app.open_async()``, so the connector's ``psycopg_pool.AsyncConnectionPool`` is at its
defaults (4 connections, checked on every checkout, as procrastinate configures it) and the
worker's LISTEN takes one connection of its own. Tasks are ``async def`` functions declared
with ``@app.task`` at their defaults (queue ``default``, no retry, jobs kept after they finish).
The schema is applied once (``app.schema_manager.apply_schema_async()``) if the
``procrastinate_jobs`` table does not exist; every run then starts with ``procrastinate_jobs``
(and the tables that reference it: events, periodic defers, workers) truncated. PostgreSQL
runs at its defaults (fsync on, synchronous commit), so every deferral and every job status
change is a durable commit.

Worker: what ``procrastinate worker`` runs, in this process and event loop:
``app.run_worker_async(concurrency=--concurrency, wait=True)`` as an asyncio task; every other
option is at its default: LISTEN/NOTIFY on (``listen_notify=True``), the fallback poll every
5 s (``fetch_job_polling_interval``), ``delete_jobs="never"``, signal handlers installed. The
worker fetches jobs one query at a time (``procrastinate_fetch_job_v2``) while it has a free
slot, and records each outcome with one more query (``delete_jobs="never"``: an UPDATE). It is
stopped by cancelling that task, which ``Worker.run`` turns into its graceful stop (side tasks
cancelled, running jobs awaited, the worker row unregistered). Logging is left unconfigured (warnings only), whereas
the CLI logs at INFO, two lines per job. (Procrastinate warns on stderr that the App is defined
in ``__main__``; that matters only to a worker importing tasks by path: here the tasks have
explicit names and run in this very process.)

Enqueue: ``noop`` and ``sleep`` use procrastinate's bulk API, ``task.batch_defer_async`` with
all ``--jobs`` jobs in one call (one ``INSERT`` statement, one commit). ``latency`` defers each
job with ``task.defer_async(t=perf_counter())`` from the same event loop the worker runs on (as
an application embedding the worker would); the worker learns of it through NOTIFY.

Completion: each handler calls ``TRACKER.hit()`` (``TRACKER.hit(t)`` as the first act of the
``latency`` handler), i.e. when the handler has run, before procrastinate records the job as
succeeded; the main task polls the tracker every 1 ms. ``sleep`` handlers ``await
asyncio.sleep(SLEEP)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common

import procrastinate
from common import (
    LATENCY_GAP,
    PG_DSN,
    SLEEP,
    TIMEOUT,
    TRACKER,
    log,
    parse_args,
    perf_counter,
    report,
)

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PG_DSN))


@app.task(name="noop")
async def noop() -> None:
    TRACKER.hit()


@app.task(name="sleepy")
async def sleepy() -> None:
    await asyncio.sleep(SLEEP)
    TRACKER.hit()


@app.task(name="stamp")
async def stamp(t: float) -> None:
    TRACKER.hit(t)


async def clean_state() -> None:
    """Apply the schema if it is missing, then empty the jobs table (and the tables referencing it)."""
    row = await app.connector.execute_query_one_async("SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present")
    if not row["present"]:
        log("procrastinate: applying the schema")
        await app.schema_manager.apply_schema_async()
    await app.connector.execute_query_async(
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, procrastinate_workers"
        " RESTART IDENTITY"
    )


def start_worker(concurrency: int) -> asyncio.Task[None]:
    return asyncio.create_task(app.run_worker_async(concurrency=concurrency, wait=True), name="procrastinate worker")


async def wait_all(worker: asyncio.Task[None], deadline: float) -> None:
    """Poll the tracker every 1 ms until every expected handler has run; fail at the deadline or if the worker ends."""
    while not TRACKER.all_done.is_set():
        if worker.done():
            worker.result()  # raises what ended it
            raise RuntimeError("procrastinate: the worker stopped before every job ran")
        if perf_counter() > deadline:
            raise TimeoutError(f"procrastinate: {TRACKER.count} of {TRACKER.expected} jobs ran within {TIMEOUT} s")
        await asyncio.sleep(0.001)


async def stop_worker(worker: asyncio.Task[None]) -> None:
    worker.cancel()  # procrastinate turns the cancellation into its graceful stop
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(worker, timeout=30)


async def fill_then_drain(
    args: argparse.Namespace, task: procrastinate.tasks.Task[..., None, ...], deadline: float
) -> tuple[float, float]:
    """Defer ``args.jobs`` jobs with no worker running, then time a worker draining them."""
    TRACKER.expect(args.jobs)
    started = perf_counter()
    await task.batch_defer_async(*({} for _ in range(args.jobs)))
    enqueue_s = perf_counter() - started
    started = perf_counter()
    worker = start_worker(args.concurrency)
    try:
        await wait_all(worker, deadline)
        drain_s = perf_counter() - started
    finally:
        await stop_worker(worker)
    return enqueue_s, drain_s


async def main() -> None:
    args = parse_args("procrastinate", ("default",))
    deadline = perf_counter() + TIMEOUT
    async with app.open_async():
        await clean_state()
        if args.workload != "latency":
            report(args, *await fill_then_drain(args, {"noop": noop, "sleep": sleepy}[args.workload], deadline))
        else:
            TRACKER.expect(args.jobs)
            worker = start_worker(args.concurrency)
            try:
                await asyncio.sleep(0.5)  # idle worker: registered, listening, waiting on NOTIFY
                for _ in range(args.jobs):
                    await stamp.defer_async(t=perf_counter())
                    await asyncio.sleep(LATENCY_GAP)
                await wait_all(worker, deadline)
            finally:
                await stop_worker(worker)
            report(args)
    log(f"procrastinate {args.workload}: {TRACKER.count} jobs ran")


if __name__ == "__main__":
    asyncio.run(main())
