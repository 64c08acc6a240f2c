"""``trioq pg migrate``: create or migrate a PostgreSQL queue's schema ahead of the nodes that open it."""

from __future__ import annotations

__all__ = ["migrate_command"]


def migrate_command(dsn: str, schema: str, *, fairness: bool = False) -> int:
    """``trioq pg migrate``: bring ``schema`` to this trioq's version; exit status 0, or 1 saying why not.

    ``fairness``: also build the index fair claims read (``jobs_tenant_ready``, ``CREATE INDEX
    CONCURRENTLY``: writes go on), which the first session opened with ``fairness`` builds otherwise.
    """
    import psycopg

    from ..stores.postgres._schema import check_schema_name, ensure_fair_index, migrate

    try:
        check_schema_name(schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            before, after = migrate(conn, schema)
            built = ensure_fair_index(conn, schema) if fairness else False
    except (psycopg.Error, RuntimeError, ValueError) as exc:
        print(f"trioq pg migrate: {exc}")
        return 1
    if before == after:
        print(f"schema {schema}: at version {after} already")
    else:
        print(f"schema {schema}: migrated from version {before} to {after}")
    if fairness:
        print(f"schema {schema}: fair claims' index {'built' if built else 'there already'}")
    return 0
