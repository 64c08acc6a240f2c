"""Cases for the calls around attempts: cancel, retry, promote, evict, rescue, and the views of the store."""

from __future__ import annotations

import pytest

from ..._model import InvalidJob, Job, JobNotFound, JobState, TrioqError
from .._base import CancelResult, Failed, JobFilter, Released, Store, Succeeded
from ._fixtures import CaseBase, needs, zero_counts
from ._harness import ALL_STATES, Harness, claim_one, complete_one

__all__ = ["CancelCases", "EvictCases", "PromoteCases", "RescueCases", "RetryCases", "ViewCases"]


class CancelCases(CaseBase):
    """``cancel``: of each state, and how the attempt of a running job hears of it."""

    async def test_cancel_ready(self, store: Store, harness: Harness) -> None:
        """A ready job is cancelled at the store's now, no longer claimable; no attempt hears of it."""
        (job,) = await store.add([harness.job()])
        harness.clock.advance(1.0)
        outcome = await store.cancel(job.id)
        assert isinstance(outcome, CancelResult)
        assert outcome.changed is True
        assert outcome.job.id == job.id
        assert outcome.job.state is JobState.CANCELLED
        assert outcome.job.finished_at == harness.clock.now
        assert await store.get(job.id) == outcome.job
        assert await store.claim(harness.request()) == []
        assert await store.counts() == zero_counts(cancelled=1)
        if harness.kind.inline_hints:
            assert harness.hints.cancelled == []

    async def test_cancel_scheduled(self, store: Store, harness: Harness) -> None:
        """A scheduled job is cancelled and never comes due."""
        (job,) = await store.add([harness.job(delay=5.0)])
        outcome = await store.cancel(job.id)
        assert (outcome.job.state, outcome.changed) == (JobState.CANCELLED, True)
        harness.clock.advance(10.0)
        assert await store.promote() is None
        assert await store.claim(harness.request()) == []
        if harness.kind.inline_hints:
            assert harness.hints.cancelled == []

    async def test_cancel_running_hints_its_epoch(self, store: Store, harness: Harness) -> None:
        """Cancelling a running job hints ``on_cancel(job_id, epoch)``, and its attempt can no longer finish it."""
        await store.add([harness.job(), harness.job()])
        claimed, other = await store.claim(harness.request(2))
        outcome = await store.cancel(claimed.id)
        assert outcome.changed is True
        assert outcome.job.state is JobState.CANCELLED
        if harness.kind.inline_hints:
            assert harness.hints.cancelled == [(claimed.id, claimed.epoch)]
        # The attempt that was running can no longer finish the job (the hint lost or not).
        assert await store.extend(harness.node, [(claimed.id, claimed.epoch), (other.id, other.epoch)], 30.0) == [
            False,
            True,
        ]
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, "late")) is None
        assert (await store.get(claimed.id)).state is JobState.CANCELLED
        assert (await store.get(claimed.id)).result is None
        assert (await store.get(claimed.id)).attempts == 0

    async def test_cancel_terminal_changes_nothing(self, store: Store, harness: Harness) -> None:
        """Cancelling a finished job returns it unchanged (``changed=False``) and hints nothing."""
        await store.add([harness.job()])
        claimed = await claim_one(store)
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, 7)) is JobState.SUCCEEDED
        done = await store.get(claimed.id)
        harness.clock.advance(3.0)
        assert await store.cancel(claimed.id) == CancelResult(done, False)
        assert await store.get(claimed.id) == done
        if harness.kind.inline_hints:
            assert harness.hints.cancelled == []


class RetryCases(CaseBase):
    """``retry``: a dead or cancelled job back to ready, nothing else."""

    async def test_retry_dead(self, store: Store, harness: Harness) -> None:
        """A dead job goes back to ready with its attempts reset, and runs under a new epoch."""
        await store.add([harness.job(max_attempts=1)])
        claimed = await claim_one(store)
        assert await complete_one(store, Failed(claimed.id, claimed.epoch, "E", retry_in=0.0)) is JobState.DEAD
        harness.hints.clear()
        harness.clock.advance(5.0)
        retried = await store.retry(claimed.id)
        assert retried.state is JobState.READY
        assert retried.attempts == 0
        assert retried.finished_at is None
        assert retried.epoch >= claimed.epoch
        assert await store.get(claimed.id) == retried
        if harness.kind.inline_hints:
            assert sum(harness.hints.ready) == 1
        again = await claim_one(store)
        assert again.id == claimed.id
        assert again.epoch > claimed.epoch

    async def test_retry_cancelled(self, store: Store, harness: Harness) -> None:
        """A cancelled job (even one scheduled far ahead) goes back to ready now."""
        (job,) = await store.add([harness.job(delay=50.0)])
        await store.cancel(job.id)
        retried = await store.retry(job.id)
        assert retried.state is JobState.READY
        assert retried.run_at == harness.clock.now
        assert (await claim_one(store)).id == job.id

    async def test_retry_refused_for_other_states(self, store: Store, harness: Harness) -> None:
        """Retrying a job neither dead nor cancelled raises ``InvalidJob(field="state")``, changing nothing."""
        ready, scheduled, running = await store.add(
            [harness.job(priority=1), harness.job(delay=9.0), harness.job(priority=5)]
        )
        assert (await claim_one(store)).id == running.id
        (succeeded,) = await store.add([harness.job(priority=9)])
        finished = await claim_one(store)
        await complete_one(store, Succeeded(finished.id, finished.epoch, None))
        for job in (ready, scheduled, running, succeeded):
            before = await store.get(job.id)
            with pytest.raises(InvalidJob) as info:
                await store.retry(job.id)
            assert info.value.field == "state"
            assert await store.get(job.id) == before


class PromoteCases(CaseBase):
    """``promote``: due scheduled jobs to ready, and when the next one is due."""

    async def test_promote_returns_next_run_at_and_signals(self, store: Store, harness: Harness) -> None:
        """``promote`` readies what is due, hints how many, and answers the next ``run_at`` (``None``: none)."""
        clock = harness.clock
        start = clock.now
        await store.add([harness.job(delay=1.0), harness.job(delay=2.0), harness.job(delay=5.0)])
        harness.hints.clear()
        assert await store.promote() == start + 1.0
        assert harness.hinted(ready=[])
        clock.advance(2.0)
        assert await store.promote() == start + 5.0
        assert harness.hinted(ready=[2])
        assert await store.counts() == zero_counts(ready=2, scheduled=1)
        clock.advance(3.0)
        assert await store.promote() is None
        assert harness.hinted(ready=[2, 1])
        assert await store.counts() == zero_counts(ready=3)

    async def test_promote_when_empty(self, store: Store, harness: Harness) -> None:
        """With nothing scheduled, ``promote`` answers ``None`` and hints nothing."""
        assert await store.promote() is None
        assert harness.hinted(ready=[])


class EvictCases(CaseBase):
    """``evict`` and ``max_retained``: how long terminal jobs stay."""

    async def test_evict_after_retention(self, harness: Harness) -> None:
        """A terminal job goes at the first ``evict`` ``retention`` seconds after it finished; its key with it."""
        clock = harness.clock
        async with harness.session(harness.make(), retention=10.0) as store:
            done, cancelled, live = await store.add([harness.job(key="k"), harness.job(), harness.job(delay=100.0)])
            claimed = await claim_one(store)
            assert claimed.id == done.id
            await complete_one(store, Succeeded(claimed.id, claimed.epoch, None))
            clock.advance(4.0)
            await store.cancel(cancelled.id)
            clock.advance(5.0)
            assert await store.evict() == 0
            clock.advance(1.0)  # done finished 10 s ago
            assert await store.evict() == 1
            with pytest.raises(JobNotFound):
                await store.get(done.id)
            assert (await store.get(cancelled.id)).state is JobState.CANCELLED
            # The evicted job's key is free again.
            (fresh,) = await store.add([harness.job(key="k")])
            assert fresh.id != done.id
            clock.advance(4.0)
            assert await store.evict() == 1
            with pytest.raises(JobNotFound):
                await store.get(cancelled.id)
            assert (await store.get(live.id)).state is JobState.SCHEDULED
            assert await store.counts() == zero_counts(ready=1, scheduled=1)

    @needs("bound_at_evict")
    async def test_max_retained_bounds_terminal_jobs_at_each_evict(self, harness: Harness) -> None:
        """Beyond ``max_retained`` terminal jobs, ``evict`` drops the oldest finished, and only those."""
        async with harness.session(harness.make(), max_retained=2) as store:
            jobs = await store.add([harness.job() for _ in range(5)])
            for job in jobs[:4]:
                harness.clock.advance(1.0)
                await store.cancel(job.id)
            assert await store.evict() == 2
            assert await store.counts() == zero_counts(cancelled=2, ready=1)
            for job in jobs[:2]:
                with pytest.raises(JobNotFound):
                    await store.get(job.id)
            for job in jobs[2:4]:
                assert (await store.get(job.id)).state is JobState.CANCELLED
            assert await store.evict() == 0

    @needs("bound_at_finish")
    async def test_max_retained_bounds_terminal_jobs(self, harness: Harness) -> None:
        """Beyond ``max_retained`` terminal jobs, the oldest finished goes at once, without ``evict``."""
        async with harness.session(harness.make(), max_retained=2) as store:
            jobs = await store.add([harness.job() for _ in range(4)])
            for job in jobs:
                harness.clock.advance(1.0)
                await store.cancel(job.id)
                assert (await store.counts())["cancelled"] <= 2
            assert await store.counts() == zero_counts(cancelled=2)
            for job in jobs[:2]:
                with pytest.raises(JobNotFound):
                    await store.get(job.id)
            for job in jobs[2:]:
                assert (await store.get(job.id)).state is JobState.CANCELLED


class ViewCases(CaseBase):
    """``counts``, ``jobs``, ``get``, and the ``on_finished`` hint."""

    async def test_has_pending_where_offered_agrees_with_counts(self, store: Store, harness: Harness) -> None:
        """A store's ``has_pending()`` (an optional cheaper ``join()`` check) is true exactly while a job is
        ready, scheduled or running."""
        has_pending = getattr(store, "has_pending", None)
        if has_pending is None:
            return  # the runtime falls back to counts()
        assert await has_pending() is False
        _, later = await store.add([harness.job(), harness.job(delay=10.0)])
        assert await has_pending() is True
        await store.cancel(later.id)
        claimed = await claim_one(store)
        assert await has_pending() is True
        await complete_one(store, Succeeded(claimed.id, claimed.epoch, None))
        assert await has_pending() is False
        assert (await store.counts())["succeeded"] == 1

    async def test_counts_follow_every_state(self, store: Store, harness: Harness) -> None:
        """``counts`` answers every state, each with its number of jobs."""
        assert await store.counts() == zero_counts()
        jobs = await store.add(
            [
                harness.job("succeed", priority=5),
                harness.job("die", priority=4, max_attempts=1),
                harness.job("run", priority=3),
                harness.job("cancel"),
                harness.job("ready"),
                harness.job("later", delay=10.0),
            ]
        )
        assert await store.counts() == zero_counts(ready=5, scheduled=1)
        a, b, _ = await store.claim(harness.request(3))
        assert await store.complete([Succeeded(a.id, a.epoch, None), Failed(b.id, b.epoch, "E", 0.0)]) == [
            JobState.SUCCEEDED,
            JobState.DEAD,
        ]
        await store.cancel(jobs[3].id)
        counts = await store.counts()
        assert set(counts) == ALL_STATES
        assert counts == zero_counts(succeeded=1, dead=1, running=1, cancelled=1, ready=1, scheduled=1)

    async def test_jobs_lists_by_state_oldest_first(self, store: Store, harness: Harness) -> None:
        """``jobs`` lists the jobs in the given states, oldest enqueued first, up to ``limit``."""
        jobs = await store.add([harness.job(f"t{n}", priority=n % 2, delay=10.0 * (n == 4)) for n in range(5)])
        running = await claim_one(store)  # t1: priority 1 first
        await store.cancel(jobs[2].id)
        pending = [JobState.READY, JobState.SCHEDULED, JobState.RUNNING]
        listed = await store.jobs(pending)
        assert [job.task for job in listed] == ["t0", "t1", "t3", "t4"]
        assert listed[1] == await store.get(running.id)
        assert [job.task for job in await store.jobs(pending, limit=2)] == ["t0", "t1"]
        assert [job.task for job in await store.jobs([JobState.CANCELLED])] == ["t2"]
        assert await store.jobs([JobState.DEAD]) == []

    async def test_list_jobs_pages_newest_first_by_filter(self, store: Store, harness: Harness) -> None:
        """``list_jobs`` gives the jobs a filter takes (states, task, queue, tenant, each narrowing), newest
        enqueued first, ``limit`` a page, ``after_id`` the last job of the page before; an unknown
        ``after_id`` is ``InvalidJob`` naming it."""
        specs = [
            harness.job(
                f"t{n % 3}", queue="q" if n % 2 else "default", tenant="acme" if n < 4 else None, max_attempts=1
            )
            for n in range(8)
        ]
        jobs = await store.add(specs)
        ids = [job.id for job in jobs]
        a, b = await store.claim(harness.request(2))  # the two oldest: jobs 0 and 1
        await store.complete([Failed(a.id, a.epoch, "E: x", None)])  # job 0 dead
        await store.cancel(ids[5])
        everything = await store.list_jobs(JobFilter(), limit=100)
        assert [job.id for job in everything] == ids[::-1]
        assert everything[-2] == await store.get(b.id)
        first = await store.list_jobs(JobFilter(), limit=3)
        second = await store.list_jobs(JobFilter(), limit=3, after_id=first[-1].id)
        third = await store.list_jobs(JobFilter(), limit=3, after_id=second[-1].id)
        assert [job.id for job in first + second + third] == ids[::-1]
        assert await store.list_jobs(JobFilter(), limit=3, after_id=ids[0]) == []
        assert await store.list_jobs(JobFilter(), limit=0) == []

        def listed(where: JobFilter) -> list[str]:
            return [job.id for job in everything if _takes(where, job)]

        for where in [
            JobFilter(states=(JobState.DEAD,)),
            JobFilter(states=(JobState.READY, JobState.CANCELLED)),
            JobFilter(states=(JobState.RUNNING,)),
            JobFilter(states=(JobState.SUCCEEDED,)),
            JobFilter(task="t1"),
            JobFilter(queue="q"),
            JobFilter(tenant="acme"),
            JobFilter(states=(JobState.READY,), task="t2", queue="default", tenant="acme"),
            JobFilter(task="nope"),
        ]:
            assert [job.id for job in await store.list_jobs(where, limit=100)] == listed(where), where
        assert [job.id for job in await store.list_jobs(JobFilter(states=(JobState.DEAD,)), limit=1)] == [ids[0]]
        assert [job.id for job in await store.list_jobs(JobFilter(queue="q"), limit=2, after_id=ids[5])] == [
            ids[3],
            ids[1],
        ]
        for unknown in ("no-such-job", "a\x00b", "\udcff", ""):  # NUL and lone surrogates: no row can hold them
            with pytest.raises(InvalidJob) as excinfo:
                await store.list_jobs(JobFilter(), limit=3, after_id=unknown)
            assert excinfo.value.field == "after_id", unknown

    async def test_unknown_id_raises_job_not_found(self, store: Store, harness: Harness) -> None:
        """``get``, ``cancel`` and ``retry`` of an id the store never held raise ``JobNotFound``."""
        await store.add([harness.job()])
        with pytest.raises(JobNotFound):
            await store.get("no-such-job")
        with pytest.raises(JobNotFound):
            await store.cancel("no-such-job")
        with pytest.raises(JobNotFound):
            await store.retry("no-such-job")
        assert issubclass(JobNotFound, TrioqError)

    @needs("inline_hints")
    async def test_on_finished_hints_each_watched_job_as_it_becomes_terminal(self, harness: Harness) -> None:
        """``on_finished`` gets the terminal snapshot of each watched job (succeeded, dead, cancelled), no other."""
        watched: set[str] = set()
        async with harness.session(harness.make(), watched=watched, max_retained=0) as store:
            ok, dead, cancelled, unwatched = await store.add([harness.job(max_attempts=1) for _ in range(4)])
            watched.update({ok.id, dead.id, cancelled.id})  # the set may change at any moment
            a, b = await store.claim(harness.request(2))
            assert (a.id, b.id) == (ok.id, dead.id)
            await store.complete([Succeeded(a.id, a.epoch, "r"), Failed(b.id, b.epoch, "E: x", 0.0)])
            await store.cancel(cancelled.id)
            c = await claim_one(store)
            assert await complete_one(store, Succeeded(c.id, c.epoch, None)) is JobState.SUCCEEDED  # unwatched
        finished = harness.hints.finished
        # max_retained=0 drops each job as it finishes: the hint came first, inside the transition.
        assert [(job.id, job.state) for job in finished] == [
            (ok.id, JobState.SUCCEEDED),
            (dead.id, JobState.DEAD),
            (cancelled.id, JobState.CANCELLED),
        ]
        assert finished[0].result == "r"
        assert finished[1].error == "E: x" and finished[1].attempts == 1
        assert unwatched.id not in {job.id for job in finished}


class RescueCases(CaseBase):
    """``rescue``: running jobs of a node whose lease lapsed, and only those."""

    async def test_rescue_puts_back_nothing_while_leases_hold(self, store: Store, harness: Harness) -> None:
        """With every node's lease holding (one node: always), ``rescue`` answers 0 and changes nothing."""
        await store.add([harness.job() for _ in range(3)])
        running = await store.claim(harness.request(2, lease=30.0))
        harness.clock.advance(10.0)
        rescued = await store.rescue()
        assert type(rescued) is int and rescued == 0
        assert [await store.get(job.id) for job in running] == running
        assert await store.extend(harness.node, [(job.id, job.epoch) for job in running], 30.0) == [True, True]
        assert await store.counts() == zero_counts(running=2, ready=1)

    @needs("concurrent_sessions")
    async def test_rescue_puts_back_a_lapsed_nodes_jobs(self, harness: Harness) -> None:
        """A node that stops extending loses its running jobs to ``rescue``: ready, uncounted, its attempts fenced."""
        first = harness.make()
        async with (
            harness.session(first, node="node-a") as store_a,
            harness.session(harness.reopen(first), node="node-b") as store_b,
        ):
            await store_a.add([harness.job(), harness.job()])
            (lapsing,) = await store_a.claim(harness.request(1, lease=10.0, node="node-a"))
            (kept,) = await store_b.claim(harness.request(1, lease=1000.0, node="node-b"))
            harness.clock.advance(11.0)
            assert await store_b.rescue() == 1
            rescued = await store_b.get(lapsing.id)
            assert (rescued.state, rescued.attempts) == (JobState.READY, 0)
            assert await store_a.extend("node-a", [(lapsing.id, lapsing.epoch)], 10.0) == [False]
            assert await complete_one(store_a, Released(lapsing.id, lapsing.epoch)) is None
            assert (await store_b.get(kept.id)).state is JobState.RUNNING


def _takes(where: JobFilter, job: Job) -> bool:
    """Whether ``where`` takes ``job``: the filter's meaning, spelled out for the listing case."""
    return (
        (not where.states or job.state in where.states)
        and where.task in (None, job.task)
        and where.queue in (None, job.queue)
        and where.tenant in (None, job.tenant)
    )
