"""Cases for a job's way through a store: add, claim, extend, and the outcomes of complete."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from ..._model import MAX_ERRORS_KEPT, MAX_SNOOZES, FailedAttempt, InvalidJob, Job, JobState, QueueFull
from .._base import Failed, Outcome, Released, Snoozed, Store, Succeeded
from ._fixtures import CaseBase, zero_counts
from ._harness import Harness, claim_one, complete_one

__all__ = ["AddCases", "ClaimCases", "CompleteCases", "ExtendCases"]


class AddCases(CaseBase):
    """``add``: snapshots, hints, idempotency keys and the ``max_pending`` bound."""

    async def test_store_satisfies_protocol(self, store: Store) -> None:
        """The store is a :class:`~trioq.stores.Store` (the runtime-checkable protocol)."""
        assert isinstance(store, Store)

    async def test_add_returns_snapshots(self, store: Store, harness: Harness) -> None:
        """``add`` answers each job as stored: its fields, state by ``run_at``, no attempt, epoch 0."""
        now = harness.clock.now
        ready_spec = harness.job("email", {"to": "a@b.c"}, priority=3, key="k1", max_attempts=4)
        sched_spec = harness.job("digest", {"n": 1}, delay=5.0)
        ready, scheduled = await store.add([ready_spec, sched_spec])

        assert isinstance(ready, Job) and isinstance(scheduled, Job)
        assert isinstance(ready.id, str) and isinstance(scheduled.id, str)
        assert ready.id != scheduled.id
        assert ready.state is JobState.READY
        assert scheduled.state is JobState.SCHEDULED
        assert (ready.task, ready.payload, ready.priority, ready.key, ready.max_attempts) == (
            "email",
            {"to": "a@b.c"},
            3,
            "k1",
            4,
        )
        assert ready.run_at == now
        assert scheduled.run_at == now + 5.0
        for job in (ready, scheduled):
            assert job.attempts == 0
            assert job.epoch == 0
            assert job.created_at == now
            assert job.finished_at is None
            assert job.result is None
            assert job.error is None
            assert job.errors == ()
        assert await store.get(ready.id) == ready
        assert await store.get(scheduled.id) == scheduled
        assert await store.counts() == zero_counts(ready=1, scheduled=1)

    async def test_a_large_batch_keeps_every_job_as_it_was_given(self, store: Store, harness: Harness) -> None:
        """A batch of 1,000 (a store may insert it another way than a small one: PostgreSQL's COPY) keeps
        each job's payload, priority, delay and order, and they run in that order."""
        payloads = [{"n": i, "text": f"é{i}\x00" if i % 7 == 0 else "x", "f": i / 3} for i in range(1000)]
        added = await store.add(
            [harness.job(payload=p, priority=i % 3, delay=5.0 if i % 10 == 0 else 0.0) for i, p in enumerate(payloads)]
        )
        assert [job.payload for job in added] == payloads
        for i, job in enumerate(added):
            again = await store.get(job.id) if i % 97 == 0 else job
            assert again.payload == payloads[i]
            assert again.priority == i % 3
            assert again.state is (JobState.SCHEDULED if i % 10 == 0 else JobState.READY)
        claimed = await store.claim(harness.request(1000))
        ready = sorted((job for job in added if job.state is JobState.READY), key=lambda job: -job.priority)
        assert [job.id for job in claimed] == [job.id for job in ready]
        assert [job.payload for job in claimed] == [job.payload for job in ready]

    async def test_add_without_delay_is_ready_and_a_bad_delay_is_refused(self, store: Store, harness: Harness) -> None:
        """A job with no delay is ready at once; a delay that is negative, infinite or NaN is refused
        (``InvalidJob`` naming ``delay``) before anything changes."""
        (job,) = await store.add([harness.job()])
        assert job.state is JobState.READY and job.run_at == harness.clock.now
        for bad in (-30.0, math.inf, math.nan):
            with pytest.raises(InvalidJob) as excinfo:
                await store.add([harness.job(), harness.job(delay=bad)])
            assert excinfo.value.field == "jobs[1].delay"
        assert (await store.counts())["ready"] == 1

    async def test_add_signals_ready_count_and_scheduled_run_at(self, store: Store, harness: Harness) -> None:
        """``add`` hints how many jobs became ready, and each scheduled job's ``run_at``."""
        now = harness.clock.now
        await store.add(
            [harness.job(), harness.job(delay=2.0), harness.job(), harness.job(delay=7.0), harness.job()],
        )
        if harness.kind.inline_hints:
            assert sum(harness.hints.ready) == 3
            assert all(n > 0 for n in harness.hints.ready)
            assert sorted(harness.hints.scheduled) == [now + 2.0, now + 7.0]

    async def test_add_only_scheduled_does_not_signal_ready(self, store: Store, harness: Harness) -> None:
        """A batch of scheduled jobs hints its ``run_at`` and no ready job."""
        await store.add([harness.job(delay=1.0)])
        assert harness.hinted(ready=[], scheduled=[harness.clock.now + 1.0])

    async def test_add_empty_batch(self, store: Store, harness: Harness) -> None:
        """An empty batch adds nothing and hints nothing, even with ``max_pending=0``."""
        assert await store.add([]) == []
        assert await store.add([], max_pending=0) == []
        assert harness.hinted(ready=[])
        assert await store.counts() == zero_counts()

    async def test_existing_key_returns_existing_job(self, store: Store, harness: Harness) -> None:
        """A key already held returns its job unchanged, whatever the new job says, and hints nothing;
        the answer's ``existing`` names it."""
        first = await store.add([harness.job(key="k", priority=1)])
        assert first.existing == frozenset()
        harness.hints.clear()
        harness.clock.advance(1.0)
        again = await store.add([harness.job(key="k", priority=9, delay=10.0), harness.job()])
        assert again[0].id == first[0].id and again.existing == {0}
        assert again[0].priority == 1
        assert harness.hinted(ready=[1], scheduled=[])
        assert await store.counts() == zero_counts(ready=2)

    async def test_a_key_held_by_another_task_is_refused_adding_nothing(self, store: Store, harness: Harness) -> None:
        """One key, one kind of work: a key held by a job of another task, in the store or earlier in the
        same batch, is ``InvalidJob`` naming the key, and nothing of the batch goes in."""
        (held,) = await store.add([harness.job("mail", key="k")])
        with pytest.raises(InvalidJob) as excinfo:
            await store.add([harness.job("sms", key="k")])
        assert excinfo.value.field == "key" and "'mail'" in str(excinfo.value)
        with pytest.raises(InvalidJob) as excinfo:
            await store.add([harness.job("sms"), harness.job("sms", key="k")])
        assert excinfo.value.field == "jobs[1].key"
        with pytest.raises(InvalidJob) as excinfo:
            await store.add([harness.job("sms", key="fresh"), harness.job("mail", key="fresh")])
        assert excinfo.value.field == "jobs[1].key"
        assert [job.id for job in await store.jobs([JobState.READY])] == [held.id]

    async def test_duplicate_key_within_one_batch(self, store: Store, harness: Harness) -> None:
        """Two jobs of one batch with the same key are one job."""
        added = await store.add([harness.job(key="k"), harness.job(key="k")])
        a, b = added
        assert a.id == b.id and added.existing == {1}
        assert await store.counts() == zero_counts(ready=1)
        if harness.kind.inline_hints:
            assert sum(harness.hints.ready) == 1

    async def test_key_of_terminal_job_still_returns_it(self, store: Store, harness: Harness) -> None:
        """A retained terminal job keeps its key: adding it again returns the finished job."""
        (job,) = await store.add([harness.job(key="k")])
        claimed = await claim_one(store)
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, "done")) is JobState.SUCCEEDED
        (again,) = await store.add([harness.job(key="k")])
        assert again.id == job.id
        assert again.state is JobState.SUCCEEDED
        assert again.result == "done"

    async def test_max_pending_refuses_whole_batch(self, store: Store, harness: Harness) -> None:
        """A batch past ``max_pending`` raises ``QueueFull``: nothing inserted, hinted, or keyed."""
        await store.add([harness.job(), harness.job(delay=5.0)], max_pending=3)
        harness.hints.clear()
        with pytest.raises(QueueFull) as info:
            await store.add([harness.job(key="new"), harness.job()], max_pending=3)
        assert info.value.retry_after > 0
        assert await store.counts() == zero_counts(ready=1, scheduled=1)
        assert harness.hinted(ready=[], scheduled=[])
        # The key of the refused batch was not taken.
        (fresh,) = await store.add([harness.job(key="new", priority=4)], max_pending=3)
        assert fresh.priority == 4
        assert await store.counts() == zero_counts(ready=2, scheduled=1)

    async def test_max_pending_counts_ready_and_scheduled(self, store: Store, harness: Harness) -> None:
        """Scheduled jobs count against ``max_pending`` as ready ones do."""
        await store.add([harness.job(delay=5.0), harness.job(delay=6.0)])
        with pytest.raises(QueueFull):
            await store.add([harness.job()], max_pending=2)
        assert await store.counts() == zero_counts(scheduled=2)

    async def test_max_pending_exact_fit_accepted(self, store: Store, harness: Harness) -> None:
        """A batch that fills ``max_pending`` exactly is accepted."""
        jobs = await store.add([harness.job() for _ in range(3)], max_pending=3)
        assert len(jobs) == 3
        assert await store.counts() == zero_counts(ready=3)

    async def test_max_pending_ignores_running(self, store: Store, harness: Harness) -> None:
        """Running jobs do not count against ``max_pending``."""
        await store.add([harness.job(), harness.job()])
        assert len(await store.claim(harness.request(2))) == 2
        jobs = await store.add([harness.job(), harness.job()], max_pending=2)
        assert len(jobs) == 2

    async def test_existing_keys_do_not_count_against_max_pending(self, store: Store, harness: Harness) -> None:
        """Only the jobs a batch inserts count against ``max_pending``; its existing keys do not."""
        (held,) = await store.add([harness.job(key="k")])
        await store.add([harness.job()])
        # Full at 2, but an existing key inserts nothing.
        (again,) = await store.add([harness.job(key="k")], max_pending=2)
        assert again.id == held.id
        # A batch with one existing key and one new job is still over the limit.
        with pytest.raises(QueueFull):
            await store.add([harness.job(key="k"), harness.job()], max_pending=2)
        assert await store.counts() == zero_counts(ready=2)
        # With room for exactly the one new job, the batch fits.
        k_job, new = await store.add([harness.job(key="k"), harness.job()], max_pending=3)
        assert k_job.id == held.id
        assert new.id != held.id
        assert await store.counts() == zero_counts(ready=3)

    async def test_duplicate_key_in_batch_counts_once_against_max_pending(self, store: Store, harness: Harness) -> None:
        """A key repeated within a batch inserts, and counts, one job."""
        a, b = await store.add([harness.job(key="k"), harness.job(key="k")], max_pending=1)
        assert a.id == b.id
        assert await store.counts() == zero_counts(ready=1)


async def _order_setup(store: Store, harness: Harness) -> list[str]:
    """Seven jobs made ready by the clock; returns their ids in the order they must be claimed.

    Delays are durations from the store's now, so ``run_at`` order comes from delays and from
    moving the clock between adds: ``late_fifo`` is enqueued after ``fifo1`` and ``fifo2`` but
    is due before them.
    """
    job = harness.job
    (low,) = await store.add([job("low", priority=0)])
    (early,) = await store.add([job("early", delay=1.0, priority=1)])
    fifo1, fifo2 = await store.add([job("fifo1", delay=3.0, priority=1), job("fifo2", delay=3.0, priority=1)])
    (high,) = await store.add([job("high", priority=2)])
    (neg,) = await store.add([job("neg", priority=-1)])
    harness.clock.advance(1.0)
    (late_fifo,) = await store.add([job("late_fifo", delay=1.0, priority=1)])  # due between early and fifo
    harness.clock.advance(10.0)  # all due
    return [high.id, early.id, late_fifo.id, fifo1.id, fifo2.id, low.id, neg.id]


class ClaimCases(CaseBase):
    """``claim``: which jobs, in which order, how many, under which epoch."""

    async def test_claim_returns_nothing_when_empty(self, store: Store, harness: Harness) -> None:
        """An empty store answers a claim with no job, whatever the limit."""
        assert await store.claim(harness.request()) == []
        assert await store.claim(harness.request(5)) == []

    async def test_claim_returns_nothing_when_only_future_jobs(self, store: Store, harness: Harness) -> None:
        """A job not yet due is not claimed, and stays scheduled."""
        (job,) = await store.add([harness.job(delay=10.0)])
        assert await store.claim(harness.request(3)) == []
        assert (await store.get(job.id)).state is JobState.SCHEDULED

    async def test_claim_order(self, store: Store, harness: Harness) -> None:
        """One at a time, jobs come by priority (larger first), then ``run_at``, then enqueue order."""
        expected = await _order_setup(store, harness)
        order = []
        while claimed := await store.claim(harness.request()):
            (job,) = claimed
            order.append(job.id)
        assert order == expected

    async def test_a_batched_claim_takes_the_best_jobs_in_order_up_to_its_limit(
        self, store: Store, harness: Harness
    ) -> None:
        """A claim of ``limit`` jobs returns the best ``limit`` ready ones, best first; fewer when fewer are ready."""
        expected = await _order_setup(store, harness)
        first = await store.claim(harness.request(3))
        assert [job.id for job in first] == expected[:3]
        rest = await store.claim(harness.request(10))
        assert [job.id for job in rest] == expected[3:]
        assert await store.claim(harness.request(10)) == []
        for job in first + rest:
            assert job.state is JobState.RUNNING
            assert job.epoch == 1
            assert await store.get(job.id) == job
        assert await store.counts() == zero_counts(running=7)

    async def test_a_claim_with_limit_zero_claims_nothing(self, store: Store, harness: Harness) -> None:
        """``limit=0`` claims no job and changes none."""
        before = await store.add([harness.job(), harness.job(priority=3)])
        assert await store.claim(harness.request(0)) == []
        assert [await store.get(job.id) for job in before] == before
        assert await store.counts() == zero_counts(ready=2)

    async def test_claim_makes_running_under_new_epoch(self, store: Store, harness: Harness) -> None:
        """A claimed job is running under a new epoch, its attempts unchanged until the attempt ends."""
        (job,) = await store.add([harness.job()])
        claimed = await claim_one(store)
        assert claimed.id == job.id
        assert claimed.state is JobState.RUNNING
        assert claimed.epoch == job.epoch + 1
        assert claimed.attempts == 0
        assert await store.get(job.id) == claimed
        assert await store.counts() == zero_counts(running=1)
        assert await store.claim(harness.request()) == []

    async def test_each_claim_bumps_epoch(self, store: Store, harness: Harness) -> None:
        """Every claim of the same job gives it a new, larger epoch."""
        await store.add([harness.job()])
        epochs = []
        for _ in range(3):
            claimed = await claim_one(store)
            epochs.append(claimed.epoch)
            assert await complete_one(store, Released(claimed.id, claimed.epoch)) is JobState.READY
        assert epochs == sorted(set(epochs))
        assert len(set(epochs)) == 3


class ExtendCases(CaseBase):
    """``extend``: whether each ``(job_id, epoch)`` still holds its job."""

    async def test_extend_by_epoch(self, store: Store, harness: Harness) -> None:
        """Only the current epoch of a running job holds it: not an older one, a newer one, or a finished one."""
        node = harness.node
        await store.add([harness.job()])
        first = await claim_one(store)
        assert await store.extend(node, [(first.id, first.epoch)], 30.0) == [True]
        assert await store.extend(node, [(first.id, first.epoch + 1)], 30.0) == [False]
        await complete_one(store, Released(first.id, first.epoch))
        assert await store.extend(node, [(first.id, first.epoch)], 30.0) == [False]  # ready, nobody holds it
        second = await claim_one(store)
        assert await store.extend(node, [(second.id, first.epoch), (second.id, second.epoch)], 30.0) == [False, True]
        await complete_one(store, Succeeded(second.id, second.epoch, None))
        assert await store.extend(node, [(second.id, second.epoch)], 30.0) == [False]

    async def test_extend_answers_each_pair_false_once_cancelled_or_completed(
        self, store: Store, harness: Harness
    ) -> None:
        """A batch of pairs is answered pair by pair: ``False`` for a cancelled, completed or unknown job."""
        await store.add([harness.job() for _ in range(5)])
        cancelled, succeeded, failed, released, live = await store.claim(harness.request(5))
        await store.cancel(cancelled.id)
        states = await store.complete(
            [
                Succeeded(succeeded.id, succeeded.epoch, 1),
                Failed(failed.id, failed.epoch, "E: x", retry_in=0.0),
                Released(released.id, released.epoch),
            ]
        )
        assert states == [JobState.SUCCEEDED, JobState.READY, JobState.READY]
        pairs = [(job.id, job.epoch) for job in (cancelled, succeeded, failed, released, live)]
        answer = await store.extend(harness.node, [*pairs, ("no-such-job", 1)], 30.0)
        assert answer == [False, False, False, False, True, False]
        assert await store.extend(harness.node, [], 30.0) == []
        assert (await store.get(live.id)).state is JobState.RUNNING


async def _requeued(store: Store, harness: Harness) -> tuple[Job, Job]:
    """A job claimed, released and claimed again: (old attempt, current attempt)."""
    await store.add([harness.job()])
    old = await claim_one(store)
    await complete_one(store, Released(old.id, old.epoch))
    current = await claim_one(store)
    assert current.epoch != old.epoch
    return old, current


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


class CompleteCases(CaseBase):
    """``complete``: what each outcome does to its job, what it answers, and what it refuses."""

    async def test_succeed(self, store: Store, harness: Harness) -> None:
        """A success counts the attempt, keeps the result and finishes the job at the store's now."""
        await store.add([harness.job()])
        claimed = await claim_one(store)
        harness.clock.advance(2.5)
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, {"sent": True})) is JobState.SUCCEEDED
        done = await store.get(claimed.id)
        assert done.state is JobState.SUCCEEDED
        assert done.attempts == 1
        assert done.result == {"sent": True}
        assert done.finished_at == harness.clock.now
        assert done.errors == ()
        assert await store.get(claimed.id) == done
        assert await store.counts() == zero_counts(succeeded=1)

    async def test_a_result_is_kept_as_a_copy_and_survives_a_reopen(self, harness: Harness) -> None:
        """Neither the handler (still holding its result) nor a snapshot's reader can change a stored result."""
        first_store = harness.make()
        returned: dict[str, Any] = {"sent": [1, 2], "to": "a@b.c"}
        async with harness.session(first_store) as store:
            await store.add([harness.job()])
            claimed = await claim_one(store)
            assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, returned)) is JobState.SUCCEEDED
            returned["sent"].append(3)  # the handler still holds what it returned
            seen = await store.get(claimed.id)
            assert seen.result == {"sent": [1, 2], "to": "a@b.c"}
            seen.result["to"] = "changed"  # nor can a caller change it through a snapshot
            assert (await store.get(claimed.id)).result == {"sent": [1, 2], "to": "a@b.c"}
            await store.sync(claimed.id)
            await store.sync()
        async with harness.session(harness.reopen(first_store)) as store:
            assert (await store.get(claimed.id)).result == {"sent": [1, 2], "to": "a@b.c"}

    @pytest.mark.parametrize(
        "result",
        [2**64, -(2**63) - 1, "\ud800", {"n": 2**70}, b"bytes", _nested(5000)],
        ids=["int-above", "int-below", "surrogate", "nested-int", "bytes", "too-deep"],
    )
    async def test_a_result_the_store_cannot_hold_kills_the_job_without_retry(
        self, store: Store, harness: Harness, result: object
    ) -> None:
        """An unstorable result fails its job for good (attempts left or not): dead, the error an InvalidJob."""
        await store.add([harness.job(max_attempts=3)])
        claimed = await claim_one(store)
        harness.clock.advance(1.0)
        harness.hints.clear()
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, result)) is JobState.DEAD
        dead = await store.get(claimed.id)
        assert dead.state is JobState.DEAD
        assert dead.attempts == 1
        assert dead.result is None
        assert dead.finished_at == harness.clock.now
        assert dead.error is not None and "InvalidJob" in dead.error
        assert re.search(r"result (cannot be stored|must be a JSON value)", dead.error), dead.error
        assert dead.errors == (FailedAttempt(1, dead.error, None, harness.clock.now),)
        assert harness.hinted(ready=[], scheduled=[])
        assert await store.counts() == zero_counts(dead=1)
        # Its epoch is stale now: a late outcome of the same attempt is refused.
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, 2**64 - 1)) is None
        assert await store.claim(harness.request()) == []

    async def test_stale_succeed_is_refused(self, store: Store, harness: Harness) -> None:
        """A success under an old epoch answers ``None`` and changes nothing."""
        old, current = await _requeued(store, harness)
        before = await store.get(current.id)
        assert await complete_one(store, Succeeded(old.id, old.epoch, "late")) is None
        assert await store.get(current.id) == before
        assert await store.counts() == zero_counts(running=1)

    async def test_stale_fail_is_refused(self, store: Store, harness: Harness) -> None:
        """A failure under an old epoch answers ``None``, changes nothing and hints nothing."""
        old, current = await _requeued(store, harness)
        before = await store.get(current.id)
        harness.hints.clear()
        assert await complete_one(store, Failed(old.id, old.epoch, "E: late", retry_in=1.0)) is None
        assert await complete_one(store, Failed(old.id, old.epoch, "E: late", retry_in=None)) is None
        assert await store.get(current.id) == before
        assert harness.hinted(ready=[], scheduled=[])

    async def test_stale_release_is_refused(self, store: Store, harness: Harness) -> None:
        """A release under an old epoch answers ``None`` and changes nothing."""
        old, current = await _requeued(store, harness)
        before = await store.get(current.id)
        harness.hints.clear()
        assert await complete_one(store, Released(old.id, old.epoch)) is None
        assert await store.get(current.id) == before
        assert harness.hinted(ready=[])
        assert await store.counts() == zero_counts(running=1)

    async def test_stale_snooze_is_refused(self, store: Store, harness: Harness) -> None:
        """A snooze under an old epoch answers ``None`` and changes nothing."""
        old, current = await _requeued(store, harness)
        before = await store.get(current.id)
        harness.hints.clear()
        assert await complete_one(store, Snoozed(old.id, old.epoch, 5.0)) is None
        assert await store.get(current.id) == before
        assert harness.hinted(ready=[], scheduled=[])

    async def test_completion_of_finished_job_is_refused(self, store: Store, harness: Harness) -> None:
        """Once a job finished, no outcome of its last attempt changes it, alone or in a batch."""
        await store.add([harness.job()])
        claimed = await claim_one(store)
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, 1)) is JobState.SUCCEEDED
        done = await store.get(claimed.id)
        late: list[Outcome] = [
            Succeeded(claimed.id, claimed.epoch, 2),
            Failed(claimed.id, claimed.epoch, "E", retry_in=0.0),
            Failed(claimed.id, claimed.epoch, "E", retry_in=None),
            Released(claimed.id, claimed.epoch),
            Snoozed(claimed.id, claimed.epoch, 0.0),
        ]
        for outcome in late:
            assert await complete_one(store, outcome) is None
        assert await store.complete(late) == [None] * len(late)
        assert await store.get(claimed.id) == done

    @pytest.mark.parametrize("kind", ["succeed", "retry", "fail", "release", "snooze"])
    async def test_an_outcome_sent_twice_applies_once(self, store: Store, harness: Harness, kind: str) -> None:
        """The same outcome sent again (the runtime resends one whose call a cancel stopped) is refused:
        the job stays as the first one left it, even where its epoch is unchanged (a retry waiting)."""
        await store.add([harness.job(max_attempts=3)])
        claimed = await claim_one(store)
        outcomes: dict[str, Outcome] = {
            "succeed": Succeeded(claimed.id, claimed.epoch, 1),
            "retry": Failed(claimed.id, claimed.epoch, "E: once", retry_in=0.0),
            "fail": Failed(claimed.id, claimed.epoch, "E: once", retry_in=None),
            "release": Released(claimed.id, claimed.epoch),
            "snooze": Snoozed(claimed.id, claimed.epoch, 0.0),
        }
        outcome = outcomes[kind]
        assert await complete_one(store, outcome) is not None
        after = await store.get(claimed.id)
        assert await complete_one(store, outcome) is None
        assert await store.complete([outcome, outcome]) == [None, None]
        assert await store.get(claimed.id) == after

    async def test_fail_schedules_retry(self, store: Store, harness: Harness) -> None:
        """A failure with attempts left schedules the job ``retry_in`` after the store's now, counted."""
        clock = harness.clock
        await store.add([harness.job(max_attempts=3)])
        claimed = await claim_one(store)
        clock.advance(2.0)  # the delay runs from the outcome's time, not the claim's
        harness.hints.clear()
        retry_at = clock.now + 4.0
        failed = Failed(claimed.id, claimed.epoch, "ValueError: boom", retry_in=4.0, traceback="Traceback: boom")
        assert await complete_one(store, failed) is JobState.SCHEDULED
        job = await store.get(claimed.id)
        assert job.state is JobState.SCHEDULED
        assert job.attempts == 1
        assert job.run_at == retry_at
        assert job.error == "ValueError: boom"
        assert job.finished_at is None
        assert harness.hinted(ready=[], scheduled=[retry_at])
        assert await store.claim(harness.request()) == []
        clock.advance(4.0)
        assert await store.promote() is None
        again = await claim_one(store)
        assert again.id == claimed.id
        assert again.epoch > claimed.epoch

    async def test_fail_with_no_delay_is_ready(self, store: Store, harness: Harness) -> None:
        """A failure with ``retry_in=0`` makes the job ready at once."""
        await store.add([harness.job(max_attempts=3)])
        claimed = await claim_one(store)
        harness.hints.clear()
        assert await complete_one(store, Failed(claimed.id, claimed.epoch, "E", retry_in=0.0)) is JobState.READY
        assert (await store.get(claimed.id)).attempts == 1
        assert harness.hinted(ready=[1])
        assert (await claim_one(store)).id == claimed.id

    async def test_fail_at_max_attempts_is_dead(self, store: Store, harness: Harness) -> None:
        """The failure that spends the last attempt kills the job, whatever its ``retry_in``."""
        clock = harness.clock
        await store.add([harness.job(max_attempts=2)])
        first = await claim_one(store)
        assert await complete_one(store, Failed(first.id, first.epoch, "E: one", retry_in=0.0)) is JobState.READY
        second = await claim_one(store)
        harness.hints.clear()
        clock.advance(1.0)
        assert await complete_one(store, Failed(second.id, second.epoch, "E: two", retry_in=100.0)) is JobState.DEAD
        dead = await store.get(second.id)
        assert dead.state is JobState.DEAD
        assert dead.attempts == 2
        assert dead.error == "E: two"
        assert dead.finished_at == clock.now
        assert harness.hinted(ready=[], scheduled=[])
        assert await store.counts() == zero_counts(dead=1)
        clock.advance(1000.0)
        assert await store.promote() is None
        assert await store.claim(harness.request()) == []

    async def test_fail_without_retry_is_dead_at_once(self, store: Store, harness: Harness) -> None:
        """``Failed(retry_in=None)`` (``NoRetry``) kills the job with attempts left, counting the attempt."""
        await store.add([harness.job(max_attempts=5)])
        claimed = await claim_one(store)
        harness.clock.advance(3.0)
        harness.hints.clear()
        failed = Failed(claimed.id, claimed.epoch, "NoRetry: bad input", retry_in=None, traceback="tb")
        assert await complete_one(store, failed) is JobState.DEAD
        dead = await store.get(claimed.id)
        assert (dead.state, dead.attempts, dead.error) == (JobState.DEAD, 1, "NoRetry: bad input")
        assert dead.finished_at == harness.clock.now
        assert dead.errors == (FailedAttempt(1, "NoRetry: bad input", "tb", harness.clock.now),)
        assert harness.hinted(ready=[], scheduled=[])
        harness.clock.advance(1000.0)
        assert await store.promote() is None
        assert await store.claim(harness.request()) == []

    async def test_release_signals_ready(self, store: Store, harness: Harness) -> None:
        """A release puts the job back to ready, uncounted, and hints it."""
        await store.add([harness.job()])
        claimed = await claim_one(store)
        harness.hints.clear()
        assert await complete_one(store, Released(claimed.id, claimed.epoch)) is JobState.READY
        released = await store.get(claimed.id)
        assert released.state is JobState.READY
        assert released.attempts == 0
        assert released.error is None
        assert harness.hinted(ready=[1])
        assert await store.counts() == zero_counts(ready=1)

    async def test_snooze_waits_its_delay_on_the_store_clock_uncounted(self, store: Store, harness: Harness) -> None:
        """A snooze schedules the job ``delay`` after the store's now, its attempts, error and errors unchanged."""
        clock = harness.clock
        await store.add([harness.job(max_attempts=3)])
        first = await claim_one(store)
        assert await complete_one(store, Failed(first.id, first.epoch, "E: one", retry_in=0.0)) is JobState.READY
        claimed = await claim_one(store)
        before = await store.get(claimed.id)
        clock.advance(2.0)
        harness.hints.clear()
        assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 30.0)) is JobState.SCHEDULED
        snoozed = await store.get(claimed.id)
        assert snoozed.state is JobState.SCHEDULED
        assert snoozed.run_at == clock.now + 30.0
        assert (snoozed.attempts, snoozed.error, snoozed.errors) == (1, "E: one", before.errors)
        assert snoozed.finished_at is None
        assert harness.hinted(ready=[], scheduled=[clock.now + 30.0])
        assert await store.extend(harness.node, [(claimed.id, claimed.epoch)], 30.0) == [False]
        assert await store.claim(harness.request()) == []
        clock.advance(29.0)
        assert await store.promote() == snoozed.run_at
        clock.advance(1.0)
        assert await store.promote() is None
        again = await claim_one(store)
        assert (again.id, again.attempts) == (claimed.id, 1)
        assert again.epoch > claimed.epoch

    async def test_a_snooze_of_no_delay_is_ready_at_once(self, store: Store, harness: Harness) -> None:
        """``Snoozed(delay=0)`` makes the job ready now, and hints it."""
        await store.add([harness.job()])
        claimed = await claim_one(store)
        harness.hints.clear()
        assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.READY
        assert (await store.get(claimed.id)).attempts == 0
        assert harness.hinted(ready=[1], scheduled=[])

    async def test_snoozing_past_max_snoozes_kills_the_job(self, store: Store, harness: Harness) -> None:
        """The snooze after ``MAX_SNOOZES`` kills the job, counted, its error saying so; a retry starts over."""
        (job,) = await store.add([harness.job(max_attempts=3)])
        for _ in range(MAX_SNOOZES):
            claimed = await claim_one(store)
            assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.READY
        assert (await store.get(job.id)).attempts == 0
        claimed = await claim_one(store)
        harness.clock.advance(1.0)
        assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.DEAD
        dead = await store.get(job.id)
        assert (dead.state, dead.attempts, dead.finished_at) == (JobState.DEAD, 1, harness.clock.now)
        assert dead.error is not None and "snooze" in dead.error.lower()
        assert [(e.attempt, e.error) for e in dead.errors] == [(1, dead.error)]
        await store.retry(job.id)
        claimed = await claim_one(store)
        assert await complete_one(store, Snoozed(claimed.id, claimed.epoch, 0.0)) is JobState.READY

    async def test_a_mixed_batch_of_outcomes_answers_each_in_order(self, store: Store, harness: Harness) -> None:
        """One ``complete`` applies its outcomes in order and answers each: a state, or ``None`` when stale."""
        await store.add([harness.job(f"j{n}", max_attempts=3) for n in range(6)])
        jobs = await store.claim(harness.request(6))
        ok, retried, no_retry, released, snoozed, unstorable = jobs
        outcomes: list[Outcome] = [
            Succeeded(ok.id, ok.epoch, "r"),
            Failed(retried.id, retried.epoch, "E: a", retry_in=5.0),
            Failed(no_retry.id, no_retry.epoch, "E: b", retry_in=None),
            Released(released.id, released.epoch),
            Snoozed(snoozed.id, snoozed.epoch, 10.0),
            Succeeded(unstorable.id, unstorable.epoch, 2**64),
            # The same attempts again: stale now, refused.
            Succeeded(ok.id, ok.epoch, "again"),
            Released(released.id, released.epoch),
            Failed(snoozed.id, snoozed.epoch, "E: c", retry_in=0.0),
        ]
        assert await store.complete(outcomes) == [
            JobState.SUCCEEDED,
            JobState.SCHEDULED,
            JobState.DEAD,
            JobState.READY,
            JobState.SCHEDULED,
            JobState.DEAD,
            None,
            None,
            None,
        ]
        now = harness.clock.now
        got = {job.id: await store.get(job.id) for job in jobs}
        assert (got[ok.id].state, got[ok.id].result, got[ok.id].attempts) == (JobState.SUCCEEDED, "r", 1)
        assert (got[retried.id].run_at, got[retried.id].attempts) == (now + 5.0, 1)
        assert (got[no_retry.id].state, got[no_retry.id].error) == (JobState.DEAD, "E: b")
        assert (got[released.id].state, got[released.id].attempts) == (JobState.READY, 0)
        assert (got[snoozed.id].run_at, got[snoozed.id].attempts, got[snoozed.id].error) == (now + 10.0, 0, None)
        error = got[unstorable.id].error
        assert error is not None and "InvalidJob" in error
        assert await store.counts() == zero_counts(succeeded=1, scheduled=2, dead=2, ready=1)
        assert await store.complete([]) == []

    async def test_job_errors_keep_each_failed_attempt(self, store: Store, harness: Harness) -> None:
        """``Job.errors`` holds the last ``MAX_ERRORS_KEPT`` failed attempts, oldest first, kept across a retry."""
        clock = harness.clock
        attempts = MAX_ERRORS_KEPT + 2
        (job,) = await store.add([harness.job(max_attempts=attempts)])
        expected: list[FailedAttempt] = []
        for n in range(1, attempts + 1):
            claimed = await claim_one(store)
            clock.advance(1.0)
            traceback = f"Traceback (attempt {n})" if n % 2 else None
            state = await complete_one(store, Failed(claimed.id, claimed.epoch, f"E: {n}", 0.0, traceback))
            assert state is (JobState.READY if n < attempts else JobState.DEAD)
            expected.append(FailedAttempt(n, f"E: {n}", traceback, clock.now))
            failed = await store.get(job.id)
            assert failed.errors == tuple(expected[-MAX_ERRORS_KEPT:])
            assert failed.error == f"E: {n}"
        dead = await store.get(job.id)
        assert [e.attempt for e in dead.errors] == list(range(3, attempts + 1))
        retried = await store.retry(job.id)
        assert (retried.attempts, retried.errors) == (0, dead.errors)
        claimed = await claim_one(store)
        clock.advance(1.0)
        assert await complete_one(store, Failed(claimed.id, claimed.epoch, "E: again", 0.0)) is JobState.READY
        expected.append(FailedAttempt(1, "E: again", None, clock.now))
        assert (await store.get(job.id)).errors == tuple(expected[-MAX_ERRORS_KEPT:])
        # A success keeps the failed attempts before it.
        claimed = await claim_one(store)
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, None)) is JobState.SUCCEEDED
        done = await store.get(job.id)
        assert (done.attempts, done.errors) == (2, tuple(expected[-MAX_ERRORS_KEPT:]))
