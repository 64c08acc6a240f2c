"""Flows in SQL (``NewJob.after``; the rules are in its docstring): the add of jobs with parents, and the
moves a parent's end makes of its children.

The columns (migration 4): a child keeps its parents' ids (``parents``), while
it waits how many of them have not succeeded (``unmet``), and once a parent's
death or cancel cancelled it, that parent (``cancelled_by``). ``flow_edges``
holds the other direction, ``(parent, child)``, for each parent that had not
succeeded when the child was added. A parent that some job names has
``has_children`` set.

Why a parent's end never misses a child added at the same instant: the add
locks each parent row (``FOR NO KEY UPDATE``, in id order) and writes it
(``has_children``) before it reads the parent's state; every transition that
ends a job locks its row first. So either the transition locks first (the add
waits, and reads the parent's end), or the add does, and the transition's lock
waits for its commit. A transition's statement reads other rows (the
children, the edges) as of its start, though, and a statement that began
before the add committed holds neither the child nor its edge. The success of
a parent (``_transitions._succeed_all``, one statement with its children's
release) therefore compares the parent's row as it locked it with the row its
snapshot holds: the add's write made them differ (a running parent's row is
written by every add, see :func:`lock_parents`), and such a parent is left to
the general path, whose later statements see the add's rows. A retry or a
revive that makes a child wait again on a running parent locks and writes it
the same way. A job without children costs one column in the lock.

Two parents of one child ending at once on two nodes each decrement the
child's ``unmet`` in an ``UPDATE``, which locks the child's row: the second
waits and re-reads the row the first wrote, so the count never skips and the
child is released exactly once. Rows are locked parents before children, and
each level's children in id order; a deadlock that a tangle of flows still
makes is PostgreSQL's to break (the loser's call is retried, see
``store._run``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..._model import InvalidJob, Job, JobState
from ..._validate import where as _where
from .._base import NewJob
from ..table.flows import parent_failed
from ..table.store import _parents
from ._rows import COLUMNS, encode_limits, job_from_row, loads
from ._sql import cursor as _cur
from ._sql import finished_notice as _finished_notice
from ._sql import one_row as _row
from ._sql import run as _run

__all__ = [
    "Settled",
    "add",
    "cascade",
    "lock_parents",
    "release",
    "results",
    "revive",
    "settle",
    "unknown_parent",
]

#: Tries of a flow add that met a concurrent add of one of its keys (each try in a savepoint).
_KEY_TRIES = 5
_ENDED = ("dead", "cancelled")


@attrs.define
class Settled:
    """What the moves of children did in one transition: jobs made ready (their NOTIFY went out in the
    transition), the ``run_at`` of each made scheduled, the ids of those cancelled (announced as
    finished in the transition too), how many parents' ends :func:`settle` moved children for, and the
    children claimed for the node."""

    ready: int = 0
    scheduled: list[float] = attrs.Factory(list)
    cancelled: list[str] = attrs.Factory(list)
    parents: int = 0
    #: Children claimed for the completing node in the transition (see ``_handoff.Take``), best first, and
    #: their parents' results (``{parent id: result}``, as :func:`results` answers).
    claimed: list[Job] = attrs.Factory(list)
    results: dict[str, Any] = attrs.Factory(dict)

    def __iadd__(self, other: Settled) -> Settled:
        self.ready += other.ready
        self.scheduled += other.scheduled
        self.cancelled += other.cancelled
        self.parents += other.parents
        self.claimed += other.claimed
        self.results.update(other.results)
        return self


def unknown_parent(parent_id: str, field: str = "after") -> InvalidJob:
    """The refusal of a parent the store does not hold."""
    return InvalidJob(
        f"{field}: parent job {parent_id!r} is not in this store (never enqueued, or evicted after retention); "
        "a parent must exist before its children are enqueued",
        field=field,
    )


def lock_parents(cur: Any, s: str, ids: Sequence[str]) -> dict[str, str]:
    """Lock the rows of ``ids`` (``FOR NO KEY UPDATE``, in id order) and write each that is running or not
    yet marked (``has_children`` set); each found id's state (an id missing is left out).

    The write gives a running parent's row a new version: a completion whose statement began before
    this transaction commits sees that its lock got a newer row than its snapshot holds, and leaves the
    parent to the general path (see the module docstring). A parent in any other state cannot be
    claimed (nor completed) until this transaction ends: no claim takes a locked row.
    """
    if not ids:
        return {}
    _run(
        cur,
        f"WITH lk AS (SELECT id, state, has_children FROM {s}.jobs WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE),"
        f" m AS (UPDATE {s}.jobs j SET has_children = true FROM lk WHERE j.id = lk.id"
        "  AND (lk.has_children IS NULL OR lk.state = 'running'))"
        " SELECT id, state FROM lk",
        (sorted(set(ids)),),
    )
    return dict(cur.fetchall())


# ---------------------------------------------------------------- add


class _KeyRace(Exception):
    """A key this add meant to take was taken by a concurrent add meanwhile: try again."""


def add(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    max_pending: int | None,
    defer_past: int | None,
    notify: tuple[str, str] | None,
    *,
    retried: bool = False,
    check: Callable[[list[Job], list[bool]], object] | None = None,
) -> tuple[list[Job], list[bool]]:
    """Insert ``rows`` (``(id, job, payload JSON)``, some with ``after``) all or nothing, in one transaction
    (the caller's, for ``enqueue_tx``); ``(each row's snapshot, whether it was inserted)`` (a row whose key
    another job holds answers with that job, as :func:`_transitions.add` does).

    Each job's state follows ``NewJob.after``: ``cancelled`` (a parent dead or cancelled), ``waiting``
    (a parent not succeeded yet), else as a plain add (``ready``, ``scheduled``, or under
    ``defer_past`` deferred while the bound is reached; the deferred backlog is not admitted first, as
    a plain add does, but by the next claim or promote). ``max_pending`` counts only the jobs that will
    be pending. ``notify``: ``(channel, "r|node|")`` of the NOTIFY sent when jobs are ready (the count is
    appended). Raises :class:`~trioq.InvalidJob` (``field`` ``after``, or ``jobs[i].after``) for a parent
    the store does not hold, or an ``after`` entry that names no earlier job of the batch. ``check``: called
    with that answer before the transaction ends; what it raises undoes the add.
    """
    ids = [r[0] for r in rows]
    with _cur(conn) as cur:
        if retried and _run(cur, f"SELECT 1 FROM {s}.jobs WHERE id = ANY(%s) LIMIT 1", (ids,)).fetchone():
            # The first try committed (all or nothing): each row is in, or its key's holder answers.
            effective = _resolve(rows, _key_holders(cur, s, rows))[0]
            return _read_back(cur, s, rows, effective, {e for e, r in zip(effective, rows, strict=True) if e == r[0]})
        for _ in range(_KEY_TRIES):
            try:
                with conn.transaction():
                    done = _add(cur, s, rows, now, max_pending, defer_past, notify)
                    if check is not None:
                        check(*done)
                    return done
            except _KeyRace:
                continue
    raise RuntimeError("the idempotency keys of this batch kept being taken by concurrent enqueues; enqueue again")


def _key_holders(cur: Any, s: str, rows: Sequence[tuple[str, NewJob, str]]) -> dict[str, str]:
    """Key -> the id of the job holding it now, for the keys of ``rows``."""
    from ._transitions import key_hash

    keys = {r[1].key for r in rows if r[1].key is not None}
    if not keys:
        return {}
    by_hash = {key_hash(k): k for k in keys}
    _run(cur, f"SELECT key_hash, id FROM {s}.jobs WHERE key_hash = ANY(%s)", (list(by_hash),))
    return {by_hash[bytes(h)]: job_id for h, job_id in cur.fetchall()}


def _resolve(
    rows: Sequence[tuple[str, NewJob, str]], holders: dict[str, str]
) -> tuple[list[str], list[bool], list[tuple[str, ...]]]:
    """Each row's effective id (its key's holder's, an earlier row's of the same key, or its own), whether
    it is to be inserted, and its parents as ids (``after`` resolved: see ``table.store._parents``)."""
    effective: list[str] = []
    fresh: list[bool] = []
    parents: list[tuple[str, ...]] = []
    taken = dict(holders)
    own = {r[0] for r in rows}
    for i, (job_id, job, _) in enumerate(rows):
        where = _where(i if len(rows) > 1 else None)
        for p in job.after:
            # The id of a job of this very batch (its own, or one the caller predicted): not in the store
            # before the batch, as the other stores find it (an earlier job of the batch is named by index).
            if type(p) is str and p in own:
                raise unknown_parent(p, f"{where}after")
        parents.append(_parents(job, i, effective, where) if job.after else ())
        key = job.key
        if key is not None and key in taken:
            effective.append(taken[key])
            fresh.append(False)
            continue
        if key is not None:
            taken[key] = job_id
        effective.append(job_id)
        fresh.append(True)
    return effective, fresh, parents


def _add(
    cur: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    max_pending: int | None,
    defer_past: int | None,
    notify: tuple[str, str] | None,
) -> tuple[list[Job], list[bool]]:
    """One try of :func:`add`, in a transaction (a savepoint) of the caller's."""
    from . import _defer
    from ._transitions import _admit, key_hash

    holders = _key_holders(cur, s, rows)
    effective, fresh, parents = _resolve(rows, holders)
    mine = {job_id for job_id, new in zip(effective, fresh, strict=True) if new}
    # Every parent must be held, a row's whose key finds a job too (the other stores check the
    # batch's parents before its keys: a request naming an unknown parent is refused either way).
    named = {p for ps in parents for p in ps if p not in mine}
    states = lock_parents(cur, s, sorted(named))
    for i, ps in enumerate(parents):
        for p in ps:
            if p not in mine and p not in states:
                raise unknown_parent(p, f"{_where(i if len(rows) > 1 else None)}after")
    # Each new row's state, in batch order (a parent of the batch is decided before its children).
    state_of: dict[str, str] = dict(states)
    row_state: list[str] = []
    unmet: list[int | None] = []
    blocked: list[str | None] = []
    errors: list[str | None] = []
    plain: list[int] = []
    for i, (job_id, job, _) in enumerate(rows):
        if not fresh[i]:
            row_state.append("")
            unmet.append(None)
            blocked.append(None)
            errors.append(None)
            continue
        blocker: str | None = None
        count = 0
        for p in parents[i]:
            st = state_of[p]
            if st in _ENDED:
                blocker = blocker or p
            elif st != "succeeded":
                count += 1
        if blocker is not None:
            st = "cancelled"
            errors.append(parent_failed(blocker, JobState(state_of[blocker])))
        else:
            st = "waiting" if count else ("scheduled" if job.delay > 0 else "ready")
            errors.append(None)
            if not count:
                plain.append(i)
        row_state.append(st)
        unmet.append(count if st == "waiting" else None)
        blocked.append(blocker)
        state_of[job_id] = st
    hashes = [None if r[1].key is None else key_hash(r[1].key) for r in rows]
    if max_pending is not None and plain:  # only the jobs that will be pending count, or are counted
        _admit(cur, s, [rows[i] for i in plain], [hashes[i] for i in plain], max_pending)
    if defer_past is not None and plain:
        deferred, pending = _row(_run(cur, f"SELECT {_defer._probe(s)}, {_defer._count(s, defer_past)}"))
        pending = int(pending)
        for i in plain:
            if deferred or pending >= defer_past:
                row_state[i] = "deferred"
                deferred = True
            else:
                pending += 1
    has_children = {p for ps in parents for p in ps}
    todo = [i for i in range(len(rows)) if fresh[i]]
    _run(
        cur,
        f"WITH ins AS (INSERT INTO {s}.jobs"
        " (id, task, payload, state, priority, key, key_hash, max_attempts, run_at, created_at, queue, tenant,"
        "  deadline, limits, parents, unmet, cancelled_by, error, finished_at, finish_seq, changed_at, has_children)"
        " SELECT u.id, u.task, u.payload::json, u.state, u.priority, u.key, u.key_hash, u.max_attempts,"
        "  %s + u.delay, %s, u.queue, u.tenant, %s + u.deadline, coalesce(u.limits::text[], '{}'),"
        "  u.parents::text[], u.unmet, u.blocked, u.error,"
        "  CASE WHEN u.state = 'cancelled' THEN %s END,"
        f"  CASE WHEN u.state = 'cancelled' THEN nextval('{s}.finish_seq') END,"
        "  CASE WHEN u.state = 'cancelled' THEN %s END, u.has_children"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::bytea[],"
        "  %s::bigint[], %s::float8[], %s::text[], %s::text[], %s::float8[], %s::text[], %s::text[], %s::int[],"
        "  %s::text[], %s::text[], %s::boolean[]) WITH ORDINALITY"
        "  AS u(id, task, payload, state, priority, key, key_hash, max_attempts, delay, queue, tenant, deadline,"
        "  limits, parents, unmet, blocked, error, has_children, ord)"
        " ORDER BY u.ord ON CONFLICT DO NOTHING RETURNING id)"
        " SELECT ARRAY(SELECT id FROM ins)",
        (
            now,
            now,
            now,
            now,
            now,
            [rows[i][0] for i in todo],
            [rows[i][1].task for i in todo],
            [rows[i][2] for i in todo],
            [row_state[i] for i in todo],
            [rows[i][1].priority for i in todo],
            [rows[i][1].key for i in todo],
            [hashes[i] for i in todo],
            [rows[i][1].max_attempts for i in todo],
            [rows[i][1].delay for i in todo],
            [rows[i][1].queue for i in todo],
            [rows[i][1].tenant for i in todo],
            [rows[i][1].deadline for i in todo],
            [encode_limits(rows[i][1].limits) for i in todo],
            [encode_limits(parents[i]) for i in todo],
            [unmet[i] for i in todo],
            [blocked[i] for i in todo],
            [errors[i] for i in todo],
            [True if rows[i][0] in has_children else None for i in todo],
        ),
    )
    inserted = set(_row(cur)[0])
    if len(inserted) < len(todo):
        raise _KeyRace  # a key taken since _key_holders looked: the savepoint goes, and the add is tried again
    edges = [(p, rows[i][0]) for i in todo for p in parents[i] if state_of[p] != "succeeded"]
    if edges:
        _run(
            cur,
            f"INSERT INTO {s}.flow_edges (parent, child) SELECT * FROM unnest(%s::text[], %s::text[])"
            " ON CONFLICT DO NOTHING",
            ([e[0] for e in edges], [e[1] for e in edges]),
        )
    ready = sum(1 for i in todo if row_state[i] == "ready")
    if ready and notify is not None:
        _run(cur, "SELECT pg_notify(%s, %s)", (notify[0], f"{notify[1]}{ready}"))
    return _read_back(cur, s, rows, effective, inserted)


def _read_back(
    cur: Any, s: str, rows: Sequence[tuple[str, NewJob, str]], effective: list[str], inserted: set[str]
) -> tuple[list[Job], list[bool]]:
    """The snapshot of each row's effective job, and whether the row was inserted."""
    _run(cur, f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = ANY(%s)", (sorted(set(effective)),))
    by_id = {row[0]: job_from_row(row) for row in cur.fetchall()}
    out: list[Job] = []
    for job_id in effective:
        job = by_id.get(job_id)
        if job is None:  # pragma: no cover - the holder was evicted between the statements
            raise RuntimeError(f"the job {job_id!r} this enqueue resolved to just went; enqueue again")
        out.append(job)
    return out, [r[0] in inserted for r in rows]


# ------------------------------------------------------- parents' ends


def settle(
    cur: Any,
    s: str,
    now: float,
    channel: str,
    node: str,
    succeeded: Sequence[str],
    ended: Sequence[tuple[str, str]],
    done: Settled | None = None,
) -> Settled:
    """The moves of the children of parents that just ended (their rows locked and written in this
    transaction): ``succeeded`` ids release their children (:func:`release`), ``ended`` ``(id, 'dead' or
    'cancelled')`` cancel theirs, down the flow (:func:`cascade`). Adds to ``done`` (or a new one)."""
    done = Settled() if done is None else done
    done.parents += len(succeeded) + len(ended)
    if succeeded:
        release(cur, s, now, channel, node, succeeded, done)
    if ended:
        cascade(cur, s, now, channel, node, ended, done)
    return done


def release(cur: Any, s: str, now: float, channel: str, node: str, parents: Sequence[str], done: Settled) -> None:
    """Count ``parents`` (just succeeded) off their waiting children; a child with none left goes ready (or
    scheduled while its ``run_at`` is ahead), never deferred. The ready ones are announced
    (``r|node|n``) in the same statement."""
    _run(
        cur,
        f"WITH k AS (SELECT e.child, count(*) AS n FROM {s}.flow_edges e WHERE e.parent = ANY(%s) GROUP BY e.child),"
        f" lk AS (SELECT j.id, k.n FROM {s}.jobs j JOIN k ON j.id = k.child WHERE j.state = 'waiting'"
        "  ORDER BY j.id FOR UPDATE OF j),"
        f" up AS (UPDATE {s}.jobs j SET unmet = CASE WHEN j.unmet > lk.n THEN j.unmet - lk.n END,"
        "  state = CASE WHEN j.unmet > lk.n THEN 'waiting' WHEN j.run_at > %s THEN 'scheduled' ELSE 'ready' END"
        "  FROM lk WHERE j.id = lk.id RETURNING j.state, j.run_at)"
        " SELECT (SELECT count(*) FROM up WHERE state = 'ready'),"
        " ARRAY(SELECT run_at FROM up WHERE state = 'scheduled'),"
        " (SELECT pg_notify(%s, %s || count(*)) FROM up WHERE state = 'ready' HAVING count(*) > 0)",
        (list(parents), now, channel, f"r|{node}|"),
    )
    ready, scheduled, _ = _row(cur)
    done.ready += int(ready)
    done.scheduled += [float(at) for at in scheduled]


def cascade(
    cur: Any, s: str, now: float, channel: str, node: str, ended: Sequence[tuple[str, str]], done: Settled
) -> None:
    """Cancel the waiting children of ``ended`` (``(parent id, its state)``), each naming its parent
    (``ParentFailed: parent <id> is <state>``, ``cancelled_by``), then theirs, level by level; each
    level announced as finished (``f|node|ids``) in its statement."""
    level = list(ended)
    while level:
        _run(
            cur,
            "WITH f AS (SELECT * FROM unnest(%s::text[], %s::text[]) AS f(parent, pstate)),"
            f" k AS (SELECT DISTINCT ON (e.child) e.child, f.parent, f.pstate FROM f JOIN {s}.flow_edges e"
            "  ON e.parent = f.parent ORDER BY e.child, f.parent),"
            f" lk AS (SELECT j.id, k.parent, k.pstate FROM {s}.jobs j JOIN k ON j.id = k.child"
            "  WHERE j.state = 'waiting' ORDER BY j.id FOR UPDATE OF j),"
            f" q AS (SELECT lk.*, nextval('{s}.finish_seq') AS fseq FROM (SELECT * FROM lk ORDER BY id) lk),"
            f" done AS (UPDATE {s}.jobs j SET state = 'cancelled', unmet = NULL, cancelled_by = q.parent,"
            "  error = 'ParentFailed: parent ' || q.parent || ' is ' || q.pstate, finished_at = %s,"
            "  finish_seq = q.fseq, changed_at = %s FROM q WHERE j.id = q.id RETURNING j.id, j.has_children)"
            " SELECT ARRAY(SELECT id FROM done ORDER BY id), ARRAY(SELECT id FROM done WHERE has_children ORDER BY id),"
            f" {_finished_notice('done')}",
            ([p for p, _ in level], [st for _, st in level], now, now, channel, f"f|{node}|"),
        )
        cancelled, parents, _ = _row(cur)
        done.cancelled += cancelled
        level = [(p, "cancelled") for p in parents]


def revive(cur: Any, s: str, now: float, parent: str) -> list[str]:
    """``parent`` was just retried (its row locked and written in this transaction): the jobs cancelled
    because it ended wait again, their unmet parents counted and their deadlines gone (or, with another
    parent dead or cancelled, stay cancelled, now naming that one), and so on down the flow; the ids of
    those that wait again.

    Each level: the candidates (cancelled, ``cancelled_by`` the level's parent), then their parents
    locked as an add locks them (so that a parent ending meanwhile sees them waiting, or they see it
    ended), then the candidates written, each re-checked.
    """
    revived: list[str] = []
    level = [parent]
    while level:
        _run(
            cur,
            f"SELECT j.id, j.cancelled_by, j.parents FROM {s}.flow_edges e JOIN {s}.jobs j ON j.id = e.child"
            " WHERE e.parent = ANY(%s) AND j.state = 'cancelled' AND j.cancelled_by = e.parent ORDER BY j.id",
            (level,),
        )
        found = cur.fetchall()
        if not found:
            break
        states = lock_parents(cur, s, sorted({p for _, _, ps in found for p in ps or ()}))
        ids: list[str] = []
        was: list[str] = []
        new_state: list[str] = []
        counts: list[int | None] = []
        blockers: list[str | None] = []
        errors: list[str | None] = []
        for job_id, by, ps in found:
            blocker = next((p for p in ps or () if states.get(p) in _ENDED), None)
            ids.append(job_id)
            was.append(by)
            blockers.append(blocker)
            if blocker is not None:
                new_state.append("cancelled")
                counts.append(None)
                errors.append(parent_failed(blocker, JobState(states[blocker])))
            else:
                new_state.append("waiting")
                counts.append(sum(1 for p in ps or () if p in states and states[p] != "succeeded"))
                errors.append(None)
        _run(
            cur,
            f"UPDATE {s}.jobs j SET state = u.state, unmet = u.unmet, cancelled_by = u.blocker, error = u.error,"
            " finished_at = CASE WHEN u.state = 'waiting' THEN NULL ELSE j.finished_at END,"
            " finish_seq = CASE WHEN u.state = 'waiting' THEN NULL ELSE j.finish_seq END, changed_at = %s,"
            # The flow was retried, however late: the revived lose their deadlines as the retried job does.
            " deadline = CASE WHEN u.state = 'waiting' THEN NULL ELSE j.deadline END"
            " FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[])"
            "  AS u(id, was, state, unmet, blocker, error)"
            " WHERE j.id = u.id AND j.state = 'cancelled' AND j.cancelled_by = u.was"
            " RETURNING j.id, j.state, j.has_children",
            (now, ids, was, new_state, counts, blockers, errors),
        )
        level = []
        for job_id, state, has_children in cur.fetchall():
            if state == "waiting":
                revived.append(job_id)
                if has_children:
                    level.append(job_id)
    return revived


def results(conn: Any, s: str, ids: Sequence[str]) -> dict[str, Any]:
    """The result of each of ``ids`` that succeeded (``None`` for a job that returned nothing)."""
    with _cur(conn) as cur:
        _run(cur, f"SELECT id, result::text FROM {s}.jobs WHERE id = ANY(%s) AND state = 'succeeded'", (list(ids),))
        return {job_id: None if text is None else loads(text) for job_id, text in cur.fetchall()}
