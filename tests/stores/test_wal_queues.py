"""WALStore and log format 4: named queues, tenants, deadlines and paused queues, logged and recovered.

Each is checked after a reopen (replayed from the records: ADD's trailing
fields, EXPIRE, PAUSE, RESUME) and after a checkpoint (replayed from its ENTRY
rows and its BEGIN's paused queues), and a crash at any record loses nothing
acknowledged (``FaultPlan.crash``: the crash-injecting log wrapper).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from test_wal import START, Clock, claim, claim_one, crash_copy, opened, scan_segment, segments, succeed
from test_wal_format import opened_limited

import trioq
from trioq import Job, JobState, WALCorruption
from trioq._app.walcli import verify_command
from trioq._model import Limit, deadline_error
from trioq.stores import ClaimRequest, NewJob, WALStore
from trioq.stores.table.store import ADD, CLAIM, EXPIRE, PAUSE, RESUME
from trioq.stores.wal._format import CHECKPOINT_BEGIN, COMMIT, HEADER_SIZE, commit_frame, frame, header, segment_name
from trioq.testing import FaultPlan, SimulatedCrash


def job(
    n: int,
    queue: str = "default",
    tenant: str | None = None,
    deadline: float | None = None,
    *,
    delay: float = 0.0,
    priority: int = 0,
) -> NewJob:
    return NewJob("t", {"n": n}, priority, None, 3, float(delay), queue, tenant, deadline)


async def snapshots(store: WALStore, jobs: list[Job]) -> dict[str, Job]:
    return {j.id: await store.get(j.id) for j in jobs}


async def claim_all(store: WALStore, queues: tuple[str, ...] | None = None) -> list[Job]:
    return await store.claim(ClaimRequest("test", 1000, queues=queues))


def kinds_in(wal: Path) -> dict[int, list[list[Any]]]:
    """Every committed record of the log, decoded as plain msgpack, by type."""
    found: dict[int, list[list[Any]]] = {}
    for segment in segments(wal):
        for kind, payload, _ in scan_segment(str(segment)).committed():
            if kind != COMMIT:
                found.setdefault(kind, []).append(msgspec.msgpack.decode(payload))
    return found


# ------------------------------------------------------------ labels


async def test_queue_tenant_and_deadline_survive_a_reopen_and_a_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        jobs = await store.add(
            [
                job(0, "email", "acme", 100.0),
                job(1, "email"),
                job(2, tenant="globex"),
                job(3, deadline=100.0),
                job(4),
                job(5, "reports", "acme", 300.0, delay=50.0),  # scheduled, with a deadline
                job(6, "email", "initech", 100.0, priority=9),  # claimed first: keeps its deadline
            ]
        )
        done = await claim(store)
        assert done.id == jobs[6].id and await succeed(store, done.id, done.epoch, "ok")
        before = await snapshots(store, jobs)
    assert before[jobs[0].id].deadline == START + 100.0 and before[jobs[5].id].run_at == START + 50.0
    assert [(j.queue, j.tenant) for j in before.values()] == [
        ("email", "acme"),
        ("email", None),
        ("default", "globex"),
        ("default", None),
        ("default", None),
        ("reports", "acme"),
        ("email", "initech"),
    ]
    # The ADD records carry what is off its default, and nothing more.
    assert sorted(len(fields) for fields in kinds_in(wal)[ADD]) == [8, 9, 10, 13, 13, 13, 13]

    for reopen in ("records", "checkpoint"):
        async with opened(wal, clock) as store:
            assert await snapshots(store, jobs) == before, reopen
            assert store._table is not None
            # One string object per queue and tenant name, as enqueue shares them.
            entry = store._table.entry
            assert entry(jobs[0].id).queue is entry(jobs[1].id).queue is entry(jobs[6].id).queue
            assert entry(jobs[0].id).tenant is entry(jobs[5].id).tenant
            await store.checkpoint()
    rows = kinds_in(wal)[9]  # ENTRY: the checkpoint's rows
    assert sorted(len(fields) for fields in rows) == [17, 18, 19, 22, 22, 22, 22]

    # The table holds them, not just the snapshots: claims by queue, and deadlines act.
    async with opened(wal, clock) as store:
        assert {j.id for j in await claim_all(store, ("email",))} == {jobs[0].id, jobs[1].id}
        assert await claim_all(store, ("email", "nowhere")) == []
        clock.now = START + 150.0  # past the deadline of job 3 (never claimed); job 0 was claimed
        assert await store.promote() == START + 300.0  # job 5's deadline comes next (run_at is past)
        expired = await store.get(jobs[3].id)
        assert (expired.state, expired.error) == (JobState.CANCELLED, deadline_error(START, START + 100.0))
        assert (await store.get(jobs[0].id)).state is JobState.RUNNING
        assert (await store.get(jobs[5].id)).state is JobState.READY


async def test_limit_keys_and_rate_tokens_survive_a_reopen_and_a_checkpoint(tmp_path: Path) -> None:
    # A rate's tokens are rebuilt from the CLAIM records' times, then from the
    # checkpoint's BEGIN; a key's slots from the running jobs (none after a close).
    limits = {"api": Limit("api", rate=1.0), "smtp": Limit("smtp", max=1)}
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened_limited(wal, clock, limits) as store:
        first, second, mailer = await store.add(
            [
                NewJob("t", {"n": 0}, 1, None, 3, limits=("api",)),
                NewJob("t", {"n": 1}, 1, None, 3, limits=("api",)),
                NewJob("t", {"n": 2}, 0, None, 3, limits=("smtp",)),
            ]
        )
        got = await claim(store)
        assert got.id == first.id and await succeed(store, got.id, got.epoch, None)
        assert (await claim(store)).id == mailer.id  # second: no token yet, passed over
    assert [fields for fields in kinds_in(wal)[CLAIM]] == [[first.id, START], [mailer.id, START]]
    for reopen in ("records", "checkpoint"):
        async with opened_limited(wal, clock, limits) as store:
            assert (await store.get(second.id)).limits == ("api",), reopen
            # The mailer was released at the close: its slot is free again; the token is still taken.
            assert [j.id for j in await claim_all(store)] == [mailer.id], reopen
            await store.checkpoint()
    (begin,) = kinds_in(wal)[CHECKPOINT_BEGIN]
    assert begin == [3, [], [["api", START + 1.0]]]
    clock.now += 1.0
    async with opened_limited(wal, clock, limits) as store:
        await store.promote()
        assert {j.id for j in await claim_all(store)} == {second.id, mailer.id}  # the token is due


# ----------------------------------------------------------- pausing


async def test_a_paused_queue_stays_paused_after_a_reopen_and_a_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        assert await store.pause("email") and await store.pause("idle")  # "idle" holds no job
        assert await store.pause("reports") and await store.resume("reports")
        assert not await store.pause("email")  # paused already: nothing logged
        email, plain = await store.add([job(0, "email"), job(1)])
    assert [fields for fields in kinds_in(wal)[PAUSE]] == [["email"], ["idle"], ["reports"]]
    assert [fields for fields in kinds_in(wal)[RESUME]] == [["reports"]]

    async with opened(wal, clock) as store:  # from the PAUSE and RESUME records
        assert await store.paused() == ["email", "idle"]
        assert [j.id for j in await claim_all(store)] == [plain.id]  # the email job stays ready
        assert (await store.get(email.id)).state is JobState.READY
        await store.checkpoint()
    (begin,) = kinds_in(wal)[CHECKPOINT_BEGIN]
    assert begin == [2, ["email", "idle"]]

    async with opened(wal, clock) as store:  # from the checkpoint's BEGIN (the records are gone)
        assert PAUSE not in kinds_in(wal) and RESUME not in kinds_in(wal)
        assert await store.paused() == ["email", "idle"]
        # The plain job was running at each close: released, ready again (the default queue runs).
        assert [j.id for j in await claim_all(store)] == [plain.id]
        assert not await store.resume("nothing")
        assert await store.resume("email")
        assert await store.paused() == ["idle"]

    async with opened(wal, clock) as store:  # the resume after a reopen is durable too
        assert await store.paused() == ["idle"]
        assert {j.id for j in await claim_all(store)} == {email.id, plain.id}
        await store.checkpoint()
    (begin,) = kinds_in(wal)[CHECKPOINT_BEGIN]
    assert begin == [2, ["idle"]]
    async with opened(wal, clock) as store:
        assert await store.paused() == ["idle"]
        assert await store.resume("idle")
        await store.checkpoint()
    (begin,) = kinds_in(wal)[CHECKPOINT_BEGIN]
    assert begin == [2]  # no queue paused: the field left off
    async with opened(wal, clock) as store:
        assert await store.paused() == []


# ---------------------------------------------------------- deadlines


async def test_a_deadline_expiry_replays_after_a_reopen_and_a_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        assert await store.pause("held")
        swept, claimed = await store.add([job(0, "held", "acme", 5.0), job(1, "email", None, 5.0, priority=1)])
        (other,) = await store.add([job(2, deadline=5.0)])
        running = await claim(store)
        assert running.id == claimed.id
        clock.now += 10.0
        assert await store.promote() is None  # the sweep: swept and other expire, not the running job
        assert await claim_all(store) == []
        await store.sync()
        expired = await store.get(swept.id)
        assert expired.state is JobState.CANCELLED and expired.finished_at == START + 10.0
        text = "DeadlineExpired: not started within 5 s of its enqueue (its deadline)"
        assert expired.error == deadline_error(START, START + 5.0) == text
        assert (await store.get(other.id)).error == expired.error
        before = await snapshots(store, [swept, claimed, other])
    assert [fields for fields in kinds_in(wal)[EXPIRE]] == [[swept.id, START + 10.0], [other.id, START + 10.0]]
    for reopen in ("records", "checkpoint"):
        async with opened(wal, clock) as store:
            got = await snapshots(store, [swept, claimed, other])
            assert got[swept.id] == before[swept.id], reopen  # cancelled, same error text, same finished_at
            assert got[other.id] == before[other.id], reopen
            # Running at the close: ready again under its epoch, its deadline kept, and it never expires.
            assert (got[claimed.id].state, got[claimed.id].epoch) == (JobState.READY, 1)
            assert got[claimed.id].deadline == START + 5.0
            assert await store.promote() is None
            assert (await store.get(claimed.id)).state is JobState.READY
            await store.checkpoint()


async def test_a_deadline_that_passed_while_closed_expires_at_the_first_sweep_and_a_retry_clears_it(
    tmp_path: Path,
) -> None:
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock) as store:
        (late,) = await store.add([job(0, "email", "acme", 5.0)])
    clock.now += 60.0
    async with opened(wal, clock) as store:
        assert (await store.get(late.id)).state is JobState.READY  # nothing swept yet
        assert await claim_one(store) is None  # the claim's sweep expires it instead
        await store.sync()
        expired = await store.get(late.id)
        assert (expired.state, expired.finished_at) == (JobState.CANCELLED, START + 60.0)
    async with opened(wal, clock) as store:
        assert await store.get(late.id) == expired
        retried = await store.retry(late.id)
        got = (retried.state, retried.deadline, retried.queue, retried.tenant)
        assert got == (JobState.READY, None, "email", "acme")
    clock.now += 60.0
    for _ in range(2):
        async with opened(wal, clock) as store:
            assert await store.get(late.id) == retried
            assert await store.promote() is None
            await store.checkpoint()


async def test_an_expire_record_the_table_refuses_is_corruption(tmp_path: Path) -> None:
    # A log whose EXPIRE names a job that had started (the log diverged from
    # what the table can do) is refused where it is, like any other record.
    wal = tmp_path / "wal"
    wal.mkdir()
    records = [
        frame(ADD, ("j1", "t", msgspec.Raw(b"\x80"), 0, None, 3, START, START, "default", None, (), (), START + 5)),
        frame(2, ("j1",)),  # CLAIM
        frame(EXPIRE, ("j1", START + 10)),
    ]
    body = b"".join(records)
    (wal / segment_name(1)).write_bytes(header(1) + body + commit_frame(1, HEADER_SIZE))
    with pytest.raises(WALCorruption, match="record does not replay: job 'j1' is running") as info:
        async with opened(wal, Clock()):
            pass  # pragma: no cover
    assert info.value.offset == HEADER_SIZE + len(records[0]) + len(records[1])
    assert verify_command(str(wal), io.StringIO(), io.StringIO()) == 1
    # A PAUSE of a queue paused already, likewise (the store logs only changes).
    shutil.rmtree(wal)
    wal.mkdir()
    body = frame(PAUSE, ("email",)) + frame(PAUSE, ("email",))
    (wal / segment_name(1)).write_bytes(header(1) + body + commit_frame(1, HEADER_SIZE))
    with pytest.raises(WALCorruption, match="record of type 14 does not replay"):
        async with opened(wal, Clock()):
            pass  # pragma: no cover


# ------------------------------------------------------------ crashes

registry = trioq.Registry()


@registry.task
async def quick(ctx: trioq.JobContext, n: int) -> None:
    pass


class Acked:
    """What a session acknowledged, and the one change it had attempted when a crash struck."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.expired: dict[str, Job] = {}
        self.paused: set[str] = set()
        #: The pause or resume in flight: ("pause" | "resume", queue), else None.
        self.attempt: tuple[str, str] | None = None

    def then(self) -> Acked:
        """What a next session starts from: all this one acknowledged."""
        later = Acked()
        later.jobs, later.expired, later.paused = list(self.jobs), dict(self.expired), set(self.paused)
        return later


async def _session(wal: Path, acked: Acked, plan: FaultPlan | None, jobs: range, checkpoint_at: int = -1) -> None:
    """Enqueue ``jobs`` one by one into three queues, pausing and resuming them, deadlines expiring meanwhile."""
    store = trioq.WALStore(wal, fsync="always", segment_size=4096)
    async with trioq.open_queue(registry, store=store, workers=0, faults=plan) as queue:
        for n in jobs:
            name = f"q{n % 3}"
            deadline = 0.5 if n % 4 == 0 else (None if n % 4 == 1 else 1e6)
            tenant = None if n % 5 == 0 else f"tenant-{n % 2}"
            acked.jobs.append(await queue.enqueue("quick", {"n": n}, queue=name, tenant=tenant, deadline=deadline))
            if n % 4 == 1:
                change = ("resume", name) if name in acked.paused else ("pause", name)
                acked.attempt = change
                assert await (queue.resume(name) if change[0] == "resume" else queue.pause(name))
                acked.paused ^= {name}
                acked.attempt = None
            if n == checkpoint_at:
                await store.checkpoint()
            await trio.sleep(0.2)  # the 0.5 s deadlines pass: the maintenance timer expires those jobs
            for j in acked.jobs:
                if j.deadline is not None and j.id not in acked.expired:
                    got = await queue.get(j.id)  # a terminal job's get() makes its outcome durable
                    if got.state is JobState.CANCELLED:
                        acked.expired[j.id] = got


async def _reopened(wal: Path) -> tuple[dict[str, Job], list[str]]:
    async with trioq.open_queue(registry, store=trioq.WALStore(wal), workers=0) as queue:
        store = queue.store
        assert isinstance(store, WALStore) and store._table is not None
        found = {e.id: e.snapshot() for e in store._table.entries()}
        return found, await store.paused()


def _check(found: dict[str, Job], paused: list[str], acked: Acked, where: object) -> None:
    for j in acked.jobs:
        got = found.get(j.id)
        assert got is not None, (where, j)
        assert (got.queue, got.tenant, got.deadline, got.payload) == (j.queue, j.tenant, j.deadline, j.payload), where
    for job_id, expired in acked.expired.items():
        assert found[job_id] == expired, where  # cancelled, its error, its finished_at
    assert expired_text(acked.expired.values())
    could = [acked.paused]
    if acked.attempt is not None:  # written, perhaps, and the crash struck before it was acknowledged
        could.append(acked.paused ^ {acked.attempt[1]})
    assert set(paused) in could, (where, paused, acked.paused, acked.attempt)


def expired_text(jobs: Any) -> bool:
    return all(j.error is not None and j.error.startswith("DeadlineExpired: not started within 0.5 s") for j in jobs)


async def test_a_crash_at_any_record_loses_no_acknowledged_label_pause_or_expiry(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    base = tmp_path / "base"
    earlier = Acked()
    await _session(base, earlier, None, range(12))  # a closed session: queues paused, jobs expired
    assert earlier.paused and len(earlier.expired) >= 2
    found, paused = await _reopened(base)
    _check(found, paused, earlier, "base")
    # Session two, uncrashed, counts its records (an ADD per job, a PAUSE or
    # RESUME every fourth, EXPIREs; the checkpoint is no record): a crash then strikes at each.
    counted = FaultPlan()
    wal = tmp_path / "counted"
    shutil.copytree(base, wal)
    uncrashed = earlier.then()
    await _session(wal, uncrashed, counted, range(12, 36), checkpoint_at=20)
    assert len(uncrashed.expired) - len(earlier.expired) >= 5
    kinds = kinds_in(wal)  # after the checkpoint
    assert len(kinds[EXPIRE]) >= 3 and len(kinds[PAUSE]) >= 1 and len(kinds[RESUME]) >= 1
    assert counted.records >= 35  # 24 ADDs, 6 PAUSE or RESUME, 6 EXPIRE
    crashed = 0
    for point in range(1, counted.records + 1):
        wal = tmp_path / f"crash-{point}"
        shutil.copytree(base, wal)
        acked = earlier.then()
        try:
            await _session(wal, acked, FaultPlan().crash(after_records=point), range(12, 36), checkpoint_at=20)
        except SimulatedCrash:
            crashed += 1
        assert verify_command(str(wal), io.StringIO(), io.StringIO()) == 0, point
        found, paused = await _reopened(wal)
        _check(found, paused, acked, point)
        # The log a crash was recovered from goes on: a reopen shows the same again.
        found_again, paused_again = await _reopened(wal)
        assert (found_again, paused_again) == (found, paused), point
        shutil.rmtree(wal)
    assert crashed == counted.records


async def test_a_copy_taken_while_open_is_what_was_acknowledged(tmp_path: Path) -> None:
    # kill -9 at any moment (a copy of the open directory), fsync="always": every
    # label, pause and expiry acknowledged so far is in it.
    clock = Clock()
    wal = tmp_path / "wal"
    async with opened(wal, clock, fsync="always", segment_size=4096) as store:
        acked: list[Job] = []
        paused: set[str] = set()
        for i in range(40):
            acked += await store.add([job(i, f"q{i % 3}", f"t{i % 2}", 3.0 if i % 2 else None)])
            if i % 5 == 0:
                name = f"q{i % 3}"
                assert await (store.resume(name) if name in paused else store.pause(name))
                paused ^= {name}
            clock.now += 1.0
            await store.promote()  # expires the jobs of 3 s ago (lazy records)...
            if i % 13 == 12:
                await store.checkpoint()
            if i % 6 == 0:
                await store.sync()  # ...made durable here, as a get() of one would
                want = await snapshots(store, acked)
                copy = crash_copy(wal, tmp_path / f"kill-{i}")
                async with opened(copy, clock) as reopened:
                    assert await snapshots(reopened, acked) == want, i
                    assert set(await reopened.paused()) == paused, i
                shutil.rmtree(copy)
        assert any(j.state is JobState.CANCELLED for j in (await snapshots(store, acked)).values())
