"""The runtime's seam to a shared store: hints are only hints (the poll fallback), batched claims
and completions, and outcomes made by another node reaching ``wait()`` and ``join()``."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

import trioq
from trioq import JobState
from trioq._runtime.producer import Producer
from trioq.stores import ClaimRequest, MemoryStore, NewJob, Outcome, StoreConfig, Succeeded


class _DeafStore(MemoryStore):
    """A MemoryStore whose hints never reach the runtime, as if every notification were lost."""

    def __init__(self, *, deaf_to: Sequence[str] = ("on_ready", "on_cancel", "on_finished", "on_scheduled")) -> None:
        super().__init__()
        self.deaf_to = deaf_to

    @asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        ignore = {
            "on_ready": lambda n: None,
            "on_cancel": lambda job_id, epoch: None,
            "on_finished": lambda job: None,
            "on_scheduled": lambda run_at: None,
        }
        deaf = attrs.evolve(config, **{name: ignore[name] for name in self.deaf_to})
        async with super().session(deaf):
            yield


class _RemoteStore(MemoryStore):
    """A MemoryStore that behaves like a store across a network: every call is a round trip."""

    batch_outcomes = True

    def __init__(self) -> None:
        super().__init__()
        self.claim_limits: list[int] = []
        self.batch_sizes: list[int] = []

    async def claim(self, request: ClaimRequest) -> list[trioq.Job]:
        self.claim_limits.append(request.limit)
        await trio.sleep(0.001)
        return await super().claim(request)

    async def complete(self, outcomes: Sequence[Outcome]) -> list[JobState | None]:
        self.batch_sizes.append(len(outcomes))
        await trio.sleep(0.001)
        return await super().complete(outcomes)


def _registry(started: list[float] | None = None, stopped: trio.Event | None = None) -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> str:
        if started is not None:
            started.append(trio.current_time())
        return "done"

    @registry.task
    async def long(ctx: trioq.JobContext) -> None:
        try:
            await trio.sleep(100)
        finally:
            if stopped is not None:
                stopped.set()

    return registry


async def test_a_lost_ready_hint_delays_a_job_by_at_most_the_poll_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[float] = []
    async with trioq.open_queue(_registry(started), store=_DeafStore(), workers=4, poll_interval=2.0) as queue:
        await trio.sleep(0.5)  # every worker parked
        enqueued = trio.current_time()
        jobs = await queue.enqueue_many([trioq.JobSpec("noop") for _ in range(10)])
        done = [await queue.wait(job.id) for job in jobs]
    assert all(job.state is JobState.SUCCEEDED for job in done)
    assert len(started) == 10 and 0 < started[0] - enqueued <= 2.0


async def test_without_the_poll_a_lost_hint_strands_the_job(autojump_clock: trio.testing.MockClock) -> None:
    """The counter-check of the test above: the poll, not some other wake-up, runs the job."""
    started: list[float] = []
    async with trioq.open_queue(_registry(started), store=_DeafStore(), workers=4, poll_interval=math.inf) as queue:
        await trio.sleep(0.5)
        await queue.enqueue("noop")
        await trio.sleep(60)
    assert started == []


async def test_a_lost_scheduled_hint_is_caught_by_the_timers_poll(autojump_clock: trio.testing.MockClock) -> None:
    started: list[float] = []
    async with trioq.open_queue(_registry(started), store=_DeafStore(), workers=2, poll_interval=1.0) as queue:
        enqueued = trio.current_time()
        job = await queue.enqueue("noop", delay=5.0)
        assert (await queue.wait(job.id)).state is JobState.SUCCEEDED
    assert 5.0 <= started[0] - enqueued <= 7.0


async def test_a_lost_cancel_hint_is_caught_by_the_lease_renewal(autojump_clock: trio.testing.MockClock) -> None:
    store = _DeafStore(deaf_to=("on_cancel",))
    stopped = trio.Event()
    async with trioq.open_queue(_registry(stopped=stopped), store=store, workers=1) as queue:
        job = await queue.enqueue("long")
        await trio.sleep(1)
        cancelled_at = trio.current_time()
        await queue.cancel(job.id)
        with trio.fail_after(60):
            await stopped.wait()
        stopped_after = trio.current_time() - cancelled_at
    assert stopped_after <= 10.5  # a third of the 30 s lease, not the handler's 100 s
    assert (await store_job(store, job.id)).state is JobState.CANCELLED


async def store_job(store: MemoryStore, job_id: str) -> trioq.Job:
    async with store.session(StoreConfig(clock=lambda: 0.0)):
        return await store.get(job_id)


async def test_wait_and_join_hear_of_an_outcome_no_hint_told_of(autojump_clock: trio.testing.MockClock) -> None:
    """An outcome recorded by another node: here the test completes the claim itself, behind the runtime."""
    store = _DeafStore(deaf_to=("on_finished",))
    async with trioq.open_queue(_registry(), store=store, workers=0, poll_interval=1.5) as queue:
        job = await queue.enqueue("noop")

        async def other_node() -> None:
            await trio.sleep(3)
            (claimed,) = await store.claim(ClaimRequest("other-node", 1))
            assert await store.complete([Succeeded(claimed.id, claimed.epoch, "elsewhere")]) == [JobState.SUCCEEDED]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_node)
            start = trio.current_time()
            done = await queue.wait(job.id)
            waited = trio.current_time() - start
            await queue.join()
    assert done.result == "elsewhere" and 3.0 <= waited <= 4.5


async def test_batched_claims_ask_for_every_free_slot_and_outcomes_go_in_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = _RemoteStore()
    async with trioq.open_queue(_registry(), store=store, workers=8) as queue:
        await trio.sleep(1)  # all 8 idle
        jobs = await queue.enqueue_many([trioq.JobSpec("noop") for _ in range(200)])
        await queue.join()
        stats = await queue.stats()
    assert stats["totals"]["succeeded"] == 200 and stats["jobs"]["succeeded"] == 200
    assert max(store.claim_limits) > 1  # a worker claimed for the others waiting behind it
    assert max(store.batch_sizes) > 1 and sum(store.batch_sizes) == 200
    assert len(jobs) == 200


@pytest.mark.parametrize("interval", [0, -1.0, math.nan, True, "1"])
async def test_poll_interval_must_be_a_positive_number(interval: object) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        async with trioq.open_queue(_registry(), poll_interval=interval):  # type: ignore[arg-type]
            pass


class _SlowReplyStore(MemoryStore):
    """A MemoryStore whose claims take 0.5 s to come back after they are made, as over a slow network;
    it keeps its config, so a test can deliver a cancel hint as another node's would arrive."""

    batch_outcomes = True

    def __init__(self) -> None:
        super().__init__()
        self.claimed = trio.Event()
        self.config: StoreConfig | None = None

    @asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        self.config = config
        async with super().session(attrs.evolve(config, on_cancel=lambda job_id, epoch: None)):
            yield

    async def claim(self, request: ClaimRequest) -> list[trioq.Job]:
        jobs = await super().claim(request)
        if jobs:
            self.claimed.set()
            await trio.sleep(0.5)
        return jobs


async def test_a_cancel_heard_while_the_claim_is_in_flight_stops_the_job_before_it_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Another node cancels a job our claim took before the claim's reply arrives: it never runs."""
    registry = trioq.Registry()
    started: list[str] = []

    @registry.task
    async def slow(ctx: trioq.JobContext) -> None:
        started.append(ctx.job.id)
        await trio.sleep(100)

    store = _SlowReplyStore()
    async with trioq.open_queue(registry, store=store, workers=1) as queue:
        job = await queue.enqueue("slow")
        await store.claimed.wait()
        running = await store.get(job.id)
        await store.cancel(job.id)  # the hint below is what another node's cancel sends
        assert store.config is not None
        store.config.on_cancel(job.id, running.epoch)
        await trio.sleep(1.0)
        assert started == []
        assert (await queue.get(job.id)).state is JobState.CANCELLED


def _new() -> NewJob:
    return NewJob("noop", {}, 0, None, 3, 0.0, "default", None, None, (), ())


async def _take_into(producer: Producer, got: list[trioq.Job | None]) -> None:
    """A worker: the producer's next job (or ``None``), noted in ``got``."""
    got.append(await producer.take())


async def test_jobs_handed_to_the_producer_go_to_its_parked_workers() -> None:
    """``takers()`` is the workers parked for want of a job; jobs a store claimed for the node on its own
    (``hand_over``) go to them as a claim's would; once stopping it offers none."""
    store = MemoryStore()
    async with store.session(StoreConfig(clock=lambda: 0.0, node="n")):
        producer = Producer(store, node="n", lease=30.0, poll_interval=math.inf)
        got: list[trioq.Job | None] = []

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_take_into, producer, got)
            await trio.testing.wait_all_tasks_blocked()
            assert producer.takers() == 3
            jobs = [attrs.evolve(job, state=JobState.RUNNING) for job in await store.add([_new(), _new()])]
            producer.hand_over(jobs)
            assert producer.takers() == 1  # two are spoken for
            await trio.testing.wait_all_tasks_blocked()
            assert got == jobs and producer.takers() == 1
            producer.stop()
        assert got == [*jobs, None] and producer.takers() == 0


async def test_a_claim_cancelled_before_it_is_handed_over_never_reaches_a_worker() -> None:
    """Another node may cancel a job that this node's add (or success) claimed before that statement's
    answer is back: the cancel finds nothing here, and the job handed over after it is left out."""
    store = MemoryStore()
    async with store.session(StoreConfig(clock=lambda: 0.0, node="n")):
        producer = Producer(store, node="n", lease=30.0, poll_interval=math.inf)
        got: list[trioq.Job | None] = []

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_take_into, producer, got)
            await trio.testing.wait_all_tasks_blocked()
            first, second = [
                attrs.evolve(job, state=JobState.RUNNING, epoch=1) for job in await store.add([_new(), _new()])
            ]
            assert producer.drop(first.id, 1) is False  # nothing here yet: kept for a hand-over
            assert producer.drop(second.id, 7) is False  # (another epoch of the second: not its claim)
            producer.hand_over([first, second])
            await trio.testing.wait_all_tasks_blocked()
            assert got == [second]
            producer.stop()


class _GatedStore(MemoryStore):
    """A MemoryStore whose claims each wait for the test to open their gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[trio.Event] = []
        self.limits: list[int] = []

    async def claim(self, request: ClaimRequest) -> list[trioq.Job]:
        self.limits.append(request.limit)
        gate = trio.Event()
        self.gates.append(gate)
        await gate.wait()
        return await super().claim(request)


async def test_takers_leave_out_the_workers_a_claim_in_flight_is_for() -> None:
    """A store that claims for the node on its own (``takers()``) must not claim for the parked workers
    a claim in flight already asks for; those that park after it was sent are counted."""
    store = _GatedStore()
    async with store.session(StoreConfig(clock=lambda: 0.0, node="n")):
        producer = Producer(store, node="n", lease=30.0, poll_interval=math.inf)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(producer.take)
            await trio.testing.wait_all_tasks_blocked()
            assert store.limits == [1] and producer.takers() == 2  # the claim in flight is its caller's own
            store.gates[0].set()  # none ready: all three park
            await trio.testing.wait_all_tasks_blocked()
            assert producer.takers() == 3
            producer.wake(1)  # one looks again, claiming for itself and the two parked
            await trio.testing.wait_all_tasks_blocked()
            assert store.limits == [1, 3] and producer.takers() == 0
            store.gates[1].set()
            await trio.testing.wait_all_tasks_blocked()
            assert producer.takers() == 3
            producer.stop()
