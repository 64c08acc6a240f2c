"""PostgresStore's tenant fairness: what only a shared database has.

The store-independent rules are the conformance suite's (``_cases_fair``). These check that the tags
are shared by every node (and outlive a session), that concurrent fair claims never take a job twice,
that a schema of version 2 is upgraded in place, which indexes a fair claim reads, and that a node
without fairness still sends the claim it sent before.
"""

from __future__ import annotations

import random
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
from trioq import Limit
from trioq.stores import ClaimRequest, NewJob, Released, StoreConfig, Succeeded
from trioq.stores.postgres import _fair
from trioq.stores.postgres import _transitions as sql
from trioq.stores.postgres._schema import MIGRATIONS, SCHEMA_VERSION

from .pgplans import START, Clock, Recording

pytestmark = pytest.mark.slow


def _schema() -> str:
    return f"fair_{secrets.token_hex(4)}"


def _job(tenant: str | None, *, priority: int = 0, queue: str = "default", limits: tuple[str, ...] = ()) -> NewJob:
    return NewJob("t", {}, priority, None, 3, 0.0, queue, tenant, None, limits)


@asynccontextmanager
async def _node(
    dsn: str, schema: str, clock: Clock, node: str, fairness: Mapping[str, float] | None = None, **options: Any
) -> AsyncIterator[trioq.PostgresStore]:
    store = trioq.PostgresStore(dsn, schema=schema)
    async with store.session(StoreConfig(clock=clock, node=node, fairness=fairness, **options)):
        yield store


async def test_two_nodes_share_the_tags(pg_dsn: str) -> None:
    """Claims alternating between two nodes give the small tenant its weighted share of them all: the
    finish tags and the virtual time are rows both nodes read and write, not each node's own."""
    schema, clock = _schema(), Clock()
    weights = {"small": 3.0}
    async with _node(pg_dsn, schema, clock, "a", weights) as a, _node(pg_dsn, schema, clock, "b", weights) as b:
        await a.add([_job("noisy") for _ in range(900)] + [_job("small") for _ in range(100)])
        got: Counter[str | None] = Counter()
        for i in range(100):
            (job,) = await (a if i % 2 else b).claim(ClaimRequest("a" if i % 2 else "b", 1))
            got[job.tenant] += 1
    assert abs(got["small"] - 75) <= 5, got


async def test_the_tags_outlive_a_session(pg_dsn: str) -> None:
    """A tenant charged before a restart is still charged after it (the in-process stores start every
    tenant level instead)."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", {}) as store:
        await store.add([_job("first") for _ in range(3)] + [_job("second") for _ in range(3)])
        (job,) = await store.claim(ClaimRequest("a", 1))
        assert job.tenant == "first"
    async with _node(pg_dsn, schema, clock, "a", {}) as store:
        (job,) = await store.claim(ClaimRequest("a", 1))
        assert job.tenant == "second"


async def test_concurrent_fair_claims_take_each_job_once(pg_dsn: str) -> None:
    """Two nodes claiming batches at once, fairly, with completions: every job is claimed exactly once,
    and the tenants' shares of the whole stay even."""
    schema, clock = _schema(), Clock()
    tenants = [f"t{i}" for i in range(5)]
    async with _node(pg_dsn, schema, clock, "a", {}) as a, _node(pg_dsn, schema, clock, "b", {}) as b:
        await a.add([_job(tenants[i % 5]) for i in range(500)])
        seen: list[str] = []
        order: list[str | None] = []

        async def drain(store: trioq.PostgresStore, node: str) -> None:
            while True:
                jobs = await store.claim(ClaimRequest(node, 7))
                if not jobs:
                    return
                seen.extend(job.id for job in jobs)
                order.extend(job.tenant for job in jobs)
                assert await store.complete([Succeeded(job.id, job.epoch) for job in jobs]) == [
                    trioq.JobState.SUCCEEDED
                ] * len(jobs)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, a, "a")
            nursery.start_soon(drain, b, "b")
        assert len(seen) == len(set(seen)) == 500
        assert (await a.counts())["succeeded"] == 500
        # Each tenant's share of the first 100 claimed is even, give or take a batch's worth.
        first = Counter(order[:100])
        assert all(abs(first[t] - 20) <= 7 for t in tenants), first


async def test_a_job_holding_a_limit_key_is_claimed_by_the_limit_path(pg_dsn: str) -> None:
    """On a node that declares limits, a fair claim meeting a job that holds a key leaves it to the limit
    path (which enforces the key); jobs without keys are still claimed fairly."""
    schema, clock = _schema(), Clock()
    limits = {"k": Limit("k", max=1)}
    async with _node(pg_dsn, schema, clock, "a", {}, limits=limits.get) as store:
        await store.add([_job("x", limits=("k",)), _job("x", limits=("k",)), _job("y")])
        claimed = await store.claim(ClaimRequest("a", 3))
        assert sorted(job.tenant or "" for job in claimed) == ["x", "y"]  # one of x's two: the key's one slot
        assert (await store.counts())["ready"] == 1


def test_a_version_2_schema_is_upgraded_to_3(pg_dsn: str) -> None:
    """A schema of version 2 gets version 3's tables and indexes in place; its ready jobs are claimed
    fairly at once."""
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
        for i, tenant in enumerate(["a", "a", "a", "b"]):
            conn.execute(
                f"INSERT INTO {schema}.jobs (id, task, payload, state, priority, max_attempts, run_at, created_at,"
                " tenant) VALUES (%s, 't', '{}', 'ready', 0, 3, %s, %s, %s)",
                (f"old-{i}", START, START, tenant),
            )

    async def run() -> None:
        async with _node(pg_dsn, schema, Clock(), "a", {}) as store:
            claimed = await store.claim(ClaimRequest("a", 2))
            assert [job.tenant for job in claimed] == ["a", "b"]

    trio.run(run)
    with psycopg.connect(pg_dsn) as conn:
        versions = [row[0] for row in conn.execute(f"SELECT version FROM {schema}.migrations ORDER BY version")]
        indexes = {row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))}
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert {"jobs_tenant_ready", "jobs_deferred", "jobs_deferred_tenant", "jobs_deadline"} <= indexes
    assert {"fair_tags", "fair_clock"} <= tables


class _Explaining:
    """A connection that runs each statement under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` first (in a savepoint
    rolled back), keeping the plans, then runs it for real."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.plans: list[tuple[str, Any]] = []
        self._cur: Any = None

    def cursor(self, **kwargs: Any) -> _Explaining:
        return self

    def transaction(self) -> _Explaining:
        return self

    def __enter__(self) -> _Explaining:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, query: str, params: Any = None, prepare: bool | None = None) -> None:
        with self.conn.transaction(force_rollback=True):  # EXPLAIN ANALYZE runs what the statement writes
            plan = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
        assert plan is not None
        self.plans.append((query, plan[0][0]["Plan"]))
        self._cur = self.conn.execute(query, params)

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()  # type: ignore[no-any-return]

    def fetchone(self) -> Any:
        return self._cur.fetchone()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan."""
    found = [plan]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


async def test_a_fair_claim_reads_indexes_only(pg_dsn: str) -> None:
    """At 20,000 ready jobs of 20 tenants, a fair claim is one statement that reads a bounded number of
    pages, before the table's first ``ANALYZE`` (statistics that say it is empty) and after: the heads
    come from ``ready_heads`` (a skip scan of ``jobs_tenant_ready`` with sorts and sequential scans off
    for itself), each tenant's jobs from a range of the same index."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", {}) as store:  # fairness on: the session builds the index
        for start in range(0, 20_000, 5_000):
            await store.add([_job(f"t{i % 20}") for i in range(start, start + 5_000)])
    with psycopg.connect(pg_dsn, autocommit=True, options="-c enable_bitmapscan=off -c jit=off") as conn:
        for analyzed in (False, True):
            if analyzed:
                conn.execute(f"ANALYZE {schema}.jobs")
            explaining = _Explaining(conn)
            with conn.transaction(force_rollback=True):
                got = _fair.claim(
                    explaining, schema, "a", 50, "tok", now=START, queues=None, weights={"t3": 2.0}, probe=True,
                    keyed_aside=False, columns=sql._qualified("j"), live=sql._LIVE,
                    pending_deadline=sql._PENDING_DEADLINE,
                )  # fmt: skip
            assert got is not None and len(got[0]) == 50
            # Tags 0 and 1 for each of 19 tenants, 0 to 1.5 by halves for t3 (weight 2): 42 jobs; the 8 others
            # at tag 2 go by the tenants' first heads (t0 to t7: t3's is the fourth), within a batch (one at a
            # time, as the table store does it, by each tenant's next job, t3 would miss this one).
            assert Counter(row[16] for row in got[0])["t3"] == 5
            ((_query, plan),) = explaining.plans
            nodes = _nodes(plan)
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"]
            assert any(n.get("Function Name") == "ready_heads" for n in nodes)
            assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 3_000, (analyzed, plan)


def test_without_fairness_the_claim_is_the_one_statement_it_was() -> None:
    """A node without fairness sends the claim of before fairness: one statement, no tags read."""
    recording = Recording()
    sql.claim(recording, "s", "n", 10, None, "tok", False, now=START)
    assert len(recording.sent) == 1
    query = recording.sent[0][0]
    assert "fair_" not in query and "jobs_tenant_ready" not in query and "coalesce(tenant" not in query
    assert query.startswith("WITH c AS MATERIALIZED (SELECT id, limits FROM s.jobs j WHERE state = 'ready'")


async def test_releasing_keeps_the_tags(pg_dsn: str) -> None:
    """A claim charges its tenant even when the attempt is released (as the table store charges a job
    popped): the next claim goes to the other tenant."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a", {}) as store:
        await store.add([_job("a"), _job("a"), _job("b")])
        (first,) = await store.claim(ClaimRequest("a", 1))
        assert first.tenant == "a"
        await store.complete([Released(first.id, first.epoch)])
        (second,) = await store.claim(ClaimRequest("a", 1))
        assert second.tenant == "b"


def _fair_index(dsn: str, schema: str) -> bool | None:
    """Whether ``jobs_tenant_ready`` is there and valid (``None``: not there)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'jobs_tenant_ready'",
            (schema,),
        ).fetchone()
    return None if row is None else bool(row[0])


async def test_the_fair_index_is_built_when_fairness_is_first_used(pg_dsn: str) -> None:
    """A schema nobody claims fairly in has no ``jobs_tenant_ready`` (adds do not maintain it); the first
    session with fairness builds it, keeping the jobs; an invalid one (a build cut off) is built again."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as store:
        await store.add([_job("x"), _job("y"), _job("x")])
    assert _fair_index(pg_dsn, schema) is None
    async with _node(pg_dsn, schema, clock, "a", {}) as store:
        assert [job.tenant for job in await store.claim(ClaimRequest("a", 2))] == ["x", "y"]
    assert _fair_index(pg_dsn, schema) is True
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as a failed CREATE INDEX CONCURRENTLY leaves it
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", (f"{schema}.jobs_tenant_ready",)
        )
    assert _fair_index(pg_dsn, schema) is False
    async with _node(pg_dsn, schema, clock, "b", {}) as store:
        assert [job.tenant for job in await store.claim(ClaimRequest("b", 1))] == ["x"]
    assert _fair_index(pg_dsn, schema) is True


@pytest.mark.parametrize("seed", range(8))
async def test_claims_one_at_a_time_match_the_table_store(pg_dsn: str, seed: int) -> None:
    """Random adds (tenants, weights, two priorities), claims of one job, releases and successes, driven
    through a MemoryStore and a PostgresStore on the same clock: both claim the same jobs in the same order.

    One queue only: with several, the table store forgets a queue's tags when the queue runs empty (it drops
    the empty queue's ready queue), where the database keeps them (both are within the documented rules:
    no tenant banks credit either way).
    """
    rnd = random.Random(seed)
    tenants: list[str | None] = ["a", "b", "c", "d", None]
    weights = {t: rnd.choice([0.5, 1.0, 2.0, 3.0]) for t in ("a", "b", "c", "d") if rnd.random() < 0.7}
    ops: list[tuple[Any, ...]] = []
    k = 0
    for _ in range(60):
        r = rnd.random()
        if r < 0.3:
            batch = []
            for _ in range(rnd.randint(1, 6)):
                batch.append((k, rnd.choice(tenants), rnd.choice([0, 0, 1])))
                k += 1
            ops.append(("add", batch))
        elif r < 0.8:
            ops.append(("claim",))
        else:
            ops.append(("finish", rnd.random() < 0.5, rnd.random()))

    async def drive(store: Any) -> list[int | None]:
        clock = Clock()
        order: list[int | None] = []
        running: list[trioq.Job] = []
        async with store.session(StoreConfig(clock=clock, fairness=weights)):
            for op in ops:
                if op[0] == "add":
                    await store.add([NewJob("t", {"i": i}, p, None, 3, 0.0, "default", t) for i, t, p in op[1]])
                elif op[0] == "claim":
                    got = await store.claim(ClaimRequest("n", 1))
                    order.append(got[0].payload["i"] if got else None)
                    running += got
                elif running:
                    job = running.pop(int(op[2] * len(running)))
                    await store.complete([Released(job.id, job.epoch) if op[1] else Succeeded(job.id, job.epoch)])
                clock.now += 0.001
        return order

    assert await drive(trioq.PostgresStore(pg_dsn, schema=_schema())) == await drive(trioq.MemoryStore())


async def _drive_keyed(
    store: Any, limits: Mapping[str, Limit], batch: int, weights: Mapping[str, float], finish_every: int
) -> list[tuple[str | None, int]]:
    """A noisy tenant's 90 jobs, then a small tenant's 10, each holding the key ``k`` (and every third of
    the noisy ones ``n`` too); 40 claims of ``batch``, the oldest running job succeeding after every
    ``finish_every``-th claim (freeing its slots): the claimed jobs, in order, as (tenant, index)."""
    clock = Clock()
    order: list[tuple[str | None, int]] = []
    running: list[trioq.Job] = []
    async with store.session(StoreConfig(clock=clock, fairness=weights, limits=limits.get)):
        noisy = [("noisy", i, ("k", "n") if i % 3 == 0 else ("k",)) for i in range(90)]
        small = [("small", i, ("k",)) for i in range(10)]
        await store.add([NewJob("t", {"i": i}, 0, None, 3, 0.0, "default", t, None, ks) for t, i, ks in noisy])
        clock.now += 0.001
        await store.add([NewJob("t", {"i": i}, 0, None, 3, 0.0, "default", t, None, ks) for t, i, ks in small])
        for step in range(40):
            clock.now += 0.001
            got = await store.claim(ClaimRequest("n", batch))
            order += [(job.tenant, job.payload["i"]) for job in got]
            running += got
            if step % finish_every == finish_every - 1 and running:
                job = running.pop(0)
                await store.complete([Succeeded(job.id, job.epoch)])
    return order


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize(
    ("limits", "finish_every"),
    [
        ({"k": Limit("k", max=100)}, 1),
        ({"k": Limit("k", max=100), "n": Limit("n", max=1)}, 2),
        ({"k": Limit("k", max=3), "n": Limit("n", max=1)}, 1),
    ],
    ids=["roomy", "tight", "shared"],
)
async def test_jobs_holding_limit_keys_are_claimed_fairly(
    pg_dsn: str, batch: int, limits: Mapping[str, Limit], finish_every: int
) -> None:
    """Every job holds a limit key and a noisy tenant has nine times the small one's jobs: the limit path
    takes them in fair order, charging a tenant for each job it considered, started or passed over for a
    key (parked: "tight", where the noisy tenant's jobs holding ``n`` wait for its one slot), as the table
    store does; and when the key both tenants hold is full ("shared": three slots, the claims in batches
    park the backlog), the slots freed go to the parked jobs fairly, as the table store lets its parked
    jobs go in the order it parked them. The small tenant gets its share, as with a MemoryStore driven the
    same way (one at a time, the same jobs in the same order; in batches, the same shares give or take a
    tie)."""
    weights: dict[str, float] = {}
    pg = await _drive_keyed(trioq.PostgresStore(pg_dsn, schema=_schema()), limits, batch, weights, finish_every)
    memory = await _drive_keyed(trioq.MemoryStore(), limits, batch, weights, finish_every)
    if batch == 1:
        assert pg == memory
    first, expected = Counter(t for t, _ in pg[:16]), Counter(t for t, _ in memory[:16])
    assert abs(first["small"] - expected["small"]) <= 2 and first["small"] >= 6, (first, expected, pg)
    if "n" in limits and limits["k"].max == 100:
        # Some of the noisy tenant's jobs were passed over for n's slot, and claimed later.
        noisy = [i for t, i in pg if t == "noisy"]
        assert noisy != sorted(noisy)


async def test_concurrent_fair_claims_of_keyed_jobs(pg_dsn: str) -> None:
    """Two nodes draining jobs that all hold keys (one bounded tightly), fairly, with completions: every job
    is claimed exactly once, no key is ever over its bound, and nothing waits forever (the tags' rows are
    each claim's last write, so no claim holding them waits for a key's lock)."""
    schema, clock = _schema(), Clock()
    limits = {"k": Limit("k", max=4), "j": Limit("j", max=100)}
    tenants = [f"t{i}" for i in range(4)]
    async with (
        _node(pg_dsn, schema, clock, "a", {}, limits=limits.get) as a,
        _node(pg_dsn, schema, clock, "b", {}, limits=limits.get) as b,
    ):
        await a.add([_job(tenants[i % 4], limits=("k",) if i % 2 else ("j",)) for i in range(300)])
        seen: list[str] = []

        async def drain(store: trioq.PostgresStore, node: str) -> None:
            idle = 0
            while idle < 3:
                jobs = await store.claim(ClaimRequest(node, 5))
                assert sum(1 for job in jobs if "k" in job.limits) <= 4
                seen.extend(job.id for job in jobs)
                idle = 0 if jobs else idle + 1
                await store.complete([Succeeded(job.id, job.epoch) for job in jobs])
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, a, "a")
            nursery.start_soon(drain, b, "b")
        assert len(seen) == len(set(seen)) == 300
        assert (await a.counts())["succeeded"] == 300
