"""Cases for named queues, pausing a queue, tenants, and deadlines (a job that must start in time)."""

from __future__ import annotations

import pytest

from ..._model import DEADLINE_ERROR_PREFIX, InvalidJob, JobState
from .._base import Released, Store, Succeeded
from ._fixtures import CaseBase, needs, zero_counts
from ._harness import START, Harness, claim_one, complete_one

__all__ = ["DeadlineCases", "QueueCases"]


class QueueCases(CaseBase):
    """Jobs wait in named queues; a claim takes from the queues it names, never from a paused one."""

    async def test_a_job_keeps_its_queue_and_tenant(self, store: Store, harness: Harness) -> None:
        """``queue`` (``"default"`` unless named) and ``tenant`` come back on every snapshot."""
        plain, named = await store.add([harness.job(), harness.job(queue="email", tenant="acme")])
        assert (plain.queue, plain.tenant, plain.deadline) == ("default", None, None)
        assert (named.queue, named.tenant) == ("email", "acme")
        assert await store.get(named.id) == named
        claimed = await store.claim(harness.request(2))
        assert [(job.id, job.queue, job.tenant) for job in claimed] == [
            (plain.id, "default", None),
            (named.id, "email", "acme"),
        ]

    async def test_a_claim_takes_only_the_queues_it_names(self, store: Store, harness: Harness) -> None:
        """``ClaimRequest.queues`` limits a claim to those queues; ``None`` claims from every queue."""
        a1, b1, a2, c1 = await store.add(
            [harness.job(queue="a"), harness.job(queue="b"), harness.job(queue="a"), harness.job(queue="c")]
        )
        assert [job.id for job in await store.claim(harness.request(5, queues=["a"]))] == [a1.id, a2.id]
        assert await store.claim(harness.request(5, queues=["a"])) == []
        assert await store.claim(harness.request(5, queues=["nothing-here"])) == []
        assert [job.id for job in await store.claim(harness.request(5, queues=["c", "b"]))] == [b1.id, c1.id]
        assert await store.counts() == zero_counts(running=4)

    async def test_claims_across_queues_keep_priority_then_enqueue_order(self, store: Store, harness: Harness) -> None:
        """A claim of several queues orders their jobs as one queue would: priority, then enqueue order."""
        low_a, high_b, low_b, high_a = await store.add(
            [
                harness.job(queue="a"),
                harness.job(queue="b", priority=5),
                harness.job(queue="b"),
                harness.job(queue="a", priority=5),
            ]
        )
        claimed = await store.claim(harness.request(4))
        assert [job.id for job in claimed] == [high_b.id, high_a.id, low_a.id, low_b.id]
        # One at a time, the same order.
        for job in claimed:
            assert await complete_one(store, Released(job.id, job.epoch)) is JobState.READY
        again = [await claim_one(store) for _ in range(4)]
        assert [job.id for job in again] == [high_b.id, high_a.id, low_a.id, low_b.id]

    async def test_a_paused_queue_is_not_claimed_until_resumed(self, store: Store, harness: Harness) -> None:
        """``pause`` stops claims from a queue (named or not in the claim), others go on; ``resume`` undoes it."""
        a, b = await store.add([harness.job(queue="a"), harness.job(queue="b")])
        assert await store.pause("a") is True
        assert await store.pause("a") is False  # paused already
        assert await store.paused() == ["a"]
        assert await store.claim(harness.request(5, queues=["a"])) == []
        assert [job.id for job in await store.claim(harness.request(5))] == [b.id]
        assert (await store.get(a.id)).state is JobState.READY
        harness.hints.clear()
        assert await store.resume("a") is True
        assert await store.resume("a") is False
        assert await store.paused() == []
        if harness.kind.inline_hints:
            assert sum(harness.hints.ready) >= 1  # the workers hear that its jobs can run again
        assert [job.id for job in await store.claim(harness.request(5))] == [a.id]

    async def test_pausing_leaves_running_attempts_to_finish(self, store: Store, harness: Harness) -> None:
        """A job already running when its queue is paused still completes; its retry waits for the resume."""
        await store.add([harness.job(queue="a"), harness.job(queue="a")])
        first = await claim_one(store)
        assert await store.pause("a") is True
        assert await store.extend(harness.node, [(first.id, first.epoch)], 30.0) == [True]
        assert await complete_one(store, Succeeded(first.id, first.epoch, 1)) is JobState.SUCCEEDED
        assert await store.claim(harness.request(5)) == []
        await store.resume("a")
        assert len(await store.claim(harness.request(5))) == 1

    async def test_a_queue_can_be_paused_before_it_has_jobs(self, store: Store, harness: Harness) -> None:
        """A queue is a name: pausing one no job has used yet holds for the jobs that come later."""
        assert await store.pause("later") is True
        (job,) = await store.add([harness.job(queue="later")])
        assert await store.claim(harness.request(5)) == []
        assert await store.resume("later") is True
        assert [claimed.id for claimed in await store.claim(harness.request(5))] == [job.id]

    async def test_pauses_survive_a_reopen(self, harness: Harness) -> None:
        """Which queues are paused is kept with the jobs: a reopened store (and a checkpoint) keeps them."""
        first = harness.make()
        async with harness.session(first) as store:
            await store.add([harness.job(queue="a"), harness.job(queue="b"), harness.job(queue="c")])
            await store.pause("a")
            await store.pause("b")
            await harness.checkpoint(store)
            await store.resume("b")
            await store.pause("c")
        async with harness.session(harness.reopen(first)) as store:
            assert await store.paused() == ["a", "c"]
            assert [job.queue for job in await store.claim(harness.request(5))] == ["b"]

    @pytest.mark.parametrize("name", ["", "x" * 256, "nul\x00here", "\udc80"])
    async def test_a_name_no_queue_can_have_is_refused(self, store: Store, harness: Harness, name: str) -> None:
        """Empty names, names over 255 bytes, NULs and lone surrogates: ``InvalidJob`` naming ``queue``."""
        for call in (store.pause, store.resume):
            with pytest.raises(InvalidJob) as caught:
                await call(name)
            assert caught.value.field == "queue"
        with pytest.raises(InvalidJob) as caught:
            await store.add([harness.job(queue=name)])
        assert caught.value.field == "queue"
        with pytest.raises(InvalidJob) as caught:
            await store.add([harness.job(tenant=name)])
        assert caught.value.field == "tenant"
        assert await store.counts() == zero_counts()
        assert await store.paused() == []


class DeadlineCases(CaseBase):
    """A job not started by its deadline is cancelled, saying so; one that started is past the rule."""

    async def test_a_deadline_is_kept_as_a_wall_clock_time(self, store: Store, harness: Harness) -> None:
        (job,) = await store.add([harness.job(deadline=5.0)])
        assert job.deadline == START + 5.0
        assert (await store.get(job.id)).deadline == START + 5.0

    async def test_a_claim_never_starts_a_job_past_its_deadline(self, store: Store, harness: Harness) -> None:
        """At its deadline a ready job is cancelled by the claim that finds it, and the next job runs."""
        late, fine = await store.add([harness.job(deadline=5.0), harness.job()])
        harness.clock.advance(5.0)
        assert [job.id for job in await store.claim(harness.request(2))] == [fine.id]
        expired = await store.get(late.id)
        assert expired.state is JobState.CANCELLED
        assert expired.finished_at == harness.clock.now
        assert expired.error is not None and expired.error.startswith(DEADLINE_ERROR_PREFIX)
        assert expired.attempts == 0
        assert await store.counts() == zero_counts(running=1, cancelled=1)

    async def test_a_job_claimed_in_time_is_not_held_to_its_deadline(self, store: Store, harness: Harness) -> None:
        """Once started, a job runs again after a release (or a retry delay) however late it is."""
        (job,) = await store.add([harness.job(deadline=5.0)])
        harness.clock.advance(4.0)
        claimed = await claim_one(store)
        assert await complete_one(store, Released(claimed.id, claimed.epoch)) is JobState.READY
        harness.clock.advance(10.0)
        assert await store.promote() is None
        again = await claim_one(store)
        assert again.id == job.id

    async def test_promote_cancels_due_deadlines_and_says_when_next(self, store: Store, harness: Harness) -> None:
        """``promote`` cancels never-claimed jobs at their deadline (scheduled ones too) and answers the
        earliest time something is due: a ``run_at`` or a deadline."""
        ready, scheduled, later = await store.add(
            [harness.job(deadline=5.0), harness.job(delay=10.0, deadline=3.0), harness.job(delay=20.0)]
        )
        assert await store.promote() == START + 3.0
        harness.clock.advance(3.0)
        assert await store.promote() == START + 5.0
        assert (await store.get(scheduled.id)).state is JobState.CANCELLED
        assert (await store.get(ready.id)).state is JobState.READY
        harness.clock.advance(2.0)
        assert await store.promote() == START + 20.0
        gone = await store.get(ready.id)
        assert gone.state is JobState.CANCELLED and gone.finished_at == START + 5.0
        assert (await store.get(later.id)).state is JobState.SCHEDULED

    async def test_a_pause_does_not_stop_a_deadline(self, store: Store, harness: Harness) -> None:
        """A job waiting in a paused queue is still cancelled at its deadline: it did not start in time."""
        (job,) = await store.add([harness.job(queue="slow", deadline=1.0)])
        await store.pause("slow")
        harness.clock.advance(1.0)
        await store.promote()
        assert (await store.get(job.id)).state is JobState.CANCELLED
        await store.resume("slow")
        assert await store.claim(harness.request(5)) == []

    async def test_a_retried_expired_job_runs_without_its_deadline(self, store: Store, harness: Harness) -> None:
        """``retry`` of a job its deadline cancelled makes it ready with no deadline: it is asked for."""
        (job,) = await store.add([harness.job(deadline=1.0)])
        harness.clock.advance(2.0)
        assert await store.promote() is None
        retried = await store.retry(job.id)
        assert (retried.state, retried.deadline) == (JobState.READY, None)
        harness.clock.advance(100.0)
        assert (await claim_one(store)).id == job.id

    @needs("inline_hints")
    async def test_a_watched_job_that_expires_is_reported_finished(self, harness: Harness) -> None:
        """The expiry is a terminal transition like a cancel: ``on_finished`` gets its snapshot."""
        watched: set[str] = set()
        async with harness.session(harness.make(), watched=watched) as store:
            (job,) = await store.add([harness.job(deadline=1.0)])
            watched.add(job.id)
            harness.clock.advance(1.0)
            await store.promote()
        assert [(j.id, j.state) for j in harness.hints.finished] == [(job.id, JobState.CANCELLED)]

    async def test_deadlines_survive_a_reopen(self, harness: Harness) -> None:
        """A deadline is kept with its job: after a reopen (and a checkpoint) it still expires on time."""
        first = harness.make()
        async with harness.session(first) as store:
            kept, expired = await store.add([harness.job(deadline=10.0), harness.job(deadline=1.0)])
            await harness.checkpoint(store)
            harness.clock.advance(1.0)
            await store.promote()
        async with harness.session(harness.reopen(first)) as store:
            assert (await store.get(kept.id)).deadline == START + 10.0
            gone = await store.get(expired.id)
            assert gone.state is JobState.CANCELLED and gone.error is not None
            harness.clock.advance(9.0)
            assert await store.claim(harness.request(5)) == []
            assert (await store.get(kept.id)).state is JobState.CANCELLED
