"""PostgresStore under the runtime: nodes in one process sharing a database, transactional enqueue,
cancels across nodes, leadership. (The Store protocol itself: the conformance suite; processes: test_pg_processes.)

These run on the real clock against the session's throwaway cluster, each on a database of its own.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg
import pytest
import trio

import trioq
from trioq.stores import NewJob
from trioq.stores.postgres import _defer
from trioq.stores.postgres import _transitions as sql
from trioq.stores.postgres.store import LEADER_TTL

pytestmark = pytest.mark.slow


def _registry(started: list[tuple[str, str]] | None = None) -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task(max_attempts=2, backoff=trioq.Backoff(base=0.01, jitter=0.0))
    async def echo(ctx: trioq.JobContext, text: str = "") -> str:
        return text

    @registry.task
    async def forever(ctx: trioq.JobContext) -> None:
        if started is not None:
            started.append((ctx.job.id, "forever"))
        await trio.sleep(1000)

    return registry


@asynccontextmanager
async def _node(dsn: str, registry: trioq.Registry, **options: object) -> AsyncIterator[trioq.Queue]:
    async with trioq.open_queue(registry, store=trioq.PostgresStore(dsn), **options) as queue:  # type: ignore[arg-type]
        yield queue


async def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - polls another node's effect, which sets no event here
            await trio.sleep(0.01)


async def test_jobs_enqueued_on_one_node_run_on_another(pg_dsn: str) -> None:
    """A producer-only node enqueues; a worker node runs every job; wait() on the producer sees each result."""
    registry = _registry()
    async with _node(pg_dsn, registry, workers=0) as producer, _node(pg_dsn, registry, workers=8) as worker:
        jobs = await producer.enqueue_many([trioq.JobSpec("echo", {"text": str(i)}) for i in range(200)])
        done = [await producer.wait(job.id, timeout=10) for job in jobs[:5]]
        assert [job.result for job in done] == ["0", "1", "2", "3", "4"]
        with trio.fail_after(10):
            await producer.join()
        assert (await producer.stats())["jobs"]["succeeded"] == 200
        assert (await worker.stats())["totals"]["succeeded"] == 200


async def test_wait_on_another_node_hears_the_outcome_promptly(pg_dsn: str) -> None:
    """The finishing node's notification ends a wait() on another node well before its one-second poll."""
    registry = _registry()
    async with _node(pg_dsn, registry, workers=0) as producer, _node(pg_dsn, registry, workers=2):
        for _ in range(5):
            job = await producer.enqueue("echo", {"text": "x"})
            start = trio.current_time()
            assert (await producer.wait(job.id, timeout=5)).result == "x"
            assert trio.current_time() - start < 0.5


async def test_enqueue_tx_commits_with_the_callers_transaction_and_never_on_rollback(pg_dsn: str) -> None:
    """A job inserted in the caller's transaction runs after its commit; one rolled back never exists."""
    registry = _registry()
    async with _node(pg_dsn, registry, workers=4) as queue:

        def place_orders() -> tuple[trioq.Job, trioq.Job]:
            with psycopg.connect(pg_dsn) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS orders (id int)")
                conn.commit()
                with conn.transaction():
                    conn.execute("INSERT INTO orders VALUES (1)")
                    kept = queue.enqueue_tx(conn, "echo", {"text": "kept"})
                try:
                    with conn.transaction():
                        conn.execute("INSERT INTO orders VALUES (2)")
                        lost = queue.enqueue_tx(conn, "echo", {"text": "lost"}, priority=3)
                        raise RuntimeError("the order failed")
                except RuntimeError:
                    pass
                assert conn.execute("SELECT array_agg(id) FROM orders").fetchone() == ([1],)
            return kept, lost

        kept, lost = await trio.to_thread.run_sync(place_orders)
        assert kept.state is trioq.JobState.READY and lost.priority == 3
        assert (await queue.wait(kept.id, timeout=10)).result == "kept"
        with pytest.raises(trioq.JobNotFound):
            await queue.get(lost.id)
        with pytest.raises(trioq.UnknownTask):
            await trio.to_thread.run_sync(lambda: queue.enqueue_tx(None, "nope"))
        with pytest.raises(TypeError, match="psycopg connection"):
            await trio.to_thread.run_sync(lambda: queue.enqueue_tx(pg_dsn, "echo"))
        enqueued = (await queue.stats())["totals"]["enqueued"]

        def enqueue_twice() -> list[trioq.Job]:
            with psycopg.connect(pg_dsn) as conn:
                return [queue.enqueue_tx(conn, "echo", key="twice") for _ in range(2)]

        first, second = await trio.to_thread.run_sync(enqueue_twice)
        assert first.id == second.id and (await queue.stats())["totals"]["enqueued"] == enqueued + 1


async def test_enqueue_tx_refuses_a_key_held_by_another_task_with_parents_too(pg_dsn: str) -> None:
    """A key held by a job of another task is ``InvalidJob`` (field ``key``) from ``enqueue_tx`` as from
    ``enqueue``, whether or not the job has parents (``after`` goes through the flows' insert)."""
    registry = _registry()
    async with _node(pg_dsn, registry, workers=0) as queue:
        parent = await queue.enqueue("echo")
        held = await queue.enqueue("forever", key="k")

        def enqueue(**options: object) -> trioq.Job:
            with psycopg.connect(pg_dsn) as conn:
                return queue.enqueue_tx(conn, "echo", key="k", **options)

        for options in ({}, {"after": [parent.id]}):
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await trio.to_thread.run_sync(lambda: enqueue(**options))  # noqa: B023
            assert excinfo.value.field == "key" and "'forever'" in str(excinfo.value), options
        assert [job.id for job in await queue.list(task="echo")] == [parent.id]
        assert (await queue.get(held.id)).task == "forever"


async def test_a_batch_is_refused_whole_when_another_node_takes_one_of_its_keys_meanwhile(pg_dsn: str) -> None:
    """All or nothing: a batch whose key another node's transaction (not yet committed when the batch
    began) gives to a job of another task is refused (``InvalidJob`` naming ``jobs[1].key``), and its
    other job is not added either; with the key held by a job of its own task, it goes in."""
    registry = _registry()
    async with _node(pg_dsn, registry, workers=0) as queue:
        other = await trio.to_thread.run_sync(psycopg.connect, pg_dsn)
        try:
            holder = await trio.to_thread.run_sync(lambda: queue.enqueue_tx(other, "forever", key="k"))
            outcome: list[BaseException | list[trioq.Job]] = []

            async def batch() -> None:
                try:
                    outcome.append(await queue.enqueue_many([trioq.JobSpec("echo"), trioq.JobSpec("echo", key="k")]))
                except trioq.InvalidJob as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(batch)
                await trio.sleep(0.3)  # its insert waits for the other transaction's key
                assert outcome == []
                await trio.to_thread.run_sync(other.commit)
        finally:
            await trio.to_thread.run_sync(other.close)
        (refused,) = outcome
        assert isinstance(refused, trioq.InvalidJob) and refused.field == "jobs[1].key", refused
        assert [job.id for job in await queue.list()] == [holder.id]
        again = await queue.enqueue_many([trioq.JobSpec("forever"), trioq.JobSpec("forever", key="k")])
        assert again[1].id == holder.id and [job.id for job in await queue.list(task="forever")][-1] == holder.id


async def test_a_retried_add_answers_the_holder_of_a_key_its_first_try_met(pg_dsn: str) -> None:
    """A try after a broken connection whose first try committed unseen answers as that try did: a row
    whose key was held gets the holder, not an id that was never inserted (plain and deferring adds)."""
    async with _node(pg_dsn, _registry(), workers=0) as queue:
        held = await queue.enqueue("echo", key="k")
        schema = queue.store.schema  # type: ignore[attr-defined]
        rows = [(f"r-{i}", NewJob("echo", {}, 0, key, 3, 0.0, "default", None, None, ()), "{}") for i, key in
                enumerate(["k-new", "k"])]  # fmt: skip
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            first = sql.add(conn, schema, rows, 100.0, None, None)
            again = sql.add(conn, schema, rows, 100.0, None, None, retried=True)
            deferring = _defer.add(conn, schema, rows, 100.0, 10, None, None, None, retried=True)
        assert first[0] is None and first[1] is not None and first[1].id == held.id
        assert again == first and deferring[0] == first and deferring[1] == ["ready", ""]


async def test_enqueue_tx_is_refused_clearly_by_other_stores() -> None:
    async with trioq.open_queue(_registry()) as queue:
        with pytest.raises(TypeError, match="PostgresStore"):
            queue.enqueue_tx(None, "echo")


async def test_cancel_stops_an_attempt_running_on_another_node_within_a_second(pg_dsn: str) -> None:
    started: list[tuple[str, str]] = []
    registry = _registry(started)
    async with _node(pg_dsn, registry, workers=0) as front, _node(pg_dsn, registry, workers=2) as worker:
        job = await front.enqueue("forever")
        await _until(lambda: bool(started))
        begin = trio.current_time()
        cancelled = await front.cancel(job.id)
        assert cancelled.state is trioq.JobState.CANCELLED
        await _until(lambda: (trio.current_time() - begin > 0.05) and _busy(worker) == 0, seconds=1.0)


def _busy(queue: trioq.Queue) -> int:
    return queue._pool.stats()["busy"]  # type: ignore[no-any-return]


async def test_one_leader_at_a_time_and_failover_when_it_leaves(pg_dsn: str) -> None:
    """Exactly one node leads; when the leader closes, another takes over within a leader round."""
    registry = _registry()
    first, second = trioq.PostgresStore(pg_dsn), trioq.PostgresStore(pg_dsn)
    leave = trio.Event()

    async def run_first(task_status: trio.TaskStatus[None]) -> None:
        async with trioq.open_queue(registry, store=first, workers=0):
            task_status.started()
            await leave.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(run_first)
        async with trioq.open_queue(registry, store=second, workers=0):
            assert (first.leading(), second.leading()) == (True, False)
            leave.set()  # the leader leaves, resigning its row
            await _until(lambda: not first.leading() and second.leading(), seconds=LEADER_TTL / 3 + 1.0)


async def test_the_schema_is_migrated_once_and_migrate_false_refuses_a_missing_one(pg_dsn: str) -> None:
    registry = _registry()
    with pytest.raises(RuntimeError, match="trioq pg migrate"):
        async with trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, schema="other", migrate=False)):
            pass  # pragma: no cover
    async with trio.open_nursery() as nursery:  # nodes opening at once migrate once
        for _ in range(4):
            nursery.start_soon(_open_and_close, pg_dsn, registry)
    # No workers: an idle node's enqueue may claim its job (running), which is not what this checks.
    async with trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn, migrate=False), workers=0) as queue:
        assert (await queue.enqueue("echo")).state is trioq.JobState.READY


async def _open_and_close(dsn: str, registry: trioq.Registry) -> None:
    async with trioq.open_queue(registry, store=trioq.PostgresStore(dsn), workers=0):
        pass


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="schema"):
        trioq.PostgresStore("postgresql://x", schema="Bad-Name")
    with pytest.raises(ValueError, match="lease"):
        trioq.PostgresStore("postgresql://x", lease=0)
    with pytest.raises(ValueError, match="lease"):
        trioq.PostgresStore("postgresql://x", lease=math.inf)
    with pytest.raises(TypeError, match="dsn"):
        trioq.PostgresStore(None)  # type: ignore[arg-type]


def test_trioq_pg_migrate_creates_the_schema_once_and_says_so(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trioq._app.cli import main
    from trioq.stores.postgres._schema import SCHEMA_VERSION

    assert main(["pg", "migrate", pg_dsn, "--schema", "ahead"]) == 0
    assert main(["pg", "migrate", pg_dsn, "--schema", "ahead"]) == 0
    assert main(["pg", "migrate", pg_dsn, "--schema", "Not-A-Name"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"schema ahead: migrated from version 0 to {SCHEMA_VERSION}"
    assert out[1] == f"schema ahead: at version {SCHEMA_VERSION} already"
    assert "schema must be" in out[2]
    # --fairness builds the fair claims' index ahead of the nodes, once.
    assert main(["pg", "migrate", pg_dsn, "--schema", "ahead", "--fairness"]) == 0
    assert main(["pg", "migrate", pg_dsn, "--schema", "ahead", "--fairness"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "schema ahead: fair claims' index built"
    assert out[3] == "schema ahead: fair claims' index there already"
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        (valid,) = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'ahead' AND c.relname = 'jobs_tenant_ready'"
        ).fetchone()
    assert valid
