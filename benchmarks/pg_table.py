"""PostgresStore's jobs table on disk: bytes per job, query plans at a backlog, vacuum under churn.

Run from the repository root against a server you may create schemas on::

    python -m benchmarks.pg_table --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python -m benchmarks.pg_table --dsn DSN --quick          # small sizes, about two minutes
    python -m benchmarks.pg_table --dsn DSN --only plans

Every measurement uses fresh schemas named ``bench_pgt_<pid>_<n>``, dropped
after use (also on an error). The only server-side change is per-table
storage parameters (``ALTER TABLE ... SET (autovacuum_..., fillfactor)``) on
those schemas' tables. Each measurement is one JSON line on stdout (progress
on stderr); the first is the ``env`` line, which records the server's version
and the settings that matter here. Sections:

``size``
    Bytes on disk per job, after ``VACUUM (ANALYZE)``: the heap's main fork
    (``pg_relation_size``), each index, ``pg_indexes_size`` and
    ``pg_total_relation_size``, each divided by the rows. Four tables:
    100,000 ready ``signup`` jobs with the payload ``{"user": 123, "email":
    "a@b.c"}`` enqueued through trioq (``enqueue_many``, batches of 1,000,
    ``workers=0``); the same 100,000 after one node (``workers=50``) ran them,
    each returning ``{"ok": true}`` (100,000 succeeded jobs; also after
    ``VACUUM FULL``, the compact figure); 100,000 such ready jobs each with an
    idempotency key (``welcome:<i>``); 1,000,000 ready jobs inserted with SQL
    (``INSERT ... SELECT generate_series``, ten statements of 100,000) with the
    columns ``_transitions.add`` writes (``check_sql_fill`` fails the run if a
    row differs from one ``add`` writes). The 1M table is kept for ``plans``.
    ``client_time`` lines: ``counts()`` (``queue.stats()``) and
    ``has_pending()`` (``queue.join()``) timed from the client, median of 5.
``plans``
    ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of every statement trioq's
    ``_transitions`` functions send, on the 1M ready table, on the 100,000
    succeeded table, and (the key cases) on the keyed table. Nothing of
    ``_transitions`` is copied: each case (:func:`cases`) calls the function
    itself on a stand-in connection (:class:`_Explaining`) that explains each
    statement in a savepoint rolled back, then runs it, so the function goes
    on with real answers. Each case's statements are labelled; a call that
    sends other statements than its labels say fails the run. Each round runs
    in a transaction rolled back afterwards (so each sees the same table);
    three rounds. A line per statement gives the median execution time, the
    client time of the real run right after (warm), the plan's nodes (type,
    relation, index), the buffers of the last run, ``full_scan`` (whether any
    node reads the jobs table without an index), and the SQL.
``churn``
    200,000 no-op jobs enqueued through a producer-only queue, then drained by
    one node (``workers=50``, ``retention=10``: the leader evicts jobs 10 s
    after they finished, every 2.5 s), which stays open after ``join()`` until
    ``TAIL`` (150) seconds have passed since the drain began, and at least
    ``MIN_TAIL`` (45) after ``join()`` returned. Every 2 s a thread on
    its own connection samples ``pg_stat_user_tables`` (live and dead tuples,
    updates, HOT updates, autovacuum runs) and the sizes of every table of the
    schema. Three runs, each on a fresh schema: the server's autovacuum
    settings (``default``), the per-table settings of ``TUNED`` (``tuned``), and
    those with ``fillfactor = 85`` on the jobs table (``tuned_ff85``, set before
    the jobs are enqueued). The line also gives how many times ``join()``
    called ``has_pending()`` during the drain and the seconds those calls took,
    and the same of the leader's ``evict()`` calls over the whole run.

A ``load`` line after each section records its seconds and the load average
(the machine may be shared: prefer sizes and plans to times).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Run as ``python -m benchmarks.pg_table`` (the root is on sys.path) or as ``python benchmarks/pg_table.py``.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import trio  # noqa: E402

import trioq  # noqa: E402
from benchmarks._common import arg_parser, emit, env_line, logger, median, perf_counter, r3, registry, run  # noqa: E402

SECTIONS = ("size", "plans", "churn")
REGISTRY = registry()  # noop, sleepy, and signup below
log = logger("pg_table")

#: The small payload of the sizing jobs, and what their handler returns.
PAYLOAD: dict[str, Any] = {"user": 123, "email": "a@b.c"}
RESULT: dict[str, Any] = {"ok": True}
#: Jobs per ``enqueue_many`` call.
FILL_BATCH = 1_000
#: Retention (seconds) of the churn node, and how long after the drain began it stays open.
CHURN_RETENTION = 10.0
TAIL = 150.0
#: ... and at least this long after ``join()`` returned.
MIN_TAIL = 45.0
#: Seconds between churn samples.
SAMPLE_EVERY = 2.0
#: The per-table settings of the ``tuned`` churn runs (jobs table only).
TUNED = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
}
#: The server settings the env line records.
SETTINGS = (
    "shared_buffers", "work_mem", "maintenance_work_mem", "max_parallel_workers_per_gather", "fsync",
    "synchronous_commit", "autovacuum_naptime", "autovacuum_max_workers", "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold", "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit", "vacuum_cost_limit", "random_page_cost",
)  # fmt: skip


@REGISTRY.task
async def signup(ctx: trioq.JobContext, user: int, email: str) -> dict[str, Any]:
    """The sizing jobs' handler: returns the small result."""
    return RESULT


# ---------------------------------------------------------------- plumbing

_schemas = itertools.count(1)


def connect(dsn: str) -> Any:
    import psycopg

    # As trioq's pool connects: autocommit, never prepared.
    from trioq.stores.postgres.store import _PLANNER  # the settings of trioq's own pooled connections

    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=10, options=_PLANNER)


@contextlib.contextmanager
def fresh_schema(dsn: str) -> Iterator[str]:
    """A new schema name (trioq creates it when the first queue opens on it), dropped after."""
    schema = f"bench_pgt_{os.getpid()}_{next(_schemas)}"
    try:
        yield schema
    finally:
        with connect(dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def create_schema(dsn: str, schema: str) -> None:
    from trioq.stores.postgres._schema import migrate

    with connect(dsn) as conn:
        migrate(conn, schema)


def store(dsn: str, schema: str, **options: Any) -> trioq.PostgresStore:
    return trioq.PostgresStore(dsn, schema=schema, **options)


async def fill(dsn: str, schema: str, n: int, task: str, payload: dict[str, Any], keyed: bool = False) -> float:
    """Enqueue ``n`` jobs through a producer-only queue (``keyed``: job i with the key ``KEY.format(i)``);
    seconds inside ``enqueue_many``."""
    spent = 0.0
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=0) as producer:
        done = 0
        while done < n:
            k = min(FILL_BATCH, n - done)
            specs = [trioq.JobSpec(task, dict(payload), key=KEY.format(done + i) if keyed else None)
                     for i in range(k)]  # fmt: skip
            t0 = perf_counter()
            await producer.enqueue_many(specs)
            spent += perf_counter() - t0
            done += k
    return spent


async def drain(dsn: str, schema: str, workers: int, queue_options: dict[str, Any]) -> float:
    """One node runs every job; seconds from entering ``open_queue`` until ``join()`` returns."""
    t0 = perf_counter()
    async with trioq.open_queue(REGISTRY, store=store(dsn, schema), workers=workers, **queue_options) as queue:
        await queue.join()
    return perf_counter() - t0


def sql_fill(dsn: str, schema: str, n: int, chunk: int = 100_000) -> float:
    """``n`` ready jobs inserted with SQL as ``_transitions.add`` inserts them; seconds taken."""
    payload = json.dumps(PAYLOAD, separators=(",", ":"))  # msgspec's encoding: no spaces
    now = time.time()
    t0 = perf_counter()
    with connect(dsn) as conn:
        for start in range(1, n + 1, chunk):
            stop = min(start + chunk - 1, n)
            conn.execute(
                f"INSERT INTO {schema}.jobs"
                " (id, task, payload, state, priority, key, key_hash, max_attempts, run_at, created_at)"
                " SELECT 'a1b2c3d4e5f6-' || lpad(to_hex(g), 10, '0'), 'signup', %s::json, 'ready', 0, NULL, NULL, 5,"
                "  %s + (g / 1000) * 0.01, %s + (g / 1000) * 0.01"
                " FROM generate_series(%s::bigint, %s::bigint) g ORDER BY g",
                (payload, now, now, start, stop),
            )
    return perf_counter() - t0


def check_sql_fill(dsn: str, schema: str) -> None:
    """Fail loudly unless a row :func:`sql_fill` wrote matches one ``_transitions.add`` writes for the same job
    (every column but the id, ``seq`` and the times; the id's format too)."""
    from trioq.stores.postgres import _transitions as sql

    skip = ("id", "seq", "run_at", "created_at")
    with connect(dsn) as conn, conn.transaction(force_rollback=True):
        rows = _new_rows(1)
        sql.add(conn, schema, rows, time.time(), None, None)
        ours = conn.execute(f"SELECT row_to_json(j) FROM {schema}.jobs j WHERE id = %s", (rows[0][0],)).fetchone()[0]
        filled = conn.execute(f"SELECT row_to_json(j) FROM {schema}.jobs j WHERE id <> %s ORDER BY seq LIMIT 1",
                              (rows[0][0],)).fetchone()[0]  # fmt: skip
    ours, filled = (json.loads(v) if isinstance(v, str) else v for v in (ours, filled))
    differ = {k: (ours[k], filled.get(k)) for k in ours if k not in skip and ours[k] != filled.get(k)}
    shape = [len(part) for part in str(ours["id"]).split("-")], [len(part) for part in str(filled["id"]).split("-")]
    if differ or shape[0] != shape[1] or set(ours) != set(filled):
        raise RuntimeError(f"sql_fill no longer writes what _transitions.add does: {differ}, id parts {shape}")


def settings(dsn: str) -> dict[str, str]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", (list(SETTINGS),)
        ).fetchall()
        version = conn.execute("SHOW server_version").fetchone()
    return {"server_version": version[0] if version else "?", **dict(rows)}


def sizes(conn: Any, schema: str, rows: int) -> dict[str, Any]:
    """Bytes of the jobs heap (main fork), each index, and totals; and each per row."""
    table = f"{schema}.jobs"
    heap, table_size, indexes, total = conn.execute(
        "SELECT pg_relation_size(%s), pg_table_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s)",
        (table, table, table, table),
    ).fetchone()
    per_index = dict(
        conn.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass ORDER BY c.relname",
            (table,),
        ).fetchall()
    )
    per = (lambda b: r3(b / rows)) if rows else (lambda b: None)
    return {
        "rows": rows,
        "heap_bytes": heap,
        "table_bytes": table_size,
        "indexes_bytes": indexes,
        "total_bytes": total,
        "heap_per_job": per(heap),
        "indexes_per_job": per(indexes),
        "total_per_job": per(total),
        "index_bytes": per_index,
        "index_per_job": {name: per(b) for name, b in per_index.items()},
    }


def vacuum(conn: Any, schema: str, full: bool = False) -> None:
    conn.execute(f"VACUUM ({'FULL, ' if full else ''}ANALYZE) {schema}.jobs")


def count_rows(conn: Any, schema: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()
    return int(row[0])


def counts_seconds(dsn: str, schema: str, repeat: int = 5) -> dict[str, Any]:
    """Client-side time of the ``counts()`` statement (median of ``repeat``, after one warm-up)."""
    from trioq.stores.postgres import _transitions as sql

    with connect(dsn) as conn:
        sql.counts(conn, schema)
        times = []
        for _ in range(repeat):
            t0 = perf_counter()
            sql.counts(conn, schema)
            times.append(perf_counter() - t0)
    return {"median_ms": r3(median(times) * 1e3), "rounds_ms": [r3(t * 1e3) for t in times]}


def client_times(dsn: str, schema: str, repeat: int = 5) -> dict[str, Any]:
    """Client-side times of ``counts()`` (``queue.stats()``) and ``has_pending()`` (``queue.join()``)."""
    from trioq.stores.postgres import _transitions as sql

    out = {"counts": counts_seconds(dsn, schema, repeat)}
    with connect(dsn) as conn:
        sql.has_pending(conn, schema)
        times = []
        for _ in range(repeat):
            t0 = perf_counter()
            sql.has_pending(conn, schema)
            times.append(perf_counter() - t0)
    out["has_pending"] = {"median_ms": r3(median(times) * 1e3), "rounds_ms": [r3(t * 1e3) for t in times]}
    return out


# ------------------------------------------------------------------- size


def section_size(dsn: str, n_small: int, n_large: int, keep: list[str]) -> None:
    with fresh_schema(dsn) as schema:
        log(f"size: {n_small} ready jobs through trioq")
        enq = run(fill, dsn, schema, n_small, "signup", PAYLOAD)
        with connect(dsn) as conn:
            vacuum(conn, schema)
            emit({"section": "size", "case": "ready_trioq", "enqueue_jobs_per_s": r3(n_small / enq),
                  **sizes(conn, schema, count_rows(conn, schema))})  # fmt: skip
        emit({"section": "client_time", "case": "ready_trioq", "rows": n_small, **client_times(dsn, schema)})
        log(f"size: draining them (workers=50), each returns {RESULT}")
        took = run(drain, dsn, schema, 50, {"max_retained": 10 * n_small, "retention": 86_400.0})
        with connect(dsn) as conn:
            rows = count_rows(conn, schema)
            conn.execute(f"ANALYZE {schema}.jobs")
            emit({"section": "size", "case": "succeeded_trioq_before_vacuum", "drain_jobs_per_s": r3(n_small / took),
                  **sizes(conn, schema, rows)})  # fmt: skip
            vacuum(conn, schema)
            emit({"section": "size", "case": "succeeded_trioq", **sizes(conn, schema, rows)})
        emit({"section": "client_time", "case": "succeeded_trioq", "rows": rows, **client_times(dsn, schema)})
        log("size: plans on the succeeded table")
        explain_all(dsn, schema, "succeeded_100k")
        with connect(dsn) as conn:
            vacuum(conn, schema, full=True)
            emit({"section": "size", "case": "succeeded_trioq_vacuum_full", **sizes(conn, schema, rows)})
    with fresh_schema(dsn) as schema:
        log(f"size: {n_small} ready jobs with keys through trioq")
        enq = run(fill, dsn, schema, n_small, "signup", PAYLOAD, True)
        with connect(dsn) as conn:
            vacuum(conn, schema)
            emit({"section": "size", "case": "ready_trioq_keyed", "key": KEY, "enqueue_jobs_per_s": r3(n_small / enq),
                  **sizes(conn, schema, count_rows(conn, schema))})  # fmt: skip
        log("size: key plans on the keyed table")
        explain_all(dsn, schema, "keyed_100k", names=KEYED_CASES)
    schema = f"bench_pgt_{os.getpid()}_{next(_schemas)}"
    keep.append(schema)
    create_schema(dsn, schema)
    log(f"size: {n_large} ready jobs inserted with SQL")
    took = sql_fill(dsn, schema, n_large)
    check_sql_fill(dsn, schema)
    with connect(dsn) as conn:
        vacuum(conn, schema)
        emit({"section": "size", "case": "ready_sql", "insert_rows_per_s": r3(n_large / took),
              **sizes(conn, schema, count_rows(conn, schema))})  # fmt: skip
    emit({"section": "client_time", "case": "ready_sql", "rows": n_large, **client_times(dsn, schema)})


# ------------------------------------------------------------------ plans


def _walk(node: dict[str, Any], depth: int, out: list[str], scans: list[tuple[str, str | None, str | None]]) -> None:
    kind = node["Node Type"]
    rel = node.get("Relation Name")
    index = node.get("Index Name")
    scans.append((kind, rel, index))
    text = "  " * depth + kind
    if rel:
        text += f" on {rel}"
    if index:
        text += f" using {index}"
    if "Actual Rows" in node:
        text += f" (rows={node['Actual Rows']} loops={node.get('Actual Loops', 1)})"
    out.append(text)
    for child in node.get("Plans", []):
        _walk(child, depth + 1, out, scans)


class _Explaining:
    """A stand-in for a psycopg connection, handed to a function of ``_transitions``: each statement the
    function sends is first explained (``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)``, in a savepoint rolled
    back), then run for real (so the function goes on with real answers), its client-side time taken.

    Every statement measured is trioq's own text: nothing of ``_transitions`` is copied here.
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        #: ``(sql, explain document, client seconds of the real run)`` per statement, in order.
        self.records: list[tuple[str, Any, float]] = []

    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        return self.conn.transaction(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> _ExplainingCursor:
        return _ExplainingCursor(self, self.conn.cursor(*args, **kwargs))


class _ExplainingCursor:
    def __init__(self, owner: _Explaining, cur: Any) -> None:
        self._owner, self._cur = owner, cur

    def __enter__(self) -> _ExplainingCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cur.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def execute(self, query: str, params: Any = None, *, prepare: bool | None = None) -> _ExplainingCursor:
        conn = self._owner.conn
        with conn.transaction(force_rollback=True), conn.cursor() as ex:
            ex.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", params, prepare=False)
            doc = ex.fetchone()[0]
        t0 = perf_counter()
        self._cur.execute(query, params, prepare=prepare)
        self._owner.records.append((query, doc, perf_counter() - t0))
        return self


def explain_doc(doc: Any) -> dict[str, Any]:
    """An ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` document: its plan as lines, scans, times, buffers."""
    doc = doc if not isinstance(doc, str) else json.loads(doc)
    top = doc[0]
    plan = top["Plan"]
    lines: list[str] = []
    scans: list[tuple[str, str | None, str | None]] = []
    _walk(plan, 0, lines, scans)
    full = any(kind in ("Seq Scan", "Parallel Seq Scan") and rel == "jobs" for kind, rel, _ in scans)
    return {
        "execution_ms": top["Execution Time"],
        "planning_ms": top["Planning Time"],
        "plan": lines,
        "indexes": sorted({i for _, rel, i in scans if i}),
        "full_scan": full,
        "shared_hit": plan.get("Shared Hit Blocks", 0),
        "shared_read": plan.get("Shared Read Blocks", 0),
    }


#: The node name the plans' claims and leases use.
NODE = "bench"
CHANNEL = "trioq_bench_plans"  # nobody listens: and every notify is rolled back anyway
#: Keys of the keyed table (``ready_trioq_keyed``), and of the plans' keyed adds.
KEY = "welcome:{}"


def _new_rows(n: int, *, keys: list[str] | None = None) -> list[tuple[str, Any, str]]:
    """``n`` rows as ``PostgresStore._rows`` makes them for ``_transitions.add``."""
    from trioq.stores._base import IdMaker, NewJob
    from trioq.stores.postgres._rows import encode_payload

    ids = IdMaker(width=10)
    out = []
    for i in range(n):
        job = NewJob("signup", dict(PAYLOAD), 0, None if keys is None else keys[i], 5)
        out.append((ids(), job, encode_payload(job.payload, "payload")))
    return out


def _claimed(conn: Any, s: str, n: int = 100) -> list[Any]:
    from trioq.stores.postgres import _transitions as sql

    return sql.claim(conn, s, NODE, n, None, "setup", False)


class Case:
    """One call of a ``_transitions`` function, and the statements it is expected to send.

    ``labels``: ``(name, a fragment its SQL contains, required)`` for each statement, in order. A call
    that sends more statements, a statement without its fragment, or fewer than the required ones fails
    the run (the transition changed: bring the labels, and docs/postgres.md, up to date).
    """

    def __init__(
        self,
        name: str,
        labels: list[tuple[str, str, bool]],
        call: Any,
        *,
        setup: Any = None,
        needs_ready: bool = False,
        only: tuple[str, ...] | None = None,
    ) -> None:
        self.name, self.labels, self.call, self.setup = name, labels, call, setup
        self.needs_ready, self.only = needs_ready, only

    def check(self, records: list[tuple[str, Any, float]]) -> None:
        if len(records) > len(self.labels):
            extra = records[len(self.labels)][0]
            raise RuntimeError(f"plans: {self.name} sent {len(records)} statements, expected at most "
                               f"{len(self.labels)}; the one past them: {extra[:200]!r}")  # fmt: skip
        for (sql_text, _, _), (label, fragment, _) in zip(records, self.labels, strict=False):
            if fragment not in sql_text:
                raise RuntimeError(f"plans: {self.name}: the statement labelled {label!r} does not contain "
                                   f"{fragment!r}: {sql_text[:200]!r}")  # fmt: skip
        required = sum(1 for *_, req in self.labels if req)
        if len(records) < required:
            raise RuntimeError(f"plans: {self.name} sent {len(records)} statements, expected at least {required}")


def cases() -> list[Case]:
    """The calls of ``_transitions`` whose statements are explained."""
    from trioq.stores._base import Failed, Succeeded
    from trioq.stores.postgres import _transitions as sql

    claim = ("claim", "FOR UPDATE SKIP LOCKED", True)
    insert = ("insert", "ON CONFLICT DO NOTHING", True)
    admit = [("admission_lock", ".admission FOR UPDATE", True), ("admit_counts", "UNION ALL", True)]
    evict = [("evict_lock", "pg_advisory_xact_lock", True), ("evict_count", "count(*)", True),
             ("evict_oldest_1000", "ORDER BY finish_seq", True), ("evict_delete", "DELETE", False)]  # fmt: skip
    keys = [KEY.format(i) for i in range(100)]

    def add(c: Any, s: str, ctx: Any, n: int, bound: int | None, with_keys: bool = False) -> None:
        from trioq import QueueFull

        with contextlib.suppress(QueueFull):
            sql.add(c, s, _new_rows(n, keys=keys[:n] if with_keys else None), time.time(), bound,
                    (CHANNEL, f"r|{NODE}|{n}"))  # fmt: skip

    def held_keys(conn: Any, s: str) -> None:  # a job holds each key (on the keyed table, one does already)
        sql.add(conn, s, _new_rows(100, keys=keys), time.time(), None, None)

    def lapsed(conn: Any, s: str) -> list[Any]:
        jobs = _claimed(conn, s)
        conn.execute(f"INSERT INTO {s}.nodes (id, expires_at) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
                     " SET expires_at = excluded.expires_at", (NODE, time.time() - 60))  # fmt: skip
        return jobs

    def dead_one(conn: Any, s: str) -> str:
        job = _claimed(conn, s, 1)[0]
        sql.complete(conn, s, [Failed(job.id, job.epoch, "Boom: setup", None)], time.time(), CHANNEL, NODE)
        return str(job.id)

    def newest(conn: Any, s: str, n: int = 1) -> list[str]:
        return [r[0] for r in conn.execute(f"SELECT id FROM {s}.jobs ORDER BY seq DESC LIMIT {n}").fetchall()]

    def retained(conn: Any, s: str) -> int:
        return int(conn.execute(f"SELECT count(*) FROM {s}.jobs WHERE finish_seq IS NOT NULL").fetchone()[0])

    def first_ready(conn: Any, s: str) -> str:
        return str(conn.execute(f"SELECT id FROM {s}.jobs WHERE state = 'ready' LIMIT 1").fetchone()[0])

    now = time.time
    return [
        Case("claim_1", [claim], lambda c, s, x: sql.claim(c, s, NODE, 1, None, "t", False)),
        Case("claim_100", [claim], lambda c, s, x: sql.claim(c, s, NODE, 100, None, "t", False)),
        Case("claim_100_with_lease", [("lease_upsert", "INSERT INTO", True), claim],
             lambda c, s, x: sql.claim(c, s, NODE, 100, now() + 30, "t", False)),
        Case("claim_100_recover", [("recover_lookup", "claim = %s", True), claim],
             lambda c, s, x: sql.claim(c, s, NODE, 100, None, "t", True)),
        Case("succeed_100", [("succeed_all", "nextval", True)],
             lambda c, s, jobs: sql.complete(c, s, [Succeeded(j.id, j.epoch, RESULT) for j in jobs], now(),
                                             CHANNEL, NODE),
             setup=_claimed, needs_ready=True),
        Case("fail_100_dead", [("lock_rows", "FOR UPDATE", True), ("finish_seqs", "generate_series", True),
                               ("write_back", "unnest", True), ("notify", "pg_notify", True)],
             lambda c, s, jobs: sql.complete(c, s, [Failed(j.id, j.epoch, "Boom: x", None) for j in jobs], now(),
                                             CHANNEL, NODE),
             setup=_claimed, needs_ready=True),
        Case("extend_100", [("extend", "ON CONFLICT (id) DO UPDATE", True)],
             lambda c, s, jobs: sql.extend(c, s, NODE, [(j.id, j.epoch) for j in jobs], 30.0, now),
             setup=_claimed, needs_ready=True),
        Case("promote_none_due", [("promote", "state = 'scheduled'", True), ("next_run_at", "min(run_at)", True)],
             lambda c, s, x: sql.promote(c, s, now())),
        Case("rescue_100", [("lapsed_nodes", "expires_at <", True), ("rescue_update", "NOT EXISTS", True),
                            ("delete_nodes", "DELETE", False)],
             lambda c, s, x: sql.rescue(c, s, now()), setup=lapsed),
        Case("release_node_100", [("release_update", "node = %s", True), ("delete_node", "DELETE", True)],
             lambda c, s, x: sql.release_node(c, s, NODE), setup=_claimed, needs_ready=True),
        Case("lead", [("lead", ".leader", True)], lambda c, s, x: sql.lead(c, s, NODE, now(), 10.0)),
        Case("has_pending", [("has_pending", "IS NOT NULL", True)], lambda c, s, x: sql.has_pending(c, s)),
        Case("counts", [("counts", "GROUP BY state", True)], lambda c, s, x: sql.counts(c, s)),
        Case("add_100", [insert], lambda c, s, x: add(c, s, x, 100, None)),
        Case("add_100_max_ready_10k_full", admit, lambda c, s, x: add(c, s, x, 100, 10_000),
             only=("ready_large",)),
        Case("add_100_max_ready_10M_room", [*admit, insert], lambda c, s, x: add(c, s, x, 100, 10_000_000)),
        Case("add_100_keyed_max_ready", [*admit, ("admit_key_lookup", "key_hash = ANY", True), insert,
                                         ("holders", "key_hash = ANY", False)],
             lambda c, s, x: add(c, s, x, 100, 10_000_000, with_keys=True)),
        Case("add_100_keys_held", [insert, ("holders", "key_hash = ANY", True)],
             lambda c, s, x: add(c, s, x, 100, None, with_keys=True), setup=held_keys),
        Case("evict_nothing_due", evict, lambda c, s, x: sql.evict(c, s, now() - 3600, 100_000)),
        Case("evict_500_over_max_retained", evict, lambda c, s, n: sql.evict(c, s, -math.inf, n - 500),
             setup=retained, only=("succeeded_100k",)),
        Case("get_by_id", [("get", "WHERE id = %s", True)], lambda c, s, ids: sql.get(c, s, ids[0]), setup=newest),
        Case("watched_terminal_100", [("watched_terminal", "id = ANY", True)],
             lambda c, s, ids: sql.watched_terminal(c, s, ids), setup=lambda c, s: newest(c, s, 100)),
        Case("jobs_ready_100", [("jobs", "ORDER BY seq", True)], lambda c, s, x: sql.jobs(c, s, [READY], 100)),
        Case("jobs_dead_100", [("jobs", "ORDER BY seq", True)], lambda c, s, x: sql.jobs(c, s, [DEAD], 100)),
        Case("jobs_succeeded_100", [("jobs", "ORDER BY seq", True)],
             lambda c, s, x: sql.jobs(c, s, [SUCCEEDED], 100), only=("succeeded_100k",)),
        Case("cancel_ready", [("lock_row", "FOR UPDATE", True), ("snapshot", "WHERE id = %s", True),
                              ("cancel_update", "'cancelled'", True), ("notify", "pg_notify", True)],
             lambda c, s, job_id: sql.cancel(c, s, job_id, now(), CHANNEL, NODE), setup=first_ready,
             needs_ready=True),
        Case("retry_dead", [("lock_row", "FOR UPDATE", True), ("retry_update", "state = 'ready'", True),
                            ("notify", "pg_notify", True)],
             lambda c, s, job_id: sql.retry(c, s, job_id, now(), (CHANNEL, f"r|{NODE}|1")), setup=dead_one,
             needs_ready=True),
    ]  # fmt: skip


READY, DEAD, SUCCEEDED = trioq.JobState.READY, trioq.JobState.DEAD, trioq.JobState.SUCCEEDED
#: The cases run on the keyed table too.
KEYED_CASES = ("add_100_keyed_max_ready", "add_100_keys_held", "get_by_id", "has_pending")


def explain_all(dsn: str, schema: str, table: str, rounds: int = 3, names: tuple[str, ...] | None = None) -> None:
    """Explain every statement of every case (or of ``names``) on ``schema``'s table, ``rounds`` times each,
    each round in a transaction rolled back afterwards (so each sees the same table)."""
    with connect(dsn) as conn:
        conn.execute(f"ANALYZE {schema}.jobs")
        rows = count_rows(conn, schema)
        has_ready = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {schema}.jobs WHERE state = 'ready')").fetchone()[0]
        for case in cases():
            if (names is not None and case.name not in names) or (case.only and table not in case.only):
                continue
            if case.needs_ready and not has_ready:
                continue
            per_round: list[list[tuple[str, Any, float]]] = []
            for _ in range(rounds):
                with conn.transaction(force_rollback=True):
                    ctx = case.setup(conn, schema) if case.setup else None
                    explaining = _Explaining(conn)
                    case.call(explaining, schema, ctx)
                    case.check(explaining.records)
                    per_round.append(explaining.records)
            if len({len(r) for r in per_round}) != 1:
                raise RuntimeError(f"plans: {case.name} sent {[len(r) for r in per_round]} statements in its rounds")
            for i, (label, _, _) in enumerate(case.labels[: len(per_round[0])]):
                runs = [explain_doc(r[i][1]) for r in per_round]
                last = runs[-1]
                emit({
                    "section": "plans", "table": table, "rows": rows, "case": case.name, "statement": label,
                    "execution_ms": r3(median([r["execution_ms"] for r in runs])),
                    "rounds_ms": [r3(r["execution_ms"]) for r in runs],
                    "client_ms": r3(median([r[i][2] * 1e3 for r in per_round])),
                    "planning_ms": r3(last["planning_ms"]), "full_scan": last["full_scan"],
                    "indexes": last["indexes"], "shared_hit": last["shared_hit"], "shared_read": last["shared_read"],
                    "plan": last["plan"], "sql": per_round[-1][i][0].replace(f"{schema}.", "{s}."),
                })  # fmt: skip


def section_plans(dsn: str, keep: list[str], n_large: int) -> None:
    if not keep:  # --only plans: build the large table here
        schema = f"bench_pgt_{os.getpid()}_{next(_schemas)}"
        keep.append(schema)
        create_schema(dsn, schema)
        log(f"plans: {n_large} ready jobs inserted with SQL")
        sql_fill(dsn, schema, n_large)
        check_sql_fill(dsn, schema)
        with connect(dsn) as conn:
            vacuum(conn, schema)
    log("plans: on the large ready table")
    explain_all(dsn, keep[0], "ready_large")


# ------------------------------------------------------------------ churn

_SAMPLE = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       autovacuum_count, autoanalyze_count, extract(epoch FROM last_autovacuum),
       pg_relation_size(relid), pg_indexes_size(relid), pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE schemaname = %s
"""
_FIELDS = ("live", "dead", "ins", "upd", "hot_upd", "del", "autovacuums", "autoanalyzes", "last_autovacuum",
           "heap_bytes", "indexes_bytes", "total_bytes")  # fmt: skip


class Sampler:
    """A thread sampling the schema's tables every :data:`SAMPLE_EVERY` seconds on its own connection."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.t0 = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with connect(self.dsn) as conn:
            while True:
                self.sample(conn)
                if self._stop.wait(SAMPLE_EVERY):
                    self.sample(conn)
                    return

    def sample(self, conn: Any) -> None:
        rows = conn.execute(_SAMPLE, (self.schema,)).fetchall()
        seq = conn.execute(f"SELECT last_value, is_called FROM {self.schema}.finish_seq").fetchone()
        tables = {}
        for row in rows:
            values = dict(zip(_FIELDS, row[1:], strict=True))
            if values["last_autovacuum"] is not None:
                values["last_autovacuum"] = r3(float(values["last_autovacuum"]) - self.t0)
            tables[row[0]] = values
        self.samples.append({"t": r3(time.time() - self.t0), "finished": seq[0] if seq[1] else 0, "tables": tables})


def _timed(st: Any, name: str, calls: list[float]) -> None:
    """Replace ``st.<name>`` by a wrapper that appends each call's seconds to ``calls``."""
    original = getattr(st, name)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            calls.append(perf_counter() - t0)

    setattr(st, name, timed)


async def churn_node(dsn: str, schema: str, workers: int, until: float, timing: dict[str, Any]) -> None:
    st = store(dsn, schema)
    pending: list[float] = []
    evicts: list[float] = []
    _timed(st, "has_pending", pending)
    _timed(st, "evict", evicts)
    t0 = perf_counter()
    async with trioq.open_queue(REGISTRY, store=st, workers=workers, retention=CHURN_RETENTION) as queue:
        await queue.join()
        timing["drain_s"] = perf_counter() - t0
        timing["join_has_pending_calls"] = len(pending)
        timing["join_has_pending_s"] = sum(pending)
        timing["join_has_pending_max_ms"] = max(pending) * 1e3 if pending else 0.0
        # At least MIN_TAIL after the drain, so eviction and autovacuum are seen however long it took.
        await trio.sleep(max(until - time.time(), MIN_TAIL))
    timing["evict_calls"] = len(evicts)
    timing["evict_s"] = sum(evicts)
    timing["evict_max_ms"] = max(evicts) * 1e3 if evicts else 0.0


def section_churn(dsn: str, n: int, workers: int, tail: float, runs: tuple[str, ...]) -> None:
    for kind in runs:
        with fresh_schema(dsn) as schema:
            create_schema(dsn, schema)
            applied: dict[str, str] = {}
            with connect(dsn) as conn:
                if kind != "default":
                    applied.update(TUNED)
                if kind == "tuned_ff85":
                    applied["fillfactor"] = "85"
                if applied:
                    opts = ", ".join(f"{k} = {v}" for k, v in applied.items())
                    conn.execute(f"ALTER TABLE {schema}.jobs SET ({opts})")
            log(f"churn {kind}: enqueue {n}")
            run(fill, dsn, schema, n, "noop", {})
            log(f"churn {kind}: drain with workers={workers}, retention={CHURN_RETENTION}, sampled for {tail:.0f}s")
            timing: dict[str, Any] = {}
            with Sampler(dsn, schema) as sampler:
                run(churn_node, dsn, schema, workers, sampler.t0 + tail, timing)
            samples = sampler.samples
            jobs = [s["tables"].get("jobs", {}) for s in samples]
            peak_total = max(j.get("total_bytes", 0) for j in jobs)
            peak_dead = max(j.get("dead", 0) for j in jobs)
            last = samples[-1]["tables"]
            hot = {name: (r3(t["hot_upd"] / t["upd"]) if t["upd"] else None) for name, t in last.items()}
            emit({
                "section": "churn", "settings": kind, "table_options": applied, "jobs": n, "workers": workers,
                "retention_s": CHURN_RETENTION, "drain_jobs_per_s": r3(n / timing["drain_s"]),
                "drain_s": r3(timing["drain_s"]), "join_has_pending_calls": timing["join_has_pending_calls"],
                "join_has_pending_s": r3(timing["join_has_pending_s"]),
                "join_has_pending_max_ms": r3(timing["join_has_pending_max_ms"]),
                "evict_calls": timing["evict_calls"], "evict_s": r3(timing["evict_s"]),
                "evict_max_ms": r3(timing["evict_max_ms"]),
                "peak_jobs_total_bytes": peak_total, "peak_jobs_dead": peak_dead,
                "end": {name: {k: t[k] for k in ("live", "dead", "heap_bytes", "indexes_bytes", "total_bytes",
                                                 "autovacuums", "last_autovacuum", "upd", "hot_upd")}
                        for name, t in last.items()},
                "hot_share": hot,
                "samples": [[s["t"], s["finished"], *(s["tables"].get("jobs", {}).get(k) for k in
                             ("live", "dead", "heap_bytes", "indexes_bytes", "autovacuums"))] for s in samples],
                "samples_columns": ["t", "finished", "live", "dead", "heap_bytes", "indexes_bytes", "autovacuums"],
                "small_tables": {name: [[s["t"], s["tables"][name]["total_bytes"], s["tables"][name]["dead"],
                                         s["tables"][name]["upd"], s["tables"][name]["hot_upd"]]
                                        for s in samples if name in s["tables"]]
                                 for name in ("nodes", "leader", "admission")},
            })  # fmt: skip


# ------------------------------------------------------------------- main


def main() -> None:
    parser = arg_parser(__doc__, SECTIONS, quick_help="small sizes: a smoke test of about two minutes")
    parser.add_argument("--dsn", required=True, help="PostgreSQL to measure on (fresh schemas, dropped after)")
    args = parser.parse_args()
    quick = args.quick
    dsn = args.dsn
    started = perf_counter()
    emit(env_line(quick, loadavg_1m=round(os.getloadavg()[0], 2), **settings(dsn)))
    n_small = 10_000 if quick else 100_000
    n_large = 50_000 if quick else 1_000_000
    keep: list[str] = []  # the large ready table, shared by size and plans
    try:
        for name in (args.only,) if args.only else SECTIONS:
            t0 = perf_counter()
            if name == "size":
                section_size(dsn, n_small, n_large, keep)
            elif name == "plans":
                section_plans(dsn, keep, n_large)
            elif name == "churn":
                for schema in keep:  # not needed any more: out of the way of autovacuum
                    with connect(dsn) as conn:
                        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                keep.clear()
                section_churn(dsn, n=20_000 if quick else 200_000, workers=50, tail=30.0 if quick else TAIL,
                              runs=("default", "tuned") if quick else ("default", "tuned", "tuned_ff85"))  # fmt: skip
            log(f"{name} took {perf_counter() - t0:.1f}s")
            emit({"section": "load", "after": name, "seconds": r3(perf_counter() - t0),
                  "loadavg_1m": round(os.getloadavg()[0], 2)})  # fmt: skip
    finally:
        for schema in keep:
            with connect(dsn) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    log(f"done in {perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
