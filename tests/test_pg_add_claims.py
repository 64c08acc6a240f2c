"""PostgresStore: an enqueue that claims its own jobs for the node's idle workers (``_transitions.add_claiming``).

While a node's workers wait, an add of ready jobs claims, in its own statement, those a claim of the
node would take first: none while another job is ready in a queue it serves, none of a paused queue,
none delayed, none holding a limit key when the node declares limits, the best first, at most its
idle workers (``StoreConfig.takers``); they go to ``StoreConfig.on_claimed`` under epoch 1. Sessions
run on a fake wall clock, except the last test, which runs a queue on the real one.
"""

from __future__ import annotations

import functools
import math
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
from trioq import Job, JobState, Limit
from trioq.stores import ClaimRequest, NewJob, StoreConfig, Succeeded
from trioq.stores._base import no_limits
from trioq.stores.postgres import _transitions as sql

from .pgplans import Clock

pytestmark = pytest.mark.slow


def _job(
    *,
    queue: str = "default",
    priority: int = 0,
    delay: float = 0.0,
    limits: tuple[str, ...] = (),
    key: str | None = None,
) -> NewJob:
    return NewJob("t", {}, priority, key, 3, delay, queue, None, None, limits)


@asynccontextmanager
async def _node(
    dsn: str, takers: dict[str | None, int], handed: list[Job], *, limits: bool = False, clock: Clock | None = None
) -> AsyncIterator[trioq.PostgresStore]:
    """A session of node "a" whose idle workers are ``takers`` (read at each call); its lease is known
    (one empty claim), as a running node's is."""
    store = trioq.PostgresStore(dsn, schema=f"ac_{secrets.token_hex(4)}")
    config = StoreConfig(
        clock=clock or Clock(),
        node="a",
        takers=lambda: dict(takers),
        on_claimed=handed.extend,
        limits=(lambda key: Limit(key, max=1)) if limits else no_limits,
    )
    async with store.session(config):
        assert await store.claim(ClaimRequest(node="a", limit=1, lease=30.0)) == []
        yield store


async def _state(store: trioq.PostgresStore, job: Job) -> tuple[JobState, int]:
    got = await store.get(job.id)
    return got.state, got.epoch


async def test_an_add_claims_for_idle_workers_and_its_claim_completes(pg_dsn: str) -> None:
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 1}, handed) as store:
        (job,) = await store.add([_job()])
        assert (job.state, job.epoch) == (JobState.RUNNING, 1)
        assert handed == [job]
        assert await _state(store, job) == (JobState.RUNNING, 1)
        assert await store.complete([Succeeded(job.id, 1, "ok")]) == [JobState.SUCCEEDED]
        assert (await store.get(job.id)).attempts == 1


async def test_an_add_without_idle_workers_claims_nothing(pg_dsn: str) -> None:
    handed: list[Job] = []
    async with _node(pg_dsn, {}, handed) as store:
        (job,) = await store.add([_job()])
        assert await _state(store, job) == (JobState.READY, 0)
        assert handed == []


async def test_an_add_claims_nothing_while_another_job_is_ready(pg_dsn: str) -> None:
    """A job ready before the add is what a claim takes first: the add leaves its own."""
    takers: dict[str | None, int] = {}
    handed: list[Job] = []
    async with _node(pg_dsn, takers, handed) as store:
        (waiting,) = await store.add([_job(priority=-5)])
        takers[None] = 2
        (job,) = await store.add([_job(priority=5)])
        assert job.state is JobState.READY and handed == []
        assert [got.id for got in await store.claim(ClaimRequest(node="a", limit=2, lease=30.0))] == [
            job.id,
            waiting.id,
        ]


async def test_an_add_claims_the_best_of_its_rows_up_to_the_idle_workers(pg_dsn: str) -> None:
    """Of one add's rows: the highest priority first, then the order given; delayed and paused ones never."""
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 2}, handed) as store:
        await store.pause("held")
        low, later, high, paused, same = await store.add(
            [_job(), _job(delay=60.0, priority=9), _job(priority=3), _job(queue="held", priority=9), _job(priority=3)]
        )
        assert [job.id for job in handed] == [high.id, same.id]
        assert [(await _state(store, job))[0] for job in (low, later, high, paused, same)] == [
            JobState.READY, JobState.SCHEDULED, JobState.RUNNING, JobState.READY, JobState.RUNNING,
        ]  # fmt: skip


async def test_an_add_claims_nothing_of_a_queue_another_node_paused(pg_dsn: str) -> None:
    """The statement reads the pause itself: this node has not heard of it."""
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 1}, handed) as store:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {store.schema}.paused (queue, paused_at) VALUES ('default', 0)")
        (job,) = await store.add([_job()])
        assert job.state is JobState.READY and handed == []
        assert await _state(store, job) == (JobState.READY, 0)


async def test_an_add_claims_only_for_the_queues_whose_workers_wait(pg_dsn: str) -> None:
    handed: list[Job] = []
    async with _node(pg_dsn, {"q1": 1}, handed) as store:
        other, mine, more = await store.add([_job(queue="q2"), _job(queue="q1"), _job(queue="q1")])
        assert handed == [mine]
        assert [(await _state(store, job))[0] for job in (other, mine, more)] == [
            JobState.READY, JobState.RUNNING, JobState.READY,
        ]  # fmt: skip


async def test_an_add_leaves_its_jobs_while_a_keyed_one_is_among_them(pg_dsn: str) -> None:
    """With one idle worker and a keyed job first in priority, the limit path's claim decides: the add
    claims neither."""
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 1}, handed, limits=True) as store:
        keyed, plain = await store.add([_job(limits=("k",), priority=9), _job()])
        assert handed == [] and (keyed.state, plain.state) == (JobState.READY, JobState.READY)


async def test_an_add_claims_nothing_while_a_job_this_node_knows_of_is_due(pg_dsn: str) -> None:
    """A scheduled job whose time has come is what this node's next claim promotes and may take first."""
    takers: dict[str | None, int] = {}
    handed: list[Job] = []
    clock = Clock()
    async with _node(pg_dsn, takers, handed, clock=clock) as store:
        (due,) = await store.add([_job(priority=10, delay=1.0)])
        clock.now += 2
        takers[None] = 1
        (job,) = await store.add([_job()])
        assert job.state is JobState.READY and handed == []
        assert [got.id for got in await store.claim(ClaimRequest(node="a", limit=1, lease=30.0))] == [due.id]


async def test_a_worker_gets_the_stored_payload_not_the_callers_object(pg_dsn: str) -> None:
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 1}, handed) as store:
        xs = [1, 2]
        await store.add([NewJob("t", {"xs": xs, "at": {"k": "v"}}, 0, None, 3, 0.0, "default", None, None, ())])
        xs.append(3)
        assert handed[0].payload == {"xs": [1, 2], "at": {"k": "v"}}


def _raise_lost(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the job holding key 'k1' just went; enqueue again")


async def _fail_after_commit(store: trioq.PostgresStore, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
    """Two adds gathered into one statement (the gatherer's call) that commits (claiming the second's job)
    and then fails: the look-up of the first job's key holder raises, as when the holder is evicted
    between the statements."""
    monkeypatch.setattr(sql, "_holders", _raise_lost)
    with pytest.raises(RuntimeError, match="just went"):
        await store._add_gathered(store._rows([_job(key="k1", **options), _job(priority=5, **options)]))
    monkeypatch.undo()


async def _holding_k1(store: trioq.PostgresStore, takers: dict[str | None, int], queue: str | None = None) -> None:
    """A running job holds key "k1" (so that nothing else is ready), then one worker waits."""
    await store.add([_job(key="k1", queue=queue or "default")])
    await store.claim(ClaimRequest(node="a", limit=1, lease=30.0, queues=None if queue is None else (queue,)))
    takers[queue] = 1


async def test_jobs_a_failed_add_claimed_are_handed_over_by_the_next_claim(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An add that committed its claim and then failed leaves no job running unseen: the next claim finds
    it by the add's token and hands it over, once, even when two claims race."""
    takers: dict[str | None, int] = {}
    handed: list[Job] = []
    async with _node(pg_dsn, takers, handed) as store:
        await _holding_k1(store, takers)
        await _fail_after_commit(store, monkeypatch)
        assert handed == []
        answers: list[list[Job]] = []

        async def claim() -> None:
            answers.append(await store.claim(ClaimRequest(node="a", limit=1, lease=30.0)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(claim)
            nursery.start_soon(claim)
        assert answers == [[], []]
        assert [(job.state, job.epoch, job.priority) for job in handed] == [(JobState.RUNNING, 1, 5)]
        assert await store.claim(ClaimRequest(node="a", limit=1, lease=30.0)) == [] and len(handed) == 1


async def test_a_recovered_job_goes_to_its_own_queues_workers(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Handed over through ``on_claimed`` (which routes by queue), never in the answer of a claim of
    another queue."""
    takers: dict[str | None, int] = {}
    handed: list[Job] = []
    async with _node(pg_dsn, takers, handed) as store:
        await _holding_k1(store, takers, "b")
        await _fail_after_commit(store, monkeypatch, queue="b")
        assert await store.claim(ClaimRequest(node="a", limit=1, lease=30.0, queues=("a",))) == []
        assert [job.queue for job in handed] == ["b"]


@asynccontextmanager
async def _noting_queue(
    dsn: str, ran: list[str], workers: int, **options: Any
) -> AsyncIterator[tuple[trioq.Queue, trioq.PostgresStore]]:
    """A queue of ``workers`` whose task ``note`` appends its job's id to ``ran``, once they all wait (each
    parks once its claim is back: then an enqueue may claim for them)."""
    registry = trioq.Registry()

    @registry.task
    async def note(ctx: trioq.JobContext) -> None:
        ran.append(ctx.job.id)

    store = trioq.PostgresStore(dsn, schema=f"ac_{secrets.token_hex(4)}")
    async with trioq.open_queue(registry, store=store, workers=workers, **options) as queue:
        with trio.fail_after(10):
            while store._open().takers() != {None: workers}:  # noqa: ASYNC110 - the workers park on their own
                await trio.sleep(0.01)
        yield queue, store


async def test_a_failed_add_wakes_a_claim_that_serves_what_it_claimed(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the runtime with no poll: the failed add's hint wakes a claim at once."""
    ran: list[str] = []
    async with _noting_queue(pg_dsn, ran, 1, poll_interval=math.inf) as (queue, store):
        holder = await queue.enqueue("note", key="k1")
        await queue.wait(holder.id, timeout=10)
        with trio.fail_after(10):
            while store._open().takers() != {None: 1}:  # noqa: ASYNC110 - the worker parks again after the holder
                await trio.sleep(0.01)
        monkeypatch.setattr(sql, "_holders", _raise_lost)

        async def enqueue(**options: Any) -> None:  # two at once: gathered into one statement
            with pytest.raises(RuntimeError, match="just went"):
                await queue.enqueue("note", **options)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(enqueue, key="k1"))
            nursery.start_soon(enqueue)
        monkeypatch.undo()
        with trio.fail_after(10):
            while len(ran) < 2:  # noqa: ASYNC110 - the worker's effect
                await trio.sleep(0.01)
    assert ran[0] == holder.id and len(set(ran)) == 2


async def test_an_add_and_a_success_in_flight_together_claim_for_a_worker_once(pg_dsn: str) -> None:
    """A parent's success releasing a child and an add, both in flight for the one waiting worker: only
    one of them claims for it (``_reserved``)."""
    takers: dict[str | None, int] = {}
    handed: list[Job] = []
    async with _node(pg_dsn, takers, handed) as store:
        (parent,) = await store.add([_job()])
        (running,) = await store.claim(ClaimRequest(node="a", limit=1, lease=30.0))
        await store.add([NewJob("t", {}, 0, None, 3, 0.0, "default", None, None, (), (parent.id,))])
        takers[None] = 1  # the runtime's count drops only as jobs are handed over: both read 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.complete, [Succeeded(running.id, running.epoch, "ok")])
            nursery.start_soon(store.add, [_job()])
        assert len(handed) == 1


async def test_an_add_leaves_a_job_whose_deadline_has_come(pg_dsn: str) -> None:
    """(Through the store protocol: the runtime refuses a deadline <= 0.) A claim would leave it too."""
    handed: list[Job] = []
    async with _node(pg_dsn, {None: 1}, handed) as store:
        (job,) = await store.add([NewJob("t", {}, 0, None, 3, 0.0, "default", None, 0.0, ())])
        assert job.state is JobState.READY and handed == []


async def test_a_key_holder_found_by_the_add_is_answered_not_claimed(pg_dsn: str) -> None:
    handed: list[Job] = []
    takers: dict[str | None, int] = {}
    async with _node(pg_dsn, takers, handed) as store:
        (first,) = await store.add([_job(key="k1")])
        await store.claim(ClaimRequest(node="a", limit=1, lease=30.0))  # running: nothing else is ready
        takers[None] = 1
        added = await store.add([_job(key="k1")])
        assert added[0].id == first.id and added.existing == {0}
        assert handed == []


async def test_a_retried_add_answers_what_its_first_try_claimed(pg_dsn: str) -> None:
    """An add whose first try committed unseen (a broken connection) finds, on the retry, the jobs that try
    claimed: none is left running unseen on a live node."""
    handed: list[Job] = []
    async with _node(pg_dsn, {}, handed) as store:
        rows = [(f"r-{i}", _job(), "{}") for i in range(3)]
        claiming = sql.Claiming("a", "t7", (True, False, True), None)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            first = sql.add_claiming(conn, store.schema, rows, 100.0, None, claiming)
            again = sql.add_claiming(conn, store.schema, rows, 100.0, None, claiming, retried=True)
        assert first == ([None] * 3, ["r-0", "r-2"])
        assert again[0] == [None] * 3 and sorted(again[1]) == ["r-0", "r-2"]


async def test_an_idle_node_starts_a_job_its_enqueue_claimed(pg_dsn: str) -> None:
    """Through the runtime on the real clock: once the workers wait, an enqueue claims its job (epoch 1 in
    the answer) and a worker runs it once."""
    ran: list[str] = []
    async with _noting_queue(pg_dsn, ran, 2) as (queue, _):
        job = await queue.enqueue("note")
        assert (job.state, job.epoch) == (JobState.RUNNING, 1)
        done = await queue.wait(job.id, timeout=10)
    assert (done.state, done.attempts, done.epoch) == (JobState.SUCCEEDED, 1, 1)
    assert ran == [job.id]


async def test_a_queue_that_closes_while_its_add_is_in_flight_leaves_no_job_running(pg_dsn: str) -> None:
    """Invariant 6: an add that claims for the node's workers, held in flight (a lock on the schema's
    ``paused`` table, which its statement reads) while the queue closes, commits before the session
    releases the node's jobs: its job ends ready, not running under a node that is gone."""
    ran: list[str] = []
    answers: list[Job] = []
    locker = await trio.to_thread.run_sync(psycopg.connect, pg_dsn)
    try:
        async with trio.open_nursery() as outer:
            async with _noting_queue(pg_dsn, ran, 2) as (queue, store):
                await trio.to_thread.run_sync(
                    locker.execute, f"LOCK TABLE {store.schema}.paused IN ACCESS EXCLUSIVE MODE"
                )

                async def enqueue() -> None:
                    answers.append(await queue.enqueue("note"))

                outer.start_soon(enqueue)
                with trio.fail_after(10):
                    while not store._reserved:  # noqa: ASYNC110 - the add's statement is in flight, claiming
                        await trio.sleep(0.01)
                outer.start_soon(trio.to_thread.run_sync, _rollback_later, locker)
            # (the queue has closed: its session waited for the add, then released the node's jobs)
            assert ran == [] and [job.state for job in answers] == [JobState.RUNNING]
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                row = conn.execute(f"SELECT state, node FROM {store.schema}.jobs WHERE id = %s", (answers[0].id,))
                assert row.fetchone() == ("ready", None)
    finally:
        await trio.to_thread.run_sync(locker.close)


def _rollback_later(conn: psycopg.Connection[Any]) -> None:
    """Roll ``conn`` back (ending its lock) after a moment in which the queue begins to close."""
    time.sleep(0.3)
    conn.rollback()


def _ready_notices(conn: psycopg.Connection[Any], seconds: float) -> list[str]:
    """The "ready" notices ``conn`` hears within ``seconds``, or until the first."""
    for notice in conn.notifies(timeout=seconds):
        if notice.payload.startswith("r|"):
            return [notice.payload]
    return []


async def test_other_nodes_hear_of_the_jobs_an_add_left_ready_not_of_those_it_claimed(pg_dsn: str) -> None:
    takers: dict[str | None, int] = {None: 1}
    handed: list[Job] = []
    async with _node(pg_dsn, takers, handed) as store:
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute(f"LISTEN {store.channel}")
            await store.add([_job()])
            assert len(handed) == 1
            assert await trio.to_thread.run_sync(_ready_notices, other, 0.3) == []
            takers.clear()
            await store.add([_job()])
            assert len(await trio.to_thread.run_sync(_ready_notices, other, 5.0)) == 1


async def test_a_dead_nodes_add_claimed_job_is_rescued_and_its_stale_outcome_refused(pg_dsn: str) -> None:
    """A job an add claimed runs under the adding node's lease like any claim: rescued once that lease
    lapses, run again under a new epoch, and the dead node's late outcome changes nothing."""
    clock = Clock()
    async with _node(pg_dsn, {}, [], clock=clock) as live:
        with psycopg.connect(pg_dsn, autocommit=True) as dead:  # a node that claims at add, then vanishes
            assert sql.claim(dead, live.schema, "dead", 1, clock.now + 30, "1", False, now=clock.now) == []
            claiming = sql.Claiming("dead", "2", (True,), None)
            assert sql.add_claiming(dead, live.schema, [("d-1", _job(), "{}")], clock.now, None, claiming)[1] == ["d-1"]
        clock.now += 20
        assert await live.rescue() == 0  # its lease still runs
        clock.now += 11
        assert await live.rescue() == 1
        (again,) = await live.claim(ClaimRequest(node="a", limit=1, lease=30.0))
        assert (again.id, again.epoch) == ("d-1", 2)
        assert await live.complete([Succeeded("d-1", 1, "late")]) == [None]
        assert await live.complete([Succeeded("d-1", 2, "ok")]) == [JobState.SUCCEEDED]
        done = await live.get("d-1")
        assert (done.result, done.attempts) == ("ok", 1)
