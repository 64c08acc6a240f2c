"""The WAL's log format: typed records (format 4), and logs of formats 2 and 3 read as they are.

``data/wal_v2/`` is a log trioq wrote in format 2 (commit fceb23c, by
``data/make_wal_v2.py``; ``data/wal_v2.json`` holds each job as that trioq saw
it): a checkpoint, then format-2 records of every type, left as a ``kill -9``
leaves a log (one job running). ``data/wal_v3/`` is the same for format 3
(by ``data/make_wal_v3.py``, with ``data/wal_v3.json``): SNOOZE records,
tracebacks, a FAIL without retry, ENTRY rows with errors and snoozes.
Jobs of either come back in the default queue, with no tenant and no deadline.
``data/wal_v4/`` is the same for format 4 (commit 0fcebc5, by
``data/make_wal_v4.py``, with ``data/wal_v4.json``): named queues, tenants,
limit keys and deadlines on ADD and ENTRY, CLAIM times, EXPIRE, PAUSE and
RESUME, a checkpoint holding a paused queue and rate tokens.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from crc32c import crc32c
from test_wal import START, Clock, claim, claim_one, fail, new_job, opened, segments, succeed

from trioq import FailedAttempt, JobNotFound, JobState, WALCorruption, WALStore
from trioq._app.walcli import verify_command
from trioq._model import Limit
from trioq.stores import ClaimRequest, Failed, NewJob, Released, Snoozed, StoreConfig, Succeeded
from trioq.stores.table.cron import TICK
from trioq.stores.table.store import ADD, CLAIM, EXPIRE, FAIL, PAUSE, RESUME, SNOOZE
from trioq.stores.wal import _format
from trioq.stores.wal._format import (
    CHECKPOINT_BEGIN,
    COMMIT,
    ENTRY,
    VERSION,
    frame,
    frame_record,
    read_header,
    scan_segment,
    segment_name,
)
from trioq.stores.wal._records import (
    RECORDS,
    Add,
    Admit,
    Cancel,
    CheckpointBegin,
    CheckpointEnd,
    Claim,
    Drop,
    Expire,
    Fail,
    Pause,
    Record,
    Release,
    Resume,
    Retry,
    Row,
    Snooze,
    Succeed,
    decode_record,
    record_fields,
)

DATA = Path(__file__).parent / "data"
EXPECTED: dict[str, dict[str, Any]] = json.loads((DATA / "wal_v2.json").read_text())
IDS = {name: job["id"] for name, job in EXPECTED.items()}
EXPECTED_V3: dict[str, dict[str, Any]] = json.loads((DATA / "wal_v3.json").read_text())
IDS_V3 = {name: job["id"] for name, job in EXPECTED_V3.items()}
EXPECTED_V4: dict[str, dict[str, Any]] = json.loads((DATA / "wal_v4.json").read_text())
IDS_V4 = {name: job["id"] for name, job in EXPECTED_V4.items()}
#: The format-4 log's limit keys, as ``data/make_wal_v4.py`` declares them.
LIMITS_V4 = {
    "api": Limit("api", rate=1.0),
    "hourly": Limit("hourly", rate=1.0, per=3600.0),
    "smtp": Limit("smtp", max=2),
}
#: The time of the format-4 log's last record (and of its last claim, of a job holding "api").
END_V4 = START + 4006.0
#: After the format-2 (and format-3) log's last record.
LATER = START + 4010.0
#: What a job of a format-2 or format-3 log has for the fields format 4 added (Job.to_dict()).
NO_LABELS = {"queue": "default", "tenant": None, "deadline": None, "limits": [], "after": []}
_FRAME = struct.Struct("<IIB")


def v2_log(tmp_path: Path) -> Path:
    """A copy of the format-2 log to open (opening writes to it)."""
    wal = tmp_path / "wal"
    shutil.copytree(DATA / "wal_v2", wal)
    return wal


def v3_log(tmp_path: Path) -> Path:
    """A copy of the format-3 log to open (opening writes to it)."""
    wal = tmp_path / "wal"
    shutil.copytree(DATA / "wal_v3", wal)
    return wal


def v4_log(tmp_path: Path) -> Path:
    """A copy of the format-4 log to open (opening writes to it)."""
    wal = tmp_path / "wal"
    shutil.copytree(DATA / "wal_v4", wal)
    return wal


def versions(wal: Path) -> dict[int, int]:
    """Each segment's format version, by segment number, from the headers."""
    return dict(read_header(str(p)) for p in segments(wal))


@asynccontextmanager
async def opened_limited(
    path: Path, clock: Clock, limits: dict[str, Limit], *, retention: float = 3600.0, defer_past: int | None = None
) -> AsyncIterator[WALStore]:
    """``test_wal.opened``, its session knowing ``limits`` (by exact key), deferring past ``defer_past``."""
    store = WALStore(path, fsync="never")
    config = StoreConfig(clock=clock, retention=retention, limits=limits.get, defer_past=defer_past)
    async with store.session(config):
        yield store


def unframe(data: bytes) -> tuple[int, bytes]:
    """The type and payload of the one record ``data`` frames (checked)."""
    length, crc, kind = _FRAME.unpack_from(data)
    payload = data[_FRAME.size :]
    assert len(payload) == length and crc == crc32c(bytes((kind,)) + payload)
    return kind, payload


# ------------------------------------------------------------ format 2


async def test_a_format_2_log_opens_with_every_job_as_it_was(tmp_path: Path) -> None:
    wal = v2_log(tmp_path)
    assert versions(wal) == {2: 2, 3: 2}
    async with opened(wal, Clock(LATER)) as store:
        assert store.recovery is not None
        assert store.recovery.versions == {2: 2, 3: 2}
        assert store.recovery.checkpoints_seen == 1
        for name, want in EXPECTED.items():
            if want["state"] == "evicted":  # its DROP record replayed
                with pytest.raises(JobNotFound):
                    await store.get(want["id"])
                continue
            got = (await store.get(want["id"])).to_dict()
            got.pop("errors")  # format 2 kept none: below
            # Running at the "crash": ready again, same epoch, uncounted. The
            # fields format 4 added (format 2 knew none of them): their defaults.
            state = "ready" if want["state"] == "running" else want["state"]
            assert got == {**want, **NO_LABELS, "state": state}, name

        async def check(name: str, state: JobState, attempts: int, epoch: int, result: Any, error: str | None) -> None:
            job = await store.get(IDS[name])
            got = (job.state, job.attempts, job.epoch, job.result, job.error)
            assert got == (state, attempts, epoch, result, error), name

        # Restored from the checkpoint's format-2 ENTRY rows.
        await check("a_ready", JobState.READY, 0, 0, None, None)
        await check("a_scheduled", JobState.SCHEDULED, 0, 0, None, None)
        await check("a_done", JobState.SUCCEEDED, 1, 1, {"sent": [1, 2], "to": "a@b.c", "ok": True}, None)
        await check("a_failed", JobState.SCHEDULED, 1, 1, None, "ValueError: once")
        await check("a_dead", JobState.DEAD, 1, 1, None, "KeyError: 'x'")
        await check("a_retried", JobState.READY, 0, 1, None, "KeyError: 'y'")
        await check("a_cancelled", JobState.CANCELLED, 0, 0, None, None)
        await check("a_running", JobState.READY, 0, 1, None, None)  # running at the crash (claimed after it)
        # Replayed from format-2 transition records.
        await check("b_done", JobState.SUCCEEDED, 1, 1, "plain", None)
        await check("b_failed", JobState.SCHEDULED, 1, 1, None, "OSError: disk")
        await check("b_dead", JobState.DEAD, 2, 2, None, "RuntimeError: try 2")
        await check("b_retried", JobState.READY, 0, 1, None, "TypeError: once")
        await check("b_cancelled", JobState.CANCELLED, 0, 0, None, None)
        await check("b_released", JobState.READY, 0, 2, None, None)
        await check("b_scheduled", JobState.SCHEDULED, 0, 0, None, None)
        assert (await store.get(IDS["a_failed"])).run_at == START + 4001.0 + 5000.0
        # A format-2 ENTRY row has no errors; a format-2 FAIL makes one, without a traceback.
        assert (await store.get(IDS["a_dead"])).errors == ()
        b_dead = await store.get(IDS["b_dead"])
        assert b_dead.errors == (
            FailedAttempt(1, "RuntimeError: try 1", None, START + 4003.0),
            FailedAttempt(2, "RuntimeError: try 2", None, START + 4003.0),
        )
        # Keys survive both ways.
        (same_a, same_b) = await store.add([new_job(Clock(LATER), key="key-a"), new_job(Clock(LATER), key="key-b")])
        assert (same_a.id, same_b.id) == (IDS["a_ready"], IDS["b_keyed"])
        assert await store.counts() == {
            "scheduled": 4,
            "ready": 46,
            "running": 0,
            "succeeded": 2,
            "dead": 2,
            "cancelled": 2,
            "deferred": 0,
            "waiting": 0,
        }


async def test_new_records_go_to_format_4_segments_after_the_format_2_ones(tmp_path: Path) -> None:
    wal = v2_log(tmp_path)
    clock = Clock(LATER)
    async with opened(wal, clock) as store:
        # Best first: priority 9 (b_released, then b_retried: run_at), then a_running (8).
        released, retried, running = await store.claim(ClaimRequest("test", 3))
        assert [released.id, retried.id, running.id] == [IDS["b_released"], IDS["b_retried"], IDS["a_running"]]
        assert (released.epoch, running.epoch) == (3, 2)  # epochs go on from the format-2 log's
        states = await store.complete(
            [
                Succeeded(released.id, released.epoch, {"format": 3}),
                Failed(retried.id, retried.epoch, "ZeroDivisionError: x", None, "Traceback (most recent call last)"),
                Snoozed(running.id, running.epoch, 60.0),
            ]
        )
        assert states == [JobState.SUCCEEDED, JobState.DEAD, JobState.SCHEDULED]
        await store.sync()
        jobs = {job_id: await store.get(job_id) for job_id in IDS.values() if job_id != IDS["a_evicted"]}
    # The old segments stay as they were (a checkpoint will delete them); the session wrote format 6.
    assert VERSION == 6
    assert versions(wal) == {2: 2, 3: 2, 4: 6}
    assert (wal / segment_name(2)).read_bytes() == (DATA / "wal_v2" / segment_name(2)).read_bytes()

    async with opened(wal, clock) as store:
        assert store.recovery is not None and store.recovery.versions == {2: 2, 3: 2, 4: 6}
        assert {job_id: await store.get(job_id) for job_id in jobs} == jobs
        dead = jobs[retried.id]
        assert dead.errors == (
            FailedAttempt(1, "TypeError: once", None, START + 4003.0),  # format 2's
            FailedAttempt(1, "ZeroDivisionError: x", "Traceback (most recent call last)", LATER),  # after the retry
        )
        assert jobs[running.id].run_at == LATER + 60.0 and jobs[running.id].state is JobState.SCHEDULED
        assert store._table is not None and store._table.entry(running.id).snoozes == 1
        await store.checkpoint()
        assert versions(wal) == {6: 6}  # the format-2 segments are gone (5: this session's first)

    async with opened(wal, clock) as store:
        assert store.recovery is not None and store.recovery.versions == {6: 6}
        assert {job_id: await store.get(job_id) for job_id in jobs} == jobs
        assert store._table is not None and store._table.entry(running.id).snoozes == 1


@pytest.mark.parametrize("version", [1, 7, 0xFFFF])
async def test_a_segment_of_a_format_it_does_not_read_is_refused_saying_so(tmp_path: Path, version: int) -> None:
    wal = tmp_path / "wal"
    wal.mkdir()
    head = struct.pack("<8sHQ", _format.MAGIC, version, 1)
    (wal / segment_name(1)).write_bytes(head + struct.pack("<I", crc32c(head)))
    with pytest.raises(
        WALCorruption, match=f"WAL format version {version}; this trioq reads versions 2, 3, 4, 5 and 6\\."
    ):
        async with opened(wal, Clock()):
            pass  # pragma: no cover
    assert verify_command(str(wal), *_sinks()) == 1


@pytest.mark.parametrize("older", [2, 3])
async def test_a_segment_of_an_older_format_after_a_format_4_one_is_corruption(tmp_path: Path, older: int) -> None:
    wal = v2_log(tmp_path)
    async with opened(wal, Clock(LATER)):
        pass
    assert versions(wal) == {2: 2, 3: 2, 4: 6}
    head = struct.pack("<8sHQ", _format.MAGIC, older, 5)  # as only a trioq of that format writes
    (wal / segment_name(5)).write_bytes(head + struct.pack("<I", crc32c(head)))
    with pytest.raises(WALCorruption, match=f"format {older} after one of format 6") as info:
        async with opened(wal, Clock(LATER)):
            pass  # pragma: no cover
    assert info.value.path == str(wal / segment_name(5))


# ------------------------------------------------------------ format 3


async def test_a_format_3_log_opens_with_every_job_as_it_was(tmp_path: Path) -> None:
    wal = v3_log(tmp_path)
    assert versions(wal) == {2: 3, 3: 3}
    async with opened(wal, Clock(LATER)) as store:
        assert store.recovery is not None
        assert store.recovery.versions == {2: 3, 3: 3}
        assert store.recovery.checkpoints_seen == 1
        for name, want in EXPECTED_V3.items():
            if want["state"] == "evicted":  # its DROP record replayed
                with pytest.raises(JobNotFound):
                    await store.get(want["id"])
                continue
            got = (await store.get(want["id"])).to_dict()
            # Running at the "crash": ready again, same epoch, uncounted; errors,
            # tracebacks and all. The fields format 4 added: their defaults.
            state = "ready" if want["state"] == "running" else want["state"]
            assert got == {**want, **NO_LABELS, "state": state}, name
        assert await store.paused() == []
        assert store._table is not None
        snoozes = {name: store._table.entry(IDS_V3[name]).snoozes for name in ("a_snoozed", "b_snoozed", "a_done")}
        assert snoozes == {"a_snoozed": 1, "b_snoozed": 2, "a_done": 0}  # from an ENTRY row, from SNOOZE records
        dead = await store.get(IDS_V3["b_no_retry"])
        assert (dead.state, dead.attempts, dead.errors) == (
            JobState.DEAD,
            1,
            (FailedAttempt(1, "NoRetry: no", "Traceback (b_no_retry)", START + 4003.0),),
        )
        (same_a, same_b) = await store.add([new_job(Clock(LATER), key="key-a"), new_job(Clock(LATER), key="key-b")])
        assert (same_a.id, same_b.id) == (IDS_V3["a_ready"], IDS_V3["b_keyed"])


async def test_a_format_3_log_goes_on_in_format_4_and_its_checkpoint_drops_it(tmp_path: Path) -> None:
    wal = v3_log(tmp_path)
    clock = Clock(LATER)
    async with opened(wal, clock) as store:
        (labelled,) = await store.add([NewJob("t", {"n": 1}, 0, None, 3, 0.0, "email", "acme", 60.0)])
        assert await store.pause("email")
        jobs = {job_id: await store.get(job_id) for job_id in IDS_V3.values() if job_id != IDS_V3["a_evicted"]}
    assert versions(wal) == {2: 3, 3: 3, 4: 6}
    assert (wal / segment_name(3)).read_bytes() == (DATA / "wal_v3" / segment_name(3)).read_bytes()
    for _ in range(2):  # replayed from the format-5 records, then from a checkpoint of them
        async with opened(wal, clock) as store:
            assert {job_id: await store.get(job_id) for job_id in jobs} == jobs
            got = await store.get(labelled.id)
            assert (got.queue, got.tenant, got.deadline) == ("email", "acme", LATER + 60.0)
            assert await store.paused() == ["email"]
            await store.checkpoint()
    assert versions(wal) == {8: 6}  # 5 and 7: each session's first segment, 6 and 8 its checkpoint


def test_the_format_3_fixture_is_what_its_docstring_says() -> None:
    # Every record type format 3 has, a checkpoint, ENTRY rows with errors and
    # snoozes, and nothing of format 4: no trailing ADD field, no type above 12.
    kinds: set[int] = set()
    for segment in sorted((DATA / "wal_v3").glob("*.wal")):
        scan = scan_segment(str(segment))
        assert scan.version == 3 and scan.damage is None
        for kind, payload, _ in scan.committed():
            kinds.add(kind)
            if kind == COMMIT:
                continue
            fields = msgspec.msgpack.decode(payload)
            if kind == ADD:
                assert len(fields) == 8
            if kind == ENTRY:
                assert len(fields) == 17
            if kind == CHECKPOINT_BEGIN:
                assert len(fields) == 1
    assert kinds == {*range(1, 13), COMMIT}


# ------------------------------------------------------------ format 4


def _v4_names() -> dict[str, str]:
    """The format-4 fixture's job names by id."""
    return {job_id: name for name, job_id in IDS_V4.items()}


async def test_a_format_4_log_opens_with_every_job_as_it_was(tmp_path: Path) -> None:
    wal = v4_log(tmp_path)
    assert versions(wal) == {2: 4, 3: 4, 4: 4}
    async with opened_limited(wal, Clock(END_V4), LIMITS_V4) as store:
        assert store.recovery is not None
        assert store.recovery.versions == {2: 4, 3: 4, 4: 4}
        assert store.recovery.checkpoints_seen == 1
        for name, want in EXPECTED_V4.items():
            if want["state"] == "evicted":  # its DROP record replayed
                with pytest.raises(JobNotFound):
                    await store.get(want["id"])
                continue
            got = (await store.get(want["id"])).to_dict()
            # Running at the "crash": ready again, same epoch, uncounted. Everything
            # else as it was: queue, tenant, limit keys and deadline included.
            state = "ready" if want["state"] == "running" else want["state"]
            assert got == {**want, "after": [], "state": state}, name
        # Paused by the checkpoint's BEGIN ("reports") and by a PAUSE record ("bulk");
        # "email" was paused and resumed after the checkpoint.
        assert await store.paused() == ["bulk", "reports"]
        # The rates' tokens: "hourly" from the BEGIN, "api" from the last CLAIM's time.
        # No slot is held: the running job's "smtp" went with its attempt.
        assert await store.limit_usage() == {"api": (0, 0, END_V4 + 1.0), "hourly": (0, 0, START + 7601.0)}
        assert store._table is not None
        snoozes = {
            name: store._table.entry(IDS_V4[name]).snoozes
            for name in ("a_snoozed", "b_snoozed", "b_deadline_started", "a_done")
        }
        assert snoozes == {"a_snoozed": 1, "b_snoozed": 2, "b_deadline_started": 1, "a_done": 0}
        # An EXPIRE record: cancelled for its deadline, never started; a RETRY cleared a deadline.
        expired = await store.get(IDS_V4["b_expired"])
        assert (expired.state, expired.epoch, expired.finished_at) == (
            JobState.CANCELLED,
            0,
            START + 4003.0,
        )  # its deadline
        assert expired.error is not None and "deadline" in expired.error
        assert (await store.get(IDS_V4["b_deadline_retried"])).deadline is None
        counts: dict[str, int] = {state.value: 0 for state in JobState}
        for want in EXPECTED_V4.values():
            if want["state"] != "evicted":
                counts["ready" if want["state"] == "running" else want["state"]] += 1
        assert await store.counts() == counts
        assert counts["deferred"] == 0 and counts["ready"] > 0
        # Keys survive, from ENTRY rows and from ADD records alike.
        clock = Clock(END_V4)
        again = await store.add([new_job(clock, key=key) for key in ("key-a", "key-t", "key-b", "key-c")])
        assert [job.id for job in again] == [IDS_V4[n] for n in ("a_ready", "a_tenant", "b_keyed", "b_tenant")]


async def test_a_format_4_log_keeps_its_paused_queues_rates_and_deadlines(tmp_path: Path) -> None:
    wal = v4_log(tmp_path)
    clock = Clock(END_V4)
    names = _v4_names()

    async def claim_all() -> list[str]:
        await store.promote()
        return [names.get(job.id, job.id) for job in await store.claim(ClaimRequest("test", 1000))]

    async with opened_limited(wal, clock, LIMITS_V4) as store:
        waiting = {name for name, want in EXPECTED_V4.items() if want["state"] in ("ready", "running")}
        # Held back: the paused queues' jobs, and those waiting for a token of "api" or "hourly".
        held = {"a_queued", "b_queued", "a_limited", "b_limited", "b_api_waiting", "b_hourly"}
        assert held <= waiting and "a_running" in waiting
        assert set(await claim_all()) == waiting - held
        # "api" gives one start a second, its next at END + 1 (the format-4 log's last
        # CLAIM took the token at END): not half a second early.
        clock.now = END_V4 + 0.5
        assert await claim_all() == []
        clock.now = END_V4 + 1.0
        assert await claim_all() == ["b_api_waiting"]  # the best of the three
        clock.now = END_V4 + 1.5
        assert await claim_all() == []
        clock.now = END_V4 + 2.0
        assert await claim_all() == ["a_limited"]  # then by run_at
        clock.now = END_V4 + 3.0
        assert await claim_all() == ["b_limited"]  # "smtp": a_running holds one of its 2 slots
        # "hourly": its token from the checkpoint's BEGIN, due at START + 7601.
        clock.now = START + 7600.5
        assert await claim_all() == []
        clock.now = START + 7601.0
        assert await claim_all() == ["b_hourly"]
        # Past the deadlines of jobs that started (from an ENTRY row and from the
        # records): they stay scheduled; the never-claimed one not yet due stays too.
        for name in ("a_deadline_started", "b_deadline_started", "a_deadline_scheduled"):
            job = await store.get(IDS_V4[name])
            assert job.state is JobState.SCHEDULED and job.deadline is not None, name
        assert (await store.get(IDS_V4["a_deadline_started"])).deadline == START + 4031.0 < clock.now
        # The paused queues' jobs come once their queues are resumed.
        assert await store.resume("reports") and await store.resume("bulk")
        assert sorted(await claim_all()) == ["a_queued", "b_queued"]
        assert await store.paused() == []


async def test_a_format_4_log_goes_on_in_format_5_and_its_checkpoint_drops_it(tmp_path: Path) -> None:
    wal = v4_log(tmp_path)
    clock = Clock(END_V4)
    # defer_past=1: every new job is deferred (an ADD with format 5's flag).
    async with opened_limited(wal, clock, LIMITS_V4, defer_past=1) as store:
        (labelled,) = await store.add([NewJob("t", {"n": 1}, 0, None, 3, 0.0, "email", "acme", 60.0, ("smtp",))])
        assert labelled.state is JobState.DEFERRED
        assert await store.resume("bulk") and await store.pause("email")
        jobs = {job_id: await store.get(job_id) for job_id in IDS_V4.values() if job_id != IDS_V4["a_evicted"]}
        jobs[labelled.id] = await store.get(labelled.id)
    assert VERSION == 6
    assert versions(wal) == {2: 4, 3: 4, 4: 4, 5: 6}
    for number in (2, 3, 4):  # the old segments stay as they were, until a checkpoint
        assert (wal / segment_name(number)).read_bytes() == (DATA / "wal_v4" / segment_name(number)).read_bytes()
    for _ in range(2):  # replayed from the format-5 records, then from a checkpoint of them
        # The same bound: a session without one would admit the deferred job as it opens.
        async with opened_limited(wal, clock, LIMITS_V4, defer_past=1) as store:
            assert {job_id: await store.get(job_id) for job_id in jobs} == jobs
            got = await store.get(labelled.id)
            assert (got.state, got.queue, got.tenant, got.deadline, got.limits) == (
                JobState.DEFERRED,
                "email",
                "acme",
                END_V4 + 60.0,
                ("smtp",),
            )
            assert await store.paused() == ["email", "reports"]
            assert await store.limit_usage() == {"api": (0, 0, END_V4 + 1.0), "hourly": (0, 0, START + 7601.0)}
            await store.checkpoint()
    assert versions(wal) == {9: 6}  # 6 and 8: each session's first segment, 7 and 9 its checkpoint


def test_the_format_4_fixture_is_what_its_docstring_says() -> None:
    # Every record type format 4 has, none of format 5 (no ADMIT, no ADD with a
    # deferred flag), every run of ADD's and ENTRY's trailing fields, CLAIMs with
    # and without a time, and a BEGIN with a paused queue and rate tokens.
    kinds: set[int] = set()
    lengths: dict[int, set[int]] = {}
    begins: list[list[Any]] = []
    for segment in sorted((DATA / "wal_v4").glob("*.wal")):
        scan = scan_segment(str(segment))
        assert scan.version == 4 and scan.damage is None
        for kind, payload, _ in scan.committed():
            kinds.add(kind)
            if kind == COMMIT:
                continue
            fields = msgspec.msgpack.decode(payload)
            lengths.setdefault(kind, set()).add(len(fields))
            if kind == CHECKPOINT_BEGIN:
                begins.append(fields[1:])
    assert kinds == {*range(1, 16), COMMIT}
    assert Admit.kind not in kinds
    assert lengths[ADD] == {8, 9, 10, 11, 13}
    assert lengths[ENTRY] == {17, 18, 19, 20, 22}
    assert lengths[CLAIM] == {1, 2}
    assert begins == [[["reports"], [["api", START + 4002.0], ["hourly", START + 7601.0]]]]
    # The JSON: the jobs the docstring names, as it says they were at the copy.
    states = {name: EXPECTED_V4[name]["state"] for name in ("a_running", "b_expired", "b_hourly", "b_api_waiting")}
    assert states == {"a_running": "running", "b_expired": "cancelled", "b_hourly": "ready", "b_api_waiting": "ready"}
    running = EXPECTED_V4["a_running"]
    assert (running["queue"], running["tenant"], running["limits"]) == ("email", "acme", ["smtp"])


def _sinks() -> tuple[io.StringIO, io.StringIO]:
    return io.StringIO(), io.StringIO()


# --------------------------------------------------------------- records

RAW = msgspec.Raw(msgspec.msgpack.encode({"n": 1}))
_FULL_ROW = (
    "j1", "t", {"n": 1}, "dead", 5, "k", 3, 10.0, 9.0, 4, 3, 3, 12.0, None, "E: x",
    ((1, "E: x", "Traceback ...", 11.0), (2, "E: y", None, 12.0)), 2, "emails", "acme", ("smtp",), ("j0",),
    99.0, {"trace": "x"},
)  # fmt: skip
#: One record of each type with every field set off its default, and some with the defaults;
#: with the number of fields written (trailing defaults left off).
SAMPLES: list[tuple[Record, int]] = [
    (Add("j1", "t", RAW, 5, "k", 3, 10.0, 9.0, "emails", "acme", ("smtp",), ("j0",), 99.0, {"trace": "x"}), 14),
    (Add("j1", "t", RAW, 0, None, 1, 10.0, 9.0), 8),
    (Add("j1", "t", RAW, 0, None, 1, 10.0, 9.0, tenant="acme"), 10),
    (Add("j1", "t", RAW, 0, None, 1, 10.0, 9.0, "email"), 9),
    (Add("j1", "t", RAW, 0, None, 1, 10.0, 9.0, deadline=70.0), 13),  # as the table store writes a deadline
    (Claim("j1"), 1),
    (Claim("j1", 11.0), 2),
    (Succeed("j1", 2, {"deep": [1, {"x": None}]}, 11.0), 4),
    (Succeed("j1", 2, None, 11.0), 4),
    (Fail("j1", 2, "E: x", 12.0, 11.0, "Traceback ..."), 6),
    (Fail("j1", 2, "E: x", None, 11.0), 5),
    (Release("j1", 2), 2),
    (Cancel("j1", 11.0), 2),
    (Retry("j1", 11.0), 2),
    (Drop("j1"), 1),
    (Snooze("j1", 2, 70.0, 11.0), 4),
    (Expire("j1", 11.0), 2),
    (Pause("email"), 1),
    (Resume("email"), 1),
    (Row(*_FULL_ROW), 23),
    (Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None), 15),
    (Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None, snoozes=3), 17),
    (Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None, queue="email"), 18),
    (Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None, deadline=50.0), 22),
    (CheckpointBegin(7), 1),
    (CheckpointBegin(7, ("email", "reports")), 2),
    (CheckpointBegin(7, rates=(("api", 12.5),)), 3),
    (CheckpointEnd(7), 1),
]


@pytest.mark.parametrize(("record", "written"), SAMPLES, ids=[type(r).__name__ for r, _ in SAMPLES])
def test_a_record_round_trips_through_its_struct(record: Record, written: int) -> None:
    kind, payload = unframe(frame_record(record))
    assert RECORDS[kind] is type(record)
    decoded = decode_record(kind, payload)
    assert decoded == record and type(decoded) is type(record)
    # Trailing fields at their defaults are left off, and no others.
    assert len(msgspec.msgpack.decode(payload)) == written


def test_format_2_shaped_records_decode_with_their_new_fields_at_the_defaults() -> None:
    v2_fail = msgspec.msgpack.encode(("j1", 2, "E: x", 12.0, 11.0))  # format 2: 5 fields, always a retry_at
    assert decode_record(FAIL, v2_fail) == Fail("j1", 2, "E: x", 12.0, 11.0, traceback=None)
    v2_add = msgspec.msgpack.encode(("j1", "t", RAW, 0, None, 3, 10.0, 9.0))
    add = decode_record(ADD, v2_add)
    assert isinstance(add, Add)
    assert (add.queue, add.tenant, add.limits, add.after, add.deadline, add.metadata) == (
        "default",
        None,
        (),
        (),
        None,
        None,
    )
    v2_row = msgspec.msgpack.encode(("j1", "t", {"n": 1}, "dead", 0, None, 1, 10.0, 9.0, 4, 1, 1, 12.0, None, "E: x"))
    row = decode_record(ENTRY, v2_row)
    assert isinstance(row, Row) and (row.errors, row.snoozes, row.queue) == ((), 0, "default")
    # A later trioq's trailing field is ignored; a field of the wrong type is damage.
    assert decode_record(FAIL, msgspec.msgpack.encode(("j1", 2, "E: x", None, 11.0, None, "new"))) == Fail(
        "j1", 2, "E: x", None, 11.0
    )
    with pytest.raises(msgspec.ValidationError):
        decode_record(FAIL, msgspec.msgpack.encode(("j1", "2", "E: x", None, 11.0)))
    with pytest.raises(msgspec.ValidationError):
        decode_record(FAIL, msgspec.msgpack.encode(("j1", 2, "E: x", None)))  # `now` is required


def test_a_queue_left_off_decodes_as_the_default_object_itself() -> None:
    # What replay's hot path relies on: an ADD whose queue is the struct's own
    # default object has no trailing field at all (tested by identity, not
    # equality); one that writes the queue, even "default", has a new string.
    from trioq.stores.wal._recovery import _DEFAULT_QUEUE

    short = decode_record(ADD, msgspec.msgpack.encode(("j1", "t", RAW, 0, None, 1, 10.0, 9.0)))
    assert isinstance(short, Add) and short.queue is _DEFAULT_QUEUE
    for fields in (("default",), ("default", "acme"), ("default", None, (), (), 5.0)):
        added = decode_record(ADD, msgspec.msgpack.encode(("j1", "t", RAW, 0, None, 1, 10.0, 9.0, *fields)))
        assert isinstance(added, Add) and added.queue == "default" and added.queue is not _DEFAULT_QUEUE


def test_writing_a_record_as_a_tuple_or_a_struct_gives_the_same_bytes() -> None:
    fields = ("j1", "t", RAW, 0, None, 3, 10.0, 9.0)  # as TableStore hands an ADD
    assert frame(ADD, fields) == frame_record(Add(*fields))
    assert frame(FAIL, ("j1", 2, "E: x", None, 11.0, None)) != frame_record(Fail("j1", 2, "E: x", None, 11.0))
    assert frame(FAIL, ("j1", 2, "E: x", None, 11.0)) == frame_record(Fail("j1", 2, "E: x", None, 11.0))
    assert record_fields(Fail("j1", 2, "E: x", None, 11.0)) == ("j1", 2, "E: x", None, 11.0)
    # A default counts only as itself: 0.0 is not snoozes' 0, nor a non-empty tuple errors' ().
    row = Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None, (), 0.0)  # type: ignore[arg-type]
    assert len(record_fields(row)) == 17
    assert (
        len(record_fields(Row("j1", "t", {}, "ready", 0, None, 1, 10.0, 9.0, 4, 0, 0, None, None, None, (), 0))) == 15
    )


async def test_every_record_the_store_writes_is_its_structs_own_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TableStore (and the checkpoint's export()) hand records as tuples: each
    # must be exactly what its struct encodes to, as many fields as it wrote
    # (field order, types: a float written as an int would decode all the
    # same, and encode back otherwise).
    monkeypatch.setattr("trioq.stores.table.jobs.MAX_SNOOZES", 1)
    clock = Clock()
    wal = tmp_path / "wal"
    limits = {"api": Limit("api", rate=1.0), "smtp": Limit("smtp", max=2)}
    async with opened_limited(wal, clock, limits, retention=10.0) as store:
        # Limit keys: ADDs of every run of trailing fields with limits, a CLAIM with its
        # time, a rate's token for the checkpoint's BEGIN; all done before the jobs below.
        await store.add(
            [
                NewJob("t", {"l": 1}, 20, None, 3, 0.0, limits=("api",)),
                NewJob("t", {"l": 2}, 20, None, 3, 0.0, "email", "acme", 600.0, ("smtp", "api")),
            ]
        )
        limited = await claim(store)
        assert limited.payload == {"l": 1} and await succeed(store, limited.id, limited.epoch, None)
        assert await claim_one(store) is None  # {"l": 2}: no token for "api" yet, passed over
        clock.now += 1.0
        await store.promote()
        limited = await claim(store)
        assert limited.payload == {"l": 2} and await succeed(store, limited.id, limited.epoch, None)
        # ADDs with each run of trailing fields the table store writes (queue;
        # queue, tenant; queue, tenant, limits, after, deadline), one to expire.
        # Priority -1: claimed after every other job.
        await store.add(
            [
                NewJob("t", {"q": 1}, -1, None, 3, 0.0, "email"),
                NewJob("t", {"q": 2}, -1, None, 3, 0.0, "email", "acme"),
                NewJob("t", {"q": 3}, -1, None, 3, 0.0, "default", None, 1000.0),
                NewJob("t", {"q": 4}, -1, None, 3, 0.0, "email", "acme", 1.0),
            ]
        )
        assert await store.pause("email") and await store.pause("reports") and await store.resume("reports")
        await store.add([new_job(clock, n=i, key=f"k{i}") for i in range(6)] + [new_job(clock, delay=50.0)])
        a = await claim(store)
        assert await succeed(store, a.id, a.epoch, {"nested": [1, 2.5, None]})
        b = await claim(store)
        assert await succeed(store, b.id, b.epoch, 7)
        c = await claim(store)
        assert await fail(store, c.id, c.epoch, "E: retry", 5.0, traceback="Traceback ...") is JobState.SCHEDULED
        d = await claim(store)
        assert await fail(store, d.id, d.epoch, "E: no retry", None) is JobState.DEAD
        await store.retry(d.id)
        e = await claim(store)
        assert await store.complete([Released(e.id, e.epoch)]) == [JobState.READY]
        (hi,) = await store.add([NewJob("t", {}, 5, None, 3)])  # claimed first: priority 5
        e = await claim(store)
        assert e.id == hi.id and await store.complete([Snoozed(e.id, e.epoch, 0.0)]) == [JobState.READY]
        e = await claim(store)  # snoozed past MAX_SNOOZES: the table fails it
        assert e.id == hi.id and await store.complete([Snoozed(e.id, e.epoch, 3.0)]) == [JobState.DEAD]
        e = await claim(store)
        assert await store.complete([Snoozed(e.id, e.epoch, 3.0)]) == [JobState.SCHEDULED]
        await store.cancel((await claim(store)).id)
        clock.now += 2.0  # past the deadline of {"q": 4}: the next claim's sweep expires it (EXPIRE)
        expired = [j for j in await store.jobs([JobState.READY], limit=100) if j.payload == {"q": 4}]
        assert len(expired) == 1
        await claim(store)
        assert (await store.get(expired[0].id)).state is JobState.CANCELLED
        await store.sync()
        shutil.copytree(wal, tmp_path / "before-checkpoint")  # which deletes the segments so far
        await store.checkpoint()
        clock.now += 60.0
        assert await store.evict() >= 1
        await store.sync()
    async with opened_limited(wal, clock, limits, retention=10.0) as store:
        assert store._table is not None  # its running jobs released at the end of the last session
        pending = store._table.pending
    # Admission: the first job takes the last place under the bound, the second is deferred (an
    # ADD with its flag), a claim admits it (ADMIT), and a checkpoint holds a deferred row.
    async with opened_limited(wal, clock, limits, retention=10.0, defer_past=pending + 1) as store:
        first, second, third = await store.add([NewJob("t", {"d": n}, 50, None, 3) for n in range(3)])
        assert (first.state, second.state, third.state) == (JobState.READY, JobState.DEFERRED, JobState.DEFERRED)
        assert (await claim(store)).id == first.id
        assert (await store.get(second.id)).state is JobState.READY
        # A TICK (a cron schedule's tick, with its job), and a flow: an ADD with parents (queue,
        # tenant, limits, after), and an ENTRY of a child its parent's cancel cancelled (cancelled_by).
        assert await store.add_tick("every-minute", START, NewJob("t", {"c": 1}, 50, None, 3)) is not None
        parent, child = await store.add([NewJob("t", {"f": 1}, 50, None, 3), NewJob("t", {}, 50, None, 3, after=(0,))])
        assert child.state is JobState.WAITING
        await store.cancel(parent.id)
        assert (await store.get(child.id)).state is JobState.CANCELLED
        await store.sync()
        shutil.copytree(wal, tmp_path / "before-second-checkpoint")
        await store.checkpoint()
    seen: set[int] = set()
    lengths: dict[int, set[int]] = {}
    for segment in segments(tmp_path / "before-checkpoint") + segments(tmp_path / "before-second-checkpoint"):
        for kind, payload, _ in scan_segment(str(segment)).committed():
            if kind == COMMIT:
                continue
            seen.add(kind)
            record = decode_record(kind, payload)
            written = len(msgspec.msgpack.decode(payload))
            lengths.setdefault(kind, set()).add(written)
            assert msgspec.msgpack.encode(msgspec.structs.astuple(record)[:written]) == bytes(payload), record
    assert seen == set(RECORDS)
    # Every run of ADD's and ENTRY's trailing fields, and a BEGIN with paused queues, were among them.
    assert lengths[ADD] == {8, 9, 10, 11, 12, 13, 15}
    assert lengths[ENTRY] == {17, 18, 19, 20, 22}
    assert lengths[CLAIM] == {1, 2}
    assert lengths[CHECKPOINT_BEGIN] == {3}  # the ticks ride on the second checkpoint, not copied
    assert {EXPIRE, PAUSE, RESUME, SNOOZE} <= seen


def test_the_format_2_fixture_is_what_its_docstring_says() -> None:
    # Every record type format 2 has, a checkpoint, and no format-3 record.
    kinds: set[int] = set()
    for segment in sorted((DATA / "wal_v2").glob("*.wal")):
        scan = scan_segment(str(segment))
        assert scan.version == 2 and scan.damage is None
        kinds.update(kind for kind, _, _ in scan.committed())
        for kind, payload, _ in scan.committed():
            if kind == FAIL:
                assert len(msgspec.msgpack.decode(payload)) == 5
            if kind == ENTRY:
                assert len(msgspec.msgpack.decode(payload)) == 15
    assert kinds == (set(RECORDS) - {Snooze.kind, Expire.kind, Pause.kind, Resume.kind, Admit.kind, TICK}) | {COMMIT}
