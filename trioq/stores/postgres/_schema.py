"""The PostgresStore schema: versioned migrations, applied under a transaction-scoped advisory lock.

Every migration is a list of statements; :func:`migrate` applies those past
the schema's recorded version in one transaction, holding
``pg_advisory_xact_lock`` on a key derived from the schema's name, so that
nodes opening at once migrate exactly once (a transaction-scoped lock, which
PgBouncer's transaction pooling keeps, unlike a session lock). Times are
``double precision`` wall-clock seconds, as :class:`~trioq.Job` carries them.
"""

from __future__ import annotations

import re
import time
from typing import Any

__all__ = [
    "FAIR_INDEX",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "check_schema_name",
    "current_version",
    "ensure_fair_index",
    "migrate",
]

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

#: The statements of each version, in order; ``{s}`` is the schema's name.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE {s}.jobs ("
        " id text PRIMARY KEY,"
        " seq bigint GENERATED ALWAYS AS IDENTITY,"
        " task text NOT NULL,"
        " payload json NOT NULL,"
        " state text NOT NULL CHECK (state IN"
        "  ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled')),"
        " priority bigint NOT NULL,"
        " key text,"
        " key_hash bytea,"
        " max_attempts bigint NOT NULL,"
        " run_at double precision NOT NULL,"
        " created_at double precision NOT NULL,"
        " attempts bigint NOT NULL DEFAULT 0,"
        " epoch bigint NOT NULL DEFAULT 0,"
        " node text,"
        " claim text,"
        " finished_at double precision,"
        " changed_at double precision,"
        " finish_seq bigint,"
        " result json,"
        " error text,"
        " errors json,"
        " snoozes integer NOT NULL DEFAULT 0)",
        # The claim: best ready job first (priority, then run_at, then enqueue order).
        "CREATE INDEX jobs_ready ON {s}.jobs (priority DESC, run_at, seq) WHERE state = 'ready'",
        "CREATE INDEX jobs_scheduled ON {s}.jobs (run_at) WHERE state = 'scheduled'",
        "CREATE INDEX jobs_running ON {s}.jobs (node) WHERE state = 'running'",
        # Retention: terminal jobs in the order they finished.
        "CREATE INDEX jobs_finished ON {s}.jobs (finish_seq) WHERE finish_seq IS NOT NULL",
        # Idempotency keys: a job holds its key until it is evicted. The index is over the key's SHA-256
        # (made by the client): a btree entry holds at most 2704 bytes, and a key may have 4096.
        "CREATE UNIQUE INDEX jobs_key ON {s}.jobs (key_hash) WHERE key_hash IS NOT NULL",
        "CREATE SEQUENCE {s}.finish_seq",
        # One row per node: its lease on every job it runs.
        "CREATE TABLE {s}.nodes (id text PRIMARY KEY, expires_at double precision NOT NULL)",
        # The leader: a single row with a lease of its own (River's leader table).
        "CREATE TABLE {s}.leader (name text PRIMARY KEY, node text NOT NULL, expires_at double precision NOT NULL)",
        # One row that adds checking max_ready lock, so that they take turns.
        "CREATE TABLE {s}.admission (id integer PRIMARY KEY)",
        "INSERT INTO {s}.admission VALUES (1)",
    ),
    (
        # Limit keys: the keys a job holds while it runs; a ready job passed over for one is parked
        # (``parked``: until when, 'Infinity' for a slot; ``parked_key``: the full key it waits on), and
        # the claims' indexes leave it out until it is unparked. A job of version 1 holds no key.
        "ALTER TABLE {s}.jobs ADD COLUMN limits text[] NOT NULL DEFAULT '{{}}'",
        "ALTER TABLE {s}.jobs ADD COLUMN parked double precision",
        "ALTER TABLE {s}.jobs ADD COLUMN parked_key text",
        "DROP INDEX {s}.jobs_ready",
        "CREATE INDEX jobs_ready ON {s}.jobs (priority DESC, run_at, seq) WHERE state = 'ready' AND parked IS NULL",
        # Parked jobs: by when they are due (promote), and by the key whose slot they wait for, best first.
        "CREATE INDEX jobs_parked ON {s}.jobs (parked) WHERE state = 'ready' AND parked IS NOT NULL",
        "CREATE INDEX jobs_blocked ON {s}.jobs (parked_key, priority DESC, run_at, seq)"
        " WHERE state = 'ready' AND parked_key IS NOT NULL",
        # A key's slots are counted from the running attempts that hold it: no counter a crash can leave.
        "CREATE INDEX jobs_holding ON {s}.jobs USING gin (limits) WHERE state = 'running' AND limits <> '{{}}'",
        # The count, one GIN probe per key. A GIN index is read by bitmap scans only, which trioq's
        # connections disable (see store._PLANNER): the function turns them on for its own statement.
        "CREATE FUNCTION {s}.limit_holders(keys text[]) RETURNS TABLE (key text, held bigint) LANGUAGE sql STABLE"
        " SET enable_bitmapscan = on AS $$ SELECT k, (SELECT count(*) FROM {s}.jobs WHERE state = 'running'"
        " AND limits <> '{{}}' AND limits @> ARRAY[k]) FROM unnest(keys) k $$",
        # Each rate's GCRA state (its theoretical arrival time), written by the claims that take its tokens.
        "CREATE TABLE {s}.limit_rates (key text PRIMARY KEY, tat double precision NOT NULL)",
        # Named queues, tenants and deadlines. A column with a constant default is added without
        # rewriting the table: every existing job is in the queue "default", with no tenant or deadline.
        "ALTER TABLE {s}.jobs ADD COLUMN queue text NOT NULL DEFAULT 'default'",
        "ALTER TABLE {s}.jobs ADD COLUMN tenant text",
        "ALTER TABLE {s}.jobs ADD COLUMN deadline double precision",
        # A claim of named queues reads each queue's best ready jobs in order from here (jobs_ready
        # stays for claims of every queue); a claim of every queue while one is paused walks the
        # distinct queues through it, skipping the paused one's backlog.
        "CREATE INDEX jobs_queue_ready ON {s}.jobs (queue, priority DESC, run_at, seq)"
        " WHERE state = 'ready' AND parked IS NULL",
        # Deadlines still to enforce: only never-claimed ready or scheduled jobs that have one, so
        # it is empty (and its probes free) while nobody uses deadlines.
        "CREATE INDEX jobs_deadline ON {s}.jobs (deadline)"
        " WHERE deadline IS NOT NULL AND epoch = 0 AND state IN ('ready', 'scheduled')",
        # One row per paused queue, for every node: claims skip its jobs until it is resumed.
        "CREATE TABLE {s}.paused (queue text PRIMARY KEY, paused_at double precision NOT NULL)",
    ),
    (
        # Deferred jobs (StoreConfig.defer_past): stored, keyed (jobs_key covers every state already),
        # never claimed, admitted oldest first. The CHECK of version 1 has PostgreSQL's default name; the
        # wider one is added NOT VALID (no scan of the table: its rows passed the narrower one), and every
        # row written from now on is checked.
        "ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_state_check",
        "ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN"
        " ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled', 'deferred')) NOT VALID",
        # Admission: oldest first (enqueue order), and with fairness each tenant's oldest ('' for none).
        # Both are empty while nothing is deferred. Each predicate holds a clause that is always true
        # (seq > 0, epoch >= 0) and that only the statements meant for that index state: with statistics
        # from before a deferred backlog (rows=1), the planner answered the tenants' skip scan with a scan
        # of jobs_deferred and a sort of every deferred job (80 ms at 20,000), not jobs_deferred_tenant.
        "CREATE INDEX jobs_deferred ON {s}.jobs (seq) WHERE state = 'deferred' AND seq > 0",
        "CREATE INDEX jobs_deferred_tenant ON {s}.jobs (coalesce(tenant, ''), seq)"
        " WHERE state = 'deferred' AND epoch >= 0",
        # A deferred job's deadline runs as a waiting job's does.
        "DROP INDEX {s}.jobs_deadline",
        "CREATE INDEX jobs_deadline ON {s}.jobs (deadline)"
        " WHERE deadline IS NOT NULL AND epoch = 0 AND state IN ('ready', 'scheduled', 'deferred')",
        # Start-time fair queueing's shared state: each (queue, tenant)'s finish tag, and each queue's
        # virtual time (the start tag of its last claim). Admissions of deferred jobs keep theirs under the
        # queue '' (no queue has that name).
        "CREATE TABLE {s}.fair_tags (queue text NOT NULL, tenant text NOT NULL, finish double precision NOT NULL,"
        " PRIMARY KEY (queue, tenant))",
        "CREATE TABLE {s}.fair_clock (queue text PRIMARY KEY, v double precision NOT NULL)",
        # The head of every (queue, tenant) with ready jobs, of the queues ``p_queues`` (NULL: every queue with
        # ready jobs, found by a loose index scan) that are not paused: a skip scan of jobs_tenant_ready (see
        # FAIR_INDEX), one probe per tenant, and each tenant's first live job. A function, so that it can turn sorts and
        # sequential scans off for itself: with statistics from before the backlog (rows=1), the planner
        # answered it with jobs_queue_ready and a sort of every ready job per tenant (110 ms at 20,000).
        "CREATE FUNCTION {s}.ready_heads(p_queues text[], p_now double precision)"
        " RETURNS TABLE (h_queue text, h_tenant text, h_priority bigint, h_run_at double precision, h_seq bigint)"
        " LANGUAGE sql STABLE SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off AS $$"
        " WITH RECURSIVE aq(name) AS ("
        "  (SELECT j.queue FROM {s}.jobs j WHERE j.state = 'ready' AND j.parked IS NULL AND p_queues IS NULL"
        "   ORDER BY j.queue LIMIT 1)"
        "  UNION ALL SELECT (SELECT j.queue FROM {s}.jobs j WHERE j.state = 'ready' AND j.parked IS NULL"
        "   AND j.queue > aq.name ORDER BY j.queue LIMIT 1) FROM aq WHERE aq.name IS NOT NULL),"
        " q(name) AS (SELECT unnest(p_queues) UNION ALL SELECT aq.name FROM aq WHERE aq.name IS NOT NULL),"
        " t(queue, tenant) AS ("
        "  SELECT q.name, (SELECT coalesce(j.tenant, '') FROM {s}.jobs j WHERE j.state >= 'ready'"
        "   AND j.state <= 'ready' AND j.parked IS NULL AND j.epoch >= 0 AND j.queue >= q.name AND j.queue <= q.name"
        "   ORDER BY j.queue, coalesce(j.tenant, '') LIMIT 1)"
        "  FROM q WHERE q.name NOT IN (SELECT p.queue FROM {s}.paused p)"
        "  UNION ALL SELECT t.queue, (SELECT coalesce(j.tenant, '') FROM {s}.jobs j WHERE j.state >= 'ready'"
        "   AND j.state <= 'ready' AND j.parked IS NULL AND j.epoch >= 0 AND j.queue >= t.queue AND j.queue <= t.queue"
        "   AND coalesce(j.tenant, '') > t.tenant ORDER BY j.queue, coalesce(j.tenant, '') LIMIT 1)"
        "  FROM t WHERE t.tenant IS NOT NULL)"
        " SELECT t.queue, t.tenant, x.priority, x.run_at, x.seq FROM t CROSS JOIN LATERAL"
        "  (SELECT j.priority, j.run_at, j.seq FROM {s}.jobs j WHERE j.state >= 'ready' AND j.state <= 'ready'"
        "   AND j.parked IS NULL AND j.epoch >= 0 AND j.queue >= t.queue AND j.queue <= t.queue"
        "   AND coalesce(j.tenant, '') >= t.tenant AND coalesce(j.tenant, '') <= t.tenant"
        "   AND (j.deadline IS NULL OR j.epoch > 0 OR p_now IS NULL OR j.deadline > p_now)"
        "   ORDER BY j.queue, coalesce(j.tenant, ''), j.priority DESC, j.run_at, j.seq LIMIT 1) x"
        " WHERE t.tenant IS NOT NULL $$",
    ),
    (
        # Flows (NewJob.after; the SQL is _flows'): a job with parents not all succeeded is 'waiting'. Each
        # column is added without a default (no rewrite), so that a job with no parents keeps them NULL and
        # COPY never names them. ``parents``: its parents' ids, in order; ``unmet``: while it waits, how many
        # have not succeeded; ``cancelled_by``: the parent whose end cancelled it (a retry of that parent
        # revives it); ``has_children``: true once some job names it as a parent, written under the parent's
        # row lock by the child's add, so that a completion that locks the parent reads whether it must look
        # for children (a job without any is completed in one statement, as before).
        "ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_state_check",
        "ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN"
        " ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled', 'deferred', 'waiting')) NOT VALID",
        "ALTER TABLE {s}.jobs ADD COLUMN parents text[]",
        "ALTER TABLE {s}.jobs ADD COLUMN unmet integer",
        "ALTER TABLE {s}.jobs ADD COLUMN cancelled_by text",
        "ALTER TABLE {s}.jobs ADD COLUMN has_children boolean",
        # Parent -> child, for each parent that had not succeeded when the child was added (one that had
        # never moves it again): a parent's end finds its children by the primary key. Dropped with the parent.
        "CREATE TABLE {s}.flow_edges (parent text NOT NULL, child text NOT NULL, PRIMARY KEY (parent, child))",
        # has_pending's probe of waiting jobs; empty while nobody uses flows.
        "CREATE INDEX jobs_waiting ON {s}.jobs (seq) WHERE state = 'waiting'",
        # A waiting job's deadline runs as a ready one's does.
        "DROP INDEX {s}.jobs_deadline",
        "CREATE INDEX jobs_deadline ON {s}.jobs (deadline)"
        " WHERE deadline IS NOT NULL AND epoch = 0 AND state IN ('ready', 'scheduled', 'deferred', 'waiting')",
    ),
    (
        # Cron (Registry.cron; the SQL is _cron's): each schedule's last tick (or baseline), wall clock. A tick's
        # job is inserted in the transaction that moves its row forward, so a tick is enqueued once.
        "CREATE TABLE {s}.cron_ticks (name text PRIMARY KEY, tick double precision NOT NULL)",
    ),
    (
        # Listings (Store.list_jobs, GET /jobs, the dashboard): each state's jobs newest first, read backwards
        # (_listing). Built without CONCURRENTLY, under the migration lock: 2.8 s per million jobs here. Its
        # predicate is always true (max_attempts >= 1) and only the listing statements state it, so no other
        # statement's plan can use it: with statistics that say a state is empty, it looked cheaper than the
        # partial index a statement is written for (a fair admission read every deferred job through it).
        "CREATE INDEX jobs_listing ON {s}.jobs (state, seq) WHERE max_attempts > 0",
    ),
)

#: The version a store of this trioq expects.
SCHEMA_VERSION = len(MIGRATIONS)

#: Tenant fairness (StoreConfig.fairness): each queue's ready jobs per tenant ('' for none) in claim order,
#: so that a fair claim finds every tenant's head by a skip scan. Not part of a migration: it is built
#: (concurrently) when a session first opens with fairness, so that a schema nobody claims fairly in does
#: not maintain it (it made a COPY of 5,000 jobs about 25 % slower). Its predicate holds ``epoch >= 0``
#: (always true), which only the fair statements state, so no plan of another statement can use it; nor
#: does a claim write to it (a running row is outside the predicate). It says ``state >= 'ready' AND
#: state <= 'ready'`` for ``state = 'ready'``, and so do the fair statements: the planner cannot prove
#: ``state = 'ready'`` from that, so their plans cannot use ``jobs_ready`` or ``jobs_queue_ready``,
#: which statistics taken before a backlog made look cheap (a scan of ``jobs_queue_ready`` and a sort
#: per tenant, even for the look-up of a job by id: 760 ms for a claim of 100 at 20,000 ready).
FAIR_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_tenant_ready ON {s}.jobs"
    " (queue, coalesce(tenant, ''), priority DESC, run_at, seq)"
    " WHERE state >= 'ready' AND state <= 'ready' AND parked IS NULL AND epoch >= 0"
)


def check_schema_name(schema: object) -> str:
    """``schema`` if it is a plain lower-case SQL identifier, else ``ValueError`` saying what is allowed."""
    if not isinstance(schema, str) or _NAME.fullmatch(schema) is None:
        raise ValueError(
            f"schema must be a lower-case identifier of letters, digits and _ (at most 48, not starting "
            f"with a digit), got {schema!r}"
        )
    return schema


def current_version(cur: Any, schema: str) -> int:
    """The schema's recorded version (0: no trioq schema there yet)."""
    cur.execute("SELECT to_regclass(%s)", (f"{schema}.migrations",))
    row = cur.fetchone()
    if row is None or row[0] is None:
        return 0
    cur.execute(f"SELECT coalesce(max(version), 0) FROM {schema}.migrations")
    found = cur.fetchone()
    return 0 if found is None else int(found[0])


def migrate(conn: Any, schema: str) -> tuple[int, int]:
    """Bring ``schema`` to :data:`SCHEMA_VERSION` on the psycopg connection ``conn``; returns ``(before, after)``.

    Creates the schema if missing. Raises ``RuntimeError`` for a schema
    newer than this trioq knows (a newer trioq migrated it: upgrade this one).
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"trioq-migrate:{schema}",))
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {schema}.migrations"
            " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        before = current_version(cur, schema)
        if before > SCHEMA_VERSION:
            raise RuntimeError(
                f"schema {schema!r} is at version {before}, newer than this trioq knows ({SCHEMA_VERSION}); "
                "upgrade trioq on this machine"
            )
        for version in range(before + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1]:
                cur.execute(statement.format(s=schema))
            cur.execute(f"INSERT INTO {schema}.migrations (version) VALUES (%s)", (version,))
    return before, SCHEMA_VERSION


def ensure_fair_index(conn: Any, schema: str, *, poll: float = 0.2) -> bool:
    """Build :data:`FAIR_INDEX` unless a valid one is there; whether this call built it. ``conn`` is in
    autocommit (``CREATE INDEX CONCURRENTLY`` runs outside a transaction, and writes go on meanwhile).

    Returns once the index is valid: a build another node runs now is waited for (checked every
    ``poll`` seconds), as fair claims without the index read every ready job per tenant (46 s a claim
    at 100,000 ready jobs of 1,000 tenants). An invalid index that nobody is building (a build that
    failed or was cut off) is dropped and built again. Two nodes building at once: one builds, the
    other waits for it.
    """
    import psycopg

    built = False
    while True:
        found = conn.execute(
            "SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_stat_progress_create_index p"
            "  WHERE p.index_relid = c.oid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = 'jobs_tenant_ready'",
            (schema,),
        ).fetchone()
        if found is not None:
            valid, building = found
            if valid:
                return built
            if building:
                time.sleep(poll)
                continue
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_tenant_ready")
        try:
            conn.execute(FAIR_INDEX.format(s=schema))
            built = True
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):  # another node's build won
            time.sleep(poll)
