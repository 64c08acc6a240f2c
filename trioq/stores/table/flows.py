"""Flows in the table: which jobs wait for which parents (see ``NewJob.after`` for the rules).

A child keeps its parents' ids (``Entry.after``), how many of them have not
succeeded yet while it waits (``Entry.unmet``), and, once a parent's death or
cancel cancelled it, that parent's id (``Entry.cancelled_by``), which a retry
of the parent looks for. :class:`FlowIndex` holds the other direction, parent
id -> children, for the parents whose end can still move a child: a parent
that has not ended, or one that ended dead or cancelled (a retry may revive
its children). A parent's list goes when it succeeds (its children counted it
then, for good) or leaves the table.

The index decides nothing on its own: :class:`~.jobs.JobTable` makes every
move, inside the transition that caused it, so a replayed log moves the same
children the same way and a flow needs no record of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._model import InvalidJob, JobState

if TYPE_CHECKING:
    from .jobs import Entry

__all__ = ["FlowIndex", "parent_failed"]

_SUCCEEDED = JobState.SUCCEEDED
_DEAD = JobState.DEAD
_CANCELLED = JobState.CANCELLED


def parent_failed(parent_id: str, state: JobState) -> str:
    """The error of a job cancelled because its parent ``parent_id`` ended ``state``."""
    return f"ParentFailed: parent {parent_id} is {state.value}"


class FlowIndex:
    """Parent id -> the entries that name it in ``after`` (see the module docstring).

    ``jobs`` is the table's own id -> entry dict (the very object, which the
    table only ever clears), so parents are looked up where they live.
    """

    def __init__(self, jobs: dict[str, Entry]) -> None:
        self.jobs = jobs
        self.children: dict[str, list[Entry]] = {}

    def clear(self) -> None:
        self.children.clear()

    def check(self, after: tuple[str, ...], field: str = "after") -> None:
        """Raise :class:`~trioq.InvalidJob` (``field``) unless the table holds every parent of ``after``."""
        jobs = self.jobs
        for parent_id in after:
            if parent_id not in jobs:
                raise InvalidJob(
                    f"{field}: parent job {parent_id!r} is not in this store (never enqueued, or evicted "
                    "after retention); a parent must exist before its children are enqueued",
                    field=field,
                )

    def link(self, child: Entry, *, every: bool = False) -> None:
        """File ``child`` under each parent whose end can still move it (``every``: under each
        parent, known or not: a checkpoint being restored, see :meth:`prune`)."""
        jobs, children = self.jobs, self.children
        for parent_id in child.after:
            parent = jobs.get(parent_id)
            if every or (parent is not None and parent.state is not _SUCCEEDED):
                children.setdefault(parent_id, []).append(child)

    def prune(self) -> None:
        """Drop the lists of parents the table does not hold, or that succeeded (after a restore)."""
        jobs = self.jobs
        for parent_id in [p for p in self.children if p not in jobs or jobs[p].state is _SUCCEEDED]:
            del self.children[parent_id]

    def blocker(self, after: tuple[str, ...]) -> Entry | None:
        """The first parent of ``after`` the table holds that ended dead or cancelled, if any."""
        jobs = self.jobs
        for parent_id in after:
            parent = jobs.get(parent_id)
            if parent is not None and (parent.state is _DEAD or parent.state is _CANCELLED):
                return parent
        return None

    def unmet(self, after: tuple[str, ...]) -> int:
        """How many parents of ``after`` the table holds that have not succeeded (an evicted parent
        ended long ago: it counts as met)."""
        jobs = self.jobs
        return sum(1 for p in after if (parent := jobs.get(p)) is not None and parent.state is not _SUCCEEDED)
