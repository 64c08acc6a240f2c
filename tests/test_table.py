"""Unit and model-based tests of the pure job state machine, ``trioq.stores.table.jobs.JobTable``.

The first half pins each transition by example; the second half
(:class:`TableMachine`) drives random sequences of transitions against a small
reference model and checks the table's invariants after every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trioq import InvalidJob, Job, JobNotFound, JobState
from trioq.stores.table import jobs as _table
from trioq.stores.table.jobs import JobTable
from trioq.stores.table.ready import CHUNK

E = TypeVar("E", bound=Exception)

READY = JobState.READY
SCHEDULED = JobState.SCHEDULED
RUNNING = JobState.RUNNING
SUCCEEDED = JobState.SUCCEEDED
DEAD = JobState.DEAD
CANCELLED = JobState.CANCELLED


def add(
    table: JobTable,
    job_id: str,
    *,
    now: float = 0.0,
    run_at: float | None = None,
    priority: int = 0,
    key: str | None = None,
    max_attempts: int = 3,
    task: str = "t",
    payload: dict[str, Any] | None = None,
) -> tuple[Any, bool]:
    return table.add(
        job_id,
        task,
        {} if payload is None else payload,
        priority=priority,
        key=key,
        max_attempts=max_attempts,
        run_at=now if run_at is None else run_at,
        now=now,
    )


def check_consistent(table: JobTable) -> None:
    """Counts, pending, retention bound and keys agree with the jobs themselves."""
    jobs = [table.get(job_id) for job_id in list(table._jobs)]
    real = {state.value: 0 for state in JobState}
    for job in jobs:
        real[job.state.value] += 1
    assert table.counts() == real
    for state in JobState:
        assert table.count(state) == real[state.value]
    assert table.pending == real["ready"] + real["scheduled"]
    assert len(table) == len(jobs)
    terminal = sum(1 for j in jobs if j.state.terminal)
    assert terminal <= table.max_retained
    for job in jobs:
        assert job.id in table
        assert 0 <= job.attempts <= job.max_attempts
        if job.key is not None:
            # A live job's key maps to that job (a duplicate add returns it).
            assert table.holds_key(job.key) and table._keys[job.key] == job.id
    for key, job_id in table._keys.items():
        assert job_id in table and table.get(job_id).key == key
    assert table._retained == terminal
    assert len(table._terminal) - table._retained <= table._stale  # every stale item is counted

    # Every waiting or retained job has exactly one current queue item.
    def current(items: Any) -> list[str]:
        return sorted(item[2].id if len(item) == 4 else item[1].id for item in items if item[-2].slot == item[-1])

    ready_items = [item for ready in table._queues.values() for item in ready]
    assert current(ready_items) == sorted(j.id for j in jobs if j.state is READY)
    for name, ready in table._queues.items():  # each job waits in its own queue's
        assert all(item[2].queue == name for item in ready if item[2].slot == item[3])
    assert current(table._scheduled) == sorted(j.id for j in jobs if j.state is SCHEDULED)
    assert current(table._terminal) == sorted(j.id for j in jobs if j.state.terminal)
    # Stale queue items are compacted away (see _table._current_ready), and
    # the size that decides when is the true count of items.
    for ready in table._queues.values():
        assert ready.size == sum(1 for _ in ready)
        assert ready.size <= 2 * real["ready"] + CHUNK + 1
    assert len(table._scheduled) <= 2 * real["scheduled"] + CHUNK + 1
    running = {job.id for job in jobs if job.state is RUNNING}
    assert set(table._active) == running
    assert all(table._active[job_id] is table.entry(job_id) for job_id in running)


def all_snapshots(table: JobTable) -> dict[str, Job]:
    return {job_id: table.get(job_id) for job_id in list(table._jobs)}


# --------------------------------------------------------------------- add


def test_add_ready_when_run_at_is_now_or_past() -> None:
    table = JobTable()
    a, created = add(table, "a", now=10.0)
    assert created
    assert a.state is READY
    b, _ = add(table, "b", now=10.0, run_at=5.0)
    assert b.state is READY
    job = table.get("a")
    assert job.id == "a"
    assert job.state == "ready"
    assert job.attempts == 0
    assert job.epoch == 0
    assert job.created_at == 10.0
    assert job.run_at == 10.0
    assert job.finished_at is None
    assert table.counts()["ready"] == 2
    assert table.pending == 2
    assert table.next_run_at() is None
    check_consistent(table)


def test_add_scheduled_when_run_at_is_future() -> None:
    table = JobTable()
    entry, created = add(table, "a", now=10.0, run_at=12.5)
    assert created
    assert entry.state is SCHEDULED
    assert table.count(SCHEDULED) == 1
    assert table.count(READY) == 0
    assert table.pending == 1
    assert table.next_run_at() == 12.5
    # Not due yet: nothing to claim.
    assert table.claim_next(12.0) is None
    assert table.get("a").state == "scheduled"
    check_consistent(table)


def test_add_keeps_fields() -> None:
    table = JobTable()
    add(table, "a", now=1.0, priority=7, key="k", max_attempts=9, task="email", payload={"to": "x"})
    job = table.get("a")
    assert (job.task, job.payload, job.priority, job.key, job.max_attempts) == ("email", {"to": "x"}, 7, "k", 9)


def test_duplicate_job_id_refused() -> None:
    table = JobTable()
    add(table, "a")
    with pytest.raises(InvalidJob) as info:
        add(table, "a", priority=5)
    assert info.value.field == "id"
    assert len(table) == 1
    assert table.get("a").priority == 0
    check_consistent(table)


def test_unknown_ids_raise_job_not_found() -> None:
    table = JobTable()
    add(table, "a")
    calls = [
        lambda: table.get("nope"),
        lambda: table.entry("nope"),
        lambda: table.claim("nope"),
        lambda: table.cancel("nope", 0.0),
        lambda: table.retry("nope", 0.0),
        lambda: table.drop("nope"),
    ]
    for call in calls:
        with pytest.raises(JobNotFound):
            call()
    # Completions naming an unknown id are stale (the job may have been
    # evicted while its attempt ran): refused, not raised.
    assert table.succeed("nope", 1, None, 0.0) is None
    assert table.fail("nope", 1, "E", 0.0, 0.0) is None
    assert table.release("nope", 1) is None
    assert table.holds("nope", 1) is False
    assert "nope" not in table
    check_consistent(table)


# ------------------------------------------------------------------- claim


def test_claim_bumps_epoch_each_time() -> None:
    table = JobTable()
    add(table, "a")
    first = table.claim_next(0.0)
    assert first is not None and first.id == "a"
    assert first.state is RUNNING
    assert first.epoch == 1
    assert table.count(RUNNING) == 1 and table.pending == 0
    table.release("a", 1)
    second = table.claim_next(0.0)
    assert second is not None
    assert second.epoch == 2
    check_consistent(table)


def test_claim_next_empty_returns_none() -> None:
    table = JobTable()
    assert table.claim_next(0.0) is None
    assert table.peek(0.0) is None


def test_claim_of_non_claimable_state_refused() -> None:
    table = JobTable()
    add(table, "a")
    table.claim("a")
    with pytest.raises(InvalidJob) as info:
        table.claim("a")
    assert info.value.field == "state"
    assert table.get("a").epoch == 1
    table.succeed("a", 1, None, 0.0)
    with pytest.raises(InvalidJob):
        table.claim("a")
    assert table.get("a").state == "succeeded"


def test_claim_scheduled_directly_for_replay() -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=100.0)
    entry = table.claim("a")
    assert entry.state is RUNNING and entry.epoch == 1
    # The old scheduled heap item is stale: it must not resurface.
    assert table.next_run_at() is None
    assert table.promote(1000.0) == 0
    assert table.get("a").state == "running"
    check_consistent(table)


def test_claim_next_orders_by_priority_then_run_at_then_fifo() -> None:
    table = JobTable()
    add(table, "low", now=0.0, run_at=0.0, priority=0)
    add(table, "fifo1", now=5.0, run_at=3.0, priority=1)
    add(table, "fifo2", now=5.0, run_at=3.0, priority=1)
    add(table, "early", now=5.0, run_at=1.0, priority=1)
    add(table, "high", now=5.0, run_at=5.0, priority=2)
    add(table, "neg", now=5.0, run_at=-10.0, priority=-1)
    order = []
    while (entry := table.claim_next(5.0)) is not None:
        order.append(entry.id)
    assert order == ["high", "early", "fifo1", "fifo2", "low", "neg"]
    check_consistent(table)


def test_fifo_among_equal_priority_and_run_at() -> None:
    table = JobTable()
    ids = [f"j{i}" for i in range(20)]
    for job_id in ids:
        add(table, job_id, now=1.0)
    claimed = []
    while (entry := table.claim_next(1.0)) is not None:
        claimed.append(entry.id)
    assert claimed == ids


def test_rebuilding_the_retention_queue_keeps_every_retained_job_in_finish_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_table, "CHUNK", 0)  # rebuild as soon as stale items outnumber current ones
    table = JobTable(max_retained=100)
    for i in range(6):
        add(table, f"j{i}")
    for now in range(6):
        entry = table.claim_next(1.0)
        assert entry is not None
        table.cancel(entry.id, float(now))
    for job_id in ("j0", "j2", "j3", "j1"):  # each retry leaves a stale item; the last one rebuilds
        table.retry(job_id, 10.0)
        check_consistent(table)
    assert len(table._terminal) < 6  # a rebuild happened
    table.max_retained = 0
    assert table.evict(10.0) == ["j4", "j5"]


@pytest.mark.parametrize("run_at", [0.0, 1e9], ids=["ready", "scheduled"])
def test_cancelled_jobs_do_not_pile_up_in_the_queues_and_order_survives(run_at: float) -> None:
    # With nothing claiming (a producer-only queue, or jobs due far ahead),
    # the items of cancelled jobs stayed queued forever; the queues are now
    # rebuilt when stale items outnumber current ones.
    table = JobTable(max_retained=10)
    kept = []
    for i in range(20 * CHUNK):
        job_id = f"j{i}"
        add(table, job_id, run_at=run_at, priority=i % 3)
        if i % 50:
            table.cancel(job_id, now=0.0)
        else:
            kept.append((-(i % 3), i, job_id))
        if i % 997 == 0:
            check_consistent(table)
    check_consistent(table)
    ready_items = sum(1 for ready in table._queues.values() for _ in ready)
    assert ready_items + len(table._scheduled) <= 2 * len(kept) + CHUNK + 1
    order = [table.claim_next(2e9) for _ in kept]
    assert [e.id for e in order if e is not None] == [job_id for _, _, job_id in sorted(kept)]
    assert table.claim_next(2e9) is None


def test_claim_next_promotes_due_scheduled() -> None:
    table = JobTable()
    add(table, "later", now=0.0, run_at=10.0, priority=5)
    add(table, "now", now=0.0)
    # At t=9 only "now" is eligible.
    first = table.claim_next(9.0)
    assert first is not None and first.id == "now"
    assert table.get("later").state == "scheduled"
    # At t=10 "later" is due and claimable.
    second = table.claim_next(10.0)
    assert second is not None and second.id == "later"
    check_consistent(table)


def test_due_scheduled_job_competes_on_priority() -> None:
    table = JobTable()
    add(table, "ready_low", now=0.0, priority=0)
    add(table, "sched_high", now=0.0, run_at=5.0, priority=3)
    entry = table.claim_next(6.0)
    assert entry is not None and entry.id == "sched_high"


def test_peek_does_not_claim() -> None:
    table = JobTable()
    add(table, "a")
    assert table.peek(0.0) is table.entry("a")
    assert table.get("a").state == "ready"
    assert table.get("a").epoch == 0


# ----------------------------------------------------------------- promote


def test_promote_moves_only_due_jobs() -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=1.0)
    add(table, "b", now=0.0, run_at=2.0)
    add(table, "c", now=0.0, run_at=3.0)
    assert table.promote(0.5) == 0
    assert table.promote(2.0) == 2
    assert table.get("a").state == "ready"
    assert table.get("b").state == "ready"
    assert table.get("c").state == "scheduled"
    assert table.count(READY) == 2 and table.count(SCHEDULED) == 1
    assert table.next_run_at() == 3.0
    assert table.promote(2.0) == 0
    assert table.promote(3.0) == 1
    assert table.next_run_at() is None
    check_consistent(table)


# -------------------------------------------------------- succeed/fail/release


def test_succeed_with_current_epoch() -> None:
    table = JobTable()
    add(table, "a")
    entry = table.claim_next(0.0)
    assert entry is not None
    done = table.succeed("a", entry.epoch, {"x": 1}, 4.0)
    assert done is entry
    job = table.get("a")
    assert job.state == "succeeded"
    assert job.attempts == 1
    assert job.result == {"x": 1}
    assert job.finished_at == 4.0
    assert job.error is None
    assert table.count(RUNNING) == 0 and table.count(SUCCEEDED) == 1
    check_consistent(table)


@pytest.mark.parametrize("op", ["succeed", "fail", "release"])
def test_stale_epoch_changes_nothing(op: str) -> None:
    table = JobTable()
    add(table, "a")
    table.claim_next(0.0)
    table.release("a", 1)
    table.claim_next(0.0)  # epoch 2 now owns the job
    before = all_snapshots(table)
    counts = table.counts()
    for stale in (0, 1, 3):
        if op == "succeed":
            result = table.succeed("a", stale, "late", 1.0)
        elif op == "fail":
            result = table.fail("a", stale, "E: late", 1.0, 1.0)
        else:
            result = table.release("a", stale)
        assert result is None
    assert all_snapshots(table) == before
    assert table.counts() == counts
    # The current epoch still works afterwards.
    assert table.succeed("a", 2, "ok", 1.0) is not None


@pytest.mark.parametrize("op", ["succeed", "fail", "release"])
@pytest.mark.parametrize("state", ["ready", "scheduled", "succeeded", "cancelled"])
def test_completion_of_non_running_job_changes_nothing(op: str, state: str) -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=50.0 if state == "scheduled" else 0.0)
    if state in ("succeeded", "cancelled"):
        table.claim("a")
        if state == "succeeded":
            table.succeed("a", 1, None, 1.0)
        else:
            table.cancel("a", 1.0)
    assert table.get("a").state == state
    epoch = table.get("a").epoch
    before = all_snapshots(table)
    if op == "succeed":
        assert table.succeed("a", epoch, "r", 2.0) is None
    elif op == "fail":
        assert table.fail("a", epoch, "E", 3.0, 2.0) is None
    else:
        assert table.release("a", epoch) is None
    assert all_snapshots(table) == before
    check_consistent(table)


def test_fail_schedules_retry_at_future() -> None:
    table = JobTable()
    add(table, "a", max_attempts=3)
    table.claim_next(0.0)
    entry = table.fail("a", 1, "ValueError: boom", 7.5, 2.0)
    assert entry is not None
    job = table.get("a")
    assert job.state == "scheduled"
    assert job.attempts == 1
    assert job.run_at == 7.5
    assert job.error == "ValueError: boom"
    assert job.finished_at is None
    assert table.next_run_at() == 7.5
    assert table.claim_next(7.0) is None
    again = table.claim_next(7.5)
    assert again is not None and again.id == "a" and again.epoch == 2
    check_consistent(table)


@pytest.mark.parametrize("retry_at", [2.0, 1.0])
def test_fail_with_retry_at_not_after_now_goes_ready(retry_at: float) -> None:
    table = JobTable()
    add(table, "a", max_attempts=3)
    table.claim_next(0.0)
    table.fail("a", 1, "E", retry_at, 2.0)
    job = table.get("a")
    assert job.state == "ready"
    assert job.run_at == retry_at
    assert table.count(READY) == 1 and table.count(SCHEDULED) == 0
    assert table.next_run_at() is None
    entry = table.claim_next(2.0)
    assert entry is not None and entry.id == "a"


def test_fail_at_max_attempts_is_dead() -> None:
    table = JobTable()
    add(table, "a", max_attempts=2)
    table.claim_next(0.0)
    table.fail("a", 1, "E: one", 0.0, 0.0)
    assert table.get("a").state == "ready"
    table.claim_next(0.0)
    entry = table.fail("a", 2, "E: two", 100.0, 3.0)
    assert entry is not None
    job = table.get("a")
    assert job.state == "dead"
    assert job.attempts == 2
    assert job.error == "E: two"
    assert job.finished_at == 3.0
    assert table.next_run_at() is None
    assert table.claim_next(1000.0) is None
    check_consistent(table)


def test_max_attempts_one_dies_on_first_failure() -> None:
    table = JobTable()
    add(table, "a", max_attempts=1)
    table.claim_next(0.0)
    table.fail("a", 1, "E", 5.0, 0.0)
    assert table.get("a").state == "dead"


def test_release_returns_to_ready_without_counting() -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=0.0)
    add(table, "b", now=1.0, run_at=1.0)
    table.claim_next(1.0)
    entry = table.release("a", 1)
    assert entry is not None
    job = table.get("a")
    assert job.state == "ready"
    assert job.attempts == 0
    assert job.epoch == 1
    assert job.run_at == 0.0
    # Released "a" keeps its place ahead of "b".
    nxt = table.claim_next(1.0)
    assert nxt is not None and nxt.id == "a" and nxt.epoch == 2
    check_consistent(table)


def test_running_lists_running_entries() -> None:
    table = JobTable()
    add(table, "a")
    add(table, "b")
    add(table, "c")
    table.claim("a")
    table.claim("c")
    assert sorted(e.id for e in table.running()) == ["a", "c"]


# ------------------------------------------------------------------ cancel


def test_cancel_ready() -> None:
    table = JobTable()
    add(table, "a")
    entry, changed, running_epoch = table.cancel("a", 3.0)
    assert changed is True
    assert running_epoch is None
    assert entry.state is CANCELLED
    assert table.get("a").finished_at == 3.0
    assert table.claim_next(3.0) is None
    assert table.pending == 0
    check_consistent(table)


def test_cancel_scheduled() -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=5.0)
    entry, changed, running_epoch = table.cancel("a", 1.0)
    assert (entry.state, changed, running_epoch) == (CANCELLED, True, None)
    assert table.next_run_at() is None
    assert table.promote(10.0) == 0
    assert table.claim_next(10.0) is None
    assert table.get("a").state == "cancelled"
    check_consistent(table)


def test_cancel_running_returns_running_epoch() -> None:
    table = JobTable()
    add(table, "a")
    table.claim_next(0.0)
    table.release("a", 1)
    table.claim_next(0.0)
    entry, changed, running_epoch = table.cancel("a", 2.0)
    assert changed is True
    assert running_epoch == 2
    assert entry.state is CANCELLED
    assert table.count(RUNNING) == 0
    # The cut-off attempt's late completion is refused.
    assert table.succeed("a", 2, "late", 3.0) is None
    assert table.fail("a", 2, "E", 3.0, 3.0) is None
    assert table.get("a").state == "cancelled"
    assert table.get("a").result is None
    check_consistent(table)


@pytest.mark.parametrize("final", ["succeeded", "dead", "cancelled"])
def test_cancel_terminal_changes_nothing(final: str) -> None:
    table = JobTable()
    add(table, "a", max_attempts=1)
    table.claim_next(0.0)
    if final == "succeeded":
        table.succeed("a", 1, 42, 1.0)
    elif final == "dead":
        table.fail("a", 1, "E", 1.0, 1.0)
    else:
        table.cancel("a", 1.0)
    before = all_snapshots(table)
    entry, changed, running_epoch = table.cancel("a", 9.0)
    assert changed is False
    assert running_epoch is None
    assert entry.state == final
    assert all_snapshots(table) == before
    assert table.get("a").finished_at == 1.0


# ------------------------------------------------------------------- retry


@pytest.mark.parametrize("final", ["dead", "cancelled"])
def test_retry_dead_or_cancelled(final: str) -> None:
    table = JobTable()
    add(table, "a", max_attempts=2, now=0.0)
    table.claim_next(0.0)
    table.fail("a", 1, "E", 0.0, 0.0)
    table.claim_next(0.0)
    if final == "dead":
        table.fail("a", 2, "E", 0.0, 1.0)
    else:
        table.cancel("a", 1.0)
    assert table.get("a").state == final
    entry = table.retry("a", 5.0)
    job = table.get("a")
    assert entry.state is READY
    assert job.state == "ready"
    assert job.attempts == 0
    assert job.finished_at is None
    assert job.run_at == 5.0
    assert job.epoch == 2  # epochs never go back
    assert table.count(READY) == 1
    again = table.claim_next(5.0)
    assert again is not None and again.id == "a" and again.epoch == 3
    check_consistent(table)


@pytest.mark.parametrize("state", ["ready", "scheduled", "running", "succeeded"])
def test_retry_refused_for_other_states(state: str) -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=5.0 if state == "scheduled" else 0.0)
    if state in ("running", "succeeded"):
        table.claim("a")
    if state == "succeeded":
        table.succeed("a", 1, None, 1.0)
    before = all_snapshots(table)
    with pytest.raises(InvalidJob) as info:
        table.retry("a", 2.0)
    assert info.value.field == "state"
    assert all_snapshots(table) == before
    check_consistent(table)


def test_retried_job_is_not_evicted_by_its_old_finish() -> None:
    table = JobTable(retention=10.0)
    add(table, "a")
    table.cancel("a", 0.0)
    table.retry("a", 1.0)
    assert table.evict(100.0) == []
    assert table.get("a").state == "ready"


def test_stale_heap_item_and_fresh_item_for_same_job() -> None:
    """Cancel then retry at the same ``now``: two heap items tie on every key."""
    table = JobTable()
    add(table, "a", now=0.0)
    add(table, "b", now=0.0)
    table.cancel("a", 0.0)
    table.retry("a", 0.0)
    table.cancel("a", 0.0)
    table.retry("a", 0.0)
    check_consistent(table)
    first = table.claim_next(0.0)
    second = table.claim_next(0.0)
    assert first is not None and second is not None
    assert {first.id, second.id} == {"a", "b"}
    # Stale items for "a" must not make it claimable twice.
    assert table.claim_next(0.0) is None
    assert table.count(RUNNING) == 2


def test_stale_scheduled_item_after_cancel_retry() -> None:
    table = JobTable()
    add(table, "a", now=0.0, run_at=5.0)
    table.cancel("a", 0.0)
    table.retry("a", 0.0)
    assert table.next_run_at() is None
    assert table.promote(10.0) == 0
    entry = table.claim_next(10.0)
    assert entry is not None and entry.id == "a"
    assert table.claim_next(10.0) is None
    check_consistent(table)


# --------------------------------------------------------- idempotency keys


def test_same_key_returns_existing() -> None:
    table = JobTable()
    first, created = add(table, "a", key="k", priority=1)
    assert created
    again, created_again = add(table, "b", key="k", priority=9, now=3.0)
    assert created_again is False
    assert again == first  # add returns snapshots: the existing job, unchanged
    assert "b" not in table
    assert len(table) == 1
    assert table.get("a").priority == 1
    assert table.by_key("k") is table.entry("a")
    assert table.holds_key("k") and not table.holds_key("other")
    assert table.by_key("other") is None
    check_consistent(table)


def test_key_held_while_terminal_and_freed_on_eviction() -> None:
    table = JobTable(retention=10.0)
    add(table, "a", key="k")
    table.claim_next(0.0)
    table.succeed("a", 1, "r", 1.0)
    entry, created = add(table, "b", key="k", now=5.0)
    assert created is False and entry.id == "a"
    assert table.evict(11.0) == ["a"]
    assert table.by_key("k") is None
    entry, created = add(table, "b", key="k", now=12.0)
    assert created and entry.id == "b"
    assert table.by_key("k") is table.entry("b")
    check_consistent(table)


def test_key_freed_when_max_retained_drops_job() -> None:
    table = JobTable(max_retained=1)
    add(table, "a", key="k1")
    add(table, "b", key="k2")
    table.cancel("a", 1.0)
    table.cancel("b", 2.0)
    assert "a" not in table
    assert table.by_key("k1") is None
    assert table.by_key("k2") is table.entry("b")
    entry, created = add(table, "c", key="k1", now=3.0)
    assert created and entry.id == "c"


def test_duplicate_id_with_held_key_returns_existing() -> None:
    table = JobTable()
    add(table, "a", key="k")
    entry, created = add(table, "a", key="k")
    assert created is False and entry.id == "a"
    assert len(table) == 1


# --------------------------------------------------------------- retention


def test_evict_by_retention_time() -> None:
    table = JobTable(retention=10.0)
    for job_id, finished in [("a", 1.0), ("b", 2.0), ("c", 5.0)]:
        add(table, job_id)
        table.claim(job_id)
        table.succeed(job_id, 1, None, finished)
    add(table, "live")
    assert table.evict(10.9) == []
    assert table.evict(11.0) == ["a"]  # finished exactly retention ago
    assert table.evict(14.0) == ["b"]
    assert "a" not in table and "b" not in table
    assert table.get("c").state == "succeeded"
    assert table.evict(100.0) == ["c"]
    assert table.get("live").state == "ready"
    assert table.count(SUCCEEDED) == 0
    check_consistent(table)


def test_evict_never_touches_non_terminal() -> None:
    table = JobTable(retention=0.0)
    add(table, "ready")
    add(table, "sched", run_at=50.0)
    add(table, "run")
    table.claim("run")
    assert table.evict(1_000_000.0) == []
    assert len(table) == 3


def test_retention_zero_evicts_on_next_evict() -> None:
    table = JobTable(retention=0.0)
    add(table, "a")
    table.cancel("a", 5.0)
    assert table.get("a").state == "cancelled"
    assert table.evict(5.0) == ["a"]


def test_max_retained_bound_holds_at_every_moment() -> None:
    table = JobTable(retention=1e9, max_retained=3)
    for i in range(10):
        add(table, f"j{i}", now=float(i))
    for i in range(10):
        table.cancel(f"j{i}", float(i))
        terminal = [e.id for e in table.entries() if e.state.terminal]
        assert len(terminal) <= 3
        # The oldest finished are the ones dropped.
        assert sorted(terminal) == [f"j{k}" for k in range(max(0, i - 2), i + 1)]
        check_consistent(table)
    assert table.evict(10.0) == []


def test_max_retained_zero_drops_at_finish() -> None:
    table = JobTable(max_retained=0)
    add(table, "a", key="k")
    table.claim("a")
    entry = table.succeed("a", 1, "r", 1.0)
    assert entry is not None and entry.state is SUCCEEDED
    assert "a" not in table
    assert table.by_key("k") is None
    assert table.count(SUCCEEDED) == 0
    check_consistent(table)


def test_evict_honours_max_retained_oldest_first() -> None:
    table = JobTable(retention=1e9, max_retained=5)
    for i in range(4):
        add(table, f"j{i}")
        table.cancel(f"j{i}", float(i))
    table.max_retained = 2
    assert table.evict(10.0) == ["j0", "j1"]
    assert sorted(e.id for e in table.entries()) == ["j2", "j3"]


def test_drop_of_non_terminal_refused() -> None:
    table = JobTable()
    add(table, "ready")
    add(table, "sched", run_at=5.0)
    add(table, "run")
    table.claim("run")
    for job_id in ("ready", "sched", "run"):
        with pytest.raises(InvalidJob) as info:
            table.drop(job_id)
        assert info.value.field == "state"
    assert len(table) == 3
    check_consistent(table)


def test_drop_terminal() -> None:
    table = JobTable()
    add(table, "a", key="k")
    table.cancel("a", 0.0)
    table.drop("a")
    assert "a" not in table
    assert table.by_key("k") is None
    with pytest.raises(JobNotFound):
        table.get("a")
    check_consistent(table)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        JobTable(retention=-1.0)
    with pytest.raises(ValueError):
        JobTable(max_retained=-1)


def test_counts_track_every_transition() -> None:
    table = JobTable(retention=5.0)
    add(table, "a", max_attempts=2)
    add(table, "b", run_at=10.0)
    add(table, "c")
    add(table, "d")
    check_consistent(table)
    table.claim("a")
    check_consistent(table)
    table.fail("a", 1, "E", 20.0, 1.0)
    check_consistent(table)
    table.cancel("b", 1.0)
    check_consistent(table)
    table.claim("c")
    table.succeed("c", 1, None, 1.0)
    check_consistent(table)
    table.retry("b", 2.0)
    check_consistent(table)
    assert table.counts() == {
        "scheduled": 1,
        "ready": 2,
        "running": 0,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 0,
        "deferred": 0,
        "waiting": 0,
    }
    table.evict(6.0)
    assert table.counts()["succeeded"] == 0
    check_consistent(table)


# ======================================================= model-based testing


@attrs.define
class Model:
    """The reference model's view of one job."""

    id: str
    state: JobState
    priority: int
    key: str | None
    max_attempts: int
    run_at: float
    seq: int
    attempts: int = 0
    epoch: int = 0
    finished_at: float | None = None


TERMINAL = {SUCCEEDED, DEAD, CANCELLED}
IDX = st.integers(min_value=0, max_value=1_000)
EPOCH_SHIFT = st.sampled_from([0, 0, 0, -1, 1])
DELAY = st.sampled_from([-1.0, 0.0, 1.0, 1.0, 2.0])


class TableMachine(RuleBasedStateMachine):
    """Random transitions against a reference model of the job table."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.table = JobTable()
        self.model: dict[str, Model] = {}
        self.terminal_order: list[str] = []  # finish order of retained terminal jobs
        self.ids: list[str] = []  # every id ever added (some evicted)
        self.seq = 0
        self.max_epoch: dict[str, int] = {}
        self.blocked: set[str] = set()  # terminal, and not retried since

    @initialize(
        retention=st.sampled_from([0.0, 2.0, 5.0, 1e9]),
        max_retained=st.sampled_from([0, 1, 2, 3, 100]),
    )
    def configure(self, retention: float, max_retained: int) -> None:
        self.table = JobTable(retention=retention, max_retained=max_retained)

    # ---------------------------------------------------------- model helpers

    def pick(self, idx: int) -> str:
        return self.ids[idx % len(self.ids)]

    def finish(self, job: Model, state: JobState) -> None:
        job.state = state
        job.finished_at = self.now
        self.terminal_order.append(job.id)
        self.blocked.add(job.id)
        while len(self.terminal_order) > self.table.max_retained:
            self.forget(self.terminal_order[0])

    def forget(self, job_id: str) -> None:
        self.terminal_order.remove(job_id)
        del self.model[job_id]
        self.blocked.discard(job_id)

    def model_promote(self) -> int:
        n = 0
        for job in self.model.values():
            if job.state is SCHEDULED and job.run_at <= self.now:
                job.state = READY
                n += 1
        return n

    def best(self) -> Model | None:
        eligible = [
            j for j in self.model.values() if j.state is READY or (j.state is SCHEDULED and j.run_at <= self.now)
        ]
        if not eligible:
            return None
        return min(eligible, key=lambda j: (-j.priority, j.run_at, j.seq))

    def live_key_holder(self, key: str) -> Model | None:
        for job in self.model.values():
            if job.key == key:
                return job
        return None

    def expect_unchanged(self, before: dict[str, Job], counts: dict[str, int]) -> None:
        assert all_snapshots(self.table) == before
        assert self.table.counts() == counts

    def refuses(self, error: type[E], call: Callable[[], object]) -> pytest.ExceptionInfo[E]:
        """``call()`` raises ``error`` and leaves every job as it was."""
        before = all_snapshots(self.table)
        with pytest.raises(error) as info:
            call()
        assert all_snapshots(self.table) == before
        return info

    # ------------------------------------------------------------------ rules

    @rule(dt=st.sampled_from([0.0, 1.0, 1.0, 2.0, 5.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        key=st.none() | st.sampled_from(["k1", "k2", "k3"]),
        delay=DELAY,
        priority=st.sampled_from([-1, 0, 0, 1, 2]),
        max_attempts=st.integers(min_value=1, max_value=3),
    )
    def add(self, key: str | None, delay: float, priority: int, max_attempts: int) -> None:
        job_id = f"j{len(self.ids)}"
        run_at = self.now + delay
        holder = self.live_key_holder(key) if key is not None else None
        before = all_snapshots(self.table)
        entry, created = self.table.add(
            job_id,
            "t",
            {"n": len(self.ids)},
            priority=priority,
            key=key,
            max_attempts=max_attempts,
            run_at=run_at,
            now=self.now,
        )
        if holder is not None:
            assert created is False
            assert entry.id == holder.id
            assert all_snapshots(self.table) == before
            return
        assert created is True
        assert entry.id == job_id
        state = SCHEDULED if run_at > self.now else READY
        assert entry.state is state
        self.ids.append(job_id)
        self.model[job_id] = Model(job_id, state, priority, key, max_attempts, run_at, self.seq)
        self.seq += 1

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX)
    def add_duplicate_id(self, idx: int) -> None:
        job_id = self.pick(idx)
        if job_id not in self.model:
            return  # an evicted id may be reused by the table; not this test's business
        now = self.now
        self.refuses(
            InvalidJob,
            lambda: self.table.add(job_id, "t", {}, priority=0, key=None, max_attempts=1, run_at=now, now=now),
        )

    @rule()
    def claim_next(self) -> None:
        expected = self.best()
        entry = self.table.claim_next(self.now)
        self.model_promote()
        if expected is None:
            assert entry is None
            return
        assert entry is not None
        assert entry.id == expected.id, (entry.id, expected.id)
        assert entry.state is RUNNING
        expected.state = RUNNING
        expected.epoch += 1
        assert entry.epoch == expected.epoch
        assert entry.id not in self.blocked

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX)
    def claim_direct(self, idx: int) -> None:
        """The replay path: claim a named ready or scheduled job."""
        job_id = self.pick(idx)
        job = self.model.get(job_id)
        if job is None:
            self.refuses(JobNotFound, lambda: self.table.claim(job_id))
            return
        if job.state not in (READY, SCHEDULED):
            self.refuses(InvalidJob, lambda: self.table.claim(job_id))
            return
        entry = self.table.claim(job_id)
        job.state = RUNNING
        job.epoch += 1
        assert entry.epoch == job.epoch

    def _complete(self, idx: int, shift: int, op: str, retry_delay: float = 0.0) -> None:
        job_id = self.pick(idx)
        job = self.model.get(job_id)
        if job is None:
            assert self.table.release(job_id, 1) is None
            assert self.table.succeed(job_id, 1, None, self.now) is None
            return
        epoch = job.epoch + shift
        before = all_snapshots(self.table)
        counts = self.table.counts()
        retry_at = self.now + retry_delay
        if op == "succeed":
            out = self.table.succeed(job_id, epoch, {"ok": epoch}, self.now)
        elif op == "fail":
            out = self.table.fail(job_id, epoch, f"E: {epoch}", retry_at, self.now)
        else:
            out = self.table.release(job_id, epoch)
        if job.state is not RUNNING or shift != 0:
            assert out is None
            self.expect_unchanged(before, counts)
            return
        assert out is not None and out.id == job_id
        if op == "succeed":
            job.attempts += 1
            self.finish(job, SUCCEEDED)
        elif op == "fail":
            job.attempts += 1
            if job.attempts >= job.max_attempts:
                self.finish(job, DEAD)
            else:
                job.run_at = retry_at
                job.state = SCHEDULED if retry_at > self.now else READY
        else:
            job.state = READY

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX, shift=EPOCH_SHIFT)
    def succeed(self, idx: int, shift: int) -> None:
        self._complete(idx, shift, "succeed")

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX, shift=EPOCH_SHIFT, retry_delay=DELAY)
    def fail(self, idx: int, shift: int, retry_delay: float) -> None:
        self._complete(idx, shift, "fail", retry_delay)

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX, shift=EPOCH_SHIFT)
    def release(self, idx: int, shift: int) -> None:
        self._complete(idx, shift, "release")

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX)
    def cancel(self, idx: int) -> None:
        job_id = self.pick(idx)
        job = self.model.get(job_id)
        if job is None:
            self.refuses(JobNotFound, lambda: self.table.cancel(job_id, self.now))
            return
        before = all_snapshots(self.table)
        entry, changed, running_epoch = self.table.cancel(job_id, self.now)
        if job.state in TERMINAL:
            assert changed is False
            assert running_epoch is None
            assert all_snapshots(self.table) == before
            return
        assert changed is True
        assert entry.state is CANCELLED
        assert running_epoch == (job.epoch if job.state is RUNNING else None)
        self.finish(job, CANCELLED)

    @precondition(lambda self: bool(self.ids))
    @rule(idx=IDX)
    def retry(self, idx: int) -> None:
        job_id = self.pick(idx)
        job = self.model.get(job_id)
        if job is None:
            self.refuses(JobNotFound, lambda: self.table.retry(job_id, self.now))
            return
        if job.state not in (DEAD, CANCELLED):
            info = self.refuses(InvalidJob, lambda: self.table.retry(job_id, self.now))
            assert info.value.field == "state"
            return
        entry = self.table.retry(job_id, self.now)
        assert entry.state is READY
        self.terminal_order.remove(job_id)
        self.blocked.discard(job_id)
        job.state = READY
        job.attempts = 0
        job.finished_at = None
        job.run_at = self.now

    @precondition(lambda self: self.ids)
    @rule(idx=IDX)
    def drop(self, idx: int) -> None:
        """Replay of a DROP record: a terminal job forgotten, out of retention order."""
        job_id = self.pick(idx)
        job = self.model.get(job_id)
        if job is None:
            self.refuses(JobNotFound, lambda: self.table.drop(job_id))
        elif job.state not in TERMINAL:
            self.refuses(InvalidJob, lambda: self.table.drop(job_id))
        else:
            self.table.drop(job_id)
            self.forget(job_id)

    @rule()
    def promote(self) -> None:
        assert self.table.promote(self.now) == self.model_promote()

    @rule()
    def evict(self) -> None:
        cutoff = self.now - self.table.retention
        excess = len(self.terminal_order) - self.table.max_retained
        expected = []
        for job_id in self.terminal_order:
            finished = self.model[job_id].finished_at
            assert finished is not None
            if excess <= 0 and finished > cutoff:
                break
            expected.append(job_id)
            excess -= 1
        assert self.table.evict(self.now) == expected
        for job_id in expected:
            self.forget(job_id)
        # After evict nothing retained is past retention.
        for job in self.model.values():
            if job.state in TERMINAL:
                assert job.finished_at is not None and job.finished_at > cutoff

    # ------------------------------------------------------------- invariants

    @rule()
    def checkpoint(self) -> None:
        """A WAL checkpoint replayed: every job exported, the table cleared and rebuilt.

        Claim order, retention order (hence eviction order), keys and counts
        must all survive it: the invariants below check the rebuilt table.
        """
        rows = self.table.export()
        self.table.clear()
        for row in rows:
            self.table.restore(*row)

    @invariant()
    def matches_model(self) -> None:
        table = self.table
        assert {e.id for e in table.entries()} == set(self.model)
        for job in self.model.values():
            snap = table.get(job.id)
            assert snap.state is job.state, (job.id, snap.state, job.state)
            assert snap.epoch == job.epoch
            assert snap.attempts == job.attempts
            assert snap.run_at == job.run_at
            assert snap.priority == job.priority
            assert snap.key == job.key
            assert snap.finished_at == job.finished_at

    @invariant()
    def consistent(self) -> None:
        check_consistent(self.table)

    @invariant()
    def epochs_never_decrease(self) -> None:
        for entry in self.table.entries():
            assert entry.epoch >= self.max_epoch.get(entry.id, 0)
            self.max_epoch[entry.id] = entry.epoch

    @invariant()
    def terminal_jobs_stay_off_running(self) -> None:
        for entry in self.table.entries():
            if entry.id in self.blocked:
                assert entry.state.terminal

    @invariant()
    def retained_bound(self) -> None:
        terminal = sum(1 for e in self.table.entries() if e.state.terminal)
        assert terminal <= self.table.max_retained
        assert terminal == len(self.terminal_order)

    @invariant()
    def keys_map_to_live_jobs(self) -> None:
        for key in ("k1", "k2", "k3"):
            entry = self.table.by_key(key)
            holder = self.live_key_holder(key)
            if holder is None:
                assert entry is None
            else:
                assert entry is not None and entry.id == holder.id
                assert self.table.entry(entry.id) is entry

    @invariant()
    def next_run_at_is_earliest_scheduled(self) -> None:
        scheduled = [j.run_at for j in self.model.values() if j.state is SCHEDULED]
        assert self.table.next_run_at() == (min(scheduled) if scheduled else None)


TableMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTableMachine = TableMachine.TestCase


class SmallChunkTableMachine(TableMachine):
    """The same, with no slack in the compaction thresholds: every rebuild path runs often."""

    def __init__(self) -> None:
        super().__init__()
        self._chunk = _table.CHUNK
        _table.CHUNK = 0  # read by _compact_retention and _push at call time

    def teardown(self) -> None:
        _table.CHUNK = self._chunk


SmallChunkTableMachine.TestCase.settings = TableMachine.TestCase.settings
TestSmallChunkTableMachine = SmallChunkTableMachine.TestCase


def test_jobs_are_invisible_to_the_cyclic_gc() -> None:
    """A large table must not be rescanned by every full collection, in any state.

    The id -> entry dict stays untracked only while every value is: one tracked
    entry would make each collection of the oldest generation visit them all.
    """
    import gc

    table = JobTable()
    add(table, "a", payload={"to": "x", "n": 3})
    add(table, "b", now=0.0, run_at=10.0)
    add(table, "c")
    assert not gc.is_tracked(table._jobs)
    assert not any(gc.is_tracked(entry) for entry in table._jobs.values())
    table.promote(10.0)
    claimed = table.claim_next(10.0)
    assert claimed is not None and claimed.id == "a" and table.entry("a") is claimed
    done = table.succeed("a", claimed.epoch, {"result": ["with", "a", "list"]}, now=11.0)
    assert done is not None
    table.cancel("c", now=11.0)
    assert table.get("b").state is JobState.READY
    assert not gc.is_tracked(table._jobs)
    assert not any(gc.is_tracked(entry) for entry in table._jobs.values())
    check_consistent(table)


def test_a_dropped_table_frees_every_job() -> None:
    """Entries are invisible to the GC, so no reference cycle may run through one.

    An entry that held its queue item (which holds the entry) would be such a
    cycle: every job of a discarded table leaked (~290 bytes each).
    """
    import gc
    import tracemalloc

    def fill_and_drop() -> None:
        table = JobTable(max_retained=1_000)
        for i in range(5_000):
            add(table, f"j{i}", run_at=float(i % 3) * 10.0)  # ready and scheduled
        table.promote(10.0)
        for _ in range(2_500):
            entry = table.claim_next(10.0)
            assert entry is not None
            table.succeed(entry.id, entry.epoch, {"n": 1}, now=11.0)  # retained, then evicted
        table.cancel("j4999", now=12.0)
        table.claim_next(10.0)  # one left running

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill_and_drop()
        gc.collect()
        leaked = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert leaked < 64 * 1024, f"{leaked} bytes still held after the table was dropped"


def test_a_forgotten_job_leaves_only_a_shell_behind_in_stale_items() -> None:
    """Cancelled scheduled jobs wait in the heap until their run_at; evicted, they must not pin payloads."""
    import gc
    import tracemalloc

    table = JobTable(max_retained=0)  # every finished job is forgotten at once
    add(table, "head", run_at=1.0)  # a live job at the heap's head keeps the stale ones in
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1_000):
            add(table, f"j{i}", run_at=100.0, payload={"blob": "x" * 4_000})
            table.cancel(f"j{i}", now=0.0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == 1
    assert held < 1_000_000, f"{held} bytes held for 1,000 forgotten jobs of 4 KB payload each"


def test_retrying_a_job_again_and_again_keeps_the_retention_queue_bounded() -> None:
    from trioq.stores.table.ready import CHUNK

    table = JobTable()
    add(table, "a", max_attempts=1)
    for i in range(3 * CHUNK):
        entry = table.claim_next(float(i))
        assert entry is not None
        table.fail("a", entry.epoch, "E: x", retry_at=0.0, now=float(i))  # dead at once
        table.retry("a", now=float(i))
    assert len(table._terminal) <= CHUNK + 1
    check_consistent(table)


def test_a_checkpoint_keeps_the_retention_order() -> None:
    """Export, clear and restore (a WAL checkpoint replayed) must evict in finish order after."""
    table = JobTable(retention=100.0, max_retained=10)
    for name in ("a", "b", "c"):
        add(table, name)
    for name, finished in (("b", 1.0), ("c", 2.0), ("a", 3.0)):  # finish order b, c, a
        table.claim(name)
        table.succeed(name, table.entry(name).epoch, None, now=finished)
    rows = table.export()
    table.clear()
    for row in rows:
        table.restore(*row)
    table.max_retained = 1
    assert table.evict(now=4.0) == ["b", "c"]
    check_consistent(table)


def test_restore_keeps_what_an_older_trioq_kept_past_todays_limits() -> None:
    # A checkpoint written before the limits holds such a job: replay must not refuse it.
    from trioq._model import MAX_DEPTH

    deep: object = 0
    for _ in range(MAX_DEPTH + 50):
        deep = [deep]
    table = JobTable()
    row = ("j1", "t", {"a": deep}, "succeeded", 0, None, 3, 1.0, 1.0, 0, 1, 1, 2.0, deep, None)
    table.restore(*row)
    assert table.get("j1").payload == {"a": deep} and table.get("j1").result == deep


def test_queues_used_once_and_rate_states_run_out_are_forgotten() -> None:
    """A queue name used once, once drained, costs later claims nothing; a rate state whose time has
    passed is dropped (a per-user key must not stay for ever)."""
    from trioq._model import Limit

    table = JobTable()
    table.limits.limit_of = lambda key: Limit(key, rate=1.0)
    for i in range(100):
        table.add_packed(f"q{i}", "t", b"", 0, None, 3, 0.0, 0.0, f"queue-{i}", None, None, (f"user:{i}",))
    while (entry := table.claim_next(1.0)) is not None:
        table.succeed(entry.id, entry.epoch, None, 1.0)
    assert table.claim_next(1.0) is None
    assert len(table._queues) <= 1
    assert len(table.limits.tat) == 100
    table.promote(10.0)
    assert table.limits.tat == {}


def test_a_job_let_go_for_a_slot_gives_it_up_when_its_queue_is_paused() -> None:
    """A freed slot promised to a parked job whose queue is then paused goes to the next job in line
    (of a queue still running), not to nobody until the resume."""
    from trioq._model import Limit

    table = JobTable()
    table.limits.limit_of = lambda key: Limit(key, max=1)
    for job_id, queue in (("holder", "a"), ("first", "a"), ("second", "b")):
        table.add_packed(job_id, "t", b"", 0, None, 3, 0.0, 0.0, queue, None, None, ("mutex",))
    holder = table.claim_next(1.0)
    assert holder is not None and holder.id == "holder"
    assert table.claim_next(1.0) is None  # first and second are parked on the mutex
    table.succeed("holder", holder.epoch, None, 1.0)  # its slot is promised to "first"
    assert table.pause("a")
    got = table.claim_next(1.0)
    assert got is not None and got.id == "second"
    table.succeed("second", got.epoch, None, 1.0)
    assert table.resume("a")
    got = table.claim_next(1.0)
    assert got is not None and got.id == "first"


def test_list_jobs_walks_newest_first_and_scans_when_the_order_does_not_hold() -> None:
    """A page is the newest jobs taken, enqueue order; held in another order (which no path makes
    today), the walk notices and the page is the same."""
    table = JobTable()
    for n in range(20):
        table.add(f"j{n:02d}", "t", {}, 0, None, 3, 10.0, 10.0, queue="even" if n % 2 == 0 else "odd")
    newest = [job.id for job in table.list_jobs((), None, "even", None, 3, None)]
    assert newest == ["j18", "j16", "j14"]
    assert [job.id for job in table.list_jobs((), None, "even", None, 3, "j14")] == ["j12", "j10", "j08"]
    jobs = table._jobs  # reorder: an old job last, as if a replay had inserted it late
    jobs["j04"] = jobs.pop("j04")
    assert [job.id for job in table.list_jobs((), None, "even", None, 3, None)] == newest
    assert [job.id for job in table.list_jobs((READY,), None, None, None, 25, "j05")] == [
        "j04",
        "j03",
        "j02",
        "j01",
        "j00",
    ]
