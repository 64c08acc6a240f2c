"""Cron ticks on PostgreSQL: ``{s}.cron_ticks`` holds each schedule's last tick, moved with its job.

The table comes with its own migration (``_schema.MIGRATIONS``).

:func:`add_tick` runs the tick's upsert and the job's insert in one
transaction: ``INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE
cron_ticks.tick < excluded.tick RETURNING``. Two nodes racing for one tick
(or an old leader and a new one) meet on the schedule's row: the second
waits for the first to commit, then finds its tick taken (no row returned)
and inserts nothing. A rollback of the first leaves the tick to the second.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from ..._model import Job
from ..._validate import label, number
from .._base import NewJob
from . import _defer
from . import _transitions as sql
from ._sql import cursor as _cur
from ._sql import run as _run

if TYPE_CHECKING:
    from .store import PostgresStore, _Row

__all__ = ["add_tick", "baseline", "ticks"]

_TAKE = (
    "INSERT INTO {s}.cron_ticks (name, tick) VALUES (%s, %s)"
    " ON CONFLICT (name) DO UPDATE SET tick = excluded.tick WHERE cron_ticks.tick < excluded.tick"
    " RETURNING tick"
)


def _checked(name: object, tick: object) -> tuple[str, float]:
    return label("name", name), number("tick", tick, minimum=-math.inf)


def _take(
    conn: Any,
    s: str,
    name: str,
    tick: float,
    rows: list[_Row],
    now: float,
    defer_past: int | None,
    notify: tuple[str, str] | None,
    weights: Any,
    *,
    retried: bool = False,
) -> tuple[str, list[Any], list[str] | None]:
    """In one transaction, move ``name``'s mark to ``tick`` and insert ``rows`` (the tick's job).

    Returns ``("taken", [], None)`` when a tick at or after ``tick`` was recorded already,
    ``("committed", [], None)`` when a try before this one (``retried``) committed the job, else
    ``("added", found, states)``: what the insert answers (``None``, or the holder of the job's key)
    and, with ``defer_past``, each row's state as inserted.
    """
    with _cur(conn) as cur:
        if retried and _run(cur, f"SELECT 1 FROM {s}.jobs WHERE id = %s", (rows[0][0],)).fetchone():
            return "committed", [], None  # the first try committed before its connection broke
        with conn.transaction():
            if _run(cur, _TAKE.format(s=s), (name, tick)).fetchone() is None:
                return "taken", [], None
            if defer_past is None:
                return "added", sql.add(conn, s, rows, now, None, notify), None
            found, states, _ = _defer.add(
                conn, s, rows, now, defer_past, None, notify, weights, admit_first=False
            )  # admitting here would hold the admission lock with the tick's row: the next claim admits
            return "added", found, states


def _baseline(conn: Any, s: str, name: str, tick: float) -> None:
    with _cur(conn) as cur:
        _run(
            cur, f"INSERT INTO {s}.cron_ticks (name, tick) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING", (name, tick)
        )


def _ticks(conn: Any, s: str) -> dict[str, float]:
    with _cur(conn) as cur:
        return {name: float(tick) for name, tick in _run(cur, f"SELECT name, tick FROM {s}.cron_ticks").fetchall()}


async def add_tick(store: PostgresStore, name: str, tick: float, job: NewJob) -> Job | None:
    """:meth:`PostgresStore.add_tick <trioq.stores.Store.add_tick>` with a job (see the module docstring)."""
    config = store._open()
    name, tick = _checked(name, tick)
    rows = store._rows([job])  # its id is made once: a retry after a broken connection looks for it
    now = config.clock()
    ready = 1 if rows[0][1].delay <= 0 else 0
    notify = (store.channel, f"r|{config.node}|{ready}") if ready else None
    outcome, found, states = await store._call(
        _take, name, tick, rows, now, config.defer_past, notify, config.fairness, retried=True
    )
    if outcome == "taken":
        return None
    if outcome == "committed":
        return await store.get(rows[0][0])
    if found[0] is not None:
        return None  # a job held the tick's key already: the tick is taken (the mark moved on)
    (added,) = store._added(rows, found, now, announce=True, states=states)
    return added


async def baseline(store: PostgresStore, name: str, tick: float) -> None:
    """Record ``tick`` as ``name``'s mark unless the schema has one (``add_tick`` with no job)."""
    store._open()
    name, tick = _checked(name, tick)
    await store._call(_baseline, name, tick)


async def ticks(store: PostgresStore) -> dict[str, float]:
    """Each schedule's mark, by name."""
    store._open()
    await trio.lowlevel.checkpoint_if_cancelled()
    return await store._call(_ticks)
