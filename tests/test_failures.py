"""What users see of failures: NoRetry, Snooze, ``no_retry=``, unstorable results, ``Job.errors``, logs."""

from __future__ import annotations

import logging
import math
import pickle

import pytest
import trio
import trio.testing

import trioq
from trioq import JobState
from trioq._model import MAX_ERRORS_KEPT, MAX_SNOOZES
from trioq.stores.table import jobs as table_module

from .handlers import no_retry_in_a_process, snooze_in_a_process


def _registry() -> trioq.Registry:
    registry = trioq.Registry()
    backoff = trioq.Backoff(base=1.0, factor=1.0, jitter=0.0)

    @registry.task(max_attempts=5, backoff=backoff)
    async def gives_up(ctx: trioq.JobContext) -> None:
        raise trioq.NoRetry("the order does not exist")

    @registry.task(max_attempts=5, backoff=backoff, no_retry=(KeyError, LookupError))
    async def lookup(ctx: trioq.JobContext, fail_with: str) -> None:
        raise {"key": KeyError("k"), "index": IndexError("i"), "value": ValueError("v")}[fail_with]

    @registry.task(max_attempts=2, backoff=backoff)
    async def snoozes(ctx: trioq.JobContext, times: int) -> str:
        if ctx.job.attempts == 0 and ctx.job.epoch <= times:
            raise trioq.Snooze(5.0)
        return f"ran at epoch {ctx.job.epoch}"

    @registry.task(max_attempts=3, backoff=backoff)
    async def unstorable(ctx: trioq.JobContext) -> object:
        return {"when": object()}

    @registry.task(max_attempts=3, backoff=backoff)
    async def always_fails(ctx: trioq.JobContext) -> None:
        raise RuntimeError(f"failure {ctx.attempt}")

    @registry.task(max_attempts=3, backoff=backoff)
    async def bad_snooze(ctx: trioq.JobContext) -> None:
        raise trioq.Snooze(math.nan)

    @registry.task(max_attempts=3, backoff=backoff)
    async def grouped_no_retry(ctx: trioq.JobContext) -> None:
        raise ExceptionGroup("two", [trioq.NoRetry("a"), trioq.NoRetry("b")])

    @registry.task(max_attempts=3, backoff=backoff)
    async def mixed_group(ctx: trioq.JobContext) -> None:
        raise ExceptionGroup("two", [trioq.NoRetry("a"), ValueError("b")])

    registry.add(no_retry_in_a_process, kind="process", max_attempts=4, backoff=backoff)
    registry.add(snooze_in_a_process, kind="process", max_attempts=4, backoff=backoff)
    return registry


async def test_no_retry_is_dead_at_once_and_counts_the_attempt(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=2) as queue:
        job = await queue.wait((await queue.enqueue("gives_up")).id)
        stats = await queue.stats()
    assert job.state is JobState.DEAD and job.attempts == 1
    assert job.error == "NoRetry: the order does not exist"
    assert stats["totals"]["dead"] == 1 and stats["totals"]["retried"] == 0


@pytest.mark.parametrize(("fail_with", "attempts"), [("key", 1), ("index", 1), ("value", 5)])
async def test_no_retry_types_go_straight_to_dead(
    fail_with: str, attempts: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with trioq.open_queue(_registry(), workers=2) as queue:
        job = await queue.wait((await queue.enqueue("lookup", {"fail_with": fail_with})).id)
    assert job.state is JobState.DEAD and job.attempts == attempts  # IndexError is a LookupError


async def test_a_group_of_no_retries_is_no_retry_but_a_mixed_group_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trioq.open_queue(_registry(), workers=2) as queue:
        grouped = await queue.wait((await queue.enqueue("grouped_no_retry")).id)
        mixed = await queue.wait((await queue.enqueue("mixed_group")).id)
    assert grouped.state is JobState.DEAD and grouped.attempts == 1
    assert mixed.state is JobState.DEAD and mixed.attempts == 3


async def test_snooze_runs_again_later_without_counting(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=2) as queue:
        start = trio.current_time()
        job = await queue.wait((await queue.enqueue("snoozes", {"times": 3})).id)
        elapsed = trio.current_time() - start
        stats = await queue.stats()
    assert job.state is JobState.SUCCEEDED and job.attempts == 1 and job.error is None and job.errors == ()
    assert job.result == "ran at epoch 4"  # three snoozes, then the fourth claim ran it
    assert 15.0 <= elapsed < 16.0
    assert stats["totals"]["snoozed"] == 3 and stats["totals"]["failed_attempts"] == 0


async def test_a_snooze_with_a_bad_delay_fails_the_attempt(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.wait((await queue.enqueue("bad_snooze")).id)
    assert job.state is JobState.DEAD and job.attempts == 3
    assert job.error is not None and job.error.startswith("InvalidJob: trioq.Snooze seconds must be a finite number")


async def test_endless_snoozing_is_bounded(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_module, "MAX_SNOOZES", 3)
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.wait((await queue.enqueue("snoozes", {"times": 100})).id)
        stats = await queue.stats()
    assert job.state is JobState.DEAD and job.attempts == 1
    assert job.error is not None and job.error.startswith("SnoozeLimit: the job snoozed 3 times")
    assert stats["totals"]["snoozed"] == 3 and stats["totals"]["dead"] == 1  # the fourth killed it
    assert MAX_SNOOZES == 1000  # the real bound, untouched by the patch above


async def test_an_unstorable_result_is_dead_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.wait((await queue.enqueue("unstorable")).id)
    assert job.state is JobState.DEAD and job.attempts == 1
    assert job.error is not None and job.error.startswith("InvalidJob: ")
    assert len(job.errors) == 1 and job.errors[0].error == job.error


async def test_job_errors_keep_each_failed_attempt_with_its_traceback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        job = await queue.wait((await queue.enqueue("always_fails")).id)
        assert [e.attempt for e in job.errors] == [1, 2, 3]
        assert [e.error for e in job.errors] == [f"RuntimeError: failure {n}" for n in (1, 2, 3)]
        for entry in job.errors:
            assert entry.traceback is not None and "in always_fails" in entry.traceback
            assert entry.traceback.rstrip().endswith(entry.error)
            assert entry.finished_at > 0
        assert job.error == job.errors[-1].error
        assert job.to_dict()["errors"][0]["attempt"] == 1
        # Kept across a retry, bounded to the last MAX_ERRORS_KEPT.
        for _ in range(4):
            await queue.retry(job.id)
            job = await queue.wait(job.id)
    assert len(job.errors) == MAX_ERRORS_KEPT
    assert [e.error for e in job.errors][-3:] == [f"RuntimeError: failure {n}" for n in (1, 2, 3)]


async def test_process_handlers_can_snooze_and_give_up() -> None:
    async with trioq.open_queue(_registry(), workers=1) as queue:
        gave_up = await queue.wait((await queue.enqueue("no_retry_in_a_process")).id, timeout=60)
        snoozed = await queue.wait((await queue.enqueue("snooze_in_a_process")).id, timeout=60)
    assert gave_up.state is JobState.DEAD and gave_up.attempts == 1 and gave_up.error == "NoRetry: from a process"
    assert snoozed.state is JobState.SUCCEEDED and snoozed.attempts == 1 and snoozed.epoch == 2


def test_snooze_survives_pickling_with_its_seconds() -> None:
    again = pickle.loads(pickle.dumps(trioq.Snooze(2.5)))
    assert isinstance(again, trioq.Snooze) and again.seconds == 2.5
    assert pickle.loads(pickle.dumps(trioq.NoRetry("why"))).reason == "why"


def test_no_retry_must_name_exception_types() -> None:
    registry = trioq.Registry()

    async def handler(ctx: trioq.JobContext) -> None: ...

    with pytest.raises(TypeError, match="no_retry must be an exception type"):
        registry.add(handler, no_retry=(ValueError, "KeyError"))  # type: ignore[arg-type]
    assert registry.add(handler, no_retry=ValueError).no_retry == (ValueError,)


async def test_failures_are_logged_with_structured_fields(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trioq")
    async with trioq.open_queue(_registry(), workers=1) as queue:
        failing = await queue.wait((await queue.enqueue("always_fails")).id)
        snoozing = await queue.wait((await queue.enqueue("snoozes", {"times": 1})).id)
    mine = [r for r in caplog.records if getattr(r, "job_id", None) == failing.id]
    levels = [r.levelname for r in mine]
    assert levels == ["DEBUG", "WARNING", "DEBUG", "WARNING", "DEBUG", "ERROR"]  # start, fail x2, start, dead
    warning = next(r for r in mine if r.levelname == "WARNING")
    assert warning.task == "always_fails" and warning.attempt == 1 and warning.epoch == 1  # type: ignore[attr-defined]
    assert warning.queue == "default" and warning.duration >= 0  # type: ignore[attr-defined]
    assert warning.error == "RuntimeError: failure 1"  # type: ignore[attr-defined]
    assert "Traceback" in warning.getMessage() and "runs again in 1s" in warning.getMessage()
    dead = mine[-1]
    assert "is dead after attempt 3" in dead.getMessage() and "failure 3" in dead.getMessage()
    snoozed = [r for r in caplog.records if getattr(r, "job_id", None) == snoozing.id]
    assert [r.levelname for r in snoozed] == ["DEBUG"] * 4  # start, snoozed, start, succeeded
    assert "snoozed for 5s" in snoozed[1].getMessage() and "succeeded in" in snoozed[3].getMessage()


async def test_nothing_below_warning_is_logged_by_default(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioq")
    async with trioq.open_queue(_registry(), workers=1) as queue:
        await queue.wait((await queue.enqueue("snoozes", {"times": 1})).id)
    assert [r for r in caplog.records if r.name == "trioq"] == []
