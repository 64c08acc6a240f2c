"""Cases for sessions: what a session's end releases, who may open one, and what survives a reopen."""

from __future__ import annotations

import pytest

from ..._model import MAX_SNOOZES, JobNotFound, JobState, TrioqError
from .._base import Failed, Outcome, Released, Snoozed, Succeeded
from ._fixtures import CaseBase, needs, zero_counts
from ._harness import Harness, claim_one, complete_one

__all__ = ["DurabilityCases", "SessionCases"]


class SessionCases(CaseBase):
    """Opening and closing sessions: running jobs, concurrent sessions, the retention bounds."""

    async def test_a_session_end_releases_its_nodes_running_jobs(self, harness: Harness) -> None:
        """Closing a session puts its node's running jobs back to ready, uncounted; the rest is kept as it was."""
        first_store = harness.make()
        async with harness.session(first_store) as store:
            running, waiting, later = await store.add(
                [harness.job(priority=1), harness.job(key="k"), harness.job(delay=60.0)]
            )
            claimed = await claim_one(store)
            assert claimed.id == running.id
            (done,) = await store.add([harness.job(priority=9)])
            finished = await claim_one(store)
            assert finished.id == done.id
            assert await complete_one(store, Succeeded(finished.id, finished.epoch, "r")) is JobState.SUCCEEDED
            done = await store.get(finished.id)

        harness.hints.clear()
        async with harness.session(harness.reopen(first_store)) as store:
            released = await store.get(running.id)
            assert released.state is JobState.READY
            assert released.attempts == 0
            assert released.epoch >= claimed.epoch
            assert (await store.get(waiting.id)).state is JobState.READY
            assert (await store.get(later.id)).state is JobState.SCHEDULED
            assert await store.get(done.id) == done
            (same,) = await store.add([harness.job(key="k")])
            assert same.id == waiting.id
            assert await store.counts() == zero_counts(ready=2, scheduled=1, succeeded=1)
            # The attempt cut off by the old session cannot complete the job.
            assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, "late")) is None
            assert await store.extend(harness.node, [(claimed.id, claimed.epoch)], 30.0) == [False]
            again = await claim_one(store)
            assert again.id == running.id
            assert again.epoch > claimed.epoch

    @needs("concurrent_sessions")
    async def test_a_session_end_leaves_other_nodes_running_jobs(self, harness: Harness) -> None:
        """Closing one node's session releases that node's running jobs only: another node's stay its own."""
        first = harness.make()
        async with harness.session(first, node="node-b") as store_b:
            async with harness.session(harness.reopen(first), node="node-a") as store_a:
                await store_a.add([harness.job(priority=1), harness.job()])
                (mine,) = await store_a.claim(harness.request(1, node="node-a"))
                (theirs,) = await store_b.claim(harness.request(1, node="node-b"))
            assert (await store_b.get(mine.id)).state is JobState.READY
            assert await store_b.get(theirs.id) == theirs
            assert await store_b.extend("node-b", [(theirs.id, theirs.epoch)], 30.0) == [True]
            assert await complete_one(store_b, Succeeded(theirs.id, theirs.epoch, 1)) is JobState.SUCCEEDED

    @needs("one_session")
    async def test_a_second_concurrent_session_is_refused_clearly(self, harness: Harness) -> None:
        """A store that serves one session refuses a second with an error saying why; the first is unharmed."""
        first_store = harness.make()
        async with harness.session(first_store) as store:
            (job,) = await store.add([harness.job()])
            with pytest.raises((RuntimeError, TrioqError)) as info:
                async with harness.session(harness.reopen(first_store)):
                    pass  # pragma: no cover
            assert str(info.value).strip(), "the refusal should say why"
            # The first session is unharmed.
            assert (await claim_one(store)).id == job.id
        # Once it closes, the store opens again.
        async with harness.session(harness.reopen(first_store)) as store:
            assert (await store.get(job.id)).state is JobState.READY

    async def test_completing_an_evicted_job_is_refused_like_a_stale_epoch(self, harness: Harness) -> None:
        """Outcomes and extends naming a job already cancelled and evicted are refused, not errors."""
        async with harness.session(harness.make(), max_retained=0) as store:
            (job,) = await store.add([harness.job()])
            claimed = await claim_one(store)
            outcome = await store.cancel(job.id)
            assert outcome.changed
            if harness.kind.inline_hints:
                assert harness.hints.cancelled == [(job.id, claimed.epoch)]
            await store.evict()  # max_retained=0: gone (at once, unless the store applies the bound here)
            with pytest.raises(JobNotFound):
                await store.get(job.id)
            assert await store.extend(harness.node, [(job.id, claimed.epoch)], 30.0) == [False]
            late: list[Outcome] = [
                Succeeded(job.id, claimed.epoch, "late"),
                Failed(job.id, claimed.epoch, "E: late", retry_in=0.0),
                Released(job.id, claimed.epoch),
                Snoozed(job.id, claimed.epoch, 1.0),
            ]
            assert await store.complete(late) == [None, None, None, None]

    async def test_reopening_with_a_smaller_max_retained_applies_it_at_once(self, harness: Harness) -> None:
        """A session opened with a smaller ``max_retained`` holds its bound from the start."""
        first = harness.make()
        async with harness.session(first) as store:
            for job in await store.add([harness.job() for _ in range(3)]):
                await store.cancel(job.id)
        async with harness.session(harness.reopen(first), max_retained=1) as store:
            assert (await store.counts())["cancelled"] == 1


async def _errors_survive(harness: Harness, *, checkpoint: bool) -> None:
    """Jobs with failed attempts (tracebacks or not), a snooze, a success after a failure and an
    unstorable result are the same after a reopen (after a checkpoint first, with ``checkpoint``), and
    after a second one that follows more transitions."""
    clock = harness.clock
    first_store = harness.make()
    async with harness.session(first_store) as store:
        failing, snoozed, recovered, unstorable = await store.add(
            [
                harness.job("failing", max_attempts=5),
                harness.job("snoozed"),
                harness.job("recovered"),
                harness.job(),
            ]
        )
        claims = await store.claim(harness.request(4))
        clock.advance(1.0)
        by_id = {job.id: job for job in claims}
        states = await store.complete(
            [
                Failed(failing.id, by_id[failing.id].epoch, "E: one", 0.0, "Traceback: one\n  line 1"),
                Snoozed(snoozed.id, by_id[snoozed.id].epoch, 40.0),
                Failed(recovered.id, by_id[recovered.id].epoch, "E: once", 0.0, None),
                Succeeded(unstorable.id, by_id[unstorable.id].epoch, float("nan")),
            ]
        )
        assert states == [JobState.READY, JobState.SCHEDULED, JobState.READY, JobState.DEAD]
        first, second = await store.claim(harness.request(2))
        assert {first.id, second.id} == {failing.id, recovered.id}
        again = {first.id: first, second.id: second}
        clock.advance(1.0)
        assert await store.complete(
            [
                Failed(failing.id, again[failing.id].epoch, "E: two", 30.0, "Traceback: two"),
                Succeeded(recovered.id, again[recovered.id].epoch, {"ok": True}),
            ]
        ) == [JobState.SCHEDULED, JobState.SUCCEEDED]
        ids = [failing.id, snoozed.id, recovered.id, unstorable.id]
        before = [await store.get(job_id) for job_id in ids]
        assert [len(job.errors) for job in before] == [2, 0, 1, 1]
        assert before[0].errors[0].traceback == "Traceback: one\n  line 1"
        assert before[1].run_at == clock.now - 1.0 + 40.0
        if checkpoint:
            await harness.checkpoint(store)
    async with harness.session(harness.reopen(first_store)) as store:
        assert [await store.get(job_id) for job_id in ids] == before
        if checkpoint:
            await harness.checkpoint(store)
        clock.advance(30.0)
        assert await store.promote() == before[1].run_at
        third = await claim_one(store)
        assert third.id == failing.id
        assert await complete_one(store, Failed(third.id, third.epoch, "E: three", 0.0, "tb")) is JobState.READY
        after = [await store.get(job_id) for job_id in ids]
    async with harness.session(harness.reopen(first_store)) as store:
        assert [await store.get(job_id) for job_id in ids] == after
        assert [e.attempt for e in after[0].errors] == [1, 2, 3]


class DurabilityCases(CaseBase):
    """What a reopen (a replay, for a store that logs) and a checkpoint keep: errors, tracebacks, snoozes."""

    async def test_errors_tracebacks_and_snoozes_survive_a_reopen(self, harness: Harness) -> None:
        """Every job's snapshot, ``errors`` and snoozed ``run_at`` included, is the same after a reopen."""
        await _errors_survive(harness, checkpoint=False)

    @needs("checkpoint")
    async def test_errors_tracebacks_and_snoozes_survive_a_checkpoint(self, harness: Harness) -> None:
        """Every job's snapshot, ``errors`` and snoozed ``run_at`` included, is the same after a checkpoint."""
        await _errors_survive(harness, checkpoint=True)

    async def test_a_snooze_count_survives_a_reopen(self, harness: Harness) -> None:
        """The snoozes a job took count after a reopen (and a checkpoint): the one past ``MAX_SNOOZES`` kills it."""
        first_store = harness.make()
        async with harness.session(first_store) as store:
            (job,) = await store.add([harness.job()])
            for n in range(MAX_SNOOZES):
                claimed = await claim_one(store)
                assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.READY
                if n == MAX_SNOOZES // 2:
                    await harness.checkpoint(store)  # half the snoozes in the checkpoint, half after it
        async with harness.session(harness.reopen(first_store)) as store:
            snoozed = await store.get(job.id)
            assert (snoozed.state, snoozed.attempts) == (JobState.READY, 0)
            claimed = await claim_one(store)
            assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.DEAD
            dead = await store.get(job.id)
        async with harness.session(harness.reopen(first_store)) as store:
            assert await store.get(job.id) == dead
