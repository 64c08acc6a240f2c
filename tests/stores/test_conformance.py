"""The Store conformance suite: every store kind must pass every test here.

Stores are driven only through the async protocol of :class:`trioq.stores.Store`,
with a fake wall clock and recorded ``on_ready`` / ``on_scheduled`` signals
(see ``conftest.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from trioq import InvalidJob, Job, JobNotFound, JobState, QueueFull, TrioqError
from trioq._model import MAX_DEPTH, MAX_ERROR_CHARS, MAX_NAME_BYTES, MAX_VALUE_BYTES, storable_text
from trioq.stores import NewJob, Store, WALStore
from trioq.stores._base import CancelResult

if TYPE_CHECKING:
    from conftest import StoreFactory

ALL_STATES = {"scheduled", "ready", "running", "succeeded", "dead", "cancelled"}


def zero_counts(**nonzero: int) -> dict[str, int]:
    counts = dict.fromkeys(ALL_STATES, 0)
    counts.update(nonzero)
    return counts


async def claim_one(store: Store) -> Job:
    job = await store.claim()
    assert job is not None
    return job


async def test_store_satisfies_protocol(store: Store) -> None:
    assert isinstance(store, Store)


# --------------------------------------------------------------------- add


async def test_add_returns_snapshots(store: Store, store_factory: StoreFactory) -> None:
    now = store_factory.clock.now
    ready_spec = store_factory.job("email", {"to": "a@b.c"}, priority=3, key="k1", max_attempts=4)
    sched_spec = store_factory.job("digest", {"n": 1}, delay=5.0)
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
    assert await store.get(ready.id) == ready
    assert await store.get(scheduled.id) == scheduled
    assert await store.counts() == zero_counts(ready=1, scheduled=1)


async def test_add_past_run_at_is_ready(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job(delay=-30.0)])
    assert job.state is JobState.READY


async def test_add_signals_ready_count_and_scheduled_run_at(store: Store, store_factory: StoreFactory) -> None:
    signals = store_factory.signals
    now = store_factory.clock.now
    await store.add(
        [
            store_factory.job(),
            store_factory.job(delay=2.0),
            store_factory.job(),
            store_factory.job(delay=7.0),
            store_factory.job(),
        ]
    )
    assert sum(signals.ready) == 3
    assert all(n > 0 for n in signals.ready)
    assert sorted(signals.scheduled) == [now + 2.0, now + 7.0]


async def test_add_only_scheduled_does_not_signal_ready(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(delay=1.0)])
    assert store_factory.signals.ready == []
    assert store_factory.signals.scheduled == [store_factory.clock.now + 1.0]


async def test_add_empty_batch(store: Store, store_factory: StoreFactory) -> None:
    assert await store.add([]) == []
    assert await store.add([], max_pending=0) == []
    assert store_factory.signals.ready == []
    assert await store.counts() == zero_counts()


async def test_existing_key_returns_existing_job(store: Store, store_factory: StoreFactory) -> None:
    (first,) = await store.add([store_factory.job(key="k", priority=1)])
    store_factory.signals.clear()
    store_factory.clock.advance(1.0)
    (again,) = await store.add([store_factory.job("other", key="k", priority=9, delay=10.0)])
    assert again.id == first.id
    assert again.task == "t"
    assert again.priority == 1
    assert store_factory.signals.ready == []
    assert store_factory.signals.scheduled == []
    assert await store.counts() == zero_counts(ready=1)


async def test_duplicate_key_within_one_batch(store: Store, store_factory: StoreFactory) -> None:
    a, b = await store.add([store_factory.job(key="k"), store_factory.job(key="k")])
    assert a.id == b.id
    assert await store.counts() == zero_counts(ready=1)
    assert sum(store_factory.signals.ready) == 1


async def test_key_of_terminal_job_still_returns_it(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job(key="k")])
    claimed = await claim_one(store)
    await store.succeed(claimed.id, claimed.epoch, "done")
    (again,) = await store.add([store_factory.job(key="k")])
    assert again.id == job.id
    assert again.state is JobState.SUCCEEDED
    assert again.result == "done"


async def test_max_pending_refuses_whole_batch(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(), store_factory.job(delay=5.0)], max_pending=3)
    store_factory.signals.clear()
    with pytest.raises(QueueFull) as info:
        await store.add([store_factory.job(key="new"), store_factory.job()], max_pending=3)
    assert info.value.retry_after > 0
    # Nothing was inserted, nothing was signalled.
    assert await store.counts() == zero_counts(ready=1, scheduled=1)
    assert store_factory.signals.ready == []
    assert store_factory.signals.scheduled == []
    # The key of the refused batch was not taken.
    (fresh,) = await store.add([store_factory.job(key="new", priority=4)], max_pending=3)
    assert fresh.priority == 4
    assert await store.counts() == zero_counts(ready=2, scheduled=1)


async def test_max_pending_counts_ready_and_scheduled(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(delay=5.0), store_factory.job(delay=6.0)])
    with pytest.raises(QueueFull):
        await store.add([store_factory.job()], max_pending=2)
    assert await store.counts() == zero_counts(scheduled=2)


async def test_max_pending_exact_fit_accepted(store: Store, store_factory: StoreFactory) -> None:
    jobs = await store.add([store_factory.job() for _ in range(3)], max_pending=3)
    assert len(jobs) == 3
    assert await store.counts() == zero_counts(ready=3)


async def test_max_pending_ignores_running(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(), store_factory.job()])
    await claim_one(store)
    await claim_one(store)
    jobs = await store.add([store_factory.job(), store_factory.job()], max_pending=2)
    assert len(jobs) == 2


async def test_existing_keys_do_not_count_against_max_pending(store: Store, store_factory: StoreFactory) -> None:
    (held,) = await store.add([store_factory.job(key="k")])
    await store.add([store_factory.job()])
    # Full at 2, but an existing key inserts nothing.
    (again,) = await store.add([store_factory.job(key="k")], max_pending=2)
    assert again.id == held.id
    # A batch with one existing key and one new job is still over the limit.
    with pytest.raises(QueueFull):
        await store.add([store_factory.job(key="k"), store_factory.job()], max_pending=2)
    assert await store.counts() == zero_counts(ready=2)
    # With room for exactly the one new job, the batch fits.
    k_job, new = await store.add([store_factory.job(key="k"), store_factory.job()], max_pending=3)
    assert k_job.id == held.id
    assert new.id != held.id
    assert await store.counts() == zero_counts(ready=3)


async def test_duplicate_key_in_batch_counts_once_against_max_pending(
    store: Store, store_factory: StoreFactory
) -> None:
    a, b = await store.add([store_factory.job(key="k"), store_factory.job(key="k")], max_pending=1)
    assert a.id == b.id
    assert await store.counts() == zero_counts(ready=1)


# ------------------------------------------------------------------- claim


async def test_claim_returns_none_when_empty(store: Store) -> None:
    assert await store.claim() is None


async def test_claim_returns_none_when_only_future_jobs(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job(delay=10.0)])
    assert await store.claim() is None
    assert (await store.get(job.id)).state is JobState.SCHEDULED


async def test_claim_order(store: Store, store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    job = store_factory.job
    (low,) = await store.add([job("low", delay=-10.0, priority=0)])
    fifo1, fifo2 = await store.add([job("fifo1", delay=-3.0, priority=1), job("fifo2", delay=-3.0, priority=1)])
    (early,) = await store.add([job("early", delay=-5.0, priority=1)])
    (high,) = await store.add([job("high", priority=2)])
    (neg,) = await store.add([job("neg", delay=-100.0, priority=-1)])
    clock.advance(1.0)
    (late_fifo,) = await store.add([job("late_fifo", delay=-5.0, priority=1)])  # run_at between early and fifo
    order = []
    while (claimed := await store.claim()) is not None:
        order.append(claimed.id)
    assert order == [high.id, early.id, late_fifo.id, fifo1.id, fifo2.id, low.id, neg.id]


async def test_claim_makes_running_under_new_epoch(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job()])
    claimed = await claim_one(store)
    assert claimed.id == job.id
    assert claimed.state is JobState.RUNNING
    assert claimed.epoch == job.epoch + 1
    assert claimed.attempts == 0
    assert await store.get(job.id) == claimed
    assert await store.counts() == zero_counts(running=1)
    assert await store.claim() is None


async def test_each_claim_bumps_epoch(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    epochs = []
    for _ in range(3):
        claimed = await claim_one(store)
        epochs.append(claimed.epoch)
        assert await store.release(claimed.id, claimed.epoch) is not None
    assert epochs == sorted(set(epochs))
    assert len(set(epochs)) == 3


# --------------------------------------------------------------- heartbeat


async def test_heartbeat_by_epoch(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    first = await claim_one(store)
    assert await store.heartbeat(first.id, first.epoch) is True
    assert await store.heartbeat(first.id, first.epoch + 1) is False
    await store.release(first.id, first.epoch)
    assert await store.heartbeat(first.id, first.epoch) is False  # ready, nobody owns it
    second = await claim_one(store)
    assert await store.heartbeat(second.id, first.epoch) is False
    assert await store.heartbeat(second.id, second.epoch) is True
    await store.succeed(second.id, second.epoch, None)
    assert await store.heartbeat(second.id, second.epoch) is False


# ---------------------------------------------------------- finishing


async def test_succeed(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    store_factory.clock.advance(2.5)
    assert await store.succeed(claimed.id, claimed.epoch, {"sent": True}) is True
    done = await store.get(claimed.id)
    assert done.state is JobState.SUCCEEDED
    assert done.attempts == 1
    assert done.result == {"sent": True}
    assert done.finished_at == store_factory.clock.now
    assert await store.get(claimed.id) == done
    assert await store.counts() == zero_counts(succeeded=1)


async def test_a_result_is_kept_as_a_copy_and_survives_a_reopen(store_factory: StoreFactory) -> None:
    first_store = store_factory()
    returned = {"sent": [1, 2], "to": "a@b.c"}
    async with store_factory.session(first_store) as store:
        await store.add([store_factory.job()])
        claimed = await claim_one(store)
        assert await store.succeed(claimed.id, claimed.epoch, returned, durable=False) is True
        returned["sent"].append(3)  # the handler still holds what it returned
        seen = await store.get(claimed.id)
        assert seen.result == {"sent": [1, 2], "to": "a@b.c"}
        seen.result["to"] = "changed"  # nor can a caller change it through a snapshot
        assert (await store.get(claimed.id)).result == {"sent": [1, 2], "to": "a@b.c"}
        await store.sync()
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        assert (await store.get(claimed.id)).result == {"sent": [1, 2], "to": "a@b.c"}


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "result",
    [2**64, -(2**63) - 1, "\ud800", {"n": 2**70}, b"bytes", _nested(5000)],
    ids=["int-above", "int-below", "surrogate", "nested-int", "bytes", "too-deep"],
)
async def test_a_result_the_store_cannot_hold_is_refused_and_changes_nothing(
    store: Store, store_factory: StoreFactory, result: object
) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    before = await store.get(claimed.id)
    with pytest.raises(InvalidJob, match=r"result (cannot be stored|must be a JSON value)") as excinfo:
        await store.succeed(claimed.id, claimed.epoch, result)
    assert excinfo.value.field == "result"
    assert await store.get(claimed.id) == before  # still running, no attempt spent, no result
    assert await store.counts() == zero_counts(running=1)
    # The attempt can still end otherwise (the runtime fails it with that error).
    assert await store.fail(claimed.id, claimed.epoch, "InvalidJob: result cannot be stored", 0.0) is not None
    assert await store.succeed(claimed.id, claimed.epoch, 2**64 - 1) is False  # stale epoch now


async def _requeued(store: Store, store_factory: StoreFactory) -> tuple[Job, Job]:
    """A job claimed, released and claimed again: (old attempt, current attempt)."""
    await store.add([store_factory.job()])
    old = await claim_one(store)
    await store.release(old.id, old.epoch)
    current = await claim_one(store)
    assert current.epoch != old.epoch
    return old, current


async def test_stale_succeed_returns_none(store: Store, store_factory: StoreFactory) -> None:
    old, current = await _requeued(store, store_factory)
    before = await store.get(current.id)
    assert await store.succeed(old.id, old.epoch, "late") is False
    assert await store.get(current.id) == before
    assert await store.counts() == zero_counts(running=1)


async def test_stale_fail_returns_none(store: Store, store_factory: StoreFactory) -> None:
    old, current = await _requeued(store, store_factory)
    before = await store.get(current.id)
    store_factory.signals.clear()
    assert await store.fail(old.id, old.epoch, "E: late", store_factory.clock.now + 1.0) is None
    assert await store.get(current.id) == before
    assert store_factory.signals.ready == [] and store_factory.signals.scheduled == []


async def test_stale_release_returns_none(store: Store, store_factory: StoreFactory) -> None:
    old, current = await _requeued(store, store_factory)
    before = await store.get(current.id)
    store_factory.signals.clear()
    assert await store.release(old.id, old.epoch) is None
    assert await store.get(current.id) == before
    assert store_factory.signals.ready == []
    assert await store.counts() == zero_counts(running=1)


async def test_completion_of_finished_job_returns_none(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    assert await store.succeed(claimed.id, claimed.epoch, 1) is True
    done = await store.get(claimed.id)
    assert await store.succeed(claimed.id, claimed.epoch, 2) is False
    assert await store.fail(claimed.id, claimed.epoch, "E", store_factory.clock.now) is None
    assert await store.release(claimed.id, claimed.epoch) is None
    assert await store.get(claimed.id) == done


async def test_fail_schedules_retry(store: Store, store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    await store.add([store_factory.job(max_attempts=3)])
    claimed = await claim_one(store)
    store_factory.signals.clear()
    retry_at = clock.now + 4.0
    failed = await store.fail(claimed.id, claimed.epoch, "ValueError: boom", retry_at)
    assert failed is not None
    assert failed.state is JobState.SCHEDULED
    assert failed.attempts == 1
    assert failed.run_at == retry_at
    assert failed.error == "ValueError: boom"
    assert failed.finished_at is None
    assert store_factory.signals.scheduled == [retry_at]
    assert store_factory.signals.ready == []
    assert await store.claim() is None
    clock.advance(4.0)
    assert await store.promote() is None
    again = await claim_one(store)
    assert again.id == claimed.id
    assert again.epoch > claimed.epoch


async def test_fail_with_past_retry_at_is_ready(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(max_attempts=3)])
    claimed = await claim_one(store)
    store_factory.signals.clear()
    failed = await store.fail(claimed.id, claimed.epoch, "E", store_factory.clock.now)
    assert failed is not None
    assert failed.state is JobState.READY
    assert sum(store_factory.signals.ready) == 1
    assert (await claim_one(store)).id == claimed.id


async def test_fail_at_max_attempts_is_dead(store: Store, store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    await store.add([store_factory.job(max_attempts=2)])
    first = await claim_one(store)
    await store.fail(first.id, first.epoch, "E: one", clock.now)
    second = await claim_one(store)
    store_factory.signals.clear()
    clock.advance(1.0)
    dead = await store.fail(second.id, second.epoch, "E: two", clock.now + 100.0)
    assert dead is not None
    assert dead.state is JobState.DEAD
    assert dead.attempts == 2
    assert dead.error == "E: two"
    assert dead.finished_at == clock.now
    assert store_factory.signals.ready == [] and store_factory.signals.scheduled == []
    assert await store.counts() == zero_counts(dead=1)
    clock.advance(1000.0)
    assert await store.promote() is None
    assert await store.claim() is None


async def test_release_signals_ready(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    store_factory.signals.clear()
    released = await store.release(claimed.id, claimed.epoch)
    assert released is not None
    assert released.state is JobState.READY
    assert released.attempts == 0
    assert store_factory.signals.ready == [1]
    assert await store.counts() == zero_counts(ready=1)


# ------------------------------------------------------------------ cancel


async def test_cancel_ready(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job()])
    store_factory.clock.advance(1.0)
    outcome = await store.cancel(job.id)
    assert isinstance(outcome, CancelResult)
    assert outcome.changed is True
    assert outcome.running_epoch is None
    assert outcome.job.id == job.id
    assert outcome.job.state is JobState.CANCELLED
    assert outcome.job.finished_at == store_factory.clock.now
    assert await store.claim() is None
    assert await store.counts() == zero_counts(cancelled=1)


async def test_cancel_scheduled(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job(delay=5.0)])
    outcome = await store.cancel(job.id)
    assert (outcome.job.state, outcome.changed, outcome.running_epoch) == (JobState.CANCELLED, True, None)
    store_factory.clock.advance(10.0)
    assert await store.promote() is None
    assert await store.claim() is None


async def test_cancel_running_returns_its_epoch(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    outcome = await store.cancel(claimed.id)
    assert outcome.changed is True
    assert outcome.running_epoch == claimed.epoch
    assert outcome.job.state is JobState.CANCELLED
    # The attempt that was running can no longer finish the job.
    assert await store.heartbeat(claimed.id, claimed.epoch) is False
    assert await store.succeed(claimed.id, claimed.epoch, "late") is False
    assert (await store.get(claimed.id)).state is JobState.CANCELLED
    assert (await store.get(claimed.id)).result is None


async def test_cancel_terminal_changes_nothing(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    assert await store.succeed(claimed.id, claimed.epoch, 7) is True
    done = await store.get(claimed.id)
    store_factory.clock.advance(3.0)
    outcome = await store.cancel(claimed.id)
    assert outcome == CancelResult(done, False, None)
    assert await store.get(claimed.id) == done


# ------------------------------------------------------------------- retry


async def test_retry_dead(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job(max_attempts=1)])
    claimed = await claim_one(store)
    await store.fail(claimed.id, claimed.epoch, "E", store_factory.clock.now)
    store_factory.signals.clear()
    store_factory.clock.advance(5.0)
    retried = await store.retry(claimed.id)
    assert retried.state is JobState.READY
    assert retried.attempts == 0
    assert retried.finished_at is None
    assert retried.epoch >= claimed.epoch
    assert sum(store_factory.signals.ready) == 1
    again = await claim_one(store)
    assert again.id == claimed.id
    assert again.epoch > claimed.epoch


async def test_retry_cancelled(store: Store, store_factory: StoreFactory) -> None:
    (job,) = await store.add([store_factory.job(delay=50.0)])
    await store.cancel(job.id)
    retried = await store.retry(job.id)
    assert retried.state is JobState.READY
    assert (await claim_one(store)).id == job.id


async def test_retry_refused_for_other_states(store: Store, store_factory: StoreFactory) -> None:
    ready, scheduled, running = await store.add(
        [store_factory.job(priority=1), store_factory.job(delay=9.0), store_factory.job(priority=5)]
    )
    assert (await claim_one(store)).id == running.id
    (succeeded,) = await store.add([store_factory.job(priority=9)])
    finished = await claim_one(store)
    await store.succeed(finished.id, finished.epoch, None)
    for job in (ready, scheduled, running, succeeded):
        before = await store.get(job.id)
        with pytest.raises(InvalidJob) as info:
            await store.retry(job.id)
        assert info.value.field == "state"
        assert await store.get(job.id) == before


# ----------------------------------------------------------------- promote


async def test_promote_returns_next_run_at_and_signals(store: Store, store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    start = clock.now
    await store.add([store_factory.job(delay=1.0), store_factory.job(delay=2.0), store_factory.job(delay=5.0)])
    store_factory.signals.clear()
    assert await store.promote() == start + 1.0
    assert store_factory.signals.ready == []
    clock.advance(2.0)
    assert await store.promote() == start + 5.0
    assert store_factory.signals.ready == [2]
    assert await store.counts() == zero_counts(ready=2, scheduled=1)
    clock.advance(3.0)
    assert await store.promote() is None
    assert store_factory.signals.ready == [2, 1]
    assert await store.counts() == zero_counts(ready=3)


async def test_promote_when_empty(store: Store, store_factory: StoreFactory) -> None:
    assert await store.promote() is None
    assert store_factory.signals.ready == []


# ------------------------------------------------------------------- evict


async def test_evict_after_retention(store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    async with store_factory.session(store_factory(), retention=10.0) as store:
        done, cancelled, live = await store.add(
            [store_factory.job(key="k"), store_factory.job(), store_factory.job(delay=100.0)]
        )
        claimed = await claim_one(store)
        assert claimed.id == done.id
        await store.succeed(claimed.id, claimed.epoch, None)
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
        (fresh,) = await store.add([store_factory.job(key="k")])
        assert fresh.id != done.id
        clock.advance(4.0)
        assert await store.evict() == 1
        with pytest.raises(JobNotFound):
            await store.get(cancelled.id)
        assert (await store.get(live.id)).state is JobState.SCHEDULED
        assert await store.counts() == zero_counts(ready=1, scheduled=1)


async def test_max_retained_bounds_terminal_jobs(store_factory: StoreFactory) -> None:
    async with store_factory.session(store_factory(), max_retained=2) as store:
        jobs = await store.add([store_factory.job() for _ in range(4)])
        for job in jobs:
            store_factory.clock.advance(1.0)
            await store.cancel(job.id)
            counts = await store.counts()
            assert counts["cancelled"] <= 2
        assert await store.counts() == zero_counts(cancelled=2)
        for job in jobs[:2]:
            with pytest.raises(JobNotFound):
                await store.get(job.id)
        for job in jobs[2:]:
            assert (await store.get(job.id)).state is JobState.CANCELLED


# ---------------------------------------------------------- counts and get


async def test_counts_follow_every_state(store: Store, store_factory: StoreFactory) -> None:
    clock = store_factory.clock
    assert await store.counts() == zero_counts()
    jobs = await store.add(
        [
            store_factory.job("succeed", priority=5),
            store_factory.job("die", priority=4, max_attempts=1),
            store_factory.job("run", priority=3),
            store_factory.job("cancel"),
            store_factory.job("ready"),
            store_factory.job("later", delay=10.0),
        ]
    )
    assert await store.counts() == zero_counts(ready=5, scheduled=1)
    a = await claim_one(store)
    await store.succeed(a.id, a.epoch, None)
    b = await claim_one(store)
    await store.fail(b.id, b.epoch, "E", clock.now)
    await claim_one(store)
    await store.cancel(jobs[3].id)
    counts = await store.counts()
    assert set(counts) == ALL_STATES
    assert counts == zero_counts(succeeded=1, dead=1, running=1, cancelled=1, ready=1, scheduled=1)


async def test_jobs_lists_by_state_oldest_first(store: Store, store_factory: StoreFactory) -> None:
    jobs = await store.add([store_factory.job(f"t{n}", priority=n % 2, delay=10.0 * (n == 4)) for n in range(5)])
    running = await claim_one(store)  # t1: priority 1 first
    await store.cancel(jobs[2].id)
    pending = [JobState.READY, JobState.SCHEDULED, JobState.RUNNING]
    listed = await store.jobs(pending)
    assert [job.task for job in listed] == ["t0", "t1", "t3", "t4"]
    assert listed[1] == await store.get(running.id)
    assert [job.task for job in await store.jobs(pending, limit=2)] == ["t0", "t1"]
    assert [job.task for job in await store.jobs([JobState.CANCELLED])] == ["t2"]
    assert await store.jobs([JobState.DEAD]) == []


async def test_unknown_id_raises_job_not_found(store: Store, store_factory: StoreFactory) -> None:
    await store.add([store_factory.job()])
    with pytest.raises(JobNotFound):
        await store.get("no-such-job")
    with pytest.raises(JobNotFound):
        await store.cancel("no-such-job")
    with pytest.raises(JobNotFound):
        await store.retry("no-such-job")
    assert issubclass(JobNotFound, TrioqError)


# -------------------------------------------------------------- sessions


async def test_reopen_keeps_jobs_and_releases_running(store_factory: StoreFactory) -> None:
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        running, waiting, later = await store.add(
            [store_factory.job(priority=1), store_factory.job(key="k"), store_factory.job(delay=60.0)]
        )
        claimed = await claim_one(store)
        assert claimed.id == running.id
        done_spec = store_factory.job(priority=9)
        (done,) = await store.add([done_spec])
        finished = await claim_one(store)
        assert finished.id == done.id
        assert await store.succeed(finished.id, finished.epoch, "r") is True
        done = await store.get(finished.id)

    store_factory.signals.clear()
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        released = await store.get(running.id)
        assert released.state is JobState.READY
        assert released.attempts == 0
        assert released.epoch >= claimed.epoch
        assert (await store.get(waiting.id)).state is JobState.READY
        assert (await store.get(later.id)).state is JobState.SCHEDULED
        assert await store.get(done.id) == done
        (same,) = await store.add([store_factory.job(key="k")])
        assert same.id == waiting.id
        assert await store.counts() == zero_counts(ready=2, scheduled=1, succeeded=1)
        # The attempt cut off by the old session cannot complete the job.
        assert await store.succeed(claimed.id, claimed.epoch, "late") is False
        again = await claim_one(store)
        assert again.id == running.id
        assert again.epoch > claimed.epoch


async def test_second_concurrent_session_refused(store_factory: StoreFactory) -> None:
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        (job,) = await store.add([store_factory.job()])
        with pytest.raises((RuntimeError, TrioqError)):
            async with store_factory.session(store_factory.reopen(first_store)):
                pass  # pragma: no cover
        # The first session is unharmed.
        assert (await claim_one(store)).id == job.id
    # Once it closes, the store opens again.
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        assert (await store.get(job.id)).state is JobState.READY


async def test_completing_an_evicted_job_is_refused_like_a_stale_epoch(store_factory: StoreFactory) -> None:
    async with store_factory.session(store_factory(), max_retained=0) as store:
        (job,) = await store.add([store_factory.job()])
        claimed = await claim_one(store)
        outcome = await store.cancel(job.id)
        assert outcome.changed and outcome.running_epoch == claimed.epoch
        with pytest.raises(JobNotFound):
            await store.get(job.id)  # max_retained=0: gone at once
        assert await store.heartbeat(job.id, claimed.epoch) is False
        assert await store.succeed(job.id, claimed.epoch, "late") is False
        assert await store.fail(job.id, claimed.epoch, "E: late", store_factory.clock.now) is None
        assert await store.release(job.id, claimed.epoch) is None


async def test_reopening_with_a_smaller_max_retained_applies_it_at_once(store_factory: StoreFactory) -> None:
    first = store_factory()
    async with store_factory.session(first) as store:
        for job in await store.add([store_factory.job() for _ in range(3)]):
            await store.cancel(job.id)
    async with store_factory.session(store_factory.reopen(first), max_retained=1) as store:
        assert (await store.counts())["cancelled"] == 1


# ---------------------------------------------------- what a store can hold

_UNSTORABLE_NAMES = {
    "surrogate": "k\udcff",
    "nul": "k\x00",
    "too-long": "k" * (MAX_NAME_BYTES + 1),
    "too-long-utf8": "é" * (MAX_NAME_BYTES // 2 + 1),
}


@pytest.mark.parametrize("field", ["task", "key"])
@pytest.mark.parametrize("bad", sorted(_UNSTORABLE_NAMES))
async def test_a_name_the_store_cannot_hold_is_refused_and_changes_nothing(
    store_factory: StoreFactory, field: str, bad: str
) -> None:
    # A key with a lone surrogate once reached the WAL's encoder after the
    # table had changed: a worker's claim was logged without its ADD, and the
    # next open failed with "record does not replay".
    value = _UNSTORABLE_NAMES[bad]
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        with pytest.raises(InvalidJob, match="cannot be stored") as excinfo:
            await store.add([store_factory.job(**{field: value})])  # type: ignore[arg-type]
        assert excinfo.value.field == field
        with pytest.raises(InvalidJob, match="cannot be stored") as excinfo:
            await store.add([store_factory.job(), store_factory.job(**{field: value})])  # type: ignore[arg-type]
        assert excinfo.value.field == f"jobs[1].{field}"
        assert await store.counts() == zero_counts()
        assert await store.claim() is None
        fine = store_factory.job(key="k\u00e9" * (MAX_NAME_BYTES // 3))  # non-ASCII, within the limit
        (kept,) = await store.add([fine])
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        assert await store.counts() == zero_counts(ready=1)
        assert (await store.get(kept.id)).key == fine.key


async def test_a_payload_over_the_size_limit_is_refused_and_changes_nothing(
    store: Store, store_factory: StoreFactory
) -> None:
    # Such a record was once written, and the next open failed: "truncated record".
    # (A payload at the limit is accepted: tests/test_limits.py.)
    over = {"blob": "x" * MAX_VALUE_BYTES}  # its msgpack framing takes it over
    with pytest.raises(InvalidJob, match="256 MiB") as excinfo:
        await store.add([store_factory.job(payload=over)])
    assert excinfo.value.field == "payload"
    with pytest.raises(InvalidJob, match="256 MiB") as excinfo:
        await store.add([store_factory.job(), store_factory.job(payload=over)])
    assert excinfo.value.field == "jobs[1].payload"
    assert await store.counts() == zero_counts()


async def test_a_result_over_the_size_limit_is_refused_and_changes_nothing(
    store: Store, store_factory: StoreFactory
) -> None:
    await store.add([store_factory.job()])
    claimed = await claim_one(store)
    before = await store.get(claimed.id)
    half = "x" * (MAX_VALUE_BYTES // 2)
    for result in (half + half + "x", [half, half]):
        with pytest.raises(InvalidJob, match=r"result cannot be stored.*256 MiB") as excinfo:
            await store.succeed(claimed.id, claimed.epoch, result)
        assert excinfo.value.field == "result"
        assert await store.get(claimed.id) == before
    assert await store.succeed(claimed.id, claimed.epoch, "fits") is True


async def test_any_error_text_is_kept_storable(store_factory: StoreFactory) -> None:
    # An error text the WAL could not encode once raised inside the worker,
    # killing the queue on every restart (the attempt was never recorded).
    errors = {
        "surrogate": ("FileNotFoundError: missing caf\udce9.txt", "FileNotFoundError: missing caf\\udce9.txt"),
        "nul": ("ValueError: a\x00b", "ValueError: a\\x00b"),
    }
    long_error = "E" * (MAX_ERROR_CHARS + 500)
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        await store.add([store_factory.job(max_attempts=5) for _ in range(3)])
        ids = []
        for error in [errors["surrogate"][0], errors["nul"][0], long_error]:
            claimed = await claim_one(store)
            failed = await store.fail(claimed.id, claimed.epoch, error, store_factory.clock.now + 60)
            assert failed is not None
            ids.append(claimed.id)
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        kept = [(await store.get(job_id)).error for job_id in ids]
    assert kept[0] == errors["surrogate"][1]
    assert kept[1] == errors["nul"][1]
    assert kept[2] is not None and len(kept[2]) <= MAX_ERROR_CHARS
    assert kept[2] == "E" * (MAX_ERROR_CHARS - 40) + "... (540 more characters cut)"
    assert storable_text(kept[2]) == kept[2]  # a text made storable once is left as it is


class _Str(str):
    """A str subclass (numpy.str_ is one): the log's encoder takes none."""


class _Int(int):
    """An int subclass."""


class _Float(float):
    """A float subclass."""


async def test_subclasses_of_str_int_and_float_are_stored_as_plain_values(store_factory: StoreFactory) -> None:
    # A str subclass as a key reached the WAL's encoder after the table had
    # changed (TypeError, then "record does not replay" at the next open).
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        spec = NewJob(_Str("t"), {"n": 1}, _Int(3), _Str("k"), _Int(4), _Float(store_factory.clock.now))
        (job,) = await store.add([spec])
        assert (type(job.task), type(job.key), type(job.priority), type(job.max_attempts)) == (str, str, int, int)
        claimed = await claim_one(store)
        failed = await store.fail(_Str(claimed.id), _Int(claimed.epoch), _Str("E: x"), _Float(0.0))
        assert failed is not None and type(failed.error) is str
        again = await claim_one(store)
        assert await store.succeed(_Str(again.id), _Int(again.epoch), "ok") is True
        (other,) = await store.add([store_factory.job()])
        await store.cancel(_Str(other.id))
        await store.retry(_Str(other.id))
        before = {j: await store.get(j) for j in (job.id, other.id)}
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        assert {j: await store.get(j) for j in (job.id, other.id)} == before


@pytest.mark.parametrize("bad", [[], {"id": 1}, None, 7], ids=["list", "dict", "none", "int"])
async def test_an_id_that_is_not_a_string_names_no_job(store: Store, bad: object) -> None:
    for call in (store.get, store.cancel, store.retry):
        with pytest.raises(JobNotFound):
            await call(bad)  # type: ignore[arg-type]
    assert await store.succeed(bad, 1, None) is False  # type: ignore[arg-type]


def _deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


async def test_nesting_past_the_limit_is_refused_and_at_it_survives_a_checkpoint(store_factory: StoreFactory) -> None:
    # A payload nested ~986 levels was accepted, then killed the queue at every
    # checkpoint (which decodes payloads again, deeper in the writer's stack).
    first_store = store_factory()
    async with store_factory.session(first_store) as store:
        with pytest.raises(InvalidJob, match=f"nests deeper than {MAX_DEPTH} levels") as excinfo:
            await store.add([store_factory.job(payload={"a": _deep(MAX_DEPTH)})])  # the dict is one level
        assert excinfo.value.field == "payload"
        (job,) = await store.add([store_factory.job(payload={"a": _deep(MAX_DEPTH - 1)})])
        claimed = await claim_one(store)
        with pytest.raises(InvalidJob, match="nests deeper"):
            await store.succeed(claimed.id, claimed.epoch, _deep(MAX_DEPTH + 1))
        assert await store.succeed(claimed.id, claimed.epoch, _deep(MAX_DEPTH - 1)) is True
        if isinstance(store, WALStore):
            await store.checkpoint()
    async with store_factory.session(store_factory.reopen(first_store)) as store:
        kept = await store.get(job.id)
    assert kept.payload == {"a": _deep(MAX_DEPTH - 1)} and kept.result == _deep(MAX_DEPTH - 1)


class _Lying(dict[str, object]):
    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


async def test_a_dict_subclass_that_says_it_is_empty_keeps_its_payload(
    store: Store, store_factory: StoreFactory
) -> None:
    # Its len() and bool() once decided that the payload was empty: stored as {}.
    (job,) = await store.add([store_factory.job(payload=_Lying(n=1))])
    assert (await store.get(job.id)).payload == {"n": 1}


class _Hiding(dict[object, object]):
    """Shows a checker different items from what it holds."""

    def items(self) -> Any:
        return [("a", 1)]


async def test_what_a_payload_holds_is_checked_not_what_it_says_it_holds(
    store: Store, store_factory: StoreFactory
) -> None:
    hiding = _Hiding({1: "an int key"})
    with pytest.raises(InvalidJob, match="keys must be strings"):
        await store.add([store_factory.job(payload={"inner": hiding})])
    assert await store.counts() == zero_counts()
