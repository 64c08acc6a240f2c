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
from typing import Any

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema_name", "current_version", "migrate"]

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
)

#: The version a store of this trioq expects.
SCHEMA_VERSION = len(MIGRATIONS)


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
