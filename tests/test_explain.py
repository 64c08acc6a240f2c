"""queue.explain(job_id): why a job is not running, for each thing that can hold one back."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trioq
from trioq._runtime.explain import reasons


def _registry() -> trioq.Registry:
    registry = trioq.Registry()
    registry.limit("gateway", max=1)
    registry.limit("api", rate=1.0, per=10.0)

    @registry.task
    async def nap(ctx: trioq.JobContext, seconds: float = 100.0) -> None:
        await trio.sleep(seconds)

    @registry.task(queue="email")
    async def mail(ctx: trioq.JobContext) -> None: ...

    return registry


def _kinds(answer: dict[str, object]) -> list[object]:
    return [reason["kind"] for reason in answer["reasons"]]  # type: ignore[attr-defined]


async def test_each_reason_a_job_waits_is_named(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers={"default": 2}) as queue:
        holder = await queue.enqueue("nap", limits=["gateway"])
        blocked = await queue.enqueue("nap", limits=["gateway"])
        await trio.sleep(1)
        assert _kinds(await queue.explain(holder.id)) == ["running"]
        answer = await queue.explain(blocked.id)
        assert answer["state"] == "ready" and answer["queue"] == "default"
        assert answer["reasons"] == [
            {
                "kind": "limit",
                "message": "limit 'gateway' is full: 1 of 1 slots held",
                "key": "gateway",
                "in_use": 1,
                "cap": 1,
            }
        ]

        later = await queue.enqueue("nap", delay=30, deadline=60)
        kinds = _kinds(await queue.explain(later.id))
        assert kinds == ["scheduled", "deadline"]
        scheduled = (await queue.explain(later.id))["reasons"][0]
        assert scheduled["due_in"] == pytest.approx(30, abs=0.01)

        mail = await queue.enqueue("mail")
        assert _kinds(await queue.explain(mail.id)) == ["no_workers"]  # this node serves "default" only
        await queue.pause("default")
        waiting = await queue.enqueue("nap")
        assert _kinds(await queue.explain(waiting.id)) == ["paused"]
        await queue.resume("default")
        await trio.sleep(1)  # it runs on the second worker: both are busy now
        assert _kinds(await queue.explain(waiting.id)) == ["running"]
        fourth = await queue.enqueue("nap")
        assert _kinds(await queue.explain(fourth.id)) == ["busy"]

        for job in (holder, blocked, later, waiting, fourth, mail):
            await queue.cancel(job.id)
        assert _kinds(await queue.explain(holder.id)) == ["finished"]
        with pytest.raises(trioq.JobNotFound):
            await queue.explain("no-such-job")


async def test_a_rate_without_a_token_says_when_the_next_is_due(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=4) as queue:
        first = await queue.enqueue("nap", {"seconds": 0.0}, limits=["api"])
        await queue.wait(first.id)
        second = await queue.enqueue("nap", {"seconds": 0.0}, limits=["api"])
        await trio.sleep(2)
        (reason,) = (await queue.explain(second.id))["reasons"]
        assert reason["kind"] == "rate" and reason["key"] == "api"
        assert reason["due_in"] == pytest.approx(8.0, abs=0.05)  # one start per 10 s
        free = await queue.enqueue("nap", {"seconds": 5.0})
        assert _kinds(await queue.explain(free.id)) in (["claimable"], ["running"])
        await queue.wait(second.id)


async def test_a_claimable_job_says_so(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=0) as queue:
        job = await queue.enqueue("nap")
        # A producer-only node has no pool at all: no_workers. The job is otherwise free to run.
        assert _kinds(await queue.explain(job.id)) == ["no_workers"]
        # With an idle worker it would start at the next claim (claims here are too quick to catch it
        # in between through the queue, so ask the reasons themselves).
        snapshot = await queue.get(job.id)
    found = reasons(snapshot, now=snapshot.created_at, paused=(), usage={}, limit_of=lambda key: None, idle=1)
    assert [reason["kind"] for reason in found] == ["claimable"]


async def test_a_snapshot_is_explained_as_it_stands(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=0) as queue:
        job = await queue.enqueue("nap", delay=30.0)
        held = await queue.get(job.id)
        await queue.cancel(job.id)
        # The snapshot says scheduled: it is explained so (the store is not asked for the job again).
        assert _kinds(await queue.explain(held))[0] == "scheduled"
        assert _kinds(await queue.explain(job.id)) == ["finished"]
