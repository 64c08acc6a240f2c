"""Listings and bulk actions: the checks of their filters, and the bulk loop over a listing.

:meth:`Queue.list <trioq.Queue.list>` reads one page of :meth:`Store.list_jobs
<trioq.stores.Store.list_jobs>`; ``retry_many`` and ``cancel_many`` read one
page of the jobs they can act on, then act on each, oldest first, through the
store's own ``retry`` and ``cancel`` (so a bulk action follows every rule a
single one does: flows, limits, hints). Bulk actions are bounded: one call acts
on the newest ``limit`` jobs it finds (:data:`MAX_BULK` at most); call again
for more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any

from .._model import InvalidJob, Job, JobNotFound, JobState, is_storable_int, name_problem
from .._validate import label
from ..stores._base import JobFilter, Store

__all__ = ["CANCELLABLE", "MAX_BULK", "MAX_PAGE", "RETRYABLE", "act_on_each", "job_filter", "page_limit"]

#: The most jobs one page of a listing holds.
MAX_PAGE = 1000
#: The most jobs one ``retry_many`` or ``cancel_many`` acts on.
MAX_BULK = 10_000
#: The states ``retry_many`` takes jobs from, and ``cancel_many``.
RETRYABLE = (JobState.DEAD, JobState.CANCELLED)
CANCELLABLE = tuple(state for state in JobState if not state.terminal)


def job_filter(
    state: Any, task: Any, queue: Any, tenant: Any, *, among: Collection[JobState] | None = None, action: str = ""
) -> JobFilter:
    """The :class:`JobFilter` of a listing's arguments, each checked: ``state`` a :class:`JobState` or its
    value (``None``: every state, or every state of ``among``), ``task`` a task name, ``queue`` and
    ``tenant`` labels (``None``: any). Raises :class:`~trioq.InvalidJob` naming the bad argument; a state
    outside ``among`` is refused too (``action`` names the call that cannot take it)."""
    if state is None:
        states: tuple[JobState, ...] = tuple(among or ())
    else:
        try:
            chosen = JobState(state)
        except ValueError:
            names = ", ".join(s.value for s in JobState)
            raise InvalidJob(f"state must be one of {names}, got {state!r:.60}", field="state") from None
        if among is not None and chosen not in among:
            names = " or ".join(s.value for s in among)
            raise InvalidJob(f"{action} takes jobs that are {names}, not {chosen.value}", field="state")
        states = (chosen,)
    if task is not None:
        if not isinstance(task, str):
            problem: str | None = "it is not a string"
        else:
            problem = name_problem(task) if task else "it is empty"
        if problem is not None:
            raise InvalidJob(f"task {task!r:.60} cannot name a task: {problem}", field="task")
    return JobFilter(
        states,
        task,
        None if queue is None else label("queue", queue),
        None if tenant is None else label("tenant", tenant),
    )


def page_limit(limit: Any, most: int) -> int:
    """``limit`` if it is an int from 1 to ``most``; else :class:`~trioq.InvalidJob` naming ``limit``."""
    if not is_storable_int(limit, 1) or limit > most:
        raise InvalidJob(f"limit must be an integer from 1 to {most}, got {limit!r:.40}", field="limit")
    return int(limit)


async def act_on_each(store: Store, where: JobFilter, limit: int, act: Callable[[str], Awaitable[bool]]) -> int:
    """Call ``act(job_id)`` for each of the newest ``limit`` jobs ``where`` takes, oldest first (a flow's
    parent before its children); how many it changed. A job it cannot act on any more (it moved
    on, was evicted, or is a flow's child whose parent is still dead or cancelled) is passed over,
    uncounted: the listing and the action are not one transaction. When a page changed nothing and
    passed some over, the next older ``limit`` are read, until one changes something or none is left
    (at most :data:`MAX_BULK` jobs read in one call): a dead parent listed behind more of its children
    than ``limit`` is reached, and its retry revives them (else every call would pass the same children
    over and return 0)."""
    changed = read = 0
    after_id: str | None = None
    while True:
        jobs: list[Job] = await store.list_jobs(where, limit=limit, after_id=after_id)
        read += len(jobs)
        passed = False
        for job in reversed(jobs):
            try:
                changed += await act(job.id)
            except (InvalidJob, JobNotFound):
                passed = True
        if changed or not passed or len(jobs) < limit or read >= MAX_BULK:
            return changed
        after_id = jobs[-1].id
