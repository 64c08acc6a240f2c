"""Cron ticks in the in-process stores: the last tick recorded per schedule, logged with its job.

:class:`CronTicks` is a base of :class:`~trioq.stores.table.store.TableStore`:
it keeps each cron schedule's last tick (a wall-clock time) by name, and
:meth:`CronTicks.add_tick` records a tick (a ``TICK`` record, type 17) and
enqueues its job in one synchronous step, so that the TICK and the job's ADD
reach the log in one batch, under one commit marker: a crash keeps both or
neither. The marks are the store's, not the table's: a ``MemoryStore`` keeps
them in the object (they outlast its sessions, as its jobs do); a ``WALStore``
replays them from its log (TICK records, and the ``ticks`` a checkpoint's BEGIN
carries) into :class:`~trioq.stores.wal._recovery.Recovery`, and takes them
from there when a session opens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._model import Job
from ..._validate import label, number
from .._base import NewJob, StoreConfig
from .jobs import JobTable, pack_payload

__all__ = ["TICK", "CronTicks"]

#: The record of a tick: ``(name, tick)`` (``_records.Tick``).
TICK = 17


class CronTicks:
    """The cron part of the table stores (see the module docstring and :meth:`Store.add_tick`)."""

    def __init__(self) -> None:
        #: The last tick recorded for each cron schedule, by name (wall-clock seconds).
        self._ticks: dict[str, float] = {}

    if TYPE_CHECKING:  # the TableStore's, which this is a base of

        def _open(self) -> tuple[JobTable, StoreConfig]: ...
        def _record(self, kind: int, fields: tuple[Any, ...], *, lazy: bool = False) -> int: ...
        async def _flush(self) -> None: ...
        async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> list[Job]: ...

    async def add_tick(self, name: str, tick: float, job: NewJob | None) -> Job | None:
        """See :meth:`~trioq.stores.Store.add_tick`.

        The job is checked (every field, its payload packed) before anything
        changes, so that the TICK is never logged for a job the add then
        refuses. The TICK is logged first and the job's ADD right after it,
        with no await between (``add`` runs up to its record without
        suspending): one batch of the log.
        """
        table, _ = self._open()
        name = label("name", name)
        tick = number("tick", tick, minimum=-math.inf)
        last = self._ticks.get(name)
        if job is None:  # a baseline: only where the store has no mark yet
            if last is not None:
                await trio.lowlevel.checkpoint()
                return None
            self._ticks[name] = tick
            self._record(TICK, (name, tick))
            await self._flush()
            return None
        if last is not None and last >= tick:
            await trio.lowlevel.checkpoint()
            return None
        from .store import _checked  # the table store's module imports this one

        checked = _checked(job, "")
        pack_payload(checked.payload)
        self._ticks[name] = tick
        self._record(TICK, (name, tick))
        if checked.key is not None and table.holds_key(checked.key):
            # The tick's job is in already (its key is held): the tick is taken, the mark moves on.
            await self._flush()
            return None
        (added,) = await self.add([checked])
        return added

    async def ticks(self) -> dict[str, float]:
        """See :meth:`~trioq.stores.Store.ticks`."""
        self._open()
        await trio.lowlevel.checkpoint()
        return dict(self._ticks)

    def _tick_marks(self) -> list[tuple[str, float]]:
        """Each schedule's ``(name, last tick)``, sorted: what a WAL checkpoint's BEGIN carries."""
        return sorted(self._ticks.items())
