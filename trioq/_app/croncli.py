"""``trioq cron list``: a registry's cron schedules, each with its next run (and last tick, given a store).

The registry comes from ``--app MOD:REGISTRY`` as for ``trioq worker``. With
``--wal DIR`` the last ticks are read from the WAL directory read-only (its log
replayed as ``trioq wal inspect`` does; a queue may have it open meanwhile);
with ``--postgres DSN`` from the schema's ``cron_ticks`` table, without
joining the queue as a node. Without a store the next run is the first tick
after now; with one, a tick missed and not taken yet is the next run (the
leader takes it as soon as it looks).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import zoneinfo
from typing import Any, TextIO

from .._registry import CronSpec
from .._runtime.cron import next_run
from .serve import load_registry

__all__ = ["list_command"]


def _wal_ticks(directory: str) -> dict[str, float]:
    from ..stores.table.jobs import JobTable
    from ..stores.wal._recovery import replay

    if not os.path.isdir(directory):
        raise SystemExit(f"trioq cron list: no WAL directory at {directory}")
    return replay(directory, JobTable(max_retained=sys.maxsize), repair=False).ticks


def _pg_ticks(dsn: str, schema: str) -> dict[str, float]:
    import psycopg

    from ..stores.postgres._cron import _ticks
    from ..stores.postgres._schema import check_schema_name

    schema = check_schema_name(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{schema}.cron_ticks",)).fetchone()
        if found is None or found[0] is None:
            return {}  # no queue opened this schema with cron yet (or it is older): no tick recorded
        return _ticks(conn, schema)


def _shown(at: float | None, spec: CronSpec) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at, zoneinfo.ZoneInfo(spec.tz)).isoformat(timespec="seconds")


def rows(specs: tuple[CronSpec, ...], marks: dict[str, float] | None, now: float) -> list[dict[str, Any]]:
    """Each schedule as ``stats()["cron"]`` shows it (without ``enqueued``); ``last_tick`` is ``None``
    without a store (``marks`` ``None``)."""
    return [
        {
            "name": spec.name,
            "schedule": spec.schedule,
            "task": spec.task,
            "tz": spec.tz,
            "next_run": next_run(spec, None if marks is None else marks.get(spec.name), now),
            "last_tick": None if marks is None else marks.get(spec.name),
        }
        for spec in specs
    ]


def list_command(
    app: str,
    *,
    wal: str | None = None,
    postgres: str | None = None,
    schema: str = "trioq",
    as_json: bool = False,
    out: TextIO = sys.stdout,
    now: float | None = None,
) -> int:
    """Print the schedules of ``app``'s registry; exit status 0 (``SystemExit`` with a message for a
    registry that cannot be loaded, or a WAL directory that does not exist)."""
    registry = load_registry(app)
    specs = registry.crons
    marks: dict[str, float] | None = None
    if wal is not None:
        marks = _wal_ticks(wal)
    elif postgres is not None:
        marks = _pg_ticks(postgres, schema)
    found = rows(specs, marks, time.time() if now is None else now)
    if as_json:
        print(json.dumps(found, indent=2), file=out)
        return 0
    if not found:
        print(f"no cron schedules in {app}", file=out)
        return 0
    table: list[tuple[str, ...]] = [("NAME", "SCHEDULE", "TZ", "TASK", "NEXT RUN", "LAST TICK")]
    for spec, row in zip(specs, found, strict=True):
        next_at, last = _shown(row["next_run"], spec), _shown(row["last_tick"], spec)
        table.append((spec.name, spec.schedule, spec.tz, spec.task, next_at, last))
    if marks is None:
        table = [line[:-1] for line in table]  # no store given: no last tick to show
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(), file=out)
    return 0
