"""One soak run: processes, load and chaos for ``duration``, then drain, read back, and judge.

PostgreSQL: a throwaway cluster (``tests/pgcluster.py``) unless ``dsn``;
``workers`` ``trioq worker`` processes; the enqueuer is a producer-only
``open_queue`` in this process, or with ``feed="serve"`` the first of those
processes is a ``trioq serve --postgres`` (workers as many) that takes the
enqueues over HTTP while it answers: a node whose own workers wait, so that an enqueue may
claim its jobs for them in its INSERT (docs/postgres.md), the path a
producer-only node never takes; the other calls go through the
producer-only queue still. Chaos: SIGKILL or SIGTERM of a random worker
about every ``kill_every`` s (exponential gaps from the seed), and a server
restart every ``db_restart_every`` s (``fast`` and ``immediate`` in turn; not
with ``dsn``, which is not ours to restart). WAL: one ``trioq serve`` process
over one directory, fed over HTTP (:class:`trioq.client.AsyncClient`); the
chaos SIGKILLs it (enqueues are in flight all the time, so mid-commit) or
SIGTERMs it, and it is started again on the same directory.

After ``duration``: chaos and load stop (``chaos_end``), the processes are
brought back to full strength, and the run waits until the queue holds no
unfinished job (``drained``; at most ``drain_timeout`` s). Then every job is
read back, the processes are stopped with SIGTERM (each must exit 0), the
store is checked on its own terms (SQL checks; ``trioq wal verify``) and the
journal judged (``verdict.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import trio

import trioq
from benchmarks._common import pg_server
from tests.pgcluster import free_port
from trioq.client import AsyncClient

from . import app, verdict
from .load import Load
from .procs import Events, Fleet, rss_kb

__all__ = ["Settings", "judge_files", "soak"]

TERMINAL = ("succeeded", "dead", "cancelled")
UNFINISHED = ("ready", "scheduled", "running", "waiting", "deferred")
KEEP = ["--retention", "86400", "--max-retained", "10000000"]


@attrs.frozen
class Settings:
    """One run's knobs (``python -m benchmarks.soak --help`` says each)."""

    store: str
    duration: float
    rate: float = 50.0
    workers: int = 4
    slots: int = 16
    seed: int = 1
    feed: str = "producer"
    kill_every: float = 15.0
    slow_seconds: float = 20.0
    db_restart_every: float = 240.0
    lease: float = 5.0
    shutdown_grace: float = 2.0
    drain_timeout: float = 300.0
    sample_every: float = 10.0
    dsn: str | None = None
    out: Path = Path("soak-run")


class _Feed:
    """The producer of ``feed="serve"``: ``enqueue_many`` through ``client`` (the serving node) while it
    answers, else (killed, restarting) through ``queue`` (producer-only, in this process), as every other
    call. A call cut off by a kill may have added its jobs: the resend finds them by their keys."""

    def __init__(self, client: Any, queue: trioq.Queue) -> None:
        self.client = client
        self.queue = queue

    async def enqueue_many(self, specs: list[trioq.JobSpec]) -> list[trioq.Job]:
        try:
            return list(await self.client.enqueue_many(specs))
        except (trioq.InvalidJob, trioq.UnknownTask):
            raise
        except trioq.TrioqError:  # the server is not answering
            return list(await self.queue.enqueue_many(specs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


def _python() -> list[str]:
    return [sys.executable, "-m", "trioq"]


@contextlib.asynccontextmanager
async def _postgres(settings: Settings) -> AsyncIterator[tuple[Any, str, str]]:
    """``(cluster, dsn, where)`` of a fresh database (``cluster.can_restart`` says if the chaos may restart it)."""
    # Blocks the trio thread while a cluster starts and while it stops: nothing else runs then.
    with pg_server(settings.dsn) as (cluster, where):
        name = f"soak_{os.getpid()}_{int(time.time())}"
        yield cluster, await trio.to_thread.run_sync(cluster.create_database, name), where


async def _chaos(settings: Settings, fleet: Fleet, events: Events, cluster: Any, stop: trio.Event) -> dict[str, int]:
    """Until ``stop``: signals to random children; database restarts on their own schedule."""
    import random

    rng = random.Random(settings.seed * 7919)
    counts = {"sigkill": 0, "sigterm": 0, "db_restart": 0}
    next_restart = trio.current_time() + settings.db_restart_every
    restart_modes = ["fast", "immediate"]
    while not stop.is_set():
        with trio.move_on_after(rng.expovariate(1.0 / settings.kill_every)):
            await stop.wait()
        if stop.is_set():
            break
        if cluster is not None and cluster.can_restart and trio.current_time() >= next_restart:
            mode = restart_modes[counts["db_restart"] % 2]
            started = time.time()
            events("db_restart", mode=mode)
            await trio.to_thread.run_sync(cluster.restart, mode)
            events("db_up", mode=mode, took_s=round(time.time() - started, 3))
            counts["db_restart"] += 1
            next_restart = trio.current_time() + settings.db_restart_every
            continue
        live = fleet.live()
        if not live:
            continue
        how = "kill" if rng.random() < 0.6 else "term"
        fleet.signal(rng.choice(live), how)
        counts["sigkill" if how == "kill" else "sigterm"] += 1
    return counts


async def _sample(fleet: Fleet, producer: Any, into: list[dict[str, Any]]) -> None:
    """The RSS of this process and of each child, and the queue's backlog, now."""
    now = time.time()
    backlog = await _backlog(producer)
    if backlog is not None:
        into.append({"t": now, "role": "queue", "backlog": sum(backlog.values())})
    into.append({"t": now, "role": "harness", "pid": os.getpid(), "rss_kb": rss_kb(os.getpid())})
    for child in fleet.children:
        into.append({"t": now, "role": "child", "pid": child.pid, "rss_kb": rss_kb(child.pid)})


async def _sample_every(every: float, fleet: Fleet, producer: Any, into: list[dict[str, Any]]) -> None:
    while True:
        await _sample(fleet, producer, into)
        await trio.sleep(every)


async def _drain(producer: Any, timeout: float, errors: Counter[str]) -> bool:
    """Until the queue holds no unfinished job (``False`` if ``timeout`` passed first). A poll that fails
    (the store may be restarting still) is counted in ``errors`` by exception type and asked again."""
    with trio.move_on_after(timeout):
        while True:
            try:
                jobs = (await producer.stats())["jobs"]
                if sum(jobs.get(state, 0) for state in UNFINISHED) == 0:
                    return True
            except Exception as exc:
                errors[f"drain:{type(exc).__name__}"] += 1
            await trio.sleep(0.5)
    return False


async def _backlog(producer: Any) -> dict[str, int] | None:
    """The unfinished jobs by state (a backlog that grew all run says the load outran the workers)."""
    try:
        jobs = (await producer.stats())["jobs"]
    except Exception:  # the store may be restarting: this sample is missing, the run goes on
        return None
    return {state: int(jobs.get(state, 0)) for state in UNFINISHED}


async def _read_back(producer: Any) -> dict[str, dict[str, Any]]:
    """Every job the store holds, newest first, a page of 1,000 at a time."""
    finals: dict[str, dict[str, Any]] = {}
    after: str | None = None
    while True:
        page = await producer.list(limit=1000, after_id=after)
        for job in page:
            finals[job.id] = {
                "state": job.state.value,
                "attempts": job.attempts,
                "epoch": job.epoch,
                "task": job.task,
                "key": job.key,
            }
        if len(page) < 1000:
            return finals
        after = page[-1].id


async def _phases(settings: Settings, fleet: Fleet, producer: Any, events: Events, cluster: Any) -> dict[str, Any]:
    """Load and chaos for the duration, then the drain and the read-back; the run's own figures."""
    load = Load(producer, settings.rate, settings.seed, settings.out, events, settings.slow_seconds)
    stop = trio.Event()
    memory: list[dict[str, Any]] = []
    chaos: dict[str, int] = {}

    async def chaos_task() -> None:
        chaos.update(await _chaos(settings, fleet, events, cluster, stop))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.watch)
            sampling = trio.CancelScope()

            async def sample() -> None:
                with sampling:
                    await _sample_every(settings.sample_every, fleet, producer, memory)

            nursery.start_soon(sample)
            async with trio.open_nursery() as timed:
                timed.start_soon(load.enqueue, stop)
                timed.start_soon(load.cancel_and_retry, stop)
                timed.start_soon(chaos_task)
                await trio.sleep(settings.duration)
                stop.set()
            events("chaos_end", backlog=await _backlog(producer))
            await fleet.settle(60.0)
            drained = await _drain(producer, settings.drain_timeout, load.errors)
            if drained:
                events("drained")
            # The memory samples end here: the read-back below holds every job of the run in this
            # process (the verdict's copy), which is the harness's memory, not the queue's.
            sampling.cancel()
            await _sample(fleet, producer, memory)
            finals = await _read_back(producer)
            nursery.cancel_scope.cancel()
    finally:
        load.close()
    return {
        "finals": finals,
        "chaos": chaos,
        "memory": memory,
        "load": {
            "calls": load.calls,
            "acked": load.acked,
            "running_at_ack": load.running_at_ack,
            "resent": load.resent,
            "errors": dict(load.errors),
        },
        "drained": drained,
    }


def _pg_checks(dsn: str) -> dict[str, int]:
    """The store's own consistency, read with SQL once every node has stopped: each figure must be 0. Cron
    ticks are left out of the unfinished rows: the schedule goes on after the drain, and a tick due then is
    still ready when the workers stop."""
    import psycopg

    tick = f"task <> '{app.CRON_TASK}'"
    queries = {
        "running_rows": "SELECT count(*) FROM trioq.jobs WHERE state = 'running'",
        "unfinished_rows": f"SELECT count(*) FROM trioq.jobs WHERE state IN {UNFINISHED!r} AND {tick}",
        "terminal_without_finished_at": f"SELECT count(*) FROM trioq.jobs WHERE state IN {TERMINAL!r}"
        " AND finished_at IS NULL",
        "unfinished_with_finished_at": f"SELECT count(*) FROM trioq.jobs WHERE state NOT IN {TERMINAL!r}"
        " AND finished_at IS NOT NULL",
        "running_without_node": "SELECT count(*) FROM trioq.jobs WHERE state = 'running' AND node IS NULL",
        "limit_holders": "SELECT coalesce(sum(held), 0) FROM trioq.limit_holders(ARRAY['mutex','cap3','both'])",
        "waiting_with_unmet_0": "SELECT count(*) FROM trioq.jobs WHERE state = 'waiting' AND unmet = 0",
        "duplicate_keys": "SELECT count(*) - count(DISTINCT key) FROM trioq.jobs WHERE key IS NOT NULL",
    }
    with psycopg.connect(dsn) as conn:
        return {name: int(conn.execute(sql).fetchone()[0]) for name, sql in queries.items()}  # type: ignore[index]


def _wal_verify(directory: Path) -> dict[str, Any]:
    proc = subprocess.run([*_python(), "wal", "verify", str(directory)], capture_output=True, text=True, timeout=600)
    return {"exit": proc.returncode, "output": (proc.stdout + proc.stderr).strip()[-2000:]}


async def soak(settings: Settings) -> dict[str, Any]:
    """Run the soak ``settings`` describe; the verdict and the run's figures (one JSON-ready dict)."""
    out = settings.out
    (out / "journal").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    events = Events(out / "events.jsonl")
    env = {**os.environ, app.JOURNAL_ENV: str(out / "journal"), "PYTHONUNBUFFERED": "1"}
    common = ["--app", "benchmarks.soak.app:registry", "--shutdown-grace", str(settings.shutdown_grace), *KEEP]
    common += ["--log-level", "WARNING"]
    # As many workers in all on either store: the WAL's one server runs workers x slots of them.
    slots = settings.slots if settings.store == "postgres" else settings.workers * settings.slots
    common += ["--workers", str(slots)]
    port = free_port()  # the HTTP API's (WAL; postgres with feed="serve")
    started = time.time()
    stopped: list[int] = []
    store_checks: dict[str, Any]
    if settings.store == "postgres":
        async with _postgres(settings) as (cluster, dsn, server):

            def worker() -> list[str]:
                return [*_python(), "worker", "--postgres", dsn, "--lease", str(settings.lease), *common]

            def serve() -> list[str]:
                return [*_python(), "serve", "--postgres", dsn, "--lease", str(settings.lease), "--port", str(port)]

            commands = [worker] * settings.workers
            if settings.feed == "serve":
                commands[0] = lambda: [*serve(), *common]
            fleet = Fleet(commands, env, out / "logs", events)
            try:
                await fleet.start()
                store = trioq.PostgresStore(dsn, lease=settings.lease)
                async with (
                    trioq.open_queue(
                        app.registry, store=store, workers=0, retention=86400, max_retained=10_000_000
                    ) as queue,
                    AsyncClient(f"http://127.0.0.1:{port}", timeout=10.0) as client,
                ):
                    producer = _Feed(client, queue) if settings.feed == "serve" else queue
                    run = await _phases(settings, fleet, producer, events, cluster)
                stopped = await fleet.stop(settings.shutdown_grace + 20)
            finally:
                fleet.kill_all()
            store_checks = await trio.to_thread.run_sync(_pg_checks, dsn)
    else:
        directory = out / "wal"

        def serve() -> list[str]:
            return [*_python(), "serve", "--wal", str(directory), "--fsync", "always", "--port", str(port), *common]

        fleet = Fleet([serve], env, out / "logs", events)
        try:
            await fleet.start()
            async with AsyncClient(f"http://127.0.0.1:{port}", timeout=10.0) as client:
                run = await _phases(settings, fleet, client, events, None)
            stopped = await fleet.stop(settings.shutdown_grace + 20)
        finally:
            fleet.kill_all()
        store_checks = await trio.to_thread.run_sync(_wal_verify, directory)
        server = "one trioq serve process"
    events.close()
    (out / "finals.json").write_text(json.dumps(run["finals"]))
    judged, torn = judge_files(out)
    return {
        "section": "soak",
        "store": settings.store,
        "server": server,
        "settings": {k: v for k, v in attrs.asdict(settings).items() if k not in ("dsn", "out")},
        "seconds": round(time.time() - started, 1),
        "chaos": run["chaos"],
        "load": run["load"],
        "drained": run["drained"],
        "verdict": judged,
        "journal_torn_lines": torn,
        "store_checks": store_checks,
        "processes": {
            "started": len(fleet.start_seconds),
            "start_s_max": round(max(fleet.start_seconds, default=0.0), 3),
            "unexpected_exits": fleet.unexpected_exits,
            "sigterm_exit_codes": sorted(set(fleet.term_exit_codes)),
            "final_exit_codes": stopped,
        },
        "memory": memory_summary(run["memory"]),
    }


def judge_files(out: Path) -> tuple[dict[str, Any], int]:
    """The verdict on a run's files in ``out`` (so a run can be judged again), and the journal's torn lines."""
    journal, torn = verdict.load_journal(out / "journal")
    config = {
        "limits": app.LIMITS,
        "task_limits": app.TASK_LIMITS,
        "cron_task": app.CRON_TASK,
        "cron_period": app.CRON_PERIOD,
        "cron_max_attempts": 1,
    }
    finals = json.loads((out / "finals.json").read_text())
    events = verdict.load_jsonl(out / "events.jsonl")
    return verdict.judge(journal, verdict.load_jsonl(out / "acks.jsonl"), events, finals, config), torn


def memory_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The harness's RSS at the first sample after a minute, at the end, and its peak; the children's peak;
    the queue's backlog (its peak and median over the samples)."""
    backlog = [s["backlog"] for s in samples if s["role"] == "queue"]
    lives: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        if sample["role"] == "child" and sample["rss_kb"]:
            lives.setdefault(sample["pid"], []).append(sample)
    longest = max(lives.values(), key=lambda life: life[-1]["t"] - life[0]["t"], default=None)
    harness = [s for s in samples if s["role"] == "harness" and s["rss_kb"]]
    children = [s["rss_kb"] for s in samples if s["role"] == "child" and s["rss_kb"]]
    if not harness:
        return {}
    warm = next((s for s in harness if s["t"] - harness[0]["t"] >= 60), harness[0])
    return {
        "harness_kb": {"start": harness[0]["rss_kb"], "after_1min": warm["rss_kb"], "end": harness[-1]["rss_kb"]},
        "harness_kb_max": max(s["rss_kb"] for s in harness),
        "child_kb_max": max(children, default=None),
        "samples": len(samples),
        # The child that lived longest (the chaos keeps the others short): its RSS when first and last seen.
        "child_longest": None
        if longest is None
        else {
            "span_s": round(longest[-1]["t"] - longest[0]["t"]),
            "first_kb": longest[0]["rss_kb"],
            "last_kb": longest[-1]["rss_kb"],
        },
        # Unfinished jobs, sampled with the memory: the last sample is during the drain.
        "backlog": {
            "max": max(backlog, default=None),
            "median": sorted(backlog)[len(backlog) // 2] if backlog else None,
        },
    }
