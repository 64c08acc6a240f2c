"""Listings for operators (``Store.list_jobs``): pages of jobs, newest enqueued first.

Each page is read from ``jobs_listing`` (``state, seq``, for rows with
``max_attempts > 0``, which is every row: the statements here say so, no
other does, so no other plan can pick the index): one backward index scan
per state asked for, merged, so a page costs about ``limit`` rows per state
whatever the table holds. A filter on ``task``, ``queue`` or
``tenant`` is checked on the rows those scans meet: with one that matches
rarely, a page walks back through the state's newer jobs until it has found
``limit`` (or reached the oldest).
"""

from __future__ import annotations

from typing import Any

from ..._model import InvalidJob, Job, JobState
from .._base import JobFilter
from ._rows import COLUMNS, job_from_row
from ._sql import cursor as _cur
from ._sql import run as _run

__all__ = ["list_jobs", "unknown_after"]

_EVERY_STATE = tuple(JobState)


def unknown_after(after_id: object) -> InvalidJob:
    """The error of an ``after_id`` that names no job this store holds."""
    return InvalidJob(
        f"after_id {after_id!r:.80} names no job this store holds (evicted since?): list from the first page again",
        field="after_id",
    )


def list_jobs(conn: Any, s: str, where: JobFilter, limit: int, after_id: str | None) -> list[Job]:
    """Up to ``limit`` snapshots of the jobs ``where`` takes, newest first, before ``after_id`` (see
    :meth:`Store.list_jobs <trioq.stores.Store.list_jobs>`). ``limit`` is written into the statement
    (a parameter there plans a sequential scan: docs/postgres.md), so it must be a checked int."""
    limit = int(limit)
    with _cur(conn) as cur:
        before: int | None = None
        if after_id is not None:
            row = _run(cur, f"SELECT seq FROM {s}.jobs WHERE id = %s", (after_id,)).fetchone()
            if row is None:
                raise unknown_after(after_id)
            before = int(row[0])
        if limit <= 0:
            return []
        narrow = ""
        params: list[Any] = []
        for column, value in (("seq <", before), ("task =", where.task), ("queue =", where.queue),
                              ("tenant =", where.tenant)):  # fmt: skip
            if value is not None:
                narrow += f" AND {column} %s"
                params.append(value)
        branches = []
        values: list[Any] = []
        for state in dict.fromkeys(where.states or _EVERY_STATE):
            branches.append(
                f"(SELECT {COLUMNS}, seq FROM {s}.jobs WHERE state = %s AND max_attempts > 0{narrow}"
                f" ORDER BY seq DESC LIMIT {limit})"
            )
            values += [JobState(state).value, *params]
        query = f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS page ORDER BY seq DESC LIMIT {limit}"
        return [job_from_row(row) for row in _run(cur, query, values).fetchall()]
