"""What every module of SQL transitions shares: cursors, unprepared statements, the finished hint.

Statements run through :func:`run`, unprepared but for one (see ``_transitions``), on
cursors that give tuples whatever row factory the connection (maybe the
caller's, for ``enqueue_tx``) has.
"""

from __future__ import annotations

from typing import Any

from psycopg.rows import tuple_row

from ..._model import JobNotFound

__all__ = ["NOTIFY_IDS", "TERMINAL", "cursor", "finished_notice", "not_found", "one", "one_row", "run"]

#: The terminal states, as the ``state`` column spells them.
TERMINAL = ("succeeded", "dead", "cancelled")
#: Bytes of job ids one "finished" notification carries (PostgreSQL's limit is 8000); past it, "*".
NOTIFY_IDS = 7000


def cursor(conn: Any) -> Any:
    """A cursor giving tuples, whatever row factory the connection (maybe the caller's) has."""
    return conn.cursor(row_factory=tuple_row)


def run(cur: Any, query: str, params: Any = None, *, prepare: bool = False) -> Any:
    """Execute ``query`` on ``cur``, unprepared unless ``prepare`` (on a pooled connection: see
    ``_transitions._succeed_all`` for the one statement that is); returns ``cur``."""
    cur.execute(query, params, prepare=prepare)
    return cur


def one_row(cur: Any) -> Any:
    """The row the statement just run returned (it always returns one)."""
    row = cur.fetchone()
    assert row is not None
    return row


def one(cur: Any) -> int:
    """The integer in the first column of the one row the statement returned."""
    return int(one_row(cur)[0])


def not_found(job_id: object) -> JobNotFound:
    return JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")


def finished_notice(done: str, *, named: bool = False) -> str:
    """SQL of a ``pg_notify(%s, %s || ids)``: the ``f|node|ids`` hint for the ids of CTE ``done`` (none if it
    is empty); its two parameters are the channel and ``"f|node|"`` (``named``: ``%(channel)s`` and
    ``%(finished)s``)."""
    channel, prefix = ("%(channel)s", "%(finished)s") if named else ("%s", "%s")
    return (
        f"(SELECT pg_notify({channel}, {prefix} || CASE WHEN sum(length(id) + 1) <= {NOTIFY_IDS}"
        f" THEN string_agg(id, ',') ELSE '*' END) FROM {done} HAVING count(*) > 0)"
    )
