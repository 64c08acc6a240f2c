"""The crash of ``FaultPlan.crash``: a write-ahead log that dies like ``kill -9``.

A :class:`CrashLog` stands in for the writer a ``WALStore`` session opens
(``WALStore._open_log``; :class:`~trioq._testing.faults.FaultSession` puts it
there). Records pass straight through to the real writer, counted; at the
armed one the log dies. The store itself knows nothing of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from .._model import TrioqError

if TYPE_CHECKING:
    from ..stores.wal._writer import LogWriter

__all__ = ["CrashLog", "SimulatedCrash"]


class SimulatedCrash(TrioqError):
    """The queue died as if killed with ``kill -9`` (``trioq.testing.FaultPlan.crash``).

    Raised out of ``open_queue`` after a fault plan's crash point: nothing more
    was written, released or checkpointed. Open the same store again to recover.
    """


class CrashLog:
    """A log writer that dies after its ``crash_at``-th record, wrapping the real one (``log``).

    Every append is counted in :attr:`records`, the one that reaches
    ``crash_at`` (``None``: none) included. That record is not handed on:
    the log dies instead. The real writer's task is cancelled where it
    stands, so nothing more reaches the disk (records it had not written are
    lost; a write already handed to a thread completes), and once that task
    has ended each segment it made is cut back to the bytes it had synced,
    one never synced deleted, as a machine crash may leave them. Then
    ``on_crash(exc, record)`` is called and ``exc``, a :class:`SimulatedCrash`,
    raised.

    A crash strikes once. Afterwards every append, flush and checkpoint
    raises a fresh :class:`SimulatedCrash`, waiters of records never
    committed get one too, and :meth:`close` does nothing: the store's
    session ends without writing (its releases are refused).
    """

    def __init__(
        self, log: LogWriter, *, crash_at: int | None, on_crash: Callable[[SimulatedCrash, int], None]
    ) -> None:
        #: The writer this one wraps.
        self.log = log
        #: The record that kills the log (counted from its open), or ``None``; may change at any time.
        self.crash_at = crash_at
        #: Records appended so far, the fatal one included.
        self.records = 0
        self._on_crash = on_crash
        self._crash: SimulatedCrash | None = None
        self._scope = trio.CancelScope()

    @property
    def crashed(self) -> bool:
        return self._crash is not None

    def append(self, data: bytes, *, lazy: bool = False) -> int:
        """``LogWriter.append``, counted; the ``crash_at``-th record kills the log instead."""
        if self._crash is not None:
            raise self._dead()
        self.records += 1
        if self.crash_at is not None and self.records >= self.crash_at:
            self._die()
        return self.log.append(data, lazy=lazy)

    async def flush(self, *, upto: int | None = None, cancellable: bool = True) -> None:
        if self._crash is not None:
            raise self._dead()
        try:
            await self.log.flush(upto=upto, cancellable=cancellable)
        except Exception:
            if self._crash is not None:  # the writer stopped under it
                raise self._dead() from None
            raise

    async def request_checkpoint(self) -> None:
        if self._crash is not None:
            raise self._dead()
        try:
            await self.log.request_checkpoint()
        except Exception:
            if self._crash is not None:
                raise self._dead() from None
            raise

    async def close(self) -> None:
        """``LogWriter.close``; after the crash nothing (the writer's task was cancelled)."""
        if self._crash is None:
            await self.log.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The real writer's task, in a scope the crash cancels; then the unsynced bytes are dropped."""
        try:
            with self._scope:
                await self.log.run(task_status=task_status)
        finally:
            if self._crash is not None:
                self._drop_unsynced()

    @property
    def busy(self) -> bool:
        return self.log.busy

    @property
    def segments(self) -> dict[int, tuple[str, int]]:
        return self.log.segments

    @property
    def padding_bytes(self) -> int:
        return self.log.padding_bytes

    def _die(self) -> None:
        record = self.records
        exc = SimulatedCrash(
            f"simulated crash after WAL record {record} of this session (FaultPlan.crash): "
            f"nothing more was written to {self.log.directory}; open the store again to recover"
        )
        self._crash = exc
        self.crash_at = None
        self._scope.cancel()
        self._on_crash(exc, record)
        raise exc

    def _dead(self) -> SimulatedCrash:
        # A copy: the original is the one open_queue raises, and should carry
        # only the traceback of where the crash struck.
        return SimulatedCrash(str(self._crash))

    def _drop_unsynced(self) -> None:
        """Cut each segment the writer made back to its synced bytes (none: delete it)."""
        for path, synced in self.log.synced.items():
            try:
                if synced == 0:
                    os.unlink(path)
                elif os.path.getsize(path) > synced:
                    os.truncate(path, synced)
            except FileNotFoundError:
                continue
