"""PostgresStore measured against bare psycopg on the same server and schema.

Run from the repository root::

    python -m benchmarks.pg                     # full run, a few minutes on 2 cores
    python -m benchmarks.pg --quick             # smoke test, under ~30 seconds
    python -m benchmarks.pg --only notify_latency --dsn postgresql://postgres@127.0.0.1:55432/postgres

Without ``--dsn`` the script starts a throwaway cluster of its own with
``tests/pgcluster.py``'s ``start_cluster()`` (which wraps ``TRIOQ_PG_DSN``'s
server instead when that is set) and stops it at the end. Every measurement
uses fresh schemas named ``bench_pg_<pid>_<n>``, dropped after use (also on
an error), so a shared server is left as it was found.

Every measurement is one JSON line on stdout (progress goes to stderr); a
ratio's two sides are measured in the same run, alternating round by round,
and the line gives medians, the ratio of medians, the target and whether it
was met. Worker nodes that must be their own process (two nodes, a node to
SIGKILL, an idle node for the latency) are this module run with the hidden
``--child`` flag, each bounded by a timeout and killed if still running.
Sections:

``drain``
    50,000 no-op jobs (``noop``) enqueued with ``enqueue_many`` (batches of
    1,000) through a producer-only queue into a fresh schema, then ``ANALYZE``,
    then drained three ways, alternating by round (a fresh schema each):
    ``bare_drain``, one thread of sync psycopg claiming 200 at a time with the
    same ``FOR UPDATE SKIP LOCKED`` claim trioq runs and completing each batch
    in one ``UPDATE`` pipelined with the next claim; ``trioq_drain``, one node
    (``workers=100``) in a child process, timed from just before
    ``open_queue`` until ``join()`` returns; ``trioq_drain_2nodes``, the same
    in two child processes at once, timed from the earlier start to the later
    ``join()``. Ratios: one node / bare (target >= 0.40), two nodes / one node
    (target >= 1.3).
``sustained``
    A worker node (``workers=100``, child process) and, in this process, a
    producer looping ``enqueue_many`` of 100 ``noop`` jobs as fast as it can,
    for 30 s. Every second: the ready backlog (``count(*)`` of ready rows) and
    the jobs finished (the schema's ``finish_seq``). Drain rate target >= 10k/s.
``enqueue``
    ``enqueue_many`` of 1,000 ``noop`` jobs per call into a producer-only queue
    (time inside the calls; target >= 50k/s), beside the same rows inserted by
    bare psycopg with trioq's ``INSERT ... SELECT FROM unnest(...)`` (context,
    no target); then 32 tasks each looping ``await queue.enqueue("noop")``
    (target >= 3k/s).
``notify_latency``
    An idle worker node (``workers=16``, child process) and a producer-only
    node here; one ``stamp`` job at a time, 5 ms apart; latency = the handler's
    first ``time.time()`` (in the child) minus the ``time.time()`` taken when
    ``enqueue`` returned here. 500 samples after 20 warm-up jobs; targets
    p50 <= 2 ms, p99 <= 5 ms.
``rescue``
    A child node (``PostgresStore(lease=2.0)``, 8 workers) enqueues 8 ``hold``
    jobs (they sleep) and runs them; once all 8 have started it is SIGKILLed.
    The time from the kill until the last of them starts again on a second node
    (this process, 8 workers, lease 2.0) is the figure; target <= lease + 1 s.
    Two cases: the second node is the leader (it opened first and was kept busy
    while the child claimed), and (full run only) the killed node was the
    leader, so the leader's row (``LEADER_TTL``) must lapse first.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Run as ``python -m benchmarks.pg`` (the root is on sys.path) or as ``python benchmarks/pg.py``.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import trio  # noqa: E402

import trioq  # noqa: E402
from benchmarks._common import (  # noqa: E402
    ROOT,
    arg_parser,
    emit,
    env_line,
    logger,
    median,
    percentile,
    perf_counter,
    pg_server,
    r3,
    registry,
    run,
)

SECTIONS = ("drain", "sustained", "enqueue", "notify_latency", "rescue")
REGISTRY = registry()  # noop, sleepy, and the tasks below
log = logger("pg")

#: Jobs per ``enqueue_many`` call when filling a schema, and in the enqueue section.
FILL_BATCH = 1_000
#: Jobs per claim of the bare drain.
BARE_CLAIM = 200
#: The lease of the rescue section (seconds).
RESCUE_LEASE = 2.0
#: Bound on any child process (seconds).
CHILD_TIMEOUT = 300.0

# Set by the rescue section in this process: what the ``hold`` handler records, and what ``block`` waits for.
_HOLD_STARTS: list[tuple[str, float]] | None = None
_RELEASE: trio.Event | None = None


@REGISTRY.task
async def stamp(ctx: trioq.JobContext) -> None:
    """The latency probe: writes ``s <id> <time.time()>`` to fd 1 first thing (the idle child)."""
    os.write(1, f"s {ctx.job.id} {time.time()!r}\n".encode())


@REGISTRY.task
async def hold(ctx: trioq.JobContext) -> None:
    """A job that runs until cancelled; its start is announced (child: ``h <id>`` on fd 1; here: recorded)."""
    if _HOLD_STARTS is None:
        os.write(1, f"h {ctx.job.id} {time.time()!r}\n".encode())
    else:
        _HOLD_STARTS.append((ctx.job.id, time.time()))
    await trio.sleep_forever()


@REGISTRY.task
async def block(ctx: trioq.JobContext) -> None:
    """Keeps a worker of this process busy until the rescue section releases it."""
    assert _RELEASE is not None
    await _RELEASE.wait()


# ---------------------------------------------------------------- plumbing

_schemas = itertools.count(1)


def new_schema() -> str:
    return f"bench_pg_{os.getpid()}_{next(_schemas)}"


def connect(dsn: str) -> Any:
    import psycopg

    # As trioq's pool connects: autocommit, never prepared.
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=10)


def drop_schema(dsn: str, schema: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextlib.contextmanager
def fresh_schema(dsn: str) -> Iterator[str]:
    """A new schema name (trioq creates the schema when the first queue opens on it), dropped after."""
    schema = new_schema()
    try:
        yield schema
    finally:
        drop_schema(dsn, schema)


def store(dsn: str, schema: str, **options: Any) -> trioq.PostgresStore:
    return trioq.PostgresStore(dsn, schema=schema, **options)


async def fill(dsn: str, schema: str, n: int, task: str = "noop", batch: int = FILL_BATCH) -> float:
    """Enqueue ``n`` jobs through a producer-only queue; seconds inside ``enqueue_many`` (specs built untimed)."""
    spent = 0.0
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=0) as producer:
        done = 0
        while done < n:
            k = min(batch, n - done)
            specs = [trioq.JobSpec(task) for _ in range(k)]
            t0 = perf_counter()
            await producer.enqueue_many(specs)
            spent += perf_counter() - t0
            done += k
    return spent


def analyze(dsn: str, schema: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"ANALYZE {schema}.jobs")


class Child:
    """This module run with ``--child``: a node in its own process, killed if still running at the end.

    Its stdout is read line by line (:meth:`line`, or every line by a reader
    thread once :meth:`start_reader` is called); stdin is its "go" (a line)
    and its "stop" (end of file).
    """

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.pg", "--child", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._killer = threading.Timer(CHILD_TIMEOUT, self.kill)
        self._killer.daemon = True
        self._killer.start()

    def line(self) -> str:
        """The next line of its stdout (RuntimeError at end of file: it died)."""
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            self.proc.wait(timeout=10)
            raise RuntimeError(f"child {self.proc.args[4:]} exited ({self.proc.returncode}) before answering")
        return text.rstrip("\n")

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.line())
        return out

    def start_reader(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for text in self.proc.stdout:
                self.lines.append(text.rstrip("\n"))

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """Close its stdin (stop), wait for it to exit; its last JSON line."""
        self.close_stdin()
        if self._reader is None:
            self.start_reader()
        assert self._reader is not None
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        self._killer.cancel()
        if self.proc.returncode != 0:
            raise RuntimeError(f"child {self.proc.args[4:]} failed with exit status {self.proc.returncode}")
        return dict(json.loads(self.lines[-1]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        self._killer.cancel()
        self.kill()
        self.close_stdin()
        if self.proc.stdout is not None and self._reader is None:
            self.proc.stdout.close()


@contextlib.contextmanager
def children(*specs: tuple[str, ...]) -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        for spec in specs:
            started.append(Child(*spec))
        yield started
    finally:
        for child in started:
            child.cleanup()


# ----------------------------------------------------------- child side


async def child_drain(dsn: str, schema: str, workers: int) -> dict[str, Any]:
    t0 = time.time()
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=workers) as queue:
        opened = time.time()
        with trio.fail_after(CHILD_TIMEOUT - 30):
            await queue.join()
        t1 = time.time()
        succeeded = (await queue.stats())["totals"]["succeeded"]
    return {"t0": t0, "opened": opened, "t1": t1, "succeeded": succeeded}


async def child_serve(dsn: str, schema: str, workers: int, lease: float, enqueue_hold: int) -> dict[str, Any]:
    """A worker node until its stdin ends; prints ``{"ready": ...}`` once open."""
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema, lease=lease), workers=workers) as queue:
        if enqueue_hold:
            await queue.enqueue_many([trioq.JobSpec("hold") for _ in range(enqueue_hold)])
        os.write(1, (json.dumps({"ready": queue.node, "leading": queue.store.leading()}) + "\n").encode())
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
        totals = (await queue.stats())["totals"]
    return {"succeeded": totals["succeeded"]}


def child_main(args: list[str]) -> None:
    kind, dsn, schema, *rest = args
    if kind == "drain":
        workers = int(rest[0])
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()  # go
        emit(trio.run(child_drain, dsn, schema, workers))
    elif kind == "serve":
        workers, lease, enqueue_hold = int(rest[0]), float(rest[1]), int(rest[2])
        emit(trio.run(child_serve, dsn, schema, workers, lease, enqueue_hold))
    else:
        raise SystemExit(f"unknown child {kind!r}")


# ------------------------------------------------------------- drain


def bare_drain(dsn: str, schema: str, n: int, batch: int = BARE_CLAIM) -> dict[str, float]:
    """Drain ``n`` ready jobs with one sync psycopg connection; the completion of each claimed batch is
    pipelined with the next claim (one round trip per batch)."""
    s = schema
    claim_sql = (
        # `parked IS NULL`: the ready index's predicate (schema 2: jobs passed over for a limit are parked).
        f"WITH c AS MATERIALIZED (SELECT id FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL"
        f" ORDER BY priority DESC, run_at, seq LIMIT {batch} FOR UPDATE SKIP LOCKED)"
        f" UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1, node = %s, claim = %s"
        " FROM c WHERE j.id = c.id RETURNING j.id, j.epoch, j.task, j.payload::text"
    )
    done_sql = (
        f"UPDATE {s}.jobs j SET state = 'succeeded', attempts = j.attempts + 1, finished_at = %s,"
        f" finish_seq = nextval('{s}.finish_seq'), node = NULL"
        " FROM unnest(%s::text[], %s::bigint[]) AS u(id, epoch)"
        " WHERE j.id = u.id AND j.epoch = u.epoch AND j.state = 'running'"
    )
    handled = 0
    completed = 0
    round_trips = 0
    with connect(dsn) as conn:
        t0 = perf_counter()
        held: list[tuple[Any, ...]] = []
        claims = 0
        while True:
            claims += 1
            with conn.pipeline():
                done_cur = None
                if held:
                    done_cur = conn.execute(done_sql, (time.time(), [r[0] for r in held], [r[1] for r in held]))
                cur = conn.execute(claim_sql, ("bare", str(claims)))
            round_trips += 1
            if done_cur is not None:
                completed += done_cur.rowcount
            rows = cur.fetchall()
            for _row in rows:  # the no-op handler
                handled += 1
            held = rows
            if not rows:
                break
        elapsed = perf_counter() - t0
    assert handled == completed == n, (handled, completed, n)
    return {"drain_s": elapsed, "round_trips": round_trips}


def run_trioq_drain(dsn: str, schema: str, nodes: int, workers: int) -> dict[str, Any]:
    with children(*[("drain", dsn, schema, str(workers)) for _ in range(nodes)]) as procs:
        for child in procs:
            child.json()  # ready: imported, waiting for go
        for child in procs:
            child.send("go")
        results = [child.finish(timeout=CHILD_TIMEOUT) for child in procs]
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    return {
        "drain_s": t1 - t0,
        "open_s": max(r["opened"] - r["t0"] for r in results),
        "per_node": [r["succeeded"] for r in results],
    }


def section_drain(dsn: str, n: int, workers: int, rounds: int) -> None:
    bare: list[float] = []
    one: list[float] = []
    two: list[float] = []
    one_open: list[float] = []
    two_split: list[list[int]] = []
    bare_trips: list[float] = []
    enqueue: list[float] = []
    for i in range(rounds):
        for kind in ("bare", "one", "two"):
            with fresh_schema(dsn) as schema:
                log(f"drain round {i + 1}/{rounds}: {kind}, {n} jobs")
                enqueue.append(n / run(fill, dsn, schema, n))
                analyze(dsn, schema)
                if kind == "bare":
                    r = bare_drain(dsn, schema, n)
                    bare.append(n / r["drain_s"])
                    bare_trips.append(r["round_trips"])
                else:
                    r = run_trioq_drain(dsn, schema, 1 if kind == "one" else 2, workers)
                    assert sum(r["per_node"]) == n, r
                    (one if kind == "one" else two).append(n / r["drain_s"])
                    if kind == "one":
                        one_open.append(r["open_s"])
                    else:
                        two_split.append(r["per_node"])
    emit(
        {
            "bench": "bare_drain",
            "jobs": n,
            "claim_batch": BARE_CLAIM,
            "jobs_per_s": r3(median(bare)),
            "rounds": [r3(x) for x in bare],
            "round_trips": int(median(bare_trips)),
            "note": "one round trip per claim of 200 plus the previous batch's completion",
            "method": "one thread, sync psycopg, autocommit, no prepared statements; claim 200 with trioq's "
            "claim SQL (WITH c AS MATERIALIZED (... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING id, epoch, "
            "task, payload), completion of the previous batch as one UPDATE ... FROM unnest(ids, epochs) "
            "pipelined with the next claim; jobs enqueued with trioq (enqueue_many x1000) into a fresh schema "
            "and ANALYZEd first",
        }
    )
    ratio = median(one) / median(bare)
    emit(
        {
            "bench": "trioq_drain",
            "jobs": n,
            "workers": workers,
            "trioq_jobs_per_s": r3(median(one)),
            "bare_jobs_per_s": r3(median(bare)),
            "ratio": r3(ratio),
            "target": ">= 0.40",
            "met": ratio >= 0.40,
            "trioq_rounds": [r3(x) for x in one],
            "bare_rounds": [r3(x) for x in bare],
            "open_s": r3(median(one_open)),
            "method": "one node (open_queue(workers=100), PostgresStore defaults) in a child process; timed from "
            "just before open_queue until join() returns (open included: open_s of it); jobs enqueued as for "
            "bare_drain; bare, one node, two nodes alternate, median of rounds",
        }
    )
    ratio2 = median(two) / median(one)
    emit(
        {
            "bench": "trioq_drain_2nodes",
            "jobs": n,
            "workers_per_node": workers,
            "two_nodes_jobs_per_s": r3(median(two)),
            "one_node_jobs_per_s": r3(median(one)),
            "ratio": r3(ratio2),
            "target": ">= 1.3",
            "met": ratio2 >= 1.3,
            "two_nodes_rounds": [r3(x) for x in two],
            "one_node_rounds": [r3(x) for x in one],
            "jobs_per_node": two_split,
            "cpus": os.cpu_count(),
            "method": "two child processes, each open_queue(workers=100) on the same schema, started together "
            "(both imported and waiting, then told to go); timed from the earlier open to the later join(); "
            "the PostgreSQL server shares the same CPUs",
        }
    )
    emit(
        {
            "bench": "enqueue_many_fill",
            "jobs": n,
            "batch": FILL_BATCH,
            "jobs_per_s": r3(median(enqueue)),
            "rounds": [r3(x) for x in enqueue],
            "method": "the fills of the drain rounds: time inside enqueue_many, producer-only queue, fresh schema",
        }
    )


# --------------------------------------------------------- sustained


async def sustained(
    dsn: str, schema: str, seconds: float, workers: int, batch: int, rate: float | None = None
) -> dict[str, Any]:
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=0) as producer:
        with children(("serve", dsn, schema, str(workers), "30.0", "0")) as (child,):
            await trio.to_thread.run_sync(child.json)  # the worker node is open
            conn = await trio.to_thread.run_sync(connect, dsn)
            try:

                def sample() -> tuple[int, int]:
                    ready = conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state = 'ready'").fetchone()[0]
                    seq = conn.execute(f"SELECT last_value, is_called FROM {schema}.finish_seq").fetchone()
                    return int(ready), int(seq[0]) if seq[1] else 0

                enqueued = 0
                samples: list[dict[str, float]] = []
                t0 = perf_counter()
                _, done0 = await trio.to_thread.run_sync(sample)

                async def produce() -> None:
                    nonlocal enqueued
                    start = trio.current_time()
                    while True:
                        if rate is not None:  # paced: batch k leaves at k * batch / rate
                            await trio.sleep_until(start + enqueued / rate)
                        await producer.enqueue_many([trioq.JobSpec("noop") for _ in range(batch)])
                        enqueued += batch

                async def sampler() -> None:
                    for k in range(1, int(seconds) + 1):
                        await trio.sleep_until(t0_trio + k)
                        ready, done = await trio.to_thread.run_sync(sample)
                        samples.append(
                            {"t": r3(perf_counter() - t0), "backlog": ready, "done": done - done0, "enqueued": enqueued}
                        )

                t0_trio = trio.current_time()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce)
                    await sampler()
                    nursery.cancel_scope.cancel()
                elapsed = perf_counter() - t0
                _, done1 = await trio.to_thread.run_sync(sample)
            finally:
                conn.close()
            child.finish(timeout=60)
    return {"elapsed": elapsed, "enqueued": enqueued, "done": done1 - done0, "samples": samples}


def section_sustained(dsn: str, seconds: float, workers: int, batch: int = 100) -> None:
    """Twice: the producer as fast as it goes (what the node drains while the producer competes for
    the machine), then paced at 10,000 jobs/s (does the node keep up: a flat backlog?)."""
    for rate in (None, 10_000.0):
        pace = "as fast as it goes" if rate is None else f"paced at {rate:.0f} jobs/s"
        log(f"sustained: producer (enqueue_many x{batch}, {pace}) + one node ({workers} workers), {seconds:.0f}s")
        with fresh_schema(dsn) as schema:
            r = run(sustained, dsn, schema, seconds, workers, batch, rate)
        samples = r["samples"]
        drained = r["done"] / r["elapsed"]
        backlog = [s["backlog"] for s in samples]
        half = len(backlog) // 2
        first, second = backlog[:half] or backlog, backlog[half:] or backlog
        growth = (median(second) - median(first)) / max(1, len(backlog) - half) if backlog else 0.0
        per_s = [b["done"] - a["done"] for a, b in zip([{"done": 0}, *samples], samples, strict=False)]
        flat = not (backlog and backlog[-1] > 2 * max(1000, backlog[0]))
        line: dict[str, Any] = {
            "bench": "sustained" if rate is None else "sustained_paced",
            "seconds": r3(r["elapsed"]),
            "workers": workers,
            "producer_batch": batch,
            "producer_rate": rate,
            "enqueue_jobs_per_s": r3(r["enqueued"] / r["elapsed"]),
            "drain_jobs_per_s": r3(drained),
            "drain_per_second": per_s,
            "backlog": backlog,
            "backlog_trend_per_s": r3(growth),
            "backlog_verdict": "flat" if flat else "growing",
            "method": f"producer in this process (open_queue(workers=0), enqueue_many of {batch} noop jobs, {pace}), "
            f"one worker node (workers={workers}) in a child process, same schema, both at once; every second: "
            "count(*) of ready rows (backlog) and the schema's finish_seq (jobs finished)",
        }
        if rate is None:
            line.update(target="drain >= 10000 jobs/s", met=drained >= 10_000)
        else:
            line.update(target="drain >= 10000 jobs/s with a flat backlog", met=drained >= 0.97 * rate and flat)
        emit(line)


# ----------------------------------------------------------- enqueue


def bare_insert(dsn: str, schema: str, n: int, batch: int) -> float:
    """Seconds to insert ``n`` trioq-shaped rows with trioq's INSERT ... unnest, ``batch`` per statement."""
    import secrets

    s = schema
    sql = (
        f"INSERT INTO {s}.jobs (id, task, payload, state, priority, key, max_attempts, run_at, created_at)"
        " SELECT u.id, u.task, u.payload::json, CASE WHEN u.delay > 0 THEN 'scheduled' ELSE 'ready' END,"
        "  u.priority, u.key, u.max_attempts, %s + u.delay, %s"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::bigint[],"
        "  %s::float8[]) WITH ORDINALITY AS u(id, task, payload, priority, key, max_attempts, delay, ord)"
        " ORDER BY u.ord ON CONFLICT DO NOTHING RETURNING id"
    )
    spent = 0.0
    with connect(dsn) as conn:
        done = 0
        while done < n:
            k = min(batch, n - done)
            ids = [secrets.token_hex(8) for _ in range(k)]
            now = time.time()
            params = (now, now, ids, ["noop"] * k, ["{}"] * k, [0] * k, [None] * k, [3] * k, [0.0] * k)
            t0 = perf_counter()
            with conn.transaction():
                conn.execute(sql, params).fetchall()
            spent += perf_counter() - t0
            done += k
    return spent


async def enqueue_single(dsn: str, schema: str, tasks: int, seconds: float) -> dict[str, float]:
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=0) as producer:
        await producer.enqueue("noop")  # warm the pool
        count = 0

        async def loop() -> None:
            nonlocal count
            while True:
                await producer.enqueue("noop")
                count += 1

        t0 = perf_counter()
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(loop)
        elapsed = perf_counter() - t0
    return {"jobs": count, "elapsed": elapsed}


def section_enqueue(dsn: str, n: int, rounds: int, tasks: int, seconds: float) -> None:
    tq: list[float] = []
    bare: list[float] = []
    for i in range(rounds):
        log(f"enqueue_many round {i + 1}/{rounds}: {n} jobs in batches of {FILL_BATCH}")
        with fresh_schema(dsn) as schema:
            tq.append(n / run(fill, dsn, schema, n))
        with fresh_schema(dsn) as schema:
            run(fill, dsn, schema, 1)  # create the schema (one job: same table shape)
            bare.append(n / bare_insert(dsn, schema, n, FILL_BATCH))
    rate = median(tq)
    emit(
        {
            "bench": "enqueue_many",
            "jobs": n,
            "batch": FILL_BATCH,
            "trioq_jobs_per_s": r3(rate),
            "bare_jobs_per_s": r3(median(bare)),
            "ratio": r3(rate / median(bare)),
            "target": ">= 50000 jobs/s",
            "met": rate >= 50_000,
            "trioq_rounds": [r3(x) for x in tq],
            "bare_rounds": [r3(x) for x in bare],
            "method": "trioq: time inside enqueue_many (JobSpecs built untimed), producer-only queue, fresh schema; "
            "bare: one psycopg connection running trioq's INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING "
            "RETURNING id with the same batch in a transaction (ids and arrays built untimed); alternating rounds",
        }
    )
    log(f"enqueue_single: {tasks} tasks looping enqueue('noop') for {seconds:.0f}s")
    with fresh_schema(dsn) as schema:
        r = run(enqueue_single, dsn, schema, tasks, seconds)
    rate = r["jobs"] / r["elapsed"]
    emit(
        {
            "bench": "enqueue_single",
            "tasks": tasks,
            "seconds": r3(r["elapsed"]),
            "jobs": r["jobs"],
            "jobs_per_s": r3(rate),
            "target": ">= 3000 jobs/s",
            "met": rate >= 3000,
            "method": f"{tasks} trio tasks each looping `await queue.enqueue('noop')` on one producer-only queue "
            "(PostgresStore defaults: max_connections=10), no workers anywhere",
        }
    )


# ---------------------------------------------------- notify latency


async def notify_latency(dsn: str, schema: str, n: int, warmup: int, gap: float) -> dict[str, Any]:
    returned: dict[str, float] = {}
    before: dict[str, float] = {}
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=0) as producer:
        with children(("serve", dsn, schema, "16", "30.0", "0")) as (child,):
            await trio.to_thread.run_sync(child.json)
            child.start_reader()
            await trio.sleep(0.2)  # the worker node is idle: every worker parked
            order: list[str] = []
            for _ in range(warmup + n):
                t = time.time()
                job = await producer.enqueue("stamp")
                returned[job.id] = time.time()
                before[job.id] = t
                order.append(job.id)
                await trio.sleep(gap)
            with trio.fail_after(30):
                while sum(1 for x in child.lines if x.startswith("s ")) < warmup + n:  # noqa: ASYNC110 - polls another process
                    await trio.sleep(0.01)
            child.finish(timeout=60)
    started = {}
    for text in child.lines:
        if text.startswith("s "):
            _, job_id, t = text.split()
            started[job_id] = float(t)
    kept = order[warmup:]
    return {
        "after_return": [started[j] - returned[j] for j in kept],
        "from_before": [started[j] - before[j] for j in kept],
        "enqueue_call": [returned[j] - before[j] for j in kept],
    }


def section_notify_latency(dsn: str, n: int, warmup: int = 20, gap: float = 0.005) -> None:
    log(f"notify_latency: {n} jobs {gap * 1000:.0f} ms apart to an idle node in a child process")
    with fresh_schema(dsn) as schema:
        r = run(notify_latency, dsn, schema, n, warmup, gap)
    ms = 1000.0
    lat = r["after_return"]
    p50, p99 = percentile(lat, 50) * ms, percentile(lat, 99) * ms
    emit(
        {
            "bench": "notify_latency",
            "samples": n,
            "p50_ms": r3(p50),
            "p99_ms": r3(p99),
            "max_ms": r3(max(lat) * ms),
            "min_ms": r3(min(lat) * ms),
            "from_before_enqueue_p50_ms": r3(percentile(r["from_before"], 50) * ms),
            "from_before_enqueue_p99_ms": r3(percentile(r["from_before"], 99) * ms),
            "enqueue_call_p50_ms": r3(percentile(r["enqueue_call"], 50) * ms),
            "enqueue_call_p99_ms": r3(percentile(r["enqueue_call"], 99) * ms),
            "target": "p50 <= 2 ms, p99 <= 5 ms",
            "met": p50 <= 2.0 and p99 <= 5.0,
            "method": f"idle worker node (workers=16) in a child process, producer-only node here, same schema; "
            f"latency = time.time() first thing in the handler (child) - time.time() when `await "
            f"queue.enqueue('stamp')` returned (here); one job every {gap * 1000:.0f} ms; {warmup} warm-up jobs "
            "dropped; nearest-rank percentiles",
        }
    )


# ------------------------------------------------------------ rescue


async def rescue(dsn: str, schema: str, jobs: int, second_leads: bool) -> dict[str, Any]:
    global _HOLD_STARTS, _RELEASE
    _HOLD_STARTS = []
    _RELEASE = trio.Event()
    lease = RESCUE_LEASE
    try:
        async with contextlib.AsyncExitStack() as stack:
            queue = None
            if second_leads:
                # This node opens first (it leads), its workers kept busy while the child claims.
                queue = await stack.enter_async_context(
                    trioq.open_queue(REGISTRY, store=store(dsn, schema, lease=lease), workers=jobs, shutdown_grace=0.2)
                )
                assert queue.store.leading()
                await queue.enqueue_many([trioq.JobSpec("block") for _ in range(jobs)])
                with trio.fail_after(10):
                    while (await queue.stats())["jobs"]["running"] < jobs:  # noqa: ASYNC110 - polls the store
                        await trio.sleep(0.01)
            child = stack.enter_context(children(("serve", dsn, schema, str(jobs), str(lease), str(jobs))))[0]
            ready = await trio.to_thread.run_sync(child.json)
            held = 0
            with trio.fail_after(20):
                while held < jobs:
                    text = await trio.to_thread.run_sync(child.line)
                    held += text.startswith("h ")
            if queue is None:
                queue = await stack.enter_async_context(
                    trioq.open_queue(REGISTRY, store=store(dsn, schema, lease=lease), workers=jobs, shutdown_grace=0.2)
                )
            leading_before = queue.store.leading()
            _RELEASE.set()  # this node's workers are free now
            await trio.sleep(0.2)
            t_kill = time.time()
            os.kill(child.proc.pid, signal.SIGKILL)
            with trio.fail_after(60):
                while len(_HOLD_STARTS) < jobs:  # noqa: ASYNC110 - polls another node
                    await trio.sleep(0.005)
            starts = sorted(t for _, t in _HOLD_STARTS)
            return {
                "first_s": starts[0] - t_kill,
                "last_s": starts[-1] - t_kill,
                "killed_was_leader": ready["leading"],
                "second_led_before_kill": leading_before,
            }
    finally:
        _HOLD_STARTS = None
        _RELEASE = None


def section_rescue(dsn: str, rounds: int, cases: tuple[bool, ...], jobs: int = 8) -> None:
    for second_leads in cases:
        rs = []
        for i in range(rounds):
            log(f"rescue ({'second node leads' if second_leads else 'killed node led'}) round {i + 1}/{rounds}")
            with fresh_schema(dsn) as schema:
                rs.append(run(rescue, dsn, schema, jobs, second_leads))
        last = median([r["last_s"] for r in rs])
        emit(
            {
                "bench": "rescue",
                "case": "second_node_leads" if second_leads else "killed_node_led",
                "lease_s": RESCUE_LEASE,
                "jobs": jobs,
                "last_rerun_s": r3(last),
                "first_rerun_s": r3(median([r["first_s"] for r in rs])),
                "rounds_last_s": [r3(r["last_s"]) for r in rs],
                "killed_was_leader": [r["killed_was_leader"] for r in rs],
                "second_led_before_kill": [r["second_led_before_kill"] for r in rs],
                "target": f"<= lease + 1 s = {RESCUE_LEASE + 1:g} s",
                "met": last <= RESCUE_LEASE + 1,
                "method": "child node (PostgresStore(lease=2.0), 8 workers) enqueues and runs 8 jobs that sleep; "
                "SIGKILL once all 8 started; seconds from the kill until each starts again on the second node "
                "(this process, lease 2.0, 8 free workers); time.time() on both sides",
            }
        )


# --------------------------------------------------------------------- main


def server_version(dsn: str) -> str:
    with connect(dsn) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


def main() -> None:
    parser = arg_parser(__doc__, SECTIONS, quick_help="small sizes: a smoke test in under ~30 s")
    parser.add_argument("--dsn", help="PostgreSQL to measure on (default: start a throwaway cluster)")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return

    quick = args.quick
    started = perf_counter()
    with pg_server(args.dsn) as (cluster, source):
        dsn = cluster.dsn
        emit(env_line(quick, postgres=server_version(dsn), server=source, loadavg_1m=round(os.getloadavg()[0], 2)))
        for name in (args.only,) if args.only else SECTIONS:
            t0 = perf_counter()
            if name == "drain":
                section_drain(dsn, n=5_000 if quick else 50_000, workers=100, rounds=1 if quick else 3)
            elif name == "sustained":
                section_sustained(dsn, seconds=3.0 if quick else 30.0, workers=100)
            elif name == "enqueue":
                section_enqueue(dsn, n=5_000 if quick else 50_000, rounds=1 if quick else 3, tasks=32,
                                seconds=1.0 if quick else 5.0)  # fmt: skip
            elif name == "notify_latency":
                section_notify_latency(dsn, n=50 if quick else 500)
            elif name == "rescue":
                section_rescue(dsn, rounds=1 if quick else 3, cases=(True,) if quick else (True, False))
            log(f"{name} took {perf_counter() - t0:.1f}s")
    log(f"done in {perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
