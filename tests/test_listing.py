"""Listings and bulk actions through the public API (queue.list, retry_many, cancel_many), on the autojump
clock, on MemoryStore and WALStore. The stores' side is the conformance suite's ``list_jobs`` case."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import trioq
from trioq import JobSpec, JobState


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def fail(ctx: trioq.JobContext, n: int = 0) -> None:
        raise RuntimeError(f"failed {n}")

    @registry.task
    async def ok(ctx: trioq.JobContext, n: int = 0) -> int:
        return n

    @registry.task(queue="slow")
    async def sleepy(ctx: trioq.JobContext) -> None:
        await trio.sleep(3600)

    return registry


@pytest.fixture(params=["memory", "wal"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> trioq.Store:
    return trioq.MemoryStore() if request.param == "memory" else trioq.WALStore(tmp_path / "wal", fsync="always")


async def test_list_pages_newest_first_by_filter(store: trioq.Store, autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
        dead = [await queue.enqueue("fail", {"n": n}, tenant="acme") for n in range(3)]
        done = [await queue.enqueue("ok", {"n": n}) for n in range(4)]
        await queue.join()
        later = await queue.enqueue("ok", delay=60)
        newest_first = [later, *done[::-1], *dead[::-1]]
        assert [job.id for job in await queue.list()] == [job.id for job in newest_first]
        pages: list[str] = []
        after = None
        while page := await queue.list(limit=3, after_id=after):
            pages += [job.id for job in page]
            after = page[-1].id
        assert pages == [job.id for job in newest_first]
        listed = await queue.list(state="dead")
        assert [job.id for job in listed] == [job.id for job in dead[::-1]]
        assert all(
            job.state is JobState.DEAD and job.error == f"RuntimeError: failed {job.payload['n']}" for job in listed
        )
        assert [job.id for job in await queue.list(state=JobState.SCHEDULED)] == [later.id]
        assert len(await queue.list(task="ok", state="succeeded")) == 4
        assert [job.id for job in await queue.list(tenant="acme", limit=1)] == [dead[2].id]
        assert await queue.list(queue="slow") == []


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"state": "finished"}, "state"),
        ({"state": 3}, "state"),
        ({"task": 5}, "task"),
        ({"task": ""}, "task"),
        ({"queue": ""}, "queue"),
        ({"tenant": "x" * 300}, "tenant"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": True}, "limit"),
        ({"after_id": 7}, "after_id"),
        ({"after_id": "no-such-job"}, "after_id"),
    ],
)
async def test_a_bad_filter_is_invalid_job_naming_it(
    arguments: dict[str, object], field: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), workers=0) as queue:
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.list(**arguments)  # type: ignore[arg-type]
        assert excinfo.value.field == field


async def test_retry_many_retries_the_newest_dead_jobs_parents_before_children(
    store: trioq.Store, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
        parent, child = await queue.enqueue_many([JobSpec("fail"), JobSpec("ok", after=[0])])
        others = [await queue.enqueue("fail", {"n": n}) for n in range(3)]
        await queue.join()
        assert (await queue.get(child.id)).state is JobState.CANCELLED
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.retry_many(state="ready")
        assert excinfo.value.field == "state"
        await queue.pause("default")  # what the retries did stays to be seen
        assert await queue.retry_many(state="dead", limit=2) == 2  # the two newest dead jobs
        states = [(await queue.get(job.id)).state for job in (parent, *others)]
        assert states == [JobState.DEAD, JobState.DEAD, JobState.READY, JobState.READY]
        # The child's parent is still dead: passed over, uncounted.
        assert await queue.retry_many(state="cancelled") == 0
        # Then the parent (and the other dead job): the child its death cancelled waits again, uncounted.
        assert await queue.retry_many() == 2
        assert (await queue.get(child.id)).state is JobState.WAITING
        assert (await queue.get(parent.id)).state is JobState.READY
        await queue.resume("default")
        await queue.join()
        assert (await queue.get(child.id)).state is JobState.CANCELLED  # its parent died again
        assert (await queue.stats())["jobs"]["dead"] == 4


async def test_retry_many_reaches_a_dead_parent_behind_more_children_than_its_limit(
    store: trioq.Store, autojump_clock: trio.testing.MockClock
) -> None:
    """A dead parent with more cancelled children than ``limit``: the newest page is all children, each
    passed over (their parent is dead), so the call reads further back to the parent, whose retry revives
    them. (It returned 0 with the whole flow still dead, and the docstring's "call again until it returns
    0" stopped there: found by a hostile review.)"""
    async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
        parent, *children = await queue.enqueue_many([JobSpec("fail"), *[JobSpec("ok", after=[0]) for _ in range(5)]])
        await queue.join()
        assert {(await queue.get(c.id)).state for c in children} == {JobState.CANCELLED}
        await queue.pause("default")  # what the retry did stays to be seen
        assert await queue.retry_many(limit=2) == 1  # the parent, read on the third page
        assert (await queue.get(parent.id)).state is JobState.READY
        assert {(await queue.get(c.id)).state for c in children} == {JobState.WAITING}
        assert await queue.retry_many(limit=2) == 0  # nothing dead or cancelled is left


async def test_cancel_many_cancels_unfinished_jobs_and_counts_each_once(
    store: trioq.Store, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), store=store, workers=2) as queue:
        running = [await queue.enqueue("sleepy") for _ in range(3)]  # two run, one waits for a worker
        _parent, child = await queue.enqueue_many([JobSpec("ok", delay=30), JobSpec("ok", after=[0])])
        finished = await queue.enqueue("ok")
        await trio.sleep(1)
        with pytest.raises(trioq.InvalidJob) as excinfo:
            await queue.cancel_many(state="succeeded")
        assert excinfo.value.field == "state"
        assert await queue.cancel_many(queue="slow", limit=2) == 2
        # The two newest: the one waiting for a worker, and the second to start.
        assert [(await queue.get(job.id)).state for job in running] == [JobState.RUNNING] + [JobState.CANCELLED] * 2
        # The parent's cancel cancels its waiting child: counted once, as the parent.
        assert await queue.cancel_many(state="scheduled") == 1
        assert (await queue.get(child.id)).state is JobState.CANCELLED
        assert await queue.cancel_many() == 1  # the last sleeper; nothing else is unfinished
        assert (await queue.get(finished.id)).state is JobState.SUCCEEDED
        stats = await queue.stats()
        assert stats["jobs"]["cancelled"] == 5 and stats["totals"]["cancelled"] == 4
