"""``trioq pg migrate``: create or migrate a PostgreSQL queue's schema ahead of the nodes that open it."""

from __future__ import annotations

__all__ = ["migrate_command"]


def migrate_command(dsn: str, schema: str) -> int:
    """``trioq pg migrate``: bring ``schema`` to this trioq's version; exit status 0, or 1 saying why not."""
    import psycopg

    from ..stores.postgres._schema import check_schema_name, migrate

    try:
        check_schema_name(schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            before, after = migrate(conn, schema)
    except (psycopg.Error, RuntimeError, ValueError) as exc:
        print(f"trioq pg migrate: {exc}")
        return 1
    if before == after:
        print(f"schema {schema}: at version {after} already")
    else:
        print(f"schema {schema}: migrated from version {before} to {after}")
    return 0
