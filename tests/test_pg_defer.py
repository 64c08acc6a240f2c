"""PostgresStore's deferred jobs (``StoreConfig.defer_past``): what only a shared database has.

The bound is global: every node counts the same ready and scheduled jobs, a claim on one node admits the
jobs another deferred, admission happens when a session opens, and concurrent adds and claims on two
nodes never lose nor duplicate a job. Sessions run on a fake wall clock.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
from trioq import JobState
from trioq.stores import ClaimRequest, NewJob, StoreConfig, Succeeded
from trioq.stores.postgres import _defer
from trioq.stores.postgres._schema import MIGRATIONS

from .pgplans import START, Clock, Recording

pytestmark = pytest.mark.slow


def _schema() -> str:
    return f"defer_{secrets.token_hex(4)}"


def _job(i: int = 0, *, tenant: str | None = None, delay: float = 0.0, deadline: float | None = None,
         key: str | None = None) -> NewJob:  # fmt: skip
    return NewJob("t", {"i": i}, 0, key, 3, delay, "default", tenant, deadline)


class Heard:
    def __init__(self) -> None:
        self.ready: list[int] = []
        self.scheduled: list[float] = []


@asynccontextmanager
async def _node(
    dsn: str,
    schema: str,
    clock: Clock,
    node: str,
    defer_past: int | None,
    heard: Heard | None = None,
    fairness: Mapping[str, float] | None = None,
) -> AsyncIterator[trioq.PostgresStore]:
    heard = Heard() if heard is None else heard
    store = trioq.PostgresStore(dsn, schema=schema)
    config = StoreConfig(
        clock=clock,
        node=node,
        defer_past=defer_past,
        fairness=fairness,
        on_ready=heard.ready.append,
        on_scheduled=heard.scheduled.append,
    )
    async with store.session(config):
        yield store


def _payloads(jobs: list[trioq.Job]) -> list[Any]:
    return [job.payload["i"] for job in jobs]


async def test_two_nodes_share_the_bound_and_admit_each_others_jobs(pg_dsn: str) -> None:
    """Node a fills the bound; node b's adds are deferred (the count is the database's); a claim on a
    admits b's jobs oldest first, in the claim's transaction, and b's workers hear of them."""
    schema, clock = _schema(), Clock()
    heard_b = Heard()
    async with _node(pg_dsn, schema, clock, "a", 3) as a, _node(pg_dsn, schema, clock, "b", 3, heard_b) as b:
        assert [job.state for job in await a.add([_job(0), _job(1), _job(2)])] == [JobState.READY] * 3
        deferred = await b.add([_job(3), _job(4), _job(5)])
        assert [job.state for job in deferred] == [JobState.DEFERRED] * 3
        assert [(await a.get(job.id)).state for job in deferred] == [JobState.DEFERRED] * 3
        counts = await a.counts()
        assert (counts["ready"], counts["deferred"]) == (3, 3)
        assert _payloads(await a.claim(ClaimRequest("a", 2))) == [0, 1]
        counts = await b.counts()
        assert (counts["ready"], counts["running"], counts["deferred"]) == (3, 2, 1)
        assert _payloads(await b.jobs([JobState.READY])) == [2, 3, 4]  # the oldest two deferred went first
        # A new job waits behind the one still deferred.
        (late,) = await a.add([_job(6)])
        assert late.state is JobState.DEFERRED
        assert _payloads(await b.claim(ClaimRequest("b", 5))) == [2, 3, 4]
        assert _payloads(await b.jobs([JobState.READY])) == [5, 6]
        assert (await b.counts())["deferred"] == 0


async def test_admission_after_cancels_and_into_scheduled(pg_dsn: str) -> None:
    """Cancelling a ready job admits the oldest deferred one in the cancel's transaction; a deferred job
    whose run time is still ahead is admitted to scheduled (the timer hears), one past it to ready."""
    schema, clock = _schema(), Clock()
    heard = Heard()
    async with _node(pg_dsn, schema, clock, "a", 2, heard) as store:
        first, _ = await store.add([_job(0), _job(1)])
        later, now = await store.add([_job(2, delay=60.0), _job(3)])
        assert (later.state, now.state) == (JobState.DEFERRED, JobState.DEFERRED)
        heard.scheduled.clear()
        cancelled = await store.cancel(first.id)
        assert cancelled.changed and cancelled.job.state is JobState.CANCELLED
        assert (await store.get(later.id)).state is JobState.SCHEDULED
        assert heard.scheduled == [START + 60.0]
        assert (await store.get(now.id)).state is JobState.DEFERRED
        cancelled = await store.cancel(now.id)  # a deferred job is cancelled like any waiting one
        assert cancelled.job.state is JobState.CANCELLED
        assert await store.has_pending()


async def test_deferred_jobs_survive_a_restart_and_are_admitted_at_open(pg_dsn: str) -> None:
    """Deferred jobs are rows like any other: a new session finds them deferred, and a session that opens
    with room (here a larger bound) admits them as it opens."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", 2) as store:
        jobs = await store.add([_job(i) for i in range(5)])
        assert [job.state for job in jobs] == [JobState.READY] * 2 + [JobState.DEFERRED] * 3
    async with _node(pg_dsn, schema, clock, "a", 2) as store:
        assert (await store.counts())["deferred"] == 3
    heard = Heard()
    async with _node(pg_dsn, schema, clock, "b", 4, heard) as store:
        counts = await store.counts()
        assert (counts["ready"], counts["deferred"]) == (4, 1)
        assert sum(heard.ready) >= 2
        assert _payloads(await store.jobs([JobState.DEFERRED])) == [4]


async def test_a_deferred_jobs_deadline_runs(pg_dsn: str) -> None:
    """A deferred job past its deadline is cancelled by promote, on any node, never admitted; its deadline
    was passed to the timer."""
    schema, clock = _schema(), Clock()
    heard = Heard()
    async with _node(pg_dsn, schema, clock, "a", 1, heard) as a, _node(pg_dsn, schema, clock, "b", 1) as b:
        await a.add([_job(0)])
        (waiting,) = await a.add([_job(1, deadline=5.0)])
        assert waiting.state is JobState.DEFERRED and START + 5.0 in heard.scheduled
        clock.now = START + 6.0
        assert await b.promote() is None
        gone = await a.get(waiting.id)
        assert gone.state is JobState.CANCELLED and gone.error is not None and "DeadlineExpired" in gone.error
        assert (await a.counts())["deferred"] == 0


async def test_keys_are_held_by_deferred_jobs(pg_dsn: str) -> None:
    """An idempotency key held by a deferred job answers with that job."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", 1) as store:
        await store.add([_job(0)])
        (held,) = await store.add([_job(1, key="k")])
        (again,) = await store.add([_job(2, key="k")])
        assert held.state is JobState.DEFERRED and again.id == held.id


async def test_admission_is_fair_across_tenants(pg_dsn: str) -> None:
    """With fairness, room goes to the tenant furthest behind its share of admissions: a tenant that
    deferred 9 jobs before another deferred 3 does not take all the room."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", 4, fairness={}) as store:
        await store.add([_job(i, tenant="base") for i in range(4)])
        await store.add([_job(i, tenant="noisy") for i in range(9)] + [_job(i, tenant="small") for i in range(3)])
        claimed = await store.claim(ClaimRequest("a", 4))
        assert {job.tenant for job in claimed} == {"base"}
        admitted = await store.jobs([JobState.READY])
        assert sorted(job.tenant or "" for job in admitted) == ["noisy", "noisy", "small", "small"]


async def test_two_nodes_adding_and_claiming_at_once_lose_and_duplicate_nothing(pg_dsn: str) -> None:
    """Two nodes adding 150 jobs each and claiming at once under a bound of 20: every job runs exactly
    once, and the ready and scheduled jobs stay within a few of the bound."""
    schema, clock = _schema(), Clock()
    peak = deferred_peak = 0
    async with _node(pg_dsn, schema, clock, "a", 20) as a, _node(pg_dsn, schema, clock, "b", 20) as b:
        claimed: list[str] = []
        done = trio.Event()

        async def produce(store: trioq.PostgresStore, base: int) -> None:
            for start in range(0, 150, 5):
                await store.add([_job(base + i) for i in range(start, start + 5)])

        async def consume(store: trioq.PostgresStore, node: str) -> None:
            while not done.is_set() or await store.has_pending():
                jobs = await store.claim(ClaimRequest(node, 3))
                claimed.extend(job.id for job in jobs)
                await store.complete([Succeeded(job.id, job.epoch) for job in jobs])
                if not jobs:
                    await store.promote()  # what each node's timer does every poll_interval
                    await trio.sleep(0.005)

        async def watch() -> None:
            nonlocal peak, deferred_peak
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                query = (
                    f"SELECT count(*) FILTER (WHERE state IN ('ready', 'scheduled')),"
                    f" count(*) FILTER (WHERE state = 'deferred') FROM {schema}.jobs"
                )
                while not done.is_set():
                    row = await trio.to_thread.run_sync(lambda: conn.execute(query).fetchone())
                    peak = max(peak, int(row[0]))  # type: ignore[index]
                    deferred_peak = max(deferred_peak, int(row[1]))  # type: ignore[index]
                    await trio.sleep(0.002)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, a, "a")
            nursery.start_soon(consume, b, "b")
            nursery.start_soon(watch)
            async with trio.open_nursery() as producers:
                producers.start_soon(produce, a, 0)
                producers.start_soon(produce, b, 1000)
            done.set()
        assert len(claimed) == len(set(claimed)) == 300
        counts = await a.counts()
        assert counts["succeeded"] == 300 and counts["deferred"] == counts["ready"] == 0
    assert peak <= 20 + 2 * 5, peak  # concurrent adds of 5 on two nodes may each see the same room
    assert deferred_peak > 0  # the producers outran the consumers: jobs were deferred and admitted


class _InTransaction(Recording):
    def transaction(self) -> _InTransaction:
        return self


def test_with_nothing_deferred_an_admission_is_one_probe() -> None:
    """An admission on a store where nothing is deferred sends one probe of ``jobs_deferred``: no count."""
    recording = _InTransaction(one=(False,))
    assert not _defer.admit(recording, "s", 10, START, None)
    assert len(recording.sent) == 1 and "state = 'deferred' AND seq > 0 ORDER BY seq LIMIT 1" in recording.sent[0][0]


def test_a_version_2_schema_accepts_deferred_jobs_after_the_upgrade(pg_dsn: str) -> None:
    """Version 3 widens the state CHECK: a version-2 table upgraded in place holds deferred rows."""
    schema = _schema()
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL"
            " DEFAULT now())"
        )
        for version in (1, 2):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement.format(s=schema))
            conn.execute(f"INSERT INTO {schema}.migrations (version) VALUES (%s)", (version,))
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute(
                f"INSERT INTO {schema}.jobs (id, task, payload, state, priority, max_attempts, run_at,"
                " created_at) VALUES ('x', 't', '{}', 'deferred', 0, 3, 0, 0)"
            )

    async def run() -> None:
        async with _node(pg_dsn, schema, Clock(), "a", 1) as store:
            jobs = await store.add([_job(0), _job(1)])
            assert [job.state for job in jobs] == [JobState.READY, JobState.DEFERRED]

    trio.run(run)


async def test_enqueue_tx_defers_in_the_callers_transaction(pg_dsn: str) -> None:
    """``add_tx`` (``enqueue_tx``) defers past the bound as an add does, inside the caller's transaction."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", 1) as store:
        await store.add([_job(0)])

        def in_tx() -> list[trioq.Job]:
            with psycopg.connect(pg_dsn) as conn, conn.transaction():
                return store.add_tx(conn, [_job(1)], clock())

        (job,) = await trio.to_thread.run_sync(in_tx)
        assert job.state is JobState.DEFERRED
        assert (await store.get(job.id)).state is JobState.DEFERRED


class _Timing(_InTransaction):
    """A stand-in that runs each statement on ``conn`` and keeps its plan's buffers (EXPLAIN ANALYZE in a
    savepoint rolled back first)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__()
        self.conn = conn
        self.buffers: list[tuple[str, int]] = []
        self._cur: Any = None

    def transaction(self) -> Any:
        return self.conn.transaction()

    def execute(self, query: str, params: Any = None, prepare: bool | None = None) -> None:
        with self.conn.transaction(force_rollback=True):
            row = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
        assert row is not None
        self.buffers.append((query, int(row[0][0]["Plan"]["Shared Hit Blocks"])))
        self._cur = self.conn.execute(query, params)

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()  # type: ignore[no-any-return]

    def fetchone(self) -> Any:
        return self._cur.fetchone()


async def test_a_fair_admission_reads_the_indexes_with_stale_statistics(pg_dsn: str) -> None:
    """20,000 jobs deferred after the table's statistics were taken (they say none is deferred): a fair
    admission of 100 still reads ``jobs_deferred_tenant`` (a few pages per tenant), not a scan of
    ``jobs_deferred`` and a sort of every deferred job (about 460 pages a probe)."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", 1000, fairness={}) as store:
        await store.add([_job(i, tenant=f"t{i % 10}") for i in range(1000)])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {schema}.jobs")
    async with _node(pg_dsn, schema, clock, "a", 1000, fairness={}) as store:
        for start in range(0, 20_000, 5_000):
            await store.add([_job(i, tenant=f"t{i % 10}") for i in range(start, start + 5_000)])
    with psycopg.connect(pg_dsn, autocommit=True, options="-c enable_bitmapscan=off -c jit=off") as conn:
        conn.execute(
            f"UPDATE {schema}.jobs SET state = 'cancelled' WHERE id IN"
            f" (SELECT id FROM {schema}.jobs WHERE state = 'ready' LIMIT 100)"
        )
        timing = _Timing(conn)
        with conn.transaction(force_rollback=True):
            admitted = _defer.admit(timing, schema, 1000, START, {})
        assert admitted.ready == 100
        reads = [(query, buffers) for query, buffers in timing.buffers if "UPDATE" not in query]
        assert len(reads) >= 4  # the probe, the count, the tenants' heads, their jobs
        for query, buffers in reads:
            assert buffers < 1_000, (buffers, query[:120])


async def test_open_queue_defers_and_runs_every_job_fairly(pg_dsn: str) -> None:
    """Through the runtime: open_queue(max_ready=3, overflow="defer", fairness={}) on PostgreSQL keeps
    the jobs past the bound deferred, join() waits for them, and every one runs once."""
    registry = trioq.Registry()
    ran: list[tuple[str, int]] = []

    @registry.task()
    async def work(ctx: trioq.JobContext, i: int) -> None:
        await trio.sleep(0.01)
        ran.append((ctx.job.tenant or "", i))

    store = trioq.PostgresStore(pg_dsn, schema=_schema())
    with trio.fail_after(60):
        async with trioq.open_queue(
            registry, store=store, workers=2, max_ready=3, overflow="defer", fairness={}
        ) as queue:
            jobs = [await queue.enqueue("work", {"i": i}, tenant="big") for i in range(12)]
            jobs += [await queue.enqueue("work", {"i": i}, tenant="small") for i in range(3)]
            assert (await queue.stats())["jobs"]["deferred"] > 0
            await queue.join()
            states = {(await queue.get(job.id)).state for job in jobs}
    assert states == {JobState.SUCCEEDED}
    assert sorted(ran) == sorted([("big", i) for i in range(12)] + [("small", i) for i in range(3)])
    # Admitted by tenant share: the small tenant's jobs do not wait behind all of the big one's
    # (oldest first, they would run last: 12th to 14th).
    last_small = max(n for n, (tenant, _) in enumerate(ran) if tenant == "small")
    assert last_small < 12, ran
