"""What each dashboard page shows, gathered from the queue (no HTML here).

Costs, per page view: the overview reads ``stats()`` and counts the
unfinished jobs of each queue: in one pass where the store can
(``queue_counts``, the in-process stores), else by listing each known
queue's once (up to :data:`COUNT_UP_TO` each, PostgreSQL);
the job page reads the job, its parents, ``explain()``, and one page of the
newest :data:`CHILD_SCAN` jobs to find its children.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..._model import FailedAttempt, Job, JobNotFound, JobState
from ..._runtime.queue import Queue
from ...stores._base import JobFilter

__all__ = ["ACTIVE", "CHILD_SCAN", "COUNT_UP_TO", "STATES", "JobPage", "Overview", "job_page", "overview"]

#: Every state, in the order a reader follows a job through them.
STATES = (
    JobState.DEFERRED,
    JobState.WAITING,
    JobState.SCHEDULED,
    JobState.READY,
    JobState.RUNNING,
    JobState.SUCCEEDED,
    JobState.DEAD,
    JobState.CANCELLED,
)
#: The unfinished states, counted per queue.
ACTIVE = STATES[:5]
#: Unfinished jobs counted per queue at most (past it the overview says "1000+").
COUNT_UP_TO = 1000
#: Queues shown with counts at most.
MAX_QUEUES = 50
#: How many of the newest jobs the job page searches for the job's children.
CHILD_SCAN = 1000


@attrs.frozen
class QueueRow:
    """One named queue on the overview: its unfinished jobs per state (capped), whether it is paused,
    and this node's workers for it (``None``: served by the pool that serves every queue)."""

    name: str
    counts: dict[str, int]
    capped: bool
    paused: bool
    workers: int | None


@attrs.frozen
class Overview:
    """The overview's figures: ``stats()`` as is, plus the queue rows and this node's identity."""

    stats: dict[str, Any]
    queues: list[QueueRow]
    more_queues: int
    node: str
    ready: tuple[bool, str]
    nodes: list[dict[str, Any]] | None  # every node of a shared store, if the store can list them


async def overview(queue: Queue) -> Overview:
    """Gather the overview (see the module's docs for what it costs)."""
    stats = await queue.stats()
    per_queue = stats.get("queues", {})
    names = sorted({queue.registry[task].queue for task in queue.registry} | set(per_queue) - {"*"})
    shared_pool = "*" in per_queue
    # A store that counts every queue in one pass (the table stores: their listings scan the table)
    # answers exactly; others are asked one bounded listing per queue.
    counted = getattr(queue.store, "queue_counts", None)
    every = await counted() if counted is not None else None
    if every is not None:
        names = sorted(set(names) | set(every))
    rows = []
    for name in names[:MAX_QUEUES]:
        counts = {state.value: 0 for state in ACTIVE}
        if every is not None:
            counts.update(every.get(name, {}))
            capped = False
        else:
            jobs = await queue.store.list_jobs(JobFilter(states=ACTIVE, queue=name), limit=COUNT_UP_TO)
            for job in jobs:
                counts[job.state.value] += 1
            capped = len(jobs) == COUNT_UP_TO
        info = per_queue.get(name, {})
        workers = info.get("workers", 0) or (None if shared_pool else 0)
        rows.append(QueueRow(name, counts, capped, bool(info.get("paused")), workers))
    nodes_of = getattr(queue.store, "nodes", None)
    nodes = await nodes_of() if nodes_of is not None else None
    return Overview(stats, rows, max(len(names) - MAX_QUEUES, 0), queue.node, queue.readiness(), nodes)


@attrs.frozen
class Event:
    """One line of a job's timeline: wall time, what happened, a detail (may be empty), and whether
    the detail is an error."""

    at: float
    what: str
    detail: str = ""
    error: bool = False


@attrs.frozen
class JobPage:
    """The job page: the job, its parents (``(id, state or None if the store no longer holds it)``),
    its children if found (``None``: not searched, the job is older than the newest
    :data:`CHILD_SCAN`), ``explain()``'s reasons and its timeline."""

    job: Job
    parents: list[tuple[str, JobState | None]]
    children: list[Job] | None
    reasons: list[dict[str, Any]]
    timeline: list[Event]

    @property
    def can_retry(self) -> bool:
        """Whether the page offers Retry: the job is dead or cancelled."""
        return self.job.state in (JobState.DEAD, JobState.CANCELLED)

    @property
    def can_cancel(self) -> bool:
        """Whether the page offers Cancel: the job has not ended."""
        return not self.job.state.terminal


async def job_page(queue: Queue, job_id: str) -> JobPage:
    """Gather one job's page; raises :class:`~trioq.JobNotFound`."""
    job = await queue.get(job_id)
    parents: list[tuple[str, JobState | None]] = []
    for parent_id in job.after:
        try:
            parents.append((parent_id, (await queue.get(parent_id)).state))
        except JobNotFound:
            parents.append((parent_id, None))
    newest = await queue.list(limit=CHILD_SCAN)
    children = None
    if any(other.id == job.id for other in newest) or len(newest) < CHILD_SCAN:
        children = [other for other in reversed(newest) if job.id in other.after]
    reasons = (await queue.explain(job))["reasons"]
    return JobPage(job, parents, children, reasons, timeline(job))


def timeline(job: Job) -> list[Event]:
    """What happened to ``job``, in time order: created, due, each kept failed attempt, the end."""
    events = [Event(job.created_at, "created", f"in queue {job.queue}")]
    if job.run_at > job.created_at + 0.001 or job.state is JobState.SCHEDULED:
        events.append(Event(job.run_at, "due", "(run_at: the time it was last scheduled for)"))
    if job.deadline is not None:
        events.append(Event(job.deadline, "deadline", "cancelled if not started by then"))
    events.extend(_failure(failed) for failed in job.errors)
    if job.finished_at is not None:
        ended = "" if job.state is JobState.SUCCEEDED else job.error or ""
        events.append(Event(job.finished_at, job.state.value, ended, error=bool(ended)))
    return sorted(events, key=lambda event: event.at)


def _failure(failed: FailedAttempt) -> Event:
    return Event(failed.finished_at, f"attempt {failed.attempt} failed", failed.error, error=True)
