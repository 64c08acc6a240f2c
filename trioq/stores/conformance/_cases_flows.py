"""Cases for flows: jobs that wait for their parents (``NewJob.after``), and what a parent's end does."""

from __future__ import annotations

import pytest

from ..._model import DEADLINE_ERROR_PREFIX, InvalidJob, JobState, QueueFull
from .._base import Failed, Store, Succeeded
from ._fixtures import CaseBase, needs, zero_counts
from ._harness import START, Harness, claim_one, complete_one

__all__ = ["FlowCases"]


async def _states(store: Store, *ids: str) -> list[JobState]:
    return [(await store.get(job_id)).state for job_id in ids]


async def _run(store: Store, job_id: str, result: object = None) -> None:
    """Claim the one ready job, which must be ``job_id``, and succeed it with ``result``."""
    job = await claim_one(store)
    assert job.id == job_id, f"claimed {job.id}, expected {job_id}"
    assert await complete_one(store, Succeeded(job.id, job.epoch, result)) is JobState.SUCCEEDED


async def _kill(store: Store, job_id: str) -> None:
    """Claim the one ready job, which must be ``job_id``, and fail it without retry (dead)."""
    job = await claim_one(store)
    assert job.id == job_id, f"claimed {job.id}, expected {job_id}"
    assert await complete_one(store, Failed(job.id, job.epoch, "Boom: no", None)) is JobState.DEAD


class FlowCases(CaseBase):
    """A job with parents waits (``WAITING``: kept, counted, never claimed) until every parent has
    succeeded; a parent's death or cancel cancels its waiting descendants, and its retry revives them."""

    async def test_a_child_waits_until_its_parent_succeeds(self, store: Store, harness: Harness) -> None:
        """Not claimable while waiting; ready, and hinted, inside the parent's success."""
        (parent,) = await store.add([harness.job("p")])
        (child,) = await store.add([harness.job("c", after=[parent.id])])
        assert child.state is JobState.WAITING
        assert child.after == (parent.id,)
        assert await store.get(child.id) == child
        assert await store.counts() == zero_counts(ready=1, waiting=1)
        claimed = await claim_one(store)
        assert claimed.id == parent.id
        assert await store.claim(harness.request(5)) == []
        harness.hints.clear()
        assert await complete_one(store, Succeeded(parent.id, claimed.epoch, {"paid": 7})) is JobState.SUCCEEDED
        assert await _states(store, child.id) == [JobState.READY]
        assert harness.hinted(ready=[1])
        await _run(store, child.id)
        results = getattr(store, "results", None)
        if results is not None:  # the optional one-trip read behind ctx.parents
            assert await results([parent.id, child.id, "nope"]) == {parent.id: {"paid": 7}, child.id: None}

    async def test_a_batch_names_earlier_jobs_by_index_and_fans_in(self, store: Store, harness: Harness) -> None:
        """An ``int`` in ``after`` is an earlier job of the batch; a child of three waits for all three."""
        jobs = await store.add(
            [harness.job("a"), harness.job("b"), harness.job("c"), harness.job("d", after=[0, 1, 2])]
        )
        a, b, c, d = jobs
        assert d.state is JobState.WAITING
        assert d.after == (a.id, b.id, c.id)
        for parent in (a, b):
            job = await claim_one(store)
            assert job.id == parent.id
            await complete_one(store, Succeeded(job.id, job.epoch, job.task))
            assert await _states(store, d.id) == [JobState.WAITING]
        await _run(store, c.id, "c")
        await _run(store, d.id)

    async def test_a_key_in_the_batch_stands_for_the_job_that_holds_it(self, store: Store, harness: Harness) -> None:
        """An index naming a job an idempotency key resolved to an existing one waits for that job."""
        (held,) = await store.add([harness.job(key="k")])
        first, child = await store.add([harness.job(key="k"), harness.job("c", after=[0])])
        assert first.id == held.id
        assert child.after == (held.id,)
        assert child.state is JobState.WAITING

    async def test_a_child_of_a_succeeded_key_holder_counts_as_pending(self, store: Store, harness: Harness) -> None:
        """An index naming a spec whose key a succeeded job holds: the child is ready, so ``max_pending``
        counts it."""
        (held,) = await store.add([harness.job(key="k")])
        await _run(store, held.id)
        with pytest.raises(QueueFull):
            await store.add([harness.job(key="k"), harness.job(after=[0])], max_pending=0)
        _, child = await store.add([harness.job(key="k"), harness.job(after=[0])], max_pending=1)
        assert child.state is JobState.READY

    async def test_a_parent_that_succeeded_already_is_met(self, store: Store, harness: Harness) -> None:
        (parent,) = await store.add([harness.job()])
        await _run(store, parent.id)
        (child,) = await store.add([harness.job(after=[parent.id])])
        assert child.state is JobState.READY
        assert child.after == (parent.id,)

    async def test_an_unknown_parent_is_invalid_and_adds_nothing(self, store: Store, harness: Harness) -> None:
        with pytest.raises(InvalidJob) as caught:
            await store.add([harness.job(), harness.job(after=["no-such-job"])])
        assert caught.value.field is not None and caught.value.field.endswith("after")
        assert "no-such-job" in str(caught.value)
        assert await store.counts() == zero_counts()

    async def test_an_unknown_parent_is_invalid_even_when_the_key_finds_a_job(
        self, store: Store, harness: Harness
    ) -> None:
        """The parents are checked before the keys: a key that finds a job does not excuse a parent the
        store does not hold (found by the model-based run on PostgreSQL, whose add checked them only for
        the rows it inserted)."""
        (held,) = await store.add([harness.job(key="k1")])
        with pytest.raises(InvalidJob) as caught:
            await store.add([harness.job(key="k1", after=["no-such-job"])])
        assert caught.value.field is not None and caught.value.field.endswith("after")
        assert await store.get(held.id) == held

    async def test_a_childs_delay_counts_from_its_enqueue(self, store: Store, harness: Harness) -> None:
        """Released while its ``run_at`` is ahead, a child is scheduled for then; once it has passed, ready."""
        parent, later, soon = await store.add(
            [harness.job(), harness.job(delay=60.0, after=[0]), harness.job(delay=5.0, after=[0])]
        )
        harness.clock.advance(10.0)
        await _run(store, parent.id)
        assert await _states(store, later.id, soon.id) == [JobState.SCHEDULED, JobState.READY]
        assert (await store.get(later.id)).run_at == START + 60.0
        harness.clock.advance(50.0)
        await store.promote()
        assert await _states(store, later.id) == [JobState.READY]

    async def test_a_dead_parent_cancels_its_waiting_descendants(self, store: Store, harness: Harness) -> None:
        """Each error names the parent whose end cancelled it; a descendant not waiting is left alone."""
        a, b, c, other = await store.add(
            [harness.job("a"), harness.job("b", after=[0]), harness.job("c", after=[1]), harness.job("x")]
        )
        (late,) = await store.add([harness.job("late", after=[a.id])])
        cancelled = await store.cancel(late.id)
        assert cancelled.changed
        await _kill(store, a.id)
        jobs = [await store.get(job_id) for job_id in (b.id, c.id)]
        assert [job.state for job in jobs] == [JobState.CANCELLED, JobState.CANCELLED]
        assert jobs[0].error == f"ParentFailed: parent {a.id} is dead"
        assert jobs[1].error == f"ParentFailed: parent {b.id} is cancelled"
        assert (await store.get(late.id)).error is None  # cancelled by hand before
        assert await _states(store, other.id) == [JobState.READY]
        assert await store.counts() == zero_counts(ready=1, dead=1, cancelled=3)

    async def test_a_cancelled_parent_cancels_its_children(self, store: Store, harness: Harness) -> None:
        parent, child = await store.add([harness.job(delay=60.0), harness.job(after=[0])])
        await store.cancel(parent.id)
        job = await store.get(child.id)
        assert job.state is JobState.CANCELLED
        assert job.error == f"ParentFailed: parent {parent.id} is cancelled"

    async def test_a_child_of_a_dead_parent_is_cancelled_at_once(self, store: Store, harness: Harness) -> None:
        (parent,) = await store.add([harness.job()])
        await _kill(store, parent.id)
        (child,) = await store.add([harness.job(after=[parent.id])])
        assert child.state is JobState.CANCELLED
        assert child.error == f"ParentFailed: parent {parent.id} is dead"
        assert child.finished_at == START

    async def test_retrying_the_parent_makes_its_descendants_wait_again(self, store: Store, harness: Harness) -> None:
        a, b, c = await store.add([harness.job("a"), harness.job("b", after=[0]), harness.job("c", after=[1])])
        await _kill(store, a.id)
        retried = await store.retry(a.id)
        assert retried.state is JobState.READY
        jobs = [await store.get(job_id) for job_id in (b.id, c.id)]
        assert [(job.state, job.error, job.finished_at) for job in jobs] == [(JobState.WAITING, None, None)] * 2
        assert await store.counts() == zero_counts(ready=1, waiting=2)
        await _run(store, a.id)
        await _run(store, b.id)
        await _run(store, c.id)

    async def test_a_retry_drops_the_deadlines_of_the_descendants_it_revives(self, harness: Harness) -> None:
        """A retry drops the retried job's deadline (an operator asked for it to run, however late), and
        those of the descendants it makes wait again: the retried flow runs, after a reopen too.
        (PostgreSQL cancelled them at once; the table stores ran them, until a reopen cancelled them.)"""
        first = harness.make()
        async with harness.session(first) as store:
            a, b, c = await store.add(
                [harness.job("a"), harness.job("b", after=[0], deadline=5.0), harness.job("c", after=[1], deadline=5.0)]
            )
            await _kill(store, a.id)
            harness.clock.advance(10.0)
            await store.promote()
            await store.retry(a.id)
            jobs = [await store.get(job_id) for job_id in (b.id, c.id)]
            assert [(job.state, job.deadline) for job in jobs] == [(JobState.WAITING, None)] * 2
            await store.promote()
            assert await _states(store, b.id, c.id) == [JobState.WAITING] * 2
        async with harness.session(harness.reopen(first)) as store:
            await store.promote()
            assert await _states(store, b.id, c.id) == [JobState.WAITING] * 2
            await _run(store, a.id)
            await _run(store, b.id)
            await _run(store, c.id)

    async def test_retrying_a_child_of_a_dead_parent_is_refused(self, store: Store, harness: Harness) -> None:
        parent, child = await store.add([harness.job(), harness.job(after=[0])])
        await _kill(store, parent.id)
        with pytest.raises(InvalidJob) as caught:
            await store.retry(child.id)
        assert caught.value.field == "after"
        assert parent.id in str(caught.value)
        assert await _states(store, child.id) == [JobState.CANCELLED]

    async def test_a_retried_child_waits_for_parents_not_done(self, store: Store, harness: Harness) -> None:
        parent, child = await store.add([harness.job(), harness.job(after=[0])])
        await store.cancel(child.id)
        assert (await store.retry(child.id)).state is JobState.WAITING
        await _run(store, parent.id)
        assert await _states(store, child.id) == [JobState.READY]

    async def test_a_child_with_two_failed_parents_stays_cancelled(self, store: Store, harness: Harness) -> None:
        """Retrying one of them leaves it cancelled, now because of the other."""
        one, two, child = await store.add([harness.job("1"), harness.job("2"), harness.job("c", after=[0, 1])])
        await _kill(store, one.id)
        await _kill(store, two.id)
        assert (await store.get(child.id)).error == f"ParentFailed: parent {one.id} is dead"
        await store.retry(one.id)
        job = await store.get(child.id)
        assert job.state is JobState.CANCELLED
        assert job.error == f"ParentFailed: parent {two.id} is dead"
        await store.retry(two.id)
        assert await _states(store, child.id) == [JobState.WAITING]

    async def test_waiting_jobs_are_not_pending(self, harness: Harness) -> None:
        """``max_pending`` and ``defer_past`` count ready and scheduled jobs, not waiting ones; a child
        released past the bound is never deferred."""
        async with harness.session(harness.make(), defer_past=2) as store:
            parent, child = await store.add([harness.job(), harness.job(after=[0])], max_pending=1)
            assert child.state is JobState.WAITING
            claimed = await claim_one(store)
            assert claimed.id == parent.id
            await store.add([harness.job(), harness.job()])
            assert await complete_one(store, Succeeded(parent.id, claimed.epoch, None)) is JobState.SUCCEEDED
            assert await _states(store, child.id) == [JobState.READY]
            assert await store.counts() == zero_counts(ready=3, succeeded=1)

    async def test_a_waiting_job_expires_at_its_deadline(self, store: Store, harness: Harness) -> None:
        parent, child = await store.add([harness.job(delay=60.0), harness.job(after=[0], deadline=10.0)])
        harness.clock.advance(11.0)
        await store.promote()
        job = await store.get(child.id)
        assert job.state is JobState.CANCELLED
        assert job.error is not None and job.error.startswith(DEADLINE_ERROR_PREFIX)
        assert await _states(store, parent.id) == [JobState.SCHEDULED]

    async def test_a_flow_survives_a_reopen(self, harness: Harness) -> None:
        first = harness.make()
        async with harness.session(first) as store:
            a, b, c, d = await store.add(
                [harness.job("a"), harness.job("b"), harness.job("c", after=[0, 1]), harness.job("d", after=[2])]
            )
            await _run(store, a.id)
        async with harness.session(harness.reopen(first)) as store:
            assert (await store.get(c.id)).after == (a.id, b.id)
            assert await _states(store, c.id, d.id) == [JobState.WAITING] * 2
            await _kill(store, b.id)
            assert await _states(store, c.id, d.id) == [JobState.CANCELLED] * 2
        async with harness.session(harness.reopen(first)) as store:
            assert (await store.get(d.id)).error == f"ParentFailed: parent {c.id} is cancelled"
            await store.retry(b.id)
            assert await _states(store, c.id, d.id) == [JobState.WAITING] * 2

    @needs("checkpoint")
    async def test_a_flow_survives_a_checkpoint(self, harness: Harness) -> None:
        """The counts of unmet parents and who cancelled whom come back from a checkpoint's rows."""
        first = harness.make()
        async with harness.session(first) as store:
            a, b, c, d = await store.add(
                [harness.job("a"), harness.job("b"), harness.job("c", after=[0, 1]), harness.job("d", after=[1])]
            )
            await _run(store, a.id)
            await _kill(store, b.id)
            (e,) = await store.add([harness.job("e", after=[c.id])])
            await harness.checkpoint(store)
        async with harness.session(harness.reopen(first)) as store:
            assert await _states(store, c.id, d.id, e.id) == [JobState.CANCELLED] * 3
            await store.retry(b.id)
            assert await _states(store, c.id, d.id, e.id) == [JobState.WAITING] * 3
            await harness.checkpoint(store)
        async with harness.session(harness.reopen(first)) as store:
            await _run(store, b.id)
            assert await _states(store, c.id, d.id, e.id) == [JobState.READY, JobState.READY, JobState.WAITING]
