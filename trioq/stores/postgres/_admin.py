"""The transitions an operator asks for by name: cancel and retry a job, pause and resume a queue.

Each is one transaction on one psycopg connection, as in ``_transitions``
(which re-exports them, so that it still names every transition).
"""

from __future__ import annotations

from typing import Any

from ..._model import InvalidJob, Job, JobState
from .._base import CancelResult
from . import _flows
from ._rows import COLUMNS, job_from_row
from ._sql import TERMINAL as _TERMINAL
from ._sql import cursor as _cur
from ._sql import not_found as _not_found
from ._sql import one_row as _row
from ._sql import run as _run

__all__ = ["cancel", "limit_usage", "nodes", "sweep_rates", "pause", "paused", "resume", "retry"]

#: A resume wakes at most this many workers (it counts the queue's ready jobs up to here).
_WAKE_AT_MOST = 1000


def cancel(
    conn: Any,
    s: str,
    job_id: str,
    now: float,
    channel: str,
    node: str,
    *,
    retried: bool = False,
    freed: set[str] | None = None,
    settled: _flows.Settled | None = None,
) -> tuple[CancelResult, int | None]:
    """Cancel a job not yet terminal: ``(result, epoch of the attempt stopped or None)``.

    A running job's cancel is announced (``c|node|job_id|epoch``) to every
    node in the same transaction, so the node running it stops the attempt;
    every cancel is announced as a finish (``f|node|job_id``). The cancelled
    row keeps the node that ran it (``node``), so a retried call can tell. ``freed`` gets the limit keys
    of the attempt stopped. A parent's waiting children are cancelled with it, and theirs
    (:func:`._flows.cascade`; ``settled`` gets their ids).
    """
    with conn.transaction(), _cur(conn) as cur:
        _run(
            cur,
            f"SELECT state, epoch, node, changed_at, limits, has_children FROM {s}.jobs WHERE id = %s FOR UPDATE",
            (job_id,),
        )
        found = cur.fetchone()
        if found is None:
            raise _not_found(job_id)
        state, epoch, ran_on, changed_at, keys, has_children = found
        _run(cur, f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = %s", (job_id,))
        if state in _TERMINAL:
            mine = retried and state == "cancelled" and changed_at == now
            running = epoch if mine and ran_on is not None else None
            if running is not None and freed is not None:
                freed.update(keys)
            return CancelResult(job_from_row(_row(cur)), mine), running
        running = epoch if state == "running" else None
        if freed is not None:
            # A running attempt's slots come free; a ready job's keys too, as it may have been let go
            # for a slot it now never takes (the next job in line gets it).
            freed.update(keys)
        _run(
            cur,
            f"UPDATE {s}.jobs SET state = 'cancelled', finished_at = %s, finish_seq = nextval('{s}.finish_seq'),"
            f" changed_at = %s, node = CASE WHEN state = 'running' THEN node END, unmet = NULL WHERE id = %s"
            f" RETURNING {COLUMNS}",
            (now, now, job_id),
        )
        job = job_from_row(_row(cur))
        notices = [f"f|{node}|{job_id}"]
        if running is not None:
            notices.append(f"c|{node}|{job_id}|{running}")
        _run(
            cur, "SELECT " + ", ".join("pg_notify(%s, %s)" for _ in notices), [v for n in notices for v in (channel, n)]
        )
        if has_children:
            moved = _flows.settle(cur, s, now, channel, node, (), [(job_id, "cancelled")])
            if settled is not None:
                settled += moved
    return CancelResult(job, True), running


def retry(conn: Any, s: str, job_id: str, now: float, notify: tuple[str, str], *, retried: bool = False) -> Job:
    """Send a dead or cancelled job back to ready, its attempts and snoozes reset and its deadline gone
    (an operator asked for it to run, however late); ``notify`` is sent if it is ready.

    A job with parents (``NewJob.after``) is refused (:class:`~trioq.InvalidJob`, ``field="after"``)
    while one of them is dead or cancelled, and goes ``waiting`` while one has not succeeded (its
    parents are locked first, as an add locks them: see ``_flows``). A parent's children cancelled
    because it ended wait again (:func:`._flows.revive`), in the same transaction.
    """
    with conn.transaction(), _cur(conn) as cur:
        _run(cur, f"SELECT parents FROM {s}.jobs WHERE id = %s", (job_id,))
        first = cur.fetchone()
        parents = list(first[0] or ()) if first is not None else []
        states = _flows.lock_parents(cur, s, parents)
        _run(
            cur,
            f"SELECT state, changed_at, attempts, has_children FROM {s}.jobs WHERE id = %s FOR UPDATE",
            (job_id,),
        )
        found = cur.fetchone()
        if found is None:
            raise _not_found(job_id)
        state, changed_at, attempts, has_children = found
        if retried and state in ("ready", "waiting") and changed_at == now and attempts == 0:
            return job_from_row(_row(_run(cur, f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = %s", (job_id,))))
        if state not in ("dead", "cancelled"):
            raise InvalidJob(f"job {job_id!r} is {state}; only dead or cancelled jobs can be retried", field="state")
        blocker = next((p for p in parents if states.get(p) in ("dead", "cancelled")), None)
        if blocker is not None:
            raise InvalidJob(
                f"job {job_id!r} waits for parent {blocker}, which is {states[blocker]}; "
                f"retry {blocker} first (its cancelled children then wait again)",
                field="after",
            )
        unmet = sum(1 for p in parents if p in states and states[p] != "succeeded")
        _run(
            cur,
            f"UPDATE {s}.jobs SET state = %s, unmet = %s, cancelled_by = NULL, attempts = 0,"
            " snoozes = 0, finished_at = NULL, finish_seq = NULL, result = NULL, run_at = %s, changed_at = %s,"
            " node = NULL, deadline = NULL, parked = NULL, parked_key = NULL"
            " WHERE id = %s"
            f" RETURNING {COLUMNS}",
            ("waiting" if unmet else "ready", unmet or None, now, now, job_id),
        )
        job = job_from_row(_row(cur))
        if job.state is JobState.READY:
            _run(cur, "SELECT pg_notify(%s, %s)", notify)
        if has_children:
            _flows.revive(cur, s, now, job_id)
    return job


# ------------------------------------------------------------- queues


def pause(conn: Any, s: str, queue: str, now: float, *, retried: bool = False) -> bool:
    """Pause ``queue`` for every node (a row in ``paused``, which every claim reads); whether it was
    running. Running attempts are left alone.

    The row keeps ``now`` (``paused_at``): a retried call whose first try
    committed unseen recognises its own row by it, and answers ``True`` as
    the first try would have.
    """
    with _cur(conn) as cur:
        _run(
            cur,
            f"WITH ins AS (INSERT INTO {s}.paused (queue, paused_at) VALUES (%s, %s) ON CONFLICT (queue) DO NOTHING"
            f" RETURNING 1) SELECT EXISTS (SELECT 1 FROM ins), (SELECT paused_at FROM {s}.paused WHERE queue = %s)",
            (queue, now, queue),
        )
        inserted, paused_at = _row(cur)
    return bool(inserted) or (retried and paused_at == now)


def resume(conn: Any, s: str, queue: str, channel: str, node: str) -> int | None:
    """Resume ``queue``: ``None`` if it was not paused, else how many workers to wake (its ready jobs,
    at least 1 and at most :data:`_WAKE_AT_MOST`), which every other node hears in the same statement
    (``r|node|n``) as it commits.

    A call retried after its connection broke answers ``None`` if its first
    try had committed unseen (the row it deleted leaves no trace); the
    queue is running either way.
    """
    with _cur(conn) as cur:
        _run(
            cur,
            f"WITH d AS (DELETE FROM {s}.paused WHERE queue = %s RETURNING queue),"
            # The queue's jobs in jobs_queue_ready order: a range ordered by the queue, as the claim reads
            # them (see _transitions.claim), so that no plan reads other queues' jobs to count these.
            f" n AS (SELECT greatest(count(*), 1) AS n FROM (SELECT 1 FROM {s}.jobs WHERE state = 'ready'"
            f"  AND parked IS NULL AND queue >= %s AND queue <= %s ORDER BY queue LIMIT {_WAKE_AT_MOST}) r)"
            " SELECT EXISTS (SELECT 1 FROM d), n.n, (SELECT pg_notify(%s, %s || n.n) FROM d) FROM n",
            (queue, queue, queue, channel, f"r|{node}|"),
        )
        was_paused, wake, _ = _row(cur)
    return int(wake) if was_paused else None


def paused(conn: Any, s: str) -> list[str]:
    """The paused queues' names, sorted as Python sorts strings (not by the database's collation)."""
    with _cur(conn) as cur:
        return sorted(row[0] for row in _run(cur, f"SELECT queue FROM {s}.paused").fetchall())


def nodes(conn: Any, s: str) -> list[tuple[str, float]]:
    """Every node with a lease row, by id: ``(id, expires_at)``. A row outlives its node until the
    rescue after ``expires_at`` deletes it; a node that never claimed (``workers=0``) has none."""
    with _cur(conn) as cur:
        rows = _run(cur, f"SELECT id, expires_at FROM {s}.nodes ORDER BY id").fetchall()
    return [(str(node), float(expires_at)) for node, expires_at in rows]


def limit_usage(conn: Any, s: str) -> dict[str, tuple[int, int, float | None]]:
    """Each limit key in use: ``(running attempts holding it, ready jobs parked for a free slot of
    it, its rate's theoretical arrival time or None)``; a key with none of the three is left out.

    For ``stats()``: it reads every running job's keys, the parked jobs' index and the rates' table,
    so it costs in proportion to the jobs running and parked, not to the backlog.
    """
    queries = (
        f"SELECT k, count(*) FROM {s}.jobs, unnest(limits) AS k"
        " WHERE state = 'running' AND limits <> '{}' GROUP BY k",
        f"SELECT parked_key, count(*) FROM {s}.jobs WHERE state = 'ready' AND parked_key IS NOT NULL"
        " AND parked = 'Infinity' GROUP BY parked_key",
        f"SELECT key, tat FROM {s}.limit_rates",
    )
    usage: dict[str, list[Any]] = {}
    with _cur(conn) as cur:
        for column, query in enumerate(queries):
            for key, value in _run(cur, query).fetchall():
                usage.setdefault(key, [0, 0, None])[column] = float(value) if column == 2 else int(value)
    return {key: (v[0], v[1], v[2]) for key, v in usage.items()}


def sweep_rates(conn: Any, s: str, cutoff: float) -> int:
    """Delete the rate states whose ``tat`` is at or before ``cutoff``; how many.

    A key whose ``tat`` has passed admits a start exactly as a key never used does, so its row only
    takes room (per-user keys would pile up forever). ``cutoff`` lies well before now, so that a
    node whose clock runs behind the sweeper's still finds the rows that matter to it. A claim that
    updates a row meanwhile is safe: the delete re-checks the row it finds updated, and a claim
    after the delete inserts the row again.
    """
    with _cur(conn) as cur:
        _run(cur, f"DELETE FROM {s}.limit_rates WHERE tat <= %s", (cutoff,))
        return int(cur.rowcount)
