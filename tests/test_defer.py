"""Admission through the runtime: open_queue(max_ready=N, overflow="defer")."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import trioq


def registry_with_gate() -> tuple[trioq.Registry, trio.Event, list[int]]:
    registry = trioq.Registry()
    gate = trio.Event()
    ran: list[int] = []

    @registry.task()
    async def slow(ctx: trioq.JobContext, n: int) -> None:
        await gate.wait()
        ran.append(n)

    return registry, gate, ran


async def test_enqueues_past_max_ready_are_kept_and_run_in_order(autojump_clock: object, tmp_path: Path) -> None:
    registry, gate, ran = registry_with_gate()
    store = trioq.WALStore(tmp_path / "wal")
    async with trioq.open_queue(registry, store=store, workers=1, max_ready=2, overflow="defer") as queue:
        jobs = [await queue.enqueue("slow", {"n": n}) for n in range(6)]
        await trio.sleep(0.1)  # the worker holds job 0; 1 and 2 are ready, 3..5 deferred
        states = [(await queue.get(job.id)).state for job in jobs]
        assert states == ["running", "ready", "ready", "deferred", "deferred", "deferred"]
        assert (await queue.stats())["jobs"]["deferred"] == 3
        explained = await queue.explain(jobs[4].id)
        assert [reason["kind"] for reason in explained["reasons"]] == ["deferred"]
        gate.set()
        await queue.join()  # waits for the deferred jobs too
        assert ran == list(range(6))
        assert (await queue.stats())["jobs"]["succeeded"] == 6


async def test_a_deadline_cancels_a_job_still_deferred(autojump_clock: object) -> None:
    registry, gate, ran = registry_with_gate()
    async with trioq.open_queue(registry, workers=1, max_ready=1, overflow="defer") as queue:
        await queue.enqueue("slow", {"n": 0})
        await queue.enqueue("slow", {"n": 1})
        late = await queue.enqueue("slow", {"n": 2}, deadline=5.0)
        assert late.state == "deferred"
        done = await queue.wait(late.id, timeout=10.0)
        assert done.state == "cancelled" and done.error is not None and "DeadlineExpired" in done.error
        gate.set()
        await queue.join()
    assert ran == [0, 1]


async def test_refuse_stays_the_default() -> None:
    registry, _, _ = registry_with_gate()
    async with trioq.open_queue(registry, workers=0, max_ready=1) as queue:
        await queue.enqueue("slow", {"n": 0})
        with pytest.raises(trioq.QueueFull):
            await queue.enqueue("slow", {"n": 1})


@pytest.mark.parametrize(
    ("options", "match"),
    [({"overflow": "defer"}, "needs a max_ready"), ({"overflow": "drop", "max_ready": 3}, "overflow must be")],
)
async def test_bad_overflow_is_refused(options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        async with trioq.open_queue(trioq.Registry(), **options):  # type: ignore[arg-type]
            pass  # pragma: no cover
