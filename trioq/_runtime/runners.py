"""How a handler runs: in the worker task, in a thread, or in a process.

An executor does two things for the worker: :meth:`slot` waits for room to run
(before the attempt's clock starts), and :meth:`call` runs the handler inside
the attempt's cancel scope, so the scope's deadline stops it:

- ``async``: awaited in the worker task; cancellation is ordinary trio
  cancellation.
- ``thread``: ``trio.to_thread.run_sync(..., abandon_on_cancel=True)``. At the
  deadline the worker stops waiting; a thread that ignores that keeps running,
  is counted as abandoned until it returns, and its result is discarded.
- ``process``: ``trio_parallel.run_sync(..., kill_on_cancel=True)``; the
  deadline kills the process. At most one process per CPU runs at a time; a
  job waits for a free CPU before its attempt (and its deadline) starts.
  Heartbeats from the child process go through a small shared-memory board
  that the worker polls; the heartbeat deadline starts with the child's first
  beat, so spawning a worker process is not mistaken for a hang.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from .._context import Attempt, JobContext
from .._model import Job

__all__ = ["ProcessJobContext", "ProcessRunner", "ThreadRunner"]

_COUNTER = struct.Struct("<Q")

#: Seconds a process attempt may take to start (spawning a worker process)
#: before its heartbeat deadline applies.
PROCESS_START_ALLOWANCE = 10.0


class ThreadRunner:
    """Runs sync handlers in threads and counts the ones it had to abandon.

    Workers bound concurrency already, so threads get their own unbounded
    limiter rather than trio's default one (40), which would make jobs wait
    while their deadlines run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limiter = trio.CapacityLimiter(math.inf)
        #: Threads abandoned at their deadline that have not returned yet.
        self.abandoned_running = 0
        #: Threads ever abandoned by this runner.
        self.abandoned_total = 0

    async def call(self, fn: Callable[..., Any], ctx: JobContext, payload: dict[str, Any]) -> Any:
        finished = False
        abandoned = False

        def run() -> Any:
            nonlocal finished
            try:
                return fn(ctx, **payload)
            finally:
                with self._lock:
                    finished = True
                    if abandoned:
                        self.abandoned_running -= 1

        try:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=self._limiter)
        except trio.Cancelled:
            with self._lock:
                if not finished:
                    abandoned = True
                    self.abandoned_running += 1
                    self.abandoned_total += 1
            raise


@attrs.frozen
class ProcessJobContext:
    """The context a process handler gets: picklable, with a cross-process heartbeat.

    ``heartbeat()`` bumps this attempt's counter on a shared-memory board that
    the worker in the parent polls; it returns ``True`` (the child cannot know
    whether the parent still wants the work; the parent kills it if not).
    """

    job: Job
    board_path: str | None = None
    slot: int = 0
    #: ``{parent_id: result}`` of the job's parents (see ``JobContext.parents``).
    parents: dict[str, Any] = attrs.field(factory=dict)

    @property
    def attempt(self) -> int:
        """This attempt's 1-based number."""
        return self.job.attempts + 1

    def heartbeat(self) -> bool:
        """Say the attempt is alive (the parent's watchdog sees the counter move); always ``True``: the
        child cannot tell whether the parent still wants the work (the parent kills it if not)."""
        if self.board_path is not None:
            board = _child_boards.get(self.board_path)
            if board is None:
                with open(self.board_path, "r+b") as f:
                    board = _child_boards[self.board_path] = mmap.mmap(f.fileno(), 0)
            offset = self.slot * _COUNTER.size
            (count,) = _COUNTER.unpack_from(board, offset)
            _COUNTER.pack_into(board, offset, count + 1)
        return True


# One mapping per board file per worker process, kept for the process's life.
_child_boards: dict[str, mmap.mmap] = {}


#: How often a worker process looks whether the process that started it is gone (seconds).
ORPHAN_POLL = 0.2
#: In a worker process: the parent it watches (see :func:`_exit_when_orphaned`), once watched.
_watched_parent: int | None = None


def _exit_when_orphaned(parent: int) -> None:
    """In a worker process, on a daemon thread: exit at once when the process that started it is gone.

    A node SIGKILLed tells its worker processes nothing, and they would run their handlers on while
    another node, its lease lapsed, runs the same jobs (a max-1 key held twice). An orphan is
    re-parented, so its parent's pid changes; it exits within :data:`ORPHAN_POLL`.
    """
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL)
    os._exit(70)


def _invoke(fn: Callable[..., Any], ctx: ProcessJobContext, payload: dict[str, Any]) -> Any:
    """Runs in the worker process: watch for its node's end (once per process), say it started, then
    call the handler."""
    global _watched_parent
    if _watched_parent is None:
        _watched_parent = os.getppid()
        threading.Thread(
            target=_exit_when_orphaned, args=(_watched_parent,), daemon=True, name="trioq-orphan-watch"
        ).start()
    ctx.heartbeat()
    return fn(ctx, **payload)


class HeartbeatBoard:
    """A file of 8-byte counters, one per worker slot, mapped into memory.

    Lives in ``/dev/shm`` where that exists (so it never touches a disk) and
    is deleted by :meth:`close`.
    """

    def __init__(self, slots: int) -> None:
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="trioq-heartbeats-", dir=where)
        try:
            os.ftruncate(fd, max(slots, 1) * _COUNTER.size)
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)

    def read(self, slot: int) -> int:
        return int(_COUNTER.unpack_from(self._map, slot * _COUNTER.size)[0])

    def close(self) -> None:
        self._map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class ProcessRunner:
    """Runs module-level sync handlers in trio-parallel worker processes."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._cpus = trio.CapacityLimiter(os.cpu_count() or 1)
        self._unbounded = trio.CapacityLimiter(math.inf)
        self._board: HeartbeatBoard | None = None

    @property
    def cpus(self) -> trio.CapacityLimiter:
        """One token per CPU: hold one while a process attempt runs."""
        return self._cpus

    async def call(self, fn: Callable[..., Any], attempt: Attempt, slot: int, payload: dict[str, Any]) -> Any:
        import trio_parallel

        if attempt.heartbeat_timeout is None:
            pctx = ProcessJobContext(attempt.job, parents=attempt.parents)
            return await trio_parallel.run_sync(
                _invoke, fn, pctx, payload, kill_on_cancel=True, limiter=self._unbounded
            )
        if self._board is None:
            self._board = HeartbeatBoard(self._slots)
        board = self._board
        pctx = ProcessJobContext(attempt.job, board.path, slot, attempt.parents)
        # Starting a worker process can take longer than a heartbeat period;
        # the heartbeat clock starts with the child's first beat (sent by
        # _invoke before the handler runs), within PROCESS_START_ALLOWANCE.
        attempt.set_deadline(
            min(attempt.timeout_at, trio.current_time() + attempt.heartbeat_timeout + PROCESS_START_ALLOWANCE)
        )
        poll_every = max(attempt.heartbeat_timeout / 4, 0.005)

        async def watch_board(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            seen = board.read(slot)
            task_status.started()
            while True:
                await trio.sleep(poll_every)
                count = board.read(slot)
                if count != seen:
                    seen = count
                    attempt.beat()

        result: Any = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(watch_board)
                result = await trio_parallel.run_sync(
                    _invoke, fn, pctx, payload, kill_on_cancel=True, limiter=self._unbounded
                )
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The handler's own error, not a group of one around it.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return result

    def close(self) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
