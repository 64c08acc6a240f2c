"""What a parent's success does for its children in its own statement (``_transitions._succeed_all``, once a
store has met flows): releases them (as :func:`._flows.release` does), claims those the completing node's
idle workers would take (:class:`Take`), and carries the claimed children's parents' results; and the
results a node keeps for children it claimed until they ask (:class:`ParentResults`).

Why the statement may release children although it cannot see a child added after it began: see
``_flows``'s module docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..._model import Job
from ._flows import Settled
from ._rows import COLUMNS, WIDTH, job_from_row, loads

__all__ = ["ParentResults", "Take", "release_sql", "released"]


@attrs.frozen
class Take:
    """Children a parent's success may claim at once for the node completing it (its idle workers): at
    most ``counts[i]`` of queue ``queues[i]`` (``queues`` ``None``: ``counts[0]`` of any queue), under claim
    ``token``; with ``keyed``, none that holds a limit key (those go to the limit path's claim).

    Only what a claim would take: ready now (``run_at`` reached, all parents met), its queue not paused,
    its deadline not passed; the best first (priority, then ``run_at``, then FIFO).
    """

    queues: tuple[str, ...] | None
    counts: tuple[int, ...]
    token: str
    keyed: bool = False


def release_sql(s: str, take: Take | None) -> tuple[str, str, str]:
    """The SQL by which a success statement (``_transitions._succeed_all``) releases the waiting children of
    the parents it completes (CTE ``s``: ``id``, ``has_children``), as :func:`release` does, and with
    ``take`` claims some for its node: ``(CTEs, after a comma, ending its WITH; select-list items, each
    after a comma; a join that follows the select list's FROM)``. Read its result with :func:`released`.

    Parameters it names: ``now``, ``channel``, ``ready`` (the ``r|node|`` prefix), and with ``take``
    ``node``, ``token``, ``take_queues``, ``take_counts``. Children are probed by id arrays, so that a
    batch without parents reads nothing more.
    """
    pick = ""
    picked = "false"
    if take is not None:
        # The children made ready now that a claim may take, ranked as a claim ranks them (per queue).
        queue_of = "''" if take.queues is None else "c.queue"
        served = "t.queue = ''" if take.queues is None else "t.queue = c.queue"
        pick = (
            " pick AS (SELECT c.id FROM (SELECT ck.id, ck.queue, row_number() OVER (PARTITION BY"
            f"   {queue_of.replace('c.', 'ck.')} ORDER BY ck.priority DESC, ck.run_at, ck.seq) AS rank"
            "   FROM ck JOIN kids ON kids.child = ck.id WHERE ck.unmet <= kids.n AND ck.run_at <= %(now)s"
            "   AND (ck.deadline IS NULL OR ck.epoch > 0 OR ck.deadline > %(now)s)"
            + (" AND ck.limits = '{}'" if take.keyed else "")
            + f"   AND ck.queue NOT IN (SELECT queue FROM {s}.paused)) c"
            "   JOIN unnest(%(take_queues)s::text[], %(take_counts)s::int[]) AS t(queue, n)"
            f"   ON {served} WHERE c.rank <= t.n),"
        )
        picked = "pick.id IS NOT NULL"
    ctes = (
        f" kids AS (SELECT e.child, count(*) AS n FROM {s}.flow_edges e"
        "   WHERE e.parent = ANY(ARRAY(SELECT id FROM s WHERE has_children)) GROUP BY e.child),"
        f" ck AS (SELECT j.id, j.unmet, j.run_at, j.queue, j.priority, j.seq, j.limits, j.deadline, j.epoch"
        f"   FROM {s}.jobs j WHERE j.id = ANY(ARRAY(SELECT child FROM kids)) AND j.state = 'waiting'"
        "   ORDER BY j.id FOR UPDATE OF j),"
        f"{pick}"
        f" up AS (UPDATE {s}.jobs j SET unmet = CASE WHEN j.unmet > kids.n THEN j.unmet - kids.n END,"
        f"   state = CASE WHEN j.unmet > kids.n THEN 'waiting' WHEN {picked} THEN 'running'"
        "   WHEN j.run_at > %(now)s THEN 'scheduled' ELSE 'ready' END"
        + (
            ", epoch = CASE WHEN pick.id IS NOT NULL THEN j.epoch + 1 ELSE j.epoch END,"
            " node = CASE WHEN pick.id IS NOT NULL THEN %(node)s ELSE j.node END,"
            " claim = CASE WHEN pick.id IS NOT NULL THEN %(token)s ELSE j.claim END"
            if take is not None
            else ""
        )
        + " FROM ck JOIN kids ON kids.child = ck.id"
        + (" LEFT JOIN pick ON pick.id = ck.id" if take is not None else "")
        + f" WHERE j.id = ck.id RETURNING j.seq, {_qualified('j')})"
    )
    items = (
        ", (SELECT count(*) FROM up WHERE state = 'ready'), ARRAY(SELECT run_at FROM up WHERE state = 'scheduled'),"
        " (SELECT pg_notify(%(channel)s, %(ready)s || count(*)) FROM up WHERE state = 'ready' HAVING count(*) > 0)"
    )
    # A claimed child's parents' results (ctx.parents): those this statement completes as it was given them
    # (the json column keeps the text), the others as the snapshot holds them (they had succeeded).
    results = (
        "ARRAY(SELECT ARRAY[x.id, x.r] FROM (SELECT s.id, s.result AS r FROM s WHERE s.id = ANY(up.parents)"
        f"   UNION ALL SELECT p.id, p.result::text FROM {s}.jobs p WHERE p.id = ANY(up.parents)"
        "   AND p.state = 'succeeded' AND NOT p.id = ANY(ARRAY(SELECT id FROM s))) x)"
    )
    join = (
        f" LEFT JOIN (SELECT {COLUMNS}, seq, {results} FROM up WHERE state = 'running') cl ON true"
        if take is not None
        else ""
    )
    return ctes, items, join


def released(rows: Sequence[Sequence[Any]], first: int, done: Settled) -> dict[str, Any]:
    """Add to ``done`` what :func:`release_sql` did, from the rows its statement returned (its select-list
    items start at column ``first``; the claimed children's columns follow them, one child a row); the
    results of the claimed children's parents, as :func:`results` answers."""
    row = rows[0]
    done.ready += int(row[first])
    done.scheduled += [float(at) for at in row[first + 1]]
    at = first + 3
    claimed = [r for r in rows if len(r) > at and r[at] is not None]
    claimed.sort(key=lambda r: (-r[at + 6], r[at + 9], r[at + WIDTH]))
    done.claimed += [job_from_row(r[at : at + WIDTH]) for r in claimed]
    return {p: None if text is None else loads(text) for r in claimed for p, text in r[at + WIDTH + 1]}


def _qualified(alias: str) -> str:
    """:data:`COLUMNS` under ``alias``, each named as in :data:`COLUMNS` (``payload``, not ``payload::text``)."""
    return ", ".join(f"{alias}.{column.strip().split('::')[0]}" for column in COLUMNS.split(","))


class ParentResults:
    """The results of the parents of jobs a node claimed, read with the claim (or the success) that took
    them: no round trip between a child's claim and its start. Kept until each child claimed with them
    has asked (``ctx.parents``).

    A succeeded job's result never changes, so an answer kept is the answer a query would give. At most
    ``bound`` parents are kept (the oldest go first: a child that never started, released at shutdown,
    leaves its parents behind); a child whose parents are not all kept is answered by a query.
    """

    def __init__(self, bound: int = 1024) -> None:
        self._bound = bound
        self._kept: dict[str, list[Any]] = {}  # parent id -> [result, children yet to ask]

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, jobs: Sequence[Job], found: dict[str, Any]) -> None:
        """Keep ``found`` (``{parent id: result}``, as :func:`results` answers) for each of ``jobs`` (claimed)."""
        kept = self._kept
        for job in jobs:
            for parent in dict.fromkeys(job.after):
                if parent in found:
                    kept.setdefault(parent, [found[parent], 0])[1] += 1
        while len(kept) > self._bound:
            del kept[next(iter(kept))]

    def take(self, ids: Sequence[str]) -> dict[str, Any] | None:
        """The kept results of ``ids`` (one child's parents), each counted as asked for; ``None`` unless
        every one is kept."""
        kept = self._kept
        if not all(parent in kept for parent in ids):
            return None
        out: dict[str, Any] = {}
        for parent in dict.fromkeys(ids):
            entry = kept[parent]
            out[parent] = entry[0]
            entry[1] -= 1
            if entry[1] <= 0:
                del kept[parent]
        return out
