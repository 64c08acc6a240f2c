"""Why a job is not running: the answer of :meth:`trioq.Queue.explain`.

Reasons are found, not recorded: from the job's snapshot, the paused queues, the limit keys'
use (``Store.limit_usage``, when the store has it) and this node's pools. So the answer is as
of one moment, and a reason may pass while it is being read (a slot frees, a token comes due).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .._model import Job, JobState, Limit

__all__ = ["reasons"]


def reasons(
    job: Job,
    *,
    now: float,
    paused: Collection[str],
    usage: Mapping[str, tuple[int, int, float | None]],
    limit_of: Callable[[str], Limit | None],
    idle: int | None,
    parents: Mapping[str, JobState | None] | None = None,
) -> list[dict[str, Any]]:
    """Each reason ``job`` is not running now, most decisive first, as ``{"kind", "message", ...}``.

    Kinds: ``running``, ``finished`` (terminal), ``waiting`` (for parents that have not
    succeeded: ``parents``, their ids and states, from ``parents``, the states of the job's parents
    as read, ``None`` for one gone), ``deferred`` (enqueued past ``max_ready``, waiting
    for admission), ``scheduled`` (``run_at`` ahead), ``paused`` (its
    named queue), ``limit`` (a key's slots all held: ``key``, ``in_use``, ``cap``), ``rate`` (a
    key's rate has no token now: ``key``, ``due_in`` seconds), ``no_workers`` (``idle is None``:
    this node has no pool for the job's queue; another node may), ``busy`` (every worker of the
    pool is busy), and ``claimable`` (nothing holds it back: it starts at the next claim). A
    ``deadline`` entry follows whenever the job still has one to meet.
    """
    state = job.state
    if state is JobState.RUNNING:
        return [{"kind": "running", "message": f"running (attempt {job.attempts + 1}, epoch {job.epoch})"}]
    if state.terminal:
        return [{"kind": "finished", "message": f"finished: {state.value}"}]
    out: list[dict[str, Any]] = []
    if state is JobState.WAITING:
        unmet = {p: s.value for p, s in (parents or {}).items() if s is not None and s is not JobState.SUCCEEDED}
        shown = ", ".join(f"{p} ({s})" for p, s in list(unmet.items())[:5]) + (" ..." if len(unmet) > 5 else "")
        out.append(
            {
                "kind": "waiting",
                "message": f"waiting for {len(unmet)} parent(s) to succeed: {shown}"
                if unmet
                else "waiting for parents",
                "parents": unmet,
            }
        )
    if state is JobState.DEFERRED:
        out.append(
            {
                "kind": "deferred",
                "message": "deferred past max_ready: admitted, oldest first, once fewer jobs are ready or scheduled",
            }
        )
    if state is JobState.SCHEDULED:
        wait = max(0.0, job.run_at - now)
        out.append({"kind": "scheduled", "message": f"not due yet: it runs in {wait:.3f}s", "due_in": wait})
    if job.queue in paused:
        out.append({"kind": "paused", "message": f"its queue {job.queue!r} is paused", "queue": job.queue})
    for key in job.limits:
        limit = limit_of(key)
        if limit is None:
            continue
        in_use, _blocked, tat = usage.get(key, (0, 0, None))
        if limit.max is not None and in_use >= limit.max:
            out.append(
                {
                    "kind": "limit",
                    "message": f"limit {key!r} is full: {in_use} of {limit.max} slots held",
                    "key": key,
                    "in_use": in_use,
                    "cap": limit.max,
                }
            )
        if tat is not None and limit.admit(tat, now) is None:
            due = limit.due(tat, now) - now
            out.append(
                {"kind": "rate", "message": f"rate of {key!r}: next token in {due:.3f}s", "key": key, "due_in": due}
            )
    if state is JobState.READY and not out:
        if idle is None:
            message = f"no pool of this node serves queue {job.queue!r} (another node's may)"
            out.append({"kind": "no_workers", "message": message, "queue": job.queue})
        elif idle == 0:
            out.append({"kind": "busy", "message": "every worker of its pool is busy: it waits its turn"})
        else:
            out.append({"kind": "claimable", "message": "nothing holds it back: it starts at the next claim"})
    deadline = job.deadline
    if deadline is not None and math.isfinite(deadline) and job.epoch == 0:
        left = deadline - now
        out.append(
            {"kind": "deadline", "message": f"cancelled unless started within {max(0.0, left):.3f}s", "due_in": left}
        )
    return out
