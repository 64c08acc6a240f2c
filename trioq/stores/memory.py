"""MemoryStore: the job table in this process's memory, nothing on disk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._base import StoreConfig
from .table.jobs import JobTable
from .table.store import TableStore

__all__ = ["MemoryStore"]


class MemoryStore(TableStore):
    """A :class:`~trioq.stores.Store` backed by a :class:`JobTable` in memory.

    Fast and simple; everything is lost when the process ends. A store serves
    one queue at a time; it may be reopened after that queue closes, keeping
    its jobs (running ones are released when a session ends).
    """

    logs = False

    def __init__(self) -> None:
        super().__init__()
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
        self._attach(self._table, config)
        self._admit_at_open()
        try:
            yield
        finally:
            self._release_running()
            self._table.watched = ()  # the table outlives the session; its waiters do not
            self._config = None
            self._in_use = False

    async def _flush(self) -> None:
        # Nothing to wait for; a schedule point all the same (not a cancel
        # point: the transition has happened), so that a loop of enqueues or
        # of failing jobs lets other tasks run, as with a store that logs.
        await trio.lowlevel.cancel_shielded_checkpoint()
