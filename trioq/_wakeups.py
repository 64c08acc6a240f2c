"""Timer wake-ups on time: a timerfd armed for trio's next deadline (Linux).

trio waits for I/O with ``epoll.poll(timeout)``, and CPython rounds that
timeout *up* to whole milliseconds. A task whose deadline is 19.2 ms away is
woken at 20 ms, and every deadline reached between two milliseconds pays the
rest of the millisecond. For a worker that sleeps 20 ms per job that is ~2-5 %
of its throughput, paid again on every job.

:func:`run_precise_wakeups` closes that gap while a queue is open. An
instrument's ``before_io_wait`` hook arms a timerfd (nanosecond resolution) for
the time left to the run's next deadline, and a task waits on the timerfd's
readability; epoll then returns when the deadline passes, not at the next
whole millisecond. The machine's own wake-up latency (~0.1-0.3 ms on our VMs)
remains.

It arms only when the loop is about to block *until a deadline*:

- ``timeout == 0`` (tasks are runnable): nothing to do, the hook returns.
- The loop waits for a shorter time than the next deadline (the cushion of
  ``trio.testing.wait_all_tasks_blocked``): the fd must not fire then, or the
  loop would never look idle. Any timer still armed is disarmed.
- No deadline at all: nothing to arm.

It is enabled only under trio's own ``SystemClock`` on 64-bit Linux with a libc
that has ``timerfd_create``. A ``MockClock`` (autojump) measures virtual time, so
a real timer there would keep the loop from ever looking idle. Elsewhere (or
when the fd cannot be created) the queue simply runs without it. One run gets
one: a second queue opened while the first is open relies on the first's, and
loses it when the first closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

import trio

_CLOCK_MONOTONIC = 1  # trio's SystemClock reads time.perf_counter(): CLOCK_MONOTONIC on Linux
_active: trio.lowlevel.RunVar[bool] = trio.lowlevel.RunVar("trioq_precise_wakeups", default=False)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    """libc with ``timerfd_create``/``timerfd_settime`` typed, or None where there is none."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return libc


_libc = _load_libc()


class Timerfd:
    """A non-blocking CLOCK_MONOTONIC timerfd, armed relative to now."""

    def __init__(self) -> None:
        if _libc is None:
            raise OSError("timerfd is not available on this platform")
        fd: int = _libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_create: {os.strerror(errno)}")
        self.fd = fd
        self.armed = False
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    def arm(self, seconds: float) -> None:
        """Fire once, ``seconds`` (> 0) from now; replaces any earlier arming."""
        whole = int(seconds)
        self._set(whole, int((seconds - whole) * 1e9) or 1)  # (0, 0) would disarm
        self.armed = True

    def disarm(self) -> None:
        self._set(0, 0)
        self.armed = False

    def _set(self, sec: int, nsec: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = sec, nsec
        assert _libc is not None
        if _libc.timerfd_settime(self.fd, 0, self._ref, None) < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_settime: {os.strerror(errno)}")

    def consume(self) -> None:
        """Read the expiry count if it fired (it may have been re-armed since)."""
        with contextlib.suppress(BlockingIOError):  # re-armed since it fired: nothing to read
            os.read(self.fd, 8)
        self.armed = False

    def close(self) -> None:
        os.close(self.fd)


class _ArmForNextDeadline(trio.abc.Instrument):
    """Before each blocking I/O wait, arm the timerfd for the run's next deadline."""

    def __init__(self, timer: Timerfd) -> None:
        self._timer = timer

    def before_io_wait(self, timeout: float) -> None:
        if timeout <= 0:
            return
        left = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if 0 < left <= timeout:
            self._timer.arm(left)
        elif self._timer.armed:
            self._timer.disarm()


def _uses_system_clock() -> bool:
    clock = type(trio.lowlevel.current_clock())
    return clock.__name__ == "SystemClock" and clock.__module__.startswith("trio.")


def supported() -> bool:
    """Whether :func:`run_precise_wakeups` would arm a timer in this run."""
    return _libc is not None and _uses_system_clock()


async def run_precise_wakeups(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Keep deadlines waking on time until cancelled (see the module docstring).

    Reports started at once and returns where it does not apply: another queue
    in this run already runs it, the clock is not trio's ``SystemClock``, or
    there is no timerfd. Cancelled, it removes its instrument and closes its fd.
    """
    if _active.get() or not supported():
        task_status.started()
        return
    try:
        timer = Timerfd()
    except OSError:
        task_status.started()  # e.g. a seccomp filter refusing timerfd_create: run without it
        return
    instrument = _ArmForNextDeadline(timer)
    _active.set(True)
    trio.lowlevel.add_instrument(instrument)
    try:
        task_status.started()
        while True:
            await trio.lowlevel.wait_readable(timer.fd)
            timer.consume()
    finally:
        _active.set(False)
        with contextlib.suppress(KeyError):  # trio removed it already, after logging its hook's error
            trio.lowlevel.remove_instrument(instrument)
        timer.close()
