"""Deferred jobs in SQL (``StoreConfig.defer_past``): the add that defers, and the admission.

A job added while ``N`` or more jobs are ready or scheduled (the batch's
earlier ones counted), or while any job is deferred, is inserted ``deferred``:
kept, keyed (``jobs_key`` covers every state), counted, cancellable, its
deadline running (``jobs_deadline`` covers it), never claimed. :func:`admit`
makes deferred jobs ready (or scheduled, their ``run_at`` still ahead) oldest
first (``jobs_deferred``), or, with fairness, the tenant furthest behind its
weighted share of admissions first (``jobs_deferred_tenant``, the tags of
``_fair`` under the queue ``''``), while fewer than ``N`` are ready or
scheduled. It runs inside the transaction of the transition that made room
(a claim, a cancel, an expiry), at session open, and at every promote (which
catches what concurrency left: see below).

Counting is bounded: ready plus scheduled jobs are counted up to ``N`` (three
index scans stopped at the bound), and only when something asks: an add while
nothing is deferred, an admission while something is. A transition on a store
where nothing is deferred pays one probe of ``jobs_deferred`` (an empty index:
one page). Admissions take turns (a transaction-scoped advisory lock, taken
only when a job is deferred), and count after the lock, so two never admit
into the same room. Adds do not take it: adds on several nodes at once may
each see the same room, so the bound is global but approximate by what such
adds bring at once (a few jobs); nothing is ever lost or admitted twice (each
admission locks the rows it admits, skipping those another holds). A job
deferred by an add that commits just after a claim's admission looked waits
for the next claim or promote (each node's promote runs every
``poll_interval``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from .._base import NewJob
from . import _fair
from . import _transitions as sql
from ._sql import cursor as _cur
from ._sql import one_row as _row
from ._sql import run as _run

__all__ = ["Admitted", "add", "admit"]


@attrs.define
class Admitted:
    """What an admission made of deferred jobs: how many are ready now, the ``run_at`` of each scheduled."""

    ready: int = 0
    scheduled: list[float] = attrs.Factory(list)

    def __iadd__(self, other: Admitted) -> Admitted:
        self.ready += other.ready
        self.scheduled += other.scheduled
        return self

    def __bool__(self) -> bool:
        return bool(self.ready or self.scheduled)


T = TypeVar("T")


def admitting(
    conn: Any, s: str, bound: int | None, now: float, weights: Mapping[str, float] | None, step: Callable[[], T]
) -> tuple[T, Admitted]:
    """``step()`` (a transition that may make room: a claim, a cancel, an expiry), then the admission of
    deferred jobs into that room (:func:`admit`), both in one transaction; ``bound=None`` (no
    ``defer_past``): ``step()`` alone, as it always ran, admitting nothing."""
    if bound is None:
        return step(), Admitted()
    with conn.transaction():
        done = step()
        return done, admit(conn, s, bound, now, weights)


def _probe(s: str) -> str:
    """SQL of whether any job is deferred: the first entry of ``jobs_deferred`` (an ``EXISTS`` may be planned
    as a scan of the table)."""
    return f"(SELECT 1 FROM {s}.jobs WHERE state = 'deferred' AND seq > 0 ORDER BY seq LIMIT 1) IS NOT NULL"


def _count(s: str, bound: int) -> str:
    """SQL of how many jobs are ready or scheduled, counted up to ``bound`` in each of three index scans.

    Each scan is ordered as its partial index (``jobs_ready``, ``jobs_parked``, ``jobs_scheduled``), as
    ``has_pending``'s probes are, so that the planner reads the index even when its statistics are off;
    without an order it may read the table until it finds ``bound`` rows, all of it when fewer are there.
    """
    b = int(bound)
    return (
        f"(SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NULL"
        f"  ORDER BY priority DESC, run_at, seq LIMIT {b}) r)"
        f" + (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'ready' AND parked IS NOT NULL"
        f"  ORDER BY parked LIMIT {b}) p)"
        f" + (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE state = 'scheduled' ORDER BY run_at LIMIT {b}) sc)"
    )


def _lock(cur: Any, s: str) -> None:
    _run(cur, "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"trioq-admit:{s}",))


def admit(conn: Any, s: str, bound: int, now: float, weights: Mapping[str, float] | None) -> Admitted:
    """Admit deferred jobs while fewer than ``bound`` are ready or scheduled; in one transaction (the
    caller's, if it is in one). One probe when nothing is deferred."""
    with conn.transaction(), _cur(conn) as cur:
        if not _row(_run(cur, f"SELECT {_probe(s)}"))[0]:
            return Admitted()
        _lock(cur, s)
        room = int(bound) - int(_row(_run(cur, f"SELECT {_count(s, bound)}"))[0])
        return _admit_locked(cur, s, room, now, weights)


def admit_all(conn: Any, s: str, now: float) -> Admitted:
    """Admit every deferred job (a session without a bound opens on jobs an earlier one deferred), in
    one statement (all of them: no order to keep); one probe when nothing is deferred."""
    with conn.transaction(), _cur(conn) as cur:
        if not _row(_run(cur, f"SELECT {_probe(s)}"))[0]:
            return Admitted()
        _lock(cur, s)
        return _admit_locked(cur, s, 2**62, now, None)


def _admit_locked(cur: Any, s: str, room: int, now: float, weights: Mapping[str, float] | None) -> Admitted:
    """Admit up to ``room`` deferred jobs (the admission lock held), oldest first or fairly."""
    if room <= 0:
        return Admitted()
    live = "(deadline IS NULL OR deadline > %(now)s)"
    params: dict[str, Any] = {"now": now}
    new_state = "CASE WHEN j.run_at <= %(now)s THEN 'ready' ELSE 'scheduled' END"
    if weights is None:
        _run(
            cur,
            f"UPDATE {s}.jobs j SET state = {new_state} WHERE j.id IN (SELECT id FROM {s}.jobs"
            f" WHERE state = 'deferred' AND seq > 0 AND {live} ORDER BY seq LIMIT {int(room)} FOR UPDATE SKIP LOCKED)"
            " RETURNING j.state, j.run_at",
            params,
        )
        return _admitted(cur.fetchall())
    _run(
        cur,
        "WITH RECURSIVE t(tenant) AS ("
        f" (SELECT coalesce(tenant, '') FROM {s}.jobs WHERE state = 'deferred' AND epoch >= 0"
        "  ORDER BY coalesce(tenant, ''), seq LIMIT 1)"
        f" UNION ALL SELECT (SELECT coalesce(tenant, '') FROM {s}.jobs WHERE state = 'deferred' AND epoch >= 0"
        "  AND coalesce(tenant, '') > t.tenant ORDER BY coalesce(tenant, ''), seq LIMIT 1) FROM t"
        "  WHERE t.tenant IS NOT NULL)"
        " SELECT t.tenant, h.seq, ft.finish, fc.v FROM t CROSS JOIN LATERAL"
        f" (SELECT seq FROM {s}.jobs WHERE state = 'deferred' AND epoch >= 0 AND coalesce(tenant, '') >= t.tenant"
        f"  AND coalesce(tenant, '') <= t.tenant AND {live} ORDER BY coalesce(tenant, ''), seq LIMIT 1) h"
        f" LEFT JOIN {s}.fair_tags ft ON ft.queue = '' AND ft.tenant = t.tenant"
        f" LEFT JOIN {s}.fair_clock fc ON fc.queue = '' WHERE t.tenant IS NOT NULL",
        params,
    )
    found = cur.fetchall()
    if not found:
        return Admitted()
    clock: dict[str, float] = {}
    groups: list[_fair.Group] = []
    for tenant, seq, finish, v in found:
        if v is not None:
            clock[_fair.ADMISSION] = float(v)
        groups.append(
            _fair.Group(_fair.ADMISSION, tenant, _fair.weight_of(weights, tenant), (seq,), float(finish or 0.0))
        )
    locked: list[str] = []

    def fetch(wanted: dict[_fair.Group, int]) -> None:
        order = list(wanted)
        params.update(at=[g.tenant for g in order], ak=[wanted[g] for g in order], exclude=locked)
        _run(
            cur,
            "WITH a AS (SELECT * FROM unnest(%(at)s::text[], %(ak)s::int[]) WITH ORDINALITY AS a(tenant, k, ord))"
            " SELECT a.ord, x.id, x.seq FROM a CROSS JOIN LATERAL"
            f" (SELECT id, seq FROM {s}.jobs WHERE state = 'deferred' AND epoch >= 0"
            f"  AND coalesce(tenant, '') >= a.tenant AND coalesce(tenant, '') <= a.tenant AND {live}"
            "  AND id <> ALL(%(exclude)s)"
            "  ORDER BY coalesce(tenant, ''), seq LIMIT a.k FOR UPDATE SKIP LOCKED) x ORDER BY a.ord, x.seq",
            params,
        )
        for ord_, job_id, seq in cur.fetchall():
            order[ord_ - 1].buffer.append((job_id, seq))
            locked.append(job_id)

    taken = _fair.take(groups, clock, room, fetch, lambda row: (row[1],))
    if not taken:
        return Admitted()
    params.update(_fair.charge_params(groups, clock, [_fair.ADMISSION]))
    params["ids"] = [row[0] for _, row in taken]
    _run(
        cur,
        "WITH ids AS (SELECT * FROM unnest(%(ids)s::text[]) AS u(id)),"
        f" c AS (UPDATE {s}.jobs j SET state = {new_state} FROM ids WHERE j.id = ids.id RETURNING j.state, j.run_at),"
        + _fair.charge_sql(s)
        + " SELECT * FROM c",
        params,
    )
    return _admitted(cur.fetchall())


def _admitted(rows: Sequence[tuple[str, float]]) -> Admitted:
    done = Admitted()
    for state, run_at in rows:
        if state == "ready":
            done.ready += 1
        else:
            done.scheduled.append(float(run_at))
    return done


def add(
    conn: Any,
    s: str,
    rows: Sequence[tuple[str, NewJob, str]],
    now: float,
    bound: int,
    max_pending: int | None,
    notify: tuple[str, str] | None,
    weights: Mapping[str, float] | None,
    *,
    retried: bool = False,
    admit_first: bool = True,
    check: Callable[[list[Any]], object] | None = None,
) -> tuple[list[Any], list[str], Admitted]:
    """:func:`_transitions.add` deferring past ``bound``: ``(what it answers, each row's state as inserted
    ('' for a row whose key was held), what it admitted first)``.

    In one transaction: the deferred probe and the bounded count; when jobs are deferred yet there is
    room (an admission missed it), they are admitted first (under the admission lock), so that the new
    jobs queue behind the old (unless ``admit_first`` is false: ``enqueue_tx``, in the caller's
    transaction); then each new job is ready (or scheduled) while the count stays below
    ``bound`` and nothing is deferred, else deferred. ``check``: as :func:`_transitions.add`'s.
    """
    ids = [r[0] for r in rows]
    hashes = [None if r[1].key is None else sql.key_hash(r[1].key) for r in rows]
    with conn.transaction(), _cur(conn) as cur:
        if retried:
            _run(cur, f"SELECT id, state FROM {s}.jobs WHERE id = ANY(%s)", (ids,))
            had = dict(cur.fetchall())
            if had:  # the first try committed: each job is in, or its key's holder answers
                missing = [i for i, job_id in enumerate(ids) if job_id not in had]
                found = sql._holders(cur, s, rows, hashes, missing, inserted=set(had))
                return found, [had.get(job_id, "") for job_id in ids], Admitted()
        if max_pending is not None:
            sql._admit(cur, s, rows, hashes, max_pending)
        deferred, pending = _row(_run(cur, f"SELECT {_probe(s)}, {_count(s, bound)}"))
        pending = int(pending)
        admitted = Admitted()
        if deferred and pending < bound and admit_first:
            _lock(cur, s)
            pending = int(_row(_run(cur, f"SELECT {_count(s, bound)}"))[0])
            room = bound - pending
            admitted = _admit_locked(cur, s, room, now, weights)
            pending += admitted.ready + len(admitted.scheduled)
            deferred = bool(_row(_run(cur, f"SELECT {_probe(s)}"))[0])
        held: set[bytes] = set()
        wanted = [h for h in hashes if h is not None]
        if wanted:
            _run(cur, f"SELECT key_hash FROM {s}.jobs WHERE key_hash = ANY(%s)", (wanted,))
            held = {bytes(row[0]) for row in cur.fetchall()}
        states: list[str] = []
        for (_, job, _), h in zip(rows, hashes, strict=True):
            if h is not None and h in held:
                states.append("ready")  # not inserted: its key's holder answers
                continue
            if h is not None:
                held.add(h)
            if deferred or pending >= bound:
                states.append("deferred")
                deferred = True
            else:
                states.append("scheduled" if job.delay > 0 else "ready")
                pending += 1
        if not wanted and len(rows) >= sql.COPY_FROM:
            sql._copy(cur, s, rows, now, notify, states)
            inserted = set(ids)
        else:
            inserted, _ = sql._insert(cur, s, rows, hashes, now, notify, states)
        missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
        found = [None] * len(rows) if not missing else sql._holders(cur, s, rows, hashes, missing, inserted=inserted)
        if check is not None:
            check(found)
    return found, [st if job_id in inserted else "" for job_id, st in zip(ids, states, strict=True)], admitted
