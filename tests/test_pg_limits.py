"""PostgresStore's limit keys across nodes: slots and rates shared by every node of a schema, slots tied to
leases, and a blocked backlog that claims step over.

The store-independent behaviour is the conformance suite's (``_cases_policies``); these check what only a
shared database has: two nodes claiming at once, a node that dies holding a slot, and the plans. Sessions
run on a fake wall clock (the tests move it).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
from trioq import Job, JobState
from trioq._model import RATE_SLACK, Limit
from trioq.stores import ClaimRequest, NewJob, StoreConfig, Succeeded
from trioq.stores.postgres import _limits
from trioq.stores.postgres import _transitions as sql

from .pgplans import START, Clock, claim_plan, jobs_scans

pytestmark = pytest.mark.slow

LIMITS = {
    "shared": Limit("shared", max=3),
    "api": Limit("api", rate=8.0, per=1.0, burst=2),
    "k": Limit("k", max=1),
    "full": Limit("full", max=1),
}


def _limit_of(key: str) -> Limit | None:
    return LIMITS.get(key)


@asynccontextmanager
async def _node(dsn: str, schema: str, clock: Clock, node: str) -> AsyncIterator[trioq.PostgresStore]:
    store = trioq.PostgresStore(dsn, schema=schema)
    async with store.session(StoreConfig(clock=clock, node=node, limits=_limit_of)):
        yield store


def _job(*limits: str, priority: int = 0) -> NewJob:
    return NewJob("t", {}, priority, None, 3, 0.0, "default", None, None, tuple(limits))


def _schema() -> str:
    return f"l_{secrets.token_hex(4)}"


def _holding(dsn: str, schema: str, key: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.jobs WHERE state = 'running' AND %s = ANY(limits)", (key,)
        ).fetchone()
    assert row is not None
    return int(row[0])


# ----------------------------------------------------------- the columns


async def test_every_insert_path_writes_the_limit_keys(pg_dsn: str) -> None:
    """The INSERT of a small batch, the COPY of a large one and ``add_tx`` keep each job's keys, in order."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as store:
        small = await store.add([_job("b", 'we"ird\\key', "a"), _job()])
        large = await store.add([_job(f"user:{i}", "shared") for i in range(250)])

        def in_transaction() -> list[Job]:
            with psycopg.connect(pg_dsn) as conn, conn.transaction():
                return store.add_tx(conn, [_job("tx")], clock.now)

        tx = await trio.to_thread.run_sync(in_transaction)
        for job in (*small, *large, *tx):
            assert await store.get(job.id) == job
        assert small[0].limits == ("b", 'we"ird\\key', "a") and small[1].limits == ()
        assert large[7].limits == ("user:7", "shared") and tx[0].limits == ("tx",)


# ------------------------------------------------------- across nodes


async def test_two_nodes_claiming_at_once_never_exceed_a_keys_max(pg_dsn: str) -> None:
    """Nodes a and b claim and complete in a loop, concurrently, jobs holding "shared" (max 3) mixed with
    free ones. The recorder counts an attempt from the claim's return to just before its outcome is
    sent (inside the attempt's true span): it never sees more than 3 hold the key, reaches 3, and
    every job runs (no job is left parked behind a free slot)."""
    schema, clock = _schema(), Clock()
    holding: set[str] = set()
    most = 0
    done: list[str] = []
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        jobs = await a.add([_job("shared") if i % 4 else _job() for i in range(120)])
        keyed = {job.id for job in jobs if job.limits}

        async def work(store: trioq.PostgresStore, node: str, seed: int) -> None:
            nonlocal most
            turn = seed
            while len(done) < len(jobs):
                claimed = await store.claim(ClaimRequest(node, 2 + turn % 3))
                mine = [job for job in claimed if job.id in keyed]
                holding.update(job.id for job in mine)
                most = max(most, len(holding))
                assert len(holding) <= 3, f"{len(holding)} attempts hold 'shared'"
                await trio.sleep(0.001 * (turn % 3))
                holding.difference_update(job.id for job in mine)
                if claimed:
                    await store.complete([Succeeded(job.id, job.epoch, None) for job in claimed])
                    done.extend(job.id for job in claimed)
                else:
                    await trio.sleep(0.002)
                turn += 1

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(work, a, "a", 0)
                nursery.start_soon(work, b, "b", 1)
        assert sorted(done) == sorted(job.id for job in jobs)
        assert most == 3
        assert (await a.counts())["succeeded"] == 120


async def test_a_rate_holds_across_two_nodes(pg_dsn: str) -> None:
    """The key "api" allows 8 starts a second, 2 at once: nodes a and b, each promoting and claiming on every
    step of the clock, start no more than ``burst + rate * w`` in any window ``w`` between them, and the
    backlog runs at the rate, not below it (the clock moves in 1/32 s, so every time is exact)."""
    schema, clock = _schema(), Clock()
    starts: list[float] = []
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        await a.add([_job("api") for _ in range(30)])

        async def step(store: trioq.PostgresStore, node: str) -> None:
            await store.promote()
            for job in await store.claim(ClaimRequest(node, 5)):
                starts.append(clock.now)
                await store.complete([Succeeded(job.id, job.epoch, None)])

        for i in range(4 * 32):
            clock.now = START + i / 32
            async with trio.open_nursery() as nursery:
                nursery.start_soon(step, a, "a")
                nursery.start_soon(step, b, "b")
    starts.sort()
    for i, first in enumerate(starts):
        for j in range(i + 1, len(starts)):
            window = starts[j] - first
            assert j - i + 1 <= 2 + 8.0 * (window + RATE_SLACK) + 1e-9, f"{j - i + 1} starts in {window:.3f} s"
    assert len(starts) == 30
    assert starts[:3] == [START, START, START + 0.125] and starts[-1] == START + 28 * 0.125  # at the rate


def _lock_key(conn: psycopg.Connection[Any], schema: str, how: str) -> None:
    """Hold "api" as another transaction may: a node's claim (its advisory lock), or anyone's row lock."""
    if how == "advisory":
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_limits.lock_id(schema, "api"),))
    else:
        conn.execute(f"SELECT tat FROM {schema}.limit_rates WHERE key = 'api' FOR UPDATE")


def _waiting_for_a_lock(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("how", ["advisory", "row"])
async def test_a_claim_that_waited_for_a_keys_lock_charges_its_starts_when_it_got_it(pg_dsn: str, how: str) -> None:
    """Node a asks to claim "api" jobs (8/s, burst 2) while another transaction holds the key (its advisory
    lock, as another node's claim does, or its rate row, as an operator's ``FOR UPDATE`` does); the clock
    moves 1 s on before it lets go. a's jobs start when it gets the key, so their tokens are charged then:
    node b, claiming right after at the same time, starts none, and no window sees more than
    ``burst + rate * w`` starts. (Charged at the time a asked, the bucket would be full again for b.)"""
    schema, clock = _schema(), Clock()
    starts: list[float] = []
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        (first,) = await a.add([_job("api")])  # the key's rate row exists from here on
        (running,) = await a.claim(ClaimRequest("a", 1))
        await a.complete([Succeeded(running.id, running.epoch, None)])
        clock.now = START + 10.0  # the bucket is full again
        await a.add([_job("api") for _ in range(6)])

        async def claim(store: trioq.PostgresStore, node: str) -> None:
            for _ in await store.claim(ClaimRequest(node, 5)):
                starts.append(clock.now)

        with psycopg.connect(pg_dsn) as holder:
            _lock_key(holder, schema, how)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim, a, "a")
                with trio.fail_after(30):
                    while await trio.to_thread.run_sync(_waiting_for_a_lock, pg_dsn) == 0:  # noqa: ASYNC110 (the server's state)
                        await trio.sleep(0.01)
                clock.now = START + 11.0  # a second passes while a waits
                holder.commit()
        await claim(b, "b")
    assert first.id == running.id
    assert starts == [START + 11.0, START + 11.0]  # a's two (the burst); b's none: the bucket is empty


async def test_a_later_batch_that_waited_for_a_key_charges_its_rate_when_it_got_it(pg_dsn: str) -> None:
    """The same, when the wait is in a later batch of the claim: its first batch (17 jobs holding "full",
    which is held, and "one") locks "one" (1/s, burst 1) and parks them all; its second batch's job holds
    "one" and "wait", whose lock another transaction holds while the clock moves 1 s on. That job starts
    when a gets "wait", so its token is charged then and b, claiming a "one" job at that instant, starts
    none. (Charged at the first batch's time, b's start made two at once under burst 1: found by a
    hostile review.)"""
    limits = dict(LIMITS, one=Limit("one", rate=1.0, per=1.0, burst=1), wait=Limit("wait", max=5))
    # The second batch waits only for a lock id above every one the claim holds (below, it only tries).
    schema = next(
        s for s in (_schema() for _ in range(1000))
        if _limits.lock_id(s, "wait") > max(_limits.lock_id(s, "one"), _limits.lock_id(s, "full"))
    )  # fmt: skip
    clock = Clock()
    starts: list[tuple[str, str]] = []
    a, b = trioq.PostgresStore(pg_dsn, schema=schema), trioq.PostgresStore(pg_dsn, schema=schema)
    async with (
        a.session(StoreConfig(clock=clock, node="a", limits=limits.get)),
        b.session(StoreConfig(clock=clock, node="b", limits=limits.get)),
    ):
        await a.add([_job("full", priority=100)])
        assert len(await a.claim(ClaimRequest("z", 1))) == 1  # "full" is held from here on
        await a.add([_job("full", "one", priority=5) for _ in range(17)])  # the first batch: all parked
        (late,) = await a.add([_job("one", "wait", priority=1)])  # the second batch's
        (other,) = await b.add([_job("one", priority=-10)])

        async def claim(store: trioq.PostgresStore, node: str, n: int) -> None:
            for job in await store.claim(ClaimRequest(node, n)):
                starts.append((node, job.id))

        with psycopg.connect(pg_dsn) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_limits.lock_id(schema, "wait"),))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim, a, "a", 1)
                with trio.fail_after(30):
                    while await trio.to_thread.run_sync(_waiting_for_a_lock, pg_dsn) == 0:  # noqa: ASYNC110 (the server's state)
                        await trio.sleep(0.01)
                clock.now = START + 1.0  # a second passes while a waits
                holder.commit()
        await claim(b, "b", 5)
    assert starts == [("a", late.id)], (starts, other.id)  # b's start would be a second one at START + 1


async def test_a_dead_nodes_slot_comes_free_only_when_its_lease_is_rescued(pg_dsn: str) -> None:
    """A node claims a job holding "k" (max 1) and dies (its connection dropped, no session end): the
    slot stays taken while its lease runs, and is free, with the job waiting on it claimable, once the
    leader rescues the lease."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "live") as live:
        first, second = await live.add([_job("k"), _job("k")])
        with psycopg.connect(pg_dsn, autocommit=True) as dead:  # the node that dies: it claims and vanishes
            (held,) = sql.claim(dead, schema, "dead", 1, START + 30, "1", False, now=START, limit_of=_limit_of)
        assert held.id == first.id
        assert await live.claim(ClaimRequest("live", 5)) == []  # second is passed over (parked)
        clock.now = START + 20
        assert await live.rescue() == 0  # the lease still runs: so does the slot
        assert await live.claim(ClaimRequest("live", 5)) == []
        assert _holding(pg_dsn, schema, "k") == 1
        clock.now = START + 31
        assert await live.rescue() == 1
        claimed = await live.claim(ClaimRequest("live", 5))
        assert [job.id for job in claimed] == [first.id]  # the rescued job first (enqueued first); one slot
        assert (await live.get(second.id)).state is JobState.READY
        assert _holding(pg_dsn, schema, "k") == 1
        await live.complete([Succeeded(claimed[0].id, claimed[0].epoch, None)])
        assert [job.id for job in await live.claim(ClaimRequest("live", 5))] == [second.id]


# ----------------------------------------------------------------- plans


async def test_jobs_parked_on_a_key_that_lost_its_max_go_at_the_next_rescue(pg_dsn: str) -> None:
    """Jobs parked for a slot of "k" (max 1), then the nodes restarted with "k" a rate only: no freed slot
    would ever let them go, so the leader's rescue round does, and they run under the rate. (They stayed
    parked for good: found by a hostile review.) A node that declares no limits judges no key."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        await a.add([_job("k") for _ in range(5)])
        assert len(await a.claim(ClaimRequest("a", 5))) == 1  # one holds "k"; four are parked on it
    # a's close gave its job back and let one parked job go for the slot it freed: three stay parked.
    bare = trioq.PostgresStore(pg_dsn, schema=schema)
    async with bare.session(StoreConfig(clock=clock, node="c")):  # declares no limits
        claimed = await bare.claim(ClaimRequest("c", 5))
        assert len(claimed) == 2
        await bare.complete([Succeeded(job.id, job.epoch, None) for job in claimed])
        await bare.rescue()
        assert await bare.claim(ClaimRequest("c", 5)) == []
    rated = {"k": Limit("k", rate=100.0, per=1.0, burst=10)}
    b = trioq.PostgresStore(pg_dsn, schema=schema)
    async with b.session(StoreConfig(clock=clock, node="b", limits=rated.get)):
        assert await b.claim(ClaimRequest("b", 5)) == []
        await b.rescue()
        assert len(await b.claim(ClaimRequest("b", 5))) == 3


async def test_a_renewal_never_shortens_a_nodes_lease(pg_dsn: str) -> None:
    """An extend writes the node's lease from the clock it reads as its statement goes out (a try retried
    after an outage renews from then) and never moves it back: a renewal that began before a later claim
    renewed the lease leaves the later expiry. (It wrote the time its call began plus the lease, which an
    outage could leave in the past while the node ran on: found by a hostile review.)"""
    schema, clock = _schema(), Clock()

    def expires(node: str) -> float:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute(f"SELECT expires_at FROM {schema}.nodes WHERE id = %s", (node,)).fetchone()
        assert row is not None
        return float(row[0])

    async with _node(pg_dsn, schema, clock, "a") as a:
        await a.add([_job()])
        (job,) = await a.claim(ClaimRequest("a", 1, lease=30.0))
        assert expires("a") == START + 30.0
        assert await a.extend("a", [(job.id, job.epoch)], 1.0) == [True]
        assert expires("a") == START + 30.0  # not moved back
        clock.now = START + 100.0
        assert await a.extend("a", [(job.id, job.epoch)], 30.0) == [True]
        assert expires("a") == START + 130.0


async def test_a_backlog_blocked_on_a_full_key_is_not_read_by_later_claims(pg_dsn: str) -> None:
    """10,000 jobs holding "full" (max 1, held), ahead in priority of 10 free jobs: the claim that meets
    them parks them once; from then on a claim of the free jobs is the fast statement, reading a few
    pages and no parked row, and the backlog moves one job per freed slot."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as store:
        (holder,) = await store.add([_job("full", priority=9)])
        (running,) = await store.claim(ClaimRequest("a", 1))
        await store.add([_job("full", priority=5) for _ in range(10_000)])
        free = await store.add([_job() for _ in range(20)])
        first = await store.claim(ClaimRequest("a", 10))  # parks the backlog on its way to the free jobs
        assert [job.id for job in first] == [job.id for job in free[:10]]
        with psycopg.connect(pg_dsn, autocommit=True, options="-c enable_bitmapscan=off") as conn:
            conn.execute(f"ANALYZE {schema}.jobs")
            # The first scan after the parking visits the index entries of the rows' old versions once
            # (about 320 pages here) and marks them dead as it goes; later scans step over them (~50
            # pages) until a vacuum drops them (3 pages). Without parking every claim would read, or
            # filter, the 10,000 blocked jobs.

            def claim(c: object) -> object:
                return sql.claim(c, schema, "n", 10, None, "t", False, now=START, limit_of=_limit_of)

            claim_plan(conn, claim)
            plan = claim_plan(conn, claim)
            parked = conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE parked_key = 'full'").fetchone()
        assert parked == (10_000,)
        assert plan["Actual Rows"] == 10
        assert all(scan.get("Rows Removed by Filter", 0) == 0 for scan in jobs_scans(plan))
        assert sum(scan.get("Actual Rows", 0) for scan in jobs_scans(plan)) <= 30
        (ready,) = [scan for scan in jobs_scans(plan) if scan.get("Index Name") == "jobs_ready"]
        assert ready["Shared Hit Blocks"] + ready.get("Shared Read Blocks", 0) < 100
        # A freed slot lets one job of the backlog go, which the next claim takes.
        await store.complete([Succeeded(running.id, running.epoch, None)])
        again = await store.claim(ClaimRequest("a", 20))
        assert len([job for job in again if job.limits]) == 1 and len(again) == 11
        assert running.id == holder.id


async def test_limit_usage_counts_every_nodes_holders_parked_jobs_and_rates(pg_dsn: str) -> None:
    """What stats()["limits"] reads: node a's and node b's holders of "shared" together, the jobs parked
    for "k"'s one slot, and "api"'s rate state; a key nobody uses is left out."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        assert await a.limit_usage() == {}
        await a.add([_job("shared"), _job("shared"), _job("k"), _job("k"), _job("k"), _job("api")])
        first = await a.claim(ClaimRequest("a", 1))
        second = await b.claim(ClaimRequest("b", 10))
        claimed = first + second
        assert len(claimed) == 4  # both "shared", one "k", the "api" one; two "k" jobs parked
        usage = await b.limit_usage()
        assert usage["shared"][:2] == (2, 0) and usage["k"][:2] == (1, 2)
        assert usage["api"][0] == 1 and usage["api"][2] is not None and usage["api"][2] > START
        assert "full" not in usage
        await a.complete([Succeeded(job.id, job.epoch, None) for job in claimed if job in first])
        await b.complete([Succeeded(job.id, job.epoch, None) for job in claimed if job in second])
        usage = await a.limit_usage()
        # Nothing holds a key now; the parked "k" jobs were let go to be claimed again (on PostgreSQL a
        # freed slot unparks every job waiting on it, and the next claim parks those that still wait).
        assert "shared" not in usage and "k" not in usage


async def test_run_out_rate_states_are_swept_by_evict_but_recent_ones_kept(pg_dsn: str) -> None:
    """A rate state whose tat lies well past admits like a fresh key: evict() deletes it (per-user keys
    must not pile up); a recent one stays, and the next sweep waits a minute."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        await a.add([_job("api")])
        (job,) = await a.claim(ClaimRequest("a", 1))
        await a.complete([Succeeded(job.id, job.epoch, None)])
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"INSERT INTO {schema}.limit_rates VALUES ('user:old', %s)", (START - 3600.0,))
        clock.now += 61.0  # past the minute between sweeps (the session's own maintenance may have swept)
        await a.evict()
        assert set(await a.limit_usage()) == {"api"}  # the old one went; api's is recent
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"INSERT INTO {schema}.limit_rates VALUES ('user:old2', %s)", (START - 3600.0,))
        clock.now += 30.0
        await a.evict()
        assert "user:old2" in await a.limit_usage()  # swept 30 s ago: the next sweep waits the minute out
        clock.now += 10_000.0
        await a.evict()  # the first sweep since the one a minute ago
        assert await a.limit_usage() == {}
