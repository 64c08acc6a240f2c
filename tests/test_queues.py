"""Named queues, pause/resume, tenants and deadlines through the public API, on the autojump clock."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from trioq import JobSpec, JobState
from trioq._model import DEADLINE_ERROR_PREFIX


def _registry(log: list[tuple[str, str]] | None = None, seconds: float = 1.0) -> trioq.Registry:
    """Tasks ``plain`` (queue "default") and ``mail`` (queue "email"), each sleeping ``seconds``."""
    registry = trioq.Registry()

    @registry.task
    async def plain(ctx: trioq.JobContext) -> str:
        if log is not None:
            log.append(("start", ctx.job.queue))
        await trio.sleep(seconds)
        if log is not None:
            log.append(("end", ctx.job.queue))
        return ctx.job.queue

    @registry.task(queue="email")
    async def mail(ctx: trioq.JobContext) -> str:
        return await plain(ctx)

    return registry


async def test_a_task_names_its_queue_and_an_enqueue_may_name_another(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=2) as queue:
        plain = await queue.enqueue("plain")
        mail = await queue.enqueue("mail", tenant="acme")
        moved = await queue.enqueue("mail", queue="bulk")
        (spec,) = await queue.enqueue_many([JobSpec("plain", queue="reports", tenant="t1")])
        assert [plain.queue, mail.queue, moved.queue, spec.queue] == ["default", "email", "bulk", "reports"]
        assert (mail.tenant, spec.tenant, plain.tenant) == ("acme", "t1", None)
        done = [await queue.wait(job.id) for job in (plain, mail, moved, spec)]
    assert [job.result for job in done] == ["default", "email", "bulk", "reports"]


async def test_one_pool_per_named_queue_claims_only_its_queues(autojump_clock: trio.testing.MockClock) -> None:
    """``workers={"default": 1, "email": 2}``: each queue runs at its own pool's size; other queues wait."""
    log: list[tuple[str, str]] = []
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    registry = trioq.Registry()

    @registry.task
    async def work(ctx: trioq.JobContext) -> None:
        q = ctx.job.queue
        running[q] = running.get(q, 0) + 1
        peak[q] = max(peak.get(q, 0), running[q])
        await trio.sleep(1.0)
        running[q] -= 1

    async with trioq.open_queue(registry, workers={"default": 1, "email": 2}) as queue:
        jobs = await queue.enqueue_many(
            [JobSpec("work") for _ in range(4)]
            + [JobSpec("work", queue="email") for _ in range(4)]
            + [JobSpec("work", queue="other")]
        )
        start = trio.current_time()
        for job in jobs[:8]:
            assert (await queue.wait(job.id)).state is JobState.SUCCEEDED
        elapsed = trio.current_time() - start
        stats = await queue.stats()
        other = await queue.get(jobs[8].id)
        assert other.state is JobState.READY  # no pool of this node serves "other"
        assert stats["workers"]["configured"] == 3
        assert stats["queues"] == {
            "default": {"paused": False, "workers": 1},
            "email": {"paused": False, "workers": 2},
        }
        await queue.cancel(other.id)
    assert peak == {"default": 1, "email": 2}
    assert elapsed == pytest.approx(4.0, abs=0.6)  # the default pool's 4 jobs, one at a time, in parallel with email
    assert not log


async def test_pause_stops_claims_lets_running_finish_and_resume_restarts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str]] = []
    async with trioq.open_queue(_registry(log), workers=4) as queue:
        running = await queue.enqueue("mail")
        await trio.sleep(0.5)  # started
        assert await queue.pause("email") is True
        assert await queue.pause("email") is False
        waiting = await queue.enqueue("mail")
        other = await queue.enqueue("plain")
        assert (await queue.wait(running.id)).state is JobState.SUCCEEDED  # the running attempt finished
        assert (await queue.wait(other.id)).state is JobState.SUCCEEDED  # other queues go on
        await trio.sleep(5.0)
        assert (await queue.get(waiting.id)).state is JobState.READY
        assert (await queue.stats())["queues"]["email"] == {"paused": True, "workers": 0}
        resumed_at = trio.current_time()
        assert await queue.resume("email") is True
        finished = await queue.wait(waiting.id)
        assert finished.state is JobState.SUCCEEDED
        # Started by the resume's hint, not by the next poll.
        assert [entry for entry in log if entry[0] == "start"][-1] == ("start", "email")
        assert trio.current_time() - resumed_at == pytest.approx(1.0, abs=0.01)
        assert await queue.resume("email") is False


async def test_a_pause_outlives_the_queue_on_a_wal_store(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), store=trioq.WALStore(tmp_path / "wal"), workers=2) as queue:
        await queue.pause("email")
        job = await queue.enqueue("mail")
    async with trioq.open_queue(_registry(), store=trioq.WALStore(tmp_path / "wal"), workers=2) as queue:
        await trio.sleep(3.0)
        assert (await queue.get(job.id)).state is JobState.READY
        assert (await queue.stats())["queues"] == {
            "*": {"paused": False, "workers": 2},
            "email": {"paused": True, "workers": 0},
        }
        await queue.resume("email")
        assert (await queue.wait(job.id)).state is JobState.SUCCEEDED


async def test_a_job_not_started_by_its_deadline_is_cancelled_on_time(autojump_clock: trio.testing.MockClock) -> None:
    """No worker serves it: the timer cancels it at its deadline, and ``wait`` sees why."""
    async with trioq.open_queue(_registry(), workers=0) as queue:
        start = trio.current_time()
        job = await queue.enqueue("plain", deadline=2.5)
        assert job.deadline == pytest.approx(job.created_at + 2.5)
        done = await queue.wait(job.id)
        assert trio.current_time() - start == pytest.approx(2.5, abs=0.01)
    assert done.state is JobState.CANCELLED and done.attempts == 0
    assert done.error is not None and done.error.startswith(DEADLINE_ERROR_PREFIX)


async def test_a_job_started_in_time_runs_to_the_end(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(seconds=10.0), workers=1) as queue:
        job = await queue.enqueue("plain", deadline=1.0)
        done = await queue.wait(job.id)
    assert done.state is JobState.SUCCEEDED


async def test_a_delay_past_the_deadline_means_it_never_runs(autojump_clock: trio.testing.MockClock) -> None:
    log: list[tuple[str, str]] = []
    async with trioq.open_queue(_registry(log), workers=1) as queue:
        job = await queue.enqueue("plain", delay=5.0, deadline=1.0)
        done = await queue.wait(job.id)
    assert done.state is JobState.CANCELLED and log == []


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"queue": ""}, "queue"),
        ({"queue": 3}, "queue"),
        ({"queue": "q" * 256}, "queue"),
        ({"queue": "a\x00b"}, "queue"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": ["acme"]}, "tenant"),
        ({"deadline": 0}, "deadline"),
        ({"deadline": -1.0}, "deadline"),
        ({"deadline": math.nan}, "deadline"),
        ({"deadline": math.inf}, "deadline"),
        ({"deadline": True}, "deadline"),
        ({"deadline": "5"}, "deadline"),
    ],
)
async def test_bad_queue_tenant_and_deadline_are_refused(options: dict[str, Any], field: str) -> None:
    async with trioq.open_queue(_registry(), workers=0) as queue:
        with pytest.raises(trioq.InvalidJob) as caught:
            await queue.enqueue("plain", **options)
        assert caught.value.field == field
        with pytest.raises(trioq.InvalidJob) as caught:
            await queue.enqueue_many([JobSpec("plain"), JobSpec("plain", **options)])
        assert caught.value.field == f"jobs[1].{field}"
        assert (await queue.stats())["jobs"]["ready"] == 0


async def test_bad_pause_names_and_worker_splits_are_refused() -> None:
    async with trioq.open_queue(_registry(), workers=0) as queue:
        for name in ("", 7, "x" * 300):
            with pytest.raises(trioq.InvalidJob) as caught:
                await queue.pause(name)  # type: ignore[arg-type]
            assert caught.value.field == "queue"
    for workers, error in (({}, ValueError), ({"a": 0}, ValueError), ({"": 1}, ValueError), ({"a": True}, ValueError)):
        with pytest.raises(error):
            async with trioq.open_queue(_registry(), workers=workers):
                pass
    with pytest.raises(TypeError):
        async with trioq.open_queue(_registry(), workers="4"):  # type: ignore[arg-type]
            pass
    registry = trioq.Registry()
    with pytest.raises(ValueError, match="queue"):

        @registry.task(queue="")
        async def nameless(ctx: trioq.JobContext) -> None: ...


@pytest.mark.parametrize(
    "fairness, error, words",
    [
        ([("a", 1.0)], TypeError, "mapping"),
        ({"a": 0}, ValueError, "weight"),
        ({"a": -1.0}, ValueError, "weight"),
        ({"a": math.inf}, ValueError, "weight"),
        ({"a": True}, ValueError, "weight"),
        ({"a": "2"}, ValueError, "weight"),
        ({"": 1.0}, ValueError, "tenant"),
        ({7: 1.0}, ValueError, "tenant"),
    ],
)
async def test_bad_fairness_is_refused_before_anything_opens(fairness: Any, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        async with trioq.open_queue(_registry(), fairness=fairness, workers=0):
            pass


@pytest.mark.parametrize("durable", [False, True])
async def test_fairness_shares_claims_by_weight_fifo_within_a_tenant(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, durable: bool
) -> None:
    """One worker, a backlog of 90 "noisy" jobs enqueued before 10 "small" ones: with small weighing 3,
    small gets 3 of every 4 claims while both have jobs, each tenant's jobs run in enqueue order, and a
    job of higher priority still goes first."""
    order: list[tuple[str, int]] = []
    registry = trioq.Registry()

    @registry.task
    async def work(ctx: trioq.JobContext, n: int) -> None:
        assert ctx.job.tenant is not None
        order.append((ctx.job.tenant, n))
        await trio.sleep(1)

    store = trioq.WALStore(tmp_path / "wal") if durable else trioq.MemoryStore()
    async with trioq.open_queue(registry, store=store, workers=0, fairness={"small": 3.0}) as queue:
        await queue.enqueue_many([JobSpec("work", {"n": n}, tenant="noisy") for n in range(90)])
        await queue.enqueue_many([JobSpec("work", {"n": n}, tenant="small") for n in range(10)])
        await queue.enqueue("work", {"n": -1}, tenant="noisy", priority=5)
    async with trioq.open_queue(registry, store=store, workers=1, fairness={"small": 3.0}) as queue:
        await queue.join()
    assert order[0] == ("noisy", -1)
    for tenant in ("noisy", "small"):
        mine = [n for t, n in order[1:] if t == tenant]
        assert mine == sorted(mine)
    first = order[1:13]  # 12 claims with both backlogged: 9 small, 3 noisy
    assert sum(1 for t, _ in first if t == "small") == 9
    last_small = max(i for i, (t, _) in enumerate(order) if t == "small")
    assert len(order) == 101 and last_small <= 14  # small's 10 done within its first 14 claims
