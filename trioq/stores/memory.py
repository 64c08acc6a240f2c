"""MemoryStore: the job table in this process's memory, nothing on disk."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .._model import Job, JobState, QueueFull
from .._table import Entry, JobTable
from ._base import CancelResult, IdMaker, NewJob, StoreConfig

__all__ = ["MemoryStore"]


class MemoryStore:
    """A :class:`~trioq.stores.Store` backed by a :class:`JobTable` in memory.

    Fast and simple; everything is lost when the process ends. A store serves
    one queue at a time; it may be reopened after that queue closes, keeping
    its jobs (running ones are released when a session ends).
    """

    def __init__(self) -> None:
        self._table: JobTable | None = None
        self._config: StoreConfig | None = None
        self._ids = IdMaker()
        self._in_use = False

    @asynccontextmanager
    async def session(self, config: StoreConfig) -> AsyncIterator[None]:
        if self._in_use:
            raise RuntimeError("this MemoryStore is already open by another queue; give each queue its own store")
        self._in_use = True
        if self._table is None:
            self._table = JobTable(retention=config.retention, max_retained=config.max_retained)
        else:
            self._table.retention = config.retention
            self._table.max_retained = config.max_retained
            self._table.evict(config.clock())  # the new bounds hold from the start
        self._config = config
        try:
            yield
        finally:
            for entry in self._table.running():
                self._table.release(entry.id, entry.epoch)
            self._config = None
            self._in_use = False

    @property
    def _t(self) -> JobTable:
        if self._table is None or self._config is None:
            raise RuntimeError("MemoryStore is not open; use it through trioq.open_queue")
        return self._table

    def _now(self) -> float:
        assert self._config is not None
        return self._config.clock()

    async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> list[Job]:
        table = self._t
        config = self._config
        assert config is not None
        now = config.clock()
        if max_pending is not None:
            new_keys = {j.key for j in jobs if j.key is not None and table.by_key(j.key) is None}
            fresh = len(new_keys) + sum(1 for j in jobs if j.key is None)
            if fresh and table.pending + fresh > max_pending:
                raise QueueFull(
                    f"queue is full: {table.pending} jobs waiting, max_ready={max_pending}; retry later",
                    retry_after=1.0,
                )
        out: list[Job] = []
        ready = 0
        for j in jobs:
            entry, created = table.add(
                self._ids(),
                j.task,
                j.payload,
                priority=j.priority,
                key=j.key,
                max_attempts=j.max_attempts,
                run_at=j.run_at,
                now=now,
            )
            if created:
                if entry.state is JobState.READY:
                    ready += 1
                else:
                    config.on_scheduled(entry.run_at)
            out.append(entry.snapshot())
        if ready:
            config.on_ready(ready)
        return out

    async def claim(self) -> Job | None:
        table = self._table
        if table is None or self._config is None:
            raise RuntimeError("MemoryStore is not open; use it through trioq.open_queue")
        entry = table.claim_next(self._config.clock())
        return None if entry is None else entry.snapshot()

    async def heartbeat(self, job_id: str, epoch: int) -> bool:
        return self._t.holds(job_id, epoch)

    async def succeed(self, job_id: str, epoch: int, result: Any) -> bool:
        return self._t.succeed(job_id, epoch, result, self._now()) is not None

    async def fail(self, job_id: str, epoch: int, error: str, retry_at: float) -> Job | None:
        entry = self._t.fail(job_id, epoch, error, retry_at, self._now())
        if entry is None:
            return None
        self._announce(entry)
        return entry.snapshot()

    async def release(self, job_id: str, epoch: int) -> Job | None:
        entry = self._t.release(job_id, epoch)
        if entry is None:
            return None
        self._announce(entry)
        return entry.snapshot()

    async def get(self, job_id: str) -> Job:
        return self._t.get(job_id)

    async def cancel(self, job_id: str) -> CancelResult:
        entry, changed, running_epoch = self._t.cancel(job_id, self._now())
        return CancelResult(entry.snapshot(), changed, running_epoch)

    async def retry(self, job_id: str) -> Job:
        entry = self._t.retry(job_id, self._now())
        self._announce(entry)
        return entry.snapshot()

    async def promote(self) -> float | None:
        table = self._t
        promoted = table.promote(self._now())
        if promoted:
            assert self._config is not None
            self._config.on_ready(promoted)
        return table.next_run_at()

    async def evict(self) -> int:
        return len(self._t.evict(self._now()))

    async def counts(self) -> dict[str, int]:
        return self._t.counts()

    def _announce(self, entry: Entry) -> None:
        config = self._config
        assert config is not None
        if entry.state is JobState.READY:
            config.on_ready(1)
        elif entry.state is JobState.SCHEDULED:
            config.on_scheduled(entry.run_at)
