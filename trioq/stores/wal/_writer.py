"""The log writer: one task owns the segment files and commits records in groups.

Callers append encoded records synchronously and then await :meth:`LogWriter.flush`.
The writer task takes every record waiting at that moment, writes them with a
commit marker, syncs once (``fsync="always"``), and only then wakes the callers:
32 concurrent submitters cost about one fsync per batch, not one each. With
``"interval"`` the file is synced every few milliseconds and callers wait only
for the write; with ``"never"`` syncing is left to the OS. In every mode a
caller returns only after its record was handed to the OS, so a ``kill -9`` of
the process loses nothing acknowledged; only a machine crash can, outside
``"always"``. Records appended ``lazy`` (nobody waits for them: a worker's claim
and success) start no commit of their own; they join the next one, which starts
at most :data:`LAZY_COMMIT_DELAY` after the first of them, or at once when a
record someone waits for arrives or a caller flushes.

Segments roll at ``segment_size``. At a roll, when the log on disk has grown
past twice the size of a checkpoint of the live jobs, the new segment starts
with a checkpoint and every older segment is deleted, so disk use follows the
live jobs, not history. The directory is fsynced after every create, truncate
and delete.

With ``"always"`` the open segment is zero-filled ahead of the records
(:data:`PREALLOC_STEP` at a time) and records overwrite the zeros in place:
an ``fdatasync`` then flushes data only, no file size or block allocation,
which is about a third faster here (ext4: ~0.14 ms instead of ~0.21 ms). A
segment is cut back to its records when the writer leaves it; one a crash left
padded ends in zeros, which recovery reads as padding, not damage. The other
modes append: without a sync per commit, overwritten blocks could reach the
disk out of order, and a machine crash could leave a hole before a commit.
"""

from __future__ import annotations

import copy
import errno
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ._format import (
    ENTRY,
    HEADER_SIZE,
    chunk_crcs,
    commit_frame,
    frame,
    frame_record,
    header,
    segment_name,
)
from ._records import CheckpointBegin, CheckpointEnd

__all__ = ["FSYNC_MODES", "LogWriter"]

FSYNC_MODES = ("always", "interval", "never")
#: How often ``fsync="interval"`` syncs a log that has unsynced writes.
SYNC_INTERVAL = 0.005
#: With ``fsync="always"``, a group commit syncs on the trio thread while a
#: sync takes less than this (moving average): handing it to a worker thread
#: costs ~0.2 ms here, more than a fast disk's fdatasync. Slower disks sync in
#: a thread so the event loop never stalls long.
INLINE_SYNC_MAX = 0.0005
#: Bytes zero-filled ahead of the records at a time with ``fsync="always"``.
PREALLOC_STEP = 1 << 20
_ZEROS = memoryview(bytes(PREALLOC_STEP))
#: How long records nobody waits for (a worker's claim and success) may wait
#: for a commit; see :meth:`LogWriter.append`.
LAZY_COMMIT_DELAY = 0.05


def virtual_time() -> bool:
    """Whether this trio run's clock is a ``MockClock`` (a test).

    Disk I/O then stays on the trio thread: while a worker thread does I/O an
    autojump clock sees every task blocked and jumps virtual time ahead, so an
    fsync could "take" the 10 seconds of some attempt's timeout. Inline, I/O
    takes no virtual time at all.
    """
    # Not `import trio.testing` at the top: it imports pytest (~10,000 objects
    # more for every full GC to walk, and 60 ms) into every program using trioq.
    # A MockClock in use means its module is loaded already.
    testing = sys.modules.get("trio.testing")
    return testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock)


class _Batch:
    """The records of one group commit, and the callers waiting for them to be committed.

    A plain ``trio.Event`` would do, but a store transition already applied
    must wait for its record without being cancellable, and a shielded
    ``CancelScope`` per call costs ~7 µs in trio 0.35: a third of an enqueue.
    :meth:`wait` with ``cancellable=False`` defers a cancel to the caller's
    next checkpoint instead, as a shield would.
    """

    __slots__ = ("_done", "_waiters", "error", "last")

    def __init__(self) -> None:
        self._done = False
        self._waiters: list[trio.lowlevel.Task] = []
        self.error: BaseException | None = None
        #: The sequence number of the batch's last record, once it is taken for a commit.
        self.last = 0

    def is_done(self) -> bool:
        return self._done

    def raise_error(self) -> None:
        """Raise the batch's error, if it failed: a copy of it for each waiter, caused by it.

        Every waiter raising the one exception object would make each raise
        grow its traceback with the others' frames, and the queue would come
        out holding the same error many times; a copy per waiter keeps each
        traceback its own, and ``__cause__`` the writer's.
        """
        error = self.error
        if error is None:
            return
        try:
            fresh = copy.copy(error)
        except Exception:  # an exception that cannot be rebuilt from its args
            raise error from None
        if hasattr(fresh, "__notes__"):  # copied as the same list: notes added later stay apart
            fresh.__notes__ = list(fresh.__notes__)
        raise fresh from error

    def set_done(self) -> None:
        """Wake every waiter (``error`` says whether it failed); later calls do nothing."""
        if self._done:
            return
        self._done = True
        for task in self._waiters:
            trio.lowlevel.reschedule(task)
        self._waiters.clear()

    async def wait(self, *, cancellable: bool = True) -> None:
        """Until :meth:`set_done`; a checkpoint either way (a cancel-shielded one if not ``cancellable``)."""
        if self._done:
            if cancellable:
                await trio.lowlevel.checkpoint()
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return
        task = trio.lowlevel.current_task()
        self._waiters.append(task)

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            if not cancellable:
                return trio.lowlevel.Abort.FAILED  # woken by set_done; the cancel lands at the next checkpoint
            self._waiters.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_at(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class LogWriter:
    """Owns the open segment; see the module docstring for the guarantees.

    ``export`` returns the fields of one ENTRY record (``_records.Row``) per
    job of the table at the moment it is called (a checkpoint); ``live`` returns how many jobs
    that would be, cheaply (to decide whether a checkpoint pays); ``paused`` the names of the
    paused queues, sorted, and ``rates`` each rate-limited key's ``(key, tat)``, sorted, and
    ``ticks`` each cron schedule's ``(name, last tick)``, sorted, which the checkpoint's BEGIN
    carries (called right after ``export``, with no await between: all are the store of one
    moment).
    """

    def __init__(
        self,
        directory: str,
        *,
        fsync: str,
        segment_size: int,
        next_segment: int,
        old_segments: list[tuple[int, str]],
        export: Callable[[], list[tuple[object, ...]]],
        live: Callable[[], int],
        last_batch: int = 0,
        paused: Callable[[], Sequence[str]] = tuple,
        rates: Callable[[], Sequence[tuple[str, float]]] = tuple,
        ticks: Callable[[], Sequence[tuple[str, float]]] = tuple,
    ) -> None:
        self.directory = directory
        self.fsync = fsync
        self.segment_size = segment_size
        self._export = export
        self._live = live
        self._paused = paused
        self._rates = rates
        self._ticks = ticks
        self._pending: list[bytes] = []
        #: Whether every pending record is lazy (nobody waits for them yet),
        #: and since when some have been waiting.
        self._lazy_only = False
        self._lazy_since = 0.0
        self._batch = _Batch()
        self._inflight: _Batch | None = None
        #: Sequence numbers: of the last record appended, and of the last one committed.
        self._appended = 0
        self._committed = 0
        self._wake = trio.Event()
        self._closing = False
        # Batches are numbered on from the log's last one, across sessions,
        # so recovery can tell batches missing between any two segments.
        self._batch_no = last_batch
        self._fd = -1
        self._segment = next_segment - 1
        self._segment_bytes = 0
        #: Size of the open segment's file: its records, then zeros (see PREALLOC_STEP).
        self._allocated = 0
        #: How far ahead of its records the open segment is zero-filled (0 after an ENOSPC).
        self._pad_step = PREALLOC_STEP
        # Sizes of every segment on disk, the open one last.
        self._segments: dict[int, tuple[str, int]] = {n: (path, os.path.getsize(path)) for n, path in old_segments}
        # Bytes known to be synced, per segment created by this writer (see `synced`).
        self._synced: dict[int, int] = {}
        self._dirty = False
        self._last_sync = -math.inf
        #: Moving average of one write+fdatasync; see INLINE_SYNC_MAX.
        self._sync_seconds = 0.0
        #: Bytes per checkpointed job, as measured at the last checkpoint.
        self._bytes_per_entry = 120.0
        self.checkpoints = 0
        # A checkpoint asked for from outside the writer task, and its outcome.
        self._checkpoint_wanted: _Batch | None = None
        self.records_written = 0
        self.batches_written = 0
        self._inline = False  # set when the writer task starts: see virtual_time()

    # ------------------------------------------------------------- callers

    def append(self, data: bytes, *, lazy: bool = False) -> int:
        """Queue one encoded record for the next group commit; returns its sequence number.

        Sequence numbers count the records appended since the writer was made
        (1, 2, ...): :meth:`flush` with ``upto`` waits for one record (and the
        ones before it) rather than for all.

        A ``lazy`` record (one nobody waits for yet: a worker's claim or
        success) does not start a commit: it joins the next one, which starts
        at the latest :data:`LAZY_COMMIT_DELAY` later, or as soon as a record
        that is not lazy arrives or someone calls :meth:`flush`. Each commit
        syncs (``"always"``), and a sync on this machine's disk blocks the
        event loop ~0.2-0.4 ms: one per finished job would cost every
        sleeping job a late wake-up (see docs/benchmarks.md).
        """
        if self._closing:
            raise RuntimeError("the WAL writer is closed")
        pending = self._pending
        self._appended += 1
        if lazy:
            if not pending:
                self._lazy_only = True
                self._lazy_since = trio.current_time()
                if not self._wake.is_set():
                    self._wake.set()  # the writer sets its deadline
            pending.append(data)
            return self._appended
        pending.append(data)
        self._lazy_only = False
        if not self._wake.is_set():
            self._wake.set()
        return self._appended

    async def flush(self, *, upto: int | None = None, cancellable: bool = True) -> None:
        """Until every record appended so far (or up to sequence number ``upto``) is committed
        (written; synced with "always").

        With ``upto`` already committed it returns at once, and a lazy record
        waiting for a later commit is left to it: asking whether one job's
        outcome is durable does not commit every other job's. With
        ``cancellable=False`` a cancel does not cut the wait short: it is
        delivered at the caller's next checkpoint (see :class:`_Batch`).
        """
        if upto is not None and upto <= self._committed:
            return
        inflight = self._inflight
        if self._pending and (upto is None or inflight is None or upto > inflight.last):
            batch = self._batch
            if self._lazy_only:
                self._lazy_only = False
                if not self._wake.is_set():
                    self._wake.set()
        elif inflight is not None:
            batch = inflight
        else:
            return
        await batch.wait(cancellable=cancellable)
        batch.raise_error()

    @property
    def busy(self) -> bool:
        """Whether some appended record is not committed yet."""
        return bool(self._pending) or self._inflight is not None

    @property
    def disk_bytes(self) -> int:
        return sum(size for _, size in self._segments.values())

    @property
    def padding_bytes(self) -> int:
        """Zeros past the open segment's records (``fsync="always"`` pads ahead; else 0)."""
        return max(self._allocated - self._segment_bytes, 0)

    @property
    def segments(self) -> dict[int, tuple[str, int]]:
        return dict(self._segments)

    @property
    def synced(self) -> dict[str, int]:
        """How much of each segment this writer created is known to be on disk: ``{path: bytes}``.

        What a machine crash would leave of them at worst (a segment at 0
        bytes would be gone, header and all). Segments the writer found on
        disk are not listed (they were synced before it), nor ones it deleted.
        """
        segments = self._segments
        return {segments[n][0]: size for n, size in self._synced.items() if n in segments}

    # -------------------------------------------------------------- writer

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: open a fresh segment, then commit batches until closed.

        It ends through :meth:`close`, after committing what is pending, or
        by a cancel of its task, which stops it before its next write (one
        already handed to a thread completes) and leaves the files as they
        are, the open segment's padding included: records not yet written
        are lost, as in a ``kill -9``. Whichever way it ends, later appends
        raise and waiters of records it never committed are told.

        Its owner runs it shielded (``WALStore.session``): an outer cancel (a
        ``move_on_after`` around the queue, a failing sibling task) must not
        stop it while the session still has records to commit (the releases
        of shutdown).
        """
        self._inline = virtual_time()
        cancelled = False
        try:
            await self._io(self._start_segment, self._segment + 1, b"")
            task_status.started()
            await self._loop()
        except trio.Cancelled:
            cancelled = True
            raise
        finally:
            self._closing = True
            stopped = RuntimeError("the WAL writer stopped before these records were committed")
            self._pending = []
            for batch in (self._batch, self._inflight, self._checkpoint_wanted):
                if batch is not None:
                    self._abandon(batch, stopped)
            if self._fd >= 0:
                if not cancelled:  # cancelled, it changes no file (padding reads as padding)
                    self._trim()
                os.close(self._fd)
                self._fd = -1

    async def _loop(self) -> None:
        while True:
            if self._checkpoint_wanted is not None:
                await self._checkpoint_on_request()
                continue
            if self._lazy_only and self._pending and not self._closing:
                # Only lazy records: commit them by their deadline, or sooner
                # if woken (a record someone waits for, a flush, a close).
                self._wake = trio.Event()
                deadline = self._lazy_since + LAZY_COMMIT_DELAY
                if self._dirty and self.fsync == "interval":
                    deadline = min(deadline, self._last_sync + SYNC_INTERVAL)  # its own promise
                with trio.move_on_at(deadline):
                    await self._wake.wait()
                self._lazy_only = False
                continue
            if not self._pending:
                if self._closing:
                    if self._dirty and self.fsync == "interval":
                        await self._sync_now()  # its promise holds to the end
                    return
                self._wake = trio.Event()
                if self._dirty and self.fsync == "interval":
                    with trio.move_on_after(SYNC_INTERVAL):
                        await self._wake.wait()
                    if not self._pending:
                        await self._sync_now()
                        continue
                else:
                    await self._wake.wait()
                continue
            # One scheduling pass first: the tasks woken with these records
            # (a worker told of a new job) run before the sync blocks the
            # loop, and records they append join this batch. A cancel point
            # too (see run): a cancel landing in that pass writes nothing.
            await trio.lowlevel.checkpoint()
            await self._commit_pending()
            if self._segment_bytes >= self.segment_size:
                await self._roll()

    async def request_checkpoint(self) -> None:
        """Have the writer task write a checkpoint; returns once it is durable.

        Only the writer task touches the files, so the checkpoint runs there,
        between two group commits.
        """
        if self._closing:
            raise RuntimeError("the WAL writer is closed; no checkpoint can be taken")
        if self._checkpoint_wanted is None:
            self._checkpoint_wanted = _Batch()
        wanted = self._checkpoint_wanted
        if not self._wake.is_set():
            self._wake.set()
        await wanted.wait()
        wanted.raise_error()

    async def _checkpoint_on_request(self) -> None:
        wanted = self._checkpoint_wanted
        assert wanted is not None
        self._checkpoint_wanted = None
        try:
            if self._pending:
                # No roll after it even if the segment is full: the checkpoint
                # starts the next segment itself (a roll would open one more,
                # or write the checkpoint twice).
                await self._commit_pending()
            await self.checkpoint()
        except BaseException as exc:
            self._abandon(wanted, exc)
            raise
        wanted.set_done()

    async def close(self) -> None:
        """Commit what is pending, then stop the writer task."""
        self._closing = True
        if not self._wake.is_set():
            self._wake.set()
        await self.flush()

    async def _commit_pending(self) -> None:
        frames, batch = self._pending, self._batch
        self._pending, self._batch = [], _Batch()
        self._lazy_only = False
        batch.last = self._appended
        self._inflight = batch
        self._batch_no += 1
        start = self._segment_bytes
        data = b"".join(frames)
        # "always" overwrites zero-filled blocks: the marker's page CRCs let
        # recovery tell a page a power cut left unwritten from damage.
        data += commit_frame(self._batch_no, start, chunk_crcs(data, start) if self.fsync == "always" else ())
        try:
            if self.fsync == "always":
                end = self._segment_bytes + len(data)
                if end > self._allocated:
                    self._zero_fill(end)
                if self._sync_seconds <= INLINE_SYNC_MAX or self._inline:
                    # A fast disk: syncing here costs less than the thread hop.
                    elapsed = self._write_and_sync(data)
                    await trio.lowlevel.checkpoint()
                else:
                    elapsed = await trio.to_thread.run_sync(self._write_and_sync, data)
                self._sync_seconds += (elapsed - self._sync_seconds) * 0.2
            else:
                _write_at(self._fd, data, self._segment_bytes)
                self._dirty = True
                if self.fsync == "interval" and trio.current_time() - self._last_sync >= SYNC_INTERVAL:
                    await self._sync_now()
        except BaseException as exc:
            self._abandon(batch, exc)
            raise
        self._segment_bytes += len(data)
        self._segments[self._segment] = (self._segments[self._segment][0], self._segment_bytes)
        self.records_written += len(frames)
        self.batches_written += 1
        self._inflight = None
        self._committed = batch.last
        batch.set_done()

    def _abandon(self, batch: _Batch, exc: BaseException) -> None:
        """The writer failed (or was cancelled) before ``batch`` was durable: tell its waiters."""
        if batch.is_done():
            return
        if isinstance(exc, Exception):
            batch.error = exc
        else:  # a Cancelled belongs to the writer task; waiters get an error of their own
            batch.error = RuntimeError("the WAL writer stopped before these records were committed")
        batch.set_done()

    def _write_and_sync(self, data: bytes) -> float:
        """Write and fdatasync ``data``; returns the seconds it took."""
        started = time.perf_counter()
        _write_at(self._fd, data, self._segment_bytes)
        os.fdatasync(self._fd)
        self._synced[self._segment] = self._segment_bytes + len(data)
        return time.perf_counter() - started

    def _sync(self) -> None:
        if self._dirty and self._fd >= 0:
            os.fdatasync(self._fd)
            # The file's size is its records here: only "always" pads, and it
            # syncs in _write_and_sync, never leaving the segment dirty.
            self._synced[self._segment] = os.fstat(self._fd).st_size
            self._dirty = False

    def _zero_fill(self, end: int) -> None:
        """Extend the open segment with zeros to at least ``end`` (synced with the next commit).

        It fills up to :data:`PREALLOC_STEP` ahead. A disk too full for that
        (ENOSPC) gets the part written cut off again and zeros only up to
        ``end``: the padding is an optimisation, and must not refuse a batch
        that still fits. The rest of that segment is then padded batch by
        batch, not ahead. ENOSPC for ``end`` itself is the caller's error.
        """
        target = max(end, min(self._allocated + self._pad_step, self.segment_size))
        try:
            self._fill_to(target)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or target == end:
                raise
            os.ftruncate(self._fd, self._allocated)
            self._pad_step = 0  # until the next segment: no filling the disk up on every commit
            self._fill_to(end)

    def _fill_to(self, target: int) -> None:
        for offset in range(self._allocated, target, PREALLOC_STEP):
            _write_at(self._fd, _ZEROS[: min(PREALLOC_STEP, target - offset)], offset)
        self._allocated = target

    def _trim(self) -> None:
        """Cut the open segment's zero padding off (not synced: padding left by a crash is harmless)."""
        if self._allocated > self._segment_bytes:
            os.ftruncate(self._fd, self._segment_bytes)
            self._allocated = self._segment_bytes

    async def _sync_now(self) -> None:
        """Sync the open segment (in a thread); notes the time for ``"interval"``."""
        await self._io(self._sync)
        self._last_sync = trio.current_time()

    async def _io(self, fn: Callable[..., None], *args: object, durable: bool = False) -> None:
        """Blocking file work: in a thread when syncing, inline otherwise; a cancel point before it (see run)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        call = functools.partial(fn, *args, durable=True) if durable else functools.partial(fn, *args)
        if (self.fsync == "never" and not durable) or self._inline:
            call()
        else:
            await trio.to_thread.run_sync(call)

    def _start_segment(self, number: int, body: bytes, *, durable: bool = False) -> None:
        """Create segment ``number`` holding ``body`` after its header and switch to it.

        Synced (file and directory) unless ``fsync="never"``; always when
        ``durable``: a checkpoint deletes the segments it replaces, so it must
        be on disk first in every mode, or a machine crash could lose jobs
        that were safe before it.
        """
        if self._fd >= 0 and self._dirty and self.fsync != "never":
            # The segment left is synced before the next one exists on disk:
            # a power cut must not leave a later segment and an older one cut short.
            self._sync()
        path = os.path.join(self.directory, segment_name(number))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        data = header(number) + body
        synced = durable or self.fsync != "never"
        try:
            _write_at(fd, data, 0)  # padding comes with the first commit (_zero_fill)
            if synced:
                os.fdatasync(fd)
                fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            self._trim()
            os.close(self._fd)
        self._fd = fd
        self._allocated = len(data)
        self._pad_step = PREALLOC_STEP
        self._dirty = False
        self._synced[number] = len(data) if synced else 0
        self._segment = number
        self._segment_bytes = len(data)
        self._segments[number] = (path, len(data))

    async def _roll(self) -> None:
        """The open segment is full: start the next, with a checkpoint when it pays."""
        await self.checkpoint(only_if_worth_it=True)

    async def checkpoint(self, *, only_if_worth_it: bool = False) -> bool:
        """Start a new segment; with a checkpoint (then delete older segments) if worth it.

        Runs in the writer task only (others call :meth:`request_checkpoint`).

        Returns whether a checkpoint was written. Records appended while the
        checkpoint is taken are reflected in it, so their callers are woken when
        it is durable.
        """
        # Exporting a million jobs takes seconds: estimate from the count first.
        if only_if_worth_it and self._live() * self._bytes_per_entry * 2 > self.disk_bytes:
            await self._io(self._start_segment, self._segment + 1, b"")
            return False
        entries = self._export()
        paused, rates, ticks = tuple(self._paused()), tuple(self._rates()), tuple(self._ticks())
        # Everything pending now was applied to the table before export():
        # the checkpoint holds it, so those records need not be written again.
        stolen, batch = self._pending, self._batch
        self._pending, self._batch = [], _Batch()
        batch.last = self._appended
        self._inflight = batch
        self._batch_no += 1
        # ENTRY rows are the table's export() tuples, in _records.Row's field order.
        frames = [frame_record(CheckpointBegin(len(entries), paused, rates, ticks))]
        frames.extend(frame(ENTRY, fields) for fields in entries)
        frames.append(frame_record(CheckpointEnd(len(entries))))
        body = b"".join(frames)
        # Marked like every other batch: a power cut that leaves some of its
        # pages unwritten is then a torn write to recovery, not corruption.
        crcs = chunk_crcs(body, HEADER_SIZE) if self.fsync == "always" else ()
        body += commit_frame(self._batch_no, HEADER_SIZE, crcs)
        try:
            await self._io(self._start_segment, self._segment + 1, body, durable=True)
            await self._io(self._delete_before, self._segment)
        except BaseException as exc:
            self._abandon(batch, exc)
            raise
        del stolen
        if entries:
            self._bytes_per_entry = max(len(body) / len(entries), 16.0)
        self.checkpoints += 1
        self._inflight = None
        self._committed = batch.last
        batch.set_done()
        return True

    def _delete_before(self, number: int) -> None:
        for n in sorted(self._segments):
            if n < number:
                path, _ = self._segments.pop(n)
                os.unlink(path)
        if self.fsync != "never":
            fsync_dir(self.directory)
