"""PostgresStore's flows (``NewJob.after``) across nodes: what only a shared database has.

The store-independent rules are the conformance suite's (``_cases_flows``); these check two nodes on
one schema: a child released on the node that did not complete its parent, a cascade seen by the
other node, an ``enqueue_tx`` rolled back, two parents of one child completed at the same instant on
two nodes, and that a job without parents still completes in one statement. Sessions run on a fake
wall clock (the tests move it); the only real waits are for notifications between nodes, bounded by
``fail_after``.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import pytest
import trio

import trioq
from trioq import InvalidJob, Job, JobState
from trioq.stores import ClaimRequest, Failed, NewJob, StoreConfig, Succeeded
from trioq.stores.postgres import _admin, _flows, _handoff
from trioq.stores.postgres import _transitions as sql

from .pgplans import Clock, Recording

pytestmark = pytest.mark.slow

T = TypeVar("T")

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

    async def until(self, check: Any) -> None:
        """Until ``check()`` holds, woken by each hint; fails after :data:`HEARD_WITHIN` seconds."""
        with trio.fail_after(HEARD_WITHIN):
            while not check():
                self.changed = trio.Event()
                await self.changed.wait()


@asynccontextmanager
async def _node(
    dsn: str, schema: str, clock: Clock, node: str, heard: Heard | None = None
) -> AsyncIterator[trioq.PostgresStore]:
    heard = Heard() if heard is None else heard
    store = trioq.PostgresStore(dsn, schema=schema)
    config = StoreConfig(
        clock=clock, node=node, on_ready=heard.on_ready, watched=heard.watched, on_finished=heard.on_finished
    )
    async with store.session(config):
        yield store


def _job(
    *after: str | int, key: str | None = None, delay: float = 0.0, deadline: float | None = None, queue: str = "default"
) -> NewJob:
    return NewJob("t", {}, 0, key, 3, delay, queue, None, deadline, (), tuple(after))


def _schema() -> str:
    return f"f_{secrets.token_hex(4)}"


async def _run(store: trioq.PostgresStore, node: str, result: Any = None) -> list[Job]:
    """Claim every ready job on ``node`` and succeed each with ``result``."""
    claimed = await store.claim(ClaimRequest(node=node, limit=100, lease=30.0))
    await store.complete([Succeeded(j.id, j.epoch, result) for j in claimed])
    return claimed


async def _states(store: trioq.PostgresStore, ids: Sequence[str]) -> list[JobState]:
    return [(await store.get(job_id)).state for job_id in ids]


# ------------------------------------------------------------------ add


async def test_a_batch_with_ints_waits_and_runs_in_order_across_nodes(pg_dsn: str) -> None:
    """A chain a -> b -> c added in one batch (ints) waits; each parent's success on one node releases
    the next job, which the other node hears of and claims."""
    schema, clock = _schema(), Clock()
    heard_b = Heard()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b", heard_b) as b:
        jobs = await a.add([_job(), _job(0), _job(1)])
        assert [j.state for j in jobs] == [JobState.READY, JobState.WAITING, JobState.WAITING]
        assert jobs[1].after == (jobs[0].id,) and jobs[2].after == (jobs[1].id,)
        assert (await a.get(jobs[2].id)).after == (jobs[1].id,)
        counts = await a.counts()
        assert counts["waiting"] == 2 and counts["ready"] == 1
        assert [j.id for j in await _run(a, "a", {"n": 1})] == [jobs[0].id]
        # b hears of the released child in the completion's own transaction.
        await heard_b.until(lambda: sum(heard_b.ready) >= 1)
        assert [j.id for j in await _run(b, "b")] == [jobs[1].id]
        assert [j.id for j in await _run(a, "a")] == [jobs[2].id]
        assert await b.results([j.id for j in jobs] + ["nope"]) == {jobs[0].id: {"n": 1}, jobs[1].id: None,
                                                                    jobs[2].id: None}  # fmt: skip
        assert not await a.has_pending()


async def test_parents_by_id_and_the_states_they_give(pg_dsn: str) -> None:
    """Parents named by id: succeeded ones are met, a dead or cancelled one cancels the child at once
    (its error naming it), an unknown one refuses the whole batch."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        done, dead, running = await a.add([_job(), _job(), _job()])
        claimed = {j.id: j for j in await a.claim(ClaimRequest(node="a", limit=3, lease=30.0))}
        await a.complete([Succeeded(done.id, claimed[done.id].epoch, 1), Failed(dead.id, claimed[dead.id].epoch,
                                                                                 "Boom: x", None)])  # fmt: skip
        assert (await a.get(dead.id)).state is JobState.DEAD
        plain, child, failed = await a.add([_job(done.id), _job(done.id, running.id), _job(running.id, dead.id)])
        assert plain.state is JobState.READY
        assert child.state is JobState.WAITING
        assert failed.state is JobState.CANCELLED
        assert failed.error == f"ParentFailed: parent {dead.id} is dead"
        assert failed.finished_at is not None
        before = await a.counts()
        with pytest.raises(InvalidJob) as caught:
            await a.add([_job(), _job(0, "no-such-job")])
        assert caught.value.field == "jobs[1].after"
        assert await a.counts() == before
        with pytest.raises(InvalidJob):
            await a.add([_job(0)])  # an int naming no earlier job
        # The running parent succeeds: its child is released (with the plain one, two ready now).
        await a.complete([Succeeded(running.id, claimed[running.id].epoch, None)])
        assert (await a.get(child.id)).state is JobState.READY


async def test_the_id_a_job_of_the_batch_gets_is_an_unknown_parent(pg_dsn: str) -> None:
    """A parent named by the id that a job of the same batch gets (ids count up, so a caller can predict
    them): not in the store before the batch, so the batch is refused whole, as the other stores refuse
    it. It was a KeyError for the job's own id and for a cycle, and accepted for an earlier job's id."""
    schema, clock = _schema(), Clock()

    cases: list[tuple[Callable[[Callable[[int], str]], list[NewJob]], str]] = [
        (lambda later: [_job(later(1))], "after"),  # its own id
        (lambda later: [_job(later(2)), _job(0)], "jobs[0].after"),  # a cycle: the next job's id
        (lambda later: [_job(), _job(later(1))], "jobs[1].after"),  # an earlier job's id, not its index
    ]
    async with _node(pg_dsn, schema, clock, "a") as a:
        for make, field in cases:
            (anchor,) = await a.add([_job()])
            prefix, n = anchor.id.rsplit("-", 1)

            def later(k: int, prefix: str = prefix, n: str = n) -> str:  # the id the k-th add after anchor gets
                return f"{prefix}-{int(n, 16) + k:0{len(n)}x}"

            before = await a.counts()
            with pytest.raises(InvalidJob) as caught:
                await a.add(make(later))
            assert caught.value.field == field
            assert await a.counts() == before


async def test_a_key_held_stands_for_its_holder(pg_dsn: str) -> None:
    """An earlier job of the batch whose key another job holds: the later job waits for the holder."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        (holder,) = await a.add([_job(key="k")])
        again, child = await a.add([_job(key="k"), _job(0)])
        assert again.id == holder.id
        assert child.after == (holder.id,) and child.state is JobState.WAITING


async def test_waiting_jobs_do_not_count_against_max_pending(pg_dsn: str) -> None:
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        (parent,) = await a.add([_job()], max_pending=1)
        children = await a.add([_job(parent.id) for _ in range(5)], max_pending=1)
        assert {j.state for j in children} == {JobState.WAITING}
        with pytest.raises(trioq.QueueFull):
            await a.add([_job()], max_pending=1)


async def test_a_waiting_job_expires_at_its_deadline_and_cascades(pg_dsn: str) -> None:
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        parent, child, grandchild = await a.add([_job(), _job(0, deadline=5.0), _job(1)])
        clock.now += 6
        await a.promote()
        assert await _states(a, [parent.id, child.id, grandchild.id]) == [
            JobState.READY, JobState.CANCELLED, JobState.CANCELLED,
        ]  # fmt: skip
        assert (await a.get(grandchild.id)).error == f"ParentFailed: parent {child.id} is cancelled"


# ------------------------------------------------------ cancel, retry


async def test_a_cancel_on_one_node_cascades_and_the_other_hears(pg_dsn: str) -> None:
    """Cancelling a parent cancels its waiting descendants in the same transaction; a node watching
    one of them hears of its end; a retry of the parent makes them wait again."""
    schema, clock = _schema(), Clock()
    heard_b = Heard()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b", heard_b) as b:
        root, other = await a.add([_job(), _job()])
        child, grandchild, keeps = await a.add([_job(root.id, other.id), _job(0), _job(other.id)])
        heard_b.watched.add(grandchild.id)
        await a.cancel(root.id)
        assert await _states(b, [child.id, grandchild.id, keeps.id]) == [
            JobState.CANCELLED, JobState.CANCELLED, JobState.WAITING,
        ]  # fmt: skip
        await heard_b.until(lambda: any(j.id == grandchild.id for j in heard_b.finished))
        with pytest.raises(InvalidJob) as caught:
            await b.retry(grandchild.id)
        assert caught.value.field == "after" and child.id in str(caught.value)
        retried = await b.retry(root.id)
        assert retried.state is JobState.READY
        assert await _states(a, [child.id, grandchild.id]) == [JobState.WAITING, JobState.WAITING]
        got = await a.get(child.id)
        assert got.error is None and got.finished_at is None
        # other fails: child and keeps are cancelled, grandchild with child.
        claimed = {j.id: j for j in await b.claim(ClaimRequest(node="b", limit=10, lease=30.0))}
        await b.complete([Failed(other.id, claimed[other.id].epoch, "Boom: x", None)])
        assert await _states(a, [child.id, grandchild.id, keeps.id]) == [JobState.CANCELLED] * 3
        assert (await a.get(child.id)).error == f"ParentFailed: parent {other.id} is dead"
        # root's own success now moves nobody; a retry of other revives all three, waiting on root no more.
        await b.complete([Succeeded(root.id, claimed[root.id].epoch, None)])
        await a.retry(other.id)
        assert await _states(a, [child.id, grandchild.id, keeps.id]) == [JobState.WAITING] * 3


async def test_retry_of_a_parent_leaves_a_child_another_parent_blocks(pg_dsn: str) -> None:
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        p, q = await a.add([_job(), _job()])
        (child,) = await a.add([_job(p.id, q.id)])
        await a.cancel(p.id)
        await a.cancel(q.id)
        assert (await a.get(child.id)).error == f"ParentFailed: parent {p.id} is cancelled"
        await a.retry(p.id)
        got = await a.get(child.id)
        assert got.state is JobState.CANCELLED and got.error == f"ParentFailed: parent {q.id} is cancelled"
        await a.retry(q.id)
        assert (await a.get(child.id)).state is JobState.WAITING


# ------------------------------------------------------------ enqueue_tx


async def test_enqueue_tx_with_parents_commits_or_leaves_nothing(pg_dsn: str) -> None:
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        (parent,) = await a.add([_job()])

        def order(commit: bool) -> list[Job]:
            with psycopg.connect(pg_dsn) as conn, conn.transaction(force_rollback=not commit):
                return a.add_tx(conn, [_job(), _job(0, parent.id)], clock.now)

        rolled_back = await trio.to_thread.run_sync(order, False)
        for job in rolled_back:
            with pytest.raises(trioq.JobNotFound):
                await a.get(job.id)
        committed = await trio.to_thread.run_sync(order, True)
        assert await _states(a, [j.id for j in committed]) == [JobState.READY, JobState.WAITING]
        await _run(a, "a")  # both parents succeed
        assert (await a.get(committed[1].id)).state is JobState.READY
        # The rolled-back order left no edge either: the parent's end found one child only.
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute(f"SELECT count(*) FROM {schema}.flow_edges").fetchone()
        assert row is not None and row[0] == 2


# ----------------------------------------------------------- concurrency


@pytest.mark.parametrize("parents", [True, False], ids=["one-statement", "general-path"])
async def test_two_parents_succeeding_at_once_on_two_nodes_release_the_child_once(pg_dsn: str, parents: bool) -> None:
    """Children of two parents that two nodes complete at the same instant (two connections let go
    together): each child's count reaches zero exactly once, never skipped and never twice: the two
    completions together released each child once, and every child is claimed once. Either way a
    success goes: released in its own statement, or by the general path."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        for _ in range(10):
            p, q = await a.add([_job(), _job()])
            kids = await a.add([_job(p.id, q.id) for _ in range(20)])
            (got_p,) = await a.claim(ClaimRequest(node="a", limit=1, lease=30.0))
            (got_q,) = await b.claim(ClaimRequest(node="b", limit=1, lease=30.0))
            barrier = threading.Barrier(2)

            def complete(job: Job, node: str) -> _flows.Settled:
                settled = _flows.Settled()
                with psycopg.connect(pg_dsn, autocommit=True) as conn:
                    barrier.wait()  # noqa: B023 (used within its own iteration)
                    sql.complete(conn, schema, [Succeeded(job.id, job.epoch, None)], clock.now, "x", node,
                                 settled=settled, parents=parents)  # fmt: skip
                return settled

            done: list[_flows.Settled] = []

            async def run(job: Job, node: str) -> None:
                done.append(await trio.to_thread.run_sync(complete, job, node))  # noqa: B023

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, got_p, "a")
                nursery.start_soon(run, got_q, "b")
            assert sorted(s.ready for s in done) == [0, 20]
            assert set(await _states(a, [k.id for k in kids])) == {JobState.READY}
            claimed = await b.claim(ClaimRequest(node="b", limit=100, lease=30.0))
            assert sorted(j.id for j in claimed) == sorted(k.id for k in kids)
            await b.complete([Succeeded(j.id, j.epoch, None) for j in claimed])


async def test_a_child_added_while_its_parent_completes_is_never_stranded(pg_dsn: str) -> None:
    """Adds of children race completions of their parent on another node: each child is ready (the
    completion saw it) or added ready (the add saw the success); none is left waiting."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a, _node(pg_dsn, schema, clock, "b") as b:
        children: list[Job] = []
        for _ in range(20):
            (parent,) = await a.add([_job()])
            (got,) = await b.claim(ClaimRequest(node="b", limit=1, lease=30.0, queues=("default",)))

            async def add_child(parent_id: str = parent.id) -> None:
                children.extend(await a.add([_job(parent_id, queue="kids")]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(add_child)
                nursery.start_soon(b.complete, [Succeeded(got.id, got.epoch, None)])
        assert set(await _states(a, [c.id for c in children])) == {JobState.READY}


def _complete_while_held(
    dsn: str, schema: str, clock: Clock, job: Job, hold: Callable[[psycopg.Connection[Any]], T]
) -> tuple[T, list[JobState | None], _flows.Settled]:
    """Run ``hold(conn)`` in a transaction left open, then complete ``job`` (a success) on a connection of
    its own, and commit ``hold``'s transaction once the completion waits for a lock it holds: the
    completion's statement began before that commit, its lock is granted after it. ``(what hold
    returned, the completion's states, what it settled)``."""
    settled = _flows.Settled()
    out: list[list[JobState | None]] = []
    with (
        psycopg.connect(dsn) as holder,
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn, autocommit=True) as look,
    ):
        holder.execute("SELECT 1")  # the transaction hold's own transaction() nests in (a savepoint)
        held = hold(holder)
        pid = conn.info.backend_pid

        def complete() -> None:
            states, _, _ = sql.complete(conn, schema, [Succeeded(job.id, job.epoch, "r")], clock.now, "x", "b",
                                        settled=settled, parents=True)  # fmt: skip
            out.append(states)

        thread = threading.Thread(target=complete)
        thread.start()
        try:
            while True:  # until the completion waits for a lock the holder's transaction holds
                row = look.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "Lock":
                    break
                assert thread.is_alive(), "the completion did not wait for the holder's lock"
        finally:
            holder.commit()
            thread.join()
    return held, out[0], settled


@pytest.mark.parametrize("first_child", [True, False], ids=["first-child", "another-child"])
async def test_a_child_added_while_the_completion_waits_for_its_parent_is_released(
    pg_dsn: str, first_child: bool
) -> None:
    """An add of a child holds its parent's row while the parent's completion (begun first) waits for
    it: the child is released all the same, whether the parent had children before or not."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        (parent,) = await a.add([_job()])
        earlier = [] if first_child else await a.add([_job(parent.id)])
        (got,) = await a.claim(ClaimRequest(node="a", limit=1, lease=30.0))

        def race() -> tuple[list[Job], list[JobState | None], _flows.Settled]:
            return _complete_while_held(pg_dsn, schema, clock, got, lambda c: a.add_tx(c, [_job(parent.id)], clock.now))

        added, states, settled = await trio.to_thread.run_sync(race)
        assert states == [JobState.SUCCEEDED]
        assert settled.ready == 1 + len(earlier)
        assert await _states(a, [j.id for j in (*earlier, *added)]) == [JobState.READY] * (1 + len(earlier))


async def test_a_child_retried_while_the_completion_waits_for_its_parent_is_released(pg_dsn: str) -> None:
    """A retry of a cancelled child (it waits again on its running parent) holds the parent's row while
    the parent's completion waits for it: the child is released."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        (parent,) = await a.add([_job()])
        (child,) = await a.add([_job(parent.id)])
        (got,) = await a.claim(ClaimRequest(node="a", limit=1, lease=30.0))
        await a.cancel(child.id)

        def race() -> tuple[Job, list[JobState | None], _flows.Settled]:
            return _complete_while_held(
                pg_dsn, schema, clock, got, lambda c: _admin.retry(c, schema, child.id, clock.now, ("x", "r||1"))
            )

        retried, states, settled = await trio.to_thread.run_sync(race)
        assert retried.state is JobState.WAITING
        assert states == [JobState.SUCCEEDED] and settled.ready == 1
        assert await _states(a, [child.id]) == [JobState.READY]


async def test_a_child_revived_while_the_completion_waits_for_its_other_parent_counts_it(pg_dsn: str) -> None:
    """A retry of a dead parent revives its child, which waits on its other, running parent too; the
    revive holds that parent's row while the parent's completion waits for it: the completion counts
    itself off the child, which the retried parent's success then releases."""
    schema, clock = _schema(), Clock()
    async with _node(pg_dsn, schema, clock, "a") as a:
        running, dead = await a.add([_job(), _job()])
        (child,) = await a.add([_job(running.id, dead.id)])
        claimed = {j.id: j for j in await a.claim(ClaimRequest(node="a", limit=2, lease=30.0))}
        await a.complete([Failed(dead.id, claimed[dead.id].epoch, "Boom: x", None)])
        assert (await a.get(child.id)).state is JobState.CANCELLED

        def race() -> tuple[Job, list[JobState | None], _flows.Settled]:
            return _complete_while_held(
                pg_dsn, schema, clock, claimed[running.id],
                lambda c: _admin.retry(c, schema, dead.id, clock.now, ("x", "r||1")),
            )  # fmt: skip

        retried, states, settled = await trio.to_thread.run_sync(race)
        assert retried.state is JobState.READY
        assert states == [JobState.SUCCEEDED] and settled.ready == 0
        assert await _states(a, [child.id]) == [JobState.WAITING]
        await _run(a, "a")  # the retried parent
        assert await _states(a, [child.id]) == [JobState.READY]


# ----------------------------------------------------------- the runtime


async def test_two_queues_run_a_flow_and_a_fan_in_with_parents_results(pg_dsn: str) -> None:
    """Two nodes (queues) on one schema: a chain inserted with ``enqueue_many`` and ints runs in order, and
    a fan-in of 10 parents sees every parent's result in ``ctx.parents``."""
    registry = trioq.Registry()
    order: list[str] = []
    seen: list[dict[str, Any]] = []

    @registry.task()
    async def step(ctx: trioq.JobContext, name: str) -> str:
        order.append(name)
        return name.upper()

    @registry.task()
    async def part(ctx: trioq.JobContext, i: int) -> int:
        await trio.sleep(0.001 * (i % 3))
        return i * i

    @registry.task()
    async def gather(ctx: trioq.JobContext) -> int:
        seen.append(dict(ctx.parents))
        return sum(ctx.parents.values())

    schema = _schema()
    with trio.fail_after(60):
        async with (
            trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema=schema), workers=4) as one,
            trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema=schema), workers=4) as two,
        ):
            chain = await one.enqueue_many(
                [trioq.JobSpec("step", {"name": "a"}), trioq.JobSpec("step", {"name": "b"}, after=[0]),
                 trioq.JobSpec("step", {"name": "c"}, after=[1])]
            )  # fmt: skip
            parts = await two.enqueue_many([trioq.JobSpec("part", {"i": i}) for i in range(10)])
            fan_in = await one.enqueue("gather", after=[p.id for p in parts])
            assert (await two.wait(chain[2].id, timeout=30)).state is JobState.SUCCEEDED
            done = await two.wait(fan_in.id, timeout=30)
    assert order == ["a", "b", "c"]
    assert done.state is JobState.SUCCEEDED and done.result == sum(i * i for i in range(10))
    assert seen == [{p.id: i * i for i, p in enumerate(parts)}]
    assert done.after == tuple(p.id for p in parts)


async def test_a_failed_parent_on_one_node_cancels_the_flow_another_node_waits_on(pg_dsn: str) -> None:
    """A parent that dies on one node cancels its descendants; the other node's ``wait`` on a grandchild
    returns its cancelled snapshot; ``join()`` returns on both."""
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def boom(ctx: trioq.JobContext) -> None:
        raise RuntimeError("no")

    @registry.task()
    async def never(ctx: trioq.JobContext) -> None:
        raise AssertionError("a child of a dead parent ran")

    schema = _schema()
    with trio.fail_after(60):
        async with (
            trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema=schema), workers=2) as one,
            trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema=schema), workers=0) as two,
        ):
            jobs = await two.enqueue_many(
                [trioq.JobSpec("boom"), trioq.JobSpec("never", after=[0]), trioq.JobSpec("never", after=[1])]
            )
            last = await two.wait(jobs[2].id, timeout=30)
            await one.join()
            await two.join()
    assert last.state is JobState.CANCELLED
    assert last.error == f"ParentFailed: parent {jobs[1].id} is cancelled"


async def test_enqueue_tx_rolled_back_leaves_no_child_to_run(pg_dsn: str) -> None:
    registry = trioq.Registry()
    ran: list[str] = []

    @registry.task()
    async def step(ctx: trioq.JobContext, name: str) -> None:
        ran.append(name)

    schema = _schema()
    with trio.fail_after(60):
        async with trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema=schema), workers=2) as queue:
            parent = await queue.enqueue("step", {"name": "parent"})

            def order(commit: bool) -> Job:
                with psycopg.connect(pg_dsn) as conn, conn.transaction(force_rollback=not commit):
                    return queue.enqueue_tx(conn, "step", {"name": f"child-{commit}"}, after=[parent.id])

            lost = await trio.to_thread.run_sync(order, False)
            kept = await trio.to_thread.run_sync(order, True)
            assert (await queue.wait(kept.id, timeout=30)).state is JobState.SUCCEEDED
            await queue.join()
            with pytest.raises(trioq.JobNotFound):
                await queue.get(lost.id)
    assert sorted(ran) == ["child-True", "parent"]


# -------------------------------------------------------------- plans


def test_a_success_of_a_job_without_children_is_one_statement() -> None:
    """The fast completion stays one statement, unprepared: the parent check is a column of its lock."""
    conn = Recording(rows=[([1], None, [], [])])
    states, finished, _ = sql.complete(conn, "s", [Succeeded("j1", 1, None)], 1.0, "ch", "n")
    assert states == [JobState.SUCCEEDED] and finished == ["j1"]
    assert len(conn.sent) == 1 and conn.prepared == [False]


def test_a_success_of_a_parent_releasing_its_children_is_one_statement() -> None:
    """With ``parents`` a parent's success and its children's release are one statement, its hints in it."""
    conn = Recording(rows=[([1], None, [], [], 2, [], None)])
    settled = _flows.Settled()
    states, finished, _ = sql.complete(conn, "s", [Succeeded("p1", 1, None)], 1.0, "ch", "n", settled=settled,
                                       parents=True)  # fmt: skip
    assert states == [JobState.SUCCEEDED] and finished == ["p1"]
    assert len(conn.sent) == 1 and settled.ready == 2 and settled.parents == 0
    assert conn.prepared == [True]  # a batch this small: its planning was most of its cost
    ((query, params),) = conn.sent
    assert "flow_edges" in query and params["ready"] == "r|n|" and params["finished"] == "f|n|"


def _claimed(job_id: str, *after: str) -> Job:
    return Job(id=job_id, task="t", payload={}, state=JobState.RUNNING, attempts=0, epoch=1, priority=0, key=None,
               max_attempts=3, run_at=0.0, created_at=0.0, finished_at=None, result=None, error=None,
               after=after)  # fmt: skip


def test_parent_results_kept_with_a_claim_answer_each_child_once() -> None:
    """Results read with a claim answer each claimed child's parents once (two children of one parent:
    twice), then are gone; a child whose parents are not all kept is left to a query (``None``); past
    the bound the oldest parents go."""
    kept = _handoff.ParentResults(bound=3)
    kept.keep([_claimed("c1", "p1"), _claimed("c2", "p1", "p2"), _claimed("c3", "gone")], {"p1": 1, "p2": None})
    assert len(kept) == 2
    assert kept.take(["p1", "p2"]) == {"p1": 1, "p2": None}
    assert kept.take(["p2"]) is None and kept.take(["gone"]) is None
    assert kept.take(["p1"]) == {"p1": 1}
    assert len(kept) == 0
    kept.keep([_claimed(f"c{i}", f"p{i}") for i in range(5)], {f"p{i}": i for i in range(5)})
    assert len(kept) == 3 and kept.take(["p0"]) is None and kept.take(["p4"]) == {"p4": 4}
