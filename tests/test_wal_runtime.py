"""The queue on a WALStore: what a caller is told is already on disk."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

import trioq
from trioq import JobState
from trioq.stores.table.jobs import JobTable
from trioq.stores.wal import _writer
from trioq.stores.wal._recovery import replay


def _crash_copy(directory: Path, into: Path) -> JobTable:
    """What a restart would find if the process died now: replay a copy of the log."""
    shutil.copytree(directory, into)
    table = JobTable(max_retained=sys.maxsize)
    replay(str(into), table)
    return table


def _slow_disk(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make every group commit take ``seconds`` longer, synced in a thread (the loop runs on)."""
    real_write_and_sync = _writer.LogWriter._write_and_sync

    def slow_write_and_sync(self: _writer.LogWriter, data: bytes) -> float:
        time.sleep(seconds)
        return seconds + real_write_and_sync(self, data)

    monkeypatch.setattr(_writer.LogWriter, "_write_and_sync", slow_write_and_sync)
    # An inline sync would make every commit durable before anything else ran.
    monkeypatch.setattr(_writer, "INLINE_SYNC_MAX", -1.0)


@pytest.mark.slow  # a real clock: the slow disk sleeps in a thread
async def test_wait_and_join_return_only_after_successes_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_disk(monkeypatch, 0.02)
    registry = trioq.Registry()

    @registry.task
    async def quick(ctx: trioq.JobContext, n: int) -> int:
        # Yield once, so the success comes after the commit of the job's ADD
        # has begun (an instant handler's success joins that same commit).
        await trio.sleep(0.001)
        return n

    wal = tmp_path / "wal"
    with trio.fail_after(20):
        async with trioq.open_queue(registry, store=trioq.WALStore(wal, fsync="always"), workers=4) as queue:
            job = await queue.enqueue("quick", {"n": 1})
            done = await queue.wait(job.id)
            assert done.state is JobState.SUCCEEDED
            seen = _crash_copy(wal, tmp_path / "after-wait")
            assert seen.get(job.id).state is JobState.SUCCEEDED and seen.get(job.id).result == 1
            # wait() and get() called once the table already shows the success,
            # while its record is still on the way to the disk (or waiting for a
            # commit), return it only after it lands.
            raced = 0
            for attempt in range(10):
                late = await queue.enqueue("quick", {"n": 2})
                while (await queue.store.get(late.id)).state is not JobState.SUCCEEDED:
                    await trio.lowlevel.checkpoint()
                raced += queue.store.unsynced()
                reader = queue.wait if attempt % 2 else queue.get
                assert (await reader(late.id)).state is JobState.SUCCEEDED
                seen = _crash_copy(wal, tmp_path / f"after-late-{reader.__name__}-{attempt}")
                assert seen.get(late.id).state is JobState.SUCCEEDED, reader.__name__
            assert raced >= 2, "the success was durable before wait()/get() was called: nothing tested"
            jobs = await queue.enqueue_many([trioq.JobSpec("quick", {"n": n}) for n in range(50)])
            await queue.join()
            seen = _crash_copy(wal, tmp_path / "after-join")
            assert all(seen.get(j.id).state is JobState.SUCCEEDED for j in jobs)


@pytest.mark.slow  # a real clock: the slow disk sleeps in a thread
async def test_an_idle_worker_starts_a_job_while_its_add_is_being_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # enqueue() returns once the job is durable, but a worker need not wait
    # for that: the job may run during the sync (and its success record joins
    # a later commit). A restart after enqueue returned still finds the job.
    _slow_disk(monkeypatch, 0.05)
    registry = trioq.Registry()
    started = trio.Event()

    @registry.task
    async def probe(ctx: trioq.JobContext) -> None:
        started.set()

    wal = tmp_path / "wal"
    with trio.fail_after(20):
        async with trioq.open_queue(registry, store=trioq.WALStore(wal, fsync="always"), workers=2) as queue:
            await trio.sleep(0.1)  # idle workers, parked
            enqueued = trio.Event()

            async def enqueue() -> None:
                job = await queue.enqueue("probe")
                assert _crash_copy(wal, tmp_path / "at-ack").get(job.id).state in {
                    JobState.READY,
                    JobState.RUNNING,
                    JobState.SUCCEEDED,
                }
                enqueued.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(enqueue)
                await started.wait()
                assert not enqueued.is_set(), "the job started only after enqueue() returned"
            await queue.join()


@pytest.mark.parametrize("fsync", ["always", "never"])
async def test_an_outer_cancel_leaves_the_queue_and_releases_running_jobs(
    tmp_path: Path, fsync: str, autojump_clock: trio.testing.MockClock
) -> None:
    # The WAL writer shields itself: cancelled from outside, the queue still
    # commits the release of its running job, instead of the worker waiting
    # forever on a writer that is gone.
    registry = trioq.Registry()

    @registry.task(timeout=60)
    async def slow(ctx: trioq.JobContext) -> None:
        await trio.sleep(10)

    with trio.move_on_after(1) as scope:
        async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path, fsync=fsync)) as queue:
            job = await queue.enqueue("slow")
            await trio.sleep(5)
    assert scope.cancelled_caught
    async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path), workers=0) as queue:
        found = await queue.get(job.id)
    assert (found.state, found.attempts) == ("ready", 0)


@pytest.mark.slow  # a real clock: the slow disk sleeps in a thread
async def test_a_cancel_during_the_durability_wait_still_wakes_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job is in the table before its record reaches the disk; a caller
    # cancelled in that wait must not leave it unannounced (join() hung).
    _slow_disk(monkeypatch, 0.05)
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None:
        pass

    with trio.fail_after(10):
        async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path / "wal", fsync="always")) as queue:
            await queue.enqueue("noop")  # the writer settles on thread syncs
            with trio.move_on_after(0.01) as scope:
                await queue.enqueue("noop")
                await trio.lowlevel.checkpoint()  # where the cancel is delivered
            assert scope.cancelled_caught
            await queue.join()
            stats = await queue.stats()
    assert stats["totals"]["enqueued"] == 2 and stats["jobs"]["succeeded"] == 2


async def test_wait_with_timeout_zero_returns_a_durable_job_while_others_are_in_flight(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # sync() waits for every pending record; bounding it by the timeout made
    # wait(timeout=0) on a long-durable job fail whenever another job's
    # outcome was still waiting for its (lazy) commit.
    registry = trioq.Registry()

    @registry.task
    async def quick(ctx: trioq.JobContext) -> None:
        await trio.sleep(0.001)  # succeeds after its ADD's commit: the success waits for the next

    async with trioq.open_queue(registry, store=trioq.WALStore(tmp_path / "wal", fsync="always")) as queue:
        first = await queue.enqueue("quick")
        await queue.join()  # first is succeeded and durable
        second = await queue.enqueue("quick")
        await trio.sleep(0.01)  # virtual: it ran, well inside the 50 ms a lazy record may wait
        assert (await queue.store.get(second.id)).state is JobState.SUCCEEDED
        assert queue.store._writer is not None and queue.store._writer.busy  # second's success: not yet committed
        done = await queue.wait(first.id, timeout=0)
        assert done.state is JobState.SUCCEEDED
