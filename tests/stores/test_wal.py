"""WALStore beyond the conformance suite: torn tails, corruption, the lock,
recovery after a crash, bounded disk use, group commit, and a property test
that a log cut at any byte replays to the state as of its last commit marker.

A "crash" in-process is a copy of the WAL directory taken while the store is
open: every transition that returned was handed to the OS before it returned,
so the copy holds exactly what a ``kill -9`` at that moment would leave.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trioq
from trioq import FailedAttempt, InvalidJob, Job, JobNotFound, JobState, WALCorruption, WALLocked, WALStore
from trioq.stores import ClaimRequest, Failed, NewJob, Released, Snoozed, StoreConfig, Succeeded
from trioq.stores.table.jobs import JobTable
from trioq.stores.table.store import ADD, CLAIM
from trioq.stores.wal import _format, _writer
from trioq.stores.wal._format import HEADER_SIZE, commit_frame, frame, header, list_segments, scan_segment
from trioq.stores.wal._recovery import replay

START = 1_700_000_000.0
_FRAME = struct.Struct("<IIB")  # payload length, CRC32C, type (see _format)


class Clock:
    """A wall clock moved by hand."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_job(clock: Clock, *, delay: float = 0.0, key: str | None = None, **payload: Any) -> NewJob:
    return NewJob(task="t", payload=payload, priority=0, key=key, max_attempts=3, delay=float(delay))


@asynccontextmanager
async def opened(path: Path, clock: Clock, **kwargs: Any) -> AsyncIterator[WALStore]:
    """A WALStore on ``path``, open in a session driven by ``clock``."""
    config = StoreConfig(
        clock=clock,
        retention=kwargs.pop("retention", 3600.0),
        max_retained=kwargs.pop("max_retained", 100_000),
    )
    kwargs.setdefault("fsync", "never")
    store = WALStore(path, **kwargs)
    async with store.session(config):
        yield store


# The store protocol, one attempt at a time. Outcomes through complete() need
# not be durable when it returns; these helpers sync after it unless told
# otherwise (durable=False), as a reporter of an outcome does.


async def claim_one(store: WALStore) -> Job | None:
    """The best ready job, claimed (``None`` when none is ready)."""
    jobs = await store.claim(ClaimRequest("test", 1))
    assert len(jobs) <= 1
    return jobs[0] if jobs else None


async def claim(store: WALStore) -> Job:
    job = await claim_one(store)
    assert job is not None
    return job


async def succeed(store: WALStore, job_id: str, epoch: int, result: Any, *, durable: bool = True) -> bool:
    """Whether the attempt's success was taken (``False``: its epoch is stale)."""
    (state,) = await store.complete([Succeeded(job_id, epoch, result)])
    if durable:
        await store.sync()
    return state is not None


async def fail(
    store: WALStore, job_id: str, epoch: int, error: str, retry_in: float | None, *, traceback: str | None = None
) -> JobState | None:
    """The job's state after the failed attempt (``None``: its epoch is stale); durable."""
    (state,) = await store.complete([Failed(job_id, epoch, error, retry_in, traceback)])
    await store.sync()
    return state


async def release(store: WALStore, job_id: str, epoch: int) -> JobState | None:
    """The job's state after the attempt was cut off (``None``: its epoch is stale); durable."""
    (state,) = await store.complete([Released(job_id, epoch)])
    await store.sync()
    return state


def segments(path: Path) -> list[Path]:
    return [Path(p) for _, p in list_segments(str(path))]


def wal_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.wal"))


def records(path: Path) -> list[tuple[int, int, int]]:
    """``(offset, type, payload length)`` of every record of a segment file."""
    data = path.read_bytes()
    out = []
    pos = HEADER_SIZE
    while pos < len(data):
        length, _, kind = _FRAME.unpack_from(data, pos)
        out.append((pos, kind, length))
        pos += _FRAME.size + length
    assert pos == len(data)
    return out


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def crash_copy(src: Path, dst: Path) -> Path:
    """What a kill -9 would leave of ``src`` now (the store's lock is not copied as held)."""
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------- torn tails


def _torn_tails() -> Iterator[tuple[str, bytes]]:
    whole = frame(ADD, ("torn-job", "t", {}, 0, None, 3, START, START))
    yield "half a frame", whole[: len(whole) // 2]
    yield "frame header only", whole[:5]
    yield "whole record, no commit marker", whole
    yield "random bytes", bytes(range(7, 250, 3))


@pytest.mark.parametrize("tail", [t for _, t in _torn_tails()], ids=[name for name, _ in _torn_tails()])
async def test_torn_tail_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        jobs = await store.add([new_job(clock, n=i) for i in range(5)])
        running = await claim(store)
        await succeed(store, running.id, running.epoch, {"ok": 1})
        before = {j.id: await store.get(j.id) for j in jobs}
    last = segments(wal)[-1]
    clean_size = last.stat().st_size
    with last.open("ab") as f:
        f.write(tail)

    with caplog.at_level(logging.WARNING, logger="trioq.wal"):
        async with opened(wal, clock) as store:
            assert {j.id: await store.get(j.id) for j in jobs} == before
            with pytest.raises(JobNotFound):
                await store.get("torn-job")
            assert store.recovery is not None
            assert store.recovery.truncated_bytes == len(tail)

    warnings = [r for r in caplog.records if r.name == "trioq.wal" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"{len(tail)} bytes" in message
    assert last.name in message
    # Truncated back to the last commit marker (the clean end of the log).
    assert last.stat().st_size == clean_size
    assert scan_segment(str(last)).committed_end == clean_size

    # The repaired segment is now an older one: the log opens cleanly again.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trioq.wal"):
        async with opened(wal, clock) as store:
            assert {j.id: await store.get(j.id) for j in jobs} == before
    assert [r for r in caplog.records if r.name == "trioq.wal"] == []


async def test_always_pads_the_open_segment_with_zeros_and_trims_it_at_close(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always", segment_size=256 * 1024) as store:
        await store.add([new_job(clock, n=i) for i in range(10)])
        (segment,) = segments(wal)
        data = segment.read_bytes()
        end = scan_segment(str(segment)).committed_end
        assert len(data) == 256 * 1024  # min(PREALLOC_STEP, segment_size)
        assert data[end:] == bytes(len(data) - end)
        usage = store.disk_usage()
        assert (usage["bytes"], usage["padding_bytes"]) == (end, len(data) - end)
    assert segment.stat().st_size == end  # trimmed: a closed segment is its records


async def test_a_disk_too_full_to_pad_ahead_still_takes_a_batch_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    room = 4096  # bytes the "disk" lets the open segment grow to
    real_write_at = _writer._write_at

    refused: list[int] = []

    def small_disk(fd: int, data: bytes | memoryview, offset: int) -> None:
        if offset + len(data) > room:
            refused.append(offset)
            real_write_at(fd, data[: max(room - offset, 0)], offset)  # a full disk takes what fits first
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_at(fd, data, offset)

    async with opened(wal, clock, fsync="always", segment_size=256 * 1024) as store:
        monkeypatch.setattr(_writer, "_write_at", small_disk)
        jobs = await store.add([new_job(clock, n=i) for i in range(3)])  # a few hundred bytes: fits
        (segment,) = segments(wal)
        end = scan_segment(str(segment)).committed_end
        assert segment.stat().st_size == end  # zeros only up to the batch, none ahead
        more = await store.add([new_job(clock, n=3)])  # and the next batch that fits, too
        assert len(refused) == 1  # padding ahead was tried once, not again on every commit
    monkeypatch.undo()
    jobs += more
    async with opened(wal, clock) as store:
        assert [(await store.get(j.id)).state for j in jobs] == [JobState.READY] * 4


async def test_padding_left_by_a_crash_is_not_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always") as store:
        jobs = await store.add([new_job(clock, n=i) for i in range(5)])
        running = await claim(store)
        await succeed(store, running.id, running.epoch, {"ok": 1})
        before = {j.id: await store.get(j.id) for j in jobs}
        crashed = crash_copy(wal, tmp_path / "crashed")
    (padded,) = segments(crashed)
    padded_size = padded.stat().st_size
    committed = scan_segment(str(padded)).committed_end
    assert padded_size > committed

    with caplog.at_level(logging.WARNING, logger="trioq.wal"):
        async with opened(crashed, clock) as store:
            assert {j.id: await store.get(j.id) for j in jobs} == before
            assert store.recovery is not None
            assert store.recovery.truncated_bytes == 0
            assert store.recovery.padding_bytes == padded_size - committed
    assert [r for r in caplog.records if r.name == "trioq.wal"] == []
    assert padded.stat().st_size == committed


async def test_padding_is_not_damage_in_an_older_segment_either(tmp_path: Path) -> None:
    # A crash after a roll, before the left segment's trim reached the disk.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always", segment_size=4096) as store:
        jobs = await store.add([new_job(clock, n=i) for i in range(200)])
    older = segments(wal)[0]
    assert len(segments(wal)) > 1
    with older.open("ab") as f:
        f.write(bytes(5000))
    async with opened(wal, clock) as store:
        assert [(await store.get(j.id)).state for j in jobs] == [JobState.READY] * 200
        assert store.recovery is not None and store.recovery.padding_bytes == 5000


@pytest.mark.parametrize("loss", ["page never written", "flipped byte"])
async def test_a_page_of_the_last_batch_lost_in_a_power_cut_is_a_torn_write(tmp_path: Path, loss: str) -> None:
    # fsync="always" overwrites zero-filled blocks: a power cut during a batch's
    # fdatasync can leave one of its pages zeros while the page with its commit
    # marker is on disk. That batch was never acknowledged. A flipped byte in
    # the same place is corruption as ever.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always") as store:
        kept = await store.add([new_job(clock, n=i) for i in range(5)])
        lost = await store.add([new_job(clock, n=i, text="x" * 60) for i in range(300)])
        crashed = crash_copy(wal, tmp_path / "crashed")
    (segment,) = segments(crashed)
    data = bytearray(segment.read_bytes())
    *_, (_, before_last), (_, last_end) = _format._commits_after(bytes(data), HEADER_SIZE)
    page = -(-before_last // _format.PAGE) * _format.PAGE
    assert page + 2 * _format.PAGE < last_end  # the batch spans pages; the marker's page is later
    if loss == "page never written":
        data[page : page + _format.PAGE] = bytes(_format.PAGE)
    else:
        data[page + 100] ^= 0x5A
    segment.write_bytes(bytes(data))

    if loss == "flipped byte":
        with pytest.raises(WALCorruption, match=segment.name):
            async with opened(crashed, clock):
                pass
        return
    async with opened(crashed, clock) as store:
        assert [(await store.get(j.id)).state for j in kept] == [JobState.READY] * 5
        for job in lost:
            with pytest.raises(JobNotFound):
                await store.get(job.id)
        assert store.recovery is not None and store.recovery.truncated_bytes > 0


@pytest.mark.parametrize("fsync", ["always", "never"])
async def test_a_flipped_byte_beside_a_record_full_of_zeros_is_corruption(tmp_path: Path, fsync: str) -> None:
    # msgpack writes 0 as a zero byte: a record can hold whole pages of zeros.
    # A flipped byte in the last batch is damage all the same; only pages the
    # commit marker's CRCs say were not written may be zeros (and "never",
    # which records no CRCs, gets no allowance at all).
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync) as store:
        await store.add([new_job(clock, n=1)])
        await store.add([new_job(clock, v=[0] * 9000)])
        crashed = crash_copy(wal, tmp_path / "crashed")
    (segment,) = segments(crashed)
    data = bytearray(segment.read_bytes())
    *_, (_, before_last), _ = _format._commits_after(bytes(data), HEADER_SIZE)
    first_zero_page = -(-(before_last + 64) // _format.PAGE) * _format.PAGE
    assert data.count(0, first_zero_page, first_zero_page + _format.PAGE) == _format.PAGE
    data[before_last + 40] ^= 0x5A  # in the ADD record, before its zeros
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorruption, match=segment.name):
        async with opened(crashed, clock):
            pass


async def test_zeros_after_part_of_a_record_are_a_torn_write(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        await store.add([new_job(clock, n=1)])
    last = segments(wal)[-1]
    whole = frame(ADD, ("torn-job", "t", {}, 0, None, 3, START, START))
    with last.open("ab") as f:
        f.write(whole[: len(whole) // 2] + bytes(100))
    async with opened(wal, clock) as store:
        assert store.recovery is not None
        assert store.recovery.truncated_bytes == len(whole) // 2 + 100
        assert store.recovery.padding_bytes == 0


@pytest.mark.parametrize("keep", [0, HEADER_SIZE // 2])
async def test_last_segment_cut_inside_its_header_is_an_unfinished_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, keep: int
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (job,) = await store.add([new_job(clock)])
    # What the writer leaves if killed right after os.open(O_CREAT) of the next segment.
    number = int(segments(wal)[-1].stem) + 1
    (wal / f"{number:020d}.wal").write_bytes(header(number)[:keep])
    with caplog.at_level(logging.WARNING, logger="trioq.wal"):
        async with opened(wal, clock) as store:
            assert (await store.get(job.id)).state is JobState.READY
    assert any(r.name == "trioq.wal" and r.levelno == logging.WARNING for r in caplog.records)
    async with opened(wal, clock) as store:  # and the log stays openable
        assert (await store.get(job.id)).state is JobState.READY


# ------------------------------------------------------------- corruption


async def _log_with_old_segments(wal: Path, clock: Clock, jobs: int = 200) -> list[Job]:
    """A log over several segments that a checkpoint has not folded away."""
    async with opened(wal, clock, segment_size=4096) as store:
        added = [(await store.add([new_job(clock, n=i)]))[0] for i in range(jobs)]
        assert store._writer is not None and store._writer.checkpoints == 0
    assert len(segments(wal)) >= 3
    return added


# Where in a record the flipped byte lands: frame fields and payload.
_FLIP_AT = {"length": 0, "crc": 5, "type": 8, "payload": 12}


@pytest.mark.parametrize("where", sorted(_FLIP_AT))
async def test_flipped_byte_in_an_older_segment_is_corruption(tmp_path: Path, where: str) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _log_with_old_segments(wal, clock)
    older = segments(wal)[0]
    offset, _, _ = records(older)[3]
    flip(older, offset + _FLIP_AT[where])
    size = older.stat().st_size

    for _ in range(2):  # the failed open released the lock and repaired nothing
        with pytest.raises(WALCorruption) as info:
            async with opened(wal, clock):
                pass  # pragma: no cover
        error = info.value
        assert error.path == str(older)
        assert error.offset == offset
        message = str(error)
        assert older.name in message
        assert str(offset) in message
        assert "trioq wal verify" in message
        assert older.stat().st_size == size


@pytest.mark.parametrize("where", sorted(_FLIP_AT))
async def test_flipped_byte_before_the_last_commit_marker_is_corruption(tmp_path: Path, where: str) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        for i in range(10):
            await store.add([new_job(clock, n=i)])
    last = segments(wal)[-1]
    offsets = [off for off, kind, _ in records(last) if kind == ADD]
    target = offsets[len(offsets) // 2]  # valid commit markers follow it
    flip(last, target + _FLIP_AT[where])
    size = last.stat().st_size

    with pytest.raises(WALCorruption) as info:
        async with opened(wal, clock):
            pass  # pragma: no cover
    error = info.value
    assert (error.path, error.offset) == (str(last), target)
    assert last.name in str(error) and str(target) in str(error)
    assert "trioq wal verify" in str(error)
    assert last.stat().st_size == size  # corruption is never "repaired" by truncation


async def test_damaged_header_of_an_older_segment_is_corruption(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _log_with_old_segments(wal, clock, jobs=120)
    older = segments(wal)[0]
    flip(older, 3)  # inside the magic
    with pytest.raises(WALCorruption) as info:
        async with opened(wal, clock):
            pass  # pragma: no cover
    assert (info.value.path, info.value.offset) == (str(older), 0)
    assert older.name in str(info.value)
    assert "trioq wal verify" in str(info.value)


async def test_record_that_does_not_replay_is_reported_where_it_is(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        await store.add([new_job(clock)])
    last = segments(wal)[-1]
    at = last.stat().st_size
    with last.open("ab") as f:  # well-formed and committed, but names no job
        f.write(frame(CLAIM, ("no-such-job",)) + commit_frame(10_000))
        f.write(frame(ADD, ("later-job", "t", {}, 0, None, 3, START, START)) + commit_frame(10_001))
    with pytest.raises(WALCorruption) as info:
        async with opened(wal, clock):
            pass  # pragma: no cover
    assert info.value.path == str(last)
    assert info.value.offset == at
    assert str(at) in str(info.value) and "trioq wal verify" in str(info.value)


async def test_corruption_comes_out_of_open_queue_as_itself(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _log_with_old_segments(wal, clock, jobs=120)
    older = segments(wal)[0]
    flip(older, records(older)[0][0] + 12)
    with pytest.raises(WALCorruption) as info:
        async with trioq.open_queue(trioq.Registry(), store=WALStore(wal, fsync="never"), workers=0):
            pass  # pragma: no cover
    assert type(info.value) is WALCorruption
    assert info.value.path == str(older)


# ------------------------------------------------------------------ lock


async def test_second_store_on_an_open_directory_is_locked_out(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as first:
        (job,) = await first.add([new_job(clock)])
        with pytest.raises(WALLocked) as info:
            async with opened(wal, clock):
                pass  # pragma: no cover
        assert str(os.getpid()) in str(info.value)
        assert isinstance(info.value, trioq.TrioqError)
        with pytest.raises(WALLocked):
            async with trioq.open_queue(trioq.Registry(), store=WALStore(wal), workers=0):
                pass  # pragma: no cover
        # The refused opener did not disturb the owner.
        assert (await claim(first)).id == job.id
    async with opened(wal, clock) as second:
        assert (await second.get(job.id)).state is JobState.READY


# -------------------------------------------------------------- recovery


async def test_recovery_after_a_crash(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        running, retried, scheduled, keyed, done, dead, cancelled = await store.add(
            [
                new_job(clock, n=1),
                new_job(clock, n=2),
                new_job(clock, delay=600.0, n=3),
                new_job(clock, key="the-key", n=4),
                new_job(clock, n=5),
                NewJob("t", {"n": 6}, 0, None, 1),
                new_job(clock, delay=30.0, n=7),
            ]
        )
        # Two earlier attempts of `running` were cut off and released: epoch 2 so far.
        for _ in range(2):
            first = await claim(store)
            assert first.id == running.id
            await release(store, first.id, first.epoch)
        cut_off = await claim(store)
        assert (cut_off.id, cut_off.epoch) == (running.id, 3)
        failing = await claim(store)
        assert failing.id == retried.id
        clock.now += 1.0
        await fail(store, failing.id, failing.epoch, "ValueError: once", 50.0)
        assert (await claim(store)).id == keyed.id
        got = await claim(store)
        assert got.id == done.id
        assert await succeed(store, done.id, got.epoch, {"sent": True}) is True
        got = await claim(store)
        assert got.id == dead.id
        await fail(store, dead.id, got.epoch, "KeyError: 'x'", 0.0)
        await store.cancel(cancelled.id)
        ids = [running.id, retried.id, scheduled.id, keyed.id, done.id, dead.id, cancelled.id]
        before = {job_id: await store.get(job_id) for job_id in ids}
        assert before[keyed.id].state is JobState.RUNNING
        crashed = crash_copy(wal, tmp_path / "crashed")

    clock.now += 5.0
    async with opened(crashed, clock) as store:
        after = {job_id: await store.get(job_id) for job_id in ids}
        # Running at the crash: ready again, same epoch, the attempt not counted.
        for job_id in (running.id, keyed.id):
            assert after[job_id] == attrs.evolve(before[job_id], state=JobState.READY)
            assert after[job_id].attempts == before[job_id].attempts == 0
        assert after[running.id].epoch == 3
        # Scheduled jobs keep their run_at (and a failed one its attempts and error).
        assert after[scheduled.id] == before[scheduled.id]
        assert after[retried.id] == before[retried.id]
        assert after[retried.id].state is JobState.SCHEDULED
        assert after[retried.id].run_at == START + 51.0
        assert after[retried.id].attempts == 1 and after[retried.id].error == "ValueError: once"
        # Terminal jobs are retained with their results and errors.
        assert after[done.id] == before[done.id]
        assert after[done.id].state is JobState.SUCCEEDED and after[done.id].result == {"sent": True}
        assert after[dead.id] == before[dead.id] and after[dead.id].state is JobState.DEAD
        assert after[cancelled.id] == before[cancelled.id] and after[cancelled.id].state is JobState.CANCELLED
        # The idempotency key survives.
        (same,) = await store.add([new_job(clock, key="the-key")])
        assert same.id == keyed.id
        # Epochs go on from where they were: the cut-off attempt cannot complete the job.
        assert await succeed(store, running.id, cut_off.epoch, "late") is False
        again = await claim(store)
        assert again.id == running.id and again.epoch == cut_off.epoch + 1
        assert await store.counts() == {
            "scheduled": 2,
            "ready": 1,
            "running": 1,
            "succeeded": 1,
            "dead": 1,
            "cancelled": 1,
            "deferred": 0,
            "waiting": 0,
        }


async def test_recovery_through_a_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, segment_size=4096) as store:
        jobs = await store.add([new_job(clock, delay=5.0 if i % 3 == 2 else 0.0, key=f"k{i}", n=i) for i in range(30)])
        for _ in range(10):
            job = await claim(store)
            await succeed(store, job.id, job.epoch, job.payload["n"])
        held = await claim(store)
        await store.checkpoint()
        assert len(segments(wal)) == 1
        for _ in range(5):
            job = await claim(store)
            await fail(store, job.id, job.epoch, "E: x", 9.0)
        before = {j.id: await store.get(j.id) for j in jobs}
        crashed = crash_copy(wal, tmp_path / "crashed")
    async with opened(crashed, clock) as store:
        after = {j.id: await store.get(j.id) for j in jobs}
        assert after[held.id] == attrs.evolve(before[held.id], state=JobState.READY)
        del after[held.id], before[held.id]
        assert after == before
        assert store.recovery is not None and store.recovery.checkpoints_seen == 1


async def test_a_snooze_replays(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (job, other) = await store.add([new_job(clock), new_job(clock)])
        got = await claim(store)
        clock.now += 2.0
        assert await store.complete([Snoozed(got.id, got.epoch, 30.0)]) == [JobState.SCHEDULED]
        await store.sync()
        before = await store.get(job.id)
        crashed = crash_copy(wal, tmp_path / "crashed")
    assert (before.state, before.run_at, before.attempts, before.epoch) == (JobState.SCHEDULED, START + 32.0, 0, 1)
    async with opened(crashed, clock) as store:
        assert await store.get(job.id) == before  # uncounted, scheduled for the snooze's end
        assert store._table is not None and store._table.entry(job.id).snoozes == 1
        assert (await claim(store)).id == other.id  # not due yet
        clock.now += 30.0
        await store.promote()
        assert (await claim(store)).id == job.id


async def test_a_snooze_past_the_limit_replays_as_the_death_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trioq.stores.table.jobs.MAX_SNOOZES", 2)
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (job,) = await store.add([new_job(clock)])
        states = []
        for _ in range(3):
            got = await claim(store)
            states += await store.complete([Snoozed(got.id, got.epoch, 0.0)])
        await store.sync()
        before = await store.get(job.id)
        crashed = crash_copy(wal, tmp_path / "crashed")
    assert states == [JobState.READY, JobState.READY, JobState.DEAD]
    assert before.error is not None and before.error.startswith("SnoozeLimit")
    async with opened(crashed, clock) as store:
        assert await store.get(job.id) == before


async def test_a_failure_with_a_traceback_replays_with_it(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    tb = 'Traceback (most recent call last):\n  File "h.py", line 1\nValueError: boom\n'
    async with opened(wal, clock) as store:
        (job,) = await store.add([new_job(clock)])
        got = await claim(store)
        clock.now += 1.0
        assert await fail(store, got.id, got.epoch, "ValueError: boom", 10.0, traceback=tb) is JobState.SCHEDULED
        before = await store.get(job.id)
        crashed = crash_copy(wal, tmp_path / "crashed")
    assert before.errors == (FailedAttempt(1, "ValueError: boom", tb, START + 1.0),)
    async with opened(crashed, clock) as store:
        assert await store.get(job.id) == before
        assert (await store.get(job.id)).errors[0].traceback == tb


async def test_a_failure_without_retry_replays_as_dead(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (job,) = await store.add([new_job(clock)])  # max_attempts=3: only "no retry" kills it now
        got = await claim(store)
        assert await fail(store, got.id, got.epoch, "NoRetry: give up", None) is JobState.DEAD
        before = await store.get(job.id)
        crashed = crash_copy(wal, tmp_path / "crashed")
    assert (before.state, before.attempts, before.error) == (JobState.DEAD, 1, "NoRetry: give up")
    async with opened(crashed, clock) as store:
        assert await store.get(job.id) == before
        assert (await store.counts())["dead"] == 1


async def test_errors_and_snoozes_survive_a_checkpoint_and_a_reopen(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (job, dead) = await store.add([NewJob("t", {}, 1, None, 3), NewJob("t", {}, 0, None, 2)])
        # `job` first (priority 1): a failure, a snooze, a failure.
        got = await claim(store)
        assert got.id == job.id
        assert await fail(store, got.id, got.epoch, "E: one", 0.0, traceback="tb one") is JobState.READY
        got = await claim(store)
        assert await store.complete([Snoozed(got.id, got.epoch, 0.0)]) == [JobState.READY]
        got = await claim(store)
        clock.now += 1.0
        assert await fail(store, got.id, got.epoch, "E: two", 100.0) is JobState.SCHEDULED
        # Then `dead`: two failures, and it is dead.
        got = await claim(store)
        assert got.id == dead.id
        assert await fail(store, got.id, got.epoch, "E: dead one", 0.0) is JobState.READY
        got = await claim(store)
        assert await fail(store, got.id, got.epoch, "E: dead two", 5.0, traceback="tb") is JobState.DEAD
        await store.sync()
        before = {j.id: await store.get(j.id) for j in (job, dead)}
        assert store._table is not None
        snoozes = {j.id: store._table.entry(j.id).snoozes for j in (job, dead)}
        await store.checkpoint()
        assert len(segments(wal)) == 1  # everything since is in the checkpoint
    assert before[job.id].errors == (
        FailedAttempt(1, "E: one", "tb one", START),
        FailedAttempt(2, "E: two", None, START + 1.0),
    )
    assert [e.error for e in before[dead.id].errors] == ["E: dead one", "E: dead two"]
    assert snoozes == {job.id: 1, dead.id: 0}
    for _ in range(2):  # the checkpoint's rows, then those rows rewritten by the next session's checkpoint
        async with opened(wal, clock) as store:
            assert store.recovery is not None and store.recovery.checkpoints_seen == 1
            assert {j.id: await store.get(j.id) for j in (job, dead)} == before
            assert store._table is not None
            assert {j.id: store._table.entry(j.id).snoozes for j in (job, dead)} == snoozes
            await store.checkpoint()


# ------------------------------------------------------------- disk usage


async def test_disk_use_follows_live_jobs_not_history(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, record_property: Any
) -> None:
    registry = trioq.Registry()

    @registry.task
    async def noop(ctx: trioq.JobContext) -> None:
        pass

    wal = tmp_path / "wal"
    store = WALStore(wal, fsync="never", segment_size=64 * 1024)
    peak = [0]

    async def produce(n: int) -> None:
        for _ in range(n):
            await queue.enqueue("noop")
            peak[0] = max(peak[0], store.disk_usage()["bytes"])

    between_rounds = []
    async with trioq.open_queue(registry, store=store, workers=8, retention=0) as queue:
        for _ in range(20):
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(produce, 100)
            await queue.join()
            # No-op jobs take no virtual time: let some pass, as it would for
            # real, so maintenance evicts them (retention=0).
            await trio.sleep(0.2)
            between_rounds.append(wal_bytes(wal))
        stats = await queue.stats()
        assert stats["jobs"]["succeeded"] == 0
        assert stats["totals"]["enqueued"] == stats["totals"]["succeeded"] == 20_000
        assert store._writer is not None
        checkpoints = store._writer.checkpoints
    final = wal_bytes(wal)
    record_property("wal_bytes_final", final)
    record_property("wal_bytes_peak", peak[0])
    print(
        f"disk use over 20 x 1,000 jobs: final {final} B, peak {peak[0]} B, "
        f"largest between rounds {max(between_rounds)} B, checkpoints {checkpoints}"
    )
    assert checkpoints >= 10
    assert final < 256 * 1024
    # A roll skips the checkpoint while it would cost over half the log: with
    # at most ~1,000 jobs live, that is ~240 kB of log plus one 64 KiB segment.
    assert max(between_rounds) < 384 * 1024
    assert peak[0] < 384 * 1024


@pytest.mark.parametrize("unlinked", [0, 1, 2], ids=["none", "oldest", "two-oldest"])
async def test_crash_while_deleting_segments_after_a_checkpoint(tmp_path: Path, unlinked: int) -> None:
    """A kill -9 after the checkpoint's segment is durable but before (or between)
    the unlinks of the segments it replaced: the log still opens, with every job."""
    clock = Clock()
    wal = tmp_path / "wal"
    saved = tmp_path / "before-checkpoint"
    async with opened(wal, clock, segment_size=4096) as store:
        jobs = await store.add([new_job(clock, n=i) for i in range(10)])
        for i in range(120):
            await store.add([new_job(clock, n=i)])
        for _ in range(5):
            job = await claim(store)
            await succeed(store, job.id, job.epoch, None)
        before = {j.id: await store.get(j.id) for j in jobs}
        shutil.copytree(wal, saved)
        await store.checkpoint()
    old = segments(saved)
    assert len(old) >= 3 and len(segments(wal)) == 1
    for path in old[unlinked:]:  # the oldest were unlinked, then the process died
        shutil.copy(path, wal)
    for _ in range(2):
        async with opened(wal, clock) as store:
            assert {j.id: await store.get(j.id) for j in jobs} == before
            assert (await store.counts())["ready"] == 125


async def test_checkpoint_concurrent_with_writes_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:  # a slow disk widens the window to tens of ms
        real(fd)
        time.sleep(0.05)

    monkeypatch.setattr(_writer.os, "fdatasync", slow_fdatasync)
    clock = Clock()
    wal = tmp_path / "wal"
    acked: list[str] = []

    async def add(n: int) -> None:
        acked.extend(j.id for j in await store.add([new_job(clock, n=n)]))

    with trio.fail_after(10):
        async with opened(wal, clock, fsync="always") as store, trio.open_nursery() as nursery:
            nursery.start_soon(add, 1)  # the writer is syncing it in a thread...
            await trio.sleep(0.015)
            nursery.start_soon(store.checkpoint)  # ...when a checkpoint is asked for...
            await trio.sleep(0.015)
            nursery.start_soon(add, 2)  # ...and another record arrives meanwhile
        async with opened(wal, clock) as store:
            for job_id in acked:
                assert (await store.get(job_id)).state is JobState.READY
    assert len(acked) == 2


async def test_checkpoints_among_many_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    acked: list[str] = []

    async def produce(first: int) -> None:
        for n in range(first, 160, 8):
            acked.extend(j.id for j in await store.add([new_job(clock, n=n)]))

    async def checkpoints() -> None:
        for _ in range(10):
            await store.checkpoint()
            await trio.lowlevel.checkpoint()

    with trio.fail_after(20):
        async with opened(wal, clock, fsync="always") as store:
            async with trio.open_nursery() as nursery:
                for first in range(8):
                    nursery.start_soon(produce, first)
                nursery.start_soon(checkpoints)
            assert store._writer is not None and store._writer.checkpoints >= 10
        async with opened(wal, clock) as store:
            assert len(acked) == 160
            for job_id in acked:
                assert (await store.get(job_id)).state is JobState.READY


# ----------------------------------------------------------- group commit


async def test_concurrent_enqueues_share_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    syncs: list[int] = []
    real = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(_writer.os, "fdatasync", counting_fdatasync)
    registry = trioq.Registry()
    registry.task(name="noop")(_noop)
    store = WALStore(tmp_path / "wal", fsync="always")
    acked: list[Job] = []

    async def submit(i: int) -> None:
        acked.append(await queue.enqueue("noop", {"i": i}))

    with trio.fail_after(10):
        async with trioq.open_queue(registry, store=store, workers=0) as queue:
            assert store._writer is not None
            batches_before, syncs_before = store._writer.batches_written, len(syncs)
            async with trio.open_nursery() as nursery:
                for i in range(32):
                    nursery.start_soon(submit, i)
            batches = store._writer.batches_written - batches_before
            fsyncs = len(syncs) - syncs_before
    record_property("group_commit_batches", batches)
    record_property("group_commit_fsyncs", fsyncs)
    print(f"32 concurrent enqueues: {batches} batches, {fsyncs} fsyncs")
    assert len(acked) == 32
    assert 1 <= fsyncs <= 4
    assert batches == fsyncs


async def _noop(ctx: trioq.JobContext, i: int) -> None:
    pass


def _after_kill(path: Path, into: Path) -> JobTable:
    """The table a restart would rebuild if the process died now."""
    table = JobTable(max_retained=sys.maxsize)
    replay(str(crash_copy(path, into)), table)
    return table


async def test_a_structured_result_survives_a_checkpoint(tmp_path: Path) -> None:
    # A checkpoint's ENTRY rows carry a non-scalar result in its stored form
    # (msgpack bytes); restoring takes it back as is.
    clock = Clock()
    path = tmp_path / "wal"
    result = {"sent": [1, 2], "to": "a@b.c", "ok": True}
    async with opened(path, clock) as store:
        [job, other] = await store.add([new_job(clock), new_job(clock)])
        claimed = await claim(store)
        assert await succeed(store, claimed.id, claimed.epoch, result) is True
        claimed = await claim(store)
        assert await succeed(store, claimed.id, claimed.epoch, "plain") is True
        await store.checkpoint()
    async with opened(path, clock) as store:
        assert (await store.get(job.id)).result == result
        assert (await store.get(other.id)).result == "plain"


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_records_nobody_waits_for_are_committed_within_the_lazy_delay(
    tmp_path: Path, fsync: str, autojump_clock: trio.testing.MockClock
) -> None:
    # A worker's claim and success (durable=False) start no commit of their
    # own: they join the next one, which comes LAZY_COMMIT_DELAY later at the
    # latest, or at once when someone syncs or a record someone waits for
    # arrives. A crash in between re-runs the job; it never loses one.
    clock = Clock()
    path = tmp_path / "wal"
    delay = _writer.LAZY_COMMIT_DELAY
    async with opened(path, clock, fsync=fsync) as store:
        writer = store._writer
        assert writer is not None
        [job] = await store.add([new_job(clock)])
        before = writer.records_written
        claimed = await claim(store)
        assert await succeed(store, claimed.id, claimed.epoch, "ok", durable=False)
        await trio.sleep(delay / 2)
        assert writer.records_written == before and store.unsynced()
        assert _after_kill(path, tmp_path / "early").get(job.id).state is JobState.READY  # runs again
        await trio.sleep(delay)
        assert writer.records_written == before + 2 and not store.unsynced()  # claim + success
        assert _after_kill(path, tmp_path / "late").get(job.id).state is JobState.SUCCEEDED

        # sync() commits lazy records at once ...
        [second, third] = await store.add([new_job(clock), new_job(clock)])
        claimed = await claim(store)
        assert await succeed(store, claimed.id, claimed.epoch, "ok", durable=False)
        started = trio.current_time()
        await store.sync()
        assert trio.current_time() == started and not store.unsynced()
        # ... and so does a record someone waits for (it carries them along).
        claimed = await claim(store)
        assert await succeed(store, claimed.id, claimed.epoch, "ok", durable=False)
        await store.add([new_job(clock)])
        assert trio.current_time() == started and not store.unsynced()
        table = _after_kill(path, tmp_path / "carried")
        assert table.get(second.id).state is table.get(third.id).state is JobState.SUCCEEDED


# -------------------------------------------------- property: cut anywhere


@attrs.frozen
class Point:
    """The state of the store once the log had ``size`` bytes."""

    size: int
    now: float
    jobs: tuple[tuple[Job, int], ...]  # (snapshot, enqueue seq), by id
    keys: tuple[tuple[str, str | None], ...]
    counts: tuple[tuple[str, int], ...]


KEYS = ("k0", "k1", "k2")


def canon(table: JobTable, size: int, now: float) -> Point:
    return Point(
        size,
        now,
        tuple(sorted(((e.snapshot(), e.seq) for e in table.entries()), key=lambda js: js[0].id)),
        tuple((k, None if (e := table.by_key(k)) is None else e.id) for k in KEYS),
        tuple(sorted(table.counts().items())),
    )


_ops = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from([None, *KEYS]),
        st.sampled_from([0.0, 1.0, 3.0, 20.0]),
        st.integers(0, 2),
        st.integers(1, 3),
    ),
    st.tuples(st.just("add_many"), st.integers(0, 3)),
    st.tuples(st.just("claim")),
    st.tuples(st.just("succeed"), st.integers(0, 5)),
    st.tuples(st.just("fail"), st.integers(0, 5), st.sampled_from([0.0, 4.0])),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("stale"), st.integers(0, 5)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("retry"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 5.0, 30.0])),
    st.tuples(st.just("evict"), st.sampled_from([0.0, 5.0])),
)


async def _drive(wal: str, ops: list[tuple[Any, ...]], max_retained: int) -> tuple[list[Point], bytes]:
    """Run ``ops`` against a WALStore; the recorded states and the log as a crash would leave it."""
    clock = Clock()
    store = WALStore(wal, fsync="never", segment_size=64 * 1024 * 1024)
    ids: list[str] = []
    epochs: dict[str, list[int]] = {}  # every epoch each job was claimed under
    points: list[Point] = []
    async with store.session(StoreConfig(clock=clock, retention=3.0, max_retained=max_retained)):
        (segment,) = segments(Path(wal))
        table = store._table
        assert table is not None

        def record() -> None:
            points.append(canon(table, segment.stat().st_size, clock.now))

        async def claim_committed() -> Job | None:
            # A claim returns before its record is durable (Store.claim);
            # sync so each recorded state sits at a commit marker.
            job = await claim_one(store)
            await store.sync()
            return job

        async def running() -> list[Job]:
            out = []
            for job_id in ids:
                try:
                    job = await store.get(job_id)
                except JobNotFound:
                    continue
                if job.state is JobState.RUNNING:
                    out.append(job)
            return out

        record()
        for op in ops:
            name = op[0]
            if name == "add":
                _, key, delay, priority, max_attempts = op
                job = NewJob("t", {"i": len(ids)}, priority, key, max_attempts, float(delay))
                ids.extend(j.id for j in await store.add([job]) if j.id not in ids)
            elif name == "add_many":
                batch = [NewJob("t", {"i": len(ids) + i}, 0, None, 2) for i in range(op[1])]
                ids.extend(j.id for j in await store.add(batch))
            elif name == "claim":
                job = await claim_committed()
                if job is not None:
                    epochs.setdefault(job.id, []).append(job.epoch)
            elif name in ("succeed", "fail", "release"):
                held = await running()
                if not held and (job := await claim_committed()) is not None:
                    epochs.setdefault(job.id, []).append(job.epoch)
                    await store.promote()
                    record()
                    held = [job]
                if held:
                    job = held[op[1] % len(held)]
                    if name == "succeed":
                        assert await succeed(store, job.id, job.epoch, {"r": job.epoch})
                    elif name == "fail":
                        assert await fail(store, job.id, job.epoch, "E: x", op[2]) is not None
                    else:
                        assert await release(store, job.id, job.epoch) is not None
            elif name == "stale":
                stale = [(i, e) for i, es in epochs.items() for e in es[:-1]]
                if stale:
                    job_id, epoch = stale[op[1] % len(stale)]
                    assert await succeed(store, job_id, epoch, "late") is False
            elif name in ("cancel", "retry") and ids:
                job_id = ids[op[1] % len(ids)]
                try:
                    if name == "cancel":
                        await store.cancel(job_id)
                    else:
                        await store.retry(job_id)
                except (JobNotFound, InvalidJob):
                    pass
            elif name == "advance":
                clock.now += op[1]
            elif name == "evict":
                clock.now += op[1]
                await store.evict()
            # The runtime's timer promotes due jobs (a clock matter, not logged).
            await store.promote()
            record()
        log = segment.read_bytes()  # the crash: taken while the store is open
    return points, log


def _state_at(points: list[Point], offset: int) -> Point:
    return [p for p in points if p.size <= offset][-1]


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops=st.lists(_ops, min_size=5, max_size=50),
    max_retained=st.sampled_from([2, 100]),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5),
)
def test_log_cut_anywhere_replays_to_its_last_commit(
    ops: list[tuple[Any, ...]], max_retained: int, cuts: list[float]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wal = os.path.join(tmp, "wal")
        points, log = trio.run(_drive, wal, ops, max_retained)
        assert points[-1].size == len(log)
        # Every recorded state is what its log replays to (promoted at its time):
        # a change of state that wrote nothing to the log would be lost in a crash.
        for point in points:
            assert _replayed(log, point.size, tmp, point.now) == point
        # A byte either side of every commit, and some random cuts.
        offsets = {HEADER_SIZE}
        for p in points:
            offsets.update({p.size - 1, p.size + 1})
        offsets.update(HEADER_SIZE + round(c * (len(log) - HEADER_SIZE)) for c in cuts)
        for offset in sorted(o for o in offsets if HEADER_SIZE <= o <= len(log)):
            expected = attrs.evolve(_state_at(points, offset), size=offset)
            assert _replayed(log, offset, tmp, expected.now) == expected, offset
            # The same cut followed by zero padding (fsync="always" zero-fills
            # ahead). Where the lost bytes were zeros too, the disk holds them
            # after all: a commit marker can end up whole, though never acknowledged.
            lost = log[offset : offset + 300]
            whole = offset + len(lost) - len(lost.lstrip(b"\0"))
            padded = attrs.evolve(_state_at(points, whole), size=offset)
            assert _replayed(log, offset, tmp, padded.now, pad=300) == padded, offset


def _replayed(log: bytes, offset: int, tmp: str, now: float, pad: int = 0) -> Point:
    """The table a crash leaving ``log[:offset]`` (then ``pad`` zeros) recovers to, promoted at ``now``."""
    directory = os.path.join(tmp, "cut")
    os.makedirs(directory, exist_ok=True)
    segment = os.path.join(directory, "00000000000000000001.wal")
    with open(segment, "wb") as f:
        f.write(log[:offset] + bytes(pad))
    table = JobTable(max_retained=sys.maxsize)
    recovery = replay(directory, table)
    assert recovery.truncated_bytes + recovery.padding_bytes == offset + pad - os.path.getsize(segment)
    table.promote(now)
    return canon(table, offset, now)


async def test_a_batch_wait_is_cancellable_or_defers_the_cancel_to_the_next_checkpoint() -> None:
    batch = _writer._Batch()
    with trio.move_on_after(0.01) as plain:
        await batch.wait()
    assert plain.cancelled_caught and batch._waiters == []  # a cancelled waiter leaves no trace

    outcome: list[str] = []

    async def committed_first() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()  # cancelled before and during the wait
            await batch.wait(cancellable=False)
            outcome.append("woken by the commit")
            await trio.lowlevel.checkpoint()
            outcome.append("not cancelled")  # pragma: no cover - the cancel must land above
        outcome.append("cancelled at the next checkpoint")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(committed_first)
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == []
        batch.set_done()
    assert outcome == ["woken by the commit", "cancelled at the next checkpoint"]
    await batch.wait(cancellable=False)  # already done: returns at once


async def test_a_checkpoint_a_power_cut_left_partly_unwritten_is_a_torn_write(tmp_path: Path) -> None:
    # The crash came after the checkpoint's segment was created but before its
    # sync returned, so the segments it replaces were not deleted yet: recovery
    # must cut the torn checkpoint and replay them, not refuse to open.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always") as store:
        jobs = await store.add([new_job(clock, n=i, text="x" * 60) for i in range(300)])
        before = crash_copy(wal, tmp_path / "before-checkpoint")
        await store.checkpoint()
        checkpoint_segment = segments(wal)[-1]
        data = bytearray(checkpoint_segment.read_bytes())
    *_, (marker, _) = _format._commits_after(bytes(data), HEADER_SIZE)
    assert marker > HEADER_SIZE + 2 * _format.PAGE  # the checkpoint spans pages before its marker's
    data[_format.PAGE : 2 * _format.PAGE] = bytes(_format.PAGE)  # one of its pages never reached the disk
    (before / checkpoint_segment.name).write_bytes(bytes(data))
    async with opened(before, clock) as store:
        assert [(await store.get(j.id)).state for j in jobs] == [JobState.READY] * 300
        assert store.recovery is not None and store.recovery.truncated_bytes > 0


async def test_a_requested_checkpoint_over_a_full_segment_starts_one_segment(tmp_path: Path) -> None:
    # Pending records that fill the segment are committed first; the
    # checkpoint then starts the next segment itself: no roll in between.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, segment_size=64 * 1024) as store:
        writer = store._writer
        assert writer is not None
        while writer._segment_bytes < 0.8 * writer.segment_size:
            await store.add([new_job(clock, n=i) for i in range(50)])
        first = writer._segment
        assert writer._segment_bytes < writer.segment_size  # committed, under the size
        with trio.fail_after(5):
            while writer._segment_bytes + sum(map(len, writer._pending)) < writer.segment_size:
                await claim(store)  # lazy records: pending, not committed
        checkpoints = writer.checkpoints
        await store.checkpoint()
        assert (writer._segment, writer.checkpoints) == (first + 1, checkpoints + 1)


# ----------------------------------------------------- per-record durability


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_syncing_one_job_waits_for_its_records_alone(
    tmp_path: Path, fsync: str, autojump_clock: trio.testing.MockClock
) -> None:
    # get() and wait() of one job once synced the whole log: 20 polls of a job
    # long durable, with 400 running, forced 16 early commits of the others'
    # lazy successes.
    clock = Clock()
    async with opened(tmp_path / "wal", clock, fsync=fsync) as store:
        writer = store._writer
        assert writer is not None
        (old,) = await store.add([new_job(clock)])
        done = await claim(store)
        assert await succeed(store, done.id, done.epoch, "old", durable=False)
        await store.sync(done.id)  # its lazy success is pending: this commits it
        assert not writer.busy
        others = await store.add([new_job(clock, n=i) for i in range(50)])
        for _ in others:
            running = await claim(store)
            assert await succeed(store, running.id, running.epoch, "new", durable=False)
        commits = writer.batches_written
        for _ in range(20):
            await store.sync(old.id)  # durable long ago: no commit
        await store.sync("no-such-job")  # unknown: every record, as sync() does
        assert writer.batches_written == commits + 1
        assert not writer.busy
        again = await store.add([new_job(clock)])
        running = await claim(store)
        assert await succeed(store, running.id, running.epoch, "last", durable=False)
        assert writer.busy
        await store.sync(again[0].id)  # its own lazy record: waited for
        assert not writer.busy


async def test_wait_bounds_the_wait_for_the_outcome_to_be_durable(tmp_path: Path) -> None:
    # Real clock: the lazy commit's 50 ms delay is what is being bounded.
    registry = trioq.Registry()

    @registry.task
    async def quick(ctx: trioq.JobContext) -> str:
        await trio.sleep(0.005)  # after the commit of its ADD: its success waits for the next
        return "done"

    store = WALStore(tmp_path / "wal", fsync="always")
    async with trioq.open_queue(registry, store=store, workers=1) as queue:
        job = await queue.enqueue("quick")
        with trio.fail_after(10):
            while (await store.get(job.id)).state is not trioq.JobState.SUCCEEDED:
                await trio.lowlevel.checkpoint()  # succeeded in the table; its record waits for the lazy commit
        assert store._writer is not None and store._writer.busy
        with pytest.raises(trioq.WaitTimeout, match="not yet durable"):
            await queue.wait(job.id, timeout=0)
        assert (await queue.wait(job.id, timeout=5)).result == "done"
        assert (await queue.wait(job.id, timeout=0)).result == "done"  # durable now: at once
