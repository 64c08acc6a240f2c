"""Opening and leaving a queue: shutdown grace, releases, errors as themselves, no leaks."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import trioq
from trioq import JobState
from trioq.stores import MemoryStore

from .conftest import TaskTracker


async def test_shutdown_waits_for_attempts_within_grace(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def short(ctx: trioq.JobContext) -> str:
        await trio.sleep(3)
        return "done"

    store = MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=2, shutdown_grace=10) as queue:
        job = await queue.enqueue("short")
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
    assert trio.current_time() - t0 == pytest.approx(3.0, abs=1e-3)
    async with trioq.open_queue(registry, store=store, workers=0) as queue:
        final = await queue.get(job.id)
    assert final.state is JobState.SUCCEEDED and final.attempts == 1


async def test_shutdown_cancels_after_grace_and_releases_without_counting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = trioq.Registry()
    attempts_seen: list[int] = []

    @registry.task
    async def long(ctx: trioq.JobContext) -> str:
        attempts_seen.append(ctx.attempt)
        await trio.sleep(100)
        return "finished"

    store = MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=2, shutdown_grace=5) as queue:
        jobs = await queue.enqueue_many([trioq.JobSpec("long") for _ in range(3)])
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
    assert trio.current_time() - t0 == pytest.approx(5.0, abs=1e-3)
    async with trioq.open_queue(registry, store=store, workers=0) as queue:
        states = [await queue.get(j.id) for j in jobs]
        stats = await queue.stats()
    assert [j.state for j in states] == [JobState.READY] * 3  # two released, one never started
    assert all(j.attempts == 0 for j in states)
    assert stats["jobs"]["running"] == 0
    # The released jobs run again from attempt 1 on the next queue.
    async with trioq.open_queue(registry, store=store, workers=3, shutdown_grace=200) as queue:
        for job in jobs:
            assert (await queue.wait(job.id)).attempts == 1
    assert attempts_seen == [1, 1, 1, 1, 1]


async def test_no_new_claims_after_shutdown_begins(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    ran: list[int] = []

    @registry.task
    async def work(ctx: trioq.JobContext, n: int) -> None:
        ran.append(n)
        await trio.sleep(1)

    async with trioq.open_queue(registry, workers=1, shutdown_grace=60) as queue:
        await queue.enqueue_many([trioq.JobSpec("work", {"n": n}) for n in range(5)])
        await trio.testing.wait_all_tasks_blocked()
    assert ran == [0]  # the running one finished within grace; nothing new was claimed


async def test_enqueue_refused_while_shutting_down(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    refused: list[BaseException] = []

    @registry.task
    async def slow(ctx: trioq.JobContext) -> None:
        await trio.sleep(5)

    async with trio.open_nursery() as nursery, trioq.open_queue(registry, workers=1) as queue:
        await queue.enqueue("slow")
        await trio.testing.wait_all_tasks_blocked()

        async def late_producer() -> None:
            await trio.sleep(1)  # the queue is draining by now
            try:
                await queue.enqueue("slow")
            except trioq.TrioqError as exc:
                refused.append(exc)

        nursery.start_soon(late_producer)
    assert len(refused) == 1 and "shutting down" in str(refused[0])


async def test_body_exception_comes_out_as_itself(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(ValueError, match="from the body") as excinfo:
        async with trioq.open_queue(registry, workers=2) as queue:
            await queue.enqueue("noop")
            raise ValueError("from the body")
    assert type(excinfo.value) is ValueError


async def test_body_exception_keeps_its_own_cause(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()
    with pytest.raises(KeyError) as excinfo:
        async with trioq.open_queue(registry, workers=1):
            try:
                raise OSError("root cause")
            except OSError as exc:
                raise KeyError("wrapped") from exc
    assert isinstance(excinfo.value.__cause__, OSError)


async def test_a_real_exception_group_from_the_body_is_not_unwrapped() -> None:
    registry = trioq.Registry()
    with pytest.raises(ExceptionGroup) as excinfo:
        async with trioq.open_queue(registry, workers=1):
            raise ExceptionGroup("two", [ValueError("a"), KeyError("b")])
    assert len(excinfo.value.exceptions) == 2


class _BrokenStore(MemoryStore):
    """A store whose claim fails the way a corrupted log would."""

    async def claim(self, request: Any) -> Any:
        raise trioq.TrioqError("the store is broken: inspect it")


async def test_store_error_comes_out_as_itself(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(trioq.TrioqError, match="store is broken") as excinfo:
        async with trioq.open_queue(registry, store=_BrokenStore(), workers=2):
            await trio.sleep_forever()
    assert type(excinfo.value) is trioq.TrioqError


async def test_outer_cancellation_skips_grace_and_releases(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task
    async def long(ctx: trioq.JobContext) -> None:
        await trio.sleep(100)

    store = MemoryStore()
    with trio.move_on_after(2):
        async with trioq.open_queue(registry, store=store, workers=1, shutdown_grace=50) as queue:
            job = await queue.enqueue("long")
            await trio.sleep_forever()
    assert trio.current_time() == pytest.approx(2.0, abs=1e-3)
    async with trioq.open_queue(registry, store=store, workers=0) as queue:
        released = await queue.get(job.id)
    assert released.state is JobState.READY and released.attempts == 0


async def test_no_trioq_task_survives_the_block(
    autojump_clock: trio.testing.MockClock, task_tracker: TaskTracker
) -> None:
    registry = trioq.Registry()

    @registry.task(heartbeat_timeout=1.0, max_attempts=1)
    async def mixed(ctx: trioq.JobContext, n: int) -> None:
        if n % 3 == 0:
            with trio.CancelScope(shield=True):
                await trio.sleep(3)  # a stuck attempt, replaced by the watcher
        await trio.sleep(n)

    async with trioq.open_queue(registry, workers=4, shutdown_grace=2) as queue:
        await queue.enqueue_many([trioq.JobSpec("mixed", {"n": n}) for n in range(12)])
        await queue.enqueue("mixed", {"n": 1}, delay=1000)
        await trio.sleep(2.5)
        assert len(task_tracker.alive) > 4  # workers, watcher, timer, maintenance are running
    assert task_tracker.alive == set()


async def test_no_trioq_task_survives_the_block_on_the_real_clock(task_tracker: TaskTracker) -> None:
    # On the real clock, precise_timers=True also starts the timer wake-ups'
    # system task (trioq._runtime.wakeups), which the autojump clock never does: it too must be gone.
    registry = trioq.Registry()

    @registry.task
    async def nap(ctx: trioq.JobContext) -> None:
        await trio.sleep(0.002)

    with trio.fail_after(10):
        async with trioq.open_queue(registry, workers=2, precise_timers=True) as queue:
            await queue.enqueue_many([trioq.JobSpec("nap")] * 4)
            await queue.join()
            names = {task.name for task in task_tracker.alive}
            assert any("wake-ups" in name for name in names), names
    assert task_tracker.alive == set()


async def test_open_queue_validates_its_arguments() -> None:
    registry = trioq.Registry()
    for kwargs in ({"workers": -1}, {"heartbeat_timeout": 0}, {"shutdown_grace": -1}, {"max_ready": 0}):
        with pytest.raises(ValueError):
            async with trioq.open_queue(registry, **kwargs):
                pass
    with pytest.raises(TypeError):
        async with trioq.open_queue(object()):  # type: ignore[arg-type]
            pass


async def test_one_memory_store_serves_one_queue_at_a_time() -> None:
    registry = trioq.Registry()
    store = MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=0):
        with pytest.raises(RuntimeError, match="already open"):
            async with trioq.open_queue(registry, store=store, workers=0):
                pass


def test_importing_trioq_loads_neither_pytest_nor_the_http_stack() -> None:
    """trioq.testing, fault plans and trioq.http are opt-in: a plain import stays small (and so do full GCs)."""
    import subprocess
    import sys

    heavy = "{'pytest', '_pytest', 'quart', 'hypercorn', 'trio.testing', 'trioq._testing.faults'}"
    code = f"import sys, trioq; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


class _RoundTripStore(MemoryStore):
    """A MemoryStore whose ``complete`` first waits ``wait`` seconds, cancellably, before it applies
    anything: as PostgresStore's does for a thread token and a pooled connection (``trio.to_thread``
    checks for a cancel before it starts). ``batch`` is its ``batch_outcomes``."""

    def __init__(self, *, batch: bool, wait: float, nursery: bool = False) -> None:
        super().__init__()
        self.batch_outcomes = batch
        self.wait = wait
        self.nursery = nursery  # wait in a task of its own nursery: a cancel comes out in a group

    async def complete(self, outcomes: Any) -> Any:
        if self.nursery:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep, self.wait)
        else:
            await trio.sleep(self.wait)
        return await super().complete(outcomes)


@pytest.mark.parametrize(
    ("batch", "nursery"), [(True, False), (False, False), (False, True)], ids=["batched", "inline", "inline-group"]
)
async def test_an_outcome_on_its_way_when_the_grace_ends_is_recorded(
    autojump_clock: trio.testing.MockClock, batch: bool, nursery: bool
) -> None:
    # The chaos soak's finding: a handler returned just before the grace ran
    # out, the cancel at its end stopped the store call carrying the success
    # before it applied, the session's end released the job, and another node
    # ran it again. An outcome handed to the store must be recorded.
    registry = trioq.Registry()
    runs: list[int] = []

    @registry.task
    async def slow(ctx: trioq.JobContext) -> str:
        runs.append(ctx.attempt)
        await trio.sleep(4.5)  # returns 0.5 s before the grace (5 s) ends
        return "done"

    store = _RoundTripStore(batch=batch, wait=1.0, nursery=nursery)  # the success reaches the store 0.5 s after it
    async with trioq.open_queue(registry, store=store, workers=1, shutdown_grace=5) as queue:
        job = await queue.enqueue("slow")
        await trio.testing.wait_all_tasks_blocked()
        assert runs == [1]
    store.wait = 0.0
    async with trioq.open_queue(registry, store=store, workers=1, shutdown_grace=5) as queue:
        await trio.sleep(10)  # a released job would run again here
        final = await queue.get(job.id)
    assert (final.state, final.attempts, final.result) == (JobState.SUCCEEDED, 1, "done")
    assert runs == [1]
