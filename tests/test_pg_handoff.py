"""PostgresStore: children a parent's success claims at once for the node completing it (``_handoff.Take``).

A success that releases children claims, in the same statement, those a claim of that node would
take (ready now, a served queue not paused, the deadline not passed, no limit key when the node
declares limits), the best first, at most as many as the node's idle workers would take
(``StoreConfig.takers``), and hands them to ``StoreConfig.on_claimed`` with their parents' results.
Sessions run on a fake wall clock; nothing here waits on time.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

import trioq
from trioq import Job, JobState
from trioq.stores import ClaimRequest, NewJob, StoreConfig, Succeeded
from trioq.stores._base import no_limits
from trioq.stores.postgres import _flows, _handoff
from trioq.stores.postgres import _transitions as sql
from trioq.stores.postgres.store import _complete

from .pgplans import Clock

pytestmark = pytest.mark.slow


def _job(
    *after: str | int,
    queue: str = "default",
    priority: int = 0,
    delay: float = 0.0,
    deadline: float | None = None,
    limits: tuple[str, ...] = (),
) -> NewJob:
    return NewJob("t", {}, priority, None, 3, delay, queue, None, deadline, limits, tuple(after))


@asynccontextmanager
async def _node(
    dsn: str,
    schema: str,
    clock: Clock,
    takers: Mapping[str | None, int] | None = None,
    handed: list[Job] | None = None,
) -> AsyncIterator[trioq.PostgresStore]:
    store = trioq.PostgresStore(dsn, schema=schema)
    config = StoreConfig(
        clock=clock,
        node="a",
        takers=lambda: dict(takers or {}),
        on_claimed=(handed if handed is not None else []).extend,
    )
    async with store.session(config):
        yield store


async def _states(store: trioq.PostgresStore, jobs: Sequence[Job]) -> list[JobState]:
    return [(await store.get(job.id)).state for job in jobs]


def _succeed(dsn: str, schema: str, clock: Clock, job: Job, take: _handoff.Take) -> _flows.Settled:
    settled = _flows.Settled()
    with psycopg.connect(dsn, autocommit=True) as conn:
        states, _, _ = sql.complete(conn, schema, [Succeeded(job.id, job.epoch, {"paid": 1})], clock.now, "x", "b",
                                    settled=settled, parents=True, take=take)  # fmt: skip
    assert states == [JobState.SUCCEEDED]
    return settled


async def test_a_success_claims_what_a_claim_would_of_the_children_it_releases(pg_dsn: str) -> None:
    """Of a parent's children, the success claims the best ready ones, as many as asked, under a new
    epoch for the node; a child still waiting on another parent, one scheduled, one past its deadline
    and one holding a limit key (the node declares limits) are left, the ready ones announced."""
    schema, clock = f"h_{secrets.token_hex(4)}", Clock()
    async with _node(pg_dsn, schema, clock) as store:
        parent, other = await store.add([_job(), _job()])
        first, best, elsewhere, waits, later, late, keyed = await store.add(
            [_job(parent.id), _job(parent.id, priority=5), _job(parent.id, queue="q2"), _job(parent.id, other.id),
             _job(parent.id, delay=60.0), _job(parent.id, deadline=5.0), _job(parent.id, limits=("k",))]
        )  # fmt: skip
        claimed = await store.claim(ClaimRequest(node="b", limit=2, lease=30.0))
        got = next(job for job in claimed if job.id == parent.id)
        clock.now += 10  # late's deadline has passed
        settled = _succeed(pg_dsn, schema, clock, got, _handoff.Take(None, (3,), "t1", keyed=True))
        assert [job.id for job in settled.claimed] == [best.id, first.id, elsewhere.id]
        assert {(job.state, job.epoch) for job in settled.claimed} == {(JobState.RUNNING, 1)}
        assert settled.results == {parent.id: {"paid": 1}}
        assert settled.ready == 2 and len(settled.scheduled) == 1  # late (expired by the next promote), keyed
        assert await _states(store, [waits, later, late, keyed]) == [
            JobState.WAITING, JobState.SCHEDULED, JobState.READY, JobState.READY,
        ]  # fmt: skip
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert sorted(job.id for job in sql.claimed_with(conn, schema, "b", "t1")) == sorted(
                job.id for job in settled.claimed
            )


async def test_a_success_claims_only_of_the_queues_asked_and_not_paused(pg_dsn: str) -> None:
    schema, clock = f"h_{secrets.token_hex(4)}", Clock()
    async with _node(pg_dsn, schema, clock) as store:
        (parent,) = await store.add([_job()])
        kids = await store.add([_job(parent.id, queue=q) for q in ("q1", "q1", "q2", "q3")])
        await store.pause("q3")
        (got,) = await store.claim(ClaimRequest(node="b", limit=1, lease=30.0))
        settled = _succeed(pg_dsn, schema, clock, got, _handoff.Take(("q1", "q3"), (1, 5), "t1"))
        assert [job.id for job in settled.claimed] == [kids[0].id]
        assert settled.ready == 3
        assert await _states(store, kids) == [JobState.RUNNING] + [JobState.READY] * 3


async def test_the_store_hands_claimed_children_to_its_node_and_answers_their_parents(pg_dsn: str) -> None:
    """Through ``complete``: the node's idle workers (``takers``) bound the children claimed, which go to
    ``on_claimed``; their parents' results are answered without a query; the rest are announced."""
    schema, clock = f"h_{secrets.token_hex(4)}", Clock()
    handed: list[Job] = []
    async with _node(pg_dsn, schema, clock, takers={None: 2}, handed=handed) as store:
        (parent,) = await store.add([_job()])
        kids = await store.add([_job(parent.id) for _ in range(3)])
        (got,) = await store.claim(ClaimRequest(node="a", limit=1, lease=30.0))
        assert await store.complete([Succeeded(got.id, got.epoch, [1, "x"])]) == [JobState.SUCCEEDED]
        assert [job.id for job in handed] == [kid.id for kid in kids[:2]]
        assert {job.state for job in handed} == {JobState.RUNNING}
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.jobs SET result = NULL WHERE id = %s", (parent.id,))
        # Answered from what the success read: the row's result is gone, the answer is not.
        assert await store.results([parent.id]) == {parent.id: [1, "x"]}
        assert await store.results([parent.id]) == {parent.id: [1, "x"]}
        assert await store.results([parent.id]) == {parent.id: None}  # both children asked: a query now
        assert await _states(store, kids) == [JobState.RUNNING, JobState.RUNNING, JobState.READY]


async def test_a_retried_success_finds_the_children_its_first_try_claimed(pg_dsn: str) -> None:
    """A completion whose first try committed unseen (a broken connection) answers, on the retry, the
    children that try claimed, with their parents' results: none is left running unseen."""
    schema, clock = f"h_{secrets.token_hex(4)}", Clock()
    async with _node(pg_dsn, schema, clock) as store:
        (parent,) = await store.add([_job()])
        kids = await store.add([_job(parent.id) for _ in range(2)])
        (got,) = await store.claim(ClaimRequest(node="a", limit=1, lease=30.0))
        take = _handoff.Take(None, (5,), "t9")
        outcome = Succeeded(got.id, got.epoch, 7)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            sql.complete(conn, schema, [outcome], clock.now, "x", "a", parents=True, take=take)
            retry: Any = _complete(conn, schema, [outcome], clock.now, "x", "a", (), no_limits,
                                   None, True, take, retried=True)  # fmt: skip
        states, _, _, _, settled = retry
        assert states == [JobState.SUCCEEDED]
        assert sorted(job.id for job in settled.claimed) == sorted(kid.id for kid in kids)
        assert settled.results == {parent.id: 7}


async def test_a_node_runs_the_children_it_claimed_as_their_parents_succeeded(pg_dsn: str) -> None:
    """Through the runtime, one node with a pool per queue: chains whose children wait in another queue
    run each job once, in order, every child seeing its parent's result."""
    registry = trioq.Registry()
    seen: list[tuple[str, Any]] = []

    @registry.task(queue="first")
    async def parent(ctx: trioq.JobContext, n: int) -> int:
        return n * 10

    @registry.task(queue="then")
    async def child(ctx: trioq.JobContext, n: int) -> None:
        seen.append((ctx.job.id, dict(ctx.parents)))

    store = trioq.PostgresStore(pg_dsn, schema=f"h_{secrets.token_hex(4)}")
    async with trioq.open_queue(registry, store=store, workers={"first": 2, "then": 2}) as queue:
        flows = []
        for n in range(10):
            flows.append(
                await queue.enqueue_many(
                    [trioq.JobSpec("parent", {"n": n}), trioq.JobSpec("child", {"n": n}, after=[0])]
                )
            )
            await queue.wait(flows[-1][1].id, timeout=30)
        await queue.join()
        done = [await queue.get(kid.id) for _, kid in flows]
    assert {(job.state, job.attempts) for job in done} == {(JobState.SUCCEEDED, 1)}
    assert seen == [(kid.id, {p.id: n * 10}) for n, (p, kid) in enumerate(flows)]
