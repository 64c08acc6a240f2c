"""Limit keys in SQL: the claim of jobs that hold keys, and the unparking of the jobs passed over.

A key's slots are counted from the running rows that hold it (``jobs_holding``,
a GIN index over ``limits`` of running rows, read by ``limit_holders``): no
counter a crash can leave behind; a dead node's attempts hold their slots until
they are rescued or released, and not a moment longer. A rate's state is one
row of ``limit_rates`` (its GCRA's theoretical arrival time), written by the
claims that take its tokens.

Every claim that decides a key holds a transaction-scoped advisory lock on it
(:func:`lock_id`), taken before the statements that count its holders and read
its rate: two nodes never both see the last slot free. The rate rows are read
``FOR UPDATE`` too (a writer that does not take the advisory lock, an operator's
``SELECT ... FOR UPDATE``, is waited for there, not at the write), and a rate is
decided at the time the claim's clock reads once it holds them, not at the time
the claim was asked for: a claim that waited a second for a lock starts its jobs
a second later, and charging their tokens at the earlier time would leave the
bucket a second fuller than the starts allow (invariant 8 counts starts). Locks are taken in
ascending id order; a later batch of the same claim only *tries* ids below the
highest it holds (and leaves the jobs whose key it could not lock), so that two
claims never wait for each other in a cycle. A transaction that frees slots
(an outcome, a cancel, a rescue, a release) commits first; :func:`unpark` then
takes the same locks and, with a snapshot taken after them, unparks as many of
the jobs waiting on each key as it has free slots: a claim that counted the
freed attempt as running and parked a job for it has committed by then, so no
job is left parked behind a free slot. Were a node to die between the two, the
leader's :func:`repair` (with every rescue) unparks what is owed.

A job passed over is parked (``parked`` set): for a slot, until
:func:`unpark` lets it go (``'Infinity'``, ``parked_key`` the full key); for a
rate, until its token is due (``promote`` unparks it then). The claims' indexes
leave parked jobs out, so a backlog blocked on one key is read once, not by
every claim.

With fairness (``StoreConfig.fairness``) a claim decides its candidates in
fair order (``_fair.FairPick``) and an unpark lets the parked jobs go fairly
among their tenants (see :func:`unpark`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..._model import Job, Limit
from .._base import no_limits
from ._fair import FairPick
from ._rows import WIDTH, job_from_row
from ._sql import cursor as _cur
from ._sql import run as _run

__all__ = ["MAX_KEYS", "claim", "lock_id", "repair", "unpark"]

#: The most keys one claim (or one unpark transaction) locks: advisory locks live in the server's
#: shared lock table (``max_locks_per_transaction`` per connection on average).
MAX_KEYS = 64
#: A key without ``max`` has room for everyone (the bound the unpark statement is given for it).
_UNBOUNDED = 1 << 62
_EXTRA = 16  # candidates read past the claim's limit in the first batch: some will be passed over
_MOST = 1000  # candidates read at most per batch
#: The parked jobs of a key a fair unpark chooses among (the first in claim order): jobs_blocked has no
#: tenant in it, so a tenant whose parked jobs all lie past these waits for the older ones to go.
_FAIR_WINDOW = 1000


def lock_id(s: str, key: str) -> int:
    """The advisory lock of ``key`` in schema ``s`` (64 bits of a hash; a collision only serializes more)."""
    return int.from_bytes(hashlib.blake2b(f"trioq-limit:{s}:{key}".encode(), digest_size=8).digest(), signed=True)


def bounding(limit_of: Callable[[str], Limit | None]) -> Callable[[str], Limit | None]:
    """``limit_of``, cached, answering ``None`` for a key whose limit bounds nothing."""
    cache: dict[str, Limit | None] = {}

    def bound(key: str) -> Limit | None:
        try:
            return cache[key]
        except KeyError:
            limit = limit_of(key)
            if limit is not None and limit.max is None and limit.rate is None:
                limit = None
            cache[key] = limit
            return limit

    return bound


def claim(
    conn: Any,
    s: str,
    node: str,
    n: int,
    token: str,
    now: float,
    limit_of: Callable[[str], Limit | None],
    pick: Callable[[int, bool, dict[str, Any]], str],
    columns: str,
    fair: FairPick | None = None,
    clock: Callable[[], float] | None = None,
) -> tuple[list[Job], float | None, bool]:
    """Claim up to ``n`` jobs in one transaction, passing over (parking) those a key refuses; ``(jobs claimed
    best first, when the first job parked for a rate is due or None, whether the claim stopped short
    at :data:`MAX_KEYS` with candidates left)``.

    ``pick(m, exclude, params)``: the SQL of CTE ``c`` (``id, limits``), the best ``m`` claimable jobs,
    locked, without the ids of ``params["exclude"]`` if ``exclude``. Candidates are read in batches
    (``n + 16``, then doubling up to 1,000) until ``n`` are claimed or none is left; each batch's jobs
    are decided in order as :class:`~trioq.stores.table.limits.LimitState` decides them: the first
    full key (fewer than ``max`` holders is room) parks a job for a slot; else a rate that admits no
    start parks it until the latest of its keys' tokens is due; else it starts, taking a slot of each
    key and a token of each rate.

    ``fair``: the candidates are ``fair.pick``'s (``pick`` is not called), in fair order, as the table
    store pops its fair heads: each one decided (started or parked) charges its tenant
    (:meth:`FairPick.consider`), the next batch's order goes on from those charges, the tags are written
    as the transaction ends, and the jobs come back in the order they were decided. A fair batch may be
    short with candidates left (a tenant's share, the best priority's jobs all decided), so the
    candidates are read until a batch is empty.

    ``now`` picks the candidates (their run times and deadlines). Rates are decided at ``clock()`` read
    once this transaction holds the locks and rate rows of the keys it decides (read again after each
    later batch's locks, once a rate key is decided: that batch may have waited for a key of its own;
    never before ``now``): the time the jobs it starts really start, give or take the commit.
    ``clock=None`` decides them at ``now`` (a caller with a fixed time).
    """
    bound = bounding(limit_of)
    held: dict[str, int] = {}  # key -> attempts holding it (this claim's included), for each key decided
    tats: dict[str, float] = {}  # key -> its tat, for each rate key decided
    queued: dict[str, float] = {}  # key -> its tat once the jobs parked for its rate so far have started
    locked: set[int] = set()
    unlockable: set[str] = set()
    left: list[str] = []  # candidates this transaction holds but leaves (a key it could not lock)
    rows: list[Any] = []
    due: float | None = None
    more = False
    # Keys with room that a job parked here for another key (or a rate) held: it may have been let go
    # for a slot of one of them, which then goes to the next job in line (unparked after the commit).
    passed: set[str] = set()
    m = n + _EXTRA
    taken: list[str] = []  # the ids started, in the order decided
    at = now  # the time rates are decided at: the clock's once the locks and rate rows are held
    with conn.transaction(), _cur(conn) as cur:
        while len(rows) < n:
            params: dict[str, Any] = {"now": now, "exclude": left}
            if fair is None:
                _run(cur, pick(m, bool(left), params) + " SELECT id, limits FROM c", params)
            else:
                _run(cur, fair.pick(m, bool(left), params) + fair.select, params)
            batch: list[Any] = cur.fetchall()
            # The keys to decide: lock the new ones, at most MAX_KEYS in all (the rest wait for a later claim).
            fresh: dict[str, int] = {}  # key -> its lock id, for each key this batch decides first
            usable = len(batch)
            for i, candidate in enumerate(batch):
                keys = candidate[1]
                new = {
                    k: lock_id(s, k) for k in keys if k not in fresh and _undecided(k, bound, held, tats, unlockable)
                }
                wanted = {x for x in new.values() if x not in locked} | {x for x in fresh.values() if x not in locked}
                if new and fresh and len(locked) + len(wanted) > MAX_KEYS:
                    usable, more = i, True
                    break
                fresh.update(new)
            if fresh:
                ids = sorted({x for x in fresh.values() if x not in locked})
                top = max(locked, default=None)
                # Ids below one already held are only tried (waiting for them could close a cycle).
                waits = [top is None or x > top for x in ids]
                _run(
                    cur,
                    "SELECT u.x, CASE WHEN u.w THEN NOT (pg_advisory_xact_lock(u.x) IS NULL)"
                    " ELSE pg_try_advisory_xact_lock(u.x) END FROM unnest(%s::bigint[], %s::bool[]) AS u(x, w)",
                    (ids, waits),
                )
                locked.update(x for x, ok in cur.fetchall() if ok)
                decided = [k for k, x in fresh.items() if x in locked]
                unlockable.update(k for k, x in fresh.items() if x not in locked)
                maxes = [k for k in decided if _limit(bound, k).max is not None]
                rates = [k for k in decided if _limit(bound, k).rate is not None]
                # Counted after the locks: a snapshot that sees every claim of these keys committed. The
                # rate rows are locked as they are read: a writer without the advisory lock is waited for
                # here, before the clock is read, not after the decision (at the write).
                _run(
                    cur,
                    f"WITH r AS (SELECT key, tat FROM {s}.limit_rates WHERE key = ANY(%s) FOR UPDATE)"
                    f" SELECT key, held, NULL::float8 FROM {s}.limit_holders(%s)"
                    " UNION ALL SELECT key, NULL, tat FROM r",
                    (rates, maxes),
                )
                for k in rates:
                    tats[k] = -math.inf
                for key, count, tat in cur.fetchall():
                    if count is not None:
                        held[key] = int(count)
                    else:
                        tats[key] = float(tat)
                if tats and clock is not None:  # this batch may have waited: its rates are decided at now
                    at = max(at, clock())
            take: list[str] = []
            parked: list[tuple[str, float, str | None]] = []
            rated: set[str] = set()
            considered: list[Any] = []
            for candidate in batch[:usable]:
                job_id, keys = candidate[0], candidate[1]
                if len(rows) + len(take) >= n:
                    break
                if any(k in unlockable for k in keys):
                    left.append(job_id)
                    continue
                considered.append(candidate)
                verdict = _decide(keys, bound, held, tats, at)
                if verdict is None:
                    take.append(job_id)
                    taken.append(job_id)
                    for k in keys:
                        limit = bound(k)
                        if limit is None:
                            continue
                        if limit.max is not None:
                            held[k] += 1
                        if limit.rate is not None:
                            tat = limit.admit(tats[k], at)
                            assert tat is not None  # _decide admitted it
                            tats[k] = tat
                            rated.add(k)
                else:
                    until, key = verdict
                    if key is None:
                        until = _in_line(keys, bound, tats, queued, at)
                    parked.append((job_id, until, key))
                    for k in keys:
                        limit = bound(k)
                        if k != key and limit is not None and limit.max is not None and held.get(k, 0) < limit.max:
                            passed.add(k)
                    if key is None:
                        due = until if due is None else min(due, until)
            if take or parked:
                _run(
                    cur,
                    f"WITH pk AS (UPDATE {s}.jobs j SET parked = u.at, parked_key = u.key"
                    "  FROM unnest(%s::text[], %s::float8[], %s::text[]) AS u(id, at, key) WHERE j.id = u.id),"
                    f" rt AS (INSERT INTO {s}.limit_rates (key, tat) SELECT * FROM unnest(%s::text[], %s::float8[])"
                    "  ON CONFLICT (key) DO UPDATE SET tat = excluded.tat)"
                    f" UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1, node = %s, claim = %s"
                    f" FROM unnest(%s::text[]) AS u(id) WHERE j.id = u.id RETURNING {columns}, j.seq",
                    (
                        [p[0] for p in parked],
                        [p[1] for p in parked],
                        [p[2] for p in parked],
                        sorted(rated),
                        [tats[k] for k in sorted(rated)],
                        node,
                        token,
                        take,
                    ),
                )
                rows += cur.fetchall()
            if fair is not None:
                fair.consider(considered)
            if more or (not batch if fair is not None else len(batch) < m):
                break
            m = min(m * 2, _MOST)
        if fair is not None:
            fair.write(cur)
    if unpark(conn, s, passed, limit_of, None if fair is None else fair.weights):
        more = True  # jobs came back: the caller's node claims again (others hear at their next poll)
    if fair is None:
        rows.sort(key=lambda row: (-row[6], row[9], row[WIDTH]))
    else:
        place = {job_id: i for i, job_id in enumerate(taken)}
        rows.sort(key=lambda row: place[row[0]])
    return [job_from_row(row) for row in rows], due, more


def _limit(bound: Callable[[str], Limit | None], key: str) -> Limit:
    limit = bound(key)
    assert limit is not None
    return limit


def _undecided(
    key: str, bound: Callable[[str], Limit | None], held: dict[str, int], tats: dict[str, float], unlockable: set[str]
) -> bool:
    """Whether ``key`` bounds something and this claim has neither decided it nor failed to lock it."""
    limit = bound(key)
    if limit is None or key in unlockable:
        return False
    return not ((limit.max is None or key in held) and (limit.rate is None or key in tats))


def _in_line(
    keys: Sequence[str],
    bound: Callable[[str], Limit | None],
    tats: dict[str, float],
    queued: dict[str, float],
    now: float,
) -> float:
    """When a job passed over for a rate is due: when the last of its rates has a token for it, once the jobs
    this claim parked for those rates before it have each taken theirs (the first one parked is due when
    the token is; the next an interval later; ...). A backlog of a rate is so unparked one job per token,
    not all of it at every token."""
    bases: dict[str, float] = {}
    due = now
    for k in keys:
        limit = bound(k)
        if limit is not None and limit.rate is not None:
            base = max(tats[k], queued.get(k, -math.inf))
            bases[k] = base
            due = max(due, limit.due(base, now))
    for k, base in bases.items():
        queued[k] = max(base, due) + _limit(bound, k).interval
    return due


def _decide(
    keys: Sequence[str],
    bound: Callable[[str], Limit | None],
    held: dict[str, int],
    tats: dict[str, float],
    now: float,
) -> tuple[float, str | None] | None:
    """``None`` if a job holding ``keys`` may start at ``now``; else ``(parked until, full key or None)``."""
    for k in keys:
        limit = bound(k)
        if limit is not None and limit.max is not None and held[k] >= limit.max:
            return math.inf, k
    due = -math.inf
    for k in keys:
        limit = bound(k)
        if limit is not None and limit.rate is not None:
            tat = tats[k]
            if limit.admit(tat, now) is None:
                due = max(due, limit.due(tat, now))
    return None if due == -math.inf else (due, None)


def unpark(
    conn: Any,
    s: str,
    keys: Collection[str],
    limit_of: Callable[[str], Limit | None],
    fair: Mapping[str, float] | None = None,
) -> int:
    """Slots of ``keys`` were freed (the transaction that freed them committed): under each key's lock, unpark
    as many of the jobs parked on it as it has free slots, best first, passing over jobs of paused queues
    (they could not take the slot; a resume unparks them); how many were unparked. Keys without a
    ``max`` (none at all, too) send nothing.

    ``fair`` (the tenants' weights, ``StoreConfig.fairness``): best first is by priority, then fairly
    among the tenants, as the table store lets its parked jobs go in the (fair) order they were parked:
    among the key's first :data:`_FAIR_WINDOW` parked jobs, each tenant's ``i``-th gets the tag
    ``max(V, F) + i / w`` from the shared tags (which the claims that parked them charged), and the
    least tags go first (ties by claim order). Nothing is charged here: the claim that takes them is."""
    if not keys:  # the common call: an outcome of a job that held no key
        return 0
    bound = bounding(limit_of)
    wanted = sorted({(lock_id(s, k), k) for k in keys if (limit := bound(k)) is not None and limit.max is not None})
    total = 0
    for start in range(0, len(wanted), MAX_KEYS):
        chunk = wanted[start : start + MAX_KEYS]
        with conn.transaction(), _cur(conn) as cur:
            _run(
                cur,
                "SELECT pg_advisory_xact_lock(x) FROM unnest(%s::bigint[]) AS u(x)",
                (sorted({x for x, _ in chunk}),),
            )
            names = [k for _, k in chunk]
            if fair is not None:
                _run(cur, _fair_unpark(s), (names, names, [_limit(bound, k).max for k in names], list(fair),
                                            [float(w) for w in fair.values()]))  # fmt: skip
                total += int(cur.rowcount)
                continue
            _run(
                cur,
                f"WITH r AS (SELECT h.key, u.mx - h.held AS room FROM {s}.limit_holders(%s) h"
                "  JOIN unnest(%s::text[], %s::bigint[]) AS u(key, mx) ON u.key = h.key)"
                f" UPDATE {s}.jobs j SET parked = NULL, parked_key = NULL WHERE j.state = 'ready' AND j.id IN"
                f" (SELECT x.id FROM r CROSS JOIN LATERAL (SELECT id FROM {s}.jobs WHERE state = 'ready'"
                f"   AND parked_key = r.key AND queue NOT IN (SELECT queue FROM {s}.paused)"
                "   ORDER BY priority DESC, run_at, seq LIMIT greatest(r.room, 0) FOR UPDATE SKIP LOCKED) x)",
                (names, names, [_limit(bound, k).max for k in names]),
            )
            total += int(cur.rowcount)
    return total


def _fair_unpark(s: str) -> str:
    """:func:`unpark`'s statement with ``fair``: the parameters are the keys, again, their ``max``, the
    tenants and their weights."""
    return (
        f"WITH r AS (SELECT h.key, u.mx - h.held AS room FROM {s}.limit_holders(%s) h"
        "  JOIN unnest(%s::text[], %s::bigint[]) AS u(key, mx) ON u.key = h.key),"
        # The window of each key with room, locked as it is read (a job another transaction holds is skipped).
        " x AS MATERIALIZED (SELECT r.key, r.room, y.* FROM r CROSS JOIN LATERAL (SELECT id, priority, queue,"
        f"  coalesce(tenant, '') AS tenant, run_at, seq FROM {s}.jobs WHERE state = 'ready' AND parked_key = r.key"
        f"  AND queue NOT IN (SELECT queue FROM {s}.paused) ORDER BY priority DESC, run_at, seq"
        f"  LIMIT CASE WHEN r.room > 0 THEN {_FAIR_WINDOW} ELSE 0 END FOR UPDATE SKIP LOCKED) y),"
        " o AS (SELECT x.*, greatest(coalesce(fc.v, 0), coalesce(ft.finish, 0)) + (row_number() OVER"
        "  (PARTITION BY x.key, x.queue, x.tenant, x.priority ORDER BY x.run_at, x.seq) - 1)"
        "  / (CASE WHEN x.tenant = '' THEN 1.0 ELSE coalesce(wt.w, 1.0) END)::float8 AS tag FROM x"
        "  LEFT JOIN unnest(%s::text[], %s::float8[]) AS wt(tenant, w) ON wt.tenant = x.tenant"
        f"  LEFT JOIN {s}.fair_tags ft ON ft.queue = x.queue AND ft.tenant = x.tenant"
        f"  LEFT JOIN {s}.fair_clock fc ON fc.queue = x.queue),"
        " z AS (SELECT o.id, o.room, row_number() OVER (PARTITION BY o.key ORDER BY o.priority DESC, o.tag,"
        "  o.run_at, o.seq) AS pos FROM o)"
        f" UPDATE {s}.jobs j SET parked = NULL, parked_key = NULL FROM z"
        "  WHERE j.id = z.id AND z.pos <= z.room AND j.state = 'ready'"
    )


def repair(conn: Any, s: str, limit_of: Callable[[str], Limit | None], fair: Mapping[str, float] | None = None) -> int:
    """Unpark what a slot freed by a node that died before its :func:`unpark` owes (the leader's, with every
    rescue): every key some job waits on, walked by one probe each of ``jobs_blocked``; how many. Jobs
    parked on a key that has no ``max`` any more (the nodes were restarted with other limits) all go:
    nothing bounds them, and no freed slot would ever unpark them. A node that declares no limits at
    all (``no_limits``: one that only enqueues, say) judges no key."""
    bound = bounding(limit_of)
    with _cur(conn) as cur:
        _run(
            cur,
            f"WITH RECURSIVE k(key) AS ((SELECT parked_key FROM {s}.jobs WHERE state = 'ready'"
            "  AND parked_key IS NOT NULL ORDER BY parked_key LIMIT 1)"
            f" UNION ALL SELECT (SELECT parked_key FROM {s}.jobs WHERE state = 'ready' AND parked_key > k.key"
            "  ORDER BY parked_key LIMIT 1) FROM k WHERE k.key IS NOT NULL)"
            " SELECT key FROM k WHERE key IS NOT NULL",
        )
        keys = [row[0] for row in cur.fetchall()]
        unbounded = [] if limit_of is no_limits else [k for k in keys if (x := bound(k)) is None or x.max is None]
        freed = 0
        if unbounded:
            _run(
                cur,
                f"UPDATE {s}.jobs SET parked = NULL, parked_key = NULL WHERE state = 'ready' AND parked_key = ANY(%s)",
                (unbounded,),
            )
            freed = int(cur.rowcount)
    return freed + unpark(conn, s, keys, limit_of, fair)
