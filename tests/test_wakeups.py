"""The timerfd wake-ups (trioq._wakeups): armed for the next deadline only, gone after the queue."""

from __future__ import annotations

import logging
import math

import pytest
import trio
import trio.lowlevel
import trio.testing

import trioq
from trioq import _wakeups
from trioq._wakeups import Timerfd, _ArmForNextDeadline, run_precise_wakeups

linux_only = pytest.mark.skipif(_wakeups._libc is None, reason="timerfd is Linux-only")


class RecordingTimer:
    """Stands in for Timerfd: records what the instrument asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.armed = False

    def arm(self, seconds: float) -> None:
        self.calls.append(("arm", seconds))
        self.armed = True

    def disarm(self) -> None:
        self.calls.append(("disarm", 0.0))
        self.armed = False


async def test_arms_for_the_next_deadline_when_the_loop_waits_for_it() -> None:
    timer = RecordingTimer()
    hook = _ArmForNextDeadline(timer)  # type: ignore[arg-type]
    with trio.CancelScope(deadline=trio.current_time() + 5.0):  # noqa: ASYNC100 (it only sets a deadline)
        hook.before_io_wait(5.0)  # the loop's wait ends at that deadline
        hook.before_io_wait(0)  # tasks are runnable: nothing to arm
    assert len(timer.calls) == 1
    kind, seconds = timer.calls[0]
    assert kind == "arm"
    assert 4.9 < seconds <= 5.0


async def test_a_shorter_wait_than_the_deadline_is_not_armed_and_disarms() -> None:
    # The loop waits less than the time to the next deadline when
    # wait_all_tasks_blocked has a cushion: firing then would make the loop
    # look busy forever.
    timer = RecordingTimer()
    hook = _ArmForNextDeadline(timer)  # type: ignore[arg-type]
    with trio.CancelScope(deadline=trio.current_time() + 5.0):  # noqa: ASYNC100 (it only sets a deadline)
        hook.before_io_wait(5.0)
        hook.before_io_wait(0.01)
        hook.before_io_wait(0.01)  # already disarmed: no second call
    assert [kind for kind, _ in timer.calls] == ["arm", "disarm"]


async def test_no_deadline_arms_nothing() -> None:
    timer = RecordingTimer()
    hook = _ArmForNextDeadline(timer)  # type: ignore[arg-type]
    assert math.isinf(trio.lowlevel.current_statistics().seconds_to_next_deadline)
    hook.before_io_wait(86400.0)  # trio's cap on an unbounded wait
    assert timer.calls == []


@linux_only
async def test_the_timerfd_fires_once_armed_and_is_quiet_once_disarmed() -> None:
    timer = Timerfd()
    try:
        timer.arm(0.002)
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(timer.fd)
        timer.consume()
        assert not timer.armed
        timer.consume()  # nothing left to read: no error
        timer.arm(0.002)
        timer.disarm()
        with trio.move_on_after(0.05) as waited:
            await trio.lowlevel.wait_readable(timer.fd)
        assert waited.cancelled_caught, "a disarmed timerfd fired"
    finally:
        trio.lowlevel.notify_closing(timer.fd)
        timer.close()


@linux_only
async def test_a_queue_runs_them_on_the_system_clock_and_leaves_nothing_behind() -> None:
    registry = trioq.Registry()
    assert _wakeups.supported()
    async with trioq.open_queue(registry, workers=1):
        assert _wakeups._active.get()
        async with trioq.open_queue(registry, workers=1):
            assert _wakeups._active.get()  # the first queue's serve both
        assert _wakeups._active.get()
    assert not _wakeups._active.get()
    assert "before_io_wait" not in _instrument_hooks()


def _instrument_hooks() -> set[str]:
    """The hooks some instrument of this run has (trio has no public way to list them)."""
    runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
    return {hook for hook, installed in runner.instruments.data.items() if installed}


async def test_not_under_a_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    # Virtual deadlines are no real time to arm a timer for, and a firing fd
    # would keep the autojump clock from ever seeing the loop idle.
    assert not _wakeups.supported()
    registry = trioq.Registry()
    async with trioq.open_queue(registry, workers=1):
        assert not _wakeups._active.get()
        await trio.sleep(10.0)  # jumps: the loop still looks idle


@linux_only
async def test_wait_all_tasks_blocked_with_a_cushion_still_returns() -> None:
    registry = trioq.Registry()
    async with trioq.open_queue(registry, workers=2):
        assert _wakeups._active.get()
        with trio.fail_after(5):
            # A deadline further off than the cushion (the queue's own timers
            # and this one): the loop waits the cushion, and must see idle.
            with trio.CancelScope(deadline=trio.current_time() + 30.0):
                await trio.testing.wait_all_tasks_blocked(cushion=0.02)


@linux_only
async def test_a_failing_hook_is_dropped_by_trio_and_the_task_still_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: Timerfd, seconds: float) -> None:
        raise OSError("timerfd_settime refused")

    monkeypatch.setattr(Timerfd, "arm", refuse)
    with caplog.at_level(logging.ERROR, logger="trio.abc.Instrument"):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_precise_wakeups)
            await trio.sleep(0.005)  # the loop blocks until a deadline: the hook raises
            assert "before_io_wait" not in _instrument_hooks()
            nursery.cancel_scope.cancel()
    assert "timerfd_settime refused" in caplog.text
    assert not _wakeups._active.get()
