"""WAL damage that leaves every remaining record readable, yet loses committed jobs.

A deleted segment (the numbers are consecutive, so a gap shows), a deleted
first segment that no checkpoint replaced, and an older segment cut or zeroed
from a commit boundary to its end: reopening and ``trioq wal verify`` must
report each as :class:`~trioq.WALCorruption` naming the file (for a missing
segment, the one expected), not replay what is left. And the shapes a real
crash leaves (superseded segments, a header-less last segment, padding a
machine crash kept, a crash at any record) must still open, with every job.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from test_wal import Clock, claim, crash_copy, new_job, opened, records, segments, succeed

import trioq
from trioq import Job, JobNotFound, JobState, WALCorruption
from trioq._app.walcli import verify_command
from trioq.stores.wal._format import COMMIT, HEADER_SIZE, header, segment_name
from trioq.testing import FaultPlan, SimulatedCrash

FSYNC_MODES = ["always", "interval", "never"]


async def _multi_segment_log(wal: Path, clock: Clock, fsync: str, jobs: int = 120) -> list[Job]:
    """One writer session over several segments (one commit per job), no checkpoint."""
    async with opened(wal, clock, fsync=fsync, segment_size=4096) as store:
        added = [(await store.add([new_job(clock, n=i)]))[0] for i in range(jobs)]
        assert store._writer is not None and store._writer.checkpoints == 0
    assert len(segments(wal)) >= 3
    return added


async def _open_fails(wal: Path, clock: Clock) -> WALCorruption:
    """Open ``wal``, which must raise WALCorruption, twice: the failed open changes nothing on disk."""
    before = {p.name: p.read_bytes() for p in wal.glob("*.wal")}
    errors = []
    for _ in range(2):
        with pytest.raises(WALCorruption) as info:
            async with opened(wal, clock):
                pass  # pragma: no cover
        errors.append(str(info.value))
        assert {p.name: p.read_bytes() for p in wal.glob("*.wal")} == before
    assert errors[0] == errors[1]
    assert "trioq wal verify" in errors[0]
    return info.value


def _verify(wal: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_command(str(wal), out, err)
    return code, out.getvalue(), err.getvalue()


def _assert_verify_damaged(wal: Path, *names: str) -> None:
    code, out, err = _verify(wal)
    assert (code, out) == (1, "")
    assert "DAMAGED" in err
    for name in names:
        assert name in err


def _commit_ends(segment: Path) -> list[int]:
    """The offset just past each commit marker of ``segment``."""
    return [offset + 9 + length for offset, kind, length in records(segment) if kind == COMMIT]


# --------------------------------------------------------- missing segments


@pytest.mark.parametrize("fsync", FSYNC_MODES)
@pytest.mark.parametrize("deleted", [1, 2], ids=["one", "two"])
async def test_a_deleted_middle_segment_is_corruption_naming_it(tmp_path: Path, fsync: str, deleted: int) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, fsync, jobs=160)
    present = segments(wal)
    assert len(present) >= 2 + deleted
    gone = present[1 : 1 + deleted]
    for path in gone:
        path.unlink()

    error = await _open_fails(wal, clock)
    assert error.path == str(gone[0]) and error.offset is None
    message = str(error)
    assert f"segment {int(gone[0].stem)} ({gone[0]}) is missing" in message
    if deleted == 2:
        assert f"up to {int(gone[1].stem)} ({gone[1].name})" in message
    _assert_verify_damaged(wal, gone[0].name, str(wal))


@pytest.mark.parametrize("fsync", FSYNC_MODES)
@pytest.mark.parametrize("deleted", [1, 2], ids=["first", "two-first"])
async def test_a_deleted_first_segment_no_checkpoint_replaced_is_corruption(
    tmp_path: Path, fsync: str, deleted: int
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, fsync)
    present = segments(wal)
    for path in present[:deleted]:
        path.unlink()
    expected = present[deleted - 1]  # the one right before the oldest left

    error = await _open_fails(wal, clock)
    assert error.path == str(expected) and error.offset is None
    assert f"segment {deleted} ({expected}) is missing" in str(error)
    assert f"starts at segment {deleted + 1}" in str(error)
    _assert_verify_damaged(wal, expected.name)


async def test_a_segment_deleted_after_the_checkpoint_replay_starts_from_is_corruption(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, segment_size=4096) as store:
        for i in range(60):
            await store.add([new_job(clock, n=i)])
        await store.checkpoint()
        for i in range(60, 160):
            await store.add([new_job(clock, n=i)])
    start, gone, *rest = segments(wal)
    assert rest and int(start.stem) > 1
    gone.unlink()

    error = await _open_fails(wal, clock)
    assert error.path == str(gone)
    _assert_verify_damaged(wal, gone.name)


async def test_a_gap_before_a_headerless_last_segment_is_corruption(tmp_path: Path) -> None:
    # A header-less last segment is a crash while creating it, removed on
    # open; but the writer created it right after the segment before it.
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, "never")
    *_, deleted = segments(wal)
    deleted.unlink()
    number = int(deleted.stem) + 1
    (wal / segment_name(number)).write_bytes(header(number)[:5])

    error = await _open_fails(wal, clock)  # and the header-less segment was not removed
    assert error.path == str(deleted)
    _assert_verify_damaged(wal, deleted.name)


async def test_a_lone_headerless_segment_after_a_deleted_log_is_corruption(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, "never")
    *_, newest = segments(wal)
    for path in segments(wal):
        path.unlink()
    number = int(newest.stem) + 1
    (wal / segment_name(number)).write_bytes(b"")

    error = await _open_fails(wal, clock)
    assert error.path == str(newest)
    assert f"starts at segment {number}" in str(error)


# ----------------------------------------------- older segments cut or zeroed


_BOUNDARIES = ["after the header", "after the first batch", "before the last batch"]


def _boundary(segment: Path, where: str) -> int:
    ends = _commit_ends(segment)
    assert len(ends) >= 3
    return {"after the header": HEADER_SIZE, "after the first batch": ends[0], "before the last batch": ends[-2]}[where]


@pytest.mark.parametrize("fsync", FSYNC_MODES)
@pytest.mark.parametrize("where", _BOUNDARIES)
@pytest.mark.parametrize("how", ["zeroed", "cut"])
async def test_an_older_segment_zeroed_or_cut_from_a_commit_boundary_is_corruption(
    tmp_path: Path, fsync: str, where: str, how: str
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, fsync)
    older = segments(wal)[0]
    data = older.read_bytes()
    at = _boundary(older, where)
    older.write_bytes(data[:at] + (bytes(len(data) - at) if how == "zeroed" else b""))

    error = await _open_fails(wal, clock)
    assert (error.path, error.offset) == (str(older), at)
    assert older.name in str(error) and f"offset {at}" in str(error)
    _assert_verify_damaged(wal, older.name, f"offset {at}")


@pytest.mark.parametrize("fsync", ["interval", "never"])
async def test_zeros_ending_an_older_session_that_never_padded_are_corruption(tmp_path: Path, fsync: str) -> None:
    # Session 1's only segment ends in zeros from a commit boundary, and
    # session 2 started a segment after it: its batches start at 1, so they
    # say nothing about session 1's end. But only fsync="always" pads.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync) as store:
        for i in range(5):
            await store.add([new_job(clock, n=i)])
    async with opened(wal, clock, fsync=fsync) as store:
        await store.add([new_job(clock, n=5)])
    older, _ = segments(wal)
    data = older.read_bytes()
    at = _commit_ends(older)[1]
    older.write_bytes(data[:at] + bytes(len(data) - at))

    error = await _open_fails(wal, clock)
    assert (error.path, error.offset) == (str(older), at)
    assert "fsync='always'" in str(error)
    _assert_verify_damaged(wal, older.name)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
@pytest.mark.parametrize("how", ["zeroed", "cut"])
async def test_the_end_of_an_earlier_sessions_last_segment_lost_is_corruption(
    tmp_path: Path, fsync: str, how: str
) -> None:
    # The next session opens a fresh segment; it numbers its batches on from
    # the log's last one, so batches lost at the end of the session before show.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync) as store:
        for i in range(5):
            await store.add([new_job(clock, n=i)])
    async with opened(wal, clock, fsync=fsync) as store:
        await store.add([new_job(clock, n=5)])
    older, _ = segments(wal)
    data = older.read_bytes()
    at = _commit_ends(older)[1]
    older.write_bytes(data[:at] + (bytes(len(data) - at) if how == "zeroed" else b""))

    error = await _open_fails(wal, clock)
    assert (error.path, error.offset) == (str(older), at)
    if how == "cut" or fsync == "always":  # else zeros no other mode writes tell it first
        assert "missing" in str(error)
    _assert_verify_damaged(wal, older.name)


# ---------------------------------------------------- what a crash can leave


@pytest.mark.parametrize("fsync", FSYNC_MODES)
async def test_a_log_that_starts_after_a_checkpoint_opens_with_every_job(tmp_path: Path, fsync: str) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync, segment_size=4096) as store:
        jobs = [(await store.add([new_job(clock, n=i)]))[0] for i in range(80)]
        for _ in range(10):
            job = await claim(store)
            await succeed(store, job.id, job.epoch, job.payload["n"])
        await store.checkpoint()  # the segments before it are deleted
        jobs += [(await store.add([new_job(clock, n=i)]))[0] for i in range(80, 160)]
        before = {j.id: await store.get(j.id) for j in jobs}
    oldest = segments(wal)[0]
    assert int(oldest.stem) > 1 and len(segments(wal)) >= 3
    # A crash while creating the next segment leaves it header-less: removed.
    number = int(segments(wal)[-1].stem) + 1
    (wal / segment_name(number)).write_bytes(header(number)[:7])
    assert _verify(wal)[0] == 0
    for _ in range(2):
        async with opened(wal, clock) as store:
            assert {j.id: await store.get(j.id) for j in jobs} == before
    assert segments(wal)[0] == oldest


@pytest.mark.parametrize("fsync", FSYNC_MODES)
async def test_only_a_checkpoint_segment_left_opens(tmp_path: Path, fsync: str) -> None:
    # Every segment before the checkpoint deleted, nothing written after it.
    clock = Clock()
    wal = tmp_path / "wal"
    await _multi_segment_log(wal, clock, fsync)
    async with opened(wal, clock, fsync=fsync) as store:
        await store.checkpoint()
        jobs = await store.counts()
    (only,) = segments(wal)
    assert int(only.stem) > 1
    async with opened(wal, clock) as store:
        assert await store.counts() == jobs
    assert jobs["ready"] == 120


async def test_padding_a_machine_crash_kept_in_the_last_segment_of_an_always_session_opens(tmp_path: Path) -> None:
    # Session 1 trimmed its padded segment at close, but the trim is not
    # synced: a machine crash after session 2 created its segment can bring
    # the padding back. (The same zeros over session 1's last committed
    # batches are damage: session 2 numbers its batches on from session 1's.)
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always") as store:
        jobs = [(await store.add([new_job(clock, n=i)]))[0] for i in range(5)]
    async with opened(wal, clock, fsync="always") as store:
        jobs += await store.add([new_job(clock, n=5)])
    older, _ = segments(wal)
    with older.open("ab") as f:
        f.write(bytes(100_000))
    assert _verify(wal)[0] == 0
    async with opened(wal, clock) as store:
        assert [(await store.get(j.id)).state for j in jobs] == [JobState.READY] * 6
        assert store.recovery is not None and store.recovery.padding_bytes == 100_000


registry = trioq.Registry()


@registry.task
async def quick(ctx: trioq.JobContext, n: int, text: str) -> None:
    pass


async def _session(
    wal: Path, fsync: str, jobs: range, acked: list[str], plan: FaultPlan | None = None, checkpoint_at: int = -1
) -> None:
    """Enqueue ``jobs`` one by one (workers run them), a checkpoint after job ``checkpoint_at``; ``acked`` gets ids."""
    store = trioq.WALStore(wal, fsync=fsync, segment_size=4096)
    async with trioq.open_queue(registry, store=store, workers=2, faults=plan) as queue:
        for n in jobs:
            acked.append((await queue.enqueue("quick", {"n": n, "text": "x" * 40})).id)
            if n == checkpoint_at:
                await store.checkpoint()
            await trio.sleep(0.01)  # lets "interval" sync, and the workers run


async def _present(wal: Path, ids: list[str]) -> list[str]:
    """The ids of ``ids`` that a reopen of ``wal`` still knows."""
    found = []
    async with trioq.open_queue(registry, store=trioq.WALStore(wal), workers=0) as queue:
        for job_id in ids:
            try:
                await queue.get(job_id)
            except JobNotFound:
                continue
            found.append(job_id)
    return found


def _crash_points() -> Iterator[int]:
    # A session of 60 jobs writes ~180 records (ADD, CLAIM, SUCCEED each);
    # every fourth point still lands on each kind, around rolls and checkpoints.
    yield from range(1, 190, 4)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
async def test_a_crash_at_any_record_leaves_a_log_that_opens(
    tmp_path: Path, fsync: str, autojump_clock: trio.testing.MockClock
) -> None:
    base = tmp_path / "base"
    earlier: list[str] = []
    await _session(base, fsync, range(40), earlier)  # a closed session over several segments
    crashed = 0
    for point in _crash_points():
        wal = tmp_path / f"crash-{point}"
        shutil.copytree(base, wal)
        acked: list[str] = []
        try:
            await _session(wal, fsync, range(40, 100), acked, FaultPlan().crash(after_records=point), checkpoint_at=70)
        except SimulatedCrash:
            crashed += 1
        assert _verify(wal)[0] == 0, (point, _verify(wal))
        assert await _present(wal, earlier) == earlier, point
        if fsync == "always":  # every acknowledged enqueue was on disk
            assert await _present(wal, acked) == acked, point
        # The log a crash was recovered from goes on, and opens again.
        more: list[str] = []
        await _session(wal, fsync, range(100, 105), more)
        assert await _present(wal, more) == more, point
        shutil.rmtree(wal)
    assert crashed > 40


@pytest.mark.parametrize("fsync", FSYNC_MODES)
async def test_a_kill_9_at_any_moment_leaves_a_log_that_opens(tmp_path: Path, fsync: str) -> None:
    # A copy of the directory taken while the store is open is what kill -9
    # would leave then: with "always", the open segment's padding included.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync, segment_size=4096) as store:
        await store.add([new_job(clock, n=-1)])
    jobs: list[Job] = []
    async with opened(wal, clock, fsync=fsync, segment_size=4096) as store:
        for i in range(120):
            jobs += await store.add([new_job(clock, n=i, text="y" * (i % 50))])
            if i % 40 == 39:
                await store.checkpoint()
            if i % 7 == 0:
                copy = crash_copy(wal, tmp_path / f"kill-{i}")
                assert _verify(copy)[0] == 0, i
                async with opened(copy, clock) as reopened:
                    assert [(await reopened.get(j.id)).id for j in jobs] == [j.id for j in jobs]
                shutil.rmtree(copy)


@pytest.mark.parametrize("fsync", FSYNC_MODES)
async def test_a_batch_cut_out_of_the_middle_of_a_segment_is_corruption(tmp_path: Path, fsync: str) -> None:
    # Frame-aligned, every record left reads cleanly: only the batch numbers
    # and each batch's start offset (in its commit marker) tell.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync=fsync) as store:
        for i in range(5):
            await store.add([new_job(clock, n=i)])
    (segment,) = segments(wal)
    data = segment.read_bytes()
    ends = _commit_ends(segment)
    segment.write_bytes(data[: ends[1]] + data[ends[2] :])

    error = await _open_fails(wal, clock)
    assert error.path == str(segment) and "cut out" in str(error)
    _assert_verify_damaged(wal, segment.name)
