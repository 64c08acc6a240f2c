"""WALStore: the job table, every transition logged to a segmented write-ahead log."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from ..._model import TrioqError
from .._base import StoreConfig
from ..table.jobs import JobTable
from ..table.store import DROP, TableStore
from ._format import frame
from ._recovery import Recovery, replay
from ._writer import FSYNC_MODES, LogWriter, virtual_time

__all__ = ["WALLocked", "WALStore"]

MiB = 1024 * 1024


class WALLocked(TrioqError):
    """Another process (or another store in this one) has the WAL directory open."""


class _DirectoryLock:
    """An exclusive ``fcntl.flock`` on ``DIR/LOCK``, holding the owner's pid."""

    def __init__(self, directory: str) -> None:
        path = os.path.join(directory, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WALLocked(
                f"the WAL directory {directory} is already open (owner pid {owner}); one process owns a WAL "
                "directory: stop the other owner, or give this queue its own directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


async def _run_shielded(writer: LogWriter, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the writer's task shielded from outer cancels: it must still commit the session's last
    records (the releases of shutdown) after the queue around it was cancelled (see ``LogWriter.run``)."""
    with trio.CancelScope(shield=True):
        await writer.run(task_status=task_status)


class WALStore(TableStore):
    """The durable embedded store: a directory of write-ahead log segments.

    ``fsync="always"``: every transition (``enqueue`` included) returns only
    after its record is on disk; concurrent transitions share one fsync (group
    commit). ``"interval"``: records are written at once and synced every few
    milliseconds. ``"never"``: syncing is left to the OS. In all modes a
    transition returns only after its record was written, so ``kill -9`` loses
    nothing acknowledged. The exceptions are the records nobody waits for: a
    claim and the outcomes of ``complete`` return at once, and their records
    join the next commit (at most ``LAZY_COMMIT_DELAY`` later, or at once when
    someone syncs); ``Queue.get``, ``wait`` and ``join`` sync before reporting
    an outcome. A crash can so re-run a job that had just finished.

    Opening replays the log (a torn last write is truncated with a warning;
    other damage raises :class:`~trioq.WALCorruption`), then puts jobs that were
    running back to ``ready`` without counting the interrupted attempt.
    Scheduled jobs keep their ``run_at``, attempts, epochs and keys. One process
    owns a directory at a time (:class:`~trioq.WALLocked` otherwise).

    The log is in format 4 (typed records, ``_records``): every transition,
    a job's queue, tenant, limit keys and deadline, a deadline's expiry,
    pausing and resuming a queue (paused queues stay paused across a reopen
    and a checkpoint), and the claims' times that a rate's tokens are rebuilt
    from (a checkpoint carries the rates' state). A directory an older trioq wrote in format 2 or 3 opens as it
    is, and its segments go at the first checkpoint (see ``_format``).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: str = "always", segment_size: int = 64 * MiB) -> None:
        super().__init__()
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, got {fsync!r}")
        if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 4096:
            raise ValueError(f"segment_size must be an int >= 4096 bytes, got {segment_size!r}")
        self.path = os.fspath(path)
        self.fsync = fsync
        self.segment_size = segment_size
        self._writer: LogWriter | None = None
        self._drops: list[str] = []
        #: What the last open found in the log (see :class:`Recovery`).
        self.recovery: Recovery | None = None

    @contextlib.asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        os.makedirs(self.path, exist_ok=True)
        lock = _DirectoryLock(self.path)
        try:
            table = JobTable(retention=config.retention, max_retained=sys.maxsize)
            # Replayed claims take their rate tokens again: the limits must be known first.
            table.limits.limit_of = config.limits
            if virtual_time():  # see virtual_time(): no clock jumps during replay
                recovery = replay(self.path, table)
            else:
                recovery = await trio.to_thread.run_sync(replay, self.path, table)
            self.recovery = recovery
            self._ticks = dict(recovery.ticks)  # the cron schedules' marks (see table/cron.py)
            table.max_retained = config.max_retained
            table.on_overflow_drop = self._drops.append
            self._attach(table, config)
            async with trio.open_nursery() as nursery:
                writer = self._open_log(recovery, table.__len__)
                await nursery.start(_run_shielded, writer)
                self._writer = writer
                try:
                    # Attempts cut off by a crash are not counted: back to ready.
                    self._release_running()
                    self._admit_at_open()
                    for job_id in table.evict(config.clock()):
                        self._record(DROP, (job_id,))
                    await self._flush()
                    yield
                finally:
                    # The writer runs shielded from outer cancels: it stops
                    # only here, after committing the releases.
                    with trio.CancelScope(shield=True):
                        try:
                            self._release_running()
                        finally:
                            await writer.close()
        finally:
            self._writer = None
            self._table = self._config = None
            lock.release()

    def _open_log(self, recovery: Recovery, live: Callable[[], int]) -> LogWriter:
        """The writer of a session: it continues the log ``recovery`` found; ``live`` counts the jobs.

        The one place the store makes its writer. Of it the store uses only
        ``run``, ``append``, ``flush``, ``close``, ``request_checkpoint``,
        ``busy``, ``segments`` and ``padding_bytes``: a wrapper offering those
        can stand in (``trioq.testing`` wraps the writer to simulate a crash).
        """
        return LogWriter(
            self.path,
            fsync=self.fsync,
            segment_size=self.segment_size,
            next_segment=recovery.last_segment + 1,
            last_batch=recovery.last_batch,
            old_segments=recovery.segments,
            export=self._export,
            live=live,
            paused=self._paused_queues,
            rates=self._rates,
            ticks=self._tick_marks,
        )

    def _record(self, kind: int, fields: tuple[Any, ...], *, lazy: bool = False) -> int:
        writer = self._writer
        assert writer is not None
        seq = writer.append(frame(kind, fields), lazy=lazy)
        if self._drops:
            drops = self._drops[:]  # the table appends to this very list
            self._drops.clear()
            for job_id in drops:
                writer.append(frame(DROP, (job_id,)), lazy=lazy)
        return seq

    async def _flush(self) -> None:
        assert self._writer is not None
        await self._writer.flush(cancellable=False)  # the transition has happened

    async def _durable(self, upto: int | None) -> None:
        assert self._writer is not None
        await self._writer.flush(upto=upto)  # only waits: may be cancelled

    def unsynced(self) -> bool:
        """Whether some applied transition is not committed yet (:meth:`sync` would wait): diagnostics."""
        return self._writer is not None and self._writer.busy

    def _export(self) -> list[tuple[Any, ...]]:
        assert self._table is not None
        return self._table.export()

    def _paused_queues(self) -> list[str]:
        """The paused queues, sorted, for a checkpoint (the writer calls it right after :meth:`_export`)."""
        assert self._table is not None
        return self._table.paused()

    def _rates(self) -> list[tuple[str, float]]:
        """Each rate-limited key's GCRA state ``(key, tat)``, sorted, for a checkpoint (see :meth:`_paused_queues`)."""
        assert self._table is not None
        return sorted(self._table.limits.tat.items())

    async def checkpoint(self) -> None:
        """Write a checkpoint now and delete the older segments."""
        if self._writer is None:
            raise RuntimeError("WALStore is not open; use it through trioq.open_queue")
        await self._writer.request_checkpoint()

    def disk_usage(self) -> dict[str, Any]:
        """Segments on disk (``{number: (path, bytes of records)}``), their total, and padding, while open.

        ``bytes`` counts records only. With ``fsync="always"`` the open segment
        also holds up to 1 MiB of zeros past its records (the writer pads ahead
        so a sync flushes data only); ``padding_bytes`` is that, and is cut off
        when the segment is left or the store closes.
        """
        if self._writer is None:
            raise RuntimeError("WALStore is not open")
        segments = self._writer.segments
        return {
            "segments": segments,
            "bytes": sum(size for _, size in segments.values()),
            "padding_bytes": self._writer.padding_bytes,
        }
