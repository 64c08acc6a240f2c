"""Timer wake-ups on time: a timerfd armed for trio's next deadline (Linux).

trio waits for I/O with ``epoll.poll(timeout)``, and CPython rounds that
timeout *up* to whole milliseconds. A task whose deadline is 19.2 ms away is
woken at 20 ms, and every deadline reached between two milliseconds pays the
rest of the millisecond: up to 5 % of a 20 ms job, paid again on every job
(measured here: 16 trioq workers sleeping 20 ms per job went from 0.92-0.95 of
the ideal rate to 0.98).

:func:`precise_wakeups` closes that gap while a queue is open. An instrument's
``before_io_wait`` hook arms a timerfd (nanosecond resolution) for the run's
next deadline, and a system task waits on the timerfd's readability; epoll then
returns when the deadline passes, not at the next whole millisecond. The
machine's own wake-up latency (~0.1-0.3 ms on our VMs) remains.

The hook arms only when the loop is about to block *until that deadline*:

- ``timeout == 0`` (tasks are runnable): it returns at once.
- The loop blocks for less than the time to the next deadline (the cushion of
  ``trio.testing.wait_all_tasks_blocked``): it arms nothing. Arming for the
  cushion instead would fire as the cushion ends, and a loop that sees an
  event never counts as idle, so ``wait_all_tasks_blocked`` would never
  return. A timer still armed for an earlier deadline is disarmed.
- No deadline at all, or the same deadline as already armed: nothing to do.
- The deadline passed since trio computed the timeout: armed for 1 ns, so the
  wait ends at once rather than at the next whole millisecond.

It runs only under trio's own ``SystemClock`` on 64-bit Linux with a libc that
has ``timerfd_create``. A ``MockClock``'s deadlines are virtual seconds, not
seconds a real timer could wait. Elsewhere, or when the fd cannot be created,
queues run without it.

One service serves a whole run: the first queue to open starts it, the last to
close stops it and waits until its task has ended, whatever order queues open
and close in. It affects every task of the run while it runs: their sleeps end
on time too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import trio

__all__ = ["precise_wakeups", "supported"]

logger = logging.getLogger("trioq")

_CLOCK_MONOTONIC = 1  # trio's SystemClock reads time.perf_counter(): CLOCK_MONOTONIC on Linux


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> Any:
    """The process's libc with ``timerfd_*`` typed, or None where there is none.

    ``CDLL(None)`` is the symbols already loaded into the interpreter (libc
    among them): no library search, no subprocess.
    """
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return libc


_libc = _load_libc()


def _check(result: int, call: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")
    return result


class Timerfd:
    """A non-blocking CLOCK_MONOTONIC timerfd, armed relative to now.

    ``armed_for`` is the deadline (any clock's number) it was last armed for,
    None once it fired and was read, or was disarmed.
    """

    def __init__(self) -> None:
        if _libc is None:
            raise OSError("timerfd is not available on this platform")
        self.fd: int = _check(_libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC), "timerfd_create")
        self.armed_for: float | None = None
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    def arm(self, seconds: float, deadline: float) -> None:
        """Fire once, ``seconds`` (> 0) from now; replaces any earlier arming."""
        whole = int(seconds)
        self._set(whole, int((seconds - whole) * 1e9) or 1)  # (0, 0) would disarm
        self.armed_for = deadline

    def disarm(self) -> None:
        self._set(0, 0)
        self.armed_for = None

    def _set(self, sec: int, nsec: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = sec, nsec
        _check(_libc.timerfd_settime(self.fd, 0, self._ref, None), "timerfd_settime")

    def consume(self) -> None:
        """Read the expiry count. Nothing to read means it was re-armed since it fired."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        self.armed_for = None

    def close(self) -> None:
        """Close the fd (after telling trio); a second call does nothing."""
        if self.fd >= 0:
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)
            self.fd = -1


def _deadline_reader() -> Callable[[], tuple[float, float]]:
    """A function returning (the run's next deadline, now), both on the run's clock.

    trio's public way, ``current_statistics()``, also walks every fd registered
    with epoll, on every blocking wait; a server with thousands of connections
    would pay that each time. So the runner's deadline heap is read directly,
    falling back to the public way if a trio version moved it.
    """
    try:
        runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
        next_deadline: Callable[[], float] = runner.deadlines.next_deadline
        now: Callable[[], float] = runner.clock.current_time
    except AttributeError:

        def public() -> tuple[float, float]:
            current = trio.current_time()
            return current + trio.lowlevel.current_statistics().seconds_to_next_deadline, current

        return public
    return lambda: (next_deadline(), now())


class _ArmForNextDeadline(trio.abc.Instrument):
    """Before each blocking I/O wait, arm the timerfd for the run's next deadline."""

    def __init__(self, timer: Timerfd, read_deadline: Callable[[], tuple[float, float]]) -> None:
        self._timer = timer
        self._read_deadline = read_deadline

    def before_io_wait(self, timeout: float) -> None:
        if timeout <= 0:
            return
        deadline, now = self._read_deadline()
        left = deadline - now
        timer = self._timer
        if left <= timeout:
            # A deadline that passed since trio computed ``timeout`` gets 1 ns:
            # epoll would otherwise round the last sliver up to a millisecond.
            if timer.armed_for != deadline:
                timer.arm(max(left, 1e-9), deadline)
        elif timer.armed_for is not None:
            timer.disarm()


def _uses_system_clock() -> bool:
    clock = type(trio.lowlevel.current_clock())
    return clock.__name__ == "SystemClock" and clock.__module__.startswith("trio.")


def supported() -> bool:
    """Whether :func:`precise_wakeups` would run in this run."""
    return _libc is not None and _uses_system_clock()


@attrs.define(eq=False)
class _Service:
    """The run's one timerfd, its instrument, and the system task that reads it."""

    timer: Timerfd
    instrument: _ArmForNextDeadline
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    ended: trio.Event = attrs.Factory(trio.Event)
    users: int = 0

    async def read_timer(self) -> None:
        """Consume each expiry until cancelled; then uninstall. Never raises.

        A system task's exception would crash the whole run, so an unexpected
        error is logged and ends the service: deadlines then wake as trio
        alone wakes them.
        """
        try:
            # Installed here, not by the opener: whatever ends this task, its
            # finally uninstalls it, and a spawn that fails installs nothing.
            trio.lowlevel.add_instrument(self.instrument)
            with self.scope:
                while True:
                    await trio.lowlevel.wait_readable(self.timer.fd)
                    self.timer.consume()
        except Exception:
            logger.exception("trioq: precise timer wake-ups stopped; deadlines now wake at trio's own precision")
        finally:
            with contextlib.suppress(KeyError):  # trio dropped it already, after logging its hook's error
                trio.lowlevel.remove_instrument(self.instrument)
            self.timer.close()
            self.ended.set()


_service: trio.lowlevel.RunVar[_Service | None] = trio.lowlevel.RunVar("trioq_precise_wakeups", default=None)


def _start() -> _Service | None:
    try:
        timer = Timerfd()
    except OSError as exc:  # e.g. a seccomp filter refusing timerfd_create
        logger.info("trioq: no precise timer wake-ups (%s)", exc)
        return None
    service = _Service(timer, _ArmForNextDeadline(timer, _deadline_reader()))
    try:
        trio.lowlevel.spawn_system_task(service.read_timer, name="trioq precise wake-ups")
    except RuntimeError as exc:  # the run is ending: its system nursery takes no new task
        timer.close()
        logger.info("trioq: no precise timer wake-ups (%s)", exc)
        return None
    return service


@trio.lowlevel.enable_ki_protection
def _acquire() -> _Service | None:
    """Join the run's service, starting it if there is none (and it is supported)."""
    service = _service.get()
    if service is None and supported():
        service = _start()
        _service.set(service)
    if service is not None:
        service.users += 1
    return service


@trio.lowlevel.enable_ki_protection
def _release(service: _Service) -> bool:
    """Leave the service; True if this was its last user, who must wait for ``ended``."""
    service.users -= 1
    if service.users:
        return False
    if _service.get() is service:
        _service.set(None)
    service.scope.cancel()
    return True


@contextlib.asynccontextmanager
async def precise_wakeups() -> AsyncIterator[None]:
    """Deadlines of this run wake on time while inside (see the module docstring).

    Does nothing where it is not supported. The last user to leave cancels the
    service and waits until its task has uninstalled everything, so nothing of
    it outlives the last queue (a KeyboardInterrupt during that wait leaves the
    task to finish its cleanup a moment later, on its own).
    """
    service = _acquire()
    try:
        yield
    finally:
        if service is not None and _release(service):
            with trio.CancelScope(shield=True):
                await service.ended.wait()
