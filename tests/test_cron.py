"""Cron schedules end to end, through ``registry.cron`` and ``open_queue``: each tick enqueued once, a
baseline at first sight, the latest missed tick once after downtime, time zones (and croniter's DST
handling), ``stats()["cron"]``, ``trioq cron list``, and two PostgreSQL nodes (a leader change, and
two nodes that both believe they lead).

The in-process tests run on the autojump clock with ``time.time`` following it (the :func:`wall`
fixture), so that a queue's wall clock starts at a known instant and moves with virtual time, also
across a close and a reopen (downtime). The PostgreSQL tests run in real time on a schedule of every
second (croniter's sixth field).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from trioq import Job, JobState
from trioq._app.croncli import list_command
from trioq.stores import NewJob

ROOT = Path(__file__).resolve().parent.parent


def _at(iso: str) -> float:
    """Wall time of an ISO 8601 instant (``Z`` for UTC)."""
    return datetime.datetime.fromisoformat(iso).timestamp()


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Wall:
    """The wall clock the tests give trioq: ``time.time()`` is ``base + trio.current_time()``."""

    def __init__(self) -> None:
        self.base = 0.0

    def set(self, iso: str) -> None:
        """Make now ``iso`` (call before opening a queue: a queue reads the offset once, as it opens)."""
        self.base = _at(iso) - trio.current_time()

    def now(self) -> float:
        return self.base + trio.current_time()


@pytest.fixture
async def wall(monkeypatch: pytest.MonkeyPatch) -> Wall:
    """Wall time that starts at 2026-01-01T00:02:30Z and follows the trio clock, also while no queue
    is open (downtime is a ``trio.sleep`` between two ``open_queue``). Tests using it ask for
    ``autojump_clock`` themselves: pytest-trio takes the clock from the test's own arguments."""
    clock = Wall()
    clock.set("2026-01-01T00:02:30Z")
    real = time.time

    def fake() -> float:
        try:
            return clock.now()
        except RuntimeError:  # outside trio (a worker thread): the real clock
            return real()

    monkeypatch.setattr(time, "time", fake)
    return clock


@pytest.fixture(params=["memory", "wal"])
def store_of(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], trioq.Store]:
    """The store under test, again after each call: the same MemoryStore, or a WALStore on one directory."""
    if request.param == "memory":
        memory = trioq.MemoryStore()
        return lambda: memory
    return lambda: trioq.WALStore(tmp_path / "wal", fsync="never")


def _recording(runs: list[Job]) -> trioq.Registry:
    """A registry whose task ``tick`` records the job of each run."""
    registry = trioq.Registry()

    @registry.task
    async def tick(ctx: trioq.JobContext) -> None:
        runs.append(ctx.job)

    return registry


async def _jobs(queue: trioq.Queue) -> list[Job]:
    """Every job of the queue's store (cron jobs included), oldest first."""
    jobs = await queue.store.jobs(list(JobState), limit=10_000)
    return sorted(jobs, key=lambda job: job.created_at)


def _open(registry: trioq.Registry, **options: Any) -> contextlib.AbstractAsyncContextManager[trioq.Queue]:
    """``open_queue`` with a poll interval of an hour: these tests span virtual hours and days, and
    nothing in them needs the poll fallback (hints wake the workers, the scheduler sleeps to each
    tick), so the loops that poll need not wake every virtual second."""
    return trioq.open_queue(registry, poll_interval=3600.0, **options)


def _keys(runs: list[Job]) -> list[str]:
    return sorted(job.key or "" for job in runs)


async def _cron_row(queue: trioq.Queue, name: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = (await queue.stats())["cron"]
    (row,) = [row for row in rows if row["name"] == name]
    return row


# ----------------------------------------------------------------- ticks on the in-process stores


async def test_every_five_minutes_for_an_hour_enqueues_twelve_ticks_once_each(
    wall: Wall, autojump_clock: trio.testing.MockClock, store_of: Callable[[], trioq.Store]
) -> None:
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("*/5 * * * *", "tick")
    async with _open(registry, store=store_of(), workers=2) as queue:
        await trio.sleep(3600)  # 00:02:30 -> 01:02:30
        await queue.join()
        jobs = await _jobs(queue)
        row = await _cron_row(queue, "tick")
    ticks = [f"2026-01-01T{minute // 60:02}:{minute % 60:02}:00Z" for minute in range(5, 61, 5)]
    assert len(ticks) == 12
    assert _keys(runs) == [f"cron:tick:{tick}" for tick in ticks]  # each tick, each once
    assert len(jobs) == 12 and all(job.state is JobState.SUCCEEDED for job in jobs)
    for job in runs:  # enqueued at its tick, not before, nor a poll later
        assert job.key == f"cron:tick:{_iso(job.created_at)}"
        assert 0 <= job.created_at - _at(job.key.removeprefix("cron:tick:")) < 0.01
    assert row["last_tick"] == _at("2026-01-01T01:00:00Z")
    assert row["next_run"] == _at("2026-01-01T01:05:00Z")
    assert row["enqueued"] == 12


async def test_after_downtime_the_latest_missed_tick_runs_once(
    wall: Wall, autojump_clock: trio.testing.MockClock, store_of: Callable[[], trioq.Store]
) -> None:
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("*/5 * * * *", "tick")
    async with _open(registry, store=store_of(), workers=2) as queue:
        await trio.sleep(600)  # ticks 00:05 and 00:10
        await queue.join()
    await trio.sleep(3600)  # down from 00:12:30 to 01:12:30: twelve ticks (00:15 ... 01:10) missed
    async with _open(registry, store=store_of(), workers=2) as queue:
        await trio.sleep(1)  # the scheduler's first look, as the queue opens
        await queue.join()
        assert _keys(runs)[-1] == "cron:tick:2026-01-01T01:10:00Z"
        assert runs[-1].created_at == pytest.approx(_at("2026-01-01T01:12:30Z"))  # as the queue reopened
        await trio.sleep(300)  # and on at its pace: 01:15
        await queue.join()
        assert (await _cron_row(queue, "tick"))["enqueued"] == 2
    assert _keys(runs) == [
        "cron:tick:2026-01-01T00:05:00Z",
        "cron:tick:2026-01-01T00:10:00Z",
        "cron:tick:2026-01-01T01:10:00Z",
        "cron:tick:2026-01-01T01:15:00Z",
    ]


async def test_a_schedule_first_seen_records_a_baseline_and_runs_no_past_tick(
    wall: Wall, autojump_clock: trio.testing.MockClock, store_of: Callable[[], trioq.Store]
) -> None:
    """A daily tick 2.5 minutes before the first open does not run; a schedule added at a later open
    starts from that open, while the one already known catches up its missed tick."""
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("0 0 * * *", "tick", name="daily")
    async with _open(registry, store=store_of(), workers=1) as queue:
        await trio.sleep(60)
        row = await _cron_row(queue, "daily")
    assert runs == []
    assert row["last_tick"] == _at("2026-01-01T00:02:30Z")  # the baseline: the first open
    assert row["next_run"] == _at("2026-01-02T00:00:00Z")
    await trio.sleep(86400)  # down past the next midnight, to 2026-01-02T00:03:30Z
    registry.cron("0 0 * * *", "tick", name="added")
    async with _open(registry, store=store_of(), workers=1) as queue:
        await trio.sleep(1)
        await queue.join()
        added = await _cron_row(queue, "added")
    assert _keys(runs) == ["cron:daily:2026-01-02T00:00:00Z"]
    assert added["last_tick"] == _at("2026-01-02T00:03:30Z")
    assert added["next_run"] == _at("2026-01-03T00:00:00Z")


async def test_stats_show_each_schedule_with_its_next_run(
    wall: Wall, autojump_clock: trio.testing.MockClock, store_of: Callable[[], trioq.Store]
) -> None:
    registry = _recording([])
    registry.cron("*/5 * * * *", "tick")
    registry.cron("0 9 * * *", "tick", payload={}, name="morning", tz="America/Sao_Paulo")
    async with _open(registry, store=store_of(), workers=1) as queue:
        await trio.sleep(180)  # 00:05:30: "tick" took 00:05
        cron = (await queue.stats())["cron"]
        json.dumps(cron)  # JSON-ready, as all of stats()
    assert cron == [
        {
            "name": "morning",
            "schedule": "0 9 * * *",
            "task": "tick",
            "tz": "America/Sao_Paulo",
            "next_run": _at("2026-01-01T12:00:00Z"),
            "last_tick": _at("2026-01-01T00:02:30Z"),
            "enqueued": 0,
        },
        {
            "name": "tick",
            "schedule": "*/5 * * * *",
            "task": "tick",
            "tz": "UTC",
            "next_run": _at("2026-01-01T00:10:00Z"),
            "last_tick": _at("2026-01-01T00:05:00Z"),
            "enqueued": 1,
        },
    ]


# ----------------------------------------------------------------- time zones


async def test_a_schedule_in_another_time_zone_fires_at_its_local_time(
    wall: Wall, autojump_clock: trio.testing.MockClock
) -> None:
    """``0 9 * * *`` in São Paulo (UTC-3, no DST since 2019) is 12:00 UTC."""
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("0 9 * * *", "tick", name="morning", tz="America/Sao_Paulo")
    async with _open(registry, workers=1) as queue:
        await trio.sleep(_at("2026-01-01T12:00:01Z") - wall.now())
        await queue.join()
        row = await _cron_row(queue, "morning")
    assert _keys(runs) == ["cron:morning:2026-01-01T12:00:00Z"]
    assert runs[0].created_at == pytest.approx(_at("2026-01-01T12:00:00Z"))
    assert row["next_run"] == _at("2026-01-02T12:00:00Z")


@pytest.mark.parametrize(
    ("start", "schedule", "expected"),
    [
        pytest.param(  # 02:30 does not exist on 2026-03-08: the tick comes once, at 03:00 EDT
            "2026-03-08T04:00:00Z",
            "30 2 * * *",
            ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
            id="gap",
        ),
        pytest.param(  # 01:30 comes twice on 2026-11-01: once in EDT, once in EST, an hour apart
            "2026-11-01T04:00:00Z",
            "30 1 * * *",
            ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"],
            id="overlap",
        ),
        pytest.param(  # hourly runs every UTC hour through the gap: 01:00 EST, then 03:00 EDT
            "2026-03-08T05:30:00Z",
            "0 * * * *",
            ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"],
            id="hourly-gap",
        ),
    ],
)
async def test_daylight_saving_time_in_new_york_is_as_croniter_reads_it(
    wall: Wall, autojump_clock: trio.testing.MockClock, start: str, schedule: str, expected: list[str]
) -> None:
    """What docs/cron.md says about DST, end to end."""
    wall.set(start)
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron(schedule, "tick", name="ny", tz="America/New_York")
    async with _open(registry, workers=1) as queue:
        await trio.sleep(_at(expected[-1]) - wall.now() + 1)
        await queue.join()
    assert _keys(runs) == [f"cron:ny:{tick}" for tick in expected]


# ----------------------------------------------------------------- admission, bad input


@pytest.mark.parametrize("overflow", ["refuse", "defer"])
async def test_max_ready_never_refuses_a_tick(
    wall: Wall, autojump_clock: trio.testing.MockClock, overflow: str
) -> None:
    registry = _recording([])
    registry.cron("*/5 * * * *", "tick")
    async with _open(registry, workers=0, max_ready=1, overflow=overflow) as queue:
        await queue.enqueue("tick")
        if overflow == "refuse":
            with pytest.raises(trioq.QueueFull):
                await queue.enqueue("tick")
        await trio.sleep(180)
        (job,) = [job for job in await _jobs(queue) if job.key is not None]
    assert job.key == "cron:tick:2026-01-01T00:05:00Z"
    assert job.state is (JobState.READY if overflow == "refuse" else JobState.DEFERRED)


@pytest.mark.parametrize(
    ("schedule", "options", "error", "match"),
    [
        ("*/5 * * *", {}, ValueError, "is not valid cron syntax: five fields"),
        ("61 * * * *", {}, ValueError, "is not valid cron syntax"),
        ("every five minutes", {}, ValueError, "is not valid cron syntax"),
        ("0 0 30 2 *", {}, ValueError, "never fires"),
        ("0 0 1 1 * 0 2030", {}, ValueError, "a seventh field \\(year\\)"),  # its ticks would run out
        (300, {}, TypeError, "must be a string such as"),
        ("*/5 * * * *", {"tz": "Mars/Olympus"}, ValueError, "'Mars/Olympus' is no time zone"),
        ("*/5 * * * *", {"tz": "EST+5"}, ValueError, "is no time zone"),
        ("*/5 * * * *", {"payload": [1]}, ValueError, "payload must be a dict"),
        ("*/5 * * * *", {"payload": {"n": 2**70}}, ValueError, "cannot be stored"),
    ],
)
def test_a_bad_schedule_is_refused_at_registration(
    schedule: Any, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    registry = _recording([])
    with pytest.raises(error, match=match):
        registry.cron(schedule, "tick", **options)
    assert registry.crons == ()


def test_a_duplicate_name_is_refused_at_registration() -> None:
    registry = _recording([])
    registry.cron("*/5 * * * *", "tick")
    with pytest.raises(ValueError, match=r"named 'tick' is already declared.*pass name=..."):
        registry.cron("0 * * * *", "tick")
    registry.cron("0 * * * *", "tick", name="hourly")
    with pytest.raises(ValueError, match=r"named 'hourly' is already declared.*its own name"):
        registry.cron("0 0 * * *", "tick", name="hourly")
    assert [spec.name for spec in registry.crons] == ["hourly", "tick"]


async def test_a_cron_of_an_unknown_task_or_payload_is_refused_by_open_queue() -> None:
    """The task may be registered after the cron, so the check is at ``open_queue``, before the store opens."""
    registry = _recording([])
    registry.cron("*/5 * * * *", "tikc")
    with pytest.raises(ValueError, match=r"enqueues task 'tikc', which this registry does not know.*known: tick"):
        async with trioq.open_queue(registry):
            pass  # pragma: no cover
    registry = _recording([])
    registry.cron("*/5 * * * *", "tick", payload={"n": 1})
    with pytest.raises(ValueError, match=r"its payload does not fit.*takes no argument"):
        async with trioq.open_queue(registry):
            pass  # pragma: no cover


# ----------------------------------------------------------------- trioq cron list


async def _cron_app_log(directory: Path) -> None:
    """Run ``tests.cron_app``'s schedules on a WAL directory from 00:02:30 to 00:12:30 (ticks 00:05, 00:10)."""
    from tests.cron_app import registry

    async with _open(registry, store=trioq.WALStore(directory, fsync="never"), workers=1) as queue:
        await trio.sleep(600)
        await queue.join()


async def test_cron_list_shows_next_runs_and_last_ticks_of_a_wal_directory(
    wall: Wall, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    await _cron_app_log(tmp_path / "wal")
    later = _at("2026-01-01T00:17:00Z")  # the queue closed; 00:15 was missed: it runs first on reopen
    out = io.StringIO()
    assert list_command("tests.cron_app:registry", wal=str(tmp_path / "wal"), as_json=True, out=out, now=later) == 0
    assert json.loads(out.getvalue()) == [
        {
            "name": "every5",
            "schedule": "*/5 * * * *",
            "task": "noop",
            "tz": "UTC",
            "next_run": _at("2026-01-01T00:15:00Z"),
            "last_tick": _at("2026-01-01T00:10:00Z"),
        },
        {
            "name": "morning",
            "schedule": "0 9 * * *",
            "task": "noop",
            "tz": "America/Sao_Paulo",
            "next_run": _at("2026-01-01T12:00:00Z"),
            "last_tick": _at("2026-01-01T00:02:30Z"),
        },
    ]
    out = io.StringIO()
    list_command("tests.cron_app:registry", wal=str(tmp_path / "wal"), out=out, now=later)
    assert out.getvalue().splitlines() == [
        "NAME     SCHEDULE     TZ                 TASK  NEXT RUN                   LAST TICK",
        "every5   */5 * * * *  UTC                noop  2026-01-01T00:15:00+00:00  2026-01-01T00:10:00+00:00",
        "morning  0 9 * * *    America/Sao_Paulo  noop  2026-01-01T09:00:00-03:00  2025-12-31T21:02:30-03:00",
    ]
    out = io.StringIO()  # without a store: the first tick after now, no last tick column
    list_command("tests.cron_app:registry", out=out, now=later)
    assert out.getvalue().splitlines()[:2] == [
        "NAME     SCHEDULE     TZ                 TASK  NEXT RUN",
        "every5   */5 * * * *  UTC                noop  2026-01-01T00:20:00+00:00",
    ]


def _trioq(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "trioq", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )


async def test_the_trioq_cron_list_command(wall: Wall, autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    """The command itself (real time now: the next run is only checked to be a tick of its schedule)."""
    await _cron_app_log(tmp_path / "wal")
    found = await trio.to_thread.run_sync(
        _trioq, "cron", "list", "--app", "tests.cron_app:registry", "--wal", str(tmp_path / "wal"), "--json"
    )
    assert found.returncode == 0, found.stderr
    rows = {row["name"]: row for row in json.loads(found.stdout)}
    assert rows["every5"]["last_tick"] == _at("2026-01-01T00:10:00Z")
    assert rows["every5"]["next_run"] % 300 == 0
    assert rows["morning"]["last_tick"] == _at("2026-01-01T00:02:30Z")
    assert rows["morning"]["next_run"] % 86400 == 12 * 3600
    table = await trio.to_thread.run_sync(
        _trioq, "cron", "list", "--app", "tests.cron_app:registry", "--wal", str(tmp_path / "wal")
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["NAME", "SCHEDULE", "TZ", "TASK", "NEXT", "RUN", "LAST", "TICK"]
    assert "2026-01-01T00:10:00+00:00" in table.stdout.splitlines()[1]
    missing = await trio.to_thread.run_sync(
        _trioq, "cron", "list", "--app", "tests.cron_app:registry", "--wal", str(tmp_path / "nowhere")
    )
    assert missing.returncode != 0 and "no WAL directory at" in missing.stderr


# ----------------------------------------------------------------- two PostgreSQL nodes


async def _until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30.0) -> None:
    """Poll ``check`` until it holds (``seconds`` bounds a hang; it is no assertion on timing)."""
    with trio.move_on_after(seconds):
        while not await check():  # noqa: ASYNC110 - polls the nodes' effect, which sets no event here
            await trio.sleep(0.05)
        return
    pytest.fail(f"not within {seconds} s: {what}")


class _Counting(trioq.PostgresStore):
    """A PostgresStore that counts the tick jobs it tried to add (``tries``) and added (``added``)."""

    def __init__(self, dsn: str, **options: Any) -> None:
        super().__init__(dsn, **options)
        self.tries = self.added = 0

    async def add_tick(self, name: str, tick: float, job: NewJob | None) -> Job | None:
        added = await super().add_tick(name, tick, job)
        if job is not None:
            self.tries += 1
            self.added += added is not None
        return added


class _AlwaysLeads(_Counting):
    """A node that believes it leads whatever the leader row says: an old leader that has not yet
    learnt that it lost the lease, for as long as the test runs."""

    def leading(self) -> bool:
        return True


def _tick_keys_in(dsn: str) -> list[str]:
    """The keys of every ``tick`` job in the database, read after the nodes closed."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [key for (key,) in conn.execute("SELECT key FROM trioq.jobs WHERE task = 'tick'").fetchall()]


async def _added_at_least(store: _Counting, least: int) -> bool:
    await trio.lowlevel.checkpoint()
    return store.added >= least


async def test_two_postgres_nodes_enqueue_each_tick_once_across_a_leader_change(pg_dsn: str) -> None:
    """Node A leads and takes every second's tick while B, not leading, takes none; A leaves, B leads
    and goes on. Every tick was enqueued once, by one node, and ran once."""
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("* * * * * *", "tick")
    first, second = _Counting(pg_dsn, lease=2.0), _Counting(pg_dsn, lease=2.0)
    leave = trio.Event()

    async def node_a(task_status: trio.TaskStatus[None]) -> None:
        async with trioq.open_queue(registry, store=first, workers=2, poll_interval=0.1):
            task_status.started()
            await leave.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(node_a)
        async with trioq.open_queue(registry, store=second, workers=2, poll_interval=0.1) as b:
            assert (first.leading(), second.leading()) == (True, False)
            await _until(lambda: _added_at_least(first, 3), "three ticks on the leader")
            assert second.tries == 0  # not leading: it only looks
            row = await _cron_row(b, "tick")
            assert row["enqueued"] == 0 and row["last_tick"] is not None  # the leader's mark, seen from B
            leave.set()
            await _until(lambda: _added_at_least(second, 3), "three ticks on the new leader")
            assert second.leading()
            await b.join()
    keys = _tick_keys_in(pg_dsn)
    assert len(keys) == len(set(keys)) == first.added + second.added
    counts = collections.Counter(job.key for job in runs)
    assert set(counts.values()) == {1}, counts  # no tick ran twice


async def test_two_postgres_nodes_that_both_believe_they_lead_still_enqueue_each_tick_once(pg_dsn: str) -> None:
    runs: list[Job] = []
    registry = _recording(runs)
    registry.cron("* * * * * *", "tick")
    a, b = _AlwaysLeads(pg_dsn), _AlwaysLeads(pg_dsn)
    async with (
        trioq.open_queue(registry, store=a, workers=2, poll_interval=0.1),
        trioq.open_queue(registry, store=b, workers=2, poll_interval=0.1) as queue,
    ):
        await _until(lambda: _added_at_least(a, 4 - b.added), "four ticks taken")
        await queue.join()
    keys = _tick_keys_in(pg_dsn)
    assert len(keys) == len(set(keys)) == a.added + b.added
    assert a.tries + b.tries > len(keys)  # they did race: a tick one took, the other tried too
    counts = collections.Counter(job.key for job in runs)
    assert set(counts.values()) == {1}, counts


async def test_cron_list_reads_the_last_ticks_of_a_postgres_queue(pg_dsn: str) -> None:
    """Before any queue ran the schedules there is no mark; after one did, its baselines show."""
    from tests.cron_app import registry

    out = io.StringIO()
    list_command("tests.cron_app:registry", postgres=pg_dsn, as_json=True, out=out)
    assert [row["last_tick"] for row in json.loads(out.getvalue())] == [None, None]
    opened = time.time()
    async with trioq.open_queue(registry, store=trioq.PostgresStore(pg_dsn), workers=0) as queue:
        await _until(lambda: _marked(queue), "the baselines")
    closed = time.time()
    out = io.StringIO()
    list_command("tests.cron_app:registry", postgres=pg_dsn, as_json=True, out=out, now=closed)
    rows = json.loads(out.getvalue())
    assert [row["name"] for row in rows] == ["every5", "morning"]
    for row in rows:
        assert opened <= row["last_tick"] <= closed
        assert row["next_run"] > row["last_tick"]
    assert rows[0]["next_run"] % 300 == 0


async def _marked(queue: trioq.Queue) -> bool:
    return all(row["last_tick"] is not None for row in (await queue.stats())["cron"])
