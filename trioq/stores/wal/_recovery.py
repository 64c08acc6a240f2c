"""Recovery: replay a WAL directory through the job table.

Each record is decoded through its typed struct (``_records``) and applied
through the table method that made it: ADD through ``add_packed`` (queue,
tenant, limit keys and deadline included), CLAIM through ``claim`` (with its
time, which takes the rate tokens of a job holding limit keys: the table's
``limits.limit_of`` should be set before replay), EXPIRE through ``expire``,
ADMIT through ``admit`` (replay itself never admits a deferred job: the table
has no ``defer_past`` until the session attaches), PAUSE and RESUME through
``pause`` and ``resume``; a checkpoint's BEGIN clears the table, pauses its
queues and sets its rates' state, and its ENTRY rows go through ``restore``.
TICK records, and the ticks a BEGIN carries, set ``Recovery.ticks`` (the cron
schedules' last ticks are the store's, not the table's).
Segments of log formats 2 to 5 read alike (older records are shorter arrays of the same
structs, their jobs in the default queue with no tenant and no deadline); a
log may hold segments of an older format followed by newer ones (see
``_format``).

Rules (DESIGN.md section 5): damage after the last commit marker of the last
segment is a write that never finished, so it is truncated (with a warning
giving the byte count) and recovery goes on. Damage anywhere else, in an older
segment or before a later valid commit marker, is corruption: WALCorruption
names the segment file and offset, and nothing past it is replayed.

What a crash can leave, and is therefore not damage:

- Segments older than the newest one that opens with a committed checkpoint
  are deleted unread (logged at INFO): the checkpoint replaced them.
- A last segment shorter than its header is removed, with a warning.
- Zeros after the last commit marker of the *last* segment are padding (the
  writer zero-fills ahead with ``fsync="always"``): cut off without a warning.
- Zeros after the last commit marker of an *older* segment are padding only
  where padding can be: the segment was written with ``fsync="always"`` (its
  commit markers carry page CRCs; no other mode writes zeros ahead) and no
  batch of its writer session is missing (see below). The writer trims a
  segment when it leaves it, but the trim is not synced: a machine crash right
  after the next session created its segment can leave the padding behind.

What a crash cannot leave, and is therefore WALCorruption, though every
record that remains reads cleanly (nothing here needs the format to change):

- A gap in the segment numbers replay reads (1, 2, 4): the writer numbers
  segments consecutively and deletes only segments older than a committed
  checkpoint. The error names the first missing segment's file.
- A log whose oldest segment read is not segment 1 and does not open with a
  committed checkpoint: the segment before it is missing (named, as above).
  A header-less last segment counts here, though it is removed and not read.
- Batches missing between two segments. The writer numbers its commits 1,
  2, 3, ... across every segment it writes (a checkpoint is one of them), and
  a new session goes on from the last batch replayed (:attr:`Recovery.last_batch`)
  in a fresh segment; a segment it opens by a roll begins with the batch after
  the previous segment's last one, and with ``"always"`` and ``"interval"``
  only once that segment is synced. So when a segment's first batch number
  ``F`` is above 1, the last batch replayed before it (segments holding none
  are skipped) must be ``F - 1``. An older segment cut, or zeroed, from a
  commit boundary to its end is reported this way; the error names the
  segment before, at its last commit's end. (Logs written before sessions
  numbered on began each session at batch 1, which is not checked.)
- Zeros after the last commit marker of an older segment not written with
  ``fsync="always"`` (or holding no commit at all): nothing but an overwrite
  puts them there.

Of a *machine* crash, ``"always"`` and ``"interval"`` keep these rules (a
roll and a close sync the segment left): with ``"never"`` (nothing synced) a
segment's unsynced end can be lost while a later segment reached the disk.
That is a loss of records the OS had been handed, which that mode allows; it
is reported as corruption rather than replayed around.

Undetectable: the end of a segment cut, or zeroed, from a commit boundary when
no segment after it holds a batch (the log's last segment, or one followed only
by empty segments), and the log's last segments deleted whole. By any reading
of the files that is a crash after that commit; telling them apart would need a
second durable record, updated at every commit.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterator

import attrs
import msgspec

from ..table.cron import TICK
from ..table.jobs import JobTable
from ..table.store import (
    ADD,
    ADMIT,
    CANCEL,
    CLAIM,
    DROP,
    EXPIRE,
    FAIL,
    PAUSE,
    RELEASE,
    RESUME,
    RETRY,
    SNOOZE,
    SUCCEED,
)
from ._format import (
    CHECKPOINT_BEGIN,
    CHECKPOINT_END,
    COMMIT,
    ENTRY,
    FRAME_OVERHEAD,
    HEADER_SIZE,
    Scan,
    WALCorruption,
    commit_info,
    list_segments,
    scan_segment,
    segment_name,
)
from ._records import (
    Add,
    Admit,
    Cancel,
    CheckpointBegin,
    Claim,
    Drop,
    Expire,
    Fail,
    Pause,
    Release,
    Resume,
    Retry,
    Row,
    Snooze,
    Succeed,
    Tick,
)
from ._writer import fsync_dir

__all__ = ["Recovery", "replay"]

log = logging.getLogger("trioq.wal")

# ADD dominates a log: replay decodes it itself (its payload stays msgpack).
_decode_add = msgspec.msgpack.Decoder(Add).decode
_decode_begin = msgspec.msgpack.Decoder(CheckpointBegin).decode


@attrs.define
class Recovery:
    """What :func:`replay` found and did."""

    segments: list[tuple[int, str]] = attrs.Factory(list)
    records: int = 0
    batches: int = 0
    truncated_bytes: int = 0
    truncated_segment: str | None = None
    #: Bytes of zero padding cut off the segments' ends (not damage).
    padding_bytes: int = 0
    checkpoints_seen: int = 0
    #: ``(segment number, jobs in it)`` of the last checkpoint replayed, if any.
    last_checkpoint: tuple[int, int] | None = None
    #: The number of the last batch replayed (0 if none): where a writer
    #: session could go on numbering (see the module docstring).
    last_batch: int = 0
    #: The format version of each segment replayed, by segment number (see ``_format``).
    versions: dict[int, int] = attrs.Factory(dict)
    #: Each cron schedule's last tick, by name: from the last checkpoint's BEGIN and the TICK
    #: records after it (the store's marks, not the table's: see ``table/cron.py``).
    ticks: dict[str, float] = attrs.Factory(dict)

    @property
    def last_segment(self) -> int:
        return self.segments[-1][0] if self.segments else 0


def _corruption(directory: str, path: str, offset: int, what: str) -> WALCorruption:
    return WALCorruption(
        f"WAL corrupted: {path} at byte offset {offset}: {what}. Nothing past it was replayed. "
        f"Inspect the log with `trioq wal verify {directory}`; keep a copy of the directory before repairing it.",
        path=path,
        offset=offset,
    )


# How each record type replays: decoded through its struct, applied to the
# table. False when the table refuses it (the log diverged); a table method may
# raise instead (InvalidJob, JobNotFound), which means the same. One call per
# record: replay runs these hundreds of thousands of times a second.
_claim_record = msgspec.msgpack.Decoder(Claim).decode
_succeed_record = msgspec.msgpack.Decoder(Succeed).decode
_fail_record = msgspec.msgpack.Decoder(Fail).decode
_snooze_record = msgspec.msgpack.Decoder(Snooze).decode
_release_record = msgspec.msgpack.Decoder(Release).decode
_cancel_record = msgspec.msgpack.Decoder(Cancel).decode
_retry_record = msgspec.msgpack.Decoder(Retry).decode
_drop_record = msgspec.msgpack.Decoder(Drop).decode
_expire_record = msgspec.msgpack.Decoder(Expire).decode
_admit_record = msgspec.msgpack.Decoder(Admit).decode
_pause_record = msgspec.msgpack.Decoder(Pause).decode
_resume_record = msgspec.msgpack.Decoder(Resume).decode
_tick_record = msgspec.msgpack.Decoder(Tick).decode
_entry_record = msgspec.msgpack.Decoder(Row).decode
#: The default queue as ADD and ENTRY decode it when the field is left off (the
#: struct's default object itself; one written, even "default", decodes to a new
#: string): ``is`` tells a record whose array stopped before its queue.
_DEFAULT_QUEUE = next(f.default for f in msgspec.structs.fields(Add) if f.name == "queue")
_intern = sys.intern


def _claim(table: JobTable, payload: memoryview) -> bool:
    r = _claim_record(payload)
    table.claim(r.id, r.now)
    return True


def _succeed(table: JobTable, payload: memoryview) -> bool:
    r = _succeed_record(payload)
    return table.succeed(r.id, r.epoch, r.result, r.now) is not None


def _fail(table: JobTable, payload: memoryview) -> bool:
    r = _fail_record(payload)
    return table.fail(r.id, r.epoch, r.error, r.retry_at, r.now, r.traceback) is not None


def _snooze(table: JobTable, payload: memoryview) -> bool:
    r = _snooze_record(payload)
    return table.snooze(r.id, r.epoch, r.run_at, r.now) is not None


def _release(table: JobTable, payload: memoryview) -> bool:
    r = _release_record(payload)
    return table.release(r.id, r.epoch) is not None


def _cancel(table: JobTable, payload: memoryview) -> bool:
    r = _cancel_record(payload)
    return table.cancel(r.id, r.now)[1]


def _retry(table: JobTable, payload: memoryview) -> bool:
    r = _retry_record(payload)
    table.retry(r.id, r.now)
    return True


def _drop(table: JobTable, payload: memoryview) -> bool:
    r = _drop_record(payload)
    table.drop(r.id)
    return True


def _expire(table: JobTable, payload: memoryview) -> bool:
    r = _expire_record(payload)
    table.expire(r.id, r.now)
    return True


def _admit(table: JobTable, payload: memoryview) -> bool:
    r = _admit_record(payload)
    table.admit(r.id, r.now)
    return True


def _pause(table: JobTable, payload: memoryview) -> bool:
    # The store logs a pause (a resume) only when it changes something: a PAUSE of a
    # queue paused already (a RESUME of one running) means the log diverged.
    return table.pause(_pause_record(payload).queue)


def _resume(table: JobTable, payload: memoryview) -> bool:
    return table.resume(_resume_record(payload).queue)


def _entry(table: JobTable, payload: memoryview) -> bool:
    r = _entry_record(payload)
    queue, tenant = r.queue, r.tenant
    if queue is not _DEFAULT_QUEUE:  # one string object per name, as for ADD (see _replay)
        queue = _intern(queue)
    if tenant is not None:
        tenant = _intern(tenant)
    # metadata: not in the table yet (see _records.Row).
    table.restore(
        r.id, r.task, r.payload, r.state, r.priority, r.key, r.max_attempts, r.run_at, r.created_at, r.seq,
        r.attempts, r.epoch, r.finished_at, r.result, r.error, r.errors, r.snoozes, queue, tenant, r.limits,
        r.after, r.deadline, r.cancelled_by,
    )  # fmt: skip
    return True


def _tick(ticks: dict[str, float], table: JobTable, payload: memoryview) -> bool:
    r = _tick_record(payload)
    ticks[r.name] = r.tick
    return True


def _checkpoint_end(table: JobTable, payload: memoryview) -> bool:
    table.restored()  # the waiting jobs' parents are all in now
    return True


#: The replay of each record type but ADD and CHECKPOINT_BEGIN (see _replay).
_REPLAY: dict[int, Callable[[JobTable, memoryview], bool]] = {
    EXPIRE: _expire,
    ADMIT: _admit,
    PAUSE: _pause,
    RESUME: _resume,
    CLAIM: _claim,
    SUCCEED: _succeed,
    FAIL: _fail,
    SNOOZE: _snooze,
    RELEASE: _release,
    CANCEL: _cancel,
    RETRY: _retry,
    DROP: _drop,
    ENTRY: _entry,
    CHECKPOINT_END: _checkpoint_end,
}


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic GC while replay builds the table.

    Replay creates one long-lived, acyclic object per job; with the collector
    on, every 25% of growth triggers a full collection that rescans them all
    (measured: 215k records/s with it, 366k without, on 200k records). The
    objects made meanwhile are collected normally once it resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay(directory: str, table: JobTable, *, repair: bool = True) -> Recovery:
    """Replay every committed batch of ``directory`` into ``table``; see :func:`_replay`."""
    with _collector_paused():
        return _replay(directory, table, repair=repair)


def _replay(directory: str, table: JobTable, *, repair: bool) -> Recovery:
    """Replay every committed batch of ``directory`` into ``table``.

    With ``repair`` (the default), a torn tail is truncated on disk so the next
    segment can follow it; without, the log is only read (``trioq wal verify``).
    Either way every check runs before anything on disk changes: a log that
    raises :class:`WALCorruption` is left as it was found (superseded segments,
    a header-less last segment and padding included). The table should not
    drop jobs by count meanwhile (the log records those drops); pass one with
    an unbounded ``max_retained``.
    """
    segments = list_segments(directory)
    recovery = Recovery()
    # TICK records set the recovery's marks (the one record kept outside the table).
    every_replay: dict[int, Callable[[JobTable, memoryview], bool]] = {
        **_REPLAY,
        TICK: functools.partial(_tick, recovery.ticks),
    }
    headerless: tuple[int, str] | None = None
    if segments and os.path.getsize(segments[-1][1]) < HEADER_SIZE:
        # Created, but its header never made it to disk: an unfinished write.
        headerless = segments.pop()
        recovery.truncated_bytes = os.path.getsize(headerless[1])
        recovery.truncated_segment = headerless[1]
    start, scans = _replay_start(directory, segments)
    superseded, segments = segments[:start], segments[start:]
    _check_numbers(directory, segments, headerless, scans)
    recovery.segments = segments
    count = len(segments)
    # Disk changes, made once the whole log has been read: (path, new size, torn bytes).
    cuts: list[tuple[str, int, int]] = []
    # The segment read before, and the number of the last batch replayed so far.
    before: tuple[str, int] | None = None
    shared: dict[str, str] = {}
    shared_bytes: dict[bytes, bytes] = {}
    shared_limits: dict[tuple[str, ...], tuple[str, ...]] = {}
    # The format of the segment read before (formats only go up along a log; see _format).
    newest_version, newest_segment = 0, 0
    for index, (number, path) in enumerate(segments):
        scan = scans.pop(index, None) or _scan(directory, path)
        if scan.number != number:
            raise _corruption(directory, path, 0, f"header says segment {scan.number}, file name says {number}")
        if scan.version < newest_version:
            raise _corruption(
                directory,
                path,
                0,
                f"a segment of WAL format {scan.version} after one of format {newest_version} (segment "
                f"{newest_segment}): only a trioq writing format {scan.version} makes such a segment, and it "
                "cannot open a log holding a later format",
            )
        newest_version, newest_segment = scan.version, number
        recovery.versions[number] = scan.version
        last = index == count - 1
        first = _first_commit(scan)
        tail = scan.size - scan.committed_end
        zeros = tail > 0 and scan.data.count(0, scan.committed_end) == tail
        if zeros and not last and (first is None or not first[1]):
            # Only fsync="always" pads (its markers carry page CRCs, no other
            # mode's do), and only after a commit: these zeros overwrote records.
            raise _corruption(
                directory,
                path,
                scan.committed_end,
                f"{tail} zero bytes after the last commit marker of a segment that is not the last and "
                + ("was written without fsync='always' (the only mode that pads)" if first else "holds no commit")
                + ": committed records were overwritten or lost",
            )
        padding = tail if zeros else 0
        if padding:
            tail = 0
        elif (
            scan.damage_at is not None
            and (not last or scan.commit_after_damage)
            # A torn final group commit is cut like any unfinished write, below.
            and not (last and scan.torn_final_batch())
        ):
            raise _corruption(directory, path, scan.damage_at, scan.damage or "damaged record")
        if tail and not last:
            raise _corruption(directory, path, scan.committed_end, "records after the last commit marker")
        if before is not None and first is not None and first[0] > 1 and first[0] != recovery.last_batch + 1:
            raise _batches_missing(directory, before, recovery.last_batch, first[0], path)
        previous_batch: int | None = None
        batch_start = HEADER_SIZE  # where the next batch must begin: its records are contiguous
        add_packed, decode_add, replayers, default_queue = table.add_packed, _decode_add, every_replay, _DEFAULT_QUEUE
        for kind, payload, offset in scan.committed():
            if kind == COMMIT:
                batch, start, _ = commit_info(payload)
                _check_batch(directory, path, offset, batch, start, previous_batch, batch_start)
                previous_batch, batch_start = batch, offset + FRAME_OVERHEAD + len(payload)
                recovery.last_batch = batch
                continue
            try:
                if kind == ADD:
                    # ADD dominates a log: its payload stays msgpack bytes
                    # (decoded only when the job first runs), no snapshot.
                    # metadata: not in the table yet (see _records.Add).
                    r = decode_add(payload)
                    # One object per distinct task name, queue, tenant, limit keys and
                    # small payload, as enqueue shares them: ~90 bytes per job at a million jobs.
                    task, packed = r.task, bytes(r.payload)
                    task = shared.setdefault(task, task)
                    if len(packed) <= 16:
                        packed = shared_bytes.setdefault(packed, packed)
                    queue = r.queue
                    if queue is default_queue:
                        # The struct's own default object: the array stopped before the
                        # queue, so every later field is at its default too (a queue
                        # written, even "default", decodes to a new string). The hot path:
                        # one test instead of four (~1% of an ADD's replay).
                        applied = (
                            add_packed(r.id, task, packed, r.priority, r.key, r.max_attempts, r.run_at, r.now) is None
                        )  # fmt: skip  (not deferred: replay's table has no defer_past)
                    else:
                        queue = shared.setdefault(queue, queue)
                        tenant = r.tenant
                        if tenant is not None:
                            tenant = shared.setdefault(tenant, tenant)
                        limits = r.limits
                        if limits:
                            limits = shared_limits.setdefault(limits, limits)
                        applied = add_packed(
                            r.id, task, packed, r.priority, r.key, r.max_attempts, r.run_at, r.now, queue, tenant,
                            r.deadline, limits, r.deferred, r.after,
                        ) is None  # fmt: skip
                elif kind == CHECKPOINT_BEGIN:
                    begin = _decode_begin(payload)
                    jobs = begin.jobs
                    table.clear()  # no queue paused either, no rate's token taken
                    for name in begin.paused:
                        table.pause(name)
                    if begin.rates:
                        table.limits.tat.update(begin.rates)
                    recovery.ticks.clear()  # the same dict the TICK replay writes to
                    recovery.ticks.update(begin.ticks)
                    applied = True
                    recovery.checkpoints_seen += 1
                    recovery.last_checkpoint = (number, jobs)
                else:
                    applied = replayers[kind](table, payload)
            except Exception as exc:
                raise _corruption(directory, path, offset, f"record does not replay: {exc}") from exc
            if not applied:
                raise _corruption(directory, path, offset, f"record of type {kind} does not replay")
        before = (path, scan.committed_end)
        recovery.records += scan.records
        recovery.batches += scan.batches
        recovery.padding_bytes += padding
        if tail:
            recovery.truncated_bytes = tail
            recovery.truncated_segment = path
        if tail or padding:
            cuts.append((path, scan.committed_end, tail))
        del scan  # one segment's bytes in memory at a time
    if repair:
        _repair(directory, [path for _, path in segments], headerless, superseded, cuts)
    return recovery


def _replay_start(directory: str, segments: list[tuple[int, str]]) -> tuple[int, dict[int, Scan]]:
    """The index of the newest segment that opens with a committed checkpoint (0 if none), and its scan.

    Everything before it is history the checkpoint replaced (left behind if a
    crash interrupted deleting it): it is not read. The segment at index 0 is
    not looked at: replay starts there anyway. The scan comes back keyed by
    the segment's index among the segments replay reads (0), for reuse.
    """
    for index in range(len(segments) - 1, 0, -1):
        if _first_record_type(segments[index][1]) == CHECKPOINT_BEGIN:
            scan = _scan(directory, segments[index][1])
            if _opens_with_checkpoint(scan):
                return index, {0: scan}
    return 0, {}


def _opens_with_checkpoint(scan: Scan) -> bool:
    """Whether the segment's first record is a CHECKPOINT_BEGIN and its first batch is committed."""
    return bool(scan.batches) and scan.first_kind == CHECKPOINT_BEGIN


def _check_numbers(
    directory: str, segments: list[tuple[int, str]], headerless: tuple[int, str] | None, scans: dict[int, Scan]
) -> None:
    """Raise :class:`WALCorruption` naming the first segment missing from the log replay reads.

    ``segments`` are the segments replay reads, oldest first; a header-less
    last segment (removed, not read) counts too. The writer numbers segments
    1, 2, 3, ... and deletes only segments older than a segment that opens
    with a committed checkpoint, so the numbers must be consecutive and the
    oldest must be 1 unless it opens with such a checkpoint. An empty list is
    a fresh log. Scans made for the check are left in ``scans`` (by index).
    """
    numbers = [number for number, _ in segments]
    if headerless is not None:
        numbers.append(headerless[0])
    if not numbers:
        return
    oldest = numbers[0]
    if oldest != 1:
        opens = False
        if segments:
            scan = scans.get(0)
            if scan is None and _first_record_type(segments[0][1]) == CHECKPOINT_BEGIN:
                scans[0] = scan = _scan(directory, segments[0][1])
            opens = scan is not None and _opens_with_checkpoint(scan)
        if not opens:
            raise _missing(
                directory,
                oldest - 1,
                oldest - 1,
                f"the log starts at segment {oldest} ({segment_name(oldest)}), which does not open with a committed "
                "checkpoint, so the segments before it still hold jobs (the writer deletes a segment only once a "
                "later checkpoint has replaced it)",
            )
    for previous, number in itertools.pairwise(numbers):
        if number != previous + 1:
            raise _missing(
                directory,
                previous + 1,
                number - 1,
                f"the log holds segment {previous} ({segment_name(previous)}) and then segment {number} "
                f"({segment_name(number)}); the writer numbers segments consecutively",
            )


def _first_commit(scan: Scan) -> tuple[int, bool] | None:
    """The batch number of the segment's first commit marker, and whether it carries page CRCs.

    ``None`` when the segment holds no commit. Every marker of a segment comes
    from one writer session (a session never appends to an older segment), so
    page CRCs in the first mean the segment was written with ``fsync="always"``.
    """
    for kind, payload, _ in scan.committed():
        if kind == COMMIT:
            batch, _, crcs = commit_info(payload)
            return batch, crcs
    return None


def _check_batch(
    directory: str, path: str, offset: int, batch: int, start: int, previous: int | None, expected_start: int
) -> None:
    """Raise :class:`WALCorruption` unless the batch whose marker is at ``offset`` follows the one before.

    Within a segment, one writer session wrote every batch, one after the
    other: each is numbered one past the previous, and begins where the
    previous ended (the first, after the header; checkpoints of older logs
    say 0). Otherwise committed records were cut out of the middle.
    """
    if previous is not None and batch != previous + 1:
        what = f"the commit of batch {batch} follows batch {previous}: the batches between were cut out"
        raise _corruption(directory, path, offset, what)
    if start != expected_start and not (start == 0 and previous is None):
        what = f"batch {batch} began at byte {start}, but the batch before it ended at {expected_start}"
        raise _corruption(directory, path, offset, what + ": the records between were cut out")


def _repair(
    directory: str,
    kept: list[str],
    headerless: tuple[int, str] | None,
    superseded: list[tuple[int, str]],
    cuts: list[tuple[str, int, int]],
) -> None:
    """Make the disk what replay read: remove what a crash left, cut tails and padding (each synced).

    First every segment replay keeps is synced, and the directory: what it
    read may have been only in the page cache (a process killed before its
    sync), and the next session builds on it (its batches numbered on from
    these, a checkpoint's older segments deleted); a power cut must not then
    take it back.
    """
    for path in kept:
        fd = os.open(path, os.O_RDONLY)  # enough to sync (Linux); a read-only segment stays readable
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory)
    if headerless is not None:
        log.warning("trioq WAL: removing %s, a segment whose header was never written", headerless[1])
        os.unlink(headerless[1])
    for _, path in superseded:
        log.info("trioq WAL: deleting %s, replaced by a later checkpoint", path)
        os.unlink(path)
    if headerless is not None or superseded:
        fsync_dir(directory)
    for path, size, torn in cuts:
        if torn:  # padding is no news: the writer zero-fills ahead
            log.warning(
                "trioq WAL: truncating %d bytes after the last commit marker of %s (a write that never finished)",
                torn,
                path,
            )
        with open(path, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())


def _missing(directory: str, first: int, last: int, why: str) -> WALCorruption:
    """The error for segments ``first`` to ``last`` missing from ``directory`` (``path`` names the first)."""
    path = os.path.join(directory, segment_name(first))
    which = f"segment {first} ({path}) is missing" + (
        f", and every segment after it up to {last} ({segment_name(last)})" if last > first else ""
    )
    return WALCorruption(
        f"WAL corrupted: {which}: {why}. Nothing was replayed. If the file was moved away (or a backup was "
        "restored without it), put it back; otherwise the jobs it held are lost. "
        f"Inspect the log with `trioq wal verify {directory}`; keep a copy of the directory before repairing it.",
        path=path,
        offset=None,
    )


def _batches_missing(
    directory: str, before: tuple[str, int], last_batch: int, first_batch: int, path: str
) -> WALCorruption:
    """The error for a segment whose first batch does not follow the last batch replayed before it."""
    earlier, end = before
    name = os.path.basename(path)
    if last_batch < first_batch:
        lost = (
            f"batch {first_batch - 1} is"
            if last_batch + 2 == first_batch
            else f"batches {last_batch + 1} to {first_batch - 1} are"
        )
        what = (
            (
                f"the log's last batch up to here is batch {last_batch}"
                if last_batch
                else "no batch was committed up to here"
            )
            + f", and the next segment, {name}, continues its writer session with batch {first_batch}: {lost} missing "
            "(the end of this segment was cut off or overwritten)"
        )
    else:
        what = (
            f"the log's last batch up to here is batch {last_batch}, but the next segment, {name}, begins with "
            f"batch {first_batch} of the same writer session: the segments do not follow one another"
        )
    return _corruption(directory, earlier, end, what)


def _scan(directory: str, path: str) -> Scan:
    """:func:`scan_segment`, with header damage reported like any other corruption."""
    try:
        return scan_segment(path)
    except WALCorruption as exc:
        raise _corruption(directory, path, exc.offset or 0, str(exc).removeprefix(f"{path}: ")) from None


def _first_record_type(path: str) -> int | None:
    """The type of a segment's first record, read without scanning the file."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE + FRAME_OVERHEAD)
    return head[-1] if len(head) == HEADER_SIZE + FRAME_OVERHEAD else None
