"""PostgresStore's named queues, pauses and deadlines across nodes, and the plans that keep them cheap.

The store-independent behaviour is the conformance suite's (``_cases_queues``); these check what only a
shared database has: a schema of version 1 upgraded in place, a pause or an expiry on one node seen by
another, and the indexes the claims read. Sessions run on a fake wall clock (the tests move it); the
only real waits are for notifications between nodes, bounded by ``fail_after``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
from trioq import InvalidJob, Job, JobState
from trioq._model import deadline_error
from trioq.stores import ClaimRequest, NewJob, Released, StoreConfig
from trioq.stores.postgres import _transitions as sql
from trioq.stores.postgres._schema import MIGRATIONS, SCHEMA_VERSION, migrate

from .pgplans import START, Clock, Recording, claim_plan, jobs_scans

pytestmark = pytest.mark.slow

#: Bounds each wait for another node's notification (they arrive within milliseconds).
HEARD_WITHIN = 5.0


class Heard:
    """One node's hints: the ``on_ready`` counts and the ``on_finished`` snapshots, each setting an event."""

    def __init__(self) -> None:
        self.ready: list[int] = []
        self.finished: list[Job] = []
        self.watched: set[str] = set()
        self.changed = trio.Event()

    def on_ready(self, n: int) -> None:
        self.ready.append(n)
        self.changed.set()

    def on_finished(self, job: Job) -> None:
        self.finished.append(job)
        self.changed.set()

    async def until(self, what: str, check: Any) -> None:
        """Until ``check()`` holds, woken by each hint; fails after :data:`HEARD_WITHIN` seconds."""
        with trio.fail_after(HEARD_WITHIN):
            while not check():
                self.changed = trio.Event()
                await self.changed.wait()


@asynccontextmanager
async def _node(
    dsn: str, schema: str, clock: Clock, node: str, heard: Heard | None = None
) -> AsyncIterator[trioq.PostgresStore]:
    """A session of a PostgresStore on ``schema`` as node ``node``, its hints going to ``heard``."""
    heard = Heard() if heard is None else heard
    store = trioq.PostgresStore(dsn, schema=schema)
    config = StoreConfig(
        clock=clock, node=node, on_ready=heard.on_ready, watched=heard.watched, on_finished=heard.on_finished
    )
    async with store.session(config):
        yield store


def _job(queue: str = "default", *, priority: int = 0, deadline: float | None = None, delay: float = 0.0) -> NewJob:
    return NewJob("t", {}, priority, None, 3, delay, queue, None, deadline)


def _schema() -> str:
    return f"q_{secrets.token_hex(4)}"


# ------------------------------------------------------------ the upgrade


def test_a_version_1_schema_is_upgraded_in_place_keeping_its_jobs(pg_dsn: str) -> None:
    """A schema migrated by the trioq before queues (version 1) gets version 2's columns, indexes and
    table when a store opens it; its jobs are in the queue "default", without tenant or deadline."""
    schema = _schema()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # What migrate() of version 1 made: the schema, its migrations table, MIGRATIONS[0].
        with conn.transaction():
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE TABLE {schema}.migrations (version integer PRIMARY KEY, applied_at timestamptz"
                         " NOT NULL DEFAULT now())")  # fmt: skip
            for statement in MIGRATIONS[0]:
                conn.execute(statement.format(s=schema))
            conn.execute(f"INSERT INTO {schema}.migrations (version) VALUES (1)")
            conn.execute(
                f"INSERT INTO {schema}.jobs (id, task, payload, state, priority, max_attempts, run_at, created_at)"
                " VALUES ('old-1', 't', '{\"n\": 1}', 'ready', 0, 3, %s, %s)",
                (START, START),
            )
        refused = trioq.PostgresStore(pg_dsn, schema=schema, migrate=False)

    async def run() -> None:
        with pytest.raises(RuntimeError, match=f"at version 1, this trioq needs {SCHEMA_VERSION}"):
            async with refused.session(StoreConfig(clock=Clock())):
                pass  # pragma: no cover - the session refuses to open
        async with _node(pg_dsn, schema, Clock(), "a") as store:
            old = await store.get("old-1")
            assert (old.payload, old.queue, old.tenant, old.deadline) == ({"n": 1}, "default", None, None)
            assert await store.pause("default") is True
            assert await store.claim(ClaimRequest("a", 5)) == []
            assert await store.resume("default") is True
            (claimed,) = await store.claim(ClaimRequest("a", 5, queues=("default",)))
            assert claimed.id == "old-1" and claimed.queue == "default"

    trio.run(run)
    with psycopg.connect(pg_dsn) as conn:
        versions = [row[0] for row in conn.execute(f"SELECT version FROM {schema}.migrations ORDER BY version")]
        indexes = {row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))}
        assert migrate(conn, schema) == (SCHEMA_VERSION, SCHEMA_VERSION)  # nothing left to do
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert {"jobs_ready", "jobs_queue_ready", "jobs_deadline", "paused_pkey"} <= indexes


# ----------------------------------------------------------- the columns


async def test_every_insert_path_writes_queue_tenant_and_deadline(pg_dsn: str) -> None:
    """The INSERT of a small batch, the COPY of a large one and ``add_tx`` all write the three columns;
    the deadline as the store's now plus the seconds given."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as store:
        small = await store.add([NewJob("t", {}, 0, None, 3, 0.0, "email", "acme", 5.0)])
        large = await store.add([NewJob("t", {}, 0, None, 3, 0.0, "bulk", f"t{i}", 7.0) for i in range(300)])

        def in_transaction() -> list[Job]:
            with psycopg.connect(pg_dsn) as conn, conn.transaction():
                return store.add_tx(conn, [NewJob("t", {}, 0, None, 3, 0.0, "tx", "who", 9.0)], clock.now)

        tx = await trio.to_thread.run_sync(in_transaction)
        for job in (*small, *large, *tx):
            assert await store.get(job.id) == job
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT queue, tenant, deadline, count(*) FROM {schema}.jobs GROUP BY 1, 2, 3"
                            " ORDER BY 1, 2").fetchall()  # fmt: skip
    assert rows[0] == ("bulk", "t0", START + 7.0, 1) and len(rows) == 302
    assert ("email", "acme", START + 5.0, 1) in rows and ("tx", "who", START + 9.0, 1) in rows


async def test_a_tenant_or_deadline_the_store_cannot_hold_adds_nothing(pg_dsn: str) -> None:
    async with _node(pg_dsn, _schema(), Clock(), "a") as store:
        for bad, field in ((_job("x" * 256), "queue"), (NewJob("t", {}, 0, None, 3, 0.0, "q", "\x00"), "tenant"),
                           (NewJob("t", {}, 0, None, 3, 0.0, "q", None, float("nan")), "deadline"),
                           (NewJob("t", {}, 0, None, 3, 0.0, "q", None, -1.0), "deadline")):  # fmt: skip
            with pytest.raises(InvalidJob) as caught:
                await store.add([_job(), bad])
            assert caught.value.field == f"jobs[1].{field}"
        assert (await store.counts())["ready"] == 0


# ---------------------------------------------------------------- pauses


async def test_a_pause_on_one_node_stops_claims_on_another_until_resumed(pg_dsn: str) -> None:
    """Node b claimed before node a paused "email" (so b believes nothing is paused): b's next claims
    still take no "email" job, of every queue or of "email" alone; a's resume wakes b (its notification)
    and b's next claim takes them."""
    schema, clock, heard_b = _schema(), Clock(), Heard()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b", heard_b) as b:
        assert await b.claim(ClaimRequest("b", 5)) == []  # b has looked: nothing due, nothing paused
        email = await a.add([_job("email", priority=9), _job("email", priority=9)])
        (plain,) = await a.add([_job()])
        await heard_b.until("b hears the adds", lambda: sum(heard_b.ready) >= 3)  # none comes after the clear
        assert await a.pause("email") is True
        assert await b.paused() == ["email"]
        b._paused_known.clear()  # as if b had not asked: its claims read the pause all the same
        assert [job.id for job in await b.claim(ClaimRequest("b", 5))] == [plain.id]
        assert await b.claim(ClaimRequest("b", 5, queues=("email",))) == []
        assert await b.claim(ClaimRequest("b", 5, queues=("email", "default"))) == []
        assert {(await b.get(job.id)).state for job in email} == {JobState.READY}
        heard_b.ready.clear()
        assert await a.resume("email") is True
        await heard_b.until("b hears the resume", lambda: sum(heard_b.ready) >= 2)
        assert await b.paused() == []
        claimed = await b.claim(ClaimRequest("b", 5, queues=("email",)))
        assert sorted(job.id for job in claimed) == sorted(job.id for job in email)


async def test_a_claim_of_every_queue_skips_a_paused_queue_while_its_node_knows_of_the_pause(pg_dsn: str) -> None:
    """With a queue paused that is ahead in priority order, the claims of every queue (which then walk
    the queues) take the other queues' jobs in the usual order, and none of the paused one's."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        await a.add([_job("bulk", priority=10) for _ in range(50)])
        others = await a.add([_job("a", priority=1), _job("b", priority=2), _job("a"), _job("c", priority=2)])
        assert await a.pause("bulk") is True
        claimed = [job.id for job in await a.claim(ClaimRequest("a", 3))]
        claimed += [job.id for job in await a.claim(ClaimRequest("a", 3))]
        assert claimed == [others[1].id, others[3].id, others[0].id, others[2].id]
        assert await a.resume("bulk") is True
        assert {job.queue for job in await a.claim(ClaimRequest("a", 50))} == {"bulk"}


# ------------------------------------------------------------- deadlines


async def test_an_expiry_at_a_claim_is_heard_by_a_watcher_on_another_node(pg_dsn: str) -> None:
    """Node a adds a job due in 5 s and claims after its deadline: the claim takes the other job and
    cancels it (before picking), and node b, waiting for it, gets its terminal snapshot."""
    schema, clock, heard_b = _schema(), Clock(), Heard()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b", heard_b):
        late, fine = await a.add([_job(priority=5, deadline=5.0), _job()])
        heard_b.watched.add(late.id)
        clock.now += 5.0
        assert [job.id for job in await a.claim(ClaimRequest("a", 2))] == [fine.id]
        await heard_b.until("b hears the expiry", lambda: bool(heard_b.finished))
    (seen,) = heard_b.finished
    assert (seen.id, seen.state, seen.attempts, seen.epoch) == (late.id, JobState.CANCELLED, 0, 0)
    assert seen.finished_at == clock.now and seen.deadline == START + 5.0
    assert seen.error == deadline_error(START, START + 5.0)


async def test_a_claim_on_a_node_that_knows_deadlines_are_used_expires_another_nodes_job(pg_dsn: str) -> None:
    """Node b learned at a promote that deadlines are in use; a job node a adds later is past its
    deadline at b's next claim: b's claim leaves it and cancels it at once, and a's watcher hears it."""
    schema, clock, heard_a = _schema(), Clock(), Heard()
    async with _node(pg_dsn, schema, clock, "a", heard_a) as a, _node(pg_dsn, schema, clock, "b") as b:
        await a.add([_job("far", deadline=100.0)])
        assert await b.promote() == START + 100.0
        late, fine = await a.add([_job(priority=5, deadline=2.0), _job()])
        heard_a.watched.add(late.id)
        clock.now += 2.0
        assert [job.id for job in await b.claim(ClaimRequest("b", 1, queues=("default",)))] == [fine.id]
        assert (await b.get(late.id)).state is JobState.CANCELLED  # by b's claim, not by a later promote
        await heard_a.until("a hears the expiry", lambda: bool(heard_a.finished))
    assert [(job.id, job.state) for job in heard_a.finished] == [(late.id, JobState.CANCELLED)]


async def test_promote_on_a_node_that_never_heard_of_a_deadline_expires_it(pg_dsn: str) -> None:
    """Node b (opened before the job existed, so it knows of no deadline) never claims a job past its
    deadline, even ahead in priority; its promote cancels it (a scheduled one too) and says what is next;
    node a's watcher hears the cancel."""
    schema, clock, heard_a = _schema(), Clock(), Heard()
    async with _node(pg_dsn, schema, clock, "a", heard_a) as a, _node(pg_dsn, schema, clock, "b") as b:
        assert await b.claim(ClaimRequest("b", 5)) == []  # b has looked: no deadline in use
        ready, scheduled, fine, later = await a.add(
            [_job(priority=5, deadline=3.0), _job(delay=10.0, deadline=3.0), _job(), _job(delay=50.0)]
        )
        heard_a.watched.update({ready.id, scheduled.id})
        clock.now += 3.0
        assert [job.id for job in await b.claim(ClaimRequest("b", 5))] == [fine.id]
        assert (await b.get(ready.id)).state is JobState.READY  # left, not claimed: b did not know
        assert await b.promote() == START + 50.0
        assert {(await b.get(job.id)).state for job in (ready, scheduled)} == {JobState.CANCELLED}
        await heard_a.until("a hears both", lambda: len(heard_a.finished) == 2)
        assert (await b.get(later.id)).state is JobState.SCHEDULED
        assert {job.error for job in heard_a.finished} == {deadline_error(START, START + 3.0)}


async def test_a_started_job_and_a_retried_one_are_past_their_deadline(pg_dsn: str) -> None:
    """A job released after its claim, and an expired job retried (its deadline cleared in the row),
    are claimed however late."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        started, expired = await a.add([_job(deadline=1.0), _job("other", deadline=1.0)])
        (claimed,) = await a.claim(ClaimRequest("a", 1, queues=("default",)))
        assert await a.complete([Released(claimed.id, claimed.epoch)]) == [JobState.READY]
        clock.now += 10.0
        assert await a.promote() is None
        assert (await a.get(expired.id)).state is JobState.CANCELLED
        assert (await a.retry(expired.id)).deadline is None
        clock.now += 10.0
        claimed_late = await a.claim(ClaimRequest("a", 5))
        assert sorted(job.id for job in claimed_late) == sorted([started.id, expired.id])
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT deadline FROM {schema}.jobs WHERE id = %s", (expired.id,)).fetchone() == (None,)


# ----------------------------------------------------------------- plans


@pytest.fixture
def backlog(pg_dsn: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """A schema whose statistics know one queue: 20,000 ready "bulk" jobs at priority 10 (analysed),
    then 200 "default" and 20 "email" jobs at priority 0 the statistics have not seen."""
    schema = _schema()
    with psycopg.connect(pg_dsn, autocommit=True, options="-c enable_bitmapscan=off") as conn:
        migrate(conn, schema)
        fill = (f"INSERT INTO {schema}.jobs (id, task, payload, state, priority, max_attempts, run_at, created_at,"
                " queue) SELECT 'j-' || lpad(g::text, 8, '0'), 't', '{}', 'ready', %s, 3, %s + g, %s, %s"
                " FROM generate_series(%s::int, %s::int) g")  # fmt: skip
        conn.execute(fill, (10, START, START, "bulk", 1, 20_000))
        conn.execute(f"ANALYZE {schema}.jobs")
        conn.execute(fill, (0, START, START, "default", 20_001, 20_200))
        conn.execute(fill, (0, START, START, "email", 20_201, 20_220))
        yield conn, schema


def test_a_claim_of_one_queue_reads_the_queue_index_even_when_the_statistics_do_not_know_it(
    backlog: tuple[psycopg.Connection[Any], str],
) -> None:
    """``jobs_queue_ready``, not ``jobs_ready`` filtered past the 20,000 jobs of another queue (which the
    planner took for a queue its statistics did not know before the claim ordered by the queue first)."""
    conn, schema = backlog
    plan = claim_plan(conn, lambda c: sql.claim(c, schema, "n", 10, None, "t", False, now=START, queues=["email"]))
    picks = [scan for scan in jobs_scans(plan) if "Index Cond" in scan and "queue" in scan["Index Cond"]]
    assert [scan["Index Name"] for scan in picks] == ["jobs_queue_ready"]
    assert all(scan.get("Index Name") != "jobs_ready" for scan in jobs_scans(plan))
    assert all(scan.get("Rows Removed by Filter", 0) == 0 for scan in jobs_scans(plan))
    assert plan["Actual Rows"] == 10 and plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 500


def test_a_claim_of_every_queue_reads_jobs_ready_when_none_is_paused(
    backlog: tuple[psycopg.Connection[Any], str],
) -> None:
    conn, schema = backlog
    plan = claim_plan(conn, lambda c: sql.claim(c, schema, "n", 10, None, "t", False, now=START))
    assert "jobs_ready" in {scan.get("Index Name") for scan in jobs_scans(plan)}
    assert "jobs_queue_ready" not in {scan.get("Index Name") for scan in jobs_scans(plan)}
    assert plan["Actual Rows"] == 10


def test_a_paused_backlog_is_stepped_over_by_the_walk_and_read_without_it(
    backlog: tuple[psycopg.Connection[Any], str],
) -> None:
    """With "bulk" (20,000 jobs ahead in priority order) paused, the walk of the queues reads a few
    hundred pages and filters no row; reading jobs_ready in order filters all 20,000 each claim."""
    conn, schema = backlog
    conn.execute(f"INSERT INTO {schema}.paused (queue, paused_at) VALUES ('bulk', %s)", (START,))
    walk = claim_plan(conn, lambda c: sql.claim(c, schema, "n", 10, None, "t", False, now=START, walk=True))
    ready = claim_plan(conn, lambda c: sql.claim(c, schema, "n", 10, None, "t", False, now=START))
    assert walk["Actual Rows"] == ready["Actual Rows"] == 10
    assert sum(scan.get("Rows Removed by Filter", 0) for scan in jobs_scans(walk)) == 0
    assert sum(scan.get("Rows Removed by Filter", 0) for scan in jobs_scans(ready)) >= 20_000
    walk_pages, ready_pages = (p["Shared Hit Blocks"] + p.get("Shared Read Blocks", 0) for p in (walk, ready))
    assert walk_pages < 500 and walk_pages * 3 < ready_pages


def test_the_expiry_and_the_next_deadline_read_the_deadline_index(backlog: tuple[psycopg.Connection[Any], str]) -> None:
    """A deadline on one job of the 20,220: the look-ups of due and next deadlines read jobs_deadline."""
    conn, schema = backlog
    conn.execute(f"UPDATE {schema}.jobs SET deadline = %s WHERE id = 'j-00020220'", (START + 5,))
    recording = Recording(one=(None, START + 5, [], None))  # what the first look finds: a deadline due
    sql.promote(recording, schema, START + 10, "ch", "n")
    (next_due, _), *_ = recording.sent
    with conn.transaction(force_rollback=True):
        for query, params in [(next_due, None), *recording.sent[1:2]]:
            text = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query, params, prepare=False).fetchall())
            assert "jobs_deadline" in text and "Seq Scan on jobs" not in text
    assert "min(deadline)" in next_due and "ORDER BY deadline" in recording.sent[1][0]


# ---------------------------------------------------------- the runtime


async def test_a_job_nobody_starts_in_time_ends_a_wait_on_another_node(pg_dsn: str) -> None:
    """Two nodes with no workers on the real clock: the enqueueing node's timer (told of the deadline)
    cancels the job 0.2 s after its enqueue, and ``wait()`` on the other node returns it cancelled,
    well before its one-second poll."""
    registry = trioq.Registry()

    @registry.task
    async def never(ctx: trioq.JobContext) -> None:
        raise AssertionError("no worker runs it")  # pragma: no cover

    schema = _schema()
    stores = [trioq.PostgresStore(pg_dsn, schema=schema) for _ in range(2)]
    async with (
        trioq.open_queue(registry, store=stores[0], workers=0) as front,
        trioq.open_queue(registry, store=stores[1], workers=0) as other,
    ):
        job = await front.enqueue("never", deadline=0.2)
        start = trio.current_time()
        done = await other.wait(job.id, timeout=5)
        took = trio.current_time() - start
    assert done.state is JobState.CANCELLED and done.attempts == 0
    assert done.error == deadline_error(job.created_at, job.created_at + 0.2)
    assert 0.15 <= took < 0.9
