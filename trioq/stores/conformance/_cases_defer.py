"""Cases for admission: jobs added past ``StoreConfig.defer_past`` are deferred, then admitted in order."""

from __future__ import annotations

from ..._model import DEADLINE_ERROR_PREFIX, JobState
from .._base import Failed, Store
from ._fixtures import CaseBase, zero_counts
from ._harness import START, Harness, claim_one, complete_one

__all__ = ["DeferCases"]


async def _states(store: Store, *ids: str) -> list[JobState]:
    return [(await store.get(job_id)).state for job_id in ids]


class DeferCases(CaseBase):
    """Past ``defer_past`` ready and scheduled jobs a new job is kept ``deferred``: stored, keyed,
    counted, cancellable, its deadline running, never claimed; admitted oldest first as room frees."""

    async def test_jobs_past_the_bound_are_deferred_then_admitted_oldest_first(self, harness: Harness) -> None:
        """Admission goes by enqueue order, not priority; an admitted job then runs by priority."""
        async with harness.session(harness.make(), defer_past=2) as store:
            a, b, c, d = await store.add([harness.job(), harness.job(), harness.job(), harness.job(priority=9)])
            assert [job.state for job in (a, b, c, d)] == [JobState.READY] * 2 + [JobState.DEFERRED] * 2
            assert await store.get(c.id) == c
            assert await store.counts() == zero_counts(ready=2, deferred=2)
            assert (await claim_one(store)).id == a.id  # room for one: c, the oldest, not d
            assert await _states(store, c.id, d.id) == [JobState.READY, JobState.DEFERRED]
            assert await store.counts() == zero_counts(ready=2, running=1, deferred=1)
            assert (await claim_one(store)).id == b.id
            # d (priority 9) is admitted now and, ready beside c, goes first.
            assert [(await claim_one(store)).id for _ in range(2)] == [d.id, c.id]
            assert await store.counts() == zero_counts(running=4)
            assert await store.claim(harness.request(5)) == []

    async def test_a_batch_fills_the_bound_and_defers_the_rest(self, harness: Harness) -> None:
        """The batch's earlier jobs count; once one job is deferred, every later one is too."""
        async with harness.session(harness.make(), defer_past=3) as store:
            (first,) = await store.add([harness.job()])
            jobs = await store.add([harness.job(delay=60.0), harness.job(), harness.job(), harness.job(delay=5.0)])
            assert [job.state for job in jobs] == [
                JobState.SCHEDULED,
                JobState.READY,
                JobState.DEFERRED,
                JobState.DEFERRED,
            ]
            assert first.state is JobState.READY
            claimed = await store.claim(harness.request(5))
            assert {job.id for job in claimed} >= {first.id, jobs[1].id}
            assert jobs[0].id not in {job.id for job in claimed}  # scheduled an hour out

    async def test_an_admitted_job_keeps_its_delay(self, harness: Harness) -> None:
        """A deferred job whose ``run_at`` is still ahead is admitted ``scheduled``, due then."""
        async with harness.session(harness.make(), defer_past=1) as store:
            first, later = await store.add([harness.job(), harness.job(delay=10.0)])
            assert later.state is JobState.DEFERRED
            assert (await claim_one(store)).id == first.id
            admitted = await store.get(later.id)
            assert (admitted.state, admitted.run_at) == (JobState.SCHEDULED, START + 10.0)
            assert await store.promote() == START + 10.0
            harness.clock.advance(10.0)
            await store.promote()
            assert (await claim_one(store)).id == later.id

    async def test_a_cancel_makes_room_and_a_deferred_job_can_be_cancelled(self, harness: Harness) -> None:
        async with harness.session(harness.make(), defer_past=1) as store:
            a, b, c = await store.add([harness.job(), harness.job(), harness.job()])
            changed = await store.cancel(b.id)
            assert changed is not None
            assert await _states(store, a.id, b.id, c.id) == [JobState.READY, JobState.CANCELLED, JobState.DEFERRED]
            await store.cancel(a.id)  # a ready job leaves: c comes in
            assert await _states(store, c.id) == [JobState.READY]
            assert await store.counts() == zero_counts(ready=1, cancelled=2)

    async def test_a_deferred_job_holds_its_key(self, harness: Harness) -> None:
        async with harness.session(harness.make(), defer_past=1) as store:
            await store.add([harness.job()])
            (keyed,) = await store.add([harness.job(key="k")])
            assert keyed.state is JobState.DEFERRED
            (same,) = await store.add([harness.job(key="k")])
            assert same.id == keyed.id
            assert await store.counts() == zero_counts(ready=1, deferred=1)

    async def test_a_deferred_jobs_deadline_runs_from_its_enqueue(self, harness: Harness) -> None:
        """A job still deferred at its deadline is cancelled, saying so; ``promote`` says when that is."""
        async with harness.session(harness.make(), defer_past=1) as store:
            first, late = await store.add([harness.job(), harness.job(deadline=5.0)])
            assert late.state is JobState.DEFERRED
            assert await store.promote() == START + 5.0
            harness.clock.advance(5.0)
            await store.promote()
            expired = await store.get(late.id)
            assert expired.state is JobState.CANCELLED and expired.attempts == 0
            assert expired.error is not None and expired.error.startswith(DEADLINE_ERROR_PREFIX)
            assert (await claim_one(store)).id == first.id

    async def test_retries_are_never_deferred(self, harness: Harness) -> None:
        """A job coming back from ``running`` goes ready or scheduled, past the bound if it must."""
        async with harness.session(harness.make(), defer_past=1) as store:
            a, b = await store.add([harness.job(), harness.job()])
            running = await claim_one(store)
            assert running.id == a.id and (await store.get(b.id)).state is JobState.READY
            assert await complete_one(store, Failed(a.id, running.epoch, "E: once", 0.0)) in (
                JobState.READY,
                JobState.SCHEDULED,
            )
            assert (await store.counts())["deferred"] == 0

    async def test_a_session_admits_what_its_bound_has_room_for(self, harness: Harness) -> None:
        """Deferred jobs stay deferred across sessions, and a session with a larger bound (or none deferring)
        admits them as it opens, oldest first."""
        first_store = harness.make()
        async with harness.session(first_store, defer_past=1) as store:
            jobs = await store.add([harness.job() for _ in range(4)])
            assert [job.state for job in jobs] == [JobState.READY] + [JobState.DEFERRED] * 3
        async with harness.session(harness.reopen(first_store), defer_past=1) as store:
            assert await store.counts() == zero_counts(ready=1, deferred=3)
        async with harness.session(harness.reopen(first_store), defer_past=3) as store:
            states = await _states(store, *(job.id for job in jobs))
            assert states == [JobState.READY] * 3 + [JobState.DEFERRED]
            assert [(await claim_one(store)).id for _ in range(4)] == [job.id for job in jobs]

    async def test_admission_is_fair_across_tenants_with_fairness_on(self, harness: Harness) -> None:
        """With ``fairness``, the tenant furthest behind its share of admissions goes next; FIFO within one."""
        async with harness.session(harness.make(), defer_past=1, fairness={}) as store:
            (head,) = await store.add([harness.job(tenant="x")])
            xs = await store.add([harness.job(tenant="x") for _ in range(3)])
            (y,) = await store.add([harness.job(tenant="y")])
            order = [(await claim_one(store)).id for _ in range(5)]
            assert order == [head.id, xs[0].id, y.id, xs[1].id, xs[2].id]

    async def test_a_session_without_a_bound_admits_every_deferred_job(self, harness: Harness) -> None:
        """Jobs deferred under one session's bound run under a session that has none (``defer_past=None``):
        it admits them all as it opens, and defers nothing new."""
        first_store = harness.make()
        async with harness.session(first_store, defer_past=1) as store:
            jobs = await store.add([harness.job() for _ in range(3)])
            assert [job.state for job in jobs] == [JobState.READY] + [JobState.DEFERRED] * 2
        async with harness.session(harness.reopen(first_store)) as store:
            assert await store.counts() == zero_counts(ready=3)
            (later,) = await store.add([harness.job()])
            assert later.state is JobState.READY
            assert [(await claim_one(store)).id for _ in range(4)] == [*(job.id for job in jobs), later.id]
