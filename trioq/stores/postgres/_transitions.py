"""The job state machine in SQL: each transition a function over one psycopg connection.

These run in worker threads (psycopg's sync API; its async one does not run
under trio). Each is one transaction: autocommit connections run a single
statement as its own, and ``conn.transaction()`` wraps the rest. Every
statement that acts for an attempt names its epoch in the ``WHERE`` clause,
so a stale attempt changes nothing. A statement that locks several job rows
locks them in id order (or skips locked ones), against deadlocks between
nodes.

Every limit a statement carries is a literal (a parameterised ``LIMIT``
planned a sequential scan at a large backlog), and nothing is prepared (a
prepared completion got a generic nested-loop plan): ``enqueue_tx`` runs these
on the caller's connection, whatever its settings. One exception: the success
statement that also releases children (:func:`_succeed_all`, flows in use),
for a batch of at most :data:`PREPARED_BATCH` jobs, on the store's own pooled
connections: planning its CTEs over the jobs table's indexes took 2 ms of its
3.5 (loaded 2-core VM), and for a few jobs the generic plan (nested loops over
ids) is the one a custom plan finds.

A call whose connection broke may be tried again after its first try
committed unseen (``retried``): each transition then recognises its own
earlier commit (its ids exist; ``changed_at`` is this call's ``now``) and
answers as the first try would have, instead of refusing what it did.

The transitions an operator asks for by name (cancel, retry, pause, resume)
live in ``_admin`` and are re-exported here, so that this module still names
every transition; what the modules share (cursors, the finished hint) is in
``_sql``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from ..._model import (
    MAX_ERRORS_KEPT,
    MAX_SNOOZES,
    InvalidJob,
    Job,
    JobState,
    Limit,
    QueueFull,
    deadline_error,
    error_text,
    storable_text,
)
from .._base import Failed, NewJob, Outcome, Released, Snoozed, Succeeded, no_limits
from . import _fair, _flows, _handoff, _limits
from ._admin import cancel, pause, paused, resume, retry
from ._rows import COLUMNS, WIDTH, encode_errors, encode_limits, encode_result, job_from_row, loads
from ._sql import NOTIFY_IDS as _NOTIFY_IDS
from ._sql import TERMINAL as _TERMINAL
from ._sql import cursor as _cur
from ._sql import finished_notice as _finished_notice
from ._sql import not_found as _not_found
from ._sql import one as _one
from ._sql import one_row as _row
from ._sql import run as _run

__all__ = [
    "Claimed",
    "COPY_FROM",
    "Claiming",
    "Promoted",
    "add",
    "add_claiming",
    "cancel",
    "claim",
    "claimed_with",
    "complete",
    "counts",
    "evict",
    "expire",
    "extend",
    "get",
    "has_pending",
    "jobs",
    "key_hash",
    "lead",
    "pause",
    "paused",
    "promote",
    "release_node",
    "rescue",
    "resign",
    "resume",
    "retry",
    "watched_terminal",
]

_STATE_NAMES = tuple(state.value for state in JobState)
#: Outcomes applied per statement (a larger batch is split, in order).
MAX_BATCH = 500
#: Success batches of at most this many jobs are completed by a prepared statement when flows are in use.
PREPARED_BATCH = 8
#: Batches of at least this many jobs, none with a key, are inserted with COPY (faster than INSERT
#: past a few hundred rows; it cannot skip a conflicting key).
COPY_FROM = 200


def key_hash(key: str) -> bytes:
    """What the unique index of idempotency keys holds for ``key``."""
    return hashlib.sha256(key.encode()).digest()


# ---------------------------------------------------------------- add


def add(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    max_pending: int | None,
    notify: tuple[str, str] | None,
    *,
    retried: bool = False,
    check: Callable[[list[Job | None]], object] | None = None,
) -> list[Job | None]:
    """Insert ``rows`` (``(id, job, payload JSON)``) all or nothing; ``None`` for each job inserted,
    the holder's snapshot for a key already held.

    ``notify``: ``(channel, payload)`` of a NOTIFY sent in the same
    transaction when a job was inserted. Raises :class:`~trioq.QueueFull`
    (inserting none) past ``max_pending`` ready plus scheduled jobs.
    ``check``: called with that answer before the transaction ends (a
    savepoint's, in a caller's transaction); what it raises undoes the add.
    """
    return _add(conn, s, rows, now, max_pending, notify, None, retried, check)[0]


@attrs.frozen
class Claiming:
    """What :func:`add_claiming` may claim of the rows it inserts, for ``node``'s idle workers, under claim
    ``token``: each row ``rows`` marks, if it goes in (no key holder stops it) and ready, its queue is not
    paused, and no job of ``queues`` (``None``: of any queue) was ready before it. The caller marks what a
    claim of that node would take of the rows alone (no delay, a queue it serves, no limit key when it
    declares limits, at most its idle workers, best first)."""

    node: str
    token: str
    rows: tuple[bool, ...]
    queues: tuple[str, ...] | None


def add_claiming(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    notify: tuple[str, str] | None,
    claiming: Claiming,
    *,
    retried: bool = False,
) -> tuple[list[Job | None], list[str]]:
    """:func:`add` without a bound (and without COPY: the caller sends few rows), which also claims rows
    as ``claiming`` says, in the same statement: one commit for both. Returns :func:`add`'s answer and
    the ids claimed, which run under epoch 1 for ``claiming.node``; the NOTIFY goes out only if a ready
    job is left.

    Why the claim is the add's: a node whose workers wait enqueues a job that they would claim next;
    claimed by the add, the job starts one commit sooner (the claim's own commit is the wait).
    """
    return _add(conn, s, rows, now, None, notify, claiming, retried)


def _add(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    max_pending: int | None,
    notify: tuple[str, str] | None,
    claiming: Claiming | None,
    retried: bool,
    check: Callable[[list[Job | None]], object] | None = None,
) -> tuple[list[Job | None], list[str]]:
    """:func:`add` (``claiming`` ``None``) and :func:`add_claiming`: the holders found, and the ids claimed."""
    ids = [r[0] for r in rows]
    hashes = [None if r[1].key is None else key_hash(r[1].key) for r in rows]
    with _cur(conn) as cur:
        if retried:
            present = {row[0] for row in _run(cur, f"SELECT id FROM {s}.jobs WHERE id = ANY(%s)", (ids,))}
            if present:
                # The first try committed: every job is in (all or nothing), or its key's holder is; what
                # it claimed runs under its token, and is this try's to hand over (nobody else knows of it).
                taken = [] if claiming is None else [j.id for j in claimed_with(conn, s, claiming.node, claiming.token)]
                missing = [i for i, job_id in enumerate(ids) if job_id not in present]
                return _holders(cur, s, rows, hashes, missing, inserted=present), taken
        if claiming is None and max_pending is None and len(rows) >= COPY_FROM and all(h is None for h in hashes):
            with conn.transaction():
                _copy(cur, s, rows, now, notify)
            return [None] * len(rows), []
        if max_pending is None and check is None:  # one statement: its own transaction
            inserted, taken = _insert(cur, s, rows, hashes, now, notify, claiming=claiming)
            missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
            return _holders(cur, s, rows, hashes, missing, inserted=inserted), taken
        with conn.transaction():
            if max_pending is not None:
                _admit(cur, s, rows, hashes, max_pending)
            inserted, taken = _insert(cur, s, rows, hashes, now, notify, claiming=claiming)
            missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
            found = _holders(cur, s, rows, hashes, missing, inserted=inserted)
            if check is not None:
                check(found)
        return found, taken


def _admit(cur: Any, s: str, rows: Sequence[tuple[str, NewJob, str]], hashes: list[bytes | None], bound: int) -> None:
    """Raise :class:`~trioq.QueueFull` unless ``rows`` fit under ``bound`` ready plus scheduled jobs."""
    # Adds that check the bound take turns: two at once could both see room.
    _run(cur, f"SELECT 1 FROM {s}.admission FOR UPDATE")
    # Counting stops past the bound: the scan costs at most the bound, whatever the backlog.
    _run(
        cur,
        f"SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL LIMIT {bound + 1}) r"
        f" UNION ALL SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NOT NULL"
        f"  LIMIT {bound + 1}) p"
        f" UNION ALL SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'scheduled' LIMIT {bound + 1}) s",
    )
    pending = sum(row[0] for row in cur.fetchall())
    wanted = [h for h in hashes if h is not None]
    held: set[bytes] = set()
    if wanted:
        _run(cur, f"SELECT key_hash FROM {s}.jobs WHERE key_hash = ANY(%s)", (wanted,))
        held = {bytes(row[0]) for row in cur.fetchall()}
    fresh = len(set(wanted) - held) + sum(1 for h in hashes if h is None)
    if fresh and pending + fresh > bound:
        shown = f"{pending}" if pending <= bound else f"more than {bound}"
        raise QueueFull(f"queue is full: {shown} jobs waiting, max_ready={bound}; retry later", retry_after=1.0)


def _insert(
    cur: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    hashes: list[bytes | None],
    now: float,
    notify: tuple[str, str] | None,
    states: Sequence[str] | None = None,
    *,
    claiming: Claiming | None = None,
) -> tuple[set[str], list[str]]:
    """Insert what no key holder stops, with the NOTIFY, in one statement; the ids inserted, and those
    claimed as ``claiming`` says (see :func:`add_claiming`; none without it).

    The arrays travel in binary (``%b``): a batch of 1,000 is 15% faster so. ``states``: each row's
    state (``_defer``'s, which may defer some), instead of ready or scheduled by its delay.
    """
    assert states is None or claiming is None
    state = "CASE WHEN u.delay > 0 THEN 'scheduled' ELSE 'ready' END" if states is None else "u.state"
    extra = ("", "") if states is None else (", %b::text[]", ", state")
    head: tuple[Any, ...] = ()
    tail: tuple[Any, ...] = ()
    columns = ""
    rows_in = (
        "unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[], %b::bytea[], %b::bigint[],"
        f"  %b::float8[], %b::text[], %b::text[], %b::float8[], %b::text[]{extra[0]}) WITH ORDINALITY"
        "  AS u(id, task, payload, priority, key, key_hash, max_attempts, delay, queue, tenant, deadline, limits"
        f"{extra[1]}, ord)"
    )
    left = "SELECT 1 FROM ins"
    if claiming is not None:
        # A row runs if marked, ready, its queue not paused, and nothing was ready before it (the probe
        # reads one entry of jobs_ready or jobs_queue_ready): what a claim of the node would take first.
        state = "CASE WHEN u.delay > 0 THEN 'scheduled' WHEN u.run THEN 'running' ELSE 'ready' END"
        columns = ", epoch, node, claim"
        served = "" if claiming.queues is None else " AND queue = ANY(%b::text[])"
        rows_in = (
            f"(SELECT u.*, (u.delay <= 0 AND t.take AND u.queue NOT IN (SELECT queue FROM {s}.paused)"
            f"  AND NOT EXISTS (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL{served})) AS run"
            f" FROM {rows_in} JOIN unnest(%b::bool[]) WITH ORDINALITY AS t(take, ord) ON t.ord = u.ord) u"
        )
        # Parameters in the text's order: the select list's (node, token, then the derived table's
        # queues) before the arrays, the marks after them.
        head = (claiming.node, claiming.token, *(() if claiming.queues is None else (list(claiming.queues),)))
        tail = (list(claiming.rows),)
        left = "SELECT 1 FROM ins WHERE state = 'ready'"
    notice = f", (SELECT pg_notify(%s, %s) WHERE EXISTS ({left}))" if notify is not None else ""
    runs = (
        ", CASE WHEN u.run THEN 1 ELSE 0 END, CASE WHEN u.run THEN %s END, CASE WHEN u.run THEN %s END"
        if claiming is not None
        else ""
    )
    _run(
        cur,
        f"WITH ins AS (INSERT INTO {s}.jobs"
        " (id, task, payload, state, priority, key, key_hash, max_attempts, run_at, created_at, queue, tenant,"
        f"  deadline, limits{columns})"
        f" SELECT u.id, u.task, u.payload::json, {state},"
        "  u.priority, u.key, u.key_hash, u.max_attempts, %s + u.delay, %s, u.queue, u.tenant, %s + u.deadline,"
        f"  coalesce(u.limits::text[], '{{}}'){runs}"
        f" FROM {rows_in}"
        " ORDER BY u.ord"
        f" ON CONFLICT DO NOTHING RETURNING id, state)"
        " SELECT ARRAY(SELECT id FROM ins), ARRAY(SELECT id FROM ins WHERE state = 'running')"
        f"{notice}",
        (
            now,
            now,
            now,
            *head,
            [r[0] for r in rows],
            [r[1].task for r in rows],
            [r[2] for r in rows],
            [r[1].priority for r in rows],
            [r[1].key for r in rows],
            hashes,
            [r[1].max_attempts for r in rows],
            [r[1].delay for r in rows],
            [r[1].queue for r in rows],
            [r[1].tenant for r in rows],
            [r[1].deadline for r in rows],
            [encode_limits(r[1].limits) for r in rows],
            *(() if states is None else (list(states),)),
            *tail,
            *(notify or ()),
        ),
    )
    row = _row(cur)
    return set(row[0]), list(row[1])


def _copy(
    cur: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    notify: tuple[str, str] | None,
    states: Sequence[str] | None = None,
) -> None:
    """Insert ``rows`` (fresh ids, no keys: nothing can conflict) with COPY, and NOTIFY; in the caller's
    transaction. ``states``: as :func:`_insert`'s."""
    with cur.copy(
        f"COPY {s}.jobs (id, task, payload, state, priority, max_attempts, run_at, created_at, queue, tenant,"
        " deadline, limits) FROM STDIN (FORMAT BINARY)"
    ) as copy:
        # The payload goes as text: json's binary form is its text, and the dumper for "json" would
        # encode the (already JSON) string once more.
        copy.set_types(["text", "text", "text", "text", "int8", "int8", "float8", "float8", "text", "text", "float8",
                        "text[]"])  # fmt: skip
        write = copy.write_row
        for i, (job_id, job, payload) in enumerate(rows):
            delay, deadline = job.delay, job.deadline
            state = ("scheduled" if delay > 0 else "ready") if states is None else states[i]
            write((job_id, job.task, payload, state, job.priority, job.max_attempts, now + delay, now, job.queue,
                   job.tenant, None if deadline is None else now + deadline, list(job.limits)))  # fmt: skip
    if notify is not None:
        _run(cur, "SELECT pg_notify(%s, %s)", notify)


def _holders(
    cur: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    hashes: list[bytes | None],
    missing: Collection[int],
    *,
    inserted: set[str],
) -> list[Job | None]:
    """``None`` for each inserted row; for each of ``missing`` not inserted, its key's holder."""
    out: list[Job | None] = [None] * len(rows)
    wanted = [hashes[i] for i in missing if hashes[i] is not None and rows[i][0] not in inserted]
    if not wanted:
        return out
    _run(cur, f"SELECT {COLUMNS}, key_hash FROM {s}.jobs WHERE key_hash = ANY(%s)", (wanted,))
    by_hash = {bytes(row[WIDTH]): job_from_row(row) for row in cur.fetchall()}
    for i in missing:
        h = hashes[i]
        if rows[i][0] in inserted or h is None:
            continue
        holder = by_hash.get(h)
        if holder is None:  # pragma: no cover - the holder was evicted between the statements
            raise RuntimeError(f"the job holding key {rows[i][1].key!r:.80} just went; enqueue again")
        out[i] = holder
    return out


# -------------------------------------------------------------- claim


#: A job the claim may take as far as its deadline goes (``j`` is the jobs table): none, started once
#: already, or still ahead of ``now``.
_LIVE = "(j.deadline IS NULL OR j.epoch > 0 OR j.deadline > %(now)s)"
#: The jobs whose deadline still applies: never claimed, not started (``jobs_deadline``'s predicate,
#: word for word, so that the planner can tell the index covers them).
_PENDING_DEADLINE = "deadline IS NOT NULL AND epoch = 0 AND state IN ('ready', 'scheduled', 'deferred', 'waiting')"
#: The distinct queues of ready jobs, each found by one probe of ``jobs_queue_ready`` (a loose index scan):
#: a queue's backlog is stepped over, not read.
_READY_QUEUES = (
    "q(name) AS ((SELECT queue FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL ORDER BY queue LIMIT 1)"
    " UNION ALL SELECT (SELECT queue FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL AND queue > q.name"
    " ORDER BY queue LIMIT 1)"
    " FROM q WHERE q.name IS NOT NULL)"
)


class Claimed(list[Job]):
    """The jobs :func:`claim` took, best first, and ``next_deadline``: the earliest deadline still pending
    (of a never-claimed ready or scheduled job, those just claimed included) as the claim saw it, or
    ``None`` when there was none, it was not asked for, or nothing was claimed (the statement returned
    no row to carry it)."""

    def __init__(
        self, jobs: list[Job], next_deadline: float | None, next_unpark: float | None = None, more: bool = False
    ) -> None:
        super().__init__(jobs)
        self.next_deadline = next_deadline
        #: When the first job this claim parked for a rate is due (``None``: it parked none for a rate).
        self.next_unpark = next_unpark
        #: The claim stopped short with candidates left (it locked as many keys as it may): claim again.
        self.more = more


def claim(
    conn: Any,
    s: str,
    node: str,
    limit: int,
    lease_until: float | None,
    token: str,
    recover: bool,
    *,
    now: float | None = None,
    queues: Sequence[str] | None = None,
    walk: bool = False,
    probe: bool = True,
    limit_of: Callable[[str], Limit | None] = no_limits,
    fair: Mapping[str, float] | None = None,
    clock: Callable[[], float] | None = None,
) -> Claimed:
    """Claim up to ``limit`` ready jobs of ``queues`` (every queue: ``None``) for ``node`` under new epochs,
    marked with ``token``; never a job of a paused queue, nor one whose deadline is at or before ``now``
    and still applies (such a job is left for :func:`expire`; ``now=None`` judges no deadline, for
    callers that set none).

    ``lease_until``: first push the node's lease out to at least then
    (``None``: its row is known to reach past it). ``recover``: an earlier
    try of this claim may have committed (its connection broke): the jobs it
    claimed, if any, are returned instead of claiming more.

    How the statement finds the best jobs: with ``queues``, the best
    ``limit`` of each queue not paused (read in order from
    ``jobs_queue_ready``), the best ``limit`` of them all taken; with neither
    ``queues`` nor ``walk``, ``jobs_ready`` in order (the cheapest, and what
    every claim did before named queues), skipping paused queues' jobs one by
    one; with ``walk`` (the caller believes a queue is paused), every queue
    with ready jobs is found by a loose index scan and read as with
    ``queues``, so that a paused queue's backlog ahead in priority order is
    stepped over instead of read by every claim. Either way a pause is read in
    the statement itself: the caller's belief decides only the plan.

    ``probe``: the statement also reads the earliest pending deadline (one
    probe of ``jobs_deadline``, but planning it is about a fifth of the
    statement's cost), so that a caller learns of deadlines other nodes set;
    a caller that knows of no deadline in use leaves it out.

    ``fair``: the tenants' weights (``StoreConfig.fairness``): the claim is
    :func:`._fair.claim`'s (start-time fair queueing over shared tags),
    unless a job it would take holds a limit key on a node that declares
    limits, when the limit path (:func:`._limits.claim`) decides the
    candidates in fair order (:class:`._fair.FairPick`), charging every job
    it considers, started or parked, as the table store does.

    ``clock``: the caller's clock, callable from this thread: the limit path decides rates at the time
    it reads once it holds the keys' locks (see :func:`._limits.claim`); ``None``: at ``now``.
    """
    with _cur(conn) as cur:
        if recover:
            recovered = claimed_with(conn, s, node, token)
            if recovered:
                return Claimed(recovered, None)
        if lease_until is not None:
            _run(
                cur,
                f"INSERT INTO {s}.nodes (id, expires_at) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
                f" SET expires_at = greatest({s}.nodes.expires_at, excluded.expires_at)",
                (node, lease_until),
            )
        n = int(limit)
        if fair is not None:
            got = _fair.claim(
                conn, s, node, n, token, now=now, queues=queues, weights=fair, probe=probe,
                keyed_aside=limit_of is not no_limits, columns=_qualified("j"), live=_LIVE,
                pending_deadline=_PENDING_DEADLINE,
            )  # fmt: skip
            fair_rows, fair_deadline, more = got
            if fair_rows is not None:
                return Claimed([job_from_row(row) for row in fair_rows], fair_deadline, more=more)
            # A job it would take holds a limit key: the limit path decides the candidates in fair order.
            jobs, unpark_at, more = _limits.claim(
                conn, s, node, n, token, time.time() if now is None else now, limit_of,
                lambda m, exclude, p: "", _qualified("j"),
                fair=_fair.FairPick(s, queues, fair, now, _LIVE), clock=clock,
            )  # fmt: skip
            return Claimed(jobs, fair_deadline if jobs else None, unpark_at, more)
        params: dict[str, Any] = {"now": now, "node": node, "token": token}
        pick = _pick(s, n, queues, walk, now is not None, params)
        if limit_of is no_limits:
            # No key is bounded on this node (its registry declares no limit): the plain claim, the
            # UPDATE itself the statement, as before limits existed (0.17 ms cheaper a round trip).
            probe_cte = f", d AS (SELECT min(deadline) AS m FROM {s}.jobs WHERE {_PENDING_DEADLINE})" if probe else ""
            _run(
                cur,
                f"{pick}{probe_cte} UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1,"
                f" node = %(node)s, claim = %(token)s FROM c{', d' if probe else ''} WHERE j.id = c.id"
                f" RETURNING {_qualified('j')}, j.seq{', d.m' if probe else ''}",
                params,
            )
            plain = cur.fetchall()
            plain.sort(key=lambda row: (-row[6], row[9], row[WIDTH]))
            deadline = plain[0][WIDTH + 1] if probe and plain else None
            return Claimed([job_from_row(row) for row in plain], deadline)
        # A candidate holding a limit key sends the claim to the limit path (_limits.claim), which takes
        # none of these: the statement claims only when none of its candidates holds a key, and says so
        # in a row of its own when nothing was claimed (the left join).
        _run(
            cur,
            f"{pick}, k AS (SELECT EXISTS (SELECT 1 FROM c WHERE c.limits <> '{{}}') AS keyed),"
            f" u AS (UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1, node = %(node)s,"
            f"  claim = %(token)s FROM c WHERE j.id = c.id AND NOT (SELECT keyed FROM k)"
            f"  RETURNING {_qualified('j')}, j.seq)"
            " SELECT u.*, k.keyed"
            + (f", (SELECT min(deadline) FROM {s}.jobs WHERE {_PENDING_DEADLINE})" if probe else "")
            + " FROM k LEFT JOIN u ON true",
            params,
        )
        rows = cur.fetchall()
    if not rows:  # pragma: no cover - the statement always returns a row (a stand-in connection may not)
        return Claimed([], None)
    keyed = bool(rows[0][WIDTH + 1])
    next_deadline = rows[0][WIDTH + 2] if probe else None
    if keyed:
        jobs, unpark_at, more = _limits.claim(
            conn, s, node, n, token, time.time() if now is None else now, limit_of,
            lambda m, exclude, p: _pick(s, m, queues, walk, now is not None, p, exclude), _qualified("j"),
            clock=clock,
        )  # fmt: skip
        return Claimed(jobs, next_deadline if jobs else None, unpark_at, more)
    rows = [row for row in rows if row[0] is not None]
    rows.sort(key=lambda row: (-row[6], row[9], row[WIDTH]))
    return Claimed([job_from_row(row) for row in rows], next_deadline if rows else None)


def claimed_with(conn: Any, s: str, node: str, token: str) -> list[Job]:
    """The jobs ``node`` runs under claim ``token`` (a claim's, or a success's that claimed children), best
    first: what a try whose first try committed unseen finds."""
    with _cur(conn) as cur:
        _run(cur, f"SELECT {COLUMNS} FROM {s}.jobs WHERE state = 'running' AND node = %s AND claim = %s",
             (node, token))  # fmt: skip
        return sorted((job_from_row(row) for row in cur.fetchall()), key=lambda job: (-job.priority, job.run_at))


def _pick(
    s: str, n: int, queues: Sequence[str] | None, walk: bool, live: bool, params: dict[str, Any], exclude: bool = False
) -> str:
    """The CTE ``c`` (``id, limits``) of :func:`claim`'s candidates: the best ``n`` ready jobs not parked, locked
    (see :func:`claim` for the plans), and the CTEs it needs; ``params`` gets the parameters it names.
    ``exclude``: leave out the ids of ``%(exclude)s`` (jobs this transaction holds but decided to leave)."""
    cond = (f" AND {_LIVE}" if live else "") + (" AND j.id <> ALL(%(exclude)s)" if exclude else "")
    if queues is None and not walk:
        return (
            f"WITH c AS MATERIALIZED (SELECT id, limits FROM {s}.jobs j WHERE state = 'ready' AND parked IS NULL{cond}"
            f"  AND queue NOT IN (SELECT queue FROM {s}.paused)"
            f"  ORDER BY priority DESC, run_at, seq LIMIT {n} FOR UPDATE SKIP LOCKED)"
        )
    if queues is None:
        names = "WITH RECURSIVE " + _READY_QUEUES.format(s=s)
    else:
        names = "WITH q(name) AS (SELECT unnest(%(queues)s::text[]))"
        params["queues"] = list(queues)
    # Each queue's best jobs, locked as they are read (so that none is lost to a concurrent claim
    # after the merge); those not among the best of all are unlocked as the statement commits.
    # The queue is matched as a range and ordered by first, so that only jobs_queue_ready gives
    # this order: with "queue = q.name" the planner took the queue for a constant, guessed its
    # share from the statistics, and for a queue they did not know (or a small one) read
    # jobs_ready past every other queue's jobs (20,000 rows for 10 in the measured case).
    return (
        f"{names}, c AS MATERIALIZED (SELECT x.id, x.limits FROM q CROSS JOIN LATERAL"
        f"  (SELECT id, limits, priority, run_at, seq FROM {s}.jobs j WHERE state = 'ready' AND parked IS NULL"
        f"   AND queue >= q.name AND queue <= q.name{cond}"
        f"   ORDER BY j.queue, priority DESC, run_at, seq LIMIT {n} FOR UPDATE SKIP LOCKED) x"
        f"  WHERE q.name IS NOT NULL AND q.name NOT IN (SELECT queue FROM {s}.paused)"
        f"  ORDER BY x.priority DESC, x.run_at, x.seq LIMIT {n})"
    )


def _qualified(alias: str) -> str:
    """:data:`COLUMNS` of the table under ``alias``."""
    return ", ".join(f"{alias}.{column.strip()}" for column in COLUMNS.split(","))


# ------------------------------------------------------------- extend


def extend(
    conn: Any, s: str, node: str, held: Sequence[tuple[str, int]], lease: float, clock: Callable[[], float]
) -> tuple[list[bool], float]:
    """Renew ``node``'s lease to ``lease`` seconds past ``clock()`` read as the statement goes out (a retry
    after an outage renews from then, not from when the call began), never shortening it; for each of
    ``held``, whether its epoch still runs the job, and the time the lease was renewed to."""
    until = clock() + lease
    with _cur(conn) as cur:
        _run(
            cur,
            f"WITH n AS (INSERT INTO {s}.nodes (id, expires_at) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
            f"  SET expires_at = greatest({s}.nodes.expires_at, excluded.expires_at))"
            f" SELECT u.ord FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY AS u(id, epoch, ord)"
            f" JOIN {s}.jobs j ON j.id = u.id AND j.epoch = u.epoch AND j.state = 'running'",
            (node, until, [h[0] for h in held], [h[1] for h in held]),
        )
        holding = {row[0] for row in cur.fetchall()}
    return [i + 1 in holding for i in range(len(held))], until


# ----------------------------------------------------------- complete


def complete(
    conn: Any,
    s: str,
    outcomes: Sequence[Outcome],
    now: float,
    channel: str,
    node: str,
    *,
    retried: bool = False,
    freed: set[str] | None = None,
    settled: _flows.Settled | None = None,
    parents: bool = False,
    take: _handoff.Take | None = None,
) -> tuple[list[JobState | None], list[str], list[float]]:
    """Apply ``outcomes`` in order; ``(states, ids of the jobs finished, run_at of each job scheduled again)``.

    A batch of successes of distinct jobs is one statement; any other batch
    locks its jobs' rows (in id order), applies each outcome as the in-process
    table would, and writes the rows back. Both announce the jobs they
    finished to every node (``f|node|ids``) as they commit. ``freed`` gets the limit keys of the
    attempts that ended (their slots are free: see :func:`_limits.unpark`). The moves of a parent's
    children (``has_children``) are made in the same transaction (``settled`` gets what they did, and
    the ids they cancelled are among the jobs finished). With ``parents`` (the caller expects parents
    among the successes), a parent's success releases them in the statement that completes it (see
    :func:`_succeed_all`); any other outcome of a parent, and a success the statement left, takes the
    second way (:func:`._flows.settle`, which counts them in ``settled.parents``). ``take`` (with
    ``parents``): children that statement may claim for ``node`` (``settled.claimed``; a batch split for
    its size claims none).
    """
    if len(outcomes) > MAX_BATCH:  # bounded statements: one slow batch must not grow the next
        states: list[JobState | None] = []
        finished: list[str] = []
        scheduled: list[float] = []
        for start in range(0, len(outcomes), MAX_BATCH):
            part = complete(
                conn, s, outcomes[start : start + MAX_BATCH], now, channel, node, retried=retried, freed=freed,
                settled=settled, parents=parents,
            )  # fmt: skip
            states += part[0]
            finished += part[1]
            scheduled += part[2]
        return states, finished, scheduled
    ids = [o.job_id for o in outcomes]
    if not retried and all(type(o) is Succeeded for o in outcomes) and len(set(ids)) == len(ids):
        fast = _succeed_all(conn, s, outcomes, now, channel, node, freed, settled, parents, take)  # type: ignore[arg-type]
        if fast is not None:
            states, finished, scheduled, left = fast
            if not left:
                return states, finished, scheduled
            # The parents among them were left running: completed with their children's moves.
            rest = [outcomes[i] for i in left]
            more = _apply_all(conn, s, rest, now, channel, node, False, freed, settled)
            for i, state in zip(left, more[0], strict=True):
                states[i] = state
            return states, finished + more[1], scheduled + more[2]
    return _apply_all(conn, s, outcomes, now, channel, node, retried, freed, settled)


def _succeed_all(
    conn: Any,
    s: str,
    outcomes: Sequence[Succeeded],
    now: float,
    channel: str,
    node: str,
    freed: set[str] | None,
    settled: _flows.Settled | None,
    parents: bool,
    take: _handoff.Take | None = None,
) -> tuple[list[JobState | None], list[str], list[float], list[int]] | None:
    """Succeed distinct jobs in one statement; ``None`` when a result is unstorable (the general path fails it).

    Rows are locked in id order first; finish order (what retention evicts by) is the outcomes' order.
    A job whose locked row says it is a parent (``has_children``) is left running, for the caller to
    complete by the general path (the last item: the indexes of those outcomes), unless ``parents``:
    then the statement releases its waiting children too (see :func:`_flows.release`; the ready ones
    announced, ``r|node|n``, as it commits; ``settled`` gets the counts). Even so, a parent whose row
    changed after the statement's snapshot was taken is left running: an add (or a retry, or a
    revive) that made a child wait on it may have committed since, and the children this snapshot
    holds are not all of them (``_flows`` explains why each of those writes the parent's row); the
    general path's later statements see them. Without ``parents`` the statement is the smaller one
    (planning the release costs about as much again). ``take`` (with ``parents``): children it may
    claim for ``node`` as it releases them (``settled.claimed``; see :class:`._handoff.Take`).
    """
    results: list[str | None] = []
    for o in outcomes:
        try:
            results.append(encode_result(o.result))
        except InvalidJob:
            return None
    if parents:
        # The parents as the snapshot holds them (no lock), and what this statement completes: every
        # row unchanged since the snapshot, or no parent.
        chosen = (
            f" sn AS (SELECT j.id, j.xmin AS x FROM {s}.jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM lk"
            "   WHERE has_children))),"
            " ok AS (SELECT lk.* FROM lk LEFT JOIN sn ON sn.id = lk.id WHERE lk.has_children IS NULL OR sn.x = lk.x),"
        )
        completed = "ok"
        release, released, joined = _handoff.release_sql(s, take)
        release = "," + release
        left = (
            "ARRAY(SELECT lk.ord FROM lk LEFT JOIN sn ON sn.id = lk.id WHERE lk.has_children"
            " AND sn.x IS DISTINCT FROM lk.x ORDER BY lk.ord)"
        )
    else:  # the statement a store without flows always sent
        chosen = ""
        completed = "lk WHERE has_children IS NULL"
        release = released = joined = ""
        left = "ARRAY(SELECT ord FROM lk WHERE has_children ORDER BY ord)"
    params: dict[str, Any] = {
        "ids": [o.job_id for o in outcomes], "epochs": [o.epoch for o in outcomes], "results": results,
        "now": now, "channel": channel, "finished": f"f|{node}|", "ready": f"r|{node}|",
    }  # fmt: skip
    if take is not None:
        params.update(
            node=node, token=take.token, take_queues=list(take.queues or ("",)), take_counts=list(take.counts)
        )
    summary = (
        f"SELECT ARRAY(SELECT ord FROM done ORDER BY ord), {_finished_notice('done', named=True)},"
        f" ARRAY(SELECT DISTINCT k FROM done, unnest(done.limits) k), {left}{released}"
    )
    with _cur(conn) as cur:
        _run(
            cur,
            "WITH u AS (SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[], %(results)s::text[])"
            "   WITH ORDINALITY AS u(id, epoch, result, ord)),"
            # Lock the attempts' rows, in id order; what this finds is what the update changes (a
            # semi-join of the batch against this CTE had no index: quadratic in the batch). A row
            # written since the snapshot is locked as it is now (its newest version, its own xmin).
            f" lk AS (SELECT j.id, u.result, u.ord, j.has_children{', j.xmin AS x' if parents else ''}"
            f"   FROM {s}.jobs j JOIN u ON j.id = u.id AND j.epoch = u.epoch WHERE j.state = 'running'"
            "   ORDER BY j.id FOR UPDATE OF j),"
            f"{chosen}"
            f" s AS (SELECT o.id, o.result, o.ord{', o.has_children' if parents else ''},"
            f"   nextval('{s}.finish_seq') AS fseq FROM (SELECT * FROM {completed} ORDER BY ord) o),"
            f" done AS (UPDATE {s}.jobs j SET state = 'succeeded', attempts = j.attempts + 1,"
            "   result = s.result::json, error = NULL, finished_at = %(now)s, finish_seq = s.fseq, node = NULL,"
            "   changed_at = %(now)s"
            f"   FROM s WHERE j.id = s.id RETURNING s.ord, j.id, j.limits){release}"
            + (f" SELECT * FROM ({summary}) sm{joined}" if joined else f" {summary}"),
            params,
            prepare=parents and len(outcomes) <= PREPARED_BATCH,
        )
        rows = cur.fetchall()
    row = rows[0]  # the statement always returns a row (with children claimed: one per child)
    done = set(row[0])
    if freed is not None:
        freed.update(row[2])
    if parents and settled is not None:
        settled.results.update(_handoff.released(rows, 4, settled))
    states: list[JobState | None] = [JobState.SUCCEEDED if i + 1 in done else None for i in range(len(outcomes))]
    return states, [outcomes[i - 1].job_id for i in sorted(done)], [], [i - 1 for i in row[3]]


_ROW = (
    "id, state, epoch, attempts, max_attempts, errors::text, snoozes, run_at, finished_at, result::text, error,"
    " changed_at, limits, has_children"
)


def _apply_all(
    conn: Any,
    s: str,
    outcomes: Sequence[Outcome],
    now: float,
    channel: str,
    node: str,
    retried: bool,
    freed: set[str] | None = None,
    settled: _flows.Settled | None = None,
) -> tuple[list[JobState | None], list[str], list[float]]:
    ids = sorted({o.job_id for o in outcomes})
    states: list[JobState | None] = []
    finished: list[str] = []
    scheduled: list[float] = []
    with conn.transaction(), _cur(conn) as cur:
        _run(cur, f"SELECT {_ROW} FROM {s}.jobs WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ids,))
        rows: dict[str, dict[str, Any]] = {}
        for r in cur.fetchall():
            rows[r[0]] = {
                "state": r[1], "epoch": r[2], "attempts": r[3], "max_attempts": r[4],
                "errors": [] if r[5] is None else loads(r[5]), "snoozes": r[6], "run_at": r[7],
                "finished_at": r[8], "result": r[9], "error": r[10], "changed_at": r[11], "changed": False,
                "limits": r[12], "parent": r[13],
            }  # fmt: skip
        for outcome in outcomes:
            row = rows.get(outcome.job_id)
            if row is None or row["epoch"] != outcome.epoch:
                states.append(None)
                continue
            if row["state"] != "running":
                # Refused, unless this is the first try's own work, committed unseen.
                mine = retried and row["changed_at"] == now and not row["changed"]
                states.append(JobState(row["state"]) if mine else None)
                row["changed"] = row["changed"] or mine  # one outcome per attempt is the first try's
                if mine and freed is not None:
                    freed.update(row["limits"])  # the first try freed them; its unpark may not have run
                continue
            _apply(row, outcome, now)
            if freed is not None:
                freed.update(row["limits"])
            row["changed"] = row["written"] = True
            state = row["state"]
            states.append(JobState(state))
            if state in _TERMINAL:
                row["order"] = len(finished)
                finished.append(outcome.job_id)
            elif state == "scheduled":
                scheduled.append(row["run_at"])
        changed = [(job_id, row) for job_id, row in rows.items() if row.get("written")]
        if changed:
            _write_back(cur, s, changed, len(finished), now)
        if finished:
            text = ",".join(finished)
            _run(cur, "SELECT pg_notify(%s, %s)", (channel, f"f|{node}|{text if len(text) <= _NOTIFY_IDS else '*'}"))
            ended = [(job_id, rows[job_id]["state"]) for job_id in finished if rows[job_id]["parent"]]
            if ended:  # parents: their children move in this transaction (see _flows)
                done = _flows.settle(
                    cur, s, now, channel, node, [p for p, st in ended if st == "succeeded"],
                    [(p, st) for p, st in ended if st != "succeeded"],
                )  # fmt: skip
                finished += done.cancelled
                if settled is not None:
                    settled += done
    return states, finished, scheduled


def _write_back(cur: Any, s: str, changed: list[tuple[str, dict[str, Any]]], finishing: int, now: float) -> None:
    """Write the rows :func:`_apply_all` changed; those that finished get finish sequence numbers in order."""
    seqs: list[int | None] = [None] * len(changed)
    if finishing:
        _run(cur, f"SELECT nextval('{s}.finish_seq') FROM generate_series(1, {finishing})")
        block = [r[0] for r in cur.fetchall()]
        for i, (_, row) in enumerate(changed):
            if "order" in row:
                seqs[i] = block[row["order"]]
    _run(
        cur,
        f"UPDATE {s}.jobs j SET state = u.state, attempts = u.attempts, errors = u.errors::json,"
        " snoozes = u.snoozes, run_at = u.run_at, finished_at = u.finished_at, finish_seq = u.fseq,"
        " result = u.result::json, error = u.error, changed_at = %s,"
        " node = CASE WHEN u.state = 'running' THEN j.node END"
        " FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::int[], %s::float8[],"
        "  %s::float8[], %s::bigint[], %s::text[], %s::text[])"
        "  AS u(id, state, attempts, errors, snoozes, run_at, finished_at, fseq, result, error)"
        " WHERE j.id = u.id",
        (
            now,
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


def evict(conn: Any, s: str, cutoff: float, max_retained: int, batch: int = 1000) -> int:
    """Drop terminal jobs oldest finish first while they finished at or before ``cutoff`` or are beyond
    ``max_retained``, stopping at the first that is neither (as the in-process table does); how many.

    Evictions take turns (a transaction-scoped advisory lock): two at once
    would each drop the same excess.
    """
    evicted = 0
    retained: int | None = None
    while True:
        with conn.transaction(), _cur(conn) as cur:
            _run(cur, "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"trioq-evict:{s}",))
            if retained is None:  # once per call: each batch takes its own off (a retry meanwhile: one more)
                _run(cur, f"SELECT count(*) FROM {s}.jobs WHERE finish_seq IS NOT NULL")
                retained = _one(cur)
            _run(cur, f"SELECT id, finished_at, has_children FROM {s}.jobs WHERE finish_seq IS NOT NULL"
                      f" ORDER BY finish_seq LIMIT {int(batch)} FOR UPDATE SKIP LOCKED")  # fmt: skip
            oldest = cur.fetchall()
            gone: list[str] = []
            parents: list[str] = []
            for job_id, finished_at, has_children in oldest:
                if retained - len(gone) <= max_retained and finished_at > cutoff:
                    break
                gone.append(job_id)
                if has_children:
                    parents.append(job_id)
            if gone:
                _run(cur, f"DELETE FROM {s}.jobs WHERE id = ANY(%s)", (gone,))
            if parents:  # a parent gone moves nobody again (a child names it still, as a met parent)
                _run(cur, f"DELETE FROM {s}.flow_edges WHERE parent = ANY(%s)", (parents,))
        evicted += len(gone)
        retained -= len(gone)
        if len(gone) < len(oldest) or len(oldest) < batch:
            return evicted


# ---------------------------------------------- promote, rescue, nodes


@attrs.frozen
class Promoted:
    """What :func:`promote` did: how many scheduled jobs it made ready, the ids of the jobs it cancelled
    for their deadline (in deadline order), and what it read last: the next ``run_at`` of a scheduled
    job, the next pending deadline, and the paused queues."""

    promoted: int
    expired: list[str]
    next_run_at: float | None
    next_deadline: float | None
    paused: list[str]
    #: Jobs parked for a rate that it unparked (their token is due), and when the next parked one is due.
    unparked: int = 0
    next_unpark: float | None = None

    @property
    def next_due(self) -> float | None:
        """When something is next due (the earliest of :attr:`next_run_at`, :attr:`next_deadline` and
        :attr:`next_unpark`), or ``None``."""
        due = [at for at in (self.next_run_at, self.next_deadline, self.next_unpark) if at is not None]
        return min(due) if due else None


def promote(
    conn: Any,
    s: str,
    now: float,
    channel: str,
    node: str,
    batch: int = 1000,
    *,
    freed: set[str] | None = None,
    settled: _flows.Settled | None = None,
) -> Promoted:
    """Cancel never-claimed jobs whose deadline is at or before ``now`` (:func:`expire`), then make due
    scheduled jobs ready.

    One statement when nothing is due (it reads the next run_at, the next
    deadline and the paused queues, each an index probe or a tiny table);
    the work and a second look only when something is.
    """
    with _cur(conn) as cur:
        next_run_at, next_deadline, paused, next_unpark = _next_due(cur, s)
        expired: list[str] = []
        total = unparked = 0
        if next_deadline is not None and next_deadline <= now:
            expired = expire(conn, s, now, channel, node, batch, freed=freed, settled=settled)
        if next_unpark is not None and next_unpark <= now:
            while True:  # jobs passed over for a rate whose token is due: claimable again
                _run(
                    cur,
                    f"UPDATE {s}.jobs SET parked = NULL WHERE id IN (SELECT id FROM {s}.jobs"
                    f" WHERE state = 'ready' AND parked IS NOT NULL AND parked <= %s ORDER BY parked"
                    f" LIMIT {int(batch)} FOR UPDATE SKIP LOCKED)",
                    (now,),
                )
                unparked += cur.rowcount
                if cur.rowcount < batch:
                    break
        if next_run_at is not None and next_run_at <= now:
            while True:
                _run(
                    cur,
                    f"UPDATE {s}.jobs SET state = 'ready' WHERE id IN (SELECT id FROM {s}.jobs"
                    f" WHERE state = 'scheduled' AND run_at <= %s ORDER BY run_at LIMIT {int(batch)}"
                    " FOR UPDATE SKIP LOCKED)",
                    (now,),
                )
                total += cur.rowcount
                if cur.rowcount < batch:
                    break
        if expired or total or unparked or (next_run_at is not None and next_run_at <= now):
            next_run_at, next_deadline, paused, next_unpark = _next_due(cur, s)
    return Promoted(total, expired, next_run_at, next_deadline, paused, unparked, next_unpark)


def _next_due(cur: Any, s: str) -> tuple[float | None, float | None, list[str], float | None]:
    """``(the next run_at of a scheduled job, the next pending deadline, the paused queues, when the next job
    parked for a rate is due)``; jobs parked for a slot ('Infinity') are due at no time."""
    _run(
        cur,
        f"SELECT (SELECT min(run_at) FROM {s}.jobs WHERE state = 'scheduled'),"
        f" (SELECT min(deadline) FROM {s}.jobs WHERE {_PENDING_DEADLINE}), ARRAY(SELECT queue FROM {s}.paused),"
        f" (SELECT min(parked) FROM {s}.jobs WHERE state = 'ready' AND parked IS NOT NULL)",
    )
    next_run_at, next_deadline, paused, next_unpark = _row(cur)
    if next_unpark is not None and next_unpark == math.inf:
        next_unpark = None
    return next_run_at, next_deadline, sorted(paused), next_unpark


def expire(
    conn: Any,
    s: str,
    now: float,
    channel: str,
    node: str,
    batch: int = 1000,
    *,
    freed: set[str] | None = None,
    settled: _flows.Settled | None = None,
) -> list[str]:
    """Cancel every never-claimed job (ready, scheduled, deferred or waiting) whose deadline is at or
    before ``now``; their ids, in deadline order.

    Each is cancelled as :func:`cancel` would (``finished_at``, a finish
    sequence number in deadline order, the ``f|node|ids`` notification as it
    commits), its error :func:`~trioq._model.deadline_error`'s (made here:
    the text formats a number as Python does). ``batch`` jobs per pair of
    statements: a look-up in ``jobs_deadline`` order, then one statement that
    locks them in id order, skipping those another transaction holds (a
    claim that saw the job still in time, a cancel, another node's expiry:
    each decides that job) and re-checking that each is still expirable.
    ``freed`` gets the limit keys of the jobs cancelled: one may have been let go for a slot it now
    never takes, which the caller passes on (``_limits.unpark``). A parent cancelled so cancels its
    waiting children in the same transaction (:func:`._flows.cascade`; ``settled`` gets their ids).
    """
    expired: list[str] = []
    with _cur(conn) as cur:
        while True:
            _run(
                cur,
                f"SELECT id, created_at, deadline FROM {s}.jobs WHERE deadline <= %s AND {_PENDING_DEADLINE}"
                f" ORDER BY deadline LIMIT {int(batch)}",
                (now,),
            )
            due = cur.fetchall()
            if not due:
                break
            with conn.transaction():
                _run(
                    cur,
                    "WITH u AS (SELECT * FROM unnest(%s::text[], %s::float8[], %s::text[]) WITH ORDINALITY"
                    "   AS u(id, deadline, error, ord)),"
                    f" lk AS (SELECT j.id, u.error, u.ord FROM {s}.jobs j JOIN u ON j.id = u.id"
                    "   AND j.deadline = u.deadline WHERE j.epoch = 0"
                    "   AND j.state IN ('ready', 'scheduled', 'deferred', 'waiting')"
                    "   ORDER BY j.id FOR UPDATE OF j SKIP LOCKED),"
                    f" s AS (SELECT o.id, o.error, o.ord, nextval('{s}.finish_seq') AS fseq"
                    "   FROM (SELECT * FROM lk ORDER BY ord) o),"
                    f" done AS (UPDATE {s}.jobs j SET state = 'cancelled', finished_at = %s, finish_seq = s.fseq,"
                    "   error = s.error, changed_at = %s, node = NULL, unmet = NULL FROM s WHERE j.id = s.id"
                    "   RETURNING s.ord, j.id, j.limits, j.has_children)"
                    f" SELECT ARRAY(SELECT id FROM done ORDER BY ord), {_finished_notice('done')},"
                    " ARRAY(SELECT DISTINCT k FROM done, unnest(done.limits) AS k),"
                    " ARRAY(SELECT id FROM done WHERE has_children ORDER BY id)",
                    (
                        [r[0] for r in due],
                        [r[2] for r in due],
                        [deadline_error(r[1], r[2]) for r in due],
                        now,
                        now,
                        channel,
                        f"f|{node}|",
                    ),
                )
                row = _row(cur)
                if row[3]:  # parents: their waiting children are cancelled with them
                    moved = _flows.settle(cur, s, now, channel, node, (), [(p, "cancelled") for p in row[3]])
                    if settled is not None:
                        settled += moved
            done = row[0]
            if freed is not None:
                freed.update(row[2])
            expired += done
            if len(due) < batch or not done:  # the rest are held by others, who decide them
                break
    return expired


def rescue(conn: Any, s: str, now: float, *, freed: set[str] | None = None) -> int:
    """Put the running jobs of every node whose lease lapsed (or whose row is gone) back to ready,
    uncounted; forget those nodes. Rows another transaction holds (a late completion) are left to it.
    ``freed`` gets the limit keys of the jobs rescued: their slots are free once this commits."""
    with conn.transaction(), _cur(conn) as cur:
        _run(cur, f"SELECT id FROM {s}.nodes WHERE expires_at < %s ORDER BY id FOR UPDATE SKIP LOCKED", (now,))
        lapsed = [row[0] for row in cur.fetchall()]
        _run(
            cur,
            f"UPDATE {s}.jobs SET state = 'ready', node = NULL WHERE id IN (SELECT j.id FROM {s}.jobs j"
            f"  WHERE j.state = 'running' AND (j.node = ANY(%s)"
            f"   OR NOT EXISTS (SELECT 1 FROM {s}.nodes n WHERE n.id = j.node))"
            "  ORDER BY j.id FOR UPDATE SKIP LOCKED) RETURNING limits",
            (lapsed,),
        )
        rescued = int(cur.rowcount)
        _freed(cur, freed)
        if lapsed:
            _run(cur, f"DELETE FROM {s}.nodes WHERE id = ANY(%s)", (lapsed,))
    return rescued


def release_node(conn: Any, s: str, node: str, *, freed: set[str] | None = None) -> int:
    """Put ``node``'s running jobs back to ready (its session ends) and forget the node; ``freed`` gets their
    limit keys (as :func:`rescue`'s)."""
    with conn.transaction(), _cur(conn) as cur:
        _run(
            cur,
            f"UPDATE {s}.jobs SET state = 'ready', node = NULL WHERE id IN (SELECT id FROM {s}.jobs"
            "  WHERE state = 'running' AND node = %s ORDER BY id FOR UPDATE) RETURNING limits",
            (node,),
        )
        released = int(cur.rowcount)
        _freed(cur, freed)
        _run(cur, f"DELETE FROM {s}.nodes WHERE id = %s", (node,))
    return released


def _freed(cur: Any, freed: set[str] | None) -> None:
    """Add the limit keys of the rows the statement just run returned (``RETURNING limits``) to ``freed``."""
    for (keys,) in cur.fetchall():
        if keys and freed is not None:
            freed.update(keys)


def lead(conn: Any, s: str, node: str, now: float, ttl: float) -> bool:
    """Take or keep the leader's row for ``ttl`` seconds if it is free, lapsed or ``node``'s; whether ``node`` leads."""
    with _cur(conn) as cur:
        _run(
            cur,
            f"INSERT INTO {s}.leader (name, node, expires_at) VALUES ('leader', %s, %s) ON CONFLICT (name) DO UPDATE"
            f" SET node = excluded.node, expires_at = excluded.expires_at"
            f" WHERE {s}.leader.node = excluded.node OR {s}.leader.expires_at < %s RETURNING node",
            (node, now + ttl, now),
        )
        return cur.fetchone() is not None


def resign(conn: Any, s: str, node: str) -> None:
    """Give up the leader's row if ``node`` holds it (a clean shutdown: another node takes over at once)."""
    with _cur(conn) as cur:
        _run(cur, f"DELETE FROM {s}.leader WHERE node = %s", (node,))


# ------------------------------------------------------------- views


def get(conn: Any, s: str, job_id: str) -> Job:
    with _cur(conn) as cur:
        row = _run(cur, f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = %s", (job_id,)).fetchone()
    if row is None:
        raise _not_found(job_id)
    return job_from_row(row)


def watched_terminal(conn: Any, s: str, ids: Sequence[str]) -> list[Job]:
    """Snapshots of those of ``ids`` that are terminal now."""
    with _cur(conn) as cur:
        _run(
            cur,
            f"SELECT {COLUMNS} FROM {s}.jobs WHERE id = ANY(%s) AND state IN ('succeeded', 'dead', 'cancelled')",
            (list(ids),),
        )
        return [job_from_row(row) for row in cur.fetchall()]


def counts(conn: Any, s: str) -> dict[str, int]:
    """Jobs per state: one scan of the table (the partial indexes do not cover the terminal states)."""
    with _cur(conn) as cur:
        found = dict(_run(cur, f"SELECT state, count(*) FROM {s}.jobs GROUP BY state").fetchall())
    return {name: int(found.get(name, 0)) for name in sorted(_STATE_NAMES)}


def has_pending(conn: Any, s: str) -> bool:
    """Whether any job is ready, scheduled, running, deferred or waiting: index probes, whatever the table
    holds.

    Each probe is a scalar subquery ordered as its partial index is (an ``EXISTS`` would drop the
    order), so that the planner walks the index even when it believes most rows qualify: a
    sequential scan reads every row a drain left behind before the first ready one.

    Prepared (on the store's pooled connections, where only a call that asks prepares): ``join()`` sends
    it every few milliseconds of a drain, it takes no parameter (so its generic plan is the plan), and
    planning its six probes cost about four times running them.
    """
    with _cur(conn) as cur:
        _run(
            cur,
            f"SELECT (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL"
            f" ORDER BY priority DESC, run_at, seq LIMIT 1) IS NOT NULL"
            f" OR (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NOT NULL ORDER BY parked LIMIT 1)"
            f" IS NOT NULL OR (SELECT 1 FROM {s}.jobs WHERE state = 'scheduled' ORDER BY run_at LIMIT 1) IS NOT NULL"
            f" OR (SELECT 1 FROM {s}.jobs WHERE state = 'running' ORDER BY node LIMIT 1) IS NOT NULL"
            f" OR (SELECT 1 FROM {s}.jobs WHERE state = 'deferred' AND seq > 0 ORDER BY seq LIMIT 1) IS NOT NULL"
            f" OR (SELECT 1 FROM {s}.jobs WHERE state = 'waiting' ORDER BY seq LIMIT 1) IS NOT NULL",
            prepare=True,
        )
        return bool(_row(cur)[0])


def jobs(conn: Any, s: str, states: Collection[JobState], limit: int) -> list[Job]:
    with _cur(conn) as cur:
        _run(
            cur,
            f"SELECT {COLUMNS} FROM {s}.jobs WHERE state = ANY(%s) ORDER BY seq LIMIT {int(limit)}",
            ([JobState(state).value for state in states],),
        )
        return [job_from_row(row) for row in cur.fetchall()]
