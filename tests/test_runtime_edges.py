"""Edges of the runtime a hostile review found: stores that misbehave, odd handler values, races.

Each test failed before its fix (session 7's review); the store here is a MemoryStore behind a
wrapper with knobs, as a remote store could behave.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trioq
from trioq import JobState
from trioq._runtime.completer import FENCE_MARGIN
from trioq._runtime.queue import _LEASE
from trioq.stores import ClaimRequest, MemoryStore, Outcome, StoreConfig


class _Wrapped:
    """A MemoryStore behind knobs: slow claims, claims of more (or the same job twice), failing calls."""

    def __init__(
        self,
        *,
        batch: bool = False,
        claim_sleep: float = 0.0,
        extra_claims: int = 0,
        twice: bool = False,
        complete_fails: bool = False,
        extend_fails_at: float = math.inf,
        extend_hangs: tuple[float, float] = (math.inf, math.inf),
        extend_sleep: float = 0.0,
        down: tuple[float, float] = (math.inf, math.inf),
        deaf_to_ready: bool = False,
    ) -> None:
        self.inner = MemoryStore()
        self.batch_outcomes = batch
        self.claim_sleep = claim_sleep
        self.extra_claims = extra_claims
        self.twice = twice
        self.complete_fails = complete_fails
        self.extend_fails_at = extend_fails_at
        self.extend_hangs = extend_hangs  # a renewal sent in [from, until) comes back at until (an outage)
        self.extend_sleep = extend_sleep  # every renewal takes this long
        self.down = down  # a claim, completion or renewal sent in [from, until) is answered at until
        self.deaf_to_ready = deaf_to_ready
        self.renewed: dict[str, list[float]] = {}
        self.running_at_exit: int | None = None

    @asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        if self.deaf_to_ready:
            config = attrs.evolve(config, on_ready=lambda n: None)
        async with self.inner.session(config):
            try:
                yield
            finally:
                # What the runtime left running, before MemoryStore's own session end
                # (one node: it releases everything) would hide it.
                self.running_at_exit = (await self.inner.counts())["running"]

    async def _unless_down(self) -> None:
        down, up = self.down
        if down <= trio.current_time() < up:
            await trio.sleep_until(up)

    async def claim(self, request: ClaimRequest) -> list[trioq.Job]:
        await self._unless_down()
        if self.claim_sleep:
            await trio.sleep(self.claim_sleep)
        if self.extra_claims:
            request = ClaimRequest(request.node, request.limit + self.extra_claims, request.lease)
        jobs = await self.inner.claim(request)
        return jobs + jobs[:1] if self.twice else jobs

    async def complete(self, outcomes: Sequence[Outcome]) -> list[JobState | None]:
        await self._unless_down()
        if self.complete_fails:
            raise ConnectionError("store down (complete)")
        return await self.inner.complete(outcomes)

    async def extend(self, node: str, held: Sequence[tuple[str, int]], lease: float) -> list[bool]:
        if trio.current_time() >= self.extend_fails_at:
            raise ConnectionError("store down (extend)")
        await self._unless_down()
        down, up = self.extend_hangs
        if down <= trio.current_time() < up:
            await trio.sleep_until(up)
        await trio.sleep(self.extend_sleep)
        for job_id, _ in held:
            self.renewed.setdefault(job_id, []).append(trio.current_time())
        return await self.inner.extend(node, held, lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _registry(live: list[int] | None = None) -> trioq.Registry:
    registry = trioq.Registry()
    peak = live if live is not None else [0, 0]

    @registry.task
    async def work(ctx: trioq.JobContext, seconds: float = 3.0) -> None:
        peak[0] += 1
        peak[1] = max(peak[1], peak[0])
        try:
            await trio.sleep(seconds)
        finally:
            peak[0] -= 1

    @registry.task(timeout=1.0, max_attempts=3, backoff=trioq.Backoff(base=0.1, jitter=0.0))
    async def snoozes_on_timeout(ctx: trioq.JobContext) -> None:
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            raise trioq.Snooze(1.0) from None

    @registry.task(max_attempts=2, backoff=trioq.Backoff(base=100.0, jitter=0.0))
    async def bad_snooze(ctx: trioq.JobContext, how: str) -> None:
        raise trioq.Snooze(_BadSeconds() if how == "raises" else -1.0)  # type: ignore[arg-type]

    @registry.task(max_attempts=2, backoff=trioq.Backoff(base=1.0, factor=math.inf, max=math.inf))
    async def fails(ctx: trioq.JobContext) -> None:
        raise RuntimeError("again")

    return registry


class _BadSeconds(float):
    def __ge__(self, other: object) -> bool:
        raise RuntimeError("comparing these seconds fails")


async def test_a_store_error_during_the_shutdown_drain_comes_out(autojump_clock: trio.testing.MockClock) -> None:
    store = _Wrapped(complete_fails=True)
    with pytest.raises(ConnectionError, match="store down"):
        async with trioq.open_queue(_registry(), store=store, workers=2, shutdown_grace=100) as queue:  # type: ignore[arg-type]
            await queue.enqueue("work")
            await trio.sleep(0.1)  # the attempt finishes during the drain; its outcome fails


async def test_a_node_that_cannot_renew_its_lease_stops_its_attempt_before_the_lease_lapses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The store stops answering lease renewals (an outage) while a long job runs: the attempt is stopped
    and its job given back before the lease that the last renewal to come back bought runs out, so no
    other node's rescue can meet it still running; it runs again at once, uncounted. (It ran on until
    the renewal came back: a hostile review saw two holders of a max-1 key on PostgreSQL.)"""
    lease = _LEASE
    store = _Wrapped(extend_hangs=(lease / 2, 3 * lease))  # the renewal sent at 2/3 of the lease hangs
    runs: list[tuple[int, float, float]] = []  # (ctx.attempt, started, ended)
    registry = trioq.Registry()

    @registry.task
    async def long(ctx: trioq.JobContext) -> None:
        started = trio.current_time()
        try:
            if not runs:
                await trio.sleep(10 * lease)
        finally:
            runs.append((ctx.attempt, started, trio.current_time()))

    async with trioq.open_queue(registry, store=store, workers=1) as queue:  # type: ignore[arg-type]
        job = await queue.enqueue("long")
        done = await queue.wait(job.id)
    (attempt, _, stopped), (again, restarted, _) = runs
    renewed = lease / 3  # the last renewal that came back was sent then
    assert lease / 2 < stopped <= renewed + lease * (1 - FENCE_MARGIN) + 0.01
    assert (attempt, again) == (1, 1) and restarted >= stopped  # given back uncounted, then run again
    assert done.state is JobState.SUCCEEDED and done.attempts == 1


def _long_jobs(runs: dict[int, list[tuple[float, float]]], seconds: float, later: float = 0.0) -> trioq.Registry:
    """A registry whose ``long`` task sleeps ``seconds`` on its first run of each ``n`` and ``later``
    on the others, recording each run's (start, end) under its ``n``."""
    registry = trioq.Registry()

    @registry.task
    async def long(ctx: trioq.JobContext, n: int) -> None:
        started = trio.current_time()
        first = n not in runs
        runs.setdefault(n, [])
        try:
            await trio.sleep(seconds if first else later)
        finally:
            runs[n].append((started, trio.current_time()))

    return registry


async def test_a_store_slow_to_renew_does_not_set_the_fence_off(autojump_clock: trio.testing.MockClock) -> None:
    """Renewals that take 40% of the lease each: the lease never lapses, so a job longer than several
    leases runs once, to its end. (With the next renewal sent a third of the lease after the last one
    came back, a latency over 28% of the lease set the fence off every cycle, and the job, released
    uncounted each time, ran for ever: found by a review of the fence.)"""
    runs: dict[int, list[tuple[float, float]]] = {}
    store = _Wrapped(batch=True, extend_sleep=0.4 * _LEASE)
    async with trioq.open_queue(_long_jobs(runs, 5 * _LEASE), store=store, workers=1) as queue:  # type: ignore[arg-type]
        done = await queue.wait((await queue.enqueue("long", {"n": 0})).id)
    assert done.state is JobState.SUCCEEDED and len(runs[0]) == 1


async def test_after_an_outage_the_fence_fires_once_and_every_attempt_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The store answers nothing for a while (claims, completions, renewals), inline and batched: every
    running attempt stops at the fence, together, and once the store is back the jobs run again and are
    not stopped a second time. (Inline, each give-back waited for the store before the next attempt was
    stopped; and the renewal that came back after the outage, sent before it, set the fence off again
    on the attempts just claimed: found by a review of the fence.)"""
    for batch in (False, True):
        runs: dict[int, list[tuple[float, float]]] = {}
        t0 = trio.current_time()
        store = _Wrapped(batch=batch, down=(t0 + _LEASE / 2, t0 + 3 * _LEASE))
        registry = _long_jobs(runs, 10 * _LEASE, _LEASE / 2)
        async with trioq.open_queue(registry, store=store, workers=3) as queue:  # type: ignore[arg-type]
            jobs = [await queue.enqueue("long", {"n": n}) for n in range(3)]
            finals = [await queue.wait(job.id) for job in jobs]
        fence = t0 + _LEASE / 3 + _LEASE * (1 - FENCE_MARGIN)  # the last renewal back was sent at a third
        assert [len(runs[n]) for n in range(3)] == [2, 2, 2], (batch, runs)
        assert {round(runs[n][0][1], 6) for n in range(3)} == {round(fence, 6)}, (batch, runs)
        assert all(runs[n][1][0] >= t0 + 3 * _LEASE for n in range(3)), (batch, runs)  # again once it was back
        assert [(job.state, job.attempts) for job in finals] == [(JobState.SUCCEEDED, 1)] * 3, batch


async def test_a_lease_renewal_failing_during_the_drain_comes_out(autojump_clock: trio.testing.MockClock) -> None:
    store = _Wrapped(extend_fails_at=5.0)
    with pytest.raises(ConnectionError, match="store down"):
        async with trioq.open_queue(_registry(), store=store, workers=1, shutdown_grace=100) as queue:  # type: ignore[arg-type]
            await queue.enqueue("work", {"seconds": 60.0})
            await trio.sleep(1)


async def test_a_store_that_gives_more_than_asked_strands_nothing(autojump_clock: trio.testing.MockClock) -> None:
    store = _Wrapped(extra_claims=2)
    async with trioq.open_queue(_registry(), store=store, workers=1) as queue:  # type: ignore[arg-type]
        await trio.sleep(0.5)
        await queue.enqueue_many([trioq.JobSpec("work", {"seconds": 0.1}) for _ in range(3)])
        with trio.fail_after(30):
            await queue.join()
        assert (await queue.stats())["jobs"]["succeeded"] == 3


@pytest.mark.parametrize("batch", [False, True])
async def test_shutdown_releases_the_claims_no_worker_took(batch: bool, autojump_clock: trio.testing.MockClock) -> None:
    """DESIGN.md invariant 6 for a shared store: jobs the producer holds for workers (a claim gave
    more than one worker asked for) are released by the runtime itself as it leaves, not left to the
    store's session end, which on a shared store releases nothing of another node's."""
    store = _Wrapped(extra_claims=2, batch=batch)
    async with trioq.open_queue(_registry(), store=store, workers=1, shutdown_grace=0) as queue:  # type: ignore[arg-type]
        await trio.sleep(0.5)
        await queue.enqueue_many([trioq.JobSpec("work", {"seconds": 60.0}) for _ in range(3)])
        await trio.sleep(1)
        assert (await queue.stats())["jobs"]["running"] == 3  # one attempt, two waiting in the producer
    assert store.running_at_exit == 0


async def test_the_same_claim_twice_runs_once(autojump_clock: trio.testing.MockClock) -> None:
    live = [0, 0]
    store = _Wrapped(twice=True)
    async with trioq.open_queue(_registry(live), store=store, workers=4) as queue:  # type: ignore[arg-type]
        await trio.sleep(0.5)
        job = await queue.enqueue("work")
        assert (await queue.wait(job.id, timeout=30)).state is JobState.SUCCEEDED
    assert live[1] == 1


async def test_workers_parked_behind_a_slow_claim_are_not_left_parked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    live = [0, 0]
    store = _Wrapped(claim_sleep=0.05)
    async with trioq.open_queue(_registry(live), store=store, workers=3, poll_interval=math.inf) as queue:  # type: ignore[arg-type]
        await queue.enqueue_many([trioq.JobSpec("work") for _ in range(6)])
        await trio.sleep(0.5)
        assert (await queue.stats())["workers"]["busy"] == 3
        await queue.join()
    assert live[1] == 3


async def test_a_claim_waiting_for_a_cpu_keeps_its_lease_and_a_cancel_stops_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A process job whose worker waits for a CPU holds its claim: the lease is renewed, and a cancel
    meanwhile means its attempt never starts."""
    from .handlers import square

    registry = trioq.Registry()
    registry.add(square, kind="process")
    store = _Wrapped()
    async with trioq.open_queue(registry, store=store, workers=1) as queue:  # type: ignore[arg-type]
        cpus = queue._pool.pools[0].executor.processes.cpus
        holders = [object() for _ in range(int(cpus.total_tokens))]
        for holder in holders:  # every CPU taken: the claimed job waits
            await cpus.acquire_on_behalf_of(holder)
        job = await queue.enqueue("square", {"n": 3})
        await trio.sleep(35)
        assert len(store.renewed.get(job.id, [])) >= 3  # every 10 s of the 30 s lease
        await queue.cancel(job.id)
        for holder in holders:
            cpus.release_on_behalf_of(holder)
        await trio.sleep(1)
        stats = await queue.stats()
    assert stats["workers"]["busy"] == 0 and stats["totals"]["succeeded"] == 0
    assert not queue._pool.pools[0].executor.cancelled_claims


async def test_a_snooze_raised_as_a_timeout_cancels_it_is_still_a_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.wait((await queue.enqueue("snoozes_on_timeout")).id, timeout=60)
    assert job.state is JobState.DEAD and job.attempts == 3
    assert job.error is not None and job.error.startswith("AttemptTimeout")


@pytest.mark.parametrize("how", ["raises", "negative"])
async def test_a_snooze_whose_seconds_misbehave_fails_the_attempt_with_the_tasks_backoff(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.enqueue("bad_snooze", {"how": how})
        await trio.sleep(1)
        job = await queue.get(job.id)
    assert job.state is JobState.SCHEDULED and job.attempts == 1
    assert job.error is not None and job.error.startswith("InvalidJob: trioq.Snooze")
    assert job.run_at - job.created_at >= 99.0  # the task's backoff, not the default 0.5 s


async def test_an_infinite_backoff_schedules_far_away_instead_of_crashing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.enqueue("fails")
        await trio.sleep(1)
        job = await queue.get(job.id)
    assert job.state is JobState.SCHEDULED and job.attempts == 1
    assert math.isfinite(job.run_at) and job.run_at - job.created_at <= trioq._model.MAX_DELAY


async def test_a_logging_filter_that_raises_does_not_stop_the_queue(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    class Broken(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            raise RuntimeError("filter broke")

    logger = logging.getLogger("trioq")
    broken = Broken()
    logger.addFilter(broken)
    try:
        async with trioq.open_queue(_registry(), workers=1) as queue:
            job = await queue.wait((await queue.enqueue("fails")).id, timeout=60)
    finally:
        logger.removeFilter(broken)
    assert job.attempts >= 1
    assert "a logging handler or filter raised" in capsys.readouterr().err


def test_no_retry_refuses_types_that_never_match() -> None:
    registry = trioq.Registry()

    async def handler(ctx: trioq.JobContext) -> None: ...

    for bad in (ExceptionGroup, trio.Cancelled):
        with pytest.raises(TypeError, match="no_retry cannot hold"):
            registry.add(handler, name=f"h{bad.__name__}", no_retry=bad)
    assert registry.add(handler, name="fine", no_retry=(trioq.NoRetry, KeyboardInterrupt)).no_retry
