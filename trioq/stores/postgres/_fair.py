"""Tenant fairness in SQL: start-time fair queueing over tags every node shares.

The semantics are :class:`~trioq.stores.table.fair.FairReadyQueue`'s: each
``(queue, tenant)`` has a finish tag ``F`` (``fair_tags``), each queue a
virtual time ``V`` (``fair_clock``: the start tag of its last claim); among
claimable jobs of the best priority a claim takes the tenant with the least
start tag ``S = max(V, F)``, then sets ``V = S`` and ``F = S + 1 / weight``.
A tenant that idled starts at ``V`` (its ``F`` is behind), so it banks no
credit; within a tenant the order is the claim order (priority, ``run_at``,
enqueue order). Jobs without a tenant are the tenant ``''`` (no tenant has
that name), weighing 1.0 as unlisted tenants do.

A fair claim is one statement (:func:`claim`): the heads of every tenant with
ready jobs (``ready_heads``, a skip scan of ``jobs_tenant_ready``), the ``n``
least start tags among them (a tenant may get several: successive tags), each
tenant's jobs for them locked ``FOR UPDATE SKIP LOCKED``, claimed, and the tags
written. The tags are written as increments (``greatest(F + k / w, S_k + 1 /
w)``), so that two nodes claiming at once never lose a charge; they may both
read the same tags and both pick the same tenant first, which skews one batch,
not the shares over time.

A claim that meets a job holding a limit key (on a node that declares limits) is decided by the limit
path (``_limits.claim``) over :class:`FairPick`'s candidates: the same choice in fair order, each job
considered (started or parked for a key) charging its tenant, as the table store charges a job it pops
and passes over; the charges are written as the claim's last statement. The slots a key frees go to the
parked jobs by these tags too (``_limits.unpark`` with the weights).

The admission of deferred jobs (``_defer``) picks among the tenants of deferred
jobs with :func:`take`, a simulation of the pops over rows fetched in rounds
(exact, a few statements: admissions are rarer than claims), its tags under the
queue ``''`` (no queue has that name).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._sql import cursor as _cur
from ._sql import run as _run

__all__ = ["ADMISSION", "FairPick", "Group", "charge_params", "charge_sql", "claim", "take", "weight_of"]

#: The queue name the admission's tags are kept under.
ADMISSION = ""
#: Rounds of fetching a claim makes at most before it answers with what it has (a tenant that runs out
#: of jobs of the best priority, or whose jobs another node took meanwhile, costs one more).
MAX_ROUNDS = 6


def weight_of(weights: Mapping[str, float], tenant: str) -> float:
    """The weight of ``tenant`` (``''``: jobs without one), 1.0 unless listed."""
    return 1.0 if tenant == "" else float(weights.get(tenant, 1.0))


@attrs.define(eq=False)
class Group:
    """One tenant of one queue in a fair pick: its head's order key, its finish tag, the rows fetched."""

    queue: str
    tenant: str
    weight: float
    #: The sort key of its next job (after the start tag): ``(run_at, seq)``, or ``(seq,)``.
    head: tuple[Any, ...]
    finish: float
    buffer: deque[Any] = attrs.Factory(deque)
    asked: int = 0
    exhausted: bool = False
    charged: int = 0


def _choose(groups: Sequence[Group], clock: Mapping[str, float], alive: Callable[[Group], bool]) -> Group | None:
    """The group whose next job goes next: per queue the least ``(start tag, head)``, then the queue whose
    chosen head comes first (as the table's claim picks among its queues' fair heads)."""
    best_of: dict[str, tuple[tuple[Any, ...], Group]] = {}
    for g in groups:
        if not alive(g):
            continue
        key = (max(clock.get(g.queue, 0.0), g.finish), *g.head)
        found = best_of.get(g.queue)
        if found is None or key < found[0]:
            best_of[g.queue] = (key, g)
    if not best_of:
        return None
    return min(best_of.values(), key=lambda kg: kg[0][1:])[1]


def _charge(g: Group, clock: dict[str, float]) -> float:
    """Charge ``g`` one job: its start tag (the queue's virtual time moves to it)."""
    start = max(clock.get(g.queue, 0.0), g.finish)
    clock[g.queue] = start
    g.finish = start + 1.0 / g.weight
    g.charged += 1
    return start


def _plannable(g: Group) -> bool:
    return bool(g.buffer) or not g.exhausted


def take(
    groups: list[Group],
    clock: dict[str, float],
    n: int,
    fetch: Callable[[dict[Group, int]], None],
    head_of: Callable[[Any], tuple[Any, ...]],
) -> list[tuple[Group, Any]]:
    """Up to ``n`` rows in fair order, each ``(group, row)``; ``groups`` and ``clock`` are charged.

    ``fetch(wanted)`` appends to each group's ``buffer`` up to ``wanted[g]`` more of its rows (locked),
    in its own order; a group given fewer is marked ``exhausted``. Each round simulates the pops still
    to make on a copy of the tags, assuming every group not exhausted has jobs enough, asks for what
    the buffers lack (and one more), then pops for real (exact: a group whose buffer runs dry and that
    has more starts the next round).
    """
    out: list[tuple[Group, Any]] = []
    for _ in range(MAX_ROUNDS):
        if len(out) >= n:
            break
        # Plan: the pops left, on copies of the tags.
        sim_clock = dict(clock)
        saved = [(g.finish, g.charged) for g in groups]
        used = dict.fromkeys(groups, 0)

        def simulable(g: Group, used: dict[Group, int] = used) -> bool:
            return used[g] < len(g.buffer) or not g.exhausted

        for _i in range(n - len(out)):
            g = _choose(groups, sim_clock, simulable)
            if g is None:
                break
            used[g] += 1
            _charge(g, sim_clock)
        for g, (finish, charged) in zip(groups, saved, strict=True):
            g.finish, g.charged = finish, charged
        # One more than the plan for each group asked: the plan breaks ties between tags by each group's
        # first head, the real pops by its next one, so they may differ by a job here and there.
        wanted = {g: k - len(g.buffer) + 1 for g, k in used.items() if k > len(g.buffer) and not g.exhausted}
        if wanted:
            before = {g: len(g.buffer) for g in wanted}
            fetch(wanted)
            for g, k in wanted.items():
                g.asked += k
                if len(g.buffer) - before[g] < k:
                    g.exhausted = True
        # Pop for real, while the chosen group has a row at hand.
        progressed = False
        while len(out) < n:
            g = _choose(groups, clock, _plannable)
            if g is None:
                return out
            if not g.buffer:
                break  # it has more, not fetched yet: the next round asks
            row = g.buffer.popleft()
            _charge(g, clock)
            out.append((g, row))
            progressed = True
            if g.buffer:
                g.head = head_of(g.buffer[0])
        if not progressed and not wanted:
            break
    return out


def charge_sql(s: str) -> str:
    """CTEs ``tg`` and ``tgi`` (the finish tags written as increments) and ``clk`` (each queue's virtual time
    moved forward), over the parameters ``%(tq)s, %(tt)s, %(tf)s, %(ti)s`` (queue, tenant, new finish
    tag, increment) and ``%(cq)s, %(cv)s`` (queue, virtual time)."""
    return (
        f" tu AS (SELECT * FROM unnest(%(tq)s::text[], %(tt)s::text[], %(tf)s::float8[], %(ti)s::float8[])"
        "  AS u(queue, tenant, f, inc) ORDER BY 1, 2),"
        f" tg AS (UPDATE {s}.fair_tags t SET finish = greatest(t.finish + tu.inc, tu.f) FROM tu"
        "  WHERE t.queue = tu.queue AND t.tenant = tu.tenant RETURNING t.queue, t.tenant),"
        f" tgi AS (INSERT INTO {s}.fair_tags (queue, tenant, finish) SELECT tu.queue, tu.tenant, tu.f FROM tu"
        "  WHERE NOT EXISTS (SELECT 1 FROM tg WHERE tg.queue = tu.queue AND tg.tenant = tu.tenant)"
        "  ON CONFLICT (queue, tenant) DO UPDATE SET finish = greatest(excluded.finish, fair_tags.finish)),"
        f" clk AS (INSERT INTO {s}.fair_clock (queue, v) SELECT * FROM unnest(%(cq)s::text[], %(cv)s::float8[])"
        "  ON CONFLICT (queue) DO UPDATE SET v = greatest(fair_clock.v, excluded.v))"
    )


def charge_params(groups: Sequence[Group], clock: Mapping[str, float], queues: Sequence[str]) -> dict[str, Any]:
    """The parameters of :func:`charge_sql` for the groups charged and the queues' clocks."""
    charged = sorted((g for g in groups if g.charged), key=lambda g: (g.queue, g.tenant))
    names = sorted(set(queues))
    return {
        "tq": [g.queue for g in charged],
        "tt": [g.tenant for g in charged],
        "tf": [g.finish for g in charged],
        "ti": [g.charged / g.weight for g in charged],
        "cq": names,
        "cv": [clock.get(q, 0.0) for q in names],
    }


def _charge_got(s: str) -> str:
    """CTEs ``lk``, ``tg``, ``tgi`` and ``clk``: the charges of a CTE ``got (queue, tenant, n, last, w)``
    (jobs taken per tenant, the greatest start tag taken, the weight) written as increments, each tenant's
    finish tag to ``greatest(F + n/w, last + 1/w)`` and each queue's virtual time to at least ``last``. The
    tags' rows are locked in (queue, tenant) order before any is written, so that two claims writing the
    same tenants cannot wait for each other in a cycle. Ends without a comma."""
    return (
        f" lk AS MATERIALIZED (SELECT f.queue, f.tenant, got.n, got.last, got.w FROM {s}.fair_tags f JOIN got"
        "  ON f.queue = got.queue AND f.tenant = got.tenant ORDER BY f.queue, f.tenant FOR UPDATE OF f),"
        f" tg AS (UPDATE {s}.fair_tags f SET finish = greatest(f.finish + lk.n / lk.w, lk.last + 1 / lk.w)"
        "  FROM lk WHERE f.queue = lk.queue AND f.tenant = lk.tenant RETURNING f.queue, f.tenant),"
        f" tgi AS (INSERT INTO {s}.fair_tags (queue, tenant, finish) SELECT got.queue, got.tenant,"
        "  got.last + 1 / got.w FROM got"
        "  WHERE NOT EXISTS (SELECT 1 FROM tg WHERE tg.queue = got.queue AND tg.tenant = got.tenant)"
        "  ORDER BY got.queue, got.tenant"
        "  ON CONFLICT (queue, tenant) DO UPDATE SET finish = greatest(excluded.finish, fair_tags.finish)),"
        f" clk AS (INSERT INTO {s}.fair_clock (queue, v) SELECT got.queue, max(got.last) FROM got"
        "  GROUP BY got.queue ORDER BY got.queue"
        "  ON CONFLICT (queue) DO UPDATE SET v = greatest(fair_clock.v, excluded.v))"
    )


def _batch(s: str, n: int, cond: str) -> str:
    """The CTEs ``g2`` to ``r`` of a fair claim's statement, after ``h``, ``b`` and ``g`` (each tenant at the
    best priority, its weight ``w`` and first start tag ``s0``): how many of the first ``n`` jobs each tenant
    gets, those jobs locked (``c``, ``FOR UPDATE SKIP LOCKED``), and each one's start tag and place in the
    merge of the queues (``r``). ``cond``: more conditions on the jobs, each starting with `` AND``."""
    return (
        # How many jobs of that priority each tenant has, counted (index entries only, no lock) up to twice
        # its weighted share of the batch within its queue, plus 2, at most n: the tenants' first tags lie
        # within 1/w of the queue's virtual time, so that covers its share and others running out.
        " g2 AS (SELECT g.*, least("
        f"{n}, ceil(2.0 * {n} * g.w / sum(g.w) OVER (PARTITION BY g.queue))::int + 2) AS l FROM g),"
        " cnt AS (SELECT g2.*, x.c FROM g2 CROSS JOIN LATERAL (SELECT count(*) AS c FROM (SELECT 1"
        f"  FROM {s}.jobs j WHERE state >= 'ready' AND state <= 'ready' AND parked IS NULL AND epoch >= 0"
        "   AND queue >= g2.queue AND queue <= g2.queue AND coalesce(tenant, '') >= g2.tenant"
        f"   AND coalesce(tenant, '') <= g2.tenant AND priority = (SELECT p FROM b){cond}"
        "   ORDER BY queue, coalesce(tenant, ''), priority DESC, run_at, seq LIMIT g2.l) y) x),"
        # Each tenant's start tags, one per job it has: S, S + 1/w, ... Within a queue they go by tag, then
        # head; the queues' sequences are merged as the table store merges them, by the claim order of each
        # queue's next job: a greedy merge, which is an order by the running maximum of the places along
        # each sequence. The merge's first n: how many jobs each tenant gets.
        " sl AS (SELECT cnt.queue, cnt.tenant, cnt.s0 + i / cnt.w AS tag, cnt.run_at, cnt.seq FROM cnt"
        "  CROSS JOIN LATERAL generate_series(0, cnt.c - 1) AS i),"
        " k AS (SELECT m.queue, m.tenant, count(*) AS k FROM (SELECT sl.queue, sl.tenant,"
        "  max(ARRAY[sl.run_at, sl.seq::float8]) OVER w AS mk, row_number() OVER w AS qpos FROM sl"
        "  WINDOW w AS (PARTITION BY sl.queue ORDER BY sl.tag, sl.run_at, sl.seq ROWS UNBOUNDED PRECEDING)"
        f"  ORDER BY mk, qpos, sl.queue LIMIT {n}) m GROUP BY m.queue, m.tenant),"
        # Each tenant's first k jobs, locked as they are read (a job another claim holds is skipped, and
        # the next one taken), by a range of jobs_tenant_ready.
        " c AS MATERIALIZED (SELECT x.id, x.limits, x.run_at, x.seq, k.queue, k.tenant FROM k CROSS JOIN LATERAL"
        f"  (SELECT id, limits, run_at, seq FROM {s}.jobs j WHERE state >= 'ready' AND state <= 'ready'"
        "   AND parked IS NULL AND epoch >= 0 AND queue >= k.queue AND queue <= k.queue"
        "   AND coalesce(tenant, '') >= k.tenant AND coalesce(tenant, '') <= k.tenant"
        f"   AND priority = (SELECT p FROM b){cond} AND queue NOT IN (SELECT queue FROM {s}.paused)"
        "   ORDER BY queue, coalesce(tenant, ''), priority DESC, run_at, seq LIMIT k.k FOR UPDATE SKIP LOCKED) x),"
        # Each job's start tag (its tenant's first, plus 1/w for each of the tenant's jobs before it) and its
        # place in the merge of the queues, as above but by the jobs' own claim order.
        " r0 AS (SELECT c.*, g.w, g.s0 + (row_number() OVER (PARTITION BY c.queue, c.tenant"
        "  ORDER BY c.run_at, c.seq) - 1) / g.w AS tag FROM c JOIN g ON g.queue = c.queue AND g.tenant = c.tenant),"
        " r AS MATERIALIZED (SELECT r0.*, max(ARRAY[r0.run_at, r0.seq::float8]) OVER w AS mk,"
        "  row_number() OVER w AS qpos FROM r0"
        "  WINDOW w AS (PARTITION BY r0.queue ORDER BY r0.tag, r0.run_at, r0.seq ROWS UNBOUNDED PRECEDING))"
    )


def claim(
    conn: Any,
    s: str,
    node: str,
    n: int,
    token: str,
    *,
    now: float | None,
    queues: Sequence[str] | None,
    weights: Mapping[str, float],
    probe: bool,
    keyed_aside: bool,
    columns: str,
    live: str,
    pending_deadline: str,
) -> tuple[list[Any] | None, float | None, bool]:
    """A fair claim of up to ``n`` jobs of ``queues`` (``None``: every queue), in one statement: the claimed
    rows (``columns``, in the order they should run), the next pending deadline if ``probe``, and whether
    it stopped short with jobs left (of a lower priority, or a tenant had fewer than its share).

    The statement finds every tenant with ready jobs of each queue (``ready_heads``: a skip scan of
    ``jobs_tenant_ready``), each tenant's head (the first live job: its priority, ``run_at``,
    ``seq``), and keeps the tenants whose head has the best priority. A tenant's successive jobs get
    the start tags ``S, S + 1/w, S + 2/w, ...`` (``S = max(V, F)``: a tenant's tags after its first
    pop follow each other, as its finish tag is never behind the virtual time then), so the batch is
    the ``n`` least tags of all the tenants (ties by head; several queues' tags, each queue on a clock of
    its own, merged by the claim order of each one's next job, as the table store chooses among its
    queues), ``k`` of them for a tenant; it locks each
    tenant's first ``k`` jobs of that priority (``FOR UPDATE SKIP LOCKED``), claims them, and writes
    each tenant's finish tag (as an increment: ``greatest(F + k/w, S + k/w)``) and each queue's virtual
    time (the greatest start tag claimed). A tenant that had fewer than ``k`` free jobs gives fewer,
    and the batch comes back short: its shares are not made up within the batch.

    Rows ``None``: a job it would take holds a limit key (``keyed_aside``, the node declares limits); it
    took nothing (the deadline is still read), and the caller claims by the limit path instead, with a
    :class:`FairPick` (in fair order, charging every job it considers).
    """
    params: dict[str, Any] = {
        "now": now,
        "node": node,
        "token": token,
        "queues": None if queues is None else list(queues),
        "wt": list(weights),
        "ww": [float(w) for w in weights.values()],
    }
    cond = f" AND {live}" if now is not None else ""
    keyed = "EXISTS (SELECT 1 FROM r WHERE r.limits <> '{}')" if keyed_aside else "false"
    deadline = f", (SELECT min(deadline) FROM {s}.jobs WHERE {pending_deadline})" if probe else ", NULL::float8"
    statement = (
        (
            # Each (queue, tenant) with ready jobs and its head: its first live job in claim order.
            f"WITH h AS MATERIALIZED (SELECT * FROM {s}.ready_heads(%(queues)s::text[], %(now)s::float8)"
            "  AS h(queue, tenant, priority, run_at, seq)),"
            " b AS (SELECT max(priority) AS p FROM h),"
            # The tenants at the best priority, each with its weight and first start tag.
            " g AS MATERIALIZED (SELECT h.queue, h.tenant, h.run_at, h.seq,"
            "  CASE WHEN h.tenant = '' THEN 1.0 ELSE coalesce(wt.w, 1.0) END::float8 AS w,"
            "  greatest(coalesce(fc.v, 0), coalesce(ft.finish, 0))::float8 AS s0"
            "  FROM h JOIN b ON h.priority = b.p"
            "  LEFT JOIN unnest(%(wt)s::text[], %(ww)s::float8[]) AS wt(tenant, w) ON wt.tenant = h.tenant"
            f"  LEFT JOIN {s}.fair_tags ft ON ft.queue = h.queue AND ft.tenant = h.tenant"
            f"  LEFT JOIN {s}.fair_clock fc ON fc.queue = h.queue),"
        )
        + _batch(s, n, cond)
        + (
            ","
            f" kd AS (SELECT {keyed} AS keyed),"
            f" u AS (UPDATE {s}.jobs j SET state = 'running', epoch = j.epoch + 1, node = %(node)s, claim = %(token)s"
            f"  FROM r WHERE j.id = r.id AND NOT (SELECT keyed FROM kd) RETURNING {columns}, r.mk AS o1, r.qpos AS o2,"
            "  r.queue AS o3),"
            " got AS MATERIALIZED (SELECT r.queue, r.tenant, count(*) AS n, max(r.tag) AS last, min(r.w) AS w FROM r"
            "  WHERE NOT (SELECT keyed FROM kd) GROUP BY r.queue, r.tenant),"
        )
        + _charge_got(s)
        + (
            " SELECT u.*, kd.keyed, (SELECT count(*) FROM h) > (SELECT count(*) FROM g) OR"
            f"  (SELECT count(*) FROM c) < {n} AND ((SELECT count(*) FROM c) < (SELECT coalesce(sum(k.k), 0) FROM k)"
            "  OR EXISTS (SELECT 1 FROM cnt WHERE cnt.c >= cnt.l))"
            f"{deadline}"
            " FROM kd LEFT JOIN u ON true ORDER BY u.o1, u.o2, u.o3"
        )
    )
    with _cur(conn) as cur:
        found = _run(cur, statement, params).fetchall()
    if not found:  # pragma: no cover - the statement always returns a row (a stand-in connection may not)
        return [], None, False
    first = found[0]
    if first[-3]:
        return None, first[-1] if probe else None, False
    rows = [row for row in found if row[0] is not None]
    width = len(first) - 6  # the columns, then o1, o2, o3 (the order), keyed, more, deadline
    more = bool(first[-2]) and len(rows) < n
    next_deadline = first[-1] if probe and rows else None
    return [row[:width] for row in rows], next_deadline, more


class FairPick:
    """The candidates of a fair claim's limit path (:func:`._limits.claim`), in fair order, and the charges
    of the jobs it considered.

    A claim whose jobs hold limit keys decides its candidates one by one, as the table store's claim pops
    its fair heads: a job a key refuses is parked, and its tenant was charged all the same (it was
    considered). :meth:`pick` is :func:`claim`'s choice of the best ``m`` jobs (tags, merge, locks),
    leaving out the jobs of ``%(exclude)s``, with the tags the candidates considered so far in this
    transaction would have written (:meth:`consider`: kept here, not in ``fair_tags``), so that a later
    batch of the same claim goes on from them; :meth:`write` writes them all as the claim ends, in one
    statement that locks the tags' rows in ``(queue, tenant)`` order (no transaction holding a tag's row
    ever waits for a key's lock: the row is the claim's last write).
    """

    #: What the limit path reads of :meth:`pick`'s CTEs: each candidate, in the order it is decided.
    select = " SELECT r.id, r.limits, r.queue, r.tenant, r.tag, r.w FROM r ORDER BY r.mk, r.qpos, r.queue"

    def __init__(
        self, s: str, queues: Sequence[str] | None, weights: Mapping[str, float], now: float | None, live: str
    ) -> None:
        self._s = s
        self._queues = None if queues is None else list(queues)
        self.weights = dict(weights)
        self._now = now
        self._live = live
        #: (queue, tenant) -> [jobs considered, greatest start tag, weight]
        self._got: dict[tuple[str, str], list[float]] = {}
        self._clock: dict[str, float] = {}  # queue -> the greatest start tag considered

    def pick(self, m: int, exclude: bool, params: dict[str, Any]) -> str:
        """The CTEs down to ``r`` (read by :attr:`select`): the best ``m`` claimable jobs in fair order,
        locked, each with its queue, tenant, start tag and weight."""
        s = self._s
        keys = sorted(self._got)
        params.update(
            {
                "fq": self._queues,
                "fnow": self._now,
                "wt": list(self.weights),
                "ww": [float(w) for w in self.weights.values()],
                "lq": [q for q, _ in keys],
                "lt": [t for _, t in keys],
                "lf": [self._got[k][1] + 1.0 / self._got[k][2] for k in keys],
                "li": [self._got[k][0] / self._got[k][2] for k in keys],
                "cq": list(self._clock),
                "cv": list(self._clock.values()),
            }
        )
        cond = (f" AND {self._live}" if self._now is not None else "") + (
            " AND j.id <> ALL(%(exclude)s)" if exclude else ""
        )
        return (
            f"WITH h AS MATERIALIZED (SELECT * FROM {s}.ready_heads(%(fq)s::text[], %(fnow)s::float8)"
            "  AS h(queue, tenant, priority, run_at, seq)),"
            " b AS (SELECT max(priority) AS p FROM h),"
            # The first start tag: the shared tags as this claim's charges so far would leave them.
            " g AS MATERIALIZED (SELECT h.queue, h.tenant, h.run_at, h.seq,"
            "  CASE WHEN h.tenant = '' THEN 1.0 ELSE coalesce(wt.w, 1.0) END::float8 AS w,"
            "  greatest(coalesce(fc.v, 0), coalesce(lc.v, 0), coalesce(ft.finish, 0) + coalesce(lo.inc, 0),"
            "   coalesce(lo.f, 0))::float8 AS s0"
            "  FROM h JOIN b ON h.priority = b.p"
            "  LEFT JOIN unnest(%(wt)s::text[], %(ww)s::float8[]) AS wt(tenant, w) ON wt.tenant = h.tenant"
            f"  LEFT JOIN {s}.fair_tags ft ON ft.queue = h.queue AND ft.tenant = h.tenant"
            f"  LEFT JOIN {s}.fair_clock fc ON fc.queue = h.queue"
            "  LEFT JOIN unnest(%(lq)s::text[], %(lt)s::text[], %(lf)s::float8[], %(li)s::float8[])"
            "   AS lo(queue, tenant, f, inc) ON lo.queue = h.queue AND lo.tenant = h.tenant"
            "  LEFT JOIN unnest(%(cq)s::text[], %(cv)s::float8[]) AS lc(queue, v) ON lc.queue = h.queue),"
        ) + _batch(s, m, cond)

    def consider(self, rows: Sequence[Any]) -> None:
        """Charge the candidates (rows of :attr:`select`) the claim decided: started or parked."""
        for row in rows:
            queue, tenant, tag, w = row[2], row[3], float(row[4]), float(row[5])
            got = self._got.get((queue, tenant))
            if got is None:
                self._got[(queue, tenant)] = [1.0, tag, w]
            else:
                got[0] += 1.0
                got[1] = max(got[1], tag)
            self._clock[queue] = max(self._clock.get(queue, tag), tag)

    def write(self, cur: Any) -> None:
        """Write the charges (as increments, as :func:`claim` writes its own), in the claim's transaction."""
        if not self._got:
            return
        s = self._s
        keys = sorted(self._got)
        _run(
            cur,
            "WITH got AS (SELECT * FROM unnest(%(gq)s::text[], %(gt)s::text[], %(gn)s::float8[], %(gl)s::float8[],"
            "  %(gw)s::float8[]) AS got(queue, tenant, n, last, w))," + _charge_got(s) + " SELECT count(*) FROM lk",
            {
                "gq": [q for q, _ in keys],
                "gt": [t for _, t in keys],
                "gn": [self._got[k][0] for k in keys],
                "gl": [self._got[k][1] for k in keys],
                "gw": [self._got[k][2] for k in keys],
            },
        )
