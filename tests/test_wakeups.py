"""The timerfd wake-ups (trioq._runtime.wakeups): armed for the next deadline only, one per run, gone after."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import trioq
from trioq._runtime import wakeups as _wakeups
from trioq._runtime.wakeups import Timerfd, _ArmForNextDeadline

linux_only = pytest.mark.skipif(_wakeups._libc is None, reason="timerfd is Linux-only")


def real_clock(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A test on the real clock: Linux only, and cut off after 10 s instead of hanging the suite."""

    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> None:
        with trio.fail_after(10):
            await test(*args, **kwargs)

    return linux_only(bounded)


class RecordingTimer:
    """Stands in for Timerfd: records what the instrument asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.armed_for: float | None = None

    def arm(self, seconds: float, deadline: float) -> None:
        self.calls.append(("arm", seconds))
        self.armed_for = deadline

    def disarm(self) -> None:
        self.calls.append(("disarm", 0.0))
        self.armed_for = None


def hook_with(deadline: float, now: float = 100.0) -> tuple[_ArmForNextDeadline, RecordingTimer]:
    timer = RecordingTimer()
    return _ArmForNextDeadline(timer, lambda: (deadline, now)), timer  # type: ignore[arg-type]


def test_arms_once_for_the_deadline_the_loop_waits_for() -> None:
    hook, timer = hook_with(deadline=105.0)
    hook.before_io_wait(0)  # tasks are runnable: nothing to arm
    hook.before_io_wait(5.0)  # the loop's wait ends at the deadline
    hook.before_io_wait(5.0)  # woken by I/O, waiting again for the same deadline
    assert timer.calls == [("arm", 5.0)]


def test_a_wait_shorter_than_the_deadline_arms_nothing_and_disarms() -> None:
    # The loop waits less than the time to the next deadline when
    # wait_all_tasks_blocked has a cushion: a timer firing as the cushion ends
    # would make the loop look busy forever.
    hook, timer = hook_with(deadline=105.0)
    hook.before_io_wait(5.0)
    hook.before_io_wait(0.01)
    hook.before_io_wait(0.01)  # already disarmed: no second call
    assert [kind for kind, _ in timer.calls] == ["arm", "disarm"]


def test_a_deadline_that_just_passed_is_armed_for_a_nanosecond() -> None:
    # trio computed a sliver of a timeout; epoll would round it up to 1 ms.
    hook, timer = hook_with(deadline=99.9999)
    hook.before_io_wait(0.000001)
    assert timer.calls == [("arm", 1e-9)]


def test_no_deadline_arms_nothing() -> None:
    hook, timer = hook_with(deadline=math.inf)
    hook.before_io_wait(86400.0)  # trio's cap on an unbounded wait
    assert timer.calls == []


async def test_the_deadline_reader_reads_trio_directly_and_agrees_with_its_statistics() -> None:
    read = _wakeups._deadline_reader()
    assert read.__name__ != "public", "trio moved its deadline heap: the hook now walks every fd per wait"
    deadline = trio.current_time() + 7.5
    with trio.CancelScope(deadline=deadline):  # noqa: ASYNC100 (it only sets a deadline)
        next_deadline, now = read()
        assert next_deadline == deadline
        statistics = trio.lowlevel.current_statistics()
        assert next_deadline - now == pytest.approx(statistics.seconds_to_next_deadline, abs=0.01)


@real_clock
async def test_the_timerfd_fires_once_armed_and_is_quiet_once_disarmed() -> None:
    timer = Timerfd()
    try:
        timer.arm(0.002, 1.0)
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(timer.fd)
        timer.consume()
        assert timer.armed_for is None
        timer.consume()  # nothing left to read: no error
        timer.arm(0.002, 2.0)
        timer.disarm()
        with trio.move_on_after(0.05) as waited:
            await trio.lowlevel.wait_readable(timer.fd)
        assert waited.cancelled_caught, "a disarmed timerfd fired"
    finally:
        timer.close()
        timer.close()  # idempotent


def _instrument_hooks() -> set[str]:
    """The hooks some instrument of this run has (trio has no public way to list them)."""
    runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
    return {hook for hook, installed in runner.instruments.data.items() if installed}


@real_clock
async def test_a_queue_wakes_its_sleepers_through_the_timerfd(monkeypatch: pytest.MonkeyPatch) -> None:
    armed: list[float] = []
    consumed: list[float | None] = []
    arm, consume = Timerfd.arm, Timerfd.consume

    def recording_arm(self: Timerfd, seconds: float, deadline: float) -> None:
        armed.append(deadline)
        arm(self, seconds, deadline)

    def recording_consume(self: Timerfd) -> None:
        consumed.append(self.armed_for)
        consume(self)

    monkeypatch.setattr(Timerfd, "arm", recording_arm)
    monkeypatch.setattr(Timerfd, "consume", recording_consume)
    async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
        deadlines = []
        for _ in range(3):
            deadlines.append(trio.current_time() + 0.003)
            await trio.sleep_until(deadlines[-1])
    # Each of this task's deadlines was armed, and the fd woke the loop for it.
    assert set(deadlines) <= set(armed)
    assert set(deadlines) <= set(consumed)


@real_clock
async def test_one_service_per_run_whatever_order_queues_close_in() -> None:
    registry = trioq.Registry()
    assert _wakeups.supported()
    first_open = trio.Event()
    first_may_close = trio.Event()
    first_closed = trio.Event()

    async def first() -> None:
        async with trioq.open_queue(registry, workers=1, precise_timers=True):
            first_open.set()
            await first_may_close.wait()
        first_closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await first_open.wait()
        service = _wakeups._service.get()
        assert service is not None and service.users == 1
        async with trioq.open_queue(registry, workers=1, precise_timers=True):
            assert _wakeups._service.get() is service and service.users == 2
            first_may_close.set()
            await first_closed.wait()
            # The queue that started the service closed first: it still serves this one.
            assert _wakeups._service.get() is service and service.users == 1
            assert not service.ended.is_set()
            assert "before_io_wait" in _instrument_hooks()
    assert _wakeups._service.get() is None
    assert service.ended.is_set() and service.timer.fd == -1
    assert "before_io_wait" not in _instrument_hooks()


async def test_not_under_a_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    # Virtual deadlines are no real time to arm a timer for.
    assert not _wakeups.supported()
    async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
        assert _wakeups._service.get() is None
        await trio.sleep(10.0)  # jumps: the loop still looks idle


@real_clock
async def test_wait_all_tasks_blocked_with_a_cushion_still_returns() -> None:
    async with trioq.open_queue(trioq.Registry(), workers=2, precise_timers=True):
        assert _wakeups._service.get() is not None
        with trio.fail_after(5):
            # A deadline further off than the cushion: the loop waits the
            # cushion, and must then see itself idle.
            with trio.CancelScope(deadline=trio.current_time() + 30.0):
                await trio.testing.wait_all_tasks_blocked(cushion=0.02)


@real_clock
async def test_a_failing_hook_is_dropped_by_trio_and_the_queue_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: Timerfd, seconds: float, deadline: float) -> None:
        raise OSError("timerfd_settime refused")

    monkeypatch.setattr(Timerfd, "arm", refuse)
    with caplog.at_level(logging.ERROR):
        async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
            await trio.sleep(0.005)  # the loop blocks until a deadline: the hook raises
            assert "before_io_wait" not in _instrument_hooks()
    assert "timerfd_settime refused" in caplog.text
    assert _wakeups._service.get() is None


@real_clock
async def test_a_failing_reader_is_logged_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A system task's exception would crash the whole run (TrioInternalError).
    def refuse(self: Timerfd) -> None:
        raise OSError("read refused")

    monkeypatch.setattr(Timerfd, "consume", refuse)
    with caplog.at_level(logging.ERROR, logger="trioq"):
        async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
            service = _wakeups._service.get()
            assert service is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep, 0.003)  # the next deadline: the timer fires for it
                with trio.fail_after(5):
                    await service.ended.wait()  # the first expiry's read fails and ends it
            assert "before_io_wait" not in _instrument_hooks()
            await trio.sleep(0.005)
    assert "precise timer wake-ups stopped" in caplog.text
    assert _wakeups._service.get() is None


@real_clock
async def test_no_timerfd_no_service(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Timerfd) -> None:
        raise OSError(1, "timerfd_create: Operation not permitted")

    monkeypatch.setattr(Timerfd, "__init__", refuse)
    async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
        assert _wakeups._service.get() is None
        await trio.sleep(0.002)


@real_clock
async def test_a_run_that_takes_no_new_system_task_gets_no_service_and_keeps_no_fd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At the end of a run (an async generator closed by trio) the system
    # nursery refuses new tasks: nothing may be left installed or open.
    made: list[Timerfd] = []
    init = Timerfd.__init__

    def recording_init(self: Timerfd) -> None:
        init(self)
        made.append(self)

    def closed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Nursery is closed to new arrivals")

    monkeypatch.setattr(Timerfd, "__init__", recording_init)
    monkeypatch.setattr(trio.lowlevel, "spawn_system_task", closed)
    async with trioq.open_queue(trioq.Registry(), workers=1, precise_timers=True):
        assert _wakeups._service.get() is None
        assert "before_io_wait" not in _instrument_hooks()
        await trio.sleep(0.002)
    assert len(made) == 1 and made[0].fd == -1


@real_clock
async def test_off_unless_asked_for_a_library_must_not_change_its_hosts_timers() -> None:
    assert _wakeups.supported()
    async with trioq.open_queue(trioq.Registry(), workers=1):
        assert _wakeups._service.get() is None
        assert "before_io_wait" not in _instrument_hooks()
    with pytest.raises(TypeError, match="precise_timers"):
        async with trioq.open_queue(trioq.Registry(), precise_timers="yes"):  # type: ignore[arg-type]
            pass  # pragma: no cover
