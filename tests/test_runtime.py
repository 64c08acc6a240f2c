"""The queue end to end on the autojump clock: running, retrying, ordering, refusing."""

from __future__ import annotations

import enum
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import trioq
from trioq import Backoff, JobSpec, JobState
from trioq._model import check_json


async def test_all_jobs_complete_with_exactly_workers_in_parallel(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    running = 0
    peak = 0
    done: list[int] = []

    @registry.task
    async def work(ctx: trioq.JobContext, n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1.0)
        running -= 1
        done.append(n)
        return n * 2

    async with trioq.open_queue(registry, workers=4) as queue:
        jobs = await queue.enqueue_many([JobSpec("work", {"n": n}) for n in range(20)])
        start = trio.current_time()
        await queue.join()
        elapsed = trio.current_time() - start
        finished = [await queue.get(job.id) for job in jobs]

    assert peak == 4
    assert sorted(done) == list(range(20))
    assert elapsed == pytest.approx(5.0)  # 20 jobs / 4 workers * 1 s
    assert all(job.state is JobState.SUCCEEDED and job.attempts == 1 for job in finished)
    assert [job.result for job in finished] == [n * 2 for n in range(20)]


async def test_failing_job_dead_letters_after_max_attempts_with_backoff_gaps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = trioq.Registry()
    starts: list[float] = []

    @registry.task(max_attempts=4, backoff=Backoff(base=1.0, factor=3.0, max=100.0, jitter=0.0))
    async def always_fails(ctx: trioq.JobContext) -> None:
        starts.append(trio.current_time())
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    async with trioq.open_queue(registry, workers=2) as queue:
        job = await queue.enqueue("always_fails")
        final = await queue.wait(job.id)
        stats = await queue.stats()

    assert final.state == "dead"
    assert final.attempts == 4
    assert final.error == "RuntimeError: attempt 4 failed"
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([1.0, 3.0, 9.0], abs=1e-3)
    assert stats["totals"]["dead"] == 1
    assert stats["totals"]["retried"] == 3
    assert stats["jobs"]["dead"] == 1


async def test_backoff_jitter_stays_within_its_band(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    starts: list[float] = []

    @registry.task(max_attempts=6, backoff=Backoff(base=2.0, factor=2.0, max=10.0, jitter=0.5))
    async def fails(ctx: trioq.JobContext) -> None:
        starts.append(trio.current_time())
        raise RuntimeError("no")

    async with trioq.open_queue(registry, workers=1) as queue:
        job = await queue.enqueue("fails")
        await queue.wait(job.id)

    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for attempt, gap in enumerate(gaps, start=1):
        raw = min(10.0, 2.0 * 2.0 ** (attempt - 1))
        assert raw - 1e-3 <= gap <= raw * 1.5 + 1e-3


async def test_max_attempts_one_dead_letters_on_first_failure(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    calls = 0

    @registry.task
    async def once(ctx: trioq.JobContext) -> None:
        nonlocal calls
        calls += 1
        raise KeyError("missing")

    async with trioq.open_queue(registry) as queue:
        job = await queue.enqueue("once", max_attempts=1)
        final = await queue.wait(job.id)
    assert calls == 1
    assert final.state is JobState.DEAD
    assert final.attempts == 1
    assert final.error == "KeyError: 'missing'"


async def test_delay_runs_job_no_earlier_than_its_run_at(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    started: dict[str, float] = {}

    @registry.task
    async def note(ctx: trioq.JobContext, name: str) -> None:
        started[name] = trio.current_time()

    async with trioq.open_queue(registry, workers=2) as queue:
        t0 = trio.current_time()
        later = await queue.enqueue("note", {"name": "later"}, delay=30.0)
        soon = await queue.enqueue("note", {"name": "soon"}, delay=5.0)
        now = await queue.enqueue("note", {"name": "now"})
        assert later.state is JobState.SCHEDULED and soon.state is JobState.SCHEDULED
        assert now.state is JobState.READY
        assert later.run_at - later.created_at == pytest.approx(30.0)
        await queue.join()
    assert started["now"] - t0 == pytest.approx(0.0, abs=1e-3)
    assert started["soon"] - t0 == pytest.approx(5.0, abs=1e-3)
    assert started["later"] - t0 == pytest.approx(30.0, abs=1e-3)


async def test_priority_then_run_at_then_fifo(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    order: list[str] = []
    gate = trio.Event()

    @registry.task
    async def blocker(ctx: trioq.JobContext) -> None:
        await gate.wait()

    @registry.task
    async def record(ctx: trioq.JobContext, name: str) -> None:
        order.append(name)

    async with trioq.open_queue(registry, workers=1) as queue:
        await queue.enqueue("blocker", priority=100)
        await trio.testing.wait_all_tasks_blocked()
        await queue.enqueue("record", {"name": "low-1"}, priority=-1)
        await queue.enqueue("record", {"name": "mid-1"})
        await queue.enqueue("record", {"name": "high"}, priority=5)
        await queue.enqueue("record", {"name": "mid-2"})
        await queue.enqueue("record", {"name": "low-2"}, priority=-1)
        gate.set()
        await queue.join()
    assert order == ["high", "mid-1", "mid-2", "low-1", "low-2"]


async def test_task_default_priority_applies(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(priority=7)
    async def urgent(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        assert (await queue.enqueue("urgent")).priority == 7
        assert (await queue.enqueue("urgent", priority=1)).priority == 1


async def test_cancel_scheduled_ready_and_running_jobs(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    ran: list[str] = []
    started = trio.Event()
    saw_cancel = False

    @registry.task
    async def slow(ctx: trioq.JobContext, name: str) -> str:
        nonlocal saw_cancel
        ran.append(name)
        started.set()
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            saw_cancel = True
            raise
        return name

    async with trioq.open_queue(registry, workers=1) as queue:
        running = await queue.enqueue("slow", {"name": "running"})
        await started.wait()
        ready = await queue.enqueue("slow", {"name": "ready"})
        scheduled = await queue.enqueue("slow", {"name": "scheduled"}, delay=10)

        assert (await queue.cancel(scheduled.id)).state is JobState.CANCELLED
        assert (await queue.cancel(ready.id)).state is JobState.CANCELLED
        t0 = trio.current_time()
        cancelled = await queue.cancel(running.id)
        assert cancelled.state is JobState.CANCELLED
        final = await queue.wait(running.id)
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() - t0 < 1.0
        # Cancelling again is a no-op that returns the job as it is.
        again = await queue.cancel(running.id)
        assert again.state is JobState.CANCELLED and again.finished_at == cancelled.finished_at
        await trio.sleep(20)  # past the scheduled job's run_at: it must not run
        stats = await queue.stats()

    assert saw_cancel
    assert ran == ["running"]
    assert final.state is JobState.CANCELLED
    assert final.result is None
    assert stats["totals"]["cancelled"] == 3
    assert stats["totals"]["succeeded"] == 0
    assert stats["jobs"]["cancelled"] == 3


async def test_retry_of_dead_and_cancelled_jobs(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    healthy = False

    @registry.task(max_attempts=2, backoff=Backoff(base=1, jitter=0))
    async def fragile(ctx: trioq.JobContext) -> str:
        if not healthy:
            raise ConnectionError("downstream is down")
        return "ok"

    async with trioq.open_queue(registry, workers=1) as queue:
        job = await queue.enqueue("fragile")
        dead = await queue.wait(job.id)
        assert dead.state is JobState.DEAD and dead.attempts == 2
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.retry((await queue.enqueue("fragile", delay=50)).id)
        assert excinfo.value.field == "state"

        healthy = True
        retried = await queue.retry(job.id)
        assert retried.state is JobState.READY and retried.attempts == 0
        done = await queue.wait(job.id)
        assert done.state is JobState.SUCCEEDED and done.attempts == 1 and done.result == "ok"

        parked = await queue.enqueue("fragile", delay=100)
        await queue.cancel(parked.id)
        assert (await queue.retry(parked.id)).state is JobState.READY
        assert (await queue.wait(parked.id)).state is JobState.SUCCEEDED


async def test_idempotency_key_returns_existing_job(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    runs = 0

    @registry.task
    async def charge(ctx: trioq.JobContext, amount: int) -> int:
        nonlocal runs
        runs += 1
        return amount

    async with trioq.open_queue(registry, workers=1, retention=60.0) as queue:
        first = await queue.enqueue("charge", {"amount": 5}, key="order-1")
        second = await queue.enqueue("charge", {"amount": 5}, key="order-1")
        assert second.id == first.id
        await queue.join()
        # Still within retention after it finished: same job, not run again.
        third = await queue.enqueue("charge", {"amount": 5}, key="order-1")
        assert third.id == first.id and third.state is JobState.SUCCEEDED
        other = await queue.enqueue("charge", {"amount": 6}, key="order-2")
        assert other.id != first.id
        await queue.join()
        assert runs == 2
        # After retention the job is evicted and the key is free again.
        await trio.sleep(200)
        with pytest.raises(trioq.JobNotFound):
            await queue.get(first.id)
        fresh = await queue.enqueue("charge", {"amount": 5}, key="order-1")
        assert fresh.id != first.id
        await queue.join()
        assert runs == 3


async def test_max_retained_bounds_terminal_jobs(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=4, max_retained=10) as queue:
        jobs = await queue.enqueue_many([JobSpec("noop") for _ in range(50)])
        await queue.join()
        stats = await queue.stats()
        assert stats["jobs"]["succeeded"] == 10
        assert stats["totals"]["succeeded"] == 50
        with pytest.raises(trioq.JobNotFound):
            await queue.get(jobs[0].id)


async def test_queue_full_at_max_ready_is_all_or_nothing(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0, max_ready=3) as queue:
        await queue.enqueue("noop")
        await queue.enqueue("noop", key="k")
        with pytest.raises(trioq.QueueFull) as excinfo:
            await queue.enqueue_many([JobSpec("noop"), JobSpec("noop")])
        assert excinfo.value.retry_after > 0
        assert (await queue.stats())["jobs"]["ready"] == 2
        # An existing key adds nothing, so it is not refused.
        assert (await queue.enqueue("noop", key="k")).key == "k"
        await queue.enqueue("noop")
        with pytest.raises(trioq.QueueFull):
            await queue.enqueue("noop", delay=10)
        assert (await queue.stats())["jobs"]["ready"] == 3


async def test_bad_input_gets_specific_errors() -> None:
    registry = trioq.Registry()

    @registry.task
    async def send(ctx: trioq.JobContext, to: str, subject: Any = "") -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        with pytest.raises(trioq.UnknownTask, match="no task named 'nope'"):
            await queue.enqueue("nope")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"payload": {"to": object()}}, "payload"),
            ({"payload": {"to": float("nan")}}, "payload"),
            ({"payload": {"to": float("-inf")}}, "payload"),
            ({"payload": {"to": "a", "subject": [float("inf")]}}, "payload"),
            ({"payload": {"to": "a", "subject": {1: "x", "y": object()}}}, "payload"),
            ({"payload": ["to"]}, "payload"),
            ({"payload": {"subject": "x"}}, "payload"),  # missing required 'to'
            ({"payload": {"to": "a", "cc": "b"}}, "payload"),  # unknown argument
            ({"payload": {"to": "a"}, "delay": -1}, "delay"),
            ({"payload": {"to": "a"}, "delay": float("inf")}, "delay"),
            ({"payload": {"to": "a"}, "delay": "soon"}, "delay"),
            ({"payload": {"to": "a"}, "delay": True}, "delay"),
            ({"payload": {"to": "a"}, "delay": 10**400}, "delay"),
            ({}, "payload"),  # no payload, but 'to' is required
            ({"payload": {"to": "a"}, "priority": 1.5}, "priority"),
            ({"payload": {"to": "a"}, "priority": True}, "priority"),
            ({"payload": {"to": "a"}, "max_attempts": 0}, "max_attempts"),
            ({"payload": {"to": "a"}, "key": ""}, "key"),
            ({"payload": {"to": "a"}, "key": 12}, "key"),
        ]
        for kwargs, field in cases:
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await queue.enqueue("send", **kwargs)
            assert excinfo.value.field == field, kwargs
            assert isinstance(excinfo.value, trioq.TrioqError)
        # A bad job in a batch rejects the whole batch and names its index.
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue_many([JobSpec("send", {"to": "a"}), JobSpec("send", {"to": "a"}, delay=-5)])
        assert excinfo.value.field == "jobs[1].delay"
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue_many(
                [JobSpec("send", {"to": "a"}, delay=2), JobSpec("send", {"to": "a"}, priority="1")]
            )
        assert excinfo.value.field == "jobs[1].priority"
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.enqueue_many([JobSpec("send", {"to": "a"}), JobSpec("send")])
        assert excinfo.value.field == "jobs[1].payload"
        assert "jobs[1]." in str(excinfo.value) and "'to'" in str(excinfo.value)
        # JSON allows these, the store's encoding does not: refused, and nothing
        # of the batch is added.
        for bad in (2**64, -(2**63) - 1, 10**5000, "\ud800"):
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await queue.enqueue_many([JobSpec("send", {"to": "a"}), JobSpec("send", {"to": "a", "subject": bad})])
            assert excinfo.value.field == "jobs[1].payload", bad
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await queue.enqueue("send", {"to": bad})
            assert excinfo.value.field == "payload", bad
        largest = await queue.enqueue("send", {"to": "a", "subject": 2**64 - 1})
        assert largest.payload["subject"] == 2**64 - 1
        await queue.cancel(largest.id)
        assert (await queue.stats())["jobs"]["ready"] == 0
        with pytest.raises(trioq.JobNotFound):
            await queue.get("no-such-id")
        with pytest.raises(trioq.JobNotFound):
            await queue.cancel("no-such-id")
        with pytest.raises(trioq.JobNotFound):
            await queue.wait("no-such-id")


async def test_result_that_is_not_json_fails_the_attempt(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def returns_object(ctx: trioq.JobContext) -> object:
        return object()

    async with trioq.open_queue(registry) as queue:
        job = await queue.enqueue("returns_object")
        final = await queue.wait(job.id)
    assert final.state is JobState.DEAD
    assert final.error is not None and "JSON" in final.error


@pytest.mark.parametrize("field", ["priority", "max_attempts"])
async def test_an_int_field_the_store_cannot_hold_is_refused_and_adds_nothing(
    field: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # It used to pass validation, enter the table, then fail in the WAL's
    # encoder with a bare OverflowError: refused, yet ready to run, unlogged.
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path / "wal"), workers=0) as queue:
        for bad in (2**63, 2**64, -(2**63) - 1, 2**70):  # (2**63: past PostgreSQL's bigint, refused everywhere)
            if field == "max_attempts" and bad < 0:
                continue
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await queue.enqueue_many([JobSpec("noop"), JobSpec("noop", **{field: bad})])
            assert excinfo.value.field == f"jobs[1].{field}"
        assert (await queue.stats())["jobs"]["ready"] == 0
        assert (await queue.enqueue("noop", **{field: 2**63 - 1})).state == "ready"
    for bad in (2**63, 2**64):
        with pytest.raises(ValueError, match=field):
            registry.task(name="big", **{field: bad})(noop)


@pytest.mark.parametrize("kind", ["memory", "wal"])
async def test_a_result_the_store_cannot_hold_fails_the_attempt_not_the_queue(
    kind: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # JSON takes these; msgpack (the table and the log) does not. They used to
    # reach the WAL's encoder after the table had changed, and the store error
    # stopped every worker.
    registry = trioq.Registry()

    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]

    @registry.task(max_attempts=1)
    async def returns(ctx: trioq.JobContext, which: int) -> object:
        return [2**64, "\ud800", {"n": -(2**63) - 1}, deep, "fine"][which]

    store = trioq.MemoryStore() if kind == "memory" else trioq.WALStore(tmp_path / "wal", fsync="always")
    async with trioq.open_queue(registry, store=store, workers=2) as queue:
        jobs = await queue.enqueue_many([JobSpec("returns", {"which": i}) for i in range(5)])
        finals = [await queue.wait(job.id) for job in jobs]
    assert [f.state for f in finals] == [JobState.DEAD] * 4 + [JobState.SUCCEEDED]
    for final in finals[:3]:
        assert final.error is not None and "result cannot be stored" in final.error
    assert finals[3].error is not None and "nests deeper than 128 levels" in finals[3].error
    assert finals[4].result == "fine"


async def test_wait_times_out_with_timeout_error(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    async with trioq.open_queue(registry, workers=0) as queue:
        job = await queue.enqueue("noop")
        with pytest.raises(TimeoutError):
            await queue.wait(job.id, timeout=5)
        with pytest.raises(trioq.TrioqError):
            await queue.wait(job.id, timeout=0)


async def test_job_context_exposes_job_and_attempt(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    seen: list[tuple[str, int, int, bool]] = []

    @registry.task(max_attempts=2, backoff=Backoff(base=0.1, jitter=0))
    async def look(ctx: trioq.JobContext, x: int) -> None:
        seen.append((ctx.job.id, ctx.attempt, ctx.job.epoch, ctx.heartbeat()))
        if ctx.attempt == 1:
            raise ValueError("again")

    async with trioq.open_queue(registry) as queue:
        job = await queue.enqueue("look", {"x": 1})
        await queue.wait(job.id)
    assert seen == [(job.id, 1, 1, True), (job.id, 2, 2, True)]


async def test_job_snapshot_fields_and_to_dict(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(name="email.send", max_attempts=3)
    async def send(ctx: trioq.JobContext, to: str) -> dict[str, str]:
        return {"sent": to}

    async with trioq.open_queue(registry) as queue:
        job = await queue.enqueue("email.send", {"to": "a@b.c"}, key="k1")
        assert job.task == "email.send" and job.payload == {"to": "a@b.c"}
        assert job.max_attempts == 3 and job.key == "k1" and job.attempts == 0 and job.epoch == 0
        done = await queue.wait(job.id)
    data = done.to_dict()
    assert data["state"] == "succeeded" and data["result"] == {"sent": "a@b.c"}
    assert done.finished_at is not None and done.finished_at >= done.created_at
    assert set(data) == {
        "id", "task", "payload", "state", "attempts", "epoch", "priority", "key",
        "max_attempts", "run_at", "created_at", "finished_at", "result", "error", "errors",
        "queue", "tenant", "deadline", "limits", "after",
    }  # fmt: skip
    assert data["errors"] == []
    assert (data["queue"], data["tenant"], data["deadline"]) == ("default", None, None)


async def test_producer_only_queue_never_runs_jobs(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def never(ctx: trioq.JobContext) -> None:
        raise AssertionError("a producer-only queue ran a job")

    async with trioq.open_queue(registry, workers=0) as queue:
        job = await queue.enqueue("never")
        await trio.sleep(10)
        assert (await queue.get(job.id)).state is JobState.READY
        assert (await queue.stats())["workers"]["configured"] == 0


async def test_jobs_enqueued_on_a_producer_queue_run_on_a_later_queue(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def double(ctx: trioq.JobContext, n: int) -> int:
        return 2 * n

    store = trioq.MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=0) as producer:
        job = await producer.enqueue("double", {"n": 21})
    async with trioq.open_queue(registry, store=store, workers=2) as consumer:
        assert (await consumer.wait(job.id)).result == 42


def test_registry_refuses_misfits() -> None:
    registry = trioq.Registry()

    @registry.task
    async def a(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        registry.task(name="a")(a)
    with pytest.raises(TypeError, match="not an async function"):

        @registry.task
        def sync_default(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(TypeError, match="async function"):

        @registry.task(kind="thread")
        async def async_thread(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(TypeError, match="module-level"):

        @registry.task(kind="process")
        def local_process(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(ValueError, match="max_attempts"):
        registry.task(name="x", max_attempts=0)(a)
    with pytest.raises(ValueError, match="kind"):
        registry.task(name="y", kind="fiber")(a)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="timeout"):
        registry.task(name="z", timeout=-1)(a)
    with pytest.raises(TypeError, match="job context"):
        registry.add(lambda: None, name="no_ctx", kind="thread")
    assert "a" in registry and len(registry) == 1


def test_backoff_formula_and_validation() -> None:
    backoff = Backoff(base=0.5, factor=2.0, max=3.0, jitter=0.5)
    assert [backoff.delay(n, 0.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.delay(2, 1.0) == pytest.approx(1.5)
    assert Backoff(base=1, factor=10, max=60).delay(10_000, 0.0) == 60
    with pytest.raises(trioq.InvalidJob):
        Backoff(base=-1)
    with pytest.raises(trioq.InvalidJob):
        Backoff(factor=0.5)


def test_job_state_is_a_str_enum() -> None:
    assert JobState.DEAD == "dead"
    assert [s.value for s in JobState] == [
        "scheduled",
        "ready",
        "running",
        "succeeded",
        "dead",
        "cancelled",
        "deferred",
        "waiting",
    ]
    assert {s for s in JobState if s.terminal} == {JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED}


async def test_snapshots_do_not_share_the_stored_payload(autojump_clock: trio.testing.MockClock) -> None:
    """A Job is a snapshot: mutating its payload (even nested) changes nothing stored."""
    registry = trioq.Registry()
    seen: list[dict[str, Any]] = []

    @registry.task(max_attempts=2, backoff=Backoff(base=0.1, jitter=0))
    async def meddle(ctx: trioq.JobContext, n: int, tags: list[str]) -> None:
        seen.append({"n": n, "tags": list(tags)})
        ctx.job.payload["n"] = 99
        ctx.job.payload["tags"].append("changed")
        if ctx.attempt == 1:
            raise RuntimeError("again")

    async with trioq.open_queue(registry, workers=1) as queue:
        job = await queue.enqueue("meddle", {"n": 1, "tags": ["a"]})
        final = await queue.wait(job.id)
        got = await queue.get(job.id)
        got.payload["tags"].append("from outside")
        again = await queue.get(job.id)
    assert seen == [{"n": 1, "tags": ["a"]}, {"n": 1, "tags": ["a"]}]
    assert final.payload == {"n": 1, "tags": ["a"]}
    assert again.payload == {"n": 1, "tags": ["a"]}


# ------------------------------------------------------- trio's checkpoint rule


def _checkpoint_store(kind: str, tmp_path: Any) -> trioq.Store:
    return trioq.MemoryStore() if kind == "memory" else trioq.WALStore(tmp_path, fsync="never")


_noops = trioq.Registry()


@_noops.task
async def noop(ctx: trioq.JobContext) -> None:
    pass


@pytest.mark.parametrize("kind", ["memory", "wal"])
async def test_a_loop_of_enqueues_lets_other_tasks_run(kind: str, tmp_path: Any) -> None:
    """Every Queue method is a checkpoint, as trio's own are: a producer loop cannot starve the loop."""
    ticks = 0
    producing = True

    async def ticker() -> None:
        nonlocal ticks
        while producing:
            ticks += 1
            await trio.lowlevel.checkpoint()

    store = _checkpoint_store(kind, tmp_path)
    async with trioq.open_queue(_noops, store=store, workers=0) as queue, trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        for _ in range(50):
            job = await queue.enqueue("noop")
            await queue.get(job.id)
        during = ticks - before
        producing = False
    assert during >= 90, f"the ticker ran {during} times during 50 enqueues and 50 gets"


@pytest.mark.parametrize("kind", ["memory", "wal"])
async def test_a_cancelled_caller_enqueues_nothing(kind: str, tmp_path: Any) -> None:
    async with trioq.open_queue(_noops, store=_checkpoint_store(kind, tmp_path), workers=0) as queue:
        job = await queue.enqueue("noop")
        with trio.CancelScope() as scope:
            scope.cancel()
            await queue.enqueue("noop")
            pytest.fail("a cancelled enqueue returned")  # pragma: no cover
        assert scope.cancelled_caught
        for call in (lambda: queue.get(job.id), queue.stats, lambda: queue.cancel(job.id)):
            with trio.CancelScope() as scope:
                scope.cancel()
                await call()
            assert scope.cancelled_caught
        stats = await queue.stats()
        assert stats["totals"]["enqueued"] == 1
        assert stats["jobs"]["ready"] == 1 and stats["jobs"]["cancelled"] == 0


async def test_waits_leave_nothing_behind_and_concurrent_waiters_all_wake(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = trioq.Registry()

    @registry.task
    async def nap(ctx: trioq.JobContext) -> str:
        await trio.sleep(1.0)
        return "up"

    async with trioq.open_queue(registry, workers=1) as queue:
        done = await queue.enqueue("nap")
        assert (await queue.wait(done.id)).result == "up"
        for _ in range(100):
            await queue.wait(done.id)  # already terminal
        later = await queue.enqueue("nap", delay=100.0)
        with pytest.raises(trioq.WaitTimeout):
            await queue.wait(later.id, timeout=1.0)
        running = await queue.enqueue("nap")
        results: list[str] = []

        async def waiter() -> None:
            results.append((await queue.wait(running.id)).result)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(waiter)
            await trio.sleep(0.5)
            nursery.start_soon(waiter)  # joins the same event mid-wait
        assert results == ["up"] * 4
        assert queue._waiters == {}


def test_check_json_takes_the_fast_path_only_for_values_that_round_trip() -> None:
    class Level(enum.IntEnum):
        HIGH = 2

    accepted: list[Any] = [
        {"a": "x", "b": 1, "c": True, "d": None, "e": 1.5},
        {"a": Level.HIGH, "b": [1, {"c": 2.0}]},  # subclasses and nesting: the full check
        [1, 2],
    ]
    for value in accepted:
        check_json(value, what="payload")
    # A key that is not a string is refused: json.dumps would make {1: "a"} into
    # {"1": "a"}, and the job would differ between the Python API and HTTP.
    bad_values = ({"a": float("nan")}, {"a": 1, "b": float("inf")}, {"a": {1, 2}}, {"a": b"bytes"}, {(1, 2): "x"})
    for bad in (*bad_values, {1: "a"}, {"a": [{"b": {True: 1}}]}, {"a": {None: 1}}):
        with pytest.raises(trioq.InvalidJob):
            check_json(bad, what="payload")


@pytest.mark.parametrize("kind", ["memory", "wal"])
@pytest.mark.parametrize("max_retained", [0, 1])
async def test_a_waiter_gets_the_terminal_snapshot_of_a_job_evicted_as_it_finished(
    kind: str, max_retained: int, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # wait() once woke, asked the store, and raised JobNotFound for a job that
    # had succeeded: the max_retained bound dropped it in between.
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def nap(ctx: trioq.JobContext, fail: bool = False) -> str:
        await trio.sleep(1.0)
        if fail:
            raise ValueError("no")
        return "up"

    store = trioq.MemoryStore() if kind == "memory" else trioq.WALStore(tmp_path / "wal", fsync="always")
    async with trioq.open_queue(registry, store=store, workers=3, max_retained=max_retained) as queue:
        jobs = await queue.enqueue_many([JobSpec("nap"), JobSpec("nap", {"fail": True}), JobSpec("nap")])
        cancelled = await queue.enqueue("nap", delay=5.0)
        finals: dict[str, trioq.Job] = {}

        async def waiter(job_id: str) -> None:
            finals[job_id] = await queue.wait(job_id)

        async with trio.open_nursery() as nursery:
            for job in [*jobs, cancelled]:
                nursery.start_soon(waiter, job.id)
            await trio.sleep(2.0)  # all three finish at once, each dropping the one before
            await queue.cancel(cancelled.id)
        assert [finals[j.id].state for j in jobs] == [JobState.SUCCEEDED, JobState.DEAD, JobState.SUCCEEDED]
        assert finals[jobs[0].id].result == "up" and finals[jobs[1].id].error == "ValueError: no"
        assert finals[cancelled.id].state is JobState.CANCELLED
        with pytest.raises(trioq.JobNotFound):  # evicted before anyone waited: unknown, as documented
            await queue.wait(jobs[0].id)
        assert queue._waiters == {}


async def test_wait_takes_an_infinite_timeout_and_refuses_bad_ones(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def nap(ctx: trioq.JobContext) -> str:
        await trio.sleep(10.0)
        return "up"

    async with trioq.open_queue(registry, workers=1) as queue:
        job = await queue.enqueue("nap")
        assert (await queue.wait(job.id, timeout=math.inf)).result == "up"
        assert (await queue.wait(job.id, timeout=0)).result == "up"
        assert (await queue.wait(job.id, timeout=10**400)).result == "up"  # beyond any float: no limit
        for bad in (-1, math.nan, "1", True):
            with pytest.raises(trioq.InvalidJob) as excinfo:
                await queue.wait(job.id, timeout=bad)  # type: ignore[arg-type]
            assert excinfo.value.field == "timeout"
