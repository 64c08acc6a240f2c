"""The job state machine in SQL: each transition a function over one psycopg connection.

These run in worker threads (psycopg's sync API; its async one does not run
under trio). Each is one transaction: autocommit connections run a single
statement as its own, and ``conn.transaction()`` wraps the rest. Every
statement that acts for an attempt names its epoch in the ``WHERE`` clause,
so a stale attempt changes nothing. Rows are locked in id order where a
transaction locks several, against deadlocks between nodes.

Every limit a statement carries is a literal (a parameterised ``LIMIT``
planned a sequential scan at a large backlog), and connections never prepare
statements (a prepared completion got a generic nested-loop plan).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from typing import Any

from ..._model import (
    MAX_ERRORS_KEPT,
    MAX_SNOOZES,
    InvalidJob,
    Job,
    JobNotFound,
    JobState,
    QueueFull,
    error_text,
    storable_text,
)
from .._base import CancelResult, Failed, NewJob, Outcome, Released, Snoozed, Succeeded
from ._rows import COLUMNS, encode_errors, encode_result, job_from_row, loads

__all__ = [
    "Finished",
    "add",
    "cancel",
    "claim",
    "complete",
    "counts",
    "evict",
    "extend",
    "get",
    "jobs",
    "lead",
    "promote",
    "release_node",
    "rescue",
    "resign",
    "retry",
    "trim",
    "watched_terminal",
]

_TERMINAL = ("succeeded", "dead", "cancelled")
_STATE_NAMES = tuple(state.value for state in JobState)

#: Ids of the jobs a transition made terminal, oldest finish first (for hints).
Finished = list[str]


def key_hash(key: str) -> bytes:
    """What the unique index of idempotency keys holds for ``key``."""
    return hashlib.sha256(key.encode()).digest()


def _not_found(job_id: object) -> JobNotFound:
    return JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")


# ---------------------------------------------------------------- add


def add(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    max_pending: int | None,
    notify: tuple[str, str] | None,
) -> list[Job | None]:
    """Insert ``rows`` (``(id, job, payload JSON)``) all or nothing; ``None`` for each job inserted,
    the holder's snapshot for a key already held (or an id inserted by an earlier try of this call).

    ``notify``: ``(channel, payload)`` of a NOTIFY sent in the same
    transaction. Raises :class:`~trioq.QueueFull` past ``max_pending``.
    """
    ids = [r[0] for r in rows]
    keys = [r[1].key for r in rows]
    hashes = [None if key is None else key_hash(key) for key in keys]
    with conn.transaction(), conn.cursor() as cur:
        if max_pending is not None:
            # Adds that check the bound take turns: two at once could both see room.
            cur.execute(f"SELECT n FROM {s}.counters WHERE id = 2 FOR UPDATE")
            cur.execute(f"SELECT count(*) FROM {s}.jobs WHERE state IN ('ready', 'scheduled')")
            pending = _one(cur)
            wanted = [h for h in hashes if h is not None]
            held: set[bytes] = set()
            if wanted:
                cur.execute(f"SELECT key_hash FROM {s}.jobs WHERE key_hash = ANY(%s)", (wanted,))
                held = {bytes(row[0]) for row in cur.fetchall()}
            fresh = len(set(wanted) - held) + sum(1 for k in keys if k is None)
            if fresh and pending + fresh > max_pending:
                raise QueueFull(
                    f"queue is full: {pending} jobs waiting, max_ready={max_pending}; retry later", retry_after=1.0
                )
        cur.execute(
            f"INSERT INTO {s}.jobs"
            " (id, task, payload, state, priority, key, key_hash, max_attempts, run_at, created_at)"
            " SELECT u.id, u.task, u.payload::json, CASE WHEN u.delay > 0 THEN 'scheduled' ELSE 'ready' END,"
            "  u.priority, u.key, u.key_hash, u.max_attempts, %s + u.delay, %s"
            " FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::bytea[], %s::bigint[],"
            "  %s::float8[]) WITH ORDINALITY"
            "  AS u(id, task, payload, priority, key, key_hash, max_attempts, delay, ord)"
            " ORDER BY u.ord"
            " ON CONFLICT DO NOTHING RETURNING id",
            (
                now,
                now,
                ids,
                [r[1].task for r in rows],
                [r[2] for r in rows],
                [r[1].priority for r in rows],
                keys,
                hashes,
                [r[1].max_attempts for r in rows],
                [r[1].delay for r in rows],
            ),
        )
        inserted = {row[0] for row in cur.fetchall()}
        out: list[Job | None] = [None] * len(rows)
        missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
        if missing:
            wanted_ids = [ids[i] for i in missing]
            wanted_hashes = [hashes[i] for i in missing if hashes[i] is not None]
            cur.execute(
                f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = ANY(%s)"
                f" UNION ALL SELECT {COLUMNS} FROM {s}.jobs WHERE key_hash = ANY(%s)",
                (wanted_ids, wanted_hashes),
            )
            found = [job_from_row(row) for row in cur.fetchall()]
            by_id = {job.id: job for job in found}
            by_key = {job.key: job for job in found if job.key is not None}
            for i in missing:
                job = by_id.get(ids[i])
                key = keys[i]
                if job is None and key is not None:
                    job = by_key.get(key)
                if job is None:  # pragma: no cover - a conflict with a row no longer there
                    raise RuntimeError(f"job {ids[i]} conflicted with a row that is gone; retry the enqueue")
                out[i] = job
        if notify is not None and inserted:
            cur.execute("SELECT pg_notify(%s, %s)", notify)
    return out


# -------------------------------------------------------------- claim


def claim(conn: Any, s: str, node: str, limit: int, lease_until: float | None, token: str, recover: bool) -> list[Job]:
    """Claim up to ``limit`` ready jobs for ``node`` under new epochs, marked with ``token``.

    ``lease_until``: also push the node's lease out to at least then (``None``:
    the node's row is known to reach past it). ``recover``: an earlier try of
    this claim may have committed (its connection broke): the jobs it claimed,
    if any, are returned instead of claiming more.
    """
    with conn.cursor() as cur:
        if recover:
            cur.execute(
                f"SELECT {COLUMNS} FROM {s}.jobs WHERE state = 'running' AND node = %s AND claim = %s", (node, token)
            )
            recovered = [job_from_row(row) for row in cur.fetchall()]
            if recovered:
                return _claim_order(recovered)
        lease = ""
        params: list[Any] = []
        if lease_until is not None:
            lease = (
                f"n AS (INSERT INTO {s}.nodes (id, expires_at) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
                f" SET expires_at = greatest({s}.nodes.expires_at, excluded.expires_at)), "
            )
            params += [node, lease_until]
        cur.execute(
            f"WITH {lease}c AS MATERIALIZED (SELECT id FROM {s}.jobs WHERE state = 'ready'"
            f"  ORDER BY priority DESC, run_at, seq LIMIT {int(limit)} FOR UPDATE SKIP LOCKED)"
            f" UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1, node = %s, claim = %s"
            f" FROM c WHERE j.id = c.id RETURNING {_qualified('j')}, j.seq",
            (*params, node, token),
        )
        rows = cur.fetchall()
    rows.sort(key=lambda row: (-row[6], row[9], row[15]))
    return [job_from_row(row) for row in rows]


def _claim_order(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda job: (-job.priority, job.run_at))


def _qualified(alias: str) -> str:
    """:data:`COLUMNS` of the table under ``alias``."""
    return ", ".join(f"{alias}.{column.strip()}" for column in COLUMNS.split(","))


# ------------------------------------------------------------- extend


def extend(conn: Any, s: str, node: str, held: Sequence[tuple[str, int]], until: float) -> list[bool]:
    """Renew ``node``'s lease to ``until``; for each of ``held``, whether its epoch still runs the job."""
    with conn.cursor() as cur:
        cur.execute(
            f"WITH n AS (INSERT INTO {s}.nodes (id, expires_at) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
            "  SET expires_at = excluded.expires_at)"
            f" SELECT u.ord FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY AS u(id, epoch, ord)"
            f" JOIN {s}.jobs j ON j.id = u.id AND j.epoch = u.epoch AND j.state = 'running'",
            (node, until, [h[0] for h in held], [h[1] for h in held]),
        )
        holding = {row[0] for row in cur.fetchall()}
    return [i + 1 in holding for i in range(len(held))]


# ----------------------------------------------------------- complete


def complete(
    conn: Any, s: str, outcomes: Sequence[Outcome], now: float
) -> tuple[list[JobState | None], Finished, int, list[float]]:
    """Apply ``outcomes`` in order; ``(states, finished ids, retained count after or -1, run_at of each job
    scheduled again)``.

    A batch of successes of distinct jobs is one statement; any other batch
    locks its jobs' rows (in id order), applies each outcome as the in-process
    table would, and writes the rows back.
    """
    ids = [o.job_id for o in outcomes]
    if all(type(o) is Succeeded for o in outcomes) and len(set(ids)) == len(ids):
        fast = _succeed_all(conn, s, outcomes, now)  # type: ignore[arg-type]
        if fast is not None:
            return fast
    return _apply_all(conn, s, outcomes, now)


def _succeed_all(
    conn: Any, s: str, outcomes: Sequence[Succeeded], now: float
) -> tuple[list[JobState | None], Finished, int, list[float]] | None:
    """Succeed distinct jobs in one statement; ``None`` when a result is unstorable (the general path fails it)."""
    results: list[str | None] = []
    for o in outcomes:
        try:
            results.append(encode_result(o.result))
        except InvalidJob:
            return None
    with conn.cursor() as cur:
        cur.execute(
            f"WITH u AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[]) WITH ORDINALITY"
            "   AS u(id, epoch, result, ord)),"
            f" s AS (SELECT o.id, o.epoch, o.result, o.ord, nextval('{s}.finish_seq') AS fseq"
            "   FROM (SELECT * FROM u ORDER BY ord) o),"
            f" done AS (UPDATE {s}.jobs j SET state = 'succeeded', attempts = j.attempts + 1,"
            "   result = s.result::json, error = NULL, finished_at = %s, finish_seq = s.fseq, node = NULL"
            "   FROM s WHERE j.id = s.id AND j.epoch = s.epoch AND j.state = 'running' RETURNING s.ord),"
            f" bump AS (UPDATE {s}.counters SET n = n + (SELECT count(*) FROM done) WHERE id = 1 RETURNING n)"
            " SELECT (SELECT n FROM bump), ARRAY(SELECT ord FROM done ORDER BY ord)",
            ([o.job_id for o in outcomes], [o.epoch for o in outcomes], results, now),
        )
        row = cur.fetchone()
    assert row is not None
    done = set(row[1])
    states: list[JobState | None] = [JobState.SUCCEEDED if i + 1 in done else None for i in range(len(outcomes))]
    finished = [outcomes[i - 1].job_id for i in sorted(done)]
    return states, finished, int(row[0]), []


_ROW = "id, state, epoch, attempts, max_attempts, errors::text, snoozes, run_at, finished_at, result::text, error"


def _apply_all(
    conn: Any, s: str, outcomes: Sequence[Outcome], now: float
) -> tuple[list[JobState | None], Finished, int, list[float]]:
    scheduled: list[float] = []
    ids = sorted({o.job_id for o in outcomes if isinstance(o.job_id, str)})
    states: list[JobState | None] = []
    finished: Finished = []
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            f"SELECT {_ROW} FROM {s}.jobs WHERE id = ANY(%s) AND state = 'running' ORDER BY id FOR UPDATE", (ids,)
        )
        rows: dict[str, dict[str, Any]] = {}
        for r in cur.fetchall():
            rows[r[0]] = {
                "state": r[1], "epoch": r[2], "attempts": r[3], "max_attempts": r[4],
                "errors": [] if r[5] is None else loads(r[5]), "snoozes": r[6], "run_at": r[7],
                "finished_at": r[8], "result": r[9], "error": r[10], "changed": False,
            }  # fmt: skip
        for outcome in outcomes:
            row = rows.get(outcome.job_id) if isinstance(outcome.job_id, str) else None
            if row is None or row["state"] != "running" or row["epoch"] != outcome.epoch:
                states.append(None)
                continue
            _apply(row, outcome, now)
            row["changed"] = True
            state = row["state"]
            states.append(JobState(state))
            if state in _TERMINAL:
                row["order"] = len(finished)
                finished.append(outcome.job_id)
            elif state == "scheduled":
                scheduled.append(row["run_at"])
        changed = [(job_id, row) for job_id, row in rows.items() if row["changed"]]
        retained = -1
        if changed:
            seqs: list[int | None] = [None] * len(changed)
            if finished:
                cur.execute(f"SELECT nextval('{s}.finish_seq') FROM generate_series(1, {len(finished)})")
                block = [r[0] for r in cur.fetchall()]
                for i, (_, row) in enumerate(changed):
                    if "order" in row:
                        seqs[i] = block[row["order"]]
            cur.execute(
                f"UPDATE {s}.jobs j SET state = u.state, attempts = u.attempts, errors = u.errors::json,"
                " snoozes = u.snoozes, run_at = u.run_at, finished_at = u.finished_at, finish_seq = u.fseq,"
                " result = u.result::json, error = u.error, node = CASE WHEN u.state = 'running' THEN j.node END"
                " FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::int[], %s::float8[],"
                "  %s::float8[], %s::bigint[], %s::text[], %s::text[])"
                "  AS u(id, state, attempts, errors, snoozes, run_at, finished_at, fseq, result, error)"
                " WHERE j.id = u.id",
                (
                    [c[0] for c in changed],
                    [c[1]["state"] for c in changed],
                    [c[1]["attempts"] for c in changed],
                    [encode_errors(c[1]["errors"]) if c[1]["errors"] else None for c in changed],
                    [c[1]["snoozes"] for c in changed],
                    [c[1]["run_at"] for c in changed],
                    [c[1]["finished_at"] for c in changed],
                    seqs,
                    [c[1]["result"] for c in changed],
                    [c[1]["error"] for c in changed],
                ),
            )
            if finished:
                cur.execute(f"UPDATE {s}.counters SET n = n + %s WHERE id = 1 RETURNING n", (len(finished),))
                retained = _one(cur)
    return states, finished, retained, scheduled


def _apply(row: dict[str, Any], outcome: Outcome, now: float) -> None:
    """Apply one outcome to a locked row's values, as :class:`~trioq.stores.table.jobs.JobTable` does."""
    kind = type(outcome)
    if kind is Succeeded:
        try:
            result = encode_result(outcome.result)  # type: ignore[union-attr]
        except InvalidJob as exc:  # a result it cannot hold: it will never succeed
            _fail(row, error_text(exc), None, None, now)
            return
        row["attempts"] += 1
        row["result"], row["error"] = result, None
        row["state"], row["finished_at"] = "succeeded", now
    elif kind is Failed:
        assert isinstance(outcome, Failed)
        retry_at = None if outcome.retry_in is None else now + _delay(outcome.retry_in)
        traceback = None if outcome.traceback is None else storable_text(outcome.traceback)
        _fail(row, storable_text(outcome.error), traceback, retry_at, now)
    elif kind is Released:
        row["state"] = "ready"
    elif kind is Snoozed:
        assert isinstance(outcome, Snoozed)
        run_at = now + _delay(outcome.delay)
        if row["snoozes"] >= MAX_SNOOZES:
            error = f"SnoozeLimit: the job snoozed {MAX_SNOOZES} times; retry it to start over"
            _fail(row, error, None, None, now)
            return
        row["snoozes"] += 1
        row["run_at"] = run_at
        row["state"] = "scheduled" if run_at > now else "ready"
    else:
        raise TypeError(f"not a trioq.stores outcome: {kind.__name__}")


def _fail(row: dict[str, Any], error: str, traceback: str | None, retry_at: float | None, now: float) -> None:
    row["attempts"] += 1
    row["error"] = error
    errors = row["errors"]
    errors.append([row["attempts"], error, traceback, now])
    del errors[:-MAX_ERRORS_KEPT]
    if retry_at is None or row["attempts"] >= row["max_attempts"]:
        row["state"], row["finished_at"] = "dead", now
    else:
        row["run_at"] = retry_at
        row["state"] = "scheduled" if retry_at > now else "ready"


def _delay(seconds: float) -> float:
    """An outcome's delay; a negative one is none. Anything but a finite number is the runtime's bug."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise ValueError(f"an outcome's delay must be a finite number, got {seconds!r}")
    return max(float(seconds), 0.0)


# --------------------------------------------------------- retention


def trim(conn: Any, s: str, excess: int) -> list[str]:
    """Drop the ``excess`` oldest terminal jobs (those another transaction holds are left to the next trim)."""
    if excess <= 0:
        return []
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            f"WITH gone AS (DELETE FROM {s}.jobs WHERE id IN (SELECT id FROM {s}.jobs"
            f"  WHERE finish_seq IS NOT NULL ORDER BY finish_seq LIMIT {int(excess)} FOR UPDATE SKIP LOCKED)"
            "  RETURNING id)"
            f" UPDATE {s}.counters SET n = n - (SELECT count(*) FROM gone) WHERE id = 1"
            " RETURNING ARRAY(SELECT id FROM gone)"
        )
        row = cur.fetchone()
    return [] if row is None else list(row[0])


def evict(conn: Any, s: str, cutoff: float, max_retained: int, batch: int = 1000) -> list[str]:
    """Drop terminal jobs oldest finish first while they finished at or before ``cutoff`` or are beyond
    ``max_retained``, stopping at the first that is neither (as the in-process table does); their ids."""
    evicted: list[str] = []
    while True:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(f"SELECT n FROM {s}.counters WHERE id = 1")
            retained = _one(cur)
            cur.execute(
                f"SELECT id, finished_at FROM {s}.jobs WHERE finish_seq IS NOT NULL ORDER BY finish_seq"
                f" LIMIT {int(batch)} FOR UPDATE SKIP LOCKED"
            )
            oldest = cur.fetchall()
            gone: list[str] = []
            for job_id, finished_at in oldest:
                if retained - len(gone) <= max_retained and finished_at > cutoff:
                    break
                gone.append(job_id)
            if gone:
                cur.execute(f"DELETE FROM {s}.jobs WHERE id = ANY(%s)", (gone,))
                cur.execute(f"UPDATE {s}.counters SET n = n - %s WHERE id = 1", (cur.rowcount,))
        evicted += gone
        if len(gone) < len(oldest) or len(oldest) < batch:
            return evicted


# --------------------------------------------------- cancel and retry


def cancel(conn: Any, s: str, job_id: str, now: float, channel: str, node: str) -> tuple[CancelResult, int | None, int]:
    """Cancel a job not yet terminal: ``(result, epoch of the attempt stopped or None, retained after)``.

    A running job's cancel is announced (``c|node|id|epoch``) to every node in
    the same transaction, so the node running it stops the attempt.
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT state, epoch FROM {s}.jobs WHERE id = %s FOR UPDATE", (job_id,))
        found = cur.fetchone()
        if found is None:
            raise _not_found(job_id)
        if found[0] in _TERMINAL:
            cur.execute(f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = %s", (job_id,))
            return CancelResult(job_from_row(_row(cur)), False), None, -1
        cur.execute(
            f"UPDATE {s}.jobs SET state = 'cancelled', finished_at = %s, finish_seq = nextval('{s}.finish_seq'),"
            f" node = NULL WHERE id = %s RETURNING {COLUMNS}",
            (now, job_id),
        )
        job = job_from_row(_row(cur))
        cur.execute(f"UPDATE {s}.counters SET n = n + 1 WHERE id = 1 RETURNING n")
        retained = _one(cur)
        running = found[1] if found[0] == "running" else None
        if running is not None:
            cur.execute("SELECT pg_notify(%s, %s)", (channel, f"c|{node}|{job_id}|{running}"))
    return CancelResult(job, True), running, retained


def retry(conn: Any, s: str, job_id: str, now: float, notify: tuple[str, str]) -> Job:
    """Send a dead or cancelled job back to ready, its attempts and snoozes reset."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT state FROM {s}.jobs WHERE id = %s FOR UPDATE", (job_id,))
        found = cur.fetchone()
        if found is None:
            raise _not_found(job_id)
        if found[0] not in ("dead", "cancelled"):
            raise InvalidJob(f"job {job_id!r} is {found[0]}; only dead or cancelled jobs can be retried", field="state")
        cur.execute(
            f"UPDATE {s}.jobs SET state = 'ready', attempts = 0, snoozes = 0, finished_at = NULL,"
            f" finish_seq = NULL, result = NULL, run_at = %s WHERE id = %s RETURNING {COLUMNS}",
            (now, job_id),
        )
        job = job_from_row(_row(cur))
        cur.execute(f"UPDATE {s}.counters SET n = n - 1 WHERE id = 1")
        cur.execute("SELECT pg_notify(%s, %s)", notify)
    return job


# ---------------------------------------------- promote, rescue, nodes


def promote(conn: Any, s: str, now: float, batch: int = 1000) -> tuple[int, float | None]:
    """Make due scheduled jobs ready; ``(how many, the next run_at still waiting)``."""
    total = 0
    with conn.cursor() as cur:
        while True:
            cur.execute(
                f"UPDATE {s}.jobs SET state = 'ready' WHERE id IN (SELECT id FROM {s}.jobs"
                f" WHERE state = 'scheduled' AND run_at <= %s ORDER BY run_at LIMIT {int(batch)}"
                " FOR UPDATE SKIP LOCKED)",
                (now,),
            )
            total += cur.rowcount
            if cur.rowcount < batch:
                break
        cur.execute(f"SELECT min(run_at) FROM {s}.jobs WHERE state = 'scheduled'")
        nxt = _row(cur)[0]
    return total, nxt


def rescue(conn: Any, s: str, now: float) -> int:
    """Put the running jobs of every node whose lease lapsed back to ready (uncounted); forget those nodes."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT id FROM {s}.nodes WHERE expires_at < %s ORDER BY id FOR UPDATE SKIP LOCKED", (now,))
        lapsed = [row[0] for row in cur.fetchall()]
        if not lapsed:
            return 0
        cur.execute(
            f"UPDATE {s}.jobs SET state = 'ready', node = NULL WHERE state = 'running' AND node = ANY(%s)", (lapsed,)
        )
        rescued = int(cur.rowcount)
        cur.execute(f"DELETE FROM {s}.nodes WHERE id = ANY(%s)", (lapsed,))
    return rescued


def release_node(conn: Any, s: str, node: str) -> int:
    """Put ``node``'s running jobs back to ready (its session ends) and forget the node."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"UPDATE {s}.jobs SET state = 'ready', node = NULL WHERE state = 'running' AND node = %s", (node,))
        released = int(cur.rowcount)
        cur.execute(f"DELETE FROM {s}.nodes WHERE id = %s", (node,))
    return released


def lead(conn: Any, s: str, node: str, now: float, ttl: float) -> bool:
    """Take or keep the leader's row for ``ttl`` seconds if it is free, lapsed or ``node``'s; whether ``node`` leads."""
    with conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO {s}.leader (name, node, expires_at) VALUES ('leader', %s, %s) ON CONFLICT (name) DO UPDATE"
            f" SET node = excluded.node, expires_at = excluded.expires_at"
            f" WHERE {s}.leader.node = excluded.node OR {s}.leader.expires_at < %s RETURNING node",
            (node, now + ttl, now),
        )
        return cur.fetchone() is not None


def resign(conn: Any, s: str, node: str) -> None:
    """Give up the leader's row if ``node`` holds it (a clean shutdown: another node takes over at once)."""
    with conn.cursor() as cur:
        cur.execute(f"DELETE FROM {s}.leader WHERE node = %s", (node,))


# ------------------------------------------------------------- views


def get(conn: Any, s: str, job_id: str) -> Job:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = %s", (job_id,))
        row = cur.fetchone()
    if row is None:
        raise _not_found(job_id)
    return job_from_row(row)


def watched_terminal(conn: Any, s: str, ids: Sequence[str]) -> list[Job]:
    """Snapshots of those of ``ids`` that are terminal now."""
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = ANY(%s) AND state IN ('succeeded', 'dead', 'cancelled')",
            (list(ids),),
        )
        return [job_from_row(row) for row in cur.fetchall()]


def counts(conn: Any, s: str) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT state, count(*) FROM {s}.jobs GROUP BY state")
        found = dict(cur.fetchall())
    return {name: int(found.get(name, 0)) for name in sorted(_STATE_NAMES)}


def jobs(conn: Any, s: str, states: Collection[JobState], limit: int) -> list[Job]:
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT {COLUMNS} FROM {s}.jobs WHERE state = ANY(%s) ORDER BY seq LIMIT {int(limit)}",
            ([JobState(state).value for state in states],),
        )
        return [job_from_row(row) for row in cur.fetchall()]


def _one(cur: Any) -> int:
    return int(_row(cur)[0])


def _row(cur: Any) -> Any:
    row = cur.fetchone()
    assert row is not None
    return row
